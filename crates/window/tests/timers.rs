//! Registered timers (Flink's `KeyedProcessFunction` timers: several per key, kept
//! across calls until they fire or are deleted) and the state TTL of the stateful
//! operator (`sessionizer_window::stateful`), by hand-worked cases and by a property
//! test against a naive model that rescans every key at every batch end.

use proptest::prelude::*;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::stateful::{GroupState, StatefulOperator, TimeoutKind, Timer};
use sessionizer_window::{BoundedOutOfOrderness, ManualClock, ProcessingTime};
use std::collections::{BTreeMap, BTreeSet};

/// What an event asks the function to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Register an event-time timer at this time.
    Register(i64),
    /// Delete the event-time timer at this time.
    Delete(i64),
    /// Register a processing-time timer at this clock time.
    RegisterProc(i64),
    /// Write the state (a count of writes).
    Write,
    /// Remove the state.
    Remove,
}

type Op = StatefulOperator<Act, u32, BoundedOutOfOrderness, ManualClock>;

fn op(clock: &ManualClock) -> Op {
    StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(0)), clock.clone())
}

/// One call as seen by the function: key, the fired timer (if any), the watermark, and
/// the state it found.
type Seen = (String, Option<Timer>, Watermark, Option<u32>);

/// A function that does what each event says and records every call; a fired
/// event-time timer at `t` registers one more at `t + chain` when `chain > 0` (a timer
/// set from a timer call waits for the next batch end), and deletes the one at `t + 1`
/// when `chain` is odd (a timer deleted before its call does not fire, even when it
/// was due in the same round).
fn function(
    seen: &mut Vec<Seen>,
    chain: i64,
) -> impl FnMut(&str, Vec<Act>, &mut GroupState<'_, u32>) -> Option<()> + '_ {
    move |key, acts, state| {
        seen.push((
            key.to_string(),
            state.fired_timer(),
            state.current_watermark(),
            state.get().copied(),
        ));
        if let Some(Timer::EventTime(t)) = state.fired_timer() {
            if chain % 2 == 1 {
                state.delete_event_time_timer(EventTime(t.millis() + 1));
            }
            if chain > 0 && t.millis() < 1_000 {
                state.register_event_time_timer(EventTime(t.millis() + chain));
            }
        }
        for a in acts {
            match a {
                Act::Register(t) => state.register_event_time_timer(EventTime(t)),
                Act::Delete(t) => state.delete_event_time_timer(EventTime(t)),
                Act::RegisterProc(t) => state.register_processing_time_timer(ProcessingTime(t)),
                Act::Write => {
                    let n = state.get().copied().unwrap_or(0);
                    state.update(n + 1);
                }
                Act::Remove => {
                    state.remove();
                }
            }
        }
        None
    }
}

fn w(ms: i64) -> Watermark {
    Watermark::at(EventTime(ms))
}

fn push(op: &mut Op, key: &str, t: i64, act: Act) {
    assert!(
        op.push(key, EventTime(t), act).is_none(),
        "{key}@{t} is late"
    );
}

#[test]
fn a_key_holds_several_timers_across_calls_and_each_fires_once_in_its_own_call() {
    let clock = ManualClock::default();
    let mut op = op(&clock);
    let mut seen = Vec::new();
    let mut f = function(&mut seen, 0);
    // Batch 1: a registers 20 and 30, b registers 25, all at event time 10.
    push(&mut op, "a", 10, Act::Register(30));
    push(&mut op, "a", 10, Act::Register(20));
    push(&mut op, "a", 10, Act::Register(20)); // the same timer again: one timer
    push(&mut op, "b", 10, Act::Register(25));
    op.end_batch(&mut f, &mut |_: ()| {});
    // Batch 2: a's data call in between does not clear its timers (unlike a timeout).
    push(&mut op, "a", 12, Act::Write);
    op.end_batch(&mut f, &mut |_: ()| {});
    // Batch 3: the watermark goes to 40: a@20, b@25, a@30, in deadline order.
    push(&mut op, "c", 40, Act::Write);
    op.end_batch(&mut f, &mut |_: ()| {});
    drop(f);
    let fired: Vec<(String, Option<Timer>, Watermark)> = seen
        .iter()
        .filter(|s| s.1.is_some())
        .map(|s| (s.0.clone(), s.1, s.2))
        .collect();
    assert_eq!(
        fired,
        [
            ("a".into(), Some(Timer::EventTime(EventTime(20))), w(40)),
            ("b".into(), Some(Timer::EventTime(EventTime(25))), w(40)),
            ("a".into(), Some(Timer::EventTime(EventTime(30))), w(40)),
        ]
    );
    // a's state (written in batch 2) is seen by both its timer calls; b never had any.
    let a_states: Vec<Option<u32>> = seen
        .iter()
        .filter(|s| s.0 == "a" && s.1.is_some())
        .map(|s| s.3)
        .collect();
    assert_eq!(a_states, [Some(1), Some(1)]);
    // b has no state and no timer left: forgotten; a and c keep their state.
    assert_eq!(op.keys(), 2);
}

#[test]
fn a_deleted_timer_does_not_fire_and_the_kind_is_reported() {
    let clock = ManualClock::default();
    let mut op = op(&clock);
    let mut kinds = Vec::new();
    let mut f = |_: &str, acts: Vec<Act>, state: &mut GroupState<'_, u32>| {
        kinds.push((
            state.timed_out_by(),
            state.fired_timer(),
            state.timers().len(),
        ));
        for a in acts {
            match a {
                Act::Register(t) => state.register_event_time_timer(EventTime(t)),
                Act::Delete(t) => state.delete_event_time_timer(EventTime(t)),
                Act::RegisterProc(t) => state.register_processing_time_timer(ProcessingTime(t)),
                _ => {}
            }
        }
        None::<()>
    };
    push(&mut op, "k", 0, Act::Register(5));
    push(&mut op, "k", 0, Act::Register(6));
    push(&mut op, "k", 0, Act::RegisterProc(1_000));
    op.end_batch(&mut f, &mut |_| {});
    push(&mut op, "k", 1, Act::Delete(5));
    op.end_batch(&mut f, &mut |_| {});
    push(&mut op, "x", 10, Act::Write);
    op.end_batch(&mut f, &mut |_| {});
    clock.set(ProcessingTime(1_000));
    op.tick(&mut f, &mut |_| {});
    assert_eq!(
        kinds,
        [
            (None, None, 0),
            (None, None, 3),
            (None, None, 0), // x's data call
            (
                Some(TimeoutKind::EventTime),
                Some(Timer::EventTime(EventTime(6))),
                1 // the processing-time timer is still there
            ),
            (
                Some(TimeoutKind::ProcessingTime),
                Some(Timer::ProcessingTime(ProcessingTime(1_000))),
                0
            ),
        ]
    );
}

#[test]
fn state_expires_after_its_ttl_of_processing_time_since_the_last_write() {
    let clock = ManualClock::default();
    let mut op = op(&clock).with_state_ttl(DurationMs(100));
    let mut seen = Vec::new();
    let mut f = function(&mut seen, 0);
    push(&mut op, "a", 0, Act::Write); // written at 0: expires at 100
    push(&mut op, "b", 0, Act::Write);
    op.end_batch(&mut f, &mut |_: ()| {});
    clock.set(ProcessingTime(60));
    push(&mut op, "a", 1, Act::Write); // written again at 60: expires at 160
    op.end_batch(&mut f, &mut |_: ()| {});
    clock.set(ProcessingTime(120));
    op.tick(&mut f, &mut |_: ()| {}); // b expires (100 <= 120) without a call
    assert_eq!(op.state("a"), Some(&2));
    assert_eq!(op.state("b"), None);
    assert_eq!(op.keys(), 1, "b is forgotten");
    // A call that only reads does not extend the TTL; at 170 a's state is gone, and a
    // call made then does not see it.
    clock.set(ProcessingTime(150));
    push(&mut op, "a", 2, Act::Register(1_000)); // no write
    op.end_batch(&mut f, &mut |_: ()| {});
    clock.set(ProcessingTime(170));
    push(&mut op, "a", 3, Act::Write);
    op.end_batch(&mut f, &mut |_: ()| {});
    drop(f);
    let a: Vec<Option<u32>> = seen.iter().filter(|s| s.0 == "a").map(|s| s.3).collect();
    assert_eq!(a, [None, Some(1), Some(2), None]);
    assert_eq!(op.state("a"), Some(&1), "a fresh state after the expiry");
}

#[test]
fn timers_and_expiry_survive_a_snapshot_and_a_version_1_snapshot_still_restores() {
    let clock = ManualClock::default();
    let mut a = op(&clock).with_state_ttl(DurationMs(100));
    let mut seen = Vec::new();
    let mut f = function(&mut seen, 0);
    push(&mut a, "k", 0, Act::Register(50));
    push(&mut a, "k", 0, Act::RegisterProc(500));
    push(&mut a, "k", 0, Act::Write);
    a.end_batch(&mut f, &mut |_: ()| {});
    drop(f);
    let bytes = a.snapshot().expect("snapshot");
    let mut b = op(&clock).with_state_ttl(DurationMs(100));
    b.restore(&bytes).expect("restore");
    assert_eq!(b.snapshot().expect("again"), bytes, "the same state");
    let mut seen = Vec::new();
    let mut f = function(&mut seen, 0);
    push(&mut b, "z", 60, Act::Write);
    b.end_batch(&mut f, &mut |_: ()| {});
    clock.set(ProcessingTime(500));
    b.tick(&mut f, &mut |_: ()| {});
    drop(f);
    let fired: Vec<Option<Timer>> = seen.iter().filter(|s| s.0 == "k").map(|s| s.1).collect();
    assert_eq!(
        fired,
        [
            Some(Timer::EventTime(EventTime(50))),
            Some(Timer::ProcessingTime(ProcessingTime(500)))
        ]
    );
    // The state expired at 100 (before the processing-time timer's call at 500).
    let states: Vec<Option<u32>> = seen.iter().filter(|s| s.0 == "k").map(|s| s.3).collect();
    assert_eq!(states, [Some(1), None]);

    // Version 1 (no timers, no expiry): one key "v" with state 7 and an event-time
    // timeout at 9, written byte by byte as the layout says.
    let mut v1 = Vec::new();
    v1.extend_from_slice(b"SZKEYED\0");
    v1.extend_from_slice(&1u16.to_le_bytes());
    v1.extend_from_slice(&0u16.to_le_bytes());
    v1.extend_from_slice(&5i64.to_le_bytes()); // watermark
    v1.extend_from_slice(&3u64.to_le_bytes()); // batches
    v1.extend_from_slice(&1u64.to_le_bytes()); // keys
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.push(b'v');
    v1.push(0b011);
    v1.extend_from_slice(&9i64.to_le_bytes());
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.push(b'7');
    let sum = xxhash_rust::xxh3::xxh3_64(&v1);
    v1.extend_from_slice(&sum.to_le_bytes());
    let mut c = op(&clock);
    c.restore(&v1).expect("a version 1 snapshot restores");
    assert_eq!(c.state("v"), Some(&7));
    assert_eq!(c.watermark(), w(5));
}

/// The naive model: every key's timers in a set, every batch end scans them all.
#[derive(Default)]
struct Model {
    timers: BTreeMap<String, BTreeSet<i64>>,
    state: BTreeMap<String, u32>,
    max_t: Option<i64>,
    w: Option<i64>,
}

impl Model {
    /// One batch of (key, time, act): data calls (keys by first appearance), the
    /// watermark step, then every due timer in (deadline, key) order; a timer fired at
    /// `t` deletes `t + 1` when `chain` is odd and, below 1000, registers `t + chain`,
    /// which waits for the next batch end.
    fn batch(&mut self, events: &[(String, i64, Act)], chain: i64, out: &mut Vec<Seen>) {
        let watermark = |w: Option<i64>| w.map_or(Watermark::MIN, |w| Watermark::at(EventTime(w)));
        let mut order: Vec<String> = Vec::new();
        for (k, t, _) in events {
            if !order.contains(k) {
                order.push(k.clone());
            }
            self.max_t = Some(self.max_t.map_or(*t, |m| m.max(*t)));
        }
        for k in &order {
            out.push((
                k.clone(),
                None,
                watermark(self.w),
                self.state.get(k).copied(),
            ));
            for (_, _, a) in events.iter().filter(|e| &e.0 == k) {
                match *a {
                    Act::Register(t) => {
                        self.timers.entry(k.clone()).or_default().insert(t);
                    }
                    Act::Delete(t) => {
                        self.timers.entry(k.clone()).or_default().remove(&t);
                    }
                    Act::RegisterProc(_) => unreachable!("event-time model"),
                    Act::Write => *self.state.entry(k.clone()).or_default() += 1,
                    Act::Remove => {
                        self.state.remove(k);
                    }
                }
            }
        }
        self.w = self.max_t.max(self.w);
        let Some(w) = self.w else { return };
        let mut due: Vec<(i64, String)> = Vec::new();
        for (k, ts) in &self.timers {
            due.extend(ts.iter().filter(|&&t| t <= w).map(|&t| (t, k.clone())));
        }
        due.sort();
        for (t, k) in due {
            if !self.timers.get_mut(&k).expect("key").remove(&t) {
                continue; // deleted by an earlier call of this round
            }
            if chain % 2 == 1 {
                self.timers.get_mut(&k).expect("key").remove(&(t + 1));
            }
            out.push((
                k.clone(),
                Some(Timer::EventTime(EventTime(t))),
                watermark(self.w),
                self.state.get(&k).copied(),
            ));
            if chain > 0 && t < 1_000 {
                self.timers.entry(k).or_default().insert(t + chain);
            }
        }
    }
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        (0i64..60).prop_map(Act::Register),
        (0i64..60).prop_map(Act::Delete),
        Just(Act::Write),
        Just(Act::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random batches of register / delete / write / remove over a few keys: the
    /// operator's calls (key, fired timer, watermark, state seen) equal the model's.
    #[test]
    fn registered_timers_fire_as_a_naive_rescan_of_every_key_says(
        batches in prop::collection::vec(
            prop::collection::vec((0usize..4, 0i64..50, act()), 0..8),
            1..12,
        ),
        chain in 0i64..15,
    ) {
        let keys = ["a", "b", "c", "d"];
        let clock = ManualClock::default();
        let mut op = op(&clock);
        let mut got = Vec::new();
        let mut want = Vec::new();
        let mut model = Model::default();
        for batch in &batches {
            let events: Vec<(String, i64, Act)> = batch
                .iter()
                .map(|&(k, t, a)| (keys[k].to_string(), t, a))
                .collect();
            // The operator drops events at or behind the batch's watermark: so does
            // the model (only events after it are pushed).
            let w = op.watermark();
            let events: Vec<_> = events
                .into_iter()
                .filter(|e| !w.has_reached(EventTime(e.1)))
                .collect();
            let mut f = function(&mut got, chain);
            for (k, t, a) in &events {
                push(&mut op, k, *t, *a);
            }
            op.end_batch(&mut f, &mut |_: ()| {});
            drop(f);
            model.batch(&events, chain, &mut want);
        }
        prop_assert_eq!(got, want);
    }
}
