//! A stateful operator over a spill store (the `rocksdb` backend): what a key costs in
//! memory, which keys are evicted and when they come back.

use super::{KeyState, StatefulOperator};
use crate::clock::{Clock, ProcessingTime};
use crate::keyed::{SlotId, key_hash};
use crate::spill::tier::{KeyCosts, Tier};
use crate::spill::{Deadlines, Domain, SpillCounts, SpillError, SpillStore};
use crate::watermark::WatermarkStrategy;
use serde::Serialize;
use sessionizer_core::Watermark;

/// What a key costs in the hot tier besides its timers and its state's heap: its slot
/// (key and state), its index entry, its timer entries on both clocks.
const fn key_bytes<S>() -> usize {
    16 + std::mem::size_of::<KeyState<S>>() + 16 + 16
}

/// A stateful operator's side of its spill store.
pub(super) struct StatefulSpill<S> {
    pub(super) tier: Tier<KeyState<S>>,
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

impl<E, S, W: WatermarkStrategy, C: Clock> StatefulOperator<E, S, W, C> {
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
    pub(super) fn spill_failed(&self) -> bool {
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
    pub(super) fn slot_of(&mut self, key: &[u8]) -> SlotId {
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
    pub(super) fn unspill_due(&mut self, w: Watermark, now: ProcessingTime) {
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
    pub(super) fn check_budget(&mut self, events: u64) {
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
}
