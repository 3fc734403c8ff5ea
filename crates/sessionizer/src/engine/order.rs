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
    order.clear();
    for (s, n) in lens.into_iter().enumerate() {
        order.extend((0..n).map(|r| (s, r)));
    }
    order.sort_unstable_by(|&a, &b| {
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
    });
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
}
