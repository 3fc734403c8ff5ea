//! End-to-end tests of what a user of the binary trips on: a path spelled two ways, a
//! stats file, live stdin, very long lines, bytes that are not UTF-8, `inspect` and
//! duration options. Every test here regresses a defect once seen in the real binary.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sessionizer"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    bin()
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn sessionizer")
}

fn run_ok(args: &[&str]) -> Output {
    let out = bin().args(args).output().expect("spawn sessionizer");
    assert!(
        out.status.success(),
        "sessionizer {args:?} failed: {}",
        stderr(&out)
    );
    out
}

const VISITS: &str = concat!(
    r#"{"visit_id":"v1","event_time":"2024-01-01T00:00:00Z","page":"/a"}"#,
    "\n",
    r#"{"visit_id":"v2","event_time":"2024-01-01T00:01:00Z","page":"/b"}"#,
    "\n",
    r#"{"visit_id":"v1","event_time":"2024-01-01T00:50:00Z","page":"/c"}"#,
    "\n",
);

/// A directory with `s.jsonl` (the input), a symlink `link.jsonl` and a hard link
/// `hard.jsonl` to it, and a subdirectory `sub`.
fn spelled_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("s.jsonl");
    std::fs::write(&input, VISITS).expect("write");
    std::os::unix::fs::symlink(&input, dir.path().join("link.jsonl")).expect("symlink");
    std::fs::hard_link(&input, dir.path().join("hard.jsonl")).expect("hard link");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    dir
}

/// Every spelling of the input file `s.jsonl` of [`spelled_dir`], seen from inside it.
fn spellings(dir: &Path) -> Vec<String> {
    vec![
        "./s.jsonl".into(),
        s(&dir.join("s.jsonl")).into(),
        "sub/../s.jsonl".into(),
        ".//s.jsonl".into(),
        "link.jsonl".into(),
        s(&dir.join("link.jsonl")).into(),
        "hard.jsonl".into(),
    ]
}

fn assert_refused_and_intact(dir: &Path, args: &[&str], what: &str) {
    let out = run_in(dir, args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{what}: {args:?} must be refused as bad options; stderr: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("same file") && err.lines().count() == 1,
        "{what}: one line naming the clash: {err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("s.jsonl")).expect("input still there"),
        VISITS,
        "{what}: the input must be intact after {args:?}"
    );
}

/// Issue 8: `--output ./s.jsonl` with `--input s.jsonl` emptied the input and exited 0;
/// so did an absolute path, a symlink, a hard link, and a side output or stats file
/// naming the input. Files are compared by identity, before anything is created.
#[test]
fn an_output_naming_the_input_under_any_spelling_is_refused_and_the_input_kept() {
    let tmp = spelled_dir();
    let dir = tmp.path();
    for spelling in spellings(dir) {
        for option in ["--output", "--dead-letter", "--late-output", "--stats-file"] {
            let mut args = vec!["run", "--input", "s.jsonl"];
            if option != "--output" {
                args.extend(["--output", "out.jsonl"]);
            }
            args.extend([option, spelling.as_str()]);
            assert_refused_and_intact(dir, &args, &format!("{option} {spelling}"));
            assert!(
                !dir.join("out.jsonl").exists(),
                "nothing is created before the check ({option} {spelling})"
            );
        }
        // The input spelled differently, the output plainly.
        assert_refused_and_intact(
            dir,
            &["run", "--input", &spelling, "--output", "s.jsonl"],
            &format!("--input {spelling}"),
        );
    }
}

/// The side outputs derived from `--output` (`x.jsonl` → `x.dead-letter.jsonl`,
/// `x.late.jsonl`) are checked like the others.
#[test]
fn a_derived_side_output_naming_the_input_is_refused() {
    let tmp = spelled_dir();
    let dir = tmp.path();
    std::fs::rename(dir.join("s.jsonl"), dir.join("x.late.jsonl")).expect("rename");
    let out = run_in(
        dir,
        &["run", "--input", "x.late.jsonl", "--output", "./x.jsonl"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--late-output"),
        "names the option to set: {}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("x.late.jsonl")).expect("read"),
        VISITS
    );
    assert!(!dir.join("x.jsonl").exists());
}

/// Two outputs (or the stats file and an output) that are one file under two spellings
/// would overwrite each other; the config file is an input too.
#[test]
fn outputs_naming_one_file_twice_or_the_config_file_are_refused() {
    let tmp = spelled_dir();
    let dir = tmp.path();
    std::fs::write(dir.join("o.jsonl"), "keep me\n").expect("write");
    std::os::unix::fs::symlink(dir.join("o.jsonl"), dir.join("o-link.jsonl")).expect("symlink");
    for args in [
        &["--output", "o.jsonl", "--late-output", "./o.jsonl"][..],
        &["--output", "o.jsonl", "--dead-letter", "o-link.jsonl"][..],
        &["--output", "o.jsonl", "--stats-file", "sub/../o.jsonl"][..],
        // Neither exists yet: compared by their canonical directory and name.
        &[
            "--output",
            "new.jsonl",
            "--stats-file",
            "./sub/../new.jsonl",
        ][..],
    ] {
        let mut all = vec!["run", "--input", "s.jsonl"];
        all.extend_from_slice(args);
        let out = run_in(dir, &all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("same file"), "{}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(dir.join("o.jsonl")).expect("read"),
            "keep me\n",
            "{all:?}"
        );
        assert!(!dir.join("new.jsonl").exists(), "{all:?}");
    }

    std::fs::write(dir.join("run.toml"), "gap = \"10m\"\n").expect("write");
    let out = run_in(
        dir,
        &[
            "run",
            "--config",
            "run.toml",
            "--input",
            "s.jsonl",
            "--output",
            "o.jsonl",
            "--stats-file",
            "./run.toml",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("run.toml")).expect("read"),
        "gap = \"10m\"\n"
    );

    // Devices may be shared, and distinct files are fine.
    let out = run_in(
        dir,
        &[
            "run",
            "--input",
            "s.jsonl",
            "--output",
            "/dev/null",
            "--dead-letter",
            "/dev/null",
            "--late-output",
            "/dev/null",
            "--stats-file",
            "sub/stats.json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dir.join("sub/stats.json").exists());
}

/// `sessionizer run --output s.jsonl < s.jsonl`: stdin is the very file the output would
/// truncate.
#[test]
fn an_output_naming_the_file_stdin_reads_is_refused() {
    let tmp = spelled_dir();
    let dir = tmp.path();
    let out = bin()
        .current_dir(dir)
        .args(["run", "--output", "./s.jsonl"])
        .stdin(std::fs::File::open(dir.join("s.jsonl")).expect("open"))
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("stdin"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("s.jsonl")).expect("read"),
        VISITS
    );
}

/// Many small sessions: enough output to overflow a pipe.
fn many_sessions(dir: &Path) -> PathBuf {
    let input = dir.join("many.jsonl");
    let mut text = String::new();
    for i in 0..3000 {
        text.push_str(&format!(
            "{{\"visit_id\":\"k{i}\",\"event_time\":\"2024-01-01T00:{:02}:{:02}Z\"}}\n",
            (i / 60) % 60,
            i % 60
        ));
    }
    std::fs::write(&input, text).expect("write");
    input
}

/// Issue 8: `run ... --stats-file st.json | head` wrote no stats file.
#[test]
fn stats_file_is_written_when_stdout_is_closed_early() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = many_sessions(tmp.path());
    let stats = tmp.path().join("stats.json");
    let mut child = bin()
        .args([
            "run",
            "--input",
            s(&input),
            "--gap",
            "1s",
            "--watermark-delay",
            "0s",
            "--stats-file",
            s(&stats),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Like `| head -1`: read one line, then close the pipe.
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("first line");
    assert!(first.contains("\"session_id\""), "{first}");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "exit 0 quietly: {}", stderr(&out));
    let st: Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("the stats file exists"))
            .expect("stats JSON");
    let n = |k: &str| st[k].as_u64().unwrap_or_else(|| panic!("{k} in {st}"));
    assert!(n("records_read") > 0, "{st}");
    assert_eq!(
        n("in_sessions") + n("duplicates") + n("late") + n("invalid"),
        n("records_read"),
        "the counts of a stopped run still add up: {st}"
    );
    assert_eq!(st["output_closed"], "stdout", "{st}");
}

/// A dead-letter pipe closed while a batch's invalid records are written: the run stops
/// before that batch is sessionized, so the batch must not be counted either.
#[test]
fn a_run_stopped_by_a_closed_dead_letter_pipe_reports_counts_that_add_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("dirty.jsonl");
    let mut text = String::new();
    for i in 0..3000 {
        text.push_str(&format!(
            "{{\"visit_id\":\"k{i}\",\"event_time\":\"2024-01-01T00:00:00Z\"}}\nnot json {i}\n"
        ));
    }
    std::fs::write(&input, text).expect("write");
    let stats = tmp.path().join("stats.json");
    let mut child = bin()
        .args([
            "run",
            "--input",
            s(&input),
            "--output",
            s(&tmp.path().join("out.jsonl")),
            "--dead-letter",
            "-",
            "--stats-file",
            s(&stats),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", stderr(&out));
    let st: Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("stats JSON");
    let n = |k: &str| st[k].as_u64().unwrap_or_else(|| panic!("{k} in {st}"));
    assert_eq!(
        n("in_sessions") + n("duplicates") + n("late") + n("invalid"),
        n("records_read"),
        "{st}"
    );
    assert_eq!(st["output_closed"], "stdout", "{st}");
}

/// Issue 8: an unwritable `--stats-file` was reported only after all the work (and after
/// the outputs were written).
#[test]
fn an_unwritable_stats_file_is_refused_before_the_work_starts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, VISITS).expect("write");
    let out_file = tmp.path().join("out.jsonl");
    for stats in [
        tmp.path().join("missing-dir/stats.json"),
        tmp.path().to_path_buf(),
    ] {
        let out = bin()
            .args([
                "run",
                "--input",
                s(&input),
                "--output",
                s(&out_file),
                "--stats-file",
                s(&stats),
            ])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("stats file") && err.contains(s(&stats)),
            "{err}"
        );
        assert!(!err.contains("read 3 records"), "no work was done: {err}");
        assert!(!out_file.exists(), "no output was created");
    }
}

/// Issue 8 / docs/semantics.md S-32: with live stdin a session record stayed in the
/// output buffer until stdin closed. Now the outputs are flushed whenever the reader
/// would wait.
#[test]
fn live_stdin_output_is_visible_while_stdin_stays_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out_file = tmp.path().join("live.jsonl");
    let mut child = bin()
        .args([
            "run",
            "--gap",
            "3s",
            "--watermark-delay",
            "1s",
            "--output",
            s(&out_file),
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(b"{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n")
        .expect("write");
    // This event moves the watermark past the close of a's session.
    stdin
        .write_all(b"{\"visit_id\":\"b\",\"event_time\":\"2024-01-01T00:01:00Z\"}\n")
        .expect("write");
    stdin.flush().expect("flush");
    let sent = Instant::now();
    // The bound is about not waiting for the end of the input, not a benchmark.
    let mut seen = String::new();
    while sent.elapsed() < Duration::from_secs(2) {
        seen = std::fs::read_to_string(&out_file).unwrap_or_default();
        if seen.contains("\"key\":\"a\"") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        seen.contains("\"key\":\"a\""),
        "a's session is visible while stdin is open: {seen:?}"
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", stderr(&out));
    let all = std::fs::read_to_string(&out_file).expect("read");
    assert_eq!(all.lines().count(), 2, "{all}");
}

/// Issue 8: a line far longer than a read batch took quadratic time. A 20 MB valid
/// record and a 20 MB invalid line come out whole under a record size limit above
/// them (the cost itself is checked by counting bytes moved, in the reader's unit
/// tests).
#[test]
fn a_20_mb_line_is_a_record_and_another_a_dead_letter() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("long.jsonl");
    let page = "p".repeat(20 << 20);
    let broken = format!("{{\"visit_id\":\"c\",\"page\":\"{}", "q".repeat(20 << 20));
    let text = format!(
        "{{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\",\"page\":\"{page}\"}}\n{broken}\n{{\"visit_id\":\"b\",\"event_time\":\"2024-01-01T00:00:01Z\"}}\n"
    );
    std::fs::write(&input, &text).expect("write");
    let out_file = tmp.path().join("out.jsonl");
    let dead = tmp.path().join("dead.jsonl");
    run_ok(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&out_file),
        "--dead-letter",
        s(&dead),
        "--collect",
        "page",
        "--max-record-size",
        "32MB",
    ]);
    let sessions: Vec<Value> = std::fs::read_to_string(&out_file)
        .expect("read")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(sessions.len(), 2);
    let a = sessions
        .iter()
        .find(|r| r["key"] == "a")
        .expect("a's session");
    assert_eq!(a["page"][0].as_str().map(str::len), Some(page.len()));
    let dead: Value = serde_json::from_str(&std::fs::read_to_string(&dead).expect("dead letter"))
        .expect("one dead letter");
    assert_eq!(dead["source"], format!("{}:2", input.display()));
    assert_eq!(dead["raw"].as_str(), Some(broken.as_str()));
}

/// Issue 8: the dead-letter `raw` replaced bytes that are not UTF-8 with U+FFFD, losing
/// the original; `raw_base64` now carries them exactly.
#[test]
fn dead_letters_keep_bytes_that_are_not_utf8_in_raw_base64() {
    use base64::Engine as _;
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("bytes.jsonl");
    let bad: &[u8] = b"{\"visit_id\":\"a\xff\xfe\",\"event_time\":oops}";
    let mut text = Vec::new();
    text.extend_from_slice(bad);
    text.extend_from_slice(b"\nnot json\n");
    std::fs::write(&input, &text).expect("write");
    let dead = tmp.path().join("dead.jsonl");
    run_ok(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&tmp.path().join("out.jsonl")),
        "--dead-letter",
        s(&dead),
    ]);
    let recs: Vec<Value> = std::fs::read_to_string(&dead)
        .expect("read")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(recs.len(), 2);
    let exact = base64::engine::general_purpose::STANDARD
        .decode(recs[0]["raw_base64"].as_str().expect("raw_base64"))
        .expect("base64");
    assert_eq!(exact, bad, "the exact bytes come back");
    assert_eq!(
        recs[0]["raw"].as_str(),
        Some(String::from_utf8_lossy(bad).as_ref()),
        "raw stays readable"
    );
    assert_eq!(recs[1]["raw"], "not json");
    assert!(
        recs[1].get("raw_base64").is_none(),
        "UTF-8 lines need no copy"
    );
}

/// A state directory with many keys kept open.
fn state_with_keys(dir: &Path) -> PathBuf {
    let input = many_sessions(dir);
    let state = dir.join("state");
    run_ok(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&dir.join("out.jsonl")),
        "--state-dir",
        s(&state),
        "--keep-open",
    ]);
    state
}

/// Issue 8: `inspect ... | head -1` exited 1 with "Broken pipe"; `run` exits quietly.
#[test]
fn inspect_exits_quietly_when_stdout_is_closed_early() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = state_with_keys(tmp.path());
    for extra in [&["--keys"][..], &["--json", "--keys"][..], &[][..]] {
        let mut child = bin()
            .args(["inspect", "--state-dir", s(&state)])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Closed before the first write: every write fails with a broken pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{extra:?}: quietly");
    }
}

/// Issue 8: `inspect` on a file said "no such directory: no such directory".
#[test]
fn inspect_on_a_file_or_a_missing_path_prints_one_correct_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let missing = tmp.path().join("missing");
    for (path, want) in [
        (&file, "is not a directory"),
        (&missing, "no such directory"),
    ] {
        let out = bin()
            .args(["inspect", "--state-dir", s(path)])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(err.matches(want).count(), 1, "{err}");
        assert!(err.contains(s(path)), "{err}");
    }
}

/// Issue 8: `inspect` printed every key (610 KB for 1,831 keys) by default.
#[test]
fn inspect_prints_a_summary_by_default_and_the_keys_on_request() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = state_with_keys(tmp.path());
    let text = |extra: &[&str]| {
        let out = bin()
            .args(["inspect", "--state-dir", s(&state)])
            .args(extra)
            .output()
            .expect("spawn");
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).expect("utf8")
    };
    let summary = text(&[]);
    assert!(!summary.contains("\"k1\""), "no keys by default");
    assert!(summary.contains("keys with state 3000"), "{summary}");
    assert!(
        summary.contains("--keys"),
        "says how to list them: {summary}"
    );
    let all = text(&["--keys"]);
    assert!(all.contains("\"k1\"") && all.contains("\"k2999\""));
    let one = text(&["--key", "k7"]);
    assert!(one.contains("\"k7\"") && !one.contains("\"k1\""), "{one}");

    let json = |extra: &[&str]| -> Value {
        serde_json::from_str(&text(&[&["--json"], extra].concat())).expect("json")
    };
    let j = json(&[]);
    assert_eq!(j["keys_with_state"], 3000, "{j}");
    assert!(j.get("sessions").is_none(), "no keys by default: {j}");
    assert_eq!(
        json(&["--keys"])["sessions"].as_array().map(Vec::len),
        Some(3000)
    );
    assert_eq!(
        json(&["--key", "k7"])["sessions"].as_array().map(Vec::len),
        Some(1)
    );
}

fn refused(args: &[&str]) -> String {
    let out = bin()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    stderr(&out)
}

/// Issue 8: `--gap -5m` gave clap's "unexpected argument '-5'", `1h1h` was read as 2h
/// and `--idle-timeout 0s` was taken as "off".
#[test]
fn negative_repeated_and_zero_durations_are_refused_with_a_reason() {
    let err = refused(&["run", "--gap", "-5m"]);
    assert!(
        err.contains("--gap") && err.contains("negative") && !err.contains("unexpected"),
        "{err}"
    );
    let err = refused(&["run", "--watermark-delay", "1h1h"]);
    assert!(
        err.contains("--watermark-delay") && err.contains("'h'"),
        "{err}"
    );
    let err = refused(&["run", "--allowed-lateness", "30s1m"]);
    assert!(err.contains("largest first"), "{err}");
    let err = refused(&["run", "--idle-timeout", "0s"]);
    assert!(
        err.contains("--idle-timeout") && err.contains("leave"),
        "{err}"
    );
    let err = refused(&["generate", "--events", "1", "--late-by", "-5m"]);
    assert!(err.contains("negative"), "{err}");

    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = tmp.path().join("c.toml");
    std::fs::write(&cfg, "gap = \"1h1h\"\n").expect("write");
    let err = refused(&["run", "--config", s(&cfg)]);
    assert!(err.contains("gap") && err.contains("'h'"), "{err}");
    std::fs::write(&cfg, "idle-timeout = \"0ms\"\n").expect("write");
    let err = refused(&["run", "--config", s(&cfg)]);
    assert!(err.contains("idle-timeout"), "{err}");
}
