//! The tasks a process holds, as the consumer group assigns them: built (restored
//! from their changelogs in exactly-once mode) when partitions are gained, committed
//! and let go when they are revoked, dropped when they are lost, and rebuilt from
//! their last commit when a transaction aborts.

use crate::config::{KafkaStart, Partitioner};
use crate::error::RunError;
use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::task::Task;
use crate::stats::RunStats;
use sessionizer_checkpoint::Counters;
use sessionizer_connectors::Batch;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::consumer::{Rebalance, StartAt};
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_core::Watermark;
use std::time::Instant;

/// Test hook (cargo feature `fault-injection` only): when set, the open transaction is
/// aborted and every task rewound at each assignment and revocation, before it is
/// handled — as when the group moving on fences a commit made in the middle of a
/// rebalance (the tests of scale-out run with it to make that path happen every time,
/// not once in a while).
#[cfg(feature = "fault-injection")]
const ABORT_ON_REBALANCE_ENV: &str = "SESSIONIZER_TEST_ABORT_ON_REBALANCE";

#[cfg(feature = "fault-injection")]
fn abort_on_rebalance() -> bool {
    std::env::var_os(ABORT_ON_REBALANCE_ENV).is_some()
}

/// Without the feature `fault-injection` there is no hook: never.
#[cfg(not(feature = "fault-injection"))]
fn abort_on_rebalance() -> bool {
    false
}

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Takes on partitions: restores each one's task (from its changelog in durable
    /// mode), then starts reading them where their tasks stand.
    pub(in crate::runtime::kafka) fn gain(
        &mut self,
        parts: &[TopicPartition],
    ) -> Result<(), RunError> {
        let starts = self.build_tasks(parts)?;
        self.consumer.assign(&starts)?;
        Ok(())
    }

    /// Creates the tasks of `parts` — restored from their changelogs in durable mode —
    /// and returns where each starts reading.
    pub(in crate::runtime::kafka) fn build_tasks(
        &mut self,
        parts: &[TopicPartition],
    ) -> Result<Vec<(TopicPartition, StartAt)>, RunError> {
        let committed = if self.durable {
            // Waits for any transaction still open on these partitions' offsets (a
            // previous owner's) to end, so the changelog read next is stable too.
            self.consumer.committed(parts)?
        } else {
            vec![None; parts.len()]
        };
        let mut starts = Vec::with_capacity(parts.len());
        let mut fresh = Vec::new();
        let mut fresh_committed = Vec::new();
        for (&tp, committed) in parts.iter().zip(committed) {
            if let Some(rekey) = self.rekey.as_mut().filter(|r| r.is_input(tp)) {
                // An input partition that is re-keyed: only its position.
                let start = match (committed, self.kafka.start) {
                    (Some(o), _) => StartAt::Offset(o),
                    (None, KafkaStart::Earliest) => StartAt::Earliest,
                    (None, KafkaStart::Latest) => StartAt::Latest,
                };
                let (low, high) = self
                    .admin
                    .watermarks(&self.topics[tp.topic as usize], tp.partition)?;
                let at = match start {
                    StartAt::Offset(o) => o.max(low),
                    StartAt::Earliest => low,
                    StartAt::Latest => high,
                };
                rekey.hold(tp, at);
                starts.push((tp, StartAt::Offset(at)));
                continue;
            }
            fresh.push(self.new_task(tp)?);
            fresh_committed.push(committed);
        }
        let restored = if self.durable {
            self.restore_all(&mut fresh, &fresh_committed)?
        } else {
            vec![None; fresh.len()]
        };
        for ((mut task, restored_meta), committed) in
            fresh.into_iter().zip(restored).zip(fresh_committed)
        {
            let tp = task.tp;
            // A task new to the job commits its progress record with its first
            // offsets: a committed offset always has a changelog that explains it.
            task.dirty = restored_meta.is_none();
            let start = match (restored_meta, committed) {
                (Some(next), _) => StartAt::Offset(next),
                (None, Some(o)) => StartAt::Offset(o),
                (None, None) => match self.kafka.start {
                    KafkaStart::Earliest => StartAt::Earliest,
                    KafkaStart::Latest => StartAt::Latest,
                },
            };
            let topic = &self.topics[tp.topic as usize];
            let (low, high) = self.admin.watermarks(topic, tp.partition)?;
            task.next_offset = match start {
                StartAt::Offset(o) => o,
                StartAt::Earliest => low,
                StartAt::Latest => high,
            };
            if task.next_offset < low {
                tracing::warn!(
                    task = %task.names[0].name,
                    from = task.next_offset,
                    first_available = low,
                    "records the task has not read were deleted by the topic's retention; it goes on from the first one still there"
                );
                task.next_offset = low;
                task.dirty = true;
            }
            // Read from where the task stands; a task that starts fresh at "latest"
            // pins its start now so that the offset is known.
            starts.push((tp, StartAt::Offset(task.next_offset)));
            if self.kafka.stop_at_end {
                // The internal topic of --repartition has no end before every input was
                // re-keyed to its own (then `ends` has it).
                let internal = self.rekey.as_ref().is_some_and(|r| !r.is_input(tp));
                task.end = match self.ends.get(&tp) {
                    Some(&e) => Some(e),
                    None if internal => None,
                    None => Some(high),
                };
            }
            #[cfg(feature = "delta")]
            self.open_table(&mut task)?;
            self.progress_at.entry(tp).or_insert_with(Instant::now);
            self.tasks.insert(tp, task);
        }
        // A restore puts keys into the tasks' stores too (most of them on disk when
        // the budget is small): the stats count them before any record is read.
        self.sample_state_stores();
        Ok(starts)
    }

    pub(in crate::runtime::kafka) fn new_task(
        &self,
        tp: TopicPartition,
    ) -> Result<Task<F::Op>, RunError> {
        let topic = &self.topics[tp.topic as usize];
        let name = format!("{topic}-{}", tp.partition);
        let mut op = self.factory.new_op(&name, self.stores.as_ref())?;
        if self.durable {
            op.track_changes();
        }
        if self.rekey.as_ref().is_some_and(|r| !r.is_input(tp)) {
            // A task of the re-keyed topic keeps the time of the input partitions.
            op.follow_upstream();
        }
        // The job's own re-keying topic is keyed by it; an input declared keyed by a
        // custom partitioner is trusted.
        let checked = self.kafka.partitioner == Partitioner::Standard && self.rekey.is_none();
        let placement = checked
            .then(|| KeyPlacement::new(tp.partition, self.partition_counts[tp.topic as usize]));
        Ok(Task {
            tp,
            names: vec![SourceName::partition(topic, tp.partition)],
            last_offset: -1,
            op,
            first_invalid: None,
            placement,
            misplaced: (0, None),
            batch: Batch::default(),
            key_spans: Vec::new(),
            offsets: Vec::new(),
            held: None,
            cut: false,
            staged_at: Instant::now(),
            keys: Vec::new(),
            next_offset: 0,
            next_seq: 0,
            end: None,
            changelog_end: None,
            carried: Counters::default(),
            committed: Counters::default(),
            run: RunStats::default(),
            dirty: false,
            flushed: false,
            last_input: Instant::now(),
            watermark_at_last_input: Watermark::MIN,
            upstream: Default::default(),
            upstream_changed: false,
            table: None,
            delta: None,
            table_prepared: false,
        })
    }

    /// Drops a task, keeping this process's committed share of its accounting.
    pub(in crate::runtime::kafka) fn release(&mut self, tp: &TopicPartition) {
        if let Some(r) = &mut self.rekey {
            r.release(tp);
        }
        if let Some(task) = self.tasks.remove(tp) {
            if let Some(c) = task.op.spill_counts() {
                self.released_store.0 += c.evicted;
                self.released_store.1 += c.unspilled;
            }
            self.telemetry.task_removed(&task.names[0].name);
            self.released.add_counters(&task.committed);
            self.released.sub_counters(&task.carried);
        }
    }

    /// Partitions lost in a rebalance (another member may own them already) go before
    /// anything else of the rebalance: a commit still running ends first, without the
    /// rewind of an aborted one, which then covers only the partitions kept — a lost
    /// partition is neither restored nor sought again. (`rebalance` then finishes the
    /// loss: it counts them, lets the consumer go of them and aborts what is open.)
    pub(in crate::runtime::kafka) fn let_lost_go(
        &mut self,
        events: &[Rebalance],
    ) -> Result<(), RunError> {
        let lost: Vec<TopicPartition> = events
            .iter()
            .filter_map(|e| match e {
                Rebalance::Lost(parts) => Some(parts),
                _ => None,
            })
            .flatten()
            .copied()
            .collect();
        if lost.is_empty() {
            return Ok(());
        }
        let aborted = self.join_pending()?;
        for tp in &lost {
            self.release(tp);
        }
        if aborted {
            self.rewind()?;
        }
        Ok(())
    }

    pub(in crate::runtime::kafka) fn rebalance(
        &mut self,
        event: Rebalance,
    ) -> Result<(), RunError> {
        let (kind, parts) = match &event {
            Rebalance::Assign(p) => ("assign", p),
            Rebalance::Revoke(p) => ("revoke", p),
            Rebalance::Lost(p) => ("lost", p),
        };
        self.telemetry.rebalance(kind, &self.names_of(parts));
        if abort_on_rebalance() && !matches!(event, Rebalance::Lost(_)) {
            // Test hook: the commit that a rebalance fences, at the worst instant.
            self.abort_and_rewind(&"test hook: aborted at a rebalance")?;
        }
        match event {
            Rebalance::Assign(parts) => {
                self.assigned_events += 1;
                self.assigned += parts.len() as u64;
                let began = Instant::now();
                let before = self.restored;
                self.gain(&parts)?;
                tracing::info!(
                    partitions = ?self.names_of(&parts),
                    restored_records = self.restored.records - before.records,
                    restored_bytes = self.restored.bytes - before.bytes,
                    restored_keys = self.restored.keys - before.keys,
                    ms = began.elapsed().as_millis() as u64,
                    "partitions assigned"
                );
                Ok(())
            }
            Rebalance::Revoke(parts) => {
                // Commit what the leaving tasks did, keep a local snapshot of them
                // (they may come back), then let them go.
                self.commit()?;
                self.write_snapshots(&parts);
                self.revoked += parts.len() as u64;
                for tp in &parts {
                    self.release(tp);
                }
                self.consumer.unassign(&parts)?;
                Ok(())
            }
            Rebalance::Lost(parts) => {
                // Another member may own them already: nothing of theirs may be
                // committed. The open transaction holds their changes and the others':
                // abort it and rewind the others to their last commit.
                self.revoked += parts.len() as u64;
                for tp in &parts {
                    self.release(tp);
                }
                self.consumer.unassign(&parts)?;
                self.abort_and_rewind(&"partitions lost in a rebalance")
            }
        }
    }

    /// Aborts the open transaction and puts every task back to its last commit.
    pub(in crate::runtime::kafka) fn abort_and_rewind(
        &mut self,
        why: &dyn std::fmt::Display,
    ) -> Result<(), RunError> {
        self.txns
            .abort(self.producer.as_mut(), &self.telemetry, why)?;
        self.rewind()
    }

    /// Puts every task back to its last commit (after an aborted transaction): drops
    /// them and restores them again from their changelogs.
    pub(in crate::runtime::kafka) fn rewind(&mut self) -> Result<(), RunError> {
        let mut parts: Vec<TopicPartition> = self.tasks.keys().copied().collect();
        if let Some(r) = &self.rekey {
            parts.extend(r.positions.keys());
        }
        if parts.is_empty() {
            return Ok(());
        }
        for tp in &parts {
            self.release(tp);
        }
        for (tp, start) in self.build_tasks(&parts)? {
            if let StartAt::Offset(o) = start {
                self.consumer.seek(tp, o)?;
            }
        }
        Ok(())
    }
}
