//! The Parquet output against records made by the real JSON encoder, read back with the
//! parquet crate's Arrow reader.

use super::schema::parse_time;
use super::*;
use crate::SessionEncoder;
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMillisecondType};
use arrow_schema::{DataType, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sessionizer_core::EventTime;
use sessionizer_core::timefmt::write_rfc3339_ms;
use sessionizer_window::{AggKind, AggState, Emit, EmitMode, SessionView};
use std::fs;
use std::path::Path;

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
const DAY: i64 = 86_400_000;

/// Sessions and retractions encoded by [`SessionEncoder`] for a table of `aggs`.
struct Fixture {
    aggs: Vec<(String, AggKind)>,
    emit: EmitMode,
    encoder: SessionEncoder,
}

impl Fixture {
    fn new(aggs: &[(&str, AggKind)], emit: EmitMode) -> Fixture {
        let aggs: Vec<(String, AggKind)> = aggs.iter().map(|(n, k)| (n.to_string(), *k)).collect();
        let names: Vec<String> = aggs.iter().map(|(n, _)| n.clone()).collect();
        Fixture {
            encoder: SessionEncoder::new(&names, emit),
            aggs,
            emit,
        }
    }

    fn schema(&self) -> SessionSchema {
        SessionSchema::new(&self.aggs, self.emit).expect("schema")
    }

    /// A session of `key` from `start` to `end`; `values[i]` are the raw JSON values
    /// added to aggregate `i`, in event order.
    fn session(&mut self, key: &str, start: i64, end: i64, values: &[&[&str]]) {
        let states: Vec<AggState> = self
            .aggs
            .iter()
            .enumerate()
            .map(|(i, (_, kind))| {
                let mut state = AggState::new(*kind);
                for (seq, raw) in values
                    .get(i)
                    .copied()
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                {
                    state.add(start, seq as u64, raw.as_bytes());
                }
                state
            })
            .collect();
        self.encoder.session(&SessionView {
            key: key.as_bytes(),
            start: EventTime(start),
            end: EventTime(end),
            close: EventTime(end + 1000),
            event_count: 3,
            revision: 2,
            complete: true,
            aggregates: states.as_slice(),
        });
    }

    fn retraction(&mut self, key: &str, start: i64) {
        self.encoder.retraction(key.as_bytes(), EventTime(start));
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.encoder.buf)
    }
}

/// Every row of one Parquet file, as one batch.
fn read(path: &Path) -> RecordBatch {
    let file = fs::File::open(path).expect("open the file");
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("a Parquet file")
        .with_batch_size(1 << 20)
        .build()
        .expect("a reader");
    let mut batches = reader.collect::<Result<Vec<_>, _>>().expect("batches");
    assert_eq!(batches.len(), 1, "{}", path.display());
    batches.remove(0)
}

fn strings(b: &RecordBatch, column: &str) -> Vec<Option<String>> {
    let a = b.column_by_name(column).expect(column).as_string::<i32>();
    a.iter().map(|v| v.map(str::to_string)).collect()
}

fn ints(b: &RecordBatch, column: &str) -> Vec<Option<i64>> {
    let a = b.column_by_name(column).expect(column);
    a.as_primitive::<Int64Type>().iter().collect()
}

fn floats(b: &RecordBatch, column: &str) -> Vec<Option<f64>> {
    let a = b.column_by_name(column).expect(column);
    a.as_primitive::<Float64Type>().iter().collect()
}

fn bools(b: &RecordBatch, column: &str) -> Vec<Option<bool>> {
    b.column_by_name(column)
        .expect(column)
        .as_boolean()
        .iter()
        .collect()
}

fn times(b: &RecordBatch, column: &str) -> Vec<Option<i64>> {
    let a = b.column_by_name(column).expect(column);
    a.as_primitive::<TimestampMillisecondType>()
        .iter()
        .collect()
}

/// The files under `dir` (and its `dt=` directories), relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("list") {
        let entry = entry.expect("entry");
        let name = entry.file_name().into_string().expect("UTF-8");
        if entry.path().is_dir() {
            for inner in fs::read_dir(entry.path()).expect("list") {
                let inner = inner.expect("entry").file_name();
                out.push(format!("{name}/{}", inner.into_string().expect("UTF-8")));
            }
        } else {
            out.push(name);
        }
    }
    out.sort();
    out
}

fn options(row_group_rows: usize) -> ParquetOptions {
    ParquetOptions {
        row_group_rows,
        ..ParquetOptions::default()
    }
}

/// Writes `records` as epoch 1 into `dir`, prepares and commits it.
fn write_committed(dir: &Path, schema: SessionSchema, records: &[u8]) -> Staged {
    let mut files = ParquetFiles::new(dir, schema, options(1000), 1).expect("files");
    files.write(records).expect("write");
    let staged = files.prepare(1).expect("prepare");
    files.commit(&staged).expect("commit");
    staged
}

const ALL: [(&str, AggKind); 7] = [
    ("pages", AggKind::Collect),
    ("entry", AggKind::First),
    ("exit", AggKind::Last),
    ("users", AggKind::CountDistinct),
    ("total", AggKind::Sum),
    ("low", AggKind::Min),
    ("high", AggKind::Max),
];

#[test]
fn every_column_type_reads_back_with_the_arrow_reader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&ALL, EmitMode::OnUpdate);
    fx.session(
        "k1",
        T0,
        T0 + 1500,
        &[
            &["1", "\"a\""],
            &["\"x\"", "\"y\""],
            &["\"x\"", "{\"k\":1}"],
            &["1", "1", "2"],
            &["1", "2"],
            &["3", "1.50"],
            &["3", "1.50"],
        ],
    );
    fx.session("k\"2", T0 + 10, T0 + 10, &[]);
    let records = fx.take();
    let staged = write_committed(dir.path(), fx.schema(), &records);
    assert_eq!(staged.files.len(), 1);
    let b = read(&dir.path().join(&staged.files[0].name));

    let schema = b.schema();
    let utc = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let types: Vec<(&str, &DataType, bool)> = schema
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type(), f.is_nullable()))
        .collect();
    assert_eq!(
        types,
        vec![
            ("key", &DataType::Utf8, false),
            ("session_id", &DataType::Utf8, false),
            ("start", &utc, true),
            ("end", &utc, true),
            ("duration_ms", &DataType::Int64, true),
            ("event_count", &DataType::Int64, true),
            ("revision", &DataType::Int64, true),
            ("complete", &DataType::Boolean, true),
            ("retract", &DataType::Boolean, false),
            ("pages", &DataType::Utf8, true),
            ("entry", &DataType::Utf8, true),
            ("exit", &DataType::Utf8, true),
            ("users", &DataType::Int64, true),
            ("total", &DataType::Float64, true),
            ("low", &DataType::Float64, true),
            ("high", &DataType::Float64, true),
        ]
    );
    let kind = schema.field_with_name("users").expect("users").metadata();
    assert_eq!(
        kind.get(AGGREGATE_METADATA).map(String::as_str),
        Some("count-distinct")
    );
    // Batches do not carry the schema's own metadata; the file's schema does.
    let file = fs::File::open(dir.path().join(&staged.files[0].name)).expect("open");
    let file_schema = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .schema()
        .clone();
    assert_eq!(
        file_schema
            .metadata()
            .get(EMIT_METADATA)
            .map(String::as_str),
        Some("on-update")
    );

    let json: Vec<serde_json::Value> = records
        .split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("JSON"))
        .collect();
    let ids: Vec<Option<String>> = json
        .iter()
        .map(|r| r["session_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(strings(&b, "key"), [Some("k1".into()), Some("k\"2".into())]);
    assert_eq!(strings(&b, "session_id"), ids);
    assert_eq!(times(&b, "start"), [Some(T0), Some(T0 + 10)]);
    assert_eq!(times(&b, "end"), [Some(T0 + 1500), Some(T0 + 10)]);
    assert_eq!(ints(&b, "duration_ms"), [Some(1500), Some(0)]);
    assert_eq!(ints(&b, "event_count"), [Some(3), Some(3)]);
    assert_eq!(ints(&b, "revision"), [Some(2), Some(2)]);
    assert_eq!(bools(&b, "complete"), [Some(true), Some(true)]);
    assert_eq!(bools(&b, "retract"), [Some(false), Some(false)]);
    assert_eq!(
        strings(&b, "pages"),
        [Some("[1,\"a\"]".into()), Some("[]".into())]
    );
    assert_eq!(strings(&b, "entry"), [Some("\"x\"".into()), None]);
    assert_eq!(strings(&b, "exit"), [Some("{\"k\":1}".into()), None]);
    assert_eq!(ints(&b, "users"), [Some(2), Some(0)]);
    assert_eq!(floats(&b, "total"), [Some(3.0), None]);
    assert_eq!(floats(&b, "low"), [Some(1.5), None]);
    assert_eq!(floats(&b, "high"), [Some(3.0), None]);
}

#[test]
fn a_sum_column_holds_integer_float_and_infinite_sums() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[("total", AggKind::Sum)], EmitMode::OnClose);
    fx.session("int", T0, T0, &[&["2", "3"]]);
    fx.session("float", T0, T0, &[&["2", "0.5"]]);
    fx.session("huge", T0, T0, &[&["1e308", "1e308"]]);
    fx.session("-huge", T0, T0, &[&["-1e308", "-1e308"]]);
    fx.session(
        "wide",
        T0,
        T0,
        &[&["9223372036854775807", "9223372036854775807"]],
    );
    fx.session("none", T0, T0, &[&["\"not a number\""]]);
    let records = fx.take();
    let text = String::from_utf8(records.clone()).expect("UTF-8");
    assert!(text.contains("\"total\":\"Infinity\""), "{text}");
    assert!(text.contains("\"total\":18446744073709551614"), "{text}");
    let staged = write_committed(dir.path(), fx.schema(), &records);
    let b = read(&dir.path().join(&staged.files[0].name));
    assert_eq!(
        floats(&b, "total"),
        [
            Some(5.0),
            Some(2.5),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
            Some(18_446_744_073_709_551_614.0),
            None
        ]
    );

    // NaN is no sum the aggregate makes from finite numbers, but the record may say it.
    let schema =
        SessionSchema::new(&[("total".into(), AggKind::Sum)], EmitMode::OnClose).expect("schema");
    let line = br#"{"key":"k","session_id":"0000000000000001","start":"2024-01-01T00:00:00.000Z","end":"2024-01-01T00:00:00.000Z","duration_ms":0,"event_count":1,"revision":0,"total":"NaN"}"#;
    let row = schema.parse(line).expect("fits");
    let session = row.session.expect("a session");
    assert!(matches!(session.aggregates[0], schema::AggValue::Float(Some(v)) if v.is_nan()));
}

#[test]
fn collect_first_and_last_keep_the_json_text_of_mixed_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let aggs = [
        ("all", AggKind::Collect),
        ("first", AggKind::First),
        ("last", AggKind::Last),
        ("low", AggKind::Min),
    ];
    let mut fx = Fixture::new(&aggs, EmitMode::OnClose);
    let mixed = [
        "1",
        "\"two\"",
        "{\"three\":[3,null,true]}",
        "[4.50]",
        "false",
        "\"é\\n\"",
        "1e400",
    ];
    fx.session("k", T0, T0, &[&mixed, &mixed, &mixed, &mixed]);
    let records = fx.take();
    let staged = write_committed(dir.path(), fx.schema(), &records);
    let b = read(&dir.path().join(&staged.files[0].name));
    let all = strings(&b, "all")[0].clone().expect("a value");
    assert_eq!(all, format!("[{}]", mixed.join(",")));
    assert_eq!(strings(&b, "first"), [Some("1".into())]);
    assert_eq!(strings(&b, "last"), [Some("1e400".into())]);
    // The number as written is not kept: 1e400 is past the float range.
    assert_eq!(floats(&b, "low"), [Some(1.0)]);

    let mut fx = Fixture::new(&[("high", AggKind::Max)], EmitMode::OnClose);
    fx.session("k", T0, T0, &[&["1", "1e400"]]);
    let records = fx.take();
    let dir = tempfile::tempdir().expect("tempdir");
    let staged = write_committed(dir.path(), fx.schema(), &records);
    let b = read(&dir.path().join(&staged.files[0].name));
    assert_eq!(floats(&b, "high"), [Some(f64::INFINITY)]);
}

#[test]
fn a_retraction_is_key_id_and_retract_with_nulls_elsewhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&ALL, EmitMode::OnUpdate);
    fx.session("k", T0, T0 + 5, &[]);
    fx.retraction("k", T0);
    let records = fx.take();
    let staged = write_committed(dir.path(), fx.schema(), &records);
    let b = read(&dir.path().join(&staged.files[0].name));
    assert_eq!(b.num_rows(), 2);
    let ids = strings(&b, "session_id");
    assert_eq!(ids[0], ids[1], "the retraction names the session");
    assert_eq!(strings(&b, "key"), [Some("k".into()), Some("k".into())]);
    assert_eq!(bools(&b, "retract"), [Some(false), Some(true)]);
    for column in ["duration_ms", "event_count", "revision", "users"] {
        assert_eq!(ints(&b, column)[1], None, "{column}");
    }
    for column in ["start", "end"] {
        assert_eq!(times(&b, column)[1], None, "{column}");
    }
    for column in ["pages", "entry", "exit"] {
        assert_eq!(strings(&b, column)[1], None, "{column}");
    }
    for column in ["total", "low", "high"] {
        assert_eq!(floats(&b, column)[1], None, "{column}");
    }
    assert_eq!(bools(&b, "complete")[1], None);
    assert_eq!(strings(&b, "pages")[0].as_deref(), Some("[]"));
}

#[test]
fn final_mode_has_no_revision_complete_or_retract_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&ALL, EmitMode::Final);
    fx.session("k", T0, T0 + 5, &[]);
    let records = fx.take();
    let schema = fx.schema();
    let staged = write_committed(dir.path(), schema.clone(), &records);
    let b = read(&dir.path().join(&staged.files[0].name));
    let names: Vec<&str> = b
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(
        names,
        [
            "key",
            "session_id",
            "start",
            "end",
            "duration_ms",
            "event_count",
            "pages",
            "entry",
            "exit",
            "users",
            "total",
            "low",
            "high"
        ]
    );
    let nullable: Vec<&str> = b
        .schema_ref()
        .fields()
        .iter()
        .filter(|f| f.is_nullable())
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(nullable, ["entry", "exit", "total", "low", "high"]);

    // A retraction, or a revision, has no place in a final table.
    let mut files = ParquetFiles::new(dir.path(), schema, options(10), 2).expect("files");
    let mut fx = Fixture::new(&ALL, EmitMode::OnClose);
    fx.retraction("k", T0);
    let err = files.write(&fx.take()).expect_err("no retract column");
    assert!(err.to_string().contains("`retract` has no column"), "{err}");
    fx.session("k", T0, T0, &[]);
    let err = files.write(&fx.take()).expect_err("no revision column");
    assert!(
        err.to_string().contains("`revision` has no column"),
        "{err}"
    );
}

#[test]
fn a_record_that_does_not_fit_is_an_error_and_nothing_of_its_call_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[("low", AggKind::Min)], EmitMode::OnClose);
    fx.session("good", T0, T0, &[&["1"]]);
    let good = fx.take();
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), options(10), 1).expect("files");

    let line = String::from_utf8(good.clone()).expect("UTF-8");
    let cases = [
        (line.replace("\"low\":1", "\"low\":\"1\""), "`low` is \"1\""),
        (line.replace(",\"low\":1", ""), "`low` is missing"),
        (
            line.replace("\"low\":1", "\"low\":1,\"x\":2"),
            "`x` has no column",
        ),
        (
            line.replace("\"revision\":2", "\"revision\":2.5"),
            "`revision` is 2.5",
        ),
        (line.replace("2024-01-01T", "2024-13-01T"), "`start` is"),
        ("[1,2]\n".to_string(), "not a JSON object"),
    ];
    for (bad, says) in cases {
        let mut call = good.clone();
        call.extend_from_slice(bad.as_bytes());
        let err = files.write(&call).expect_err(&bad);
        assert!(matches!(err, ParquetError::Record { .. }), "{err:?}");
        assert!(err.to_string().contains(says), "{err} / {says}");
    }
    let staged = files.prepare(1).expect("prepare");
    assert!(
        staged.files.is_empty(),
        "no good record of a failed call was kept"
    );
    assert_eq!(files.write(&good).expect("write"), 1, "the writer goes on");
}

#[test]
fn aggregate_names_that_clash_with_columns_or_each_other_are_refused() {
    for aggs in [
        vec![("start".to_string(), AggKind::Min)],
        vec![
            ("a".to_string(), AggKind::Min),
            ("a".to_string(), AggKind::Max),
        ],
    ] {
        let err = SessionSchema::new(&aggs, EmitMode::Final).expect_err("a clash");
        assert!(matches!(err, ParquetError::ColumnName(_)), "{err:?}");
    }
}

#[test]
fn files_roll_by_size_and_their_rows_concatenate_to_the_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[("n", AggKind::Sum)], EmitMode::OnClose);
    let opts = ParquetOptions {
        row_group_rows: 10,
        max_file_bytes: 2000,
        partition_by_date: false,
        final_names: None,
    };
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), opts, 7).expect("files");
    let mut keys = Vec::new();
    for i in 0..95 {
        let key = format!("key-{i:03}-{}", "x".repeat(i % 50));
        fx.session(&key, T0 + i as i64, T0 + i as i64, &[&[&i.to_string()]]);
        keys.push(Some(key));
        if i % 7 == 0 {
            files.write(&fx.take()).expect("write");
        }
    }
    files.write(&fx.take()).expect("write");
    let staged = files.prepare(7).expect("prepare");
    assert!(staged.files.len() > 2, "{staged:?}");
    files.commit(&staged).expect("commit");

    let mut read_keys = Vec::new();
    for (n, f) in staged.files.iter().enumerate() {
        assert_eq!(f.name, format!("part-00000000000000000007-{n:05}.parquet"));
        let len = fs::metadata(dir.path().join(&f.name)).expect("final").len();
        assert_eq!(f.bytes, len);
        if n + 1 < staged.files.len() {
            assert!(f.bytes >= 2000, "rolled only once full: {f:?}");
        }
        let b = read(&dir.path().join(&f.name));
        assert_eq!(b.num_rows() as u64, f.rows);
        read_keys.extend(strings(&b, "key"));
    }
    assert_eq!(read_keys, keys);
}

#[test]
fn row_groups_hold_the_configured_number_of_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[], EmitMode::Final);
    for i in 0..25 {
        fx.session(&format!("k{i}"), T0, T0, &[]);
    }
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), options(10), 0).expect("files");
    files.write(&fx.take()).expect("write");
    let staged = files.prepare(0).expect("prepare");
    let file = fs::File::open(dir.path().join(&staged.files[0].temp)).expect("open");
    let meta = ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet");
    let groups: Vec<i64> = meta
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .collect();
    assert_eq!(groups, [10, 10, 5]);
}

#[test]
fn staged_files_stay_hidden_until_commit_and_a_second_commit_is_harmless() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[], EmitMode::OnClose);
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), options(10), 3).expect("files");
    fx.session("k", T0, T0, &[]);
    files.write(&fx.take()).expect("write");
    assert_eq!(
        listing(dir.path()),
        [".part-00000000000000000003-00000.parquet.tmp"]
    );

    let staged = files.prepare(3).expect("prepare");
    assert_eq!(files.epoch(), 4);
    assert_eq!(
        listing(dir.path()),
        [".part-00000000000000000003-00000.parquet.tmp"]
    );
    assert_eq!(
        staged.files[0].temp,
        ".part-00000000000000000003-00000.parquet.tmp"
    );
    assert_eq!(
        staged.files[0].name,
        "part-00000000000000000003-00000.parquet"
    );

    // The checkpoint keeps the list as it is.
    let kept: Staged =
        serde_json::from_str(&serde_json::to_string(&staged).expect("to JSON")).expect("from JSON");
    assert_eq!(kept, staged);

    files.commit(&kept).expect("commit");
    assert_eq!(
        listing(dir.path()),
        ["part-00000000000000000003-00000.parquet"]
    );
    files.commit(&kept).expect("a second commit");
    assert_eq!(
        listing(dir.path()),
        ["part-00000000000000000003-00000.parquet"]
    );
    assert_eq!(read(&dir.path().join(&staged.files[0].name)).num_rows(), 1);

    let err = files.prepare(9).expect_err("not the open epoch");
    assert!(
        matches!(err, ParquetError::Epoch { asked: 9, open: 4 }),
        "{err:?}"
    );
    assert!(files.prepare(4).expect("empty epoch").files.is_empty());
}

#[test]
fn abort_deletes_the_open_epoch_and_leaves_prepared_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[], EmitMode::OnClose);
    let opts = ParquetOptions {
        row_group_rows: 2,
        max_file_bytes: 1,
        partition_by_date: false,
        final_names: None,
    };
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), opts, 1).expect("files");
    fx.session("a", T0, T0, &[]);
    files.write(&fx.take()).expect("write");
    let staged = files.prepare(1).expect("prepare");
    for k in ["b", "c", "d"] {
        fx.session(k, T0, T0, &[]);
    }
    files.write(&fx.take()).expect("write");
    assert_eq!(
        listing(dir.path()).len(),
        3,
        "one prepared, one full, one open"
    );
    files.abort().expect("abort");
    assert_eq!(listing(dir.path()), [staged.files[0].temp.clone()]);

    fx.session("e", T0, T0, &[]);
    files.write(&fx.take()).expect("write after abort");
    let again = files.prepare(2).expect("prepare");
    assert_eq!(
        again.files[0].name,
        "part-00000000000000000002-00000.parquet"
    );
    files.commit(&staged).expect("commit 1");
    files.commit(&again).expect("commit 2");
    let b = read(&dir.path().join(&again.files[0].name));
    assert_eq!(strings(&b, "key"), [Some("e".into())]);
}

#[test]
fn recover_rolls_the_committed_epoch_forward_and_deletes_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[], EmitMode::OnClose);
    let opts = ParquetOptions {
        partition_by_date: true,
        ..options(10)
    };
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), opts, 1).expect("files");
    fx.session("a", T0, T0, &[]);
    fx.session("b", T0 + DAY, T0 + DAY, &[]);
    files.write(&fx.take()).expect("write");
    let first = files.prepare(1).expect("prepare 1");
    let done = first.clone();
    fx.session("c", T0, T0, &[]);
    files.write(&fx.take()).expect("write");
    let second = files.prepare(2).expect("prepare 2");
    fx.session("d", T0, T0, &[]);
    files.write(&fx.take()).expect("write");
    // The process dies: epoch 1 is in a checkpoint but not renamed, epoch 2 prepared
    // without a checkpoint, epoch 3 open.
    drop(files);
    fs::write(dir.path().join("notes.txt"), "not ours").expect("write");

    let found = ParquetFiles::recover(dir.path(), Some(&first)).expect("recover");
    assert_eq!(
        found.renamed,
        [
            "dt=2024-01-01/part-00000000000000000001-00000.parquet",
            "dt=2024-01-02/part-00000000000000000001-00001.parquet",
        ]
    );
    let mut orphans: Vec<String> = second.files.iter().map(|f| f.temp.clone()).collect();
    orphans.push("dt=2024-01-01/.part-00000000000000000003-00000.parquet.tmp".into());
    orphans.sort();
    assert_eq!(found.deleted, orphans);
    assert!(found.later.is_empty());
    assert_eq!(
        listing(dir.path()),
        [
            "dt=2024-01-01/part-00000000000000000001-00000.parquet",
            "dt=2024-01-02/part-00000000000000000001-00001.parquet",
            "notes.txt",
        ]
    );

    // Recovering again changes nothing; a later epoch's final file is reported.
    fs::write(
        dir.path()
            .join("dt=2024-01-01/part-00000000000000000005-00000.parquet"),
        "",
    )
    .expect("write");
    let again = ParquetFiles::recover(dir.path(), Some(&done)).expect("recover again");
    assert!(
        again.renamed.is_empty() && again.deleted.is_empty(),
        "{again:?}"
    );
    assert_eq!(
        again.later,
        ["dt=2024-01-01/part-00000000000000000005-00000.parquet"]
    );

    // A committed file under neither name is lost data, not something to skip.
    fs::remove_file(dir.path().join(&done.files[0].name)).expect("remove");
    let err = ParquetFiles::recover(dir.path(), Some(&done)).expect_err("lost");
    assert!(matches!(err, ParquetError::Lost { .. }), "{err:?}");

    let mut outside = done.clone();
    outside.files[0].temp = "../elsewhere.parquet.tmp".into();
    let err = ParquetFiles::recover(dir.path(), Some(&outside)).expect_err("outside");
    assert!(matches!(err, ParquetError::StagedName(_)), "{err:?}");

    let empty = tempfile::tempdir().expect("tempdir");
    let none = ParquetFiles::recover(&empty.path().join("missing"), None).expect("no dir");
    assert_eq!(none, Recovered::default());
}

#[test]
fn a_replay_writes_the_same_files_under_the_same_names() {
    let mut fx = Fixture::new(&ALL, EmitMode::OnUpdate);
    for i in 0..40 {
        fx.session(
            &format!("k{i}"),
            T0 + i * DAY / 10,
            T0 + i * DAY / 10,
            &[&["1"]],
        );
        if i % 9 == 0 {
            fx.retraction(&format!("k{i}"), T0);
        }
    }
    let records = fx.take();
    let opts = ParquetOptions {
        row_group_rows: 4,
        max_file_bytes: 3000,
        partition_by_date: true,
        final_names: None,
    };
    let run = |dir: &Path| {
        let mut files = ParquetFiles::new(dir, fx.schema(), opts.clone(), 12).expect("files");
        for chunk in records
            .split_inclusive(|&b| b == b'\n')
            .collect::<Vec<_>>()
            .chunks(5)
        {
            files.write(&chunk.concat()).expect("write");
        }
        let staged = files.prepare(12).expect("prepare");
        files.commit(&staged).expect("commit");
        staged
    };
    let (a, b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (staged_a, staged_b) = (run(a.path()), run(b.path()));
    assert_eq!(staged_a, staged_b);
    assert!(staged_a.files.len() > 3, "{staged_a:?}");
    for f in &staged_a.files {
        let bytes_a = fs::read(a.path().join(&f.name)).expect("a");
        let bytes_b = fs::read(b.path().join(&f.name)).expect("b");
        assert!(bytes_a == bytes_b, "{} differs", f.name);
    }
}

#[test]
fn hive_directories_by_the_start_date_and_retractions_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fx = Fixture::new(&[], EmitMode::OnClose);
    fx.session("a", T0 + 5, T0 + DAY + 5, &[]);
    fx.session("b", T0 + DAY, T0 + DAY, &[]);
    fx.session("c", T0 + DAY - 1, T0 + DAY, &[]);
    fx.retraction("a", T0 - 10);
    fx.session("d", -DAY, -DAY, &[]);
    let opts = ParquetOptions {
        partition_by_date: true,
        ..options(100)
    };
    let mut files = ParquetFiles::new(dir.path(), fx.schema(), opts, 1).expect("files");
    files.write(&fx.take()).expect("write");
    let staged = files.prepare(1).expect("prepare");
    files.commit(&staged).expect("commit");
    assert_eq!(
        listing(dir.path()),
        [
            "dt=1969-12-31/part-00000000000000000001-00003.parquet",
            "dt=2024-01-01/part-00000000000000000001-00000.parquet",
            "dt=2024-01-02/part-00000000000000000001-00001.parquet",
            "dt=__HIVE_DEFAULT_PARTITION__/part-00000000000000000001-00002.parquet",
        ]
    );
    let names: Vec<&str> = staged.files.iter().map(|f| f.name.as_str()).collect();
    assert!(
        names.is_sorted_by_key(|n| n.rsplit('/').next()),
        "{names:?}"
    );
    let keys = |sub: &str, n: u32| {
        let path = dir
            .path()
            .join(format!("{sub}/part-00000000000000000001-{n:05}.parquet"));
        strings(&read(&path), "key")
    };
    assert_eq!(
        keys("dt=2024-01-01", 0),
        [Some("a".into()), Some("c".into())]
    );
    assert_eq!(keys("dt=2024-01-02", 1), [Some("b".into())]);
    assert_eq!(keys("dt=__HIVE_DEFAULT_PARTITION__", 2), [Some("a".into())]);
    assert_eq!(keys("dt=1969-12-31", 3), [Some("d".into())]);
}

#[test]
fn times_of_any_year_read_back_as_written() {
    for ms in [
        0,
        T0,
        -1,
        253_402_300_799_999, // 9999-12-31T23:59:59.999Z
        253_402_300_800_000, // +10000-01-01
        -62_167_219_200_001, // -0001-12-31T23:59:59.999Z
        -62_167_219_200_000, // 0000-01-01
        8_000_000_000_000_000,
        -8_000_000_000_000_000,
        i64::MAX,
        i64::MIN,
    ] {
        let mut text = Vec::new();
        write_rfc3339_ms(EventTime(ms), &mut text);
        let text = String::from_utf8(text).expect("ASCII");
        assert_eq!(parse_time(&text), Some(ms), "{text}");
    }
    assert_eq!(
        parse_time("+99999999999999999999-01-01T00:00:00.000Z"),
        None
    );
    assert_eq!(parse_time("+1-01-01T00:00:00.000Z"), None);
}
