//! The keyed-state + timers core: a slot of user state per key, one event-time timer and
//! one processing-time timer per key, each indexed by deadline.
//!
//! Both the declarative session window ([`crate::SessionOperator`]) and user-defined
//! stateful functions ([`crate::stateful::StatefulOperator`]) keep their per-key state
//! here. Keys are byte strings (a key's text), stored once: inline in the slot's 16
//! bytes when they fit, in a side table otherwise. Slots live in fixed-size chunks, so
//! growing the store never copies (or briefly doubles) the state of every key.
//!
//! Event-time timers live in a hierarchical timing wheel of slot ids (`wheel.rs`) with
//! lazy invalidation: each key's state remembers the deadline of its one live timer
//! ([`Timed`]). Moving a timer earlier adds a new entry; moving it later does nothing —
//! the early entry fires, the owner finds nothing due yet and re-arms. So the wheel
//! holds about one 4-byte entry per key and a watermark step costs `O(fired)`, never a
//! scan of all keys.
//!
//! Processing-time timers use the same lazy technique on a min-heap. Their per-slot
//! deadlines live in a side vector that stays empty until the first processing-time
//! timer is set, so the session window, which never sets one, pays nothing for them:
//! not a byte per key, not a branch per event.
//!
//! With [`track_changes`](KeyedStore::track_changes) on, the store also remembers which
//! keys were handed out mutably or removed since the last
//! [`drain_changes`](KeyedStore::drain_changes): an incremental checkpoint writes only
//! those. Off (the default), it costs one predictable branch per mutable access.

use crate::clock::ProcessingTime;
use crate::index::Index;
use crate::wheel::Wheel;
use sessionizer_core::{EventTime, Watermark};
use smallvec::SmallVec;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

/// Index of a key's slot. Stable while the key has state; reused after [`KeyedStore::remove`].
pub type SlotId = u32;

/// A key's text, inline up to 16 bytes.
pub type KeyBytes = SmallVec<[u8; 16]>;

/// The deadline of "no timer".
pub const NO_TIMER: i64 = i64::MAX;

/// Per-key state that keeps its key's live event-time timer: the deadline of the one
/// wheel entry that counts ([`NO_TIMER`] when none). The store reads and writes it; the
/// state only stores it (as compactly as it likes).
pub trait Timed {
    /// The live timer's deadline, [`NO_TIMER`] when none.
    fn timer(&self) -> i64;
    /// Sets the live timer's deadline ([`NO_TIMER`]: none).
    fn set_timer(&mut self, deadline: i64);
    /// A time before which the owner has nothing to do for this key (the default: its
    /// timer): when the timer comes due earlier, the store moves it there instead of
    /// handing the key back (a session extended since its timer was set, say).
    fn next_action(&self) -> i64 {
        self.timer()
    }
}

/// The slots as the timer wheel sees them.
struct WheelSlots<'a, S>(&'a mut Vec<Vec<Slot<S>>>);

impl<S: Timed> crate::wheel::Slots for WheelSlots<'_, S> {
    #[inline]
    fn live(&self, id: u32) -> i64 {
        slot_of(self.0, id).state.timer()
    }

    #[inline]
    fn postpone(&mut self, id: u32) -> i64 {
        let state = &mut slot_of_mut(self.0, id).state;
        let (timer, next) = (state.timer(), state.next_action());
        if next > timer {
            state.set_timer(next);
            next
        } else {
            timer
        }
    }

    #[inline]
    fn ahead(&self, id: u32) {
        sessionizer_core::prefetch::prefetch(slot_of(self.0, id));
    }
}

/// Slots per chunk.
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Byte 15 of an inline key shorter than 15 bytes (its length in byte 14).
const SHORT: u8 = 0xFF;
/// Byte 15 of an inline key of 15 bytes.
const FIFTEEN: u8 = 0xFE;
/// Byte 15 of a key in the long-key table (its index in bytes 0..4).
const LONG: u8 = 0xFD;

/// A key's 16 bytes in its slot: the key itself when it fits, with its length told by
/// the last byte (a 16-byte key ending in a byte below `0xFD`, which every UTF-8 text
/// and every number does), else an index into [`LongKeys`].
#[derive(Debug, Clone, Copy)]
struct Key16([u8; 16]);

impl Key16 {
    fn new(key: &[u8], long: &mut LongKeys) -> Key16 {
        Key16::inline(key).unwrap_or_else(|| {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&long.insert(key).to_le_bytes());
            b[15] = LONG;
            Key16(b)
        })
    }

    /// The slot bytes of `key` when it is kept inline (then two keys are equal exactly
    /// when their 16 bytes are).
    #[inline]
    fn inline(key: &[u8]) -> Option<Key16> {
        let mut b = [0u8; 16];
        match key.len() {
            n @ 0..=14 => {
                b[..n].copy_from_slice(key);
                b[14] = n as u8;
                b[15] = SHORT;
            }
            15 => {
                b[..15].copy_from_slice(key);
                b[15] = FIFTEEN;
            }
            16 if key[15] < LONG => b.copy_from_slice(key),
            _ => return None,
        }
        Some(Key16(b))
    }

    #[inline]
    fn get<'a>(&'a self, long: &'a LongKeys) -> &'a [u8] {
        match self.0[15] {
            SHORT => &self.0[..self.0[14] as usize],
            FIFTEEN => &self.0[..15],
            LONG => &long.keys[self.long_index() as usize],
            _ => &self.0,
        }
    }

    fn long_index(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    fn is_long(&self) -> bool {
        self.0[15] == LONG
    }
}

impl Key16 {
    /// The bytes of a slot without a key: a short key of length 255, which no key
    /// encodes to.
    const FREE: Key16 = {
        let mut b = [0u8; 16];
        b[14] = 0xFF;
        b[15] = SHORT;
        Key16(b)
    };

    fn is_free(&self) -> bool {
        self.0 == Key16::FREE.0
    }
}

/// Keys too long for a slot.
#[derive(Debug, Default)]
struct LongKeys {
    keys: Vec<Box<[u8]>>,
    free: Vec<u32>,
}

impl LongKeys {
    fn insert(&mut self, key: &[u8]) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.keys[i as usize] = key.into();
                i
            }
            None => {
                self.keys.push(key.into());
                u32::try_from(self.keys.len() - 1).expect("more than 2^32 long keys")
            }
        }
    }

    fn remove(&mut self, i: u32) {
        self.keys[i as usize] = Box::default();
        self.free.push(i);
    }
}

#[derive(Debug)]
struct Slot<S> {
    key: Key16,
    state: S,
}

/// Per-key state with one event-time and one processing-time timer per key.
#[derive(Debug)]
pub struct KeyedStore<S> {
    index: Index,
    /// Slot `id` is `chunks[id >> CHUNK_BITS][id % CHUNK]`; every chunk but the last is
    /// full.
    chunks: Vec<Vec<Slot<S>>>,
    long: LongKeys,
    free: Vec<SlotId>,
    timers: Wheel,
    /// Deadline of each slot's live processing-time heap entry (`NO_TIMER`: none),
    /// indexed by slot; shorter than the slots (often empty) when later slots never had
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
            index: Index::default(),
            chunks: Vec::new(),
            long: LongKeys::default(),
            free: Vec::new(),
            timers: Wheel::default(),
            proc_deadline: Vec::new(),
            proc_timers: BinaryHeap::new(),
            tracking: false,
            changed: Vec::new(),
            changed_bits: Vec::new(),
            removed: Vec::new(),
        }
    }
}

#[inline]
fn slot_of<S>(chunks: &[Vec<Slot<S>>], id: SlotId) -> &Slot<S> {
    &chunks[(id >> CHUNK_BITS) as usize][(id as usize) & (CHUNK - 1)]
}

#[inline]
fn slot_of_mut<S>(chunks: &mut [Vec<Slot<S>>], id: SlotId) -> &mut Slot<S> {
    &mut chunks[(id >> CHUNK_BITS) as usize][(id as usize) & (CHUNK - 1)]
}

/// The hash of a key as the store's index uses it ([`KeyedStore::find_hashed`]): callers
/// that know keys ahead can hash them early (in parallel, say) and
/// [`prefetch`](KeyedStore::prefetch) their state.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    foldhash::fast::FixedState::with_seed(0x5e55_10e1).hash_one(key)
}

impl<S: Default> KeyedStore<S> {
    /// The slot of `key`, created with default state when the key has none.
    pub fn slot_for(&mut self, key: &[u8]) -> SlotId {
        self.slot_for_hashed(key_hash(key), key)
    }

    /// [`slot_for`](Self::slot_for) with the key's [`key_hash`].
    #[inline]
    pub fn slot_for_hashed(&mut self, hash: u64, key: &[u8]) -> SlotId {
        let id = self.slot_unmarked(hash, key);
        self.mark(id);
        id
    }

    /// Puts a key back with its state (a restore from a checkpoint): not a change, so
    /// the next incremental checkpoint does not write it again.
    pub fn restore(&mut self, key: &[u8], state: S) -> SlotId {
        let id = self.slot_unmarked(key_hash(key), key);
        self.slot_mut(id).state = state;
        id
    }

    /// [`restore`](Self::restore) with the key's [`key_hash`]: a key brought back from a
    /// spill store ([`crate::spill`]) is not a change either.
    pub fn restore_hashed(&mut self, hash: u64, key: &[u8], state: S) -> SlotId {
        let id = self.slot_unmarked(hash, key);
        self.slot_mut(id).state = state;
        id
    }

    /// Takes a key and its state out of the store to keep elsewhere (a spill store):
    /// unlike [`remove`](Self::remove) not a removal for the next incremental
    /// checkpoint. Returns the key, its state and whether it changed since the last
    /// drain (with change tracking on), which the caller must then report itself.
    pub fn evict(&mut self, id: SlotId) -> (KeyBytes, S, bool) {
        let key = KeyBytes::from_slice(self.key(id));
        let changed = self.tracking && self.take_bit(id, false);
        let state = std::mem::take(&mut self.slot_mut(id).state);
        let tracking = std::mem::replace(&mut self.tracking, false);
        self.remove(id);
        self.tracking = tracking;
        (key, state, changed)
    }

    fn slot_unmarked(&mut self, hash: u64, key: &[u8]) -> SlotId {
        if let Some(id) = self.find_hashed(hash, key) {
            return id;
        }
        let KeyedStore {
            index,
            chunks,
            long,
            free,
            ..
        } = self;
        let slot = Slot {
            key: Key16::new(key, long),
            state: S::default(),
        };
        let id = match free.pop() {
            Some(id) => {
                *slot_of_mut(chunks, id) = slot;
                // The next new key takes the slot freed before this one: with many keys,
                // not in cache.
                if let Some(&next) = free.last() {
                    sessionizer_core::prefetch::prefetch(slot_of(chunks, next));
                }
                id
            }
            None => {
                if chunks.last().is_none_or(|c| c.len() == CHUNK) {
                    chunks.push(Vec::with_capacity(CHUNK));
                }
                let n = chunks.len() - 1;
                let last = &mut chunks[n];
                last.push(slot);
                SlotId::try_from((n << CHUNK_BITS) + last.len() - 1)
                    .expect("more than 2^32 keys in one store")
            }
        };
        index.insert(hash, id, |id| key_hash(slot_of(chunks, id).key.get(long)));
        id
    }
}

impl<S> KeyedStore<S> {
    #[inline]
    fn slot(&self, id: SlotId) -> &Slot<S> {
        slot_of(&self.chunks, id)
    }

    #[inline]
    fn slot_mut(&mut self, id: SlotId) -> &mut Slot<S> {
        slot_of_mut(&mut self.chunks, id)
    }

    /// Makes room for `keys` keys in all (restoring a checkpoint of that many).
    pub fn reserve(&mut self, keys: usize) {
        let KeyedStore {
            index,
            chunks,
            long,
            ..
        } = self;
        index.reserve(keys, |id| key_hash(slot_of(chunks, id).key.get(long)));
    }

    /// The slot of `key` if it has state.
    #[inline]
    pub fn find(&self, key: &[u8]) -> Option<SlotId> {
        self.find_hashed(key_hash(key), key)
    }

    /// [`find`](Self::find) with the key's [`key_hash`].
    #[inline]
    pub fn find_hashed(&self, hash: u64, key: &[u8]) -> Option<SlotId> {
        match Key16::inline(key) {
            Some(k) => self.index.find(hash, |id| self.slot(id).key.0 == k.0),
            None => self
                .index
                .find(hash, |id| self.slot(id).key.get(&self.long) == key),
        }
    }

    /// Asks the CPU for the memory a lookup of the key with `hash` reads first (its
    /// entry in the index), without waiting for it. For keys a few lookups ahead.
    #[inline]
    pub fn prefetch_index(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// Asks the CPU for the slot a lookup of the key with `hash` will most likely read
    /// (the index entry should be in cache by then: see
    /// [`prefetch_index`](Self::prefetch_index)).
    #[inline]
    pub fn prefetch_slot(&self, hash: u64) {
        if let Some(id) = self.index.candidate(hash) {
            self.prefetch(id);
        }
    }

    /// Asks the CPU for slot `id`'s memory.
    #[inline]
    pub fn prefetch(&self, id: SlotId) {
        if let Some(slot) = self
            .chunks
            .get((id >> CHUNK_BITS) as usize)
            .and_then(|c| c.get((id as usize) & (CHUNK - 1)))
        {
            sessionizer_core::prefetch::prefetch(slot);
        }
    }

    /// The key of slot `id`.
    pub fn key(&self, id: SlotId) -> &[u8] {
        self.slot(id).key.get(&self.long)
    }

    /// The state of slot `id`.
    #[inline]
    pub fn state(&self, id: SlotId) -> &S {
        &self.slot(id).state
    }

    /// The state of slot `id`, mutably. With change tracking on, the key counts as
    /// changed.
    #[inline]
    pub fn state_mut(&mut self, id: SlotId) -> &mut S {
        self.mark(id);
        &mut self.slot_mut(id).state
    }

    /// The key and a mutable handle on its state at once. With change tracking on, the
    /// key counts as changed.
    pub fn key_and_state_mut(&mut self, id: SlotId) -> (&[u8], &mut S) {
        self.mark(id);
        let slot = slot_of_mut(&mut self.chunks, id);
        (slot.key.get(&self.long), &mut slot.state)
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
                let slot = self.slot(id);
                f(slot.key.get(&self.long), Some(&slot.state));
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
        let key = self.slot(id).key;
        self.index.remove(key_hash(key.get(&self.long)), id);
        if self.tracking {
            self.take_bit(id, false);
            self.removed.push(KeyBytes::from_slice(key.get(&self.long)));
        }
        if key.is_long() {
            self.long.remove(key.long_index());
        }
        let slot = self.slot_mut(id);
        slot.key = Key16::FREE;
        slot.state = S::default();
        if let Some(d) = self.proc_deadline.get_mut(id as usize) {
            *d = NO_TIMER;
        }
        self.free.push(id);
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
            // Entries of keys removed or evicted (a spill store) stay until their
            // deadline: past twice the keys, the heap is rebuilt from the live ones.
            if self.proc_timers.len() > 2 * self.len() + 4096 {
                self.proc_timers = self
                    .proc_deadline
                    .iter()
                    .zip(0..)
                    .filter(|&(&d, _)| d != NO_TIMER)
                    .map(|(&d, id)| Reverse((d, id)))
                    .collect();
            }
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
        self.index.len() == 0
    }

    /// Pending timer entries of both kinds, live or stale (for memory accounting).
    pub fn timer_entries(&self) -> usize {
        self.timers.len() + self.proc_timers.len()
    }

    /// Drops every key, its state and its timers.
    pub fn clear(&mut self) {
        self.index.clear();
        self.chunks.clear();
        self.long = LongKeys::default();
        self.free.clear();
        self.timers.clear();
        self.proc_deadline.clear();
        self.proc_timers.clear();
        // Removals cannot be reported any more: a tracking owner takes a full snapshot
        // after clearing.
        self.forget_changes();
    }

    /// Every key with state, in slot order: roughly the order keys came in, and that of
    /// their memory, which a walk over millions of keys reads much faster than the
    /// index's order.
    pub fn iter(&self) -> impl Iterator<Item = (SlotId, &[u8], &S)> {
        self.chunks.iter().enumerate().flat_map(move |(c, chunk)| {
            chunk
                .iter()
                .enumerate()
                .filter(|(_, slot)| !slot.key.is_free())
                .map(move |(i, slot)| {
                    let id = ((c << CHUNK_BITS) + i) as SlotId;
                    (id, slot.key.get(&self.long), &slot.state)
                })
        })
    }
}

impl<S: Timed> KeyedStore<S> {
    /// Asks for the key to be handed back by [`pop_due`](Self::pop_due) once the watermark
    /// reaches `deadline`. A key has one timer: asking for a later deadline than the one
    /// pending keeps the earlier one (the owner re-arms when it fires early).
    #[inline]
    pub fn schedule(&mut self, id: SlotId, deadline: EventTime) {
        let state = &mut slot_of_mut(&mut self.chunks, id).state;
        if deadline.0 < state.timer() {
            self.arm(id, deadline.0);
        }
    }

    #[inline(never)]
    fn arm(&mut self, id: SlotId, deadline: i64) {
        slot_of_mut(&mut self.chunks, id).state.set_timer(deadline);
        self.timers.insert(id, deadline);
    }

    /// The next key whose timer is due at watermark `w`, its timer cleared.
    pub fn pop_due(&mut self, w: Watermark) -> Option<SlotId> {
        self.pop_due_at(w).map(|(id, _)| id)
    }

    /// The next key whose timer is due at watermark `w` and the deadline it was set
    /// for, its timer cleared. Keys come in deadline order.
    #[inline]
    pub fn pop_due_at(&mut self, w: Watermark) -> Option<(SlotId, i64)> {
        if !self.timers.may_be_due(w.millis()) {
            return None;
        }
        self.pop_due_slow(w)
    }

    #[inline(never)]
    fn pop_due_slow(&mut self, w: Watermark) -> Option<(SlotId, i64)> {
        let (id, at) = self
            .timers
            .pop(w.millis(), &mut WheelSlots(&mut self.chunks))?;
        slot_of_mut(&mut self.chunks, id).state.set_timer(NO_TIMER);
        Some((id, at))
    }

    /// Whether a timer may be due at `w` (when not, [`pop_due_at`](Self::pop_due_at)
    /// finds none).
    #[inline]
    pub fn may_be_due(&self, w: Watermark) -> bool {
        self.timers.may_be_due(w.millis())
    }

    /// A deadline at or before every pending event-time timer (`None`: none pending).
    /// It may be that of a timer since moved or dropped, so it is a lower bound: a
    /// [`pop_due_at`](Self::pop_due_at) up to it may find nothing.
    pub fn next_deadline_bound(&self) -> Option<i64> {
        self.timers.bound()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// State that is only a timer.
    #[derive(Debug)]
    struct T(i64);

    impl Default for T {
        fn default() -> Self {
            T(NO_TIMER)
        }
    }

    impl Timed for T {
        fn timer(&self) -> i64 {
            self.0
        }
        fn set_timer(&mut self, deadline: i64) {
            self.0 = deadline;
        }
    }

    #[test]
    fn keys_of_every_length_and_byte_are_kept_exactly() {
        let mut store: KeyedStore<u32> = KeyedStore::default();
        let mut keys: Vec<Vec<u8>> = (0..=40).map(|n| vec![b'k'; n]).collect();
        // Sixteen bytes ending in a byte no UTF-8 text ends with: kept in the side table.
        keys.extend([[7u8; 16], [0xFD; 16], [0xFE; 16], [0xFF; 16]].map(|k| k.to_vec()));
        let mut k = [b'x'; 16];
        k[15] = 0xFC;
        keys.push(k.to_vec());
        // Shorter keys whose bytes look like the length markers.
        keys.extend([vec![0xFF; 14], vec![0xFE; 15], vec![14u8; 15], vec![0xFF]]);
        for (i, key) in keys.iter().enumerate() {
            let id = store.slot_for(key);
            *store.state_mut(id) = i as u32;
        }
        for (i, key) in keys.iter().enumerate() {
            let id = store.find(key).unwrap_or_else(|| panic!("key {key:?}"));
            assert_eq!(store.key(id), &key[..]);
            assert_eq!(*store.state(id), i as u32);
        }
        // Long keys removed and added again reuse their room in the side table.
        for key in keys.iter().filter(|k| k.len() > 16) {
            let id = store.find(key).expect("key");
            store.remove(id);
            assert_eq!(store.find(key), None);
        }
        let other = vec![b'z'; 30];
        let id = store.slot_for(&other);
        assert_eq!(store.key(id), &other[..]);
        assert_eq!(store.long.keys.iter().filter(|k| !k.is_empty()).count(), 4);
        assert_eq!(
            store.len(),
            keys.iter().filter(|k| k.len() <= 16).count() + 1
        );
    }

    #[test]
    fn slots_span_chunks() {
        let mut store: KeyedStore<T> = KeyedStore::default();
        let n = CHUNK as u32 * 2 + 5;
        for i in 0..n {
            let id = store.slot_for(&i.to_le_bytes());
            assert_eq!(id, i);
            store.schedule(id, EventTime(i64::from(n - i)));
        }
        for i in (0..n).rev() {
            assert_eq!(store.pop_due(Watermark::MAX), Some(i));
            assert_eq!(store.key(i), i.to_le_bytes());
        }
    }

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
        let mut store: KeyedStore<T> = KeyedStore::default();
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
        let mut store: KeyedStore<T> = KeyedStore::default();
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
        let mut store: KeyedStore<T> = KeyedStore::default();
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
    fn stale_processing_timers_do_not_pile_up_and_live_ones_still_fire_in_order() {
        let mut store: KeyedStore<T> = KeyedStore::default();
        // Keys come and go (removed, or evicted to a spill store) with far deadlines.
        for round in 0..20i64 {
            for i in 0..1_000i64 {
                let id = store.slot_for(format!("k{round}-{i}").as_bytes());
                store.schedule_processing(id, ProcessingTime(1_000_000 - i));
                if i % 100 != 0 {
                    store.remove(id);
                }
            }
        }
        let live = store.len();
        assert_eq!(live, 200);
        assert!(
            store.timer_entries() <= 2 * live + 4096 + 1,
            "{} entries for {live} keys",
            store.timer_entries()
        );
        let mut fired = Vec::new();
        while let Some(id) = store.pop_due_processing(ProcessingTime(i64::MAX)) {
            let key = String::from_utf8(store.key(id).to_vec()).expect("utf-8");
            let i: i64 = key
                .rsplit('-')
                .next()
                .expect("k{round}-{i}")
                .parse()
                .expect("i");
            fired.push(1_000_000 - i);
            store.remove(id);
        }
        assert_eq!(fired.len(), live, "every live key fires once");
        assert!(fired.is_sorted(), "in deadline order: {fired:?}");
    }

    #[test]
    fn a_removed_key_never_fires() {
        let mut store: KeyedStore<T> = KeyedStore::default();
        let a = store.slot_for(b"a");
        store.schedule(a, EventTime(1));
        store.remove(a);
        assert_eq!(store.pop_due(Watermark::MAX), None);
    }
}
