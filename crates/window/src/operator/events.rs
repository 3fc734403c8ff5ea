//! One event through the session window: judged against the watermark (late,
//! duplicate), then applied to its key's sessions (created, extended or merged, with
//! the retractions that causes).

use super::{Emit, LateReason, SessionOperator, TypedEvent, Verdict};
use crate::aggregate::{Accumulate, SessionAggregate};
use crate::keyed::{SlotId, key_hash};
use crate::session::{Arrival, Session};
use sessionizer_core::EventTime;
use smallvec::SmallVec;

impl<A: SessionAggregate> SessionOperator<A> {
    /// Judges one valid event against the current watermark and applies it if it is
    /// neither too late nor a duplicate. Retractions caused by the event are emitted
    /// right away; everything else waits for [`advance_to`](Self::advance_to).
    pub fn on_typed<I>(&mut self, ev: &TypedEvent<'_, I>, out: &mut impl Emit<A>) -> Verdict
    where
        A: Accumulate<I>,
        I: ?Sized,
    {
        self.on_typed_hashed(ev, key_hash(ev.key), out)
    }

    /// Asks the CPU for the index entry the lookup of a key with [`key_hash`] `hash`
    /// reads first. With millions of keys, calling it some events ahead (and
    /// [`prefetch_state`](Self::prefetch_state) a few events ahead) lets the cache misses
    /// of several events overlap.
    #[inline]
    pub fn prefetch_index(&self, hash: u64) {
        self.store.prefetch_index(hash);
    }

    /// Asks the CPU for the state of the key with [`key_hash`] `hash` (its index entry
    /// should be in cache: see [`prefetch_index`](Self::prefetch_index)).
    #[inline]
    pub fn prefetch_state(&self, hash: u64) {
        self.store.prefetch_slot(hash);
    }

    /// [`on_typed`](Self::on_typed) for a key whose [`key_hash`] is `hash`.
    #[inline]
    pub fn on_typed_hashed<I>(
        &mut self,
        ev: &TypedEvent<'_, I>,
        hash: u64,
        out: &mut impl Emit<A>,
    ) -> Verdict
    where
        A: Accumulate<I>,
        I: ?Sized,
    {
        // The rest of an advance stopped at its limit comes first (see advance_at_most).
        if self.group_next < self.group.len() {
            self.drain(usize::MAX, out);
        }
        self.observe_gap(ev.gap);
        let gap = ev.gap.millis();
        let arrival = Arrival {
            time: ev.time.millis(),
            end: ev.time.millis().saturating_add(gap),
            seq: ev.seq,
            dedup: ev.dedup,
            input: ev.input,
        };

        let mut slot = self.store.find_hashed(hash, ev.key);
        if slot.is_none() && self.spill.is_some() {
            slot = self.unspill(hash, ev.key);
        }
        if let Some(id) = slot {
            if let Some(verdict) = self.judge(id, &arrival) {
                return verdict;
            }
        } else if arrival
            .end
            .saturating_add(self.cfg.allowed_lateness.millis())
            <= self.watermark.millis()
        {
            return Verdict::Late(LateReason::WindowClosed);
        } else if arrival.time <= self.new_key_floor {
            // At or before the floor the key's new state would have.
            return Verdict::Late(LateReason::SessionFinal);
        }

        let id = match slot {
            Some(id) => id,
            None => {
                let id = self.store.slot_for_hashed(hash, ev.key);
                self.store.state_mut(id).set_floor(self.new_key_floor);
                id
            }
        };
        let (start, close) = self.apply(id, &arrival, out);
        let due = close.saturating_add(self.cfg.emit_delay());
        self.store.schedule(id, EventTime(due));
        self.changed = Some((id, start));
        self.check_budget(Some(id));
        Verdict::Applied
    }

    /// Lateness and dedup verdict for a key that has state; `None` means apply.
    /// `window_closed` comes first, then `session_final` (the event touches a final
    /// session, or lies at or before the key's floor), then duplicates
    /// (docs/semantics.md S-20).
    fn judge<I: ?Sized>(&self, id: SlotId, ev: &Arrival<'_, I>) -> Option<Verdict> {
        let state = self.store.state(id);
        let mut close = ev.end;
        let mut touches_final = false;
        for s in state.sessions().filter(|s| s.touches(ev.time, ev.end)) {
            if s.is_final() {
                touches_final = true;
            } else {
                close = close.max(s.close());
            }
        }
        if close.saturating_add(self.cfg.allowed_lateness.millis()) <= self.watermark.millis() {
            return Some(Verdict::Late(LateReason::WindowClosed));
        }
        if touches_final || ev.time <= state.floor() {
            return Some(Verdict::Late(LateReason::SessionFinal));
        }
        if let Some(h) = ev.dedup.filter(|_| self.cfg.dedup) {
            let seen = state
                .sessions()
                .any(|s| !s.is_final() && s.touches(ev.time, ev.end) && s.has_seen(h));
            if seen {
                return Some(Verdict::Duplicate);
            }
        }
        None
    }

    /// Creates, extends or merges; returns the resulting session's `(start, close)`.
    fn apply<I>(&mut self, id: SlotId, ev: &Arrival<'_, I>, out: &mut impl Emit<A>) -> (i64, i64)
    where
        A: Accumulate<I>,
        I: ?Sized,
    {
        let state = self.store.state_mut(id);
        if let Some(bounds) = state.extend_one(ev.time, ev.end) {
            // One session without contents, extended without moving its start.
            return bounds;
        }
        let (agg, dedup) = (&self.agg, self.cfg.dedup);
        if state.is_empty() && state.start_first(Session::new(ev, agg, dedup)) {
            // A new key.
            self.open_sessions += 1;
            return (ev.time, ev.end);
        }
        let (key, state) = self.store.key_and_state_mut(id);
        let (open, retractions) = (&mut self.open_sessions, &mut self.counts.retractions);
        state.edit(|sessions, _| {
            let mut touched: SmallVec<[usize; 4]> = sessions
                .iter()
                .enumerate()
                .filter(|(_, s)| s.touches(ev.time, ev.end))
                .map(|(i, _)| i)
                .collect();

            if touched.is_empty() {
                sessions.push(Session::new(ev, agg, dedup));
                *open += 1;
                return (ev.time, ev.end);
            }

            if let [only] = touched[..] {
                // One session touched (the common case): it takes the event.
                let s = &mut sessions[only];
                let emitted = s.was_emitted();
                if emitted && ev.time < s.start() {
                    out.retraction(key, EventTime(s.start()));
                    *retractions += 1;
                }
                let keeps_id = emitted && ev.time >= s.start();
                s.absorb_event(ev, agg);
                s.set_emitted(keeps_id);
                return (s.start(), s.close());
            }

            touched.sort_by_key(|&i| sessions[i].start());
            let new_start = ev.time.min(sessions[touched[0]].start());
            for &i in &touched {
                let s = &sessions[i];
                if s.was_emitted() && s.start() != new_start {
                    out.retraction(key, EventTime(s.start()));
                    *retractions += 1;
                }
            }
            let survivor_start = sessions[touched[0]].start();
            let keeps_id = sessions[touched[0]].was_emitted() && survivor_start == new_start;

            // Take the absorbed sessions out from the back so indices stay valid, then
            // fold them into the earliest one in start order.
            let mut absorbed: SmallVec<[Session<A::Acc>; 2]> = SmallVec::new();
            let mut by_index = touched[1..].to_vec();
            by_index.sort_unstable_by(|a, b| b.cmp(a));
            for i in by_index {
                absorbed.push(sessions.swap_remove(i));
            }
            absorbed.sort_by_key(Session::start);
            let target = sessions
                .iter()
                .position(|s| s.start() == survivor_start && !s.is_final())
                .expect("the earliest touched session is still there");
            let merged = &mut sessions[target];
            *open -= absorbed.len();
            for other in absorbed {
                merged.absorb_session(other, agg);
            }
            merged.absorb_event(ev, agg);
            merged.set_emitted(keeps_id);
            (merged.start(), merged.close())
        })
    }
}
