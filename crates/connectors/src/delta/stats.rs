//! The Delta statistics of a data file, read back from its Parquet footer: the row
//! count, the null count of every column, and the least and greatest value of every
//! column whose row groups all have bounds (integers, timestamps, floats, text).
//!
//! Readers skip files by these bounds, and some (the Python `deltalake` package) take a
//! column without bounds for one whose bounds are null, which no row matches: so a
//! column gets bounds whenever the footer has them. Text bounds are the Parquet
//! writer's, which may be cut short at 64 bytes (the least value to a prefix, the
//! greatest to a prefix with its last character raised): still bounds of every value,
//! as Delta statistics may be. Float bounds leave NaN out, as Parquet's do.

use super::error::DeltaError;
use parquet::basic::{LogicalType, TimeUnit};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::statistics::Statistics;
use serde_json::{Map, Value, json};
use sessionizer_core::EventTime;
use sessionizer_core::timefmt::write_rfc3339_ms;
use std::cmp::Ordering;
use std::fs::File;
use std::path::Path;

/// The statistics of the Parquet file at `path`, as a Delta Add action carries them
/// (JSON text), and its row count.
pub(super) fn file_stats(path: &Path) -> Result<(String, u64), DeltaError> {
    let failed = |source| DeltaError::Stats {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(|source| DeltaError::Io {
        action: "open",
        path: path.to_path_buf(),
        source,
    })?;
    let reader = SerializedFileReader::new(file).map_err(failed)?;
    let meta = reader.metadata();
    let rows = meta.file_metadata().num_rows();
    let columns = meta.file_metadata().schema_descr().columns();
    let mut mins = Map::new();
    let mut maxes = Map::new();
    let mut nulls = Map::new();
    for (i, column) in columns.iter().enumerate() {
        // A value inside a list or a map has no statistics in Delta.
        if column.max_rep_level() > 0 {
            continue;
        }
        // Delta statistics give times as text: a timestamp's unit per millisecond.
        let per_ms = match column.logical_type_ref() {
            Some(LogicalType::Timestamp(t)) => Some(match t.unit {
                TimeUnit::MILLIS => 1,
                TimeUnit::MICROS => 1_000,
                TimeUnit::NANOS => 1_000_000,
            }),
            // Days (a date) or a decimal's digits: no bounds of ours fit.
            Some(LogicalType::Date | LogicalType::Decimal(_)) => continue,
            _ => None,
        };
        // Bytes get text bounds only in a text column (not binary that happens to be
        // UTF-8).
        let bytes_are_text = matches!(
            column.logical_type_ref(),
            Some(LogicalType::String | LogicalType::Json | LogicalType::Enum)
        );
        let mut null_count = Some(0u64);
        // None once a row group has values but no bounds.
        let mut bounds: Option<Option<(Bound, Bound)>> = Some(None);
        for group in meta.row_groups() {
            let chunk = group.column(i);
            let stats = chunk.statistics();
            let group_nulls = stats.and_then(Statistics::null_count_opt);
            null_count = null_count.zip(group_nulls).map(|(a, b)| a + b);
            let all_null = group_nulls.is_some_and(|n| n as i64 == chunk.num_values());
            let group = stats
                .and_then(group_bounds)
                .filter(|(lo, _)| bytes_are_text || !matches!(lo, Bound::Text(_)));
            bounds = match (bounds, group) {
                (Some(None), Some(b)) => Some(Some(b)),
                (Some(Some((l, h))), Some((lo, hi))) => Some(
                    l.pick(lo, Ordering::Less)
                        .zip(h.pick(hi, Ordering::Greater)),
                ),
                (b, None) if all_null => b,
                _ => None,
            };
        }
        // A struct's field sits under the struct's name.
        let path = column.path().parts();
        if let Some(n) = null_count {
            insert(&mut nulls, path, json!(n));
        }
        if let Some(Some((lo, hi))) = bounds {
            let (lo, hi) = match (per_ms, lo, hi) {
                (Some(per), Bound::Int(lo), Bound::Int(hi)) => (
                    Bound::Time(lo.div_euclid(per)),
                    // Rounded up: still a bound of every value.
                    Bound::Time(hi.div_euclid(per) + i64::from(hi.rem_euclid(per) != 0)),
                ),
                (_, lo, hi) => (lo, hi),
            };
            insert(&mut mins, path, lo.json());
            insert(&mut maxes, path, hi.json());
        }
    }
    let stats = Value::Object(Map::from_iter([
        ("numRecords".to_string(), json!(rows)),
        ("minValues".to_string(), Value::Object(mins)),
        ("maxValues".to_string(), Value::Object(maxes)),
        ("nullCount".to_string(), Value::Object(nulls)),
    ]));
    Ok((stats.to_string(), u64::try_from(rows).unwrap_or(0)))
}

/// Puts `value` at `path` (a column, or a struct's field) in `map`.
fn insert(map: &mut Map<String, Value>, path: &[String], value: Value) {
    match path {
        [] => {}
        [name] => {
            map.insert(name.clone(), value);
        }
        [name, rest @ ..] => {
            let inner = map
                .entry(name.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(inner) = inner {
                insert(inner, rest, value);
            }
        }
    }
}

/// One bound of a column: an integer, a time (milliseconds since the epoch), a float or
/// UTF-8 text.
#[derive(Debug, Clone, PartialEq)]
enum Bound {
    Int(i64),
    Time(i64),
    Float(f64),
    Text(String),
}

impl Bound {
    /// Of two bounds of one column, the one that comes first in order `keep` (`Less`:
    /// the least, `Greater`: the greatest); `None` for bounds of two kinds.
    fn pick(self, other: Bound, keep: Ordering) -> Option<Bound> {
        let order = match (&self, &other) {
            (Bound::Int(a), Bound::Int(b)) | (Bound::Time(a), Bound::Time(b)) => a.cmp(b),
            (Bound::Float(a), Bound::Float(b)) => a.total_cmp(b),
            (Bound::Text(a), Bound::Text(b)) => a.cmp(b),
            _ => return None,
        };
        Some(if order == keep || order.is_eq() {
            self
        } else {
            other
        })
    }

    fn json(&self) -> Value {
        match self {
            Bound::Time(ms) => json!(timestamp_text(*ms)),
            Bound::Int(v) => json!(v),
            Bound::Float(v) => json!(v),
            Bound::Text(v) => json!(v),
        }
    }
}

/// The bounds of a row group's column, when its footer has them (text only when it is
/// UTF-8; floats only when finite, which JSON can hold).
fn group_bounds(stats: &Statistics) -> Option<(Bound, Bound)> {
    match stats {
        Statistics::Int64(s) => Some((Bound::Int(*s.min_opt()?), Bound::Int(*s.max_opt()?))),
        Statistics::Int32(s) => Some((
            Bound::Int(i64::from(*s.min_opt()?)),
            Bound::Int(i64::from(*s.max_opt()?)),
        )),
        Statistics::Float(s) => {
            let (lo, hi) = (f64::from(*s.min_opt()?), f64::from(*s.max_opt()?));
            (lo.is_finite() && hi.is_finite()).then_some((Bound::Float(lo), Bound::Float(hi)))
        }
        Statistics::Double(s) => {
            let (lo, hi) = (*s.min_opt()?, *s.max_opt()?);
            (lo.is_finite() && hi.is_finite()).then_some((Bound::Float(lo), Bound::Float(hi)))
        }
        Statistics::ByteArray(s) => {
            let lo = s.min_opt()?.as_utf8().ok()?.to_string();
            let hi = s.max_opt()?.as_utf8().ok()?.to_string();
            Some((Bound::Text(lo), Bound::Text(hi)))
        }
        _ => None,
    }
}

/// A timestamp bound as Delta statistics write it: RFC 3339, UTC, milliseconds.
fn timestamp_text(ms: i64) -> String {
    let mut out = Vec::with_capacity(24);
    write_rfc3339_ms(EventTime(ms), &mut out);
    String::from_utf8_lossy(&out).into_owned()
}
