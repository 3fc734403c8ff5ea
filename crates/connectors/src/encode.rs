//! The output records (docs/semantics.md S-16, S-9, S-14, S-6), encoded as JSON lines
//! into a batch buffer, which a [`RecordWriter`](crate::sink::RecordWriter) hands to
//! its output in large blocks.

use sessionizer_core::json::write_json_string;
use sessionizer_core::timefmt::write_rfc3339_ms;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::{Emit, SessionView, session_id};

/// The members a session record may have besides its aggregates: an aggregate named
/// like one of them would make a record with a member twice (or a table with a column
/// twice), so it is refused.
pub const FIXED_FIELDS: [&str; 9] = [
    "key",
    "session_id",
    "start",
    "end",
    "duration_ms",
    "event_count",
    "revision",
    "complete",
    "retract",
];

/// Encodes sessions and retractions (the operator's [`Emit`]) as JSON lines into `buf`.
#[derive(Debug, Clone)]
pub struct SessionEncoder {
    /// Encoded records not yet taken.
    pub buf: Vec<u8>,
    /// Records encoded into `buf` since it was last taken.
    pub records: u64,
    /// `,"name":` of each aggregate, pre-encoded.
    agg_prefixes: Vec<Vec<u8>>,
    with_complete: bool,
    with_revision: bool,
    retractions: u64,
}

impl SessionEncoder {
    /// `agg_names` are the output names of the aggregates in order. The record's fields
    /// follow the emit mode, and are the same for every record of a run: `--emit
    /// on-update` adds `complete`; `--emit final` leaves out `revision` (a session is
    /// written once, when it can no longer change).
    pub fn new(agg_names: &[String], emit: sessionizer_window::EmitMode) -> Self {
        use sessionizer_window::EmitMode;
        let agg_prefixes = agg_names
            .iter()
            .map(|n| {
                let mut p = b",".to_vec();
                write_json_string(n.as_bytes(), &mut p);
                p.push(b':');
                p
            })
            .collect();
        SessionEncoder {
            buf: Vec::with_capacity(1 << 16),
            records: 0,
            agg_prefixes,
            with_complete: emit == EmitMode::OnUpdate,
            with_revision: emit != EmitMode::Final,
            retractions: 0,
        }
    }

    /// Retraction records encoded so far (not reset when `buf` is taken).
    pub fn retractions(&self) -> u64 {
        self.retractions
    }
}

fn write_id(key: &[u8], start: EventTime, out: &mut Vec<u8>) {
    out.extend_from_slice(b"\"session_id\":\"");
    let id = session_id(key, start.millis());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((id >> (shift * 4)) & 0xf) as usize]);
    }
    out.push(b'"');
}

fn write_time(name: &[u8], t: EventTime, out: &mut Vec<u8>) {
    out.extend_from_slice(name);
    out.push(b'"');
    write_rfc3339_ms(t, out);
    out.push(b'"');
}

impl Emit for SessionEncoder {
    fn session(&mut self, s: &SessionView<'_>) {
        let out = &mut self.buf;
        let mut num = itoa::Buffer::new();
        out.extend_from_slice(b"{\"key\":");
        write_json_string(s.key, out);
        out.push(b',');
        write_id(s.key, s.start, out);
        write_time(b",\"start\":", s.start, out);
        write_time(b",\"end\":", s.end, out);
        out.extend_from_slice(b",\"duration_ms\":");
        out.extend_from_slice(num.format(s.end.millis() - s.start.millis()).as_bytes());
        out.extend_from_slice(b",\"event_count\":");
        out.extend_from_slice(num.format(s.event_count).as_bytes());
        if self.with_revision {
            out.extend_from_slice(b",\"revision\":");
            out.extend_from_slice(num.format(s.revision).as_bytes());
        }
        if self.with_complete {
            out.extend_from_slice(if s.complete {
                b",\"complete\":true"
            } else {
                b",\"complete\":false"
            });
        }
        for (prefix, agg) in self.agg_prefixes.iter().zip(s.aggregates) {
            out.extend_from_slice(prefix);
            agg.write_json(out);
        }
        out.extend_from_slice(b"}\n");
        self.records += 1;
    }

    fn retraction(&mut self, key: &[u8], start: EventTime) {
        let out = &mut self.buf;
        out.extend_from_slice(b"{\"key\":");
        write_json_string(key, out);
        out.push(b',');
        write_id(key, start, out);
        out.extend_from_slice(b",\"retract\":true}\n");
        self.retractions += 1;
        self.records += 1;
    }
}

/// How a position within an input is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionStyle {
    /// `file:line`, the 1-based line number.
    Line,
    /// `topic/partition@offset`, the record's offset.
    Offset,
}

/// An input as named in dead-letter and late records: a file (`visits.jsonl`, `stdin`)
/// or a Kafka partition (`visits/3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceName {
    /// The display name.
    pub name: String,
    /// How positions within it are written.
    pub style: PositionStyle,
}

impl SourceName {
    /// A file or stdin, whose positions are line numbers.
    pub fn lines(name: impl Into<String>) -> SourceName {
        SourceName {
            name: name.into(),
            style: PositionStyle::Line,
        }
    }

    /// A Kafka partition, whose positions are offsets.
    pub fn partition(topic: &str, partition: i32) -> SourceName {
        SourceName {
            name: format!("{topic}/{partition}"),
            style: PositionStyle::Offset,
        }
    }

    /// The position `at` (a line number or an offset) within this input.
    pub fn pos(&self, at: u64) -> SourcePos<'_> {
        SourcePos {
            name: &self.name,
            at,
            style: self.style,
        }
    }
}

/// Where a record came from: `file:line` or `topic/partition@offset`.
#[derive(Debug, Clone, Copy)]
pub struct SourcePos<'a> {
    /// The input's display name.
    pub name: &'a str,
    /// The 1-based line number, or the offset.
    pub at: u64,
    /// Which of the two `at` is.
    pub style: PositionStyle,
}

impl std::fmt::Display for SourcePos<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sep = match self.style {
            PositionStyle::Line => ':',
            PositionStyle::Offset => '@',
        };
        write!(f, "{}{sep}{}", self.name, self.at)
    }
}

fn write_source(pos: SourcePos<'_>, out: &mut Vec<u8>) {
    let mut s = Vec::with_capacity(pos.name.len() + 12);
    s.extend_from_slice(pos.name.as_bytes());
    s.push(match pos.style {
        PositionStyle::Line => b':',
        PositionStyle::Offset => b'@',
    });
    s.extend_from_slice(itoa::Buffer::new().format(pos.at).as_bytes());
    write_json_string(&s, out);
}

/// `{"reason":..,"source":"file:line","raw":"<the record as read>"}`. A JSON string
/// holds only UTF-8, so when the record is not UTF-8 `raw` has U+FFFD in place of the
/// bad bytes and `"raw_base64"` follows with the exact bytes (standard base64, padded).
pub fn encode_dead_letter(out: &mut Vec<u8>, reason: &str, pos: SourcePos<'_>, raw: &[u8]) {
    out.extend_from_slice(b"{\"reason\":");
    write_json_string(reason.as_bytes(), out);
    out.extend_from_slice(b",\"source\":");
    write_source(pos, out);
    out.extend_from_slice(b",\"raw\":");
    match std::str::from_utf8(raw) {
        Ok(_) => write_json_string(raw, out),
        Err(_) => {
            write_json_string(String::from_utf8_lossy(raw).as_bytes(), out);
            out.extend_from_slice(b",\"raw_base64\":\"");
            out.extend_from_slice(base64_of(raw).as_bytes());
            out.push(b'"');
        }
    }
    out.extend_from_slice(b"}\n");
}

/// The dead-letter `raw_base64` of a record: its exact bytes in standard base64 when
/// they are not UTF-8 (so that `raw`, a JSON string, cannot hold them), else `None`.
pub fn raw_base64(raw: &[u8]) -> Option<String> {
    std::str::from_utf8(raw).is_err().then(|| base64_of(raw))
}

fn base64_of(raw: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(raw)
}

/// `{"reason":..,"source":..,"watermark":..,"behind_watermark_ms":..,"event":<as read>}`.
pub fn encode_late(
    out: &mut Vec<u8>,
    reason: &str,
    pos: SourcePos<'_>,
    watermark: Watermark,
    time: EventTime,
    event: &[u8],
) {
    out.extend_from_slice(b"{\"reason\":\"");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\",\"source\":");
    write_source(pos, out);
    write_time(b",\"watermark\":", watermark.as_time(), out);
    out.extend_from_slice(b",\"behind_watermark_ms\":");
    let behind = watermark.millis().saturating_sub(time.millis());
    out.extend_from_slice(itoa::Buffer::new().format(behind).as_bytes());
    out.extend_from_slice(b",\"event\":");
    out.extend_from_slice(event.trim_ascii());
    out.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 8): bytes that are not UTF-8 were replaced by U+FFFD in `raw`
    /// and lost; `raw_base64` keeps them.
    #[test]
    fn a_dead_letter_of_bytes_that_are_not_utf8_keeps_them_in_raw_base64() {
        let name = SourceName::lines("in.jsonl");
        let pos = name.pos(3);
        let mut out = Vec::new();
        encode_dead_letter(&mut out, "not valid JSON", pos, b"ab\xffc\"");
        let rec: serde_json::Value = serde_json::from_slice(&out).expect("one JSON line");
        assert_eq!(rec["raw"], "ab\u{fffd}c\"");
        assert_eq!(rec["raw_base64"], "YWL/YyI=", "base64 of 61 62 ff 63 22");
        assert_eq!(raw_base64(b"ab\xffc\""), Some("YWL/YyI=".to_string()));

        out.clear();
        encode_dead_letter(&mut out, "not valid JSON", pos, "é\"".as_bytes());
        let rec: serde_json::Value = serde_json::from_slice(&out).expect("one JSON line");
        assert_eq!(rec["raw"], "é\"");
        assert!(rec.get("raw_base64").is_none(), "{rec}");
        assert_eq!(raw_base64("é".as_bytes()), None);
    }
}
