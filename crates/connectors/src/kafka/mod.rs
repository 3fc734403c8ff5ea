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
pub mod records;
pub mod security;

use rdkafka::ClientConfig;
use std::time::Duration;

/// The Kafka client library, for tests and tools that need it directly.
pub use rdkafka;
pub use rdkafka::error::KafkaError as ClientError;

/// How to reach the cluster: shared by every client a job makes. Its `Debug` hides the
/// values of secret properties (`sasl.password`, `ssl.key.password`, ...).
#[derive(Clone)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Extra librdkafka properties (`--kafka-config KEY=VALUE`, security settings),
    /// applied last.
    properties: Vec<(String, String)>,
    /// How long a metadata, commit or restore call may take before it is an error.
    pub timeout: Duration,
    /// The first configuration error any client of the job met.
    watch: security::ClientWatch,
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("properties", &crate::secrets::shown(&self.properties))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A broker list is enough to reach an unsecured cluster.
impl From<&str> for KafkaSettings {
    fn from(brokers: &str) -> KafkaSettings {
        KafkaSettings::new(brokers)
    }
}

impl From<&String> for KafkaSettings {
    fn from(brokers: &String) -> KafkaSettings {
        KafkaSettings::new(brokers)
    }
}

impl From<&KafkaSettings> for KafkaSettings {
    fn from(settings: &KafkaSettings) -> KafkaSettings {
        settings.clone()
    }
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
            watch: security::ClientWatch::default(),
        }
    }

    /// Settings for `brokers` with the client properties set in the environment
    /// (`SESSIONIZER_KAFKA_SASL_PASSWORD=...` is `sasl.password`, see
    /// [`crate::secrets::ENV_PREFIX`]): how a service keeps its secrets off its command line.
    pub fn from_env(brokers: &str) -> KafkaSettings {
        KafkaSettings::new(brokers).properties(crate::secrets::env_properties())
    }

    /// Adds librdkafka properties (security settings, `session.timeout.ms`, ...); a
    /// key given again replaces its earlier value.
    pub fn properties(mut self, props: impl IntoIterator<Item = (String, String)>) -> Self {
        let props: Vec<(String, String)> = props.into_iter().collect();
        crate::secrets::register(&props);
        self.properties = crate::secrets::merge(&[&self.properties, &props]);
        self
    }

    /// Adds one librdkafka property.
    pub fn property(self, key: &str, value: &str) -> Self {
        self.properties([(key.to_string(), value.to_string())])
    }

    /// The extra properties, as given (secrets included: for clients, not for
    /// printing).
    pub fn extra_properties(&self) -> &[(String, String)] {
        &self.properties
    }

    /// With `timeout` for every call to the cluster.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What every client's error callback reports to.
    pub fn watch(&self) -> &security::ClientWatch {
        &self.watch
    }

    /// The configuration error a client of the job met (a wrong password, an
    /// unknown CA, a missing ACL), as an error that ends the job: no retry cures it.
    pub fn check(&self) -> Result<(), KafkaError> {
        match self.watch.fatal() {
            None => Ok(()),
            Some(cause) => Err(KafkaError::Refused {
                brokers: self.brokers.clone(),
                cause,
            }),
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
        // The rdkafka crate sets the client's log level after creating it, from the
        // log crate's level, over the `log_level` property: set it here instead.
        let level = c
            .get("log_level")
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(3);
        c.set_log_level(log_level(level));
        c
    }

    /// The most verbose librdkafka log level the user asked for (`log_level`, default
    /// 3: errors).
    pub fn user_log_level(&self) -> i32 {
        self.properties
            .iter()
            .find(|(k, _)| k == "log_level")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(3)
    }
}

/// librdkafka's log level `n` (syslog numbers, 0 to 7).
pub fn log_level(n: i32) -> rdkafka::config::RDKafkaLogLevel {
    use rdkafka::config::RDKafkaLogLevel as L;
    match n {
        i32::MIN..=0 => L::Emerg,
        1 => L::Alert,
        2 => L::Critical,
        3 => L::Error,
        4 => L::Warning,
        5 => L::Notice,
        6 => L::Info,
        _ => L::Debug,
    }
}

/// An error from Kafka, with what we were doing. What a client or broker said is
/// quoted with the secrets' values hidden ([`crate::secrets::redact`]).
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The cluster refused the job's clients for a reason no retry cures: a wrong
    /// password, an unknown CA, a plaintext client on a TLS listener, a missing ACL.
    #[error("the Kafka brokers at {brokers} refused this job's client: {cause}")]
    Refused {
        /// `--kafka-brokers`.
        brokers: String,
        /// What failed, and what to check.
        cause: String,
    },
    /// The brokers did not answer.
    #[error(
        "cannot reach the Kafka brokers at {brokers} within {timeout:?} ({}); check --kafka-brokers and that the cluster is up",
        crate::secrets::redact(&error.to_string())
    )]
    Unreachable {
        /// `--kafka-brokers`.
        brokers: String,
        /// How long we waited.
        timeout: Duration,
        /// The client's error (not a `source()`: its text may quote a secret).
        error: ClientError,
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
    #[error("Kafka: {what}: {}", crate::secrets::redact(&error.to_string()))]
    Client {
        /// What we were doing.
        what: String,
        /// The client's error (not a `source()`: its text may quote a secret).
        error: ClientError,
    },
    /// Something the broker returned makes no sense for the job.
    #[error("Kafka: {}", crate::secrets::redact(.0))]
    Invalid(String),
    /// The cluster did not answer a transaction in time (see
    /// [`producer::CommitError::Unavailable`]), or aborted it under the job.
    #[error("Kafka: {}", crate::secrets::redact(.0))]
    Unavailable(String),
    /// A changelog record the job cannot use (its state or progress record does not
    /// decode): the changelog was written by another build or job, or damaged.
    #[error("Kafka: the changelog {topic}/{partition} is damaged at offset {offset}: {reason}")]
    ChangelogDamaged {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// Why the job cannot use it.
        #[source]
        reason: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The coordinator described a member's assignment in bytes that do not decode.
    #[error("Kafka: the assignment of member {member} of group {group} does not decode: {reason}")]
    Assignment {
        /// The member's client id.
        member: String,
        /// The consumer group.
        group: String,
        /// What is wrong with the bytes.
        #[source]
        reason: consumer::AssignmentError,
    },
}

impl KafkaError {
    /// Whether the error may go away by itself: the brokers did not answer, a
    /// partition's leader or a group's or transaction's coordinator moved, a request
    /// timed out. A job rides these out (for a bounded time); anything else — a
    /// refused client, a missing topic, a fenced producer, a damaged changelog — ends
    /// it, because no retry cures it.
    pub fn is_transient(&self) -> bool {
        match self {
            KafkaError::Unreachable { .. } | KafkaError::Unavailable(_) => true,
            KafkaError::Client { error, .. } => is_transient(error),
            _ => false,
        }
    }

    /// Wraps a client error with what we were doing.
    pub fn client(what: impl Into<String>) -> impl FnOnce(ClientError) -> KafkaError {
        let what = what.into();
        move |error| KafkaError::Client { what, error }
    }
}

/// Whether a client error may go away by itself (see [`KafkaError::is_transient`]):
/// by its error code, the same for every client.
pub fn is_transient(error: &ClientError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as Code;
    if let ClientError::Transaction(t) = error
        && t.is_fatal()
    {
        return false;
    }
    matches!(
        error.rdkafka_error_code(),
        Some(
            Code::BrokerTransportFailure
                | Code::AllBrokersDown
                | Code::OperationTimedOut
                | Code::RequestTimedOut
                | Code::MessageTimedOut
                | Code::NetworkException
                | Code::NotCoordinator
                | Code::CoordinatorLoadInProgress
                | Code::CoordinatorNotAvailable
                | Code::LeaderNotAvailable
                | Code::NotLeaderForPartition
                | Code::PreferredLeaderNotAvailable
                | Code::FencedLeaderEpoch
                | Code::UnknownLeaderEpoch
                | Code::BrokerNotAvailable
                | Code::ReplicaNotAvailable
                | Code::NotEnoughReplicas
                | Code::NotEnoughReplicasAfterAppend
                | Code::KafkaStorageError
                | Code::OffsetNotAvailable
                | Code::ConcurrentTransactions
                | Code::RebalanceInProgress
                | Code::Resolve
                // A broker's handle torn down while a request waited on it (the broker
                // left the cluster's metadata during a restart), a coordinator still
                // being looked up, a controller that moved, a request to try again.
                | Code::DestroyBroker
                | Code::WaitingForCoordinator
                | Code::NotController
                | Code::Retry
        )
    )
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
/// of a partition is what they wait for, not an error to log. Its first field names
/// the reader in the logs.
#[derive(Debug)]
pub(crate) struct Reader(pub(crate) &'static str, pub(crate) security::ClientWatch);

impl rdkafka::ClientContext for Reader {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        security::forward_log(&self.1, level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let eof = matches!(
            error,
            rdkafka::error::KafkaError::PartitionEOF(_)
                | rdkafka::error::KafkaError::Global(
                    rdkafka::error::RDKafkaErrorCode::PartitionEOF
                )
        );
        if !eof {
            let who = format!("Kafka reader ({})", self.0);
            security::log_error(&self.1, &error, reason, &who);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Reader {}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode as Code;

    #[test]
    fn transient_errors_are_told_from_fatal_ones() {
        let client = |error| KafkaError::Client {
            what: "read the input".into(),
            error,
        };
        // A broker going away, a leader or coordinator moving, a timeout: retried.
        for code in [
            Code::BrokerTransportFailure,
            Code::AllBrokersDown,
            Code::OperationTimedOut,
            Code::RequestTimedOut,
            Code::NotCoordinator,
            Code::CoordinatorLoadInProgress,
            Code::NotLeaderForPartition,
            Code::NotEnoughReplicas,
            Code::DestroyBroker,
            Code::WaitingForCoordinator,
        ] {
            assert!(
                client(ClientError::MessageConsumption(code)).is_transient(),
                "{code:?}"
            );
            assert!(is_transient(&ClientError::Global(code)), "{code:?}");
        }
        assert!(KafkaError::Unavailable("the transaction timed out".into()).is_transient());
        // A configuration the cluster refuses, a missing topic, anything the job
        // cannot use: fatal.
        for code in [
            Code::SaslAuthenticationFailed,
            Code::TopicAuthorizationFailed,
            Code::GroupAuthorizationFailed,
            Code::ProducerFenced,
            Code::InvalidProducerEpoch,
            Code::UnknownTopicOrPartition,
            Code::MessageSizeTooLarge,
        ] {
            assert!(
                !client(ClientError::MessageConsumption(code)).is_transient(),
                "{code:?}"
            );
        }
        assert!(
            !KafkaError::Refused {
                brokers: "b:9092".into(),
                cause: "authentication failed".into(),
            }
            .is_transient()
        );
        assert!(!KafkaError::Invalid("a fenced producer".into()).is_transient());
        assert!(
            !KafkaError::TopicMissing {
                topic: "visits".into(),
                role: "input",
                hint: String::new(),
            }
            .is_transient()
        );
    }
}
