//! The changelog: a compacted topic with one partition per input partition, holding
//! each task's state (docs/semantics.md K-2, K-3). Its records:
//!
//! | key | value |
//! | --- | --- |
//! | `s` + the session key | the key's state (the checkpoint codec), or a tombstone when the key has none left |
//! | `m` | the task's progress (JSON): next input offset, watermark, counters, options |
//!
//! Both are written in the same transaction as the output and the consumed offsets, so
//! reading a partition to its end under `read_committed` gives the task exactly as it
//! stood at its last commit. Compaction keeps the newest record of each key, so a full
//! restore reads each key about once.

use super::{KafkaError, KafkaSettings, Reader};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// The first byte of a changelog key that holds a session key's state.
pub const STATE_PREFIX: u8 = b's';
/// The changelog key of a task's progress record.
pub const META_KEY: &[u8] = b"m";

/// The changelog key for `key`'s state.
pub fn state_key(key: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(STATE_PREFIX);
    out.extend_from_slice(key);
}

/// One record of a changelog partition.
#[derive(Debug)]
pub enum Entry<'a> {
    /// A session key's state (`None`: removed).
    State {
        /// The session key.
        key: &'a [u8],
        /// Its encoded state.
        value: Option<&'a [u8]>,
    },
    /// The task's progress record.
    Meta(&'a [u8]),
}

/// What reading a changelog partition found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Records read.
    pub records: u64,
    /// Bytes of keys and values read.
    pub bytes: u64,
    /// The offset after the last record read (where a later read would go on).
    pub end_offset: i64,
}

/// Reads partition `partition` of changelog `topic` from `from` to its end — its last
/// stable offset, so records of a transaction still open are not read (and a restore
/// that follows a crashed owner sees only what that owner committed) — calling `apply`
/// for every record in order. An error of `apply` (a record the job cannot use) stops
/// the read: [`KafkaError::ChangelogDamaged`], naming the record.
pub fn read_to_end<E>(
    settings: &KafkaSettings,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    mut apply: impl FnMut(Entry<'_>) -> Result<(), E>,
) -> Result<ReadStats, KafkaError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut stats = read_many(settings, topic, &[(partition, from)], |_, e| apply(e))?;
    Ok(stats.remove(0))
}

/// Reads several partitions of changelog `topic` to their ends at once (as
/// [`read_to_end`] does one): `parts` are `(partition, from)`, and `apply` gets the
/// index in `parts` of each record's partition. One reader for all: a restore of many
/// partitions waits for the end of the slowest, not for the sum of them. Give `from`
/// as an offset when it is known (the partition's low watermark for a full read):
/// `None` makes librdkafka look the beginning up first, about half a second.
pub fn read_many<E>(
    settings: &KafkaSettings,
    topic: &str,
    parts: &[(i32, Option<i64>)],
    mut apply: impl FnMut(usize, Entry<'_>) -> Result<(), E>,
) -> Result<Vec<ReadStats>, KafkaError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut stats: Vec<ReadStats> = parts
        .iter()
        .map(|&(_, from)| ReadStats {
            end_offset: from.unwrap_or(0),
            ..ReadStats::default()
        })
        .collect();
    if parts.is_empty() {
        return Ok(stats);
    }
    let mut c = settings.client_config();
    c.set("group.id", "sessionizer-restore")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .set("queued.min.messages", "500000")
        .set("fetch.queue.backoff.ms", "5")
        .set("max.partition.fetch.bytes", "16777216");
    let consumer: BaseConsumer<Reader> = settings
        .finish(c)
        .create_with_context(Reader("changelog", settings.watch().clone()))
        .map_err(KafkaError::client("create the changelog reader"))?;
    let mut tpl = TopicPartitionList::new();
    for &(partition, from) in parts {
        let start = match from {
            Some(o) => Offset::Offset(o),
            None => Offset::Beginning,
        };
        tpl.add_partition_offset(topic, partition, start)
            .map_err(KafkaError::client(format!("read {topic}/{partition}")))?;
    }
    consumer
        .assign(&tpl)
        .map_err(KafkaError::client(format!("read {topic}")))?;
    let index = |partition: i32| parts.iter().position(|&(p, _)| p == partition);
    let mut ended = vec![false; parts.len()];
    let mut last_progress = Instant::now();
    while ended.iter().any(|e| !e) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if last_progress.elapsed() > settings.timeout {
                    let waiting: Vec<String> = parts
                        .iter()
                        .zip(&ended)
                        .filter(|(_, e)| !**e)
                        .map(|((p, _), _)| format!("{topic}/{p}"))
                        .collect();
                    return Err(KafkaError::Invalid(format!(
                        "reading the changelog made no progress for {:?} ({} not at its end); is the broker up?",
                        settings.timeout,
                        waiting.join(", ")
                    )));
                }
            }
            Some(Err(ClientError::PartitionEOF(p))) => {
                if let Some(i) = index(p) {
                    ended[i] = true;
                }
            }
            Some(Err(e)) => {
                return Err(KafkaError::Client {
                    what: format!("read the changelog {topic}"),
                    error: e,
                });
            }
            Some(Ok(m)) => {
                last_progress = Instant::now();
                let partition = m.partition();
                let Some(i) = index(partition) else { continue };
                let key = m.key().unwrap_or_default();
                let value = m.payload();
                let st = &mut stats[i];
                st.records += 1;
                st.bytes += (key.len() + value.map_or(0, <[u8]>::len)) as u64;
                st.end_offset = m.offset() + 1;
                let entry = match key.split_first() {
                    Some((&STATE_PREFIX, k)) => Entry::State { key: k, value },
                    _ if key == META_KEY => match value {
                        Some(v) => Entry::Meta(v),
                        None => continue,
                    },
                    _ => {
                        return Err(KafkaError::Invalid(format!(
                            "the changelog {topic}/{partition} holds a record at offset {} that sessionizer did not write (key {:?}); was the topic shared with another application?",
                            m.offset(),
                            String::from_utf8_lossy(key)
                        )));
                    }
                };
                apply(i, entry).map_err(|reason| KafkaError::ChangelogDamaged {
                    topic: topic.to_string(),
                    partition,
                    offset: m.offset(),
                    reason: Box::new(reason),
                })?;
            }
        }
    }
    Ok(stats)
}

/// A reader that follows several changelog partitions as they grow: the standby
/// replicas of tasks another process owns (docs/semantics.md K-3, `--standby-replicas`).
pub struct Tail {
    consumer: BaseConsumer<Reader>,
    /// What is followed: `(topic, partition)` → next offset to read (`None`: from the
    /// beginning).
    followed: std::collections::BTreeMap<(String, i32), Option<i64>>,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("followed", &self.followed)
            .finish()
    }
}

impl Tail {
    /// A reader following nothing yet.
    pub fn new(settings: &KafkaSettings) -> Result<Tail, KafkaError> {
        let mut c = settings.client_config();
        c.set("group.id", "sessionizer-standby")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.queue.backoff.ms", "5")
            .set("fetch.wait.max.ms", "100");
        let consumer: BaseConsumer<Reader> = settings
            .finish(c)
            .create_with_context(Reader("changelog", settings.watch().clone()))
            .map_err(KafkaError::client("create the standby reader"))?;
        Ok(Tail {
            consumer,
            followed: std::collections::BTreeMap::new(),
        })
    }

    /// Follows exactly these partitions from now on, each from the given position (the
    /// next offset its reader needs; `None`: from the beginning). The positions of the
    /// partitions already followed are those [`poll`](Self::poll) reported, so passing
    /// them back changes nothing; a partition given with another position (a copy
    /// started over) is read again from there.
    pub fn follow(&mut self, wanted: &[(String, i32, Option<i64>)]) -> Result<(), KafkaError> {
        let next: std::collections::BTreeMap<(String, i32), Option<i64>> = wanted
            .iter()
            .map(|(t, p, at)| ((t.clone(), *p), *at))
            .collect();
        if next == self.followed {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), at) in &next {
            let offset = match at {
                Some(o) => Offset::Offset(*o),
                None => Offset::Beginning,
            };
            tpl.add_partition_offset(t, *p, offset)
                .map_err(KafkaError::client(format!("follow {t}/{p}")))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(KafkaError::client("follow the standby changelogs"))?;
        self.followed = next;
        Ok(())
    }

    /// Applies up to `max` new records (`topic`, partition, offset, record), waiting at
    /// most `wait` for the first; returns how many.
    pub fn poll(
        &mut self,
        max: usize,
        wait: Duration,
        mut apply: impl FnMut(&str, i32, i64, Entry<'_>),
    ) -> Result<usize, KafkaError> {
        let mut n = 0;
        let mut timeout = wait;
        while n < max {
            match self.consumer.poll(timeout) {
                None => break,
                Some(Err(ClientError::PartitionEOF(_))) => {}
                Some(Err(e)) => {
                    return Err(KafkaError::Client {
                        what: "follow the standby changelogs".into(),
                        error: e,
                    });
                }
                Some(Ok(m)) => {
                    let key = m.key().unwrap_or_default();
                    let entry = match key.split_first() {
                        Some((&STATE_PREFIX, k)) => Entry::State {
                            key: k,
                            value: m.payload(),
                        },
                        _ if key == META_KEY => match m.payload() {
                            Some(v) => Entry::Meta(v),
                            None => continue,
                        },
                        _ => continue,
                    };
                    if let Some(at) = self
                        .followed
                        .get_mut(&(m.topic().to_string(), m.partition()))
                    {
                        *at = Some(m.offset() + 1);
                    }
                    apply(m.topic(), m.partition(), m.offset(), entry);
                    n += 1;
                }
            }
            timeout = Duration::ZERO;
        }
        Ok(n)
    }
}
