//! The idle advance (docs/semantics.md S-32), for every job: while a live input is quiet,
//! the watermark moves on with the clock.

use sessionizer_core::{EventTime, Watermark};

/// Where the watermark moves once an input has been quiet for `quiet_ms` of processing
/// time, its last input having left it at `at_last`: `at_last` plus the quiet time,
/// once that is at least the idle timeout `limit_ms`. `None` before then, and when
/// `at_last` is not finite (before the first event, or after the end of input).
pub(crate) fn idle_watermark(
    limit_ms: i64,
    quiet_ms: i64,
    at_last: Watermark,
) -> Option<Watermark> {
    (quiet_ms >= limit_ms && at_last.is_finite())
        .then(|| Watermark::at(EventTime(at_last.millis().saturating_add(quiet_ms))))
}

/// Milliseconds in `d`, saturating.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_moves_by_the_quiet_time_once_it_reaches_the_limit() {
        let w = Watermark::at(EventTime(1_000));
        assert_eq!(idle_watermark(60_000, 59_999, w), None);
        assert_eq!(
            idle_watermark(60_000, 60_000, w),
            Some(Watermark::at(EventTime(61_000)))
        );
        assert_eq!(idle_watermark(60_000, 90_000, Watermark::MIN), None);
        assert_eq!(idle_watermark(60_000, 90_000, Watermark::MAX), None);
    }
}
