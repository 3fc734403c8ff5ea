//! The start of every job: a stream of the user's events, how to key them, where their
//! event time is, and how the watermark follows it. From there, one of the two styles:
//!
//! * [`Stream::session_windows`] — declarative session windows (Flink's
//!   `EventTimeSessionWindows.withGap`, Spark's `session_window`);
//! * [`Stream::flat_map_groups_with_state`] — a user function called per key with the
//!   key's new events and a state handle (Spark's `flatMapGroupsWithState`, Flink's
//!   `KeyedProcessFunction`).
//!
//! Both end up on the same keyed-state + timers core
//! ([`sessionizer_window::keyed::KeyedStore`]).

use crate::api::stateful::StatefulBuilder;
use crate::api::windowed::{FixedGap, SessionWindowBuilder};
use sessionizer_core::decode::DEFAULT_VALID_RANGE;
use sessionizer_core::{DurationMs, EventTime};
use sessionizer_window::clock::SystemClock;
use sessionizer_window::stateful::GroupState;
use sessionizer_window::{BoundedOutOfOrderness, WatermarkStrategy};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

/// A value that can be a session key. Keys are compared as their text (docs/semantics.md
/// S-15: `42` and `"42"` are one key), so integers are written in decimal.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a session key",
    label = "the key extractor returns `{Self}`",
    note = "a key is a string (`String`, `&str`, `Box<str>`, `Arc<str>`) or an integer: keys are compared as their text",
    note = "for a key made of several fields, return `format!(\"{{}}/{{}}\", ..)`; to return a borrowed field, use `key_by_ref(|e| &e.field)`"
)]
pub trait IntoKey {
    /// Appends the key's text to `out`.
    fn write_key(&self, out: &mut String);
}

impl IntoKey for str {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl IntoKey for String {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl<K: IntoKey + ?Sized> IntoKey for &K {
    fn write_key(&self, out: &mut String) {
        (**self).write_key(out);
    }
}

impl IntoKey for Box<str> {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl IntoKey for std::sync::Arc<str> {
    fn write_key(&self, out: &mut String) {
        out.push_str(self);
    }
}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl IntoKey for $t {
            fn write_key(&self, out: &mut String) {
                use std::fmt::Write as _;
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
int_key!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

/// A key extractor: any `Fn(&E) -> K` with `K:` [`IntoKey`].
#[diagnostic::on_unimplemented(
    message = "the stream has no session key",
    label = "no key extractor for `{E}` events",
    note = "call `.key_by(|event| ...)` on the stream first (Flink's `keyBy`, Spark's `groupBy`)"
)]
pub trait KeyFn<E> {
    /// Writes the key of `event` into `out` (cleared first).
    fn key_into(&self, event: &E, out: &mut String);
}

impl<E, F, K> KeyFn<E> for F
where
    F: Fn(&E) -> K,
    K: IntoKey,
{
    #[inline]
    fn key_into(&self, event: &E, out: &mut String) {
        out.clear();
        self(event).write_key(out);
    }
}

/// A key extractor returning a borrowed key ([`Stream::key_by_ref`]).
#[derive(Debug, Clone, Copy)]
pub struct ByRef<F>(F);

impl<E, F, K> KeyFn<E> for ByRef<F>
where
    F: for<'a> Fn(&'a E) -> &'a K,
    K: IntoKey + ?Sized,
{
    #[inline]
    fn key_into(&self, event: &E, out: &mut String) {
        out.clear();
        (self.0)(event).write_key(out);
    }
}

/// A time extractor: any `Fn(&E) -> EventTime`.
#[diagnostic::on_unimplemented(
    message = "the stream has no event time",
    label = "no event-time extractor for `{E}` events",
    note = "call `.event_time(|event| ...)` on the stream first, returning an `EventTime` (milliseconds since the epoch: `EventTime(ms)`)"
)]
pub trait TimeFn<E> {
    /// The event time of `event`.
    fn time_of(&self, event: &E) -> EventTime;
}

impl<E, F: Fn(&E) -> EventTime> TimeFn<E> for F {
    #[inline]
    fn time_of(&self, event: &E) -> EventTime {
        self(event)
    }
}

/// Not set yet (a builder slot).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unset;

/// A stream of events of type `E`: its key and time extractors and its watermark
/// strategy (by default `W = max event time`, no delay).
///
/// ```
/// use sessionizer::core::EventTime;
/// use sessionizer::stream::Stream;
/// use sessionizer::time::minutes;
/// use sessionizer::window::BoundedOutOfOrderness;
///
/// struct Click { user: u64, at: EventTime }
///
/// let clicks = Stream::<Click>::new()
///     .key_by(|c| c.user)
///     .event_time(|c| c.at)
///     .watermark(BoundedOutOfOrderness::new(minutes(1)));
/// # let _ = clicks;
/// ```
pub struct Stream<E, K = Unset, T = Unset, W = BoundedOutOfOrderness> {
    pub(crate) key: K,
    pub(crate) time: T,
    pub(crate) watermark: W,
    pub(crate) valid: ValidTimes,
    _events: PhantomData<fn(&E)>,
}

/// The event times a job accepts (`--valid-time-range` of the command line): `None`
/// accepts every time.
pub(crate) type ValidTimes = Option<(EventTime, EventTime)>;

/// The time of `event` if it passes the guard `valid` (`None`: the job refuses it).
#[cfg(feature = "kafka")]
pub(crate) fn valid_time_of<E>(
    time: &impl TimeFn<E>,
    valid: ValidTimes,
    event: &E,
) -> Option<EventTime> {
    let t = time.time_of(event);
    time_is_valid(valid, t).then_some(t)
}

/// Whether `time` passes the guard `valid` (the command line's check).
#[inline]
pub(crate) fn time_is_valid(valid: ValidTimes, time: EventTime) -> bool {
    valid.is_none_or(|range| sessionizer_core::decode::in_valid_range(time, range))
}

impl<E, K, T, W: fmt::Debug> fmt::Debug for Stream<E, K, T, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("event", &std::any::type_name::<E>())
            .field("watermark", &self.watermark)
            .field("valid_time_range", &self.valid)
            .finish()
    }
}

impl<E> Default for Stream<E> {
    fn default() -> Self {
        Stream::new()
    }
}

impl<E> Stream<E> {
    /// A stream of `E` with no key or time extractor yet.
    pub fn new() -> Self {
        Stream {
            key: Unset,
            time: Unset,
            watermark: BoundedOutOfOrderness::new(DurationMs::ZERO),
            valid: Some(DEFAULT_VALID_RANGE),
            _events: PhantomData,
        }
    }
}

impl<E, K, T, W> Stream<E, K, T, W> {
    /// The session key of each event (Flink's `keyBy`, Spark's `groupBy`): any
    /// [`IntoKey`] — a string or an integer, owned (`|v| v.visit_id.clone()`, `|c| c.user`)
    /// or `'static`. To return a field by reference, use
    /// [`key_by_ref`](Self::key_by_ref)`(|v| &v.visit_id)`: `key_by(|v| &v.visit_id)`
    /// fails with "lifetime may not live long enough".
    pub fn key_by<K2, Key>(self, key: K2) -> Stream<E, K2, T, W>
    where
        K2: Fn(&E) -> Key,
        Key: IntoKey,
    {
        Stream {
            key,
            time: self.time,
            watermark: self.watermark,
            valid: self.valid,
            _events: PhantomData,
        }
    }

    /// The session key of each event as a borrowed field (`key_by_ref(|v| &v.visit_id)`):
    /// the same as [`key_by`](Self::key_by) without a copy of the key per event. (A
    /// closure given to `key_by` must return an owned key or a `'static` one: Rust
    /// cannot tell it that the result borrows from the event.)
    ///
    /// ```
    /// use sessionizer::prelude::*;
    ///
    /// struct Visit { visit_id: String, at: EventTime }
    ///
    /// let mut job = Stream::<Visit>::new()
    ///     .key_by_ref(|v| &v.visit_id)
    ///     .event_time(|v| v.at)
    ///     .session_windows(minutes(10))
    ///     .build();
    /// let visits = [Visit { visit_id: "v1".into(), at: EventTime(0) }];
    /// let mut sessions = Vec::new();
    /// job.run(visits, &mut sessions, &mut Vec::new()).expect("vectors never refuse");
    /// assert_eq!(sessions[0].session().map(|s| s.key.as_str()), Some("v1"));
    /// ```
    pub fn key_by_ref<K2, Key>(self, key: K2) -> Stream<E, ByRef<K2>, T, W>
    where
        K2: for<'a> Fn(&'a E) -> &'a Key,
        Key: IntoKey + ?Sized,
    {
        Stream {
            key: ByRef(key),
            time: self.time,
            watermark: self.watermark,
            valid: self.valid,
            _events: PhantomData,
        }
    }

    /// The event time of each event.
    pub fn event_time<T2>(self, time: T2) -> Stream<E, K, T2, W>
    where
        T2: Fn(&E) -> EventTime,
    {
        Stream {
            key: self.key,
            time,
            watermark: self.watermark,
            valid: self.valid,
            _events: PhantomData,
        }
    }

    /// How the watermark follows the event times (Spark's `withWatermark`, Flink's
    /// `WatermarkStrategy`): [`BoundedOutOfOrderness`] or any [`WatermarkStrategy`].
    pub fn watermark<W2: WatermarkStrategy>(self, watermark: W2) -> Stream<E, K, T, W2> {
        Stream {
            key: self.key,
            time: self.time,
            watermark,
            valid: self.valid,
            _events: PhantomData,
        }
    }
}

impl<E, K, T, W> Stream<E, K, T, W> {
    /// The event times the job accepts; an event outside them is **rejected** before
    /// anything sees its time: it goes to the late sink as a [`Late`](crate::api::late::Late)
    /// with reason [`TIME_OUT_OF_RANGE`](crate::api::late::TIME_OUT_OF_RANGE), is counted as
    /// `invalid`, and never moves the watermark.
    ///
    /// The default is the command line's `--valid-time-range` default,
    /// 1970-01-01T00:00:00Z (inclusive) to 2200-01-01T00:00:00Z (exclusive)
    /// ([`DEFAULT_VALID_RANGE`]): one corrupt far-future event would otherwise push the
    /// watermark past every open session and make everything after it late. `..` turns
    /// the guard off; `start..`, `..end` and `start..=end` work as usual.
    ///
    /// ```
    /// use sessionizer::prelude::*;
    ///
    /// let t0 = sessionizer::time::parse("2024-01-01T00:00:00Z").expect("a time");
    /// let mut job = Stream::<EventTime>::new()
    ///     .key_by(|_| "k")
    ///     .event_time(|t| *t)
    ///     .valid_time_range(t0..t0.plus(hours(24)))
    ///     .session_windows(minutes(10))
    ///     .build();
    /// let (mut sessions, mut rejected) = (Vec::new(), Vec::new());
    /// job.run([t0, t0.plus(hours(48))], &mut sessions, &mut rejected).expect("vectors");
    /// assert_eq!(sessions.len(), 1);
    /// assert_eq!(rejected[0].reason, "time_out_of_range");
    /// assert_eq!(job.counts().invalid, 1);
    /// ```
    pub fn valid_time_range(mut self, range: impl RangeBounds<EventTime>) -> Self {
        let start = match range.start_bound() {
            Bound::Included(t) => Some(*t),
            Bound::Excluded(t) => Some(EventTime(t.millis().saturating_add(1))),
            Bound::Unbounded => None,
        };
        let end = match range.end_bound() {
            Bound::Excluded(t) => Some(*t),
            Bound::Included(t) => t.millis().checked_add(1).map(EventTime),
            Bound::Unbounded => None,
        };
        self.valid = match (start, end) {
            (None, None) => None,
            (start, end) => Some((
                start.unwrap_or(EventTime(i64::MIN)),
                end.unwrap_or(EventTime(i64::MAX)),
            )),
        };
        self
    }
}

impl<E, K, T, W: WatermarkStrategy> Stream<E, K, T, W> {
    /// Declarative session windows with gap `gap`: see [`SessionWindowBuilder`].
    ///
    /// The stream needs a key and an event time first; without them the error says so:
    ///
    /// ```compile_fail,E0277
    /// use sessionizer::prelude::*;
    /// struct Visit { id: String, at: EventTime }
    /// // error[E0277]: the stream has no event time
    /// let job = Stream::<Visit>::new().key_by(|v| v.id.clone()).session_windows(minutes(10));
    /// ```
    pub fn session_windows(self, gap: DurationMs) -> SessionWindowBuilder<E, K, T, W, (), FixedGap>
    where
        K: KeyFn<E>,
        T: TimeFn<E>,
    {
        SessionWindowBuilder::new(self, gap)
    }

    /// Arbitrary stateful processing: `f` is called per key with the key's new events
    /// and a [`GroupState`] handle, and returns zero or more outputs. See
    /// [`StatefulBuilder`] and [`sessionizer_window::stateful`] for exactly when.
    pub fn flat_map_groups_with_state<S, F, R>(
        self,
        f: F,
    ) -> StatefulBuilder<E, K, T, W, S, F, SystemClock>
    where
        K: KeyFn<E>,
        T: TimeFn<E>,
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        StatefulBuilder::new(self, f)
    }
}
