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

use crate::error::RunError;
use sessionizer_connectors::RecordWriter;

/// How the job's tasks make their writers of the table.
#[derive(Clone)]
pub(crate) struct TableSettings {
    /// A writer of the table, not opened yet (`DeltaStorage::writer`).
    pub make: std::sync::Arc<dyn Fn() -> RecordWriter + Send + Sync>,
}

impl std::fmt::Debug for TableSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSettings").finish_non_exhaustive()
    }
}

/// A task's next epoch of the table: the one after its last listed epoch (`last`).
pub(super) fn next_epoch(last: &Option<sessionizer_checkpoint::DeltaEpoch>) -> u64 {
    last.as_ref().map_or(1, |d| d.epoch + 1)
}

/// The name of a task as a writer of the table (its data files', its application id's).
pub(super) fn writer_name(group: &str, topic: &str, partition: i32) -> String {
    format!("{group}-{topic}-{partition}")
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
