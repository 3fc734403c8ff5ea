//! The library's error types that are not a job's own ([`RunError`](crate::pipeline::RunError),
//! [`StateError`](crate::checkpoints::StateError), [`SinkError`](crate::sink::SinkError)):
//! one per concern, each saying what happened and what to do.

use sessionizer_checkpoint::state::LiveError;
use sessionizer_window::spill::{EncodeError, SpillError, StateDecodeError};
use sessionizer_window::stateful::SnapshotError;

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
/// checkpoint whole with it, [`StateError::State`](crate::checkpoints::StateError)).
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
    Stores(Box<crate::checkpoints::StateError>),
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
/// ([`StateError::State`](crate::checkpoints::StateError)).
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
/// [`RunError::Unsupported`]: crate::pipeline::RunError::Unsupported
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
}
