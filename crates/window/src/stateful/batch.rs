//! The batch driver of the stateful operator: pushing events into the open batch, the
//! data calls, the watermark step and the timeout and timer calls at its end, and the
//! order in which their outputs are emitted ([`CallOrder`]).

use super::BatchRules;
use super::{BatchReport, GroupState, LateEvent, LatePolicy, OpenBatch, StatefulOperator};
use super::{TimeoutKind, Timer};
use crate::clock::{Clock, ProcessingTime};
use crate::keyed::SlotId;
use crate::watermark::WatermarkStrategy;
use sessionizer_core::{EventTime, Watermark};

/// Something due for a key at a batch end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Due {
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

impl<E, S, W: WatermarkStrategy, C: Clock> StatefulOperator<E, S, W, C> {
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
        self.late_policy == LatePolicy::Drop && self.late_watermark().has_reached(time)
    }

    /// Opens a batch if none is open (reading the clock) and returns its processing
    /// time.
    pub fn begin_batch(&mut self) -> ProcessingTime {
        self.open_batch().now
    }

    /// Shows `time` to the watermark strategy without an event: a job running its keys
    /// on several operators shows every event's time to the one that keeps time. Not
    /// after [`follow_external_time`](Self::follow_external_time).
    pub fn observe(&mut self, time: EventTime) {
        if !self.external_time {
            self.strategy.observe(time);
        }
    }

    /// Shows the external time `time` to the watermark strategy (see
    /// [`follow_external_time`](Self::follow_external_time)).
    pub fn observe_external(&mut self, time: EventTime) {
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
        let w = self.late_watermark();
        if observe && !self.external_time {
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
                past_end: false,
            };
            self.call(id, group, call, CallSeed::Data(rank), f, emit, &mut report);
            report.data_calls += 1;
        }
        drop(events);
        self.pending = pending;

        if self.rules == BatchRules::Spark {
            self.fire_timeouts(batch.now, f, emit, &mut report);
            // This batch's watermark judges the next batch's late events.
            self.late_watermark = self.watermark;
        }
        let next = self.strategy.current();
        if next > self.watermark {
            self.watermark = next;
        }
        if self.rules == BatchRules::Standard {
            self.fire_timeouts(batch.now, f, emit, &mut report);
        }
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
    /// snapshot. With [`BatchRules::Spark`] a batch with no events (Spark's
    /// no-data micro-batch) runs first, at the watermark the last events lead to.
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
        if self.rules == BatchRules::Spark {
            report.then(self.end_batch_ordered(f, &mut emit));
        }
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
        // Spark's watermark never reaches +∞: the calls at the end of a bounded input
        // see the no-data batch's watermark, the one the last events led to, and what
        // they set to fire later never does (a finished job restored and finished again
        // calls nothing again).
        let past_end = self.rules == BatchRules::Spark && w == Watermark::MAX;
        let shown = if past_end && self.late_watermark != Watermark::MAX {
            self.late_watermark
        } else {
            w
        };
        for &(what, deadline, id) in &due {
            let n = left.get_mut(&id).expect("counted");
            *n -= 1;
            let keep = *n > 0;
            let call = |timed_out, fired| Call {
                timed_out: Some(timed_out),
                fired,
                watermark: shown,
                now,
                keep,
                past_end,
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
        ks.event_timeout = event_timeout.filter(|_| !call.past_end);
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
    /// A call at +∞ on Spark's rules: an event-time timeout it sets is never due.
    past_end: bool,
}
