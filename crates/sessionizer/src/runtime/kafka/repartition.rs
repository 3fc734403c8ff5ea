//! `--repartition` (docs/semantics.md K-6): an input topic that is not partitioned by the
//! session key is re-keyed through an internal topic, `<group>-repartition`, and
//! sessionized from there. Each record read from an input partition is written, as it was
//! read, to the internal partition its session key gives (Kafka's murmur2 partitioner),
//! with a `source` header naming where it was read, in the same transaction as the input
//! offsets: exactly once across both hops. The internal topic's partitions are the
//! tasks. A record without a key (not JSON, no key field) is forwarded too, to the
//! partition its bytes hash to, so that the task there dead-letters it with its reason
//! and its original position — every record is accounted for by the tasks alone.
//!
//! Event time crosses the hop too. Each input partition's largest valid event time
//! forwarded so far goes, with every commit that moved it, to every internal partition
//! as a watermark record (no key, no value, a `sessionizer-watermark` header), in the
//! same transaction as the records it covers; `+inf` once a `--stop-at-end` partition is
//! done, `idle` once it brought nothing for `--idle-timeout`. A task's watermark follows
//! the smallest of them (see `Task::hear_upstream`), so it judges a record late only if
//! the input partition it came from had moved past it already.

use crate::runtime::kafka::op::UpstreamTimes;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::consumer::Record;
use sessionizer_connectors::kafka::partitioner::partition_for;
use sessionizer_connectors::kafka::producer::{CommitError, TxnProducer};
use sessionizer_core::decode::KeyReader;
use sessionizer_core::json::FieldPath;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// An input partition's time goes to the internal topic at least every this many
/// records forwarded from it (and at every commit that moved it): a task's watermark
/// trails the inputs by at most that much, also while a backlog is read in one go.
const PUBLISH_EVERY: u32 = 1000;

/// Where one input partition's event time stands, on the re-keying side.
#[derive(Debug, Clone, Copy)]
struct Upstream {
    /// The largest valid event time forwarded (since this process took the partition).
    time: Option<i64>,
    /// Quiet for the idle timeout (until its next record).
    idle: bool,
    last_input: Instant,
    /// What the last watermark record said (`None`: none yet).
    published: Option<(Option<i64>, bool)>,
    /// Records forwarded since then.
    unpublished: u32,
}

/// The re-keying side of a job.
pub(super) struct Rekey<T> {
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
    times: T,
    /// The event time of each input partition held.
    upstream: BTreeMap<TopicPartition, Upstream>,
}

impl<T: UpstreamTimes> Rekey<T> {
    pub(super) fn new(
        topic: String,
        partitions: usize,
        inputs: usize,
        key: FieldPath,
        times: T,
    ) -> Rekey<T> {
        Rekey {
            topic,
            partitions,
            first_internal: inputs as u32,
            keys: KeyReader::new(key),
            positions: BTreeMap::new(),
            forwarded: 0,
            inputs_done: false,
            source: String::new(),
            times,
            upstream: BTreeMap::new(),
        }
    }

    /// Takes input partition `tp` on, to read from `at`.
    pub(super) fn hold(&mut self, tp: TopicPartition, at: i64) {
        self.positions.insert(tp, at);
        self.upstream.insert(
            tp,
            Upstream {
                time: None,
                idle: false,
                last_input: Instant::now(),
                published: None,
                unpublished: 0,
            },
        );
    }

    /// Lets input partition `tp` go. Its event time starts over with its next owner (or
    /// with this process, after a rewind): from the records it reads from then on,
    /// which the watermark records already committed cannot have passed.
    pub(super) fn release(&mut self, tp: &TopicPartition) {
        self.positions.remove(tp);
        self.upstream.remove(tp);
    }

    /// Marks the input partitions that brought no record for `limit` idle.
    pub(super) fn mark_idle(&mut self, limit: Duration) {
        for u in self.upstream.values_mut() {
            if u.last_input.elapsed() >= limit {
                u.idle = true;
            }
        }
    }

    /// Sends, to every internal partition, a watermark record for each input partition
    /// whose time (or idleness) changed since its last one: in the open transaction,
    /// after every record it covers. A partition at its end (`ends`, with
    /// `--stop-at-end`) says `+inf`.
    pub(super) fn publish(
        &mut self,
        producer: &mut TxnProducer,
        topics: &[String],
        ends: Option<&BTreeMap<TopicPartition, i64>>,
    ) -> Result<(), CommitError> {
        for (tp, u) in &mut self.upstream {
            let done = ends.is_some_and(|e| {
                e.get(tp)
                    .is_some_and(|&end| self.positions.get(tp).is_some_and(|&at| at >= end))
            });
            let now = match done {
                true => (Some(i64::MAX), false),
                false => (u.time, u.idle),
            };
            let to = (self.topic.as_str(), self.partitions);
            publish_one(producer, to, &topics[tp.topic as usize], *tp, u, now)?;
        }
        Ok(())
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
        let time = self.times.time_of(value);
        let key = self.keys.key(value).ok();
        let partition = partition_for(key.unwrap_or(value), self.partitions);
        producer.send_with_source(&self.topic, Some(partition), key, Some(value), &self.source)?;
        self.positions.insert(r.from, r.offset() + 1);
        if let Some(u) = self.upstream.get_mut(&r.from) {
            if let Some(t) = time {
                u.time = Some(u.time.map_or(t.0, |m| m.max(t.0)));
            }
            u.idle = false;
            u.last_input = Instant::now();
            u.unpublished += 1;
            if u.unpublished >= PUBLISH_EVERY {
                let to = (self.topic.as_str(), self.partitions);
                let topic = &topics[r.from.topic as usize];
                publish_one(producer, to, topic, r.from, u, (u.time, false))?;
            }
        }
        self.forwarded += 1;
        Ok(())
    }
}

/// Sends input partition `tp`'s time `now` (`(time, idle)`) to every partition of the
/// internal topic `to` (name, partitions), unless it said that already.
fn publish_one(
    producer: &mut TxnProducer,
    to: (&str, usize),
    topic: &str,
    tp: TopicPartition,
    u: &mut Upstream,
    now: (Option<i64>, bool),
) -> Result<(), CommitError> {
    if u.published == Some(now) {
        return Ok(());
    }
    let what = match now {
        (Some(t), false) => t.to_string(),
        (_, true) => "idle".to_string(),
        (None, false) => return Ok(()),
    };
    let mark = format!("{topic}/{} {what}", tp.partition);
    for p in 0..to.1 {
        producer.send_watermark(to.0, p as i32, &mark)?;
    }
    u.published = Some(now);
    u.unpublished = 0;
    Ok(())
}
