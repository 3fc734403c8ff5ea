//! The driver's steps for restore (see `runtime/kafka/restore.rs` for its parts).

use crate::error::RunError;
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::restore::{EXPIRY_CHECK, MARKER_WAIT, Restoring};
use crate::runtime::kafka::task::Task;
use crate::runtime::kafka::{KafkaJob, option_differences};
use crate::stats::RestoreStats;
use crate::telemetry::RestoreReport;
use sessionizer_connectors::kafka::KafkaError;
use sessionizer_connectors::kafka::changelog::{self, ReadStats};
use std::time::Instant;

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Puts the state of several tasks back (a rebalance gives partitions in groups):
    /// each from a standby copy or a local snapshot when one fits, then the changelog's
    /// tail (or all of it), every partition read at once. Returns, per task, the offset
    /// it goes on from, `None` when the changelog has no progress record (a task never
    /// committed).
    pub(in crate::runtime::kafka) fn restore_all(
        &mut self,
        tasks: &mut [Task<F::Op>],
        committed: &[Option<i64>],
    ) -> Result<Vec<Option<i64>>, RunError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let began = Instant::now();
        self.telemetry.restoring();
        let mut states = Vec::with_capacity(tasks.len());
        // Partitions with nothing to read after their start (an empty changelog, a copy
        // that is up to date) are not read at all.
        let mut nothing_to_read = vec![false; tasks.len()];
        // Where each task's changelog read starts (the log start for a full restore).
        let mut starts = vec![0i64; tasks.len()];
        for (i, task) in tasks.iter().enumerate() {
            let topic = self.changelogs[task.tp.topic as usize].clone();
            let partition = task.tp.partition;
            let (low, high) = self.admin.watermarks(&topic, partition)?;
            let seeded = self
                .standbys
                .as_mut()
                .and_then(|s| s.take(task.tp))
                .or_else(|| self.load_snapshot(&topic, partition));
            // A seed fits when the changelog still holds every record after it; one
            // from a changelog that was deleted and created again, or cut by retention,
            // does not.
            let state = match seeded {
                // A copy that has seen nothing yet is an empty start.
                Some(s) if s.offset.is_none() => Restoring::empty(),
                Some(s) if s.offset.is_some_and(|o| low <= o && o <= high) => s,
                Some(s) => {
                    tracing::warn!(
                        task = %task.names[0].name,
                        source = s.source,
                        offset = ?s.offset,
                        changelog_low = low,
                        changelog_high = high,
                        "the local copy does not fit the changelog; restoring from the changelog alone"
                    );
                    Restoring::empty()
                }
                None => Restoring::empty(),
            };
            starts[i] = state.offset.unwrap_or(low);
            // Always an explicit offset: librdkafka looks "the beginning" up first,
            // which costs about half a second per restore.
            let mut state = state;
            state.offset = Some(starts[i]);
            nothing_to_read[i] = starts[i] >= high;
            if nothing_to_read[i] {
                let mut state = state;
                state.offset = Some(high);
                states.push(state);
                continue;
            }
            states.push(state);
        }
        let mut reads = vec![ReadStats::default(); tasks.len()];
        let all: Vec<usize> = (0..tasks.len()).filter(|&i| !nothing_to_read[i]).collect();
        self.read_changelogs(tasks, &mut states, &all, &mut reads)?;
        // The group's offsets and the changelog are written in one transaction, but its
        // markers reach the partitions one at a time: a read made just after the offsets
        // became stable may stop before the last commit's changelog records, which are
        // there but not yet readable. Read on until the progress record agrees with the
        // committed offset, or no record is left beyond the read (a changelog that is
        // really behind is reported by finish_restore).
        //
        // A read still held below the written end after that is held by an open
        // transaction: one of a process that died after writing to the changelog (a
        // task taken over from it, then rewound by this process) stays open until the
        // coordinator aborts it, and nothing written after it — this process's own
        // commits included — is readable until then: wait for that too.
        let markers = Instant::now() + MARKER_WAIT.min(self.settings.timeout);
        let deadline = Instant::now() + self.kafka.transaction_timeout + EXPIRY_CHECK;
        let mut told = false;
        loop {
            let mut behind = Vec::new();
            for (i, task) in tasks.iter().enumerate() {
                let Some(o) = committed[i] else { continue };
                if states[i].meta.as_ref().is_some_and(|m| m.next_offset >= o) {
                    continue;
                }
                // Records written but not yet readable lie below the high watermark,
                // not below the last stable offset.
                let topic = &self.changelogs[task.tp.topic as usize];
                let high = self.admin.written_end(topic, task.tp.partition)?;
                if states[i].offset.is_some_and(|at| at < high) {
                    behind.push(i);
                }
            }
            if behind.is_empty() || Instant::now() >= deadline {
                break;
            }
            if !told && Instant::now() >= markers {
                told = true;
                let names: Vec<&str> = behind
                    .iter()
                    .map(|&i| tasks[i].names[0].name.as_str())
                    .collect();
                tracing::info!(
                    tasks = ?names,
                    wait_s = (deadline - Instant::now()).as_secs(),
                    "a changelog is held by an open transaction (of a process that stopped?); waiting for the coordinator to abort it"
                );
            }
            tracing::debug!(
                tasks = behind.len(),
                "changelog not yet readable up to the committed offset; reading on"
            );
            // Markers come within milliseconds; an expiring transaction takes seconds.
            let pause = if told { 500 } else { 20 };
            std::thread::sleep(std::time::Duration::from_millis(pause));
            self.read_changelogs(tasks, &mut states, &behind, &mut reads)?;
        }
        for (i, n) in nothing_to_read.iter().enumerate() {
            if *n {
                reads[i].end_offset = states[i].offset.unwrap_or(0);
            }
        }
        let took = began.elapsed();
        let mut out = Vec::with_capacity(tasks.len());
        for (((task, state), (read, &committed)), &from) in tasks
            .iter_mut()
            .zip(states)
            .zip(reads.iter().zip(committed))
            .zip(&starts)
        {
            let read = (from, *read);
            out.push(self.finish_restore(task, state, read, committed, took)?);
        }
        Ok(out)
    }

    /// Reads the changelog partitions of tasks `which` on from where each state stands
    /// to their ends (every partition of one topic by one reader), adding to `reads`.
    fn read_changelogs(
        &self,
        tasks: &[Task<F::Op>],
        states: &mut [Restoring],
        which: &[usize],
        reads: &mut [ReadStats],
    ) -> Result<(), RunError> {
        let mut topics: Vec<u32> = which.iter().map(|&i| tasks[i].tp.topic).collect();
        topics.sort_unstable();
        topics.dedup();
        for t in topics {
            let idx: Vec<usize> = which
                .iter()
                .copied()
                .filter(|&i| tasks[i].tp.topic == t)
                .collect();
            let parts: Vec<(i32, Option<i64>)> = idx
                .iter()
                .map(|&i| (tasks[i].tp.partition, states[i].offset))
                .collect();
            let topic = &self.changelogs[t as usize];
            let read = changelog::read_many(&self.settings, topic, &parts, |j, e| {
                states[idx[j]].apply(e)
            })?;
            for (j, r) in read.into_iter().enumerate() {
                let i = idx[j];
                states[i].offset = Some(r.end_offset);
                reads[i].records += r.records;
                reads[i].bytes += r.bytes;
                reads[i].end_offset = r.end_offset;
            }
        }
        Ok(())
    }

    /// Puts one task's restored state into its operator, after checking it against the
    /// group's committed offset and this run's options. `read` is where the changelog
    /// read started and what it read.
    fn finish_restore(
        &mut self,
        task: &mut Task<F::Op>,
        state: Restoring,
        (from, read): (i64, ReadStats),
        committed: Option<i64>,
        took: std::time::Duration,
    ) -> Result<Option<i64>, RunError> {
        let topic = self.changelogs[task.tp.topic as usize].clone();
        let partition = task.tp.partition;
        let name = task.names[0].name.clone();
        task.changelog_end = state.offset;
        let Some(meta) = state.meta else {
            if let Some(o) = committed {
                return Err(RunError::Kafka(KafkaError::Invalid(format!(
                    "the group has committed offset {o} for {name} but its changelog {topic}/{partition} holds no state: the changelog was deleted or truncated, and starting empty would emit wrong sessions. Restore the changelog, or start over with a new --kafka-group"
                ))));
            }
            if !state.states.is_empty() {
                return Err(RunError::Kafka(KafkaError::Invalid(format!(
                    "the changelog {topic}/{partition} holds state but no progress record; it is damaged. Start over with a new --kafka-group"
                ))));
            }
            return Ok(None);
        };
        if let Some(o) = committed
            && o != meta.next_offset
        {
            return Err(RunError::Kafka(KafkaError::Invalid(format!(
                "the group's committed offset of {name} is {o} but its changelog says {}: the two are written in one transaction, so the offsets were changed by hand or the changelog is from another job. Use a new --kafka-group",
                meta.next_offset
            ))));
        }
        let differences = option_differences(&meta.options, &self.options);
        if !differences.is_empty() {
            return Err(RunError::OptionsChanged {
                dir: format!("changelog {topic}"),
                differences,
            });
        }
        task.op.restore_progress(&meta.watermark);
        for (key, value) in &state.states {
            task.op
                .restore_key(key, value, meta.state_format)
                .map_err(|reason| RunError::RestoreState {
                    dir: format!("changelog {topic}/{partition}"),
                    key: String::from_utf8_lossy(key).into_owned(),
                    reason: Box::new(reason),
                })?;
        }
        task.next_seq = meta.next_seq;
        task.carried = meta.counters.clone();
        task.committed = meta.counters.clone();
        task.flushed = meta.flushed;
        task.upstream = meta.upstream.clone();
        task.delta = meta.delta.clone();
        task.watermark_at_last_input = task.op.watermark();
        let micros = took.as_micros() as u64;
        self.restored.records += read.records;
        self.restored.bytes += read.bytes;
        self.restored.keys += state.states.len() as u64;
        self.restored.micros += micros;
        self.restores.push(RestoreStats {
            task: name.clone(),
            source: state.source.to_string(),
            changelog_from: from,
            changelog_end: state.offset.unwrap_or(from),
            changelog_records: read.records,
            keys: state.states.len() as u64,
            ms: micros / 1000,
        });
        self.telemetry.restored(
            &RestoreReport {
                source: &format!("{topic} (from {})", state.source),
                task: &name,
                epoch: None,
                records: read.records,
                bytes: read.bytes,
                keys: state.states.len() as u64,
                took,
            },
            0,
        );
        Ok(Some(meta.next_offset))
    }
}
