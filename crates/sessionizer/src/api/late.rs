//! Events that came too late, handed to a late-event sink rather than dropped.

use serde::ser::{Serialize, SerializeMap, Serializer};
use sessionizer_core::{EventTime, Watermark};

/// The reason of an event whose time is outside the job's valid time range
/// ([`Stream::valid_time_range`](crate::Stream::valid_time_range)): rejected, not
/// processed, and its time never seen by the watermark.
pub const TIME_OUT_OF_RANGE: &str = "time_out_of_range";

/// An event that was too late to be processed, or whose time is outside the job's valid
/// time range, with why.
///
/// As JSON it has the command line's late-record shape: `reason`, `watermark`,
/// `behind_watermark_ms`, `event`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Late<E> {
    /// The event, untouched.
    pub event: E,
    /// Its event time.
    pub time: EventTime,
    /// The watermark it was judged against.
    pub watermark: Watermark,
    /// `window_closed` or `session_final` (session windows, docs/semantics.md S-6, S-7),
    /// `behind_watermark` (stateful jobs: `t <= W` of its batch), or
    /// [`TIME_OUT_OF_RANGE`] (either job: the time is outside the valid time range; then
    /// `behind_watermark_ms` is negative for a time in the far future).
    pub reason: &'static str,
}

impl<E> Late<E> {
    /// How far behind the watermark the event was, in milliseconds.
    pub fn behind_watermark_ms(&self) -> i64 {
        self.watermark.millis().saturating_sub(self.time.millis())
    }
}

impl<E: Serialize> Serialize for Late<E> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(4))?;
        map.serialize_entry("reason", self.reason)?;
        map.serialize_entry("watermark", &self.watermark.to_string())?;
        map.serialize_entry("behind_watermark_ms", &self.behind_watermark_ms())?;
        map.serialize_entry("event", &self.event)?;
        map.end()
    }
}
