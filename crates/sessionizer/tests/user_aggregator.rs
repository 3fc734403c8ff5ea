//! A user-defined aggregator gives the same result whether sessions merge or not: the
//! same events arriving out of order (so that late events bridge and merge sessions)
//! and in event-time order (so that no session ever merges) give the same sessions
//! with the same aggregate values.

use proptest::prelude::*;
use sessionizer::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Clone)]
struct Click {
    user: u8,
    at: EventTime,
    /// A unique id: orders clicks of equal time the same way in both runs.
    id: u32,
    amount: i64,
}

/// A typical user aggregate: count, total, the clicks in time order, the biggest.
#[derive(Debug, Clone, Default)]
struct ClickStats {
    merges: Arc<AtomicUsize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stats {
    count: u64,
    total: i64,
    ids_in_time_order: Vec<u32>,
    biggest: Option<(i64, u32)>,
}

impl Aggregator<Click> for ClickStats {
    type Acc = (u64, i64, Vec<(EventTime, u32)>, Option<(i64, u32)>);
    type Output = Stats;

    fn create(&self) -> Self::Acc {
        (0, 0, Vec::new(), None)
    }

    fn add(&self, acc: &mut Self::Acc, c: &Click, _: Position) {
        acc.0 += 1;
        acc.1 += c.amount;
        acc.2.push((c.at, c.id));
        // Largest amount, ties to the smallest id: independent of order.
        let candidate = (c.amount, c.id);
        acc.3 = Some(match acc.3 {
            Some(b)
                if (b.0, std::cmp::Reverse(b.1))
                    >= (candidate.0, std::cmp::Reverse(candidate.1)) =>
            {
                b
            }
            _ => candidate,
        });
    }

    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        self.merges.fetch_add(1, Ordering::Relaxed);
        acc.0 += other.0;
        acc.1 += other.1;
        acc.2.extend(other.2);
        if let Some(o) = other.3 {
            let mut tmp = self.create();
            tmp.3 = acc.3;
            // Re-use add's rule for the maximum.
            let click = Click {
                user: 0,
                at: EventTime(0),
                id: o.1,
                amount: o.0,
            };
            self.add(
                &mut tmp,
                &click,
                Position {
                    time: EventTime(0),
                    seq: 0,
                },
            );
            acc.3 = tmp.3;
        }
    }

    fn finish(&self, acc: &Self::Acc) -> Stats {
        let mut ids = acc.2.clone();
        ids.sort();
        Stats {
            count: acc.0,
            total: acc.1,
            ids_in_time_order: ids.into_iter().map(|(_, id)| id).collect(),
            biggest: acc.3,
        }
    }
}

/// Runs the window (gap 10 ms, a watermark far behind so nothing is late) and returns the
/// final sessions, sorted, and how many merges the aggregator saw.
/// A session as compared: key, start, end, count, aggregate.
type Found = (String, i64, i64, u64, Stats);

fn sessions(clicks: &[Click]) -> (Vec<Found>, usize) {
    let agg = ClickStats::default();
    let merges = agg.merges.clone();
    let mut job = Stream::<Click>::new()
        .key_by(|c| c.user)
        .event_time(|c| c.at)
        .watermark(BoundedOutOfOrderness::new(hours(1)))
        .session_windows(millis(10))
        .aggregate(agg)
        .build();
    let mut out = Vec::new();
    let mut late = Vec::new();
    job.run(clicks.iter().cloned(), &mut out, &mut late)
        .expect("vectors never refuse");
    assert!(late.is_empty());
    let mut got: Vec<_> = out
        .into_iter()
        .filter_map(|o| match o {
            WindowOutput::Session(s) => Some((
                s.key,
                s.start.millis(),
                s.end.millis(),
                s.event_count,
                s.value,
            )),
            WindowOutput::Retraction(_) => None,
        })
        .collect();
    got.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    (got, merges.load(Ordering::Relaxed))
}

fn clicks(spec: &[(u8, i64, i64)]) -> Vec<Click> {
    spec.iter()
        .enumerate()
        .map(|(i, &(user, t, amount))| Click {
            user,
            at: EventTime(t),
            id: i as u32,
            amount,
        })
        .collect()
}

fn in_time_order(clicks: &[Click]) -> Vec<Click> {
    let mut sorted = clicks.to_vec();
    sorted.sort_by_key(|c| (c.at, c.id));
    sorted
}

#[test]
fn a_bridging_click_merges_and_the_result_equals_the_unmerged_run() {
    // Gap 10. User 1: 0, 25, 8 -> sessions [0, 8] (close 18) and [25]; then 16 touches
    // both (16 <= 18 and 16 + 10 >= 25): one session.
    let c = clicks(&[(1, 0, 5), (1, 25, 7), (1, 8, 1), (1, 16, 9), (2, 100, 3)]);
    let (merged, merges) = sessions(&c);
    let (sorted, no_merges) = sessions(&in_time_order(&c));
    assert!(merges > 0, "the out-of-order run merged sessions");
    assert_eq!(no_merges, 0, "the in-order run never merges");
    assert_eq!(merged, sorted);
    assert_eq!(merged[0].4.ids_in_time_order, [0, 2, 3, 1]);
    assert_eq!(merged[0].4.biggest, Some((9, 3)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_user_aggregator_gives_the_same_result_whether_sessions_merge_or_not(
        spec in prop::collection::vec((0u8..3, 0i64..200, -5i64..20), 1..60)
    ) {
        let c = clicks(&spec);
        let (arrival_order, _) = sessions(&c);
        let (time_order, merges) = sessions(&in_time_order(&c));
        prop_assert_eq!(merges, 0);
        prop_assert_eq!(arrival_order, time_order);
    }
}
