//! Session records appended to a Delta Lake table (cargo feature `delta`), exactly once
//! with the job's checkpoints.
//!
//! The rows are the Parquet output's ([`SessionSchema`](crate::parquet::SessionSchema),
//! written by [`ParquetFiles`](crate::parquet::ParquetFiles)): a table's data files
//! are the files `--output-format parquet` would write, and its columns are theirs. The
//! table is created with those columns on first use; an existing table whose columns
//! differ is refused, naming the differences.
//!
//! # Files
//!
//! A Delta table's readers see the data files its log lists and nothing else, so an
//! epoch's files are written straight into the table's directory under their final
//! names, `part-<job>-<epoch, 20 digits>-<n, 5 digits>.parquet`: `<job>` is the job's
//! instance id (one writer's files are told from another's by it), `n` counts the
//! files of an epoch from 0.
//!
//! # Exactly once
//!
//! The job's transactions in the table carry the application id `sessionizer-<job>`
//! and, as their version, the checkpoint epoch whose rows they add (the Delta
//! protocol's `txn` action, which the table keeps per application id). Per epoch:
//!
//! 1. [`DeltaOutput::prepare`] closes the epoch's files (footer written, synced) and
//!    returns a [`DeltaEpoch`]: the files with their sizes, rows and statistics, which
//!    the checkpoint's manifest records;
//! 2. once the checkpoint is durable, [`DeltaOutput::commit`] makes one Delta commit
//!    with an Add action for each of those files and the transaction
//!    `(sessionizer-<job>, epoch)`. An epoch without rows makes no commit;
//! 3. a restarted run opens the table with the `DeltaEpoch` of the checkpoint it
//!    resumes from ([`DeltaOutput::open`]): if the table's transaction version for the
//!    job is below that epoch, the process stopped between the checkpoint and the
//!    commit, and the recorded files are committed now, with the epoch's version — once,
//!    since the commit moves the version up to it. Then every file of the job that no
//!    commit can name is deleted: the files of later epochs (never recorded by a
//!    checkpoint that survives) and files of the epoch that its record does not list.
//!
//! With a commit interval ([`DeltaOutput::set_commit_interval`]) an epoch whose commit is
//! not due records its files as *pending* (with those of the pending epochs before it)
//! and makes no commit; the next due epoch commits them all with its own version, and a
//! run resuming from a pending epoch carries its files on. The run's last epoch always
//! commits ([`DeltaOutput::finish`]).
//!
//! A table whose transaction version for the job is past the checkpoint resumed from
//! (newer checkpoints damaged or deleted, an old copy of the state directory) already
//! holds rows that the run would write again: refused.
//!
//! delta-rs is asynchronous; the output runs it on a current-thread Tokio runtime of
//! its own, on the caller's thread.

mod error;
mod source;
mod stats;
mod storage;
mod store;
mod table;
#[cfg(test)]
mod tests;

pub use error::DeltaError;
pub use source::{DataFile, DeltaRows, TableHistory, table_history};
pub use storage::DeltaStorage;
pub use table::{DeltaOutput, Recovered, app_id, committed_version, recorded_location};

pub use sessionizer_checkpoint::{DeltaEpoch, DeltaFileRef};
