//! A spill store in memory: two ordered maps. The reference the RocksDB store is
//! tested against, and the spill store of tests that need eviction without RocksDB.

use super::{Deadlines, Domain, SpillError, SpillStore};
use crate::keyed::KeyBytes;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A [`SpillStore`] in memory: a key's state and deadlines by key, the keys by deadline
/// on each clock.
pub struct MapSpill<S> {
    states: BTreeMap<KeyBytes, (S, Deadlines)>,
    /// By [`Domain`]: event time, processing time.
    timers: [BTreeSet<(i64, KeyBytes)>; 2],
}

impl<S> Default for MapSpill<S> {
    fn default() -> Self {
        MapSpill {
            states: BTreeMap::new(),
            timers: [BTreeSet::new(), BTreeSet::new()],
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

const DOMAINS: [Domain; 2] = [Domain::EventTime, Domain::ProcessingTime];

impl<S: Send> SpillStore<S> for MapSpill<S> {
    fn take(&mut self, key: &[u8]) -> Result<Option<(S, Deadlines)>, SpillError> {
        let taken = self.states.remove(key);
        if let Some((_, deadlines)) = &taken {
            for d in DOMAINS {
                self.timers[d as usize].remove(&(deadlines.of(d), KeyBytes::from_slice(key)));
            }
        }
        Ok(taken)
    }

    fn peek(&self, key: &[u8], f: &mut dyn FnMut(&S)) -> Result<bool, SpillError> {
        Ok(self.states.get(key).map(|(s, _)| f(s)).is_some())
    }

    fn put(&mut self, evicted: &mut Vec<(KeyBytes, S, Deadlines)>) -> Result<(), SpillError> {
        for (key, state, deadlines) in evicted.drain(..) {
            for d in DOMAINS {
                if deadlines.of(d) != Deadlines::NONE {
                    self.timers[d as usize].insert((deadlines.of(d), key.clone()));
                }
            }
            self.states.insert(key, (state, deadlines));
        }
        Ok(())
    }

    fn earliest(&self, domain: Domain) -> Result<i64, SpillError> {
        Ok(self.timers[domain as usize]
            .first()
            .map_or(i64::MAX, |(deadline, _)| *deadline))
    }

    fn take_due(
        &mut self,
        domain: Domain,
        upto: i64,
        max: usize,
        f: &mut dyn FnMut(&[u8], S, Deadlines),
    ) -> Result<i64, SpillError> {
        let mut taken = 0;
        let mut last = None;
        while let Some((deadline, _)) = self.timers[domain as usize].first() {
            let deadline = *deadline;
            if deadline > upto || (taken >= max.max(1) && last != Some(deadline)) {
                return Ok(deadline);
            }
            let (_, key) = self.timers[domain as usize]
                .pop_first()
                .expect("a first timer");
            let (state, deadlines) = self.states.remove(&key).expect("a timer's key has state");
            for other in DOMAINS.into_iter().filter(|&d| d != domain) {
                self.timers[other as usize].remove(&(deadlines.of(other), key.clone()));
            }
            f(&key, state, deadlines);
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

    fn clear(&mut self) -> Result<(), SpillError> {
        *self = MapSpill::default();
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
        let ev = Deadlines::event;
        m.put(&mut vec![
            (k("a"), 1, ev(30)),
            (k("b"), 2, ev(10)),
            (k("c"), 3, ev(10)),
            (k("d"), 4, ev(20)),
        ])
        .unwrap();
        let mut got = Vec::new();
        let next = m
            .take_due(Domain::EventTime, 25, 1, &mut |key, s, d| {
                got.push((key.to_vec(), s, d.event))
            })
            .unwrap();
        assert_eq!(got, vec![(b"b".to_vec(), 2, 10), (b"c".to_vec(), 3, 10)]);
        assert_eq!(next, 20, "the next deadline left");
        assert_eq!(m.take(b"a").unwrap(), Some((1, ev(30))));
        assert_eq!(m.take(b"a").unwrap(), None);
        got.clear();
        let next = m
            .take_due(Domain::EventTime, i64::MAX, 10, &mut |key, s, d| {
                got.push((key.to_vec(), s, d.event))
            })
            .unwrap();
        assert_eq!(got, vec![(b"d".to_vec(), 4, 20)]);
        assert_eq!(next, i64::MAX);
    }

    #[test]
    fn each_clock_has_its_own_order_and_a_key_leaves_both() {
        let mut m: MapSpill<u32> = MapSpill::default();
        let both = |event, processing| Deadlines { event, processing };
        m.put(&mut vec![
            (k("a"), 1, both(10, 500)),
            (k("b"), 2, both(Deadlines::NONE, 100)),
            (k("c"), 3, both(Deadlines::NONE, Deadlines::NONE)),
        ])
        .unwrap();
        let mut got = Vec::new();
        let next = m
            .take_due(Domain::ProcessingTime, 200, 10, &mut |key, s, _| {
                got.push((key.to_vec(), s))
            })
            .unwrap();
        assert_eq!(got, vec![(b"b".to_vec(), 2)]);
        assert_eq!(next, 500);
        got.clear();
        // a leaves both clocks when taken by its event-time deadline.
        m.take_due(Domain::EventTime, 10, 10, &mut |key, s, _| {
            got.push((key.to_vec(), s))
        })
        .unwrap();
        assert_eq!(got, vec![(b"a".to_vec(), 1)]);
        let next = m
            .take_due(Domain::ProcessingTime, i64::MAX, 10, &mut |_, _, _| {
                panic!("a is gone, c has no timer")
            })
            .unwrap();
        assert_eq!(next, i64::MAX);
        // A key without timers comes back only when asked for.
        assert_eq!(
            m.take(b"c").unwrap(),
            Some((3, both(Deadlines::NONE, Deadlines::NONE)))
        );
    }
}
