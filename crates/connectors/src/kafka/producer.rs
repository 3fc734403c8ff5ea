//! The output side: one transactional producer per process (docs/semantics.md K-2).
//!
//! Every commit of the job is one Kafka transaction: the session records, the late and
//! dead-letter records, the changelog records of every task's state changes and the
//! consumed offsets. A `read_committed` reader sees all of a commit or nothing of it.
//! The transactional id names the process: a restarted process with the same id fences
//! its predecessor and aborts whatever transaction it left open.

use super::{KafkaError, KafkaSettings};
use rdkafka::ClientContext;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::topic_partition_list::TopicPartitionList;
use sessionizer_core::json::{
    Extractor, FieldPath, JsonKind, Span, kind, string_content, unescape_string,
};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counts failed deliveries; a failed delivery fails the transaction's commit, and the
/// first error is kept to say why.
#[derive(Debug, Default)]
pub struct DeliveryContext {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// The offsets of delivered records sent with a tracking tag, by tag.
    tracked: Mutex<std::collections::HashMap<usize, i64>>,
    watch: super::security::ClientWatch,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        super::security::forward_log(&self.watch, level, fac, message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        super::security::log_error(&self.watch, &error, reason, "Kafka producer");
    }
}

impl DeliveryContext {
    fn new(settings: &KafkaSettings) -> DeliveryContext {
        DeliveryContext {
            failed: AtomicU64::new(0),
            first_error: Mutex::new(None),
            tracked: Mutex::new(std::collections::HashMap::new()),
            watch: settings.watch().clone(),
        }
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: usize) {
        if let (Ok(m), true) = (result, tag != 0) {
            use rdkafka::message::Message;
            self.tracked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(tag, m.offset());
        }
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let mut first = self
                .first_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if first.is_none() {
                *first = Some(e.to_string());
            }
        }
    }
}

/// Why a commit failed, and what the job must do about it.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The transaction was aborted (its records are invisible to `read_committed`
    /// readers): the job must rewind its tasks to the last commit and go on.
    #[error("the transaction was aborted: {0}")]
    Aborted(String),
    /// The producer can no longer be used (another process with the same transactional
    /// id took over, or the broker refused it): the process must stop.
    #[error("{0}")]
    Fatal(String),
    /// The cluster did not answer in time, or aborted the transaction because it stayed
    /// open longer than the transaction timeout (the coordinator then fences the
    /// producer's epoch: no other process is involved). Nothing of the transaction is
    /// visible; a new producer with the same transactional id settles what this one
    /// left open, and the job rewinds its tasks once the cluster answers again.
    #[error("Kafka did not answer: {0}")]
    Unavailable(String),
}

/// How much longer than the client's timeout a transaction's offsets may take before
/// the producer is taken for stuck (see `add_offsets`).
const OFFSETS_GRACE: Duration = Duration::from_secs(5);

/// The transactional producer of one process.
pub struct TxnProducer {
    /// Shared with the thread that adds a transaction's offsets (see
    /// [`add_offsets`]) and the one committing ([`start_commit`](Self::start_commit)),
    /// which may outlive a call that waited too long.
    producer: std::sync::Arc<BaseProducer<DeliveryContext>>,
    timeout: Duration,
    /// How long the coordinator lets a transaction stay open.
    transaction_timeout: Duration,
    id: String,
    in_txn: bool,
    /// When the open transaction began.
    began: Option<std::time::Instant>,
    /// The open transaction's commit, running on a thread of its own
    /// ([`start_commit`](Self::start_commit)): nothing is sent until it is finished.
    committing: Option<std::thread::JoinHandle<Committed>>,
    /// Commits started on a thread so far (the test hook counts them).
    #[cfg(feature = "fault-injection")]
    started: u64,
}

/// How a commit on its own thread ended, and when.
type Committed = (Result<(), CommitError>, std::time::Instant);

/// The librdkafka producer under a [`TxnProducer`].
type TxnClient = BaseProducer<DeliveryContext>;

impl std::fmt::Debug for TxnProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnProducer")
            .field("transactional_id", &self.id)
            .field("in_txn", &self.in_txn)
            .finish()
    }
}

/// A header that marks a tombstone as a retraction (docs/semantics.md K-7).
pub const RETRACT_HEADER: &str = "retract";
/// The header of a re-keyed record that names where it was read first.
pub const SOURCE_HEADER: &str = "source";
/// The header of a watermark record of a re-keying job: `topic/partition time`, the
/// largest event time forwarded from that input partition so far, or `topic/partition
/// idle` (the record has no key and no value).
pub const WATERMARK_HEADER: &str = "sessionizer-watermark";

impl TxnProducer {
    /// Creates the producer with `transactional_id` and registers it with the broker's
    /// transaction coordinator, which fences any earlier producer with the same id and
    /// aborts its open transaction.
    pub fn new(
        settings: &KafkaSettings,
        transactional_id: &str,
        transaction_timeout: Duration,
    ) -> Result<TxnProducer, KafkaError> {
        let mut c = settings.client_config();
        c.set("transactional.id", transactional_id)
            .set(
                "transaction.timeout.ms",
                transaction_timeout.as_millis().to_string(),
            )
            .set("linger.ms", "5")
            // The coordinator answers a transaction's first requests with "concurrent
            // transactions" while it still writes the previous commit's markers; the
            // default 100 ms before asking again was most of a short commit's time.
            // (Later retries back off exponentially up to retry.backoff.max.ms.)
            .set("retry.backoff.ms", "10")
            .set("batch.size", "1000000")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576")
            .set("message.max.bytes", "10000000");
        let producer: BaseProducer<DeliveryContext> = settings
            .finish(c)
            .create_with_context(DeliveryContext::new(settings))
            .map_err(KafkaError::client("create the transactional producer"))?;
        producer
            .init_transactions(settings.timeout)
            .map_err(|source| match &source {
                _ if settings.check().is_err() => settings.check().expect_err("noted"),
                ClientError::Transaction(e) if e.code() == RDKafkaErrorCode::MessageTimedOut => {
                    KafkaError::Unreachable {
                        brokers: settings.brokers.clone(),
                        timeout: settings.timeout,
                        error: source,
                    }
                }
                _ => KafkaError::Client {
                    what: format!("register transactional id {transactional_id}"),
                    error: source,
                },
            })?;
        Ok(TxnProducer {
            producer: std::sync::Arc::new(producer),
            timeout: settings.timeout,
            transaction_timeout,
            id: transactional_id.to_string(),
            in_txn: false,
            began: None,
            committing: None,
            #[cfg(feature = "fault-injection")]
            started: 0,
        })
    }

    /// The transactional id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Opens a transaction if none is open.
    pub fn begin(&mut self) -> Result<(), CommitError> {
        self.not_committing()?;
        if !self.in_txn {
            self.producer.begin_transaction().map_err(classify)?;
            self.in_txn = true;
            self.began = Some(std::time::Instant::now());
        }
        Ok(())
    }

    /// Sends one record in the open transaction (opening one if needed). `value: None`
    /// is a tombstone; `retract` adds the `retract: true` header.
    pub fn send(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        retract: bool,
    ) -> Result<(), CommitError> {
        self.send_tracked(topic, partition, key, value, retract, 0)
    }

    /// [`send`](Self::send), remembering the record's offset under `tag` (non-zero)
    /// once it is delivered: see [`take_tracked`](Self::take_tracked).
    pub fn send_tracked(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        retract: bool,
        tag: usize,
    ) -> Result<(), CommitError> {
        self.send_full(topic, partition, key, value, retract, None, tag)
    }

    /// [`send`](Self::send) with a `source` header (a re-keyed record's origin,
    /// `topic/partition@offset`).
    pub fn send_with_source(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        source: &str,
    ) -> Result<(), CommitError> {
        self.send_full(
            topic,
            partition,
            key,
            value,
            false,
            Some((SOURCE_HEADER, source)),
            0,
        )
    }

    /// A watermark record (no key, no value, a [`WATERMARK_HEADER`] saying `what`) to
    /// `partition` of `topic`, in the open transaction.
    pub fn send_watermark(
        &mut self,
        topic: &str,
        partition: i32,
        what: &str,
    ) -> Result<(), CommitError> {
        self.send_full(
            topic,
            Some(partition),
            None,
            None,
            false,
            Some((WATERMARK_HEADER, what)),
            0,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn send_full(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        retract: bool,
        header: Option<(&str, &str)>,
        tag: usize,
    ) -> Result<(), CommitError> {
        self.begin()?;
        let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(topic, tag);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        if retract {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: RETRACT_HEADER,
                value: Some("true"),
            }));
        }
        if let Some((key, value)) = header {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key,
                value: Some(value),
            }));
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.producer.poll(Duration::from_millis(5));
                }
                // The transaction failed in the background (a record of it could
                // not be delivered, its coordinator went away): it can only be aborted.
                Err((ClientError::MessageProduction(RDKafkaErrorCode::State), _)) => {
                    return Err(self.with_delivery_error(CommitError::Aborted(
                        "the transaction failed before this record was sent".into(),
                    )));
                }
                // A record the producer refuses (too large, an unknown partition) is
                // refused again by a retry; a fatal producer error stays fatal, unless
                // the coordinator raised it because the transaction outlived its timeout.
                Err((ClientError::MessageProduction(RDKafkaErrorCode::Fatal), _)) => {
                    let why = self.producer.client().fatal_error().map_or_else(
                        || "a fatal error".to_string(),
                        |(code, reason)| format!("{code:?}: {reason}"),
                    );
                    return Err(self.expired(CommitError::Fatal(format!(
                        "the transactional producer was fenced or failed ({why}); another process may have taken over this instance's transactional id"
                    ))));
                }
                Err((e @ ClientError::MessageProduction(_), _)) => {
                    return Err(self.expired(CommitError::Fatal(format!(
                        "a record to {topic} was refused: {e}"
                    ))));
                }
                Err((e, _)) => return Err(self.expired(classify(e))),
            }
        }
    }

    /// The offsets of the tracked records delivered since the last call, by tag. After a
    /// successful [`commit`](Self::commit) every tracked record of it is here.
    pub fn take_tracked(&self) -> std::collections::HashMap<usize, i64> {
        std::mem::take(
            &mut *self
                .producer
                .context()
                .tracked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Serves delivery reports; call now and then while sending.
    pub fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Whether a transaction is open (something was sent since the last commit).
    pub fn in_transaction(&self) -> bool {
        self.in_txn
    }

    /// Waits until every record sent so far is delivered — written and acknowledged by
    /// the brokers, still invisible to `read_committed` readers until the commit — and
    /// fails if one was not. Afterwards [`take_tracked`](Self::take_tracked) has the
    /// offsets of every tracked record sent. The first phase of a two-phase commit.
    pub fn flush(&mut self) -> Result<(), CommitError> {
        self.not_committing()?;
        let left = drain(&self.producer, self.timeout);
        self.producer.flush(left).map_err(classify)?;
        let failed = self.producer.context().failed.load(Ordering::Relaxed);
        if failed > 0 {
            return Err(self.with_delivery_error(CommitError::Aborted(format!(
                "{failed} records of the transaction were not delivered"
            ))));
        }
        Ok(())
    }

    /// Commits the open transaction, waiting for it, with no consumed offsets in it (a
    /// job without a consumer group, or one that commits no offsets; a group's offsets
    /// go through [`start_commit`](Self::start_commit)). On error the transaction is
    /// aborted (or the producer is dead); either way nothing of it is visible.
    pub fn commit(&mut self) -> Result<(), CommitError> {
        self.begin()?;
        let result = commit_on(&self.producer, self.timeout, None);
        self.ended((result, std::time::Instant::now()))
    }

    /// Commits the open transaction with the consumed `offsets` of a group (`None`:
    /// none) on a thread of its own, so that the caller can go on with its next batch
    /// meanwhile; [`finish_commit`](Self::finish_commit) waits for it and says how it
    /// ended. Until then nothing can be sent (the producer has one
    /// transaction at a time): the caller holds what it has to send.
    pub fn start_commit(
        &mut self,
        offsets: Option<(TopicPartitionList, ConsumerGroupMetadata)>,
    ) -> Result<(), CommitError> {
        self.begin()?;
        let producer = std::sync::Arc::clone(&self.producer);
        let timeout = self.timeout;
        #[cfg(feature = "fault-injection")]
        let refuse = {
            self.started += 1;
            refuse_commit(self.started)
        };
        let thread = std::thread::Builder::new()
            .name("sessionizer-txn-commit".into())
            .spawn(move || {
                #[cfg(feature = "fault-injection")]
                if refuse {
                    // The caller goes on with its next batch meanwhile.
                    std::thread::sleep(Duration::from_millis(200));
                    let refused = CommitError::Aborted(format!(
                        "{REFUSE_COMMIT_ENV}: the test hook refused this commit"
                    ));
                    return (Err(refused), std::time::Instant::now());
                }
                let result = commit_on(&producer, timeout, offsets);
                (result, std::time::Instant::now())
            })
            .map_err(|e| CommitError::Fatal(format!("cannot start a thread: {e}")))?;
        self.committing = Some(thread);
        Ok(())
    }

    /// Whether a commit started by [`start_commit`](Self::start_commit) is still to be
    /// finished.
    pub fn committing(&self) -> bool {
        self.committing.is_some()
    }

    /// Whether that commit has ended ([`finish_commit`](Self::finish_commit) then does
    /// not wait).
    pub fn commit_ended(&self) -> bool {
        self.committing
            .as_ref()
            .is_some_and(std::thread::JoinHandle::is_finished)
    }

    /// Waits for the commit started by [`start_commit`](Self::start_commit): its outcome,
    /// as [`commit`](Self::commit)'s.
    pub fn finish_commit(&mut self) -> Result<(), CommitError> {
        let Some(thread) = self.committing.take() else {
            return Err(CommitError::Fatal(
                "no commit was started on a thread".to_string(),
            ));
        };
        let ended = thread.join().unwrap_or_else(|_| {
            let stopped = CommitError::Fatal(
                "the thread committing the transaction stopped unexpectedly".to_string(),
            );
            (Err(stopped), std::time::Instant::now())
        });
        self.ended(ended)
    }

    /// The transaction after its commit ended with `result` at `at`.
    fn ended(&mut self, (result, at): Committed) -> Result<(), CommitError> {
        let result = result.map_err(|e| self.expired_at(e, at));
        self.in_txn = false;
        match result {
            Ok(()) => Ok(()),
            Err(CommitError::Aborted(why)) => {
                // The transaction cannot be committed (a rebalance moved the group on,
                // a record was refused, the broker timed out): abort it, so that the
                // producer can begin the next one.
                self.abort_now()?;
                Err(self.with_delivery_error(CommitError::Aborted(why)))
            }
            Err(e) => Err(self.with_delivery_error(e)),
        }
    }

    /// Refuses to go on while a commit runs on its thread: a record sent now would join
    /// the transaction being committed, or none.
    fn not_committing(&self) -> Result<(), CommitError> {
        match self.committing {
            Some(_) => Err(CommitError::Fatal(
                "a record was sent while the previous transaction was being committed".to_string(),
            )),
            None => Ok(()),
        }
    }

    /// Aborts the open transaction, if any.
    pub fn abort(&mut self) -> Result<(), CommitError> {
        self.not_committing()?;
        if self.in_txn {
            self.in_txn = false;
            self.abort_now()?;
        }
        Ok(())
    }

    /// Aborts the current transaction, retrying while librdkafka says it may.
    fn abort_now(&mut self) -> Result<(), CommitError> {
        let began = std::time::Instant::now();
        loop {
            // Delivery reports of the records in flight must be served first (this
            // producer is polled by the job, not by a thread of its own).
            drain(&self.producer, self.timeout);
            match self.producer.abort_transaction(self.timeout) {
                Ok(()) => {
                    // Deliveries that failed, and the offsets of tracked records,
                    // belonged to the aborted transaction; the next one starts clean.
                    self.producer.context().failed.store(0, Ordering::Relaxed);
                    self.take_tracked();
                    return Ok(());
                }
                Err(ClientError::Transaction(t)) if t.is_fatal() => {
                    return Err(self.expired(classify(ClientError::Transaction(t))));
                }
                Err(e) => {
                    if began.elapsed() > self.timeout {
                        return Err(CommitError::Unavailable(format!(
                            "cannot abort the transaction within {:?}: {e}",
                            self.timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A fatal error of a transaction that stayed open longer than the transaction
    /// timeout: the coordinator aborted it and fenced this producer's epoch because
    /// the cluster or this process was away, not because another process took over.
    fn expired(&self, e: CommitError) -> CommitError {
        self.expired_at(e, std::time::Instant::now())
    }

    /// [`expired`](Self::expired) for an error met at `at`.
    fn expired_at(&self, e: CommitError, at: std::time::Instant) -> CommitError {
        match e {
            CommitError::Fatal(why)
                if self
                    .began
                    .is_some_and(|b| at.duration_since(b) >= self.transaction_timeout) =>
            {
                CommitError::Unavailable(format!(
                    "the transaction stayed open longer than its timeout ({:?}) and was aborted by the coordinator: {why}",
                    self.transaction_timeout
                ))
            }
            e => e,
        }
    }

    fn with_delivery_error(&self, e: CommitError) -> CommitError {
        let first = self
            .producer
            .context()
            .first_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match (e, first) {
            (CommitError::Aborted(m), Some(d)) => {
                CommitError::Aborted(format!("{m} (a record was not delivered: {d})"))
            }
            (CommitError::Fatal(m), Some(d)) => {
                CommitError::Fatal(format!("{m} (a record was not delivered: {d})"))
            }
            (CommitError::Unavailable(m), Some(d)) => {
                CommitError::Unavailable(format!("{m} (a record was not delivered: {d})"))
            }
            (e, None) => e,
        }
    }
}

/// Commits the open transaction of `producer` with `offsets`: the offsets join it, its
/// records are drained, then the coordinator commits it.
fn commit_on(
    producer: &std::sync::Arc<TxnClient>,
    timeout: Duration,
    offsets: Option<(TopicPartitionList, ConsumerGroupMetadata)>,
) -> Result<(), CommitError> {
    if let Some((tpl, group)) = offsets
        && tpl.count() > 0
    {
        add_offsets(producer, timeout, tpl, group)?;
    }
    // The first try gets the time the drain left; a retry the whole timeout.
    let mut wait = drain(producer, timeout);
    // A retriable error (a timeout) may be retried; anything else aborts.
    let mut attempts = 0;
    loop {
        let result = producer.commit_transaction(wait);
        wait = timeout;
        match result {
            Ok(()) => break,
            Err(ClientError::Transaction(t))
                if t.is_retriable() && !t.txn_requires_abort() && attempts < 3 =>
            {
                attempts += 1;
            }
            Err(e) => return Err(classify(e)),
        }
    }
    let failed = producer.context().failed.swap(0, Ordering::Relaxed);
    if failed > 0 {
        // librdkafka fails the commit when a delivery failed; this is a guard.
        return Err(CommitError::Fatal(format!(
            "{failed} records of a committed transaction were not delivered"
        )));
    }
    Ok(())
}

/// Adds the consumed offsets `tpl` of `group` to the open transaction, waiting at most
/// the client's timeout and a little more. librdkafka's call can wait past its own
/// timeout for a group coordinator that went away (a broker restarted while the client
/// cached it as the coordinator: librdkafka issues 5456 and 5511), which stalled a job
/// for minutes in a rolling restart; so the call runs on a thread of its own, and one
/// that has not answered in time is an unavailable cluster: the job replaces this
/// producer (a new one with the same transactional id fences it and aborts its
/// transaction) and goes back to its last commit. The thread keeps its share of the
/// old producer until librdkafka answers it.
fn add_offsets(
    producer: &std::sync::Arc<TxnClient>,
    timeout: Duration,
    tpl: TopicPartitionList,
    group: ConsumerGroupMetadata,
) -> Result<(), CommitError> {
    let (answer, answered) = std::sync::mpsc::channel();
    let producer = std::sync::Arc::clone(producer);
    std::thread::Builder::new()
        .name("sessionizer-txn-offsets".into())
        .spawn(move || {
            let added = producer.send_offsets_to_transaction(&tpl, &group, timeout);
            let _ = answer.send(added);
        })
        .map_err(|e| CommitError::Fatal(format!("cannot start a thread: {e}")))?;
    match answered.recv_timeout(timeout + OFFSETS_GRACE) {
        Ok(added) => added.map_err(classify),
        Err(_) => Err(CommitError::Unavailable(format!(
            "the group coordinator did not take the transaction's offsets within {:?}",
            timeout + OFFSETS_GRACE
        ))),
    }
}

/// The test hook of asynchronous commits (cargo feature `fault-injection` only): with
/// `SESSIONIZER_TEST_REFUSE_COMMIT_EVERY=N`, every Nth commit started on a thread is
/// aborted instead, 200 ms after it started, while the job goes on with its next
/// batch. A build without the feature has no such hook.
#[cfg(feature = "fault-injection")]
const REFUSE_COMMIT_ENV: &str = "SESSIONIZER_TEST_REFUSE_COMMIT_EVERY";

#[cfg(feature = "fault-injection")]
fn refuse_commit(nth: u64) -> bool {
    let every = std::env::var(REFUSE_COMMIT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    every.is_some_and(|n| n > 0 && nth.is_multiple_of(n))
}

fn classify(e: ClientError) -> CommitError {
    match &e {
        ClientError::Transaction(t) if t.is_fatal() => CommitError::Fatal(format!(
            "the transactional producer was fenced or failed ({t}); another process may have taken over this instance's transactional id"
        )),
        ClientError::Transaction(t) if t.txn_requires_abort() || t.is_retriable() => {
            CommitError::Aborted(t.to_string())
        }
        _ => CommitError::Aborted(e.to_string()),
    }
}

/// A plain (not transactional) producer of JSON lines into a topic, each keyed by the
/// text of one of its fields and placed by Kafka's default murmur2 partitioner — as a
/// Java producer keyed by that field would place it. For loading sample data
/// (`sessionizer generate --kafka-topic`).
pub struct LineProducer {
    producer: BaseProducer<DeliveryContext>,
    topic: String,
    key: KeyField,
    timeout: Duration,
    sent: u64,
}

impl std::fmt::Debug for LineProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineProducer")
            .field("topic", &self.topic)
            .field("sent", &self.sent)
            .finish()
    }
}

impl LineProducer {
    /// A producer into `topic`, keying each line by its field `key_field` ([`KeyField`]).
    pub fn new(
        settings: &KafkaSettings,
        topic: &str,
        key_field: &str,
    ) -> Result<LineProducer, KafkaError> {
        let mut c = settings.client_config();
        c.set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("linger.ms", "20")
            .set("batch.size", "1000000")
            .set("queue.buffering.max.messages", "1000000");
        let producer: BaseProducer<DeliveryContext> = settings
            .finish(c)
            .create_with_context(DeliveryContext::new(settings))
            .map_err(KafkaError::client("create the producer"))?;
        Ok(LineProducer {
            producer,
            topic: topic.to_string(),
            key: KeyField::new(key_field)?,
            timeout: settings.timeout,
            sent: 0,
        })
    }

    /// Sends one line (without its line end); a line without the key field (or not
    /// JSON) is sent without a key.
    pub fn send(&mut self, line: &[u8]) -> Result<(), KafkaError> {
        let key = self.key.of(line);
        let mut record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&self.topic, 0).payload(line);
        if let Some(k) = key {
            record = record.key(k);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => {
                    return Err(KafkaError::Client {
                        what: format!("produce to {}", self.topic),
                        error: e,
                    });
                }
            }
        }
        self.sent += 1;
        if self.sent.is_multiple_of(10_000) {
            self.producer.poll(Duration::ZERO);
        }
        Ok(())
    }

    /// Waits until every record is delivered; fails if any was not.
    pub fn flush(&mut self) -> Result<u64, KafkaError> {
        let left = drain(&self.producer, self.timeout);
        self.producer
            .flush(left)
            .map_err(KafkaError::client(format!("deliver to {}", self.topic)))?;
        let failed = self.producer.context().failed.load(Ordering::Relaxed);
        if failed > 0 {
            let why = self
                .producer
                .context()
                .first_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
                .unwrap_or_default();
            return Err(KafkaError::Invalid(format!(
                "{failed} records were not delivered to {}: {why}",
                self.topic
            )));
        }
        Ok(self.sent)
    }
}

/// Finds the key of a JSON line for Kafka: the value of one member, read by the
/// validating scanner the job reads its input with — so a member of that name inside a
/// nested object or a string never stands in for it, and an escaped key is unescaped.
#[derive(Debug)]
pub struct KeyField {
    extractor: Extractor,
    found: [Option<Span>; 1],
    text: Vec<u8>,
}

impl KeyField {
    /// The key at member `name` (a dotted path names a nested member, as the job's
    /// `--key-field` does).
    pub fn new(name: &str) -> Result<KeyField, KafkaError> {
        let path = FieldPath::parse(name)
            .map_err(|e| KafkaError::Invalid(format!("the key field {name:?}: {e}")))?;
        Ok(KeyField {
            extractor: Extractor::new(&[path]),
            found: [None],
            text: Vec::new(),
        })
    }

    /// The key of `line`: the member's text when it is a string, its digits when it is
    /// a number; `None` when the line is not a JSON object, lacks the member, or holds
    /// another kind of value there (such a record is sent without a key).
    pub fn of<'a>(&'a mut self, line: &'a [u8]) -> Option<&'a [u8]> {
        self.extractor.scan(line, &mut self.found).ok()?;
        let raw = self.found[0]?.of(line);
        match kind(raw) {
            JsonKind::String => match string_content(raw) {
                Some(text) => Some(text),
                None => {
                    self.text.clear();
                    unescape_string(raw, &mut self.text).ok()?;
                    Some(&self.text)
                }
            },
            JsonKind::Number => Some(raw),
            _ => None,
        }
    }
}

/// Waits until no record `producer` was given is in flight (each delivered or failed),
/// serving the delivery reports, for at most `timeout`. Returns the time rdkafka's own
/// flush or commit that follows gets: `timeout` when nothing is in flight any more,
/// none when records still are (the cluster was waited for long enough: that call then
/// fails at once).
///
/// rdkafka's `flush` (also the first step of its `commit_transaction`) serves the
/// reports with `poll` calls of up to 100 ms that each wait out their whole time, so a
/// commit whose records were acknowledged in a millisecond would still take 100: at
/// 100 ms commits that halved a job's throughput. Here a flush without waiting (which
/// also tells the brokers' threads to send what lingers) alternates with polls of 1 ms;
/// rdkafka's own flush that follows finds nothing in flight and returns at once.
fn drain<C: ProducerContext>(producer: &BaseProducer<C>, timeout: Duration) -> Duration {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if producer.flush(Duration::ZERO).is_ok() {
            return timeout;
        }
        if std::time::Instant::now() >= deadline {
            return Duration::ZERO;
        }
        producer.poll(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::KeyField;

    #[test]
    fn keys_are_the_members_text_or_digits() {
        let mut key = KeyField::new("visit_id").expect("a field name");
        let mut f = |l: &str| {
            key.of(l.as_bytes())
                .map(|k| String::from_utf8_lossy(k).into_owned())
        };
        assert_eq!(f(r#"{"visit_id":"v-1","x":2}"#).as_deref(), Some("v-1"));
        assert_eq!(f(r#"{"a":1, "visit_id" : 42}"#).as_deref(), Some("42"));
        assert_eq!(f(r#"{"visit_id":null}"#), None);
        assert_eq!(f(r#"{"visit_id":{"id":"v"}}"#), None);
        assert_eq!(f(r#"{"visit":"v"}"#), None);
        assert_eq!(f("not json"), None);
        assert_eq!(f(r#"{"visit_id":"v-1""#), None, "a broken line has no key");
        assert_eq!(f(r#"{"visit_id":"a\"b"}"#).as_deref(), Some("a\"b"));
        assert_eq!(f(r#"{"visit_id":"caf\u00e9"}"#).as_deref(), Some("café"));
        // The member itself, not a nested one or a string of its name before it.
        assert_eq!(
            f(r#"{"note":"visit_id","inner":{"visit_id":"no"},"visit_id":"yes"}"#).as_deref(),
            Some("yes")
        );
        let mut nested = KeyField::new("user.id").expect("a dotted path");
        assert_eq!(
            nested.of(br#"{"id":"top","user":{"id":"u-7"}}"#),
            Some(&b"u-7"[..])
        );
        assert!(KeyField::new("").is_err());
    }
}
