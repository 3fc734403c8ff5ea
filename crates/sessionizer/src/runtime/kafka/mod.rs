//! The Kafka driver (docs/semantics.md K-1 to K-7): every input partition is a
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

mod op;
mod output;
mod repartition;
mod restore;
mod snapshot;
mod standby;
mod task;

use crate::config::{KafkaConfig, KafkaStart, Partitioner, PipelineConfig};
use crate::error::RunError;
use crate::runtime::instance::{persisted_instance, random_instance};
use crate::stats::{KafkaStats, RestoreStats, RunStats};
use crate::telemetry::{CheckpointKind, CheckpointReport, TaskReport, Telemetry};
use output::Out;
use repartition::Rekey;
use sessionizer_checkpoint::Counters;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::kafka::changelog;
use sessionizer_connectors::kafka::consumer::{GroupConsumer, Polled, Rebalance, StartAt};
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_connectors::kafka::producer::{CommitError, SOURCE_HEADER, TxnProducer};
use sessionizer_connectors::kafka::{KafkaError, KafkaSettings, TopicPartition};
use sessionizer_connectors::{Batch, OutputTarget};
use sessionizer_core::Watermark;
use snapshot::Snapshots;
use standby::Standbys;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use task::{Task, stage};

pub(crate) use op::{Processed, PutChange, TaskFactory, TaskOp};

/// Bytes of records staged per task before its batch is processed.
const TASK_BATCH_BYTES: usize = 2 << 20;
/// Records polled in one round before the staged batches are processed.
const ROUND_RECORDS: usize = 50_000;

/// What a restore found, for the logs and the stats.
#[derive(Debug, Clone, Copy, Default)]
struct Restored {
    records: u64,
    bytes: u64,
    keys: u64,
    micros: u64,
}

/// Transactions aborted one after the other before the job gives up.
const MAX_ABORTS_IN_ROW: u32 = 5;

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

/// The offset metadata of a task that emitted every session at the end of a
/// `--stop-at-end` run.
const FLUSHED: &str = "flushed";

/// The error of a record read for a task that already emitted every session.
fn more_after_flush(task: &str, group: &Option<String>) -> RunError {
    RunError::Resume {
        dir: format!("Kafka group {}", group.as_deref().unwrap_or("")),
        message: format!(
            "partition {task} ended a --stop-at-end run with every session emitted (no --keep-open), and more records came after; use a new --kafka-group, or --keep-open for runs that continue"
        ),
    }
}

/// What the driver itself needs besides the Kafka options: where outputs that are not
/// topics go, the workers, the state backend, the idle timeout, and the key field that
/// `--repartition` re-keys by.
#[derive(Debug, Clone)]
pub(crate) struct DriverSettings {
    pub output: OutputTarget,
    pub dead_letter: OutputTarget,
    pub late_output: OutputTarget,
    pub rekey_field: Option<sessionizer_core::json::FieldPath>,
    pub workers: usize,
    pub state_backend: crate::config::StateBackend,
    pub idle_timeout: Option<sessionizer_core::DurationMs>,
    /// The largest record: a longer message is a dead letter, staged as its first
    /// bytes only.
    pub max_record: usize,
}

impl DriverSettings {
    /// The command line's.
    pub(crate) fn of(cfg: &PipelineConfig) -> DriverSettings {
        DriverSettings {
            output: cfg.output.clone(),
            dead_letter: cfg.dead_letter.clone(),
            late_output: cfg.late_output.clone(),
            rekey_field: Some(cfg.key.clone()),
            workers: cfg.workers,
            state_backend: cfg.state_backend.clone(),
            idle_timeout: cfg.idle_timeout,
            max_record: cfg.max_record,
        }
    }
}

/// Runs a job whose input is Kafka topics, each task's operator made by `factory`
/// (`cfg` gives the driver's settings: outputs, `--on-invalid`, `--idle-timeout`,
/// `--workers`, the state backend, the key field of `--repartition`).
pub(crate) fn run_tasks<F: TaskFactory>(
    settings: DriverSettings,
    kafka: &KafkaConfig,
    factory: F,
    telemetry: &Telemetry,
) -> Result<RunStats, RunError> {
    let mut job = KafkaJob::open(&settings, kafka, factory, telemetry)?;
    job.run().map_err(|e| {
        let stats = job.stats();
        e.with_stats(stats)
    })
}

struct KafkaJob<'c, F: TaskFactory> {
    cfg: &'c DriverSettings,
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
    tasks: BTreeMap<TopicPartition, Task<F::Op>>,
    /// `--workers N`: the threads that sessionize the tasks' batches in parallel.
    pool: crate::runtime::Workers,
    /// Makes each task's operator.
    factory: F,
    options: Vec<(String, String)>,
    started: Instant,
    last_commit: Instant,
    restored: Restored,
    /// This process's committed share of the tasks it gave up (revoked, lost, rewound).
    released: RunStats,
    commits: u64,
    aborts: u64,
    /// Transactions aborted since the last one committed.
    aborts_in_row: u32,
    assigned: u64,
    revoked: u64,
    /// Every restore of the run.
    restores: Vec<RestoreStats>,
    /// `--stop-at-end`: the end offset of every input partition at the start.
    ends: BTreeMap<TopicPartition, i64>,
    /// When the group's progress was last checked (`--stop-at-end` in a group).
    last_group_check: Option<Instant>,
    /// Assignments received from the group.
    assigned_events: u64,
    /// The topics read: the inputs, then the internal re-keying topic if any.
    topics: Vec<String>,
    /// The number of partitions of each topic of `topics`.
    partition_counts: Vec<usize>,
    /// Records refused because their key cannot belong to their partition.
    misplaced: u64,
    /// `--repartition`: the re-keying of the inputs.
    rekey: Option<Rekey>,
    /// Metrics, logs, `/sessions` questions.
    telemetry: Telemetry,
    /// `--state-dir`: local task snapshots.
    snapshots: Option<Snapshots>,
    /// `--standby-replicas`: copies of other processes' tasks.
    standbys: Option<Standbys>,
    /// Records at offsets their task had processed already, skipped.
    stale_skipped: u64,
    /// Scratch.
    key_buf: Vec<u8>,
    /// `--state-backend rocksdb`: where each task's store goes, and its budget; what
    /// the stores did (those of tasks given up included).
    stores: Option<crate::runtime::backend::TaskStores>,
    store_stats: Option<crate::stats::StateStoreStats>,
    released_store: (u64, u64),
}

impl<'c, F: TaskFactory> KafkaJob<'c, F> {
    fn open(
        cfg: &'c DriverSettings,
        kafka: &'c KafkaConfig,
        factory: F,
        telemetry: &Telemetry,
    ) -> Result<KafkaJob<'c, F>, RunError> {
        let settings = kafka.settings();
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
        // The topics the consumer reads: the inputs, and with --repartition the internal
        // topic they are re-keyed into, whose partitions are then the tasks.
        let mut topics = kafka.topics.clone();
        let mut rekey = None;
        if kafka.repartition {
            let (Some(g), true) = (group, durable) else {
                return Err(RunError::Kafka(KafkaError::Invalid(
                    "--repartition needs --kafka-output-topic and --kafka-group".into(),
                )));
            };
            let internal = format!("{g}-repartition");
            let n = partitions[0];
            admin.ensure_internal(&internal, n)?;
            let Some(field) = cfg.rekey_field.clone() else {
                return Err(RunError::Kafka(KafkaError::Invalid(
                    "this job cannot re-key its input (--repartition): it names no key field of the records".into(),
                )));
            };
            rekey = Some(Rekey::new(internal.clone(), n, topics.len(), field));
            topics.push(internal);
            partitions.push(n);
        }
        // One changelog per topic whose partitions are tasks (an input topic that is
        // re-keyed has none: its entry stays empty).
        let mut changelogs = Vec::new();
        if let (true, Some(g)) = (durable, group) {
            for (i, (t, &n)) in topics.iter().zip(&partitions).enumerate() {
                if rekey.is_some() && i + 1 < topics.len() {
                    changelogs.push(String::new());
                    continue;
                }
                let name = changelog_topic(g, t);
                admin.ensure_changelog(&name, n)?;
                changelogs.push(name);
            }
        }
        let any_topic = [&sessions, &dead, &late]
            .iter()
            .any(|o| matches!(o, Out::Topic { .. }));
        let snapshots = match &kafka.state_dir {
            Some(dir) if durable => Some(Snapshots::open(dir, kafka.snapshot_interval)?),
            _ => None,
        };
        // The process's name: given, kept in the state directory across restarts, or
        // made up for this run.
        let instance = match (&kafka.instance_id, &snapshots) {
            (Some(id), _) => id.clone(),
            (None, Some(s)) => persisted_instance(s.path())?,
            (None, None) => random_instance(),
        };
        let producer = if any_topic {
            let id = format!("{}-{instance}", group.unwrap_or("sessionizer"));
            Some(TxnProducer::new(&settings, &id, kafka.transaction_timeout)?)
        } else {
            None
        };
        let client_id = format!("sessionizer-{instance}");
        let consumer = GroupConsumer::new(
            &settings,
            &topics,
            if durable { group } else { None },
            &client_id,
        )?;
        let standbys = if durable && kafka.standby_replicas > 0 {
            Some(Standbys::new(
                &settings,
                kafka.standby_replicas,
                &client_id,
                &changelogs,
            )?)
        } else {
            None
        };
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
            options: factory.options(),
            factory,
            started: Instant::now(),
            last_commit: Instant::now(),
            restored: Restored::default(),
            released: RunStats::default(),
            commits: 0,
            aborts: 0,
            aborts_in_row: 0,
            assigned: 0,
            revoked: 0,
            restores: Vec::new(),
            ends: BTreeMap::new(),
            last_group_check: None,
            assigned_events: 0,
            topics,
            partition_counts: partitions.clone(),
            misplaced: 0,
            rekey,
            telemetry: telemetry.clone(),
            snapshots,
            standbys,
            stale_skipped: 0,
            key_buf: Vec::new(),
            pool: crate::runtime::start_workers(cfg.workers.max(1))?,
            stores: None,
            store_stats: None,
            released_store: (0, 0),
        };
        for w in [&mut job.sessions, &mut job.dead, &mut job.late] {
            if let Out::Writer(w) = w
                && matches!(w.target(), OutputTarget::File(_))
            {
                w.open()?;
            }
        }
        let mut all = Vec::new();
        for (ti, &n) in partitions.iter().enumerate() {
            for p in 0..n as i32 {
                all.push(TopicPartition {
                    topic: ti as u32,
                    partition: p,
                });
            }
        }
        // The budget is shared as if every partition whose records are tasks came to
        // this process.
        let task_partitions = match &job.rekey {
            Some(_) => partitions.last().copied().unwrap_or(1),
            None => partitions.iter().sum(),
        };
        job.stores = crate::runtime::backend::TaskStores::open(
            &cfg.state_backend,
            kafka.state_dir.as_deref(),
            task_partitions,
        )?;
        if kafka.stop_at_end {
            // "The end" is where every partition stood when this run started, whoever
            // comes to process it. The internal topic's end is known only once every
            // input was re-keyed to its end (see all_done).
            for &tp in &all {
                if job.rekey.as_ref().is_some_and(|r| !r.is_input(tp)) {
                    continue;
                }
                let (_, high) = job
                    .admin
                    .watermarks(&job.topics[tp.topic as usize], tp.partition)?;
                job.ends.insert(tp, high);
            }
        }
        if durable {
            job.consumer.subscribe()?;
        } else {
            // No group: every partition of every topic, from --kafka-start.
            job.gain(&all)?;
        }
        Ok(job)
    }

    fn run(&mut self) -> Result<RunStats, RunError> {
        let idle = self
            .cfg
            .idle_timeout
            .map(|d| Duration::from_millis(u64::try_from(d.millis()).unwrap_or(0)));
        let interval = self.commit_interval();
        let mut staged = 0usize;
        let mut stopped = false;
        'job: loop {
            loop {
                if self.telemetry.stop_requested() {
                    // A clean stop: what was processed is committed (an aborted commit
                    // rewinds the tasks to the one before: nothing is lost either way),
                    // the sessions in progress stay in the changelogs for whoever takes
                    // the partitions next, and no session is emitted early.
                    self.commit()?;
                    stopped = true;
                    tracing::info!("stopping on request: committed, leaving the group");
                    break 'job;
                }
                for event in self.consumer.take_rebalances() {
                    self.process_staged()?;
                    self.rebalance(event)?;
                    if let Some(s) = &mut self.standbys {
                        s.stale();
                    }
                }
                if let Some(s) = &mut self.standbys {
                    // Copies are a help, not the job: a failure to follow them (the
                    // coordinator busy, a changelog read that failed) is tried again
                    // later, and a partition without a copy restores from its changelog.
                    if let Err(e) = s
                        .refresh(&self.consumer, &self.tasks)
                        .and_then(|()| s.poll())
                    {
                        tracing::warn!(error = %e, "standby copies not updated; trying again");
                    }
                }
                if self.kafka.stop_at_end {
                    // A task that reached its end emits every session right away, as a
                    // file input does at its end; the process then waits for the rest
                    // of the group before it leaves.
                    self.flush_done_tasks()?;
                    if self.ready_to_stop()? {
                        break;
                    }
                }
                self.telemetry.running();
                self.telemetry.answer_queries(|key| {
                    let key = key.as_bytes();
                    self.tasks
                        .values()
                        .filter_map(|t| t.op.describe(key, &t.names[0].name))
                        .collect()
                });
                // Poll a round: wait for the first record, then take what is ready.
                let mut round = 0;
                let mut ended = false;
                let mut wait = Duration::from_millis(100);
                loop {
                    match self.consumer.poll(wait)? {
                        Polled::Nothing => break,
                        Polled::End => ended = true,
                        Polled::Record(r) => {
                            round += 1;
                            // Records past a --stop-at-end run's end are not this run's;
                            // one says the partition's position is past its end.
                            let past_end = self.kafka.stop_at_end
                                && self.ends.get(&r.from).is_some_and(|&e| r.offset() >= e);
                            if past_end {
                                ended = true;
                            } else if let Some(rekey) =
                                self.rekey.as_mut().filter(|k| k.is_input(r.from))
                            {
                                if rekey.positions.contains_key(&r.from) {
                                    let p =
                                        self.producer.as_mut().expect("re-keying has a producer");
                                    rekey.forward(p, &self.topics, &r).map_err(commit_error)?;
                                }
                            } else if let Some(task) = self.tasks.get_mut(&r.from)
                                && task.is_stale(r.offset())
                            {
                                // Never applied twice, whatever the client hands out.
                                self.stale_skipped += 1;
                                tracing::warn!(
                                    task = %task.names[0].name,
                                    offset = r.offset(),
                                    next_offset = task.next_offset,
                                    "a record the task processed already was read again; skipped"
                                );
                            } else if let Some(task) = self.tasks.get_mut(&r.from) {
                                if task.flushed {
                                    return Err(more_after_flush(
                                        &task.names[0].name,
                                        &self.kafka.group,
                                    ));
                                }
                                // Only re-keyed records carry where they were read first.
                                let origin = match self.rekey {
                                    Some(_) => r.header(SOURCE_HEADER),
                                    None => None,
                                };
                                let max = self.cfg.max_record;
                                staged += stage(task, r.offset(), r.key(), r.value(), origin, max);
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
                if ended {
                    self.catch_up_positions()?;
                }
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
            self.flush_done_tasks()?;
            let aborts = self.aborts;
            self.commit()?;
            if self.aborts == aborts {
                break 'job;
            }
            // The last commit was aborted (a rebalance moved the group on while it was
            // made): the tasks were put back to their previous commit. Read on and end
            // again.
        }
        let all: Vec<TopicPartition> = self.tasks.keys().copied().collect();
        self.write_snapshots(&all);
        for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
            if let Out::Writer(w) = w {
                w.finish()?;
            }
        }
        self.report();
        let mut stats = self.stats();
        stats.stopped = stopped;
        self.consumer.close();
        Ok(stats)
    }

    /// `--stop-at-end` without `--keep-open`: the tasks that reached their end emit
    /// every session (the watermark becomes +infinity) and are committed as finished.
    fn flush_done_tasks(&mut self) -> Result<(), RunError> {
        if self.keep_open() {
            return Ok(());
        }
        let done: Vec<TopicPartition> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.done() && !t.flushed)
            .map(|(&id, _)| id)
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        for id in &done {
            let task = self.tasks.get_mut(id).expect("task exists");
            task.op.clear_outputs();
            task.op.finish();
            task.flushed = true;
            task.dirty = true;
            self.send_outputs(*id)?;
        }
        self.commit()
    }

    /// Where every task stands, for telemetry (and the progress line).
    fn report(&self) {
        let reports: Vec<TaskReport<'_>> = self
            .tasks
            .values()
            .map(|t| TaskReport {
                task: &t.names[0].name,
                counts: task_counts_of(&t.run_counts()),
                watermark: t.op.watermark(),
                open_sessions: t.op.open_sessions(),
                keys: t.op.keys(),
            })
            .collect();
        self.telemetry.batch(&reports);
    }

    /// `--stop-at-end`: whether this process may end — its tasks are done and so is
    /// every other partition of the input (its committed offset reached its end). A
    /// process stays in the group until then, to take over the partitions of a member
    /// that dies. With `--repartition` the inputs come first: once every input
    /// partition was re-keyed to its end and committed, the internal topic's end is
    /// read, and the tasks run up to it. Asked of the group coordinator at most once a
    /// second.
    fn ready_to_stop(&mut self) -> Result<bool, RunError> {
        if !self.durable {
            return Ok(!self.tasks.is_empty() && self.tasks.values().all(Task::done));
        }
        // Not before the group gave this process its share (it may hold partitions
        // that need restoring, or whose changelog is damaged).
        if self.assigned_events == 0 {
            return Ok(false);
        }
        let inputs_pending = self.rekey.as_ref().is_some_and(|r| !r.inputs_done);
        let mine_finished = self
            .tasks
            .values()
            .all(|t| t.done() && (t.flushed || self.keep_open()));
        if !inputs_pending && !mine_finished {
            return Ok(false);
        }
        if self
            .last_group_check
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return Ok(false);
        }
        self.last_group_check = Some(Instant::now());
        if inputs_pending {
            let rekey = self.rekey.as_ref().expect("re-keying");
            let mine_done = rekey
                .positions
                .iter()
                .all(|(tp, &at)| self.ends.get(tp).is_some_and(|&e| at >= e));
            let others: Vec<TopicPartition> = self
                .ends
                .keys()
                .filter(|tp| rekey.is_input(**tp) && !rekey.positions.contains_key(tp))
                .copied()
                .collect();
            if !mine_done || !self.committed_reached_end(&others)? {
                return Ok(false);
            }
            // What this process forwarded must be committed before the end of the
            // internal topic is taken; an aborted commit put the inputs back, so they
            // are not done.
            let aborts = self.aborts;
            self.commit()?;
            if self.aborts != aborts {
                return Ok(false);
            }
            // The internal topic is the last one read.
            let t = self.topics.len() as u32 - 1;
            let n = self.admin.require(&self.topics[t as usize], "internal")?;
            let internal = (0..n as i32).map(|p| TopicPartition {
                topic: t,
                partition: p,
            });
            // Its end is its high watermark, not its last stable offset: a committed
            // transaction's markers reach the partitions after the commit returns, so
            // right after it the last stable offset can still stand before the records
            // just committed (which would then count as past the end). Everything below
            // the high watermark was committed or aborted by now; the tasks read up to it
            // once the markers are there.
            for tp in internal {
                let high = self
                    .admin
                    .written_end(&self.topics[tp.topic as usize], tp.partition)?;
                self.ends.insert(tp, high);
                if let Some(task) = self.tasks.get_mut(&tp) {
                    task.end = Some(high);
                }
            }
            if let Some(r) = &mut self.rekey {
                r.inputs_done = true;
            }
            self.last_group_check = None;
            return Ok(false);
        }
        let others: Vec<TopicPartition> = self
            .ends
            .keys()
            .filter(|tp| !self.tasks.contains_key(tp))
            .filter(|tp| !self.rekey.as_ref().is_some_and(|r| r.is_input(**tp)))
            .copied()
            .collect();
        self.committed_reached_end(&others)
    }

    /// Whether the group's committed offset of each of `parts` reached its end — and,
    /// for a task partition of a run that emits every session at the end, whether the
    /// task that owned it did so (the metadata it committed says [`FLUSHED`]).
    fn committed_reached_end(&self, parts: &[TopicPartition]) -> Result<bool, RunError> {
        if parts.is_empty() {
            return Ok(true);
        }
        let committed = self.consumer.committed_with_metadata(parts)?;
        Ok(parts.iter().zip(committed).all(|(tp, c)| {
            let input = self.rekey.as_ref().is_some_and(|r| r.is_input(*tp));
            // A task flushed by its owner reached that owner's end (a process that
            // started later, when the partition had grown, has a later end).
            c.is_some_and(|(o, meta)| {
                (!input && meta == FLUSHED)
                    || (o >= self.ends[tp] && (input || self.keep_open() || meta == FLUSHED))
            })
        }))
    }

    /// Moves each task's (and re-keyed input's) next offset up to the consumer's
    /// position: past transaction markers and aborted records, which are never handed
    /// out, so that a partition written with transactions can reach its end offset.
    /// Called after the staged records were processed.
    fn catch_up_positions(&mut self) -> Result<(), RunError> {
        let mut parts: Vec<TopicPartition> = self.tasks.keys().copied().collect();
        if let Some(r) = &self.rekey {
            parts.extend(r.positions.keys());
        }
        let positions = self.consumer.positions(&parts)?;
        for (tp, at) in parts.iter().zip(positions) {
            let Some(at) = at else { continue };
            // Not past a --stop-at-end run's end (records after it are skipped).
            let at = self.ends.get(tp).map_or(at, |&e| {
                if self.kafka.stop_at_end {
                    at.min(e)
                } else {
                    at
                }
            });
            if let Some(task) = self.tasks.get_mut(tp) {
                if task.batch.lines.is_empty() && at > task.next_offset {
                    task.next_offset = at;
                    // The progress record must say so: the committed offset and the
                    // changelog's next offset always agree.
                    task.dirty = true;
                }
            } else if let Some(r) = &mut self.rekey
                && let Some(p) = r.positions.get_mut(tp)
                && at > *p
            {
                *p = at;
            }
        }
        Ok(())
    }

    fn keep_open(&self) -> bool {
        self.kafka.keep_open
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
                rekey.positions.insert(tp, at);
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
            self.tasks.insert(tp, task);
        }
        // A restore puts keys into the tasks' stores too (most of them on disk when
        // the budget is small): the stats count them before any record is read.
        self.sample_state_stores();
        Ok(starts)
    }

    fn new_task(&self, tp: TopicPartition) -> Result<Task<F::Op>, RunError> {
        let topic = &self.topics[tp.topic as usize];
        let name = format!("{topic}-{}", tp.partition);
        let mut op = self.factory.new_op(&name, self.stores.as_ref())?;
        if self.durable {
            op.track_changes();
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
        })
    }

    /// Drops a task, keeping this process's committed share of its accounting.
    fn release(&mut self, tp: &TopicPartition) {
        if let Some(r) = &mut self.rekey {
            r.positions.remove(tp);
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

    fn rebalance(&mut self, event: Rebalance) -> Result<(), RunError> {
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
    fn abort_and_rewind(&mut self, why: &dyn std::fmt::Display) -> Result<(), RunError> {
        if let Some(p) = &mut self.producer {
            p.abort().map_err(commit_error)?;
        }
        self.telemetry.transaction_aborted(why);
        self.aborts += 1;
        self.rewind()
    }

    /// Puts every task back to its last commit (after an aborted transaction): drops
    /// them and restores them again from their changelogs.
    fn rewind(&mut self) -> Result<(), RunError> {
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

    /// Runs every task's staged records through decode and sessionize — the tasks in
    /// parallel over `--workers` threads — and sends what came out, task by task.
    fn process_staged(&mut self) -> Result<(), RunError> {
        let mut staged: Vec<&mut Task<F::Op>> = self
            .tasks
            .values_mut()
            .filter(|t| !t.batch.lines.is_empty())
            .collect();
        let ids: Vec<TopicPartition> = staged.iter().map(|t| t.tp).collect();
        match self.pool.pool() {
            Some(pool) if staged.len() > 1 => pool.install(|| {
                use rayon::prelude::*;
                staged.par_iter_mut().for_each(|t| t.process_staged());
            }),
            _ => {
                for t in staged {
                    t.process_staged();
                }
            }
        }
        for id in ids {
            let task = self.tasks.get_mut(&id).expect("staged task exists");
            // A task's RocksDB store failed: stop before anything of the step is sent.
            if let Some(e) = task.op.take_error() {
                return Err(e);
            }
            if let Some((line, reason)) = &task.first_invalid {
                let span = task.batch.lines[*line as usize];
                return Err(RunError::InvalidRecord {
                    position: task.names[0].pos(span.line_no).to_string(),
                    reason: reason.clone(),
                });
            }
            if let (count, Some((line, key))) = &task.misplaced {
                self.misplaced += count;
                self.telemetry
                    .records_misplaced(&task.names[0].name, *count);
                let span = task.batch.lines[*line as usize];
                let placement = task.placement.expect("a misplaced record was checked");
                let (partition, partitions) = placement.partition();
                let (murmur2, crc32) = placement.expected(key.as_bytes());
                return Err(RunError::NotKeyed {
                    topic: self.topics[id.topic as usize].clone(),
                    position: task.names[0].pos(span.line_no).to_string(),
                    key: key.clone(),
                    partition,
                    partitions,
                    murmur2,
                    crc32,
                    count: *count,
                });
            }
            self.send_outputs(id)?;
            let task = self.tasks.get_mut(&id).expect("task exists");
            task.batch.clear();
            task.key_spans.clear();
            task.keys.clear();
        }
        if let Some(p) = &self.producer {
            p.poll();
        }
        self.sample_state_stores();
        Ok(())
    }

    /// Updates what the tasks' RocksDB stores did (nothing without them).
    fn sample_state_stores(&mut self) {
        if self.stores.is_some() {
            let live = self.tasks.values().filter_map(|t| t.op.spill_counts());
            crate::runtime::backend::sample_stores(
                &mut self.store_stats,
                self.released_store,
                live,
            );
        }
    }

    /// Moves the watermark of every task whose partition has been quiet for `limit`
    /// on with the wall clock (docs/semantics.md S-32).
    fn advance_idle(&mut self, limit: Duration) -> Result<(), RunError> {
        let limit = crate::runtime::millis(limit);
        let due: Vec<(TopicPartition, Watermark)> = self
            .tasks
            .iter()
            .filter(|(_, t)| !t.flushed)
            .filter_map(|(&id, t)| {
                let quiet = crate::runtime::millis(t.last_input.elapsed());
                crate::runtime::idle_watermark(limit, quiet, t.watermark_at_last_input)
                    .filter(|&w| w > t.op.watermark())
                    .map(|w| (id, w))
            })
            .collect();
        for (id, w) in due {
            let task = self.tasks.get_mut(&id).expect("task exists");
            task.op.clear_outputs();
            task.op.advance_idle(w, task.next_seq);
            if task.op.sessions().tags.is_empty() && task.op.late().1.is_empty() {
                continue;
            }
            task.dirty = true;
            self.send_outputs(id)?;
        }
        Ok(())
    }

    /// Commits: in durable mode one transaction with every changed task's state
    /// changes and progress record and every task's offsets; otherwise the outputs are
    /// flushed (and a transaction holding side outputs to topics committed).
    fn names_of(&self, parts: &[TopicPartition]) -> Vec<String> {
        parts
            .iter()
            .map(|tp| format!("{}/{}", self.topics[tp.topic as usize], tp.partition))
            .collect()
    }

    fn commit(&mut self) -> Result<(), RunError> {
        let began = Instant::now();
        let commits = self.commits;
        let result = self.commit_now();
        if self.commits > commits {
            tracing::debug!(ms = began.elapsed().as_millis() as u64, "committed");
        }
        result
    }

    fn commit_now(&mut self) -> Result<(), RunError> {
        self.last_commit = Instant::now();
        // Nothing read, emitted or forwarded since the last commit: the offsets and the
        // changelogs already say where every task stands, and an idle job does not
        // write an empty transaction every interval.
        let idle = !self.tasks.values().any(|t| t.dirty)
            && !self
                .producer
                .as_ref()
                .is_some_and(TxnProducer::in_transaction);
        if idle && self.producer.is_some() {
            return Ok(());
        }
        let KafkaJob {
            tasks,
            producer,
            changelogs,
            options,
            key_buf,
            consumer,
            factory,
            durable,
            rekey,
            ..
        } = self;
        // The changelog records of the transaction, for telemetry.
        let (mut bytes, mut keys) = (0u64, 0u64);
        if let Some(p) = producer.as_mut() {
            if *durable {
                for task in tasks.values_mut().filter(|t| t.dirty) {
                    let topic = &changelogs[task.tp.topic as usize];
                    let partition = Some(task.tp.partition);
                    let mut failed = None;
                    task.op.drain_changes(&mut |key, value| {
                        if failed.is_some() {
                            return;
                        }
                        changelog::state_key(key, key_buf);
                        keys += 1;
                        bytes += (key_buf.len() + value.map_or(0, <[u8]>::len)) as u64;
                        if let Err(e) = p.send(topic, partition, Some(key_buf), value, false) {
                            failed = Some(e);
                        }
                    });
                    if let Some(e) = failed {
                        return Err(commit_error(e));
                    }
                    if let Some(e) = task.op.take_error() {
                        return Err(e);
                    }
                    let meta = serde_json::to_vec(&task.meta(options, factory.state_format()))
                        .expect("progress record encodes");
                    bytes += meta.len() as u64;
                    // Its offset tells a local snapshot how much of the changelog
                    // it covers.
                    p.send_tracked(
                        topic,
                        partition,
                        Some(changelog::META_KEY),
                        Some(&meta),
                        false,
                        meta_tag(task.tp),
                    )
                    .map_err(commit_error)?;
                    task.dirty = false;
                }
                // A task that emitted every session at the end of a --stop-at-end run
                // says so beside its offset, so that the other processes of the group
                // know it is finished, not only read.
                let mut next: Vec<(TopicPartition, i64, &str)> = tasks
                    .values()
                    .map(|t| (t.tp, t.next_offset, if t.flushed { FLUSHED } else { "" }))
                    .collect();
                if let Some(r) = rekey.as_ref() {
                    next.extend(r.positions.iter().map(|(&tp, &o)| (tp, o, "")));
                }
                let offsets = consumer.offsets(&next)?;
                let group = consumer.group_metadata();
                match p.commit(group.as_ref().map(|g| (&offsets, g))) {
                    Ok(()) => {
                        self.commits += 1;
                        self.aborts_in_row = 0;
                        self.telemetry.checkpoint(&CheckpointReport {
                            kind: CheckpointKind::Transaction,
                            epoch: None,
                            bytes,
                            keys,
                            took: self.last_commit.elapsed(),
                        });
                        let tracked = p.take_tracked();
                        for task in self.tasks.values_mut() {
                            task.committed = task.counters();
                            if let Some(&o) = tracked.get(&meta_tag(task.tp)) {
                                task.changelog_end = Some(o + 1);
                            }
                        }
                        if self.snapshots.as_ref().is_some_and(Snapshots::due) {
                            let all: Vec<TopicPartition> = self.tasks.keys().copied().collect();
                            self.write_snapshots(&all);
                        }
                    }
                    Err(CommitError::Aborted(why)) => {
                        self.telemetry.transaction_aborted(&why);
                        self.aborts += 1;
                        self.aborts_in_row += 1;
                        // A cause that does not go away (a record the broker refuses)
                        // would abort every replay: give up, saying why.
                        if self.aborts_in_row >= MAX_ABORTS_IN_ROW {
                            return Err(commit_error(CommitError::Fatal(format!(
                                "{} transactions in a row were aborted; the last because: {why}",
                                self.aborts_in_row
                            ))));
                        }
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
        stats.state_store = self.store_stats.clone();
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
            job_by_partition: self
                .tasks
                .values()
                .map(|t| (t.names[0].name.clone(), t.committed.clone()))
                .collect(),
            commits: self.commits,
            aborts: self.aborts,
            assigned: self.assigned,
            revoked: self.revoked,
            restored_records: self.restored.records,
            restored_bytes: self.restored.bytes,
            restored_keys: self.restored.keys,
            restore_ms: self.restored.micros / 1000,
            restores: self.restores.clone(),
            standby_partitions: self
                .standbys
                .as_ref()
                .map(|s| self.names_of(&s.copied()))
                .unwrap_or_default(),
            standby_records: self.standbys.as_ref().map_or(0, |s| s.applied),
            snapshots_written: self.snapshots.as_ref().map_or(0, |s| s.written),
            snapshot_bytes: self.snapshots.as_ref().map_or(0, |s| s.bytes),
            stale_records_skipped: self.stale_skipped,
            records_misplaced: self.misplaced,
        });
        stats.elapsed_ms = self.started.elapsed().as_millis() as u64;
        stats.peak_rss_bytes = crate::stats::peak_rss_bytes();
        stats
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

/// `<group>-<topic>-changelog`.
fn changelog_topic(group: &str, topic: &str) -> String {
    format!("{group}-{topic}-changelog")
}

/// The delivery tag of a task's progress record (non-zero).
fn meta_tag(tp: TopicPartition) -> usize {
    ((tp.topic as usize) << 32 | tp.partition as usize) + 1
}

/// A task's counts for telemetry from its run's counts, the operator's included.
pub(crate) fn task_counts_of(run: &RunStats) -> crate::telemetry::TaskCounts {
    crate::telemetry::TaskCounts {
        invalid: run.invalid,
        blank_lines: run.blank_lines,
        bytes_read: run.bytes_read,
        in_sessions: run.in_sessions,
        duplicates: run.duplicates,
        late: run.late,
        sessions_emitted: run.sessions_emitted,
        retractions: run.retractions,
    }
}
