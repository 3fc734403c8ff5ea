//! A watermark step of the session window: the timers that came due, the completed
//! sessions emitted in `(close, key, start)` order (in parts if asked), and sessions
//! finalized and forgotten afterwards.

use super::{Emit, EmitMode, SessionOperator, SessionView};
use crate::aggregate::SessionAggregate;
use crate::keyed::{SlotId, key_hash};
use sessionizer_core::{EventTime, Watermark};

impl<A: SessionAggregate> SessionOperator<A> {
    /// Moves the watermark to `w` (never backwards) and emits what the step made due:
    /// the `on-update` record of the session this step changed, then every completed
    /// session in `(close, key, start)` order. Then sessions past their lateness become
    /// final, and final bounds past their retention are forgotten, raising their key's
    /// floor to their close.
    pub fn advance_to(&mut self, w: Watermark, out: &mut impl Emit<A>) {
        self.advance_at_most(w, usize::MAX, out);
    }

    /// [`advance_to`](Self::advance_to) in parts: emits at most `max` completed
    /// sessions and returns whether more are due. Call it again (with the same `w`, or
    /// a later one) until it returns `false`: the records of all the calls together are
    /// exactly those of one `advance_to(w)`, in the same order, and memory does not
    /// grow with their number (the end of input emits every open session at once). An
    /// event given in between first emits the rest.
    pub fn advance_at_most(&mut self, w: Watermark, max: usize, out: &mut impl Emit<A>) -> bool {
        if w > self.watermark {
            self.watermark = w;
        }
        let w = self.watermark;
        // Every bound forgotten from now on closes at or before W - A - Gmax.
        let lateness = self.cfg.allowed_lateness.millis();
        self.new_key_floor = self.new_key_floor.max(
            w.millis()
                .saturating_sub(lateness)
                .saturating_sub(self.largest_gap),
        );
        if let Some((id, start)) = self.changed.take()
            && self.cfg.emit == EmitMode::OnUpdate
        {
            self.emit_update(id, start, w, out);
        }
        if self.group_next >= self.group.len() && !self.store.may_be_due(w) && !self.spilled_due(w)
        {
            // Nothing pending, no timer due: the common step.
            return false;
        }
        self.drain(max, out)
    }

    /// Emits up to `max` of the completed sessions due at the watermark, in `(close,
    /// key, start)` order; returns whether more are due.
    ///
    /// Keys come off the timer heap in deadline order. A key's timer is never later
    /// than the close of any of its sessions waiting to be emitted, so once no timer at
    /// or before close `c` is left, every session closing at `c` is known: they are
    /// emitted together, sorted by key. A key whose timer fired before its first due
    /// close is re-armed at that close; a key is retired (sessions finalized or
    /// forgotten, the timer re-armed or the key dropped) once its last due session is
    /// out. So only the sessions of one close time are ever held, never all that are due.
    pub(super) fn drain(&mut self, max: usize, out: &mut impl Emit<A>) -> bool {
        let w = self.watermark;
        let mut emitted = 0;
        let mut unspill_now = false;
        loop {
            while self.group_next < self.group.len() {
                if emitted == max {
                    return true;
                }
                let (id, start, last) = self.group[self.group_next];
                self.group_next += 1;
                self.emit(id, start, true, out);
                emitted += 1;
                if last {
                    self.retire(id, w);
                }
            }
            self.group.clear();
            self.group_next = 0;
            // Spilled keys due no later than the next timer in memory come back first
            // (a batch of them; memory's earlier timers fire before the next batch), and
            // only timers before the earliest deadline still spilled may fire.
            let mut upto = w;
            if let Some(bound) = self.spill_bound_due(w) {
                let in_memory = self.store.next_deadline_bound().unwrap_or(i64::MAX);
                if unspill_now || in_memory >= bound {
                    self.unspill_due(w.millis());
                }
                if let Some(bound) = self.spill_bound_due(w) {
                    upto = Watermark::at(EventTime(bound.saturating_sub(1)));
                }
            }
            unspill_now = false;
            let Some((id, deadline)) = self.store.pop_due_at(upto) else {
                if self.spilled_due(w) {
                    // Nothing in memory before the spilled keys: take them back.
                    unspill_now = true;
                    continue;
                }
                return false;
            };
            self.fire(id, deadline, w);
            // Every other key due at this very deadline joins the group.
            while self.store.next_deadline_bound() == Some(deadline) {
                if let Some((id, at)) = self.store.pop_due_at(Watermark::at(EventTime(deadline))) {
                    self.fire(id, at, w);
                }
            }
            if self.group.len() > 1 {
                let store = &self.store;
                self.group
                    .sort_unstable_by(|a, b| (store.key(a.0), a.1).cmp(&(store.key(b.0), b.1)));
            }
        }
    }

    /// A key's timer fired at `deadline` (at or before `w`): its session closing then
    /// joins the group to emit; with nothing closing then, the key is re-armed at its
    /// next due close, or retired when nothing of it is due to be emitted.
    fn fire(&mut self, id: SlotId, deadline: i64, w: Watermark) {
        // The earliest due session (close, start) and the close of the next one.
        let mut first: Option<(i64, i64)> = None;
        let mut second: Option<i64> = None;
        let delay = self.cfg.emit_delay();
        for s in self.store.state(id).sessions() {
            // When the session is due: its close, or with `final` emission its close
            // plus the lateness (always later by the same amount: the order of closes).
            let c = s.close().saturating_add(delay);
            if s.is_final() || !s.is_dirty() || !w.has_reached(EventTime(c)) {
                continue;
            }
            match first {
                Some((fc, _)) if fc <= c => second = Some(second.map_or(c, |x| x.min(c))),
                _ => {
                    second = first.map(|(fc, _)| fc);
                    first = Some((c, s.start()));
                }
            }
        }
        match first {
            None => self.retire(id, w),
            // The timer was early (the session grew since it was set).
            Some((due, _)) if due > deadline => self.store.schedule(id, EventTime(due)),
            Some((due, start)) => {
                // Two live sessions of one key never close at the same time (they would
                // touch), so the next due one closes later.
                let close = due.saturating_sub(delay);
                if let Some(next) = second {
                    self.store.schedule(id, EventTime(next));
                } else if w.millis() >= close.saturating_add(self.retention()) {
                    // The key is dropped once this session is out: its index entry is
                    // read then (at the end of input, for every key).
                    self.store.prefetch_index(key_hash(self.store.key(id)));
                }
                self.group.push((id, start, second.is_none()));
            }
        }
    }

    /// After its due sessions are emitted: sessions past their lateness become final,
    /// final bounds past their retention are forgotten (raising the key's floor), and
    /// the key is re-armed for what it waits for next, or dropped when nothing is left.
    /// How long after its close a session's bounds are remembered: `A + Gmax`.
    fn retention(&self) -> i64 {
        self.cfg
            .allowed_lateness
            .millis()
            .saturating_add(self.largest_gap)
    }

    fn retire(&mut self, id: SlotId, w: Watermark) {
        let lateness = self.cfg.allowed_lateness.millis();
        let retention = self.retention();
        let delay = self.cfg.emit_delay();
        let state = self.store.state_mut(id);
        let (next, finalized, empty) =
            match state.retire_one(w.millis(), lateness, retention, delay) {
                Some((next, finalized, empty)) => (next, usize::from(finalized), empty),
                None => state.edit(|sessions, floor| {
                    let mut next = i64::MAX;
                    let mut finalized = 0;
                    sessions.retain(|s| {
                        if !s.is_final() && w.millis() >= s.close().saturating_add(lateness) {
                            s.finalize();
                            finalized += 1;
                        }
                        if s.is_final() {
                            let forget_at = s.close().saturating_add(retention);
                            if w.millis() >= forget_at {
                                *floor = (*floor).max(s.close());
                                return false;
                            }
                            next = next.min(forget_at);
                        } else if s.is_dirty() {
                            next = next.min(s.close().saturating_add(delay));
                        } else {
                            next = next.min(s.close().saturating_add(lateness));
                        }
                        true
                    });
                    (next, finalized, sessions.is_empty())
                }),
            };
        self.open_sessions -= finalized;
        if empty {
            self.store.remove(id);
        } else {
            self.store.schedule(id, EventTime(next));
        }
    }

    fn emit_update(&mut self, id: SlotId, start: i64, w: Watermark, out: &mut impl Emit<A>) {
        let still_open = self
            .store
            .state(id)
            .live_at(start)
            .is_some_and(|s| !w.has_reached(EventTime(s.close())));
        if still_open {
            self.emit(id, start, false, out);
        }
    }

    fn emit(&mut self, id: SlotId, start: i64, complete: bool, out: &mut impl Emit<A>) {
        let (key, state) = self.store.key_and_state_mut(id);
        let Some((revision, s)) = state.take_revision(start, complete) else {
            return;
        };
        out.session(&SessionView {
            key,
            start: EventTime(s.start()),
            end: EventTime(s.last()),
            close: EventTime(s.close()),
            event_count: s.event_count(),
            revision,
            complete,
            aggregates: self.agg.view(s.acc()),
        });
        self.counts.sessions_emitted += 1;
    }
}
