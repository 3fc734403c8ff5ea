//! File input, Kafka output (docs/semantics.md K-7, S-35): the real binary against a real
//! Apache Kafka broker. The property checked everywhere: what a `read_committed` reader
//! finds in each output partition equals, record for record in the values, the lines
//! of the same run written to a file whose session key falls in that partition, in the
//! file's order; the side-output topics (one partition) equal the side-output files.
//! The binary's broker is its own (one node, on a port of its own): one test kills it.

#![cfg(feature = "kafka")]

#[path = "support/kafka.rs"]
mod kafka;
#[path = "support/process.rs"]
mod process;

use kafka::{Read, broker, create_topics, read_committed, read_uncommitted, text, unique};
use process::{bin, generate, run, run_ok, s};
use rand::{Rng, SeedableRng};
use sessionizer_connectors::kafka::partitioner::partition_for;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The session options every run of a test shares.
const OPTIONS: &[&str] = &[
    "--gap",
    "2m",
    "--watermark-delay",
    "10s",
    "--allowed-lateness",
    "2m",
    "--dedup",
    "--collect",
    "page",
    "--progress",
    "never",
];

/// The output topics of one job: sessions (4 partitions), dead letters and late
/// events (one partition each, so that their order is the files').
struct Topics {
    output: String,
    dead: String,
    late: String,
}

const PARTITIONS: usize = 4;

/// This binary's broker: one node, on a port no test binary running at the same time
/// uses (the test binaries of a crate run one after another).
const PORT: u16 = 29592;

/// This binary's broker, and one test at a time.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    kafka::own_brokers(PORT, 1);
    kafka::exclusive()
}

impl Topics {
    fn new() -> Topics {
        let t = Topics {
            output: unique("file-sessions"),
            dead: unique("file-dead"),
            late: unique("file-late"),
        };
        create_topics(&[&t.output], PARTITIONS as i32);
        create_topics(&[&t.dead, &t.late], 1);
        t
    }

    /// `run` arguments writing `input` to these topics.
    fn args(&self, input: &Path, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = [
            "run",
            "--input",
            s(input),
            "--kafka-brokers",
            broker(),
            "--kafka-output-topic",
            &self.output,
            "--dead-letter-topic",
            &self.dead,
            "--late-topic",
            &self.late,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(OPTIONS.iter().map(|s| s.to_string()));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A session line as `(session_id, record)`; a retraction is `(session_id, None)`.
fn session_line(line: &str) -> (String, Option<String>) {
    let v: serde_json::Value = serde_json::from_str(line).expect("session record is JSON");
    let id = v["session_id"].as_str().expect("session_id").to_string();
    if v.get("retract").is_some() {
        (id, None)
    } else {
        (id, Some(line.to_string()))
    }
}

/// What the same run writes to files.
struct FileRun {
    /// Per output partition (by the session key), the file's session lines in order.
    sessions: Vec<Vec<(String, Option<String>)>>,
    dead: Vec<String>,
    late: Vec<String>,
    records_read: u64,
}

fn file_run(dir: &Path, input: &Path) -> FileRun {
    let output = dir.join("file.out.jsonl");
    let dead = dir.join("file.dead.jsonl");
    let late = dir.join("file.late.jsonl");
    let stats = dir.join("file.stats.json");
    let mut args = vec![
        "run",
        "--input",
        s(input),
        "--output",
        s(&output),
        "--dead-letter",
        s(&dead),
        "--late-output",
        s(&late),
        "--stats-file",
        s(&stats),
    ];
    args.extend_from_slice(OPTIONS);
    run_ok(&args);
    let read = |p: &Path| std::fs::read_to_string(p).expect("output file");
    let mut sessions = vec![Vec::new(); PARTITIONS];
    for line in read(&output).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
        let key = v["key"].as_str().expect("key");
        let p = partition_for(key.as_bytes(), PARTITIONS) as usize;
        sessions[p].push(session_line(line));
    }
    let stats: serde_json::Value = serde_json::from_str(&read(&stats)).expect("stats file is JSON");
    assert_eq!(
        stats["scope"], "run",
        "a run without a state directory counts itself"
    );
    FileRun {
        sessions,
        dead: read(&dead).lines().map(String::from).collect(),
        late: read(&late).lines().map(String::from).collect(),
        records_read: stats["records_read"].as_u64().expect("records_read"),
    }
}

/// The Kafka output of one partition as `(session_id, record)`, checking the format of
/// docs/semantics.md K-7 on the way: key = session_id, retraction = tombstone with
/// `retract: true`.
fn kafka_sessions(records: &[Read]) -> Vec<(String, Option<String>)> {
    records
        .iter()
        .map(|r| {
            let key = String::from_utf8(r.key.clone().expect("session records have a key"))
                .expect("utf8 key");
            match &r.value {
                None => {
                    assert_eq!(
                        r.retract.as_deref(),
                        Some("true"),
                        "a tombstone is a retraction"
                    );
                    (key, None)
                }
                Some(_) => {
                    let line = text(r);
                    let (id, _) = session_line(&line);
                    assert_eq!(id, key, "the record key is the session_id");
                    assert_eq!(r.retract, None);
                    (key, Some(line))
                }
            }
        })
        .collect()
}

/// Checks the committed topics against the file run, record for record.
fn assert_topics_equal_files(t: &Topics, expected: &FileRun) {
    let outputs = read_committed(&t.output);
    assert_eq!(outputs.len(), PARTITIONS);
    for (p, records) in outputs.iter().enumerate() {
        let got = kafka_sessions(records);
        let want = &expected.sessions[p];
        assert!(!want.is_empty(), "partition {p} has sessions");
        assert_eq!(got.len(), want.len(), "partition {p}: record count");
        for (i, (g, e)) in got.iter().zip(want).enumerate() {
            assert_eq!(g, e, "partition {p}, record {i}");
        }
    }
    let side = |topic: &str| -> Vec<String> {
        read_committed(topic)
            .iter()
            .flatten()
            .map(|r| {
                assert_eq!(r.key, None, "a file's side records have no key");
                text(r)
            })
            .collect()
    };
    assert_eq!(side(&t.dead), expected.dead, "dead letters");
    assert_eq!(side(&t.late), expected.late, "late events");
}

#[test]
fn a_file_written_to_a_kafka_topic_equals_the_file_run_per_partition() {
    let _one_at_a_time = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 20_000, 7);
    let expected = file_run(dir.path(), &data);
    assert!(!expected.dead.is_empty() && !expected.late.is_empty());
    assert!(
        expected
            .sessions
            .iter()
            .flatten()
            .any(|(_, record)| record.is_none()),
        "the data has retractions"
    );

    // Without a state directory (a transaction per interval), on two workers.
    let t = Topics::new();
    let stats = dir.path().join("kafka.stats.json");
    let args = t.args(
        &data,
        &[
            "--checkpoint-interval",
            "100ms",
            "--workers",
            "2",
            "--stats-file",
            s(&stats),
        ],
    );
    let out = run_ok(&as_strs(&args));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("to Kafka topic {}", t.output)),
        "the summary names the topic: {err}"
    );
    assert_topics_equal_files(&t, &expected);
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("JSON");
    assert_eq!(stats["records_read"].as_u64(), Some(expected.records_read));

    // With a state directory (two-phase commits at the checkpoints), on one worker.
    let t = Topics::new();
    let state = dir.path().join("state");
    let args = t.args(
        &data,
        &["--state-dir", s(&state), "--checkpoint-interval", "100ms"],
    );
    run_ok(&as_strs(&args));
    assert_topics_equal_files(&t, &expected);
    // Each checkpoint's transaction ended with a progress record naming its epoch.
    let progress = read_committed(&format!("{}-sessionizer-progress", t.output));
    let epochs: Vec<u64> = progress
        .iter()
        .flatten()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&text(r)).expect("progress JSON");
            v["epoch"].as_u64().expect("epoch")
        })
        .collect();
    assert!(epochs.len() >= 2, "{epochs:?}");
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");

    // The finished job run again reads nothing new and writes no session.
    let before = read_committed(&t.output)
        .iter()
        .map(Vec::len)
        .sum::<usize>();
    run_ok(&as_strs(&args));
    let after = read_committed(&t.output)
        .iter()
        .map(Vec::len)
        .sum::<usize>();
    assert_eq!(before, after, "a finished job run again writes nothing");
}

#[test]
fn killed_at_random_instants_with_a_state_dir_the_committed_topics_are_the_uninterrupted_run() {
    let _one_at_a_time = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 80_000, 11);
    let expected = file_run(dir.path(), &data);
    let t = Topics::new();
    let state = dir.path().join("state");
    let stats = dir.path().join("stats.json");
    let args = t.args(
        &data,
        &[
            "--state-dir",
            s(&state),
            "--checkpoint-interval",
            "100ms",
            "--stats-file",
            s(&stats),
        ],
    );
    // How long the whole job takes here, uninterrupted (into topics of its own): the
    // kill instants are drawn within a third of it, so that the job is killed several
    // times before it ends however fast the machine is.
    let took = {
        let other = Topics::new();
        let other_state = dir.path().join("state-uninterrupted");
        let began = Instant::now();
        run_ok(&as_strs(&other.args(
            &data,
            &[
                "--state-dir",
                s(&other_state),
                "--checkpoint-interval",
                "100ms",
            ],
        )));
        began.elapsed().as_millis() as u64
    };
    let mut rng = rand_pcg::Pcg64::seed_from_u64(2025);
    let spawn = || {
        bin()
            .args(as_strs(&args))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (kills, finished) = kafka::kill_repeatedly(spawn, &t.output, PARTITIONS, 40, || {
        Duration::from_millis(rng.random_range(took / 50..took / 3 + 1))
    });
    if !finished {
        run_ok(&as_strs(&args));
    }
    assert!(
        kills >= 5,
        "only {kills} kills: the run was too short to test anything"
    );
    assert_topics_equal_files(&t, &expected);
    // The first run, killed mid-transaction, left aborted records behind (the later
    // ones may have too): a read_committed reader does not see them.
    let all: usize = read_uncommitted(&t.output).iter().map(Vec::len).sum();
    let committed: usize = expected.sessions.iter().map(Vec::len).sum();
    eprintln!(
        "{kills} kills; the uninterrupted run took {took} ms; {} aborted records",
        all.saturating_sub(committed)
    );
    assert!(
        all > committed,
        "{all} records in all, {committed} committed"
    );
    // The last run counts the whole job, across the killed ones.
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("JSON");
    assert_eq!(stats["records_read"].as_u64(), Some(expected.records_read));
}

/// The broker killed with -9 in the middle of the run and started again 2 s later: the
/// run waits for it, goes back to its last checkpoint and finishes with exit 0, and the
/// committed topics are the file run's.
#[test]
fn a_broker_killed_mid_run_is_waited_for_and_the_run_goes_back_to_its_checkpoint() {
    let _one_at_a_time = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 200_000, 23);
    let expected = file_run(dir.path(), &data);
    let t = Topics::new();
    let stats = dir.path().join("stats.json");
    let args = t.args(
        &data,
        &[
            "--state-dir",
            s(&dir.path().join("state")),
            "--checkpoint-interval",
            "200ms",
            // A checkpoint every 5,000 records as well: the first commit comes early
            // and the run lasts (about 40 two-phase commits) on any machine.
            "--checkpoint-every-records",
            "5000",
            "--kafka-timeout",
            "5s",
            "--stats-file",
            s(&stats),
        ],
    );
    let mut job = bin()
        .args(as_strs(&args))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let began = Instant::now();
    while kafka::last_stable_offsets(&t.output, PARTITIONS)
        .iter()
        .sum::<i64>()
        == 0
    {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "nothing committed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Held still while the broker goes: the run cannot reach its end in between.
    process::signal(&job, "-STOP");
    assert!(
        job.try_wait().expect("wait").is_none(),
        "the run ended before the broker was killed: make the input larger"
    );
    kafka::kill_node(1);
    process::signal(&job, "-CONT");
    std::thread::sleep(Duration::from_secs(2));
    kafka::start_node(1);
    let out = job.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the outage ended the run: {err}");
    assert_eq!(
        err.matches("the Kafka cluster does not answer; waiting for it")
            .count(),
        1,
        "the wait is logged once: {err}"
    );
    assert!(err.contains("resumed from checkpoint"), "{err}");
    assert_topics_equal_files(&t, &expected);
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("JSON");
    assert_eq!(stats["records_read"].as_u64(), Some(expected.records_read));
    assert_eq!(
        stats["scope"], "job",
        "with a state directory the job is counted"
    );
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_between_the_checkpoint_and_the_commit_resumes_from_the_checkpoint_before() {
    let _one_at_a_time = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 40_000, 17);
    let expected = file_run(dir.path(), &data);
    let t = Topics::new();
    let state = dir.path().join("state");
    let args = t.args(
        &data,
        &[
            "--state-dir",
            s(&state),
            "--checkpoint-every-records",
            "3000",
            "--kafka-instance-id",
            "crash-test",
        ],
    );
    // The third checkpoint is written, then the process dies before its commit.
    kafka::exit_before_commit(bin().args(as_strs(&args)), 3);
    let manifests = |state: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(state)
            .expect("state dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .filter(|n| n.starts_with("manifest-"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        manifests(&state).last().map(String::as_str),
        Some("manifest-0000000003.ckpt"),
        "checkpoint 3 was written"
    );
    let out = run_ok(&as_strs(&args));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("checkpoint 3")
            && err.contains("never committed")
            && err.contains("resuming from checkpoint 2"),
        "{err}"
    );
    assert!(
        !manifests(&state).contains(&"manifest-0000000003.ckpt".to_string()),
        "the uncommitted checkpoint is discarded: {:?}",
        manifests(&state)
    );
    assert_topics_equal_files(&t, &expected);

    // A crash before the first commit: the job starts over from the beginning.
    let t = Topics::new();
    let state = dir.path().join("state-first");
    let args = t.args(&data, &["--state-dir", s(&state)]);
    kafka::exit_before_commit(bin().args(as_strs(&args)), 1);
    let out = run_ok(&as_strs(&args));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("resuming from the beginning of the job"),
        "{err}"
    );
    assert_topics_equal_files(&t, &expected);
}

#[test]
fn a_missing_topic_an_unreachable_broker_and_a_mismatched_job_are_clear_errors() {
    let _one_at_a_time = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 2_000, 5);
    let input = s(&data);

    // No output topic given.
    let out = run(&["run", "--input", input, "--kafka-brokers", broker()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kafka-output-topic"), "{err}");

    // An output topic that does not exist.
    let missing = unique("nope");
    let out = run(&[
        "run",
        "--input",
        input,
        "--kafka-brokers",
        broker(),
        "--kafka-output-topic",
        &missing,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("Kafka topic {missing} does not exist")) && err.contains("create it"),
        "{err}"
    );

    // Nothing listens there.
    let out = run(&[
        "run",
        "--input",
        input,
        "--kafka-brokers",
        "127.0.0.1:1",
        "--kafka-output-topic",
        "sessions",
        "--kafka-timeout",
        "2s",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the Kafka brokers at 127.0.0.1:1"),
        "{err}"
    );

    // Options of a Kafka input.
    let out = run(&[
        "run",
        "--input",
        input,
        "--kafka-brokers",
        broker(),
        "--kafka-output-topic",
        "sessions",
        "--kafka-group",
        "g",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kafka-group applies to a Kafka input"),
        "{err}"
    );

    // A job whose sessions went to Kafka is not continued into a file, nor into
    // another topic.
    let t = Topics::new();
    let state = dir.path().join("state");
    run_ok(&as_strs(
        &t.args(&data, &["--state-dir", s(&state), "--keep-open"]),
    ));
    let out = run(&[
        "run",
        "--input",
        input,
        "--state-dir",
        s(&state),
        "--output",
        s(&dir.path().join("out.jsonl")),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--kafka-output-topic {}", t.output)),
        "{err}"
    );
    let other = Topics::new();
    let out = run(&as_strs(
        &other.args(&data, &["--state-dir", s(&state), "--keep-open"]),
    ));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("resume with --kafka-output-topic {}", t.output)),
        "{err}"
    );

    // A progress topic that was deleted cannot tell what committed: refused.
    kafka::delete_topic(&format!("{}-sessionizer-progress", t.output));
    std::thread::sleep(Duration::from_millis(500));
    let next = dir.path().join("next.jsonl");
    generate(&next, 1_000, 6);
    let out = run(&as_strs(
        &t.args(&next, &["--state-dir", s(&state), "--keep-open"]),
    ));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot tell whether the Kafka transaction")
            && err.contains("another --state-dir"),
        "{err}"
    );
}
