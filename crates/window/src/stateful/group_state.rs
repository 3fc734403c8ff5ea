//! The handle a stateful function gets on one key's state during one call
//! ([`GroupState`]), and the timeouts and registered timers it can set.

use crate::clock::ProcessingTime;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use std::fmt;

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
    pub(super) state: &'a mut Option<S>,
    pub(super) timed_out: Option<TimeoutKind>,
    pub(super) watermark: Watermark,
    pub(super) now: ProcessingTime,
    pub(super) event_timeout: Option<EventTime>,
    pub(super) proc_timeout: Option<ProcessingTime>,
    /// The key's registered timers, sorted, one per timestamp and domain.
    pub(super) timers: Vec<Timer>,
    pub(super) fired: Option<Timer>,
    /// The call wrote the state (`update`, `get_mut`): its TTL starts again.
    pub(super) written: bool,
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
