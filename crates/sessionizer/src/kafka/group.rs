//! A library job as a member of a Kafka consumer group (SPEC §5), on the command line's
//! Kafka driver: every input partition is a task with a job of its own (made by your
//! closure), its own watermark, offsets and state; the state of each task is kept in a
//! compacted changelog topic, and every commit — the output records, the dead letters
//! and late events, each changed task's state and the consumed offsets — is one Kafka
//! transaction. Processes that run the same group share the partitions (cooperative
//! rebalancing); a process that gains a partition restores its task from the changelog
//! (or a local snapshot, with a state directory) before it reads a record of it;
//! standby replicas keep warm copies. This is the driver `sessionizer run
//! --kafka-group` runs, not a second one: only the task's operator differs (the job you
//! built, instead of the command line's JSON session window).
//!
//! Each record's value is decoded as your event type with serde; a record that does not
//! decode (or whose event time is outside the job's valid time range) is a dead letter,
//! `{"reason","source":"topic/partition@offset","raw"}`, and a too-late event a late
//! record, `{"reason","source","watermark","behind_watermark_ms","event"}` — the command
//! line's records. Session records are the job's [`WindowOutput`] as JSON (the
//! [`SessionRecord`](crate::windowed::SessionRecord) layout), each a message keyed by
//! its `session_id`, partitioned by its session key; a retraction is a tombstone.

use crate::config::{KafkaConfig, KafkaStart, StateBackend};
use crate::late::TIME_OUT_OF_RANGE;
use crate::pipeline::backend::TaskStores;
use crate::pipeline::kafka::{
    DriverSettings, Processed, PutChange, TaskFactory, TaskOp, run_tasks,
};
use crate::pipeline::shard::Tagged;
use crate::pipeline::{Quiet, RunError};
use crate::sink::{Sink, SinkError};
use crate::stats::RunStats;
use crate::stream::{KeyFn, TimeFn};
use crate::telemetry::Telemetry;
use crate::windowed::{GapFn, SessionWindowJob, WindowOutput};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::WatermarkState;
use sessionizer_connectors::encode::{SourceName, encode_dead_letter, encode_late};
use sessionizer_connectors::{Batch, OutputTarget};
use sessionizer_core::{DurationMs, Watermark};
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::aggregate::Aggregator;
use sessionizer_window::clock::Clock;
use sessionizer_window::codec;
use sessionizer_window::spill::{SpillCounts, SpillError};
use std::path::PathBuf;
use std::time::Duration;

/// A library job run as a member of a Kafka consumer group: the command line's
/// `--kafka-group` with your job as every partition's operator.
///
/// ```no_run
/// use sessionizer::kafka::KafkaGroup;
/// use sessionizer::prelude::*;
///
/// #[derive(serde::Deserialize)]
/// struct Visit { visit_id: String, event_time: EventTime }
///
/// let stats = KafkaGroup::new("127.0.0.1:9092", "visit-sessions", "visits", "sessions")
///     .dead_letter_topic("visits-dead")
///     .state_dir("/var/lib/visit-sessions")
///     .run_windows(|| {
///         Stream::<Visit>::new()
///             .key_by(|v| v.visit_id.clone())
///             .event_time(|v| v.event_time)
///             .session_windows(minutes(30))
///             .aggregate(Count)
///             .build()
///     })?;
/// # Ok::<(), sessionizer::pipeline::RunError>(())
/// ```
#[derive(Debug, Clone)]
pub struct KafkaGroup {
    kafka: KafkaConfig,
    idle_timeout: Option<DurationMs>,
    workers: usize,
    telemetry: Option<Telemetry>,
}

impl KafkaGroup {
    /// A member of consumer group `group` at `brokers` reading `topic` (one task per
    /// partition) and writing session records to `output_topic`, exactly once. The
    /// group names the job in Kafka: its changelog topics are `<group>-<topic>-changelog`
    /// and its transactional ids start with it. Defaults as on the command line: commit
    /// every 10 s, start a partition without a committed offset at its first record,
    /// dead letters and late events to stderr unless given topics.
    pub fn new(brokers: &str, group: &str, topic: &str, output_topic: &str) -> KafkaGroup {
        KafkaGroup {
            kafka: KafkaConfig {
                brokers: brokers.to_string(),
                properties: Vec::new(),
                timeout: Duration::from_secs(30),
                topics: vec![topic.to_string()],
                group: Some(group.to_string()),
                start: KafkaStart::Earliest,
                stop_at_end: false,
                output_topic: Some(output_topic.to_string()),
                dead_letter_topic: None,
                late_topic: None,
                instance_id: None,
                transaction_timeout: Duration::from_secs(10),
                commit_interval: Duration::from_secs(10),
                keep_open: false,
                state_dir: None,
                snapshot_interval: Duration::from_secs(30),
                standby_replicas: 0,
                repartition: false,
            },
            idle_timeout: None,
            workers: 1,
            telemetry: None,
        }
    }

    /// Reads `topic` too (its partitions are tasks of their own).
    pub fn topic(mut self, topic: &str) -> Self {
        self.kafka.topics.push(topic.to_string());
        self
    }

    /// Invalid records go to `topic`, in the commits' transactions (else to stderr).
    pub fn dead_letter_topic(mut self, topic: &str) -> Self {
        self.kafka.dead_letter_topic = Some(topic.to_string());
        self
    }

    /// Too-late events go to `topic`, in the commits' transactions (else to stderr).
    pub fn late_topic(mut self, topic: &str) -> Self {
        self.kafka.late_topic = Some(topic.to_string());
        self
    }

    /// How often the job commits (`--checkpoint-interval`; default 10 s): a reader of
    /// the output sees records within about this long.
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.kafka.commit_interval = every;
        self
    }

    /// After a partition has been quiet for `timeout`, its watermark moves on with the
    /// wall clock (`--idle-timeout`, SPEC §2), so its quiet keys' sessions close.
    pub fn idle_timeout(mut self, timeout: DurationMs) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// A local state directory (`--state-dir`): each task's committed state is
    /// snapshotted there, so a restart reads only the changelog after it; the process's
    /// instance id is kept there too.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.kafka.state_dir = Some(dir.into());
        self
    }

    /// How often the local snapshots are written (default 30 s).
    pub fn snapshot_interval(mut self, every: Duration) -> Self {
        self.kafka.snapshot_interval = every;
        self
    }

    /// Keeps warm copies of `n` other processes' tasks (`--standby-replicas`), so that
    /// a failover does not wait for a restore.
    pub fn standby_replicas(mut self, n: usize) -> Self {
        self.kafka.standby_replicas = n;
        self
    }

    /// This process's stable name (`--kafka-instance-id`), which names its
    /// transactional producer: a restarted process with the same id fences its
    /// predecessor's producer at once, aborting its open transaction.
    pub fn instance_id(mut self, id: &str) -> Self {
        self.kafka.instance_id = Some(id.to_string());
        self
    }

    /// Reads every partition up to its end offset at the start, then ends
    /// (`--stop-at-end`): every session is emitted, unless [`keep_open`](Self::keep_open).
    pub fn stop_at_end(mut self, yes: bool) -> Self {
        self.kafka.stop_at_end = yes;
        self
    }

    /// At the end of a [`stop_at_end`](Self::stop_at_end) run, keeps the sessions in
    /// progress in the changelogs for the next run (`--keep-open`).
    pub fn keep_open(mut self, yes: bool) -> Self {
        self.kafka.keep_open = yes;
        self
    }

    /// Where a partition without a committed offset starts (`--kafka-start`).
    pub fn start(mut self, at: KafkaStart) -> Self {
        self.kafka.start = at;
        self
    }

    /// Processes the tasks of this process on `n` threads (`--workers`).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// A librdkafka property for every client (`--kafka-config KEY=VALUE`).
    pub fn kafka_property(mut self, key: &str, value: &str) -> Self {
        self.kafka
            .properties
            .push((key.to_string(), value.to_string()));
        self
    }

    /// Reports to `telemetry` (metrics, logs, `/health`) and stops, committing first,
    /// when [`Telemetry::request_stop`] is called on it (from another thread or a signal
    /// handler). Without one the job reports nothing and runs until it fails or, with
    /// [`stop_at_end`](Self::stop_at_end), ends.
    pub fn telemetry(mut self, telemetry: &Telemetry) -> Self {
        self.telemetry = Some(telemetry.clone());
        self
    }

    /// Runs a session-window job per partition: `new_job` builds one (on one worker,
    /// in memory: the group spreads partitions over processes and
    /// [`workers`](Self::workers)); it is called for every task this process takes
    /// on. Returns the run's accounting when it ends ([`stop_at_end`](Self::stop_at_end),
    /// or a stop asked of its [`telemetry`](Self::telemetry)); an error stops it
    /// without committing what the failing step produced.
    pub fn run_windows<F, E, K, T, W, A, G, C>(&self, new_job: F) -> Result<RunStats, RunError>
    where
        F: Fn() -> SessionWindowJob<E, K, T, W, A, G, C> + Sync,
        SessionWindowJob<E, K, T, W, A, G, C>: Send,
        E: DeserializeOwned,
        K: KeyFn<E>,
        T: TimeFn<E>,
        W: WatermarkStrategy,
        A: Aggregator<E>,
        A::Acc: Serialize + DeserializeOwned,
        A::Output: Serialize,
        G: GapFn<E>,
        C: Clock,
    {
        let probe = new_job();
        if let Some(refusal) = probe.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        let options = probe.task_state_options();
        drop(probe);
        let quiet;
        let telemetry = match &self.telemetry {
            Some(t) => t,
            None => {
                quiet = Telemetry::new(Quiet);
                &quiet
            }
        };
        run_tasks(
            self.settings(),
            &self.kafka,
            WindowTasks { new_job, options },
            telemetry,
        )
    }

    /// The driver's settings: outputs that are not topics go to stderr.
    fn settings(&self) -> DriverSettings {
        DriverSettings {
            output: OutputTarget::Stdout,
            dead_letter: OutputTarget::Stderr,
            late_output: OutputTarget::Stderr,
            rekey_field: None,
            workers: self.workers,
            state_backend: StateBackend::Memory,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// Makes a session-window job per task.
struct WindowTasks<F> {
    new_job: F,
    options: Vec<(String, String)>,
}

impl<F, E, K, T, W, A, G, C> TaskFactory for WindowTasks<F>
where
    F: Fn() -> SessionWindowJob<E, K, T, W, A, G, C> + Sync,
    SessionWindowJob<E, K, T, W, A, G, C>: Send,
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    A::Output: Serialize,
    G: GapFn<E>,
    C: Clock,
{
    type Op = WindowOp<E, K, T, W, A, G, C>;

    fn new_op(&self, _task: &str, stores: Option<&TaskStores>) -> Result<Self::Op, RunError> {
        if stores.is_some() {
            return Err(RunError::Unsupported(
                "a library job in a Kafka group keeps its state in memory".into(),
            ));
        }
        let job = (self.new_job)();
        if let Some(refusal) = job.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        Ok(WindowOp {
            job,
            out: Tagged::for_records(),
            late: Vec::new(),
            late_steps: Vec::new(),
            dead: Vec::new(),
            dead_lines: Vec::new(),
            lines: Vec::new(),
            error: None,
        })
    }

    fn options(&self) -> Vec<(String, String)> {
        self.options.clone()
    }

    fn state_format(&self) -> u16 {
        codec::FORMAT
    }
}

/// One task's session-window job, and the records of its last step.
struct WindowOp<E, K, T, W, A: Aggregator<E>, G, C> {
    job: SessionWindowJob<E, K, T, W, A, G, C>,
    out: Tagged,
    late: Vec<u8>,
    late_steps: Vec<(u64, usize, usize)>,
    dead: Vec<u8>,
    dead_lines: Vec<usize>,
    /// The batch line of each decoded event of the last batch.
    lines: Vec<usize>,
    /// The first error (an output or a state its serde implementation refused).
    error: Option<RunError>,
}

/// The job's records into a task's tagged buffer, as JSON.
struct Records<'a>(&'a mut Tagged);

impl<O: Serialize> Sink<WindowOutput<O>> for Records<'_> {
    fn send(&mut self, record: WindowOutput<O>) -> Result<(), SinkError> {
        let mut failed = None;
        let (key, start, complete, retract) = match &record {
            WindowOutput::Session(s) => (s.key.as_bytes(), s.start, s.complete, false),
            WindowOutput::Retraction(r) => (r.key.as_bytes(), r.start, false, true),
        };
        self.0.push_with(key, start, complete, retract, |buf| {
            if let Err(e) = serde_json::to_writer(buf, &record) {
                failed = Some(e);
            }
        });
        failed.map_or(Ok(()), |e| Err(SinkError::Encode(e)))
    }
}

impl<E, K, T, W, A, G, C> WindowOp<E, K, T, W, A, G, C>
where
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    A::Output: Serialize,
    G: GapFn<E>,
    C: Clock,
{
    fn failed(&mut self, e: RunError) {
        self.error.get_or_insert(e);
    }
}

impl<E, K, T, W, A, G, C> TaskOp for WindowOp<E, K, T, W, A, G, C>
where
    SessionWindowJob<E, K, T, W, A, G, C>: Send,
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    A::Output: Serialize,
    G: GapFn<E>,
    C: Clock,
{
    fn process(&mut self, batch: &Batch, names: &[SourceName], first_seq: u64) -> Processed {
        self.clear_outputs();
        let mut p = Processed::default();
        let mut events = Vec::with_capacity(batch.lines.len());
        self.lines.clear();
        for i in 0..batch.lines.len() {
            let raw = batch.line(i);
            if raw.iter().all(u8::is_ascii_whitespace) {
                p.blank += 1;
                continue;
            }
            p.records += 1;
            match serde_json::from_slice::<E>(raw) {
                Ok(event) => {
                    events.push(event);
                    self.lines.push(i);
                }
                Err(e) => {
                    p.invalid += 1;
                    let span = batch.lines[i];
                    let pos = names[span.input as usize].pos(span.line_no);
                    encode_dead_letter(&mut self.dead, &e.to_string(), pos, raw);
                    self.dead_lines.push(i);
                }
            }
        }
        let WindowOp {
            job,
            out,
            late,
            late_steps,
            dead,
            dead_lines,
            lines,
            ..
        } = self;
        let pushed = job.push_task_batch(events, first_seq, &mut Records(out), |j, l| {
            let i = lines[j];
            let span = batch.lines[i];
            let pos = names[span.input as usize].pos(span.line_no);
            let raw = batch.line(i);
            if l.reason == TIME_OUT_OF_RANGE {
                let reason = format!("event time {} is outside the valid time range", l.time);
                encode_dead_letter(dead, &reason, pos, raw);
                dead_lines.push(i);
            } else {
                let from = late.len();
                encode_late(late, l.reason, pos, l.watermark, l.time, raw);
                late_steps.push((first_seq + i as u64, from, late.len() - from));
            }
            Ok(())
        });
        if let Err(e) = pushed {
            self.failed(e.into());
        }
        p
    }

    fn clear_outputs(&mut self) {
        self.out.clear();
        self.late.clear();
        self.late_steps.clear();
        self.dead.clear();
        self.dead_lines.clear();
    }

    fn advance_idle(&mut self, w: Watermark, _step: u64) {
        if let Err(e) = self.job.advance_task(w, false, &mut Records(&mut self.out)) {
            self.failed(e.into());
        }
    }

    fn finish(&mut self) {
        if let Err(e) = self
            .job
            .advance_task(Watermark::MAX, true, &mut Records(&mut self.out))
        {
            self.failed(e.into());
        }
    }

    fn sessions(&self) -> &Tagged {
        &self.out
    }

    fn late(&self) -> (&[u8], &[(u64, usize, usize)]) {
        (&self.late, &self.late_steps)
    }

    fn dead_letters(&self) -> (&[u8], Vec<usize>) {
        (&self.dead, self.dead_lines.clone())
    }

    fn watermark(&self) -> Watermark {
        self.job.watermark()
    }

    fn progress(&self) -> WatermarkState {
        self.job.task_progress()
    }

    fn restore_progress(&mut self, w: &WatermarkState) {
        self.job.restore_task_progress(w);
    }

    fn restore_key(&mut self, key: &[u8], value: &[u8], format: u16) -> Result<(), String> {
        if format != codec::FORMAT {
            return Err(format!(
                "its state is of checkpoint format {format}, a library job reads format {}",
                codec::FORMAT
            ));
        }
        self.job.restore_task_key(key, value)
    }

    fn track_changes(&mut self) {
        self.job.track_task_changes();
    }

    fn drain_changes(&mut self, f: &mut PutChange<'_>) {
        if let Err(reason) = self.job.drain_task_changes(f) {
            self.failed(RunError::Unsupported(format!(
                "an accumulator state cannot be written as JSON: {reason}"
            )));
        }
    }

    fn for_each_key(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError> {
        self.job.for_each_task_key(f)
    }

    fn take_error(&mut self) -> Option<RunError> {
        self.error.take()
    }

    fn spill_counts(&self) -> Option<SpillCounts> {
        None
    }

    fn add_counts(&self, stats: &mut RunStats) {
        let c = self.job.counts();
        stats.in_sessions += c.in_sessions;
        stats.late += c.late;
        stats.invalid += c.invalid;
        stats.sessions_emitted += c.sessions_emitted;
        stats.retractions += c.retractions;
    }

    fn open_sessions(&self) -> u64 {
        self.job.open_sessions() as u64
    }

    fn keys(&self) -> u64 {
        self.job.operator().keys() as u64
    }
}
