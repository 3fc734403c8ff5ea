//! Watermark strategies: how the event-time watermark follows the events.

use sessionizer_core::{DurationMs, EventTime, Watermark};

/// The bounded-out-of-orderness rule of SPEC §2: after each valid event with time `t`,
/// `maxT = max(maxT, t)` and `W = maxT - delay`.
///
/// ```
/// use sessionizer_core::{DurationMs, EventTime, Watermark};
/// use sessionizer_window::BoundedOutOfOrderness;
///
/// let mut wm = BoundedOutOfOrderness::new(DurationMs(60_000));
/// assert_eq!(wm.current(), Watermark::MIN);
/// assert_eq!(wm.observe(EventTime(100_000)), Watermark::at(EventTime(40_000)));
/// // An older event does not move the watermark back.
/// assert_eq!(wm.observe(EventTime(0)), Watermark::at(EventTime(40_000)));
/// ```
#[derive(Debug, Clone)]
pub struct BoundedOutOfOrderness {
    delay: DurationMs,
    max_time: Option<EventTime>,
}

impl BoundedOutOfOrderness {
    pub fn new(delay: DurationMs) -> Self {
        BoundedOutOfOrderness {
            delay,
            max_time: None,
        }
    }

    /// Records a valid event's time and returns the watermark after it.
    pub fn observe(&mut self, t: EventTime) -> Watermark {
        let max = match self.max_time {
            Some(m) if m >= t => m,
            _ => t,
        };
        self.max_time = Some(max);
        Watermark::behind(max, self.delay)
    }

    /// The watermark as it stands (minus infinity before the first event).
    pub fn current(&self) -> Watermark {
        match self.max_time {
            Some(m) => Watermark::behind(m, self.delay),
            None => Watermark::MIN,
        }
    }

    /// The largest event time seen so far.
    pub fn max_time(&self) -> Option<EventTime> {
        self.max_time
    }
}
