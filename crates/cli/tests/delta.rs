//! `--delta-table` end to end: the real binary appends sessions to a Delta table, and
//! the Python `deltalake` package (not our code) reads the table back through
//! `scripts/delta-read.py`; its rows must be the session records of the JSON-lines
//! `--emit final` run of the same input, each once — after a resume over new input,
//! after `kill -9` at random instants, and after a crash between a checkpoint and the
//! table's commit. The same on S3 (SeaweedFS on 127.0.0.1, `scripts/s3-dev.sh`), where two
//! jobs also write one table at once. And from Kafka (a real broker, `scripts/kafka-dev.sh`):
//! a group job's table holds the sessions of the file runs of its input partitions,
//! through `kill -9` at random instants.
//!
//! A table is named by its location held as a path: a directory, or `s3://bucket/path`
//! (which goes through a `Path` unchanged).
#![cfg(feature = "delta")]

#[cfg(feature = "kafka")]
#[path = "support/kafka.rs"]
mod kafka;
#[path = "support/outputs.rs"]
mod outputs;
#[path = "support/process.rs"]
mod process;
#[path = "support/s3.rs"]
mod s3;

use outputs::kill_until_done;
use process::{run, run_ok, s, signal};
use serde_json::Value;
use sessionizer_checkpoint::StateDir;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The job's options: aggregates of every column type a table gets.
const JOB: &[&str] = &[
    "--collect",
    "page",
    "--first",
    "referrer",
    "--count-distinct",
    "pages=page",
    "--sum",
    "dwell=duration_ms",
    "--max",
    "max_dwell=duration_ms",
    "--gap",
    "10m",
    "--watermark-delay",
    "1m",
    "--allowed-lateness",
    "5m",
    "--progress",
    "never",
];

/// Dirty generated visits (out of order, late, duplicated and invalid lines) of 100
/// concurrent keys: about five events a second of event time, so that sessions become
/// final all along the input and every checkpoint has rows for the table.
fn generate(path: &Path, events: u64, seed: u64) {
    process::generate_with(path, events, 100, seed, &process::DIRTY);
}

/// What `scripts/SCRIPT TABLE ARGS` prints, a script of the Python `deltalake` package
/// (with the S3 server's settings for a table there); it must succeed.
fn python_delta(script: &str, table: &Path, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(script);
    let mut cmd = Command::new("python3");
    if s(table).starts_with("s3://") {
        cmd.envs(s3::server().iter().map(|(k, v)| (k, v)));
    }
    let out = cmd
        .arg(&path)
        .arg(table)
        .args(args)
        .output()
        .expect("python3 runs (scripts/test.sh installs deltalake)");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

/// What `scripts/delta-read.py TABLE OPTIONS` prints.
fn delta_read(table: &Path, options: &[&str]) -> String {
    python_delta("delta-read.py", table, options)
}

/// The table's rows as the `deltalake` package reads them, typed and sorted.
fn table_rows(table: &Path) -> Vec<String> {
    sorted(&delta_read(table, &[]))
}

/// The table's rows as the `deltalake` package reads them are `want`, row for row
/// (`after` says after what, in the messages).
fn assert_rows(table: &Path, want: &[String], after: &str) {
    let got = table_rows(table);
    assert_eq!(got.len(), want.len(), "rows{after}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "row {i}{after}");
    }
}

/// The table's data files as its log lists them.
fn logged_files(table: &Path) -> Vec<String> {
    delta_read(table, &["--files"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// The table's transaction version of the job in `state` (`None`: it has none).
fn txn_version(table: &Path, state: &Path) -> Option<u64> {
    let id = std::fs::read_to_string(state.join("instance-id")).expect("instance id");
    let app = format!("sessionizer-{}", id.trim());
    let text = delta_read(table, &["--txn", &app]);
    match text.trim() {
        "none" => None,
        v => Some(v.parse().expect("a version")),
    }
}

/// The Parquet files at the table's root, as its directory or bucket lists them.
fn files_on_disk(table: &Path) -> Vec<String> {
    delta_read(table, &["--stored"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// A new table on the tests' S3 server; the runs of the binary get the server's
/// endpoint and keys.
fn s3_table(prefix: &str) -> PathBuf {
    process::set_env(s3::server().to_vec());
    PathBuf::from(s3::unique(prefix))
}

/// JSON lines with their numbers as floats (a table types numbers: 3 and 3.0 are one
/// value), sorted: a table's scan has no order.
fn sorted(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .map(|l| typed(&serde_json::from_str(l).expect("a JSON line")).to_string())
        .collect();
    out.sort();
    out
}

fn typed(v: &Value) -> Value {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().expect("a number");
            serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
        }
        Value::Array(a) => Value::Array(a.iter().map(typed).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), typed(v))).collect()),
        other => other.clone(),
    }
}

/// The sessions of the JSON-lines `--emit final` run over `inputs`, sorted.
fn json_final(dir: &Path, inputs: &[&Path]) -> Vec<String> {
    let out = dir.join("want.jsonl");
    let mut args = vec!["run"];
    for i in inputs {
        args.extend(["--input", s(i)]);
    }
    args.extend(["--output", s(&out), "--emit", "final"]);
    args.extend_from_slice(JOB);
    run_ok(&args);
    sorted(&std::fs::read_to_string(&out).expect("JSON lines"))
}

/// The arguments of a run into `table` with state in `state`.
fn delta_args(inputs: &[&Path], table: &Path, state: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["run".to_string()];
    for i in inputs {
        args.extend(["--input".to_string(), s(i).to_string()]);
    }
    args.extend(
        ["--delta-table", s(table), "--state-dir", s(state)]
            .iter()
            .chain(JOB)
            .chain(extra)
            .map(|a| a.to_string()),
    );
    args
}

fn run_delta(inputs: &[&Path], table: &Path, state: &Path, extra: &[&str]) -> String {
    let args = delta_args(inputs, table, state, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    String::from_utf8_lossy(&run_ok(&args).stderr).into_owned()
}

/// Every file the log names is on disk, each once, and no file of the job is left
/// outside the log.
fn assert_files_consistent(table: &Path) {
    let logged = logged_files(table);
    let mut unique = logged.clone();
    unique.dedup();
    assert_eq!(unique, logged, "a file is named twice by the log");
    assert_eq!(files_on_disk(table), logged, "data files outside the log");
}

#[test]
fn python_deltalake_reads_the_sessions_of_the_json_final_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 30_000, 5);
    let want = json_final(tmp.path(), &[&input]);
    assert!(want.len() > 1_000, "{} sessions", want.len());
    let table = tmp.path().join("sessions");
    let state = tmp.path().join("state");
    run_delta(
        &[&input],
        &table,
        &state,
        &["--checkpoint-every-records", "7000"],
    );
    assert_rows(&table, &want, "");
    // Reads that skip files by their statistics find the same rows: the statistics
    // bound every file's values.
    for i in [0, want.len() / 3, want.len() - 1] {
        let row: Value = serde_json::from_str(&want[i]).expect("JSON");
        let key = row["key"].as_str().expect("a key");
        let of_key: Vec<&String> = want
            .iter()
            .filter(|r| r.contains(&format!("\"key\":\"{key}\",")))
            .collect();
        let read = sorted(&delta_read(&table, &["--key", key]));
        assert_eq!(read.iter().collect::<Vec<_>>(), of_key, "key {key}");
        let start = row["start"].as_str().expect("a start");
        let later = want
            .iter()
            .filter(|r| {
                let r: Value = serde_json::from_str(r).expect("JSON");
                r["start"].as_str().expect("a start") >= start
            })
            .count();
        let read = sorted(&delta_read(&table, &["--start-from", start]));
        assert_eq!(read.len(), later, "rows from {start}");
    }
    // One commit per checkpoint that had rows, each carrying the job's transaction.
    let files = logged_files(&table);
    assert!(files.len() >= 3, "{files:?}");
    let (last, _) = newest_checkpoint(&state);
    assert!(last >= 4, "checkpoints every 7000 records: {last}");
    assert_eq!(txn_version(&table, &state), Some(last));
    assert_files_consistent(&table);
    // The side outputs stay JSON lines, next to the table.
    let dead = std::fs::read_to_string(tmp.path().join("sessions.dead-letter.jsonl"))
        .expect("dead letters");
    assert!(dead.lines().count() > 10, "the input has invalid lines");
    // inspect names the table, the job's id and that the last epoch committed.
    let out = run_ok(&["inspect", "--state-dir", s(&state)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(Delta table, application id sessionizer-"),
        "{text}"
    );
    assert!(
        text.contains("committed (the table's transaction version"),
        "{text}"
    );
    let out = run_ok(&["inspect", "--state-dir", s(&state), "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mark = &report["newest_valid"]["delta"][0];
    assert_eq!(mark["epoch"], last);
    assert_eq!(mark["role"], "sessions");
    let id = std::fs::read_to_string(state.join("instance-id")).expect("instance id");
    assert_eq!(mark["app_id"], format!("sessionizer-{}", id.trim()));
}

#[test]
fn a_resumed_run_over_the_next_file_appends_without_duplicates() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let all = tmp.path().join("all.jsonl");
    generate(&all, 40_000, 11);
    let text = std::fs::read_to_string(&all).expect("generated");
    let lines: Vec<&str> = text.lines().collect();
    let (a, b) = lines.split_at(lines.len() / 2);
    let day1 = tmp.path().join("day1.jsonl");
    let day2 = tmp.path().join("day2.jsonl");
    std::fs::write(&day1, a.join("\n") + "\n").expect("day 1");
    std::fs::write(&day2, b.join("\n") + "\n").expect("day 2");
    let want = json_final(tmp.path(), &[&day1, &day2]);

    let table = tmp.path().join("t");
    let state = tmp.path().join("state");
    run_delta(&[&day1], &table, &state, &["--keep-open"]);
    let first = table_rows(&table);
    assert!(
        !first.is_empty() && first.len() < want.len(),
        "{}",
        first.len()
    );
    let version = txn_version(&table, &state);
    run_delta(&[&day2], &table, &state, &[]);
    let got = table_rows(&table);
    assert_eq!(got, want);
    assert!(txn_version(&table, &state) > version);
    assert_files_consistent(&table);
    // The finished command again reads nothing and commits nothing.
    let logged = logged_files(&table);
    run_delta(&[&day2], &table, &state, &[]);
    assert_eq!(logged_files(&table), logged);
    assert_eq!(table_rows(&table), want);
}

/// The crash test's checkpoints: many, so that kills fall before, between and after
/// table commits.
const CHECKPOINTS: [&str; 4] = [
    "--checkpoint-interval",
    "50ms",
    "--checkpoint-every-records",
    "5000",
];

/// A run of `events` generated visits (seed `seed`) into `table`, with `extra`, killed
/// at random instants (about `want` times, the delays drawn with `kill_seed`) and run
/// again until done, in `dir`; `timing` is a table for an uninterrupted run first, which
/// times a run. Checks that the table holds the JSON-lines `--emit final` run's rows,
/// once, and no stray file; returns the kills, how long a run takes and the state
/// directory.
fn killed_until_done(
    dir: &Path,
    (timing, table): (&Path, &Path),
    (events, seed): (u64, u64),
    extra: &[&str],
    (want, kill_seed): (u32, u64),
) -> (u32, std::time::Duration, PathBuf) {
    let input = dir.join("visits.jsonl");
    generate(&input, events, seed);
    let want_rows = json_final(dir, &[&input]);
    // How long an uninterrupted run takes, checkpoints and commits included.
    let began = Instant::now();
    run_delta(&[&input], timing, &dir.join("timing-state"), extra);
    let took = began.elapsed();

    let state = dir.join("state");
    let log = dir.join("runs.log");
    let args = delta_args(&[&input], table, &state, extra);
    let kills = kill_until_done(&args, &state, events, &log, (took, want, kill_seed));
    assert_rows(table, &want_rows, &format!(" after {kills} kills"));
    assert_files_consistent(table);
    eprintln!(
        "delta crash test ({}): {kills} kills, {} files",
        s(table),
        logged_files(table).len()
    );
    (kills, took, state)
}

#[test]
fn a_run_killed_at_random_instants_keeps_every_session_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (timing, table) = (tmp.path().join("timing"), tmp.path().join("t"));
    let (kills, took, _) = killed_until_done(
        tmp.path(),
        (&timing, &table),
        (120_000, 21),
        &CHECKPOINTS,
        (10, 7),
    );
    assert!(kills >= 8, "only {kills} kills (runs take {took:?})");
}

/// The newest checkpoint of `state` and the number of data files it recorded for the
/// table.
fn newest_checkpoint(state: &Path) -> (u64, usize) {
    let dir = StateDir::existing(state).expect("state dir");
    let found = dir
        .recover()
        .expect("recovery")
        .found
        .expect("a checkpoint");
    let files = found.manifest.delta.iter().map(|d| d.files.len()).sum();
    (found.manifest.epoch, files)
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_between_the_checkpoint_and_the_table_commit_is_rolled_forward() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 60_000, 3);
    let want = json_final(tmp.path(), &[&input]);
    let table = tmp.path().join("t");
    let state = tmp.path().join("state");
    let extra = ["--checkpoint-every-records", "10000"];
    let args = delta_args(&[&input], &table, &state, &extra);
    let out = process::bin()
        .args(&args)
        .env("SESSIONIZER_TEST_EXIT_BEFORE_SECOND_PHASE", "3")
        .output()
        .expect("spawn");
    assert_eq!(
        out.status.code(),
        Some(86),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Checkpoint 3 is durable and lists its files; the table stops before it.
    let (epoch, files) = newest_checkpoint(&state);
    assert_eq!(epoch, 3);
    assert!(files > 0, "checkpoint 3 has rows");
    assert!(txn_version(&table, &state).is_none_or(|v| v < 3));
    let before = logged_files(&table).len();
    let inspected = run_ok(&["inspect", "--state-dir", s(&state)]);
    let text = String::from_utf8_lossy(&inspected.stdout);
    assert!(text.contains("not committed yet"), "{text}");

    let stderr = run_delta(&[&input], &table, &state, &extra);
    assert!(
        stderr.contains("had not committed checkpoint 3"),
        "the roll-forward is reported: {stderr}"
    );
    assert!(logged_files(&table).len() >= before + files);
    assert_eq!(table_rows(&table), want);
    assert_files_consistent(&table);
}

#[test]
fn a_table_of_other_columns_is_refused_naming_the_difference() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 3_000, 1);
    let table = tmp.path().join("t");
    run_delta(&[&input], &table, &tmp.path().join("state"), &[]);
    let before = logged_files(&table);
    // Another job, without the aggregates, into the same table.
    let out = run(&[
        "run",
        "--input",
        s(&input),
        "--delta-table",
        s(&table),
        "--state-dir",
        s(&tmp.path().join("state2")),
        "--progress",
        "never",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not fit the session records"), "{err}");
    assert!(
        err.contains("the table has a column `pages` (long) that the session records do not have"),
        "{err}"
    );
    assert_eq!(logged_files(&table), before);
}

/// A run over stdin (or any run without `--state-dir`) is a job of its own that commits
/// once, at its end: its rows are the JSON-lines run's; a run killed, or stopped by a
/// signal, before its end adds no row; a second run appends its own.
#[test]
fn a_run_without_checkpoints_commits_its_rows_once_at_its_end() {
    use std::io::Write;
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 5_000, 17);
    let want = json_final(tmp.path(), &[&input]);
    let table = tmp.path().join("t");
    let over_stdin = || {
        let mut c = process::bin();
        c.args(["run", "--input", "-", "--delta-table", s(&table)])
            .args(JOB)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        c.spawn().expect("spawn")
    };

    // Killed before its input ended: the table exists, with no row.
    let mut child = over_stdin();
    let text = std::fs::read(&input).expect("input");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(&text[..text.len() / 2])
        .expect("half the input");
    stdin.flush().expect("flushed");
    std::thread::sleep(std::time::Duration::from_millis(500));
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    drop(stdin);
    assert_rows(&table, &[], " after a killed run");

    // Stopped by SIGTERM with its whole input read (stdin still open): it ends cleanly,
    // and says so, but a run without checkpoints that did not reach its end commits
    // none of its rows either.
    let mut child = over_stdin();
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&text).expect("the input");
    stdin.flush().expect("flushed");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    signal(&child, "-TERM");
    let stopped = child.wait_with_output().expect("ended");
    drop(stdin);
    let said = String::from_utf8_lossy(&stopped.stderr);
    assert!(
        said.contains("none of the run's sessions are committed to the Delta table"),
        "{said}"
    );
    assert_rows(&table, &[], " after a stopped run");

    // A whole run: its rows, once.
    let mut child = over_stdin();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&text)
        .expect("the input");
    let done = child.wait_with_output().expect("ran");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_rows(&table, &want, " after a whole run");

    // Another run is another job: its rows are added.
    let args = [
        &["run", "--input", s(&input), "--delta-table", s(&table)][..],
        JOB,
    ]
    .concat();
    run_ok(&args);
    let twice: Vec<String> = {
        let mut w = [want.clone(), want.clone()].concat();
        w.sort();
        w
    };
    assert_rows(&table, &twice, " after a second run");
}

#[test]
fn what_a_table_cannot_take_is_refused_with_a_reason() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 100, 1);
    let table = tmp.path().join("t");
    let state = tmp.path().join("state");
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec!["--delta-table", s(&table), "--delta-commit-interval", "1m"],
            "--delta-commit-interval needs --state-dir",
        ),
        (
            vec!["--delta-commit-interval", "1m", "--output", "o.jsonl"],
            "--delta-commit-interval applies to --delta-table",
        ),
        (
            vec![
                "--delta-table",
                s(&table),
                "--state-dir",
                s(&state),
                "--emit",
                "on-close",
            ],
            "on-close and on-update emit revisions and retractions",
        ),
        (
            vec![
                "--delta-table",
                "gs://bucket/sessions",
                "--state-dir",
                s(&state),
            ],
            "gs:// locations are not supported; give a local directory or s3://bucket/path",
        ),
        (
            vec![
                "--delta-table",
                s(&table),
                "--state-dir",
                s(&state),
                "--output",
                "o.jsonl",
            ],
            "--delta-table cannot be combined with --output",
        ),
        (
            vec![
                "--delta-table",
                s(&table),
                "--state-dir",
                s(&state),
                "--output-format",
                "parquet",
            ],
            "--delta-table cannot be combined with --output-format",
        ),
    ];
    for (extra, reason) in cases {
        let mut args = vec!["run", "--input", s(&input)];
        args.extend(extra);
        let out = run(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(reason), "{args:?}: {err}");
    }
    assert!(!table.exists(), "nothing was created");
    assert!(!PathBuf::from("o.jsonl").exists());
}

/// The table's versions: the commits in its log (the first creates the table).
fn table_versions(table: &Path) -> usize {
    std::fs::read_dir(table.join("_delta_log"))
        .expect("the table's log")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .count()
}

/// `--delta-commit-interval`: checkpoints go on as often as before, but the table is
/// committed to at most once per interval, each commit adding the files of every
/// checkpoint since the last — and the run's last checkpoint always commits. Rows stay
/// exactly once through kill -9 at random instants, pending files included.
#[test]
fn a_commit_interval_commits_less_often_and_keeps_every_session_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let events = 60_000;
    let input = tmp.path().join("visits.jsonl");
    generate(&input, events, 23);
    let want = json_final(tmp.path(), &[&input]);

    // An interval longer than the run: one commit, at the end.
    let table = tmp.path().join("once");
    let state = tmp.path().join("once-state");
    let interval = ["--delta-commit-interval", "1h"];
    let extra: Vec<&str> = CHECKPOINTS.iter().chain(&interval).copied().collect();
    let began = Instant::now();
    run_delta(&[&input], &table, &state, &extra);
    let took = began.elapsed();
    assert_eq!(table_rows(&table), want);
    let (last, files) = newest_checkpoint(&state);
    assert!(last >= 5, "checkpoints all along the input: {last}");
    assert_eq!(
        table_versions(&table),
        2,
        "the table's creation, then one commit"
    );
    assert_eq!(txn_version(&table, &state), Some(last));
    assert!(
        files >= 5,
        "the last commit took every checkpoint's files: {files}"
    );
    assert_files_consistent(&table);

    // A short interval, and kills: some land while files wait for a commit.
    let table = tmp.path().join("t");
    let state = tmp.path().join("state");
    let log = tmp.path().join("runs.log");
    let interval = ["--delta-commit-interval", "400ms"];
    let extra: Vec<&str> = CHECKPOINTS.iter().chain(&interval).copied().collect();
    let args = delta_args(&[&input], &table, &state, &extra);
    let kills = kill_until_done(&args, &state, events, &log, (took, 6, 9));
    assert!(kills >= 4, "only {kills} kills (runs take {took:?})");
    let got = table_rows(&table);
    assert!(
        got == want,
        "{} rows after {kills} kills, {} wanted",
        got.len(),
        want.len()
    );
    assert_files_consistent(&table);
    let (last, _) = newest_checkpoint(&state);
    assert!(
        table_versions(&table) < last as usize,
        "fewer commits ({}) than checkpoints ({last})",
        table_versions(&table)
    );
}

/// The side outputs of a run into a table on S3, in files of `dir`.
fn side_files(dir: &Path) -> [String; 4] {
    [
        "--dead-letter".into(),
        s(&dir.join("dead.jsonl")).into(),
        "--late-output".into(),
        s(&dir.join("late.jsonl")).into(),
    ]
}

#[test]
fn an_s3_table_killed_at_random_instants_keeps_every_session_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let side = side_files(tmp.path());
    let mut extra: Vec<&str> = CHECKPOINTS.to_vec();
    extra.extend(side.iter().map(String::as_str));
    let table = s3_table("kills");
    let (kills, took, state) = killed_until_done(
        tmp.path(),
        (&s3_table("timing"), &table),
        (60_000, 23),
        &extra,
        (8, 9),
    );
    assert!(kills >= 5, "only {kills} kills (runs take {took:?})");
    // The table's transaction is the newest checkpoint with rows (a last run that
    // resumed after every row was written commits nothing).
    let (last, _) = newest_checkpoint(&state);
    let txn = txn_version(&table, &state).expect("the job committed");
    assert!(
        txn <= last && txn >= 2,
        "transaction {txn}, checkpoint {last}"
    );
    // inspect reads the table on S3 for the checkpoint's mark.
    let out = run_ok(&["inspect", "--state-dir", s(&state)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("committed (the table's transaction version")
            || text.contains("no rows in this epoch, nothing to commit (table version"),
        "{text}"
    );
}

/// Two jobs create and commit to one table on S3 at once, many times: a commit that
/// loses the race for a log version (its put-if-absent refused) is retried at the next
/// one, a creation that loses is the other's table, so no commit of either is lost or
/// doubled.
#[test]
fn two_jobs_writing_one_s3_table_at_once_lose_no_commit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir_a, dir_b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&dir_a).expect("dir a");
    std::fs::create_dir_all(&dir_b).expect("dir b");
    let (input_a, input_b) = (dir_a.join("visits.jsonl"), dir_b.join("visits.jsonl"));
    generate(&input_a, 100_000, 31);
    generate(&input_b, 100_000, 32);
    let mut want = json_final(&dir_a, &[&input_a]);
    want.extend(json_final(&dir_b, &[&input_b]));
    want.sort();

    let table = s3_table("two");
    let (state_a, state_b) = (dir_a.join("state"), dir_b.join("state"));
    // Many commits of each, close together.
    let often = [
        "--checkpoint-interval",
        "20ms",
        "--checkpoint-every-records",
        "2000",
    ];
    let spawn = |input: &Path, state: &Path| {
        process::bin()
            .args(delta_args(&[input], &table, state, &often))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (a, b) = (spawn(&input_a, &state_a), spawn(&input_b, &state_b));
    for (name, child) in [("a", a), ("b", b)] {
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        assert!(out.status.success(), "job {name} failed: {tail:?}");
        // Without a directory beside the table, the side outputs go to stderr.
        assert!(
            stderr.contains("\"reason\":"),
            "job {name}'s dead letters on stderr"
        );
    }
    assert_eq!(table_rows(&table), want);
    assert_files_consistent(&table);
    for state in [&state_a, &state_b] {
        let (last, _) = newest_checkpoint(state);
        assert!(last >= 8, "checkpoints every 20 ms or 2000 records: {last}");
        assert_eq!(txn_version(&table, state), Some(last));
    }
}

/// The sessions of `--emit final` file runs over each partition of `topic` (its
/// records in offset order), together, sorted.
#[cfg(feature = "kafka")]
fn json_final_per_partition(dir: &Path, topic: &str) -> Vec<String> {
    let mut want = Vec::new();
    for (p, records) in kafka::read_committed(topic).iter().enumerate() {
        let part = dir.join(format!("partition-{p}"));
        std::fs::create_dir_all(&part).expect("dir");
        let input = part.join("records.jsonl");
        let text: String = records.iter().map(|r| kafka::text(r) + "\n").collect();
        std::fs::write(&input, text).expect("partition file");
        want.extend(json_final(&part, &[&input]));
    }
    want.sort();
    want
}

/// The arguments of a group job from `topic` (group `group`) into `table`, with the
/// job's options and `extra`, committing every 100 ms until the end of the input.
#[cfg(feature = "kafka")]
fn kafka_table_args(topic: &str, group: &str, table: &Path, extra: &[&str]) -> Vec<String> {
    [
        "run",
        "--kafka-brokers",
        kafka::broker(),
        "--kafka-topic",
        topic,
        "--kafka-group",
        group,
        "--stop-at-end",
        "--delta-table",
        s(table),
        "--checkpoint-interval",
        "100ms",
    ]
    .iter()
    .chain(extra)
    .chain(JOB)
    .map(|a| a.to_string())
    .collect()
}

/// A group job from a Kafka topic into a table, killed at random instants (the first
/// kill with a transaction open) and run again until a run ends by itself: the table
/// holds every session of the file runs of the input partitions, once.
#[cfg(feature = "kafka")]
#[test]
fn a_kafka_job_killed_at_random_instants_fills_the_table_once() {
    use rand::{Rng, SeedableRng};
    let _one_at_a_time = kafka::exclusive();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("visits.jsonl");
    generate(&data, 60_000, 41);
    let topic = kafka::unique("delta-visits");
    kafka::create_topics(&[&topic], 4);
    kafka::produce_lines(&topic, &data, "visit_id");
    let want = json_final_per_partition(tmp.path(), &topic);
    assert!(want.len() > 1_000, "{} sessions", want.len());

    let group = kafka::unique("delta-group");
    let table = tmp.path().join("table");
    let args = kafka_table_args(&topic, &group, &table, &[]);
    let changelog = format!("{group}-{topic}-changelog");
    let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
    let (kills, ended) = kafka::kill_repeatedly(
        || {
            process::bin()
                .args(&args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        },
        &changelog,
        4,
        8,
        || std::time::Duration::from_millis(rng.random_range(300..2_000)),
    );
    assert!(kills >= 3, "only {kills} kills");
    if !ended {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_ok(&args);
    }
    assert_rows(&table, &want, &format!(" after {kills} kills"));
    assert_files_consistent(&table);
    // Each partition is a writer of its own in the table.
    let files = logged_files(&table);
    for p in 0..4 {
        let name = format!("part-{group}-{topic}-{p}-");
        assert!(
            files.iter().any(|f| f.starts_with(&name)),
            "{name} in {files:?}"
        );
    }
    // inspect shows each task's last epoch of the table and that the table has it.
    let inspected = run_ok(&[
        "inspect",
        "--kafka-brokers",
        kafka::broker(),
        "--kafka-group",
        &group,
        "--kafka-topic",
        &topic,
    ]);
    let text = String::from_utf8_lossy(&inspected.stdout);
    for p in 0..4 {
        let app = format!("application id sessionizer-{group}-{topic}-{p})");
        let line = text.lines().find(|l| l.contains(&app));
        assert!(
            line.is_some_and(|l| l.trim_start().starts_with("table ")
                && (l.contains("committed (the table's transaction version")
                    || l.contains("no rows in this epoch"))),
            "task {p}'s table epoch, committed, in: {text}"
        );
    }
    eprintln!("Kafka to Delta: {kills} kills, {} files", files.len());
}

/// A second process joins the group while the first writes the table: the partitions
/// it takes over go on as writers of their own (their epochs restored from the
/// changelog), and the table holds every session once.
#[cfg(feature = "kafka")]
#[test]
fn a_process_joining_a_kafka_job_takes_its_partitions_writers_over() {
    let _one_at_a_time = kafka::exclusive();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("visits.jsonl");
    generate(&data, 80_000, 43);
    // The second process must join before the first has read everything: should the
    // first have finished before it was held still, the table is checked all the same
    // and the scenario runs again on new topics, up to three times.
    for attempt in 1..=3 {
        let run = tmp.path().join(format!("attempt-{attempt}"));
        std::fs::create_dir(&run).expect("mkdir");
        let (by_a, by_b) = joining_run(&data, &run);
        eprintln!("attempt {attempt}: the processes read {by_a} and {by_b}");
        if by_a > 0 && by_b > 0 {
            return;
        }
    }
    panic!("in three attempts the second process never took a partition over");
}

/// One run of [`a_process_joining_a_kafka_job_takes_its_partitions_writers_over`] in
/// `dir`: two processes, the second started once the first has committed rows; the table must hold
/// every session once. Returns the records each read.
#[cfg(feature = "kafka")]
fn joining_run(data: &Path, dir: &Path) -> (u64, u64) {
    let topic = kafka::unique("delta-visits");
    kafka::create_topics(&[&topic], 4);
    kafka::produce_lines(&topic, data, "visit_id");
    let group = kafka::unique("delta-group");
    let table = dir.join("table");
    let spawn = |stats: &Path| {
        let (dead, late) = (
            stats.with_extension("dead.jsonl"),
            stats.with_extension("late.jsonl"),
        );
        let extra = [
            "--stats-file",
            s(stats),
            "--dead-letter",
            s(&dead),
            "--late-output",
            s(&late),
        ];
        let args = kafka_table_args(&topic, &group, &table, &extra);
        process::bin()
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (stats_a, stats_b) = (dir.join("a.json"), dir.join("b.json"));
    // The first process is held still (SIGSTOP) once it has committed rows to the
    // table, so that however fast it reads, the second joins while it still has
    // records to read; the group's rebalance waits for it to go on (SIGCONT).
    let mut a = spawn(&stats_a);
    let started = std::time::Instant::now();
    while !table.join("_delta_log").exists() || table_versions(&table) < 2 {
        if a.try_wait().expect("wait").is_some() || started.elapsed().as_secs() > 60 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    signal(&a, "-STOP");
    let b = spawn(&stats_b);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    signal(&a, "-CONT");
    for (name, child) in [("a", a), ("b", b)] {
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        assert!(out.status.success(), "process {name} failed: {tail:?}");
    }
    let read = |path: &Path| -> u64 {
        let stats: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("stats")).expect("JSON");
        stats["records_read"].as_u64().expect("records_read")
    };
    let want = json_final_per_partition(dir, &topic);
    assert_eq!(table_rows(&table), want);
    assert_files_consistent(&table);
    (read(&stats_a), read(&stats_b))
}

/// Generated visits without invalid lines: every line is a row of a table.
const TABLE_DIRT: process::Dirt = process::Dirt {
    late: "0.03",
    duplicate: "0.005",
    invalid: "0",
    returning: "0.3",
};

/// `scripts/delta-append.py ARGS` (the Python `deltalake` package writing the table).
fn delta_append(table: &Path, args: &[&str]) {
    python_delta("delta-append.py", table, args);
}

/// Appends lines `from..to` of `data` to `table`, as one commit.
fn append_rows(table: &Path, data: &Path, from: usize, to: usize) {
    delta_append(table, &[s(data), &from.to_string(), &to.to_string()]);
}

/// The arguments of a run reading `table` into `out` with state in `state`.
fn table_input_args(table: &Path, state: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    [
        "run",
        "--delta-input",
        s(table),
        "--state-dir",
        s(state),
        "--output",
        s(out),
    ]
    .iter()
    .chain(JOB)
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// A table read as it grows, by a run that keeps its sessions open and a run after more
/// commits, gives the sessions of one run over the same rows as a file — in a
/// directory and on S3.
#[test]
fn a_delta_input_read_as_it_grows_gives_the_sessions_of_one_file_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("visits.jsonl");
    process::generate_with(&data, 20_000, 500, 51, &TABLE_DIRT);
    let n = std::fs::read_to_string(&data)
        .expect("data")
        .lines()
        .count();
    let want = tmp.path().join("want.jsonl");
    let mut args = vec!["run", "--input", s(&data), "--output", s(&want)];
    args.extend_from_slice(JOB);
    run_ok(&args);
    for (name, table) in [
        ("local", tmp.path().join("visits-table")),
        ("s3", s3_table("input")),
    ] {
        let state = tmp.path().join(format!("state-{name}"));
        let out = tmp.path().join(format!("out-{name}.jsonl"));
        append_rows(&table, &data, 0, n / 3);
        append_rows(&table, &data, n / 3, n / 2);
        let args = table_input_args(&table, &state, &out, &["--keep-open"]);
        run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        append_rows(&table, &data, n / 2, n);
        let args = table_input_args(&table, &state, &out, &[]);
        let stderr = run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>()).stderr;
        let stderr = String::from_utf8_lossy(&stderr);
        assert!(
            stderr.contains("resumed from checkpoint"),
            "{name}: {stderr}"
        );
        outputs::assert_same_file(&out, &want);
        let text = String::from_utf8_lossy(&run_ok(&["inspect", "--state-dir", s(&state)]).stdout)
            .into_owned();
        assert!(
            text.contains(&format!("{} (Delta table, id ", s(&table)))
                && text.contains(&format!(": {n} of {n} rows read")),
            "{name}: {text}"
        );
    }
}

/// Killed at random instants while reading a table (a position in the middle of a data
/// file included), restarted until done: the output is the uninterrupted run's.
#[test]
fn a_delta_input_killed_at_random_instants_gives_the_uninterrupted_output() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("visits.jsonl");
    let events = 80_000;
    process::generate_with(&data, events, 2000, 53, &TABLE_DIRT);
    let n = std::fs::read_to_string(&data)
        .expect("data")
        .lines()
        .count();
    let table = tmp.path().join("visits-table");
    for i in 0..4 {
        append_rows(&table, &data, n * i / 4, n * (i + 1) / 4);
    }
    let want = tmp.path().join("want.jsonl");
    let mut args = vec!["run", "--input", s(&data), "--output", s(&want)];
    args.extend_from_slice(JOB);
    run_ok(&args);
    let began = Instant::now();
    let timing = table_input_args(
        &table,
        &tmp.path().join("timing-state"),
        &tmp.path().join("timing.jsonl"),
        &CHECKPOINTS,
    );
    run_ok(&timing.iter().map(String::as_str).collect::<Vec<_>>());
    let took = began.elapsed();
    let (state, out) = (tmp.path().join("state"), tmp.path().join("out.jsonl"));
    let args = table_input_args(&table, &state, &out, &CHECKPOINTS);
    let log = tmp.path().join("runs.log");
    let kills = kill_until_done(&args, &state, n as u64, &log, (took, 8, 5));
    assert!(kills >= 4, "only {kills} kills (runs take {took:?})");
    outputs::assert_same_file(&out, &want);
}

/// What a table input cannot be is refused with the reason: a commit that removed
/// rows, new rows after a job that ended, another table at the location read before.
#[test]
fn a_rewritten_replaced_or_ended_delta_input_is_refused_with_a_reason() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("visits.jsonl");
    process::generate_with(&data, 3_000, 100, 57, &TABLE_DIRT);
    let n = std::fs::read_to_string(&data)
        .expect("data")
        .lines()
        .count();
    let refused = |args: &[String], reason: &str| {
        let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(reason),
            "{reason}: {err}"
        );
    };
    let out = tmp.path().join("out.jsonl");

    // A delete rewrote the history.
    let deleted = tmp.path().join("deleted");
    append_rows(&deleted, &data, 0, n);
    let first: Value = serde_json::from_str(
        std::fs::read_to_string(&data)
            .expect("data")
            .lines()
            .next()
            .expect("a line"),
    )
    .expect("JSON");
    delta_append(
        &deleted,
        &["--delete-key", first["visit_id"].as_str().expect("a key")],
    );
    refused(
        &table_input_args(&deleted, &tmp.path().join("s1"), &out, &[]),
        "removes the data file",
    );

    // New rows after the job ended (no --keep-open).
    let ended = tmp.path().join("ended");
    append_rows(&ended, &data, 0, n / 2);
    let state = tmp.path().join("s2");
    let args = table_input_args(&ended, &state, &out, &[]);
    run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    append_rows(&ended, &data, n / 2, n);
    refused(&args, "the job it holds has ended");

    // Another table where the one read was.
    let replaced = tmp.path().join("replaced");
    append_rows(&replaced, &data, 0, n / 2);
    let state = tmp.path().join("s3");
    let args = table_input_args(&replaced, &state, &out, &["--keep-open"]);
    run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::remove_dir_all(&replaced).expect("drop the table");
    append_rows(&replaced, &data, 0, n);
    refused(&args, "it is another Delta table");
}
