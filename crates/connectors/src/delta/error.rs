//! Why a Delta table could not be read or written.

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
