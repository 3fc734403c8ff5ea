//! Ways a run could once give a wrong or corrupted result, or unbounded memory, without
//! an error: each test here failed before its fix.

#[path = "support/process.rs"]
mod process;

use process::{bin, run, run_ok, s, signal};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

fn stats(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("stats file")).expect("stats JSON")
}

/// The peak resident memory of a running process, from /proc.
fn peak_rss_bytes(child: &Child) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// A record longer than `--max-record-size` is a dead letter with its position, its
/// length and its first bytes; the lines around it are read as usual and the counts
/// add up. Before: a line was buffered whole, up to 4 GiB.
#[test]
fn a_record_above_the_size_limit_is_a_dead_letter_with_its_length_and_first_bytes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    let big = format!(
        "{{\"visit_id\":\"big\",\"event_time\":\"2024-01-01T00:00:00Z\",\"page\":\"{}\"}}",
        "p".repeat(3 << 20)
    );
    let text = format!(
        "{{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}}\n{big}\n{{\"visit_id\":\"b\",\"event_time\":\"2024-01-01T00:00:01Z\"}}\n{big}"
    );
    std::fs::write(&input, &text).expect("write");
    let out = tmp.path().join("out.jsonl");
    let dead = tmp.path().join("dead.jsonl");
    let stats_file = tmp.path().join("stats.json");
    run_ok(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--dead-letter",
        s(&dead),
        "--stats-file",
        s(&stats_file),
        "--max-record-size",
        "1MB",
    ]);
    let keys: Vec<Value> = json_lines(&out).iter().map(|r| r["key"].clone()).collect();
    assert_eq!(keys, ["a", "b"]);
    let dead = json_lines(&dead);
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (d, line) in dead.iter().zip([2, 4]) {
        assert_eq!(d["source"], format!("{}:{line}", input.display()));
        let reason = d["reason"].as_str().expect("reason");
        assert!(
            reason.contains(&format!("{} bytes", big.len())) && reason.contains("1048576"),
            "{reason}"
        );
        let raw = d["raw"].as_str().expect("raw");
        assert!(
            big.starts_with(raw) && raw.len() == 1024,
            "{} bytes",
            raw.len()
        );
    }
    let st = stats(&stats_file);
    assert_eq!(
        (
            st["records_read"].as_u64(),
            st["in_sessions"].as_u64(),
            st["invalid"].as_u64()
        ),
        (Some(4), Some(2), Some(2))
    );
    assert_eq!(st["bytes_read"].as_u64(), Some(text.len() as u64));
}

/// `sessionizer run --input /dev/zero` reached 4.4 GB of memory in 3 s: one endless
/// line, buffered whole. Now it streams by in flat memory, and SIGTERM still stops the
/// run (the record never ends, so no batch ever comes to the loop that looks for it).
#[test]
fn reading_dev_zero_stays_in_flat_memory_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let stats_file = tmp.path().join("stats.json");
    let mut child = bin()
        .args([
            "run",
            "--input",
            "/dev/zero",
            "--output",
            s(&tmp.path().join("z.out")),
            "--stats-file",
            s(&stats_file),
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Long enough to read gigabytes of zeros (it reads at several GB/s).
    std::thread::sleep(Duration::from_secs(3));
    let peak = peak_rss_bytes(&child);
    signal(&child, "-TERM");
    let began = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if began.elapsed() > Duration::from_secs(10) {
            child.kill().expect("kill");
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        peak < 120 << 20,
        "peak RSS {} MiB while reading /dev/zero",
        peak >> 20
    );
    assert_eq!(status.and_then(|s| s.code()), Some(1), "stopped by SIGTERM");
    assert_eq!(stats(&stats_file)["stopped"], true);
}

/// A file that begins with a UTF-8 byte-order mark lost its first line to the dead
/// letters.
#[test]
fn a_byte_order_mark_does_not_cost_the_first_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("bom.jsonl");
    std::fs::write(
        &input,
        b"\xef\xbb\xbf{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .expect("write");
    let out = tmp.path().join("out.jsonl");
    let o = run_ok(&["run", "--input", s(&input), "--output", s(&out)]);
    assert_eq!(json_lines(&out).len(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("invalid 0"), "{}", stderr(&o));
}

/// A run that holds `out` open: it reads a stdin that stays open until `feed` is
/// dropped.
struct Holder {
    child: Child,
    feed: Option<std::process::ChildStdin>,
}

fn hold_output(out: &Path, extra: &[&str]) -> Holder {
    let mut child = bin()
        .args(["run", "--output", s(out), "--gap", "1m"])
        .args(extra)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut feed = child.stdin.take().expect("stdin");
    feed.write_all(b"{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n")
        .expect("write");
    feed.flush().expect("flush");
    // The output is opened (and locked) before the first record is read.
    let began = Instant::now();
    while !out.exists() && began.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    Holder {
        child,
        feed: Some(feed),
    }
}

/// Two runs writing one output both exited 0 and left a file that matched neither
/// (one line not even JSON). Every file a run writes is locked now, before anything is
/// cut: the second run is refused, naming the file, and the first one's output is
/// what it would be alone.
#[test]
fn a_second_run_writing_the_same_output_is_refused_and_the_first_one_is_intact() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    run_ok(&[
        "generate",
        "--events",
        "20000",
        "--seed",
        "5",
        "--output",
        s(&input),
    ]);
    let out = tmp.path().join("o").join("s.jsonl");
    std::fs::create_dir_all(out.parent().expect("dir")).expect("mkdir");
    let dead = tmp.path().join("o").join("dead.jsonl");
    let stats_file = tmp.path().join("o").join("stats.json");
    let mut first = hold_output(
        &out,
        &["--dead-letter", s(&dead), "--stats-file", s(&stats_file)],
    );
    // The same output, and each of the first run's other files.
    for (args, named) in [
        (vec!["--output", s(&out)], &out),
        (vec!["--output", "-", "--dead-letter", s(&dead)], &dead),
        (
            vec!["--output", "-", "--stats-file", s(&stats_file)],
            &stats_file,
        ),
    ] {
        let second = run(&[&["run", "--input", s(&input), "--gap", "5m"][..], &args].concat());
        assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
        let err = stderr(&second);
        assert!(
            err.contains(&named.display().to_string()) && err.contains("another process"),
            "{err}"
        );
    }
    // Devices stay shareable.
    let shared = run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        "/dev/null",
        "--dead-letter",
        "/dev/null",
        "--late-output",
        "/dev/null",
    ]);
    assert!(shared.status.success(), "{}", stderr(&shared));

    drop(first.feed.take());
    let done = first.child.wait_with_output().expect("wait");
    assert!(done.status.success(), "{}", stderr(&done));
    let alone = tmp.path().join("alone.jsonl");
    let mut solo = hold_output(&alone, &["--dead-letter", "/dev/null"]);
    drop(solo.feed.take());
    assert!(solo.child.wait().expect("wait").success());
    assert_eq!(
        std::fs::read(&out).expect("first output"),
        std::fs::read(&alone).expect("alone"),
        "the first run's output is what it writes alone"
    );
    assert_eq!(stats(&stats_file)["records_read"].as_u64(), Some(1));
}

/// A run stopped by SIGTERM left a 0-byte --stats-file. It now stops between two
/// batches, writes out what it processed, and writes its stats with "stopped": true
/// (exit code 1: the input was not read to its end).
#[test]
fn sigterm_stops_a_run_cleanly_and_writes_its_stats() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out.jsonl");
    let stats_file = tmp.path().join("stats.json");
    // One event a second over 37 keys, each its own session (gap 1s); the last line
    // jumps ahead and alone moves the watermark past the session at 00:16:38.
    let mut lines: Vec<String> = (0..999)
        .map(|i| {
            format!(
                "{{\"visit_id\":\"v{}\",\"event_time\":\"2024-01-01T00:{:02}:{:02}Z\"}}\n",
                i % 37,
                i / 60,
                i % 60
            )
        })
        .collect();
    lines.push("{\"visit_id\":\"last\",\"event_time\":\"2024-01-01T00:20:00Z\"}\n".into());
    let mut child = bin()
        .args([
            "run",
            "--output",
            s(&out),
            "--stats-file",
            s(&stats_file),
            "--gap",
            "1s",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut feed = child.stdin.take().expect("stdin");
    for l in &lines {
        feed.write_all(l.as_bytes()).expect("write");
    }
    feed.flush().expect("flush");
    // Once the session at 00:16:38 is out, every line was read.
    let began = Instant::now();
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("\"start\":\"2024-01-01T00:16:38.000Z\"")
        && began.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, "-TERM");
    let done = child.wait_with_output().expect("wait");
    drop(feed);
    assert_eq!(done.status.code(), Some(1), "{}", stderr(&done));
    assert!(
        stderr(&done).contains("stopped by a signal"),
        "{}",
        stderr(&done)
    );
    let st = stats(&stats_file);
    assert_eq!(st["stopped"], true, "{st}");
    assert_eq!(st["records_read"].as_u64(), Some(1000), "{st}");
    // The sessions still open (not yet closed by the watermark) were not emitted.
    let emitted = json_lines(&out).len() as u64;
    assert_eq!(st["sessions_emitted"].as_u64(), Some(emitted), "{st}");
    assert!(emitted < 1000, "{emitted}");
}

/// A run that failed (here: an invalid record with `--on-invalid fail`) left no stats
/// file; it now writes one with the counts so far and the error.
#[test]
fn a_failed_run_writes_its_stats_with_the_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n[1]\n{\"visit_id\":\"b\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .expect("write");
    let stats_file = tmp.path().join("stats.json");
    let o = run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&tmp.path().join("out.jsonl")),
        "--on-invalid",
        "fail",
        "--stats-file",
        s(&stats_file),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let st = stats(&stats_file);
    let error = st["error"].as_str().expect("error in the stats");
    assert!(
        error.contains(":2") && error.contains("--on-invalid fail"),
        "{error}"
    );
    // And the error is printed once, not also as a log line (RUST_LOG unset).
    let err = stderr(&o);
    assert_eq!(err.matches("--on-invalid fail").count(), 1, "{err}");
}

/// With RUST_LOG unset every fatal error was printed twice: as a log event and by the
/// binary.
#[test]
fn a_fatal_error_is_printed_once() {
    let o = bin()
        .args([
            "run",
            "--input",
            "/nonexistent/visits.jsonl",
            "--output",
            "-",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("spawn");
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.matches("/nonexistent/visits.jsonl").count(), 1, "{err}");
}

/// `--sum v --min v` was refused ("two aggregates are named 'v'") unless a config file
/// renamed one; NAME=FIELD names an aggregate on the command line. And a sum past the
/// float range was written `null`, as if there were no numbers.
#[test]
fn aggregates_are_named_on_the_command_line_and_an_overflowing_sum_is_said() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\",\"v\":3,\"w\":1e308}\n{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:01Z\",\"v\":-2,\"w\":1e308}\n",
    )
    .expect("write");
    let out = tmp.path().join("out.jsonl");
    let refused = run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--sum",
        "v",
        "--min",
        "v",
    ]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("NAME=FIELD"),
        "{}",
        stderr(&refused)
    );
    run_ok(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--sum",
        "v",
        "--min",
        "min_v=v",
        "--sum",
        "w",
    ]);
    let r = &json_lines(&out)[0];
    assert_eq!(
        (r["v"].as_i64(), r["min_v"].as_i64()),
        (Some(1), Some(-2)),
        "{r}"
    );
    assert_eq!(r["w"], "Infinity", "{r}");
}
