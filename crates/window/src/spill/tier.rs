//! An operator's side of its spill store, the same for both operators: which keys are
//! below the hot tier, when the hot tier is measured, how its coldest keys are evicted
//! and how keys come back (on an event, or when a timer on either clock is due), and
//! the changes of evicted keys that the next incremental checkpoint must still write.
//!
//! What differs between the operators is passed in: what a key costs in memory, how
//! cold it is, and the deadlines of its next timers.

use super::{Deadlines, Domain, SpillCounts, SpillError, SpillStore};
use crate::clock::ProcessingTime;
use crate::keyed::{KeyBytes, KeyedStore, NO_TIMER, SlotId, Timed, key_hash};
use sessionizer_core::EventTime;
use std::collections::HashSet;

/// What the operator tells the tier about its keys when it evicts.
pub(crate) trait KeyCosts<S> {
    /// The bytes `state` of `key` takes in the hot tier, its slot, index and timer
    /// entries included.
    fn bytes(&mut self, key: &[u8], state: &S) -> usize;
    /// How cold the key is: the smallest are evicted first.
    fn coldness(&self, state: &S) -> i64;
    /// The deadlines of the key's next timers, kept with it below.
    fn deadlines(&self, state: &S) -> Deadlines;
}

/// The keys of one operator below its hot tier.
pub(crate) struct Tier<S> {
    store: Box<dyn SpillStore<S>>,
    /// The hot tier's budget.
    hot_bytes: usize,
    /// Keys in the spill store.
    pub(crate) keys: usize,
    /// By [`Domain`]: a deadline at or before that of every key in the spill store on
    /// that clock (`i64::MAX`: none).
    bound: [i64; 2],
    /// The hot tier's size is checked when it holds this many keys, or after this many
    /// more events.
    check_keys: usize,
    check_events: u64,
    /// Keys evicted with changes the next incremental checkpoint must still write.
    dirty: HashSet<KeyBytes>,
    /// `dirty` outgrew its bound ([`Tier::evict`]) and was forgotten: the next
    /// checkpoint must be a base.
    pub(crate) changes_lost: bool,
    /// The first error of the spill store: the run stops with it.
    error: Option<SpillError>,
    evicted: u64,
    unspilled: u64,
    scratch: Vec<(KeyBytes, S, Deadlines)>,
}

impl<S: Timed + Default> Tier<S> {
    /// A tier below a hot tier of `hot_bytes`, whose keys cost about `key_bytes` each
    /// besides their heap.
    pub(crate) fn new(store: Box<dyn SpillStore<S>>, hot_bytes: usize, key_bytes: usize) -> Self {
        Tier {
            store,
            hot_bytes,
            keys: 0,
            bound: [i64::MAX; 2],
            check_keys: (hot_bytes / key_bytes.max(1)).max(1),
            check_events: 1 << 16,
            dirty: HashSet::new(),
            changes_lost: false,
            error: None,
            evicted: 0,
            unspilled: 0,
            scratch: Vec::new(),
        }
    }

    /// As [`new`](Self::new), below a store that already holds `keys` keys (restored
    /// from a checkpoint): they come back on their events and deadlines as if evicted.
    pub(crate) fn restored(
        store: Box<dyn SpillStore<S>>,
        hot_bytes: usize,
        key_bytes: usize,
        keys: usize,
    ) -> Result<Self, SpillError> {
        let bound = [
            store.earliest(Domain::EventTime)?,
            store.earliest(Domain::ProcessingTime)?,
        ];
        let mut tier = Tier::new(store, hot_bytes, key_bytes);
        tier.keys = keys;
        tier.bound = bound;
        Ok(tier)
    }

    /// Takes `key` out of the spill store for good (a restore replaces or removes it);
    /// its state if it was there.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Result<Option<S>, SpillError> {
        if self.keys == 0 {
            return Ok(None);
        }
        let taken = self.store.take(key)?;
        if taken.is_some() {
            self.keys -= 1;
        }
        Ok(taken.map(|(state, _)| state))
    }

    pub(crate) fn store(&self) -> &dyn SpillStore<S> {
        &*self.store
    }

    pub(crate) fn store_mut(&mut self) -> &mut dyn SpillStore<S> {
        &mut *self.store
    }

    /// Keeps the first error.
    fn failed(&mut self, e: SpillError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// The spill store has failed since the last [`take_error`](Self::take_error).
    pub(crate) fn has_failed(&self) -> bool {
        self.error.is_some()
    }

    pub(crate) fn take_error(&mut self) -> Option<SpillError> {
        self.error.take()
    }

    pub(crate) fn counts(&self) -> SpillCounts {
        SpillCounts {
            keys: self.keys,
            evicted: self.evicted,
            unspilled: self.unspilled,
            disk_bytes: self.store.disk_bytes(),
        }
    }

    /// Puts a key taken from the spill store back into `hot`, its timers armed at
    /// `deadlines`.
    fn place(
        hot: &mut KeyedStore<S>,
        hash: u64,
        key: &[u8],
        mut state: S,
        at: Deadlines,
    ) -> SlotId {
        state.set_timer(NO_TIMER);
        let id = hot.restore_hashed(hash, key, state);
        if at.event != Deadlines::NONE {
            hot.schedule(id, EventTime(at.event));
        }
        if at.processing != Deadlines::NONE {
            hot.schedule_processing(id, ProcessingTime(at.processing));
        }
        id
    }

    /// A key not in `hot`: taken back from the spill store into it, if it is there.
    #[cold]
    #[inline(never)]
    pub(crate) fn take_back(
        &mut self,
        hot: &mut KeyedStore<S>,
        hash: u64,
        key: &[u8],
    ) -> Option<SlotId> {
        if self.keys == 0 {
            return None;
        }
        let (state, at) = match self.store.take(key) {
            Ok(found) => found?,
            Err(e) => {
                self.failed(e);
                return None;
            }
        };
        self.keys -= 1;
        self.unspilled += 1;
        Some(Self::place(hot, hash, key, state, at))
    }

    /// The earliest deadline spilled on `domain`'s clock, when it is at or before
    /// `upto`.
    #[inline]
    pub(crate) fn bound_due(&self, domain: Domain, upto: i64) -> Option<i64> {
        Some(self.bound[domain as usize]).filter(|&b| b != i64::MAX && b <= upto)
    }

    /// Takes back into `hot` keys due on `domain`'s clock by `upto` (at least every key
    /// of the earliest such deadline, about `max` in all), their timers armed, so that
    /// the hot tier's timers fire them in order with the others.
    pub(crate) fn take_due(
        &mut self,
        hot: &mut KeyedStore<S>,
        domain: Domain,
        upto: i64,
        max: usize,
    ) {
        let mut back = std::mem::take(&mut self.scratch);
        let taken = self
            .store
            .take_due(domain, upto, max, &mut |key, state, at| {
                back.push((KeyBytes::from_slice(key), state, at));
            });
        match taken {
            Ok(next) => self.bound[domain as usize] = next,
            Err(e) => {
                self.failed(e);
                self.bound[domain as usize] = i64::MAX;
            }
        }
        self.keys -= back.len();
        self.unspilled += back.len() as u64;
        for (key, state, at) in back.drain(..) {
            Self::place(hot, key_hash(&key), &key, state, at);
        }
        self.scratch = back;
    }

    /// Counts `events` more events; whether the hot tier (holding `keys`) may have
    /// outgrown its budget and should be measured ([`evict`](Self::evict)).
    #[inline]
    pub(crate) fn should_check(&mut self, keys: usize, events: u64) -> bool {
        self.check_events = self.check_events.saturating_sub(events);
        self.check_events == 0 || keys >= self.check_keys
    }

    /// Measures `hot` and, over budget, evicts its coldest keys (but `keep`) down to
    /// three quarters of it. With `bound_changes`, the evicted keys' changes remembered
    /// for the next checkpoint are bounded by the hot tier's size; beyond, they are
    /// forgotten and [`changes_lost`](Self::changes_lost) is set.
    #[cold]
    #[inline(never)]
    pub(crate) fn evict(
        &mut self,
        hot: &mut KeyedStore<S>,
        keep: Option<SlotId>,
        bound_changes: bool,
        costs: &mut impl KeyCosts<S>,
    ) {
        let budget = self.hot_bytes;
        let n = hot.len();
        let mut bytes = 0usize;
        let mut order: Vec<(i64, SlotId)> = Vec::with_capacity(n);
        for (id, key, state) in hot.iter() {
            bytes += costs.bytes(key, state);
            if Some(id) != keep {
                order.push((costs.coldness(state), id));
            }
        }
        let per_key = (bytes / n.max(1)).max(1);
        let target = budget / 4 * 3 / per_key;
        let evict = if bytes > budget {
            n.saturating_sub(target).min(order.len())
        } else {
            0
        };
        if evict > 0 {
            if evict < order.len() {
                order.select_nth_unstable(evict);
            }
            let mut out = std::mem::take(&mut self.scratch);
            let mut dirty = Vec::new();
            let mut bound = self.bound;
            for &(_, id) in &order[..evict] {
                let (key, state, changed) = hot.evict(id);
                if changed {
                    dirty.push(key.clone());
                }
                let at = costs.deadlines(&state);
                bound[0] = bound[0].min(at.event);
                bound[1] = bound[1].min(at.processing);
                out.push((key, state, at));
            }
            self.bound = bound;
            if !self.changes_lost {
                self.dirty.extend(dirty);
                // Remembering every evicted change would grow with the state, outside
                // the budget: beyond as many keys as the hot tier holds, the owner takes
                // a base instead (it holds everything).
                if bound_changes && self.dirty.len() > self.check_keys.max(4096) {
                    self.dirty = HashSet::new();
                    self.changes_lost = true;
                }
            }
            self.keys += out.len();
            self.evicted += out.len() as u64;
            if let Err(e) = self.store.put(&mut out) {
                self.failed(e);
            }
            out.clear();
            self.scratch = out;
        }
        let now = hot.len();
        let room = budget.saturating_sub(now * per_key) / per_key;
        // Not every key: a pass reads the whole hot tier.
        self.check_keys = now + room.max(now / 16).max(1);
        self.check_events = (now as u64).max(1 << 16);
    }

    /// Calls `f` for every key of `hot` or of the spill store whose state changed since
    /// the last call (with it) or that has none any more (`None`), then forgets the
    /// changes. Keys evicted since their change are reported from wherever they are now
    /// (an error reading one is kept for [`take_error`](Self::take_error)).
    pub(crate) fn drain_changes(
        &mut self,
        hot: &mut KeyedStore<S>,
        mut f: impl FnMut(&[u8], Option<&S>),
    ) {
        if self.dirty.is_empty() {
            return hot.drain_changes(f);
        }
        let dirty = std::mem::take(&mut self.dirty);
        hot.drain_changes(|key, state| {
            if !dirty.contains(key) {
                f(key, state);
            }
        });
        for key in &dirty {
            if let Some(id) = hot.find(key) {
                f(key, Some(hot.state(id)));
                continue;
            }
            match self.store.peek(key, &mut |s| f(key, Some(s))) {
                Ok(true) => {}
                Ok(false) => f(key, None),
                Err(e) => self.failed(e),
            }
        }
    }

    /// Removes every spilled key (the state is being replaced).
    pub(crate) fn clear(&mut self) -> Result<(), SpillError> {
        self.store.clear()?;
        self.keys = 0;
        self.bound = [i64::MAX; 2];
        self.forget_changes();
        Ok(())
    }

    /// Forgets the changes of evicted keys (a full snapshot was just taken).
    pub(crate) fn forget_changes(&mut self) {
        self.dirty.clear();
        self.changes_lost = false;
    }
}
