//! `--repartition` (docs/semantics.md K-6): an input topic that is not partitioned by the
//! session key is re-keyed through an internal topic, `<group>-repartition`, and
//! sessionized from there. Each record read from an input partition is written, as it was
//! read, to the internal partition its session key gives (Kafka's murmur2 partitioner),
//! with a `source` header naming where it was read, in the same transaction as the input
//! offsets: exactly once across both hops. The internal topic's partitions are the
//! tasks. A record without a key (not JSON, no key field) is forwarded too, to the
//! partition its bytes hash to, so that the task there dead-letters it with its reason
//! and its original position — every record is accounted for by the tasks alone.

use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::consumer::Record;
use sessionizer_connectors::kafka::partitioner::partition_for;
use sessionizer_connectors::kafka::producer::{CommitError, TxnProducer};
use sessionizer_core::decode::KeyReader;
use sessionizer_core::json::FieldPath;
use std::collections::BTreeMap;

/// The re-keying side of a job.
#[derive(Debug)]
pub(super) struct Rekey {
    /// The internal topic.
    pub(super) topic: String,
    partitions: usize,
    /// Topics with an index below this are inputs (the internal topic comes after).
    first_internal: u32,
    keys: KeyReader,
    /// The input partitions held, each with the next offset to read.
    pub(super) positions: BTreeMap<TopicPartition, i64>,
    /// Records forwarded by this process.
    pub(super) forwarded: u64,
    /// `--stop-at-end`: every input partition was re-keyed to its end and committed.
    pub(super) inputs_done: bool,
    source: String,
}

impl Rekey {
    pub(super) fn new(topic: String, partitions: usize, inputs: usize, key: FieldPath) -> Rekey {
        Rekey {
            topic,
            partitions,
            first_internal: inputs as u32,
            keys: KeyReader::new(key),
            positions: BTreeMap::new(),
            forwarded: 0,
            inputs_done: false,
            source: String::new(),
        }
    }

    /// Whether `tp` is an input partition (re-keyed), not a task's.
    pub(super) fn is_input(&self, tp: TopicPartition) -> bool {
        tp.topic < self.first_internal
    }

    /// Forwards one input record to the internal topic, in the open transaction.
    pub(super) fn forward(
        &mut self,
        producer: &mut TxnProducer,
        topics: &[String],
        r: &Record<'_>,
    ) -> Result<(), CommitError> {
        use std::fmt::Write as _;
        let value = r.value().unwrap_or_default();
        self.source.clear();
        let _ = write!(
            self.source,
            "{}/{}@{}",
            topics[r.from.topic as usize],
            r.from.partition,
            r.offset()
        );
        let key = self.keys.key(value).ok();
        let partition = partition_for(key.unwrap_or(value), self.partitions);
        producer.send_with_source(&self.topic, Some(partition), key, Some(value), &self.source)?;
        self.positions.insert(r.from, r.offset() + 1);
        self.forwarded += 1;
        Ok(())
    }
}
