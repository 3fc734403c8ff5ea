//! A library service with an exactly-once Kafka output (cargo feature `kafka`; a real
//! broker started by `scripts/kafka-dev.sh`), run as a real process: the example
//! `examples/kafka_exactly_once.rs`, which `cargo test` builds beside this test. Killed
//! with SIGKILL at random instants (the first time while a transaction holding records
//! is open) and started again with the same arguments, its committed output topic holds
//! exactly the records of one uninterrupted run — none lost, none twice; a crash
//! between a checkpoint and its commit resumes from the checkpoint before.

#![cfg(feature = "kafka")]

mod support;

#[path = "../../cli/tests/support/kafka.rs"]
mod kafka;

use rand::{Rng, SeedableRng};
use sessionizer::prelude::*;
use sessionizer::source::DeadLetter;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const OUTPUT_PARTITIONS: usize = 3;

/// Input lines of the kill test (the crash test: a third): every 500th is no visit.
const VISITS: i64 = 60_000;

/// Seconds without a record after which the service stops.
const IDLE: &str = "2";

fn service() -> PathBuf {
    support::example("kafka_exactly_once")
}

/// A visit line as the example reads it (and `sessionizer generate` writes it).
#[derive(serde::Serialize)]
struct VisitLine {
    visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    event_time: EventTime,
    page: String,
}

/// `n` visit lines with pages (the example's input), some far late; every 500th line
/// is not a visit.
fn produce_visits(topic: &str, n: i64) {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for (i, v) in support::visits(n, 400, 300, 7).iter().enumerate() {
        if i % 500 == 499 {
            writeln!(
                file,
                r#"{{"visit_id":"v{i}","event_time":"not a time","page":"/"}}"#
            )
        } else {
            let line = VisitLine {
                visit_id: format!("v{}", v.visit),
                event_time: v.at,
                page: format!("/p{}", v.page),
            };
            writeln!(file, "{}", serde_json::to_string(&line).expect("JSON"))
        }
        .expect("write");
    }
    file.flush().expect("flush");
    kafka::produce_lines(topic, file.path(), "visit_id");
}

struct Service {
    input: String,
    output: String,
    dead: String,
    state: PathBuf,
}

impl Service {
    fn command(&self) -> Command {
        let mut c = Command::new(service());
        c.args([kafka::broker(), &self.input, &self.output, &self.dead])
            .arg(&self.state)
            .arg(IDLE)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    /// Runs the service until it stops by itself; returns its stderr.
    fn run_to_end(&self) -> String {
        let out = self.command().output().expect("spawn");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "the service failed: {err}");
        err
    }

    /// The committed records of the output topic, sorted (a multiset: a record written
    /// twice is there twice).
    fn committed(&self) -> Vec<String> {
        committed(&self.output)
    }

    /// The committed records of the dead-letter topic, in their order.
    fn dead_letters(&self) -> Vec<String> {
        let records = kafka::read_committed(&self.dead);
        records.iter().flatten().map(kafka::text).collect()
    }

    /// The dead-letter topic holds `expected`: each once, in the input's order.
    fn assert_dead_letters(&self, expected: &[String]) {
        let dead = self.dead_letters();
        assert!(
            dead == expected,
            "{} dead letters committed, one run wrote {} (each once, in the input's order)",
            dead.len(),
            expected.len()
        );
    }
}

/// The committed records of `topic`, sorted.
fn committed(topic: &str) -> Vec<String> {
    let records = kafka::read_committed(topic);
    let mut v: Vec<String> = records.iter().flatten().map(kafka::text).collect();
    v.sort();
    v
}

/// New output topics (sessions, dead letters) and a state directory on `input`.
fn service_on(input: &str, dir: &Path, name: &str) -> Service {
    let output = kafka::unique(&format!("lib-eo-{name}"));
    let dead = kafka::unique(&format!("lib-eo-{name}-dead"));
    kafka::create_topics(&[&output], OUTPUT_PARTITIONS as i32);
    kafka::create_topics(&[&dead], 1);
    Service {
        input: input.to_string(),
        output,
        dead,
        state: dir.join(name),
    }
}

/// One uninterrupted run: its session records (sorted), its dead letters, and how long
/// it took (its idle wait not counted).
fn uninterrupted(input: &str, visits: i64, dir: &Path) -> (Vec<String>, Vec<String>, u64) {
    let reference = service_on(input, dir, "uninterrupted");
    let began = Instant::now();
    reference.run_to_end();
    let took = began.elapsed().saturating_sub(Duration::from_secs(2));
    let records = reference.committed();
    // Every session record once: no (session_id, revision) twice (retractions carry
    // no revision).
    let revisions: Vec<(String, u64)> = records
        .iter()
        .filter_map(|r| {
            let v: serde_json::Value = serde_json::from_str(r).expect("JSON");
            Some((v["session_id"].to_string(), v["revision"].as_u64()?))
        })
        .collect();
    let mut ids = revisions.clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), revisions.len(), "a session record written twice");
    assert!(records.len() > 500, "only {} records", records.len());
    let dead = reference.dead_letters();
    assert_eq!(
        dead.len(),
        (visits / 500) as usize,
        "one dead letter per line that is no visit"
    );
    assert!(dead[0].contains("not a time"), "{}", dead[0]);
    (records, dead, took.as_millis() as u64)
}

#[test]
fn a_service_killed_at_random_instants_commits_every_record_once() {
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-eo-visits");
    kafka::create_topics(&[&input], 1);
    produce_visits(&input, VISITS);
    let dir = tempfile::tempdir().expect("temp dir");
    let (expected, expected_dead, took) = uninterrupted(&input, VISITS, dir.path());

    let killed = service_on(&input, dir.path(), "killed");
    let mut rng = rand_pcg::Pcg64::seed_from_u64(14);
    let (kills, finished) = kafka::kill_repeatedly(
        || killed.command().spawn().expect("spawn"),
        &killed.output,
        OUTPUT_PARTITIONS,
        40,
        || Duration::from_millis(rng.random_range(took / 50..took / 2 + 2)),
    );
    if !finished {
        killed.run_to_end();
    }
    let all: usize = kafka::read_uncommitted(&killed.output)
        .iter()
        .map(Vec::len)
        .sum();
    eprintln!(
        "{kills} kills; the uninterrupted run took {took} ms; {} records, {} aborted",
        expected.len(),
        all.saturating_sub(expected.len())
    );
    assert!(kills >= 5, "only {kills} kills: the runs were too short");
    let got = killed.committed();
    assert_eq!(
        got.len(),
        expected.len(),
        "committed records: {} against one run's {}",
        got.len(),
        expected.len()
    );
    assert!(
        got == expected,
        "the committed records differ from one run's"
    );
    killed.assert_dead_letters(&expected_dead);
    assert!(
        all > got.len(),
        "no aborted records: no kill hit a transaction"
    );
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_crash_between_a_checkpoint_and_its_commit_resumes_from_the_checkpoint_before() {
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-eo-crash");
    kafka::create_topics(&[&input], 1);
    produce_visits(&input, VISITS / 3);
    let dir = tempfile::tempdir().expect("temp dir");
    let (expected, expected_dead, _) = uninterrupted(&input, VISITS / 3, dir.path());

    let crashed = service_on(&input, dir.path(), "crashed");
    // The third checkpoint is written, then the process exits before its commit: the
    // transaction stays open, as after a kill at that instant.
    kafka::exit_before_commit(&mut crashed.command(), 3);
    let err = crashed.run_to_end();
    assert!(
        err.contains("resumed from checkpoint 2"),
        "checkpoint 3 never committed, so the run resumes from 2: {err}"
    );
    assert!(
        crashed.committed() == expected,
        "the committed records differ from one run's"
    );
    crashed.assert_dead_letters(&expected_dead);

    // Its checkpoints cannot be restored without the exactly-once sink.
    let mut checkpoints = Checkpoints::open(&crashed.state).expect("state dir");
    let mut job = Stream::<(String, EventTime)>::new()
        .key_by(|e| e.0.clone())
        .event_time(|e| e.1)
        .session_windows(minutes(2))
        .aggregate(Count)
        .build();
    let text = job
        .restore(&mut checkpoints)
        .expect_err("restored without the sink")
        .to_string();
    assert!(
        text.contains("exactly once") && text.contains(&crashed.output),
        "{text}"
    );
    // Nor can a source start from its positions before the restore settled which
    // checkpoint (and so which positions) the job resumes from.
    let source = sessionizer::kafka::KafkaJson::<serde_json::Value, Vec<DeadLetter>>::open(
        kafka::broker(),
        &crashed.input,
        &mut checkpoints,
        Vec::new(),
    );
    let text = source.expect_err("a source before the restore").to_string();
    assert!(text.contains("after the job's restore()"), "{text}");
}
