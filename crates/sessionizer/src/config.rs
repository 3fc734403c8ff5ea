//! The validated options of a pipeline run.

use sessionizer_connectors::{InputSource, OutputTarget};
use sessionizer_core::decode::{DecoderConfig, DedupMode, TimeFormat};
use sessionizer_core::json::FieldPath;
use sessionizer_core::{DurationMs, EventTime};
use sessionizer_window::{AggKind, EmitMode, WindowConfig};

/// What to do with an invalid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInvalid {
    /// Write it to the dead-letter output with the reason and its position.
    DeadLetter,
    /// Only count it.
    Skip,
    /// Stop the run with an error naming it.
    Fail,
}

/// How session records are written to a file output (`--output-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// One JSON object per line.
    #[default]
    JsonLines,
    /// Parquet files in the output directory, one session per row (cargo feature
    /// `parquet`); with `partition_by_date`, in `dt=YYYY-MM-DD/` directories by the
    /// session's start (UTC).
    Parquet {
        /// Hive-style directories by the start date.
        partition_by_date: bool,
    },
    /// Rows appended to the Delta Lake table in the output directory (cargo feature
    /// `delta`): the Parquet format's files, committed to the table's log with the
    /// checkpoints, so only a run with a state directory writes one.
    Delta {
        /// Commit to the table at most this often (`None`: at every checkpoint); the
        /// checkpoints in between record the files written, and the last checkpoint of
        /// a run always commits.
        commit_every: Option<std::time::Duration>,
    },
}

/// One aggregate of the output record.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// What to compute.
    pub kind: AggKind,
    /// The event field it reads (a dotted path).
    pub field: FieldPath,
    /// The name of its member in the session record.
    pub name: String,
}

/// Everything a pipeline run needs, checked.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The inputs, read one after another as one stream.
    pub inputs: Vec<InputSource>,
    /// Where session records and retractions go.
    pub output: OutputTarget,
    /// How they are written there.
    pub output_format: OutputFormat,
    /// Where invalid records go (with `OnInvalid::DeadLetter`).
    pub dead_letter: OutputTarget,
    /// Where too-late events go.
    pub late_output: OutputTarget,
    /// The session key field.
    pub key: FieldPath,
    /// The event-time field.
    pub time: FieldPath,
    /// How the event-time field is written.
    pub time_format: TimeFormat,
    /// The default gap `G`.
    pub gap: DurationMs,
    /// A field that may carry an event's own gap.
    pub gap_field: Option<FieldPath>,
    /// How far the watermark trails the largest event time (`D`).
    pub watermark_delay: DurationMs,
    /// How long complete sessions still accept late events (`A`).
    pub allowed_lateness: DurationMs,
    /// Valid event times: `start <= t < end`.
    pub valid_range: (EventTime, EventTime),
    /// The aggregates of the session record, in output order.
    pub aggregates: Vec<Aggregate>,
    /// Whether and how duplicates are recognised.
    pub dedup: DedupMode,
    /// On close only, or on every update too.
    pub emit: EmitMode,
    /// What to do with invalid records.
    pub on_invalid: OnInvalid,
    /// With stdin input: after this long without input the watermark moves on with the
    /// wall clock (docs/semantics.md S-32). `None`: it waits for events.
    pub idle_timeout: Option<DurationMs>,
    /// Worker threads; keys are shared among them by hash. The output is the same for
    /// every value.
    pub workers: usize,
    /// Kafka as the source, the sink, or both (`--kafka-*`); `None`: files and stdio only.
    pub kafka: Option<KafkaConfig>,
    /// Where the keyed state lives (`--state-backend`).
    pub state_backend: StateBackend,
    /// The largest record in bytes (`--max-record-size`): a longer line or Kafka
    /// message is invalid, skipped as it is read and never held whole.
    pub max_record: usize,
}

/// Where the job's keyed state lives (docs/semantics.md S-36, `--state-backend`). Both
/// give the same output byte for byte, and their checkpoints are the same files: a state
/// directory written with one resumes with the other.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StateBackend {
    /// Every key in memory.
    #[default]
    Memory,
    /// Keys beyond a memory budget spilled to RocksDB on local disk (cargo feature
    /// `rocksdb`).
    RocksDb {
        /// The budget (`--state-memory`), for the keys kept in memory and RocksDB's block
        /// cache and write buffers, half each, shared by the workers.
        memory_bytes: u64,
        /// Where RocksDB's files go (scratch space, emptied at the start and removed at
        /// the end); `None`: a directory under the system's temporary directory.
        dir: Option<std::path::PathBuf>,
    },
}

/// Where a consumer group starts reading a partition that has no committed position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KafkaStart {
    /// At the first record still in the partition.
    #[default]
    Earliest,
    /// After the last record: only records produced from now on.
    Latest,
}

/// Apache Kafka options of a run (docs/semantics.md K-1 to K-7). Needs the `kafka` cargo
/// feature.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `--kafka-brokers`: the bootstrap servers.
    pub brokers: String,
    /// Extra librdkafka properties for every client (security settings among them):
    /// the config file's `kafka-config`, the environment's `SESSIONIZER_KAFKA_*`, then
    /// `--kafka-config KEY=VALUE`, the later winning per key. Its `Debug` hides secrets.
    pub properties: KafkaProperties,
    /// How long a call to the cluster may take before it is an error.
    pub timeout: std::time::Duration,
    /// `--kafka-topic`: the input topics (empty: the input is files or stdin).
    pub topics: Vec<String>,
    /// `--kafka-group`: the consumer group, and the job's name in Kafka (its changelog
    /// topics and transactional ids start with it).
    pub group: Option<String>,
    /// `--kafka-start`: where a partition without a committed position starts.
    pub start: KafkaStart,
    /// `--stop-at-end`: read each partition up to its end offset at the start of the run,
    /// then end as a file input does.
    pub stop_at_end: bool,
    /// `--kafka-output-topic`: where session records go (else `--output`).
    pub output_topic: Option<String>,
    /// `--dead-letter-topic`: where invalid records go (else `--dead-letter`).
    pub dead_letter_topic: Option<String>,
    /// `--late-topic`: where too-late events go (else `--late-output`).
    pub late_topic: Option<String>,
    /// `--kafka-instance-id`: this process's stable name within the group; its
    /// transactional id is `<group>-<instance>`. A restarted process with the same id
    /// fences its predecessor at once; without one, a random id is used and a crashed
    /// predecessor's open transaction blocks its partitions until
    /// `transaction_timeout` passes.
    pub instance_id: Option<String>,
    /// `--kafka-transaction-timeout`: how long the broker keeps a transaction of a
    /// vanished process open before aborting it.
    pub transaction_timeout: std::time::Duration,
    /// How often a Kafka job commits (`--checkpoint-interval`).
    pub commit_interval: std::time::Duration,
    /// `--keep-open`: at the end of a `--stop-at-end` run keep the sessions in progress
    /// in the changelog instead of emitting them.
    pub keep_open: bool,
    /// `--state-dir`: local snapshots of the tasks, so that a restart reads only the
    /// changelog's tail (and the process's instance id, kept across restarts).
    pub state_dir: Option<std::path::PathBuf>,
    /// How often the local snapshots are written (after a commit).
    pub snapshot_interval: std::time::Duration,
    /// `--standby-replicas`: warm copies of other processes' tasks kept per partition.
    pub standby_replicas: usize,
    /// `--repartition`: the input is not partitioned by the session key; it is re-keyed
    /// through the internal topic `<group>-repartition` first.
    pub repartition: bool,
    /// `--kafka-partitioner`: how the input topics are keyed by the session key.
    pub partitioner: Partitioner,
    /// `--kafka-outage-limit`: how long a job with a Kafka input waits for a cluster
    /// that does not answer (brokers restarting, leaders or coordinators moving) before
    /// it stops with an error.
    pub outage_limit: std::time::Duration,
}

/// How the producers of the input topics place records in partitions
/// (`--kafka-partitioner`). Sessions need every record of a key in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Partitioner {
    /// Keyed by the session key with a standard partitioner (the Java client's
    /// murmur2, librdkafka's CRC-32 `consistent_random`, or their variants): every
    /// record is checked, and one that cannot belong to its partition stops the job.
    #[default]
    Standard,
    /// Keyed by the session key with a partitioner of the producer's own: trusted,
    /// not checked.
    Custom,
}

/// Client properties, `KEY=VALUE`: their `Debug` shows the values of secret ones
/// (`sasl.password`, `ssl.key.password`, `sasl.oauthbearer.client.secret`, ...) as
/// `[redacted]`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(pub Vec<(String, String)>);

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = sessionizer_connectors::secrets::shown(&self.0)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"));
        f.debug_list().entries(shown).finish()
    }
}

impl std::ops::Deref for KafkaProperties {
    type Target = Vec<(String, String)>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KafkaProperties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<Vec<(String, String)>> for KafkaProperties {
    fn from(v: Vec<(String, String)>) -> KafkaProperties {
        KafkaProperties(v)
    }
}

impl KafkaConfig {
    /// The client settings every Kafka client of the run starts from (one value,
    /// cloned for every client, so that a configuration error one of them meets stops
    /// the others too).
    #[cfg(feature = "kafka")]
    pub fn settings(&self) -> sessionizer_connectors::kafka::KafkaSettings {
        sessionizer_connectors::kafka::KafkaSettings::new(&self.brokers)
            .properties(self.properties.0.clone())
            .timeout(self.timeout)
    }

    /// Whether the input is Kafka topics.
    pub fn is_source(&self) -> bool {
        !self.topics.is_empty()
    }

    /// Whether session records go to a Kafka topic.
    pub fn is_sink(&self) -> bool {
        self.output_topic.is_some()
    }
}

impl PipelineConfig {
    /// The decoder's view of the options.
    pub fn decoder_config(&self) -> DecoderConfig {
        DecoderConfig {
            key: self.key.clone(),
            time: self.time.clone(),
            time_format: self.time_format,
            gap_field: self.gap_field.clone(),
            dedup: self.dedup.clone(),
            valid_range: self.valid_range,
            value_fields: self.aggregates.iter().map(|a| a.field.clone()).collect(),
        }
    }

    /// The session window's view of the options.
    pub fn window_config(&self) -> WindowConfig {
        WindowConfig {
            gap: self.gap,
            allowed_lateness: self.allowed_lateness,
            emit: self.emit,
            aggregates: self.aggregates.iter().map(|a| a.kind).collect(),
            dedup: !matches!(self.dedup, DedupMode::Off),
        }
    }

    /// The output names of the aggregates, in order.
    pub fn aggregate_names(&self) -> Vec<String> {
        self.aggregates.iter().map(|a| a.name.clone()).collect()
    }
}

/// Durable state for a run (`--state-dir` and friends, docs/semantics.md S-35).
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// Where checkpoints are kept.
    pub state_dir: std::path::PathBuf,
    /// Checkpoint when this much time has passed since the last one (checked between
    /// batches of input, about every 4 MiB).
    pub interval: std::time::Duration,
    /// Also checkpoint once this many records were read since the last one.
    pub every_records: Option<u64>,
    /// At the end of the input, keep the sessions in progress in the state (no
    /// +infinity watermark) for a later run over the next input.
    pub keep_open: bool,
    /// Test hook: the n-th checkpoint file write of the run fails as on a full disk
    /// (the binary sets it from `SESSIONIZER_TEST_FAIL_CHECKPOINT_WRITE` only when built
    /// with its cargo feature `fault-injection`). `None` in every real job.
    pub fail_write_at: Option<u64>,
}

impl PipelineConfig {
    /// The options that shape the state, as `(name, value)` pairs recorded in every
    /// checkpoint: resuming with any other value is refused, naming it. Output paths,
    /// `--on-invalid` and `--workers` are not among them: they change where records go or
    /// how fast, not what the state holds (state is re-hashed to any number of workers).
    pub fn state_options(&self) -> Vec<(String, String)> {
        let aggregates = if self.aggregates.is_empty() {
            "none".to_string()
        } else {
            self.aggregates
                .iter()
                .map(|a| format!("{} {} as {}", a.kind.name(), a.field, a.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let dedup = match &self.dedup {
            DedupMode::Off => "off".to_string(),
            DedupMode::Record => "whole record (--dedup)".to_string(),
            DedupMode::Field(f) => format!("field {f} (--dedup-field)"),
        };
        let emit = match self.emit {
            EmitMode::OnClose => "on-close",
            EmitMode::OnUpdate => "on-update",
            EmitMode::Final => "final",
        };
        [
            ("--key", self.key.to_string()),
            ("--time", self.time.to_string()),
            ("--time-format", self.time_format.as_str().to_string()),
            ("--gap", self.gap.to_string()),
            (
                "--gap-field",
                self.gap_field
                    .as_ref()
                    .map_or_else(|| "none".to_string(), ToString::to_string),
            ),
            ("--watermark-delay", self.watermark_delay.to_string()),
            ("--allowed-lateness", self.allowed_lateness.to_string()),
            (
                "--valid-time-range",
                format!("{}..{}", self.valid_range.0, self.valid_range.1),
            ),
            ("aggregates", aggregates),
            ("dedup", dedup),
            ("--emit", emit.to_string()),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .chain(match self.output_format {
            // The checkpoints of JSON-lines runs keep their options as they were.
            OutputFormat::JsonLines => None,
            OutputFormat::Parquet { partition_by_date } => Some((
                "--output-format".to_string(),
                if partition_by_date {
                    "parquet, by date".to_string()
                } else {
                    "parquet".to_string()
                },
            )),
            OutputFormat::Delta { .. } => {
                Some(("--output-format".to_string(), "delta".to_string()))
            }
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration derived `Debug` over its client properties: a password given
    /// with `--kafka-config` or in the config file showed in any `{:?}`.
    #[test]
    fn the_debug_of_kafka_properties_hides_secrets() {
        let props = KafkaProperties(vec![
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.password".into(), "hunter2-pw".into()),
            (
                "sasl.oauthbearer.client.secret".into(),
                "oidc-s3cret".into(),
            ),
        ]);
        let shown = format!("{props:?}");
        assert!(shown.contains("security.protocol=SASL_SSL"), "{shown}");
        assert!(
            !shown.contains("hunter2-pw") && !shown.contains("oidc-s3cret"),
            "{shown}"
        );
        assert_eq!(shown.matches("[redacted]").count(), 2, "{shown}");
    }
}
