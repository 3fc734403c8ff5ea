//! The Delta statistics of a data file, read back from its Parquet footer: the row
//! count, the null count of every column, and the least and greatest value of the
//! integer and timestamp columns (`start`, `end`, `duration_ms`, `event_count`, ...),
//! which readers use to skip files.
//!
//! Text columns get no bounds (a Parquet writer may cut long string bounds short), nor
//! do float columns (NaN is left out of Parquet's bounds but not of a reader's
//! comparisons): a reader then reads those files, which is always correct.

use super::DeltaError;
use parquet::basic::LogicalType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::statistics::Statistics;
use serde_json::{Map, Value, json};
use sessionizer_core::EventTime;
use sessionizer_core::timefmt::write_rfc3339_ms;
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
        let timestamp = matches!(
            column.logical_type_ref(),
            Some(LogicalType::Timestamp { .. })
        );
        let mut null_count = Some(0u64);
        // None once a row group has no bounds while it has values.
        let mut bounds: Option<Option<(i64, i64)>> = Some(None);
        for group in meta.row_groups() {
            let chunk = group.column(i);
            let values = chunk.num_values();
            let stats = chunk.statistics();
            let group_nulls = stats.and_then(Statistics::null_count_opt);
            null_count = null_count.zip(group_nulls).map(|(a, b)| a + b);
            let all_null = group_nulls.is_some_and(|n| n as i64 == values);
            match stats {
                Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                    (Some(&lo), Some(&hi)) => {
                        bounds = bounds
                            .map(|b| Some(b.map_or((lo, hi), |(l, h)| (l.min(lo), h.max(hi)))));
                    }
                    _ if all_null => {}
                    _ => bounds = None,
                },
                _ => bounds = None,
            }
        }
        let name = column.name().to_string();
        if let Some(n) = null_count {
            nulls.insert(name.clone(), json!(n));
        }
        if let Some(Some((lo, hi))) = bounds {
            let (lo, hi) = if timestamp {
                (json!(timestamp_text(lo)), json!(timestamp_text(hi)))
            } else {
                (json!(lo), json!(hi))
            };
            mins.insert(name.clone(), lo);
            maxes.insert(name, hi);
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

/// A timestamp bound as Delta statistics write it: RFC 3339, UTC, milliseconds.
fn timestamp_text(ms: i64) -> String {
    let mut out = Vec::with_capacity(24);
    write_rfc3339_ms(EventTime(ms), &mut out);
    String::from_utf8_lossy(&out).into_owned()
}
