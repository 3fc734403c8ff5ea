//! `--output-format parquet` end to end: the real binary writes Parquet files, and
//! pyarrow (not our code) reads them back through `scripts/parquet-read.py`; the rows
//! must be the session records of the JSON-lines run of the same input. Then the same
//! under `kill -9`: the files of a job killed at random instants and resumed hold the
//! rows of one uninterrupted run, each once.
#![cfg(feature = "parquet")]

#[path = "support/outputs.rs"]
mod outputs;
#[path = "support/process.rs"]
mod process;

use outputs::kill_until_done;
use process::{generate, run_ok, s};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The job's options: every aggregate kind, over fields of mixed types.
const JOB: &[&str] = &[
    "--collect",
    "page",
    "--first",
    "referrer",
    "--last",
    "mixed",
    "--count-distinct",
    "pages=page",
    "--sum",
    "dwell=duration_ms",
    "--sum",
    "mixed_sum=mixed",
    "--min",
    "min_mixed=mixed",
    "--max",
    "max_d=duration_ms",
    "--gap",
    "10m",
    "--watermark-delay",
    "1m",
    "--allowed-lateness",
    "5m",
    "--progress",
    "never",
];

/// Dirty generated visits (out of order, late, duplicated, invalid lines), each line
/// given a field `mixed` holding a number, a float, a huge number, a string, an
/// object or null, in turn. They follow three events of one visit that make a
/// retraction outside final mode: a session closed and emitted at 23:12, then an event
/// within the allowed lateness that moves its start (a new session id).
fn dirty_input(dir: &Path, events: u64, seed: u64) -> PathBuf {
    let plain = dir.join("plain.jsonl");
    generate(&plain, events, seed);
    let text = std::fs::read_to_string(&plain).expect("generated");
    let kinds = [
        "3",
        "2.5",
        "1e300",
        "\"text\"",
        "{\"a\":[1,2]}",
        "null",
        "-7",
    ];
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for (t, page) in [("23:00", "/a"), ("23:12", "/c"), ("22:55", "/b")] {
        out.push_str(&format!(
            "{{\"visit_id\":\"bridge\",\"event_time\":\"2023-12-31T{t}:00Z\",\"page\":\"{page}\",\"duration_ms\":1000}}\n"
        ));
    }
    for (i, line) in text.lines().enumerate() {
        match line.strip_suffix('}') {
            Some(head) if line.starts_with('{') => {
                out.push_str(head);
                out.push_str(",\"mixed\":");
                out.push_str(kinds[i % kinds.len()]);
                out.push_str("}\n");
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    let path = dir.join("visits.jsonl");
    std::fs::write(&path, out).expect("write input");
    path
}

/// The rows of a Parquet directory as pyarrow reads them, one JSON value per row.
fn pyarrow_rows(dir: &Path) -> Vec<Value> {
    pyarrow_rows_with(dir, &[])
}

/// As [`pyarrow_rows`], with more options of the script.
fn pyarrow_rows_with(dir: &Path, options: &[&str]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/parquet-read.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(options)
        .arg(dir)
        .output()
        .expect("python3 runs (scripts/test.sh installs pyarrow)");
    assert!(
        out.status.success(),
        "parquet-read.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines(&String::from_utf8(out.stdout).expect("utf8"))
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A record with its numbers as floats, and the infinities a float column keeps
/// written as the JSON encoder writes a sum past the float range: the table types
/// numbers, so 3 and 3.0 are one value.
fn typed(v: &Value) -> Value {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().expect("a number");
            match serde_json::Number::from_f64(f) {
                Some(n) => Value::Number(n),
                None if f > 0.0 => Value::String("Infinity".into()),
                None => Value::String("-Infinity".into()),
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(typed).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), typed(v))).collect()),
        other => other.clone(),
    }
}

fn typed_all(rows: &[Value]) -> Vec<Value> {
    rows.iter().map(typed).collect()
}

fn sorted(mut rows: Vec<Value>) -> Vec<String> {
    let mut out: Vec<String> = rows.drain(..).map(|v| v.to_string()).collect();
    out.sort();
    out
}

/// Every file name under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).expect("under").display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn run_job(input: &Path, output: &Path, extra: &[&str]) {
    let mut args = vec!["run", "--input", s(input), "--output", s(output)];
    args.extend_from_slice(JOB);
    args.extend_from_slice(extra);
    run_ok(&args);
}

#[test]
fn pyarrow_reads_the_sessions_of_the_json_lines_run_in_every_emit_mode() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = dirty_input(tmp.path(), 30_000, 5);
    for emit in ["final", "on-close", "on-update"] {
        let json = tmp.path().join(format!("{emit}.jsonl"));
        run_job(&input, &json, &["--emit", emit]);
        let want = typed_all(&lines(&std::fs::read_to_string(&json).expect("jsonl")));
        assert!(want.len() > 1_000, "{emit}: {} records", want.len());
        if emit != "final" {
            assert!(
                want.iter().any(|r| r.get("retract").is_some()),
                "{emit}: the data makes retractions"
            );
        }
        let dir = tmp.path().join(format!("{emit}-parquet"));
        run_job(
            &input,
            &dir,
            &["--emit", emit, "--output-format", "parquet"],
        );
        let got = typed_all(&pyarrow_rows(&dir));
        assert_eq!(got.len(), want.len(), "{emit}: rows");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{emit}: row {i}");
        }
        assert!(
            files_under(&dir).iter().all(|f| !f.contains(".tmp")),
            "{emit}: no staged file left: {:?}",
            files_under(&dir)
        );
        // The side outputs stay JSON lines, next to the directory.
        let dead = tmp.path().join(format!("{emit}-parquet.dead-letter.jsonl"));
        let dead_json = tmp.path().join(format!("{emit}.dead-letter.jsonl"));
        assert_eq!(
            std::fs::read(&dead).expect("dead letters"),
            std::fs::read(&dead_json).expect("dead letters of the JSON run")
        );
    }
}

#[test]
fn dated_directories_hold_each_session_under_its_start_day() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = dirty_input(tmp.path(), 20_000, 9);
    let json = tmp.path().join("s.jsonl");
    run_job(&input, &json, &["--emit", "final"]);
    let dir = tmp.path().join("dated");
    run_job(
        &input,
        &dir,
        &[
            "--emit",
            "final",
            "--output-format",
            "parquet",
            "--partition-by-date",
        ],
    );
    let want = typed_all(&lines(&std::fs::read_to_string(&json).expect("jsonl")));
    let got = typed_all(&pyarrow_rows(&dir));
    assert_eq!(sorted(got), sorted(want.clone()));
    for file in files_under(&dir) {
        assert!(file.starts_with("dt="), "{file}");
    }
    // Each file's rows start on its directory's day.
    for row in pyarrow_rows_with(&dir, &["--with-partition"]) {
        let start = row["start"].as_str().expect("start");
        let dt = row["dt"].as_str().expect("dt");
        assert_eq!(&start[..10], dt, "{row}");
    }
}

#[test]
fn a_checkpointed_run_killed_at_random_instants_keeps_every_session_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let events = 200_000;
    let input = dirty_input(tmp.path(), events, 21);
    let want_dir = tmp.path().join("want");
    let began = Instant::now();
    run_job(
        &input,
        &want_dir,
        &["--emit", "final", "--output-format", "parquet"],
    );
    let took = began.elapsed();
    let want = typed_all(&pyarrow_rows(&want_dir));

    let got_dir = tmp.path().join("got");
    let state = tmp.path().join("state");
    let log = tmp.path().join("runs.log");
    let mut args: Vec<String> = ["run", "--input", s(&input), "--output", s(&got_dir)]
        .iter()
        .chain(JOB)
        .map(|a| a.to_string())
        .collect();
    args.extend(
        [
            "--emit",
            "final",
            "--output-format",
            "parquet",
            "--state-dir",
            s(&state),
            "--checkpoint-interval",
            "20ms",
        ]
        .map(String::from),
    );
    let kills = kill_until_done(&args, &state, events, &log, (took, 10, 7));
    assert!(kills >= 10, "only {kills} kills (runs take {took:?})");
    let got = typed_all(&pyarrow_rows(&got_dir));
    assert_eq!(got.len(), want.len(), "rows after {kills} kills");
    // The same rows in the same order: files are read in the order of their epochs.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "row {i} after {kills} kills");
    }
    let files = files_under(&got_dir);
    assert!(
        files.iter().all(|f| !f.contains(".tmp")),
        "staged files left: {files:?}"
    );
    eprintln!("parquet crash test: {kills} kills, {} files", files.len());
}

#[test]
fn parquet_needs_a_directory_and_dates_need_parquet() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = dirty_input(tmp.path(), 100, 1);
    let out = process::run(&["run", "--input", s(&input), "--output-format", "parquet"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--output DIR"), "{err}");
    let out = process::run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&tmp.path().join("o.jsonl")),
        "--partition-by-date",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--output-format parquet"), "{err}");
}
