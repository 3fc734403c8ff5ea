//! The stateful operator on a spill store (the seam of the `rocksdb` backend): with a
//! hot tier so small that keys are evicted at every batch end (all of them, or the
//! coldest few), the function is called exactly as on the memory backend — same keys, events, timers, timeouts, watermarks,
//! processing times and states seen, in the same order — and snapshots and incremental
//! changes are the same bytes. Random streams of every timer kind (timeouts on both
//! clocks, registered timers on both clocks, state TTL), on the in-memory
//! [`MapSpill`] and, with the feature, on RocksDB.

use proptest::prelude::*;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::spill::{MapSpill, SpillStore};
use sessionizer_window::stateful::{GroupState, KeyState, StatefulOperator, TimeoutKind, Timer};
use sessionizer_window::{BoundedOutOfOrderness, ManualClock, ProcessingTime};
use std::collections::BTreeMap;

/// What an event asks the function to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Register an event-time timer at this time.
    Register(i64),
    /// Delete the event-time timer at this time.
    Delete(i64),
    /// Register a processing-time timer this long after the batch's processing time.
    RegisterProc(i64),
    /// Set the event-time timeout at this time.
    TimeoutAt(i64),
    /// Set the processing-time timeout this long after the batch's processing time.
    TimeoutIn(i64),
    /// Write the state (a count of writes).
    Write,
    /// Remove the state.
    Remove,
}

type Op = StatefulOperator<Act, u32, BoundedOutOfOrderness, ManualClock>;

/// One call as the function saw it: key, events, how it was called, the watermark, the
/// processing time and the state it found.
type Seen = (
    String,
    Vec<Act>,
    Option<TimeoutKind>,
    Option<Timer>,
    Watermark,
    ProcessingTime,
    Option<u32>,
);

/// Does what each event says and records every call. A fired event-time timer at `t`
/// registers one at `t + 7` (below 200); a timeout call adds 100 to the state.
fn function(
    seen: &mut Vec<Seen>,
) -> impl FnMut(&str, Vec<Act>, &mut GroupState<'_, u32>) -> Vec<u32> + '_ {
    move |key, acts, state| {
        seen.push((
            key.to_string(),
            acts.clone(),
            state.timed_out_by(),
            state.fired_timer(),
            state.current_watermark(),
            state.current_processing_time(),
            state.get().copied(),
        ));
        let now = state.current_processing_time().0;
        if let Some(Timer::EventTime(t)) = state.fired_timer()
            && t.millis() < 200
        {
            state.register_event_time_timer(EventTime(t.millis() + 7));
        }
        if state.has_timed_out() && state.fired_timer().is_none() {
            let n = state.get().copied().unwrap_or(0);
            state.update(n + 100);
        }
        for a in acts {
            match a {
                Act::Register(t) => state.register_event_time_timer(EventTime(t)),
                Act::Delete(t) => state.delete_event_time_timer(EventTime(t)),
                Act::RegisterProc(d) => {
                    state.register_processing_time_timer(ProcessingTime(now + d))
                }
                Act::TimeoutAt(t) => state.set_timeout_timestamp(EventTime(t)),
                Act::TimeoutIn(d) => state.set_timeout_duration(DurationMs(d)),
                Act::Write => {
                    let n = state.get().copied().unwrap_or(0);
                    state.update(n + 1);
                }
                Act::Remove => {
                    state.remove();
                }
            }
        }
        state.get().copied().into_iter().collect()
    }
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        (0i64..120).prop_map(Act::Register),
        (0i64..120).prop_map(Act::Delete),
        (1i64..50).prop_map(Act::RegisterProc),
        (0i64..120).prop_map(Act::TimeoutAt),
        (1i64..50).prop_map(Act::TimeoutIn),
        Just(Act::Write),
        Just(Act::Write),
        Just(Act::Remove),
    ]
}

/// A batch of events (key index, time, act) and how far the clock moves before it.
type Batch = (Vec<(usize, i64, Act)>, i64);

const KEYS: [&str; 12] = [
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "a-key-longer-than-sixteen-bytes",
    "k",
    "l",
];

/// How a run checkpoints: a base every `base_every` batches (deltas between), and a
/// restore from its own snapshot after batch `restore_at`.
#[derive(Debug, Clone, Copy)]
struct Plan {
    hot_bytes: usize,
    base_every: usize,
    restore_at: Option<usize>,
}

/// Everything an operator did over `batches`: the calls, the outputs, the changes
/// each batch reported for an incremental checkpoint, and a snapshot at the end.
#[derive(Debug, PartialEq)]
struct Run {
    seen: Vec<Seen>,
    outputs: Vec<u32>,
    changes: Vec<BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    keys: Vec<usize>,
    snapshot: Vec<u8>,
}

fn run(
    batches: &[Batch],
    ttl: Option<i64>,
    plan: Plan,
    spill: Option<Box<dyn SpillStore<KeyState<u32>>>>,
) -> Run {
    let clock = ManualClock::default();
    let mut op: Op =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(3)), clock.clone());
    if let Some(ttl) = ttl {
        op = op.with_state_ttl(DurationMs(ttl));
    }
    if let Some(store) = spill {
        op.spill_to(store, plan.hot_bytes);
    }
    op.track_changes(true);
    let mut r = Run {
        seen: Vec::new(),
        outputs: Vec::new(),
        changes: Vec::new(),
        keys: Vec::new(),
        snapshot: Vec::new(),
    };
    for (b, (events, tick)) in batches.iter().enumerate() {
        clock.advance(DurationMs(*tick));
        let mut f = function(&mut r.seen);
        for &(k, t, a) in events {
            // Late events are handed back by both alike; they are not part of the check.
            let _ = op.push(KEYS[k], EventTime(t), a);
        }
        op.end_batch(&mut f, &mut |o| r.outputs.push(o));
        drop(f);
        let mut changes = BTreeMap::new();
        op.encode_state(b % plan.base_every == 0, |k, v| {
            changes.insert(k.to_vec(), v.map(<[u8]>::to_vec));
        })
        .expect("encodes");
        r.changes.push(changes);
        if plan.restore_at == Some(b) {
            let snapshot = op.snapshot().expect("snapshot");
            op.restore(&snapshot).expect("restore");
        }
        r.keys.push(op.keys());
        assert!(op.take_spill_error().is_none());
    }
    let mut f = function(&mut r.seen);
    op.finish(&mut f, &mut |o| r.outputs.push(o));
    drop(f);
    r.snapshot = op.snapshot().expect("snapshot");
    r
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        // Smaller than one key (every key evicted at every batch end), a few keys, most.
        prop_oneof![Just(1usize), Just(500), Just(1_500)],
        1usize..6,
        prop::option::of(0usize..14),
    )
        .prop_map(|(hot_bytes, base_every, restore_at)| Plan {
            hot_bytes,
            base_every,
            restore_at,
        })
}

fn batches() -> impl Strategy<Value = Vec<Batch>> {
    prop::collection::vec(
        (
            prop::collection::vec((0usize..KEYS.len(), 0i64..100, act()), 0..10),
            0i64..20,
        ),
        1..14,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_stateful_operator_on_a_spill_store_calls_the_function_as_one_in_memory(
        batches in batches(),
        ttl in prop::option::of(1i64..40),
        plan in plan(),
    ) {
        let memory = run(&batches, ttl, plan, None);
        let spilled = run(&batches, ttl, plan, Some(Box::new(MapSpill::default())));
        prop_assert_eq!(&spilled, &memory);
    }
}

#[cfg(feature = "rocksdb")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_stateful_operator_on_rocksdb_calls_the_function_as_one_in_memory(
        batches in batches(),
        ttl in prop::option::of(1i64..40),
        plan in plan(),
    ) {
        use sessionizer_window::spill::{RocksMemory, RocksSpill};
        use sessionizer_window::stateful::KeyRecordCodec;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RocksSpill::open_with(
            &dir.path().join("spill"),
            Box::new(KeyRecordCodec::<u32>::default()),
            &RocksMemory::new(8 << 20),
        )
        .expect("opens");
        let memory = run(&batches, ttl, plan, None);
        let spilled = run(&batches, ttl, plan, Some(Box::new(store)));
        prop_assert_eq!(&spilled, &memory);
    }
}

/// Keys really leave memory and come back: a spilled key's state is seen by
/// `with_state`, not by `state`, and an event brings it back.
#[test]
fn spilled_keys_are_seen_by_with_state_and_come_back_on_an_event() {
    let clock = ManualClock::default();
    let mut op: Op =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(3)), clock.clone());
    op.spill_to(Box::new(MapSpill::default()), 1);
    let mut seen = Vec::new();
    let mut f = function(&mut seen);
    for (k, t) in [("a", 1), ("b", 2), ("a", 3)] {
        assert!(op.push(k, EventTime(t), Act::Write).is_none());
    }
    op.end_batch(&mut f, &mut |_| {});
    let counts = op.spill_counts().expect("a spill store");
    assert_eq!(counts.keys, 2, "both keys evicted at the batch end");
    assert_eq!(op.keys(), 2);
    assert_eq!(op.state("a"), None, "not in memory");
    assert_eq!(op.with_state("a", |s| s.copied()).unwrap(), Some(2));
    assert_eq!(op.with_state("zz", |s| s.copied()).unwrap(), None);
    assert!(op.push("a", EventTime(10), Act::Write).is_none());
    assert_eq!(op.state("a"), Some(&2), "taken back by its event");
    op.end_batch(&mut f, &mut |_| {});
    drop(f);
    assert_eq!(seen.last().map(|s| s.6), Some(Some(2)));
    assert_eq!(op.with_state("a", |s| s.copied()).unwrap(), Some(3));
    assert!(op.spill_counts().unwrap().unspilled >= 1);
}

/// A restore onto a spill store evicts as it goes, and a snapshot of it is the same
/// bytes as one in memory.
#[test]
fn a_restore_fills_the_spill_store_and_snapshots_alike() {
    let clock = ManualClock::default();
    let mut mem: Op =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(3)), clock.clone());
    let mut seen = Vec::new();
    let mut f = function(&mut seen);
    for (i, k) in KEYS.iter().enumerate() {
        assert!(mem.push(k, EventTime(i as i64), Act::Write).is_none());
        assert!(
            mem.push(k, EventTime(i as i64), Act::Register(50 + i as i64))
                .is_none()
        );
    }
    mem.end_batch(&mut f, &mut |_| {});
    drop(f);
    let bytes = mem.snapshot().unwrap();

    let mut spilled: Op =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(3)), clock.clone());
    spilled.spill_to(Box::new(MapSpill::default()), 1);
    spilled.restore(&bytes).unwrap();
    assert_eq!(spilled.keys(), KEYS.len());
    assert!(spilled.spill_counts().unwrap().keys >= KEYS.len() - 1);
    assert_eq!(spilled.snapshot().unwrap(), bytes);
    // A restore replaces what the spill store held.
    spilled.restore(&bytes).unwrap();
    assert_eq!(spilled.keys(), KEYS.len());
    assert_eq!(spilled.snapshot().unwrap(), bytes);

    // Both fire the same timers at the end.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    mem.finish(&mut function(&mut a), &mut |_| {});
    spilled.finish(&mut function(&mut b), &mut |_| {});
    assert_eq!(a, b);
    // One round at the end: the timers the calls register wait for a next batch end.
    assert_eq!(a.len(), KEYS.len(), "every key's timer fired");
}

/// A state its JSON writer refuses (a map with non-string keys) cannot be evicted: the
/// operator reports it, naming the key, and makes no more calls while it is pending.
#[cfg(feature = "rocksdb")]
#[test]
fn a_state_that_cannot_be_written_stops_the_operator_with_its_key() {
    use sessionizer_window::spill::{RocksMemory, RocksSpill, SpillError};
    use sessionizer_window::stateful::KeyRecordCodec;
    type Pairs = BTreeMap<(u32, u32), u32>;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RocksSpill::open_with(
        &dir.path().join("spill"),
        Box::new(KeyRecordCodec::<Pairs>::default()),
        &RocksMemory::new(8 << 20),
    )
    .expect("opens");
    let clock = ManualClock::default();
    let mut op: StatefulOperator<u32, Pairs, _, _> =
        StatefulOperator::new(BoundedOutOfOrderness::new(DurationMs(3)), clock.clone());
    op.spill_to(Box::new(store), 1);
    let calls = std::cell::Cell::new(0);
    let mut f = |_: &str, evs: Vec<u32>, s: &mut GroupState<'_, Pairs>| {
        calls.set(calls.get() + 1);
        let mut m = s.get().cloned().unwrap_or_default();
        for e in evs {
            m.insert((e, e), e);
        }
        s.update(m);
        None::<()>
    };
    assert!(op.push("ann", EventTime(1), 1).is_none());
    op.end_batch(&mut f, &mut |_| {});
    assert_eq!(calls.get(), 1);
    // While the error is pending no call is made: the caller stops with it.
    assert!(op.push("bob", EventTime(2), 2).is_none());
    op.end_batch(&mut f, &mut |_| {});
    assert_eq!(calls.get(), 1, "no call after the failure");
    let err = op.take_spill_error().expect("eviction refused");
    assert!(
        matches!(err, SpillError::Encode { ref key, .. } if key == "ann"),
        "{err}"
    );
    assert!(err.to_string().contains("key must be a string"), "{err}");
}
