//! The driver's steps for table (see `runtime/kafka/table.rs` for its parts).

use crate::error::RunError;
use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::TaskFactory;
use crate::runtime::kafka::table::{next_epoch, writer_name};
use crate::runtime::kafka::task::Task;
use sessionizer_connectors::sink::{Prepared, SinkMark};

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Opens the table writer of a task just built or restored, at the epoch after its
    /// last committed one (rolling that one forward into the table if it is missing).
    pub(in crate::runtime::kafka) fn open_table(
        &self,
        task: &mut Task<F::Op>,
    ) -> Result<(), RunError> {
        let Some(settings) = &self.cfg.table else {
            return Ok(());
        };
        let group = self.kafka.group.as_deref().unwrap_or_default();
        let topic = &self.topics[task.tp.topic as usize];
        let name = writer_name(group, topic, task.tp.partition);
        let mut writer = (settings.make)();
        let last = task.delta.clone().map(SinkMark::Delta);
        let found = writer.recover(next_epoch(&task.delta), last.as_ref(), &mut || {
            Ok(name.clone())
        })?;
        if let Some(epoch) = found.rolled_forward {
            tracing::info!(
                task = %task.names[0].name,
                epoch,
                "the table had not committed the task's last epoch; committed it now"
            );
        }
        if !found.removed.is_empty() {
            tracing::info!(
                task = %task.names[0].name,
                files = found.removed.len(),
                "deleted the task's data files that no table commit names"
            );
        }
        task.table = Some(writer);
        task.table_prepared = false;
        Ok(())
    }

    /// Phase one for the tasks in the transaction about to commit: each closes its
    /// epoch's data files and records them for its progress record.
    pub(in crate::runtime::kafka) fn prepare_tables(&mut self) -> Result<(), RunError> {
        for task in self.tasks.values_mut().filter(|t| t.dirty) {
            let Some(writer) = task.table.as_mut() else {
                continue;
            };
            if task.flushed {
                // The task's last epoch: committed to the table whatever the interval.
                writer.closing();
            }
            let prepared = writer.prepare(next_epoch(&task.delta), "sessions")?;
            let Some(Prepared {
                mark: SinkMark::Delta(mark),
                ..
            }) = prepared
            else {
                return Err(RunError::Internal(
                    "a task's table writer prepared no table epoch",
                ));
            };
            task.delta = Some(mark);
            task.table_prepared = true;
        }
        Ok(())
    }

    /// Phase two, once the transaction committed: each task that prepared an epoch
    /// commits it to the table.
    pub(in crate::runtime::kafka) fn commit_tables(&mut self) -> Result<(), RunError> {
        for task in self.tasks.values_mut().filter(|t| t.table_prepared) {
            if let Some(writer) = task.table.as_mut() {
                writer.commit()?;
            }
            task.table_prepared = false;
        }
        Ok(())
    }
}
