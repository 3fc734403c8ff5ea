//! The built-in aggregates of the command line (SPEC §3), over the user's own events:
//! each takes a closure that picks a value out of an event (`None` is skipped, as SQL
//! aggregates skip nulls). Order-sensitive ones follow event time, ties in input order,
//! so a result never depends on how sessions merged.
//!
//! Combine several with a tuple: `.aggregate((Count, Collect(|v: &Visit| Some(v.page.clone()))))`.
//! For anything else, implement [`Aggregator`] yourself.
//!
//! ```
//! use sessionizer::aggregators::{Collect, Count, Max};
//! use sessionizer::window::aggregate::{Aggregator, Position};
//! use sessionizer::core::EventTime;
//!
//! let agg = (Count, Collect(|p: &(i64, &'static str)| Some(p.1)), Max(|p: &(i64, &'static str)| Some(p.0)));
//! let mut acc = agg.create();
//! for (seq, e) in [(30, "/b"), (10, "/a")].iter().enumerate() {
//!     agg.add(&mut acc, e, Position { time: EventTime(e.0), seq: seq as u64 });
//! }
//! assert_eq!(agg.finish(&acc), (2, vec!["/a", "/b"], Some(30)));
//! ```

use sessionizer_window::aggregate::{Aggregator, Position};
use std::cmp::Ordering;
use std::collections::HashSet;
use std::hash::Hash;
use std::ops::Add;

/// The number of events (`event_count` counts them too; this is for tuples).
#[derive(Debug, Clone, Copy, Default)]
pub struct Count;

impl<E> Aggregator<E> for Count {
    type Acc = u64;
    type Output = u64;
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _: &E, _: Position) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn finish(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// All values, in event-time order, ties in input order (`--collect`).
#[derive(Debug, Clone, Copy)]
pub struct Collect<F>(pub F);

impl<E, V: Clone, F: Fn(&E) -> Option<V>> Aggregator<E> for Collect<F> {
    type Acc = Vec<(Position, V)>;
    type Output = Vec<V>;
    fn create(&self) -> Self::Acc {
        Vec::new()
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, at: Position) {
        if let Some(v) = (self.0)(event) {
            // Mostly in order: append; otherwise insert at its place.
            let pos = acc.partition_point(|(p, _)| *p < at);
            acc.insert(pos, (at, v));
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        acc.extend(other);
        acc.sort_by_key(|(p, _)| *p);
    }
    fn finish(&self, acc: &Self::Acc) -> Vec<V> {
        acc.iter().map(|(_, v)| v.clone()).collect()
    }
}

/// Keeps the value at the position that `better` prefers.
fn keep<V>(
    slot: &mut Option<(Position, V)>,
    at: Position,
    v: V,
    better: fn(Position, Position) -> bool,
) {
    match slot {
        Some((p, _)) if !better(at, *p) => {}
        _ => *slot = Some((at, v)),
    }
}

/// The value of the earliest event that has one (`--first`).
#[derive(Debug, Clone, Copy)]
pub struct First<F>(pub F);

impl<E, V: Clone, F: Fn(&E) -> Option<V>> Aggregator<E> for First<F> {
    type Acc = Option<(Position, V)>;
    type Output = Option<V>;
    fn create(&self) -> Self::Acc {
        None
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, at: Position) {
        if let Some(v) = (self.0)(event) {
            keep(acc, at, v, |a, b| a < b);
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        if let Some((at, v)) = other {
            keep(acc, at, v, |a, b| a < b);
        }
    }
    fn finish(&self, acc: &Self::Acc) -> Option<V> {
        acc.as_ref().map(|(_, v)| v.clone())
    }
}

/// The value of the latest event that has one (`--last`).
#[derive(Debug, Clone, Copy)]
pub struct Last<F>(pub F);

impl<E, V: Clone, F: Fn(&E) -> Option<V>> Aggregator<E> for Last<F> {
    type Acc = Option<(Position, V)>;
    type Output = Option<V>;
    fn create(&self) -> Self::Acc {
        None
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, at: Position) {
        if let Some(v) = (self.0)(event) {
            keep(acc, at, v, |a, b| a > b);
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        if let Some((at, v)) = other {
            keep(acc, at, v, |a, b| a > b);
        }
    }
    fn finish(&self, acc: &Self::Acc) -> Option<V> {
        acc.as_ref().map(|(_, v)| v.clone())
    }
}

/// The number of distinct values (`--count-distinct`).
#[derive(Debug, Clone, Copy)]
pub struct CountDistinct<F>(pub F);

impl<E, V: Eq + Hash, F: Fn(&E) -> Option<V>> Aggregator<E> for CountDistinct<F> {
    type Acc = HashSet<V>;
    type Output = usize;
    fn create(&self) -> Self::Acc {
        HashSet::new()
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, _: Position) {
        if let Some(v) = (self.0)(event) {
            acc.insert(v);
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        acc.extend(other);
    }
    fn finish(&self, acc: &Self::Acc) -> usize {
        acc.len()
    }
}

/// The sum of the values; `None` when there are none (`--sum`).
#[derive(Debug, Clone, Copy)]
pub struct Sum<F>(pub F);

impl<E, V: Copy + Add<Output = V>, F: Fn(&E) -> Option<V>> Aggregator<E> for Sum<F> {
    type Acc = Option<V>;
    type Output = Option<V>;
    fn create(&self) -> Self::Acc {
        None
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, _: Position) {
        if let Some(v) = (self.0)(event) {
            *acc = Some(acc.map_or(v, |s| s + v));
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        if let Some(v) = other {
            *acc = Some(acc.map_or(v, |s| s + v));
        }
    }
    fn finish(&self, acc: &Self::Acc) -> Option<V> {
        *acc
    }
}

/// Keeps the extreme value; ties keep the earliest position and values that do not
/// compare with themselves (NaN) are skipped, so the result does not depend on merge
/// order.
fn extreme<V: PartialOrd>(slot: &mut Option<(Position, V)>, at: Position, v: V, want: Ordering) {
    let better = match slot {
        None => v.partial_cmp(&v).is_some(),
        Some((p, cur)) => match v.partial_cmp(cur) {
            Some(Ordering::Equal) => at < *p,
            Some(o) => o == want,
            None => false,
        },
    };
    if better {
        *slot = Some((at, v));
    }
}

/// The smallest value (`--min`).
#[derive(Debug, Clone, Copy)]
pub struct Min<F>(pub F);

impl<E, V: PartialOrd + Clone, F: Fn(&E) -> Option<V>> Aggregator<E> for Min<F> {
    type Acc = Option<(Position, V)>;
    type Output = Option<V>;
    fn create(&self) -> Self::Acc {
        None
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, at: Position) {
        if let Some(v) = (self.0)(event) {
            extreme(acc, at, v, Ordering::Less);
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        if let Some((at, v)) = other {
            extreme(acc, at, v, Ordering::Less);
        }
    }
    fn finish(&self, acc: &Self::Acc) -> Option<V> {
        acc.as_ref().map(|(_, v)| v.clone())
    }
}

/// The largest value (`--max`).
#[derive(Debug, Clone, Copy)]
pub struct Max<F>(pub F);

impl<E, V: PartialOrd + Clone, F: Fn(&E) -> Option<V>> Aggregator<E> for Max<F> {
    type Acc = Option<(Position, V)>;
    type Output = Option<V>;
    fn create(&self) -> Self::Acc {
        None
    }
    fn add(&self, acc: &mut Self::Acc, event: &E, at: Position) {
        if let Some(v) = (self.0)(event) {
            extreme(acc, at, v, Ordering::Greater);
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        if let Some((at, v)) = other {
            extreme(acc, at, v, Ordering::Greater);
        }
    }
    fn finish(&self, acc: &Self::Acc) -> Option<V> {
        acc.as_ref().map(|(_, v)| v.clone())
    }
}
