//! The library's API as a user meets it: the valid-time guard, the emission context,
//! sources and sinks from the prelude, JSON output.

use sessionizer::prelude::*;
use sessionizer::window::ProcessingTime;

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z

fn at(min: i64) -> EventTime {
    EventTime(T0 + min * 60_000)
}

/// The stateful job has the same guard as the window: an event in the year 2500 is
/// never given to the function and never moves the watermark.
#[test]
fn the_stateful_job_rejects_times_outside_the_valid_range() {
    let far = sessionizer::time::parse("2500-01-01T00:00:00Z").expect("a time");
    let mut job = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .flat_map_groups_with_state(
            |key: &str, events: Vec<(&str, EventTime)>, state: &mut GroupState<'_, u32>| {
                if state.has_timed_out() {
                    return state.remove().map(|n| format!("{key}:{n}"));
                }
                let n = state.get().copied().unwrap_or(0) + events.len() as u32;
                state.update(n);
                state.set_timeout_timestamp(events[0].1.plus(minutes(10)));
                None
            },
        )
        .build();
    let (mut out, mut rejected) = (Vec::new(), Vec::new());
    for e in [("a", at(0)), ("b", far), ("a", at(1))] {
        job.push(e, &mut rejected).expect("vectors");
        job.end_batch(&mut out).expect("vectors");
        assert!(
            job.watermark() <= Watermark::at(at(1)),
            "{}",
            job.watermark()
        );
    }
    job.finish(&mut out, &mut rejected).expect("vectors");
    assert_eq!(out, ["a:2"]);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].event.0, "b");
    assert_eq!(rejected[0].reason, sessionizer::late::TIME_OUT_OF_RANGE);
    let counts = job.counts();
    assert_eq!((counts.events, counts.late, counts.invalid), (3, 0, 1));
}

/// `..` turns the guard off; a bounded range keeps the times it says.
#[test]
fn the_valid_range_can_be_narrowed_or_turned_off() {
    let run = |job: &mut dyn FnMut(EventTime) -> bool| [at(-1), at(0), at(59), at(60)].map(job);
    let window = |range: Option<std::ops::Range<EventTime>>| {
        let stream = Stream::<EventTime>::new()
            .key_by(|_| "k")
            .event_time(|t| *t);
        let stream = match range {
            Some(r) => stream.valid_time_range(r),
            None => stream.valid_time_range(..),
        };
        let mut job = stream.session_windows(minutes(1)).build();
        run(&mut |t| {
            let (mut s, mut l): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
            job.push(t, &mut s, &mut l).expect("vectors")
                != sessionizer::windowed::Outcome::OutOfRange
        })
    };
    assert_eq!(window(Some(at(0)..at(60))), [false, true, true, false]);
    assert_eq!(window(None), [true; 4]);
}

/// Every record carries the watermark and processing time of its emission; the
/// sessions that `finish` emits carry the last real watermark, not +∞, and say they
/// came from the end of input.
#[test]
fn records_carry_the_watermark_and_processing_time_of_their_emission() {
    use sessionizer::windowed::{Emission, Trigger};
    let clock = ManualClock::new(ProcessingTime(1_000));
    let mut job = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .session_windows(minutes(10))
        .allowed_lateness(minutes(15))
        .clock(clock.clone())
        .build();
    let (mut out, mut late) = (Vec::new(), Vec::new());
    for e in [("k", at(0)), ("k", at(5)), ("j", at(3))] {
        job.push(e, &mut out, &mut late).expect("vectors");
    }
    assert!(out.is_empty());
    clock.advance(seconds(5));
    // W = 19 completes j [3] (close 13) and k [0, 5] (close 15).
    job.push(("k", at(20)), &mut out, &mut late)
        .expect("vectors");
    let fired = Emission {
        watermark: Watermark::at(at(19)),
        processing_time: ProcessingTime(6_000),
        trigger: Trigger::Watermark,
    };
    let emitted: Vec<(String, Emission)> = out
        .iter()
        .filter_map(WindowOutput::session)
        .map(|s| (s.key.clone(), s.emitted))
        .collect();
    assert_eq!(
        emitted,
        [("j".to_string(), fired), ("k".to_string(), fired)]
    );
    // A late event within the allowed lateness: the next revision at once, at the
    // watermark it was judged against.
    clock.advance(seconds(1));
    out.clear();
    job.push(("k", at(4)), &mut out, &mut late)
        .expect("vectors");
    let revision = out[0].session().expect("a session");
    assert_eq!(revision.revision, 1);
    assert_eq!(
        revision.emitted,
        Emission {
            watermark: Watermark::at(at(19)),
            processing_time: ProcessingTime(7_000),
            trigger: Trigger::Watermark,
        }
    );
    clock.advance(seconds(1));
    out.clear();
    job.finish(&mut out, &mut late).expect("vectors");
    let last = out[0].session().expect("a session");
    assert_eq!(last.start, at(20));
    assert_eq!(
        last.emitted,
        Emission {
            watermark: Watermark::at(at(19)),
            processing_time: ProcessingTime(8_000),
            trigger: Trigger::EndOfInput,
        },
        "the last real watermark, not +∞"
    );
    assert!(late.is_empty());
}

/// With `EmitMode::OnUpdate` a record of a session still open says so, with the
/// watermark after the event that changed it.
#[test]
fn update_records_carry_the_watermark_after_their_event() {
    use sessionizer::windowed::Trigger;
    let mut job = Stream::<EventTime>::new()
        .key_by(|_| "k")
        .event_time(|t| *t)
        .session_windows(minutes(10))
        .emit(EmitMode::OnUpdate)
        .clock(ManualClock::new(ProcessingTime(0)))
        .build();
    let (mut out, mut late) = (Vec::new(), Vec::<sessionizer::late::Late<EventTime>>::new());
    for t in [at(0), at(2)] {
        job.push(t, &mut out, &mut late).expect("vectors");
    }
    let seen: Vec<(bool, Trigger, Watermark)> = out
        .iter()
        .filter_map(WindowOutput::session)
        .map(|s| (s.complete, s.emitted.trigger, s.emitted.watermark))
        .collect();
    assert_eq!(
        seen,
        [
            (false, Trigger::Update, Watermark::at(at(0))),
            (false, Trigger::Update, Watermark::at(at(2))),
        ]
    );
}

/// Regression (issue 12): the value's fields went through a sorted JSON map, so a
/// struct's fields (and a nested object's) came out in alphabetical order.
#[test]
fn json_records_keep_the_fields_of_the_value_in_order_nested_objects_too() {
    #[derive(serde::Serialize)]
    struct Inner {
        z: u8,
        a: u8,
    }
    #[derive(serde::Serialize)]
    struct Out {
        zeta: u64,
        alpha: Inner,
        mid: Option<u8>,
    }
    struct Zeta;
    impl Aggregator<EventTime> for Zeta {
        type Acc = u64;
        type Output = Out;
        fn create(&self) -> u64 {
            0
        }
        fn add(&self, acc: &mut u64, _: &EventTime, _: Position) {
            *acc += 1;
        }
        fn merge(&self, acc: &mut u64, other: u64) {
            *acc += other;
        }
        fn finish(&self, acc: &u64) -> Out {
            Out {
                zeta: *acc,
                alpha: Inner { z: 1, a: 2 },
                mid: None,
            }
        }
    }
    let mut job = Stream::<EventTime>::new()
        .key_by(|_| "k")
        .event_time(|t| *t)
        .session_windows(minutes(10))
        .aggregate(Zeta)
        .build();
    let mut out = Vec::new();
    job.run([at(0)], &mut out, &mut Vec::new())
        .expect("vectors");
    let json = serde_json::to_string(&out[0]).expect("JSON");
    assert!(
        json.ends_with(r#""complete":true,"zeta":1,"alpha":{"z":1,"a":2},"mid":null}"#),
        "{json}"
    );
}

/// A tuple aggregate's elements become fields: named ones by their names, others `_1`,
/// `_2` by position; a plain value is one field `value`.
#[test]
fn a_tuple_aggregate_comes_out_as_named_fields() {
    type Page = (&'static str, EventTime);
    fn tail_of<A>(aggregate: A) -> String
    where
        A: Aggregator<Page>,
        A::Output: serde::Serialize,
    {
        let mut job = Stream::<Page>::new()
            .key_by(|_| "k")
            .event_time(|e| e.1)
            .session_windows(minutes(10))
            .aggregate(aggregate)
            .build();
        let mut out = Vec::new();
        job.run([("/1", at(0)), ("/2", at(1))], &mut out, &mut Vec::new())
            .expect("vectors");
        let json = serde_json::to_string(&out[0]).expect("JSON");
        json.split_once(r#""complete":true"#)
            .map(|(_, t)| t.to_string())
            .unwrap_or(json)
    }
    assert_eq!(
        tail_of((Count, Collect(|e: &Page| Some(e.0)))),
        r#","_1":2,"_2":["/1","/2"]}"#
    );
    assert_eq!(
        tail_of((
            Count.named("views"),
            Collect(|e: &Page| Some(e.0)).named("pages"),
            Last(|e: &Page| Some(e.0)),
        )),
        r#","views":2,"pages":["/1","/2"],"_3":"/2"}"#
    );
    assert_eq!(tail_of(Count), r#","value":2}"#);
    assert_eq!(tail_of(()), "}");
}

/// `EmitMode::Final`: each session once, when the watermark passes its close plus the
/// allowed lateness, with every event a late one brought (revision 0, no retraction);
/// `OnClose` emits the same session twice.
#[test]
fn final_emission_writes_each_session_once_when_it_can_no_longer_change() {
    let run = |mode: EmitMode| {
        let mut job = Stream::<(&str, EventTime)>::new()
            .key_by(|e| e.0)
            .event_time(|e| e.1)
            .session_windows(minutes(10))
            .allowed_lateness(minutes(15))
            .emit(mode)
            .aggregate(Count)
            .build();
        let mut out = Vec::new();
        // a@0 closes at 10; b@11 moves W past it; a@5 is late but within the
        // lateness (a's close is 15 now); b@40 moves W to 40, past a's close +
        // lateness (30) and b@11's (21 + 15 = 36).
        for e in [("a", at(0)), ("b", at(11)), ("a", at(5)), ("b", at(40))] {
            job.push(e, &mut out, &mut Vec::new()).expect("vectors");
        }
        let before_end = out.len();
        job.finish(&mut out, &mut Vec::new()).expect("vectors");
        let records: Vec<(String, u64, u32)> = out
            .iter()
            .map(|r: &WindowOutput<u64>| {
                let s = r.session().expect("no retraction");
                (s.key.clone(), s.event_count, s.revision)
            })
            .collect();
        (records, before_end)
    };
    let (on_close, _) = run(EmitMode::OnClose);
    assert_eq!(on_close.len(), 4, "{on_close:?}"); // a twice, b@11, b@40
    let (fin, before_end) = run(EmitMode::Final);
    assert_eq!(
        before_end, 2,
        "a and b@11 were final before the end: {fin:?}"
    );
    assert_eq!(fin[0].0, "a");
    assert_eq!((fin[0].1, fin[0].2), (2, 0), "both events, revision 0");
    assert_eq!(fin.len(), 3);
    assert!(fin.iter().all(|r| r.2 == 0));
}
