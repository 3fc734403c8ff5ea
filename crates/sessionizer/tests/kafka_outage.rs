//! The library's Kafka source through a broker restart (cargo feature `kafka`): a
//! broker of its own, started by `scripts/kafka-dev.sh` on a port no other test binary
//! uses while this one runs, killed with SIGKILL while a `KafkaJson` reads, then
//! started again. The polls meanwhile return what they read, without an error, and the
//! source then reads on: every record once, in order.

#![cfg(feature = "kafka")]

mod support;

#[path = "../../cli/tests/support/kafka.rs"]
mod kafka;

#[path = "support/kafka_visits.rs"]
mod visits;

use sessionizer::kafka::KafkaJson;
use sessionizer::prelude::*;
use sessionizer::source::DeadLetter;
use std::time::{Duration, Instant};
use visits::{Visit, job, lines, produce};

/// The broker the command line's outage tests use too (binaries run one at a time).
const PORT: u16 = 29592;

/// A source over a new one-partition topic `input` holding `records`, opened on a
/// job's new state directory in `dir`, once it has handed out its first events.
fn reading<'d>(
    input: &str,
    records: &[String],
    dir: &std::path::Path,
    dead: &'d mut Vec<DeadLetter>,
    events: &mut Vec<Visit>,
) -> KafkaJson<Visit, &'d mut Vec<DeadLetter>> {
    kafka::create_topics(&[input], 1);
    produce(input, records);
    let mut checkpoints = Checkpoints::open(dir).expect("state dir");
    job().restore(&mut checkpoints).expect("restore");
    let mut source = KafkaJson::<Visit, _>::open(kafka::broker(), input, &mut checkpoints, dead)
        .expect("source");
    let began = Instant::now();
    while events.is_empty() {
        assert!(began.elapsed() < Duration::from_secs(60), "nothing read");
        source
            .poll(Duration::from_millis(200), 10, events)
            .expect("poll");
    }
    source
}

#[test]
fn a_source_waits_through_a_broker_restart_and_reads_every_record_once() {
    kafka::own_brokers(PORT, 1);
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-outage");
    let records = lines(0, 2_000, None);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut dead: Vec<DeadLetter> = Vec::new();
    let mut events = Vec::new();
    let mut source = reading(&input, &records, dir.path(), &mut dead, &mut events)
        .outage_limit(Duration::from_secs(120));
    kafka::kill_node(1);
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(6) {
        source
            .poll(Duration::from_millis(200), 100, &mut events)
            .expect("a poll while the broker is away waits, it does not fail");
    }
    kafka::start_node(1);
    let began = Instant::now();
    while source.positions() != [Some(records.len() as i64)] {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "read {} of {} records",
            events.len(),
            records.len()
        );
        source
            .poll(Duration::from_millis(200), 500, &mut events)
            .expect("poll after the restart");
    }
    let counts = source.finish().expect("counts");
    assert_eq!(counts.records, records.len() as u64);
    // Every record once, in offset order: the visits as events, the others (one in
    // 500 has no valid time) as dead letters.
    let read: Vec<(String, i64)> = events
        .iter()
        .map(|v| (v.visit_id.clone(), v.event_time.millis()))
        .collect();
    let mut want = Vec::new();
    let mut want_dead = Vec::new();
    for (offset, l) in records.iter().enumerate() {
        match serde_json::from_str::<Visit>(l) {
            Ok(v) => want.push((v.visit_id, v.event_time.millis())),
            Err(_) => want_dead.push(format!("{input}/0@{offset}")),
        }
    }
    assert_eq!(read, want);
    let dead: Vec<String> = dead.iter().map(|d| d.source.clone()).collect();
    assert_eq!(dead, want_dead);
}

#[test]
fn a_source_whose_broker_stays_away_past_its_limit_fails_and_says_so() {
    kafka::own_brokers(PORT, 1);
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-outage-limit");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut dead: Vec<DeadLetter> = Vec::new();
    let mut events = Vec::new();
    let mut source = reading(
        &input,
        &lines(0, 100, None),
        dir.path(),
        &mut dead,
        &mut events,
    )
    .outage_limit(Duration::from_secs(3));
    kafka::kill_node(1);
    let down = Instant::now();
    let error = loop {
        assert!(
            down.elapsed() < Duration::from_secs(60),
            "no error within a minute of the broker's death"
        );
        if let Err(e) = source.poll(Duration::from_millis(200), 10, &mut events) {
            break e.to_string();
        }
    };
    kafka::start_node(1);
    assert!(down.elapsed() >= Duration::from_secs(3), "{error}");
    assert!(
        error.contains("did not answer") && error.contains("outage limit (3s)"),
        "{error}"
    );
}
