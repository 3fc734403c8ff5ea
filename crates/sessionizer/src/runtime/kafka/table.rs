//! A Delta table as the sessions' output of a Kafka job (exactly once, with a group).
//!
//! Each task is a writer of its own in the table: its data files are named by the task
//! (`<group>-<topic>-<partition>`) and its table commits carry the transaction
//! `(sessionizer-<group>-<topic>-<partition>, epoch)`, the epoch counted by the task.
//! The task's epochs ride on the job's Kafka transactions, as a checkpoint's ride on
//! the state directory of a file job:
//!
//! 1. before a transaction commits, every task in it closes its epoch's data files
//!    (uploaded, for a table on S3) and puts their list in its progress record — in the
//!    transaction, with the task's changelog and the consumed offsets;
//! 2. once the transaction committed, each such task commits its files to the table;
//! 3. whoever restores the task (this process after an aborted transaction, another
//!    after a rebalance or a crash) opens its writer with the progress record's epoch:
//!    an epoch the table lacks is committed then, once, and the task's files that no
//!    commit names (those of an aborted transaction) are deleted.
//!
//! A table commit that another owner of the task made first (a process that lost the
//! partition and committed late) is recognised by the task's transaction version and
//! not made twice.

use super::KafkaJob;
use super::op::TaskFactory;
use super::task::Task;
use crate::error::RunError;
use sessionizer_connectors::RecordWriter;
use sessionizer_connectors::sink::{Prepared, SinkMark};

/// How the job's tasks make their writers of the table.
#[derive(Clone)]
pub(crate) struct TableSettings {
    /// A writer of the table, not opened yet (`RecordWriter::delta`).
    pub make: std::sync::Arc<dyn Fn() -> RecordWriter + Send + Sync>,
}

impl std::fmt::Debug for TableSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSettings").finish_non_exhaustive()
    }
}

/// A task's next epoch of the table: the one after its last listed epoch (`last`).
fn next_epoch(last: &Option<sessionizer_checkpoint::DeltaEpoch>) -> u64 {
    last.as_ref().map_or(1, |d| d.epoch + 1)
}

/// The name of a task as a writer of the table (its data files', its application id's).
fn writer_name(group: &str, topic: &str, partition: i32) -> String {
    format!("{group}-{topic}-{partition}")
}

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Opens the table writer of a task just built or restored, at the epoch after its
    /// last committed one (rolling that one forward into the table if it is missing).
    pub(super) fn open_table(&self, task: &mut Task<F::Op>) -> Result<(), RunError> {
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
    pub(super) fn prepare_tables(&mut self) -> Result<(), RunError> {
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
    pub(super) fn commit_tables(&mut self) -> Result<(), RunError> {
        for task in self.tasks.values_mut().filter(|t| t.table_prepared) {
            if let Some(writer) = task.table.as_mut() {
                writer.commit()?;
            }
            task.table_prepared = false;
        }
        Ok(())
    }
}

/// A task's rows of its last step go to its own writer of the table (`table`, the
/// task's).
pub(super) fn append(
    table: &mut Option<RecordWriter>,
    records: &[u8],
    count: u64,
) -> Result<(), RunError> {
    table
        .as_mut()
        .expect("a task of a table job has its writer")
        .append(records, count)?;
    Ok(())
}
