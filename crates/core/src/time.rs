//! Time newtypes. Every time inside sessionizer is an `i64` of milliseconds since the
//! Unix epoch, but never a bare `i64` across an API.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An event's time: milliseconds since 1970-01-01T00:00:00Z.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventTime(pub i64);

impl EventTime {
    /// Milliseconds since the epoch.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating at the ends of `i64`.
    pub const fn plus(self, d: DurationMs) -> EventTime {
        EventTime(self.0.saturating_add(d.0))
    }
}

impl fmt::Display for EventTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::timefmt::format_rfc3339_ms(*self))
    }
}

/// A span of time in milliseconds (gap, delay, lateness). Never negative.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct DurationMs(pub i64);

impl DurationMs {
    /// No time at all.
    pub const ZERO: DurationMs = DurationMs(0);

    /// The span in milliseconds.
    pub const fn millis(self) -> i64 {
        self.0
    }
}

impl fmt::Display for DurationMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::timefmt::format_duration(*self))
    }
}

/// The event-time watermark: "no event older than this is expected any more".
///
/// It starts at minus infinity and only moves forward. Plus infinity is the watermark of
/// a finished bounded input.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Watermark(
    /// Milliseconds since the Unix epoch, like [`EventTime`]'s; `i64::MIN` and
    /// `i64::MAX` stand for minus and plus infinity ([`Watermark::MIN`],
    /// [`Watermark::MAX`]).
    pub i64,
);

impl Watermark {
    /// Minus infinity: before any event, nothing is late.
    pub const MIN: Watermark = Watermark(i64::MIN);
    /// Plus infinity: the end of a bounded input, every session completes.
    pub const MAX: Watermark = Watermark(i64::MAX);

    /// The watermark standing at event time `t`.
    pub const fn at(t: EventTime) -> Watermark {
        Watermark(t.0)
    }

    /// The watermark `t - delay`, the bounded-out-of-orderness rule.
    pub const fn behind(t: EventTime, delay: DurationMs) -> Watermark {
        Watermark(t.0.saturating_sub(delay.0))
    }

    /// Whether the watermark has reached `t` (`W >= t`).
    pub const fn has_reached(self, t: EventTime) -> bool {
        self.0 >= t.0
    }

    /// Neither minus nor plus infinity.
    pub const fn is_finite(self) -> bool {
        self.0 != i64::MIN && self.0 != i64::MAX
    }

    /// The raw millisecond value; `i64::MIN`/`i64::MAX` stand for minus/plus infinity.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// This watermark as an event time (meaningful only when finite).
    pub const fn as_time(self) -> EventTime {
        EventTime(self.0)
    }
}

impl fmt::Display for Watermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            i64::MIN => f.write_str("-inf"),
            i64::MAX => f.write_str("+inf"),
            ms => f.write_str(&crate::timefmt::format_rfc3339_ms(EventTime(ms))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_reaches_inclusively() {
        let w = Watermark::at(EventTime(1000));
        assert!(w.has_reached(EventTime(1000)));
        assert!(!w.has_reached(EventTime(1001)));
        assert!(!Watermark::MIN.has_reached(EventTime(i64::MIN + 1)));
        assert!(Watermark::MAX.has_reached(EventTime(i64::MAX)));
    }

    #[test]
    fn behind_saturates() {
        assert_eq!(
            Watermark::behind(EventTime(i64::MIN + 5), DurationMs(10)),
            Watermark::MIN
        );
    }
}
