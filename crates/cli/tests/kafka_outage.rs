//! A Kafka job riding out a broker that goes away (docs/kafka-faults in the README's
//! Kafka section): the real binary against a broker of its own — started by
//! `scripts/kafka-dev.sh` on a port no other test uses, so that killing it disturbs
//! nobody else — killed with SIGKILL in the middle of an exactly-once run and started
//! again. The job waits and finishes; what a `read_committed` reader finds in each
//! output partition is the file run of the matching input partition, byte for byte.

#![cfg(feature = "kafka")]

#[path = "support/kafka.rs"]
mod kafka;
#[path = "support/kafka_runs.rs"]
mod kafka_runs;
#[path = "support/process.rs"]
mod process;

use kafka_runs::{Topics, as_strs, assert_adds_up, assert_matches_file_runs, stats_of};
use process::{bin, generate, run, s};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// This binary's broker: one node, on a port of its own.
const PORT: u16 = 29592;

/// The job's arguments: Kafka in and out, exactly once, `--stop-at-end`, commits every
/// 200 ms, calls to the cluster bounded by 5 s (so that a call made while the broker
/// is away fails soon and the job starts waiting), and `extra`.
fn job_args(t: &Topics, stats: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = t.args();
    args.extend(
        [
            "--stop-at-end",
            "--checkpoint-interval",
            "200ms",
            "--kafka-timeout",
            "5s",
            "--kafka-instance-id",
            "outage-1",
            "--stats-file",
            s(stats),
        ]
        .iter()
        .chain(extra)
        .map(|a| a.to_string()),
    );
    args
}

/// Starts the job; returns it once its first output is committed (it is then in the
/// middle of its run).
fn start_job(args: &[String], t: &Topics) -> Child {
    let mut child = bin()
        .args(as_strs(args))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sessionizer");
    let began = Instant::now();
    while kafka::last_stable_offsets(&t.output, 4).iter().sum::<i64>() == 0 {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "no output committed within a minute"
        );
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("the job ended ({status}) before any output was committed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Waits for the job to end, at most `limit`.
fn wait_for(mut child: Child, limit: Duration) -> Output {
    let began = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if began.elapsed() > limit {
            child.kill().expect("kill");
            let out = child.wait_with_output().expect("reap");
            panic!(
                "the job did not end within {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// One job over `events` generated visits (with `extra` options) whose broker is
/// killed once its first output is committed and started again `pause` later.
fn killed_broker(pause: Duration, extra: &[&str], events: u64, seed: u64) {
    kafka::own_brokers(PORT, 1);
    let _one_at_a_time = kafka::exclusive();
    kafka::broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, events, seed);
    let t = Topics::new(4);
    let produced = kafka::produce_lines(&t.input, &data, "visit_id");
    let stats = dir.path().join("stats.json");
    let args = job_args(&t, &stats, extra);
    let mut job = start_job(&args, &t);
    kafka::kill_node(1);
    assert!(
        job.try_wait().expect("wait").is_none(),
        "the job ended before the broker was killed: make the input larger"
    );
    std::thread::sleep(pause);
    kafka::start_node(1);
    let out = wait_for(job, Duration::from_secs(240));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a {pause:?} outage ended the job: {stderr}"
    );
    // Said once, by default, with why.
    assert_eq!(
        stderr
            .matches("the Kafka cluster does not answer; waiting for it")
            .count(),
        1,
        "the wait is logged once: {stderr}"
    );
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
    let stats = stats_of(&stats);
    assert_adds_up(&stats["kafka"]["job"], records);
    // The top level is this process's share; the summary says so, with the job's.
    assert_eq!(stats["scope"], "process");
    assert!(stderr.contains("this process read"), "{stderr}");
    assert!(
        stderr.contains(&format!("every process so far: {records} records read")),
        "{stderr}"
    );
    assert!(
        stats["kafka"]["outages"].as_u64() >= Some(1),
        "the outage is counted: {}",
        stats["kafka"]
    );
    let stalls = stats["kafka"]["longest_stall_ms"]
        .as_object()
        .expect("stalls per partition");
    assert_eq!(stalls.len(), 4, "{stalls:?}");
    let longest = stalls.values().filter_map(|ms| ms.as_u64()).max();
    assert!(
        longest >= Some(pause.as_millis() as u64),
        "the partitions made no progress for at least the outage: {stalls:?}"
    );
}

/// Down for 2 s (and the broker's start): less than the transaction timeout (10 s).
#[test]
fn a_broker_killed_for_less_than_the_transaction_timeout_is_waited_for() {
    killed_broker(Duration::from_secs(2), &[], 120_000, 31);
}

/// Down for longer than the transaction timeout (3 s here): the coordinator aborts the
/// open transaction and fences the producer's epoch, with no other process anywhere.
/// The job takes a new producer and goes back to its last commit instead of stopping.
#[test]
fn a_broker_killed_for_longer_than_the_transaction_timeout_is_waited_for() {
    killed_broker(
        Duration::from_secs(8),
        &["--kafka-transaction-timeout", "3s"],
        120_000,
        32,
    );
}

#[test]
fn an_outage_longer_than_the_limit_ends_the_job_and_a_rerun_completes_it() {
    kafka::own_brokers(PORT, 1);
    let _one_at_a_time = kafka::exclusive();
    let broker = kafka::broker().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 120_000, 33);
    let t = Topics::new(4);
    let produced = kafka::produce_lines(&t.input, &data, "visit_id");
    let stats = dir.path().join("stats.json");
    let args = job_args(&t, &stats, &["--kafka-outage-limit", "4s"]);
    let job = start_job(&args, &t);
    let killed = Instant::now();
    kafka::kill_node(1);
    let out = wait_for(job, Duration::from_secs(120));
    let waited = killed.elapsed();
    kafka::start_node(1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for words in [
        broker.as_str(),
        "did not answer for",
        "longer than --kafka-outage-limit (4s)",
        "run the job again once the cluster is back",
    ] {
        assert!(stderr.contains(words), "{words:?} in: {stderr}");
    }
    assert!(
        waited >= Duration::from_secs(4),
        "the job waited the limit out first ({waited:?})"
    );
    // The rerun goes on from the last commit and ends with the whole input's sessions.
    let out = run(&as_strs(&args));
    assert!(
        out.status.success(),
        "the rerun: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
}
