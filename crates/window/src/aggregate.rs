//! Per-session aggregates. Sessions merge, so every aggregate is mergeable: `add` one
//! value, `merge` another session's state, then read the result.
//!
//! Two layers:
//!
//! * [`SessionAggregate`] + [`Accumulate`] — what the session window is generic over
//!   (monomorphised: no boxing, no dynamic dispatch per event). Implemented by
//!   [`JsonAggregates`], the CLI's built-ins over raw JSON values, and by [`Custom`],
//!   which adapts any user [`Aggregator`].
//! * [`Aggregator`] — the user-facing create / add / merge / finish interface, in the
//!   style of Flink's `AggregateFunction`.
//!
//! The built-in JSON values arrive as the raw JSON text of a field (already validated by
//! the scanner); a missing or null value is skipped before it gets here
//! (docs/semantics.md S-17). Order-sensitive aggregates order by [`Position`] (event
//! time, then input sequence number), so the result does not depend on arrival order or
//! on how sessions merged.

use crate::codec::{CodecError, Reader, Writer};
use hashbrown::HashSet;
use sessionizer_core::EventTime;
use std::cmp::Ordering;
use std::fmt;
use std::marker::PhantomData;

/// Where an event stands among the events of its key: event time, then input order.
/// Order-sensitive aggregates sort by it, which makes their result independent of the
/// order in which sessions merged.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Position {
    /// The event's time.
    pub time: EventTime,
    /// The event's input sequence number (ties of equal time keep input order).
    pub seq: u64,
}

/// The contents a session window keeps per session, mergeable.
///
/// The window is generic over this trait and calls it directly, so the aggregate code is
/// compiled into the window's hot path. `&self` is the aggregate's configuration (the
/// list of JSON aggregates, or the user's [`Aggregator`]); the per-session state is
/// [`Acc`](Self::Acc).
pub trait SessionAggregate {
    /// The per-session accumulator.
    type Acc;
    /// What an emitted session shows of its accumulator (see [`SessionView`]).
    ///
    /// [`SessionView`]: crate::SessionView
    type View<'a>
    where
        Self: 'a;

    /// A new session's accumulator. `None` means sessions keep no contents at all: the
    /// window then allocates nothing per session (the CLI without aggregates).
    fn create(&self) -> Option<Self::Acc>;

    /// Folds `other` (a session that an event bridged to this one) into `into`.
    fn merge(&self, into: &mut Self::Acc, other: Self::Acc);

    /// The view handed to [`Emit`](crate::Emit) for a session with contents `acc`.
    fn view<'a>(&'a self, acc: Option<&'a Self::Acc>) -> Self::View<'a>;

    /// Heap bytes held by `acc` (for memory accounting).
    fn heap_bytes(&self, _acc: &Self::Acc) -> usize {
        0
    }
}

/// How an event's input of type `I` is added to a [`SessionAggregate`]'s accumulator.
/// Separate from [`SessionAggregate`] so that one aggregate can accept borrowed inputs
/// (`[Option<&[u8]>]`, `E: ?Sized`) without tying the window type to their lifetime.
pub trait Accumulate<I: ?Sized>: SessionAggregate {
    /// Adds the input of the event at `at`.
    fn add(&self, acc: &mut Self::Acc, at: Position, input: &I);
}

/// A user-defined mergeable aggregate over events of type `E`: create / add / merge /
/// finish. Sessions merge when an out-of-order event bridges two of them, so `merge`
/// must give the same result as adding all events to one accumulator; order-sensitive
/// aggregates should order by the [`Position`] they are given, not by call order.
///
/// `finish` takes the accumulator by reference: a session may be emitted more than once
/// (late events within the allowed lateness make a new revision), so its accumulator
/// lives on after an emission.
///
/// ```
/// use sessionizer_window::aggregate::{Aggregator, Position};
///
/// /// The pages of a visit in event-time order.
/// struct Pages;
///
/// impl Aggregator<(i64, &'static str)> for Pages {
///     type Acc = Vec<(Position, &'static str)>;
///     type Output = Vec<&'static str>;
///     fn create(&self) -> Self::Acc {
///         Vec::new()
///     }
///     fn add(&self, acc: &mut Self::Acc, event: &(i64, &'static str), at: Position) {
///         acc.push((at, event.1));
///     }
///     fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
///         acc.extend(other);
///     }
///     fn finish(&self, acc: &Self::Acc) -> Self::Output {
///         let mut sorted = acc.clone();
///         sorted.sort_by_key(|(at, _)| *at);
///         sorted.into_iter().map(|(_, page)| page).collect()
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an aggregator of `{E}` events",
    label = "not an `Aggregator<{E}>`",
    note = "use a built-in of `sessionizer::aggregators` (`Count`, `Collect(|e: &{E}| Some(..))`, `First`, `Last`, `CountDistinct`, `Sum`, `Min`, `Max`), a tuple of up to four, or implement `Aggregator<{E}>`"
)]
pub trait Aggregator<E: ?Sized> {
    /// The per-session accumulator.
    type Acc;
    /// The result written into the session record.
    type Output;
    /// An empty accumulator.
    fn create(&self) -> Self::Acc;
    /// Adds one event, which stands at `at`.
    fn add(&self, acc: &mut Self::Acc, event: &E, at: Position);
    /// Folds another session's accumulator in.
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    /// The result for a session whose events are in `acc`.
    fn finish(&self, acc: &Self::Acc) -> Self::Output;
}

/// Several aggregators side by side; the output is the tuple of their outputs.
macro_rules! tuple_aggregator {
    ($($name:ident $idx:tt),+) => {
        impl<E: ?Sized, $($name: Aggregator<E>),+> Aggregator<E> for ($($name,)+) {
            type Acc = ($($name::Acc,)+);
            type Output = ($($name::Output,)+);
            fn create(&self) -> Self::Acc {
                ($(self.$idx.create(),)+)
            }
            fn add(&self, acc: &mut Self::Acc, event: &E, at: Position) {
                $(self.$idx.add(&mut acc.$idx, event, at);)+
            }
            fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
                $(self.$idx.merge(&mut acc.$idx, other.$idx);)+
            }
            fn finish(&self, acc: &Self::Acc) -> Self::Output {
                ($(self.$idx.finish(&acc.$idx),)+)
            }
        }
    };
}

tuple_aggregator!(A 0);
tuple_aggregator!(A 0, B 1);
tuple_aggregator!(A 0, B 1, C 2);
tuple_aggregator!(A 0, B 1, C 2, D 3);

/// No aggregate: sessions carry only their bounds and count. Nothing is allocated per
/// session.
impl<E: ?Sized> Aggregator<E> for () {
    type Acc = ();
    type Output = ();
    fn create(&self) -> Self::Acc {}
    fn add(&self, _: &mut Self::Acc, _: &E, _: Position) {}
    fn merge(&self, _: &mut Self::Acc, _: Self::Acc) {}
    fn finish(&self, _: &Self::Acc) -> Self::Output {}
}

/// Adapts a user [`Aggregator`] over events `E` to the window's [`SessionAggregate`].
pub struct Custom<G, E: ?Sized> {
    /// The user's aggregator.
    pub aggregator: G,
    _events: PhantomData<fn(&E)>,
}

impl<G, E: ?Sized> Custom<G, E> {
    /// Wraps `aggregator`.
    pub fn new(aggregator: G) -> Self {
        Custom {
            aggregator,
            _events: PhantomData,
        }
    }
}

impl<G: fmt::Debug, E: ?Sized> fmt::Debug for Custom<G, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Custom").field(&self.aggregator).finish()
    }
}

impl<G: Aggregator<E>, E: ?Sized> SessionAggregate for Custom<G, E> {
    type Acc = G::Acc;
    type View<'a>
        = CustomView<'a, G, E>
    where
        Self: 'a;

    fn create(&self) -> Option<Self::Acc> {
        Some(self.aggregator.create())
    }

    fn merge(&self, into: &mut Self::Acc, other: Self::Acc) {
        self.aggregator.merge(into, other);
    }

    fn view<'a>(&'a self, acc: Option<&'a Self::Acc>) -> Self::View<'a> {
        CustomView {
            aggregator: &self.aggregator,
            acc,
            _events: PhantomData,
        }
    }
}

/// What an emitted session of a [`Custom`] aggregate shows: its accumulator, and the
/// aggregator to finish it with.
pub struct CustomView<'a, G: Aggregator<E>, E: ?Sized> {
    aggregator: &'a G,
    acc: Option<&'a G::Acc>,
    _events: PhantomData<fn(&E)>,
}

impl<G: Aggregator<E>, E: ?Sized> Clone for CustomView<'_, G, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<G: Aggregator<E>, E: ?Sized> Copy for CustomView<'_, G, E> {}

impl<G: Aggregator<E>, E: ?Sized> fmt::Debug for CustomView<'_, G, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomView")
            .field("has_acc", &self.acc.is_some())
            .finish()
    }
}

impl<G: Aggregator<E>, E: ?Sized> CustomView<'_, G, E> {
    /// The session's result ([`Aggregator::finish`]).
    pub fn finish(&self) -> G::Output {
        match self.acc {
            Some(acc) => self.aggregator.finish(acc),
            // Sessions of a `Custom` window always keep an accumulator; an empty one
            // gives the same result as a missing one.
            None => self.aggregator.finish(&self.aggregator.create()),
        }
    }

    /// The session's accumulator.
    pub fn acc(&self) -> Option<&G::Acc> {
        self.acc
    }
}

impl<G: Aggregator<E>, E: ?Sized> Accumulate<E> for Custom<G, E> {
    fn add(&self, acc: &mut Self::Acc, at: Position, input: &E) {
        self.aggregator.add(acc, input, at);
    }
}

/// The built-in aggregates of the command line (`--collect`, `--first`, ...), computed
/// over the raw JSON text of one field each; the input of an event is one optional raw
/// value per aggregate, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonAggregates {
    kinds: Vec<AggKind>,
}

impl JsonAggregates {
    /// The aggregates `kinds`, in output order.
    pub fn new(kinds: Vec<AggKind>) -> Self {
        JsonAggregates { kinds }
    }

    /// The configured aggregates.
    pub fn kinds(&self) -> &[AggKind] {
        &self.kinds
    }
}

impl SessionAggregate for JsonAggregates {
    type Acc = Vec<AggState>;
    type View<'a> = &'a [AggState];

    fn create(&self) -> Option<Self::Acc> {
        (!self.kinds.is_empty()).then(|| self.kinds.iter().map(|&k| AggState::new(k)).collect())
    }

    fn merge(&self, into: &mut Self::Acc, other: Self::Acc) {
        for (a, b) in into.iter_mut().zip(other) {
            a.merge(b);
        }
    }

    fn view<'a>(&'a self, acc: Option<&'a Self::Acc>) -> Self::View<'a> {
        acc.map_or(&[], Vec::as_slice)
    }

    fn heap_bytes(&self, acc: &Self::Acc) -> usize {
        acc.capacity() * std::mem::size_of::<AggState>()
            + acc.iter().map(AggState::heap_bytes).sum::<usize>()
    }
}

impl<'v> Accumulate<[Option<&'v [u8]>]> for JsonAggregates {
    #[inline]
    fn add(&self, acc: &mut Self::Acc, at: Position, values: &[Option<&'v [u8]>]) {
        for (agg, value) in acc.iter_mut().zip(values) {
            if let Some(raw) = value {
                agg.add(at.time.millis(), at.seq, raw);
            }
        }
    }
}

/// Which aggregate to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggKind {
    /// All values in event-time order (ties in input order); `[]` when none.
    Collect,
    /// The value of the earliest event that has one; `null` when none.
    First,
    /// The value of the latest event that has one; `null` when none.
    Last,
    /// The number of distinct values (compared as JSON text); `0` when none.
    CountDistinct,
    /// The sum of the numeric values; other values are skipped; `null` when none.
    Sum,
    /// The smallest numeric value, as written; `null` when none.
    Min,
    /// The largest numeric value, as written; `null` when none.
    Max,
}

impl AggKind {
    /// The flag / config name of this aggregate (`collect`, `count-distinct`, ...).
    pub fn name(self) -> &'static str {
        match self {
            AggKind::Collect => "collect",
            AggKind::First => "first",
            AggKind::Last => "last",
            AggKind::CountDistinct => "count-distinct",
            AggKind::Sum => "sum",
            AggKind::Min => "min",
            AggKind::Max => "max",
        }
    }
}

/// Where a value stands in a session: `(event time, input sequence number)`.
type At = (i64, u64);

type FastSet<T> = HashSet<T, foldhash::fast::FixedState>;

/// The running state of one aggregate in one session.
#[derive(Debug, Clone)]
pub enum AggState {
    /// `--collect`: the values with their positions.
    Collect(Collected),
    /// `--first`: the earliest value so far.
    First(Option<Picked>),
    /// `--last`: the latest value so far.
    Last(Option<Picked>),
    /// `--count-distinct`: hashes of the distinct values.
    CountDistinct(FastSet<u128>),
    /// `--sum`.
    Sum(Sum),
    /// `--min`: the smallest number so far.
    Min(Option<Extreme>),
    /// `--max`: the largest number so far.
    Max(Option<Extreme>),
}

/// Values kept in `(time, seq)` order; their bytes live in one buffer.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    items: Vec<CollectedItem>,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
struct CollectedItem {
    at: At,
    offset: u32,
    len: u32,
}

/// One value chosen by position (first / last).
#[derive(Debug, Clone)]
pub struct Picked {
    at: At,
    raw: Vec<u8>,
}

/// The smallest or largest number, kept as written.
#[derive(Debug, Clone)]
pub struct Extreme {
    value: f64,
    at: At,
    raw: Vec<u8>,
}

/// A sum that stays an exact integer until a non-integer shows up.
#[derive(Debug, Clone, Default)]
pub struct Sum {
    int: i128,
    float: f64,
    any: bool,
    any_float: bool,
}

fn is_number(raw: &[u8]) -> bool {
    matches!(raw.first(), Some(b'-' | b'0'..=b'9'))
}

fn parse_f64(raw: &[u8]) -> Option<f64> {
    std::str::from_utf8(raw).ok()?.parse::<f64>().ok()
}

impl AggState {
    /// The empty state of aggregate `kind`.
    pub fn new(kind: AggKind) -> AggState {
        match kind {
            AggKind::Collect => AggState::Collect(Collected::default()),
            AggKind::First => AggState::First(None),
            AggKind::Last => AggState::Last(None),
            AggKind::CountDistinct => AggState::CountDistinct(FastSet::default()),
            AggKind::Sum => AggState::Sum(Sum::default()),
            AggKind::Min => AggState::Min(None),
            AggKind::Max => AggState::Max(None),
        }
    }

    /// Adds the value of the event at `(time, seq)`; `raw` is present and not null.
    pub fn add(&mut self, time: i64, seq: u64, raw: &[u8]) {
        let at = (time, seq);
        match self {
            AggState::Collect(c) => c.add(at, raw),
            AggState::First(p) => pick(p, at, raw, Ordering::Less),
            AggState::Last(p) => pick(p, at, raw, Ordering::Greater),
            AggState::CountDistinct(set) => {
                set.insert(xxhash_rust::xxh3::xxh3_128(raw));
            }
            AggState::Sum(s) => s.add(raw),
            AggState::Min(e) => extreme(e, at, raw, Ordering::Less),
            AggState::Max(e) => extreme(e, at, raw, Ordering::Greater),
        }
    }

    /// Folds another session's state of the same aggregate into this one.
    pub fn merge(&mut self, other: AggState) {
        match (self, other) {
            (AggState::Collect(a), AggState::Collect(b)) => a.merge(b),
            (AggState::First(a), AggState::First(Some(b))) => pick(a, b.at, &b.raw, Ordering::Less),
            (AggState::Last(a), AggState::Last(Some(b))) => {
                pick(a, b.at, &b.raw, Ordering::Greater)
            }
            (AggState::CountDistinct(a), AggState::CountDistinct(b)) => a.extend(b),
            (AggState::Sum(a), AggState::Sum(b)) => a.merge(&b),
            (AggState::Min(a), AggState::Min(Some(b))) => extreme(a, b.at, &b.raw, Ordering::Less),
            (AggState::Max(a), AggState::Max(Some(b))) => {
                extreme(a, b.at, &b.raw, Ordering::Greater)
            }
            (AggState::First(_) | AggState::Last(_) | AggState::Min(_) | AggState::Max(_), _) => {}
            (a, b) => unreachable!("merging different aggregates {a:?} and {b:?}"),
        }
    }

    /// Writes the result as JSON.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            AggState::Collect(c) => c.write_json(out),
            AggState::First(p) | AggState::Last(p) => match p {
                Some(p) => out.extend_from_slice(&p.raw),
                None => out.extend_from_slice(b"null"),
            },
            AggState::CountDistinct(set) => {
                out.extend_from_slice(itoa::Buffer::new().format(set.len()).as_bytes())
            }
            AggState::Sum(s) => s.write_json(out),
            AggState::Min(e) | AggState::Max(e) => match e {
                Some(e) => out.extend_from_slice(&e.raw),
                None => out.extend_from_slice(b"null"),
            },
        }
    }

    /// Heap bytes held by this aggregate (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        match self {
            AggState::Collect(c) => {
                c.items.capacity() * std::mem::size_of::<CollectedItem>() + c.bytes.capacity()
            }
            AggState::First(p) | AggState::Last(p) => p.as_ref().map_or(0, |p| p.raw.capacity()),
            AggState::CountDistinct(s) => s.capacity() * 17,
            AggState::Sum(_) => 0,
            AggState::Min(e) | AggState::Max(e) => e.as_ref().map_or(0, |e| e.raw.capacity()),
        }
    }
}

impl AggKind {
    /// The aggregate's code in checkpoints (`docs/checkpoint-format.md`).
    fn code(self) -> u8 {
        match self {
            AggKind::Collect => 1,
            AggKind::First => 2,
            AggKind::Last => 3,
            AggKind::CountDistinct => 4,
            AggKind::Sum => 5,
            AggKind::Min => 6,
            AggKind::Max => 7,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<AggKind> {
        Some(match code {
            1 => AggKind::Collect,
            2 => AggKind::First,
            3 => AggKind::Last,
            4 => AggKind::CountDistinct,
            5 => AggKind::Sum,
            6 => AggKind::Min,
            7 => AggKind::Max,
            _ => return None,
        })
    }
}

impl AggState {
    fn kind(&self) -> AggKind {
        match self {
            AggState::Collect(_) => AggKind::Collect,
            AggState::First(_) => AggKind::First,
            AggState::Last(_) => AggKind::Last,
            AggState::CountDistinct(_) => AggKind::CountDistinct,
            AggState::Sum(_) => AggKind::Sum,
            AggState::Min(_) => AggKind::Min,
            AggState::Max(_) => AggKind::Max,
        }
    }

    /// Appends the checkpoint encoding of this state (`docs/checkpoint-format.md`).
    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        w.u8(self.kind().code());
        let at = |w: &mut Writer<'_>, at: At| {
            w.i64(at.0);
            w.u64(at.1);
        };
        match self {
            AggState::Collect(c) => {
                w.count(c.items.len());
                for item in &c.items {
                    at(w, item.at);
                    let from = item.offset as usize;
                    w.bytes(&c.bytes[from..from + item.len as usize]);
                }
            }
            AggState::First(p) | AggState::Last(p) => match p {
                None => w.bool(false),
                Some(p) => {
                    w.bool(true);
                    at(w, p.at);
                    w.bytes(&p.raw);
                }
            },
            AggState::CountDistinct(set) => {
                w.count(set.len());
                for &h in set {
                    w.u128(h);
                }
            }
            AggState::Sum(sum) => {
                w.i128(sum.int);
                w.f64(sum.float);
                w.bool(sum.any);
                w.bool(sum.any_float);
            }
            AggState::Min(e) | AggState::Max(e) => match e {
                None => w.bool(false),
                Some(e) => {
                    w.bool(true);
                    w.f64(e.value);
                    at(w, e.at);
                    w.bytes(&e.raw);
                }
            },
        }
    }

    /// Reads a state written by [`encode`](Self::encode), which must be of `kind`.
    pub(crate) fn decode(r: &mut Reader<'_>, kind: AggKind) -> Result<AggState, CodecError> {
        let code = r.u8()?;
        let found = AggKind::from_code(code).ok_or(CodecError::AggKind(code))?;
        if found != kind {
            return Err(CodecError::AggMismatch {
                expected: kind.name(),
                found: found.name(),
            });
        }
        let at = |r: &mut Reader<'_>| -> Result<At, CodecError> { Ok((r.i64()?, r.u64()?)) };
        let picked = |r: &mut Reader<'_>| -> Result<Option<Picked>, CodecError> {
            if !r.bool("value marker")? {
                return Ok(None);
            }
            let at = at(r)?;
            Ok(Some(Picked {
                at,
                raw: r.bytes()?.to_vec(),
            }))
        };
        let extreme = |r: &mut Reader<'_>| -> Result<Option<Extreme>, CodecError> {
            if !r.bool("value marker")? {
                return Ok(None);
            }
            let value = r.f64()?;
            let at = at(r)?;
            Ok(Some(Extreme {
                value,
                at,
                raw: r.bytes()?.to_vec(),
            }))
        };
        Ok(match kind {
            AggKind::Collect => {
                let n = r.count(20)?;
                let mut c = Collected {
                    items: Vec::with_capacity(n),
                    bytes: Vec::new(),
                };
                for _ in 0..n {
                    let at = at(r)?;
                    let raw = r.bytes()?;
                    // Lengths came through a u32 and the bytes were there: they fit.
                    c.items.push(CollectedItem {
                        at,
                        offset: c.bytes.len() as u32,
                        len: raw.len() as u32,
                    });
                    c.bytes.extend_from_slice(raw);
                }
                AggState::Collect(c)
            }
            AggKind::First => AggState::First(picked(r)?),
            AggKind::Last => AggState::Last(picked(r)?),
            AggKind::CountDistinct => {
                let n = r.count(16)?;
                let mut set = FastSet::with_capacity_and_hasher(n, Default::default());
                for _ in 0..n {
                    set.insert(r.u128()?);
                }
                AggState::CountDistinct(set)
            }
            AggKind::Sum => AggState::Sum(Sum {
                int: r.i128()?,
                float: r.f64()?,
                any: r.bool("sum marker")?,
                any_float: r.bool("sum marker")?,
            }),
            AggKind::Min => AggState::Min(extreme(r)?),
            AggKind::Max => AggState::Max(extreme(r)?),
        })
    }
}

/// Keeps the value whose position compares as `wanted` (Less: earliest, Greater: latest).
fn pick(slot: &mut Option<Picked>, at: At, raw: &[u8], wanted: Ordering) {
    match slot {
        Some(p) if at.cmp(&p.at) != wanted => {}
        Some(p) => {
            p.at = at;
            p.raw.clear();
            p.raw.extend_from_slice(raw);
        }
        None => {
            *slot = Some(Picked {
                at,
                raw: raw.to_vec(),
            })
        }
    }
}

/// Keeps the numeric value comparing as `wanted`; ties go to the earliest position, so
/// the result does not depend on merge order.
fn extreme(slot: &mut Option<Extreme>, at: At, raw: &[u8], wanted: Ordering) {
    if !is_number(raw) {
        return;
    }
    let Some(value) = parse_f64(raw) else { return };
    let better = match slot {
        None => true,
        Some(e) => match value.partial_cmp(&e.value) {
            Some(Ordering::Equal) => at < e.at,
            Some(o) => o == wanted,
            None => false,
        },
    };
    if better {
        *slot = Some(Extreme {
            value,
            at,
            raw: raw.to_vec(),
        });
    }
}

impl Collected {
    fn add(&mut self, at: At, raw: &[u8]) {
        let item = CollectedItem {
            at,
            offset: u32::try_from(self.bytes.len()).expect("collected values exceed 4 GiB"),
            len: u32::try_from(raw.len()).expect("value exceeds 4 GiB"),
        };
        self.bytes.extend_from_slice(raw);
        // Mostly in order: append; otherwise insert at its place.
        match self.items.last() {
            Some(last) if last.at > at => {
                let pos = self.items.partition_point(|i| i.at < at);
                self.items.insert(pos, item);
            }
            _ => self.items.push(item),
        }
    }

    fn merge(&mut self, other: Collected) {
        let base = u32::try_from(self.bytes.len()).expect("collected values exceed 4 GiB");
        self.bytes.extend_from_slice(&other.bytes);
        self.items.extend(other.items.into_iter().map(|mut i| {
            i.offset += base;
            i
        }));
        // Positions are unique, so an unstable sort is deterministic.
        self.items.sort_unstable_by_key(|i| i.at);
    }

    fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (n, item) in self.items.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let start = item.offset as usize;
            out.extend_from_slice(&self.bytes[start..start + item.len as usize]);
        }
        out.push(b']');
    }
}

impl Sum {
    fn add(&mut self, raw: &[u8]) {
        if !is_number(raw) {
            return;
        }
        let integral = !raw.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
        let as_int = if integral {
            std::str::from_utf8(raw)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
        } else {
            None
        };
        match as_int {
            Some(i) => self.int += i128::from(i),
            None => match parse_f64(raw) {
                Some(f) => {
                    self.float += f;
                    self.any_float = true;
                }
                None => return,
            },
        }
        self.any = true;
    }

    fn merge(&mut self, other: &Sum) {
        self.int += other.int;
        self.float += other.float;
        self.any |= other.any;
        self.any_float |= other.any_float;
    }

    fn write_json(&self, out: &mut Vec<u8>) {
        if !self.any {
            out.extend_from_slice(b"null");
        } else if !self.any_float {
            out.extend_from_slice(itoa::Buffer::new().format(self.int).as_bytes());
        } else {
            let total = self.int as f64 + self.float;
            // JSON has no infinity: a sum beyond the float range is said as a string,
            // never as `null` (which means "no numbers").
            let mut buf = ryu::Buffer::new();
            let text: &[u8] = if total.is_finite() {
                buf.format_finite(total).as_bytes()
            } else if total.is_nan() {
                b"\"NaN\""
            } else if total > 0.0 {
                b"\"Infinity\""
            } else {
                b"\"-Infinity\""
            };
            out.extend_from_slice(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(a: &AggState) -> String {
        let mut out = Vec::new();
        a.write_json(&mut out);
        String::from_utf8(out).expect("utf8")
    }

    /// Regression: a sum past the float range was written `null`, the same as a
    /// session without numbers.
    #[test]
    fn a_sum_beyond_the_float_range_is_said_not_nulled() {
        let sum = |values: &[&str]| {
            let mut s = AggState::new(AggKind::Sum);
            for v in values {
                s.add(0, 0, v.as_bytes());
            }
            render(&s)
        };
        assert_eq!(sum(&["1e308", "1e308"]), "\"Infinity\"");
        assert_eq!(sum(&["-1e308", "-1.5e308"]), "\"-Infinity\"");
        assert_eq!(sum(&["1e999"]), "\"Infinity\"");
        assert_eq!(sum(&["1e308", "1e308", "-1e999"]), "\"NaN\"");
        assert_eq!(sum(&["\"x\""]), "null", "no numbers");
        assert_eq!(sum(&["1.5", "2"]), "3.5");
    }

    #[test]
    fn collect_orders_by_time_then_input_order() {
        let mut a = AggState::new(AggKind::Collect);
        a.add(20, 0, b"\"b\"");
        a.add(10, 1, b"\"a\"");
        a.add(20, 2, b"\"c\"");
        assert_eq!(render(&a), r#"["a","b","c"]"#);
    }

    #[test]
    fn collect_merge_equals_adding_everything_to_one() {
        let mut a = AggState::new(AggKind::Collect);
        a.add(30, 3, b"3");
        a.add(10, 0, b"1");
        let mut b = AggState::new(AggKind::Collect);
        b.add(20, 1, b"2");
        b.add(30, 2, b"4");
        a.merge(b);
        assert_eq!(render(&a), "[1,2,4,3]");
    }

    #[test]
    fn first_and_last_follow_event_time_not_arrival() {
        let mut f = AggState::new(AggKind::First);
        let mut l = AggState::new(AggKind::Last);
        for (t, seq, v) in [
            (5, 0, "\"x\""),
            (1, 1, "\"y\""),
            (9, 2, "\"z\""),
            (9, 3, "\"w\""),
        ] {
            f.add(t, seq, v.as_bytes());
            l.add(t, seq, v.as_bytes());
        }
        assert_eq!(render(&f), "\"y\"");
        assert_eq!(render(&l), "\"w\"");
        assert_eq!(render(&AggState::new(AggKind::First)), "null");
    }

    #[test]
    fn sum_stays_integer_until_a_fraction_appears() {
        let mut s = AggState::new(AggKind::Sum);
        assert_eq!(render(&s), "null");
        s.add(0, 0, b"2");
        s.add(0, 1, b"\"7\"");
        s.add(0, 2, b"40");
        assert_eq!(render(&s), "42");
        s.add(0, 3, b"0.5");
        assert_eq!(render(&s), "42.5");
    }

    #[test]
    fn min_max_keep_the_number_as_written_and_skip_non_numbers() {
        let mut lo = AggState::new(AggKind::Min);
        let mut hi = AggState::new(AggKind::Max);
        for (i, v) in ["3", "1.50", "true", "\"0\"", "1e1"].iter().enumerate() {
            lo.add(0, i as u64, v.as_bytes());
            hi.add(0, i as u64, v.as_bytes());
        }
        assert_eq!(render(&lo), "1.50");
        assert_eq!(render(&hi), "1e1");
    }

    #[test]
    fn count_distinct_compares_json_text() {
        let mut c = AggState::new(AggKind::CountDistinct);
        for v in ["\"a\"", "\"b\"", "\"a\"", "1", "1"] {
            c.add(0, 0, v.as_bytes());
        }
        assert_eq!(render(&c), "3");
        assert_eq!(render(&AggState::new(AggKind::CountDistinct)), "0");
    }
}
