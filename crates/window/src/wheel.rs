//! The event-time timers of a [`KeyedStore`](crate::keyed::KeyedStore): a hierarchical
//! timing wheel of slot ids, exact to the millisecond.
//!
//! A key's live deadline is kept by the key's own state ([`Timed`](crate::keyed::Timed));
//! the wheel only holds slot ids, 4 bytes per pending timer, in buckets by deadline.
//! Level `l` has 256 buckets of `256^l` ms; a timer sits at the lowest level whose bucket
//! holds its deadline and no earlier time than the wheel's `now` in the levels above.
//! So every timer of a lower level is due before every timer of a higher one, and a
//! level's buckets are in deadline order: the next bucket is found with a few bit scans.
//! When time reaches a bucket of level `l > 0` its timers are spread over the levels
//! below ("cascading"), reading each key's live deadline; those whose key has since
//! moved its timer elsewhere (or dropped it) are discarded on the way. A timer moves at
//! most once per level, so popping costs `O(levels)` per timer whatever the number of
//! keys — and walks bucket arrays in order, where a binary heap over millions of keys
//! misses the cache on every level of every pop.
//!
//! Deadlines are `i64` milliseconds, mapped to `u64` in the same order (the sign bit
//! flipped). Timers set at or before `now` (a late event re-opening a session that
//! already completed) go to a small exact min-heap, popped first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const BITS: u32 = 8;
const SLOTS: usize = 1 << BITS;
/// Words of a level's occupancy bitmap.
const WORDS: usize = SLOTS / 64;
/// Enough levels for 64-bit deadlines.
const LEVELS: usize = 64usize.div_ceil(BITS as usize);
/// How many timers ahead the slots they read are asked for (`ahead` of
/// [`Wheel::pop`]): with millions of keys, reading a slot's live deadline misses the
/// cache.
const AHEAD: usize = 8;
/// The smallest capacity of a bucket buffer.
const FRESH: usize = 64;
/// A drained bucket's buffer is kept for reuse up to this many entries; a larger one is
/// freed.
const KEEP: usize = 1024;

fn key(deadline: i64) -> u64 {
    (deadline as u64) ^ (1 << 63)
}

fn deadline(key: u64) -> i64 {
    (key ^ (1 << 63)) as i64
}

/// What the wheel reads and changes of the slots whose timers it holds.
pub(crate) trait Slots {
    /// The slot's live deadline ([`i64::MAX`]: none).
    fn live(&self, id: u32) -> i64;
    /// Moves the slot's live deadline as late as its owner allows
    /// ([`Timed::next_action`](crate::keyed::Timed::next_action)), never earlier, and
    /// returns it.
    fn postpone(&mut self, id: u32) -> i64;
    /// The slot will be read soon (to prefetch it).
    fn ahead(&self, id: u32);
}

/// Pending event-time timers: slot ids by deadline.
#[derive(Debug)]
pub(crate) struct Wheel {
    /// The wheel's time (as a key): every timer in the buckets is later.
    now: u64,
    buckets: Vec<Vec<u32>>,
    /// Per level, which buckets hold timers.
    occupied: [[u64; WORDS]; LEVELS],
    /// A key at or before every timer (`u64::MAX`: none): while it is later than the
    /// watermark, nothing is due and a pop costs one comparison.
    next: u64,
    /// Timers due exactly at `now` (popped before anything later).
    due: Vec<u32>,
    /// Timers set before `now`, with their deadlines.
    past: BinaryHeap<Reverse<(i64, u32)>>,
    /// Buffers of drained buckets, for buckets that fill next: in a steady state the
    /// wheel allocates nothing.
    spare: Vec<Vec<u32>>,
    /// The capacity of spare buffers.
    buffer: usize,
    /// Entries in the buckets and `due`, live or stale.
    entries: usize,
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel {
            now: 0,
            buckets: (0..LEVELS * SLOTS).map(|_| Vec::new()).collect(),
            occupied: [[0; WORDS]; LEVELS],
            next: u64::MAX,
            due: Vec::new(),
            past: BinaryHeap::new(),
            spare: Vec::with_capacity(256),
            buffer: FRESH,
            entries: 0,
        }
    }
}

impl Wheel {
    /// Adds a timer of slot `id` at `at` (before `i64::MAX`, which stands for "no
    /// timer"). The caller keeps `at` as the slot's live deadline: [`pop`](Self::pop) hands a slot back only if its live deadline is the
    /// one the timer was set for.
    pub fn insert(&mut self, id: u32, at: i64) {
        let k = key(at);
        self.next = self.next.min(k);
        if k < self.now {
            self.past.push(Reverse((at, id)));
        } else {
            self.place(id, k);
        }
    }

    /// Puts a timer at `k >= now` where it belongs.
    fn place(&mut self, id: u32, k: u64) {
        self.entries += 1;
        let diff = k ^ self.now;
        if diff == 0 {
            self.due.push(id);
            return;
        }
        let level = ((63 - diff.leading_zeros()) / BITS) as usize;
        let slot = ((k >> (level as u32 * BITS)) as usize) & (SLOTS - 1);
        let bucket = &mut self.buckets[level * SLOTS + slot];
        if bucket.capacity() == 0 {
            *bucket = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(self.buffer));
        }
        bucket.push(id);
        self.occupied[level][slot / 64] |= 1 << (slot % 64);
    }

    /// The lowest occupied bucket: (level, slot, the first time it covers).
    fn lowest(&self) -> Option<(usize, usize, u64)> {
        let (level, slot) = self
            .occupied
            .iter()
            .enumerate()
            .find_map(|(level, words)| {
                let (w, bits) = words.iter().enumerate().find(|(_, b)| **b != 0)?;
                Some((level, w * 64 + bits.trailing_zeros() as usize))
            })?;
        let above = (level as u32 + 1) * BITS;
        let prefix = if above >= 64 {
            0
        } else {
            self.now & !((1u64 << above) - 1)
        };
        Some((
            level,
            slot,
            prefix | ((slot as u64) << (level as u32 * BITS)),
        ))
    }

    /// A deadline at or before every pending timer (`None`: no timer). It may be that of
    /// a stale timer.
    pub fn bound(&self) -> Option<i64> {
        (self.next != u64::MAX).then(|| deadline(self.next))
    }

    /// The exact lower bound of [`next`](Self::next) from the structure.
    fn lower_bound(&self) -> u64 {
        if let Some(&Reverse((at, _))) = self.past.peek() {
            return key(at);
        }
        if !self.due.is_empty() {
            return self.now;
        }
        self.lowest().map_or(u64::MAX, |(_, _, start)| start)
    }

    /// The next timer due at `w` whose slot's live deadline is still the one it was set
    /// for, and that deadline; timers come in deadline order. Stale timers met on the
    /// way are dropped, and a live one whose owner has nothing to do yet is moved to
    /// when it has ([`Slots::postpone`]). The caller clears the slot's live deadline.
    /// Whether a timer may be due at `w` (when not, [`pop`](Self::pop) finds none).
    #[inline]
    pub fn may_be_due(&self, w: i64) -> bool {
        self.next <= key(w)
    }

    #[inline]
    pub fn pop(&mut self, w: i64, slots: &mut impl Slots) -> Option<(u32, i64)> {
        if self.next > key(w) {
            return None;
        }
        let popped = self.pop_slow(w, slots);
        self.next = self.lower_bound();
        popped
    }

    fn pop_slow(&mut self, w: i64, slots: &mut impl Slots) -> Option<(u32, i64)> {
        loop {
            if let Some(&Reverse((at, id))) = self.past.peek() {
                if at > w {
                    // Everything else is later still.
                    return None;
                }
                self.past.pop();
                if slots.live(id) == at {
                    let later = slots.postpone(id);
                    if later == at {
                        return Some((id, at));
                    }
                    self.insert(id, later);
                }
                continue;
            }
            if let Some(id) = self.due.pop() {
                if let Some(&next) = self.due.len().checked_sub(AHEAD).map(|i| &self.due[i]) {
                    slots.ahead(next);
                }
                self.entries -= 1;
                let now = deadline(self.now);
                if now > w {
                    self.due.push(id);
                    self.entries += 1;
                    return None;
                }
                if slots.live(id) == now {
                    let later = slots.postpone(id);
                    if later == now {
                        return Some((id, now));
                    }
                    self.place(id, key(later));
                }
                continue;
            }
            let (level, slot, start) = self.lowest()?;
            if deadline(start) > w {
                return None;
            }
            self.cascade(level, slot, start, slots);
        }
    }

    /// Moves the wheel's time to `start`, the beginning of bucket `(level, slot)`, and
    /// spreads that bucket's live timers over the levels below (or later, where their
    /// owners postpone them to).
    fn cascade(&mut self, level: usize, slot: usize, start: u64, slots: &mut impl Slots) {
        self.now = start;
        self.occupied[level][slot / 64] &= !(1 << (slot % 64));
        let mut list = std::mem::take(&mut self.buckets[level * SLOTS + slot]);
        if level == 0 {
            // A bucket of one millisecond: all of it is due now (`due` is empty here);
            // stale entries are dropped as they are popped.
            let empty = std::mem::replace(&mut self.due, list);
            self.recycle(empty);
            return;
        }
        self.entries -= list.len();
        let width_bits = level as u32 * BITS;
        for (k, &id) in list.iter().enumerate() {
            if let Some(&next) = list.get(k + AHEAD) {
                slots.ahead(next);
            }
            let k = key(slots.live(id));
            // Live only if the slot's deadline is still in this bucket (`i64::MAX`: the
            // slot has no timer).
            if k != u64::MAX && k >= start && (k - start) >> width_bits == 0 {
                self.place(id, key(slots.postpone(id)));
            }
        }
        list.clear();
        self.recycle(list);
    }

    /// Keeps an empty buffer for a bucket that fills next, unless it is large. Kept
    /// buffers all have the largest capacity a bucket needed so far, so that in a steady
    /// state no bucket outgrows the buffer it is given.
    fn recycle(&mut self, mut list: Vec<u32>) {
        if list.capacity() != 0 && list.capacity() <= KEEP {
            self.buffer = self.buffer.max(list.capacity());
            list.reserve_exact(self.buffer);
            self.spare.push(list);
        }
    }

    /// Timers pending, live or stale.
    pub fn len(&self) -> usize {
        self.entries + self.past.len()
    }

    /// Drops every timer.
    pub fn clear(&mut self) {
        for b in &mut self.buckets {
            *b = Vec::new();
        }
        self.occupied = [[0; WORDS]; LEVELS];
        self.next = u64::MAX;
        self.due = Vec::new();
        self.past.clear();
        self.spare = Vec::new();
        self.entries = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Live deadlines by slot, and when each slot's owner has something to do next.
    struct Model<'a>(&'a mut BTreeMap<u32, i64>, &'a BTreeMap<u32, i64>);

    impl Slots for Model<'_> {
        fn live(&self, id: u32) -> i64 {
            *self.0.get(&id).unwrap_or(&i64::MAX)
        }
        fn postpone(&mut self, id: u32) -> i64 {
            let live = self.0.get_mut(&id).expect("a live timer");
            *live = (*live).max(*self.1.get(&id).unwrap_or(&i64::MIN));
            *live
        }
        fn ahead(&self, _: u32) {}
    }

    /// The wheel against a model: a map of live deadlines, popped in (deadline) order.
    fn check(ops: &[(u8, u32, i64)]) {
        let mut wheel = Wheel::default();
        let mut live: BTreeMap<u32, i64> = BTreeMap::new();
        let mut action: BTreeMap<u32, i64> = BTreeMap::new();
        let mut w = i64::MIN;
        for &(op, id, t) in ops {
            match op % 4 {
                // The owner has nothing to do for the key before `t` (never moves back).
                3 => {
                    let a = action.entry(id).or_insert(i64::MIN);
                    *a = (*a).max(t);
                }
                // Set a timer (earlier than the live one, as the store does).
                0 => {
                    if t < *live.get(&id).unwrap_or(&i64::MAX) {
                        live.insert(id, t);
                        wheel.insert(id, t);
                    }
                }
                // Drop a key's timer.
                1 => {
                    live.remove(&id);
                }
                // Advance and pop everything due.
                _ => {
                    w = w.max(t);
                    let mut popped = Vec::new();
                    while let Some((id, at)) = wheel.pop(w, &mut Model(&mut live, &action)) {
                        assert_eq!(live.remove(&id), Some(at));
                        assert!(
                            at >= *action.get(&id).unwrap_or(&i64::MIN),
                            "{id} too early"
                        );
                        popped.push(at);
                    }
                    assert!(popped.is_sorted(), "out of order: {popped:?}");
                    let effective =
                        |id: &u32, at: &i64| (*at).max(*action.get(id).unwrap_or(&i64::MIN));
                    assert!(
                        live.iter().all(|(id, at)| effective(id, at) > w),
                        "left due timers at {w}: {live:?}"
                    );
                    if let Some(b) = wheel.bound() {
                        assert!(live.values().all(|&at| at >= b), "bound {b}: {live:?}");
                    } else {
                        assert!(live.is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn timers_pop_in_deadline_order_across_levels() {
        check(&[
            (0, 1, 5_000_000),
            (0, 2, 70),
            (0, 3, -3),
            (0, 4, 70),
            (0, 5, i64::MAX - 1),
            (2, 0, 0),
            (0, 6, -10),
            (2, 0, 69),
            (2, 0, 70),
            (0, 1, 4_000),
            (2, 0, 10_000_000),
            (2, 0, i64::MAX),
        ]);
    }

    proptest! {
        #[test]
        fn the_wheel_pops_what_a_sorted_map_would(
            ops in prop::collection::vec(
                (0u8..4, 0u32..16, prop_oneof![
                    -100i64..5_000,
                    -1_000_000i64..100_000_000,
                    Just(i64::MIN + 1),
                    Just(i64::MAX - 1),
                ]),
                1..200,
            )
        ) {
            check(&ops);
        }
    }
}
