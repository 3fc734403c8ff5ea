//! Arbitrary stateful processing: user code called per key with that key's new events
//! and a [`GroupState`] handle, in the style of Spark's `flatMapGroupsWithState` /
//! `applyInPandasWithState` and Flink's `KeyedProcessFunction`.
//!
//! The per-key state and both kinds of timeouts live in the same [`KeyedStore`] as the
//! session window's sessions: one core, two operators.
//!
//! # When the function is called, and with which events
//!
//! Input arrives in **batches** (micro-batches): [`push`](StatefulOperator::push) adds
//! events to the open batch, [`end_batch`](StatefulOperator::end_batch) processes it.
//! Batch `b` runs like this:
//!
//! 1. **Its watermark** `W_b` is the one computed at the end of batch `b - 1` (from the
//!    event times of all earlier batches); [`Watermark::MIN`] ("unset" — Spark's `0`)
//!    before the first batch ended. **Its processing time** `P_b` is read from the
//!    [`Clock`] once, when the batch opens.
//! 2. **Late events.** With [`LatePolicy::Drop`] (the default, as Spark does with an
//!    event-time timeout), an event with `t <= W_b` is not given to the function: `push`
//!    hands it back as a [`LateEvent`]. With [`LatePolicy::Deliver`] (Flink) every event
//!    is delivered. Every event's time, late or not, moves the watermark strategy.
//! 3. **Data calls.** The function is called once per key that has events in the batch,
//!    keys in order of their first event in the batch, with that key's events in input
//!    order, `has_timed_out() == false` and `current_watermark() == W_b`.
//! 4. **The watermark advances** to `W_{b+1}`, what the strategy says after all of the
//!    batch's event times (never backwards).
//! 5. **Timeout calls.** Every key whose event-time timeout is `<= W_{b+1}` or whose
//!    processing-time timeout is `<= P_b` is called once with no events,
//!    `has_timed_out() == true` and `current_watermark() == W_{b+1}`: event-time timeouts
//!    first, then processing-time ones, each in order of (deadline, key). This is what
//!    Spark does in the no-data micro-batch it runs as soon as the watermark has moved;
//!    timeouts set during these calls are checked at the next batch end.
//!
//! Every call starts with **no timeout** set (Spark's rule: a timeout lasts until the
//! key's next call), so the function sets it again on each call that wants one. A key
//! may have one event-time and one processing-time timeout at a time.
//! A key whose state was removed and that has no timeout is forgotten.
//!
//! An event-time timeout fires when the watermark *reaches* it (`W >= deadline`, as
//! Flink's timers and the session window's `W >= close`); Spark waits until the
//! watermark has *passed* it (`W > deadline`). Set `deadline + 1 ms` to get Spark's
//! behaviour exactly.
//!
//! [`tick`](StatefulOperator::tick) runs an empty batch (for processing-time timeouts
//! while no events come), [`finish`](StatefulOperator::finish) ends a bounded input:
//! the watermark becomes +∞ and every event-time timeout fires.
//!
//! # Snapshots
//!
//! [`snapshot`](StatefulOperator::snapshot) writes the keyed state (user state as JSON,
//! timeouts, watermark) to bytes with a versioned, checksummed header;
//! [`restore`](StatefulOperator::restore) reads them back. The layout is documented on
//! [`SNAPSHOT_MAGIC`].

use crate::clock::{Clock, ProcessingTime};
use crate::keyed::{KeyedStore, SlotId, Timed};
use crate::watermark::WatermarkStrategy;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use std::borrow::Cow;
use std::fmt;

/// What becomes of events at or behind the watermark of their batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LatePolicy {
    /// Not given to the function; handed back as a [`LateEvent`] (Spark, with an
    /// event-time timeout).
    #[default]
    Drop,
    /// Given to the function like any other event (Flink's `KeyedProcessFunction`);
    /// the function can compare times with [`GroupState::current_watermark`].
    Deliver,
}

/// Which timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeoutKind {
    /// The watermark reached the timestamp set with
    /// [`GroupState::set_timeout_timestamp`].
    EventTime,
    /// The clock reached the deadline set with [`GroupState::set_timeout_duration`].
    ProcessingTime,
}

/// An event that was not given to the function because it was at or behind the
/// watermark of its batch ([`LatePolicy::Drop`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateEvent<E> {
    /// The event, untouched.
    pub event: E,
    /// Its event time.
    pub time: EventTime,
    /// The watermark of the batch it came in.
    pub watermark: Watermark,
}

/// The handle on one key's state during one call (Spark's `GroupState`).
///
/// ```
/// use sessionizer_core::{DurationMs, EventTime, Watermark};
/// use sessionizer_window::stateful::GroupState;
///
/// let mut slot: Option<u32> = None;
/// let mut state = GroupState::detached(&mut slot, Watermark::MIN);
/// assert!(!state.exists());
/// state.update(1);
/// *state.get_mut().expect("just set") += 1;
/// state.set_timeout_timestamp(EventTime(60_000));
/// assert_eq!(state.get(), Some(&2));
/// assert_eq!(state.timeout_timestamp(), Some(EventTime(60_000)));
/// ```
pub struct GroupState<'a, S> {
    state: &'a mut Option<S>,
    timed_out: Option<TimeoutKind>,
    watermark: Watermark,
    now: ProcessingTime,
    event_timeout: Option<EventTime>,
    proc_timeout: Option<ProcessingTime>,
}

impl<S: fmt::Debug> fmt::Debug for GroupState<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupState")
            .field("state", &self.state)
            .field("timed_out", &self.timed_out)
            .field("watermark", &self.watermark)
            .field("now", &self.now)
            .field("event_timeout", &self.event_timeout)
            .field("proc_timeout", &self.proc_timeout)
            .finish()
    }
}

impl<'a, S> GroupState<'a, S> {
    /// A handle on `state` outside any operator, for unit-testing a state function: not
    /// timed out, at `watermark`, processing time 0.
    pub fn detached(state: &'a mut Option<S>, watermark: Watermark) -> Self {
        GroupState {
            state,
            timed_out: None,
            watermark,
            now: ProcessingTime(0),
            event_timeout: None,
            proc_timeout: None,
        }
    }

    /// The key's state, if it has one.
    pub fn get(&self) -> Option<&S> {
        self.state.as_ref()
    }

    /// The key's state, mutably, if it has one.
    pub fn get_mut(&mut self) -> Option<&mut S> {
        self.state.as_mut()
    }

    /// Whether the key has state.
    pub fn exists(&self) -> bool {
        self.state.is_some()
    }

    /// Sets the key's state.
    pub fn update(&mut self, state: S) {
        *self.state = Some(state);
    }

    /// Removes the key's state and hands it back. Once the call returns, a key with
    /// neither state nor timeout is forgotten.
    pub fn remove(&mut self) -> Option<S> {
        self.state.take()
    }

    /// Whether this call is a timeout call (no events).
    pub fn has_timed_out(&self) -> bool {
        self.timed_out.is_some()
    }

    /// Which timeout fired, in a timeout call.
    pub fn timed_out_by(&self) -> Option<TimeoutKind> {
        self.timed_out
    }

    /// The watermark of this call: the batch's watermark in a data call (computed at
    /// the end of the previous batch; [`Watermark::MIN`] before the first batch ended),
    /// the new one in a timeout call.
    pub fn current_watermark(&self) -> Watermark {
        self.watermark
    }

    /// The processing time of the batch, read from the operator's clock when the batch
    /// opened.
    pub fn current_processing_time(&self) -> ProcessingTime {
        self.now
    }

    /// Calls the function again, with `has_timed_out()`, once the watermark reaches `t`
    /// (and no event came for the key before). Replaces the event-time timeout set
    /// earlier in this call.
    pub fn set_timeout_timestamp(&mut self, t: EventTime) {
        self.event_timeout = Some(t);
    }

    /// Calls the function again, with `has_timed_out()`, once the clock reaches the
    /// batch's processing time plus `d` (and no event came for the key before).
    /// Replaces the processing-time timeout set earlier in this call.
    pub fn set_timeout_duration(&mut self, d: DurationMs) {
        self.proc_timeout = Some(self.now.plus(d));
    }

    /// Removes both timeouts set in this call.
    pub fn clear_timeouts(&mut self) {
        self.event_timeout = None;
        self.proc_timeout = None;
    }

    /// The event-time timeout set in this call.
    pub fn timeout_timestamp(&self) -> Option<EventTime> {
        self.event_timeout
    }

    /// The processing-time deadline set in this call.
    pub fn timeout_deadline(&self) -> Option<ProcessingTime> {
        self.proc_timeout
    }
}

/// One key's slot: the user state and its pending timeouts.
#[derive(Debug)]
struct KeyState<S> {
    state: Option<S>,
    event_timeout: Option<EventTime>,
    proc_timeout: Option<ProcessingTime>,
    /// The batch (1-based) in which the key last had an event, and its rank among the
    /// keys of that batch by first appearance.
    batch: u64,
    rank: u32,
    /// The live event-time timer ([`Timed`]).
    timer: i64,
}

impl<S> Default for KeyState<S> {
    fn default() -> Self {
        KeyState {
            state: None,
            event_timeout: None,
            proc_timeout: None,
            batch: 0,
            rank: 0,
            timer: crate::keyed::NO_TIMER,
        }
    }
}

impl<S> Timed for KeyState<S> {
    fn timer(&self) -> i64 {
        self.timer
    }

    fn set_timer(&mut self, deadline: i64) {
        self.timer = deadline;
    }
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Events pushed, late ones included.
    pub events: u64,
    /// Events handed back as late.
    pub late: u64,
    /// Calls with events.
    pub data_calls: u64,
    /// Calls with `has_timed_out()`.
    pub timeout_calls: u64,
    /// Outputs the function returned.
    pub outputs: u64,
    /// The watermark after the batch.
    pub watermark: Option<Watermark>,
}

/// Why a snapshot could not be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A batch is open: its pushed events are in no snapshot.
    #[error("a batch is open; end it (end_batch) before taking a snapshot")]
    BatchOpen,
    /// The bytes do not start with [`SNAPSHOT_MAGIC`].
    #[error("not a sessionizer keyed-state snapshot (bad magic bytes)")]
    BadMagic,
    /// A format version this build cannot read.
    #[error(
        "keyed-state snapshot version {0} is not supported (this build reads version {SNAPSHOT_VERSION})"
    )]
    UnsupportedVersion(u16),
    /// The bytes end early.
    #[error("keyed-state snapshot is truncated")]
    Truncated,
    /// The checksum does not match: the bytes were damaged.
    #[error("keyed-state snapshot checksum mismatch: the snapshot is damaged")]
    Checksum,
    /// A key is not UTF-8.
    #[error("keyed-state snapshot holds a key that is not UTF-8")]
    BadKey,
    /// A user state could not be written or read (its serde implementation failed, or
    /// its type changed since the snapshot was taken).
    #[error("state of key {key:?}: {source}")]
    State {
        /// The key whose state failed.
        key: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

/// The first bytes of a keyed-state snapshot.
///
/// Layout (all integers little-endian):
///
/// ```text
/// magic       8 bytes  "SZKEYED\0"
/// version     u16      1
/// reserved    u16      0
/// watermark   i64      i64::MIN = unset, i64::MAX = +inf
/// batches     u64      batches ended so far
/// entries     u64      number of keys
/// per key, in key order:
///   key_len   u32, key bytes (UTF-8)
///   flags     u8       bit 0: state, bit 1: event-time timeout, bit 2: processing-time timeout
///   [i64 event-time timeout] [i64 processing-time timeout]   when flagged
///   [u32 state_len, state as JSON]                            when flagged
/// checksum    u64      xxh3-64 of every byte before it
/// ```
///
/// JSON keeps the user's state self-describing, so a restore into a changed state type
/// fails with serde's message naming the field rather than misreading bytes.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"SZKEYED\0";
/// The snapshot format version written by this build.
pub const SNAPSHOT_VERSION: u16 = 1;

/// The stateful operator: per-key user state with event-time and processing-time
/// timeouts, fed in batches (see the [module docs](self) for the exact rules).
///
/// `E` is the event type, `S` the per-key state, `W` the watermark strategy and `C` the
/// clock. The user function is passed to each call that may run it, so one operator
/// can be driven by a closure that borrows local data.
///
/// ```
/// use sessionizer_core::{DurationMs, EventTime};
/// use sessionizer_window::stateful::{GroupState, StatefulOperator};
/// use sessionizer_window::{BoundedOutOfOrderness, ManualClock};
///
/// // Counts clicks per user; reports the count 10 s (event time) after the last click.
/// let mut op = StatefulOperator::new(
///     BoundedOutOfOrderness::new(DurationMs(0)),
///     ManualClock::default(),
/// );
/// let mut count = |key: &str, clicks: Vec<i64>, state: &mut GroupState<'_, u64>| {
///     if state.has_timed_out() {
///         let n = state.remove().unwrap_or(0);
///         return Some(format!("{key}: {n}"));
///     }
///     let n = state.get().copied().unwrap_or(0) + clicks.len() as u64;
///     state.update(n);
///     let last = clicks.iter().copied().max().unwrap_or(0);
///     state.set_timeout_timestamp(EventTime(last + 10_000));
///     None
/// };
/// let mut out = Vec::new();
/// for (user, t) in [("ann", 1_000), ("bob", 2_000), ("ann", 3_000)] {
///     assert!(op.push(user, EventTime(t), t).is_none());
/// }
/// op.end_batch(&mut count, &mut |o| out.push(o));
/// // The watermark moves to 30 s at the end of this batch: ann's timeout (13 s) fires.
/// assert!(op.push("bob", EventTime(30_000), 30_000).is_none());
/// op.end_batch(&mut count, &mut |o| out.push(o));
/// // End of input: the watermark becomes +inf, bob's timeout fires.
/// op.finish(&mut count, &mut |o| out.push(o));
/// assert_eq!(out, ["ann: 2", "bob: 2"]);
/// ```
pub struct StatefulOperator<E, S, W, C> {
    store: KeyedStore<KeyState<S>>,
    strategy: W,
    clock: C,
    late_policy: LatePolicy,
    /// The watermark of the open (or next) batch.
    watermark: Watermark,
    /// Batches ended so far; the open batch is number `batches + 1`.
    batches: u64,
    open: Option<OpenBatch>,
    /// The open batch's events: (rank of the key, slot, event), in input order.
    pending: Vec<(u32, SlotId, E)>,
    due: Vec<(TimeoutKind, i64, SlotId)>,
}

#[derive(Debug, Clone, Copy)]
struct OpenBatch {
    now: ProcessingTime,
    keys: u32,
    events: u64,
    late: u64,
}

impl<E, S: fmt::Debug, W: fmt::Debug, C: fmt::Debug> fmt::Debug for StatefulOperator<E, S, W, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatefulOperator")
            .field("keys", &self.store.len())
            .field("strategy", &self.strategy)
            .field("clock", &self.clock)
            .field("late_policy", &self.late_policy)
            .field("watermark", &self.watermark)
            .field("batches", &self.batches)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<E, S, W: WatermarkStrategy, C: Clock> StatefulOperator<E, S, W, C> {
    /// An operator with no state, its watermark unset, late events dropped.
    pub fn new(strategy: W, clock: C) -> Self {
        StatefulOperator {
            store: KeyedStore::default(),
            strategy,
            clock,
            late_policy: LatePolicy::default(),
            watermark: Watermark::MIN,
            batches: 0,
            open: None,
            pending: Vec::new(),
            due: Vec::new(),
        }
    }

    /// Sets what happens to late events.
    pub fn with_late_policy(mut self, policy: LatePolicy) -> Self {
        self.late_policy = policy;
        self
    }

    /// The watermark of the open (or next) batch.
    pub fn watermark(&self) -> Watermark {
        self.watermark
    }

    /// Keys with state or a pending timeout.
    pub fn keys(&self) -> usize {
        self.store.len()
    }

    /// Batches ended so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The state of `key`, if any (for inspection and tests).
    pub fn state(&self, key: &str) -> Option<&S> {
        let id = self.store.find(key.as_bytes())?;
        self.store.state(id).state.as_ref()
    }

    /// Every key with state, and its state, in no particular order.
    pub fn states(&self) -> impl Iterator<Item = (Cow<'_, str>, &S)> {
        self.store
            .iter()
            .filter_map(|(_, k, s)| Some((String::from_utf8_lossy(k), s.state.as_ref()?)))
    }

    fn open_batch(&mut self) -> OpenBatch {
        match self.open {
            Some(b) => b,
            None => {
                let b = OpenBatch {
                    now: self.clock.now(),
                    keys: 0,
                    events: 0,
                    late: 0,
                };
                self.open = Some(b);
                b
            }
        }
    }

    /// Adds an event of `key` at `time` to the open batch (opening one if needed).
    /// Returns the event back as [`LateEvent`] when it is at or behind the batch's
    /// watermark and the policy is [`LatePolicy::Drop`].
    #[must_use = "a late event is handed back; send it to a late-event output"]
    pub fn push(&mut self, key: &str, time: EventTime, event: E) -> Option<LateEvent<E>> {
        let mut batch = self.open_batch();
        batch.events += 1;
        let w = self.watermark;
        self.strategy.observe(time);
        if self.late_policy == LatePolicy::Drop && w.has_reached(time) {
            batch.late += 1;
            self.open = Some(batch);
            return Some(LateEvent {
                event,
                time,
                watermark: w,
            });
        }
        let id = self.store.slot_for(key.as_bytes());
        let this_batch = self.batches + 1;
        let ks = self.store.state_mut(id);
        if ks.batch != this_batch {
            ks.batch = this_batch;
            ks.rank = batch.keys;
            batch.keys += 1;
        }
        let rank = ks.rank;
        self.pending.push((rank, id, event));
        self.open = Some(batch);
        None
    }

    /// Processes the open batch (an empty one if none is open): the data calls, the
    /// watermark step, the timeout calls. Outputs go to `emit` in that order.
    pub fn end_batch<F, R>(&mut self, f: &mut F, emit: &mut impl FnMut(R::Item)) -> BatchReport
    where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let batch = self.open_batch();
        let mut report = BatchReport {
            events: batch.events,
            late: batch.late,
            ..BatchReport::default()
        };

        // Data calls: keys by first appearance, each key's events in input order (the
        // sort is stable).
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|p| p.0);
        let mut events = pending.drain(..).peekable();
        while let Some((rank, id, first)) = events.next() {
            let mut group = vec![first];
            while let Some((_, _, e)) = events.next_if(|p| p.0 == rank) {
                group.push(e);
            }
            self.call(
                id,
                group,
                None,
                self.watermark,
                batch.now,
                f,
                emit,
                &mut report,
            );
            report.data_calls += 1;
        }
        drop(events);
        self.pending = pending;

        let next = self.strategy.current();
        if next > self.watermark {
            self.watermark = next;
        }
        self.fire_timeouts(batch.now, f, emit, &mut report);
        self.batches += 1;
        self.open = None;
        report.watermark = Some(self.watermark);
        report
    }

    /// Runs one batch: pushes `events` (key, time, event), hands late ones to `late`,
    /// then [`end_batch`](Self::end_batch).
    pub fn process_batch<K, I, F, R>(
        &mut self,
        events: I,
        f: &mut F,
        emit: &mut impl FnMut(R::Item),
        late: &mut impl FnMut(LateEvent<E>),
    ) -> BatchReport
    where
        K: AsRef<str>,
        I: IntoIterator<Item = (K, EventTime, E)>,
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        for (key, time, event) in events {
            if let Some(l) = self.push(key.as_ref(), time, event) {
                late(l);
            }
        }
        self.end_batch(f, emit)
    }

    /// An empty batch: reads the clock and runs the timeouts that are due (processing
    /// time moves on while no events come).
    pub fn tick<F, R>(&mut self, f: &mut F, emit: &mut impl FnMut(R::Item)) -> BatchReport
    where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        self.end_batch(f, emit)
    }

    /// The end of a bounded input: ends the open batch, if any, then moves the watermark
    /// to +∞ so that every event-time timeout fires (processing-time ones fire if the
    /// clock has reached them). Keys that still hold state afterwards stay, e.g. for a
    /// snapshot.
    pub fn finish<F, R>(&mut self, f: &mut F, emit: &mut impl FnMut(R::Item)) -> BatchReport
    where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let mut report = if self.open.is_some() {
            self.end_batch(f, emit)
        } else {
            BatchReport::default()
        };
        self.watermark = Watermark::MAX;
        let now = self.clock.now();
        self.fire_timeouts(now, f, emit, &mut report);
        report.watermark = Some(self.watermark);
        report
    }

    /// Calls every key whose timeout is due at the current watermark or at `now`.
    fn fire_timeouts<F, R>(
        &mut self,
        now: ProcessingTime,
        f: &mut F,
        emit: &mut impl FnMut(R::Item),
        report: &mut BatchReport,
    ) where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let w = self.watermark;
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        while let Some(id) = self.store.pop_due(w) {
            match self.store.state(id).event_timeout {
                Some(d) if w.has_reached(d) => due.push((TimeoutKind::EventTime, d.millis(), id)),
                // Moved later since it was scheduled: re-arm at the real deadline.
                Some(d) => self.store.schedule(id, d),
                None => {}
            }
        }
        while let Some(id) = self.store.pop_due_processing(now) {
            let ks = self.store.state(id);
            if ks.event_timeout.is_some_and(|d| w.has_reached(d)) {
                continue; // already due by event time: one call per key
            }
            match ks.proc_timeout {
                Some(d) if d <= now => due.push((TimeoutKind::ProcessingTime, d.millis(), id)),
                Some(d) => self.store.schedule_processing(id, d),
                None => {}
            }
        }
        let store = &self.store;
        due.sort_by(|a, b| {
            let kind = |k: TimeoutKind| k == TimeoutKind::ProcessingTime;
            (kind(a.0), a.1, store.key(a.2)).cmp(&(kind(b.0), b.1, store.key(b.2)))
        });
        for &(kind, _, id) in &due {
            self.call(id, Vec::new(), Some(kind), w, now, f, emit, report);
            report.timeout_calls += 1;
        }
        self.due = due;
    }

    /// One call of the user function for the key in slot `id`.
    #[allow(clippy::too_many_arguments)]
    fn call<F, R>(
        &mut self,
        id: SlotId,
        events: Vec<E>,
        timed_out: Option<TimeoutKind>,
        watermark: Watermark,
        now: ProcessingTime,
        f: &mut F,
        emit: &mut impl FnMut(R::Item),
        report: &mut BatchReport,
    ) where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let (key, ks) = self.store.key_and_state_mut(id);
        let key = String::from_utf8_lossy(key);
        // A timeout lasts until the key's next call (Spark's rule).
        ks.event_timeout = None;
        ks.proc_timeout = None;
        let mut handle = GroupState {
            state: &mut ks.state,
            timed_out,
            watermark,
            now,
            event_timeout: None,
            proc_timeout: None,
        };
        for out in f(&key, events, &mut handle) {
            report.outputs += 1;
            emit(out);
        }
        let (event_timeout, proc_timeout) = (handle.event_timeout, handle.proc_timeout);
        ks.event_timeout = event_timeout;
        ks.proc_timeout = proc_timeout;
        let forget = ks.state.is_none() && event_timeout.is_none() && proc_timeout.is_none();
        if forget {
            self.store.remove(id);
            return;
        }
        if let Some(t) = event_timeout {
            self.store.schedule(id, t);
        }
        if let Some(t) = proc_timeout {
            self.store.schedule_processing(id, t);
        }
    }
}

impl<E, S: Serialize + DeserializeOwned, W: WatermarkStrategy, C: Clock>
    StatefulOperator<E, S, W, C>
{
    /// The keyed state (every key's state and timeouts) and the watermark, as bytes
    /// (layout: [`SNAPSHOT_MAGIC`]). Keys are written in order, so equal states give
    /// equal bytes.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        let mut entries: Vec<(&[u8], &KeyState<S>)> =
            self.store.iter().map(|(_, k, s)| (k, s)).collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));

        let mut out = Vec::with_capacity(32 + entries.len() * 64);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.watermark.millis().to_le_bytes());
        out.extend_from_slice(&self.batches.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        let mut json = Vec::new();
        for (key, ks) in entries {
            put_len(&mut out, key.len());
            out.extend_from_slice(key);
            let flags = u8::from(ks.state.is_some())
                | u8::from(ks.event_timeout.is_some()) << 1
                | u8::from(ks.proc_timeout.is_some()) << 2;
            out.push(flags);
            if let Some(t) = ks.event_timeout {
                out.extend_from_slice(&t.millis().to_le_bytes());
            }
            if let Some(t) = ks.proc_timeout {
                out.extend_from_slice(&t.millis().to_le_bytes());
            }
            if let Some(s) = &ks.state {
                json.clear();
                serde_json::to_writer(&mut json, s).map_err(|source| SnapshotError::State {
                    key: String::from_utf8_lossy(key).into_owned(),
                    source,
                })?;
                put_len(&mut out, json.len());
                out.extend_from_slice(&json);
            }
        }
        let checksum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        Ok(out)
    }

    /// Replaces the keyed state and the watermark with a [`snapshot`](Self::snapshot)'s.
    /// On error the operator is left unchanged.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        if bytes.len() < SNAPSHOT_MAGIC.len() || &bytes[..8] != SNAPSHOT_MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let Some((body, sum)) = bytes.split_last_chunk::<8>() else {
            return Err(SnapshotError::Truncated);
        };
        let mut r = Reader { bytes: body, at: 8 };
        let version = u16::from_le_bytes(r.array()?);
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::UnsupportedVersion(version));
        }
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(*sum) {
            return Err(SnapshotError::Checksum);
        }
        let _reserved = u16::from_le_bytes(r.array()?);
        let watermark = i64::from_le_bytes(r.array()?);
        let batches = u64::from_le_bytes(r.array()?);
        let count = u64::from_le_bytes(r.array()?);

        let mut store: KeyedStore<KeyState<S>> = KeyedStore::default();
        for _ in 0..count {
            let len = r.len()?;
            let key = r.take(len)?;
            let key_text = std::str::from_utf8(key).map_err(|_| SnapshotError::BadKey)?;
            let flags = r.array::<1>()?[0];
            let event_timeout = (flags & 2 != 0)
                .then(|| r.array().map(|b| EventTime(i64::from_le_bytes(b))))
                .transpose()?;
            let proc_timeout = (flags & 4 != 0)
                .then(|| r.array().map(|b| ProcessingTime(i64::from_le_bytes(b))))
                .transpose()?;
            let state = if flags & 1 != 0 {
                let len = r.len()?;
                let json = r.take(len)?;
                Some(
                    serde_json::from_slice(json).map_err(|source| SnapshotError::State {
                        key: key_text.to_owned(),
                        source,
                    })?,
                )
            } else {
                None
            };
            let id = store.slot_for(key);
            let ks = store.state_mut(id);
            ks.state = state;
            ks.event_timeout = event_timeout;
            ks.proc_timeout = proc_timeout;
            if let Some(t) = event_timeout {
                store.schedule(id, t);
            }
            if let Some(t) = proc_timeout {
                store.schedule_processing(id, t);
            }
        }
        if r.at != body.len() {
            return Err(SnapshotError::Truncated);
        }

        self.store = store;
        self.watermark = match watermark {
            i64::MIN => Watermark::MIN,
            i64::MAX => Watermark::MAX,
            ms => Watermark::at(EventTime(ms)),
        };
        self.strategy.resume_at(self.watermark);
        self.batches = batches;
        self.pending.clear();
        Ok(())
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Keys and states beyond 4 GiB are not supported by the format.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
}

/// A cursor over snapshot bytes that reports truncation instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).ok_or(SnapshotError::Truncated)?;
        let slice = self
            .bytes
            .get(self.at..end)
            .ok_or(SnapshotError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let slice = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(slice);
        Ok(a)
    }

    fn len(&mut self) -> Result<usize, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }
}
