//! The Delta output against a real table on disk: records made by the JSON encoder,
//! the table's log read back with delta-rs, the data files with the parquet crate.

use super::table::schema_differences;
use super::*;
use crate::SessionEncoder;
use crate::parquet::SessionSchema;
use deltalake::kernel::StructType;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel as _;
use parquet::file::reader::{FileReader, SerializedFileReader};
use sessionizer_core::EventTime;
use sessionizer_window::{Emit, EmitMode, SessionView};
use std::fs;
use std::path::Path;

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
const JOB: &str = "0123456789abcdef";

/// A local table's location, as `--delta-table` takes it.
fn loc(dir: &Path) -> &str {
    dir.to_str().expect("a UTF-8 temporary path")
}

fn schema(emit: EmitMode) -> SessionSchema {
    SessionSchema::new(&[], emit).expect("schema")
}

/// `n` final sessions, the i-th of key `k<first + i>` from `T0 + i s` for one minute.
fn sessions(first: usize, n: usize) -> Vec<u8> {
    let mut encoder = SessionEncoder::new(&[], EmitMode::Final);
    for i in first..first + n {
        let start = T0 + i as i64 * 1000;
        encoder.session(&SessionView {
            key: format!("k{i}").as_bytes(),
            start: EventTime(start),
            end: EventTime(start + 60_000),
            close: EventTime(start + 90_000),
            event_count: 2,
            revision: 0,
            complete: true,
            aggregates: &[],
        });
    }
    std::mem::take(&mut encoder.buf)
}

/// The table's data files (relative paths, sorted), its version and the job's
/// transaction version, read by a fresh delta-rs handle.
fn logged(dir: &Path) -> (Vec<String>, Option<u64>, Option<i64>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (txn, version) = committed_version(loc(dir), &app_id(JOB)).expect("readable");
    let files = runtime.block_on(async {
        let url = deltalake::table::builder::parse_table_uri(dir.to_string_lossy()).expect("url");
        let table = deltalake::open_table(url).await.expect("a table");
        let root = format!("{}/", fs::canonicalize(dir).expect("dir").display());
        let mut files: Vec<String> = table
            .get_file_uris()
            .expect("files")
            .map(|uri| {
                let path = uri.strip_prefix("file://").unwrap_or(&uri).to_string();
                path.strip_prefix(&root).unwrap_or(&path).to_string()
            })
            .collect();
        files.sort();
        files
    });
    (files, version, txn)
}

/// The data files of the job in the table's directory, sorted.
fn on_disk(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("UTF-8"))
        .filter(|n| n.ends_with(".parquet"))
        .collect();
    names.sort();
    names
}

fn rows_in(dir: &Path, file: &str) -> i64 {
    let f = fs::File::open(dir.join(file)).expect("open");
    let reader = SerializedFileReader::new(f).expect("Parquet");
    reader.metadata().file_metadata().num_rows()
}

fn open(dir: &Path, epoch: u64, committed: Option<&DeltaEpoch>) -> (DeltaOutput, Recovered) {
    DeltaOutput::open(loc(dir), schema(EmitMode::Final), JOB, epoch, committed).expect("opened")
}

#[test]
fn an_epoch_becomes_one_commit_with_the_job_transaction() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, found) = open(&dir, 1, None);
    assert!(found.created);
    assert_eq!(out.app_id(), "sessionizer-0123456789abcdef");
    assert_eq!(out.write(&sessions(0, 5)).expect("written"), 5);
    let mark = out.prepare(1).expect("prepared");
    assert_eq!(mark.epoch, 1);
    assert_eq!(mark.app_id, "sessionizer-0123456789abcdef");
    assert_eq!(
        mark.table,
        fs::canonicalize(&dir).expect("dir").display().to_string()
    );
    let name = format!("part-{JOB}-{:020}-00000.parquet", 1);
    assert_eq!(mark.files.len(), 1);
    assert_eq!(mark.files[0].path, name);
    assert_eq!(mark.files[0].rows, 5);
    assert_eq!(
        mark.files[0].bytes,
        fs::metadata(dir.join(&name)).expect("file").len()
    );
    let stats: serde_json::Value = serde_json::from_str(&mark.files[0].stats).expect("JSON");
    assert_eq!(stats["numRecords"], 5);
    assert_eq!(stats["minValues"]["start"], "2024-01-01T00:00:00.000Z");
    assert_eq!(stats["maxValues"]["start"], "2024-01-01T00:00:04.000Z");
    assert_eq!(stats["maxValues"]["event_count"], 2);
    assert_eq!(stats["nullCount"]["key"], 0);
    // Text columns have bounds too: a reader that finds none matches no row.
    assert_eq!(stats["minValues"]["key"], "k0");
    assert_eq!(stats["maxValues"]["key"], "k4");
    // Prepared, not committed: on disk, but not in the table.
    assert_eq!(logged(&dir), (vec![], Some(0), None));
    assert_eq!(out.commit().expect("committed"), Some(1));
    assert_eq!(logged(&dir), (vec![name.clone()], Some(1), Some(1)));
    assert_eq!(rows_in(&dir, &name), 5);
    // A second commit without a new prepare adds nothing.
    assert_eq!(out.commit().expect("nothing to do"), None);
    // The next epoch's files carry its number and make the next commit.
    out.write(&sessions(5, 3)).expect("written");
    let mark = out.prepare(2).expect("prepared");
    assert_eq!(out.commit().expect("committed"), Some(2));
    let (files, version, txn) = logged(&dir);
    assert_eq!(files.len(), 2);
    assert!(files.contains(&mark.files[0].path));
    assert_eq!((version, txn), (Some(2), Some(2)));
}

#[test]
fn an_epoch_without_rows_makes_no_commit() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    let mark = out.prepare(1).expect("prepared");
    assert!(mark.files.is_empty());
    assert_eq!(out.commit().expect("nothing"), None);
    assert_eq!(logged(&dir), (vec![], Some(0), None));
    // A resume from that checkpoint has nothing to roll forward.
    drop(out);
    let (_, found) = open(&dir, 2, Some(&mark));
    assert_eq!(found.rolled_forward, None);
    assert_eq!(logged(&dir), (vec![], Some(0), None));
}

#[test]
fn a_recorded_epoch_is_rolled_forward_once_and_later_files_deleted() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    out.write(&sessions(0, 4)).expect("written");
    let first = out.prepare(1).expect("prepared");
    out.commit().expect("committed");
    out.write(&sessions(4, 4)).expect("written");
    let recorded = out.prepare(2).expect("prepared");
    // The process dies after checkpoint 2 is durable, before the table's commit, with
    // rows of epoch 3 in an open file.
    out.write(&sessions(8, 4)).expect("written");
    out.prepare(3).expect("closed");
    drop(out);
    let later = format!("part-{JOB}-{:020}-00000.parquet", 3);
    assert!(on_disk(&dir).contains(&later));
    assert_eq!(logged(&dir).2, Some(1));

    let (out, found) = open(&dir, 3, Some(&recorded));
    assert!(!found.created);
    assert_eq!(found.rolled_forward, Some(2));
    assert_eq!(found.deleted, vec![later]);
    assert_eq!(out.transaction_version().expect("read"), Some(2));
    let (files, version, txn) = logged(&dir);
    let mut expected = vec![first.files[0].path.clone(), recorded.files[0].path.clone()];
    expected.sort();
    assert_eq!(files, expected);
    assert_eq!((version, txn), (Some(2), Some(2)));
    assert_eq!(on_disk(&dir), expected);
    drop(out);

    // Opened again from the same checkpoint: the epoch is in the table, not committed
    // again.
    let (_, found) = open(&dir, 3, Some(&recorded));
    assert_eq!(found, Recovered::default());
    assert_eq!(logged(&dir), (expected, Some(2), Some(2)));
}

#[test]
fn a_resume_without_checkpoint_deletes_every_file_of_the_job_only() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    out.write(&sessions(0, 4)).expect("written");
    out.prepare(1).expect("prepared");
    drop(out);
    // Another writer's file, and a file of another job, are not this job's.
    fs::write(dir.join("part-00000-foreign.parquet"), b"x").expect("written");
    let other = format!("part-fedcba9876543210-{:020}-00000.parquet", 1);
    fs::write(dir.join(&other), b"x").expect("written");
    let (_, found) = open(&dir, 1, None);
    assert_eq!(
        found.deleted,
        vec![format!("part-{JOB}-{:020}-00000.parquet", 1)]
    );
    assert_eq!(
        on_disk(&dir),
        vec!["part-00000-foreign.parquet".to_string(), other]
    );
}

#[test]
fn a_table_ahead_of_the_checkpoint_is_refused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    out.write(&sessions(0, 2)).expect("written");
    let first = out.prepare(1).expect("prepared");
    out.commit().expect("committed");
    out.write(&sessions(2, 2)).expect("written");
    out.prepare(2).expect("prepared");
    out.commit().expect("committed");
    drop(out);
    let refused = DeltaOutput::open(loc(&dir), schema(EmitMode::Final), JOB, 2, Some(&first))
        .expect_err("the table has epoch 2");
    let text = refused.to_string();
    assert!(
        matches!(refused, DeltaError::Ahead { committed: 2, .. }),
        "{text}"
    );
    assert!(text.contains("up to checkpoint 2"), "{text}");
    assert!(text.contains("resumed from is 1"), "{text}");
    // Nothing was deleted or committed.
    assert_eq!(logged(&dir).0.len(), 2);
    // Without any checkpoint the table's transactions are just as much ahead.
    let refused = DeltaOutput::open(loc(&dir), schema(EmitMode::Final), JOB, 1, None)
        .expect_err("no checkpoint");
    assert!(refused.to_string().contains("no checkpoint"), "{refused}");
}

#[test]
fn a_checkpoint_of_another_table_or_job_is_refused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    out.write(&sessions(0, 2)).expect("written");
    let mark = out.prepare(1).expect("prepared");
    drop(out);
    let other = tmp.path().join("other");
    let refused = DeltaOutput::open(loc(&other), schema(EmitMode::Final), JOB, 2, Some(&mark))
        .expect_err("another table");
    assert!(matches!(refused, DeltaError::Mismatch { .. }), "{refused}");
    assert!(!other.join("_delta_log").exists());
    let refused = DeltaOutput::open(
        loc(&dir),
        schema(EmitMode::Final),
        "another",
        2,
        Some(&mark),
    )
    .expect_err("another job");
    assert!(
        refused.to_string().contains("sessionizer-another"),
        "{refused}"
    );
}

#[test]
fn a_recorded_file_that_is_gone_is_reported_not_committed() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    out.write(&sessions(0, 2)).expect("written");
    let mark = out.prepare(1).expect("prepared");
    drop(out);
    fs::remove_file(dir.join(&mark.files[0].path)).expect("removed");
    let refused = DeltaOutput::open(loc(&dir), schema(EmitMode::Final), JOB, 2, Some(&mark))
        .expect_err("lost");
    assert!(matches!(refused, DeltaError::Lost { .. }), "{refused}");
    assert_eq!(logged(&dir), (vec![], Some(0), None));
    // So is a table directory deleted whole.
    fs::remove_dir_all(&dir).expect("removed");
    let refused = DeltaOutput::open(loc(&dir), schema(EmitMode::Final), JOB, 2, Some(&mark))
        .expect_err("lost");
    assert!(matches!(refused, DeltaError::Lost { .. }), "{refused}");
}

#[test]
fn a_table_of_other_columns_is_refused_naming_them() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (out, _) = open(&dir, 1, None);
    drop(out);
    let refused = DeltaOutput::open(loc(&dir), schema(EmitMode::OnClose), JOB, 1, None)
        .expect_err("other columns");
    let text = refused.to_string();
    assert!(matches!(refused, DeltaError::Schema { .. }), "{text}");
    assert!(
        text.contains("the table has no column `revision`"),
        "{text}"
    );
    assert!(
        text.contains("`start` is not nullable in the table"),
        "{text}"
    );
}

#[test]
fn schema_differences_name_types_and_extra_columns() {
    let ours: StructType = schema(EmitMode::Final)
        .arrow_schema()
        .as_ref()
        .try_into_kernel()
        .expect("kernel schema");
    assert!(schema_differences(&ours, &ours).is_empty());
    let aggs = [(
        "pages".to_string(),
        sessionizer_window::AggKind::CountDistinct,
    )];
    let theirs: StructType = SessionSchema::new(&aggs, EmitMode::Final)
        .expect("schema")
        .arrow_schema()
        .as_ref()
        .try_into_kernel()
        .expect("kernel schema");
    assert_eq!(
        schema_differences(&theirs, &ours),
        vec!["the table has a column `pages` (long) that the session records do not have"]
    );
    let text = [("pages".to_string(), sessionizer_window::AggKind::Collect)];
    let ours_text: StructType = SessionSchema::new(&text, EmitMode::Final)
        .expect("schema")
        .arrow_schema()
        .as_ref()
        .try_into_kernel()
        .expect("kernel schema");
    assert_eq!(
        schema_differences(&theirs, &ours_text),
        vec!["column `pages` is long in the table, string in the session records"]
    );
}

#[test]
fn a_long_job_gets_delta_checkpoints_and_its_transaction_survives_them() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("table");
    let (mut out, _) = open(&dir, 1, None);
    let mut last = None;
    for epoch in 1..=105 {
        out.write(&sessions(epoch as usize, 1)).expect("written");
        last = Some(out.prepare(epoch).expect("prepared"));
        out.commit().expect("committed");
    }
    drop(out);
    // delta-rs writes a checkpoint of the log every 100 commits; the table is read from
    // it and the commits after it, the job's transaction version included.
    let log = dir.join("_delta_log");
    assert!(
        log.join(format!("{:020}.checkpoint.parquet", 99)).exists(),
        "{:?}",
        fs::read_dir(&log).expect("log").count()
    );
    let (files, version, txn) = logged(&dir);
    assert_eq!(files.len(), 105);
    assert_eq!((version, txn), (Some(105), Some(105)));
    let (_, found) = open(&dir, 106, last.as_ref());
    assert_eq!(found, Recovered::default());
}

/// A library job's own rows: nested and list columns, a microsecond timestamp. The
/// rows go into the table as given; the statistics bound the top-level columns and a
/// struct's fields, in milliseconds for the timestamp, and leave a list's values out.
#[test]
fn a_library_jobs_own_rows_with_nested_columns_are_committed_with_their_statistics() {
    use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("temp dir");
    let table = dir.path().join("rows");
    let columns = Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new(
            "user",
            DataType::Struct(Fields::from(vec![
                Field::new("name", DataType::Utf8, false),
                Field::new("plan", DataType::Utf8, true),
            ])),
            false,
        ),
        Field::new_list("tags", Field::new("item", DataType::Utf8, true), false),
    ]);
    let schema = SessionSchema::of_rows(Arc::new(columns));
    let (mut output, _) = DeltaOutput::open(loc(&table), schema, JOB, 1, None).expect("created");
    let rows = concat!(
        r#"{"id":2,"at":"2024-01-01T00:00:00.000500Z","user":{"name":"bo","plan":null},"tags":["a"]}"#,
        "\n",
        r#"{"id":7,"at":"2024-01-01T00:00:01.250001Z","user":{"name":"al","plan":"pro"},"tags":[]}"#,
        "\n"
    );
    assert_eq!(output.write(rows.as_bytes()).expect("fits"), 2);
    // A row that does not fit is refused with the row, and nothing of the call is taken.
    let bad = "{\"id\":3,\"at\":\"2024-01-01T00:00:00Z\",\"user\":{\"name\":\"x\"},\"tags\":[]}\n{\"id\":\"four\"}\n";
    let err = output.write(bad.as_bytes()).expect_err("a text id");
    assert!(err.to_string().contains("\"four\""), "{err}");
    let epoch = output.prepare(1).expect("prepared");
    assert_eq!(epoch.files.iter().map(|f| f.rows).sum::<u64>(), 2);
    output.commit().expect("committed");
    let (files, _, txn) = logged(&table);
    assert_eq!((files.len(), txn), (1, Some(1)));
    let (stats, rows) = super::stats::file_stats(&table.join(&files[0])).expect("stats");
    assert_eq!(rows, 2);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("JSON");
    assert_eq!(stats["minValues"]["id"], 2);
    assert_eq!(stats["maxValues"]["id"], 7);
    assert_eq!(stats["minValues"]["at"], "2024-01-01T00:00:00.000Z");
    // Rounded up to the next millisecond: still a bound.
    assert_eq!(stats["maxValues"]["at"], "2024-01-01T00:00:01.251Z");
    assert_eq!(stats["minValues"]["user"]["name"], "al");
    assert_eq!(stats["nullCount"]["user"]["plan"], 1);
    assert!(stats["minValues"].get("tags").is_none(), "{stats}");
    assert!(stats["minValues"].get("item").is_none(), "{stats}");
}
