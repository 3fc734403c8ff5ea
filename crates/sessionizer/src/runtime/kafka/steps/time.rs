//! Watermarks that move without a record of the task's own: a task of a re-keyed topic
//! following the input partitions' times (docs/semantics.md K-6), and a quiet partition
//! moving on with the clock under `--idle-timeout` (S-32).

use crate::error::RunError;
use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::task::UpstreamMark;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_core::{EventTime, Watermark};
use std::time::Duration;

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Moves the watermark of each task of the re-keyed topic that heard a watermark
    /// record to the smallest time of the input partitions (docs/semantics.md K-6) and
    /// sends what completes. The poll loop ends a round at a watermark record, so the
    /// records staged before it are processed first and none after it is staged yet.
    pub(in crate::runtime::kafka) fn follow_upstreams(&mut self) -> Result<(), RunError> {
        let due: Vec<(TopicPartition, i64)> = self
            .tasks
            .values_mut()
            .filter(|t| t.upstream_changed && t.batch.lines.is_empty() && !t.flushed)
            .filter_map(|t| {
                t.upstream_changed = false;
                UpstreamMark::least(&t.upstream, &self.upstream_inputs).map(|least| (t.tp, least))
            })
            .collect();
        for (id, least) in due {
            let task = self.tasks.get_mut(&id).expect("task exists");
            let before = task.op.watermark();
            task.op.clear_outputs();
            task.op.observe_upstream(EventTime(least), task.next_seq);
            if task.op.watermark() == before {
                continue;
            }
            task.watermark_at_last_input = task.op.watermark();
            task.dirty = true;
            self.send_outputs(id)?;
        }
        Ok(())
    }

    /// Moves the watermark of every task whose partition has been quiet for `limit`
    /// on with the wall clock (docs/semantics.md S-32).
    pub(in crate::runtime::kafka) fn advance_idle(
        &mut self,
        limit: Duration,
    ) -> Result<(), RunError> {
        // Records held back for a micro-batch they do not fill run now, as a shorter
        // one, when nothing came after them for `limit`.
        let mut cut = false;
        for t in self.tasks.values_mut() {
            if !t.batch.lines.is_empty() && t.staged_at.elapsed() >= limit {
                t.cut = true;
                cut = true;
            }
        }
        if cut {
            self.process_staged()?;
        }
        if let Some(r) = &mut self.rekey {
            r.mark_idle(limit);
        }
        let limit = crate::runtime::millis(limit);
        let due: Vec<(TopicPartition, Watermark)> = self
            .tasks
            .iter()
            .filter(|(_, t)| !t.flushed)
            .filter_map(|(&id, t)| {
                let quiet = crate::runtime::millis(t.last_input.elapsed());
                crate::runtime::idle_watermark(limit, quiet, t.watermark_at_last_input)
                    .filter(|&w| w > t.op.watermark())
                    .map(|w| (id, w))
            })
            .collect();
        // A commit running meanwhile ends first; if it was aborted, every task went
        // back to the commit before (the next round looks again).
        if !due.is_empty() && self.settle()? {
            return Ok(());
        }
        for (id, w) in due {
            let task = self.tasks.get_mut(&id).expect("task exists");
            task.op.clear_outputs();
            task.op.advance_idle(w, task.next_seq);
            if task.op.sessions().tags.is_empty() && task.op.late().1.is_empty() {
                continue;
            }
            task.dirty = true;
            self.send_outputs(id)?;
        }
        Ok(())
    }
}
