//! A library job as a member of a Kafka consumer group (docs/semantics.md K-1 to K-3), on
//! the command line's Kafka driver: every input partition is a task with a job of its own
//! (made by your closure), its own watermark, offsets and state; the state of each task
//! is kept in a compacted changelog topic, and every commit — the output records, the
//! dead letters and late events, each changed task's state and the consumed offsets — is
//! one Kafka transaction. Processes that run the same group share the partitions
//! (cooperative rebalancing); a process that gains a partition restores its task from the
//! changelog (or a local snapshot, with a state directory) before it reads a record of
//! it; standby replicas keep warm copies. This is the driver `sessionizer run
//! --kafka-group` runs, not a second one: only the task's operator differs (the job you
//! built, instead of the command line's JSON session window).
//!
//! Each record's value is decoded as your event type with serde; a record that does not
//! decode (or whose event time is outside the job's valid time range) is a dead letter,
//! `{"reason","source":"topic/partition@offset","raw"}`, and a too-late event a late
//! record, `{"reason","source","watermark","behind_watermark_ms","event"}` — the command
//! line's records. Session records are the job's
//! [`WindowOutput`](crate::api::windowed::WindowOutput) as JSON (the
//! [`SessionRecord`](crate::api::windowed::SessionRecord) layout), each a message keyed by
//! its `session_id`, partitioned by its session key; a retraction is a tombstone. A
//! stateful job's outputs ([`KafkaGroup::run_stateful`]) are messages keyed by the key
//! of the call that returned them.

use crate::api::late::{Late, TIME_OUT_OF_RANGE};
use crate::config::{KafkaConfig, KafkaStart, Partitioner, StateBackend};
use crate::error::RunError;
use crate::runtime::kafka::{DriverSettings, Processed, TaskFactory, run_tasks};
use crate::stats::RunStats;
use crate::telemetry::Quiet;
use crate::telemetry::Telemetry;
use serde::de::DeserializeOwned;
use sessionizer_connectors::encode::{SourceName, encode_dead_letter, encode_late};
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_connectors::{Batch, OutputTarget};
use sessionizer_core::DurationMs;
use sessionizer_core::json::FieldPath;
use std::path::PathBuf;
use std::time::Duration;

mod stateful;
mod window;

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
    state_backend: StateBackend,
    /// `repartition_by`: the field, as given.
    rekey_field: Option<String>,
    max_record: usize,
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
                properties: Default::default(),
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
                partitioner: Partitioner::Standard,
                outage_limit: Duration::from_secs(300),
            },
            idle_timeout: None,
            workers: 1,
            state_backend: StateBackend::Memory,
            rekey_field: None,
            max_record: sessionizer_connectors::input::DEFAULT_MAX_RECORD,
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
    /// wall clock (`--idle-timeout`, docs/semantics.md S-32), so its quiet keys' sessions
    /// close.
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

    /// How long the job waits for a cluster that does not answer (brokers restarting,
    /// a leader or coordinator moving) before it stops with an error
    /// (`--kafka-outage-limit`; default 5 minutes). Meanwhile it goes back to its last
    /// commit as after an aborted transaction: nothing is lost or written twice.
    pub fn outage_limit(mut self, limit: Duration) -> Self {
        self.kafka.outage_limit = limit;
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

    /// Where each task keeps its keys (`--state-backend`, docs/semantics.md S-36):
    /// [`StateBackend::Memory`] (the default) or [`StateBackend::RocksDb`] (cargo
    /// feature `rocksdb`): each task's job gets a RocksDB store of its own below it in
    /// `dir` (else the state directory's `spill/`, else a temporary directory), the
    /// budget split evenly over the input's partitions (a share per task), with the
    /// memory backend's outputs. The changelogs
    /// hold every key either way; a task's store is scratch space, emptied when the
    /// task starts and restored from the changelog.
    pub fn state_backend(mut self, backend: StateBackend) -> Self {
        self.state_backend = backend;
        self
    }

    /// Re-keys the input through the internal topic `<group>-repartition`
    /// (`--repartition`, docs/semantics.md K-6), for an input that is not partitioned by
    /// the job's key: each record goes, exactly once, to the partition its JSON field
    /// `field` gives (a dotted path, e.g. `"user.id"`), and the internal topic's
    /// partitions are the tasks. The field must hold the job's key (what `key_by`
    /// returns), so that each key's events meet in one task.
    pub fn repartition_by(mut self, field: &str) -> Self {
        self.kafka.repartition = true;
        self.rekey_field = Some(field.to_string());
        self
    }

    /// Declares the input topics keyed by the job's key with a partitioner of the
    /// producer's own (`--kafka-partitioner custom`): every key in one partition, but
    /// not where Kafka's standard partitioners would put it. Without it each record's
    /// key is checked against its partition (the Java client's murmur2 or librdkafka's
    /// CRC-32), and a record that cannot belong there stops the job: a topic not
    /// partitioned by the key would otherwise split sessions silently.
    pub fn custom_partitioner(mut self) -> Self {
        self.kafka.partitioner = Partitioner::Custom;
        self
    }

    /// The largest record in bytes (`--max-record-size`, default 16 MiB): a longer
    /// message is a dead letter with its length and first bytes.
    pub fn max_record_size(mut self, bytes: usize) -> Self {
        self.max_record = bytes.clamp(1, sessionizer_connectors::input::MAX_RECORD_LIMIT);
        self
    }

    /// A librdkafka property for every client (`--kafka-config KEY=VALUE`): security
    /// settings (`security.protocol`, `sasl.mechanism`, `sasl.username`,
    /// `sasl.password`, `ssl.ca.location`, ...) among them. A key given again replaces
    /// its earlier value.
    pub fn kafka_property(mut self, key: &str, value: &str) -> Self {
        let set = [(key.to_string(), value.to_string())];
        self.kafka.properties.0 =
            sessionizer_connectors::secrets::merge(&[&self.kafka.properties, &set]);
        self
    }

    /// The client properties set in the environment (`SESSIONIZER_KAFKA_SASL_PASSWORD`
    /// is `sasl.password`, and so on), over those given so far: how a service keeps its
    /// secrets off its command line and out of its code.
    pub fn kafka_properties_from_env(mut self) -> Self {
        let env = sessionizer_connectors::secrets::env_properties();
        self.kafka.properties.0 =
            sessionizer_connectors::secrets::merge(&[&self.kafka.properties, &env]);
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
    /// Runs the driver with `tasks`, reporting to the telemetry if there is one.
    fn run_tasks<Tasks: TaskFactory>(&self, tasks: Tasks) -> Result<RunStats, RunError> {
        let quiet;
        let telemetry = match &self.telemetry {
            Some(t) => t,
            None => {
                quiet = Telemetry::new(Quiet);
                &quiet
            }
        };
        run_tasks(self.settings()?, &self.kafka, tasks, telemetry)
    }

    /// The driver's settings: outputs that are not topics go to stderr.
    fn settings(&self) -> Result<DriverSettings, RunError> {
        let rekey_field = match &self.rekey_field {
            Some(field) => {
                Some(
                    FieldPath::parse(field).map_err(|source| RunError::RepartitionField {
                        field: field.clone(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        #[cfg(not(feature = "rocksdb"))]
        if let StateBackend::RocksDb { .. } = self.state_backend {
            return Err(RunError::Unsupported(
                crate::error::Unsupported::NoRocksDbLibrary,
            ));
        }
        Ok(DriverSettings {
            output: OutputTarget::Stdout,
            dead_letter: OutputTarget::Stderr,
            late_output: OutputTarget::Stderr,
            rekey_field,
            workers: self.workers,
            state_backend: self.state_backend.clone(),
            idle_timeout: self.idle_timeout,
            max_record: self.max_record,
            #[cfg(feature = "delta")]
            table: None,
        })
    }
}

/// Decodes the records of `batch` as events (dead letters into `outputs`), their batch
/// lines into `lines`, and checks each event's key (`key_into`) against the partition.
fn decode_batch<E: DeserializeOwned>(
    batch: &Batch,
    names: &[SourceName],
    max_record: usize,
    outputs: &mut Outputs,
    lines: &mut Vec<usize>,
    placement: &mut Option<KeyPlacement>,
    key_into: impl Fn(&E, &mut String),
) -> (Vec<E>, Processed) {
    let mut p = Processed::default();
    let mut events = Vec::with_capacity(batch.lines.len());
    let mut key = String::new();
    lines.clear();
    for i in 0..batch.lines.len() {
        let raw = batch.line(i);
        let oversized = batch.oversized_len(i);
        if oversized.is_none() && raw.iter().all(u8::is_ascii_whitespace) {
            p.blank += 1;
            continue;
        }
        p.records += 1;
        match crate::api::records::decode::<E>(raw, oversized, max_record) {
            Ok(event) => {
                if placement.is_some() {
                    key_into(&event, &mut key);
                    p.check_key(placement, i, key.as_bytes());
                }
                events.push(event);
                lines.push(i);
            }
            Err(reason) => {
                p.invalid += 1;
                outputs.undecodable(batch, names, i, &reason.to_string());
            }
        }
    }
    (events, p)
}

/// The late, dead-letter and failure outputs of a task's last step (shared by both
/// kinds of library task).
#[derive(Default)]
struct Outputs {
    late: Vec<u8>,
    late_steps: Vec<(u64, usize, usize)>,
    dead: Vec<u8>,
    dead_lines: Vec<usize>,
}

impl Outputs {
    fn clear(&mut self) {
        self.late.clear();
        self.late_steps.clear();
        self.dead.clear();
        self.dead_lines.clear();
    }

    /// A record that does not decode as an event.
    fn undecodable(&mut self, batch: &Batch, names: &[SourceName], i: usize, reason: &str) {
        let span = batch.lines[i];
        let pos = names[span.input as usize].pos(span.at);
        encode_dead_letter(&mut self.dead, reason, pos, batch.line(i));
        self.dead_lines.push(i);
    }

    /// An event the job handed back: outside the valid time range (a dead letter) or
    /// behind the watermark (a late record); `seq` is its record's sequence number.
    fn handed_back<E>(
        &mut self,
        batch: &Batch,
        names: &[SourceName],
        i: usize,
        seq: u64,
        l: &Late<E>,
    ) {
        if l.reason == TIME_OUT_OF_RANGE {
            let reason = format!("event time {} is outside the valid time range", l.time);
            self.undecodable(batch, names, i, &reason);
        } else {
            let span = batch.lines[i];
            let pos = names[span.input as usize].pos(span.at);
            let from = self.late.len();
            encode_late(
                &mut self.late,
                l.reason,
                pos,
                l.watermark,
                l.time,
                batch.line(i),
            );
            self.late_steps.push((seq, from, self.late.len() - from));
        }
    }
}
