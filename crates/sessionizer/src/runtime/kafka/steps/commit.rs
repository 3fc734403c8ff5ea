//! The driver's commits: one Kafka transaction per step in exactly-once mode (the
//! protocol of [`crate::runtime::commit::txn`]), started on the producer's thread when
//! the interval asks for it and settled before anything else is sent; a flush of the
//! outputs otherwise.

use crate::error::RunError;
use crate::runtime::commit::txn::{Changed, Outcome, Pending, TxnTask, commit_error};
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::output::Out;
use crate::runtime::kafka::snapshot::Snapshots;
use crate::runtime::kafka::task::Task;
use crate::runtime::kafka::{FLUSHED, KafkaJob, meta_tag};
use crate::runtime::state::PutChange;
use sessionizer_checkpoint::Counters;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::producer::TxnProducer;
use std::collections::BTreeMap;
use std::time::Instant;

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Commits: in durable mode one transaction with every changed task's state
    /// changes and progress record and every task's offsets (the protocol of
    /// [`crate::runtime::commit::txn`]); otherwise the outputs are flushed (and a
    /// transaction holding side outputs to topics committed). Returns once the commit
    /// ended (a commit still running from [`commit_due`](Self::commit_due) ends first).
    pub(in crate::runtime::kafka) fn commit(&mut self) -> Result<(), RunError> {
        self.commit_with(false)
    }

    /// The commit the interval asks for: like [`commit`](Self::commit), but in durable
    /// mode the transaction's commit runs on a thread of its own while the job polls
    /// and processes its next round. The outputs of that round are held by their tasks
    /// (the producer has one transaction at a time) until the commit ended
    /// ([`settle`](Self::settle), before anything is sent); if it was aborted, the
    /// round is dropped with everything since the commit before. A re-keying job
    /// (it forwards records while it polls), a table output and a snapshot due commit
    /// and wait as before.
    pub(in crate::runtime::kafka) fn commit_due(&mut self) -> Result<(), RunError> {
        let wait = self.rekey.is_some()
            || matches!(self.sessions, Out::Table)
            || self.snapshots.as_ref().is_some_and(Snapshots::due);
        self.commit_with(!wait)
    }

    fn commit_with(&mut self, in_background: bool) -> Result<(), RunError> {
        self.settle()?;
        let began = Instant::now();
        let commits = self.txns.commits;
        let result = self.commit_now(in_background);
        if self.txns.commits > commits {
            tracing::debug!(ms = began.elapsed().as_millis() as u64, "committed");
        }
        result
    }

    fn commit_now(&mut self, in_background: bool) -> Result<(), RunError> {
        self.last_commit = Instant::now();
        if let (Some(r), Some(p), true) = (&mut self.rekey, &mut self.producer, self.durable) {
            // The input partitions' times, after the records they cover.
            let ends = self.kafka.stop_at_end.then_some(&self.ends);
            r.publish(p, &self.topics, ends).map_err(commit_error)?;
        }
        // Nothing read, emitted or forwarded since the last commit: the offsets and the
        // changelogs already say where every task stands, and an idle job does not
        // write an empty transaction every interval.
        let idle = !self.tasks.values().any(|t| t.dirty)
            && !self
                .producer
                .as_ref()
                .is_some_and(TxnProducer::in_transaction);
        if idle && self.producer.is_some() {
            return Ok(());
        }
        #[cfg(feature = "delta")]
        if self.durable && self.producer.is_some() {
            // The tasks' epochs of the table join the transaction (their files listed in
            // their progress records).
            self.prepare_tables()?;
        }
        if let Some(p) = self.producer.as_mut() {
            if self.durable {
                // A task that emitted every session at the end of a --stop-at-end run
                // says so beside its offset, so that the other processes of the group
                // know it is finished, not only read.
                let mut next: Vec<(TopicPartition, i64, &str)> = self
                    .tasks
                    .values()
                    .map(|t| (t.tp, t.next_offset, if t.flushed { FLUSHED } else { "" }))
                    .collect();
                if let Some(r) = self.rekey.as_ref() {
                    next.extend(r.positions.iter().map(|(&tp, &o)| (tp, o, "")));
                }
                let (options, format) = (&self.options, self.factory.state_format());
                let mut changed: Vec<(&str, TopicPartition, TaskInTxn<'_, F::Op>)> = self
                    .tasks
                    .values_mut()
                    .filter(|t| t.dirty)
                    .map(|task| {
                        let changelog = self.changelogs[task.tp.topic as usize].as_str();
                        (
                            changelog,
                            task.tp,
                            TaskInTxn {
                                task,
                                options,
                                format,
                            },
                        )
                    })
                    .collect();
                let changed = changed
                    .iter_mut()
                    .map(|(changelog, tp, task)| Changed {
                        changelog: (changelog, tp.partition),
                        tag: meta_tag(*tp),
                        task,
                    })
                    .collect();
                let started = self.txns.start(p, &self.consumer, changed, &next)?;
                // Every task's changes are in the transaction; what each had counted
                // is what it commits.
                let counters = self
                    .tasks
                    .values_mut()
                    .map(|t| {
                        t.dirty = false;
                        (t.tp, t.counters())
                    })
                    .collect();
                self.pending = Some(Pending { started, counters });
                // A commit that is waited for is one started and settled at once: one
                // path commits, takes the outcome and rewinds after an abort.
                if in_background || self.settle()? {
                    return Ok(());
                }
                if self.snapshots.as_ref().is_some_and(Snapshots::due) {
                    // Taken right after the commit: each holds exactly the committed
                    // state.
                    let all: Vec<TopicPartition> = self.tasks.keys().copied().collect();
                    self.write_snapshots(&all);
                }
                return Ok(());
            }
            p.commit().map_err(commit_error)?;
        }
        if !self.durable {
            // Nothing is committed to Kafka: what the outputs were given is this
            // process's share.
            for task in self.tasks.values_mut() {
                task.committed = task.counters();
            }
        }
        self.outputs_committed()
    }

    /// Waits for the commit [`commit_due`](Self::commit_due) started, if any, and
    /// takes its outcome. Returns whether it was aborted: every task then went back to
    /// the commit before (what they processed since is dropped).
    pub(in crate::runtime::kafka) fn settle(&mut self) -> Result<bool, RunError> {
        let aborted = self.join_pending()?;
        if aborted {
            self.rewind()?;
        }
        Ok(aborted)
    }

    /// [`settle`](Self::settle) without the rewind of an aborted commit, which the
    /// caller then owes before anything else is sent or committed.
    pub(in crate::runtime::kafka) fn join_pending(&mut self) -> Result<bool, RunError> {
        let Some(Pending { started, counters }) = self.pending.take() else {
            return Ok(false);
        };
        let p = self
            .producer
            .as_mut()
            .expect("a pending commit has a producer");
        let outcome = self.txns.finish(p, started, &self.telemetry)?;
        self.committed(outcome, counters)
    }

    /// After a durable commit ended with `outcome`, the tasks having counted
    /// `counters` when their changes went into it. Returns whether it was aborted:
    /// the tasks must then be rewound to the commit before.
    fn committed(
        &mut self,
        outcome: Outcome,
        counters: BTreeMap<TopicPartition, Counters>,
    ) -> Result<bool, RunError> {
        let Outcome::Committed { progress_offsets } = outcome else {
            return Ok(true);
        };
        for task in self.tasks.values_mut() {
            if let Some(c) = counters.get(&task.tp) {
                task.committed = c.clone();
            }
            if let Some(&o) = progress_offsets.get(&meta_tag(task.tp)) {
                task.changelog_end = Some(o + 1);
            }
        }
        #[cfg(feature = "delta")]
        self.commit_tables()?;
        self.outputs_committed()?;
        Ok(false)
    }

    /// The outputs that are not in a transaction are written out with each commit.
    fn outputs_committed(&mut self) -> Result<(), RunError> {
        for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
            if let Out::Writer(w) = w {
                w.finish()?;
            }
        }
        self.telemetry.outputs_written();
        Ok(())
    }
}

/// A changed task as a transaction takes it: its progress record carries the job's
/// options and state format.
struct TaskInTxn<'t, O> {
    task: &'t mut Task<O>,
    options: &'t [(String, String)],
    format: u16,
}

impl<O: TaskOp> TxnTask for TaskInTxn<'_, O> {
    fn drain_changes(&mut self, f: &mut PutChange<'_>) {
        self.task.op.drain_changes(f);
    }

    fn take_error(&mut self) -> Option<RunError> {
        self.task.op.take_error()
    }

    fn progress(&self) -> Vec<u8> {
        serde_json::to_vec(&self.task.meta(self.options, self.format))
            .expect("progress record encodes")
    }
}
