//! The session window over a spill store (the `rocksdb` backend): what a key costs in
//! memory, which keys are evicted, and taking them back when an event or a deadline
//! needs them.

use super::{SessionOperator, WindowConfig};
use crate::aggregate::SessionAggregate;
use crate::keyed::{SlotId, Timed};
use crate::session::KeySessions;
use crate::spill::tier::{KeyCosts, Tier};
use crate::spill::{Deadlines, Domain, SpillCounts, SpillError, SpillStore};
use sessionizer_core::Watermark;

/// How many due keys a watermark step takes back from the spill store at a time.
const UNSPILL_BATCH: usize = 4096;

/// What a key costs in the hot tier besides its sessions' heap: its slot (key and
/// state), its index entry and its timer entry, with their tables' slack.
const KEY_BYTES: usize = 16 + std::mem::size_of::<KeySessions>() + 16;

/// What the session window tells its spill tier about its keys.
struct SessionCosts<'a, A: SessionAggregate> {
    agg: &'a A,
    lateness: i64,
    retention: i64,
    delay: i64,
}

impl<'a, A: SessionAggregate> SessionCosts<'a, A> {
    /// Of a window configured as `cfg` whose largest gap so far is `largest_gap`.
    fn new(agg: &'a A, cfg: &WindowConfig, largest_gap: i64) -> Self {
        let lateness = cfg.allowed_lateness.millis();
        SessionCosts {
            agg,
            lateness,
            retention: lateness.saturating_add(largest_gap),
            delay: cfg.emit_delay(),
        }
    }
}

impl<A: SessionAggregate> KeyCosts<KeySessions<A::Acc>> for SessionCosts<'_, A> {
    fn bytes(&mut self, key: &[u8], state: &KeySessions<A::Acc>) -> usize {
        KEY_BYTES + key.len().saturating_sub(16) + state.heap_bytes(self.agg)
    }

    /// The coldest keys are those with the earliest next deadline: with one gap for all
    /// it is the last event plus the gap, so they are the keys quiet for the longest in
    /// event time (LRU without a per-event write); each comes back at its deadline to
    /// be emitted.
    fn coldness(&self, state: &KeySessions<A::Acc>) -> i64 {
        state.next_action()
    }

    fn deadlines(&self, state: &KeySessions<A::Acc>) -> Deadlines {
        Deadlines::event(next_deadline(
            state,
            self.lateness,
            self.retention,
            self.delay,
        ))
    }
}

/// When the operator next acts on a key with `sessions` (see
/// [`SessionOperator::restore_key`]), `i64::MAX` for none; a changed session is due
/// `delay` after its close ([`WindowConfig::emit_delay`]).
fn next_deadline<Acc>(
    sessions: &KeySessions<Acc>,
    lateness: i64,
    retention: i64,
    delay: i64,
) -> i64 {
    sessions
        .sessions()
        .map(|s| {
            if s.is_final() {
                s.close().saturating_add(retention)
            } else if s.is_dirty() {
                s.close().saturating_add(delay)
            } else {
                s.close().saturating_add(lateness)
            }
        })
        .min()
        .unwrap_or(i64::MAX)
}

impl<A: SessionAggregate> SessionOperator<A> {
    /// Puts `store` below the hot tier (the `rocksdb` backend): once the keys in memory
    /// take more than about `hot_bytes`, the coldest (earliest next deadline) are
    /// evicted to it, and taken back when an event for them arrives or their deadline
    /// comes due. The output stays exactly that of an operator without one. Call it
    /// before the first event or restored key.
    pub fn spill_to(&mut self, store: Box<dyn SpillStore<KeySessions<A::Acc>>>, hot_bytes: usize) {
        self.spill = Some(Box::new(Tier::new(store, hot_bytes, KEY_BYTES)));
    }

    /// As [`spill_to`](Self::spill_to), with a store restored from a checkpoint's
    /// [`BaseImage`](crate::spill::BaseImage): it holds `keys` keys with `open_sessions`
    /// sessions not yet final, each with the deadline it was evicted with. Call it after
    /// the watermark and the largest gap are restored and before any other key is; the
    /// checkpoint's other keys then come with [`restore_over`](Self::restore_over).
    pub fn spill_restored(
        &mut self,
        store: Box<dyn SpillStore<KeySessions<A::Acc>>>,
        hot_bytes: usize,
        keys: usize,
        open_sessions: usize,
    ) -> Result<(), SpillError> {
        self.spill = Some(Box::new(Tier::restored(store, hot_bytes, KEY_BYTES, keys)?));
        self.open_sessions += open_sessions;
        Ok(())
    }

    /// Closes the spill store of an operator that has no key in memory, with the keys
    /// it held (a restore that started it from a checkpoint's copy gave up, or another
    /// store is about to open in its directory). Refused (`false`, nothing changed)
    /// while keys are in memory: their sessions would be counted twice.
    pub fn detach_spill(&mut self) -> bool {
        if !self.store.is_empty() {
            return false;
        }
        self.spill = None;
        // Every session not yet final was in the store.
        self.open_sessions = 0;
        true
    }

    /// Puts a key's newest state from a checkpoint over what a restored spill store
    /// ([`spill_restored`](Self::spill_restored)) holds of it: its copy there is
    /// dropped, then `sessions` are restored as [`restore_key`](Self::restore_key) does
    /// (`None`: the key has no state any more).
    pub fn restore_over(
        &mut self,
        key: &[u8],
        sessions: Option<KeySessions<A::Acc>>,
    ) -> Result<(), SpillError> {
        if let Some(spill) = self.spill.as_mut()
            && let Some(old) = spill.remove(key)?
        {
            self.open_sessions -= old.sessions().filter(|s| !s.is_final()).count();
        }
        if let Some(sessions) = sessions {
            self.restore_key(key, sessions);
        }
        Ok(())
    }

    /// The first error of the spill store since the last call, if any. The operator
    /// cannot go on correctly after one (a key it could not read back was treated as
    /// new): the caller stops before writing what the step emitted.
    pub fn take_spill_error(&mut self) -> Option<SpillError> {
        self.spill.as_mut().and_then(|s| s.take_error())
    }

    /// What the spill store has done (`None`: the operator has none).
    pub fn spill_counts(&self) -> Option<SpillCounts> {
        self.spill.as_ref().map(|s| s.counts())
    }

    /// When the operator next acts on a key with `sessions` (see
    /// [`restore_key`](Self::restore_key)), `i64::MAX` for none.
    pub(super) fn next_deadline(&self, sessions: &KeySessions<A::Acc>) -> i64 {
        SessionCosts::new(&self.agg, &self.cfg, self.largest_gap)
            .deadlines(sessions)
            .event
    }

    /// A key not in memory: taken back from the spill store if it is there.
    #[inline]
    pub(super) fn unspill(&mut self, hash: u64, key: &[u8]) -> Option<SlotId> {
        self.spill.as_mut()?.take_back(&mut self.store, hash, key)
    }

    /// Takes back from the spill store the keys due by `w` (some of them: at least
    /// every key of the earliest deadline), so that the timers of memory fire them in
    /// order with the others.
    pub(super) fn unspill_due(&mut self, w: i64) {
        if let Some(spill) = self.spill.as_mut() {
            spill.take_due(&mut self.store, Domain::EventTime, w, UNSPILL_BATCH);
        }
    }

    /// The earliest deadline in the spill store when it may be due at `w`.
    #[inline]
    pub(super) fn spill_bound_due(&self, w: Watermark) -> Option<i64> {
        self.spill
            .as_ref()
            .and_then(|s| s.bound_due(Domain::EventTime, w.millis()))
    }

    /// Whether the spill store holds a key due at `w`.
    #[inline]
    pub(super) fn spilled_due(&self, w: Watermark) -> bool {
        self.spill_bound_due(w).is_some()
    }

    /// After an applied event (or a restored key): when the hot tier may have outgrown
    /// its budget, measures it and, over budget, evicts its coldest keys down to three
    /// quarters of it. `keep` (the key of the current step) stays.
    #[inline]
    pub(super) fn check_budget(&mut self, keep: Option<SlotId>) {
        if let Some(spill) = self.spill.as_mut()
            && spill.should_check(self.store.len(), 1)
        {
            let mut costs = SessionCosts::new(&self.agg, &self.cfg, self.largest_gap);
            spill.evict(&mut self.store, keep, self.bound_changes, &mut costs);
        }
    }
}
