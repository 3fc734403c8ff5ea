//! The order of one operator's output, rebuilt from the records of several shards.

use sessionizer_core::EventTime;

/// Where one emitted record goes in the output of one operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    /// The input position of the step (event, idle advance, end of input) that emitted
    /// it.
    pub step: u64,
    /// [`Place::OWN`] or [`Place::COMPLETION`].
    pub class: u8,
    /// A completion's close time (`i64::MIN` for the step's own records).
    pub close: i64,
    pub start: i64,
}

impl Place {
    /// Caused by the step's own event (a retraction, an on-update record): all from the
    /// event's shard, in emission order.
    pub const OWN: u8 = 0;
    /// A complete session of the watermark step: ordered by `(close, key, start)`
    /// across shards.
    pub const COMPLETION: u8 = 1;

    /// The place of a session record.
    pub fn session(step: u64, complete: bool, close: EventTime, start: EventTime) -> Place {
        Place {
            step,
            class: if complete {
                Place::COMPLETION
            } else {
                Place::OWN
            },
            close: close.millis(),
            start: start.millis(),
        }
    }

    /// The place of a retraction.
    pub fn retraction(step: u64, start: EventTime) -> Place {
        Place {
            step,
            class: Place::OWN,
            close: i64::MIN,
            start: start.millis(),
        }
    }

    /// The order of completions across shards (and of every record of the end of
    /// input, which are all completions): keys differ across shards, so no two records
    /// of different shards are equal.
    pub fn completion<'k>(&self, key: &'k [u8]) -> (i64, &'k [u8], i64) {
        (self.close, key, self.start)
    }
}

/// Fills `order` with `(shard, record)` for every record of the shards — shard `s` has
/// `lens[s]` records, record `r` at `place(s, r)` with key `key(s, r)` — in the order one
/// operator emits them: by step; within a step its own records (from one shard, in
/// emission order), then its completions by `(close, key, start)`.
pub(crate) fn merge_order<'k>(
    order: &mut Vec<(usize, usize)>,
    lens: impl IntoIterator<Item = usize>,
    place: impl Fn(usize, usize) -> Place,
    key: impl Fn(usize, usize) -> &'k [u8],
) {
    let cmp = |a: (usize, usize), b: (usize, usize)| {
        let (pa, pb) = (place(a.0, a.1), place(b.0, b.1));
        pa.step
            .cmp(&pb.step)
            .then(pa.class.cmp(&pb.class))
            .then_with(|| {
                if pa.class == Place::OWN {
                    a.cmp(&b)
                } else {
                    pa.completion(key(a.0, a.1))
                        .cmp(&pb.completion(key(b.0, b.1)))
                }
            })
    };
    let lens: Vec<usize> = lens.into_iter().collect();
    merge_by(order, &lens, cmp);
}

/// Fills `order` with `(shard, record)` for every record of the shards (shard `s` has
/// `lens[s]` records) in the order `cmp`, no two records of different shards equal. A
/// shard is one operator, which emits its records in that order already: the shards'
/// lists are then merged in one pass. Should one not be in order, the records are
/// sorted instead (the same order, at n log n).
pub(crate) fn merge_by(
    order: &mut Vec<(usize, usize)>,
    lens: &[usize],
    cmp: impl Fn((usize, usize), (usize, usize)) -> std::cmp::Ordering,
) {
    order.clear();
    let in_order = lens
        .iter()
        .enumerate()
        .all(|(s, &n)| (1..n).all(|r| cmp((s, r - 1), (s, r)).is_lt()));
    if !in_order {
        for (s, &n) in lens.iter().enumerate() {
            order.extend((0..n).map(|r| (s, r)));
        }
        order.sort_unstable_by(|&a, &b| cmp(a, b));
        return;
    }
    order.reserve(lens.iter().sum());
    let mut next = vec![0usize; lens.len()];
    loop {
        let mut least: Option<(usize, usize)> = None;
        for (s, (&at, &n)) in next.iter().zip(lens).enumerate() {
            if at < n && least.is_none_or(|l| cmp((s, at), l).is_lt()) {
                least = Some((s, at));
            }
        }
        let Some(l) = least else { break };
        order.push(l);
        next[l.0] += 1;
    }
}

/// Records each shard emits per round of a bounded end of input, at most: every shard
/// emits its sessions in rounds of at most this many (one holding more than half of
/// it unwritten sits a round out), so memory does not grow with the open sessions.
pub(crate) const END_PART: usize = 8192;

/// A round of the end of input in parts: every shard emits its remaining sessions in
/// `(close, key, start)` order, at most [`END_PART`] a round. Of each shard's records
/// so far (`len(s)` of them, record `r` at position `pos(s, r)`, ascending), how many
/// can be written now: those at or before the last record of every shard that has more
/// to come (`ending(s)`) — nothing any shard emits later sorts before them. `None`: a
/// shard with more to come has no record yet (it emits in the next round).
pub(crate) fn end_part_lens<P: Ord>(
    shards: usize,
    ending: impl Fn(usize) -> bool,
    len: impl Fn(usize) -> usize,
    pos: impl Fn(usize, usize) -> P,
) -> Option<Vec<usize>> {
    let mut bound = None;
    for s in (0..shards).filter(|&s| ending(s)) {
        let last = pos(s, len(s).checked_sub(1)?);
        if bound.as_ref().is_none_or(|b| last < *b) {
            bound = Some(last);
        }
    }
    Some(
        (0..shards)
            .map(|s| match &bound {
                // Ascending: a binary search for the end of those at or before it.
                Some(b) => {
                    let (mut lo, mut hi) = (0, len(s));
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        if pos(s, mid) <= *b {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    lo
                }
                None => len(s),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_by_step_then_own_records_then_completions_by_close_key_start() {
        // Two shards; keys "b" on shard 0, "a" on shard 1.
        let places = [
            vec![
                Place::session(2, true, EventTime(50), EventTime(10)),
                Place::retraction(3, EventTime(5)),
                Place::session(3, false, EventTime(70), EventTime(5)),
                Place::session(3, true, EventTime(40), EventTime(1)),
            ],
            vec![
                Place::session(1, true, EventTime(90), EventTime(0)),
                Place::session(2, true, EventTime(50), EventTime(20)),
                Place::session(3, true, EventTime(40), EventTime(1)),
            ],
        ];
        let keys: [&[u8]; 2] = [b"b", b"a"];
        let mut order = Vec::new();
        merge_order(
            &mut order,
            places.iter().map(Vec::len),
            |s, r| places[s][r],
            |s, _| keys[s],
        );
        assert_eq!(
            order,
            [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (1, 2), (0, 3)],
            "step 2: close 50 ties, key a < b; step 3: own records first, in order, \
             then close 40 with key a before b"
        );
    }

    /// A record's sort key by the definition: step, class, then (close, key, start)
    /// for a completion, and for every record its shard and place there.
    type SortKey<'k> = (u64, u8, i64, &'k [u8], i64, usize, usize);

    /// The order by its definition: every record's sort key, one stable sort.
    fn by_definition(places: &[Vec<Place>], keys: &[Vec<u8>]) -> Vec<(usize, usize)> {
        let mut all: Vec<SortKey<'_>> = Vec::new();
        for (s, shard) in places.iter().enumerate() {
            for (r, p) in shard.iter().enumerate() {
                all.push(match p.class {
                    Place::OWN => (p.step, p.class, 0, &[], 0, s, r),
                    _ => (p.step, p.class, p.close, &keys[s], p.start, s, r),
                });
            }
        }
        all.sort();
        all.into_iter().map(|t| (t.5, t.6)).collect()
    }

    proptest::proptest! {
        /// Shards whose records come in one operator's order are merged; any others
        /// are sorted: either way the order is the definition's.
        #[test]
        fn the_merged_order_is_the_definitions(
            shards in proptest::collection::vec(
                proptest::collection::vec((0u64..6, proptest::bool::ANY, -5i64..5, -5i64..5), 0..30),
                1..4,
            ),
            emitted_in_order in proptest::bool::ANY,
        ) {
            let keys: Vec<Vec<u8>> = (0..shards.len()).map(|s| vec![b'k', b'0' + s as u8]).collect();
            let mut places: Vec<Vec<Place>> = shards
                .iter()
                .map(|shard| {
                    let mut seen = std::collections::HashSet::new();
                    shard
                        .iter()
                        // One shard never emits the same completion twice in a step.
                        .filter(|&&(step, complete, close, start)| !complete || seen.insert((step, close, start)))
                        .map(|&(step, complete, close, start)| {
                            Place::session(step, complete, EventTime(close), EventTime(start))
                        })
                        .collect()
                })
                .collect();
            if emitted_in_order {
                for (s, shard) in places.iter_mut().enumerate() {
                    let single = [std::mem::take(shard)];
                    let order = by_definition(&single, &keys[s..=s]);
                    *shard = order.into_iter().map(|(_, r)| single[0][r]).collect();
                }
            }
            let mut order = Vec::new();
            merge_order(
                &mut order,
                places.iter().map(Vec::len),
                |s, r| places[s][r],
                |s, _| &keys[s],
            );
            proptest::prop_assert_eq!(order, by_definition(&places, &keys));
        }
    }

    #[test]
    fn a_round_writes_what_no_later_record_can_precede() {
        let shards = [vec![1, 4, 9], vec![2, 3], vec![5, 6, 7]];
        let lens = |ending: [bool; 3]| {
            end_part_lens(3, |s| ending[s], |s| shards[s].len(), |s, r| shards[s][r])
        };
        // Shards 0 and 2 have more to come: everything up to 7 (the lesser last).
        assert_eq!(lens([true, false, true]), Some(vec![2, 2, 3]));
        // Only shard 1: up to 3.
        assert_eq!(lens([false, true, false]), Some(vec![1, 2, 0]));
        // None has more: everything.
        assert_eq!(lens([false; 3]), Some(vec![3, 2, 3]));
        // A shard with more to come and nothing yet: wait.
        let empty: [Vec<i32>; 2] = [vec![], vec![1]];
        assert_eq!(
            end_part_lens(2, |s| s == 0, |s| empty[s].len(), |s, r| empty[s][r]),
            None
        );
    }
}
