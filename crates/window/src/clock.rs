//! Processing time, injected.
//!
//! Operators never read the wall clock themselves: a replay must give the same output,
//! and a test of a processing-time timeout must not sleep. Whoever drives an operator
//! hands it a [`Clock`]; production code uses [`SystemClock`], tests a [`ManualClock`]
//! that moves only when told to.

use sessionizer_core::DurationMs;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A processing (wall-clock) time: milliseconds since the Unix epoch as a [`Clock`] reads
/// them. A separate type from [`sessionizer_core::EventTime`] so that the two time
/// domains cannot be mixed up by accident.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessingTime(pub i64);

impl ProcessingTime {
    /// Milliseconds since the epoch.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating at the ends of `i64`.
    pub const fn plus(self, d: DurationMs) -> ProcessingTime {
        ProcessingTime(self.0.saturating_add(d.0))
    }
}

impl fmt::Display for ProcessingTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&sessionizer_core::timefmt::format_rfc3339_ms(
            sessionizer_core::EventTime(self.0),
        ))
    }
}

/// A source of processing time.
///
/// `Send + Sync` so that one clock can be shared by the operator and whoever advances
/// it (a test, a timer task).
pub trait Clock: fmt::Debug + Send + Sync {
    /// The current processing time.
    fn now(&self) -> ProcessingTime;
}

/// The machine's wall clock.
///
/// ```
/// use sessionizer_window::clock::{Clock, SystemClock};
/// assert!(SystemClock.now().millis() > 1_600_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> ProcessingTime {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        ProcessingTime(ms)
    }
}

/// A clock that moves only when told to, for tests and simulations. Clones share the
/// same time, so a test keeps one clone and hands the other to the operator.
///
/// ```
/// use sessionizer_core::DurationMs;
/// use sessionizer_window::clock::{Clock, ManualClock, ProcessingTime};
///
/// let clock = ManualClock::new(ProcessingTime(1_000));
/// let operator_side = clock.clone();
/// clock.advance(DurationMs(500));
/// assert_eq!(operator_side.now(), ProcessingTime(1_500));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: ProcessingTime) -> ManualClock {
        ManualClock {
            now: Arc::new(AtomicI64::new(start.0)),
        }
    }

    /// Sets the time (it may go backwards: a test may want to see what that does).
    pub fn set(&self, t: ProcessingTime) {
        self.now.store(t.0, Ordering::SeqCst);
    }

    /// Moves the time forward by `d`.
    pub fn advance(&self, d: DurationMs) {
        self.now.fetch_add(d.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> ProcessingTime {
        ProcessingTime(self.now.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> ProcessingTime {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> ProcessingTime {
        (**self).now()
    }
}
