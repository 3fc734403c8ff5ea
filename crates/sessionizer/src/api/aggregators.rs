//! The built-in aggregates of the command line (docs/semantics.md S-17), over the user's
//! own events: each takes a closure that picks a value out of an event (`None` is
//! skipped, as SQL aggregates skip nulls). Order-sensitive ones follow event time, ties
//! in input order, so a result never depends on how sessions merged.
//!
//! Combine several with a tuple: `.aggregate((Count, Collect(|v: &Visit| Some(v.page.clone()))))`.
//! For anything else, implement [`Aggregator`] yourself.
//!
//! **Names in the output.** A session record written as JSON takes the fields of its
//! aggregate value in their order (see [`SessionRecord`](crate::api::windowed::SessionRecord)):
//! give each aggregate its field name with `.named(..)` (or [`Named`] for your own
//! aggregator), so that a tuple of them becomes named fields:
//!
//! ```
//! use sessionizer::prelude::*;
//!
//! struct Visit { id: &'static str, page: &'static str, at: EventTime }
//!
//! let mut job = Stream::<Visit>::new()
//!     .key_by(|v| v.id)
//!     .event_time(|v| v.at)
//!     .session_windows(minutes(10))
//!     .aggregate((Count.named("views"), Collect(|v: &Visit| Some(v.page)).named("pages")))
//!     .build();
//! let visits = [("v1", "/a", 0), ("v1", "/b", 60_000)]
//!     .map(|(id, page, t)| Visit { id, page, at: EventTime(t) });
//! let mut sessions = Vec::new();
//! job.run(visits, &mut sessions, &mut Vec::new()).expect("vectors never refuse");
//! let json = serde_json::to_string(&sessions[0]).expect("JSON");
//! assert!(json.ends_with(r#""revision":0,"complete":true,"views":2,"pages":["/a","/b"]}"#), "{json}");
//! ```
//!
//! Without names, a tuple's elements are written as fields `_1`, `_2`, ... by position
//! (Spark's names for the columns of a tuple), except that an element which is itself a
//! struct or a map contributes its own fields.
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

/// An aggregator whose result is written as the field `name` of the session record:
/// its output serializes as `{name: value}`. The built-ins have `.named(name)`.
#[derive(Debug, Clone, Copy)]
pub struct Named<A> {
    /// The field name.
    pub name: &'static str,
    /// The aggregator.
    pub aggregator: A,
}

impl<A> Named<A> {
    /// `aggregator`, written as the field `name`.
    pub fn new(name: &'static str, aggregator: A) -> Self {
        Named { name, aggregator }
    }
}

/// The result of a [`Named`] aggregator: serializes as a map of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedValue<O> {
    /// The field name.
    pub name: &'static str,
    /// The aggregator's result.
    pub value: O,
}

impl<O: serde::Serialize> serde::Serialize for NamedValue<O> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(self.name, &self.value)?;
        map.end()
    }
}

impl<E, A: Aggregator<E>> Aggregator<E> for Named<A> {
    type Acc = A::Acc;
    type Output = NamedValue<A::Output>;
    fn create(&self) -> A::Acc {
        self.aggregator.create()
    }
    fn add(&self, acc: &mut A::Acc, event: &E, at: Position) {
        self.aggregator.add(acc, event, at);
    }
    fn merge(&self, acc: &mut A::Acc, other: A::Acc) {
        self.aggregator.merge(acc, other);
    }
    fn finish(&self, acc: &A::Acc) -> Self::Output {
        NamedValue {
            name: self.name,
            value: self.aggregator.finish(acc),
        }
    }
}

macro_rules! named {
    ($($t:ident $(<$f:ident>)?),*) => {$(
        impl$(<$f>)? $t$(<$f>)? {
            /// This aggregate, written as the field `name` of the session record.
            pub fn named(self, name: &'static str) -> Named<Self> {
                Named::new(name, self)
            }
        }
    )*};
}
named!(
    Count,
    Collect<F>,
    First<F>,
    Last<F>,
    CountDistinct<F>,
    Sum<F>,
    Min<F>,
    Max<F>
);

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
