//! Durations in a readable form, and serde helpers for event times written as RFC 3339
//! text in the user's own event types.

use sessionizer_core::{DurationMs, EventTime};

/// `n` milliseconds.
pub const fn millis(n: i64) -> DurationMs {
    DurationMs(n)
}

/// `n` seconds.
pub const fn seconds(n: i64) -> DurationMs {
    DurationMs(n.saturating_mul(1_000))
}

/// `n` minutes.
///
/// ```
/// assert_eq!(sessionizer::time::minutes(10).millis(), 600_000);
/// ```
pub const fn minutes(n: i64) -> DurationMs {
    DurationMs(n.saturating_mul(60_000))
}

/// `n` hours.
pub const fn hours(n: i64) -> DurationMs {
    DurationMs(n.saturating_mul(3_600_000))
}

/// Parses an RFC 3339 / ISO 8601 time the way the command line does (any offset, with
/// or without fractional seconds, no zone meaning UTC).
///
/// ```
/// use sessionizer::core::EventTime;
/// assert_eq!(
///     sessionizer::time::parse("2024-01-01T00:01:00Z"),
///     Ok(EventTime(1_704_067_260_000))
/// );
/// ```
pub fn parse(text: &str) -> Result<EventTime, sessionizer_core::timefmt::TimeError> {
    sessionizer_core::timefmt::parse_timestamp(text.as_bytes())
}

/// `#[serde(with = "sessionizer::time::rfc3339")]` on an [`EventTime`] field: read from
/// and written as RFC 3339 text (written in UTC with milliseconds).
///
/// ```
/// use serde::Deserialize;
/// use sessionizer::core::EventTime;
///
/// #[derive(Deserialize)]
/// struct Visit {
///     visit_id: String,
///     #[serde(with = "sessionizer::time::rfc3339")]
///     event_time: EventTime,
/// }
///
/// let v: Visit =
///     serde_json::from_str(r#"{"visit_id":"v1","event_time":"2024-01-01T01:00:00+01:00"}"#)
///         .expect("valid");
/// assert_eq!(v.event_time, EventTime(1_704_067_200_000));
/// ```
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};
    use sessionizer_core::EventTime;
    use std::borrow::Cow;

    /// Writes `t` as RFC 3339 text in UTC with milliseconds.
    pub fn serialize<S: Serializer>(t: &EventTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&sessionizer_core::timefmt::format_rfc3339_ms(*t))
    }

    /// Reads RFC 3339 text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<EventTime, D::Error> {
        let text = Cow::<'de, str>::deserialize(d)?;
        // Worded so that a dead letter reads as the command line's: "field
        // event_time is not a valid timestamp: ...".
        crate::api::time::parse(&text)
            .map_err(|e| serde::de::Error::custom(format!("not a valid timestamp: {e}")))
    }
}
