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

mod source;
mod stats;
mod storage;
mod store;
mod table;
#[cfg(test)]
mod tests;

pub use source::{DataFile, DeltaRows, TableHistory, table_history};
pub use storage::DeltaStorage;
pub use table::{DeltaOutput, Recovered, app_id, committed_version, recorded_location};

pub use sessionizer_checkpoint::{DeltaEpoch, DeltaFileRef};

use crate::parquet::ParquetError;
use std::path::PathBuf;

/// An error of the Delta table output.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// Writing the data files failed.
    #[error(transparent)]
    Parquet(#[from] ParquetError),
    /// delta-rs failed: reading the log, creating the table or committing.
    #[error("Delta table {table}: cannot {action}: {source}")]
    Table {
        /// The table's location.
        table: String,
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// A table read as an input cannot be read, or not as one.
    #[error("Delta table {table} as an input: {reason}")]
    Input {
        /// The table's location.
        table: String,
        /// Why.
        reason: String,
    },
    /// The table's location is neither a local directory nor `s3://bucket/path`.
    #[error("Delta table {0}: give a local directory or an S3 location (s3://bucket/path)")]
    Location(String),
    /// The async runtime could not be started.
    #[error("cannot start the runtime of the Delta table output: {0}")]
    Runtime(#[source] std::io::Error),
    /// The table exists with other columns than the session records'.
    #[error(
        "the Delta table {table} does not fit the session records: {}; write to a new table, or run with the options that made it",
        differences.join("; ")
    )]
    Schema {
        /// The table's location.
        table: String,
        /// What differs, one column at a time.
        differences: Vec<String>,
    },
    /// The table holds commits of this job past the checkpoint resumed from.
    #[error(
        "the Delta table {table} holds the rows of this job up to checkpoint {committed} (application id {app_id}), but the checkpoint resumed from is {}; resuming would write rows twice. Use a new table, or start the job over with another state directory",
        resumed.map_or_else(|| "none (the state directory has no checkpoint)".to_string(), |e| e.to_string())
    )]
    Ahead {
        /// The table's location.
        table: String,
        /// The job's application id.
        app_id: String,
        /// The table's transaction version for it.
        committed: i64,
        /// The checkpoint epoch resumed from.
        resumed: Option<u64>,
    },
    /// The checkpoint's record belongs to another table or job.
    #[error(
        "the checkpoint's Delta output is the table {recorded_table} with application id {recorded_app}, this run writes {table} as {app_id}; resume with --delta-table {recorded_table} (and the state directory's instance id), or use another state directory"
    )]
    Mismatch {
        /// The recorded table.
        recorded_table: String,
        /// The recorded application id.
        recorded_app: String,
        /// This run's table.
        table: String,
        /// This run's application id.
        app_id: String,
    },
    /// A file the checkpoint recorded is gone or changed before its commit.
    #[error(
        "the data file {} recorded by the checkpoint is {what}: the table directory lost data the checkpoint counted on; restore the file, or start over with a new table and state directory",
        path.display()
    )]
    Lost {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A file system operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Statistics of a written file could not be read back.
    #[error("cannot read the statistics of {}: {source}", path.display())]
    Stats {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: parquet::errors::ParquetError,
    },
}
