//! Apache Kafka at the edges (docs/semantics.md K-1 to K-7), through librdkafka (the
//! `rdkafka` crate):
//!
//! * [`consumer`] — the input: a consumer group member that reads `read_committed`,
//!   joins with the cooperative-sticky assignor and hands rebalances to the job as
//!   events it handles between batches (it commits before it lets partitions go);
//! * [`producer`] — the output: one transactional producer per process; a transaction
//!   holds the output records, the side outputs, the state changes and the consumed
//!   offsets of one commit;
//! * [`changelog`] — the compacted topic that holds each task's state, and reading a
//!   partition of it back to its end;
//! * [`admin`] — topic checks and creation with errors that say what to do;
//! * [`partitioner`] — Kafka's default (murmur2) partitioner;
//! * [`progress`] — reading back whether a transaction's progress record committed
//!   (a file run with a Kafka output resolves its last checkpoint with it).
//!
//! Nothing here knows about sessions: records are bytes.

pub mod admin;
pub mod changelog;
pub mod consumer;
pub mod partitioner;
pub mod producer;
pub mod progress;

use rdkafka::ClientConfig;
use std::time::Duration;

/// The Kafka client library, for tests and tools that need it directly.
pub use rdkafka;
pub use rdkafka::error::KafkaError as ClientError;

/// How to reach the cluster: shared by every client a job makes.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Extra librdkafka properties (`--kafka-config KEY=VALUE`), applied last.
    pub properties: Vec<(String, String)>,
    /// How long a metadata, commit or restore call may take before it is an error.
    pub timeout: Duration,
}

impl KafkaSettings {
    /// How long a call may take by default (`--kafka-timeout`'s default).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// Settings for `brokers`, without extra properties, with the default timeout.
    pub fn new(brokers: &str) -> KafkaSettings {
        KafkaSettings {
            brokers: brokers.to_string(),
            properties: Vec::new(),
            timeout: KafkaSettings::DEFAULT_TIMEOUT,
        }
    }

    /// The client configuration every client starts from.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        // librdkafka logs through its own callback; keep its chatter out of our stderr
        // unless asked for with --kafka-config log_level=7.
        c.set("log_level", "3");
        c
    }

    /// Applies the user's properties on top of `c`.
    pub fn finish(&self, mut c: ClientConfig) -> ClientConfig {
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

/// An error from Kafka, with what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The brokers did not answer.
    #[error(
        "cannot reach the Kafka brokers at {brokers} within {timeout:?} ({source}); check --kafka-brokers and that the cluster is up"
    )]
    Unreachable {
        /// `--kafka-brokers`.
        brokers: String,
        /// How long we waited.
        timeout: Duration,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// A topic the job reads or writes does not exist.
    #[error("Kafka topic {topic} does not exist ({role}); create it first{hint}")]
    TopicMissing {
        /// The topic.
        topic: String,
        /// What the job uses it for.
        role: &'static str,
        /// How to create it, when we can tell.
        hint: String,
    },
    /// Any other client error.
    #[error("Kafka: {what}: {source}")]
    Client {
        /// What we were doing.
        what: String,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// Something the broker returned makes no sense for the job.
    #[error("Kafka: {0}")]
    Invalid(String),
}

impl KafkaError {
    /// Wraps a client error with what we were doing.
    pub fn client(what: impl Into<String>) -> impl FnOnce(ClientError) -> KafkaError {
        let what = what.into();
        move |source| KafkaError::Client { what, source }
    }
}

/// Where a record came from: `topic`, partition, offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// Index of the topic in the job's list of input topics.
    pub topic: u32,
    /// The partition.
    pub partition: i32,
}

/// The client context of the job's own readers (changelogs, progress records): the end
/// of a partition is what they wait for, not an error to log. Its field names the
/// reader in the logs.
#[derive(Debug)]
pub(crate) struct Reader(pub(crate) &'static str);

impl rdkafka::ClientContext for Reader {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let eof = matches!(
            error,
            rdkafka::error::KafkaError::PartitionEOF(_)
                | rdkafka::error::KafkaError::Global(
                    rdkafka::error::RDKafkaErrorCode::PartitionEOF
                )
        );
        if !eof {
            tracing::error!(%error, reason, reader = self.0, "Kafka reader");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Reader {}
