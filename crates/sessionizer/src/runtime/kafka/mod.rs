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
//!   partition, and the consumed offsets (the protocol of
//!   [`crate::runtime::commit::txn`]). A partition gained in a rebalance is restored
//!   from its changelog before any of its records is read; one revoked is committed
//!   first; one lost is given up with the open transaction aborted.
//! * **Kafka in, files or stdout out**: the partitions of the topics are assigned
//!   directly (no group); the state lives only in memory and nothing is committed, so a
//!   run starts from `--kafka-start` every time, as a file run starts at the top.
//! * **Files in, Kafka out** is the file driver with a Kafka sink (see [`super`]).
//!
//! Here: the job, its loop and the run's summary. Beside it the parts the
//! job holds, which know nothing of it: one task (task), the seam to its operator
//! (op), where its records go (output), a task being restored from its changelog
//! (restore), local snapshots (snapshot), standby copies (standby), `--repartition`
//! (repartition), an outage (outage) and a Delta table output (table); in `steps`,
//! the job's steps over them (`impl KafkaJob` blocks: assignment, commit, end, outage,
//! output, restore, snapshot, table, time), so that the driver's files import one way.

mod op;
mod outage;
mod output;
mod repartition;
mod restore;
mod snapshot;
mod standby;
mod steps;
#[cfg(feature = "delta")]
mod table;
mod task;

use crate::config::{KafkaConfig, PipelineConfig};
use crate::error::RunError;
use crate::runtime::commit::txn::{Pending, Transactions, commit_error};
use crate::runtime::instance::{persisted_instance, random_instance};
use crate::stats::{KafkaStats, RestoreStats, RunStats};
use crate::telemetry::{TaskReport, Telemetry};
use output::Out;
use repartition::Rekey;
use sessionizer_connectors::OutputTarget;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::kafka::consumer::{GroupConsumer, Polled};
use sessionizer_connectors::kafka::producer::{SOURCE_HEADER, TxnProducer, WATERMARK_HEADER};
use sessionizer_connectors::kafka::{KafkaError, KafkaSettings, TopicPartition};
use snapshot::Snapshots;
use standby::Standbys;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use task::{Task, stage};

pub(crate) use op::{Processed, PutChange, TaskFactory, TaskOp, UpstreamTimes};
pub(crate) use outage::checkpointed_riding_out;
#[cfg(feature = "delta")]
pub(crate) use table::TableSettings;

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

/// The offset metadata of a task that emitted every session at the end of a
/// `--stop-at-end` run.
pub(super) const FLUSHED: &str = "flushed";

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
    /// The sessions go to a Delta table, each task a writer of its own.
    #[cfg(feature = "delta")]
    pub table: Option<TableSettings>,
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
            #[cfg(feature = "delta")]
            table: None,
        }
    }

    /// Whether the sessions go to a Delta table.
    fn writes_table(&self) -> bool {
        #[cfg(feature = "delta")]
        if self.table.is_some() {
            return true;
        }
        false
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
    /// The job's transactions (durable mode) and their history.
    txns: Transactions,
    /// A transaction committing while the job goes on (see [`Self::commit_due`]).
    pending: Option<Pending>,
    /// The cluster does not answer: since when, and why.
    outage: Option<outage::Outage>,
    /// What the job waited for the cluster.
    outages: outage::Outages,
    /// When each task last processed records (or was created), and the longest time
    /// it went without.
    progress_at: BTreeMap<TopicPartition, Instant>,
    longest_stall: BTreeMap<TopicPartition, Duration>,
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
    rekey: Option<Rekey<F::Times>>,
    /// `--repartition`: every input partition (`topic/partition`), whose watermark
    /// records a task of the re-keyed topic follows.
    upstream_inputs: Vec<String>,
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
        // A Delta table is a sink of the job's transactions too: its epochs ride on them.
        let durable = kafka.is_sink() || cfg.writes_table();
        let group = kafka.group.as_deref();
        if durable && group.is_none() {
            return Err(RunError::Kafka(KafkaError::Invalid(
                "--kafka-output-topic with a Kafka input needs --kafka-group: the group names the job (its changelog topics, its offsets)".into(),
            )));
        }
        let sessions = match cfg.writes_table() {
            true => Out::Table,
            false => Out::new(
                &kafka.output_topic,
                &cfg.output,
                &admin,
                "output, --kafka-output-topic",
            )?,
        };
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
            let times = factory.upstream_times();
            rekey = Some(Rekey::new(internal.clone(), n, topics.len(), field, times));
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
        // The transactions of a table job carry the changelogs and offsets alone.
        let producer = if any_topic || cfg.writes_table() {
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
        let upstream_inputs = match &rekey {
            Some(_) => topics
                .iter()
                .zip(&partitions)
                .take(kafka.topics.len())
                .flat_map(|(t, &n)| (0..n).map(move |p| format!("{t}/{p}")))
                .collect(),
            None => Vec::new(),
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
            txns: Transactions::default(),
            pending: None,
            outage: None,
            outages: outage::Outages::default(),
            progress_at: BTreeMap::new(),
            longest_stall: BTreeMap::new(),
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
            upstream_inputs,
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
        let stopped = loop {
            match self.run_rounds() {
                Ok(stopped) => break stopped,
                // A cluster that does not answer for a while is waited for (up to
                // --kafka-outage-limit); the job then goes on from its last commit.
                Err(e) if outage::is_transient(&e) => self.ride_out(e)?,
                Err(e) => {
                    // A commit still running ends first: if it committed, its share is
                    // this process's (the stats of the failed run say so).
                    let _ = self.join_pending();
                    return Err(e);
                }
            }
        };
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

    /// Polls, processes and commits until the input ends (`--stop-at-end`) or a stop
    /// is asked for (then `true`).
    fn run_rounds(&mut self) -> Result<bool, RunError> {
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
                let events = self.consumer.take_rebalances();
                self.let_lost_go(&events)?;
                for event in events {
                    self.process_staged()?;
                    self.settle()?;
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
                        // The cluster's absence is reported once, by the outage.
                        if outage::is_transient(&e) {
                            tracing::debug!(error = %e, "standby copies not updated; trying again");
                        } else {
                            tracing::warn!(error = %e, "standby copies not updated; trying again");
                        }
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
                if self.outage.is_none() {
                    self.telemetry.running();
                }
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
                let mut heard_mark = false;
                let mut wait = Duration::from_millis(100);
                loop {
                    let polled = match self.consumer.poll(wait) {
                        Ok(p) => p,
                        Err(e) if e.is_transient() => {
                            self.poll_failed(e)?;
                            break;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    match polled {
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
                                // Only re-keyed records carry where they were read first,
                                // or an input partition's time.
                                let (origin, mark) = match self.rekey {
                                    Some(_) => {
                                        (r.header(SOURCE_HEADER), r.header(WATERMARK_HEADER))
                                    }
                                    None => (None, None),
                                };
                                if let Some(mark) = mark {
                                    // The records staged before the mark are judged by
                                    // the watermark before it, the ones after by the
                                    // one it sets: the round ends here.
                                    task.cut |= !task.batch.lines.is_empty();
                                    task.hear_upstream(r.offset(), mark);
                                    heard_mark = true;
                                } else {
                                    let max = self.cfg.max_record;
                                    staged +=
                                        stage(task, r.offset(), r.key(), r.value(), origin, max);
                                }
                            }
                        }
                    }
                    wait = Duration::ZERO;
                    if round >= ROUND_RECORDS
                        || heard_mark
                        || staged >= TASK_BATCH_BYTES * self.tasks.len().max(1)
                        || self.consumer.rebalance_pending()
                    {
                        break;
                    }
                }
                self.process_staged()?;
                self.follow_upstreams()?;
                if ended {
                    self.catch_up_positions()?;
                }
                staged = 0;
                if let Some(limit) = idle {
                    self.advance_idle(limit)?;
                }
                self.report();
                // While the cluster does not answer a commit could only time out.
                if !self.waiting_for_cluster()? && self.last_commit.elapsed() >= interval {
                    self.commit_due()?;
                } else if self
                    .producer
                    .as_ref()
                    .is_some_and(TxnProducer::commit_ended)
                {
                    self.settle()?;
                }
            }
            // Every partition reached its end offset: end as a file input does.
            self.flush_done_tasks()?;
            let aborts = self.txns.aborts;
            self.commit()?;
            if self.txns.aborts == aborts {
                break 'job;
            }
            // The last commit was aborted (a rebalance moved the group on while it was
            // made): the tasks were put back to their previous commit. Read on and end
            // again.
        }
        Ok(stopped)
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

    fn keep_open(&self) -> bool {
        self.kafka.keep_open
    }

    fn commit_interval(&self) -> Duration {
        self.kafka.commit_interval
    }

    /// Runs every task's staged records through decode and sessionize — the tasks in
    /// parallel over `--workers` threads — and sends what came out, task by task.
    fn process_staged(&mut self) -> Result<(), RunError> {
        let mut staged: Vec<&mut Task<F::Op>> = self
            .tasks
            .values_mut()
            .filter(|t| !t.batch.lines.is_empty())
            .collect();
        // The tasks that stepped (one whose staged records do not fill a micro-batch
        // yet does not).
        let stepped = |t: &mut &mut Task<F::Op>| t.process_staged().then_some(t.tp);
        let ids: Vec<TopicPartition> = match self.pool.pool() {
            Some(pool) if staged.len() > 1 => pool.install(|| {
                use rayon::prelude::*;
                staged.par_iter_mut().filter_map(stepped).collect()
            }),
            _ => staged.iter_mut().filter_map(stepped).collect(),
        };
        // A commit that ran meanwhile ends before anything is sent; if it was aborted,
        // every task went back to the commit before and what was just processed goes.
        if !ids.is_empty() && self.settle()? {
            return Ok(());
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
                    position: task.names[0].pos(span.at).to_string(),
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
                    position: task.names[0].pos(span.at).to_string(),
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
            let now = Instant::now();
            let last = self.progress_at.insert(id, now).unwrap_or(self.started);
            let stall = self.longest_stall.entry(id).or_default();
            *stall = (*stall).max(now - last);
            task.clear_processed();
        }
        if let Some(p) = self.producer.as_ref().filter(|p| !p.committing()) {
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

    /// `topic/partition` of each of `parts`, for the logs.
    fn names_of(&self, parts: &[TopicPartition]) -> Vec<String> {
        parts
            .iter()
            .map(|tp| format!("{}/{}", self.topics[tp.topic as usize], tp.partition))
            .collect()
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
            commits: self.txns.commits,
            aborts: self.txns.aborts,
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
            outages: self.outages.count,
            outage_ms: self.outages.waited.as_millis() as u64,
            longest_stall_ms: self
                .longest_stall
                .iter()
                .map(|(tp, d)| (self.names_of(&[*tp]).remove(0), d.as_millis() as u64))
                .collect(),
        });
        stats.scope = crate::stats::Scope::Process;
        stats.elapsed_ms = self.started.elapsed().as_millis() as u64;
        stats.peak_rss_bytes = crate::stats::peak_rss_bytes();
        stats
    }
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
