//! The keyed-state + timers core: a slot of user state per key, one event-time timer and
//! one processing-time timer per key, each indexed by deadline.
//!
//! Both the declarative session window ([`crate::SessionOperator`]) and user-defined
//! stateful functions ([`crate::stateful::StatefulOperator`]) keep their per-key state
//! here. Keys are byte strings (a key's text); they are stored once, inline when short.
//!
//! Timers are min-heaps of `(deadline, slot)` with lazy invalidation: each slot remembers
//! the deadline of its one live heap entry. Moving a timer earlier pushes a new entry;
//! moving it later does nothing — the early entry fires, the owner finds nothing due yet
//! and re-arms. So a heap holds about one entry per key and a watermark (or clock) step
//! costs `O(fired · log n)`, never a scan of all keys.
//!
//! Processing-time timers use the same technique on a second heap. Their per-slot
//! deadlines live in a side vector that stays empty until the first processing-time
//! timer is set, so the session window, which never sets one, pays nothing for them:
//! not a byte per key, not a branch per event.
//!
//! With [`track_changes`](KeyedStore::track_changes) on, the store also remembers which
//! keys were handed out mutably or removed since the last
//! [`drain_changes`](KeyedStore::drain_changes): an incremental checkpoint writes only
//! those. Off (the default), it costs one predictable branch per mutable access.

use crate::clock::ProcessingTime;
use hashbrown::HashTable;
use sessionizer_core::{EventTime, Watermark};
use smallvec::SmallVec;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

/// Index of a key's slot. Stable while the key has state; reused after [`KeyedStore::remove`].
pub type SlotId = u32;

/// A key's text, inline up to 16 bytes.
pub type KeyBytes = SmallVec<[u8; 16]>;

const NO_TIMER: i64 = i64::MAX;

#[derive(Debug)]
struct Slot<S> {
    key: KeyBytes,
    state: S,
    /// Deadline of this slot's live heap entry, `NO_TIMER` when none.
    timer: i64,
}

/// Per-key state with one event-time and one processing-time timer per key.
#[derive(Debug)]
pub struct KeyedStore<S> {
    hasher: foldhash::fast::FixedState,
    index: HashTable<SlotId>,
    slots: Vec<Slot<S>>,
    free: Vec<SlotId>,
    timers: BinaryHeap<Reverse<(i64, SlotId)>>,
    /// Deadline of each slot's live processing-time heap entry (`NO_TIMER`: none),
    /// indexed by slot; shorter than `slots` (often empty) when later slots never had
    /// one.
    proc_deadline: Vec<i64>,
    proc_timers: BinaryHeap<Reverse<(i64, SlotId)>>,
    /// Change tracking for incremental checkpoints: on or off, the slots handed out
    /// mutably (listed, and one bit per slot so each is listed once), and the keys
    /// removed, since the last drain. Kept apart from the slots so that a store without
    /// tracking pays not a byte per key.
    tracking: bool,
    changed: Vec<SlotId>,
    changed_bits: Vec<u64>,
    removed: Vec<KeyBytes>,
}

impl<S> Default for KeyedStore<S> {
    fn default() -> Self {
        KeyedStore {
            hasher: foldhash::fast::FixedState::with_seed(0x5e55_10e1),
            index: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            timers: BinaryHeap::new(),
            proc_deadline: Vec::new(),
            proc_timers: BinaryHeap::new(),
            tracking: false,
            changed: Vec::new(),
            changed_bits: Vec::new(),
            removed: Vec::new(),
        }
    }
}

impl<S: Default> KeyedStore<S> {
    /// The slot of `key`, created with default state when the key has none.
    pub fn slot_for(&mut self, key: &[u8]) -> SlotId {
        let id = self.slot_unmarked(key);
        self.mark(id);
        id
    }

    /// Puts a key back with its state (a restore from a checkpoint): not a change, so
    /// the next incremental checkpoint does not write it again.
    pub fn restore(&mut self, key: &[u8], state: S) -> SlotId {
        let id = self.slot_unmarked(key);
        self.slots[id as usize].state = state;
        id
    }

    fn slot_unmarked(&mut self, key: &[u8]) -> SlotId {
        let hash = self.hasher.hash_one(key);
        let KeyedStore {
            hasher,
            index,
            slots,
            free,
            ..
        } = self;
        let entry = index.entry(
            hash,
            |&id| slots[id as usize].key.as_slice() == key,
            |&id| hasher.hash_one(slots[id as usize].key.as_slice()),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(e) => *e.get(),
            hashbrown::hash_table::Entry::Vacant(e) => {
                let slot = Slot {
                    key: KeyBytes::from_slice(key),
                    state: S::default(),
                    timer: NO_TIMER,
                };
                let id = match free.pop() {
                    Some(id) => {
                        slots[id as usize] = slot;
                        id
                    }
                    None => {
                        slots.push(slot);
                        SlotId::try_from(slots.len() - 1).expect("more than 2^32 keys in one store")
                    }
                };
                e.insert(id);
                id
            }
        }
    }
}

impl<S> KeyedStore<S> {
    /// The slot of `key` if it has state.
    pub fn find(&self, key: &[u8]) -> Option<SlotId> {
        let hash = self.hasher.hash_one(key);
        self.index
            .find(hash, |&id| self.slots[id as usize].key.as_slice() == key)
            .copied()
    }

    /// The key of slot `id`.
    pub fn key(&self, id: SlotId) -> &[u8] {
        &self.slots[id as usize].key
    }

    /// The state of slot `id`.
    pub fn state(&self, id: SlotId) -> &S {
        &self.slots[id as usize].state
    }

    /// The state of slot `id`, mutably. With change tracking on, the key counts as
    /// changed.
    pub fn state_mut(&mut self, id: SlotId) -> &mut S {
        self.mark(id);
        &mut self.slots[id as usize].state
    }

    /// The key and a mutable handle on its state at once. With change tracking on, the
    /// key counts as changed.
    pub fn key_and_state_mut(&mut self, id: SlotId) -> (&[u8], &mut S) {
        self.mark(id);
        let slot = &mut self.slots[id as usize];
        (&slot.key, &mut slot.state)
    }

    #[inline]
    fn mark(&mut self, id: SlotId) {
        if self.tracking && !self.take_bit(id, true) {
            self.changed.push(id);
        }
    }

    /// Sets slot `id`'s changed bit to `to`; returns what it was.
    fn take_bit(&mut self, id: SlotId, to: bool) -> bool {
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        if self.changed_bits.len() <= word {
            if !to {
                return false;
            }
            self.changed_bits.resize(word + 1, 0);
        }
        let was = self.changed_bits[word] & bit != 0;
        if to {
            self.changed_bits[word] |= bit;
        } else {
            self.changed_bits[word] &= !bit;
        }
        was
    }

    /// Starts (or stops) remembering which keys change, for incremental checkpoints.
    /// Keys changed before it was turned on are not known: take a full snapshot then.
    pub fn track_changes(&mut self, on: bool) {
        self.tracking = on;
        if !on {
            self.forget_changes();
        }
    }

    /// Calls `f` once for every key changed or removed since the last drain (or since
    /// tracking started): with its state, or `None` when it has none any more. Then
    /// forgets them. A key handed out mutably counts as changed even if nothing was
    /// written: an extra entry in a checkpoint, never a missing one.
    pub fn drain_changes(&mut self, mut f: impl FnMut(&[u8], Option<&S>)) {
        let mut removed = std::mem::take(&mut self.removed);
        removed.sort_unstable();
        removed.dedup();
        for key in &removed {
            // A key removed and then created again is reported once, with its state.
            if self.find(key).is_none() {
                f(key, None);
            }
        }
        removed.clear();
        self.removed = removed;
        let mut changed = std::mem::take(&mut self.changed);
        for &id in &changed {
            // A slot listed twice (removed, then reused by another key) is reported once.
            if self.take_bit(id, false) {
                let slot = &self.slots[id as usize];
                f(&slot.key, Some(&slot.state));
            }
        }
        changed.clear();
        self.changed = changed;
    }

    /// Forgets the changes without reporting them (after a full snapshot).
    pub fn forget_changes(&mut self) {
        self.changed.clear();
        self.changed_bits.clear();
        self.removed.clear();
    }

    /// Drops a key and its state. Its pending timer entry goes stale and is skipped.
    pub fn remove(&mut self, id: SlotId)
    where
        S: Default,
    {
        let hash = self.hasher.hash_one(self.slots[id as usize].key.as_slice());
        if let Ok(entry) = self.index.find_entry(hash, |&x| x == id) {
            entry.remove();
        }
        let slot = &mut self.slots[id as usize];
        let key = std::mem::take(&mut slot.key);
        slot.state = S::default();
        slot.timer = NO_TIMER;
        if self.tracking {
            self.take_bit(id, false);
            self.removed.push(key);
        }
        if let Some(d) = self.proc_deadline.get_mut(id as usize) {
            *d = NO_TIMER;
        }
        self.free.push(id);
    }

    /// Asks for the key to be handed back by [`pop_due`](Self::pop_due) once the watermark
    /// reaches `deadline`. A key has one timer: asking for a later deadline than the one
    /// pending keeps the earlier one (the owner re-arms when it fires early).
    pub fn schedule(&mut self, id: SlotId, deadline: EventTime) {
        let slot = &mut self.slots[id as usize];
        if deadline.0 < slot.timer {
            slot.timer = deadline.0;
            self.timers.push(Reverse((deadline.0, id)));
        }
    }

    /// The next key whose timer is due at watermark `w`, its timer cleared.
    pub fn pop_due(&mut self, w: Watermark) -> Option<SlotId> {
        self.pop_due_at(w).map(|(id, _)| id)
    }

    /// The next key whose timer is due at watermark `w` and the deadline it was set
    /// for, its timer cleared. Keys come in deadline order.
    pub fn pop_due_at(&mut self, w: Watermark) -> Option<(SlotId, i64)> {
        while let Some(&Reverse((deadline, id))) = self.timers.peek() {
            if deadline > w.millis() {
                return None;
            }
            self.timers.pop();
            let slot = &mut self.slots[id as usize];
            if slot.timer == deadline {
                slot.timer = NO_TIMER;
                return Some((id, deadline));
            }
        }
        None
    }

    /// A deadline at or before every pending event-time timer (`None`: none pending).
    /// It may be that of a timer since moved or dropped, so it is a lower bound: a
    /// [`pop_due_at`](Self::pop_due_at) up to it may find nothing.
    pub fn next_deadline_bound(&self) -> Option<i64> {
        self.timers.peek().map(|&Reverse((deadline, _))| deadline)
    }

    /// Asks for the key to be handed back by
    /// [`pop_due_processing`](Self::pop_due_processing) once the clock reaches
    /// `deadline`. Same one-timer-per-key rule as [`schedule`](Self::schedule).
    pub fn schedule_processing(&mut self, id: SlotId, deadline: ProcessingTime) {
        let i = id as usize;
        if self.proc_deadline.len() <= i {
            self.proc_deadline.resize(i + 1, NO_TIMER);
        }
        if deadline.0 < self.proc_deadline[i] {
            self.proc_deadline[i] = deadline.0;
            self.proc_timers.push(Reverse((deadline.0, id)));
        }
    }

    /// The next key whose processing-time timer is due at `now`, its timer cleared.
    pub fn pop_due_processing(&mut self, now: ProcessingTime) -> Option<SlotId> {
        while let Some(&Reverse((deadline, id))) = self.proc_timers.peek() {
            if deadline > now.0 {
                return None;
            }
            self.proc_timers.pop();
            if let Some(live) = self.proc_deadline.get_mut(id as usize)
                && *live == deadline
            {
                *live = NO_TIMER;
                return Some(id);
            }
        }
        None
    }

    /// Number of keys with state.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no key has state.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Pending timer entries of both kinds, live or stale (for memory accounting).
    pub fn timer_entries(&self) -> usize {
        self.timers.len() + self.proc_timers.len()
    }

    /// Drops every key, its state and its timers.
    pub fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free.clear();
        self.timers.clear();
        self.proc_deadline.clear();
        self.proc_timers.clear();
        // Removals cannot be reported any more: a tracking owner takes a full snapshot
        // after clearing.
        self.forget_changes();
    }

    /// Every key with state, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (SlotId, &[u8], &S)> {
        self.index.iter().map(|&id| {
            (
                id,
                self.slots[id as usize].key.as_slice(),
                &self.slots[id as usize].state,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_get_stable_slots_and_are_reused_after_removal() {
        let mut store: KeyedStore<u32> = KeyedStore::default();
        let a = store.slot_for(b"a");
        let b = store.slot_for(b"b");
        assert_ne!(a, b);
        assert_eq!(store.slot_for(b"a"), a);
        *store.state_mut(a) = 7;
        store.remove(a);
        assert_eq!(store.find(b"a"), None);
        let c = store.slot_for(b"c");
        assert_eq!(c, a, "freed slot is reused");
        assert_eq!(*store.state(c), 0, "reused slot starts from default state");
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn timers_fire_in_deadline_order_and_only_when_due() {
        let mut store: KeyedStore<()> = KeyedStore::default();
        let a = store.slot_for(b"a");
        let b = store.slot_for(b"b");
        store.schedule(a, EventTime(20));
        store.schedule(b, EventTime(10));
        assert_eq!(store.pop_due(Watermark::at(EventTime(9))), None);
        assert_eq!(store.pop_due(Watermark::at(EventTime(25))), Some(b));
        assert_eq!(store.pop_due(Watermark::at(EventTime(25))), Some(a));
        assert_eq!(store.pop_due(Watermark::MAX), None);
    }

    #[test]
    fn a_later_deadline_keeps_the_earlier_entry_and_an_earlier_one_replaces_it() {
        let mut store: KeyedStore<()> = KeyedStore::default();
        let a = store.slot_for(b"a");
        store.schedule(a, EventTime(20));
        store.schedule(a, EventTime(30)); // keeps 20
        assert_eq!(store.pop_due(Watermark::at(EventTime(20))), Some(a));
        store.schedule(a, EventTime(30));
        store.schedule(a, EventTime(5)); // replaces 30
        assert_eq!(store.pop_due(Watermark::at(EventTime(5))), Some(a));
        assert_eq!(
            store.pop_due(Watermark::MAX),
            None,
            "the stale 30 entry is skipped"
        );
    }

    #[test]
    fn processing_timers_are_independent_of_event_timers() {
        let mut store: KeyedStore<()> = KeyedStore::default();
        let a = store.slot_for(b"a");
        let b = store.slot_for(b"b");
        store.schedule(a, EventTime(10));
        store.schedule_processing(b, ProcessingTime(100));
        store.schedule_processing(b, ProcessingTime(200)); // keeps 100
        assert_eq!(store.pop_due_processing(ProcessingTime(99)), None);
        assert_eq!(store.pop_due(Watermark::MAX), Some(a));
        assert_eq!(store.pop_due(Watermark::MAX), None, "b has no event timer");
        assert_eq!(store.pop_due_processing(ProcessingTime(100)), Some(b));
        assert_eq!(store.pop_due_processing(ProcessingTime(i64::MAX)), None);
        store.schedule_processing(b, ProcessingTime(50));
        store.remove(b);
        assert_eq!(
            store.pop_due_processing(ProcessingTime(i64::MAX)),
            None,
            "a removed key's processing timer is stale"
        );
    }

    #[test]
    fn changes_are_tracked_once_per_key_and_removals_become_tombstones() {
        let mut store: KeyedStore<u32> = KeyedStore::default();
        let a = store.slot_for(b"a");
        *store.state_mut(a) = 1;
        store.track_changes(true);
        let drained = |store: &mut KeyedStore<u32>| {
            let mut v = Vec::new();
            store.drain_changes(|k, s| v.push((k.to_vec(), s.copied())));
            v.sort();
            v
        };
        assert_eq!(
            drained(&mut store),
            vec![],
            "nothing changed since tracking began"
        );
        *store.state_mut(a) = 2;
        *store.state_mut(a) = 3;
        let b = store.slot_for(b"b");
        store.remove(b);
        let c = store.slot_for(b"c");
        assert_eq!(c, b, "the slot is reused");
        *store.state_mut(c) = 9;
        assert_eq!(
            drained(&mut store),
            vec![
                (b"a".to_vec(), Some(3)),
                (b"b".to_vec(), None),
                (b"c".to_vec(), Some(9))
            ]
        );
        store.remove(a);
        let a2 = store.slot_for(b"a");
        *store.state_mut(a2) = 5;
        assert_eq!(
            drained(&mut store),
            vec![(b"a".to_vec(), Some(5))],
            "removed then created again: its new state"
        );
        let restored = store.restore(b"r", 7);
        assert_eq!(*store.state(restored), 7);
        assert_eq!(drained(&mut store), vec![], "a restore is not a change");
        *store.state_mut(restored) = 8;
        store.forget_changes();
        assert_eq!(drained(&mut store), vec![]);
    }

    #[test]
    fn a_removed_key_never_fires() {
        let mut store: KeyedStore<()> = KeyedStore::default();
        let a = store.slot_for(b"a");
        store.schedule(a, EventTime(1));
        store.remove(a);
        assert_eq!(store.pop_due(Watermark::MAX), None);
    }
}
