//! A library job's own rows into a Delta Lake table, exactly once with its
//! [`Checkpoints`] (cargo feature `delta`).
//!
//! A [`DeltaSink<T>`] takes items of any serde type `T` — a session window's records
//! mapped to your type, a stateful function's outputs — and appends them to a Delta
//! table in a local directory or on S3-compatible storage (`s3://bucket/path`, with the
//! usual `AWS_*` variables). The table's columns come from `T` itself
//! ([`columns_of`]: traced from its `Deserialize` impl) or are given
//! ([`DeltaSink::exactly_once_with_columns`]: to make a text field a timestamp column,
//! say). The table is created with them when it does not exist; an existing table must
//! have exactly those columns.
//!
//! Each checkpoint of the job is one epoch of the table: the items taken since the last
//! checkpoint are written as Parquet data files, the checkpoint records them, and once
//! it is durable they are committed to the table's log with a transaction
//! `(sessionizer-<instance id>, epoch)`. A job restarted from its state directory
//! commits the recorded files of its last checkpoint if the table missed them (the run
//! before was killed in between) and deletes the data files that no commit names, so a
//! job killed at any instant and started again leaves every row in the table once.
//! Rows become visible to readers at the checkpoints only.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use sessionizer::prelude::*;
//! use sessionizer::table::DeltaSink;
//!
//! #[derive(Serialize, Deserialize)]
//! struct VisitSession {
//!     visit_id: String,
//!     start: String,
//!     pages: Vec<String>,
//! }
//!
//! let mut checkpoints = Checkpoints::open("state")?;
//! let mut sessions = DeltaSink::<VisitSession>::exactly_once("lake/sessions", &mut checkpoints)?;
//! // ... job.restore(&mut checkpoints)?, push records, map them to VisitSession and
//! // send them to `sessions`, then job.checkpoint(&mut checkpoints)?
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::api::checkpoints::{Checkpoints, StateError};
use crate::api::joined::SharedWriter;
use crate::api::sink::{Sink, SinkError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_arrow::schema::{SchemaLike, TracingOptions};
use sessionizer_connectors::parquet::SessionSchema;
use std::marker::PhantomData;
use std::sync::Arc;

/// Arrow's schema types, to give a table's columns
/// ([`DeltaSink::exactly_once_with_columns`]).
pub use sessionizer_connectors::parquet::arrow_schema::{
    DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit,
};

/// Why the columns of a type cannot be told.
#[derive(Debug, thiserror::Error)]
#[error(
    "the table's columns cannot be traced from the type {type_name}: {reason}; give them with DeltaSink::exactly_once_with_columns"
)]
pub struct ColumnsError {
    type_name: &'static str,
    reason: String,
}

/// The table columns of rows of type `T`, traced from its `Deserialize` impl: a field
/// per column in the struct's order, `Option` fields nullable, nested structs as
/// structs, sequences as lists, maps as maps, enums without data as text. Delta has no
/// unsigned integers: `u8`, `u16` and `u32` get the next wider signed column, `u64`
/// a 64-bit one (a value past `i64::MAX` is then refused when written). A time kept as
/// text stays text: give a timestamp column with
/// [`DeltaSink::exactly_once_with_columns`] to have RFC 3339 text read as times.
pub fn columns_of<T: DeserializeOwned>() -> Result<Schema, ColumnsError> {
    let options = TracingOptions::default()
        .map_as_struct(false)
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false)
        .bytes_as_large_binary(false)
        .enums_without_data_as_strings(true);
    let fields = Vec::<FieldRef>::from_type::<T>(options).map_err(|e| ColumnsError {
        type_name: std::any::type_name::<T>(),
        reason: e.to_string(),
    })?;
    Ok(Schema::new(
        fields
            .iter()
            .map(|f| Arc::new(for_delta(f)))
            .collect::<Fields>(),
    ))
}

/// `field` with the types Delta has: signed integers only, no dictionaries.
fn for_delta(field: &Field) -> Field {
    let data_type = match field.data_type() {
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 | DataType::UInt64 => DataType::Int64,
        DataType::Dictionary(_, value) => value.as_ref().clone(),
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().map(|f| Arc::new(for_delta(f))).collect())
        }
        DataType::List(item) => DataType::List(Arc::new(for_delta(item))),
        DataType::Map(entries, sorted) => DataType::Map(Arc::new(for_delta(entries)), *sorted),
        other => other.clone(),
    };
    Field::new(field.name(), data_type, field.is_nullable()).with_metadata(field.metadata().clone())
}

/// Items of type `T` appended to a Delta table, exactly once with a job's
/// [`Checkpoints`] (see the module's documentation).
#[derive(Debug)]
pub struct DeltaSink<T> {
    writer: SharedWriter,
    line: Vec<u8>,
    rows: PhantomData<fn(T)>,
}

impl<T: Serialize> DeltaSink<T> {
    /// A sink into the table at `location` (a directory, or `s3://bucket/path`) whose
    /// columns are those of `T` ([`columns_of`]), joined to `checkpoints` before the
    /// job's restore (as the state directory's other outputs): the table is created if
    /// missing and brought back to the checkpoint found.
    pub fn exactly_once(location: &str, checkpoints: &mut Checkpoints) -> Result<Self, StateError>
    where
        T: DeserializeOwned,
    {
        let columns = columns_of::<T>().map_err(|e| StateError::Output(e.to_string()))?;
        Self::exactly_once_with_columns(location, columns, checkpoints)
    }

    /// The same with the columns given: each item, as serde writes it in JSON, is read
    /// into them (every field must have a column; a missing field is null, refused for
    /// a column that may not be null; RFC 3339 text goes into a timestamp column).
    pub fn exactly_once_with_columns(
        location: &str,
        columns: Schema,
        checkpoints: &mut Checkpoints,
    ) -> Result<Self, StateError> {
        let schema = SessionSchema::of_rows(Arc::new(columns));
        let writer = checkpoints.join_table(location, schema)?;
        Ok(DeltaSink {
            writer,
            line: Vec::new(),
            rows: PhantomData,
        })
    }

    /// Items taken so far.
    pub fn records(&self) -> u64 {
        self.writer.lock().records()
    }
}

impl<T: Serialize> Sink<T> for DeltaSink<T> {
    /// Takes one item; it reaches the table with the job's next checkpoint. Items are
    /// read into the columns in blocks (when the sink's buffer is full, and at the
    /// checkpoint): an item that does not fit fails that `send` or that checkpoint, the
    /// error naming the first item of the block that does not fit, and the sink then
    /// refuses everything until a restart — which meets the item again: fix the type or
    /// the columns.
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &item)?;
        self.line.push(b'\n');
        let line = &self.line;
        self.writer.lock().append(line, 1)?;
        Ok(())
    }
}

impl<T: Serialize> Sink<T> for &mut DeltaSink<T> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        Sink::<T>::send(&mut **self, item)
    }
}
