//! Apache Kafka for library jobs (cargo feature `kafka`): [`KafkaJson`] reads a topic's
//! JSON records as events of your type, [`KafkaJsonSink`] writes any serde type to a
//! topic as JSON, keyed by one of its fields.
//!
//! The source reads every partition of its topic itself (no consumer group: one
//! process owns the topic; for several processes sharing a topic's partitions use the
//! command line's `--kafka-group`), `read_committed`, and keeps how far it has read
//! each partition. [`KafkaJson::open`]'s events go to one job with one watermark, in the
//! order they are fetched: with several partitions the output can depend on how their
//! records interleave. [`KafkaJson::open_partition`] reads one partition: one job (and
//! state directory) per partition gives the command line's per-partition tasks
//! (docs/semantics.md K-1), each partition's sessions those of its records alone. A
//! source is opened on the job's [`Checkpoints`] after the job's restore and shares its
//! position with them: every checkpoint records, beside the job's state, just where the
//! source stopped handing out records, and a source opened on that state directory
//! continues from there. The state and the input position of a restart always belong
//! together — push every event a `poll` handed out before the next checkpoint. The sink
//! opened with [`KafkaJsonSink::open`] is idempotent but not transactional: records
//! emitted after the last checkpoint are written again after a restart (the same records,
//! with the same session ids and revisions). One opened with
//! [`KafkaJsonSink::exactly_once`] writes in transactions that commit with the job's
//! checkpoints: every record once.
//!
//! ```no_run
//! use sessionizer::kafka::{KafkaJson, KafkaJsonSink};
//! use sessionizer::prelude::*;
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Visit { visit_id: String, event_time: EventTime }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let brokers = "127.0.0.1:9092";
//!     let mut checkpoints = Checkpoints::open("/var/lib/my-service/state")?;
//!     // Before the restore: it settles which checkpoint is the last committed one.
//!     let mut sessions = KafkaJsonSink::exactly_once(brokers, "sessions", "key", &mut checkpoints)?;
//!     let mut job = Stream::<Visit>::new()
//!         .key_by(|v| v.visit_id.clone())
//!         .event_time(|v| v.event_time)
//!         .session_windows(minutes(30))
//!         .aggregate(Count)
//!         .build();
//!     job.restore(&mut checkpoints)?;
//!     // After the restore: every checkpoint then records how far it has read.
//!     let mut visits = KafkaJson::<Visit, _>::open(brokers, "visits", &mut checkpoints, Vec::new())?;
//!     let mut events = Vec::new();
//!     loop {
//!         visits.poll(Duration::from_millis(200), 50_000, &mut events)?;
//!         job.push_batch(events.drain(..), &mut sessions, &mut Vec::new())?;
//!         job.tick(&mut sessions)?;
//!         job.checkpoint(&mut checkpoints)?; // state, position and the commit together
//!     }
//! }
//! ```

use crate::api::checkpoints::{Checkpoints, SharedTopicSink, StateError};
use crate::api::joined::{JoinedSource, Offsets, SharedOffsets};
use crate::api::sink::{Sink, SinkError};
use crate::api::source::{DeadLetter, Reader, SourceCounts, SourceError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::KafkaSource;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::kafka::consumer::{GroupConsumer, StartAt};
use sessionizer_connectors::kafka::producer::{KeyField, LineProducer};
use sessionizer_connectors::kafka::records::TopicRecords;
use sessionizer_connectors::source::{Limit, Read};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use group::KafkaGroup;
pub use sessionizer_connectors::kafka::KafkaError;

mod group;

/// Why a library job cannot be a task of a [`KafkaGroup`], if it cannot: it has
/// `workers`, a state `store` of its own, or was `used` (events pushed, or restored).
pub(crate) fn task_refusal(
    workers: bool,
    store: bool,
    used: bool,
) -> Option<crate::error::GroupJobRefusal> {
    use crate::error::GroupJobRefusal;
    if workers {
        Some(GroupJobRefusal::Workers)
    } else if store {
        Some(GroupJobRefusal::OwnStore)
    } else if used {
        Some(GroupJobRefusal::NotNew)
    } else {
        None
    }
}

/// How the library's Kafka sources and sinks reach the cluster: a broker list (`&str`)
/// for an unsecured one, or [`KafkaSettings`] with its security properties
/// (`KafkaSettings::new(brokers).property("security.protocol", "SASL_SSL")...`, or
/// [`KafkaSettings::from_env`] for secrets kept in the environment).
pub use sessionizer_connectors::kafka::KafkaSettings;

/// A Kafka topic's JSON records as events of type `E` (each record's value is one JSON
/// document); a record that is not a valid `E` goes to the dead-letter sink `D` with
/// the reason and its `topic/partition@offset`, and is counted.
pub struct KafkaJson<E, D> {
    /// The topic's records, decoded; positions shared with the checkpoints.
    reader: Reader<TopicRecords, D>,
    topic: String,
    /// The next offset to hand out, per partition, shared with the checkpoints that
    /// record it.
    next: SharedOffsets,
    /// Why an earlier poll failed: the consumer may have read past a record it did not
    /// hand out, so the source takes no more polls (a restart goes on from the last
    /// checkpoint's position).
    failed: Option<String>,
    /// The cluster stopped answering: since when, when it was last asked whether it
    /// answers again, and the last error.
    outage: Option<(Instant, Instant, String)>,
    /// How long polls wait for a cluster that does not answer before they fail.
    outage_limit: Duration,
    _events: PhantomData<fn() -> E>,
}

impl<E, D> fmt::Debug for KafkaJson<E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaJson")
            .field("topic", &self.topic)
            .field("next", &self.next.lock().next)
            .field("counts", &self.reader.counts)
            .finish()
    }
}

impl<E: DeserializeOwned, D: Sink<DeadLetter>> KafkaJson<E, D> {
    /// Reads every partition of `topic` at `brokers`, each from where the checkpoint
    /// the job restored from `checkpoints` had read it, or from its first record when
    /// there is none; every later checkpoint in `checkpoints` records how far it has
    /// read. Open it after the job's restore (refused before, and as a second source
    /// of the same checkpoints). A checkpoint that read another topic, or other
    /// partitions than the topic has now, that was written with a source of one
    /// partition ([`open_partition`](Self::open_partition)), or that recorded no Kafka
    /// source, is refused. One job then sees all partitions with one watermark (see
    /// the module's docs); [`open_partition`](Self::open_partition) gives each
    /// partition a job of its own.
    pub fn open(
        brokers: impl Into<KafkaSettings>,
        topic: &str,
        checkpoints: &mut Checkpoints,
        dead_letters: D,
    ) -> Result<Self, SourceError> {
        Self::open_assigned(brokers.into(), topic, None, checkpoints, dead_letters)
    }

    /// Reads partition `partition` of `topic` only, from where the checkpoint the job
    /// restored from `checkpoints` had read it (as [`open`](Self::open) does, after the
    /// restore): one input partition is one task, as the command line
    /// runs them (docs/semantics.md K-1) — give each partition its own job, state
    /// directory (and so its own exactly-once sink, whose transactional id lives there),
    /// in one process or spread over several. A partition's sessions then depend on its
    /// records alone. A checkpoint that read another topic or partition, or that was
    /// written with a source of every partition ([`open`](Self::open)), is refused.
    pub fn open_partition(
        brokers: impl Into<KafkaSettings>,
        topic: &str,
        partition: i32,
        checkpoints: &mut Checkpoints,
        dead_letters: D,
    ) -> Result<Self, SourceError> {
        Self::open_assigned(
            brokers.into(),
            topic,
            Some(partition),
            checkpoints,
            dead_letters,
        )
    }

    fn open_assigned(
        settings: KafkaSettings,
        topic: &str,
        only: Option<i32>,
        checkpoints: &mut Checkpoints,
        dead_letters: D,
    ) -> Result<Self, SourceError> {
        checkpoints.can_join_source()?;
        // (A checkpoint written with an exactly-once sink was restored only if that
        // sink joined first: it settled which checkpoint, and so which positions.)
        // A checkpoint without a Kafka source's record reads from each partition's
        // start (one from a build before sources recorded how they were opened has
        // positions only, which are checked below); one of a file source cannot go on
        // with Kafka.
        if !checkpoints.inputs.is_empty()
            && let Some(epoch) = checkpoints.latest()
        {
            return Err(SourceError::Resume(format!(
                "checkpoint {epoch} in {} was written by a job reading files (JsonLines::resume), so a Kafka source cannot continue it; use another state directory",
                checkpoints.path().display()
            )));
        }
        let reads = |topic: &str, only: Option<i32>| match only {
            Some(p) => format!("{topic}/{p} alone (KafkaJson::open_partition)"),
            None => format!("every partition of {topic} (KafkaJson::open)"),
        };
        if let Some(was) = &checkpoints.kafka.source
            && (was.topic != topic || was.partition != only)
        {
            return Err(KafkaError::Invalid(format!(
                "the checkpoint in {} was written by a source reading {}; this source reads {}: open it as the state was built, or use another state directory",
                checkpoints.path().display(),
                reads(&was.topic, was.partition),
                reads(topic, only)
            ))
            .into());
        }
        let partitions = Admin::new(&settings)?.require(topic, "the job's input")?;
        if let Some(p) = only
            && usize::try_from(p).map_or(true, |p| p >= partitions)
        {
            return Err(KafkaError::Invalid(format!(
                "the topic {topic} has no partition {p} (it has {partitions})"
            ))
            .into());
        }
        let mut next = vec![None; partitions];
        for p in &checkpoints.kafka.positions {
            let slot = usize::try_from(p.partition)
                .ok()
                .filter(|_| p.topic == topic && only.is_none_or(|o| o == p.partition))
                .and_then(|i| next.get_mut(i))
                .ok_or_else(|| {
                    let reads = match only {
                        Some(o) => format!("{topic}/{o}"),
                        None => format!("{topic}, {partitions} partitions"),
                    };
                    KafkaError::Invalid(format!(
                        "the checkpoint in {} read {}/{}, which this source ({reads}) does not: use the topic and partition the state was built from, or another state directory",
                        checkpoints.path().display(),
                        p.topic,
                        p.partition
                    ))
                })?;
            *slot = Some(p.next_offset);
        }
        let consumer =
            GroupConsumer::new(&settings, &[topic.to_string()], None, "sessionizer-library")?;
        let assign: Vec<(TopicPartition, StartAt)> = next
            .iter()
            .enumerate()
            .filter(|(p, _)| only.is_none_or(|o| o as usize == *p))
            .map(|(p, at)| {
                let tp = TopicPartition {
                    topic: 0,
                    partition: p as i32,
                };
                (tp, at.map_or(StartAt::Earliest, StartAt::Offset))
            })
            .collect();
        consumer.assign(&assign)?;
        let next = SharedOffsets(Arc::new(Mutex::new(Offsets {
            source: KafkaSource {
                topic: topic.to_string(),
                partition: only,
            },
            next,
        })));
        let joined = JoinedSource::Kafka(next.clone());
        checkpoints.join_source(joined.clone());
        let records = TopicRecords::new(consumer, topic, partitions);
        Ok(KafkaJson {
            reader: Reader::new(records, dead_letters, Some(joined)),
            topic: topic.to_string(),
            next,
            failed: None,
            outage: None,
            outage_limit: Duration::from_secs(300),
            _events: PhantomData,
        })
    }

    /// The largest record in bytes (default 16 MiB, as `--max-record-size`): a longer
    /// message is a dead letter with its length and first bytes.
    pub fn max_record_size(mut self, bytes: usize) -> Self {
        self.reader.set_max_record(bytes);
        self
    }

    /// Appends to `events` the records readable now: waits up to `timeout` for the
    /// first, then takes what has arrived, up to `max` records (dead letters included).
    /// Returns how many records it read. A record without a value (a tombstone), or
    /// whose value is empty or only whitespace, is skipped and counted in
    /// [`SourceCounts::blank_lines`], as the command line's Kafka input counts it.
    /// A cluster that does not answer is waited for (see
    /// [`outage_limit`](Self::outage_limit)); any other error (Kafka refused the
    /// client, the dead-letter sink refused a record) ends the source: later polls are
    /// refused, and a restart goes on from the last checkpoint.
    pub fn poll(
        &mut self,
        timeout: Duration,
        max: usize,
        events: &mut Vec<E>,
    ) -> Result<usize, SourceError> {
        if let Some(why) = &self.failed {
            return Err(SourceError::Resume(format!(
                "this source failed earlier ({why}) and takes no more polls: restart the job, which goes on from its last checkpoint"
            )));
        }
        if let Err(e) = self.waited_out() {
            self.failed = Some(e.to_string());
            return Err(e);
        }
        let polled = self.poll_records(timeout, max, events);
        if let Err(e) = &polled {
            self.failed = Some(e.to_string());
        }
        polled
    }

    /// How long [`poll`](Self::poll) waits for a cluster that does not answer (brokers
    /// restarting, a leader moving) before it fails: default 5 minutes, as the command
    /// line's `--kafka-outage-limit`. Meanwhile a poll that meets such an error returns
    /// what it read so far, and the next ones go on where the consumer stands (it
    /// reconnects by itself): no record is skipped.
    pub fn outage_limit(mut self, limit: Duration) -> Self {
        self.outage_limit = limit;
        self
    }

    /// During an outage, asks the cluster once a second whether it answers again;
    /// fails once it has not for the outage limit.
    fn waited_out(&mut self) -> Result<(), SourceError> {
        let Some((since, probed, cause)) = &mut self.outage else {
            return Ok(());
        };
        if probed.elapsed() >= Duration::from_secs(1) {
            *probed = Instant::now();
            if self
                .reader
                .source
                .consumer()
                .answers(Duration::from_secs(2))
            {
                tracing::info!(
                    target: crate::telemetry::OUTAGE_TARGET,
                    topic = %self.topic,
                    waited_ms = since.elapsed().as_millis() as u64,
                    "the Kafka cluster answers again"
                );
                self.outage = None;
                return Ok(());
            }
        }
        if since.elapsed() > self.outage_limit {
            return Err(KafkaError::Unavailable(format!(
                "the brokers did not answer for {:?}, longer than the source's outage limit ({:?}); the last error: {cause}",
                since.elapsed(),
                self.outage_limit
            ))
            .into());
        }
        Ok(())
    }

    fn poll_records(
        &mut self,
        timeout: Duration,
        max: usize,
        events: &mut Vec<E>,
    ) -> Result<usize, SourceError> {
        let limit = Limit {
            bytes: usize::MAX,
            records: max,
            wait: timeout,
        };
        let read = match self.reader.read(limit) {
            Ok(Read::Records) => self.reader.records_read(),
            Ok(Read::Quiet | Read::End) => 0,
            // The cluster does not answer: nothing was handed out past what was
            // read, and the consumer reconnects by itself (see `outage_limit`).
            Err(SourceError::Kafka(e)) if e.is_transient() => {
                if self.outage.is_none() {
                    tracing::warn!(
                        target: crate::telemetry::OUTAGE_TARGET,
                        topic = %self.topic,
                        cause = %e,
                        "the Kafka cluster does not answer; waiting for it"
                    );
                    let now = Instant::now();
                    self.outage = Some((now, now, e.to_string()));
                } else if let Some((_, _, cause)) = &mut self.outage {
                    *cause = e.to_string();
                }
                0
            }
            Err(e) => return Err(e),
        };
        while let Some(event) = self.reader.next_event()? {
            events.push(event);
        }
        Ok(read)
    }

    /// The next offset of each partition (`None`: nothing read from it yet): just
    /// after the last record [`poll`](Self::poll) handed out. Every checkpoint of the
    /// job records it.
    pub fn positions(&self) -> Vec<Option<i64>> {
        self.next.lock().next.clone()
    }

    /// Records read so far, and how many of them were dead letters.
    pub fn counts(&self) -> SourceCounts {
        self.reader.counts
    }

    /// Flushes the dead-letter sink and returns the counts.
    pub fn finish(mut self) -> Result<SourceCounts, SourceError> {
        self.reader.dead.flush()?;
        Ok(self.reader.counts)
    }
}

/// Writes items of any serde type to a Kafka topic as JSON values, keyed by the text
/// of one field (`"key"` for session records) and placed by Kafka's default
/// partitioner, as a Java producer keyed by that field would place them. The field is
/// named as the command line's `--key-field` names one: a dotted name is a path to a
/// nested member (so a member whose own name holds a dot cannot key records), and the
/// key is read from the written JSON by the job's own validating scanner.
///
/// Two kinds: [`open`](Self::open) is idempotent, not transactional — records emitted
/// after the last checkpoint are written again after a restart, and
/// [`flush`](Sink::flush) waits until everything sent is delivered.
/// [`exactly_once`](Self::exactly_once) writes in Kafka transactions that commit with
/// the job's checkpoints: a `read_committed` reader sees every record once, whatever
/// kills and restarts.
pub struct KafkaJsonSink {
    out: Producer,
    line: Vec<u8>,
    sent: u64,
}

enum Producer {
    /// Keys each line itself.
    Idempotent(LineProducer),
    /// One topic of a shared transactional output.
    Transactional {
        sink: SharedTopicSink,
        /// Which of its topics (0: the first).
        topic: usize,
        key: KeyField,
    },
}

impl fmt::Debug for KafkaJsonSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.out {
            Producer::Idempotent(_) => "idempotent",
            Producer::Transactional { .. } => "exactly once",
        };
        f.debug_struct("KafkaJsonSink")
            .field("kind", &kind)
            .field("sent", &self.sent)
            .finish()
    }
}

/// How long the brokers keep an exactly-once sink's transaction open: checkpoint more
/// often than this (its transaction commits with each checkpoint).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

impl KafkaJsonSink {
    /// A producer into `topic` (which must exist) at `brokers`, keying each record by
    /// its field `key_field` (a member name; dotted for a nested member).
    pub fn open(
        brokers: impl Into<KafkaSettings>,
        topic: &str,
        key_field: &str,
    ) -> Result<Self, KafkaError> {
        let settings = brokers.into();
        Admin::new(&settings)?.require(topic, "the job's output")?;
        Ok(KafkaJsonSink {
            out: Producer::Idempotent(LineProducer::new(&settings, topic, key_field)?),
            line: Vec::new(),
            sent: 0,
        })
    }

    /// An exactly-once producer into `topic` (which must exist) at `brokers`, keying
    /// each record by its top-level field `key_field`, whose transactions commit with
    /// the job's checkpoints in `checkpoints` — as `sessionizer run --state-dir` does
    /// with `--kafka-output-topic` (docs/checkpoint-format.md, *Kafka output: two-phase
    /// commit*): each checkpoint adds a progress record to the open transaction (topic
    /// `<topic>-sessionizer-progress`, created if missing), flushes it, writes the
    /// checkpoint, then commits. Records become visible to `read_committed` readers when
    /// the checkpoint after them is written.
    ///
    /// Call it right after [`Checkpoints::open`] and before the job's `restore` (and
    /// before opening a [`KafkaJson`] source on the same checkpoints): it fences an
    /// earlier process of the job (the transactional id, `sessionizer-lib-<instance>`,
    /// is kept in the directory's `instance-id` file) and, when the newest checkpoint's
    /// transaction never committed, makes the checkpoint before it the one to restore.
    /// A checkpoint written with this sink cannot be restored without it. Checkpoint
    /// at least every [`TRANSACTION_TIMEOUT`].
    pub fn exactly_once(
        brokers: impl Into<KafkaSettings>,
        topic: &str,
        key_field: &str,
        checkpoints: &mut Checkpoints,
    ) -> Result<Self, StateError> {
        let key = KeyField::new(key_field).map_err(|e| StateError::Output(e.to_string()))?;
        let settings = brokers.into();
        let sink = crate::runtime::kafka_sink::open_library(settings, topic, TRANSACTION_TIMEOUT)
            .map_err(StateError::output)?;
        let shared = checkpoints.join_transaction(sink)?;
        Ok(KafkaJsonSink {
            out: Producer::Transactional {
                sink: shared,
                topic: 0,
                key,
            },
            line: Vec::new(),
            sent: 0,
        })
    }

    /// Another topic (which must exist) written in this exactly-once sink's
    /// transactions, keyed by its items' top-level field `key_field`: dead letters
    /// (`key_field` `"source"`) or late events next to the sessions, committed with the
    /// same checkpoints. Refused for a sink made with [`open`](Self::open).
    pub fn also_to(&self, topic: &str, key_field: &str) -> Result<KafkaJsonSink, StateError> {
        let Producer::Transactional { sink: shared, .. } = &self.out else {
            return Err(StateError::Output(format!(
                "also_to({topic}) needs a sink made with KafkaJsonSink::exactly_once"
            )));
        };
        let key = KeyField::new(key_field).map_err(|e| StateError::Output(e.to_string()))?;
        let index = shared.lock().add_topic(topic).map_err(StateError::output)?;
        Ok(KafkaJsonSink {
            out: Producer::Transactional {
                sink: shared.clone(),
                topic: index,
                key,
            },
            line: Vec::new(),
            sent: 0,
        })
    }

    /// Waits until every record sent is delivered; fails if any was not. Returns how
    /// many were sent in all. Exactly once, delivered is not visible: the records of the
    /// open transaction become visible when the next checkpoint commits it (which
    /// flushes too: calling this before a checkpoint is not needed).
    pub fn flush(&mut self) -> Result<u64, SinkError> {
        match &mut self.out {
            Producer::Idempotent(p) => Ok(p.flush()?),
            Producer::Transactional { sink, .. } => {
                sink.lock()
                    .deliver()
                    .map_err(|e| KafkaError::Invalid(e.to_string()))?;
                Ok(self.sent)
            }
        }
    }
}

impl<T: Serialize> Sink<T> for KafkaJsonSink {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &item)?;
        match &mut self.out {
            Producer::Idempotent(p) => p.send(&self.line)?,
            Producer::Transactional { sink, topic, key } => {
                let key = key.of(&self.line);
                sink.lock()
                    .keyed(*topic, key, &self.line)
                    .map_err(|e| KafkaError::Invalid(e.to_string()))?;
            }
        }
        self.sent += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        KafkaJsonSink::flush(self).map(drop)
    }
}
