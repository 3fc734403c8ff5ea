//! The library's error types, one per concern, each saying what happened and what to
//! do: a run's ([`RunError`]), a job's state ([`StateError`]), a sink's ([`SinkError`]),
//! a source's ([`SourceError`]), and the parts they are made of. Nothing here depends
//! on the rest of the crate but its plain data (`stats`), so every module can use them.

use crate::stats::RunStats;
use sessionizer_checkpoint::CheckpointError;
use sessionizer_checkpoint::state::LiveError;
use sessionizer_connectors::input::InputError;
use sessionizer_connectors::sink::OutputError;
use sessionizer_window::spill::{EncodeError, SpillError, StateDecodeError};
use sessionizer_window::stateful::SnapshotError;
use std::path::PathBuf;

/// Why one key's state, read from a checkpoint or a changelog, cannot be put back.
/// What to do: resume with the build and the job (state and accumulator types) that
/// wrote it, or start over with another state directory or consumer group.
#[derive(Debug, thiserror::Error)]
pub enum KeyStateError {
    /// The value does not decode as the job's state: the codec says why (truncated,
    /// an unknown aggregate, another checkpoint format, a changed state type).
    #[error(transparent)]
    Decode(#[from] StateDecodeError),
    /// The value is of a checkpoint format or record version that this kind of job
    /// does not read.
    #[error("its state is of {what} {found}, a {job} reads {what_short} {reads}")]
    Version {
        /// `checkpoint format` or `record version`.
        what: &'static str,
        /// `format` or `version`.
        what_short: &'static str,
        /// The kind of job: `library job`, `stateful job`.
        job: &'static str,
        /// The format or version of the value.
        found: u16,
        /// The one the job reads.
        reads: u16,
    },
    /// The state backend's store below the operator failed while the key was put in.
    #[error(transparent)]
    Store(#[from] SpillError),
    /// The stateful operator refused the key (a batch is open).
    #[error(transparent)]
    Operator(SnapshotError),
}

impl From<sessionizer_window::codec::CodecError> for KeyStateError {
    fn from(e: sessionizer_window::codec::CodecError) -> Self {
        KeyStateError::Decode(e.into())
    }
}

impl From<SnapshotError> for KeyStateError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Spill(e) => KeyStateError::Store(e),
            e @ (SnapshotError::BatchOpen | SnapshotError::Unsupported(_)) => {
                KeyStateError::Operator(e)
            }
            e => KeyStateError::Decode(e.into()),
        }
    }
}

/// Why a checkpoint's keys could not be read or put back (a library job refuses the
/// checkpoint whole with it, [`StateError::State`](crate::api::checkpoints::StateError)).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A state file is damaged.
    #[error(transparent)]
    Damaged(sessionizer_checkpoint::Damage),
    /// A key's value was refused.
    #[error("key {}: {reason}", String::from_utf8_lossy(.key))]
    Key {
        /// The key.
        key: Vec<u8>,
        /// Why.
        #[source]
        reason: KeyStateError,
    },
    /// The base keeps keys in RocksDB store checkpoints and this build has no reader of
    /// them.
    #[error("{}", sessionizer_checkpoint::stores::NO_READER)]
    NoStoreReader,
    /// The checkpoint's format is not the one this kind of job reads.
    #[error("its state is of checkpoint format {found}, a library job reads format {reads}")]
    Format {
        /// The checkpoint's format.
        found: u16,
        /// The one the job reads.
        reads: u16,
    },
    /// The job's state stores could not start from the checkpoint's copies of them.
    #[error(transparent)]
    Stores(Box<StateError>),
    /// The stateful operators could not be emptied for the checkpoint's keys.
    #[error(transparent)]
    Operator(#[from] SnapshotError),
}

impl From<LiveError<(Vec<u8>, KeyStateError)>> for RestoreError {
    fn from(e: LiveError<(Vec<u8>, KeyStateError)>) -> Self {
        match e {
            LiveError::Damaged(d) => RestoreError::Damaged(d),
            LiveError::Apply((key, reason)) => RestoreError::Key { key, reason },
            LiveError::NoStoreReader => RestoreError::NoStoreReader,
        }
    }
}

/// Why a record of a library source (JSON lines, a Kafka partition, a task of a
/// consumer group) is not one of the job's events. It becomes a dead letter whose
/// reason is this text, in the command line's words; what to do is to fix the
/// producer, or the job's event type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Longer than the record size limit: refused without being read.
    #[error("{}", sessionizer_connectors::input::too_large_reason(*.len, *.limit))]
    TooLarge {
        /// The record's length in bytes.
        len: u64,
        /// The limit (`--max-record-size`, the source's `max_record_size`).
        limit: usize,
    },
    /// Not valid JSON, not an object, a field missing or of another type: the reason
    /// of the command line's dead letters (`missing field visit_id`, ...).
    #[error("{0}")]
    Undecodable(String),
}

/// Why a task's progress record in its changelog cannot be used.
#[cfg(feature = "kafka")]
#[derive(Debug, thiserror::Error)]
pub enum ProgressRecordError {
    /// It is not the JSON of a progress record.
    #[error("unreadable progress record: {0}")]
    Unreadable(#[source] serde_json::Error),
    /// It is of a version this build does not read: a newer sessionizer wrote it.
    #[error("progress record version {found} (this build reads {reads})")]
    Version {
        /// The record's version.
        found: u32,
        /// The one this build reads.
        reads: u32,
    },
}

/// A user's state or accumulator that its serde implementation refuses to write: the
/// job stops before anything of that step is committed. What to do: fix the type's
/// `Serialize` (a map with keys that are not strings, a custom implementation that
/// fails).
#[derive(Debug, thiserror::Error)]
pub enum StateEncodeError {
    /// A session window's accumulator.
    #[error("the accumulator state of key {key:?} cannot be written as JSON: {reason}")]
    Accumulator {
        /// The key, as text.
        key: String,
        /// serde's reason.
        #[source]
        reason: EncodeError,
    },
    /// A stateful function's state, for its changelog.
    #[error("a task's state could not be encoded for its changelog: {0}")]
    TaskState(#[source] SnapshotError),
}

/// What went wrong with a library job's state in its state directory
/// ([`StateError::State`](crate::api::checkpoints::StateError)).
#[derive(Debug, thiserror::Error)]
pub enum StateFailure {
    /// The checkpoint's keys could not be read or put back.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// A key's state could not be written.
    #[error(transparent)]
    Encode(#[from] StateEncodeError),
    /// The stateful operator could not encode its state (a state its JSON writer
    /// refuses, the state store failed).
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A bug: the job and the checkpoint writer disagree.
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// What this build or this mode cannot do ([`RunError::Unsupported`]): a cargo feature
/// the build lacks, or a job that cannot run where it was put.
///
/// [`RunError::Unsupported`]: crate::error::RunError::Unsupported
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// A Kafka input or output in a build without the cargo feature `kafka`.
    #[error(
        "this sessionizer was built without Kafka support; build it with `cargo build --release --features kafka`"
    )]
    NoKafka,
    /// `--state-backend rocksdb` in a build without the cargo feature `rocksdb`.
    #[error(
        "this sessionizer was built without the RocksDB state backend; build it with `cargo build --release --features rocksdb`, or use --state-backend memory"
    )]
    NoRocksDb,
    /// A library job's RocksDB state backend in a build without the feature `rocksdb`.
    #[error(
        "this build of the sessionizer crate has no RocksDB state backend: enable its cargo feature `rocksdb`"
    )]
    NoRocksDbLibrary,
    /// A checkpoint whose base keeps keys in RocksDB files, in a build that cannot read
    /// them.
    #[error("{}", sessionizer_checkpoint::stores::NO_READER)]
    NoStoreReader,
    /// A Kafka output without its topic.
    #[error("a Kafka output needs --kafka-output-topic")]
    NoOutputTopic,
    /// `--output-format parquet` in a build without the cargo feature `parquet`.
    #[error(
        "this sessionizer was built without Parquet output; build it with `cargo build --release --features parquet`"
    )]
    NoParquet,
    /// A Delta table output in a build without the cargo feature `delta`.
    #[error(
        "this sessionizer was built without Delta Lake output; build it with `cargo build --release --features delta`"
    )]
    NoDelta,

    /// A library job that cannot be a task of a Kafka group.
    #[error(transparent)]
    GroupJob(#[from] GroupJobRefusal),
}

/// Why a library job cannot be a task of a Kafka group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GroupJobRefusal {
    /// It was given workers of its own.
    #[error(
        "a job in a Kafka group runs on one worker per partition: do not call set_workers() on it (the group's workers() runs partitions in parallel)"
    )]
    Workers,
    /// It was given a state store of its own.
    #[error(
        "a job in a Kafka group gets its state store from the group: do not call set_state_backend() on it (call KafkaGroup::state_backend)"
    )]
    OwnStore,
    /// It has seen events or restored a checkpoint.
    #[error("a job in a Kafka group must be new: no events pushed, nothing restored")]
    NotNew,
    /// Its records are keyed by the user's mapping, and it may retract a record: a
    /// tombstone under the user's key would delete another session's record.
    #[error(
        "a group job whose records the user shapes (run_windows_as) cannot retract records it emitted: emit with EmitMode::Final (or on close without allowed lateness), or use run_windows (records keyed by session_id, retractions as tombstones)"
    )]
    Retracts,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// An input could not be opened or read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// An output could not be written, flushed or synced.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The reader of an output closed it (stdout piped into `head`), so the run stopped
    /// early. Not a failure for a command line; `stats` counts the input processed until
    /// then (the counts add up) and names the output in `output_closed`.
    #[error("{name} was closed by its reader; the run stopped early")]
    OutputClosed {
        /// The output's name (`stdout`, or a path).
        name: String,
        /// The run's counts until it stopped.
        stats: Box<RunStats>,
    },
    /// An invalid record with `--on-invalid fail`.
    #[error(
        "invalid record at {position}: {reason} (stopping because of --on-invalid fail; use --on-invalid dead-letter to set such records aside)"
    )]
    InvalidRecord {
        /// `file:line`.
        position: String,
        /// Why the record is invalid.
        reason: String,
    },
    /// The worker or reader threads could not be started.
    #[error("cannot start {workers} worker threads: {message}")]
    Workers {
        /// How many were asked for.
        workers: usize,
        /// The system's reason.
        message: String,
    },
    /// The reader thread stopped without reaching the end of the inputs (it panicked):
    /// the run stops rather than pass a truncated input off as complete.
    #[error(
        "the input reader stopped unexpectedly before the end of the inputs; no output was committed past that point"
    )]
    ReaderFailed,
    /// Reading or writing the checkpoint files failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint was taken with options that shape the state differently.
    #[error(
        "the checkpoint in {dir} was taken with other options: {}; run with the checkpoint's options, or use another --state-dir",
        differences.join("; ")
    )]
    OptionsChanged {
        /// The state directory.
        dir: String,
        /// One line per differing option.
        differences: Vec<String>,
    },
    /// An input file is not the one the checkpoint was reading.
    #[error(
        "input {path} changed since the checkpoint in {dir} was taken ({what}); resuming would skip or repeat records. Restore the file, or use another --state-dir"
    )]
    InputChanged {
        /// The state directory.
        dir: String,
        /// The input file.
        path: String,
        /// What differs.
        what: String,
    },
    /// The job in the state directory cannot continue with these inputs.
    #[error("cannot continue the job in {dir}: {message}")]
    Resume {
        /// The state directory.
        dir: String,
        /// Why not.
        message: String,
    },
    /// Talking to Kafka failed, or what it holds does not fit the job.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] sessionizer_connectors::kafka::KafkaError),
    /// The Kafka cluster stayed unreachable (or kept failing the job's calls with errors
    /// that usually pass) for longer than the job waits.
    #[cfg(feature = "kafka")]
    #[error(
        "the Kafka brokers at {brokers} did not answer for {waited:?}, longer than --kafka-outage-limit ({limit:?}); the last error: {cause}. Everything committed is safe: run the job again once the cluster is back"
    )]
    KafkaOutage {
        /// `--kafka-brokers`.
        brokers: String,
        /// How long the job waited.
        waited: std::time::Duration,
        /// `--kafka-outage-limit`.
        limit: std::time::Duration,
        /// The last error met while waiting.
        cause: String,
    },
    /// The run asks for something this build or this mode cannot do.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// A library job's state could not be written (its serde implementation refused
    /// it): the job stops before anything of that step is committed.
    #[error(transparent)]
    StateEncode(#[from] StateEncodeError),
    /// The field of a group's `repartition_by` is not a field path.
    #[error("repartition_by({field:?}): {source}")]
    RepartitionField {
        /// The field as given.
        field: String,
        /// Why it is not a path.
        #[source]
        source: sessionizer_core::json::PathError,
    },
    /// A stateful job's operator refused what the run asked of it (emptied for a
    /// restore while a batch is open, its state store failed).
    #[error(transparent)]
    Stateful(Box<sessionizer_window::stateful::SnapshotError>),
    /// A bug: something that cannot happen did.
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// The state backend's store (RocksDB) failed.
    #[error(transparent)]
    StateStore(#[from] sessionizer_window::spill::SpillError),
    /// A library job's output or state could not be written (its serde implementation
    /// refused it, say): the job stops before anything of that step is committed.
    #[error("the job cannot go on: {0}")]
    Job(#[from] SinkError),
    /// A Kafka input topic is not partitioned by the session key: a record sits in a
    /// partition that no standard partitioner gives its key.
    #[error(
        "Kafka topic {topic} is not partitioned by the session key: the record at {position} has key {key:?}, which the standard partitioners place in partition {murmur2} (murmur2, the Java client's default) or {crc32} (CRC-32, librdkafka's default) of {partitions}, not in {partition} ({count} such record(s) in the batch; nothing of it was committed). Sessions need every record of a key in one partition. Re-key the input through an internal topic with --repartition (library: repartition_by; exactly once, lateness judged by the slowest input partition's time), or, if the producer keeps each key in one partition with a partitioner of its own, declare it with --kafka-partitioner custom (library: custom_partitioner)"
    )]
    NotKeyed {
        /// The input topic.
        topic: String,
        /// `topic/partition@offset` of the first such record.
        position: String,
        /// Its session key.
        key: String,
        /// Its partition.
        partition: i32,
        /// The topic's partitions.
        partitions: usize,
        /// Where the Java client's default partitioner (murmur2) puts the key.
        murmur2: i32,
        /// Where librdkafka's default partitioner (CRC-32) puts the key.
        crc32: i32,
        /// How many records of the batch could not belong to their partition.
        count: u64,
    },
    /// The run failed after it started: the error, with the counts of what it did
    /// until then ([`RunError::stats`]).
    #[error("{error}")]
    Failed {
        /// What went wrong.
        #[source]
        error: Box<RunError>,
        /// The run's counts until it failed.
        stats: Box<RunStats>,
    },
    /// A key's state in the checkpoint does not decode.
    #[error("cannot restore the state of key {key:?} from the checkpoint in {dir}: {reason}")]
    RestoreState {
        /// The state directory.
        dir: String,
        /// The key, as text.
        key: String,
        /// What is wrong with it.
        #[source]
        reason: Box<KeyStateError>,
    },
}

impl RunError {
    /// The error with the counts of the run it stopped (written to the stats file).
    pub fn with_stats(self, stats: RunStats) -> RunError {
        match self {
            e @ (RunError::OutputClosed { .. } | RunError::Failed { .. }) => e,
            e => RunError::Failed {
                error: Box::new(e),
                stats: Box::new(stats),
            },
        }
    }

    /// The counts of the run until it stopped, when the error carries them.
    pub fn stats(&self) -> Option<&RunStats> {
        match self {
            RunError::OutputClosed { stats, .. } | RunError::Failed { stats, .. } => Some(stats),
            _ => None,
        }
    }

    /// The error itself, without the counts [`with_stats`](Self::with_stats) added.
    pub fn inner(&self) -> &RunError {
        match self {
            RunError::Failed { error, .. } => error.inner(),
            e => e,
        }
    }
}

/// Why a sink refused an item.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The receiving end of a channel was dropped.
    #[error("the receiving end of the output channel is closed")]
    Closed,
    /// Writing an output failed.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An item could not be encoded as JSON.
    #[error("cannot encode an output record as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// The output cannot carry this kind of record.
    #[error("the output cannot carry {0}")]
    Refused(&'static str),
    /// The job's state store (the `rocksdb` backend) failed: the job cannot go on, and
    /// what it emitted in the failing step may be wrong. Restore it from its last
    /// checkpoint.
    #[error(transparent)]
    StateStore(#[from] sessionizer_window::spill::SpillError),
    /// Producing to Kafka failed (a [`KafkaJsonSink`](crate::api::kafka::KafkaJsonSink)).
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] sessionizer_connectors::kafka::KafkaError),
}

/// Why the committer could not take a checkpoint (`runtime::commit`).
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Writing the checkpoint files failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A sink could not prepare or commit its epoch.
    #[error(transparent)]
    Sink(#[from] sessionizer_connectors::sink::SinkError),
    /// A bug: the job and the committer disagree (on the kind or order of checkpoints);
    /// nothing was written.
    #[error("cannot continue the job in {dir}: internal error: {what}")]
    Disagree {
        /// The state directory.
        dir: String,
        /// What they disagree on.
        what: &'static str,
    },
    /// The thread that writes checkpoints could not start, or stopped.
    #[error("{0}")]
    Thread(String),
    /// An earlier checkpoint failed in a way that leaves what was committed unknown
    /// here; only a restart, which resolves it from the state directory, continues.
    #[error(
        "the checkpoints in {dir} take no more writes: {why}; stop the job and start it again on the same state directory, which resumes from the last committed checkpoint"
    )]
    Poisoned {
        /// The state directory.
        dir: String,
        /// What failed.
        why: String,
    },
}

impl From<CommitError> for RunError {
    fn from(e: CommitError) -> RunError {
        use sessionizer_connectors::sink::SinkError;
        match e {
            CommitError::Checkpoint(e) => RunError::Checkpoint(e),
            CommitError::Sink(SinkError::Output(e)) => RunError::Output(e),
            #[cfg(feature = "kafka")]
            CommitError::Sink(SinkError::Kafka(e)) => RunError::Kafka(e),
            CommitError::Sink(SinkError::Internal(what)) => RunError::Internal(what),
            CommitError::Disagree { dir, what } => RunError::Resume {
                dir,
                message: format!("internal error: {what}"),
            },
            CommitError::Thread(message) => RunError::Workers {
                workers: 1,
                message,
            },
            CommitError::Poisoned { dir, why } => RunError::Resume {
                dir,
                message: format!("its checkpoints take no more writes: {why}"),
            },
        }
    }
}

impl From<CommitError> for StateError {
    fn from(e: CommitError) -> StateError {
        match e {
            CommitError::Checkpoint(e) => StateError::Checkpoint(e),
            CommitError::Disagree { dir, what } => StateError::State {
                dir: dir.into(),
                reason: Box::new(StateFailure::Internal(what)),
            },
            other => StateError::Output(other.to_string()),
        }
    }
}

/// Why a job cannot checkpoint or restore.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state directory could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint was taken with other options than this job's.
    #[error(
        "cannot resume from {dir}: the job's options changed: {}. Use the options of the checkpoint, or another state directory",
        differences.join("; ")
    )]
    OptionsChanged {
        /// The state directory.
        dir: PathBuf,
        /// One line per option that differs, naming it.
        differences: Vec<String>,
    },
    /// A key's state in the checkpoint could not be read (a changed accumulator type,
    /// say), or a key's state could not be written to it.
    #[error("cannot resume from {dir}: {reason}")]
    State {
        /// The state directory.
        dir: PathBuf,
        /// What could not be read or written, naming the key.
        #[source]
        reason: Box<StateFailure>,
    },
    /// The directory holds a checkpoint that this job did not restore: checkpointing
    /// over it would mix two jobs' state.
    #[error(
        "the state directory {dir} holds checkpoint {epoch}, which this job did not restore: call restore() before the first checkpoint, or use an empty directory"
    )]
    NotRestored {
        /// The state directory.
        dir: PathBuf,
        /// The checkpoint found there.
        epoch: u64,
    },
    /// Restore was called on a job that has already processed events.
    #[error("restore() must come before the job's first event ({events} processed)")]
    NotFresh {
        /// Events the job has processed.
        events: u64,
    },
    /// The state backend's store (RocksDB) failed.
    #[error(transparent)]
    StateStore(#[from] sessionizer_window::spill::SpillError),
    /// The state backend asked for cannot be used (this build lacks it, or the job has
    /// state already).
    #[error("{0}")]
    Backend(String),
    /// The workers asked for cannot be set up (the job has state already, or the
    /// threads did not start).
    #[error("{0}")]
    Workers(String),
    /// The job's exactly-once Kafka output could not take part in a checkpoint or a
    /// restore (the transaction did not commit, the checkpoint belongs to another
    /// output, the brokers did not answer).
    #[error("{0}")]
    Output(String),
}

impl StateError {
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn output(e: RunError) -> StateError {
        StateError::Output(e.to_string())
    }
}

impl From<sessionizer_connectors::source::ReadError> for SourceError {
    fn from(e: sessionizer_connectors::source::ReadError) -> SourceError {
        use sessionizer_connectors::source::ReadError;
        match e {
            ReadError::Input(e) => SourceError::Input(e),
            #[cfg(feature = "kafka")]
            ReadError::Kafka(e) => SourceError::Kafka(e),
        }
    }
}

/// Why a source stopped.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// An input could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The dead-letter sink refused a record.
    #[error("cannot write a dead letter: {0}")]
    DeadLetter(#[from] SinkError),
    /// A source cannot continue where a checkpoint stood: the files changed, the
    /// checkpoint recorded no position of them, or the source was opened before the
    /// job's restore (or as a second source).
    #[error("{0}")]
    Resume(String),
    /// Reading Kafka failed (a [`KafkaJson`](crate::api::kafka::KafkaJson) source).
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] sessionizer_connectors::kafka::KafkaError),
}
