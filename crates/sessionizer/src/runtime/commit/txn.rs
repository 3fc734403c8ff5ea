//! The commit protocol of a Kafka job in exactly-once mode: one Kafka transaction
//! makes a step durable as a whole.
//!
//! Where a checkpointed file job writes its state and its sources' positions into a
//! state directory ([`super::Committer`]), a Kafka job writes them into the same
//! transaction as its output records:
//!
//! 1. every task whose state changed since the last commit sends its changes to its
//!    changelog partition (a key and its encoded state, or a tombstone), then its
//!    progress record (next offset, watermark, counters), whose changelog offset the
//!    producer tracks: a local snapshot of the committed state names it;
//! 2. the sources' positions — every task's next offset, with `flushed` beside the
//!    offset of a task that emitted every session at the end of its input — join the
//!    transaction as the consumer group's offsets;
//! 3. the transaction commits: outputs, state and positions become visible together.
//!
//! The commit of step 3 may run on a thread of the producer while the job goes on
//! ([`Transactions::start`], then [`Transactions::finish`]): the job polls and
//! processes its next round meanwhile, but sends nothing — a producer has one
//! transaction at a time — so that round's outputs wait in its tasks until the commit
//! ended. If it was aborted, the job rewinds as below, and the round goes with
//! everything else since the commit before; so exactly once holds as with a commit
//! that is waited for.
//!
//! A transaction the broker aborts (a rebalance moved the group on while it was
//! committed, a fenced epoch) is not an error: none of it is visible, the job rewinds
//! its tasks to the last commit (restoring them from their changelogs) and goes on. A
//! cause that does not go away — a record the broker refuses every time — would abort
//! every replay, so after [`MAX_ABORTS_IN_ROW`] aborts in a row the job stops, saying
//! why.

use crate::error::RunError;
use crate::runtime::state::PutChange;
use crate::telemetry::{CheckpointKind, CheckpointReport, Telemetry};
use sessionizer_checkpoint::Counters;
use sessionizer_connectors::kafka::KafkaError;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::changelog;
use sessionizer_connectors::kafka::consumer::GroupConsumer;
use sessionizer_connectors::kafka::producer::{CommitError, TxnProducer};
use std::collections::HashMap;
use std::time::Instant;

/// Transactions aborted one after the other before the job gives up.
pub(crate) const MAX_ABORTS_IN_ROW: u32 = 5;

/// What a transaction takes from one task whose state changed.
pub(crate) trait TxnTask {
    /// Calls `f` for every key whose state changed since the last call, with the state
    /// encoded (`None`: the key has none any more), then forgets the changes.
    fn drain_changes(&mut self, f: &mut PutChange<'_>);
    /// The first error of the task's operator since the last call (its state store
    /// failed while the changes were read): nothing of the transaction commits.
    fn take_error(&mut self) -> Option<RunError>;
    /// The task's progress record, encoded.
    fn progress(&self) -> Vec<u8>;
}

/// One changed task's place in a transaction.
pub(crate) struct Changed<'t> {
    /// Its changelog topic and partition.
    pub changelog: (&'t str, i32),
    /// The tag under which the producer tracks the progress record's offset.
    pub tag: usize,
    /// The task.
    pub task: &'t mut dyn TxnTask,
}

/// How a transaction ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Committed: the changelog offset of each tracked progress record, by tag.
    Committed {
        progress_offsets: HashMap<usize, i64>,
    },
    /// Aborted by the broker (see the module's documentation): rewind and go on.
    Aborted,
}

/// The transactions of one Kafka job and their history.
#[derive(Debug, Default)]
pub(crate) struct Transactions {
    /// Transactions committed.
    pub commits: u64,
    /// Transactions aborted (by the broker, or by the job giving partitions up).
    pub aborts: u64,
    /// Transactions aborted since the last one committed.
    aborts_in_row: u32,
}

/// A transaction whose records and offsets are all sent, its commit running on a
/// thread of the producer ([`Transactions::start`]).
#[derive(Debug)]
#[must_use = "a started commit is finished with Transactions::finish"]
pub(crate) struct Started {
    began: Instant,
    bytes: u64,
    keys: u64,
}

/// A commit started by the Kafka driver, running while the job goes on.
#[derive(Debug)]
pub(crate) struct Pending {
    pub started: Started,
    /// Every task's counters when its changes went into the transaction.
    pub counters: std::collections::BTreeMap<TopicPartition, Counters>,
}

impl Transactions {
    /// Commits one step of the job (see the module's protocol): sends the changes and
    /// progress records of `changed`, adds the positions `next` (`(partition, next
    /// offset, metadata)`) to the open transaction, which holds the step's outputs
    /// too, and starts its commit on a thread of the producer. The job may go on with
    /// its next batch, holding what it would send, until [`finish`](Self::finish) says
    /// how the commit ended; a commit that is waited for is finished at once.
    pub fn start(
        &mut self,
        producer: &mut TxnProducer,
        consumer: &GroupConsumer,
        changed: Vec<Changed<'_>>,
        next: &[(TopicPartition, i64, &str)],
    ) -> Result<Started, RunError> {
        let (began, bytes, keys) = send_changes(producer, changed)?;
        let offsets = consumer.offsets(next)?;
        let group = consumer.group_metadata();
        producer
            .start_commit(group.map(|g| (offsets, g)))
            .map_err(commit_error)?;
        Ok(Started { began, bytes, keys })
    }

    /// Waits for the commit of [`start`](Self::start) and says how it ended.
    pub fn finish(
        &mut self,
        producer: &mut TxnProducer,
        started: Started,
        telemetry: &Telemetry,
    ) -> Result<Outcome, RunError> {
        let committed = producer.finish_commit();
        self.ended(producer, started, committed, telemetry)
    }

    fn ended(
        &mut self,
        producer: &mut TxnProducer,
        started: Started,
        committed: Result<(), CommitError>,
        telemetry: &Telemetry,
    ) -> Result<Outcome, RunError> {
        match committed {
            Ok(()) => {
                self.commits += 1;
                self.aborts_in_row = 0;
                telemetry.checkpoint(&CheckpointReport {
                    kind: CheckpointKind::Transaction,
                    epoch: None,
                    bytes: started.bytes,
                    keys: started.keys,
                    took: started.began.elapsed(),
                });
                Ok(Outcome::Committed {
                    progress_offsets: producer.take_tracked(),
                })
            }
            Err(CommitError::Aborted(why)) => {
                self.aborted(telemetry, &why);
                if self.aborts_in_row >= MAX_ABORTS_IN_ROW {
                    return Err(commit_error(CommitError::Fatal(format!(
                        "{} transactions in a row were aborted; the last because: {why}",
                        self.aborts_in_row
                    ))));
                }
                Ok(Outcome::Aborted)
            }
            Err(e) => Err(commit_error(e)),
        }
    }

    /// Aborts the open transaction, if any (`producer`; `None` when a new producer
    /// aborted it already), because the job gives up what it holds (partitions lost
    /// in a rebalance, a cluster that did not answer): the caller rewinds its tasks.
    pub fn abort(
        &mut self,
        producer: Option<&mut TxnProducer>,
        telemetry: &Telemetry,
        why: &dyn std::fmt::Display,
    ) -> Result<(), RunError> {
        if let Some(p) = producer {
            p.abort().map_err(commit_error)?;
        }
        telemetry.transaction_aborted(why);
        self.aborts += 1;
        Ok(())
    }

    fn aborted(&mut self, telemetry: &Telemetry, why: &dyn std::fmt::Display) {
        telemetry.transaction_aborted(why);
        self.aborts += 1;
        self.aborts_in_row += 1;
    }
}

/// Sends the changelog records of `changed` (see the module's protocol): returns when
/// the transaction began to be committed, and its changelog bytes and keys.
fn send_changes(
    producer: &mut TxnProducer,
    changed: Vec<Changed<'_>>,
) -> Result<(Instant, u64, u64), RunError> {
    let began = Instant::now();
    // The changelog records of the transaction, for telemetry.
    let (mut bytes, mut keys) = (0u64, 0u64);
    let mut key_buf = Vec::new();
    for Changed {
        changelog: (topic, partition),
        tag,
        task,
    } in changed
    {
        let mut failed = None;
        task.drain_changes(&mut |key, value| {
            if failed.is_some() {
                return;
            }
            changelog::state_key(key, &mut key_buf);
            keys += 1;
            bytes += (key_buf.len() + value.map_or(0, <[u8]>::len)) as u64;
            if let Err(e) = producer.send(topic, Some(partition), Some(&key_buf), value, false) {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            return Err(commit_error(e));
        }
        if let Some(e) = task.take_error() {
            return Err(e);
        }
        let progress = task.progress();
        bytes += progress.len() as u64;
        // Its offset tells a local snapshot how much of the changelog it covers.
        producer
            .send_tracked(
                topic,
                Some(partition),
                Some(changelog::META_KEY),
                Some(&progress),
                false,
                tag,
            )
            .map_err(commit_error)?;
    }
    Ok((began, bytes, keys))
}

/// A producer's failure as the run's error. A transaction aborted under the job — a
/// record sent while the producer's transaction had already failed in the background (a
/// broker went away with some of its records) — passes like an unanswered cluster: the
/// job replaces its producer and rewinds its tasks to the last commit. Only a producer
/// that cannot go on (fenced by another process, a record it refuses) ends the run.
pub(crate) fn commit_error(e: CommitError) -> RunError {
    match e {
        CommitError::Unavailable(why) => RunError::Kafka(KafkaError::Unavailable(why)),
        CommitError::Aborted(_) => RunError::Kafka(KafkaError::Unavailable(e.to_string())),
        CommitError::Fatal(_) => RunError::Kafka(KafkaError::Invalid(e.to_string())),
    }
}
