//! The input side: a member of a consumer group, or a plain consumer that assigns
//! partitions itself.
//!
//! Rebalances are not handled inside librdkafka's callback, which runs in the middle of
//! a `poll` where the job's state is out of reach. The callback only queues the event;
//! the job handles it between batches — commits the transaction that covers partitions
//! it is about to lose, restores the state of partitions it gains — and then completes
//! the rebalance with [`GroupConsumer::assign`] / [`GroupConsumer::unassign`].
//! librdkafka waits for that call (its "wait assign call" state), so no record of a
//! gained partition is fetched before its state is restored and its start offset set,
//! and none of a lost one is processed after its last commit.

use super::{KafkaError, KafkaSettings, TopicPartition};
use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::TopicPartitionListElem;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A change of the partitions this process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebalance {
    /// These partitions are now ours (incrementally, with the cooperative protocol).
    Assign(Vec<TopicPartition>),
    /// These partitions are being taken away; commit them, then call
    /// [`GroupConsumer::unassign`].
    Revoke(Vec<TopicPartition>),
    /// These partitions were lost without a clean hand-over (the session timed out):
    /// another member may already own them, so nothing of theirs may be committed.
    Lost(Vec<TopicPartition>),
}

/// Queues rebalance events for the job.
#[derive(Debug)]
pub struct GroupContext {
    topics: Vec<String>,
    events: Mutex<VecDeque<Rebalance>>,
    /// Set while the consumer closes: rebalances are then completed inside the callback
    /// (the job is no longer polling to do it).
    closing: AtomicBool,
    watch: super::security::ClientWatch,
}

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        super::security::forward_log(&self.watch, level, fac, message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        // The end of a partition is news for the job (it comes back from `poll`), not an
        // error; librdkafka reports it here too when the partition was assigned at its
        // end.
        let eof = matches!(
            error,
            ClientError::PartitionEOF(_) | ClientError::Global(RDKafkaErrorCode::PartitionEOF)
        );
        if !eof {
            super::security::log_error(&self.watch, &error, reason, "Kafka consumer");
        }
    }
}

impl GroupContext {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<TopicPartition> {
        tpl.elements()
            .iter()
            .filter_map(|e| {
                let topic = self.topics.iter().position(|t| t == e.topic())?;
                Some(TopicPartition {
                    topic: topic as u32,
                    partition: e.partition(),
                })
            })
            .collect()
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        if self.closing.load(Ordering::Acquire) {
            let _ = match err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                    consumer.incremental_assign(tpl)
                }
                _ => consumer.incremental_unassign(tpl),
            };
            return;
        }
        let event = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                Rebalance::Assign(self.partitions(tpl))
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                if consumer.assignment_lost() {
                    Rebalance::Lost(self.partitions(tpl))
                } else {
                    Rebalance::Revoke(self.partitions(tpl))
                }
            }
            _ => return,
        };
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(event);
    }
}

/// Where a newly assigned partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// At this offset (the committed position of the task).
    Offset(i64),
    /// At the first record still in the partition.
    Earliest,
    /// After the last record (only new records are read).
    Latest,
}

/// One record as read (its bytes stay in librdkafka's buffers while it lives).
pub struct Record<'a> {
    /// The partition it came from.
    pub from: TopicPartition,
    msg: BorrowedMessage<'a>,
}

impl std::fmt::Debug for Record<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("from", &self.from)
            .field("offset", &self.offset())
            .finish()
    }
}

impl Record<'_> {
    /// Its offset.
    pub fn offset(&self) -> i64 {
        self.msg.offset()
    }

    /// The record key, if any.
    pub fn key(&self) -> Option<&[u8]> {
        self.msg.key()
    }

    /// The record value; `None` for a tombstone.
    pub fn value(&self) -> Option<&[u8]> {
        self.msg.payload()
    }

    /// The value of header `name`, if the record has it.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        use rdkafka::message::Headers;
        self.msg
            .headers()?
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
    }
}

/// What one poll gave.
#[derive(Debug)]
pub enum Polled<'a> {
    /// A record.
    Record(Record<'a>),
    /// A partition reached the end of what is readable now (its last stable offset).
    End,
    /// Nothing within the timeout.
    Nothing,
}

/// A consumer group member (or a plain consumer) over the job's input topics, reading
/// `read_committed`.
pub struct GroupConsumer {
    consumer: Leavable,
    /// Rebalances handed to the job and not completed yet (partitions to assign, to
    /// unassign): completed on drop, or librdkafka's close would wait for them forever.
    outstanding: Mutex<(Vec<TopicPartition>, Vec<TopicPartition>)>,
    topics: Vec<String>,
    settings: KafkaSettings,
    group: Option<String>,
}

impl std::fmt::Debug for GroupConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupConsumer")
            .field("topics", &self.topics)
            .field("group", &self.group)
            .finish()
    }
}

impl GroupConsumer {
    /// A member of `group` that will subscribe to `topics` (cooperative-sticky), or with
    /// `group = None` a consumer that is assigned partitions by the job. Offsets are
    /// never auto-committed: they are committed in the job's transactions.
    ///
    /// Members are dynamic, not static (KIP-345), whatever the process's instance id
    /// (which names its transactional producer): a static member killed in the middle
    /// of a cooperative rebalance — after giving up partitions for another member,
    /// before rejoining for the second round that hands them over — and restarted
    /// within the session timeout is given back its cached assignment without that
    /// round, and the partitions it gave up stay with nobody until some other member
    /// joins or leaves (seen with Kafka 4.1 and librdkafka 2.12: a `--stop-at-end` group
    /// then waited forever). A dynamic member's death is a rebalance of its own, once the
    /// group's session timeout (10 s) passes.
    pub fn new(
        settings: &KafkaSettings,
        topics: &[String],
        group: Option<&str>,
        client_id: &str,
    ) -> Result<GroupConsumer, KafkaError> {
        let mut c = settings.client_config();
        c.set("client.id", client_id);
        c.set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            // Fetch in large blocks: a record is a few hundred bytes.
            .set("fetch.min.bytes", "1")
            .set("fetch.wait.max.ms", "50")
            // Prefetch: up to 8 MiB per partition (the default 64 MiB per partition
            // makes a 4-partition job hold 256 MiB of records it has not asked for; 16
            // MiB took a 1M-record run to 161-185 MiB of peak RSS, 8 MiB to 123-138 MiB
            // at the same speed, BENCHMARKS.md).
            .set("queued.min.messages", "100000")
            .set("queued.max.messages.kbytes", "8192")
            // When the prefetch queue is full, fetch again soon after it drains (the
            // default waits a whole second, which starves a fast consumer).
            .set("fetch.queue.backoff.ms", "5")
            .set("max.partition.fetch.bytes", "4194304")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000");
        // A group id is always needed by librdkafka; without a group it is never used.
        c.set("group.id", group.unwrap_or("sessionizer-unused"));
        let context = GroupContext {
            topics: topics.to_vec(),
            events: Mutex::new(VecDeque::new()),
            closing: AtomicBool::new(false),
            watch: settings.watch().clone(),
        };
        let consumer: BaseConsumer<GroupContext> = settings
            .finish(c)
            .create_with_context(context)
            .map_err(KafkaError::client("create the consumer"))?;
        Ok(GroupConsumer {
            consumer: Leavable(Some(consumer)),
            outstanding: Mutex::new((Vec::new(), Vec::new())),
            topics: topics.to_vec(),
            settings: settings.clone(),
            group: group.map(str::to_string),
        })
    }

    /// The input topics, in the order their [`TopicPartition::topic`] indexes.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Joins the group: partitions arrive as [`Rebalance::Assign`] events.
    pub fn subscribe(&self) -> Result<(), KafkaError> {
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        self.consumer
            .subscribe(&names)
            .map_err(KafkaError::client("subscribe to the input topics"))
    }

    /// The rebalance events queued since the last call, oldest first.
    pub fn take_rebalances(&self) -> Vec<Rebalance> {
        let events: Vec<Rebalance> = self
            .consumer
            .context()
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .collect();
        let mut outstanding = self.outstanding();
        for e in &events {
            match e {
                Rebalance::Assign(p) => outstanding.0.extend_from_slice(p),
                Rebalance::Revoke(p) | Rebalance::Lost(p) => outstanding.1.extend_from_slice(p),
            }
        }
        events
    }

    fn outstanding(&self) -> std::sync::MutexGuard<'_, (Vec<TopicPartition>, Vec<TopicPartition>)> {
        self.outstanding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether rebalance events wait to be handled.
    pub fn rebalance_pending(&self) -> bool {
        !self
            .consumer
            .context()
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    fn tpl(
        &self,
        parts: &[(TopicPartition, Option<StartAt>)],
    ) -> Result<TopicPartitionList, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (tp, start) in parts {
            let topic = &self.topics[tp.topic as usize];
            let offset = match start {
                None => Offset::Invalid,
                Some(StartAt::Offset(o)) => Offset::Offset(*o),
                Some(StartAt::Earliest) => Offset::Beginning,
                Some(StartAt::Latest) => Offset::End,
            };
            tpl.add_partition_offset(topic, tp.partition, offset)
                .map_err(KafkaError::client(format!(
                    "assign {topic}/{}",
                    tp.partition
                )))?;
        }
        Ok(tpl)
    }

    /// Starts reading these partitions, each from its position (completes an
    /// [`Rebalance::Assign`] in a group; a plain consumer adds them).
    pub fn assign(&self, parts: &[(TopicPartition, StartAt)]) -> Result<(), KafkaError> {
        let with: Vec<_> = parts.iter().map(|&(tp, s)| (tp, Some(s))).collect();
        let tpl = self.tpl(&with)?;
        self.outstanding()
            .0
            .retain(|tp| !parts.iter().any(|(p, _)| p == tp));
        self.consumer
            .incremental_assign(&tpl)
            .map_err(KafkaError::client("assign partitions"))
    }

    /// Stops reading these partitions (completes a [`Rebalance::Revoke`] or
    /// [`Rebalance::Lost`]).
    pub fn unassign(&self, parts: &[TopicPartition]) -> Result<(), KafkaError> {
        let with: Vec<_> = parts.iter().map(|&tp| (tp, None)).collect();
        let tpl = self.tpl(&with)?;
        self.outstanding().1.retain(|tp| !parts.contains(tp));
        self.consumer
            .incremental_unassign(&tpl)
            .map_err(KafkaError::client("unassign partitions"))
    }

    /// Whether the cluster answers a metadata request about the first topic within
    /// `timeout` (a job or source waiting for its brokers asks this).
    pub fn answers(&self, timeout: Duration) -> bool {
        self.consumer
            .fetch_metadata(self.topics.first().map(String::as_str), timeout)
            .is_ok()
    }

    /// Rebalances handed to the job and not completed yet: the partitions the group gave
    /// it that it has not started reading (no [`GroupConsumer::assign`] yet), and those
    /// taken away that it has not let go (no [`GroupConsumer::unassign`] yet). A job whose
    /// step failed in the middle of a rebalance finishes it from these.
    pub fn unfinished(&self) -> (Vec<TopicPartition>, Vec<TopicPartition>) {
        self.outstanding().clone()
    }

    /// The partitions of the job's topics this consumer has assigned now, from the
    /// client's own state: no round trip.
    pub fn assigned(&self) -> Result<Vec<TopicPartition>, KafkaError> {
        let tpl = self
            .consumer
            .assignment()
            .map_err(KafkaError::client("read the consumer's assignment"))?;
        Ok(tpl
            .elements()
            .iter()
            .filter_map(|e| {
                let topic = self.topics.iter().position(|t| t == e.topic())?;
                Some(TopicPartition {
                    topic: topic as u32,
                    partition: e.partition(),
                })
            })
            .collect())
    }

    /// Moves the read position of an assigned partition (records fetched beyond it are
    /// dropped): a task rewound to its last commit reads on from there.
    pub fn seek(&self, tp: TopicPartition, offset: i64) -> Result<(), KafkaError> {
        let topic = &self.topics[tp.topic as usize];
        self.consumer
            .seek(
                topic,
                tp.partition,
                Offset::Offset(offset),
                self.settings.timeout,
            )
            .map_err(KafkaError::client(format!(
                "seek {topic}/{} to {offset}",
                tp.partition
            )))
    }

    /// The group's committed offsets of these partitions (`None`: never committed).
    /// Under `read_committed` the broker answers only once no transaction that commits
    /// offsets for them is pending (KIP-447), so the answer is stable: a crashed
    /// owner's open transaction is first aborted (after its timeout) or committed.
    pub fn committed(&self, parts: &[TopicPartition]) -> Result<Vec<Option<i64>>, KafkaError> {
        Ok(self
            .committed_with_metadata(parts)?
            .into_iter()
            .map(|c| c.map(|(o, _)| o))
            .collect())
    }

    /// [`committed`](Self::committed), with the metadata string committed beside each
    /// offset.
    pub fn committed_with_metadata(
        &self,
        parts: &[TopicPartition],
    ) -> Result<Vec<Option<(i64, String)>>, KafkaError> {
        let with: Vec<_> = parts.iter().map(|&tp| (tp, None)).collect();
        let began = std::time::Instant::now();
        // While a transaction that commits offsets for a partition is open, the broker
        // answers UNSTABLE_OFFSET_COMMIT for it (and no offset). librdkafka retries that
        // answer within its request timeout, but a partition can still come back with
        // the error beside an empty offset, which must not be taken for "never
        // committed": the open transaction may be committing, and a task started from
        // the changelog as it stands would process its records again. So ask until
        // every answer is stable (a dead owner's transaction is aborted after its
        // timeout) or `settings.timeout` passes; any other error is an error.
        let got = loop {
            let tpl = self.tpl(&with)?;
            let got = self
                .consumer
                .committed_offsets(tpl, self.settings.timeout)
                .map_err(KafkaError::client("read the group's committed offsets"))?;
            let mut unstable = Vec::new();
            for e in got.elements() {
                match e.error() {
                    Ok(()) => {}
                    Err(ClientError::OffsetFetch(RDKafkaErrorCode::UnstableOffsetCommit)) => {
                        unstable.push(format!("{}/{}", e.topic(), e.partition()));
                    }
                    Err(source) => {
                        return Err(KafkaError::Client {
                            what: format!(
                                "read the group's committed offset of {}/{}",
                                e.topic(),
                                e.partition()
                            ),
                            error: source,
                        });
                    }
                }
            }
            if unstable.is_empty() {
                break got;
            }
            if began.elapsed() > self.settings.timeout {
                return Err(KafkaError::Invalid(format!(
                    "the committed offsets of {} stayed unstable for {:?}: a transaction that commits them is still open; is its producer stuck, or --kafka-transaction-timeout longer than --kafka-timeout?",
                    unstable.join(", "),
                    self.settings.timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(parts
            .iter()
            .map(|tp| {
                let topic = &self.topics[tp.topic as usize];
                got.find_partition(topic, tp.partition)
                    .and_then(|e: TopicPartitionListElem<'_>| match e.offset() {
                        Offset::Offset(o) => Some((o, e.metadata().to_string())),
                        _ => None,
                    })
            })
            .collect())
    }

    /// The group metadata for a transaction's offset commit (fences zombies: a member
    /// that lost its partitions cannot commit offsets for them).
    pub fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        self.consumer.group_metadata()
    }

    /// Builds the offsets list of a commit: `(partition, next offset to read, metadata)`.
    pub fn offsets(
        &self,
        next: &[(TopicPartition, i64, &str)],
    ) -> Result<TopicPartitionList, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for &(tp, offset, metadata) in next {
            let topic = &self.topics[tp.topic as usize];
            let mut e = tpl.add_partition(topic, tp.partition);
            e.set_offset(Offset::Offset(offset))
                .map_err(KafkaError::client(format!(
                    "commit {topic}/{}",
                    tp.partition
                )))?;
            e.set_metadata(metadata);
        }
        Ok(tpl)
    }

    /// The next record, an end-of-partition notice, or nothing within `timeout`.
    /// Rebalance events are queued during the call (see [`take_rebalances`](Self::take_rebalances)).
    pub fn poll(&self, timeout: Duration) -> Result<Polled<'_>, KafkaError> {
        // A wrong password or certificate is retried by librdkafka as if the broker
        // were away; it ends the job instead.
        self.settings.check()?;
        match self.consumer.poll(timeout) {
            None => Ok(Polled::Nothing),
            Some(Ok(m)) => Ok(Polled::Record(self.record(m))),
            Some(Err(ClientError::PartitionEOF(_))) => Ok(Polled::End),
            Some(Err(e)) => Err(KafkaError::Client {
                what: "read the input".into(),
                error: e,
            }),
        }
    }

    fn record<'a>(&self, msg: BorrowedMessage<'a>) -> Record<'a> {
        let topic = self
            .topics
            .iter()
            .position(|t| t == msg.topic())
            .unwrap_or(0) as u32;
        Record {
            from: TopicPartition {
                topic,
                partition: msg.partition(),
            },
            msg,
        }
    }

    /// This process's read position in each of these partitions (the next offset it
    /// will hand out), from the client's own state: no round trip.
    pub fn positions(&self, parts: &[TopicPartition]) -> Result<Vec<Option<i64>>, KafkaError> {
        let got = self
            .consumer
            .position()
            .map_err(KafkaError::client("read the consumer's positions"))?;
        Ok(parts
            .iter()
            .map(|tp| {
                got.find_partition(&self.topics[tp.topic as usize], tp.partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    })
            })
            .collect())
    }

    /// The members of the group and the partitions each holds (in the generation the
    /// group last completed), from the group coordinator.
    pub fn members(&self) -> Result<Vec<Member>, KafkaError> {
        let Some(group) = &self.group else {
            return Ok(Vec::new());
        };
        let list = self
            .consumer
            .fetch_group_list(Some(group), self.settings.timeout)
            .map_err(KafkaError::client(format!("describe group {group}")))?;
        let mut out = Vec::new();
        for g in list.groups().iter().filter(|g| g.name() == group) {
            for m in g.members() {
                let partitions = m
                    .assignment()
                    .map(decode_assignment)
                    .transpose()
                    .map_err(|reason| KafkaError::Assignment {
                        member: m.client_id().to_string(),
                        group: group.clone(),
                        reason,
                    })?
                    .unwrap_or_default();
                out.push(Member {
                    client_id: m.client_id().to_string(),
                    partitions: partitions
                        .into_iter()
                        .filter_map(|(t, p)| {
                            let topic = self.topics.iter().position(|x| *x == t)?;
                            Some(TopicPartition {
                                topic: topic as u32,
                                partition: p,
                            })
                        })
                        .collect(),
                });
            }
        }
        Ok(out)
    }

    /// Leaves the group cleanly: rebalances from here on complete inside librdkafka.
    pub fn close(&mut self) {
        self.consumer.unsubscribe();
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        // librdkafka's close (when the inner consumer drops, also on an error path)
        // revokes the assignment and waits for the revocation to be completed: from
        // now on the callback completes it itself. A rebalance handed to the job and
        // not completed (the job stopped on an error) is completed first.
        self.consumer
            .context()
            .closing
            .store(true, Ordering::Release);
        let (assign, unassign) = std::mem::take(&mut *self.outstanding());
        if !assign.is_empty() {
            let with: Vec<_> = assign.iter().map(|&tp| (tp, None)).collect();
            if let Ok(tpl) = self.tpl(&with) {
                let _ = self.consumer.incremental_assign(&tpl);
            }
        }
        if !unassign.is_empty() {
            let with: Vec<_> = unassign.iter().map(|&tp| (tp, None)).collect();
            if let Ok(tpl) = self.tpl(&with) {
                let _ = self.consumer.incremental_unassign(&tpl);
            }
        }
        // A member of a group leaves it before it goes: librdkafka's close (on the inner
        // consumer's drop) revokes the assignment and tells the coordinator. With the
        // cluster gone (a job that ends because it stayed away) that could wait for as
        // long as it stays away: then the close is started here and given a bounded
        // time, and otherwise abandoned — the process is ending, and the group notices
        // the member's absence by its session timeout.
        if self.group.is_some() && !self.answers(CLOSE_PROBE) && self.consumer.close_queue().is_ok()
        {
            let deadline = std::time::Instant::now() + CLOSE_TIMEOUT;
            while !self.consumer.closed() {
                if std::time::Instant::now() > deadline {
                    tracing::warn!(
                        waited = ?CLOSE_TIMEOUT,
                        "the Kafka consumer could not leave its group in time; the group will notice by its session timeout"
                    );
                    // Its drop would wait for the close again: it is never dropped.
                    std::mem::forget(self.consumer.0.take());
                    return;
                }
                let _ = self.consumer.poll(Duration::from_millis(100));
            }
        }
    }
}

/// The librdkafka consumer of a [`GroupConsumer`]; always there, but for the end of a
/// drop that gave up waiting for it to leave its group.
struct Leavable(Option<BaseConsumer<GroupContext>>);

impl std::ops::Deref for Leavable {
    type Target = BaseConsumer<GroupContext>;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("the consumer is there until its drop")
    }
}

/// How long a consumer may take to leave its group when it is dropped and the cluster
/// does not answer.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a dropped consumer asks the cluster whether it answers.
const CLOSE_PROBE: Duration = Duration::from_secs(2);

/// A member of the consumer group, as the coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its `client.id` (sessionizer makes it unique per process).
    pub client_id: String,
    /// The input partitions it holds.
    pub partitions: Vec<TopicPartition>,
}

/// Why a consumer protocol assignment does not decode ([`decode_assignment`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    /// The bytes end before the last field.
    #[error("truncated")]
    Truncated,
    /// A topic name is not UTF-8.
    #[error("topic name is not UTF-8")]
    TopicName,
}

/// Decodes a consumer protocol assignment (versions 0 to 3 share the layout):
/// `version:i16, [topic:string, [partition:i32]], user_data:bytes`.
pub fn decode_assignment(bytes: &[u8]) -> Result<Vec<(String, i32)>, AssignmentError> {
    struct R<'a>(&'a [u8]);
    impl R<'_> {
        fn take(&mut self, n: usize) -> Result<&[u8], AssignmentError> {
            if self.0.len() < n {
                return Err(AssignmentError::Truncated);
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Ok(a)
        }
        fn i16(&mut self) -> Result<i16, AssignmentError> {
            let b = self.take(2)?;
            Ok(i16::from_be_bytes([b[0], b[1]]))
        }
        fn i32(&mut self) -> Result<i32, AssignmentError> {
            let b = self.take(4)?;
            Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        }
    }
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = R(bytes);
    let _version = r.i16()?;
    let topics = r.i32()?;
    let mut out = Vec::new();
    for _ in 0..topics.max(0) {
        let len = r.i16()?;
        let name = String::from_utf8(r.take(len.max(0) as usize)?.to_vec())
            .map_err(|_| AssignmentError::TopicName)?;
        let n = r.i32()?;
        for _ in 0..n.max(0) {
            out.push((name.clone(), r.i32()?));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::decode_assignment;

    #[test]
    fn an_assignment_decodes_topics_and_partitions() {
        // version 1, two topics: "ab" [0, 3], "c" [2], user data of 2 bytes.
        let mut b = vec![0, 1, 0, 0, 0, 2];
        b.extend_from_slice(&[0, 2, b'a', b'b', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3]);
        b.extend_from_slice(&[0, 1, b'c', 0, 0, 0, 1, 0, 0, 0, 2]);
        b.extend_from_slice(&[0, 0, 0, 2, 9, 9]);
        assert_eq!(
            decode_assignment(&b).expect("decodes"),
            vec![
                ("ab".to_string(), 0),
                ("ab".to_string(), 3),
                ("c".to_string(), 2)
            ]
        );
        assert_eq!(
            decode_assignment(&b[..9]),
            Err(super::AssignmentError::Truncated)
        );
        assert_eq!(decode_assignment(&[]).expect("empty"), vec![]);
    }
}
