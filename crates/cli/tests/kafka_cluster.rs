//! A Kafka job riding out a rolling restart of a three-broker cluster (KRaft, every
//! topic replicated three times with two replicas in sync required), started by
//! `scripts/kafka-dev.sh` on ports no other test uses: two processes of one group,
//! with standby copies, keep running while each broker in turn is stopped (one of them
//! killed with SIGKILL) and started again, as in a rolling upgrade; then a last process
//! finishes the input, and what a `read_committed` reader finds in each output
//! partition is the file run of the matching input partition, byte for byte.

#![cfg(feature = "kafka")]

#[path = "support/kafka.rs"]
mod kafka;
#[path = "support/kafka_runs.rs"]
mod kafka_runs;
#[path = "support/process.rs"]
mod process;

use kafka_runs::{Topics, as_strs, assert_matches_file_runs, stats_of};
use process::{bin, generate, run, s, signal};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// This binary's cluster: three nodes from this port on.
const PORT: u16 = 29292;
const NODES: u32 = 3;

/// A process of the job, its log in `dir`.
fn spawn(args: &[String], dir: &Path, id: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).expect("log file");
    bin()
        .args(as_strs(args))
        .env("RUST_LOG", "sessionizer=info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn sessionizer")
}

fn log_of(dir: &Path, id: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{id}.log"))).unwrap_or_default()
}

fn assert_running(child: &mut Child, dir: &Path, id: &str, when: &str) {
    if let Some(status) = child.try_wait().expect("wait") {
        panic!("process {id} ended ({status}) {when}: {}", log_of(dir, id));
    }
}

/// The thread stacks of a running member (gdb), to tell a blocked call from a loop
/// that reads nothing when the group stalls.
fn stacks(child: &Child) -> String {
    let done = std::process::Command::new("gdb")
        .args(["-batch", "-ex", "thread apply all bt 25", "-p"])
        .arg(child.id().to_string())
        .output();
    match done {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(no stacks: gdb: {e})"),
    }
}

/// Asks a process to stop (SIGTERM: it commits what it processed and leaves the
/// group); returns whether it ended with exit 0 within a minute.
fn stop(mut child: Child) -> bool {
    signal(&child, "-TERM");
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.success();
        }
        if began.elapsed() > Duration::from_secs(60) {
            child.kill().expect("kill");
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_processes_with_standbys_ride_out_a_rolling_restart_of_three_brokers() {
    kafka::own_brokers(PORT, NODES);
    let _one_at_a_time = kafka::exclusive();
    kafka::broker();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 120_000, 41);
    let t = Topics::new(4);
    // A live input all through the restarts.
    let producer = {
        let (topic, data) = (t.input.clone(), data.clone());
        std::thread::spawn(move || {
            kafka::produce_lines_paced(&topic, &data, "visit_id", Duration::from_secs(60))
        })
    };
    let args = |id: &str| {
        let mut a = t.args();
        a.extend(
            [
                "--checkpoint-interval",
                "200ms",
                "--standby-replicas",
                "1",
                "--kafka-instance-id",
                id,
                "--kafka-timeout",
                "10s",
                "--stats-file",
                s(&dir.path().join(format!("{id}.json"))),
            ]
            .map(String::from),
        );
        a
    };
    let mut a = spawn(&args("a"), dir.path(), "a");
    let mut b = spawn(&args("b"), dir.path(), "b");
    let began = Instant::now();
    // (A partition of the new topics may not have its leader yet: no answer is none.)
    while kafka::last_stable_offsets_if_there(&t.output, 4)
        .map_or(0, |ends| ends.iter().sum::<i64>())
        == 0
    {
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "no output committed within 90 s"
        );
        assert_running(&mut a, dir.path(), "a", "before the restarts");
        assert_running(&mut b, dir.path(), "b", "before the restarts");
        std::thread::sleep(Duration::from_millis(50));
    }
    for n in 1..=NODES {
        // Node 2 crashes; the others shut down cleanly, as in a rolling upgrade.
        if n == 2 {
            kafka::kill_node(n);
        } else {
            kafka::stop_node(n);
        }
        std::thread::sleep(Duration::from_secs(3));
        kafka::start_node(n);
        kafka::wait_isr(n);
        let when = format!("after node {n} restarted");
        assert_running(&mut a, dir.path(), "a", &when);
        assert_running(&mut b, dir.path(), "b", &when);
    }
    let produced = producer.join().expect("producer");
    // Both go on to the end of the input, then stop cleanly.
    let ends = kafka::high_watermarks(&t.input, 4);
    let began = Instant::now();
    loop {
        let committed = kafka::committed_offsets(&t.group, &t.input, 4);
        if committed == ends {
            break;
        }
        if began.elapsed() > Duration::from_secs(180) {
            let tail = |id: &str| {
                let log = log_of(dir.path(), id);
                let lines: Vec<&str> = log.lines().filter(|l| !l.contains("batch")).collect();
                lines[lines.len().saturating_sub(60)..].join("\n")
            };
            panic!(
                "the group did not reach the end of the input within 3 minutes: {committed:?} of {ends:?}\n--- a:\n{}\n--- b:\n{}\n--- a's threads:\n{}\n--- b's threads:\n{}",
                tail("a"),
                tail("b"),
                stacks(&a),
                stacks(&b)
            );
        }
        assert_running(&mut a, dir.path(), "a", "after the restarts");
        assert_running(&mut b, dir.path(), "b", "after the restarts");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        stop(a),
        "a did not stop cleanly: {}",
        log_of(dir.path(), "a")
    );
    assert!(
        stop(b),
        "b did not stop cleanly: {}",
        log_of(dir.path(), "b")
    );
    // Each process reports how long each of its partitions went without progress.
    for id in ["a", "b"] {
        let stats = stats_of(&dir.path().join(format!("{id}.json")));
        let stalls = stats["kafka"]["longest_stall_ms"]
            .as_object()
            .unwrap_or_else(|| panic!("stalls in {id}'s stats: {stats}"));
        assert!(!stalls.is_empty(), "{id} worked on partitions: {stats}");
        eprintln!("process {id}: longest stall per partition (ms): {stalls:?}");
    }
    // A last process emits the sessions still open and ends.
    let mut last = args("c");
    last.push("--stop-at-end".into());
    let out = run(&as_strs(&last));
    assert!(
        out.status.success(),
        "the last run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
}
