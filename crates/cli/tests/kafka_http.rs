//! The HTTP endpoint of a Kafka job (docs/semantics.md S-37 with K-1's tasks): against a
//! real broker (`scripts/kafka-dev.sh`), a running group member shows one task per input
//! partition in `/metrics`, answers `/sessions` from the task holding the key, and logs
//! its rebalances and transactions.

#![cfg(feature = "kafka")]

#[path = "support/kafka.rs"]
mod kafka;

use kafka::{broker, create_topics, produce_lines, unique};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sessionizer"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
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
    (status, r.body_mut().read_to_string().expect("body"))
}

/// `(labels, value)` of every sample of `name` (`name{labels} value`).
fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once("} ")?;
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_kafka_job_shows_one_task_per_partition_and_answers_for_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    let out = bin()
        .args([
            "generate", "--events", "3000", "--keys", "300", "--seed", "21",
        ])
        .args(["--invalid-fraction", "0.01", "--output", s(&data)])
        .output()
        .expect("generate");
    assert!(out.status.success());
    let (input, output, group) = (unique("visits"), unique("sessions"), unique("job"));
    create_topics(&[&input, &output], 3);
    let produced = produce_lines(&input, &data, "visit_id") as u64;
    // The key of the latest event: its session is still open when all is read.
    let latest = std::fs::read_to_string(&data)
        .expect("data")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let t = v["event_time"].as_str()?.to_string();
            Some((t, v["visit_id"].as_str()?.to_string()))
        })
        .max()
        .expect("events")
        .1;

    // No --stop-at-end: a long-running group member, stopped by the test.
    let mut child = bin()
        .env("RUST_LOG", "sessionizer=info")
        .args(["run", "--kafka-brokers", broker(), "--kafka-topic", &input])
        .args(["--kafka-group", &group, "--kafka-output-topic", &output])
        .args(["--gap", "2m", "--watermark-delay", "10s"])
        .args(["--checkpoint-interval", "200ms", "--progress", "never"])
        .args(["--http-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let err = child.stderr.take().expect("stderr");
    let (addr_tx, addr_rx) = mpsc::channel();
    let (log_tx, log_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("sessionizer: http listening on ") {
                let _ = addr_tx.send(a.to_string());
            }
            log.push_str(&line);
            log.push('\n');
        }
        let _ = log_tx.send(log);
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the address is printed");

    let began = Instant::now();
    let metrics = loop {
        let (status, text) = get(&addr, "/metrics");
        assert_eq!(status, 200);
        let read: f64 = samples(&text, "sessionizer_records_total")
            .iter()
            .map(|(_, v)| v)
            .sum();
        if read as u64 == produced {
            break text;
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "read {read} of {produced}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // One task per partition, each with its own counts and watermark.
    let tasks: Vec<String> = (0..3).map(|p| format!("task=\"{input}/{p}\"")).collect();
    assert!(metrics.contains("sessionizer_tasks 3\n"), "{metrics}");
    for t in &tasks {
        let in_task: Vec<f64> = samples(&metrics, "sessionizer_records_total")
            .iter()
            .filter(|(l, _)| l.starts_with(t.as_str()))
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(in_task.len(), 4, "four outcomes for {t}");
        assert!(in_task.iter().sum::<f64>() > 0.0, "{t} read records");
        let marks = samples(&metrics, "sessionizer_watermark_seconds");
        assert!(marks.iter().any(|(l, _)| l == t), "{t}: {metrics}");
    }
    assert!(get(&addr, "/health/ready").0 == 200);

    // The key is in exactly one task: the partition it was produced to.
    let (status, body) = get(&addr, &format!("/sessions?key={latest}"));
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answer["tasks"].as_array().map(Vec::len), Some(1), "{body}");
    let task = answer["tasks"][0]["task"].as_str().expect("task");
    assert!(task.starts_with(&format!("{input}/")), "{body}");
    let last = answer["sessions"]
        .as_array()
        .and_then(|s| s.last())
        .expect("a session");
    assert_eq!(last["status"], "open", "{body}");
    assert_eq!(last["task"], task);

    // Transactions are committed while it runs.
    let began = Instant::now();
    while samples(&get(&addr, "/metrics").1, "sessionizer_checkpoints_total")
        .iter()
        .all(|(l, _)| *l != "kind=\"transaction\"")
    {
        assert!(began.elapsed() < Duration::from_secs(30), "no commit");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().expect("stop the test's own process");
    child.wait().expect("wait");
    let log = log_rx.recv_timeout(Duration::from_secs(30)).expect("log");
    // Every partition was assigned through logged rebalance events.
    let assigned: u64 = log
        .lines()
        .filter(|l| {
            l.contains("sessionizer::telemetry: rebalance") && l.contains("kind=\"assign\"")
        })
        .filter_map(|l| {
            l.split("count=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(assigned, 3, "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("sessionizer::telemetry: checkpoint")
                && l.contains("kind=\"transaction\"")),
        "{log}"
    );
}
