//! The end of a `--stop-at-end` run: tasks that reached their end emit every
//! session, positions move past transaction markers, and a process leaves only once
//! the whole group is done.

use crate::error::RunError;
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::task::Task;
use crate::runtime::kafka::{FLUSHED, KafkaJob};
use sessionizer_connectors::kafka::TopicPartition;
use std::time::{Duration, Instant};

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// `--stop-at-end` without `--keep-open`: the tasks that reached their end emit
    /// every session (the watermark becomes +infinity) and are committed as finished.
    pub(in crate::runtime::kafka) fn flush_done_tasks(&mut self) -> Result<(), RunError> {
        if self.keep_open() {
            return Ok(());
        }
        let done: Vec<TopicPartition> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.done() && !t.flushed)
            .map(|(&id, _)| id)
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        // A commit running meanwhile ends first; if it was aborted, every task went
        // back to the commit before (the next round looks again).
        if self.settle()? {
            return Ok(());
        }
        for id in &done {
            let task = self.tasks.get_mut(id).expect("task exists");
            task.op.clear_outputs();
            task.op.finish();
            task.flushed = true;
            task.dirty = true;
            self.send_outputs(*id)?;
        }
        self.commit()
    }

    /// `--stop-at-end`: whether this process may end — its tasks are done and so is
    /// every other partition of the input (its committed offset reached its end). A
    /// process stays in the group until then, to take over the partitions of a member
    /// that dies. With `--repartition` the inputs come first: once every input
    /// partition was re-keyed to its end and committed, the internal topic's end is
    /// read, and the tasks run up to it. Asked of the group coordinator at most once a
    /// second.
    pub(in crate::runtime::kafka) fn ready_to_stop(&mut self) -> Result<bool, RunError> {
        if !self.durable {
            return Ok(!self.tasks.is_empty() && self.tasks.values().all(Task::done));
        }
        // Not before the group gave this process its share (it may hold partitions
        // that need restoring, or whose changelog is damaged).
        if self.assigned_events == 0 {
            return Ok(false);
        }
        let inputs_pending = self.rekey.as_ref().is_some_and(|r| !r.inputs_done);
        let mine_finished = self
            .tasks
            .values()
            .all(|t| t.done() && (t.flushed || self.keep_open()));
        if !inputs_pending && !mine_finished {
            return Ok(false);
        }
        if self
            .last_group_check
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return Ok(false);
        }
        self.last_group_check = Some(Instant::now());
        if inputs_pending {
            let rekey = self.rekey.as_ref().expect("re-keying");
            let mine_done = rekey
                .positions
                .iter()
                .all(|(tp, &at)| self.ends.get(tp).is_some_and(|&e| at >= e));
            let others: Vec<TopicPartition> = self
                .ends
                .keys()
                .filter(|tp| rekey.is_input(**tp) && !rekey.positions.contains_key(tp))
                .copied()
                .collect();
            if !mine_done || !self.committed_reached_end(&others)? {
                return Ok(false);
            }
            // What this process forwarded must be committed before the end of the
            // internal topic is taken; an aborted commit put the inputs back, so they
            // are not done.
            let aborts = self.txns.aborts;
            self.commit()?;
            if self.txns.aborts != aborts {
                return Ok(false);
            }
            // The internal topic is the last one read.
            let t = self.topics.len() as u32 - 1;
            let n = self.admin.require(&self.topics[t as usize], "internal")?;
            let internal = (0..n as i32).map(|p| TopicPartition {
                topic: t,
                partition: p,
            });
            // Its end is its high watermark, not its last stable offset: a committed
            // transaction's markers reach the partitions after the commit returns, so
            // right after it the last stable offset can still stand before the records
            // just committed (which would then count as past the end). Everything below
            // the high watermark was committed or aborted by now; the tasks read up to it
            // once the markers are there.
            for tp in internal {
                let high = self
                    .admin
                    .written_end(&self.topics[tp.topic as usize], tp.partition)?;
                self.ends.insert(tp, high);
                if let Some(task) = self.tasks.get_mut(&tp) {
                    task.end = Some(high);
                }
            }
            if let Some(r) = &mut self.rekey {
                r.inputs_done = true;
            }
            self.last_group_check = None;
            return Ok(false);
        }
        let others: Vec<TopicPartition> = self
            .ends
            .keys()
            .filter(|tp| !self.tasks.contains_key(tp))
            .filter(|tp| !self.rekey.as_ref().is_some_and(|r| r.is_input(**tp)))
            .copied()
            .collect();
        self.committed_reached_end(&others)
    }

    /// Whether the group's committed offset of each of `parts` reached its end — and,
    /// for a task partition of a run that emits every session at the end, whether the
    /// task that owned it did so (the metadata it committed says [`FLUSHED`]).
    pub(in crate::runtime::kafka) fn committed_reached_end(
        &self,
        parts: &[TopicPartition],
    ) -> Result<bool, RunError> {
        if parts.is_empty() {
            return Ok(true);
        }
        let committed = self.consumer.committed_with_metadata(parts)?;
        Ok(parts.iter().zip(committed).all(|(tp, c)| {
            let input = self.rekey.as_ref().is_some_and(|r| r.is_input(*tp));
            // A task flushed by its owner reached that owner's end (a process that
            // started later, when the partition had grown, has a later end).
            c.is_some_and(|(o, meta)| {
                (!input && meta == FLUSHED)
                    || (o >= self.ends[tp] && (input || self.keep_open() || meta == FLUSHED))
            })
        }))
    }

    /// Moves each task's (and re-keyed input's) next offset up to the consumer's
    /// position: past transaction markers and aborted records, which are never handed
    /// out, so that a partition written with transactions can reach its end offset.
    /// Called after the staged records were processed.
    pub(in crate::runtime::kafka) fn catch_up_positions(&mut self) -> Result<(), RunError> {
        let mut parts: Vec<TopicPartition> = self.tasks.keys().copied().collect();
        if let Some(r) = &self.rekey {
            parts.extend(r.positions.keys());
        }
        let positions = self.consumer.positions(&parts)?;
        for (tp, at) in parts.iter().zip(positions) {
            let Some(at) = at else { continue };
            // Not past a --stop-at-end run's end (records after it are skipped).
            let at = self.ends.get(tp).map_or(at, |&e| {
                if self.kafka.stop_at_end {
                    at.min(e)
                } else {
                    at
                }
            });
            if let Some(task) = self.tasks.get_mut(tp) {
                if task.batch.lines.is_empty() && at > task.next_offset {
                    task.next_offset = at;
                    // The progress record must say so: the committed offset and the
                    // changelog's next offset always agree.
                    task.dirty = true;
                }
            } else if let Some(r) = &mut self.rekey
                && let Some(p) = r.positions.get_mut(tp)
                && at > *p
            {
                *p = at;
            }
        }
        Ok(())
    }
}
