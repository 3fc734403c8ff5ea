//! Apache Kafka for library jobs (cargo feature `kafka`): [`KafkaJson`] reads a topic's
//! JSON records as events of your type, [`KafkaJsonSink`] writes any serde type to a
//! topic as JSON, keyed by one of its fields.
//!
//! The source reads every partition of its topic itself (no consumer group: one
//! process owns the topic; for several processes sharing a topic's partitions use the
//! command line's `--kafka-group`), `read_committed`, and keeps how far it has read
//! each partition. [`record_position`](KafkaJson::record_position) puts that into the
//! job's [`Checkpoints`], so the next checkpoint carries it beside the job's state, and
//! a source opened on that state directory continues from there: the state and the
//! input position of a restart always belong together. The sink is idempotent but not
//! transactional: records emitted after the last checkpoint are written again after a
//! restart (the same records, with the same session ids and revisions).
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
//!     let mut checkpoints = Checkpoints::open("/var/lib/my-service/state")?;
//!     let mut job = Stream::<Visit>::new()
//!         .key_by(|v| v.visit_id.clone())
//!         .event_time(|v| v.event_time)
//!         .session_windows(minutes(30))
//!         .aggregate(Count)
//!         .build();
//!     job.restore(&mut checkpoints)?;
//!     let brokers = "127.0.0.1:9092";
//!     let mut visits = KafkaJson::<Visit, _>::open(brokers, "visits", &checkpoints, Vec::new())?;
//!     let mut sessions = KafkaJsonSink::open(brokers, "sessions", "key")?;
//!     let mut events = Vec::new();
//!     loop {
//!         visits.poll(Duration::from_millis(200), 50_000, &mut events)?;
//!         job.push_batch(events.drain(..), &mut sessions, &mut Vec::new())?;
//!         job.tick(&mut sessions)?;
//!         sessions.flush()?;                      // delivered, then
//!         visits.record_position(&mut checkpoints);
//!         job.checkpoint(&mut checkpoints)?;      // state and position together
//!     }
//! }
//! ```

use crate::checkpoints::Checkpoints;
use crate::sink::{Sink, SinkError};
use crate::source::{DeadLetter, SourceCounts, SourceError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::KafkaPosition;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::kafka::consumer::{GroupConsumer, Polled, StartAt};
use sessionizer_connectors::kafka::producer::LineProducer;
use sessionizer_connectors::kafka::{KafkaSettings, TopicPartition};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

pub use sessionizer_connectors::kafka::KafkaError;

fn settings(brokers: &str) -> KafkaSettings {
    KafkaSettings {
        brokers: brokers.to_string(),
        properties: Vec::new(),
        timeout: Duration::from_secs(30),
    }
}

/// A Kafka topic's JSON records as events of type `E` (each record's value is one JSON
/// document); a record that is not a valid `E` goes to the dead-letter sink `D` with
/// the reason and its `topic/partition@offset`, and is counted.
pub struct KafkaJson<E, D> {
    consumer: GroupConsumer,
    topic: String,
    /// The next offset to hand out, per partition (`None`: from the start).
    next: Vec<Option<i64>>,
    dead: D,
    counts: SourceCounts,
    _events: PhantomData<fn() -> E>,
}

impl<E, D> fmt::Debug for KafkaJson<E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaJson")
            .field("topic", &self.topic)
            .field("next", &self.next)
            .field("counts", &self.counts)
            .finish()
    }
}

impl<E: DeserializeOwned, D: Sink<DeadLetter>> KafkaJson<E, D> {
    /// Reads every partition of `topic` at `brokers`, each from where the checkpoint
    /// found in `checkpoints` had read it (the one the job restores), or from its first
    /// record when there is none. A checkpoint that read another topic, or other
    /// partitions than the topic has now, is refused.
    pub fn open(
        brokers: &str,
        topic: &str,
        checkpoints: &Checkpoints,
        dead_letters: D,
    ) -> Result<Self, SourceError> {
        let settings = settings(brokers);
        let partitions = Admin::new(&settings)?.require(topic, "the job's input")?;
        let mut next = vec![None; partitions];
        for p in &checkpoints.kafka_positions {
            let slot = usize::try_from(p.partition)
                .ok()
                .filter(|_| p.topic == topic)
                .and_then(|i| next.get_mut(i))
                .ok_or_else(|| {
                    KafkaError::Invalid(format!(
                        "the checkpoint in {} read {}/{}, which this source ({topic}, {partitions} partitions) does not have: use the topic the state was built from, or another state directory",
                        checkpoints.path().display(),
                        p.topic,
                        p.partition
                    ))
                })?;
            *slot = Some(p.next_offset);
        }
        let consumer = GroupConsumer::new(
            &settings,
            &[topic.to_string()],
            None,
            None,
            "sessionizer-library",
        )?;
        let assign: Vec<(TopicPartition, StartAt)> = next
            .iter()
            .enumerate()
            .map(|(p, at)| {
                let tp = TopicPartition {
                    topic: 0,
                    partition: p as i32,
                };
                (tp, at.map_or(StartAt::Earliest, StartAt::Offset))
            })
            .collect();
        consumer.assign(&assign)?;
        Ok(KafkaJson {
            consumer,
            topic: topic.to_string(),
            next,
            dead: dead_letters,
            counts: SourceCounts::default(),
            _events: PhantomData,
        })
    }

    /// Appends to `events` the records readable now: waits up to `timeout` for the
    /// first, then takes what has arrived, up to `max` records (dead letters included).
    /// Returns how many records it read.
    pub fn poll(
        &mut self,
        timeout: Duration,
        max: usize,
        events: &mut Vec<E>,
    ) -> Result<usize, SourceError> {
        let mut read = 0;
        let mut wait = timeout;
        while read < max {
            let record = match self.consumer.poll(wait)? {
                Polled::Record(r) => r,
                Polled::End => continue,
                Polled::Nothing => break,
            };
            wait = Duration::ZERO;
            read += 1;
            self.counts.records += 1;
            let (partition, offset) = (record.from.partition, record.offset());
            if let Some(slot) = usize::try_from(partition)
                .ok()
                .and_then(|p| self.next.get_mut(p))
            {
                *slot = Some(offset + 1);
            }
            let bytes = record.value().unwrap_or_default();
            let decoded = match record.value() {
                None => Err("a record without a value (a tombstone)".to_string()),
                Some(v) => serde_json::from_slice::<E>(v).map_err(|e| e.to_string()),
            };
            match decoded {
                Ok(event) => events.push(event),
                Err(reason) => {
                    self.counts.invalid += 1;
                    let source = format!("{}/{partition}@{offset}", self.topic);
                    self.dead.send(DeadLetter::of(reason, source, bytes))?;
                }
            }
        }
        Ok(read)
    }

    /// Records in `checkpoints` how far this source has read (every record handed out
    /// by [`poll`](Self::poll) so far): the job's next checkpoint carries it. Call it
    /// after pushing those events and before `job.checkpoint(..)`.
    pub fn record_position(&self, checkpoints: &mut Checkpoints) {
        checkpoints.kafka_positions = self
            .next
            .iter()
            .enumerate()
            .filter_map(|(p, at)| {
                at.map(|next_offset| KafkaPosition {
                    topic: self.topic.clone(),
                    partition: p as i32,
                    next_offset,
                })
            })
            .collect();
    }

    /// The next offset of each partition (`None`: nothing read from it yet).
    pub fn positions(&self) -> &[Option<i64>] {
        &self.next
    }

    /// Records read so far, and how many of them were dead letters.
    pub fn counts(&self) -> SourceCounts {
        self.counts
    }

    /// Flushes the dead-letter sink and returns the counts.
    pub fn finish(mut self) -> Result<SourceCounts, SourceError> {
        self.dead.flush()?;
        Ok(self.counts)
    }
}

/// Writes items of any serde type to a Kafka topic as JSON values, keyed by the text
/// of one top-level field (`"key"` for session records) and placed by Kafka's default
/// partitioner, as a Java producer keyed by that field would place them. Idempotent,
/// not transactional; [`flush`](Sink::flush) waits until everything sent is
/// delivered and fails if anything was not.
pub struct KafkaJsonSink {
    producer: LineProducer,
    line: Vec<u8>,
}

impl fmt::Debug for KafkaJsonSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaJsonSink")
            .field("producer", &self.producer)
            .finish()
    }
}

impl KafkaJsonSink {
    /// A producer into `topic` (which must exist) at `brokers`, keying each record by
    /// its top-level field `key_field`.
    pub fn open(brokers: &str, topic: &str, key_field: &str) -> Result<Self, KafkaError> {
        let settings = settings(brokers);
        Admin::new(&settings)?.require(topic, "the job's output")?;
        Ok(KafkaJsonSink {
            producer: LineProducer::new(&settings, topic, key_field)?,
            line: Vec::new(),
        })
    }

    /// Waits until every record sent is delivered; fails if any was not. Returns how
    /// many were sent in all.
    pub fn flush(&mut self) -> Result<u64, SinkError> {
        Ok(self.producer.flush()?)
    }
}

impl<T: Serialize> Sink<T> for KafkaJsonSink {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &item)?;
        self.producer.send(&self.line)?;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        KafkaJsonSink::flush(self).map(drop)
    }
}
