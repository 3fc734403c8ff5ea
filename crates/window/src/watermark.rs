//! Watermark strategies: how the event-time watermark follows the events.
//!
//! A strategy sees the time of every valid event, in input order, and says where the
//! watermark stands. The built-in one is [`BoundedOutOfOrderness`] (docs/semantics.md
//! S-4); anything else implements [`WatermarkStrategy`].

use sessionizer_core::{DurationMs, EventTime, Watermark};

/// How the watermark follows the event times.
///
/// A strategy must be a pure function of the event times it observed (no clock), so that
/// a replay gives the same watermarks. The watermark it reports never has to go back:
/// operators ignore a smaller one.
///
/// ```
/// use sessionizer_core::{EventTime, Watermark};
/// use sessionizer_window::watermark::WatermarkStrategy;
///
/// /// Trusts the input to be in order: the watermark is the last event time.
/// #[derive(Debug, Default)]
/// struct InOrder(Option<EventTime>);
///
/// impl WatermarkStrategy for InOrder {
///     fn observe(&mut self, t: EventTime) -> Watermark {
///         self.0 = Some(self.0.map_or(t, |m| m.max(t)));
///         self.current()
///     }
///     fn current(&self) -> Watermark {
///         self.0.map_or(Watermark::MIN, Watermark::at)
///     }
/// }
///
/// let mut s = InOrder::default();
/// assert_eq!(s.observe(EventTime(5)), Watermark::at(EventTime(5)));
/// ```
pub trait WatermarkStrategy {
    /// Records a valid event's time and returns the watermark after it.
    fn observe(&mut self, t: EventTime) -> Watermark;

    /// The watermark as it stands ([`Watermark::MIN`] before any event).
    fn current(&self) -> Watermark;

    /// Continues from a restored watermark `w` (after [`observe`](Self::observe) was
    /// last called in an earlier run). The default does nothing, which is right for
    /// strategies that derive nothing from past events.
    fn resume_at(&mut self, _w: Watermark) {}
}

/// The bounded-out-of-orderness rule of docs/semantics.md S-4: after each valid event
/// with time `t`, `maxT = max(maxT, t)` and `W = maxT - delay`.
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
    /// A watermark `delay` behind the largest event time seen.
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

impl WatermarkStrategy for BoundedOutOfOrderness {
    fn observe(&mut self, t: EventTime) -> Watermark {
        BoundedOutOfOrderness::observe(self, t)
    }

    fn current(&self) -> Watermark {
        BoundedOutOfOrderness::current(self)
    }

    /// The largest event time that gives `w`: `w + delay`.
    fn resume_at(&mut self, w: Watermark) {
        if w.is_finite() {
            let max = EventTime(w.millis().saturating_add(self.delay.millis()));
            if self.max_time.is_none_or(|m| m < max) {
                self.max_time = Some(max);
            }
        }
    }
}
