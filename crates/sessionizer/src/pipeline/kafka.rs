//! The Kafka driver (SPEC §2 tasks, §3 Kafka output, §5): every input partition is a
//! task with its own session operator, watermark, offsets and counters.
//!
//! One loop on one thread: poll records into each task's batch, run every task's batch
//! through the same decode and sessionize phases as a file input (one shard per task),
//! send what came out, and every `--checkpoint-interval` commit. Three ways to run:
//!
//! * **Kafka in, Kafka out** (`--kafka-topic` with `--kafka-output-topic`): a consumer
//!   group member. A commit is one transaction holding the output records, the side
//!   outputs, each changed task's state changes and progress record in its changelog
//!   partition, and the consumed offsets. A partition gained in a rebalance is restored
//!   from its changelog before any of its records is read; one lost is committed first.
//! * **Kafka in, files or stdout out**: the partitions of the topics are assigned
//!   directly (no group); the state lives only in memory and nothing is committed, so a
//!   run starts from `--kafka-start` every time, as a file run starts at the top.
//! * **Files in, Kafka out** is the file driver with a Kafka sink (see [`super`]).

use super::RunError;
use super::parse::{self, Kind, ParseSettings, Parsed};
use super::shard::Shard;
use crate::config::{KafkaConfig, KafkaStart, OnInvalid, PipelineConfig};
use crate::stats::{KafkaStats, RunStats};
use crate::telemetry::{CheckpointKind, CheckpointReport, RestoreReport, TaskReport, Telemetry};
use serde::{Deserialize, Serialize};
use sessionizer_checkpoint::{Counters, WatermarkState};
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::input::LineSpan;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::kafka::changelog::{self, Entry};
use sessionizer_connectors::kafka::consumer::{GroupConsumer, Polled, Rebalance, StartAt};
use sessionizer_connectors::kafka::partitioner::partition_for;
use sessionizer_connectors::kafka::producer::{CommitError, TxnProducer};
use sessionizer_connectors::kafka::{KafkaError, KafkaSettings, TopicPartition};
use sessionizer_connectors::{Batch, OutputTarget, RecordWriter, SessionEncoder};
use sessionizer_core::decode::Decoder;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::{EmitMode, codec, session_id};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Bytes of records staged per task before its batch is processed.
const TASK_BATCH_BYTES: usize = 2 << 20;
/// Records polled in one round before the staged batches are processed.
const ROUND_RECORDS: usize = 50_000;

/// The version of the progress record's layout.
const META_VERSION: u32 = 1;

/// A task's progress, the `m` record of its changelog partition (JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskMeta {
    /// Layout version of this record.
    version: u32,
    /// The checkpoint format version of the state records (the value codec).
    state_format: u16,
    /// The next input offset to read.
    next_offset: i64,
    /// The sequence number of the task's next record (orders values of equal time).
    next_seq: u64,
    /// Where event time stands in this partition.
    watermark: WatermarkState,
    /// The task's accounting, cumulative over every process that held it.
    counters: Counters,
    /// The end of the input was reached without `--keep-open`: every session was emitted.
    flushed: bool,
    /// The options that shape the state; a restore with others is refused.
    options: Vec<(String, String)>,
}

/// Where one kind of output goes.
enum Out {
    /// A Kafka topic with this many partitions.
    Topic { name: String, partitions: usize },
    /// A file, stdout or stderr.
    Writer(RecordWriter),
}

impl Out {
    fn new(
        topic: &Option<String>,
        target: &OutputTarget,
        admin: &Admin,
        role: &'static str,
    ) -> Result<Out, RunError> {
        Ok(match topic {
            Some(name) => Out::Topic {
                partitions: admin.require(name, role)?,
                name: name.clone(),
            },
            None => Out::Writer(RecordWriter::new(target.clone())),
        })
    }
}

/// One input partition: its operator, watermark, offsets and counters.
struct Task {
    tp: TopicPartition,
    /// `topic/partition`, for positions in side outputs.
    names: [SourceName; 1],
    shard: Shard,
    decoder: Decoder,
    parsed: Parsed,
    /// Records staged since the last processing: values as lines, line number = offset.
    batch: Batch,
    /// The staged records' keys (`(start, len)` in `keys`, `len == u32::MAX`: none).
    key_spans: Vec<(u32, u32)>,
    keys: Vec<u8>,
    /// The next offset to read (after the last record processed).
    next_offset: i64,
    next_seq: u64,
    /// `--stop-at-end`: the offset at which this partition is done.
    end: Option<i64>,
    /// Counters from before this process held the task.
    carried: Counters,
    /// The task's cumulative counters at its last commit by this process (`carried`
    /// before the first).
    committed: Counters,
    /// This process's counters for the task (the shard keeps its verdict counts).
    run: RunStats,
    /// Processed records not yet committed.
    dirty: bool,
    flushed: bool,
    last_input: Instant,
    watermark_at_last_input: Watermark,
}

impl Task {
    fn counters(&self) -> Counters {
        let mut total = self.run.clone();
        super::add_shard_counts(&mut total, std::slice::from_ref(&self.shard));
        total.add_counters(&self.carried);
        total.counters()
    }

    fn done(&self) -> bool {
        self.end.is_some_and(|e| self.next_offset >= e)
    }

    fn meta(&self, options: &[(String, String)]) -> TaskMeta {
        TaskMeta {
            version: META_VERSION,
            state_format: sessionizer_checkpoint::FORMAT_VERSION,
            next_offset: self.next_offset,
            next_seq: self.next_seq,
            watermark: WatermarkState {
                max_event_time_ms: self.shard.max_event_time().map(|t| t.millis()),
                watermark_ms: self.shard.op.watermark().millis(),
                largest_gap_ms: self.shard.largest_gap().millis(),
                new_key_floor_ms: Some(self.shard.op.new_key_floor()),
            },
            counters: self.counters(),
            flushed: self.flushed,
            options: options.to_vec(),
        }
    }
}

/// What a restore found, for the logs and the stats.
#[derive(Debug, Clone, Copy, Default)]
struct Restored {
    records: u64,
    bytes: u64,
    keys: u64,
    micros: u64,
}

/// Runs a job whose input is Kafka topics.
pub(crate) fn run(
    cfg: &PipelineConfig,
    kafka: &KafkaConfig,
    telemetry: &Telemetry,
) -> Result<RunStats, RunError> {
    KafkaJob::open(cfg, kafka, telemetry)?.run()
}

struct KafkaJob<'c> {
    cfg: &'c PipelineConfig,
    kafka: &'c KafkaConfig,
    settings: KafkaSettings,
    admin: Admin,
    consumer: GroupConsumer,
    /// The transactional producer (any output is a topic).
    producer: Option<TxnProducer>,
    /// Exactly-once mode: a group, changelogs, offsets in the transactions.
    durable: bool,
    sessions: Out,
    dead: Out,
    late: Out,
    /// The changelog topic of each input topic (durable mode).
    changelogs: Vec<String>,
    tasks: BTreeMap<TopicPartition, Task>,
    encoder: SessionEncoder,
    options: Vec<(String, String)>,
    started: Instant,
    last_commit: Instant,
    restored: Restored,
    /// This process's committed share of the tasks it gave up (revoked, lost, rewound).
    released: RunStats,
    commits: u64,
    aborts: u64,
    assigned: u64,
    revoked: u64,
    /// Scratch.
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
    telemetry: Telemetry,
}

impl<'c> KafkaJob<'c> {
    fn open(
        cfg: &'c PipelineConfig,
        kafka: &'c KafkaConfig,
        telemetry: &Telemetry,
    ) -> Result<KafkaJob<'c>, RunError> {
        let settings = KafkaSettings {
            brokers: kafka.brokers.clone(),
            properties: kafka.properties.clone(),
            timeout: kafka.timeout,
        };
        let admin = Admin::new(&settings)?;
        let mut partitions = Vec::new();
        for t in &kafka.topics {
            partitions.push(admin.require(t, "input, --kafka-topic")?);
        }
        let durable = kafka.is_sink();
        let group = kafka.group.as_deref();
        if durable && group.is_none() {
            return Err(RunError::Kafka(KafkaError::Invalid(
                "--kafka-output-topic with a Kafka input needs --kafka-group: the group names the job (its changelog topics, its offsets)".into(),
            )));
        }
        let sessions = Out::new(
            &kafka.output_topic,
            &cfg.output,
            &admin,
            "output, --kafka-output-topic",
        )?;
        let dead = Out::new(
            &kafka.dead_letter_topic,
            &cfg.dead_letter,
            &admin,
            "--dead-letter-topic",
        )?;
        let late = Out::new(&kafka.late_topic, &cfg.late_output, &admin, "--late-topic")?;
        let mut changelogs = Vec::new();
        if let (true, Some(g)) = (durable, group) {
            for (t, &n) in kafka.topics.iter().zip(&partitions) {
                let name = changelog_topic(g, t);
                admin.ensure_changelog(&name, n)?;
                changelogs.push(name);
            }
        }
        let any_topic = [&sessions, &dead, &late]
            .iter()
            .any(|o| matches!(o, Out::Topic { .. }));
        let producer = if any_topic {
            let id = transactional_id(group, kafka.instance_id.as_deref());
            Some(TxnProducer::new(&settings, &id, kafka.transaction_timeout)?)
        } else {
            None
        };
        let consumer = GroupConsumer::new(
            &settings,
            &kafka.topics,
            if durable { group } else { None },
            kafka.instance_id.as_deref(),
        )?;
        let encoder = SessionEncoder::new(&cfg.aggregate_names(), cfg.emit == EmitMode::OnUpdate);
        let mut job = KafkaJob {
            cfg,
            kafka,
            settings,
            admin,
            consumer,
            producer,
            durable,
            sessions,
            dead,
            late,
            changelogs,
            tasks: BTreeMap::new(),
            encoder,
            options: cfg.state_options(),
            started: Instant::now(),
            last_commit: Instant::now(),
            restored: Restored::default(),
            released: RunStats::default(),
            commits: 0,
            aborts: 0,
            assigned: 0,
            revoked: 0,
            key_buf: Vec::new(),
            value_buf: Vec::new(),
            telemetry: telemetry.clone(),
        };
        for w in [&mut job.sessions, &mut job.dead, &mut job.late] {
            if let Out::Writer(w) = w
                && matches!(w.target(), OutputTarget::File(_))
            {
                w.open()?;
            }
        }
        if durable {
            job.consumer.subscribe()?;
        } else {
            // No group: every partition of every topic, from --kafka-start.
            let mut all = Vec::new();
            for (ti, &n) in partitions.iter().enumerate() {
                for p in 0..n as i32 {
                    all.push(TopicPartition {
                        topic: ti as u32,
                        partition: p,
                    });
                }
            }
            job.gain(&all)?;
        }
        Ok(job)
    }

    fn run(mut self) -> Result<RunStats, RunError> {
        let idle = self
            .cfg
            .idle_timeout
            .map(|d| Duration::from_millis(u64::try_from(d.millis()).unwrap_or(0)));
        let interval = self.commit_interval();
        let mut staged = 0usize;
        loop {
            for event in self.consumer.take_rebalances() {
                self.process_staged()?;
                self.rebalance(event)?;
            }
            self.telemetry.running();
            self.telemetry.answer_queries(|key| {
                let key = key.as_bytes();
                self.tasks
                    .values()
                    .filter_map(|t| super::lookup::describe(&t.shard, key, &t.names[0].name))
                    .collect()
            });
            if self.kafka.stop_at_end
                && !self.tasks.is_empty()
                && self.tasks.values().all(Task::done)
            {
                break;
            }
            // Poll a round: wait for the first record, then take what is ready.
            let mut round = 0;
            let mut wait = Duration::from_millis(100);
            loop {
                match self.consumer.poll(wait)? {
                    Polled::Nothing => break,
                    Polled::End => {}
                    Polled::Record(r) => {
                        if let Some(task) = self.tasks.get_mut(&r.from) {
                            staged += stage(task, r.offset(), r.key(), r.value());
                            round += 1;
                        }
                    }
                }
                wait = Duration::ZERO;
                if round >= ROUND_RECORDS
                    || staged >= TASK_BATCH_BYTES * self.tasks.len().max(1)
                    || self.consumer.rebalance_pending()
                {
                    break;
                }
            }
            self.process_staged()?;
            staged = 0;
            if let Some(limit) = idle {
                self.advance_idle(limit)?;
            }
            self.report();
            if self.last_commit.elapsed() >= interval {
                self.commit()?;
            }
        }
        // Every partition reached its end offset: end as a file input does.
        if !self.keep_open() {
            for task in self.tasks.values_mut() {
                if !task.flushed {
                    task.shard.clear_outputs();
                    task.shard.finish();
                    task.flushed = true;
                    task.dirty = true;
                }
            }
            let ids: Vec<TopicPartition> = self.tasks.keys().copied().collect();
            for id in ids {
                self.send_outputs(id, None)?;
            }
        }
        self.commit()?;
        for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
            if let Out::Writer(w) = w {
                w.finish()?;
            }
        }
        self.report();
        let stats = self.stats();
        self.consumer.close();
        Ok(stats)
    }

    fn keep_open(&self) -> bool {
        self.kafka.keep_open
    }

    /// Where every task stands, for telemetry (and the progress line).
    fn report(&self) {
        let reports: Vec<TaskReport<'_>> = self
            .tasks
            .values()
            .map(|t| TaskReport {
                task: &t.names[0].name,
                counts: super::task_counts(&t.run, std::slice::from_ref(&t.shard)),
                watermark: t.shard.op.watermark(),
                open_sessions: t.shard.op.open_sessions() as u64,
                keys: t.shard.op.keys() as u64,
            })
            .collect();
        self.telemetry.batch(&reports);
    }

    /// `topic/partition` of each of `parts`.
    fn partition_names(&self, parts: &[TopicPartition]) -> Vec<String> {
        parts
            .iter()
            .map(|tp| format!("{}/{}", self.kafka.topics[tp.topic as usize], tp.partition))
            .collect()
    }

    fn commit_interval(&self) -> Duration {
        self.kafka.commit_interval
    }

    /// Takes on partitions: restores each one's task (from its changelog in durable
    /// mode), then starts reading them where their tasks stand.
    fn gain(&mut self, parts: &[TopicPartition]) -> Result<(), RunError> {
        let starts = self.build_tasks(parts)?;
        self.consumer.assign(&starts)?;
        Ok(())
    }

    /// Creates the tasks of `parts` — restored from their changelogs in durable mode —
    /// and returns where each starts reading.
    fn build_tasks(
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
        for (&tp, committed) in parts.iter().zip(committed) {
            let mut task = self.new_task(tp);
            let restored_meta = if self.durable {
                self.restore(&mut task, committed)?
            } else {
                None
            };
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
            let topic = &self.kafka.topics[tp.topic as usize];
            let (low, high) = self.admin.watermarks(topic, tp.partition)?;
            task.next_offset = match start {
                StartAt::Offset(o) => o,
                StartAt::Earliest => low,
                StartAt::Latest => high,
            };
            // Read from where the task stands; a task that starts fresh at "latest"
            // pins its start now so that the offset is known.
            starts.push((tp, StartAt::Offset(task.next_offset.max(low))));
            if self.kafka.stop_at_end {
                task.end = Some(high);
            }
            if task.flushed && task.end.is_none_or(|e| task.next_offset < e) {
                return Err(RunError::Resume {
                    dir: format!("Kafka group {}", self.kafka.group.as_deref().unwrap_or("")),
                    message: format!(
                        "partition {} ended a --stop-at-end run with every session emitted (no --keep-open), and more records came after; use a new --kafka-group, or --keep-open for runs that continue",
                        task.names[0].name
                    ),
                });
            }
            self.tasks.insert(tp, task);
        }
        Ok(starts)
    }

    fn new_task(&self, tp: TopicPartition) -> Task {
        let topic = &self.kafka.topics[tp.topic as usize];
        let mut shard = Shard::new(
            0,
            self.cfg.window_config(),
            self.cfg.watermark_delay,
            self.encoder.clone(),
            true,
        );
        if self.durable {
            shard.track_changes();
        }
        Task {
            tp,
            names: [SourceName::partition(topic, tp.partition)],
            shard,
            decoder: Decoder::new(self.cfg.decoder_config()),
            parsed: Parsed::default(),
            batch: Batch::default(),
            key_spans: Vec::new(),
            keys: Vec::new(),
            next_offset: 0,
            next_seq: 0,
            end: None,
            carried: Counters::default(),
            committed: Counters::default(),
            run: RunStats::default(),
            dirty: false,
            flushed: false,
            last_input: Instant::now(),
            watermark_at_last_input: Watermark::MIN,
        }
    }

    /// Reads the task's changelog partition to its end and puts its state back; returns
    /// the offset the task goes on from, `None` when the changelog has no progress
    /// record (a task never committed).
    fn restore(
        &mut self,
        task: &mut Task,
        committed: Option<i64>,
    ) -> Result<Option<i64>, RunError> {
        let began = Instant::now();
        self.telemetry.restoring();
        let topic = &self.changelogs[task.tp.topic as usize];
        let mut states: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut meta: Option<TaskMeta> = None;
        let read =
            changelog::read_to_end(&self.settings, topic, task.tp.partition, None, |entry| {
                match entry {
                    Entry::State {
                        key,
                        value: Some(v),
                    } => {
                        states.insert(key.to_vec(), v.to_vec());
                    }
                    Entry::State { key, value: None } => {
                        states.remove(key);
                    }
                    Entry::Meta(bytes) => {
                        let m: TaskMeta = serde_json::from_slice(bytes)
                            .map_err(|e| format!("unreadable progress record: {e}"))?;
                        if m.version != META_VERSION {
                            return Err(format!(
                                "progress record version {} (this build reads {META_VERSION})",
                                m.version
                            ));
                        }
                        meta = Some(m);
                    }
                }
                Ok(())
            })?;
        let name = task.names[0].name.clone();
        let Some(meta) = meta else {
            if let Some(o) = committed {
                return Err(RunError::Kafka(KafkaError::Invalid(format!(
                    "the group has committed offset {o} for {name} but its changelog {topic}/{} holds no state: the changelog was deleted or truncated, and starting empty would emit wrong sessions. Restore the changelog, or start over with a new --kafka-group",
                    task.tp.partition
                ))));
            }
            if !states.is_empty() {
                return Err(RunError::Kafka(KafkaError::Invalid(format!(
                    "the changelog {topic}/{} holds state but no progress record; it is damaged. Start over with a new --kafka-group",
                    task.tp.partition
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
        task.shard.restore_progress(&meta.watermark);
        for (key, value) in &states {
            task.shard
                .restore_key(key, value, meta.state_format)
                .map_err(|reason| RunError::RestoreState {
                    dir: format!("changelog {topic}/{}", task.tp.partition),
                    key: String::from_utf8_lossy(key).into_owned(),
                    reason,
                })?;
        }
        task.next_seq = meta.next_seq;
        task.carried = meta.counters.clone();
        task.committed = meta.counters.clone();
        task.flushed = meta.flushed;
        task.watermark_at_last_input = task.shard.op.watermark();
        self.restored.records += read.records;
        self.restored.bytes += read.bytes;
        self.restored.keys += states.len() as u64;
        self.restored.micros += began.elapsed().as_micros() as u64;
        self.telemetry.restored(
            &RestoreReport {
                source: topic,
                task: &name,
                epoch: None,
                records: read.records,
                bytes: read.bytes,
                keys: states.len() as u64,
                took: began.elapsed(),
            },
            0,
        );
        Ok(Some(meta.next_offset))
    }

    /// Drops a task, keeping this process's committed share of its accounting.
    fn release(&mut self, tp: &TopicPartition) {
        if let Some(task) = self.tasks.remove(tp) {
            self.telemetry.task_removed(&task.names[0].name);
            self.released.add_counters(&task.committed);
            self.released.sub_counters(&task.carried);
        }
    }

    fn rebalance(&mut self, event: Rebalance) -> Result<(), RunError> {
        let (kind, parts) = match &event {
            Rebalance::Assign(p) => ("assign", p),
            Rebalance::Revoke(p) => ("revoke", p),
            Rebalance::Lost(p) => ("lost", p),
        };
        self.telemetry.rebalance(kind, &self.partition_names(parts));
        match event {
            Rebalance::Assign(parts) => {
                self.assigned += parts.len() as u64;
                self.gain(&parts)
            }
            Rebalance::Revoke(parts) => {
                // Commit what the leaving tasks did, then let them go.
                self.commit()?;
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
                if let Some(p) = &mut self.producer {
                    p.abort().map_err(commit_error)?;
                }
                self.telemetry
                    .transaction_aborted(&"partitions lost in a rebalance");
                self.aborts += 1;
                self.revoked += parts.len() as u64;
                for tp in &parts {
                    self.release(tp);
                }
                self.consumer.unassign(&parts)?;
                self.rewind()
            }
        }
    }

    /// Puts every task back to its last commit (after an aborted transaction): drops
    /// them and restores them again from their changelogs.
    fn rewind(&mut self) -> Result<(), RunError> {
        let parts: Vec<TopicPartition> = self.tasks.keys().copied().collect();
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

    /// Runs every task's staged records through decode and sessionize, and sends what
    /// came out.
    fn process_staged(&mut self) -> Result<(), RunError> {
        let ids: Vec<TopicPartition> = self
            .tasks
            .iter()
            .filter(|(_, t)| !t.batch.lines.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let task = self.tasks.get_mut(&id).expect("staged task exists");
            let n = task.batch.lines.len();
            let settings = ParseSettings {
                aggregates: self.cfg.aggregates.len(),
                shards: 1,
                on_invalid: self.cfg.on_invalid,
                names: &task.names,
            };
            parse::parse_range(
                &task.batch,
                0..n,
                &mut task.decoder,
                settings,
                &mut task.parsed,
            );
            if let Some((line, reason)) = &task.parsed.first_invalid {
                let span = task.batch.lines[*line as usize];
                return Err(RunError::InvalidRecord {
                    position: task.names[0].pos(span.line_no).to_string(),
                    reason: reason.clone(),
                });
            }
            let p = &task.parsed;
            task.run.blank_lines += p.blank;
            task.run.invalid += p.invalid;
            task.run.records_read += p.recs.len() as u64 - p.blank;
            task.run.bytes_read += task.batch.data.len() as u64;
            task.shard.clear_outputs();
            task.shard.process(
                &task.batch,
                std::slice::from_ref(&task.parsed),
                task.next_seq,
                &task.names,
            );
            task.next_seq += n as u64;
            let last = task.batch.lines[n - 1].line_no as i64;
            task.next_offset = last + 1;
            task.dirty = true;
            task.last_input = Instant::now();
            task.watermark_at_last_input = task.shard.op.watermark();
            self.send_outputs(id, Some(()))?;
            let task = self.tasks.get_mut(&id).expect("task exists");
            task.batch.lines.clear();
            task.batch.data.clear();
            task.key_spans.clear();
            task.keys.clear();
        }
        if let Some(p) = &self.producer {
            p.poll();
        }
        Ok(())
    }

    /// Sends a task's outputs of its last step: sessions and retractions, late events,
    /// and (`with_batch`) the dead letters of the batch just decoded.
    fn send_outputs(&mut self, id: TopicPartition, with_batch: Option<()>) -> Result<(), RunError> {
        let KafkaJob {
            tasks,
            producer,
            sessions,
            dead,
            late,
            key_buf,
            ..
        } = self;
        let task = tasks.get_mut(&id).expect("task exists");
        self.telemetry
            .sessions_completed(task.shard.out.completed, Instant::now());
        // Dead letters first: they come from decoding, before any session of the batch.
        if with_batch.is_some()
            && self.cfg.on_invalid == OnInvalid::DeadLetter
            && task.parsed.invalid > 0
        {
            let invalid_lines = task
                .parsed
                .recs
                .iter()
                .filter(|r| r.kind == Kind::Invalid)
                .map(|r| r.line as usize);
            let records = task
                .parsed
                .dead
                .split(|&b| b == b'\n')
                .filter(|r| !r.is_empty());
            match dead {
                Out::Writer(w) => w.append(&task.parsed.dead, task.parsed.invalid)?,
                Out::Topic { name, .. } => {
                    let p = producer.as_mut().expect("a topic output has a producer");
                    for (line, record) in invalid_lines.zip(records) {
                        let key = message_key(task, line);
                        p.send(name, None, key, Some(record), false)
                            .map_err(commit_error)?;
                    }
                }
            }
        }
        let out = &task.shard.out;
        match sessions {
            Out::Writer(w) => w.append(&out.encoder.buf, out.tags.len() as u64)?,
            Out::Topic { name, partitions } => {
                let p = producer.as_mut().expect("a topic output has a producer");
                for tag in &out.tags {
                    let key = out.key(tag);
                    let record = &out.encoder.buf[tag.bytes.0..tag.bytes.0 + tag.bytes.1];
                    let record = record.strip_suffix(b"\n").unwrap_or(record);
                    let partition = partition_for(key, *partitions);
                    key_buf.clear();
                    write_hex(session_id(key, tag.start), key_buf);
                    let value = (!tag.retract).then_some(record);
                    p.send(name, Some(partition), Some(key_buf), value, tag.retract)
                        .map_err(commit_error)?;
                }
            }
        }
        if !task.shard.late_steps.is_empty() {
            match late {
                Out::Writer(w) => w.append(&task.shard.late, task.shard.late_steps.len() as u64)?,
                Out::Topic { name, .. } => {
                    let p = producer.as_mut().expect("a topic output has a producer");
                    let first = task.next_seq - task.batch.lines.len() as u64;
                    for &(step, from, len) in &task.shard.late_steps {
                        let record = &task.shard.late[from..from + len];
                        let record = record.strip_suffix(b"\n").unwrap_or(record);
                        let line = step.checked_sub(first).map(|l| l as usize);
                        let key = line.and_then(|l| message_key(task, l));
                        p.send(name, None, key, Some(record), false)
                            .map_err(commit_error)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves the watermark of every task whose partition has been quiet for `limit`
    /// on with the wall clock (SPEC §2).
    fn advance_idle(&mut self, limit: Duration) -> Result<(), RunError> {
        let ids: Vec<TopicPartition> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                t.last_input.elapsed() >= limit
                    && t.watermark_at_last_input.is_finite()
                    && !t.flushed
            })
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let task = self.tasks.get_mut(&id).expect("task exists");
            let quiet = i64::try_from(task.last_input.elapsed().as_millis()).unwrap_or(i64::MAX);
            let w = Watermark::at(EventTime(
                task.watermark_at_last_input.millis().saturating_add(quiet),
            ));
            if w <= task.shard.op.watermark() {
                continue;
            }
            task.shard.clear_outputs();
            task.shard.advance_idle(w, task.next_seq);
            if task.shard.out.tags.is_empty() && task.shard.late_steps.is_empty() {
                continue;
            }
            task.dirty = true;
            self.send_outputs(id, None)?;
        }
        Ok(())
    }

    /// Commits: in durable mode one transaction with every changed task's state
    /// changes and progress record and every task's offsets; otherwise the outputs are
    /// flushed (and a transaction holding side outputs to topics committed).
    fn commit(&mut self) -> Result<(), RunError> {
        self.last_commit = Instant::now();
        // The changelog records of the transaction, for telemetry.
        let (mut bytes, mut keys) = (0u64, 0u64);
        let KafkaJob {
            tasks,
            producer,
            changelogs,
            options,
            key_buf,
            value_buf,
            consumer,
            durable,
            ..
        } = self;
        if let Some(p) = producer.as_mut() {
            if *durable {
                for task in tasks.values_mut().filter(|t| t.dirty) {
                    let topic = &changelogs[task.tp.topic as usize];
                    let partition = Some(task.tp.partition);
                    let mut failed = None;
                    task.shard.op.drain_changes(|key, sessions| {
                        if failed.is_some() {
                            return;
                        }
                        changelog::state_key(key, key_buf);
                        let value = sessions.map(|s| {
                            value_buf.clear();
                            codec::encode_sessions(s, value_buf);
                            &value_buf[..]
                        });
                        keys += 1;
                        bytes += (key_buf.len() + value.map_or(0, <[u8]>::len)) as u64;
                        if let Err(e) = p.send(topic, partition, Some(key_buf), value, false) {
                            failed = Some(e);
                        }
                    });
                    if let Some(e) = failed {
                        return Err(commit_error(e));
                    }
                    let meta =
                        serde_json::to_vec(&task.meta(options)).expect("progress record encodes");
                    bytes += meta.len() as u64;
                    p.send(
                        topic,
                        partition,
                        Some(changelog::META_KEY),
                        Some(&meta),
                        false,
                    )
                    .map_err(commit_error)?;
                    task.dirty = false;
                }
                let next: Vec<(TopicPartition, i64)> =
                    tasks.values().map(|t| (t.tp, t.next_offset)).collect();
                let offsets = consumer.offsets(&next)?;
                let group = consumer.group_metadata();
                match p.commit(group.as_ref().map(|g| (&offsets, g))) {
                    Ok(()) => {
                        self.telemetry.checkpoint(&CheckpointReport {
                            kind: CheckpointKind::Transaction,
                            epoch: None,
                            bytes,
                            keys,
                            took: self.last_commit.elapsed(),
                        });
                        self.commits += 1;
                        for task in self.tasks.values_mut() {
                            task.committed = task.counters();
                        }
                    }
                    Err(CommitError::Aborted(why)) => {
                        self.telemetry.transaction_aborted(&why);
                        self.aborts += 1;
                        return self.rewind();
                    }
                    Err(e) => return Err(commit_error(e)),
                }
            } else {
                p.commit(None).map_err(commit_error)?;
            }
        }
        if !self.durable {
            // Nothing is committed to Kafka: what the outputs were given is this
            // process's share.
            for task in self.tasks.values_mut() {
                task.committed = task.counters();
            }
        }
        for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
            if let Out::Writer(w) = w {
                w.finish()?;
            }
        }
        self.telemetry.outputs_written();
        Ok(())
    }

    /// The run's summary: this process's share of the job (what it committed for the
    /// tasks it held), and the job's cumulative counters of the tasks it holds now.
    fn stats(&self) -> RunStats {
        let mut stats = self.released.clone();
        let mut job = RunStats::default();
        for task in self.tasks.values() {
            stats.add_counters(&task.committed);
            stats.sub_counters(&task.carried);
            job.add_counters(&task.committed);
        }
        stats.kafka = Some(KafkaStats {
            partitions: self
                .tasks
                .values()
                .map(|t| t.names[0].name.clone())
                .collect(),
            job: job.counters(),
            commits: self.commits,
            aborts: self.aborts,
            assigned: self.assigned,
            revoked: self.revoked,
            restored_records: self.restored.records,
            restored_bytes: self.restored.bytes,
            restored_keys: self.restored.keys,
            restore_ms: self.restored.micros / 1000,
        });
        stats.elapsed_ms = self.started.elapsed().as_millis() as u64;
        stats.peak_rss_bytes = crate::stats::peak_rss_bytes();
        stats
    }
}

/// The Kafka key of the record on line `line` of a task's batch.
fn message_key(task: &Task, line: usize) -> Option<&[u8]> {
    let &(from, len) = task.key_spans.get(line)?;
    (len != u32::MAX).then(|| &task.keys[from as usize..(from + len) as usize])
}

fn write_hex(id: u64, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((id >> (shift * 4)) & 0xf) as usize]);
    }
}

fn commit_error(e: CommitError) -> RunError {
    RunError::Kafka(KafkaError::Invalid(e.to_string()))
}

/// The differences between a changelog's options and this run's, one line each.
fn option_differences(then: &[(String, String)], now: &[(String, String)]) -> Vec<String> {
    let manifest = sessionizer_checkpoint::Manifest {
        options: then.to_vec(),
        ..Default::default()
    };
    manifest.option_differences(now)
}

/// Appends one record to a task's batch; returns the bytes staged.
fn stage(task: &mut Task, offset: i64, key: Option<&[u8]>, value: Option<&[u8]>) -> usize {
    let value = value.unwrap_or_default();
    let start = task.batch.data.len();
    task.batch.data.extend_from_slice(value);
    task.batch.lines.push(LineSpan {
        start: start as u32,
        end: task.batch.data.len() as u32,
        input: 0,
        line_no: offset as u64,
    });
    match key {
        Some(k) => {
            task.key_spans
                .push((task.keys.len() as u32, k.len() as u32));
            task.keys.extend_from_slice(k);
        }
        None => task.key_spans.push((0, u32::MAX)),
    }
    value.len()
}

/// `<group>-<topic>-changelog`.
fn changelog_topic(group: &str, topic: &str) -> String {
    format!("{group}-{topic}-changelog")
}

/// `<group>-<instance>`; a random instance when none is given.
fn transactional_id(group: Option<&str>, instance: Option<&str>) -> String {
    let instance = match instance {
        Some(i) => i.to_string(),
        None => {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(seed);
            h.write_u32(std::process::id());
            format!("{:016x}", h.finish())
        }
    };
    format!("{}-{instance}", group.unwrap_or("sessionizer"))
}
