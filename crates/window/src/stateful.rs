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
//!
//! **Registered timers** (Flink's `KeyedProcessFunction` timers) are the other style:
//! [`GroupState::register_event_time_timer`] and
//! [`register_processing_time_timer`](GroupState::register_processing_time_timer) add a
//! timer that stays until it fires or is deleted, across calls; a key may hold any
//! number (one per timestamp and domain). Each due timer is a call of its own, with
//! `has_timed_out()`, [`timed_out_by`](GroupState::timed_out_by) its domain and
//! [`fired_timer`](GroupState::fired_timer) its timestamp; they fire at step 5 with the
//! timeouts, in the same order (event time first, then by deadline and key; at one
//! deadline a key's timeout before its timers).
//!
//! **State TTL** ([`StatefulOperator::with_state_ttl`], Flink's `StateTtlConfig` with
//! `OnCreateAndWrite` in processing time): a key's state expires once `ttl` of
//! processing time has passed since a call last wrote it
//! ([`update`](GroupState::update) or [`get_mut`](GroupState::get_mut)); expired state
//! is never handed to a call (`get()` is `None`), and it is cleared without a call at
//! the first batch end whose processing time reaches its expiry.
//!
//! A key whose state was removed (or expired) and that has no timeout and no timer is
//! forgotten.
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
//!
//! # State larger than memory
//!
//! [`spill_to`](StatefulOperator::spill_to) puts a [`SpillStore`] below the keyed store,
//! as for the session window (`crate::spill`): at a batch end (and while a restore
//! fills it), once the keys in memory take more than the budget, the keys that have
//! gone longest without an event are evicted (a key taken back for a timer, or
//! restored, counts as the oldest) with the deadlines of their next timers on both
//! clocks, and a key comes back
//! when an event for it arrives or before a batch end at which one of its timers, its
//! timeout or its state's expiry is due. The calls and their order are those of an
//! operator without one.

use crate::clock::{Clock, ProcessingTime};
use crate::keyed::{KeyBytes, KeyedStore, SlotId, Timed, key_hash};
use crate::spill::tier::{KeyCosts, Tier};
use crate::spill::{
    Deadlines, Domain, EncodeError, SpillCounts, SpillError, SpillStore, StateCodec,
    StateDecodeError,
};
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

/// Which timeout fired (or the domain of the registered timer that fired).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeoutKind {
    /// The watermark reached the timestamp set with
    /// [`GroupState::set_timeout_timestamp`].
    EventTime,
    /// The clock reached the deadline set with [`GroupState::set_timeout_duration`].
    ProcessingTime,
}

/// A registered timer ([`GroupState::register_event_time_timer`],
/// [`GroupState::register_processing_time_timer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timer {
    /// Fires when the watermark reaches it.
    EventTime(EventTime),
    /// Fires when the clock reaches it.
    ProcessingTime(ProcessingTime),
}

impl Timer {
    /// Its domain.
    pub fn kind(self) -> TimeoutKind {
        match self {
            Timer::EventTime(_) => TimeoutKind::EventTime,
            Timer::ProcessingTime(_) => TimeoutKind::ProcessingTime,
        }
    }

    /// Its timestamp in milliseconds (event time or processing time).
    pub fn millis(self) -> i64 {
        match self {
            Timer::EventTime(t) => t.millis(),
            Timer::ProcessingTime(t) => t.millis(),
        }
    }
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
    /// The key's registered timers, sorted, one per timestamp and domain.
    timers: Vec<Timer>,
    fired: Option<Timer>,
    /// The call wrote the state (`update`, `get_mut`): its TTL starts again.
    written: bool,
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
            .field("timers", &self.timers)
            .field("fired", &self.fired)
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
            timers: Vec::new(),
            fired: None,
            written: false,
        }
    }

    /// The key's state, if it has one.
    pub fn get(&self) -> Option<&S> {
        self.state.as_ref()
    }

    /// The key's state, mutably, if it has one (counts as a write for the state TTL).
    pub fn get_mut(&mut self) -> Option<&mut S> {
        self.written |= self.state.is_some();
        self.state.as_mut()
    }

    /// Whether the key has state.
    pub fn exists(&self) -> bool {
        self.state.is_some()
    }

    /// Sets the key's state (with a state TTL, its expiry starts again).
    pub fn update(&mut self, state: S) {
        *self.state = Some(state);
        self.written = true;
    }

    /// Removes the key's state and hands it back. Once the call returns, a key with
    /// neither state nor timeout is forgotten.
    pub fn remove(&mut self) -> Option<S> {
        self.state.take()
    }

    /// Whether this call is a timeout call (no events): a timeout or a registered timer
    /// fired.
    pub fn has_timed_out(&self) -> bool {
        self.timed_out.is_some()
    }

    /// Which timeout fired (or the domain of the registered timer that fired), in a
    /// timeout call.
    pub fn timed_out_by(&self) -> Option<TimeoutKind> {
        self.timed_out
    }

    /// The registered timer this call is for (`None` in data calls and in calls for a
    /// timeout set with `set_timeout_*`). It is no longer registered.
    pub fn fired_timer(&self) -> Option<Timer> {
        self.fired
    }

    /// Registers a timer that calls the function, with `has_timed_out()` and
    /// [`fired_timer`](Self::fired_timer), once the watermark reaches `t`. It stays
    /// registered across calls until it fires or is deleted; registering the same
    /// timestamp again changes nothing (Flink's timers).
    pub fn register_event_time_timer(&mut self, t: EventTime) {
        self.register(Timer::EventTime(t));
    }

    /// Registers a timer that fires once the clock reaches `t` (see
    /// [`register_event_time_timer`](Self::register_event_time_timer)).
    pub fn register_processing_time_timer(&mut self, t: ProcessingTime) {
        self.register(Timer::ProcessingTime(t));
    }

    /// Deletes the event-time timer registered for `t`, if any.
    pub fn delete_event_time_timer(&mut self, t: EventTime) {
        self.timers.retain(|x| *x != Timer::EventTime(t));
    }

    /// Deletes the processing-time timer registered for `t`, if any.
    pub fn delete_processing_time_timer(&mut self, t: ProcessingTime) {
        self.timers.retain(|x| *x != Timer::ProcessingTime(t));
    }

    /// The key's registered timers, event-time ones first, each domain in time order.
    pub fn timers(&self) -> &[Timer] {
        &self.timers
    }

    fn register(&mut self, t: Timer) {
        if let Err(at) = self.timers.binary_search(&t) {
            self.timers.insert(at, t);
        }
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

/// One key's slot in a [`StatefulOperator`]: the user state and its pending timeouts
/// and timers (opaque; a spill store keeps it with [`KeyRecordCodec`]).
#[derive(Debug)]
pub struct KeyState<S> {
    state: Option<S>,
    event_timeout: Option<EventTime>,
    proc_timeout: Option<ProcessingTime>,
    /// Registered timers, sorted (event-time ones first), no duplicates.
    timers: Vec<Timer>,
    /// When the state expires (a state TTL is set and the state exists).
    expires: Option<ProcessingTime>,
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
            timers: Vec::new(),
            expires: None,
            batch: 0,
            rank: 0,
            timer: crate::keyed::NO_TIMER,
        }
    }
}

impl<S> KeyState<S> {
    /// The earliest event-time deadline: the timeout or a registered timer.
    fn next_event_deadline(&self) -> Option<EventTime> {
        let timer = self.timers.iter().find_map(|t| match t {
            Timer::EventTime(t) => Some(*t),
            Timer::ProcessingTime(_) => None,
        });
        match (self.event_timeout, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest processing-time deadline: the timeout, a registered timer or the
    /// state's expiry.
    fn next_processing_deadline(&self) -> Option<ProcessingTime> {
        let timer = self.timers.iter().find_map(|t| match t {
            Timer::ProcessingTime(t) => Some(*t),
            Timer::EventTime(_) => None,
        });
        [self.proc_timeout, timer, self.expires]
            .into_iter()
            .flatten()
            .min()
    }

    /// Nothing left to keep the key for.
    fn is_empty(&self) -> bool {
        self.state.is_none()
            && self.event_timeout.is_none()
            && self.proc_timeout.is_none()
            && self.timers.is_empty()
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

impl BatchReport {
    /// Adds the calls and outputs of `rest`, a step that followed this one without
    /// events of its own, and takes its watermark.
    pub fn then(&mut self, rest: BatchReport) {
        self.data_calls += rest.data_calls;
        self.timeout_calls += rest.timeout_calls;
        self.outputs += rest.outputs;
        self.watermark = rest.watermark;
    }
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
    /// What was asked cannot be done by this job (the reason says why).
    #[error("{0}")]
    Unsupported(&'static str),
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
    /// The spill store (the `rocksdb` backend) failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

/// The first bytes of a keyed-state snapshot.
///
/// Layout (all integers little-endian):
///
/// ```text
/// magic       8 bytes  "SZKEYED\0"
/// version     u16      2 (version 1, without timers and expiry, is read too)
/// reserved    u16      0
/// watermark   i64      i64::MIN = unset, i64::MAX = +inf
/// batches     u64      batches ended so far
/// entries     u64      number of keys
/// per key, in key order:
///   key_len   u32, key bytes (UTF-8)
///   flags     u8       bit 0: state, bit 1: event-time timeout, bit 2: processing-time
///                      timeout, bit 3: registered timers, bit 4: state expiry
///   [i64 event-time timeout] [i64 processing-time timeout]   when flagged
///   [u32 count, count × (u8 domain: 0 event time, 1 processing time; i64 time)]
///                                                             registered timers, when flagged
///   [i64 processing time the state expires at]                when flagged
///   [u32 state_len, state as JSON]                            when flagged
/// checksum    u64      xxh3-64 of every byte before it
/// ```
///
/// JSON keeps the user's state self-describing, so a restore into a changed state type
/// fails with serde's message naming the field rather than misreading bytes.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"SZKEYED\0";
/// The snapshot format version written by this build.
pub const SNAPSHOT_VERSION: u16 = 2;

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
    due: Vec<(Due, i64, SlotId)>,
    /// The state TTL ([`with_state_ttl`](StatefulOperator::with_state_ttl)).
    ttl: Option<DurationMs>,
    /// Changed keys are remembered (incremental checkpoints).
    tracking: bool,
    /// With a spill store (the `rocksdb` backend), where the keys the hot tier has no
    /// room for go; `None` (the `memory` backend): every key stays in `store`.
    spill: Option<Box<StatefulSpill<S>>>,
    /// [`bound_tracked_changes`](Self::bound_tracked_changes) was called.
    bound_changes: bool,
}

/// What a key costs in the hot tier besides its timers and its state's heap: its slot
/// (key and state), its index entry, its timer entries on both clocks.
const fn key_bytes<S>() -> usize {
    16 + std::mem::size_of::<KeyState<S>>() + 16 + 16
}

/// A stateful operator's side of its spill store.
struct StatefulSpill<S> {
    tier: Tier<KeyState<S>>,
    /// The size of a state as JSON, a stand-in for its heap (the operator does not know
    /// the user type's layout); its buffer.
    json_len: fn(&S, &mut Vec<u8>) -> usize,
    buf: Vec<u8>,
}

/// How many keys' states one measuring pass writes as JSON: one in this many.
const SAMPLE_EVERY: usize = 32;

/// What a stateful operator tells its spill tier about its keys.
struct StatefulCosts<'a, S> {
    json_len: fn(&S, &mut Vec<u8>) -> usize,
    buf: &'a mut Vec<u8>,
    /// Keys with state seen in this pass; of them, how many were written, and their
    /// mean JSON size.
    seen: usize,
    sampled: usize,
    sum: usize,
    state_bytes: usize,
}

impl<S> KeyCosts<KeyState<S>> for StatefulCosts<'_, S> {
    fn bytes(&mut self, key: &[u8], ks: &KeyState<S>) -> usize {
        let mut state = 0;
        if let Some(s) = &ks.state {
            if self.seen.is_multiple_of(SAMPLE_EVERY) {
                self.buf.clear();
                self.sum += (self.json_len)(s, self.buf);
                self.sampled += 1;
                self.state_bytes = self.sum / self.sampled;
            }
            self.seen += 1;
            state = self.state_bytes;
        }
        key_bytes::<S>() + key.len().saturating_sub(16) + ks.timers.capacity() * 16 + state
    }

    /// The keys that have gone longest without an event (by the batch of their last
    /// one) are the coldest.
    fn coldness(&self, ks: &KeyState<S>) -> i64 {
        ks.batch as i64
    }

    fn deadlines(&self, ks: &KeyState<S>) -> Deadlines {
        Deadlines {
            event: ks
                .next_event_deadline()
                .map_or(Deadlines::NONE, |t| t.millis()),
            processing: ks
                .next_processing_deadline()
                .map_or(Deadlines::NONE, |t| t.millis()),
        }
    }
}

/// The JSON size of `s` (a state the JSON writer refuses counts as empty: the
/// checkpoint reports that error).
fn json_len<S: Serialize>(s: &S, buf: &mut Vec<u8>) -> usize {
    match serde_json::to_writer(&mut *buf, s) {
        Ok(()) => buf.len(),
        Err(_) => 0,
    }
}

/// How a stateful operator's spill store writes a key: its checkpoint record (flags,
/// timeouts, timers, expiry, the state as JSON; see [`StatefulOperator::encode_state`]),
/// so that an image of the store holds what a checkpoint's base does.
pub struct KeyRecordCodec<S>(std::marker::PhantomData<fn() -> S>);

impl<S> fmt::Debug for KeyRecordCodec<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyRecordCodec")
    }
}

impl<S> Default for KeyRecordCodec<S> {
    fn default() -> Self {
        KeyRecordCodec(std::marker::PhantomData)
    }
}

impl<S: Serialize + DeserializeOwned> StateCodec<KeyState<S>> for KeyRecordCodec<S> {
    fn encode(&self, ks: &KeyState<S>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        Ok(write_key_record(ks, out)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<KeyState<S>, StateDecodeError> {
        let mut r = Reader { bytes, at: 0 };
        let ks = decode_key_record(b"", &mut r)?;
        if r.at != bytes.len() {
            return Err(SnapshotError::Truncated.into());
        }
        Ok(ks)
    }
}

/// Something due for a key at a batch end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// The timeout set with `set_timeout_*`.
    Timeout(TimeoutKind),
    /// A registered timer.
    Timer(Timer),
    /// The state's TTL ran out (no call).
    Expire,
}

impl Due {
    fn domain(self) -> TimeoutKind {
        match self {
            Due::Timeout(k) => k,
            Due::Timer(t) => t.kind(),
            Due::Expire => TimeoutKind::ProcessingTime,
        }
    }
}

/// Where one call's outputs stand in the order one operator emits them: data calls by
/// their key's rank in the batch, then what is due at the batch end, sorted by domain,
/// deadline, key and kind. A job that runs its keys on several operators (each owning
/// some keys, all at one watermark and one clock) merges their outputs by it into the
/// order one operator would emit them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CallOrder<'a> {
    /// A call with events: the rank of its key among the keys of the batch (by first
    /// appearance, or as given to [`StatefulOperator::push_ranked`]), and the key.
    Data(u32, &'a [u8]),
    /// A timeout or timer call.
    Due(TimeoutKind, i64, &'a [u8], DueRank),
}

impl<'a> CallOrder<'a> {
    /// The key of the call.
    pub fn key(&self) -> &'a [u8] {
        match *self {
            CallOrder::Data(_, key) | CallOrder::Due(_, _, key, _) => key,
        }
    }
}

/// The kind of a due call, as [`CallOrder`] sorts it (opaque).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueRank(Due);

/// What a call is, for its [`CallOrder`].
#[derive(Debug, Clone, Copy)]
enum CallSeed {
    Data(u32),
    Due(Due, i64),
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
            ttl: None,
            tracking: false,
            spill: None,
            bound_changes: false,
        }
    }

    /// Puts `store` below the hot tier (the `rocksdb` backend): at a batch end, once the
    /// keys in memory take more than about `hot_bytes` (a state's heap estimated from
    /// its JSON size), those longest without an event are evicted to it, with the
    /// deadlines of their next timers; a key is taken back when an event for it
    /// arrives, or before the batch end at which something of it is due. The calls
    /// stay exactly those of an operator without one. Call it before the first event
    /// or restore.
    pub fn spill_to(&mut self, store: Box<dyn SpillStore<KeyState<S>>>, hot_bytes: usize)
    where
        S: Serialize,
    {
        self.spill = Some(Box::new(StatefulSpill {
            tier: Tier::new(store, hot_bytes, key_bytes::<S>()),
            json_len: json_len::<S>,
            buf: Vec::new(),
        }));
    }

    /// The first error of the spill store since the last call, if any. The operator
    /// cannot go on correctly after one (a key it could not read back would be treated
    /// as new, an evicted key may be lost), so while one is pending it makes no calls:
    /// the batch that met it makes none after that point, the batches after it none at
    /// all. The caller stops with it (and restores from its last checkpoint).
    pub fn take_spill_error(&mut self) -> Option<SpillError> {
        self.spill.as_mut().and_then(|s| s.tier.take_error())
    }

    /// The spill store failed: no more calls ([`take_spill_error`](Self::take_spill_error)).
    fn spill_failed(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.tier.has_failed())
    }

    /// What the spill store has done (`None`: the operator has none).
    pub fn spill_counts(&self) -> Option<SpillCounts> {
        self.spill.as_ref().map(|s| s.tier.counts())
    }

    /// For an owner whose next checkpoint may as well be a full base: with a spill
    /// store, the changed keys remembered for evicted keys are bounded by the hot
    /// tier's size; beyond, they are forgotten and [`changes_lost`](Self::changes_lost)
    /// says so.
    pub fn bound_tracked_changes(&mut self) {
        self.bound_changes = true;
    }

    /// The changes since the last checkpoint were forgotten
    /// ([`bound_tracked_changes`](Self::bound_tracked_changes)): the next
    /// [`encode_state`](StatefulOperator::encode_state) must be a base.
    pub fn changes_lost(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.tier.changes_lost)
    }

    /// The slot of `key` (created if it has none), taken back from the spill store if
    /// it is there.
    fn slot_of(&mut self, key: &[u8]) -> SlotId {
        let Some(s) = self.spill.as_mut() else {
            return self.store.slot_for(key);
        };
        let hash = key_hash(key);
        if let Some(id) = self.store.find_hashed(hash, key) {
            return id;
        }
        if let Some(id) = s.tier.take_back(&mut self.store, hash, key) {
            return id;
        }
        self.store.slot_for_hashed(hash, key)
    }

    /// Takes back from the spill store every key with something due at watermark `w` or
    /// at processing time `now`, so that the timers in memory find them.
    fn unspill_due(&mut self, w: Watermark, now: ProcessingTime) {
        let Some(s) = self.spill.as_mut() else {
            return;
        };
        for (domain, upto) in [
            (Domain::EventTime, w.millis()),
            (Domain::ProcessingTime, now.millis()),
        ] {
            while s.tier.bound_due(domain, upto).is_some() {
                s.tier.take_due(&mut self.store, domain, upto, usize::MAX);
            }
        }
    }

    /// After a batch end (or a restored key): when the hot tier may have outgrown its
    /// budget, measures it and, over budget, evicts its coldest keys down to three
    /// quarters of it.
    fn check_budget(&mut self, events: u64) {
        let Some(s) = self.spill.as_mut() else {
            return;
        };
        if !s.tier.should_check(self.store.len(), events) {
            return;
        }
        let StatefulSpill {
            tier,
            json_len,
            buf,
        } = &mut **s;
        let mut costs = StatefulCosts {
            json_len: *json_len,
            buf,
            seen: 0,
            sampled: 0,
            sum: 0,
            state_bytes: 0,
        };
        tier.evict(&mut self.store, None, self.bound_changes, &mut costs);
    }

    /// Sets what happens to late events.
    pub fn with_late_policy(mut self, policy: LatePolicy) -> Self {
        self.late_policy = policy;
        self
    }

    /// Lets a key's state expire once `ttl` of processing time has passed since a call
    /// last wrote it (see the [module docs](self)): the state of keys that stop coming
    /// does not stay forever, without a timer in the function.
    pub fn with_state_ttl(mut self, ttl: DurationMs) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The watermark of the open (or next) batch.
    pub fn watermark(&self) -> Watermark {
        self.watermark
    }

    /// Keys with state or a pending timeout, in memory or spilled.
    pub fn keys(&self) -> usize {
        self.store.len() + self.spill.as_ref().map_or(0, |s| s.tier.keys)
    }

    /// Batches ended so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The state of `key`, if any (for inspection and tests). With a spill store, only
    /// a key in memory is seen: [`with_state`](Self::with_state) sees them all.
    pub fn state(&self, key: &str) -> Option<&S> {
        let id = self.store.find(key.as_bytes())?;
        self.store.state(id).state.as_ref()
    }

    /// Calls `f` with the state of `key` (`None`: it has none), in memory or spilled.
    /// Errors are the spill store's.
    pub fn with_state<R>(
        &self,
        key: &str,
        f: impl FnOnce(Option<&S>) -> R,
    ) -> Result<R, SpillError> {
        if let Some(id) = self.store.find(key.as_bytes()) {
            return Ok(f(self.store.state(id).state.as_ref()));
        }
        let mut f = Some(f);
        let mut out = None;
        if let Some(s) = self.spill.as_ref().filter(|s| s.tier.keys > 0) {
            s.tier.store().peek(key.as_bytes(), &mut |ks| {
                if let Some(f) = f.take() {
                    out = Some(f(ks.state.as_ref()));
                }
            })?;
        }
        Ok(match out {
            Some(r) => r,
            None => f.take().expect("not called yet")(None),
        })
    }

    /// Every key in memory with state, and its state, in no particular order (with a
    /// spill store, the spilled keys are not among them).
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
        self.push_inner(key, time, event, None, true)
    }

    /// As [`push`](Self::push), with the key's rank in the batch given (used on its
    /// first event in the batch), and without showing the time to the watermark
    /// strategy (call [`observe`](Self::observe) for that): a job running its keys on
    /// several operators ranks keys by their first appearance in the whole batch and
    /// shows every time to the one operator that keeps time.
    #[must_use = "a late event is handed back; send it to a late-event output"]
    pub fn push_ranked(
        &mut self,
        key: &str,
        time: EventTime,
        event: E,
        rank: u32,
    ) -> Option<LateEvent<E>> {
        self.push_inner(key, time, event, Some(rank), false)
    }

    /// Whether an event at `time` pushed now would be handed back as late.
    pub fn is_late(&self, time: EventTime) -> bool {
        self.late_policy == LatePolicy::Drop && self.watermark.has_reached(time)
    }

    /// Opens a batch if none is open (reading the clock) and returns its processing
    /// time.
    pub fn begin_batch(&mut self) -> ProcessingTime {
        self.open_batch().now
    }

    /// Shows `time` to the watermark strategy without an event: a job running its keys
    /// on several operators shows every event's time to the one that keeps time.
    pub fn observe(&mut self, time: EventTime) {
        self.strategy.observe(time);
    }

    /// The watermark the open batch will end at.
    pub fn next_watermark(&self) -> Watermark {
        self.watermark.max(self.strategy.current())
    }

    /// The clock's processing time now.
    pub fn now(&self) -> ProcessingTime {
        self.clock.now()
    }

    fn push_inner(
        &mut self,
        key: &str,
        time: EventTime,
        event: E,
        rank: Option<u32>,
        observe: bool,
    ) -> Option<LateEvent<E>> {
        let mut batch = self.open_batch();
        batch.events += 1;
        let w = self.watermark;
        if observe {
            self.strategy.observe(time);
        }
        if self.is_late(time) {
            batch.late += 1;
            self.open = Some(batch);
            return Some(LateEvent {
                event,
                time,
                watermark: w,
            });
        }
        let id = self.slot_of(key.as_bytes());
        let this_batch = self.batches + 1;
        let ks = self.store.state_mut(id);
        if ks.batch != this_batch {
            ks.batch = this_batch;
            ks.rank = rank.unwrap_or(batch.keys);
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
        self.end_batch_ordered(f, &mut |_, o| emit(o))
    }

    /// As [`end_batch`](Self::end_batch), each output with its call's [`CallOrder`].
    pub fn end_batch_ordered<F, R>(
        &mut self,
        f: &mut F,
        emit: &mut impl FnMut(CallOrder<'_>, R::Item),
    ) -> BatchReport
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

        if self.spill_failed() {
            // A key of this batch may not have been read back: no calls.
            self.pending.clear();
        }
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
            let call = Call {
                timed_out: None,
                fired: None,
                watermark: self.watermark,
                now: batch.now,
                keep: false,
            };
            self.call(id, group, call, CallSeed::Data(rank), f, emit, &mut report);
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
        self.check_budget(batch.events.max(1));
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
        let mut emit = |_: CallOrder<'_>, o| emit(o);
        let mut report = if self.open.is_some() {
            self.end_batch_ordered(f, &mut emit)
        } else {
            BatchReport::default()
        };
        let now = self.clock.now();
        report.then(self.finish_at(now, f, &mut emit));
        report
    }

    /// Moves the watermark to `w` without an event (an idle input, docs/semantics.md
    /// S-32) and ends an empty batch: the timeouts and timers due by then, or by the
    /// clock's processing time, fire. A `w` at or behind the watermark changes only
    /// processing time.
    pub fn advance_to<F, R>(
        &mut self,
        w: Watermark,
        f: &mut F,
        emit: &mut impl FnMut(CallOrder<'_>, R::Item),
    ) -> BatchReport
    where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let mut report = BatchReport::default();
        if self.open.is_some() {
            // An open batch ends first, at the watermark its events give.
            report = self.end_batch_ordered(f, emit);
        }
        self.raise_watermark(w);
        report.then(self.end_batch_ordered(f, emit));
        report
    }

    /// Moves the watermark to `w` without an event (an idle input, docs/semantics.md
    /// S-32), for the next batch end to fire what is due by then; a `w` at or behind the
    /// watermark does nothing. Later events are judged against it. Call it with no batch
    /// open ([`advance_to`](Self::advance_to) ends one first): a job whose keys run on
    /// several operators moves the one that keeps time, and the others follow it at the
    /// batch end.
    pub fn raise_watermark(&mut self, w: Watermark) {
        if w > self.watermark {
            // The batch end keeps the larger of this and what the strategy says; the
            // strategy goes on from it, as after a restore at this watermark.
            self.watermark = w;
            self.strategy.resume_at(w);
        }
    }

    /// The second half of [`finish`](Self::finish), with no batch open: the watermark
    /// becomes +∞ and what is due then, or at processing time `now`, fires.
    pub fn finish_at<F, R>(
        &mut self,
        now: ProcessingTime,
        f: &mut F,
        emit: &mut impl FnMut(CallOrder<'_>, R::Item),
    ) -> BatchReport
    where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let mut report = BatchReport::default();
        self.watermark = Watermark::MAX;
        self.fire_timeouts(now, f, emit, &mut report);
        self.check_budget(1);
        report.watermark = Some(self.watermark);
        report
    }

    /// Calls every key whose timeout or registered timer is due at the current
    /// watermark or at `now`, and clears the state whose TTL ran out.
    fn fire_timeouts<F, R>(
        &mut self,
        now: ProcessingTime,
        f: &mut F,
        emit: &mut impl FnMut(CallOrder<'_>, R::Item),
        report: &mut BatchReport,
    ) where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let w = self.watermark;
        self.unspill_due(w, now);
        if self.spill_failed() {
            return;
        }
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        while let Some(id) = self.store.pop_due(w) {
            let ks = self.store.state(id);
            let mut later: Option<EventTime> = None;
            if let Some(d) = ks.event_timeout {
                if w.has_reached(d) {
                    due.push((Due::Timeout(TimeoutKind::EventTime), d.millis(), id));
                } else {
                    later = Some(d);
                }
            }
            for &t in &ks.timers {
                if let Timer::EventTime(d) = t {
                    if w.has_reached(d) {
                        due.push((Due::Timer(t), d.millis(), id));
                    } else {
                        later = Some(later.map_or(d, |l| l.min(d)));
                    }
                }
            }
            // What is not due yet (a timeout moved later since it was scheduled, later
            // timers) is scheduled again.
            if let Some(d) = later {
                self.store.schedule(id, d);
            }
        }
        while let Some(id) = self.store.pop_due_processing(now) {
            let ks = self.store.state(id);
            let mut later: Option<ProcessingTime> = None;
            let mut keep_later = |d: ProcessingTime| later = Some(later.map_or(d, |l| l.min(d)));
            match ks.proc_timeout {
                // One timeout call per key: one due by event time already has it.
                Some(_) if ks.event_timeout.is_some_and(|d| w.has_reached(d)) => {}
                Some(d) if d <= now => {
                    due.push((Due::Timeout(TimeoutKind::ProcessingTime), d.millis(), id));
                }
                Some(d) => keep_later(d),
                None => {}
            }
            for &t in &ks.timers {
                if let Timer::ProcessingTime(d) = t {
                    if d <= now {
                        due.push((Due::Timer(t), d.millis(), id));
                    } else {
                        keep_later(d);
                    }
                }
            }
            match ks.expires {
                Some(d) if d <= now => due.push((Due::Expire, d.millis(), id)),
                Some(d) => keep_later(d),
                None => {}
            }
            if let Some(d) = later {
                self.store.schedule_processing(id, d);
            }
        }
        let store = &self.store;
        due.sort_by(|a, b| {
            (a.0.domain(), a.1, store.key(a.2), a.0).cmp(&(b.0.domain(), b.1, store.key(b.2), b.0))
        });
        // A key with more due after this one is not forgotten in between.
        let mut left: std::collections::HashMap<SlotId, u32> = std::collections::HashMap::new();
        for &(_, _, id) in &due {
            *left.entry(id).or_default() += 1;
        }
        for &(what, deadline, id) in &due {
            let n = left.get_mut(&id).expect("counted");
            *n -= 1;
            let keep = *n > 0;
            let call = |timed_out, fired| Call {
                timed_out: Some(timed_out),
                fired,
                watermark: w,
                now,
                keep,
            };
            match what {
                Due::Timeout(kind) => {
                    let seed = CallSeed::Due(what, deadline);
                    self.call(id, Vec::new(), call(kind, None), seed, f, emit, report);
                    report.timeout_calls += 1;
                }
                Due::Timer(t) => {
                    // Deleted by a call made since it became due: it does not fire.
                    let timers = &mut self.store.state_mut(id).timers;
                    let Ok(at) = timers.binary_search(&t) else {
                        self.forget_if_empty(id, keep);
                        continue;
                    };
                    timers.remove(at);
                    let seed = CallSeed::Due(what, deadline);
                    self.call(
                        id,
                        Vec::new(),
                        call(t.kind(), Some(t)),
                        seed,
                        f,
                        emit,
                        report,
                    );
                    report.timeout_calls += 1;
                }
                Due::Expire => {
                    let ks = self.store.state_mut(id);
                    if ks.expires.is_some_and(|d| d <= now) {
                        ks.state = None;
                        ks.expires = None;
                    }
                    self.forget_if_empty(id, keep);
                }
            }
        }
        self.due = due;
    }

    fn forget_if_empty(&mut self, id: SlotId, keep: bool) {
        if !keep && self.store.state(id).is_empty() {
            self.store.remove(id);
        }
    }

    /// One call of the user function for the key in slot `id`.
    #[allow(clippy::too_many_arguments)]
    fn call<F, R>(
        &mut self,
        id: SlotId,
        events: Vec<E>,
        call: Call,
        seed: CallSeed,
        f: &mut F,
        emit: &mut impl FnMut(CallOrder<'_>, R::Item),
        report: &mut BatchReport,
    ) where
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        let ttl = self.ttl;
        let (key_bytes, ks) = self.store.key_and_state_mut(id);
        let order = match seed {
            CallSeed::Data(rank) => CallOrder::Data(rank, key_bytes),
            CallSeed::Due(what, deadline) => {
                CallOrder::Due(what.domain(), deadline, key_bytes, DueRank(what))
            }
        };
        let key = String::from_utf8_lossy(key_bytes);
        // Expired state is never handed to a call.
        if ks.expires.is_some_and(|d| d <= call.now) {
            ks.state = None;
            ks.expires = None;
        }
        // A timeout lasts until the key's next call (Spark's rule).
        ks.event_timeout = None;
        ks.proc_timeout = None;
        let mut handle = GroupState {
            state: &mut ks.state,
            timed_out: call.timed_out,
            watermark: call.watermark,
            now: call.now,
            event_timeout: None,
            proc_timeout: None,
            timers: std::mem::take(&mut ks.timers),
            fired: call.fired,
            written: false,
        };
        for out in f(&key, events, &mut handle) {
            report.outputs += 1;
            emit(order, out);
        }
        let (event_timeout, proc_timeout, written) =
            (handle.event_timeout, handle.proc_timeout, handle.written);
        ks.timers = handle.timers;
        ks.event_timeout = event_timeout;
        ks.proc_timeout = proc_timeout;
        ks.expires = match (ttl, &ks.state) {
            (Some(ttl), Some(_)) if written || ks.expires.is_none() => Some(call.now.plus(ttl)),
            (Some(_), Some(_)) => ks.expires,
            _ => None,
        };
        if ks.is_empty() && !call.keep {
            self.store.remove(id);
            return;
        }
        let (event, processing) = (ks.next_event_deadline(), ks.next_processing_deadline());
        if let Some(t) = event {
            self.store.schedule(id, t);
        }
        if let Some(t) = processing {
            self.store.schedule_processing(id, t);
        }
    }
}

/// How one call is made.
#[derive(Debug, Clone, Copy)]
struct Call {
    timed_out: Option<TimeoutKind>,
    fired: Option<Timer>,
    watermark: Watermark,
    now: ProcessingTime,
    /// More is due for the key in this round: keep it even if it has nothing left.
    keep: bool,
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
        // Every key's record, in key order: those in memory, then the spilled ones.
        let mut entries: Vec<(KeyBytes, Vec<u8>)> = Vec::with_capacity(self.keys());
        for (_, key, ks) in self.store.iter() {
            let mut record = Vec::new();
            encode_key_record(key, ks, &mut record)?;
            entries.push((KeyBytes::from_slice(key), record));
        }
        self.for_each_spilled(|key, ks| {
            let mut record = Vec::new();
            encode_key_record(key, ks, &mut record)?;
            entries.push((KeyBytes::from_slice(key), record));
            Ok(())
        })?;
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));

        let mut out = Vec::with_capacity(
            32 + entries
                .iter()
                .map(|e| 8 + e.0.len() + e.1.len())
                .sum::<usize>(),
        );
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.watermark.millis().to_le_bytes());
        out.extend_from_slice(&self.batches.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (key, record) in entries {
            put_len(&mut out, key.len());
            out.extend_from_slice(&key);
            out.extend_from_slice(&record);
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
        if version != SNAPSHOT_VERSION && version != 1 {
            return Err(SnapshotError::UnsupportedVersion(version));
        }
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(*sum) {
            return Err(SnapshotError::Checksum);
        }
        let _reserved = u16::from_le_bytes(r.array()?);
        let watermark = i64::from_le_bytes(r.array()?);
        let batches = u64::from_le_bytes(r.array()?);
        let count = u64::from_le_bytes(r.array()?);

        let mut keys = Restored::new(self.spill.is_some());
        for _ in 0..count {
            let len = r.len()?;
            let key = r.take(len)?;
            let start = r.at;
            let ks = decode_key_record::<S>(key, &mut r)?;
            keys.add(key, &body[start..r.at], ks);
        }
        if r.at != body.len() {
            return Err(SnapshotError::Truncated);
        }
        self.install(Watermark(watermark), batches, keys)
    }

    /// Starts (or stops) remembering which keys change, for incremental checkpoints
    /// ([`encode_state`](Self::encode_state) with `base == false`).
    pub fn track_changes(&mut self, on: bool) {
        self.tracking = on;
        self.store.track_changes(on);
    }

    /// The keyed state for a checkpoint, key by key, between batches: every key
    /// (`base`), or the keys changed since the last call (`None`: removed). Each value
    /// is one key's record of the snapshot layout (flags, timeouts, timers, expiry,
    /// state as JSON: see [`SNAPSHOT_MAGIC`]); [`restore_state`](Self::restore_state)
    /// reads them back.
    pub fn encode_state(
        &mut self,
        base: bool,
        mut put: impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        if base {
            self.store.forget_changes();
            if let Some(s) = self.spill.as_mut() {
                s.tier.forget_changes();
            }
            return self.for_each_key_record(|key, record| put(key, Some(record)));
        }
        let mut buf = Vec::new();
        let mut failed = None;
        let mut one = |key: &[u8], ks: Option<&KeyState<S>>| {
            if failed.is_some() {
                return;
            }
            match ks {
                None => put(key, None),
                Some(ks) => {
                    buf.clear();
                    match encode_key_record(key, ks, &mut buf) {
                        Ok(()) => put(key, Some(&buf)),
                        Err(e) => failed = Some(e),
                    }
                }
            }
        };
        match self.spill.as_mut() {
            Some(s) => s
                .tier
                .drain_changes(&mut self.store, |key, ks| one(key, ks)),
            None => self.store.drain_changes(|key, ks| one(key, ks)),
        }
        if let Some(e) = self.take_spill_error() {
            return Err(e.into());
        }
        failed.map_or(Ok(()), Err)
    }

    /// Calls `f` with every spilled key and its state (none without a spill store).
    fn for_each_spilled(
        &self,
        mut f: impl FnMut(&[u8], &KeyState<S>) -> Result<(), SnapshotError>,
    ) -> Result<(), SnapshotError> {
        let Some(s) = self.spill.as_ref().filter(|s| s.tier.keys > 0) else {
            return Ok(());
        };
        let mut failed = None;
        s.tier.store().for_each(&mut |key, ks| {
            if failed.is_none()
                && let Err(e) = f(key, ks)
            {
                failed = Some(e);
            }
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// Calls `put` with every key and its record (as [`encode_state`](Self::encode_state)
    /// writes it with `base`), changing nothing: a snapshot taken between batches that
    /// leaves the tracked changes alone.
    pub fn for_each_key_record(
        &self,
        mut put: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), SnapshotError> {
        let mut buf = Vec::new();
        for (_, key, ks) in self.store.iter() {
            buf.clear();
            encode_key_record(key, ks, &mut buf)?;
            put(key, &buf);
        }
        self.for_each_spilled(|key, ks| {
            buf.clear();
            encode_key_record(key, ks, &mut buf)?;
            put(key, &buf);
            Ok(())
        })
    }

    /// Checks that `record` is a key record [`restore_key`](Self::restore_key) takes
    /// (as [`encode_state`](Self::encode_state) wrote it, for this state type),
    /// changing nothing: a restore that must refuse a checkpoint whole checks every key
    /// before putting any.
    pub fn check_key(&self, key: &[u8], record: &[u8]) -> Result<(), SnapshotError> {
        let mut r = Reader {
            bytes: record,
            at: 0,
        };
        decode_key_record::<S>(key, &mut r)?;
        if r.at != record.len() {
            return Err(SnapshotError::Truncated);
        }
        Ok(())
    }

    /// Puts one key back from its record (as [`encode_state`](Self::encode_state)
    /// wrote it), between batches, replacing what the key held: a restore key by key,
    /// after [`restore_state`](Self::restore_state) set the watermark. On error nothing
    /// changes.
    pub fn restore_key(&mut self, key: &[u8], record: &[u8]) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        let mut r = Reader {
            bytes: record,
            at: 0,
        };
        let ks = decode_key_record::<S>(key, &mut r)?;
        if r.at != record.len() {
            return Err(SnapshotError::Truncated);
        }
        put_key(&mut self.store, key, ks);
        self.check_budget(0);
        self.take_spill_error().map_or(Ok(()), |e| Err(e.into()))
    }

    /// Replaces the keyed state with `keys` (key, record as
    /// [`encode_state`](Self::encode_state) wrote it), the watermark and the number of
    /// batches ended. On error the operator is left unchanged.
    pub fn restore_state<'k>(
        &mut self,
        watermark: Watermark,
        batches: u64,
        keys: impl IntoIterator<Item = (&'k [u8], &'k [u8])>,
    ) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        let mut restored = Restored::new(self.spill.is_some());
        for (key, record) in keys {
            let mut r = Reader {
                bytes: record,
                at: 0,
            };
            let ks = decode_key_record::<S>(key, &mut r)?;
            if r.at != record.len() {
                return Err(SnapshotError::Truncated);
            }
            restored.add(key, record, ks);
        }
        self.install(watermark, batches, restored)
    }

    /// Replaces the keyed state with the restored `keys` — with a spill store, decoding
    /// them again and evicting as they come (what the store held goes first) — and sets
    /// the watermark and the number of batches ended.
    fn install(
        &mut self,
        watermark: Watermark,
        batches: u64,
        keys: Restored<'_, S>,
    ) -> Result<(), SnapshotError> {
        match keys.store {
            Some(mut store) => {
                store.track_changes(self.tracking);
                self.store = store;
            }
            None => {
                if let Some(s) = self.spill.as_mut() {
                    s.tier.clear()?;
                }
                let mut store = KeyedStore::default();
                store.track_changes(self.tracking);
                self.store = store;
                for (key, record) in keys.records {
                    let mut r = Reader {
                        bytes: record,
                        at: 0,
                    };
                    let ks = decode_key_record(key, &mut r).expect("decoded before");
                    put_key(&mut self.store, key, ks);
                    self.check_budget(0);
                }
                if let Some(e) = self.take_spill_error() {
                    return Err(e.into());
                }
            }
        }
        self.watermark = match watermark.millis() {
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

/// One key's record: flags, timeouts, timers, expiry, state as JSON (the per-key part
/// of the layout of [`SNAPSHOT_MAGIC`], after the key).
fn encode_key_record<S: Serialize>(
    key: &[u8],
    ks: &KeyState<S>,
    out: &mut Vec<u8>,
) -> Result<(), SnapshotError> {
    write_key_record(ks, out).map_err(|source| SnapshotError::State {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

/// [`encode_key_record`] without the key: the error is the state's JSON writer's, the
/// only thing that can refuse.
fn write_key_record<S: Serialize>(
    ks: &KeyState<S>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let flags = u8::from(ks.state.is_some())
        | u8::from(ks.event_timeout.is_some()) << 1
        | u8::from(ks.proc_timeout.is_some()) << 2
        | u8::from(!ks.timers.is_empty()) << 3
        | u8::from(ks.expires.is_some()) << 4;
    out.push(flags);
    if let Some(t) = ks.event_timeout {
        out.extend_from_slice(&t.millis().to_le_bytes());
    }
    if let Some(t) = ks.proc_timeout {
        out.extend_from_slice(&t.millis().to_le_bytes());
    }
    if !ks.timers.is_empty() {
        put_len(out, ks.timers.len());
        for t in &ks.timers {
            out.push(u8::from(t.kind() == TimeoutKind::ProcessingTime));
            out.extend_from_slice(&t.millis().to_le_bytes());
        }
    }
    if let Some(t) = ks.expires {
        out.extend_from_slice(&t.millis().to_le_bytes());
    }
    if let Some(s) = &ks.state {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        serde_json::to_writer(&mut *out, s)?;
        let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    Ok(())
}

/// Reads one key's record (see [`encode_key_record`]).
fn decode_key_record<S: DeserializeOwned>(
    key: &[u8],
    r: &mut Reader<'_>,
) -> Result<KeyState<S>, SnapshotError> {
    let key_text = std::str::from_utf8(key).map_err(|_| SnapshotError::BadKey)?;
    let flags = r.array::<1>()?[0];
    let event_timeout = (flags & 2 != 0)
        .then(|| r.array().map(|b| EventTime(i64::from_le_bytes(b))))
        .transpose()?;
    let proc_timeout = (flags & 4 != 0)
        .then(|| r.array().map(|b| ProcessingTime(i64::from_le_bytes(b))))
        .transpose()?;
    let mut timers = Vec::new();
    if flags & 8 != 0 {
        for _ in 0..r.len()? {
            let domain = r.array::<1>()?[0];
            let t = i64::from_le_bytes(r.array()?);
            timers.push(match domain {
                0 => Timer::EventTime(EventTime(t)),
                1 => Timer::ProcessingTime(ProcessingTime(t)),
                _ => return Err(SnapshotError::Truncated),
            });
        }
        timers.sort_unstable();
        timers.dedup();
    }
    let expires = (flags & 16 != 0)
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
    Ok(KeyState {
        state,
        event_timeout,
        proc_timeout,
        timers,
        expires,
        ..KeyState::default()
    })
}

/// One key's checkpoint record (as [`StatefulOperator::encode_state`] writes it) as
/// JSON, for `sessionizer inspect`: the state as the job wrote it, the timeouts, the
/// registered timers and the expiry, times as RFC 3339.
pub fn describe_record(key: &[u8], record: &[u8]) -> Result<serde_json::Value, SnapshotError> {
    use serde_json::json;
    let mut r = Reader {
        bytes: record,
        at: 0,
    };
    let ks: KeyState<serde_json::Value> = decode_key_record(key, &mut r)?;
    if r.at != record.len() {
        return Err(SnapshotError::Truncated);
    }
    let time = |ms: i64| sessionizer_core::timefmt::format_rfc3339_ms(EventTime(ms));
    let timers: Vec<serde_json::Value> = ks
        .timers
        .iter()
        .map(|t| match t {
            Timer::EventTime(t) => json!({"event_time": time(t.millis())}),
            Timer::ProcessingTime(t) => json!({"processing_time": time(t.millis())}),
        })
        .collect();
    Ok(json!({
        "state": ks.state,
        "event_timeout": ks.event_timeout.map(|t| time(t.millis())),
        "processing_timeout": ks.proc_timeout.map(|t| time(t.millis())),
        "timers": timers,
        "expires": ks.expires.map(|t| time(t.millis())),
    }))
}

/// The keys of a restore, each read once (so a damaged one refuses the restore before
/// anything changes): without a spill store decoded into the store they will live in;
/// with one only checked, and decoded again as they go in, so that the whole state is
/// never in memory at once.
struct Restored<'r, S> {
    store: Option<KeyedStore<KeyState<S>>>,
    records: Vec<(&'r [u8], &'r [u8])>,
}

impl<'r, S> Restored<'r, S> {
    fn new(spilling: bool) -> Self {
        Restored {
            store: (!spilling).then(KeyedStore::default),
            records: Vec::new(),
        }
    }

    /// `key` with its `record`, decoded as `ks`.
    fn add(&mut self, key: &'r [u8], record: &'r [u8], ks: KeyState<S>) {
        match &mut self.store {
            Some(store) => put_key(store, key, ks),
            None => self.records.push((key, record)),
        }
    }
}

/// Puts a decoded key into `store` with its timers scheduled.
fn put_key<S>(store: &mut KeyedStore<KeyState<S>>, key: &[u8], ks: KeyState<S>) {
    let (event, processing) = (ks.next_event_deadline(), ks.next_processing_deadline());
    let id = store.restore(key, ks);
    if let Some(t) = event {
        store.schedule(id, t);
    }
    if let Some(t) = processing {
        store.schedule_processing(id, t);
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
