//! A library session-window job as a member of a Kafka consumer group
//! (`sessionizer::kafka::KafkaGroup`; cargo feature `kafka`, a real broker started by
//! `scripts/kafka-dev.sh`): every input partition is a task with a job of its own, on
//! the command line's Kafka driver. Each partition's committed output is, record for
//! record, what one job over that partition's records alone emits; dead letters (a
//! record that is not an event, a far-future time) and late events go to their topics
//! with their positions; the accounting adds up; and a second run of the group over
//! more records continues the sessions from the changelog.

#![cfg(feature = "kafka")]

mod support;

#[path = "../../cli/tests/support/kafka.rs"]
mod kafka;

use serde::{Deserialize, Serialize};
use sessionizer::kafka::KafkaGroup;
use sessionizer::prelude::*;
use sessionizer_connectors::kafka::partitioner::partition_for;
use std::io::Write;
use std::time::Duration;

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
const PARTITIONS: usize = 3;
/// 2500-01-01T00:00:00Z: past the default valid time range.
const FAR: i64 = 16_725_225_600_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Visit {
    visit_id: String,
    event_time: EventTime,
}

/// `n` visit lines over 40 visits from line `from` on, out of order by up to 2 minutes,
/// some 20 minutes late; every 500th line is not a visit and every 700th is dated in
/// the year 2500.
fn lines(from: i64, n: i64) -> Vec<String> {
    let mut next = support::xorshift(0x9e37_79b9_7f4a_7c15 ^ from as u64);
    (from..from + n)
        .map(|i| {
            let visit_id = format!("v{}", next() % 40);
            if i % 500 == 499 {
                return format!("{{\"visit_id\": \"{visit_id}\", \"event_time\": \"not a time\"}}");
            }
            if i % 700 == 699 {
                return format!("{{\"visit_id\": \"{visit_id}\", \"event_time\": {FAR}}}");
            }
            let late = if next().is_multiple_of(40) {
                1_200_000
            } else {
                0
            };
            let visit = Visit {
                visit_id,
                event_time: EventTime(T0 + i * 2_000 - (next() % 120_000) as i64 - late),
            };
            serde_json::to_string(&visit).expect("json")
        })
        .collect()
}

type Job = SessionWindowJob<
    Visit,
    fn(&Visit) -> String,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    Count,
    sessionizer::windowed::FixedGap,
    SystemClock,
>;

fn job() -> Job {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .session_windows(minutes(5))
        .allowed_lateness(minutes(10))
        .aggregate(Count)
        .build()
}

fn produce(topic: &str, lines: &[String]) {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for l in lines {
        writeln!(file, "{l}").expect("write");
    }
    file.flush().expect("flush");
    kafka::produce_lines(topic, file.path(), "visit_id");
}

/// The lines of input partition `p`, in offset order: those whose key it holds.
fn of(lines: &[String], p: usize) -> Vec<&String> {
    lines
        .iter()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            let key = v["visit_id"].as_str().expect("every line has a visit_id");
            partition_for(key.as_bytes(), PARTITIONS) as usize == p
        })
        .collect()
}

/// A record as a reader of the output topic sees it: the message key (the session id)
/// and the value (`None`: a tombstone, a retraction).
type Message = (String, Option<String>);

/// What one job over `records` emits, pushed in `parts` (the end of input only after
/// the last, with `finish`), as output messages; and its late events.
fn reference(parts: &[Vec<&String>], finish: bool) -> (Vec<Message>, Vec<Late<Visit>>) {
    let mut j = job();
    let (mut out, mut late) = (Vec::new(), Vec::new());
    for part in parts {
        let events = part
            .iter()
            .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
        j.push_batch(events, &mut out, &mut late).expect("vectors");
    }
    if finish {
        j.finish(&mut out, &mut late).expect("vectors");
    }
    let messages = out
        .iter()
        .map(|r: &WindowOutput<u64>| match r {
            WindowOutput::Session(s) => (
                format!("{:016x}", s.session_id),
                Some(serde_json::to_string(r).expect("json")),
            ),
            WindowOutput::Retraction(r) => (format!("{:016x}", r.session_id), None),
        })
        .collect();
    (messages, late)
}

fn messages(topic: &str) -> Vec<Vec<Message>> {
    kafka::read_committed(topic)
        .into_iter()
        .map(|part| {
            part.iter()
                .map(|r| {
                    let key = String::from_utf8(r.key.clone().unwrap_or_default()).expect("utf8");
                    (key, r.value.as_ref().map(|_| kafka::text(r)))
                })
                .collect()
        })
        .collect()
}

#[test]
fn each_partition_of_a_group_job_emits_the_sessions_of_its_records_alone_and_continues() {
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-visits");
    let (output, dead, late) = (
        kafka::unique("grp-sessions"),
        kafka::unique("grp-dead"),
        kafka::unique("grp-late"),
    );
    kafka::create_topics(&[&input, &output], PARTITIONS as i32);
    kafka::create_topics(&[&dead, &late], 1);
    let group = kafka::unique("grp");
    let first = lines(0, 3_000);
    produce(&input, &first);
    let run = |keep_open: bool| {
        KafkaGroup::new(kafka::broker(), &group, &input, &output)
            .dead_letter_topic(&dead)
            .late_topic(&late)
            .commit_interval(Duration::from_millis(300))
            .stop_at_end(true)
            .keep_open(keep_open)
            .workers(2)
            .run_windows(job)
            .expect("the group job runs")
    };
    // The first run keeps its sessions open at the end (in the changelogs)...
    let stats = run(true);
    assert_eq!(stats.records_read, first.len() as u64);
    assert_eq!(
        stats.in_sessions + stats.late + stats.invalid,
        stats.records_read,
        "every record accounted for: {stats:?}"
    );
    // ... and the second, over more records, continues them and ends them.
    let second = lines(3_000, 1_500);
    produce(&input, &second);
    let stats = run(false);
    assert_eq!(stats.records_read, second.len() as u64);

    let got = messages(&output);
    let mut expected_late = 0;
    assert_eq!(got.len(), PARTITIONS);
    for (p, got) in got.iter().enumerate() {
        let parts = [of(&first, p), of(&second, p)];
        let (want, late_events) = reference(&parts, true);
        assert!(want.len() > 20, "partition {p}: {} records", want.len());
        assert_eq!(*got, want, "output partition {p}");
        expected_late += late_events
            .iter()
            .filter(|l| l.reason != sessionizer::late::TIME_OUT_OF_RANGE)
            .count();
    }
    // Dead letters: every record that is not a visit and every far-future one, with
    // where it was read.
    let dead_letters: Vec<serde_json::Value> = kafka::read_committed(&dead)
        .iter()
        .flatten()
        .map(|r| serde_json::from_str(&kafka::text(r)).expect("dead letter JSON"))
        .collect();
    let all: Vec<&String> = first.iter().chain(&second).collect();
    let not_visits = all.iter().filter(|l| l.contains("not a time")).count();
    let far = all.iter().filter(|l| l.contains(&FAR.to_string())).count();
    assert!(not_visits > 5 && far > 3);
    assert_eq!(dead_letters.len(), not_visits + far, "{dead_letters:?}");
    for d in &dead_letters {
        let source = d["source"].as_str().expect("source");
        assert!(
            source.starts_with(&format!("{input}/")) && source.contains('@'),
            "{d}"
        );
        let reason = d["reason"].as_str().expect("reason");
        let raw = d["raw"].as_str().expect("raw");
        if raw.contains(&FAR.to_string()) {
            assert!(reason.contains("outside the valid time range"), "{d}");
        }
    }
    let late_records = kafka::read_committed(&late).iter().flatten().count();
    assert!(expected_late > 10, "{expected_late} late events");
    assert_eq!(late_records, expected_late);
}

#[test]
fn a_job_that_cannot_be_a_task_is_refused_with_the_reason() {
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-refused");
    kafka::create_topics(&[&input], 1);
    let err = KafkaGroup::new(kafka::broker(), &kafka::unique("grp"), &input, &input)
        .stop_at_end(true)
        .run_windows(|| {
            let mut j = job();
            j.set_workers(2).expect("workers");
            j
        })
        .expect_err("a job on two workers");
    assert!(err.to_string().contains("set_workers"), "{err}");
}
