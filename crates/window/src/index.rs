//! The hash index of a [`KeyedStore`](crate::keyed::KeyedStore): key hash -> slot id.
//!
//! Open addressing with linear probing over one array of `u32` entries. An entry holds
//! the slot id (plus one) in its low `id_bits` bits and the top bits of the key's hash
//! above them, so that a probe reads a slot (to compare the key) only when those bits
//! match: as many as the slot ids leave room for, 8 or more up to 16M slots. `0` is an
//! empty entry; a removed key leaves a tombstone (a tag of 1 over an id of 0) until the
//! next rebuild. At most 80% of the entries are used (live or tombstones).
//!
//! Against `hashbrown::HashTable<u32>` (a control byte plus 4 bytes per bucket, at most
//! 87.5% full): 4 bytes per bucket, and the bucket of a hash is known up front, so the
//! caller can ask for its cache line before it needs it ([`Index::prefetch`]) — with
//! millions of keys, the lookups of several events then wait for memory together.

use sessionizer_core::prefetch::prefetch;

/// Bits of the slot id field: slots up to `2^31 - 1`.
const MAX_ID_BITS: u32 = 31;

/// Key hash -> slot id.
#[derive(Debug)]
pub(crate) struct Index {
    entries: Vec<u32>,
    /// `entries.len() - 1` (a power of two minus one), 0 when empty.
    mask: usize,
    /// Width of the `id + 1` field.
    id_bits: u32,
    live: usize,
    /// Live entries and tombstones.
    used: usize,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            entries: Vec::new(),
            mask: 0,
            id_bits: 16,
            live: 0,
            used: 0,
        }
    }
}

impl Index {
    #[inline]
    fn id_mask(&self) -> u32 {
        (1u32 << self.id_bits) - 1
    }

    /// The entry's hash bits for `hash`.
    #[inline]
    fn tag(&self, hash: u64) -> u32 {
        (hash >> (32 + self.id_bits)) as u32
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        hash as usize & self.mask
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.live
    }

    /// The slot whose key has `hash` and passes `is_key`.
    #[inline]
    pub fn find(&self, hash: u64, is_key: impl Fn(u32) -> bool) -> Option<u32> {
        if self.entries.is_empty() {
            return None;
        }
        let (tag, id_mask) = (self.tag(hash), self.id_mask());
        let mut i = self.home(hash);
        loop {
            let e = self.entries[i];
            if e == 0 {
                return None;
            }
            let field = e & id_mask;
            if e >> self.id_bits == tag && field != 0 && is_key(field - 1) {
                return Some(field - 1);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Asks for the cache line where the lookup of `hash` starts.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if let Some(e) = self.entries.get(self.home(hash)) {
            prefetch(e);
        }
    }

    /// The first slot on the probe path of `hash` whose hash bits match (the slot a
    /// lookup will most likely read), without comparing keys.
    #[inline]
    pub fn candidate(&self, hash: u64) -> Option<u32> {
        if self.entries.is_empty() {
            return None;
        }
        let (tag, id_mask) = (self.tag(hash), self.id_mask());
        let mut i = self.home(hash);
        for _ in 0..8 {
            let e = self.entries[i];
            if e == 0 {
                return None;
            }
            if e >> self.id_bits == tag && e & id_mask != 0 {
                return Some((e & id_mask) - 1);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Adds slot `id` for a key with `hash` that is not in the index. `hash_of` gives
    /// the hash of any slot already in (for a rebuild).
    pub fn insert(&mut self, hash: u64, id: u32, hash_of: impl Fn(u32) -> u64) {
        let needs_bits = u64::from(id) + 2 > 1u64 << self.id_bits;
        if needs_bits || (self.used + 1) * 5 > self.entries.len() * 4 {
            let bits = if needs_bits {
                // One bit of room over what this id needs: rebuilds stay rare.
                (64 - (u64::from(id) + 1).leading_zeros() + 1).min(MAX_ID_BITS)
            } else {
                self.id_bits
            };
            assert!(
                u64::from(id) + 1 < 1u64 << bits,
                "more than 2^31 keys in one store"
            );
            let len = if (self.live + 1) * 5 > self.entries.len() * 2 {
                (self.entries.len() * 2).max(16)
            } else {
                self.entries.len().max(16)
            };
            self.rebuild(len, bits, &hash_of);
        }
        let tag = self.tag(hash);
        let mut i = self.home(hash);
        loop {
            let e = self.entries[i];
            if e == 0 || e & self.id_mask() == 0 {
                if e == 0 {
                    self.used += 1;
                }
                self.entries[i] = (tag << self.id_bits) | (id + 1);
                self.live += 1;
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Makes room for `keys` keys in all without a rebuild (restoring a checkpoint).
    pub fn reserve(&mut self, keys: usize, hash_of: impl Fn(u32) -> u64) {
        let len = (keys * 5 / 4 + 1).next_power_of_two().max(16);
        if len > self.entries.len() {
            self.rebuild(len, self.id_bits, &hash_of);
        }
    }

    /// Removes slot `id`, whose key has `hash`.
    pub fn remove(&mut self, hash: u64, id: u32) {
        if self.entries.is_empty() {
            return;
        }
        let id_mask = self.id_mask();
        let mut i = self.home(hash);
        loop {
            let e = self.entries[i];
            if e == 0 {
                return;
            }
            if e & id_mask == id + 1 {
                self.live -= 1;
                if self.entries[(i + 1) & self.mask] != 0 {
                    // A probe path may go on past this entry.
                    self.entries[i] = 1 << self.id_bits;
                    return;
                }
                // The end of a probe path: it ends earlier now, also past the
                // tombstones just before it.
                self.entries[i] = 0;
                self.used -= 1;
                let mut j = i.wrapping_sub(1) & self.mask;
                while self.entries[j] != 0 && self.entries[j] & id_mask == 0 {
                    self.entries[j] = 0;
                    self.used -= 1;
                    j = j.wrapping_sub(1) & self.mask;
                }
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Builds the index anew with `len` entries and `id_bits`, without tombstones.
    fn rebuild(&mut self, len: usize, id_bits: u32, hash_of: &impl Fn(u32) -> u64) {
        let old = std::mem::replace(&mut self.entries, vec![0; len]);
        let old_mask = self.id_mask();
        self.mask = len - 1;
        self.id_bits = id_bits;
        self.used = self.live;
        for e in old {
            let field = e & old_mask;
            if field != 0 {
                let hash = hash_of(field - 1);
                let tag = self.tag(hash);
                let mut i = self.home(hash);
                while self.entries[i] != 0 {
                    i = (i + 1) & self.mask;
                }
                self.entries[i] = (tag << self.id_bits) | field;
            }
        }
    }

    /// Every slot id, in no particular order.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let id_mask = self.id_mask();
        self.entries
            .iter()
            .filter(move |&&e| e & id_mask != 0)
            .map(move |&e| (e & id_mask) - 1)
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        *self = Index::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A poor hash, so that probe paths collide and wrap around.
    fn hash(key: u32) -> u64 {
        u64::from(key % 97).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(key)
    }

    proptest! {
        /// The index agrees with a map through inserts, removals (tombstones), rebuilds
        /// and growing slot ids (wider id fields).
        #[test]
        fn the_index_finds_what_a_map_holds(ops in prop::collection::vec((any::<bool>(), 0u32..300), 1..600)) {
            let mut index = Index::default();
            // key -> slot id; slot ids grow (as a store hands out new slots), and a
            // removed key's slot may come back for another key.
            let mut map: HashMap<u32, u32> = HashMap::new();
            let mut key_of: HashMap<u32, u32> = HashMap::new();
            let mut free: Vec<u32> = Vec::new();
            let mut next_id = 0u32;
            for (add, key) in ops {
                let h = hash(key);
                let found = index.find(h, |id| key_of.get(&id) == Some(&key));
                prop_assert_eq!(found, map.get(&key).copied());
                match (add, found) {
                    (true, None) => {
                        let id = free.pop().unwrap_or_else(|| { next_id += 37; next_id });
                        let keys = key_of.clone();
                        index.insert(h, id, |id| hash(keys[&id]));
                        map.insert(key, id);
                        key_of.insert(id, key);
                    }
                    (false, Some(id)) => {
                        index.remove(h, id);
                        map.remove(&key);
                        key_of.remove(&id);
                        free.push(id);
                    }
                    _ => {}
                }
                prop_assert_eq!(index.len(), map.len());
            }
            let mut ids: Vec<u32> = index.iter().collect();
            ids.sort_unstable();
            let mut expected: Vec<u32> = map.values().copied().collect();
            expected.sort_unstable();
            prop_assert_eq!(ids, expected);
            for (&key, &id) in &map {
                prop_assert_eq!(index.find(hash(key), |i| i == id), Some(id));
            }
        }
    }

    #[test]
    fn slot_ids_wider_than_16_bits_get_a_wider_field() {
        let mut index = Index::default();
        let ids = [3u32, 70_000, 5_000_000, 2_000_000_000];
        for (k, &id) in ids.iter().enumerate() {
            let done: Vec<u32> = ids[..k].to_vec();
            index.insert(hash(id), id, |i| {
                assert!(done.contains(&i));
                hash(i)
            });
        }
        for &id in &ids {
            assert_eq!(index.find(hash(id), |i| i == id), Some(id));
            assert_eq!(index.candidate(hash(id)), Some(id));
        }
        assert_eq!(index.id_bits, 31);
    }
}
