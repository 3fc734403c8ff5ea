//! Topic checks and creation.

use super::security::Watched;
use super::{KafkaError, KafkaSettings};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;

/// How long one metadata request may wait before the job looks whether a client met
/// a configuration error.
const METADATA_SLICE: std::time::Duration = std::time::Duration::from_millis(500);

/// Metadata and topic management for one job.
pub struct Admin {
    settings: KafkaSettings,
    /// A plain consumer (no group) used for metadata only, `read_committed`: a
    /// partition's end it is told is the last stable offset.
    meta: BaseConsumer<Watched>,
    /// The same, `read_uncommitted`: told the high watermark.
    uncommitted: BaseConsumer<Watched>,
    admin: AdminClient<Watched>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("brokers", &self.settings.brokers)
            .finish()
    }
}

impl Admin {
    /// Connects (lazily: the first call reaches the brokers).
    pub fn new(settings: &KafkaSettings) -> Result<Admin, KafkaError> {
        // librdkafka asks for a partition's end with the client's isolation level.
        // What these clients pass on to the logs: the user's log level, or errors only.
        let watched = || Watched(settings.watch().clone(), settings.user_log_level());
        let client = |isolation: &str| -> Result<BaseConsumer<Watched>, KafkaError> {
            let mut c = settings.finish(settings.client_config());
            // Failed connections are logged at level 6: the watch reads them.
            c.set_log_level(super::log_level(settings.user_log_level().max(6)));
            c.set("isolation.level", isolation);
            c.create_with_context(watched())
                .map_err(KafkaError::client("create a metadata client"))
        };
        let meta = client("read_committed")?;
        let uncommitted = client("read_uncommitted")?;
        let admin: AdminClient<Watched> = settings
            .finish(settings.client_config())
            .create_with_context(watched())
            .map_err(KafkaError::client("create an admin client"))?;
        Ok(Admin {
            settings: settings.clone(),
            meta,
            uncommitted,
            admin,
        })
    }

    /// The number of partitions of `topic`, or `None` when it does not exist.
    pub fn partitions(&self, topic: &str) -> Result<Option<usize>, KafkaError> {
        // Asked in slices, so that a configuration error a client met (a wrong
        // password, an unknown CA) ends the wait at once rather than after the whole
        // timeout: librdkafka retries those as if the brokers were away.
        let deadline = std::time::Instant::now() + self.settings.timeout;
        let md = loop {
            // The client's error events (where a failed authentication or handshake
            // shows) are delivered to its context when it is polled.
            if let Some(Err(e)) = self.meta.poll(std::time::Duration::ZERO) {
                self.settings.watch().note(&e, &e.to_string());
            }
            self.settings.check()?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self
                .meta
                .fetch_metadata(Some(topic), left.min(METADATA_SLICE))
            {
                Ok(md) => {
                    self.settings.watch().connected();
                    break md;
                }
                Err(_) if !left.is_zero() && left > METADATA_SLICE => continue,
                Err(error) => {
                    self.settings.check()?;
                    return Err(KafkaError::Unreachable {
                        brokers: self.settings.brokers.clone(),
                        timeout: self.settings.timeout,
                        error,
                    });
                }
            }
        };
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        match t.error() {
            None => Ok(Some(t.partitions().len())),
            Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(None),
            Some(e) => Err(KafkaError::Invalid(format!(
                "metadata of topic {topic}: {}",
                RDKafkaErrorCode::from(e)
            ))),
        }
    }

    /// The number of partitions of a topic that must exist.
    pub fn require(&self, topic: &str, role: &'static str) -> Result<usize, KafkaError> {
        match self.partitions(topic)? {
            Some(n) if n > 0 => Ok(n),
            _ => Err(KafkaError::TopicMissing {
                topic: topic.to_string(),
                role,
                hint: format!(
                    " (for a local broker: scripts/kafka-dev.sh topics --create --topic {topic} --partitions 4)"
                ),
            }),
        }
    }

    /// Makes sure the job's internal re-keying topic exists with `partitions`
    /// partitions (created with the broker's default retention when missing).
    pub fn ensure_internal(&self, topic: &str, partitions: usize) -> Result<(), KafkaError> {
        self.ensure(
            topic,
            partitions,
            &[("cleanup.policy", "delete")],
            "internal",
        )
    }

    /// Makes sure the compacted changelog `topic` exists with `partitions` partitions:
    /// creates it when missing, refuses one with another partition count (its partitions
    /// would no longer match the input's).
    pub fn ensure_changelog(&self, topic: &str, partitions: usize) -> Result<(), KafkaError> {
        // Compacted: the latest state of each key stays, so a restore reads each key
        // once. Small segments let the cleaner compact soon after a segment rolls.
        let config = [
            ("cleanup.policy", "compact"),
            ("segment.bytes", "67108864"),
            ("segment.ms", "600000"),
            ("min.cleanable.dirty.ratio", "0.2"),
            ("message.timestamp.type", "LogAppendTime"),
            // Tombstones stay a day: a local snapshot (at most 12 hours old) read on
            // from its offset still sees every key removed since.
            ("delete.retention.ms", "86400000"),
        ];
        self.ensure(topic, partitions, &config, "changelog")
    }

    /// Makes sure the compacted topic of a job's progress records exists (created with
    /// one partition when missing); returns its number of partitions.
    pub fn ensure_progress(&self, topic: &str) -> Result<usize, KafkaError> {
        match self.partitions(topic)? {
            Some(n) if n > 0 => Ok(n),
            _ => {
                self.ensure(topic, 1, &[("cleanup.policy", "compact")], "progress")?;
                Ok(1)
            }
        }
    }

    fn ensure(
        &self,
        topic: &str,
        partitions: usize,
        config: &[(&str, &str)],
        what: &str,
    ) -> Result<(), KafkaError> {
        if let Some(n) = self.partitions(topic)? {
            if n != partitions {
                return Err(KafkaError::Invalid(format!(
                    "the {what} topic {topic} has {n} partitions but needs {partitions} (one per input partition). Was the input topic repartitioned? Use a new --kafka-group"
                )));
            }
            return Ok(());
        }
        let parts = i32::try_from(partitions)
            .map_err(|_| KafkaError::Invalid(format!("{partitions} partitions")))?;
        let mut new = NewTopic::new(topic, parts, TopicReplication::Fixed(-1));
        for &(k, v) in config {
            new = new.set(k, v);
        }
        let opts = AdminOptions::new().operation_timeout(Some(self.settings.timeout));
        let results = futures_executor::block_on(self.admin.create_topics([&new], &opts))
            .map_err(KafkaError::client(format!("create topic {topic}")))?;
        for r in results {
            match r {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(KafkaError::Invalid(format!(
                        "cannot create the {what} topic {name}: {code}"
                    )));
                }
            }
        }
        // Creation is asynchronous on the broker: wait until the metadata shows it.
        let began = std::time::Instant::now();
        while began.elapsed() < self.settings.timeout {
            if self.partitions(topic)? == Some(partitions) {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Err(KafkaError::Invalid(format!(
            "the {what} topic {topic} was created but did not appear within {:?}",
            self.settings.timeout
        )))
    }

    /// The first offset of a partition and its end as a `read_committed` reader sees
    /// it (`low`, `high`): `high` is the last stable offset, where the first transaction
    /// still open starts (the offset after the last record when none is).
    /// A partition whose leader is moving, or that was created a moment ago and has no
    /// leader yet, answers with a retriable error: asked again until `--kafka-timeout`.
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), KafkaError> {
        Self::ends_of(&self.meta, &self.settings, topic, partition)
    }

    /// The offset after a partition's last record, committed or not (its high
    /// watermark): records a transaction has written but whose marker has not reached
    /// the partition yet lie below it.
    pub fn written_end(&self, topic: &str, partition: i32) -> Result<i64, KafkaError> {
        Ok(Self::ends_of(&self.uncommitted, &self.settings, topic, partition)?.1)
    }

    fn ends_of(
        client: &BaseConsumer<Watched>,
        settings: &KafkaSettings,
        topic: &str,
        partition: i32,
    ) -> Result<(i64, i64), KafkaError> {
        let began = std::time::Instant::now();
        loop {
            match client.fetch_watermarks(topic, partition, settings.timeout) {
                Ok(w) => return Ok(w),
                Err(ClientError::MetadataFetch(
                    RDKafkaErrorCode::NotLeaderForPartition
                    | RDKafkaErrorCode::LeaderNotAvailable
                    | RDKafkaErrorCode::UnknownTopicOrPartition,
                )) if began.elapsed() < settings.timeout => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(KafkaError::client(format!(
                        "read the end offsets of {topic}/{partition}"
                    ))(e));
                }
            }
        }
    }
}
