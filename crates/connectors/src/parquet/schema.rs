//! The columns of a session table, decided from the run's options, and the reading of
//! one encoded session record into a row of them.

use super::error::ParquetError;
use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde_json::value::RawValue;
use sessionizer_core::EventTime;
use sessionizer_core::timefmt::{format_rfc3339_ms, parse_timestamp};
use sessionizer_window::{AggKind, EmitMode};
use std::collections::HashMap;
use std::sync::Arc;

/// The field metadata key naming an aggregate column's kind (`sum`, `collect`, ...), so
/// that a reader knows which text columns hold JSON.
pub const AGGREGATE_METADATA: &str = "sessionizer.aggregate";
/// The schema metadata key naming the emit mode (`on-close`, `on-update`, `final`).
pub const EMIT_METADATA: &str = "sessionizer.emit";

// The fields every session record has, which aggregates may not be named after.
use crate::encode::FIXED_FIELDS as FIXED;

/// Rows read into one batch by [`SessionSchema::decode_rows`].
const ROWS_PER_DECODE: usize = 8192;

/// The columns of the session table of one run. They follow the fields of the JSON
/// record for the same options, and do not change once rows are written.
#[derive(Debug, Clone)]
pub struct SessionSchema {
    arrow: SchemaRef,
    aggregates: Vec<(String, AggKind)>,
    emit: EmitMode,
    /// The rows of a library job's own type ([`of_rows`](Self::of_rows)), not the
    /// command line's session records.
    rows: bool,
}

/// Why a session record does not fit the table's columns.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The line is not a JSON object.
    #[error("not a JSON object: {0}")]
    NotJson(#[from] serde_json::Error),
    /// A field the table needs is missing.
    #[error("the field `{0}` is missing")]
    Missing(String),
    /// A field that has no column (or that this emit mode leaves out).
    #[error("the field `{0}` has no column in the table")]
    Unexpected(String),
    /// A record of a library job's own rows does not fit the table's columns (a field
    /// without a column, a value of another type, a missing value where the column may
    /// not be null), as Arrow's JSON decoder says.
    #[error("{0}")]
    Columns(arrow_schema::ArrowError),
    /// A field's value is not of its column's type.
    #[error("the field `{field}` is {found}, where the table wants {expected}")]
    Type {
        /// The field's name.
        field: String,
        /// What the column holds.
        expected: &'static str,
        /// The value as written (shortened when long).
        found: String,
    },
}

/// One record read against the schema, owned, ready to be appended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub key: String,
    pub session_id: String,
    /// `None` for a retraction.
    pub session: Option<SessionFields>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionFields {
    pub start: i64,
    pub end: i64,
    pub duration_ms: i64,
    pub event_count: i64,
    pub revision: Option<i64>,
    pub complete: Option<bool>,
    pub aggregates: Vec<AggValue>,
}

/// An aggregate's value in its column's type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AggValue {
    Int(i64),
    Float(Option<f64>),
    Text(Option<String>),
}

impl Row {
    /// The Hive-style directory of this row when files are split by date: the UTC date
    /// of the session's start, and for a retraction (whose record carries no start)
    /// Hive's name for a null partition value.
    pub fn date_dir(&self) -> String {
        match &self.session {
            Some(s) => {
                let text = format_rfc3339_ms(EventTime(s.start));
                let date = text.split_once('T').map_or(text.as_str(), |(d, _)| d);
                format!("dt={date}")
            }
            None => "dt=__HIVE_DEFAULT_PARTITION__".to_string(),
        }
    }
}

impl SessionSchema {
    /// The table for aggregates `aggregates` (output name and kind, in record order)
    /// under emit mode `emit`. Two aggregates of one name, or an aggregate named like a
    /// field of every record (`key`, `start`, ...), would make the columns ambiguous and
    /// are refused.
    pub fn new(
        aggregates: &[(String, AggKind)],
        emit: EmitMode,
    ) -> Result<SessionSchema, ParquetError> {
        for (i, (name, _)) in aggregates.iter().enumerate() {
            if FIXED.contains(&name.as_str()) || aggregates[..i].iter().any(|(n, _)| n == name) {
                return Err(ParquetError::ColumnName(name.clone()));
            }
        }
        let final_mode = emit == EmitMode::Final;
        // Outside final mode a retraction row leaves every session column empty.
        let session_nullable = !final_mode;
        let time = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        let mut fields = vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("session_id", DataType::Utf8, false),
            Field::new("start", time.clone(), session_nullable),
            Field::new("end", time, session_nullable),
            Field::new("duration_ms", DataType::Int64, session_nullable),
            Field::new("event_count", DataType::Int64, session_nullable),
        ];
        if !final_mode {
            fields.push(Field::new("revision", DataType::Int64, true));
        }
        if emit == EmitMode::OnUpdate {
            fields.push(Field::new("complete", DataType::Boolean, true));
        }
        if !final_mode {
            fields.push(Field::new("retract", DataType::Boolean, false));
        }
        for (name, kind) in aggregates {
            let (data_type, never_null) = match kind {
                AggKind::CountDistinct => (DataType::Int64, true),
                AggKind::Sum | AggKind::Min | AggKind::Max => (DataType::Float64, false),
                AggKind::Collect => (DataType::Utf8, true),
                AggKind::First | AggKind::Last => (DataType::Utf8, false),
            };
            let metadata = HashMap::from([(AGGREGATE_METADATA.to_string(), kind.name().into())]);
            fields.push(
                Field::new(name, data_type, session_nullable || !never_null)
                    .with_metadata(metadata),
            );
        }
        let metadata = HashMap::from([(EMIT_METADATA.to_string(), emit_name(emit).to_string())]);
        Ok(SessionSchema {
            arrow: Arc::new(Schema::new_with_metadata(fields, metadata)),
            aggregates: aggregates.to_vec(),
            emit,
            rows: false,
        })
    }

    /// The table of a library job's own rows (a session window's records mapped to the
    /// user's type, a stateful function's outputs): the columns `arrow` as given. Each
    /// record (a JSON object, as serde writes the type) is read into them by Arrow's
    /// JSON decoder: every field must have a column, a missing field is null (an error
    /// for a column that may not be null), a text goes into a timestamp column when it
    /// is an RFC 3339 time.
    pub fn of_rows(arrow: SchemaRef) -> SessionSchema {
        SessionSchema {
            arrow,
            aggregates: Vec::new(),
            emit: EmitMode::Final,
            rows: true,
        }
    }

    /// Whether the table is of a library job's own rows ([`of_rows`](Self::of_rows)).
    pub fn is_rows(&self) -> bool {
        self.rows
    }

    /// Reads the JSON lines in `records` (blank lines skipped) into batches of the
    /// columns of [`of_rows`](Self::of_rows): every record or none. The error names the
    /// first record that does not fit.
    pub(crate) fn decode_rows(&self, records: &[u8]) -> Result<Vec<RecordBatch>, ParquetError> {
        let decode = |text: &[u8]| -> Result<Vec<RecordBatch>, arrow_schema::ArrowError> {
            let mut decoder = arrow_json::ReaderBuilder::new(self.arrow.clone())
                .with_batch_size(ROWS_PER_DECODE)
                .with_strict_mode(true)
                .build_decoder()?;
            let mut batches = Vec::new();
            let mut rest = text;
            while !rest.is_empty() {
                let read = decoder.decode(rest)?;
                rest = &rest[read..];
                match decoder.flush()? {
                    Some(batch) => batches.push(batch),
                    None if read == 0 => break,
                    None => {}
                }
            }
            batches.extend(decoder.flush()?);
            Ok(batches)
        };
        decode(records).map_err(|_| {
            // Which record: each one read alone, until one fails.
            let lines = records.split(|&b| b == b'\n');
            lines
                .filter(|line| !line.trim_ascii().is_empty())
                .find_map(|line| {
                    decode(line).err().map(|e| ParquetError::Record {
                        record: super::files::shorten(line),
                        reason: RecordError::Columns(e),
                    })
                })
                .unwrap_or(ParquetError::Record {
                    record: super::files::shorten(records),
                    reason: RecordError::Columns(arrow_schema::ArrowError::JsonError(
                        "the records do not fit the table's columns".into(),
                    )),
                })
        })
    }

    /// The Arrow schema of the table.
    pub fn arrow_schema(&self) -> SchemaRef {
        self.arrow.clone()
    }

    /// The emit mode the columns were decided for.
    pub fn emit(&self) -> EmitMode {
        self.emit
    }

    /// Reads one encoded record (a session or a retraction) into a row. Every field of
    /// the record must have a column and every column must get its field: a record that
    /// does not fit is an error, never cut down to fit.
    pub(crate) fn parse(&self, line: &[u8]) -> Result<Row, RecordError> {
        let mut fields: HashMap<String, &RawValue> = serde_json::from_slice(line)?;
        let key = string(take(&mut fields, "key")?, "key")?;
        let session_id = string(take(&mut fields, "session_id")?, "session_id")?;
        if let Some(raw) = fields.remove("retract") {
            if self.emit == EmitMode::Final {
                return Err(RecordError::Unexpected("retract".to_string()));
            }
            if raw.get() != "true" {
                return Err(wrong("retract", "true", raw));
            }
            no_more(fields)?;
            return Ok(Row {
                key,
                session_id,
                session: None,
            });
        }
        let start = time(take(&mut fields, "start")?, "start")?;
        let end = time(take(&mut fields, "end")?, "end")?;
        let duration_ms = int(take(&mut fields, "duration_ms")?, "duration_ms")?;
        let event_count = int(take(&mut fields, "event_count")?, "event_count")?;
        let revision = match self.emit {
            EmitMode::Final => None,
            _ => Some(int(take(&mut fields, "revision")?, "revision")?),
        };
        let complete = match self.emit {
            EmitMode::OnUpdate => Some(boolean(take(&mut fields, "complete")?, "complete")?),
            _ => None,
        };
        let aggregates = self
            .aggregates
            .iter()
            .map(|(name, kind)| aggregate(take(&mut fields, name)?, name, *kind))
            .collect::<Result<Vec<_>, _>>()?;
        no_more(fields)?;
        Ok(Row {
            key,
            session_id,
            session: Some(SessionFields {
                start,
                end,
                duration_ms,
                event_count,
                revision,
                complete,
                aggregates,
            }),
        })
    }
}

fn emit_name(emit: EmitMode) -> &'static str {
    match emit {
        EmitMode::OnClose => "on-close",
        EmitMode::OnUpdate => "on-update",
        EmitMode::Final => "final",
    }
}

fn take<'a>(
    fields: &mut HashMap<String, &'a RawValue>,
    name: &str,
) -> Result<&'a RawValue, RecordError> {
    fields
        .remove(name)
        .ok_or_else(|| RecordError::Missing(name.to_string()))
}

fn no_more(fields: HashMap<String, &RawValue>) -> Result<(), RecordError> {
    // The smallest name, so that the error does not depend on the map's order.
    match fields.into_keys().min() {
        Some(name) => Err(RecordError::Unexpected(name)),
        None => Ok(()),
    }
}

fn wrong(field: &str, expected: &'static str, raw: &RawValue) -> RecordError {
    const SHOWN: usize = 80;
    let text = raw.get();
    let found = match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    };
    RecordError::Type {
        field: field.to_string(),
        expected,
        found,
    }
}

fn string(raw: &RawValue, field: &str) -> Result<String, RecordError> {
    serde_json::from_str(raw.get()).map_err(|_| wrong(field, "a string", raw))
}

fn int(raw: &RawValue, field: &str) -> Result<i64, RecordError> {
    raw.get()
        .parse()
        .map_err(|_| wrong(field, "an integer of 64 bits", raw))
}

fn boolean(raw: &RawValue, field: &str) -> Result<bool, RecordError> {
    match raw.get() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(wrong(field, "true or false", raw)),
    }
}

fn time(raw: &RawValue, field: &str) -> Result<i64, RecordError> {
    const EXPECTED: &str = "a time as written by the encoder (YYYY-MM-DDTHH:MM:SS.mmmZ)";
    let text = string(raw, field).map_err(|_| wrong(field, EXPECTED, raw))?;
    parse_time(&text).ok_or_else(|| wrong(field, EXPECTED, raw))
}

/// Milliseconds since the epoch of a time in the encoder's form. Years outside
/// 0000-9999 are written with a sign (`+10000-01-01T...`) and the time parser takes only
/// four-digit years, so such a year is read as the year of the same place in the
/// 400-year cycle of the Gregorian calendar (which repeats exactly) and shifted back.
pub(super) fn parse_time(text: &str) -> Option<i64> {
    const MS_PER_CYCLE: i128 = 146_097 * 86_400_000;
    let Some(signed) = text.strip_prefix(['+', '-']) else {
        return parse_timestamp(text.as_bytes()).ok().map(EventTime::millis);
    };
    let (digits, rest) = signed.split_at(signed.find('-')?);
    if !(4..=19).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let magnitude: i128 = digits.parse().ok()?;
    let year = if text.starts_with('-') {
        -magnitude
    } else {
        magnitude
    };
    let stand_in = 2000 + year.rem_euclid(400);
    let millis = parse_timestamp(format!("{stand_in}{rest}").as_bytes()).ok()?;
    let cycles = (year - stand_in) / 400;
    i64::try_from(cycles * MS_PER_CYCLE + i128::from(millis.millis())).ok()
}

fn aggregate(raw: &RawValue, name: &str, kind: AggKind) -> Result<AggValue, RecordError> {
    let text = raw.get();
    let is_number = text.starts_with(|c: char| c == '-' || c.is_ascii_digit());
    // A JSON number (the parser checked its grammar) read as the nearest float; one
    // beyond the float range is an infinity, as the aggregate itself compared it.
    let number = || text.parse::<f64>().ok();
    Ok(match kind {
        AggKind::CountDistinct => AggValue::Int(int(raw, name)?),
        AggKind::Sum => {
            const EXPECTED: &str = "a number, \"Infinity\", \"-Infinity\", \"NaN\" or null";
            AggValue::Float(match text {
                "null" => None,
                "\"Infinity\"" => Some(f64::INFINITY),
                "\"-Infinity\"" => Some(f64::NEG_INFINITY),
                "\"NaN\"" => Some(f64::NAN),
                _ if is_number => Some(number().ok_or_else(|| wrong(name, EXPECTED, raw))?),
                _ => return Err(wrong(name, EXPECTED, raw)),
            })
        }
        AggKind::Min | AggKind::Max => AggValue::Float(match text {
            "null" => None,
            _ if is_number => Some(number().ok_or_else(|| wrong(name, "a number or null", raw))?),
            _ => return Err(wrong(name, "a number or null", raw)),
        }),
        AggKind::Collect if text.starts_with('[') => AggValue::Text(Some(text.to_string())),
        AggKind::Collect => return Err(wrong(name, "a JSON array", raw)),
        AggKind::First | AggKind::Last => {
            AggValue::Text((text != "null").then(|| text.to_string()))
        }
    })
}

/// The columns of rows not yet written, in the schema's order.
#[derive(Debug)]
pub(crate) struct Builders {
    schema: SchemaRef,
    key: StringBuilder,
    session_id: StringBuilder,
    start: TimestampMillisecondBuilder,
    end: TimestampMillisecondBuilder,
    duration_ms: Int64Builder,
    event_count: Int64Builder,
    revision: Option<Int64Builder>,
    complete: Option<BooleanBuilder>,
    retract: Option<BooleanBuilder>,
    aggregates: Vec<AggBuilder>,
    rows: usize,
}

#[derive(Debug)]
enum AggBuilder {
    Int(Int64Builder),
    Float(Float64Builder),
    Text(StringBuilder),
}

impl Builders {
    pub fn new(schema: &SessionSchema) -> Builders {
        let final_mode = schema.emit == EmitMode::Final;
        let time = || TimestampMillisecondBuilder::new().with_timezone("UTC");
        Builders {
            schema: schema.arrow.clone(),
            key: StringBuilder::new(),
            session_id: StringBuilder::new(),
            start: time(),
            end: time(),
            duration_ms: Int64Builder::new(),
            event_count: Int64Builder::new(),
            revision: (!final_mode).then(Int64Builder::new),
            complete: (schema.emit == EmitMode::OnUpdate).then(BooleanBuilder::new),
            retract: (!final_mode).then(BooleanBuilder::new),
            aggregates: schema
                .aggregates
                .iter()
                .map(|(_, kind)| match kind {
                    AggKind::CountDistinct => AggBuilder::Int(Int64Builder::new()),
                    AggKind::Sum | AggKind::Min | AggKind::Max => {
                        AggBuilder::Float(Float64Builder::new())
                    }
                    AggKind::Collect | AggKind::First | AggKind::Last => {
                        AggBuilder::Text(StringBuilder::new())
                    }
                })
                .collect(),
            rows: 0,
        }
    }

    /// Rows appended since the last [`finish`](Self::finish).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends a row read by [`SessionSchema::parse`] of the same schema.
    pub fn append(&mut self, row: &Row) {
        self.key.append_value(&row.key);
        self.session_id.append_value(&row.session_id);
        if let Some(r) = &mut self.retract {
            r.append_value(row.session.is_none());
        }
        match &row.session {
            Some(s) => {
                self.start.append_value(s.start);
                self.end.append_value(s.end);
                self.duration_ms.append_value(s.duration_ms);
                self.event_count.append_value(s.event_count);
                if let Some(b) = &mut self.revision {
                    b.append_option(s.revision);
                }
                if let Some(b) = &mut self.complete {
                    b.append_option(s.complete);
                }
                for (b, v) in self.aggregates.iter_mut().zip(&s.aggregates) {
                    match (b, v) {
                        (AggBuilder::Int(b), AggValue::Int(v)) => b.append_value(*v),
                        (AggBuilder::Float(b), AggValue::Float(v)) => b.append_option(*v),
                        (AggBuilder::Text(b), AggValue::Text(v)) => b.append_option(v.as_deref()),
                        // Rows come from `parse` of the same schema, which gives each
                        // aggregate the value type of its column.
                        (b, v) => unreachable!("aggregate value {v:?} for column {b:?}"),
                    }
                }
            }
            None => {
                self.start.append_null();
                self.end.append_null();
                self.duration_ms.append_null();
                self.event_count.append_null();
                if let Some(b) = &mut self.revision {
                    b.append_null();
                }
                if let Some(b) = &mut self.complete {
                    b.append_null();
                }
                for b in &mut self.aggregates {
                    match b {
                        AggBuilder::Int(b) => b.append_null(),
                        AggBuilder::Float(b) => b.append_null(),
                        AggBuilder::Text(b) => b.append_null(),
                    }
                }
            }
        }
        self.rows += 1;
    }

    /// The rows appended so far as one batch; the builders are empty again.
    pub fn finish(&mut self) -> Result<RecordBatch, ParquetError> {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.key.finish()),
            Arc::new(self.session_id.finish()),
            Arc::new(self.start.finish()),
            Arc::new(self.end.finish()),
            Arc::new(self.duration_ms.finish()),
            Arc::new(self.event_count.finish()),
        ];
        if let Some(b) = &mut self.revision {
            columns.push(Arc::new(b.finish()));
        }
        if let Some(b) = &mut self.complete {
            columns.push(Arc::new(b.finish()));
        }
        if let Some(b) = &mut self.retract {
            columns.push(Arc::new(b.finish()));
        }
        for b in &mut self.aggregates {
            columns.push(match b {
                AggBuilder::Int(b) => Arc::new(b.finish()),
                AggBuilder::Float(b) => Arc::new(b.finish()),
                AggBuilder::Text(b) => Arc::new(b.finish()),
            });
        }
        self.rows = 0;
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}
