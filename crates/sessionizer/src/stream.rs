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

use crate::stateful::StatefulBuilder;
use crate::windowed::{FixedGap, SessionWindowBuilder};
use sessionizer_core::decode::DEFAULT_VALID_RANGE;
use sessionizer_core::{DurationMs, EventTime};
use sessionizer_window::clock::SystemClock;
use sessionizer_window::stateful::GroupState;
use sessionizer_window::{BoundedOutOfOrderness, WatermarkStrategy};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

/// A value that can be a session key. Keys are compared as their text (SPEC §1: `42`
/// and `"42"` are one key), so integers are written in decimal.
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

/// A time extractor: any `Fn(&E) -> EventTime`.
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
    /// The session key of each event (Flink's `keyBy`, Spark's `groupBy`).
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
    /// anything sees its time: it goes to the late sink as a [`Late`](crate::late::Late)
    /// with reason [`TIME_OUT_OF_RANGE`](crate::late::TIME_OUT_OF_RANGE), is counted as
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

impl<E, K: KeyFn<E>, T: TimeFn<E>, W: WatermarkStrategy> Stream<E, K, T, W> {
    /// Declarative session windows with gap `gap`: see [`SessionWindowBuilder`].
    pub fn session_windows(
        self,
        gap: DurationMs,
    ) -> SessionWindowBuilder<E, K, T, W, (), FixedGap> {
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
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        StatefulBuilder::new(self, f)
    }
}
