//! Progress records: how a job whose input is not Kafka (a file run with a Kafka output)
//! learns, after a crash, whether its last transaction committed.
//!
//! Each of its transactions ends with one small record in a compacted progress topic,
//! keyed by the job's transactional id. The job notes the record's offset in its local
//! checkpoint before it commits; on recovery it reads the partition from that offset
//! under `read_committed`: the record is there if and only if the transaction committed
//! (librdkafka cannot commit a transaction begun by an earlier process, so the outcome
//! is read back rather than completed).

use super::{KafkaError, KafkaSettings, Reader};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// What reading a progress partition from an offset found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// The value of the record at the offset asked for, if it is committed and keyed as
    /// asked.
    pub at: Option<Vec<u8>>,
    /// The values of the committed records with the same key after it, in order.
    pub later: Vec<Vec<u8>>,
    /// The partition's first offset (older records were deleted by retention).
    pub low: i64,
    /// The partition's end when the read started.
    pub high: i64,
}

/// Reads partition `partition` of `topic` under `read_committed` from `offset` up to
/// the partition's end as it is when called — waiting, if a transaction of another
/// producer is still open below that end, until it is resolved (at most
/// `settings.timeout` without progress) — and returns the committed records keyed
/// `key` at and after `offset`. Call it after the job's own producer registered its
/// transactional id: that aborts whatever the job's previous process left open.
pub fn read_from(
    settings: &KafkaSettings,
    topic: &str,
    partition: i32,
    offset: i64,
    key: &[u8],
) -> Result<Found, KafkaError> {
    let mut c = settings.client_config();
    c.set("group.id", "sessionizer-progress")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10");
    let consumer: BaseConsumer<Reader> = settings
        .finish(c)
        .create_with_context(Reader("progress", settings.watch().clone()))
        .map_err(KafkaError::client("create the progress reader"))?;
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, settings.timeout)
        .map_err(|source| KafkaError::Unreachable {
            brokers: settings.brokers.clone(),
            timeout: settings.timeout,
            error: source,
        })?;
    let mut found = Found {
        low,
        high,
        ..Found::default()
    };
    if offset >= high {
        return Ok(found);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset.max(low)))
        .map_err(KafkaError::client(format!("read {topic}/{partition}")))?;
    consumer
        .assign(&tpl)
        .map_err(KafkaError::client(format!("read {topic}")))?;
    let position = |consumer: &BaseConsumer<Reader>| -> i64 {
        consumer
            .position()
            .ok()
            .and_then(|p| {
                p.find_partition(topic, partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    })
            })
            .unwrap_or(-1)
    };
    let mut last_progress = Instant::now();
    let mut at_end = false;
    loop {
        if at_end && position(&consumer) >= high {
            return Ok(found);
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if last_progress.elapsed() > settings.timeout {
                    return Err(KafkaError::Invalid(format!(
                        "reading the progress topic {topic}/{partition} up to offset {high} made no progress for {:?}: a transaction of another producer is still open there; try again later",
                        settings.timeout
                    )));
                }
            }
            Some(Err(ClientError::PartitionEOF(_))) => at_end = true,
            Some(Err(e)) => {
                return Err(KafkaError::Client {
                    what: format!("read the progress topic {topic}"),
                    error: e,
                });
            }
            Some(Ok(m)) => {
                last_progress = Instant::now();
                if m.key() == Some(key) {
                    let value = m.payload().unwrap_or_default().to_vec();
                    if m.offset() == offset {
                        found.at = Some(value);
                    } else if m.offset() > offset {
                        found.later.push(value);
                    }
                }
                if m.offset() + 1 >= high {
                    return Ok(found);
                }
            }
        }
    }
}
