//! A Kafka output for the file and stdin driver (docs/semantics.md K-7, S-35): session
//! records, and optionally dead letters and late events, go to topics through one
//! transactional producer, in the same record format as the Kafka-input driver
//! ([`super::kafka`]): key `session_id`, a retraction is a tombstone with header
//! `retract: true`, the partition is murmur2 of the session key.
//!
//! **Without a state directory** a transaction commits every `--checkpoint-interval`
//! and at the end of the input, so readers see the records progressively. A failed run
//! aborts its open transaction; what earlier transactions committed stays.
//!
//! **With a state directory** every checkpoint is a two-phase commit:
//!
//! 1. *prepare*: a progress record naming the checkpoint's epoch is added to the open
//!    transaction (in the compacted topic `<output-topic>-sessionizer-progress`, keyed
//!    by the job's transactional id) and the producer is flushed: every record of the
//!    transaction is on the brokers, not yet visible;
//! 2. the checkpoint is written (state, manifest) with the progress record's offset —
//!    the manifest is "prepared";
//! 3. *commit* the transaction;
//! 4. *recovery*: the new process registers the same transactional id (which fences the
//!    old one and aborts a transaction it left open), then reads the progress record
//!    at the recorded offset under `read_committed`: there, the checkpoint's
//!    transaction committed and the run resumes from it; not there, it was aborted and
//!    the run resumes from the previous checkpoint (kept until then) — discarding the
//!    unresolved one.
//!
//! The transactional id is fixed per job: `sessionizer-file-<ID>` with
//! `--kafka-instance-id ID`, else an id made up on first use and kept in the state
//! directory (`instance-id`), so that a restarted job fences a zombie predecessor.

use crate::error::RunError;
use crate::runtime::tagged::{Tag, Tagged};
use sessionizer_checkpoint::KafkaTxn;
use sessionizer_connectors::sink::EpochSink;
use std::path::Path;

/// A side output that may go to a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    DeadLetter,
    Late,
}

/// What Kafka says of a prepared checkpoint's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) enum Outcome {
    /// It committed: resume from the checkpoint.
    Committed,
    /// It did not (the process stopped between the checkpoint and the commit).
    Aborted,
    /// A later checkpoint of the job (this epoch) committed: the state directory lost
    /// it.
    Ahead(u64),
}

/// Where the job's topics are, and the transactions that carry its records. With a
/// state directory each transaction is one epoch of the job's checkpoints
/// ([`EpochSink`]: prepared with a progress record naming the checkpoint, committed once
/// the checkpoint is durable, aborted when the run fails).
pub(crate) trait TopicSink: EpochSink {
    /// Registers the job's transactional id (fencing an earlier process with it and
    /// aborting what that left open); `state_dir` keeps a made-up id across runs.
    fn claim(&mut self, state_dir: Option<&Path>) -> Result<(), RunError>;
    /// The transactional id (once claimed) and the session output topic.
    fn identity(&self) -> (&str, &str);
    /// Whether records of `side` go to a topic.
    fn routes(&self, side: Side) -> bool;
    /// Sends one session record or retraction of `out`.
    fn session(&mut self, out: &Tagged, tag: &Tag) -> Result<(), RunError>;
    /// Sends every record of `out`.
    fn sessions(&mut self, out: &Tagged) -> Result<(), RunError> {
        for tag in &out.tags {
            self.session(out, tag)?;
        }
        Ok(())
    }
    /// Sends side-output records (each ending with a line end).
    fn side(&mut self, side: Side, records: &[u8]) -> Result<(), RunError>;
    /// Sends one record of a library job to topic `to` (0: the output topic, else one
    /// of [`add_topic`](Self::add_topic)): `value` under `key`, in the partition Kafka's
    /// default partitioner gives `key` (any partition without one).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    fn keyed(&mut self, to: usize, key: Option<&[u8]>, value: &[u8]) -> Result<(), RunError>;
    /// Waits until every record sent so far is on the brokers (in the open
    /// transaction, not committed); fails if any was not delivered.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    fn deliver(&mut self) -> Result<(), RunError>;
    /// Adds a topic (which must exist) that [`keyed`](Self::keyed) writes in the same
    /// transactions; returns its number.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    fn add_topic(&mut self, topic: &str) -> Result<usize, RunError>;
    /// Serves delivery reports.
    fn poll(&mut self);
    /// Whether the open transaction must be committed now: its commit interval passed
    /// (without a state directory), or it has been open for half the transaction
    /// timeout (the broker would abort it at the timeout).
    fn due(&self) -> bool;
    /// Commits the open transaction (without a state directory; a no-op when nothing
    /// was sent since the last commit).
    fn commit_open(&mut self) -> Result<(), RunError>;
    /// Whether the transaction prepared for checkpoint `epoch` (as its manifest has
    /// it) committed.
    fn outcome(&mut self, txn: &KafkaTxn, epoch: u64) -> Result<Outcome, RunError>;
}

/// Opens the Kafka output of a file or stdin run: checks that its topics exist.
#[cfg(feature = "kafka")]
pub(crate) fn open(kafka: &crate::config::KafkaConfig) -> Result<Box<dyn TopicSink>, RunError> {
    let Some(sessions) = kafka.output_topic.clone() else {
        return Err(RunError::Unsupported(
            crate::error::Unsupported::NoOutputTopic,
        ));
    };
    let options = imp::SinkOptions {
        settings: kafka.settings(),
        sessions,
        dead: kafka.dead_letter_topic.clone(),
        late: kafka.late_topic.clone(),
        instance_id: kafka.instance_id.clone(),
        transaction_timeout: kafka.transaction_timeout,
        commit_interval: kafka.commit_interval,
    };
    Ok(Box::new(imp::KafkaSink::open(options, "sessionizer-file")?))
}

/// Opens the exactly-once output of a library job (`sessionizer::kafka::KafkaJsonSink`):
/// one topic, transactions committed with the job's checkpoints, the transactional id
/// `sessionizer-lib-<instance>` kept in the state directory.
#[cfg(feature = "kafka")]
pub(crate) fn open_library(
    settings: sessionizer_connectors::kafka::KafkaSettings,
    topic: &str,
    transaction_timeout: std::time::Duration,
) -> Result<Box<dyn TopicSink + Send>, RunError> {
    let options = imp::SinkOptions {
        settings,
        sessions: topic.to_string(),
        dead: None,
        late: None,
        instance_id: None,
        transaction_timeout,
        // The library commits with its checkpoints, not on a timer.
        commit_interval: transaction_timeout,
    };
    Ok(Box::new(imp::KafkaSink::open(options, "sessionizer-lib")?))
}

/// The progress record's value: `{"epoch":N}`.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
fn progress_value(epoch: u64) -> Vec<u8> {
    format!("{{\"epoch\":{epoch}}}").into_bytes()
}

/// The epoch in a progress record, `None` if it is not one.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
fn progress_epoch(value: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    v.get("epoch")?.as_u64()
}

#[cfg(feature = "kafka")]
mod imp {
    use super::{Outcome, RunError, Side, Tag, Tagged, TopicSink, progress_epoch, progress_value};
    use crate::runtime::instance::{persisted_instance, random_instance};
    use sessionizer_checkpoint::KafkaTxn;
    use sessionizer_connectors::kafka::admin::Admin;
    use sessionizer_connectors::kafka::partitioner::partition_for;
    use sessionizer_connectors::kafka::producer::{CommitError, TxnProducer};
    use sessionizer_connectors::kafka::{KafkaError, KafkaSettings, progress};
    use sessionizer_connectors::sink::{EpochSink, Prepared, SinkError, SinkMark};
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// The delivery tag of the progress record.
    const PROGRESS_TAG: usize = 1;

    /// Test hook (cargo feature `fault-injection` only): with `=N`, the process exits
    /// (code [`EXIT_BEFORE_COMMIT_CODE`], without cleaning up) after writing its N-th
    /// checkpoint and before committing its Kafka transaction — the one instant a
    /// `kill -9` rarely hits. A build without the feature has no such exit.
    #[cfg(feature = "fault-injection")]
    const EXIT_BEFORE_COMMIT_ENV: &str = "SESSIONIZER_TEST_EXIT_BEFORE_KAFKA_COMMIT";
    #[cfg(feature = "fault-injection")]
    const EXIT_BEFORE_COMMIT_CODE: i32 = 86;

    #[cfg(feature = "fault-injection")]
    fn exit_before_commit() -> Option<u64> {
        std::env::var(EXIT_BEFORE_COMMIT_ENV).ok()?.parse().ok()
    }

    /// What a Kafka output is opened with: the command line's `--kafka-*` options, or
    /// a library job's sink.
    pub(crate) struct SinkOptions {
        pub settings: KafkaSettings,
        /// The session records' topic.
        pub sessions: String,
        /// The dead letters' and late events' topics, if they go to Kafka too.
        pub dead: Option<String>,
        pub late: Option<String>,
        /// The instance of the transactional id; `None`: kept in the state directory,
        /// or random without one.
        pub instance_id: Option<String>,
        pub transaction_timeout: Duration,
        /// How often a run without a state directory commits.
        pub commit_interval: Duration,
    }

    pub(crate) struct KafkaSink {
        /// The transactional id's prefix (the instance follows).
        prefix: &'static str,
        settings: KafkaSettings,
        admin: Admin,
        producer: Option<TxnProducer>,
        instance_id: Option<String>,
        transactional_id: String,
        transaction_timeout: Duration,
        interval: Duration,
        sessions: String,
        partitions: usize,
        dead: Option<String>,
        late: Option<String>,
        /// A library job's other topics in the same transactions, with their partitions.
        more_topics: Vec<(String, usize)>,
        /// With a state directory: the progress topic and the partition of this job's
        /// records.
        progress: Option<(String, i32)>,
        /// When the open transaction got its first record.
        opened: Option<Instant>,
        last_commit: Instant,
        key_buf: Vec<u8>,
        sent: u64,
        /// Checkpoints prepared by this process.
        prepared: u64,
    }

    fn kafka_error(what: &str) -> impl FnOnce(CommitError) -> RunError + '_ {
        move |e| RunError::Kafka(failed(what, e))
    }

    fn sink_error(what: &str) -> impl FnOnce(CommitError) -> SinkError + '_ {
        move |e| SinkError::Kafka(failed(what, e))
    }

    /// A failed transaction step, as an error that says whether it may pass: the
    /// cluster did not answer, or the transaction was aborted under the job (a broker
    /// went away mid-transaction) — a run with a state directory then waits for the
    /// cluster and goes back to its last checkpoint. A producer that cannot go on
    /// (fenced by another process, refused) is fatal.
    fn failed(what: &str, e: CommitError) -> KafkaError {
        match e {
            CommitError::Fatal(_) => KafkaError::Invalid(format!("{what}: {e}")),
            CommitError::Aborted(_) | CommitError::Unavailable(_) => {
                KafkaError::Unavailable(format!("{what}: {e}"))
            }
        }
    }

    impl KafkaSink {
        pub(crate) fn open(o: SinkOptions, prefix: &'static str) -> Result<Self, RunError> {
            let admin = Admin::new(&o.settings)?;
            let partitions = admin.require(&o.sessions, "output, --kafka-output-topic")?;
            if let Some(t) = &o.dead {
                admin.require(t, "--dead-letter-topic")?;
            }
            if let Some(t) = &o.late {
                admin.require(t, "--late-topic")?;
            }
            Ok(KafkaSink {
                prefix,
                settings: o.settings,
                admin,
                producer: None,
                instance_id: o.instance_id,
                transactional_id: String::new(),
                transaction_timeout: o.transaction_timeout,
                interval: o.commit_interval,
                sessions: o.sessions,
                partitions,
                dead: o.dead,
                late: o.late,
                more_topics: Vec::new(),
                progress: None,
                opened: None,
                last_commit: Instant::now(),
                key_buf: Vec::with_capacity(16),
                sent: 0,
                prepared: 0,
            })
        }

        fn producer(&mut self) -> &mut TxnProducer {
            self.producer
                .as_mut()
                .expect("the Kafka output is claimed before anything is sent")
        }

        fn sent_one(&mut self) {
            if self.opened.is_none() {
                self.opened = Some(Instant::now());
            }
            self.sent += 1;
            if self.sent.is_multiple_of(4096) {
                self.producer().poll();
            }
        }

        fn committed(&mut self) {
            self.opened = None;
            self.last_commit = Instant::now();
        }
    }

    impl TopicSink for KafkaSink {
        fn claim(&mut self, state_dir: Option<&Path>) -> Result<(), RunError> {
            let instance = match (&self.instance_id, state_dir) {
                (Some(id), _) => id.clone(),
                (None, Some(dir)) => persisted_instance(dir)?,
                (None, None) => random_instance(),
            };
            self.transactional_id = format!("{}-{instance}", self.prefix);
            if state_dir.is_some() {
                let topic = format!("{}-sessionizer-progress", self.sessions);
                let n = self.admin.ensure_progress(&topic)?;
                let partition = partition_for(self.transactional_id.as_bytes(), n);
                self.progress = Some((topic, partition));
            }
            self.producer = Some(TxnProducer::new(
                &self.settings,
                &self.transactional_id,
                self.transaction_timeout,
            )?);
            self.last_commit = Instant::now();
            Ok(())
        }

        fn identity(&self) -> (&str, &str) {
            (&self.transactional_id, &self.sessions)
        }

        fn routes(&self, side: Side) -> bool {
            match side {
                Side::DeadLetter => self.dead.is_some(),
                Side::Late => self.late.is_some(),
            }
        }

        fn session(&mut self, out: &Tagged, tag: &Tag) -> Result<(), RunError> {
            let m = out.message(tag, self.partitions, &mut self.key_buf);
            let producer = self
                .producer
                .as_mut()
                .expect("the Kafka output is claimed before anything is sent");
            producer
                .send(
                    &self.sessions,
                    Some(m.partition),
                    Some(m.key),
                    m.value,
                    m.retract,
                )
                .map_err(kafka_error("send a session record"))?;
            self.sent_one();
            Ok(())
        }

        fn side(&mut self, side: Side, records: &[u8]) -> Result<(), RunError> {
            let topic = match side {
                Side::DeadLetter => self.dead.clone(),
                Side::Late => self.late.clone(),
            };
            let Some(topic) = topic else {
                return Ok(());
            };
            for record in records.split(|&b| b == b'\n').filter(|r| !r.is_empty()) {
                self.producer()
                    .send(&topic, None, None, Some(record), false)
                    .map_err(kafka_error("send a side-output record"))?;
                self.sent_one();
            }
            Ok(())
        }

        fn keyed(&mut self, to: usize, key: Option<&[u8]>, value: &[u8]) -> Result<(), RunError> {
            let (topic, partitions) = match to {
                0 => (&self.sessions, self.partitions),
                i => {
                    let (t, n) = &self.more_topics[i - 1];
                    (t, *n)
                }
            };
            let partition = key.map(|k| partition_for(k, partitions));
            let producer = self
                .producer
                .as_mut()
                .expect("the Kafka output is claimed before anything is sent");
            producer
                .send(topic, partition, key, Some(value), false)
                .map_err(kafka_error("send a record"))?;
            self.sent_one();
            Ok(())
        }

        fn deliver(&mut self) -> Result<(), RunError> {
            match &mut self.producer {
                Some(p) => p
                    .flush()
                    .map_err(kafka_error("deliver the records of the transaction")),
                None => Ok(()),
            }
        }

        fn add_topic(&mut self, topic: &str) -> Result<usize, RunError> {
            let partitions = self.admin.require(topic, "an output of the job")?;
            self.more_topics.push((topic.to_string(), partitions));
            Ok(self.more_topics.len())
        }

        fn poll(&mut self) {
            if let Some(p) = &self.producer {
                p.poll();
            }
        }

        fn due(&self) -> bool {
            let open_long = self
                .opened
                .is_some_and(|t| t.elapsed() >= self.transaction_timeout / 2);
            let interval = self.progress.is_none()
                && self.opened.is_some()
                && self.last_commit.elapsed() >= self.interval;
            open_long || interval
        }

        fn commit_open(&mut self) -> Result<(), RunError> {
            let Some(p) = &mut self.producer else {
                return Ok(());
            };
            if p.in_transaction() {
                p.commit().map_err(|e| {
                    RunError::Kafka(KafkaError::Invalid(format!(
                        "the Kafka transaction did not commit ({e}); the records of earlier transactions stay committed. A run without --state-dir cannot be resumed: run it again into a new topic (or let a compacted topic keep one record per session_id), or use --state-dir for exactly once across failures"
                    )))
                })?;
            }
            self.committed();
            Ok(())
        }

        fn outcome(&mut self, txn: &KafkaTxn, epoch: u64) -> Result<Outcome, RunError> {
            let found = progress::read_from(
                &self.settings,
                &txn.progress_topic,
                txn.progress_partition,
                txn.progress_offset,
                txn.transactional_id.as_bytes(),
            )?;
            let newest = found.later.iter().filter_map(|v| progress_epoch(v)).max();
            if let Some(e) = newest.filter(|&e| e > epoch) {
                return Ok(Outcome::Ahead(e));
            }
            if let Some(v) = &found.at {
                return match progress_epoch(v) {
                    Some(e) if e == epoch => Ok(Outcome::Committed),
                    other => Err(RunError::Kafka(KafkaError::Invalid(format!(
                        "the progress record at {}/{}@{} should name checkpoint {epoch} but names {other:?}; was the topic recreated or shared?",
                        txn.progress_topic, txn.progress_partition, txn.progress_offset
                    )))),
                };
            }
            if txn.progress_offset >= found.high || txn.progress_offset < found.low {
                return Err(RunError::Kafka(KafkaError::Invalid(format!(
                    "cannot tell whether the Kafka transaction of checkpoint {epoch} committed: its progress record {}/{}@{} is no longer in the topic (it holds offsets {} to {}); was the topic deleted or recreated? Use another --state-dir to start the job over",
                    txn.progress_topic,
                    txn.progress_partition,
                    txn.progress_offset,
                    found.low,
                    found.high
                ))));
            }
            Ok(Outcome::Aborted)
        }
    }

    impl EpochSink for KafkaSink {
        fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>, SinkError> {
            let Some((topic, partition)) = self.progress.clone() else {
                return Err(SinkError::Internal(
                    "a checkpoint of a Kafka output without a progress topic",
                ));
            };
            let id = self.transactional_id.clone();
            let value = progress_value(epoch);
            let p = self.producer();
            p.send_tracked(
                &topic,
                Some(partition),
                Some(id.as_bytes()),
                Some(&value),
                false,
                PROGRESS_TAG,
            )
            .map_err(sink_error("send the progress record"))?;
            p.flush()
                .map_err(sink_error("deliver the records of the transaction"))?;
            let Some(&offset) = p.take_tracked().get(&PROGRESS_TAG) else {
                return Err(SinkError::Kafka(KafkaError::Invalid(format!(
                    "the progress record of checkpoint {epoch} was flushed but its delivery was not reported"
                ))));
            };
            // The fallback is the committer's to fill in.
            let txn = KafkaTxn {
                transactional_id: id,
                output_topic: self.sessions.clone(),
                progress_topic: topic,
                progress_partition: partition,
                progress_offset: offset,
                fallback_epoch: None,
            };
            Ok(Some(Prepared {
                mark: SinkMark::Transaction(txn),
                sync: None,
            }))
        }

        fn two_phase(&self) -> bool {
            true
        }

        fn commit(&mut self, epoch: u64) -> Result<(), SinkError> {
            self.prepared += 1;
            #[cfg(feature = "fault-injection")]
            if exit_before_commit() == Some(self.prepared) {
                // The test hook: a crash between the checkpoint and the commit. Nothing
                // is cleaned up, the transaction stays open, as after `kill -9`.
                eprintln!(
                    "sessionizer: {EXIT_BEFORE_COMMIT_ENV}: exiting before the commit of checkpoint {epoch}"
                );
                std::process::exit(EXIT_BEFORE_COMMIT_CODE);
            }
            self.producer().commit().map_err(|e| {
                let what = format!(
                    "the Kafka transaction of checkpoint {epoch} did not commit; the checkpoint was written but its records are not committed: run the same command again, it resumes from the last committed checkpoint and writes them again (exactly once)"
                );
                SinkError::Kafka(failed(&what, e))
            })?;
            self.committed();
            Ok(())
        }

        fn abort(&mut self) {
            if let Some(p) = &mut self.producer
                && p.in_transaction()
                && let Err(e) = p.abort()
            {
                tracing::warn!(error = %e, "cannot abort the open Kafka transaction");
            }
            self.opened = None;
        }
    }
}
