//! A library job writing its own serde type into a Delta table, exactly once (the
//! example `table_service`, cargo feature `delta`): read by the Python `deltalake`
//! package, the table holds the job's final sessions as rows of the type; killed with
//! SIGKILL at random instants and started again, the table ends up with the same rows,
//! each once. A type whose columns cannot be traced, a row that does not fit the
//! columns, and a restore without the table are refused with a message.

#![cfg(feature = "delta")]

mod support;

#[path = "../examples/table_service.rs"]
#[allow(dead_code)]
mod table_service;

use serde::{Deserialize, Serialize};
use sessionizer::prelude::*;
use sessionizer::table::{DeltaSink, columns_of};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;
use table_service::{Visit, VisitSession};

fn service(input: &Path, state: &Path, table: &Path, out: &Path) -> Command {
    let mut c = Command::new(support::example("table_service"));
    c.arg(input).arg(state).arg(table).arg(out).arg("1000");
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn run_to_end(input: &Path, state: &Path, table: &Path, out: &Path) -> String {
    let done = service(input, state, table, out)
        .output()
        .expect("run the example");
    let err = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "the service failed: {err}");
    err
}

/// The table's rows as the `deltalake` package reads them (`scripts/delta-read.py`),
/// each as canonical JSON, sorted.
fn table_rows(table: &Path) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/delta-read.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(table)
        .output()
        .expect("python3 runs (scripts/test.sh installs deltalake)");
    assert!(
        out.status.success(),
        "delta-read.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rows: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .map(|l| canonical(serde_json::from_str(l).expect("a JSON row")))
        .collect();
    rows.sort();
    rows
}

fn canonical(v: serde_json::Value) -> String {
    // serde_json's maps are sorted by key: one text per row whatever the column order.
    serde_json::to_string(&v).expect("JSON")
}

/// The job's final sessions in one go, without checkpoints, as rows, sorted.
fn in_one_go(input: &Path) -> Vec<String> {
    let mut dead = Vec::new();
    let mut visits = JsonLines::<Visit, _>::files([input], &mut dead).expect("readable");
    let mut job = table_service::job();
    let mut outputs = Vec::new();
    let mut late = Vec::new();
    job.run(visits.by_ref(), &mut outputs, &mut late)
        .expect("in memory");
    let mut rows: Vec<String> = outputs
        .iter()
        .filter_map(WindowOutput::session)
        .map(|r| {
            let row = VisitSession::of(r);
            let mut v = serde_json::to_value(&row).expect("JSON");
            // The table's timestamp columns read back in RFC 3339 with milliseconds.
            for field in ["start", "end"] {
                let ms = sessionizer::core::timefmt::parse_timestamp(
                    v[field].as_str().expect("text").as_bytes(),
                )
                .expect("a time");
                v[field] = sessionizer::core::timefmt::format_rfc3339_ms(ms).into();
            }
            canonical(v)
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_killed_service_leaves_every_session_in_the_table_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("visits.jsonl");
    support::write_visit_lines(&input, 60_000);
    let want = in_one_go(&input);
    assert!(want.len() > 500, "{} sessions", want.len());

    // Uninterrupted: the table holds the job's final sessions, typed.
    let (state, table, out) = (
        dir.path().join("state-1"),
        dir.path().join("lake-1/sessions"),
        dir.path().join("out-1"),
    );
    let started = Instant::now();
    let said = run_to_end(&input, &state, &table, &out);
    let took = started.elapsed();
    assert!(said.contains("started from the beginning"), "{said}");
    let got = table_rows(&table);
    assert_eq!(got.len(), want.len(), "rows of the uninterrupted run");
    assert!(
        got == want,
        "the table's rows differ from the job's sessions"
    );
    let late = std::fs::read_to_string(out.join("late.jsonl")).expect("late events");
    assert!(!late.is_empty(), "the input has late events");

    // Killed with SIGKILL at random instants, started again each time.
    let (state, table, out) = (
        dir.path().join("state-2"),
        dir.path().join("lake-2/sessions"),
        dir.path().join("out-2"),
    );
    let support::Killed { kills, resumed } = support::kill_at_random_instants(
        || service(&input, &state, &table, &out),
        took,
        (20, 3),
        10,
        35,
    );
    eprintln!("{kills} kills, {resumed} runs resumed; an uninterrupted run took {took:?}");
    assert!(kills >= 3, "only {kills} kills: the runs were too short");
    assert!(
        resumed >= 2,
        "only {resumed} runs resumed from a checkpoint"
    );
    let got = table_rows(&table);
    assert_eq!(got.len(), want.len(), "rows after the kills");
    assert!(got == want, "the table's rows differ after the kills");
    assert_eq!(
        std::fs::read_to_string(out.join("late.jsonl")).expect("late events"),
        late
    );

    // Started again once done: it resumes from its last checkpoint and adds nothing.
    let said = run_to_end(&input, &state, &table, &out);
    assert!(said.contains("resumed from checkpoint"), "{said}");
    assert_eq!(table_rows(&table).len(), want.len());
}

#[derive(Debug, Serialize, Deserialize)]
struct Counted {
    key: String,
    count: u64,
    #[serde(default)]
    note: Option<String>,
}

#[test]
fn rows_that_do_not_fit_and_tables_left_out_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (state, table) = (dir.path().join("state"), dir.path().join("counts"));

    // Columns traced from the type: unsigned as signed, options nullable.
    let columns = columns_of::<Counted>().expect("traceable");
    let names: Vec<(&str, String, bool)> = columns
        .fields()
        .iter()
        .map(|f| {
            (
                f.name().as_str(),
                f.data_type().to_string(),
                f.is_nullable(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("key", "Utf8".to_string(), false),
            ("count", "Int64".to_string(), false),
            ("note", "Utf8".to_string(), true),
        ]
    );

    // A type whose Deserialize impl says nothing of its fields cannot be traced.
    let untraceable = columns_of::<serde_json::Value>().expect_err("no columns");
    assert!(
        untraceable
            .to_string()
            .contains("exactly_once_with_columns"),
        "{untraceable}"
    );

    // A value past the column's range fails the checkpoint, naming the row.
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let location = table.to_str().expect("utf8");
    let mut sink = DeltaSink::<Counted>::exactly_once(location, &mut checkpoints).expect("created");
    let mut job = table_service::job();
    assert!(job.restore(&mut checkpoints).expect("restored").is_none());
    let row = |key: &str, count| Counted {
        key: key.into(),
        count,
        note: None,
    };
    sink.send(row("a", 1)).expect("taken");
    sink.send(row("b", u64::MAX)).expect("taken");
    let err = job
        .checkpoint(&mut checkpoints)
        .expect_err("a row does not fit");
    assert!(
        err.to_string().contains("18446744073709551615"),
        "the error names the row: {err}"
    );
    drop((sink, job, checkpoints));

    // The rows that fit, checkpointed: the table has them once read back.
    let state = dir.path().join("state-2");
    let table = dir.path().join("counts-2");
    let location = table.to_str().expect("utf8");
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let mut sink = DeltaSink::<Counted>::exactly_once(location, &mut checkpoints).expect("created");
    let mut job = table_service::job();
    job.restore(&mut checkpoints).expect("restored");
    sink.send(row("a", 1)).expect("taken");
    sink.send(Counted {
        note: Some("two".into()),
        ..row("b", 2)
    })
    .expect("taken");
    job.checkpoint(&mut checkpoints).expect("checkpointed");
    assert_eq!(
        table_rows(&table),
        [
            r#"{"count":1,"key":"a","note":null}"#,
            r#"{"count":2,"key":"b","note":"two"}"#
        ]
    );
    drop((sink, job, checkpoints));

    // A restore whose checkpoint wrote into a table that was not opened again.
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let mut job = table_service::job();
    let err = job
        .restore(&mut checkpoints)
        .expect_err("the table is left out");
    assert!(err.to_string().contains("DeltaSink::exactly_once"), "{err}");
}
