//! A running job's endpoint and logs (docs/semantics.md S-37), end to end against the
//! real binary: `run --http-addr` on a live stdin, scraped and asked with a real HTTP
//! client while lines arrive, its final stats compared with the last scrape; and the logs
//! that `RUST_LOG` turns on (one event per checkpoint, restore, damaged checkpoint).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sessionizer"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// A `sessionizer run` on a live stdin with `--http-addr 127.0.0.1:0`.
struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    addr: String,
    /// Everything written to stderr, once the process has ended.
    stderr: mpsc::Receiver<String>,
}

impl Live {
    fn start(args: &[&str]) -> Live {
        let mut child = bin()
            .arg("run")
            .args(args)
            .args(["--http-addr", "127.0.0.1:0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sessionizer");
        let stdin = child.stdin.take();
        let err = child.stderr.take().expect("stderr");
        let (addr_tx, addr_rx) = mpsc::channel();
        let (all_tx, stderr) = mpsc::channel();
        std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("sessionizer: http listening on ") {
                    let _ = addr_tx.send(a.to_string());
                }
                all.push_str(&line);
                all.push('\n');
            }
            let _ = all_tx.send(all);
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the chosen address is printed on stderr");
        Live {
            child,
            stdin,
            addr,
            stderr,
        }
    }

    fn send(&mut self, lines: &[&str]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        for l in lines {
            stdin.write_all(l.as_bytes()).expect("write");
            stdin.write_all(b"\n").expect("write");
        }
        stdin.flush().expect("flush");
    }

    fn get(&self, path: &str) -> (u16, String) {
        get(&self.addr, path)
    }

    fn metrics(&self) -> Metrics {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "{text}");
        Metrics(text)
    }

    /// Scrapes until `done` holds (the pipeline works on its own thread).
    fn metrics_when(&self, what: &str, done: impl Fn(&Metrics) -> bool) -> Metrics {
        let began = Instant::now();
        loop {
            let m = self.metrics();
            if done(&m) {
                return m;
            }
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "{what} never held:\n{}",
                m.0
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes stdin and waits for the end; returns stderr.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait");
        let err = self
            .stderr
            .recv_timeout(Duration::from_secs(30))
            .expect("stderr");
        assert!(status.success(), "{err}");
        err
    }
}

fn get(addr: &str, path: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let mut r = agent
        .get(format!("http://{addr}{path}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string().expect("body");
    (status, body)
}

/// A scrape of `/metrics`.
struct Metrics(String);

impl Metrics {
    /// The value of one series, written as in the exposition (`name{labels}`).
    fn try_get(&self, series: &str) -> Option<f64> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().expect("a number"))
    }

    fn get(&self, series: &str) -> f64 {
        self.try_get(series)
            .unwrap_or_else(|| panic!("no series {series} in:\n{}", self.0))
    }

    fn records(&self, outcome: &str) -> u64 {
        self.get(&format!(
            r#"sessionizer_records_total{{task="0",outcome="{outcome}"}}"#
        )) as u64
    }

    /// Records read: the sum over the outcomes (0 before the first batch).
    fn read(&self) -> u64 {
        ["in_sessions", "duplicates", "late", "invalid"]
            .iter()
            .map(|o| {
                self.try_get(&format!(
                    r#"sessionizer_records_total{{task="0",outcome="{o}"}}"#
                ))
                .unwrap_or(0.0) as u64
            })
            .sum()
    }

    fn emitted(&self) -> u64 {
        self.get(r#"sessionizer_sessions_emitted_total{task="0"}"#) as u64
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A session of `/sessions` without the fields it adds to the output record.
fn as_record(session: &Value) -> Value {
    let mut v = session.clone();
    let fields = v.as_object_mut().expect("an object");
    for extra in ["close", "status", "task"] {
        assert!(fields.remove(extra).is_some(), "{extra} in {session}");
    }
    v
}

fn output_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(json)
        .collect()
}

fn visit(key: &str, time: &str, page: &str) -> String {
    format!(r#"{{"visit_id":"{key}","event_time":"2024-01-01T{time}Z","page":"{page}"}}"#)
}

/// docs/semantics.md S-37 / issue 8: a running job is scraped while stdin stays open; its
/// counters move with the input, `/sessions` answers with the state (open and final
/// sessions, none), `/health` is live and ready, and after stdin closes the stats file
/// adds up with the last scrape.
#[test]
fn a_live_job_serves_metrics_sessions_and_health_that_add_up_with_its_stats() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("sessions.jsonl");
    let stats = tmp.path().join("stats.json");
    let mut job = Live::start(&[
        "--gap",
        "10s",
        "--watermark-delay",
        "0s",
        "--dedup",
        "--collect",
        "page",
        "--output",
        s(&out),
        "--stats-file",
        s(&stats),
    ]);
    let (status, body) = job.get("/health");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["live"], true);
    let began = Instant::now();
    while job.get("/health/ready").0 != 200 {
        assert!(began.elapsed() < Duration::from_secs(20), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(json(&job.get("/health").1)["ready"], true);

    let a2 = visit("a", "00:00:05", "/a2");
    job.send(&[
        &visit("a", "00:00:00", "/a1"),
        &a2,
        &a2, // a duplicate
        &visit("b", "00:00:06", "/b1"),
        "not json", // invalid
        // W = 00:00:20: a (closes 00:00:15) and b (00:00:16) complete and, with no
        // allowed lateness, final: only their bounds are kept for one more gap.
        &visit("c", "00:00:20", "/c1"),
        &visit("a", "00:00:02", "/late"), // joins a final session: late
        &visit("c", "00:00:21", "/c2"),
    ]);
    let first = job.metrics_when("8 records counted", |m| m.read() == 8);
    assert_eq!(first.records("in_sessions"), 5);
    assert_eq!(first.records("duplicates"), 1);
    assert_eq!(first.records("late"), 1);
    assert_eq!(first.records("invalid"), 1);
    assert_eq!(first.emitted(), 2);
    assert_eq!(first.get(r#"sessionizer_open_sessions{task="0"}"#), 1.0);
    assert_eq!(first.get(r#"sessionizer_keys{task="0"}"#), 3.0);
    assert_eq!(first.get("sessionizer_ready"), 1.0);
    assert_eq!(
        first.get(r#"sessionizer_watermark_seconds{task="0"}"#),
        1_704_067_221.0,
        "2024-01-01T00:00:21Z, the largest event time"
    );
    assert!(first.get(r#"sessionizer_watermark_lag_seconds{task="0"}"#) > 0.0);
    // Both completed sessions were written out while stdin stayed open.
    let written = job.metrics_when("the emissions are written", |m| {
        m.get("sessionizer_emission_delay_seconds_count") == 2.0
    });
    assert!(written.get("sessionizer_emission_delay_seconds_sum") >= 0.0);

    // An open session, as the state holds it.
    let (status, body) = job.get("/sessions?key=c");
    assert_eq!(status, 200, "{body}");
    let c = json(&body);
    assert_eq!(c["key"], "c");
    assert_eq!(c["tasks"][0]["task"], "0");
    assert_eq!(c["tasks"][0]["watermark"], "2024-01-01T00:00:21.000Z");
    let c_open = &c["sessions"][0];
    assert_eq!(c["sessions"].as_array().expect("list").len(), 1, "{body}");
    assert_eq!(c_open["status"], "open");
    assert_eq!(c_open["close"], "2024-01-01T00:00:31.000Z");
    assert_eq!(c_open["event_count"], 2);
    assert_eq!(c_open["revision"], 0);
    assert_eq!(c_open["page"], serde_json::json!(["/c1", "/c2"]));
    // A final session: bounds only, no aggregates.
    let (status, body) = job.get("/sessions?key=a");
    assert_eq!(status, 200, "{body}");
    let a = json(&body);
    assert_eq!(a["sessions"][0]["status"], "final", "{body}");
    assert_eq!(a["sessions"][0]["start"], "2024-01-01T00:00:00.000Z");
    assert_eq!(a["sessions"][0]["end"], "2024-01-01T00:00:05.000Z");
    assert!(a["sessions"][0].get("page").is_none(), "{body}");
    // No state: 404 and an empty list. A key is URL-decoded.
    let (status, body) = job.get("/sessions?key=no%20such");
    assert_eq!(status, 404);
    assert_eq!(
        json(&body),
        serde_json::json!({"key": "no such", "sessions": []})
    );
    assert_eq!(job.get("/sessions").0, 400);
    assert_eq!(job.get("/nothing-here").0, 404);

    // Later input moves the counters on: c completes, d opens.
    std::thread::sleep(Duration::from_millis(200));
    job.send(&[
        &visit("d", "00:00:40", "/d1"),
        &visit("d", "00:00:41", "/d2"),
    ]);
    let last = job.metrics_when("10 records counted", |m| m.read() == 10);
    assert_eq!(last.records("in_sessions"), 7);
    assert_eq!(last.emitted(), 3);
    let d = json(&job.get("/sessions?key=d").1);
    assert_eq!(d["sessions"][0]["status"], "open");
    assert_eq!(
        job.get("/sessions?key=a").0,
        404,
        "a's bounds are forgotten"
    );
    let open = last.get(r#"sessionizer_open_sessions{task="0"}"#) as u64;
    assert_eq!(open, 1);

    job.finish();
    // What /sessions said is what came out.
    let records = output_records(&out);
    let c_out = records
        .iter()
        .find(|r| r["key"] == "c")
        .expect("c's session");
    assert_eq!(&as_record(c_open), c_out);
    let d_out = records
        .iter()
        .find(|r| r["key"] == "d")
        .expect("d's session");
    assert_eq!(&as_record(&d["sessions"][0]), d_out);
    // The stats file adds up with the last scrape: nothing was read after it, and the
    // sessions still open then were emitted at the end of the input.
    let st = json(&std::fs::read_to_string(&stats).expect("stats file"));
    assert_eq!(st["records_read"], last.read());
    assert_eq!(st["in_sessions"], last.records("in_sessions"));
    assert_eq!(st["duplicates"], last.records("duplicates"));
    assert_eq!(st["late"], last.records("late"));
    assert_eq!(st["invalid"], last.records("invalid"));
    assert_eq!(st["sessions_emitted"], last.emitted() + open);
    assert_eq!(st["retractions"], 0);
    assert_eq!(records.len() as u64, last.emitted() + open);
}

/// `/sessions` tells a session kept for the allowed lateness (`complete`) from an open
/// one, and follows its revisions: each answer equals the record the output got.
#[test]
fn sessions_kept_for_lateness_are_complete_and_follow_their_revisions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("sessions.jsonl");
    let mut job = Live::start(&[
        "--gap",
        "10s",
        "--watermark-delay",
        "0s",
        "--allowed-lateness",
        "1m",
        "--collect",
        "page",
        "--output",
        s(&out),
    ]);
    let answer_of_a = |job: &Live, revision: u64| -> Value {
        let began = Instant::now();
        loop {
            let (status, body) = job.get("/sessions?key=a");
            if status == 200 {
                let v = json(&body);
                if v["sessions"][0]["revision"] == revision
                    && v["sessions"][0]["status"] == "complete"
                {
                    return v["sessions"][0].clone();
                }
            }
            assert!(began.elapsed() < Duration::from_secs(20), "{body}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    job.send(&[
        &visit("a", "00:00:00", "/a1"),
        &visit("b", "00:00:20", "/b1"), // a completes
    ]);
    let first = answer_of_a(&job, 0);
    assert_eq!(first["event_count"], 1);
    // A late event within the lateness revises a.
    job.send(&[&visit("a", "00:00:05", "/a2")]);
    let second = answer_of_a(&job, 1);
    assert_eq!(second["event_count"], 2);
    assert_eq!(second["page"], serde_json::json!(["/a1", "/a2"]));
    let b = json(&job.get("/sessions?key=b").1);
    assert_eq!(b["sessions"][0]["status"], "open");
    job.finish();
    let a_records: Vec<Value> = output_records(&out)
        .into_iter()
        .filter(|r| r["key"] == "a")
        .collect();
    assert_eq!(a_records, [as_record(&first), as_record(&second)]);
}

/// The README's `/sessions` example is a real answer: keep the two in step.
#[test]
fn the_readme_sessions_example_is_a_real_answer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let block = readme
        .split("<!-- sessions-example -->")
        .nth(1)
        .and_then(|rest| rest.split("```json").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("README has the /sessions example");
    let want = json(block);
    let visits = std::fs::read_to_string(root.join("examples/data/visits.jsonl")).expect("data");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut job = Live::start(&[
        "--gap",
        "10m",
        "--watermark-delay",
        "2m",
        "--allowed-lateness",
        "5m",
        "--dedup",
        "--collect",
        "page",
        "--output",
        s(&tmp.path().join("out.jsonl")),
    ]);
    let first_five: Vec<&str> = visits.lines().take(5).collect();
    job.send(&first_five);
    job.metrics_when("five records counted", |m| m.read() == 5);
    let (status, body) = job.get("/sessions?key=v1");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), want, "{body}");
    job.finish();
}

/// `/sessions?key=%ZZ` answered for the literal key `%ZZ`, and `%FF%FE` was decoded to
/// U+FFFD U+FFFD: a query that is not valid percent-encoding, or whose key is not UTF-8,
/// is a 400 that says so. `+` is a space, `%2B` a plus, `%E2%82%AC` a euro sign.
#[test]
fn a_malformed_or_non_utf8_key_is_a_400_that_says_what_is_wrong() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut job = Live::start(&["--gap", "10m", "--output", s(&tmp.path().join("out.jsonl"))]);
    let keys = ["%ZZ", "a b", "a+b", "\u{20ac}"];
    let lines: Vec<String> = keys
        .iter()
        .map(|k| json!({"visit_id": k, "event_time": "2024-01-01T00:00:00Z"}).to_string())
        .collect();
    job.send(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    job.metrics_when("four records counted", |m| m.read() == 4);
    for (query, key) in [
        ("a+b", "a b"),
        ("a%20b", "a b"),
        ("a%2Bb", "a+b"),
        ("%E2%82%AC", "\u{20ac}"),
        ("%25ZZ", "%ZZ"),
    ] {
        let (status, body) = job.get(&format!("/sessions?key={query}"));
        assert_eq!(status, 200, "{query}: {body}");
        assert_eq!(json(&body)["key"], key, "{query}: {body}");
    }
    for (query, says) in [
        ("key=%ZZ", "%ZZ"),
        ("key=abc%", "%"),
        ("key=%4", "%4"),
        ("key=%FF%FE", "UTF-8"),
        ("other=%zz&key=a+b", "%zz"),
    ] {
        let (status, body) = job.get(&format!("/sessions?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        let error = json(&body)["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{query}: no error in {body}"))
            .to_string();
        assert!(error.contains(says), "{query}: {error}");
    }
    job.finish();
}

fn generate(path: &Path, events: u64) {
    let out = bin()
        .args(["generate", "--events", &events.to_string(), "--seed", "5"])
        .args(["--output", s(path)])
        .output()
        .expect("generate");
    assert!(out.status.success());
}

/// `RUST_LOG` log lines of the telemetry module with `message`.
fn events<'a>(log: &'a str, message: &str) -> Vec<&'a str> {
    let marker = format!("sessionizer::telemetry: {message}");
    log.lines().filter(|l| l.contains(&marker)).collect()
}

/// docs/semantics.md S-37: with `RUST_LOG` a run logs one event with fields per
/// checkpoint, per restore and per damaged checkpoint; the warning a user sees is still
/// printed.
#[test]
fn logs_have_one_event_per_checkpoint_restore_and_damaged_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 20_000);
    let state = tmp.path().join("state");
    let stats = tmp.path().join("stats.json");
    let run = || {
        bin()
            .env("RUST_LOG", "sessionizer=info")
            .args(["run", "--input", s(&input), "--state-dir", s(&state)])
            .args(["--checkpoint-every-records", "4000", "--keep-open"])
            .args(["--output", s(&tmp.path().join("out.jsonl"))])
            .args(["--stats-file", s(&stats)])
            .output()
            .expect("run")
    };
    let first = run();
    let log = String::from_utf8_lossy(&first.stderr).into_owned();
    assert!(first.status.success(), "{log}");
    assert!(
        !log.contains('\x1b'),
        "no colours outside a terminal: {log}"
    );
    let st = json(&std::fs::read_to_string(&stats).expect("stats"));
    let written = st["checkpoints"]["written"].as_u64().expect("written");
    let checkpoints = events(&log, "checkpoint ");
    assert_eq!(checkpoints.len() as u64, written, "{log}");
    assert!(written >= 3, "{log}");
    for l in &checkpoints {
        for field in ["kind=", "epoch=", "bytes=", "keys=", "duration_ms="] {
            assert!(l.contains(field), "{field} in {l}");
        }
    }
    let last_epoch = st["checkpoints"]["last_epoch"].as_u64().expect("epoch");
    assert!(events(&log, "state restored").is_empty(), "{log}");

    // Damage the newest manifest: the next run falls back to the one before.
    let manifest = state.join(sessionizer_checkpoint::dir::file_name(
        sessionizer_checkpoint::FileKind::Manifest,
        last_epoch,
    ));
    let mut bytes = std::fs::read(&manifest).expect("manifest");
    let i = bytes.len() / 2;
    bytes[i] ^= 0x20;
    std::fs::write(&manifest, bytes).expect("damage");
    let second = run();
    let log = String::from_utf8_lossy(&second.stderr).into_owned();
    assert!(second.status.success(), "{log}");
    let damaged = events(&log, "damaged checkpoint skipped");
    assert_eq!(damaged.len(), 1, "{log}");
    assert!(damaged[0].contains(&format!("epoch={last_epoch}")), "{log}");
    assert!(damaged[0].contains("damage="), "{log}");
    assert!(
        log.contains(&format!(
            "sessionizer: warning: checkpoint {last_epoch} in {}",
            state.display()
        )),
        "the user's warning is still printed: {log}"
    );
    let restored = events(&log, "state restored");
    assert_eq!(restored.len(), 1, "{log}");
    let r = restored[0];
    assert!(r.contains(&format!("epoch={}", last_epoch - 1)), "{r}");
    for field in ["records=", "bytes=", "keys=", "duration_ms=", "task=\"0\""] {
        assert!(r.contains(field), "{field} in {r}");
    }
}
