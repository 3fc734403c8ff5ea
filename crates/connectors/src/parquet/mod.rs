//! Session records as typed Parquet files in a directory (cargo feature `parquet`), for
//! a file output written as Parquet instead of JSON lines.
//!
//! The writer takes the records as [`SessionEncoder`](crate::SessionEncoder) encoded
//! them — JSON lines, one or many at a time — and reads each back into a row of a table
//! whose columns are fixed by the run's options before the first row
//! ([`SessionSchema`]), so every file of a run has the same schema.
//!
//! # Columns
//!
//! | column                        | type                             | when                      |
//! |-------------------------------|----------------------------------|---------------------------|
//! | `key`                         | utf8                             | always                    |
//! | `session_id`                  | utf8 (16 hex digits)             | always                    |
//! | `start`, `end`                | timestamp (milliseconds, UTC)    | always                    |
//! | `duration_ms`, `event_count`  | int64                            | always                    |
//! | `revision`                    | int64                            | not with `--emit final`   |
//! | `complete`                    | bool                             | with `--emit on-update`   |
//! | `retract`                     | bool                             | not with `--emit final`   |
//! | a count-distinct              | int64                            | one column per aggregate, |
//! | a sum, min or max             | float64                          | under its output name, in |
//! | a collect                     | utf8: the JSON text of the array | the order of the record   |
//! | a first or last               | utf8: the JSON text of the value |                           |
//!
//! A retraction is a row with `key`, `session_id` and `retract` = true, and every other
//! column null. So outside final mode (which has no retractions) every column but `key`,
//! `session_id` and `retract` may be null. In final mode `start`, `end`, `duration_ms`,
//! `event_count` and the count-distinct and collect columns are never null; the others
//! are null where the JSON record has `null`: a sum, min or max over no number, a first
//! or last without a value.
//!
//! The types cost some of what the JSON text says, on purpose:
//!
//! * A sum is a float64 also when it is an integer in JSON (exact up to 2^53); the
//!   strings `"Infinity"`, `"-Infinity"` and `"NaN"` of a sum past the float range
//!   become those float values.
//! * A min or max is the float64 nearest the number as written: the text itself (`1.50`,
//!   an integer of more than 53 bits, `1e400`, which becomes infinity) is not kept.
//! * Collect, first and last hold any JSON values, which no one Parquet type fits: their
//!   columns keep the JSON text as the record had it. Each aggregate column carries the
//!   field metadata `sessionizer.aggregate` = its kind (`sum`, `collect`, ...), so a
//!   reader knows which text columns are JSON; the schema carries `sessionizer.emit`.
//!
//! A record that does not fit the columns — a field missing or left over, a min that is
//! not a number, a retraction in final mode — is an error ([`RecordError`]); nothing is
//! cut down to fit or skipped.
//!
//! # Files
//!
//! [`ParquetFiles`] writes into one directory: rows gather in Arrow builders, a row
//! group is written every [`row_group_rows`](ParquetOptions::row_group_rows) rows, and a
//! file is closed once it passes [`max_file_bytes`](ParquetOptions::max_file_bytes) and
//! at every checkpoint. A file is written under a hidden temporary name
//! (`.part-<epoch>-<n>.parquet.tmp`, which readers such as pyarrow skip) and gets its
//! final name `part-<epoch, 20 digits>-<n, 5 digits>.parquet` only when its epoch
//! commits. `n` counts the files of an epoch from 0, so a run replayed from a checkpoint
//! writes the same names again.
//!
//! With [`partition_by_date`](ParquetOptions::partition_by_date), files go into
//! Hive-style directories by the UTC date of the session's start (`dt=2024-01-01/`),
//! one open file per date. A retraction's record has no start, so retractions go to
//! `dt=__HIVE_DEFAULT_PARTITION__/`, Hive's directory for a null partition value.
//!
//! # Exactly once
//!
//! The runtime drives a two-phase commit per checkpoint epoch:
//!
//! 1. [`ParquetFiles::prepare`] closes every open file (footer written, synced to disk)
//!    and returns the epoch's files as [`Staged`], which the checkpoint records;
//! 2. once the checkpoint is durable, [`ParquetFiles::commit`] renames them to their
//!    final names and syncs the directories; committing again is harmless;
//! 3. a run that fails drops its open epoch with [`ParquetFiles::abort`];
//! 4. a restarted run first calls [`ParquetFiles::recover`] with the `Staged` of the
//!    checkpoint it resumes from: files that were staged there but not yet renamed are
//!    renamed, and every other temporary file (what a crashed run left) is deleted.

mod error;
mod files;
mod schema;
mod storage;
#[cfg(test)]
mod tests;

/// Arrow's schema types, in which a table's columns are given.
pub use arrow_schema;
pub use error::ParquetError;
pub use files::{ParquetFiles, ParquetOptions, Recovered, Staged, StagedFile};
pub use schema::{AGGREGATE_METADATA, EMIT_METADATA, RecordError, SessionSchema};
pub use storage::ParquetStorage;
