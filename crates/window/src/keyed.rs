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
        }
    }
}

impl<S: Default> KeyedStore<S> {
    /// The slot of `key`, created with default state when the key has none.
    pub fn slot_for(&mut self, key: &[u8]) -> SlotId {
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

    /// The state of slot `id`, mutably.
    pub fn state_mut(&mut self, id: SlotId) -> &mut S {
        &mut self.slots[id as usize].state
    }

    /// The key and a mutable handle on its state at once.
    pub fn key_and_state_mut(&mut self, id: SlotId) -> (&[u8], &mut S) {
        let slot = &mut self.slots[id as usize];
        (&slot.key, &mut slot.state)
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
        slot.key = KeyBytes::new();
        slot.state = S::default();
        slot.timer = NO_TIMER;
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
        while let Some(&Reverse((deadline, id))) = self.timers.peek() {
            if deadline > w.millis() {
                return None;
            }
            self.timers.pop();
            let slot = &mut self.slots[id as usize];
            if slot.timer == deadline {
                slot.timer = NO_TIMER;
                return Some(id);
            }
        }
        None
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
            if let Some(live) = self.proc_deadline.get_mut(id as usize) {
                if *live == deadline {
                    *live = NO_TIMER;
                    return Some(id);
                }
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
    fn a_removed_key_never_fires() {
        let mut store: KeyedStore<()> = KeyedStore::default();
        let a = store.slot_for(b"a");
        store.schedule(a, EventTime(1));
        store.remove(a);
        assert_eq!(store.pop_due(Watermark::MAX), None);
    }
}
