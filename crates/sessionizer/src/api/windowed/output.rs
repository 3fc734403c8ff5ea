//! What a session window job emits: session records with the context of their
//! emission, retractions, and the JSON shape both are written in.

use serde::ser::{Serialize, SerializeMap, Serializer};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::clock::ProcessingTime;

/// Why a record was emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// The watermark reached the session's close time (Flink's event-time trigger
    /// firing). A late event that changes a complete session emits its next revision at
    /// once, with the watermark it was judged against.
    Watermark,
    /// `EmitMode::OnUpdate`: an event changed a session still open (`complete` is
    /// false).
    Update,
    /// The input was quiet for the idle timeout and the watermark moved on with the
    /// clock ([`SessionWindowBuilder::idle_timeout`](super::SessionWindowBuilder::idle_timeout)).
    Idle,
    /// [`SessionWindowJob::finish`](super::SessionWindowJob::finish): the end of a
    /// bounded input, where every session is emitted whatever the watermark.
    EndOfInput,
}

/// The context of an emission, on every record (Flink's `Context.currentWatermark()`
/// and `currentProcessingTime()` at firing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Emission {
    /// The event-time watermark at emission: the one that completed the session (for
    /// [`Trigger::Update`], the one after the event that changed it; for a late event's
    /// revision, the one it was judged against).
    ///
    /// At the end of input ([`Trigger::EndOfInput`]) the engine moves the watermark to
    /// +∞ to emit everything; that is no watermark any event gave, so this field holds
    /// instead the **last watermark the events gave** ([`Watermark::MIN`] if none) — a
    /// session emitted then is incomplete in event time, `watermark` says how far the
    /// input had got.
    pub watermark: Watermark,
    /// The processing time at emission (the job's
    /// [`Clock`](sessionizer_window::clock::Clock)).
    pub processing_time: ProcessingTime,
    /// What emitted the record.
    pub trigger: Trigger,
}

/// A session as emitted: its bounds, revision, the aggregate's result `value`, and the
/// context of its emission.
///
/// As JSON (through [`JsonLinesSink`](crate::api::sink::JsonLinesSink)) it has the command
/// line's shape: `key`, `session_id` (16 hex digits), `start`, `end` (RFC 3339),
/// `duration_ms`, `event_count`, `revision`, `complete`, then the fields of `value`, in
/// the value's own order and with its own names (nested objects too):
///
/// - a struct or map: its fields;
/// - a tuple: its elements' fields — a struct or map element (such as a
///   [`Named`](crate::api::aggregators::Named) aggregate's result) contributes its fields,
///   any other element is the field `_1`, `_2`, ... by position;
/// - `()` or `None`: nothing;
/// - anything else: one field `value`.
///
/// The emission context is not written (the command line's records do not have it);
/// map the record to your own type to output it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord<O> {
    /// The key's text.
    pub key: String,
    /// The deterministic id of (key, start) — see [`session_id`](sessionizer_window::session_id).
    pub session_id: u64,
    /// The first event time.
    pub start: EventTime,
    /// The last event time.
    pub end: EventTime,
    /// Events in the session.
    pub event_count: u64,
    /// 0, then 1, 2, ... when late events change an emitted session (always 0 with
    /// `EmitMode::Final`).
    pub revision: u32,
    /// False for `EmitMode::OnUpdate` records of a session still open.
    pub complete: bool,
    /// The aggregate's result.
    pub value: O,
    /// When and why it was emitted.
    pub emitted: Emission,
}

impl<O> SessionRecord<O> {
    /// `end - start`.
    pub fn duration(&self) -> DurationMs {
        DurationMs(self.end.millis() - self.start.millis())
    }

    /// The same record with its value mapped by `f` (to name a tuple's fields, say).
    pub fn map<O2>(self, f: impl FnOnce(O) -> O2) -> SessionRecord<O2> {
        SessionRecord {
            key: self.key,
            session_id: self.session_id,
            start: self.start,
            end: self.end,
            event_count: self.event_count,
            revision: self.revision,
            complete: self.complete,
            value: f(self.value),
            emitted: self.emitted,
        }
    }
}

fn hex_id(id: u64) -> String {
    format!("{id:016x}")
}

impl<O: Serialize> Serialize for SessionRecord<O> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("key", &self.key)?;
        map.serialize_entry("session_id", &hex_id(self.session_id))?;
        map.serialize_entry("start", &self.start.to_string())?;
        map.serialize_entry("end", &self.end.to_string())?;
        map.serialize_entry("duration_ms", &self.duration().millis())?;
        map.serialize_entry("event_count", &self.event_count)?;
        map.serialize_entry("revision", &self.revision)?;
        map.serialize_entry("complete", &self.complete)?;
        // The value's fields become the record's, as the command line's aggregates do,
        // in the value's own order.
        crate::api::flatten::flatten_into(&mut map, &self.value)?;
        map.end()
    }
}

/// A session emitted before that disappeared (merged into another, or its start moved
/// so that its id changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retraction {
    /// The key's text.
    pub key: String,
    /// The id being retracted.
    pub session_id: u64,
    /// The start it had.
    pub start: EventTime,
    /// When and why it was emitted.
    pub emitted: Emission,
}

impl Serialize for Retraction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("key", &self.key)?;
        map.serialize_entry("session_id", &hex_id(self.session_id))?;
        map.serialize_entry("retract", &true)?;
        map.end()
    }
}

/// What a session window job emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowOutput<O> {
    /// A session record.
    Session(SessionRecord<O>),
    /// A retraction (only with allowed lateness).
    Retraction(Retraction),
}

impl<O> WindowOutput<O> {
    /// The session record, if this is one.
    pub fn session(&self) -> Option<&SessionRecord<O>> {
        match self {
            WindowOutput::Session(s) => Some(s),
            WindowOutput::Retraction(_) => None,
        }
    }
}

impl<O: Serialize> Serialize for WindowOutput<O> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WindowOutput::Session(r) => r.serialize(s),
            WindowOutput::Retraction(r) => r.serialize(s),
        }
    }
}
