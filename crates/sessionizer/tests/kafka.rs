//! A library job on Apache Kafka (cargo feature `kafka`; a real broker started by
//! `scripts/kafka-dev.sh`): `KafkaJson` in, `KafkaJsonSink` out, the source's position
//! stored in the job's checkpoints. A job stopped after a checkpoint and started again
//! on its state directory reads on from the checkpoint's position and writes, with
//! what the first run wrote, the records of one uninterrupted run (and nothing else).

#![cfg(feature = "kafka")]

mod support;

#[path = "../../cli/tests/support/kafka.rs"]
mod kafka;

#[path = "support/kafka_visits.rs"]
mod visits;

use serde::Serialize;
use sessionizer::kafka::{KafkaJson, KafkaJsonSink};
use sessionizer::prelude::*;
use sessionizer::source::DeadLetter;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use visits::{Visit, job, lines, produce};

/// Polls `source` until it has read `records` records in all (dead letters included).
fn read_until(
    source: &mut KafkaJson<Visit, Vec<DeadLetter>>,
    records: u64,
    events: &mut Vec<Visit>,
) {
    let began = Instant::now();
    while source.counts().records < records {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "read {} of {records} records in 60 s",
            source.counts().records
        );
        let left = (records - source.counts().records) as usize;
        source
            .poll(Duration::from_millis(200), left, events)
            .expect("poll");
    }
}

fn session_lines(topic: &str) -> Vec<String> {
    kafka::read_committed(topic)
        .iter()
        .flatten()
        .map(kafka::text)
        .collect()
}

#[test]
fn a_restarted_job_reads_on_from_its_checkpoint_and_writes_one_runs_records() {
    let _one = kafka::exclusive();
    let (input, output) = (kafka::unique("lib-visits"), kafka::unique("lib-sessions"));
    kafka::create_topics(&[&input], 1);
    kafka::create_topics(&[&output], 3);
    let lines = lines(0, 3_000, None);
    produce(&input, &lines);

    // What one uninterrupted run gives: the same events, in the topic's order.
    let mut reference = job();
    let mut expected = Vec::new();
    let events = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
    reference
        .run(events, &mut expected, &mut Vec::new())
        .expect("vectors");
    let expected: BTreeSet<String> = expected
        .iter()
        .map(|r| serde_json::to_string(r).expect("json"))
        .collect();

    let dir = tempfile::tempdir().expect("temp dir");
    let broker = kafka::broker();
    // The first run: 1,700 records, a checkpoint, 600 more written out, then it stops
    // before its next checkpoint.
    {
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut job = job();
        assert!(job.restore(&mut checkpoints).expect("restore").is_none());
        let mut source = KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new())
            .expect("source");
        let mut sink = KafkaJsonSink::open(broker, &output, "key").expect("sink");
        let mut events = Vec::new();
        read_until(&mut source, 1_700, &mut events);
        job.push_batch(events.drain(..), &mut sink, &mut Vec::new())
            .expect("push");
        sink.flush().expect("delivered");
        job.checkpoint(&mut checkpoints).expect("checkpoint");
        assert_eq!(source.positions(), [Some(1_700)]);
        read_until(&mut source, 2_300, &mut events);
        job.push_batch(events.drain(..), &mut sink, &mut Vec::new())
            .expect("push");
        sink.flush().expect("delivered");
        let counts = source.finish().expect("counts");
        assert_eq!((counts.records, counts.invalid), (2_300, 4));
    }
    let after_first = session_lines(&output);
    assert!(
        after_first.len() > 10,
        "the first run emitted {} records",
        after_first.len()
    );

    // The second run resumes from the checkpoint: it reads records 1,700.. only.
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let mut job = job();
    let resumed = job
        .restore(&mut checkpoints)
        .expect("restore")
        .expect("a checkpoint");
    let mut dead = Vec::new();
    let mut source =
        KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, &mut dead).expect("source");
    let mut sink = KafkaJsonSink::open(broker, &output, "key").expect("sink");
    let mut events = Vec::new();
    let began = Instant::now();
    while source.counts().records < 1_300 {
        assert!(began.elapsed() < Duration::from_secs(60), "stuck");
        source
            .poll(Duration::from_millis(200), 10_000, &mut events)
            .expect("poll");
    }
    // Nothing beyond the topic's end, nothing before the checkpoint's position.
    source
        .poll(Duration::from_millis(500), 10_000, &mut events)
        .expect("poll");
    assert_eq!(source.counts().records, 1_300);
    assert_eq!(source.positions(), [Some(3_000)]);
    assert_eq!(resumed.events + events.len() as u64, 3_000 - 6);
    job.push_batch(events.drain(..), &mut sink, &mut Vec::new())
        .expect("push");
    job.finish(&mut sink, &mut Vec::new()).expect("finish");
    sink.flush().expect("delivered");
    let counts = source.finish().expect("counts");
    assert_eq!(counts.invalid, 3);
    assert_eq!(dead.len(), 3);
    assert!(
        dead[0].source.starts_with(&format!("{input}/0@"))
            && dead[0].reason == "field event_time is not an integer (found a string)",
        "{:?}",
        dead[0]
    );

    // With the first run's records: the uninterrupted run's, some of them twice (those
    // the first run wrote after its checkpoint).
    let all = session_lines(&output);
    let written: BTreeSet<String> = all.iter().cloned().collect();
    assert_eq!(written, expected);
    assert!(
        all.len() > written.len(),
        "the records after the checkpoint are written again"
    );
}

/// The source shares its position with the checkpoints it joined: each checkpoint
/// records where the source stopped then, with nothing to call — a later checkpoint
/// never carries an earlier position. Opened before the restore, or on a file source's
/// checkpoint (and a file source on its checkpoint), it is refused.
#[test]
fn every_checkpoint_records_where_the_source_stopped_and_a_source_joins_after_the_restore() {
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-joined");
    kafka::create_topics(&[&input], 1);
    let lines = lines(0, 1_000, None);
    produce(&input, &lines);
    let broker = kafka::broker();
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut job = job();
        job.restore(&mut checkpoints).expect("restore");
        let mut source = KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new())
            .expect("source");
        let mut events = Vec::new();
        for upto in [300, 800] {
            read_until(&mut source, upto, &mut events);
            job.push_batch(events.drain(..), &mut Vec::new(), &mut Vec::new())
                .expect("push");
            job.checkpoint(&mut checkpoints).expect("checkpoint");
        }
    }
    // Before the restore the checkpoint to continue is not settled.
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let err =
        KafkaJson::<Visit, Vec<DeadLetter>>::open(broker, &input, &mut checkpoints, Vec::new())
            .expect_err("a source before the restore");
    assert!(
        err.to_string().contains("after the job's restore()"),
        "{err}"
    );
    let mut job = job();
    let resumed = job
        .restore(&mut checkpoints)
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(resumed.epoch, 2);
    // A file source cannot continue a Kafka source's checkpoint.
    let file = dir.path().join("visits.jsonl");
    std::fs::write(&file, "").expect("write");
    let err = JsonLines::<Visit, Vec<DeadLetter>>::resume([&file], &mut checkpoints, Vec::new())
        .map(|_| ())
        .expect_err("a file source on a Kafka checkpoint");
    assert!(
        err.to_string().contains("no position of a file source"),
        "{err}"
    );
    let mut source =
        KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new()).expect("source");
    assert_eq!(source.positions(), [Some(800)], "the second checkpoint's");
    let mut events = Vec::new();
    read_until(&mut source, 200, &mut events);
    source
        .poll(Duration::from_millis(500), 10_000, &mut events)
        .expect("poll");
    assert_eq!(source.counts().records, 200, "records 800.. only");
    drop((job, source, checkpoints));

    // A checkpoint of a job that read files cannot be continued from Kafka.
    let other = tempfile::tempdir().expect("temp dir");
    let file = other.path().join("visits.jsonl");
    std::fs::write(&file, format!("{}\n", lines[0])).expect("write");
    let mut checkpoints = Checkpoints::open(other.path().join("state")).expect("state dir");
    let mut job = crate::job();
    job.restore(&mut checkpoints).expect("restore");
    let files = JsonLines::<Visit, Vec<DeadLetter>>::resume([&file], &mut checkpoints, Vec::new())
        .expect("a file source");
    let mut sessions = Vec::new();
    job.run(files, &mut sessions, &mut Vec::new()).expect("run");
    job.checkpoint(&mut checkpoints).expect("checkpoint");
    drop(checkpoints);
    let mut checkpoints = Checkpoints::open(other.path().join("state")).expect("state dir");
    crate::job().restore(&mut checkpoints).expect("restore");
    let err =
        KafkaJson::<Visit, Vec<DeadLetter>>::open(broker, &input, &mut checkpoints, Vec::new())
            .expect_err("a file source's checkpoint");
    assert!(err.to_string().contains("reading files"), "{err}");
}

/// A record whose value is empty or only whitespace is skipped and counted as blank,
/// as the command line's Kafka input counts it; one that is not a visit is a dead
/// letter; the position moves past both.
#[test]
fn empty_values_are_blank_and_invalid_ones_dead_letters() {
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-blank");
    kafka::create_topics(&[&input], 1);
    let mut records = lines(0, 3, None);
    records.insert(1, "   ".to_string());
    records.insert(3, "\t".to_string());
    records.push(r#"{"visit_id":"v1","event_time":"no"}"#.to_string());
    produce(&input, &records);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    job().restore(&mut checkpoints).expect("restore");
    let mut dead = Vec::new();
    let mut source =
        KafkaJson::<Visit, _>::open(kafka::broker(), &input, &mut checkpoints, &mut dead)
            .expect("source");
    let mut events = Vec::new();
    let began = Instant::now();
    while source.positions() != [Some(6)] {
        assert!(began.elapsed() < Duration::from_secs(60), "stuck");
        source
            .poll(Duration::from_millis(200), 100, &mut events)
            .expect("poll");
    }
    let counts = source.finish().expect("counts");
    assert_eq!(
        (counts.records, counts.invalid, counts.blank_lines),
        (4, 1, 2)
    );
    assert_eq!(events.len(), 3);
    assert_eq!(dead.len(), 1);
    assert!(dead[0].source.ends_with("/0@5"), "{:?}", dead[0]);
}

#[test]
fn a_source_reads_every_partition_once_and_refuses_another_topics_checkpoint() {
    let _one = kafka::exclusive();
    let (input, other) = (kafka::unique("lib-parts"), kafka::unique("lib-other"));
    kafka::create_topics(&[&input, &other], 3);
    let lines = lines(0, 900, None);
    produce(&input, &lines);
    let broker = kafka::broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut first = job();
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    first.restore(&mut checkpoints).expect("restore");
    let mut source =
        KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new()).expect("source");
    let mut events = Vec::new();
    read_until(&mut source, 900, &mut events);
    let mut keys: Vec<String> = events.iter().map(|v| v.visit_id.clone()).collect();
    let mut want: Vec<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Visit>(l).ok())
        .map(|v| v.visit_id)
        .collect();
    keys.sort();
    want.sort();
    assert_eq!(keys, want);
    let per_partition: i64 = source.positions().iter().map(|p| p.unwrap_or(0)).sum();
    assert_eq!(per_partition, 900);
    first
        .push_batch(events.drain(..), &mut Vec::new(), &mut Vec::new())
        .expect("push");
    first.checkpoint(&mut checkpoints).expect("checkpoint");
    drop((first, source, checkpoints));

    // Reopened on the checkpoint: nothing old, then exactly what is new.
    let mut second = job();
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    second.restore(&mut checkpoints).expect("restore");
    let mut source =
        KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new()).expect("source");
    source
        .poll(Duration::from_secs(2), 10_000, &mut events)
        .expect("poll");
    assert_eq!(source.counts().records, 0);
    produce(&input, &lines[..10]);
    read_until(&mut source, 10, &mut events);
    source
        .poll(Duration::from_millis(500), 10_000, &mut events)
        .expect("poll");
    assert_eq!(events.len(), 10);

    // A second source of the same checkpoints is refused.
    let err =
        KafkaJson::<Visit, Vec<DeadLetter>>::open(broker, &input, &mut checkpoints, Vec::new())
            .expect_err("a second source");
    assert!(err.to_string().contains("already have a source"), "{err}");
    second
        .push_batch(events.drain(..), &mut Vec::new(), &mut Vec::new())
        .expect("push");
    second.checkpoint(&mut checkpoints).expect("checkpoint");
    drop((second, source, checkpoints));

    // Another topic on this state directory is refused, naming both.
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    job().restore(&mut checkpoints).expect("restore");
    let err =
        KafkaJson::<Visit, Vec<DeadLetter>>::open(broker, &other, &mut checkpoints, Vec::new())
            .expect_err("another topic");
    let text = err.to_string();
    assert!(text.contains(&input) && text.contains(&other), "{text}");
    // So is one partition of this topic: the job's state holds every partition's keys.
    let err = KafkaJson::<Visit, Vec<DeadLetter>>::open_partition(
        broker,
        &input,
        1,
        &mut checkpoints,
        Vec::new(),
    )
    .expect_err("one partition of a directory built from all");
    let text = err.to_string();
    assert!(
        text.contains("KafkaJson::open)") && text.contains(&format!("{input}/1 alone")),
        "{text}"
    );
}

#[test]
fn one_job_per_partition_gives_each_partition_the_sessions_of_its_records_alone() {
    use sessionizer_connectors::kafka::partitioner::partition_for;
    const PARTITIONS: usize = 3;
    let _one = kafka::exclusive();
    let input = kafka::unique("lib-per-partition");
    kafka::create_topics(&[&input], PARTITIONS as i32);
    let lines = lines(0, 2_400, None);
    produce(&input, &lines);
    let broker = kafka::broker();
    let dir = tempfile::tempdir().expect("temp dir");
    // A partition's records, in offset order: the lines whose key it holds.
    let of = |p: usize| -> Vec<&String> {
        lines
            .iter()
            .filter(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
                let key = v["visit_id"].as_str().expect("every line has a visit_id");
                partition_for(key.as_bytes(), PARTITIONS) as usize == p
            })
            .collect()
    };
    for p in 0..PARTITIONS {
        let mine = of(p);
        // What one job over this partition's records alone emits.
        let mut reference = job();
        let mut expected = Vec::new();
        let events = mine
            .iter()
            .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
        reference
            .run(events, &mut expected, &mut Vec::new())
            .expect("vectors");

        let state = dir.path().join(format!("p{p}"));
        let mut checkpoints = Checkpoints::open(&state).expect("state dir");
        let mut job = job();
        job.restore(&mut checkpoints).expect("restore");
        let mut source = KafkaJson::<Visit, _>::open_partition(
            broker,
            &input,
            p as i32,
            &mut checkpoints,
            Vec::new(),
        )
        .expect("source");
        let mut events = Vec::new();
        let mut got = Vec::new();
        read_until(&mut source, mine.len() as u64, &mut events);
        source
            .poll(Duration::from_millis(500), 10_000, &mut events)
            .expect("poll");
        assert_eq!(
            source.counts().records,
            mine.len() as u64,
            "partition {p} only"
        );
        job.push_batch(events.drain(..), &mut got, &mut Vec::new())
            .expect("push");
        job.checkpoint(&mut checkpoints).expect("checkpoint");
        job.finish(&mut got, &mut Vec::new()).expect("finish");
        assert!(
            expected.len() > 10,
            "partition {p}: {} records",
            expected.len()
        );
        // As written (the emission context, with its processing time, is not).
        let json = |v: &[WindowOutput<u64>]| -> Vec<String> {
            v.iter()
                .map(|r| serde_json::to_string(r).expect("json"))
                .collect()
        };
        assert_eq!(json(&got), json(&expected), "partition {p}");
        drop((job, source, checkpoints));

        // Its state directory belongs to that partition.
        let mut checkpoints = Checkpoints::open(&state).expect("state dir");
        crate::job().restore(&mut checkpoints).expect("restore");
        let other = (p + 1) % PARTITIONS;
        let err = KafkaJson::<Visit, Vec<DeadLetter>>::open_partition(
            broker,
            &input,
            other as i32,
            &mut checkpoints,
            Vec::new(),
        )
        .expect_err("another partition");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{input}/{p}")) && text.contains(&format!("{input}/{other}")),
            "{text}"
        );
        // And to a source of every partition, which would read the others from their
        // start into this partition's job.
        let err =
            KafkaJson::<Visit, Vec<DeadLetter>>::open(broker, &input, &mut checkpoints, Vec::new())
                .expect_err("every partition on a partition's directory");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{input}/{p} alone"))
                && text.contains(&format!("every partition of {input}")),
            "{text}"
        );
    }
}

/// What the stateful job below emits: a visit's event count, when its timeout fires.
#[derive(Debug, Serialize)]
struct VisitCount {
    visit_id: String,
    events: u64,
}

#[test]
fn a_stateful_job_resumed_with_an_exactly_once_sink_commits_one_runs_records() {
    let _one = kafka::exclusive();
    let (input, output) = (
        kafka::unique("lib-sf-visits"),
        kafka::unique("lib-sf-counts"),
    );
    kafka::create_topics(&[&input], 1);
    kafka::create_topics(&[&output], 2);
    let lines = lines(0, 3_000, None);
    produce(&input, &lines);
    let job = || {
        Stream::<Visit>::new()
            .key_by(|v| v.visit_id.clone())
            .event_time(|v| v.event_time)
            .flat_map_groups_with_state(
                |key: &str, events: Vec<Visit>, state: &mut GroupState<'_, u64>| {
                    if state.has_timed_out() {
                        let events = state.remove().unwrap_or(0);
                        return Some(VisitCount {
                            visit_id: key.to_string(),
                            events,
                        });
                    }
                    state.update(state.get().copied().unwrap_or(0) + events.len() as u64);
                    let last = events.iter().map(|v| v.event_time).max();
                    state.set_timeout_timestamp(last.unwrap_or(EventTime(0)).plus(minutes(5)));
                    None
                },
            )
            .build()
    };
    let valid = |range: std::ops::Range<usize>| -> Vec<Visit> {
        lines[range]
            .iter()
            .filter_map(|l| serde_json::from_str::<Visit>(l).ok())
            .collect()
    };
    // One uninterrupted run: two batches (records 0..1,700 and 1,700..3,000), the end.
    let mut reference = job();
    let mut expected = Vec::new();
    reference
        .process_batch(valid(0..1_700), &mut expected, &mut Vec::new())
        .expect("vectors");
    reference
        .process_batch(valid(1_700..3_000), &mut expected, &mut Vec::new())
        .expect("vectors");
    reference
        .finish(&mut expected, &mut Vec::new())
        .expect("vectors");
    let mut expected: Vec<String> = expected
        .iter()
        .map(|r| serde_json::to_string(r).expect("json"))
        .collect();
    expected.sort();

    let dir = tempfile::tempdir().expect("temp dir");
    let broker = kafka::broker();
    // The first run: a batch and a checkpoint (committed), then a batch whose records
    // reach the brokers, and the run dies before its next checkpoint.
    {
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut sink = KafkaJsonSink::exactly_once(broker, &output, "visit_id", &mut checkpoints)
            .expect("sink");
        let mut job = job();
        assert!(
            job.restore_checkpoint(&mut checkpoints)
                .expect("restore")
                .is_none()
        );
        let mut source = KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new())
            .expect("source");
        let mut events = Vec::new();
        read_until(&mut source, 1_700, &mut events);
        job.process_batch(events.drain(..), &mut sink, &mut Vec::new())
            .expect("batch");
        job.checkpoint(&mut checkpoints).expect("checkpoint");
        read_until(&mut source, 2_300, &mut events);
        job.process_batch(events.drain(..), &mut sink, &mut Vec::new())
            .expect("batch");
        sink.flush().expect("delivered, not committed");
    }

    // The second run fences the first (aborting its open transaction) and resumes
    // from the checkpoint: records 1,700.. again, in one batch, then the end.
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let mut sink =
        KafkaJsonSink::exactly_once(broker, &output, "visit_id", &mut checkpoints).expect("sink");
    let committed_first = session_lines(&output).len();
    let written_first: usize = kafka::read_uncommitted(&output).iter().map(Vec::len).sum();
    assert!(
        written_first > committed_first && committed_first > 0,
        "the first run committed {committed_first} records and wrote {written_first}"
    );
    let mut job = job();
    let resumed = job
        .restore_checkpoint(&mut checkpoints)
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(resumed.epoch, 1);
    let mut source =
        KafkaJson::<Visit, _>::open(broker, &input, &mut checkpoints, Vec::new()).expect("source");
    let mut events = Vec::new();
    read_until(&mut source, 1_300, &mut events);
    job.process_batch(events.drain(..), &mut sink, &mut Vec::new())
        .expect("batch");
    job.finish(&mut sink, &mut Vec::new()).expect("finish");
    job.checkpoint(&mut checkpoints).expect("checkpoint");

    let mut got = session_lines(&output);
    got.sort();
    assert_eq!(
        got.len(),
        expected.len(),
        "records committed against one run's"
    );
    assert!(
        got == expected,
        "the committed records differ from one run's"
    );
}

/// A cluster that wants TLS and SCRAM: the library's source and sinks take the same
/// security settings as the command line (`KafkaSettings`), and a job reads visits from
/// the SASL_SSL listener and writes its sessions back through it exactly once.
#[test]
fn a_library_job_reads_and_writes_a_cluster_that_wants_tls_and_scram() {
    let _one = kafka::exclusive();
    let _secure = kafka::on_secure();
    let secure = kafka::secure();
    let settings =
        sessionizer::kafka::KafkaSettings::new(&secure.sasl).properties(secure.sasl_config.clone());
    // Its Debug never shows the password.
    let shown = format!("{settings:?}");
    assert!(
        !shown.contains("sessionizer-dev-secret") && shown.contains("[redacted]"),
        "{shown}"
    );
    let (input, output) = (
        kafka::unique("lib-tls-visits"),
        kafka::unique("lib-tls-sessions"),
    );
    kafka::create_topics(&[&input, &output], 1);
    let lines = lines(0, 500, None);
    produce(&input, &lines);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let mut sink = KafkaJsonSink::exactly_once(&settings, &output, "key", &mut checkpoints)
        .expect("an exactly-once sink over SASL_SSL");
    let mut job = job();
    job.restore(&mut checkpoints).expect("restore");
    let mut source = KafkaJson::<Visit, _>::open(&settings, &input, &mut checkpoints, Vec::new())
        .expect("a source over SASL_SSL");
    let mut events = Vec::new();
    read_until(&mut source, lines.len() as u64, &mut events);
    job.push_batch(events.drain(..), &mut sink, &mut Vec::new())
        .expect("push");
    job.finish(&mut sink, &mut Vec::new()).expect("finish");
    job.checkpoint(&mut checkpoints)
        .expect("checkpoint and commit");
    let got = session_lines(&output);
    let mut want = Vec::new();
    job_over(&lines, &mut want);
    assert_eq!(got.len(), want.len());
    assert!(!got.is_empty());
}

/// The sessions one job writes over `lines`, as JSON lines.
fn job_over(lines: &[String], out: &mut Vec<String>) {
    let mut j = job();
    let events = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
    let mut records = Vec::new();
    j.run(events, &mut records, &mut Vec::new())
        .expect("vectors");
    out.extend(
        records
            .iter()
            .map(|r| serde_json::to_string(r).expect("json")),
    );
}
