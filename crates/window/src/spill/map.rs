//! A spill store in memory: two ordered maps. The reference the RocksDB store is
//! tested against, and the spill store of tests that need eviction without RocksDB.

use super::{SpillError, SpillStore};
use crate::keyed::KeyBytes;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A [`SpillStore`] in memory: a key's state and deadline by key, the keys by deadline.
pub struct MapSpill<S> {
    states: BTreeMap<KeyBytes, (S, i64)>,
    timers: BTreeSet<(i64, KeyBytes)>,
}

impl<S> Default for MapSpill<S> {
    fn default() -> Self {
        MapSpill {
            states: BTreeMap::new(),
            timers: BTreeSet::new(),
        }
    }
}

impl<S> fmt::Debug for MapSpill<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapSpill")
            .field("keys", &self.states.len())
            .finish()
    }
}

impl<S: Send> SpillStore<S> for MapSpill<S> {
    fn take(&mut self, key: &[u8]) -> Result<Option<(S, i64)>, SpillError> {
        let taken = self.states.remove(key);
        if let Some((_, deadline)) = &taken {
            self.timers.remove(&(*deadline, KeyBytes::from_slice(key)));
        }
        Ok(taken)
    }

    fn peek(&self, key: &[u8], f: &mut dyn FnMut(&S)) -> Result<bool, SpillError> {
        Ok(self.states.get(key).map(|(s, _)| f(s)).is_some())
    }

    fn put(&mut self, evicted: &mut Vec<(KeyBytes, S, i64)>) -> Result<(), SpillError> {
        for (key, state, deadline) in evicted.drain(..) {
            self.timers.insert((deadline, key.clone()));
            self.states.insert(key, (state, deadline));
        }
        Ok(())
    }

    fn take_due(
        &mut self,
        upto: i64,
        max: usize,
        f: &mut dyn FnMut(&[u8], S, i64),
    ) -> Result<i64, SpillError> {
        let mut taken = 0;
        let mut last = None;
        while let Some((deadline, _)) = self.timers.first() {
            let deadline = *deadline;
            if deadline > upto || (taken >= max.max(1) && last != Some(deadline)) {
                return Ok(deadline);
            }
            let (_, key) = self.timers.pop_first().expect("a first timer");
            let (state, _) = self.states.remove(&key).expect("a timer's key has state");
            f(&key, state, deadline);
            taken += 1;
            last = Some(deadline);
        }
        Ok(i64::MAX)
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8], &S)) -> Result<(), SpillError> {
        for (key, (state, _)) in &self.states {
            f(key, state);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> KeyBytes {
        KeyBytes::from_slice(s.as_bytes())
    }

    #[test]
    fn due_keys_come_back_in_deadline_order_whole_deadlines_at_a_time() {
        let mut m: MapSpill<u32> = MapSpill::default();
        m.put(&mut vec![
            (k("a"), 1, 30),
            (k("b"), 2, 10),
            (k("c"), 3, 10),
            (k("d"), 4, 20),
        ])
        .unwrap();
        let mut got = Vec::new();
        let next = m
            .take_due(25, 1, &mut |key, s, d| got.push((key.to_vec(), s, d)))
            .unwrap();
        assert_eq!(got, vec![(b"b".to_vec(), 2, 10), (b"c".to_vec(), 3, 10)]);
        assert_eq!(next, 20, "the next deadline left");
        assert_eq!(m.take(b"a").unwrap(), Some((1, 30)));
        assert_eq!(m.take(b"a").unwrap(), None);
        got.clear();
        let next = m
            .take_due(i64::MAX, 10, &mut |key, s, d| {
                got.push((key.to_vec(), s, d))
            })
            .unwrap();
        assert_eq!(got, vec![(b"d".to_vec(), 4, 20)]);
        assert_eq!(next, i64::MAX);
    }
}
