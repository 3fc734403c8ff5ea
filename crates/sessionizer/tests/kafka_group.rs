//! A library session-window job as a member of a Kafka consumer group
//! (`sessionizer::kafka::KafkaGroup`; cargo feature `kafka`, a real broker started by
//! `scripts/kafka-dev.sh`): every input partition is a task with a job of its own, on
//! the command line's Kafka driver. Each partition's committed output is, record for
//! record, what one job over that partition's records alone emits; dead letters (a
//! record that is not an event, a far-future time) and late events go to their topics
//! with their positions; the accounting adds up; and a second run of the group over
//! more records continues the sessions from the changelog. The same for stateful jobs,
//! and both with one of two processes killed with SIGKILL again and again.

#![cfg(feature = "kafka")]

mod support;

#[path = "../../cli/tests/support/kafka.rs"]
mod kafka;

#[path = "support/kafka_visits.rs"]
mod visits;

/// The example `kafka_group`'s stateful job, for the reference of its kill test.
#[path = "../examples/kafka_group.rs"]
mod example;

use serde::{Deserialize, Serialize};
use sessionizer::kafka::KafkaGroup;
use sessionizer::prelude::*;
use sessionizer::stats::RunStats;
use sessionizer_connectors::kafka::partitioner::partition_for;
use std::io::Write;
use std::time::Duration;
use visits::{FAR, Visit, job, produce};

const PARTITIONS: usize = 3;

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
    let stats = window_case(StateBackend::Memory, 40);
    assert_eq!(stats.state_store, None);
}

/// The session-window case on `backend`, over `visits` visits: returns the second
/// run's accounting.
fn window_case(backend: StateBackend, visits: u64) -> RunStats {
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
    let first = visits::lines_over(visits, 0, 3_000, Some(700));
    produce(&input, &first);
    let run = |keep_open: bool| {
        KafkaGroup::new(kafka::broker(), &group, &input, &output)
            .dead_letter_topic(&dead)
            .late_topic(&late)
            .commit_interval(Duration::from_millis(300))
            .stop_at_end(true)
            .keep_open(keep_open)
            .workers(2)
            .state_backend(backend.clone())
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
    let second = visits::lines_over(visits, 3_000, 1_500, Some(700));
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
    stats
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

/// The example job, emitting each session once, when it is final.
fn final_job() -> visits::Job {
    visits::job_emitting(EmitMode::Final)
}

/// A session in the shape of the book's job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookSession {
    visit_id: String,
    start_time: i64,
    end_time: i64,
    visited_pages: u64,
    data_processing_context: serde_json::Value,
}

fn book_session(s: &SessionRecord<u64>) -> Option<(String, BookSession)> {
    Some((
        s.key.clone(),
        BookSession {
            visit_id: s.key.clone(),
            start_time: s.start.0,
            end_time: s.end.0,
            visited_pages: s.value,
            data_processing_context: serde_json::json!({
                "watermark": s.emitted.watermark.millis(),
                "processing_time": s.emitted.processing_time.0,
                "at_end_of_input": s.emitted.trigger == Trigger::EndOfInput,
            }),
        },
    ))
}

/// A group job shapes its own records: keyed by the visit, in the book's layout, each
/// session once (final emission), per partition the sessions of one job over its
/// records; a job that may retract is refused, since a tombstone under a visit id
/// would delete another session's record.
#[test]
fn a_group_job_writes_its_own_record_layout_keyed_by_its_own_key() {
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-shape-visits");
    let (output, dead) = (
        kafka::unique("grp-shape-out"),
        kafka::unique("grp-shape-dead"),
    );
    kafka::create_topics(&[&input, &output], PARTITIONS as i32);
    kafka::create_topics(&[&dead], 1);
    let lines = visits::lines_over(40, 0, 3_000, Some(700));
    produce(&input, &lines);
    let group = || {
        KafkaGroup::new(
            kafka::broker(),
            &kafka::unique("grp-shape"),
            &input,
            &output,
        )
        .dead_letter_topic(&dead)
        .stop_at_end(true)
    };
    let err = group()
        .run_windows_as(job, book_session)
        .expect_err("a job that retracts");
    assert!(err.to_string().contains("EmitMode::Final"), "{err}");
    let stats = group()
        .run_windows_as(final_job, book_session)
        .expect("the group job runs");
    assert_eq!(stats.records_read, lines.len() as u64);
    for (p, got) in kafka::read_committed(&output).iter().enumerate() {
        let mut j = final_job();
        let mut out: Vec<WindowOutput<u64>> = Vec::new();
        let events = of(&lines, p)
            .into_iter()
            .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
        j.run(events, &mut out, &mut Vec::new()).expect("vectors");
        // The processing context is the run's own (its watermark is where the task
        // stood when the session became final): compared apart.
        let without_context = |(key, mut b): (String, BookSession)| {
            b.data_processing_context = serde_json::Value::Null;
            (key, b)
        };
        let want: Vec<(String, BookSession)> = out
            .iter()
            .filter_map(|o| book_session(o.session().expect("no retraction")))
            .map(without_context)
            .collect();
        assert!(want.len() > 20, "partition {p}: {} sessions", want.len());
        let mut final_by_watermark = 0;
        let got: Vec<(String, BookSession)> = got
            .iter()
            .map(|r| {
                let key = String::from_utf8(r.key.clone().expect("a key")).expect("utf8");
                let b: BookSession = serde_json::from_str(&kafka::text(r)).expect("a session");
                assert_eq!(b.visit_id, key, "keyed by the visit");
                // Final: the watermark passed the session's end (its close plus the
                // lateness, in fact), unless the input's end emitted it.
                let context = &b.data_processing_context;
                if context["at_end_of_input"] == false {
                    final_by_watermark += 1;
                    assert!(
                        context["watermark"].as_i64() >= Some(b.end_time),
                        "emitted when final: {b:?}"
                    );
                }
                (key, b)
            })
            .map(without_context)
            .collect();
        assert!(
            got == want,
            "output partition {p}: {} sessions, {} wanted",
            got.len(),
            want.len()
        );
        assert!(
            final_by_watermark > 10,
            "partition {p}: {final_by_watermark} sessions final before the end"
        );
    }
}

/// A visit's pages, emitted once the visit has been quiet for 5 minutes of event time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Closed {
    visit: String,
    pages: u64,
    first: i64,
    last: i64,
}

/// A visit's pages and first and last event time so far.
type Pages = (u64, i64, i64);

type PagesFn = fn(&str, Vec<Visit>, &mut GroupState<'_, Pages>) -> Option<Closed>;

type StatefulVisits = StatefulJob<
    Visit,
    fn(&Visit) -> String,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    Pages,
    PagesFn,
    SystemClock,
>;

/// Each visit's pages in its state, kept until an event-time timeout 5 minutes after
/// its last event, which emits them.
fn close_visits(
    visit: &str,
    events: Vec<Visit>,
    state: &mut GroupState<'_, Pages>,
) -> Option<Closed> {
    if state.has_timed_out() {
        return state.remove().map(|(pages, first, last)| Closed {
            visit: visit.to_string(),
            pages,
            first,
            last,
        });
    }
    let (mut pages, mut first, mut last) = state.get().copied().unwrap_or((0, i64::MAX, i64::MIN));
    for e in &events {
        pages += 1;
        first = first.min(e.event_time.0);
        last = last.max(e.event_time.0);
    }
    state.update((pages, first, last));
    state.set_timeout_timestamp(EventTime(last).plus(minutes(5)));
    None
}

/// A stateful job in Flink's way, one event per batch, so that nothing depends on where
/// a restart cuts the input.
fn stateful_job() -> StatefulVisits {
    stateful_job_behind(minutes(1))
}

/// [`stateful_job`] with its watermark `delay` behind the events.
fn stateful_job_behind(delay: DurationMs) -> StatefulVisits {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(delay))
        .flat_map_groups_with_state(close_visits as PagesFn)
        .batching(Batching::PerEvent)
        .build()
}

#[test]
fn a_stateful_group_job_gives_each_partition_the_outputs_of_one_job_over_its_records() {
    let stats = stateful_case(StateBackend::Memory, 40);
    assert_eq!(stats.state_store, None);
}

/// The jobs of a group on the RocksDB backend, with a budget so small that keys are
/// evicted all the time: the memory backend's outputs.
#[cfg(feature = "rocksdb")]
#[test]
fn group_jobs_on_the_rocksdb_backend_give_the_same_outputs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let backend = StateBackend::RocksDb {
        memory_bytes: 8 << 10,
        dir: Some(dir.path().to_path_buf()),
    };
    for stats in [
        window_case(backend.clone(), 2_000),
        stateful_case(backend, 2_000),
    ] {
        let store = stats.state_store.expect("the tasks had stores");
        assert!(
            store.evicted > 50 && store.unspilled > 50,
            "keys went to the stores and came back: {store:?}"
        );
    }
}

/// The stateful case on `backend`, over `visits` visits: returns the second run's
/// accounting.
fn stateful_case(backend: StateBackend, visits: u64) -> RunStats {
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-st-visits");
    let (output, dead, late) = (
        kafka::unique("grp-st-out"),
        kafka::unique("grp-st-dead"),
        kafka::unique("grp-st-late"),
    );
    kafka::create_topics(&[&input, &output], PARTITIONS as i32);
    kafka::create_topics(&[&dead, &late], 1);
    let group = kafka::unique("grp-st");
    let first = visits::lines_over(visits, 0, 3_000, Some(700));
    produce(&input, &first);
    let run = |keep_open: bool| {
        KafkaGroup::new(kafka::broker(), &group, &input, &output)
            .dead_letter_topic(&dead)
            .late_topic(&late)
            .commit_interval(Duration::from_millis(300))
            .stop_at_end(true)
            .keep_open(keep_open)
            .workers(2)
            .state_backend(backend.clone())
            .run_stateful(stateful_job)
            .expect("the group job runs")
    };
    // The first run keeps its states at the end (in the changelogs); the second, over
    // more records, restores them, goes on and ends.
    let stats = run(true);
    assert_eq!(stats.records_read, first.len() as u64);
    assert_eq!(
        stats.in_sessions + stats.late + stats.invalid,
        stats.records_read,
        "every record accounted for: {stats:?}"
    );
    let second = visits::lines_over(visits, 3_000, 1_500, Some(700));
    produce(&input, &second);
    let stats = run(false);
    assert_eq!(stats.records_read, second.len() as u64);
    assert!(
        stats.kafka.as_ref().expect("kafka stats").restored_records > 0,
        "the second run restored from the changelogs"
    );

    let got = kafka::read_committed(&output);
    assert_eq!(got.len(), PARTITIONS);
    let mut expected_late = 0;
    for (p, got) in got.iter().enumerate() {
        // One job over the partition's records, uninterrupted.
        let mut j = stateful_job();
        let (mut want, mut late_events) = (Vec::new(), Vec::new());
        let events = of(&first, p)
            .into_iter()
            .chain(of(&second, p))
            .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
        j.run(events, &mut want, &mut late_events).expect("vectors");
        assert!(want.len() > 20, "partition {p}: {} outputs", want.len());
        let got: Vec<(String, Closed)> = got
            .iter()
            .map(|r| {
                let key = String::from_utf8(r.key.clone().expect("a key")).expect("utf8");
                (
                    key,
                    serde_json::from_str(&kafka::text(r)).expect("an output"),
                )
            })
            .collect();
        let want: Vec<(String, Closed)> = want.into_iter().map(|c| (c.visit.clone(), c)).collect();
        assert_eq!(got, want, "output partition {p}");
        expected_late += late_events
            .iter()
            .filter(|l| l.reason != sessionizer::late::TIME_OUT_OF_RANGE)
            .count();
    }
    let dead_letters = kafka::read_committed(&dead).iter().flatten().count();
    let all: Vec<&String> = first.iter().chain(&second).collect();
    let not_events = all
        .iter()
        .filter(|l| l.contains("not a time") || l.contains(&FAR.to_string()))
        .count();
    assert!(not_events > 8);
    assert_eq!(dead_letters, not_events);
    let late_records = kafka::read_committed(&late).iter().flatten().count();
    assert!(expected_late > 10, "{expected_late} late events");
    assert_eq!(late_records, expected_late);
    stats
}

/// One call of a stateful function: its key, how many events it got, the watermark
/// it saw and whether a timeout made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Call {
    key: String,
    events: usize,
    watermark: i64,
    timed_out: bool,
}

type CallsFn = fn(&str, Vec<Visit>, &mut GroupState<'_, i64>) -> Option<Call>;

/// Says what each call got: everything a micro-batch boundary can change shows.
fn calls(key: &str, events: Vec<Visit>, state: &mut GroupState<'_, i64>) -> Option<Call> {
    let timed_out = state.has_timed_out();
    let last = events
        .iter()
        .map(|e| e.event_time.0)
        .max()
        .unwrap_or(i64::MIN)
        .max(state.get().copied().unwrap_or(i64::MIN));
    if timed_out {
        state.remove();
    } else {
        state.update(last);
        state.set_timeout_timestamp(EventTime(last).plus(minutes(3)));
    }
    Some(Call {
        key: key.to_string(),
        events: events.len(),
        watermark: state.current_watermark().millis(),
        timed_out,
    })
}

type MicroBatched = StatefulJob<
    Visit,
    fn(&Visit) -> String,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    i64,
    CallsFn,
    SystemClock,
>;

/// Spark-style micro-batches of 40 records.
fn micro_batched() -> MicroBatched {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .flat_map_groups_with_state(calls as CallsFn)
        .batching(Batching::Events(40))
        .build()
}

/// A micro-batched stateful job in a group calls its function with the same events
/// however the records were polled: a run that fetches a few records at a time and
/// one that fetches many give, per partition, the calls of one job over micro-batches
/// of 40 consecutive records of the partition (records that are no visit count too).
#[test]
fn micro_batches_are_cut_by_the_partitions_records_not_by_the_polls() {
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-mb-visits");
    kafka::create_topics(&[&input], PARTITIONS as i32);
    let lines = visits::lines_over(300, 0, 6_000, Some(900));
    // Produced over three seconds: small record batches, which a consumer fetching a
    // few bytes at a time receives a few at a time.
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for l in &lines {
        writeln!(file, "{l}").expect("write");
    }
    file.flush().expect("flush");
    kafka::produce_lines_paced(&input, file.path(), "visit_id", Duration::from_secs(3));
    let mut runs = Vec::new();
    for fetch in ["300", "1048576"] {
        let (output, dead) = (kafka::unique("grp-mb-out"), kafka::unique("grp-mb-dead"));
        kafka::create_topics(&[&output], PARTITIONS as i32);
        kafka::create_topics(&[&dead], 1);
        let stats = KafkaGroup::new(kafka::broker(), &kafka::unique("grp-mb"), &input, &output)
            .dead_letter_topic(&dead)
            .commit_interval(Duration::from_millis(100))
            .stop_at_end(true)
            .kafka_property("max.partition.fetch.bytes", fetch)
            .run_stateful(micro_batched)
            .expect("the group job runs");
        assert_eq!(stats.records_read, lines.len() as u64);
        runs.push(output);
    }
    for (p, _) in kafka::read_committed(&runs[0]).iter().enumerate() {
        // One job over the partition's records, 40 records to a micro-batch.
        let mut j = micro_batched();
        let mut want: Vec<Call> = Vec::new();
        for chunk in of(&lines, p).chunks(40) {
            let events: Vec<Visit> = chunk
                .iter()
                .filter_map(|l| serde_json::from_str::<Visit>(l).ok())
                .collect();
            if !events.is_empty() {
                j.process_batch(events, &mut want, &mut Vec::new())
                    .expect("vectors");
            }
        }
        j.finish(&mut want, &mut Vec::new()).expect("vectors");
        assert!(want.len() > 100, "partition {p}: {} calls", want.len());
        assert!(want.iter().any(|c| c.events > 1), "calls of several events");
        for output in &runs {
            let got: Vec<Call> = kafka::read_committed(output)[p]
                .iter()
                .map(|r| serde_json::from_str(&kafka::text(r)).expect("a call"))
                .collect();
            assert!(
                got == want,
                "output partition {p} of {output}: {} calls, {} wanted",
                got.len(),
                want.len()
            );
        }
    }
}

#[test]
fn a_group_job_re_keys_an_input_partitioned_otherwise_with_repartition_by() {
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-rk-visits");
    let (output, dead) = (kafka::unique("grp-rk-out"), kafka::unique("grp-rk-dead"));
    kafka::create_topics(&[&input, &output], PARTITIONS as i32);
    kafka::create_topics(&[&dead], 1);
    // Keyed by their time, not their visit: a visit's events are spread over every
    // input partition. Out of order by up to 2 minutes (the visits 20 minutes late are
    // left out), within the job's 3-minute watermark delay: no event is late in file
    // order, and none may be here, whichever input partition the group reads first —
    // the tasks follow the slowest input partition's time (docs/semantics.md K-6).
    let mut newest = i64::MIN;
    let lines: Vec<String> = visits::lines(0, 3_000, None)
        .into_iter()
        .filter(|l| match serde_json::from_str::<Visit>(l) {
            Ok(v) if v.event_time.0 < newest.saturating_sub(120_000) => false,
            Ok(v) => {
                newest = newest.max(v.event_time.0);
                true
            }
            Err(_) => true,
        })
        .collect();
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for l in &lines {
        writeln!(file, "{l}").expect("write");
    }
    file.flush().expect("flush");
    kafka::produce_lines(&input, file.path(), "event_time");
    let job = || {
        Stream::<Visit>::new()
            .key_by(|v: &Visit| v.visit_id.clone())
            .event_time(|v: &Visit| v.event_time)
            .watermark(BoundedOutOfOrderness::new(minutes(3)))
            .session_windows(minutes(5))
            .aggregate(Count)
            .build()
    };
    let stats = KafkaGroup::new(kafka::broker(), &kafka::unique("grp-rk"), &input, &output)
        .dead_letter_topic(&dead)
        .repartition_by("visit_id")
        .commit_interval(Duration::from_millis(300))
        .stop_at_end(true)
        .run_windows(job)
        .expect("the group job runs");
    assert_eq!(stats.records_read, lines.len() as u64);
    assert_eq!(stats.late, 0, "no event is late");

    // What a session says of its records (not when it was emitted).
    let facts = |v: serde_json::Value| {
        (
            v["key"].as_str().expect("key").to_string(),
            v["start"].to_string(),
            v["end"].to_string(),
            v["event_count"].as_u64().expect("count"),
        )
    };
    let mut want = Vec::new();
    let mut j = job();
    let events = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Visit>(l).ok());
    let mut late_in_order: Vec<Late<Visit>> = Vec::new();
    j.run(events, &mut want, &mut late_in_order)
        .expect("vectors");
    assert!(
        late_in_order.is_empty(),
        "none is late in file order either"
    );
    let mut want: Vec<_> = want
        .iter()
        .map(|r: &WindowOutput<u64>| facts(serde_json::to_value(r).expect("json")))
        .collect();
    let mut got: Vec<_> = kafka::read_committed(&output)
        .iter()
        .enumerate()
        .flat_map(|(p, part)| {
            part.iter().map(move |r| {
                let v: serde_json::Value = serde_json::from_str(&kafka::text(r)).expect("json");
                let key = v["key"].as_str().expect("key");
                assert_eq!(partition_for(key.as_bytes(), PARTITIONS), p as i32, "{v}");
                facts(v)
            })
        })
        .collect();
    want.sort();
    got.sort();
    assert!(want.len() > 100, "{} sessions", want.len());
    assert_eq!(got, want);
    let not_visits = lines.iter().filter(|l| l.contains("not a time")).count();
    let dead_letters = kafka::read_committed(&dead).iter().flatten().count();
    assert!(not_visits > 3);
    assert_eq!(dead_letters, not_visits);

    // A stateful job re-keyed the same way follows the same time: no event is late, and
    // every visit's pages are in its outputs (the timeouts fire at +infinity at the end).
    let stateful_output = kafka::unique("grp-rk-st-out");
    kafka::create_topics(&[&stateful_output], PARTITIONS as i32);
    let stateful = || stateful_job_behind(minutes(3));
    let stats = KafkaGroup::new(
        kafka::broker(),
        &kafka::unique("grp-rk-st"),
        &input,
        &stateful_output,
    )
    .dead_letter_topic(&dead)
    .repartition_by("visit_id")
    .commit_interval(Duration::from_millis(300))
    .stop_at_end(true)
    .run_stateful(stateful)
    .expect("the stateful group job runs");
    assert_eq!(stats.late, 0, "no event is late");
    let pages: u64 = kafka::read_committed(&stateful_output)
        .iter()
        .flatten()
        .map(|r| {
            serde_json::from_str::<Closed>(&kafka::text(r))
                .expect("an output")
                .pages
        })
        .sum();
    assert_eq!(pages, (lines.len() - not_visits) as u64);
    let dead_letters = kafka::read_committed(&dead).iter().flatten().count();
    assert_eq!(dead_letters, 2 * not_visits);

    // The same input without the re-keying gave wrong sessions silently; now the job
    // stops at the first batch holding a visit in the wrong partition, naming the cure.
    let refused = KafkaGroup::new(kafka::broker(), &kafka::unique("grp-rk"), &input, &output)
        .dead_letter_topic(&dead)
        .commit_interval(Duration::from_millis(300))
        .stop_at_end(true)
        .run_windows(job)
        .expect_err("an input keyed by time is not keyed by visit");
    let text = refused.to_string();
    assert!(
        text.contains("not partitioned by the session key") && text.contains("repartition_by"),
        "{text}"
    );
    let stats = refused.stats().expect("the counts until it stopped");
    assert!(
        stats
            .kafka
            .as_ref()
            .is_some_and(|k| k.records_misplaced > 0)
    );
    assert_eq!(
        kafka::read_committed(&dead).iter().flatten().count(),
        2 * not_visits,
        "nothing more was committed"
    );
}

/// The end of a process's stderr (its late events come before its error).
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// The changelog records restored at every assignment a log (of the processes of one
/// instance) tells of.
fn restored_records(log: &std::path::Path) -> u64 {
    let text = String::from_utf8_lossy(&std::fs::read(log).expect("a log"))
        .replace("\u{1b}[0m", "")
        .replace("\u{1b}[2m", "")
        .replace("\u{1b}[3m", "");
    text.lines()
        .filter(|l| l.contains("partitions assigned"))
        .map(|l| {
            let (_, after) = l.split_once("restored_records=").expect("restored_records");
            let n: String = after.chars().take_while(char::is_ascii_digit).collect();
            n.parse::<u64>().expect("a count")
        })
        .sum()
}

/// A visit line of the example `kafka_group` (and of `sessionizer generate`).
#[derive(Debug, Serialize, Deserialize)]
struct PageVisit {
    visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    event_time: EventTime,
    page: String,
}

/// The example's job.
fn page_job() -> impl FnMut(&[&String]) -> Vec<Message> {
    |records| {
        let mut j = Stream::<PageVisit>::new()
            .key_by(|v| v.visit_id.clone())
            .event_time(|v| v.event_time)
            .watermark(BoundedOutOfOrderness::new(seconds(30)))
            .session_windows(minutes(2))
            .allowed_lateness(minutes(2))
            .aggregate(Collect(|v: &PageVisit| Some(v.page.clone())).named("pages"))
            .build();
        let events = records
            .iter()
            .filter_map(|l| serde_json::from_str::<PageVisit>(l).ok());
        let mut out = Vec::new();
        j.run(events, &mut out, &mut Vec::new()).expect("vectors");
        out.iter()
            .map(|r| match r {
                WindowOutput::Session(s) => (
                    format!("{:016x}", s.session_id),
                    Some(serde_json::to_string(r).expect("json")),
                ),
                WindowOutput::Retraction(r) => (format!("{:016x}", r.session_id), None),
            })
            .collect()
    }
}

/// The example's stateful job (`--stateful`): what one job over `records` emits, as
/// output messages (keyed by the visit), the records cut into micro-batches of the
/// example's size.
fn stateful_page_job(records: &[&String]) -> Vec<Message> {
    let mut j = Stream::<example::Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(seconds(30)))
        .flat_map_groups_with_state(example::visit_pages)
        .batching(Batching::Events(example::MICRO_BATCH))
        .build();
    let mut out = Vec::new();
    for chunk in records.chunks(example::MICRO_BATCH) {
        let events: Vec<example::Visit> = chunk
            .iter()
            .filter_map(|l| serde_json::from_str::<example::Visit>(l).ok())
            .collect();
        if !events.is_empty() {
            j.process_batch(events, &mut out, &mut Vec::new())
                .expect("vectors");
        }
    }
    j.finish(&mut out, &mut Vec::new()).expect("vectors");
    out.iter()
        .map(|o| {
            (
                o.visit_id.clone(),
                Some(serde_json::to_string(o).expect("json")),
            )
        })
        .collect()
}

/// Two processes of the example `kafka_group` in one group over a three-partition
/// topic; the second is killed with SIGKILL three times at random instants and started
/// again, restoring its partitions from their changelogs each time. The committed output of each partition is, record for record, what one job
/// over that partition's records emits — nothing lost, nothing twice — and every record
/// that is not a visit is one dead letter.
#[test]
fn two_processes_one_killed_again_and_again_give_each_partitions_sessions_once() {
    kill_one_of_two(false, 600_000);
}

/// The same with the example's stateful job: each partition's committed outputs are
/// one stateful job's over its records, the states restored from the changelogs.
#[test]
fn a_stateful_group_job_killed_again_and_again_gives_each_partitions_outputs_once() {
    kill_one_of_two(true, 300_000);
}

/// Runs the example (`stateful`: its stateful job) in two processes over `visits`
/// visits, kills one of them three times, and checks the outputs.
fn kill_one_of_two(stateful: bool, visits: i64) {
    use rand::{Rng, SeedableRng};
    use std::process::{Command, Stdio};
    let _one = kafka::exclusive();
    let input = kafka::unique("grp-kill-visits");
    let (output, dead) = (
        kafka::unique("grp-kill-sessions"),
        kafka::unique("grp-kill-dead"),
    );
    kafka::create_topics(&[&input, &output], PARTITIONS as i32);
    kafka::create_topics(&[&dead], 1);
    let lines: Vec<String> = support::visits(visits, 400, 300, 23)
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if i % 500 == 499 {
                return format!(
                    r#"{{"visit_id":"v{}","event_time":"not a time","page":"/"}}"#,
                    v.visit
                );
            }
            let line = PageVisit {
                visit_id: format!("v{}", v.visit),
                event_time: v.at,
                page: format!("/p{}", v.page),
            };
            serde_json::to_string(&line).expect("JSON")
        })
        .collect();
    produce(&input, &lines);
    let group = kafka::unique("grp-kill");
    let service = support::example("kafka_group");
    // Their stderr (late events, then any error) goes to files: a pipe nobody reads
    // would fill and stall the process past its transaction timeout.
    let logs = tempfile::tempdir().expect("temp dir");
    let log = |instance: &str| logs.path().join(format!("{instance}.log"));
    // Only the last b and a stop at the end of the input: the bs to be killed never
    // end by themselves, whatever the machine's speed.
    let spawn = |instance: &str, stop_at_end: bool| {
        let err = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log(instance))
            .expect("log file");
        Command::new(&service)
            .args([kafka::broker(), &group, &input, &output, &dead, instance])
            .args(stop_at_end.then_some("--stop-at-end"))
            .args(stateful.then_some("--stateful"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn the example")
    };
    let tail = |instance: &str| tail(&std::fs::read(log(instance)).unwrap_or_default());
    // Both start together and share the partitions. b is killed three times, each
    // time once every partition's changelog has grown since b started (so that b's
    // partitions, whichever they are, have state committed by b) and a random moment
    // later, and started again: its partitions go back to the new b (it keeps its
    // instance id) or to a, and their new owner restores them from their changelogs.
    // Then both run to their end: the last b is started with --stop-at-end.
    let changelog = format!("{group}-{input}-changelog");
    let committed_state = || -> Vec<i64> {
        kafka::high_watermarks_if_there(&changelog, PARTITIONS)
            .unwrap_or_else(|| vec![0; PARTITIONS])
    };
    let mut a = spawn("a", true);
    let mut b = spawn("b", false);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(12);
    // The input may be read to its end before the third kill (a fast machine), or a
    // may read it while b is away (it takes b's partitions, reads them to their end,
    // emits every session and stops): the kills stop there, and the last b, started
    // with --stop-at-end, finishes the partitions it gets.
    let mut kills = 0;
    // Whether a has ended: only once it held every partition after a kill of b.
    let mut a_ended = |kills: u32| match a.try_wait().expect("wait") {
        Some(status) => {
            assert!(
                status.success() && kills > 0,
                "a ended before b's first kill ({status}): {}",
                tail("a")
            );
            true
        }
        None => false,
    };
    // A b started without --stop-at-end never ends by itself.
    let running = |b: &mut std::process::Child| {
        if let Some(status) = b.try_wait().expect("wait") {
            panic!("b ended before its kill ({status}): {}", tail("b"));
        }
    };
    'kills: while kills < 3 {
        let (began, before) = (std::time::Instant::now(), committed_state());
        let (mut last, mut changed_at) = (before.clone(), began);
        loop {
            let now = committed_state();
            if now != last {
                (last, changed_at) = (now.clone(), std::time::Instant::now());
            }
            let grown = now.iter().zip(&before).map(|(n, b)| n - b);
            let (least, total) = grown.fold((i64::MAX, 0), |(l, t), g| (l.min(g), t + g));
            // A partition whose input ended grows no more: after a while, enough
            // growth of all of them together will do.
            let waited = began.elapsed() > Duration::from_secs(20);
            if least >= 20 || (waited && total >= 50) {
                break;
            }
            // Nothing committed for 10 s: the whole input is read (a b started
            // afterwards restores its partitions and has little or nothing more to
            // commit).
            let read = changed_at.elapsed() > Duration::from_secs(10);
            if a_ended(kills) || (read && kills > 0) {
                break 'kills;
            }
            running(&mut b);
            assert!(
                began.elapsed() < Duration::from_secs(90),
                "no state committed in 90 s: {}",
                tail("b")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..400)));
        if a_ended(kills) {
            break;
        }
        running(&mut b);
        b.kill().expect("kill -9 b");
        b.wait().expect("reap b");
        kills += 1;
        b = spawn("b", kills == 3);
    }
    if kills < 3 {
        // The input is read, or a finished every partition: the b that never ends
        // gives way to one that stops at the end.
        b.kill().expect("kill -9 b");
        b.wait().expect("reap b");
        b = spawn("b", true);
    }
    eprintln!("b was killed {kills} times");
    let out = b.wait_with_output().expect("b runs to its end");
    assert!(out.status.success(), "b failed: {}", tail("b"));
    let b_stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("b's stats");
    let out = a.wait_with_output().expect("a runs to its end");
    assert!(out.status.success(), "a failed: {}", tail("a"));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a's stats");
    // The partitions b held when it was killed were restored by whoever took them:
    // every process logs what it restored at each assignment.
    let restored = restored_records(&log("a")) + restored_records(&log("b"));
    assert!(
        restored > 50,
        "the runs restored {restored} changelog records: a {stats}, b {b_stats}"
    );
    let read = stats["records_read"].as_u64().expect("records_read");
    let sum: u64 = ["in_sessions", "late", "invalid"]
        .iter()
        .map(|k| stats[*k].as_u64().expect("a count"))
        .sum();
    assert_eq!(sum, read, "a's accounting: {stats}");

    let got = messages(&output);
    let mut reference = page_job();
    let mut records = 0;
    for (p, got) in got.iter().enumerate() {
        let records_of_p = of(&lines, p);
        let want = if stateful {
            stateful_page_job(&records_of_p)
        } else {
            reference(&records_of_p)
        };
        records += want.len();
        if *got != want {
            let at = got.iter().zip(&want).take_while(|(g, w)| g == w).count();
            panic!(
                "output partition {p} after {kills} kills of b: {} records, one job's {}; the first difference at {at}: {:?} against {:?}",
                got.len(),
                want.len(),
                got.get(at),
                want.get(at)
            );
        }
    }
    assert!(records > 1_000, "{records} records");
    let dead_letters = kafka::read_committed(&dead).iter().flatten().count();
    assert_eq!(dead_letters, lines.len() / 500, "every non-visit once");
}
