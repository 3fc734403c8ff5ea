//! A topic's partitions as a [`Source`]: each poll's records into a batch, the
//! partition as the record's input and its offset as its place.

use super::KafkaError;
use super::consumer::{GroupConsumer, Polled};
use crate::encode::{PositionStyle, SourcePos};
use crate::input::{Batch, DEFAULT_MAX_RECORD};
use crate::source::{Limit, Read, ReadError, Source};
use std::time::Duration;

/// The records of one topic a consumer was assigned (or subscribed to). A record
/// without a value (a tombstone) is an empty line of the batch.
pub struct TopicRecords {
    consumer: GroupConsumer,
    /// `topic/partition` of each partition, by partition number.
    names: Vec<String>,
    max_record: usize,
    /// An error met after a read had records: reported by the next read, so that the
    /// records read before it are handed out.
    pending: Option<KafkaError>,
}

impl std::fmt::Debug for TopicRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicRecords")
            .field("partitions", &self.names.len())
            .finish()
    }
}

impl TopicRecords {
    /// The records `consumer` reads of `topic` (its only topic), which has
    /// `partitions` partitions.
    pub fn new(consumer: GroupConsumer, topic: &str, partitions: usize) -> TopicRecords {
        TopicRecords {
            consumer,
            names: (0..partitions).map(|p| format!("{topic}/{p}")).collect(),
            max_record: DEFAULT_MAX_RECORD,
            pending: None,
        }
    }

    /// The consumer (to ask whether the cluster answers).
    pub fn consumer(&self) -> &GroupConsumer {
        &self.consumer
    }
}

impl Source for TopicRecords {
    /// Waits up to `limit.wait` for the first record, then takes what has arrived, up
    /// to `limit.records`. An error after some records were read is reported by the
    /// next read; one met first is reported now (the consumer goes on where it stands
    /// after a transient one: it reconnects by itself).
    fn read(&mut self, batch: &mut Batch, limit: Limit) -> Result<Read, ReadError> {
        batch.clear();
        if let Some(e) = self.pending.take() {
            return Err(e.into());
        }
        let mut wait = limit.wait;
        while batch.lines.len() < limit.records {
            let record = match self.consumer.poll(wait) {
                Ok(Polled::Record(r)) => r,
                Ok(Polled::End) => continue,
                Ok(Polled::Nothing) => break,
                Err(e) if batch.lines.is_empty() => return Err(e.into()),
                Err(e) => {
                    self.pending = Some(e);
                    break;
                }
            };
            wait = Duration::ZERO;
            let (partition, offset) = (record.from.partition, record.offset());
            let value = record.value().unwrap_or_default();
            let input = u32::try_from(partition).unwrap_or(u32::MAX);
            let at = u64::try_from(offset).unwrap_or_default();
            batch.push_record(value, input, at, self.max_record);
        }
        Ok(match batch.lines.is_empty() {
            true => Read::Quiet,
            false => Read::Records,
        })
    }

    fn pos(&self, input: u32, at: u64) -> SourcePos<'_> {
        SourcePos {
            name: self.names.get(input as usize).map_or("?", String::as_str),
            at,
            style: PositionStyle::Offset,
        }
    }

    fn set_max_record(&mut self, bytes: usize) {
        self.max_record = bytes;
    }
}
