//! The one emit point of a running job's internal events (ARCHITECTURE.md, *Telemetry*;
//! after Vector's `InternalEvent`): a batch done, sessions completed and written, a
//! checkpoint or a Kafka commit, a state restored, a damaged checkpoint skipped, a
//! rebalance. Each is reported here once, by one method, and feeds all three places it is
//! seen:
//!
//! * the logs: one `tracing` event with fields (`RUST_LOG=sessionizer=info`);
//! * the metrics: Prometheus families in a registry ([`Telemetry::encode_metrics`]),
//!   served by the command line's `--http-addr`;
//! * the progress line and the warnings a user sees, through an [`Observer`].
//!
//! Both drivers (files or stdin, and Kafka) call these methods at batch boundaries, on
//! the pipeline thread. The handle is cheap to clone and can be read from other
//! threads: the HTTP server encodes the metrics and asks questions.
//!
//! A question about a key (`/sessions?key=K`) is never answered by reading the state
//! concurrently: it waits in a mailbox that the pipeline thread empties between two
//! batches ([`Telemetry::answer_queries`]), so the answer is the state as it stands
//! between two batches.

use crate::stats::RunStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use sessionizer_core::{EventTime, Watermark};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a user of a running pipeline sees of it: a progress line, warnings. Given to
/// [`Telemetry::new`], which calls it; logs and metrics go through the telemetry itself.
pub trait Observer {
    /// Called after every batch of input (about every 4 MiB).
    fn progress(&self, _records_read: u64, _open_sessions: usize, _watermark: Watermark) {}

    /// Something the user should know that does not stop the run (a damaged checkpoint
    /// skipped for an older one). The library prints nothing: the event is also logged
    /// through `tracing`, and the command line writes this text to stderr.
    fn warn(&self, _message: &str) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// The `Content-Type` of [`Telemetry::encode_metrics`]: the Prometheus text format.
pub const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The log target of a job waiting for its Kafka cluster, and of the wait's end: logged
/// by default, where the other events of a run are asked for with `RUST_LOG`.
pub const OUTAGE_TARGET: &str = "sessionizer::outage";

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Opening its inputs and outputs.
    Starting,
    /// Restoring state from a checkpoint or a changelog.
    Restoring,
    /// Reading its input: ready.
    Running,
    /// Its input ended, or it failed.
    Ended,
    /// Waiting for a Kafka cluster that does not answer (brokers restarting): not
    /// ready.
    Waiting,
}

impl Phase {
    /// `starting`, `restoring`, `running`, `ended`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Restoring => "restoring",
            Phase::Running => "running",
            Phase::Ended => "ended",
            Phase::Waiting => "waiting",
        }
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Restoring,
            2 => Phase::Running,
            3 => Phase::Ended,
            4 => Phase::Waiting,
            _ => Phase::Starting,
        }
    }
}

/// One task's counts, as done by this process since it took the task on (not carried
/// from earlier runs or other processes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Records applied to a session.
    pub in_sessions: u64,
    /// Records dropped as duplicates.
    pub duplicates: u64,
    /// Records too late.
    pub late: u64,
    /// Invalid records.
    pub invalid: u64,
    /// Blank lines skipped.
    pub blank_lines: u64,
    /// Session records emitted (every revision).
    pub sessions_emitted: u64,
    /// Retractions emitted.
    pub retractions: u64,
    /// Input bytes consumed.
    pub bytes_read: u64,
}

impl TaskCounts {
    /// Records read: every one is in exactly one of the four outcomes.
    pub fn records_read(&self) -> u64 {
        self.in_sessions + self.duplicates + self.late + self.invalid
    }
}

/// Where one task stands after a batch.
#[derive(Debug, Clone, Copy)]
pub struct TaskReport<'a> {
    /// `0` for a file or stdin input; `topic/partition` for Kafka.
    pub task: &'a str,
    /// Its counts so far.
    pub counts: TaskCounts,
    /// Its watermark.
    pub watermark: Watermark,
    /// Sessions not yet final (open, or complete and kept for lateness).
    pub open_sessions: u64,
    /// Keys with state.
    pub keys: u64,
}

/// A restore finished.
#[derive(Debug, Clone, Copy)]
pub struct RestoreReport<'a> {
    /// Where from: the state directory, or the changelog topic.
    pub source: &'a str,
    /// The task restored.
    pub task: &'a str,
    /// The checkpoint's epoch (state directories).
    pub epoch: Option<u64>,
    /// Records read: state entries of the checkpoint files (bases and deltas), or
    /// changelog records.
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Keys whose state was put back.
    pub keys: u64,
    /// How long it took.
    pub took: Duration,
}

/// What a checkpoint was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// A full snapshot in the state directory.
    Base,
    /// The changes since the previous checkpoint, in the state directory.
    Delta,
    /// A Kafka transaction: outputs, changelog records and offsets.
    Transaction,
}

impl CheckpointKind {
    fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Base => "base",
            CheckpointKind::Delta => "delta",
            CheckpointKind::Transaction => "transaction",
        }
    }
}

/// A checkpoint was made durable (state directory) or a transaction committed (Kafka).
#[derive(Debug, Clone, Copy)]
pub struct CheckpointReport {
    /// Base, delta or transaction.
    pub kind: CheckpointKind,
    /// The checkpoint's epoch (state directories).
    pub epoch: Option<u64>,
    /// Bytes written: state file and manifest, or the changelog records.
    pub bytes: u64,
    /// Keys written (changed or removed).
    pub keys: u64,
    /// How long it took: syncing the outputs and writing the files, or the commit.
    pub took: Duration,
}

/// One key's state in one task, for `/sessions?key=K`.
#[derive(Debug, Clone)]
pub struct KeyView {
    /// The task holding it.
    pub task: String,
    /// The key's floor (ms, `i64::MIN` for minus infinity).
    pub floor: i64,
    /// The task's watermark.
    pub watermark: Watermark,
    /// Its sessions, oldest first, as JSON objects: the fields of a session record, in
    /// their order, then `close`, `status` and `task`.
    pub sessions: Vec<Box<serde_json::value::RawValue>>,
}

/// Why a question about a key got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The job is not reading its input yet (or any more).
    #[error("the job is not running: it is {}", .0.as_str())]
    NotRunning(Phase),
    /// The pipeline did not come between two batches in time.
    #[error(
        "the job did not answer within {} s: it is busy with a batch or a checkpoint; ask again",
        .0.as_secs_f64()
    )]
    TimedOut(Duration),
}

/// A question waiting for the pipeline.
struct Query {
    key: String,
    reply: mpsc::SyncSender<Vec<KeyView>>,
}

/// A running job's telemetry: cheap to clone, shared with the HTTP server.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("phase", &self.phase())
            .finish_non_exhaustive()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry::new(Quiet)
    }
}

struct Inner {
    registry: Registry,
    m: Metrics,
    observer: Box<dyn Observer + Send + Sync>,
    phase: AtomicU8,
    tasks: Arc<Mutex<BTreeMap<String, TaskState>>>,
    /// Sessions completed and not yet written out: when the watermark passed their
    /// close, and how many.
    completed: Mutex<Vec<(Instant, u64)>>,
    queries: Mutex<Vec<Query>>,
    /// Questions are waiting (checked between batches without taking the lock).
    asked: AtomicBool,
    /// Set by whoever runs the job (the command line's SIGTERM and SIGINT handler) to
    /// ask a long-running Kafka job to stop cleanly between two batches.
    stop: Arc<AtomicBool>,
    /// Someone may ask (an HTTP endpoint is up): a quiet live input then wakes the
    /// pipeline now and then to answer.
    serving: AtomicBool,
}

/// What is kept per task between two reports.
#[derive(Debug, Clone, Copy, Default)]
struct TaskState {
    counts: TaskCounts,
    watermark: Option<i64>,
}

type Labels = Vec<(&'static str, String)>;

fn task_label(task: &str) -> Labels {
    vec![("task", task.to_string())]
}

/// Histogram buckets in seconds, 1 ms to 60 s.
const SECONDS_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

struct Metrics {
    records: Family<Labels, Counter>,
    blank_lines: Family<Labels, Counter>,
    input_bytes: Family<Labels, Counter>,
    sessions_emitted: Family<Labels, Counter>,
    retractions: Family<Labels, Counter>,
    open_sessions: Family<Labels, Gauge>,
    keys: Family<Labels, Gauge>,
    emission_delay: Histogram,
    checkpoints: Family<Labels, Counter>,
    checkpoint_duration: Histogram,
    checkpoint_pause: Histogram,
    checkpoint_size: Gauge,
    checkpoint_bytes: Counter,
    checkpoint_epoch: Gauge,
    checkpoints_damaged: Counter,
    restore_records: Counter,
    restore_bytes: Counter,
    restore_keys: Counter,
    restore_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    ready: Gauge,
    rebalances: Family<Labels, Counter>,
    rebalance_partitions: Family<Labels, Counter>,
    transactions_aborted: Counter,
    records_misplaced: Family<Labels, Counter>,
    outages: Counter,
    outage_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
}

impl Metrics {
    fn register(r: &mut Registry, tasks: Arc<Mutex<BTreeMap<String, TaskState>>>) -> Metrics {
        let m = Metrics {
            records: Family::default(),
            blank_lines: Family::default(),
            input_bytes: Family::default(),
            sessions_emitted: Family::default(),
            retractions: Family::default(),
            open_sessions: Family::default(),
            keys: Family::default(),
            emission_delay: Histogram::new(SECONDS_BUCKETS),
            checkpoints: Family::default(),
            checkpoint_duration: Histogram::new(SECONDS_BUCKETS),
            checkpoint_pause: Histogram::new(SECONDS_BUCKETS),
            checkpoint_size: Gauge::default(),
            checkpoint_bytes: Counter::default(),
            checkpoint_epoch: Gauge::default(),
            checkpoints_damaged: Counter::default(),
            restore_records: Counter::default(),
            restore_bytes: Counter::default(),
            restore_keys: Counter::default(),
            restore_seconds: Counter::default(),
            ready: Gauge::default(),
            rebalances: Family::default(),
            rebalance_partitions: Family::default(),
            transactions_aborted: Counter::default(),
            records_misplaced: Family::default(),
            outages: Counter::default(),
            outage_seconds: Counter::default(),
        };
        r.register(
            "records",
            "Records read, by task and outcome (in_sessions, duplicates, late, invalid); their sum is the records read",
            m.records.clone(),
        );
        r.register(
            "blank_lines",
            "Blank lines skipped (not records)",
            m.blank_lines.clone(),
        );
        r.register_with_unit(
            "input",
            "Input bytes consumed",
            Unit::Bytes,
            m.input_bytes.clone(),
        );
        r.register(
            "sessions_emitted",
            "Session records emitted (every revision; on-update records too)",
            m.sessions_emitted.clone(),
        );
        r.register(
            "retractions",
            "Retraction records emitted",
            m.retractions.clone(),
        );
        r.register(
            "open_sessions",
            "Sessions not yet final (open, or complete and kept for the allowed lateness)",
            m.open_sessions.clone(),
        );
        r.register("keys", "Keys with state", m.keys.clone());
        r.register_with_unit(
            "emission_delay",
            "From the moment the pipeline's watermark passed a session's close time to the moment its record was written to the output (Kafka: committed)",
            Unit::Seconds,
            m.emission_delay.clone(),
        );
        r.register(
            "checkpoints",
            "Checkpoints made durable, by kind (base, delta; transaction for a Kafka commit)",
            m.checkpoints.clone(),
        );
        r.register_with_unit(
            "checkpoint_duration",
            "Time to make a checkpoint durable (sync the outputs, write state and manifest), or to commit a Kafka transaction",
            Unit::Seconds,
            m.checkpoint_duration.clone(),
        );
        r.register_with_unit(
            "checkpoint_pause",
            "Time the pipeline stood still for a checkpoint (flush outputs, encode changed state)",
            Unit::Seconds,
            m.checkpoint_pause.clone(),
        );
        r.register_with_unit(
            "checkpoint_size",
            "Size of the last checkpoint (state file and manifest; a transaction's changelog records)",
            Unit::Bytes,
            m.checkpoint_size.clone(),
        );
        r.register_with_unit(
            "checkpoint_written",
            "Bytes of checkpoints written",
            Unit::Bytes,
            m.checkpoint_bytes.clone(),
        );
        r.register(
            "checkpoint_epoch",
            "Epoch of the last checkpoint made durable in the state directory",
            m.checkpoint_epoch.clone(),
        );
        r.register(
            "checkpoints_damaged",
            "Damaged checkpoints skipped for an older one",
            m.checkpoints_damaged.clone(),
        );
        r.register(
            "restore_records",
            "State records read to restore (checkpoint state entries, changelog records)",
            m.restore_records.clone(),
        );
        r.register_with_unit(
            "restore",
            "Bytes of state read to restore",
            Unit::Bytes,
            m.restore_bytes.clone(),
        );
        r.register(
            "restore_keys",
            "Keys whose state was put back (grows while a restore runs)",
            m.restore_keys.clone(),
        );
        r.register_with_unit(
            "restore_duration",
            "Time spent restoring state",
            Unit::Seconds,
            m.restore_seconds.clone(),
        );
        r.register(
            "ready",
            "1 once the state is restored and the input is being read, else 0",
            m.ready.clone(),
        );
        r.register(
            "rebalances",
            "Kafka rebalance events, by kind (assign, revoke, lost)",
            m.rebalances.clone(),
        );
        r.register(
            "rebalance_partitions",
            "Partitions gained or given up in rebalances, by kind",
            m.rebalance_partitions.clone(),
        );
        r.register(
            "transactions_aborted",
            "Kafka transactions aborted (the tasks were rewound to their last commit)",
            m.transactions_aborted.clone(),
        );
        r.register(
            "records_misplaced",
            "Kafka records whose session key cannot belong to their partition (the topic is not keyed by the session key; the job stops)",
            m.records_misplaced.clone(),
        );
        r.register(
            "kafka_outages",
            "Times the Kafka cluster stopped answering and the job waited for it",
            m.outages.clone(),
        );
        r.register_with_unit(
            "kafka_outage_duration",
            "Time spent waiting for the Kafka cluster to answer again",
            Unit::Seconds,
            m.outage_seconds.clone(),
        );
        r.register_collector(Box::new(WatermarkCollector { tasks }));
        m
    }
}

/// The watermark and its lag behind the wall clock, per task, computed at each scrape
/// so that the lag keeps growing while the input is quiet.
#[derive(Debug)]
struct WatermarkCollector {
    tasks: Arc<Mutex<BTreeMap<String, TaskState>>>,
}

impl Collector for WatermarkCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let marks: Vec<(String, i64)> = lock(&self.tasks)
            .iter()
            .filter_map(|(t, s)| s.watermark.map(|w| (t.clone(), w)))
            .collect();
        let tasks = ConstGauge::new(lock(&self.tasks).len() as i64);
        tasks.encode(encoder.encode_descriptor(
            "tasks",
            "Tasks this process holds (1 for a file or stdin input; one per Kafka partition)",
            None,
            MetricType::Gauge,
        )?)?;
        let seconds = Unit::Seconds;
        let mut family = encoder.encode_descriptor(
            "watermark",
            "The task's watermark, as Unix time (absent before the first event and after the end of input)",
            Some(&seconds),
            MetricType::Gauge,
        )?;
        for (task, w) in &marks {
            let labels = [("task", task.as_str())];
            ConstGauge::new(*w as f64 / 1000.0).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "watermark_lag",
            "Wall-clock time minus the task's watermark, at the scrape",
            Some(&seconds),
            MetricType::Gauge,
        )?;
        for (task, w) in &marks {
            let labels = [("task", task.as_str())];
            let lag = now_ms.saturating_sub(*w) as f64 / 1000.0;
            ConstGauge::new(lag).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Telemetry {
    /// Telemetry whose progress and warnings go to `observer`.
    pub fn new(observer: impl Observer + Send + Sync + 'static) -> Telemetry {
        Telemetry::with_stop(observer, Arc::new(AtomicBool::new(false)))
    }

    /// The same, with the stop flag `stop`, which the host sets to ask the job to stop
    /// cleanly (see [`stop_flag`](Self::stop_flag)): a host that does not hand the flag
    /// to signal handlers, such as a Python interpreter watching for Ctrl-C.
    pub fn with_stop(
        observer: impl Observer + Send + Sync + 'static,
        stop: Arc<AtomicBool>,
    ) -> Telemetry {
        let mut registry = Registry::with_prefix("sessionizer");
        let tasks = Arc::new(Mutex::new(BTreeMap::new()));
        let m = Metrics::register(&mut registry, tasks.clone());
        Telemetry {
            inner: Arc::new(Inner {
                registry,
                m,
                observer: Box::new(observer),
                phase: AtomicU8::new(0),
                tasks,
                completed: Mutex::new(Vec::new()),
                queries: Mutex::new(Vec::new()),
                asked: AtomicBool::new(false),
                stop,
                serving: AtomicBool::new(false),
            }),
        }
    }

    /// The metrics in the Prometheus text format ([`METRICS_CONTENT_TYPE`]).
    pub fn encode_metrics(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.inner.registry);
        out
    }

    /// The flag that asks the job to stop cleanly: a Kafka job commits what it did,
    /// writes its task snapshots, leaves the group and returns its stats (with
    /// `stopped`). Hand it to a signal handler (`signal_hook::flag::register`).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.inner.stop.clone()
    }

    /// Asks the job to stop cleanly (see [`stop_flag`](Self::stop_flag)).
    pub fn request_stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
    }

    /// Whether a clean stop was asked for.
    pub fn stop_requested(&self) -> bool {
        self.inner.stop.load(Ordering::Acquire)
    }

    /// Where the run stands.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.inner.phase.load(Ordering::Acquire))
    }

    /// Ready: the state is restored and the input is being read.
    pub fn is_ready(&self) -> bool {
        self.phase() == Phase::Running
    }

    fn set_phase(&self, p: Phase) {
        self.inner.phase.store(p as u8, Ordering::Release);
        self.inner.m.ready.set(i64::from(p == Phase::Running));
    }

    /// State is being restored (not ready).
    pub fn restoring(&self) {
        if self.phase() != Phase::Restoring {
            self.set_phase(Phase::Restoring);
            tracing::info!(phase = "restoring", "restoring state");
        }
    }

    /// Keys put back so far in a restore that is still running.
    pub fn restore_progress(&self, keys: u64) {
        self.inner.m.restore_keys.inc_by(keys);
    }

    /// A task's state was restored. `keys` already reported through
    /// [`restore_progress`](Self::restore_progress) are given in `keys_reported`.
    pub fn restored(&self, r: &RestoreReport<'_>, keys_reported: u64) {
        let m = &self.inner.m;
        m.restore_records.inc_by(r.records);
        m.restore_bytes.inc_by(r.bytes);
        m.restore_keys.inc_by(r.keys.saturating_sub(keys_reported));
        m.restore_seconds.inc_by(r.took.as_secs_f64());
        tracing::info!(
            source = r.source,
            task = r.task,
            epoch = r.epoch,
            records = r.records,
            bytes = r.bytes,
            keys = r.keys,
            duration_ms = millis(r.took),
            "state restored"
        );
    }

    /// The Kafka cluster stopped answering (`cause`: the first error): the job waits
    /// for it, not ready. Said (and counted) when `new`, not when the failure follows
    /// from an outage that just ended.
    pub fn waiting(&self, cause: &dyn fmt::Display, limit: Duration, new: bool) {
        if self.phase() == Phase::Waiting {
            return;
        }
        self.set_phase(Phase::Waiting);
        if new {
            self.inner.m.outages.inc();
            // Said by default (unlike the other events of a run): a service that stops
            // making progress must say why.
            tracing::warn!(
                target: OUTAGE_TARGET,
                cause = %cause,
                limit_s = limit.as_secs(),
                "the Kafka cluster does not answer; waiting for it"
            );
        }
    }

    /// The Kafka cluster answers again after `waited` (said when the wait was
    /// announced).
    pub fn answered(&self, waited: Duration, say: bool) {
        self.inner.m.outage_seconds.inc_by(waited.as_secs_f64());
        if say {
            tracing::info!(
                target: OUTAGE_TARGET,
                waited_ms = millis(waited),
                "the Kafka cluster answers again"
            );
        }
        self.running();
    }

    /// The input is being read: ready.
    pub fn running(&self) {
        if self.phase() != Phase::Running {
            self.set_phase(Phase::Running);
            tracing::info!(phase = "running", "reading input");
        }
    }

    /// The run is over (`result`: its summary, or why it failed). Questions still
    /// waiting get no answer.
    pub fn ended(&self, result: Result<&RunStats, &dyn std::error::Error>) {
        self.set_phase(Phase::Ended);
        lock(&self.inner.queries).clear();
        match result {
            Ok(s) => tracing::info!(
                records_read = s.records_read,
                in_sessions = s.in_sessions,
                duplicates = s.duplicates,
                late = s.late,
                invalid = s.invalid,
                sessions_emitted = s.sessions_emitted,
                retractions = s.retractions,
                elapsed_ms = s.elapsed_ms,
                "run finished"
            ),
            Err(e) => tracing::error!(error = %e, "run failed"),
        }
    }

    /// A damaged checkpoint was skipped for an older one.
    pub fn damaged_checkpoint(&self, dir: &str, epoch: u64, damage: &dyn fmt::Display) {
        self.inner.m.checkpoints_damaged.inc();
        tracing::warn!(dir, epoch, damage = %damage, "damaged checkpoint skipped");
        self.inner.observer.warn(&format!(
            "checkpoint {epoch} in {dir} is damaged ({damage}); using an older one"
        ));
    }

    /// Something the user should know that does not stop the run: logged, and told to
    /// the observer.
    pub(crate) fn warn(&self, message: &str) {
        tracing::warn!(message, "warning");
        self.inner.observer.warn(message);
    }

    /// Where the tasks stand after a batch (or a round of batches).
    pub fn batch(&self, reports: &[TaskReport<'_>]) {
        let m = &self.inner.m;
        let mut tasks = lock(&self.inner.tasks);
        for r in reports {
            let state = tasks.entry(r.task.to_string()).or_default();
            let (was, now) = (state.counts, r.counts);
            let labels = task_label(r.task);
            for (outcome, a, b) in [
                ("in_sessions", was.in_sessions, now.in_sessions),
                ("duplicates", was.duplicates, now.duplicates),
                ("late", was.late, now.late),
                ("invalid", was.invalid, now.invalid),
            ] {
                let mut l = labels.clone();
                l.push(("outcome", outcome.to_string()));
                m.records.get_or_create(&l).inc_by(b.saturating_sub(a));
            }
            m.blank_lines
                .get_or_create(&labels)
                .inc_by(now.blank_lines.saturating_sub(was.blank_lines));
            m.input_bytes
                .get_or_create(&labels)
                .inc_by(now.bytes_read.saturating_sub(was.bytes_read));
            m.sessions_emitted
                .get_or_create(&labels)
                .inc_by(now.sessions_emitted.saturating_sub(was.sessions_emitted));
            m.retractions
                .get_or_create(&labels)
                .inc_by(now.retractions.saturating_sub(was.retractions));
            m.open_sessions
                .get_or_create(&labels)
                .set(r.open_sessions as i64);
            m.keys.get_or_create(&labels).set(r.keys as i64);
            state.counts = now;
            state.watermark = r.watermark.is_finite().then(|| r.watermark.millis());
        }
        drop(tasks);
        let read = reports.iter().map(|r| r.counts.records_read()).sum();
        let open = reports.iter().map(|r| r.open_sessions as usize).sum();
        let w = reports
            .iter()
            .map(|r| r.watermark)
            .min()
            .unwrap_or(Watermark::MIN);
        self.inner.observer.progress(read, open, w);
    }

    /// A task was given up (Kafka): its gauges go; a later report of the same task
    /// counts from zero again.
    pub fn task_removed(&self, task: &str) {
        lock(&self.inner.tasks).remove(task);
        let labels = task_label(task);
        self.inner.m.open_sessions.remove(&labels);
        self.inner.m.keys.remove(&labels);
    }

    /// `n` complete session records were emitted; the pipeline's watermark passed
    /// their close times at `at`. They count in the emission delay once written.
    pub fn sessions_completed(&self, n: u64, at: Instant) {
        if n > 0 {
            lock(&self.inner.completed).push((at, n));
        }
    }

    /// Everything emitted so far is written to the outputs (Kafka: committed) now.
    pub fn outputs_written(&self) {
        let pending = std::mem::take(&mut *lock(&self.inner.completed));
        let now = Instant::now();
        for (at, n) in pending {
            let delay = now.saturating_duration_since(at).as_secs_f64();
            for _ in 0..n {
                self.inner.m.emission_delay.observe(delay);
            }
        }
    }

    /// What was emitted since the last write is thrown away (an aborted transaction):
    /// it is produced again, and counted then.
    pub fn outputs_discarded(&self) {
        lock(&self.inner.completed).clear();
    }

    /// The pipeline stood still this long for a checkpoint.
    pub fn checkpoint_paused(&self, pause: Duration) {
        self.inner.m.checkpoint_pause.observe(pause.as_secs_f64());
    }

    /// A checkpoint is durable, or a Kafka transaction committed.
    pub fn checkpoint(&self, r: &CheckpointReport) {
        let m = &self.inner.m;
        m.checkpoints
            .get_or_create(&vec![("kind", r.kind.as_str().to_string())])
            .inc();
        m.checkpoint_duration.observe(r.took.as_secs_f64());
        m.checkpoint_size.set(r.bytes as i64);
        m.checkpoint_bytes.inc_by(r.bytes);
        if let Some(e) = r.epoch {
            m.checkpoint_epoch.set(e as i64);
        }
        tracing::info!(
            kind = r.kind.as_str(),
            epoch = r.epoch,
            bytes = r.bytes,
            keys = r.keys,
            duration_ms = millis(r.took),
            "checkpoint"
        );
    }

    /// A Kafka rebalance: `kind` is `assign`, `revoke` or `lost`.
    pub fn rebalance(&self, kind: &'static str, partitions: &[String]) {
        let l = vec![("kind", kind.to_string())];
        self.inner.m.rebalances.get_or_create(&l).inc();
        self.inner
            .m
            .rebalance_partitions
            .get_or_create(&l)
            .inc_by(partitions.len() as u64);
        tracing::info!(
            kind,
            count = partitions.len(),
            partitions = %partitions.join(","),
            "rebalance"
        );
    }

    /// Records of a Kafka task whose session key cannot belong to its partition.
    pub fn records_misplaced(&self, task: &str, count: u64) {
        self.inner
            .m
            .records_misplaced
            .get_or_create(&task_label(task))
            .inc_by(count);
        tracing::error!(
            task,
            count,
            "records not keyed into their partition by the session key"
        );
    }

    /// A Kafka transaction was aborted; the tasks go back to their last commit.
    pub fn transaction_aborted(&self, reason: &dyn fmt::Display) {
        self.inner.m.transactions_aborted.inc();
        self.outputs_discarded();
        tracing::warn!(reason = %reason, "transaction aborted; rewinding the tasks to their last commit");
    }

    /// From now on questions may be asked: a pipeline waiting on a quiet input wakes
    /// up now and then to answer them.
    pub fn accept_queries(&self) {
        self.inner.serving.store(true, Ordering::Release);
    }

    /// Whether questions may be asked ([`accept_queries`](Self::accept_queries)).
    pub fn serves_queries(&self) -> bool {
        self.inner.serving.load(Ordering::Acquire)
    }

    /// Answers the waiting questions, `lookup` giving a key's state in every task
    /// that holds it. Called by the pipeline between batches.
    pub fn answer_queries(&self, mut lookup: impl FnMut(&str) -> Vec<KeyView>) {
        if !self.inner.asked.load(Ordering::Acquire) {
            return;
        }
        let waiting = {
            let mut q = lock(&self.inner.queries);
            self.inner.asked.store(false, Ordering::Release);
            std::mem::take(&mut *q)
        };
        for q in waiting {
            let _ = q.reply.try_send(lookup(&q.key));
        }
    }

    /// Asks the running pipeline for `key`'s sessions and waits up to `timeout` for
    /// the answer (blocking: call it off any async runtime's worker threads).
    pub fn query(&self, key: &str, timeout: Duration) -> Result<KeyAnswer, QueryError> {
        let phase = self.phase();
        if phase != Phase::Running {
            return Err(QueryError::NotRunning(phase));
        }
        let (reply, answer) = mpsc::sync_channel(1);
        {
            let mut q = lock(&self.inner.queries);
            q.push(Query {
                key: key.to_string(),
                reply,
            });
            self.inner.asked.store(true, Ordering::Release);
        }
        match answer.recv_timeout(timeout) {
            Ok(views) => Ok(KeyAnswer::new(key, views)),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(QueryError::TimedOut(timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(QueryError::NotRunning(self.phase())),
        }
    }
}

/// The answer to `/sessions?key=K`.
#[derive(Debug, Clone)]
pub struct KeyAnswer {
    /// Whether any task holds state for the key.
    pub found: bool,
    /// One JSON object: `{"key", "floor", "tasks": [{"task", "floor", "watermark"}],
    /// "sessions": [...]}`, or `{"key", "sessions": []}` when no task holds the key.
    /// `floor` is the highest floor of the tasks holding the key (usually one).
    pub json: String,
}

#[derive(serde::Serialize)]
struct Found<'a> {
    key: &'a str,
    floor: String,
    tasks: Vec<FoundIn>,
    sessions: Vec<Box<serde_json::value::RawValue>>,
}

#[derive(serde::Serialize)]
struct FoundIn {
    task: String,
    floor: String,
    watermark: String,
}

#[derive(serde::Serialize)]
struct NotFound<'a> {
    key: &'a str,
    sessions: [(); 0],
}

impl KeyAnswer {
    fn new(key: &str, views: Vec<KeyView>) -> KeyAnswer {
        let floor = |ms: i64| Watermark::at(EventTime(ms)).to_string();
        let found = !views.is_empty();
        let json = if !found {
            serde_json::to_string(&NotFound { key, sessions: [] })
        } else {
            let highest = views.iter().map(|v| v.floor).max().unwrap_or(i64::MIN);
            let tasks = views
                .iter()
                .map(|v| FoundIn {
                    task: v.task.clone(),
                    floor: floor(v.floor),
                    watermark: v.watermark.to_string(),
                })
                .collect();
            let sessions = views.into_iter().flat_map(|v| v.sessions).collect();
            serde_json::to_string(&Found {
                key,
                floor: floor(highest),
                tasks,
                sessions,
            })
        };
        KeyAnswer {
            found,
            // Plain strings and numbers: serializing cannot fail.
            json: json.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests;
