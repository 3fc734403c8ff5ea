//! Why the Parquet output failed.

use super::schema::RecordError;
use std::path::PathBuf;

/// An error of the Parquet output.
#[derive(Debug, thiserror::Error)]
pub enum ParquetError {
    /// Two aggregates share an output name, or one is named like a fixed column.
    #[error(
        "the aggregate output name `{0}` is taken by another column of the session table; give the aggregate another name"
    )]
    ColumnName(String),
    /// A record does not fit the table's columns.
    #[error("a session record does not fit the Parquet table: {reason}; the record: {record}")]
    Record {
        /// The record (shortened when long).
        record: String,
        /// What does not fit.
        #[source]
        reason: RecordError,
    },
    /// A file system operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`create`, `rename`, `sync`, ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The Parquet writer failed.
    #[error("cannot write the Parquet file {}: {source}", path.display())]
    Parquet {
        /// The file being written (its temporary name).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// The rows did not make a batch of the schema: a bug, not a bad record.
    #[error("internal error: the rows do not form a batch of the session table: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// `prepare` was asked for another epoch than the open one.
    #[error(
        "internal error: epoch {asked} was to be prepared, but the files open are of epoch {open}"
    )]
    Epoch {
        /// The epoch asked for.
        asked: u64,
        /// The epoch whose rows the open files hold.
        open: u64,
    },
    /// A committed file is neither under its temporary name nor under its final one.
    #[error(
        "the committed file {} is missing, and so is its staged file {}: the output directory lost data a checkpoint counted on; restore the file, or start over with an empty state directory",
        name.display(), temp.display()
    )]
    Lost {
        /// The staged (temporary) path.
        temp: PathBuf,
        /// The final path.
        name: PathBuf,
    },
    /// A staged file's name would lead outside the output directory.
    #[error(
        "the staged file name `{0}` is not a file in the output directory: the list of staged files is damaged"
    )]
    StagedName(String),
    /// An earlier write failed.
    #[error(
        "an earlier write to {} failed, so what its open files hold is not known; nothing more is written until the epoch is aborted",
        dir.display()
    )]
    Failed {
        /// The output directory.
        dir: PathBuf,
    },
}
