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
//! [`spill_to`](StatefulOperator::spill_to) puts a
//! [`SpillStore`](crate::spill::SpillStore) below the keyed store,
//! as for the session window (`crate::spill`): at a batch end (and while a restore
//! fills it), once the keys in memory take more than the budget, the keys that have
//! gone longest without an event are evicted (a key taken back for a timer, or
//! restored, counts as the oldest) with the deadlines of their next timers on both
//! clocks, and a key comes back
//! when an event for it arrives or before a batch end at which one of its timers, its
//! timeout or its state's expiry is due. The calls and their order are those of an
//! operator without one.

mod batch;
mod group_state;
mod record;
mod snapshot;
mod spill;

pub use batch::{CallOrder, DueRank};
pub use group_state::{GroupState, TimeoutKind, Timer};
pub use record::{KeyRecordCodec, describe_record};
pub use snapshot::{SNAPSHOT_MAGIC, SNAPSHOT_VERSION, SnapshotError};

use crate::clock::{Clock, ProcessingTime};
use crate::keyed::{KeyedStore, SlotId, Timed};
use crate::spill::SpillError;
use crate::watermark::WatermarkStrategy;
use batch::Due;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use spill::StatefulSpill;
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

/// The rules by which a batch judges late events and fires timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchRules {
    /// An event at or behind the batch's watermark is late; a timeout is checked after
    /// the batch's watermark step, so one due by the watermark the batch's events lead
    /// to fires at the end of that batch (the calls see that watermark).
    #[default]
    Standard,
    /// Spark's `applyInPandasWithState` / `flatMapGroupsWithState` (Spark 3.4 and
    /// later, one stateful operator): an event is late when it is at or behind the
    /// *previous* batch's watermark (Spark's watermark for late events); timeouts are
    /// checked against the batch's own watermark, after its data calls and before the
    /// watermark step — a timeout the batch's events make due fires in the next batch,
    /// or not at all if the key has events in it (its data call comes instead). A batch
    /// with no events is Spark's no-data micro-batch;
    /// [`finish`](StatefulOperator::finish) runs one before moving the watermark to +∞,
    /// and the calls at +∞ see the no-data batch's watermark (Spark's never reaches
    /// +∞; a timeout they set is never due). [`snapshot`](StatefulOperator::snapshot)
    /// keeps the watermark only: an operator restored from one judges late events by
    /// its own watermark until its next batch ends; the library's checkpoints keep both.
    Spark,
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
    /// [`follow_external_time`](Self::follow_external_time): events do not move the
    /// watermark strategy.
    external_time: bool,
    /// [`with_batch_rules`](Self::with_batch_rules).
    rules: BatchRules,
    /// With [`BatchRules::Spark`], the watermark late events are judged by: the
    /// previous batch's.
    late_watermark: Watermark,
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
            external_time: false,
            rules: BatchRules::default(),
            late_watermark: Watermark::MIN,
        }
    }

    /// From now on the events' times do not move the watermark strategy: only
    /// [`observe_external`](Self::observe_external) does (a task of a re-keyed topic,
    /// whose time is that of its upstream partitions).
    pub fn follow_external_time(&mut self) {
        self.external_time = true;
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

    /// Sets the rules by which batches judge late events and fire timeouts (default
    /// [`BatchRules::Standard`]).
    pub fn with_batch_rules(mut self, rules: BatchRules) -> Self {
        self.rules = rules;
        self
    }

    /// The watermark an event pushed now is judged late by: the batch's own, or with
    /// [`BatchRules::Spark`] the previous batch's.
    pub fn late_watermark(&self) -> Watermark {
        match self.rules {
            BatchRules::Standard => self.watermark,
            BatchRules::Spark => self.late_watermark,
        }
    }

    /// Sets the watermark late events are judged by until the next batch ends (with
    /// [`BatchRules::Spark`]; a restore puts back the one its checkpoint recorded).
    pub fn restore_late_watermark(&mut self, w: Watermark) {
        self.late_watermark = w;
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
}
