//! The stateful operator's rules (docs/library.md, `sessionizer_window::stateful`):
//! batching, the watermark a call sees, event-time and processing-time timeouts (the
//! latter on a manual clock, no sleeps), late events, and snapshot / restore.

use serde::{Deserialize, Serialize};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::stateful::{
    BatchRules, GroupState, LatePolicy, SNAPSHOT_VERSION, SnapshotError, StatefulOperator,
    TimeoutKind,
};
use sessionizer_window::{BoundedOutOfOrderness, ManualClock, ProcessingTime};

/// What one call saw.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    key: String,
    events: Vec<i64>,
    timed_out: Option<TimeoutKind>,
    watermark: Watermark,
    existed: bool,
}

type Op = StatefulOperator<i64, u32, BoundedOutOfOrderness, ManualClock>;

fn op(delay: i64, clock: &ManualClock) -> Op {
    StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(delay)), clock.clone())
}

fn w(ms: i64) -> Watermark {
    Watermark::at(EventTime(ms))
}

/// A function that records its calls and keeps a count per key, with an event-time
/// timeout `gap` after the call's last event (or none when `gap` is `None`).
fn recorder(
    calls: &mut Vec<Call>,
    gap: Option<i64>,
) -> impl FnMut(&str, Vec<i64>, &mut GroupState<'_, u32>) -> Option<String> + '_ {
    move |key, events, state| {
        calls.push(Call {
            key: key.to_string(),
            events: events.clone(),
            timed_out: state.timed_out_by(),
            watermark: state.current_watermark(),
            existed: state.exists(),
        });
        if state.has_timed_out() {
            return state.remove().map(|n| format!("{key}:{n}"));
        }
        let n = state.get().copied().unwrap_or(0) + events.len() as u32;
        state.update(n);
        if let (Some(g), Some(last)) = (gap, events.iter().max()) {
            state.set_timeout_timestamp(EventTime(last + g));
        }
        None
    }
}

fn push_all(op: &mut Op, events: &[(&str, i64)]) {
    for &(k, t) in events {
        assert!(op.push(k, EventTime(t), t).is_none(), "{k}@{t} is not late");
    }
}

#[test]
fn a_batch_calls_each_key_once_in_order_of_first_appearance_with_its_events_in_input_order() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut calls = Vec::new();
    let mut f = recorder(&mut calls, None);
    push_all(&mut op, &[("b", 5), ("a", 9), ("b", 3), ("c", 1), ("a", 2)]);
    op.end_batch(&mut f, &mut |_| {});
    drop(f);
    let seen: Vec<(&str, Vec<i64>)> = calls
        .iter()
        .map(|c| (c.key.as_str(), c.events.clone()))
        .collect();
    assert_eq!(seen, [("b", vec![5, 3]), ("a", vec![9, 2]), ("c", vec![1])]);
    assert!(
        calls
            .iter()
            .all(|c| c.watermark == Watermark::MIN && c.timed_out.is_none())
    );
    assert_eq!(
        op.watermark(),
        w(9),
        "the batch's event times move the watermark"
    );
}

#[test]
fn a_call_sees_the_watermark_computed_at_the_end_of_the_previous_batch() {
    let clock = ManualClock::default();
    let mut op = op(10, &clock);
    let mut calls = Vec::new();
    let mut f = recorder(&mut calls, None);
    push_all(&mut op, &[("a", 100)]);
    op.end_batch(&mut f, &mut |_| {});
    push_all(&mut op, &[("a", 200), ("a", 300)]);
    op.end_batch(&mut f, &mut |_| {});
    push_all(&mut op, &[("a", 295)]);
    op.end_batch(&mut f, &mut |_| {});
    drop(f);
    let marks: Vec<Watermark> = calls.iter().map(|c| c.watermark).collect();
    assert_eq!(marks, [Watermark::MIN, w(90), w(290)]);
}

#[test]
fn an_event_time_timeout_fires_once_at_the_end_of_the_batch_whose_watermark_reaches_it() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut calls = Vec::new();
    let mut out = Vec::new();
    let mut f = recorder(&mut calls, Some(10));
    push_all(&mut op, &[("a", 0)]); // timeout 10
    op.end_batch(&mut f, &mut |o| out.push(o));
    push_all(&mut op, &[("b", 9)]); // W' = 9: not yet
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert!(out.is_empty());
    push_all(&mut op, &[("b", 10)]); // W' = 10 reaches 10 (inclusive)
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a:1"]);
    op.tick(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a:1"], "fired once");
    drop(f);
    let last = calls.iter().rfind(|c| c.key == "a").expect("a was called");
    assert_eq!(last.timed_out, Some(TimeoutKind::EventTime));
    assert_eq!(
        last.watermark,
        w(10),
        "a timeout call sees the new watermark"
    );
    assert!(last.events.is_empty());
}

#[test]
fn with_sparks_rules_a_timeout_fires_in_the_next_batch_after_its_data_calls() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock).with_batch_rules(BatchRules::Spark);
    let mut calls = Vec::new();
    let mut out = Vec::new();
    let mut f = recorder(&mut calls, Some(10));
    push_all(&mut op, &[("a", 0), ("b", 0)]); // timeouts 10
    op.end_batch(&mut f, &mut |o| out.push(o));
    push_all(&mut op, &[("c", 10)]); // W' = 10: due, but checked against W = 0
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert!(out.is_empty(), "not in the batch whose events made it due");
    // The next batch: b's events come first (its data call, no timeout call), then a's
    // timeout fires at the batch's own watermark, 10.
    push_all(&mut op, &[("b", 11)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a:1"]);
    // The end of the input: the no-data batch (c's timeout 20 is not due at W = 11), then
    // +inf fires the rest.
    op.finish(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a:1", "c:1", "b:2"]);
    drop(f);
    let a = calls.iter().find(|c| c.key == "a" && c.timed_out.is_some());
    let a = a.expect("a timed out");
    assert_eq!(a.timed_out, Some(TimeoutKind::EventTime));
    assert_eq!(a.watermark, w(10), "the batch's own watermark");
    let b: Vec<_> = calls.iter().filter(|c| c.key == "b").collect();
    assert_eq!(b.len(), 3, "b's second batch was a data call: {b:?}");
    assert!(b[1].existed && b[1].timed_out.is_none() && b[1].events == [11]);
}

#[test]
fn with_sparks_rules_an_event_is_late_only_behind_the_previous_batchs_watermark() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock).with_batch_rules(BatchRules::Spark);
    let mut calls = Vec::new();
    let mut f = recorder(&mut calls, None);
    push_all(&mut op, &[("a", 0)]);
    op.end_batch(&mut f, &mut |_| {}); // W: 0
    push_all(&mut op, &[("a", 100)]); // the batch's W is 0, the previous batch's unset
    op.end_batch(&mut f, &mut |_| {}); // W: 100, late by 0
    assert_eq!((op.watermark(), op.late_watermark()), (w(100), w(0)));
    assert!(
        op.push("a", EventTime(50), 50).is_none(),
        "behind W, not behind the last W"
    );
    let late = op
        .push("a", EventTime(0), 0)
        .expect("at the previous batch's watermark");
    assert_eq!(late.watermark, w(0));
    op.end_batch(&mut f, &mut |_| {});
    assert_eq!(op.late_watermark(), w(100));
    drop(f);
    assert_eq!(calls.last().map(|c| c.events.clone()), Some(vec![50]));
    // The standard rules judge by the batch's own watermark.
    let mut standard = op_at(100, &clock);
    assert!(standard.push("a", EventTime(50), 50).is_some());
}

fn op_at(watermark: i64, clock: &ManualClock) -> Op {
    let mut op = op(0, clock);
    assert!(op.push("z", EventTime(watermark), watermark).is_none());
    op.end_batch(
        &mut |_: &str, _: Vec<i64>, _: &mut GroupState<'_, u32>| None::<String>,
        &mut |_| {},
    );
    op
}

#[test]
fn with_sparks_rules_finish_runs_a_no_data_batch_before_infinity() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock).with_batch_rules(BatchRules::Spark);
    let mut calls = Vec::new();
    let mut f = recorder(&mut calls, Some(10));
    push_all(&mut op, &[("a", 0)]);
    op.end_batch(&mut f, &mut |_| {});
    push_all(&mut op, &[("b", 100)]);
    op.finish(&mut f, &mut |_| {});
    drop(f);
    let fired: Vec<(&str, Watermark)> = calls
        .iter()
        .filter(|c| c.timed_out.is_some())
        .map(|c| (c.key.as_str(), c.watermark))
        .collect();
    // a is due at W = 100 (the no-data batch); b only at +inf, where a call sees the
    // no-data batch's watermark (Spark's never reaches +inf).
    assert_eq!(fired, [("a", w(100)), ("b", w(100))]);
}

#[test]
fn new_events_reset_the_timeout_before_it_fires() {
    // Spark's rule: a timeout lasts until the key's next call. a's timeout (10) is passed
    // by the watermark of the batch that brings a's next event (W' = 30), but the data
    // call comes first and sets a new one (40).
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut calls = Vec::new();
    let mut out = Vec::new();
    let mut f = recorder(&mut calls, Some(10));
    push_all(&mut op, &[("a", 0)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    push_all(&mut op, &[("a", 30)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert!(out.is_empty(), "{out:?}");
    op.finish(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a:2"]);
}

#[test]
fn a_call_that_sets_no_timeout_clears_the_previous_one() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut out = Vec::new();
    let mut first = true;
    let mut f = |_: &str, _: Vec<i64>, s: &mut GroupState<'_, u32>| {
        if s.has_timed_out() {
            return Some("timed out");
        }
        s.update(1);
        if first {
            s.set_timeout_timestamp(EventTime(5));
            first = false;
        }
        None
    };
    push_all(&mut op, &[("a", 0)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    push_all(&mut op, &[("a", 1)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    op.finish(&mut f, &mut |o| out.push(o));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(op.keys(), 1, "the state stays (no timeout, not removed)");
}

#[test]
fn a_processing_time_timeout_fires_when_the_manual_clock_reaches_it() {
    let clock = ManualClock::new(ProcessingTime(1_000));
    let mut op = op(0, &clock);
    let mut out = Vec::new();
    let mut timed_out_by = Vec::new();
    let mut f = |key: &str, events: Vec<i64>, s: &mut GroupState<'_, u32>| {
        if s.has_timed_out() {
            timed_out_by.push((s.timed_out_by(), s.current_processing_time()));
            return s.remove().map(|n| format!("{key}:{n}"));
        }
        let n = s.get().copied().unwrap_or(0) + events.len() as u32;
        s.update(n);
        s.set_timeout_duration(DurationMs(30_000));
        None
    };
    push_all(&mut op, &[("a", 0), ("a", 1)]); // the batch opens at 1 000: deadline 31 000
    op.end_batch(&mut f, &mut |o| out.push(o));
    clock.advance(DurationMs(29_999));
    op.tick(&mut f, &mut |o| out.push(o));
    assert!(out.is_empty(), "not due at 30 999");
    clock.advance(DurationMs(1));
    op.tick(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a:2"]);
    assert_eq!(
        timed_out_by,
        [(Some(TimeoutKind::ProcessingTime), ProcessingTime(31_000))]
    );
    assert_eq!(op.keys(), 0);
}

#[test]
fn new_events_postpone_a_processing_time_timeout() {
    let clock = ManualClock::new(ProcessingTime(0));
    let mut op = op(0, &clock);
    let mut out = Vec::new();
    let mut f = |key: &str, _: Vec<i64>, s: &mut GroupState<'_, u32>| {
        if s.has_timed_out() {
            return Some(format!(
                "{key} idle at {}",
                s.current_processing_time().millis()
            ));
        }
        s.update(0);
        s.set_timeout_duration(DurationMs(10));
        None
    };
    push_all(&mut op, &[("a", 0)]); // deadline 10
    op.end_batch(&mut f, &mut |o| out.push(o));
    clock.set(ProcessingTime(8));
    push_all(&mut op, &[("a", 1)]); // deadline 18
    op.end_batch(&mut f, &mut |o| out.push(o));
    clock.set(ProcessingTime(12));
    op.tick(&mut f, &mut |o| out.push(o));
    assert!(out.is_empty(), "the first deadline was replaced: {out:?}");
    clock.set(ProcessingTime(18));
    op.tick(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["a idle at 18"]);
}

#[test]
fn a_key_due_by_both_timeouts_is_called_once() {
    let clock = ManualClock::new(ProcessingTime(0));
    let mut op = op(0, &clock);
    let mut calls = 0;
    let mut f = |key: &str, _: Vec<i64>, s: &mut GroupState<'_, u32>| {
        if s.has_timed_out() {
            calls += 1;
            return s.timed_out_by();
        }
        s.update(0);
        if key == "a" {
            s.set_timeout_timestamp(EventTime(5));
            s.set_timeout_duration(DurationMs(5));
        }
        None
    };
    let mut out = Vec::new();
    push_all(&mut op, &[("a", 0)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    clock.set(ProcessingTime(100));
    push_all(&mut op, &[("b", 100)]); // W' = 100 and the clock at 100: both due for a
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert_eq!(calls, 1);
    assert_eq!(out, [TimeoutKind::EventTime]);
}

#[test]
fn timeouts_fire_in_deadline_then_key_order_event_time_first() {
    let clock = ManualClock::new(ProcessingTime(0));
    let mut op = op(0, &clock);
    let mut out = Vec::new();
    let mut f = |key: &str, events: Vec<i64>, s: &mut GroupState<'_, u32>| {
        if s.has_timed_out() {
            return Some(key.to_string());
        }
        s.update(0);
        match key {
            "p" => s.set_timeout_duration(DurationMs(1)),
            _ => s.set_timeout_timestamp(EventTime(events[0] + 10)),
        }
        None
    };
    push_all(&mut op, &[("p", 0), ("z", 0), ("y", 5), ("x", 0)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    clock.set(ProcessingTime(50));
    push_all(&mut op, &[("q", 100)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert_eq!(out, ["x", "z", "y", "p"]);
}

#[test]
fn a_timeout_set_in_a_timeout_call_waits_for_the_next_batch_end() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut fired = 0;
    let mut f = |key: &str, _: Vec<i64>, s: &mut GroupState<'_, u32>| -> Option<()> {
        if s.has_timed_out() {
            fired += 1;
            // Already behind the watermark: due again, but not in this same step.
            s.set_timeout_timestamp(EventTime(0));
            return None;
        }
        s.update(0);
        if key == "a" {
            s.set_timeout_timestamp(EventTime(1));
        }
        None
    };
    push_all(&mut op, &[("a", 0), ("b", 50)]);
    op.end_batch(&mut f, &mut |_| {});
    op.tick(&mut f, &mut |_| {});
    assert_eq!(fired, 2, "once per batch end, no loop");
}

#[test]
fn late_events_are_handed_back_or_delivered_as_the_policy_says() {
    let clock = ManualClock::default();
    let mut drop_op = op(0, &clock);
    let mut calls = Vec::new();
    let mut f = recorder(&mut calls, None);
    push_all(&mut drop_op, &[("a", 100)]);
    drop_op.end_batch(&mut f, &mut |_| {});
    let late = drop_op
        .push("a", EventTime(100), 100)
        .expect("t <= W is late");
    assert_eq!((late.event, late.watermark), (100, w(100)));
    assert!(drop_op.push("a", EventTime(101), 101).is_none());
    drop_op.end_batch(&mut f, &mut |_| {});
    drop(f);
    assert_eq!(calls[1].events, [101]);

    let mut deliver_op = op(0, &clock).with_late_policy(LatePolicy::Deliver);
    let mut calls = Vec::new();
    let mut f = recorder(&mut calls, None);
    push_all(&mut deliver_op, &[("a", 100)]);
    deliver_op.end_batch(&mut f, &mut |_| {});
    push_all(&mut deliver_op, &[("a", 50)]);
    deliver_op.end_batch(&mut f, &mut |_| {});
    drop(f);
    assert_eq!(calls[1].events, [50]);
    assert_eq!(
        calls[1].watermark,
        w(100),
        "the function can tell it is behind"
    );
}

#[test]
fn a_key_with_a_timeout_but_no_state_is_kept_and_called_with_exists_false() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut calls = Vec::new();
    let mut f = |_: &str, _: Vec<i64>, s: &mut GroupState<'_, u32>| -> Option<()> {
        calls.push((s.has_timed_out(), s.exists()));
        if !s.has_timed_out() {
            s.set_timeout_timestamp(EventTime(10));
        }
        None
    };
    push_all(&mut op, &[("a", 0)]);
    op.end_batch(&mut f, &mut |_| {});
    assert_eq!(op.keys(), 1);
    op.finish(&mut f, &mut |_| {});
    assert_eq!(calls, [(false, false), (true, false)]);
    assert_eq!(
        op.keys(),
        0,
        "forgotten once it has neither state nor timeout"
    );
}

// ---------------------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------------------

/// A user state with the kinds of fields users keep: strings, lists, maps, options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Visit {
    user: String,
    pages: Vec<(i64, String)>,
    tags: std::collections::BTreeMap<String, u32>,
    referrer: Option<String>,
    score: f64,
}

type VisitOp = StatefulOperator<(i64, String), Visit, BoundedOutOfOrderness, ManualClock>;

fn visit_fn(
    key: &str,
    events: Vec<(i64, String)>,
    s: &mut GroupState<'_, Visit>,
) -> Option<String> {
    if s.has_timed_out() {
        let v = s.remove()?;
        return Some(format!(
            "{key} {:?} {:?} {:?}",
            v.pages,
            v.tags,
            s.timed_out_by()
        ));
    }
    let mut v = s.remove().unwrap_or(Visit {
        user: format!("user of {key}"),
        pages: Vec::new(),
        tags: Default::default(),
        referrer: None,
        score: 0.5,
    });
    for (t, page) in events {
        *v.tags.entry(page.clone()).or_default() += 1;
        v.pages.push((t, page));
        v.score += 0.25;
    }
    let last = v.pages.iter().map(|p| p.0).max().unwrap_or(0);
    if key.starts_with('p') {
        s.set_timeout_duration(DurationMs(1_000));
    } else {
        s.set_timeout_timestamp(EventTime(last + 100));
    }
    s.update(v);
    None
}

fn batches() -> Vec<Vec<(&'static str, i64, &'static str)>> {
    vec![
        vec![("a", 10, "/home"), ("p1", 12, "/x"), ("b", 11, "/home")],
        vec![("a", 60, "/cart"), ("b\u{e9}", 70, "/\"quoted\"")],
        vec![("c", 150, "/home"), ("p1", 151, "/y")],
        vec![("b", 400, "/late-ish")],
        vec![("d", 500, "/home")],
    ]
}

/// Runs batches `from..` on `op`, advancing the clock 700 ms per batch (p1's
/// processing-time timeout, 1 s after its last batch, fires in the last batch).
fn drive(op: &mut VisitOp, clock: &ManualClock, from: usize, out: &mut Vec<String>) {
    for batch in &batches()[from..] {
        clock.advance(DurationMs(700));
        for &(k, t, p) in batch {
            if let Some(l) = op.push(k, EventTime(t), (t, p.to_string())) {
                out.push(format!("late {k}@{}", l.time.millis()));
            }
        }
        op.end_batch(&mut visit_fn, &mut |o| out.push(o));
    }
    op.finish(&mut visit_fn, &mut |o| out.push(o));
}

#[test]
fn user_state_and_timeouts_survive_a_snapshot_and_restore_at_every_batch_boundary() {
    let clock = ManualClock::new(ProcessingTime(0));
    let mut whole: VisitOp =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
    let mut expected = Vec::new();
    drive(&mut whole, &clock, 0, &mut expected);
    assert!(
        expected.iter().any(|o| o.contains("ProcessingTime")),
        "{expected:?}"
    );
    assert!(
        expected.iter().any(|o| o.contains("EventTime")),
        "{expected:?}"
    );

    for cut in 1..batches().len() {
        let clock = ManualClock::new(ProcessingTime(0));
        let mut first: VisitOp =
            StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
        let mut got = Vec::new();
        for batch in &batches()[..cut] {
            clock.advance(DurationMs(700));
            for &(k, t, p) in batch {
                if let Some(l) = first.push(k, EventTime(t), (t, p.to_string())) {
                    got.push(format!("late {k}@{}", l.time.millis()));
                }
            }
            first.end_batch(&mut visit_fn, &mut |o| got.push(o));
        }
        let bytes = first.snapshot().expect("snapshot");
        assert_eq!(
            bytes,
            first.snapshot().expect("snapshot"),
            "deterministic bytes"
        );

        // A new operator, as after a restart: only the bytes carry over.
        let mut second: VisitOp =
            StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
        second.restore(&bytes).expect("restore");
        assert_eq!(second.watermark(), first.watermark());
        assert_eq!(second.batches(), first.batches());
        let mut states_before: Vec<(String, Visit)> = first
            .states()
            .map(|(k, v)| (k.into_owned(), v.clone()))
            .collect();
        let mut states_after: Vec<(String, Visit)> = second
            .states()
            .map(|(k, v)| (k.into_owned(), v.clone()))
            .collect();
        states_before.sort_by(|a, b| a.0.cmp(&b.0));
        states_after.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            states_after, states_before,
            "user state after restore at batch {cut}"
        );
        assert_eq!(
            second.snapshot().expect("snapshot"),
            bytes,
            "restore then snapshot is identity"
        );

        drive(&mut second, &clock, cut, &mut got);
        assert_eq!(got, expected, "output with a restore after batch {cut}");
    }
}

#[test]
fn a_restore_key_by_key_from_the_records_continues_as_the_uninterrupted_operator() {
    // What a Kafka task does: its changelog holds each key's record; a new owner puts
    // event time back, then the keys one by one.
    let clock = ManualClock::new(ProcessingTime(0));
    let mut whole: VisitOp =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
    let mut expected = Vec::new();
    drive(&mut whole, &clock, 0, &mut expected);
    for cut in 1..batches().len() {
        let clock = ManualClock::new(ProcessingTime(0));
        let mut first: VisitOp =
            StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
        first.track_changes(true);
        let mut got = Vec::new();
        let mut changelog = std::collections::BTreeMap::new();
        for batch in &batches()[..cut] {
            clock.advance(DurationMs(700));
            for &(k, t, p) in batch {
                assert!(first.push(k, EventTime(t), (t, p.to_string())).is_none());
            }
            first.end_batch(&mut visit_fn, &mut |o| got.push(o));
            // The changed keys of each batch, as a compacted changelog keeps them.
            first
                .encode_state(false, |k, r| {
                    changelog.insert(k.to_vec(), r.map(<[u8]>::to_vec));
                })
                .expect("changes");
        }
        // Every key's record, read without touching the tracked changes, is the
        // changelog's newest value of it.
        let mut records = std::collections::BTreeMap::new();
        first
            .for_each_key_record(|k, r| {
                records.insert(k.to_vec(), Some(r.to_vec()));
            })
            .expect("records");
        changelog.retain(|_, v| v.is_some());
        assert_eq!(records, changelog, "after batch {cut}");

        let mut second: VisitOp =
            StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
        second
            .restore_state(first.watermark(), 0, std::iter::empty())
            .expect("event time");
        for (k, r) in &changelog {
            second
                .restore_key(k, r.as_deref().expect("live"))
                .expect("a key");
        }
        assert_eq!(second.keys(), first.keys());
        drive(&mut second, &clock, cut, &mut got);
        assert_eq!(
            got, expected,
            "output with a key-by-key restore after batch {cut}"
        );
    }
    assert!(matches!(
        fresh().restore_key(b"k", &[0xff]),
        Err(SnapshotError::Truncated)
    ));
}

#[test]
fn advancing_the_watermark_without_events_fires_what_is_due_and_never_moves_it_back() {
    let clock = ManualClock::default();
    let mut op = op(0, &clock);
    let mut calls = Vec::new();
    let mut out: Vec<String> = Vec::new();
    let mut f = recorder(&mut calls, Some(10));
    push_all(&mut op, &[("a", 0), ("b", 50)]); // timeouts 10 and 60
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert_eq!(op.watermark(), w(50));
    // Behind the watermark: nothing moves, nothing fires.
    op.advance_to(w(20), &mut f, &mut |_, o| out.push(o));
    assert_eq!(op.watermark(), w(50));
    assert_eq!(
        out,
        ["a:1"],
        "a was due by 50 already, at the first batch end"
    );
    op.advance_to(w(59), &mut f, &mut |_, o| out.push(o));
    assert_eq!(out, ["a:1"]);
    op.advance_to(w(60), &mut f, &mut |o, item| {
        assert_eq!(o.key(), b"b");
        out.push(item)
    });
    assert_eq!(op.watermark(), w(60));
    assert_eq!(out, ["a:1", "b:1"]);
    // An event's own watermark step cannot take it back either.
    push_all(&mut op, &[("c", 61)]);
    op.end_batch(&mut f, &mut |o| out.push(o));
    assert_eq!(op.watermark(), w(61));
}

fn sample_snapshot() -> Vec<u8> {
    let clock = ManualClock::new(ProcessingTime(0));
    let mut op: VisitOp =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(5)), clock.clone());
    for &(k, t, p) in &batches()[0] {
        assert!(op.push(k, EventTime(t), (t, p.to_string())).is_none());
    }
    op.end_batch(&mut visit_fn, &mut |_| {});
    op.snapshot().expect("snapshot")
}

fn fresh() -> VisitOp {
    StatefulOperator::new(
        BoundedOutOfOrderness::new(DurationMs(5)),
        ManualClock::default(),
    )
}

#[test]
fn a_damaged_snapshot_is_refused_and_leaves_the_operator_unchanged() {
    let good = sample_snapshot();
    let mut op = fresh();

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    assert!(matches!(op.restore(&flipped), Err(SnapshotError::Checksum)));

    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert!(matches!(
        op.restore(&bad_magic),
        Err(SnapshotError::BadMagic)
    ));

    let mut future = good.clone();
    future[8..10].copy_from_slice(&(SNAPSHOT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        op.restore(&future),
        Err(SnapshotError::UnsupportedVersion(v)) if v == SNAPSHOT_VERSION + 1
    ));

    for len in [0, 5, 12, good.len() - 1] {
        assert!(
            op.restore(&good[..len]).is_err(),
            "a snapshot cut at {len} bytes"
        );
    }
    assert_eq!(op.keys(), 0, "nothing was half-restored");
    op.restore(&good).expect("the intact snapshot restores");
    assert_eq!(op.keys(), 3);
}

#[test]
fn restoring_into_a_changed_state_type_names_the_key_and_the_field() {
    #[derive(Debug, Serialize, Deserialize)]
    struct Renamed {
        visitor: String,
    }
    let good = sample_snapshot();
    let mut op: StatefulOperator<(i64, String), Renamed, BoundedOutOfOrderness, ManualClock> =
        StatefulOperator::new(
            BoundedOutOfOrderness::new(DurationMs(5)),
            ManualClock::default(),
        );
    let err = op.restore(&good).expect_err("the state type changed");
    let text = err.to_string();
    assert!(
        text.contains("\"a\"") && text.contains("missing field `visitor`"),
        "{text}"
    );
}

#[test]
fn no_snapshot_while_a_batch_is_open() {
    let mut op = fresh();
    assert!(op.push("a", EventTime(1), (1, "/".into())).is_none());
    assert!(matches!(op.snapshot(), Err(SnapshotError::BatchOpen)));
}
