//! One JSON-lines record to one event: key, event time, optional per-event gap, dedup
//! hash, and the raw values that aggregates need.
//!
//! A [`Decoder`] is built once from a [`DecoderConfig`] and reused for every line; it owns
//! all its buffers, so decoding allocates nothing (except on rare paths: escaped keys or
//! times grow a scratch buffer once, and invalid records build their reason).

use crate::json::{self, Extractor, FieldPath, JsonError, JsonKind, Span};
use crate::time::{DurationMs, EventTime};
use crate::timefmt::{self, DurationError, EpochUnit, TimeError};
use std::fmt;
use std::str::FromStr;

/// How the time field is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TimeFormat {
    /// An RFC 3339 / ISO-8601 string (see [`timefmt::parse_timestamp`]).
    #[default]
    Rfc3339,
    /// A number (or a string holding a number) of milliseconds since the epoch.
    EpochMs,
    /// A number (or a string holding a number) of seconds since the epoch.
    EpochS,
}

impl TimeFormat {
    /// The command-line name: `rfc3339`, `epoch-ms` or `epoch-s`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeFormat::Rfc3339 => "rfc3339",
            TimeFormat::EpochMs => "epoch-ms",
            TimeFormat::EpochS => "epoch-s",
        }
    }
}

impl fmt::Display for TimeFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a [`TimeFormat`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time format '{0}'; use rfc3339, epoch-ms or epoch-s")]
pub struct UnknownTimeFormat(pub String);

impl FromStr for TimeFormat {
    type Err = UnknownTimeFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rfc3339" => Ok(TimeFormat::Rfc3339),
            "epoch-ms" => Ok(TimeFormat::EpochMs),
            "epoch-s" => Ok(TimeFormat::EpochS),
            _ => Err(UnknownTimeFormat(s.to_owned())),
        }
    }
}

/// Which duplicates to detect.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DedupMode {
    /// No deduplication.
    #[default]
    Off,
    /// Whole records, byte for byte (`--dedup`).
    Record,
    /// The raw text of one field's value (`--dedup-field`).
    Field(FieldPath),
}

/// The default `--valid-time-range`: 1970-01-01T00:00:00Z (inclusive) to
/// 2200-01-01T00:00:00Z (exclusive).
pub const DEFAULT_VALID_RANGE: (EventTime, EventTime) =
    (EventTime(0), EventTime(7_258_118_400_000));

/// Whether `time` lies in `range` (`start <= t < end`): the `--valid-time-range` check,
/// shared by the [`Decoder`] and the library's jobs, so that one corrupt far-future
/// record cannot push the watermark past every open session.
#[inline]
pub fn in_valid_range(time: EventTime, range: (EventTime, EventTime)) -> bool {
    range.0 <= time && time < range.1
}

/// What a [`Decoder`] reads from each record.
#[derive(Clone, Debug)]
pub struct DecoderConfig {
    /// The session key field (a JSON string or integer).
    pub key: FieldPath,
    /// The event time field.
    pub time: FieldPath,
    /// How the time is written.
    pub time_format: TimeFormat,
    /// The per-event gap field (`--gap-field`), if any.
    pub gap_field: Option<FieldPath>,
    /// Duplicate detection.
    pub dedup: DedupMode,
    /// Valid times `t` satisfy `start <= t < end`.
    pub valid_range: (EventTime, EventTime),
    /// Fields whose raw values the aggregates need, see [`Decoded::value`].
    pub value_fields: Vec<FieldPath>,
}

impl Default for DecoderConfig {
    /// Key `visit_id`, time `event_time` in RFC 3339, no gap field, no dedup, the
    /// [`DEFAULT_VALID_RANGE`], no value fields.
    fn default() -> Self {
        DecoderConfig {
            key: FieldPath::parse("visit_id").expect("constant path"),
            time: FieldPath::parse("event_time").expect("constant path"),
            time_format: TimeFormat::Rfc3339,
            gap_field: None,
            dedup: DedupMode::Off,
            valid_range: DEFAULT_VALID_RANGE,
            value_fields: Vec::new(),
        }
    }
}

/// Why a per-event gap value is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GapError {
    /// A string that is not a duration.
    #[error(transparent)]
    Parse(#[from] DurationError),
    /// A number that is not a non-negative integer of milliseconds.
    #[error("a number must be a non-negative integer of milliseconds")]
    BadNumber,
    /// Above [`timefmt::MAX_DURATION`].
    #[error("duration longer than 100 years")]
    TooLong,
    /// Neither a string nor a number.
    #[error("expected a duration string like \"45m\" or an integer of milliseconds (found {0})")]
    Kind(&'static str),
}

/// Why a record is invalid. The `Display` text is the reason written into dead-letter
/// records, e.g. `missing key field visit_id`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The line is not UTF-8.
    #[error("not valid UTF-8")]
    NotUtf8,
    /// A JSON syntax error, nesting too deep, or not an object (the [`JsonError`] text:
    /// `not valid JSON at byte 17: ...`, `not a JSON object (found an array)`).
    #[error("{0}")]
    Json(JsonError),
    /// The key field is absent.
    #[error("missing key field {0}")]
    MissingKey(FieldPath),
    /// The key field is `null`.
    #[error("key field {0} is null")]
    NullKey(FieldPath),
    /// The key is neither a string nor an integer.
    #[error("key field {field} is not a string or integer (found {found})")]
    KeyKind {
        /// The key field.
        field: FieldPath,
        /// What was found: `a float`, `a boolean`, `an object`, `an array`.
        found: &'static str,
    },
    /// The time field is absent.
    #[error("missing time field {0}")]
    MissingTime(FieldPath),
    /// The time field is `null`.
    #[error("time field {0} is null")]
    NullTime(FieldPath),
    /// The time field could not be parsed.
    #[error("time field {field} is not a valid timestamp: {error}")]
    BadTime {
        /// The time field.
        field: FieldPath,
        /// Why.
        error: TimeError,
    },
    /// A JSON number in RFC 3339 mode.
    #[error("time field {0} is a number; use --time-format epoch-ms or epoch-s")]
    TimeIsNumber(FieldPath),
    /// The time field is of a kind that cannot hold a time in the configured format (a
    /// boolean, object or array; a string in an epoch format must hold a number).
    #[error("time field {field} is not {expected} (found {found})")]
    TimeKind {
        /// The time field.
        field: FieldPath,
        /// What was expected: `an RFC 3339 string` or `a number`.
        expected: &'static str,
        /// What was found.
        found: &'static str,
    },
    /// The time is outside the valid range.
    #[error("time field {field} is outside the valid time range {}..{}", .range.0, .range.1)]
    TimeOutOfRange {
        /// The time field.
        field: FieldPath,
        /// The configured range (`start <= t < end`).
        range: (EventTime, EventTime),
    },
    /// The per-event gap is unusable.
    #[error("gap field {field} is not a duration: {error}")]
    BadGap {
        /// The gap field.
        field: FieldPath,
        /// Why.
        error: GapError,
    },
}

impl From<JsonError> for Invalid {
    fn from(e: JsonError) -> Self {
        match e {
            JsonError::NotUtf8 { .. } => Invalid::NotUtf8,
            e => Invalid::Json(e),
        }
    }
}

/// One decoded event, borrowing from the line and the [`Decoder`].
#[derive(Debug, Clone, Copy)]
pub struct Decoded<'a> {
    /// The key's text: the unescaped content of a string key, or an integer key's digits
    /// as written (`"42"` and `42` give the same key).
    pub key: &'a [u8],
    /// The event time.
    pub time: EventTime,
    /// The event's own gap, when a gap field is configured and present (not null).
    pub gap: Option<DurationMs>,
    /// The dedup hash (xxh3-128) of the record or of the dedup field's raw value text;
    /// `None` when dedup is off or the field is absent or null.
    pub dedup: Option<u128>,
    line: &'a [u8],
    found: &'a [Option<Span>],
    value_slots: &'a [usize],
}

impl<'a> Decoded<'a> {
    /// The raw JSON text of `value_fields[i]`; `None` if missing or `null` (or `i` is out
    /// of range).
    #[inline]
    pub fn value(&self, i: usize) -> Option<&'a [u8]> {
        let slot = *self.value_slots.get(i)?;
        let span = (*self.found.get(slot)?)?;
        let raw = span.of(self.line);
        if raw == b"null" { None } else { Some(raw) }
    }

    /// The number of value fields.
    pub fn value_count(&self) -> usize {
        self.value_slots.len()
    }

    /// The record as decoded.
    pub fn line(&self) -> &'a [u8] {
        self.line
    }
}

/// The content of the raw JSON string `raw` (valid, with its quotes) when it has no
/// escapes; `escapes` is false when the line it is from holds no backslash at all (see
/// [`Extractor::scan_noting_escapes`]), and then it is not looked for again.
#[inline(always)]
fn plain_content(raw: &[u8], escapes: bool) -> Option<&[u8]> {
    if escapes {
        json::string_content(raw)
    } else {
        raw.strip_prefix(b"\"")?.strip_suffix(b"\"")
    }
}

/// A key's text from its raw JSON value: a string's content (unescaped into `buf` when
/// it has escapes) or an integer's digits; anything else is invalid.
fn read_key<'s>(
    raw: &'s [u8],
    escapes: bool,
    field: &FieldPath,
    buf: &'s mut Vec<u8>,
) -> Result<&'s [u8], Invalid> {
    match json::kind(raw) {
        JsonKind::String => match plain_content(raw, escapes) {
            Some(content) => Ok(content),
            None => {
                buf.clear();
                json::unescape_string(raw, buf)?;
                Ok(buf)
            }
        },
        JsonKind::Number if json::is_integer(raw) => Ok(raw),
        JsonKind::Number => Err(Invalid::KeyKind {
            field: field.clone(),
            found: "a float",
        }),
        JsonKind::Null => Err(Invalid::NullKey(field.clone())),
        k => Err(Invalid::KeyKind {
            field: field.clone(),
            found: k.describe(),
        }),
    }
}

/// Reads only the session key of records, as [`Decoder`] does (validating the whole
/// line): for re-keying records without judging the rest of them.
#[derive(Debug, Clone)]
pub struct KeyReader {
    field: FieldPath,
    extractor: Extractor,
    found: Vec<Option<Span>>,
    buf: Vec<u8>,
}

impl KeyReader {
    /// A reader of the key field `field`.
    pub fn new(field: FieldPath) -> KeyReader {
        KeyReader {
            extractor: Extractor::new(std::slice::from_ref(&field)),
            field,
            found: vec![None],
            buf: Vec::new(),
        }
    }

    /// The key of `line`, or why the line has none.
    pub fn key<'s>(&'s mut self, line: &'s [u8]) -> Result<&'s [u8], Invalid> {
        let escapes = self.extractor.scan_noting_escapes(line, &mut self.found)?;
        let Some(span) = self.found[0] else {
            return Err(Invalid::MissingKey(self.field.clone()));
        };
        read_key(span.of(line), escapes, &self.field, &mut self.buf)
    }
}

/// Decodes records per a [`DecoderConfig`]; reuse one per input stream.
#[derive(Debug, Clone)]
pub struct Decoder {
    cfg: DecoderConfig,
    extractor: Extractor,
    found: Vec<Option<Span>>,
    time_slot: usize,
    gap_slot: Option<usize>,
    dedup_slot: Option<usize>,
    value_slots: Vec<usize>,
    key_buf: Vec<u8>,
    tmp_buf: Vec<u8>,
    dates: timefmt::DateCache,
}

/// Adds `p` to `paths` unless present; its index.
fn slot_of(paths: &mut Vec<FieldPath>, p: &FieldPath) -> usize {
    match paths.iter().position(|q| q == p) {
        Some(i) => i,
        None => {
            paths.push(p.clone());
            paths.len() - 1
        }
    }
}

impl Decoder {
    /// A decoder for `cfg`. Identical paths (a value field that is also the key, say) are
    /// looked up once.
    ///
    /// # Panics
    ///
    /// If the key, time, gap, dedup and value fields make more than
    /// [`json::MAX_PATHS`] distinct paths.
    pub fn new(cfg: DecoderConfig) -> Decoder {
        let mut paths = vec![cfg.key.clone()];
        let time_slot = slot_of(&mut paths, &cfg.time);
        let gap_slot = cfg.gap_field.as_ref().map(|p| slot_of(&mut paths, p));
        let dedup_slot = match &cfg.dedup {
            DedupMode::Field(p) => Some(slot_of(&mut paths, p)),
            _ => None,
        };
        let value_slots = cfg
            .value_fields
            .iter()
            .map(|p| slot_of(&mut paths, p))
            .collect();
        let extractor = Extractor::new(&paths);
        Decoder {
            found: vec![None; paths.len()],
            extractor,
            cfg,
            time_slot,
            gap_slot,
            dedup_slot,
            value_slots,
            key_buf: Vec::new(),
            tmp_buf: Vec::new(),
            dates: timefmt::DateCache::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// Decodes one line: `line` is the record without its line terminator (the caller
    /// strips `\n` and a trailing `\r`).
    ///
    /// The line is validated as a whole (UTF-8 and JSON, see [`Extractor::scan`]), then
    /// the key, the time (and its range), the gap and the dedup value are read, in that
    /// order; the first problem found is the [`Invalid`] reason. Nothing is allocated
    /// unless the record is invalid (or a key or time needs unescaping into a buffer that
    /// is not yet large enough).
    pub fn decode<'s>(&'s mut self, line: &'s [u8]) -> Result<Decoded<'s>, Invalid> {
        let escapes = self.extractor.scan_noting_escapes(line, &mut self.found)?;
        let found = &self.found;

        // Key.
        let Some(key_span) = found[0] else {
            return Err(Invalid::MissingKey(self.cfg.key.clone()));
        };
        let key = read_key(key_span.of(line), escapes, &self.cfg.key, &mut self.key_buf)?;

        // Time.
        let Some(time_span) = found[self.time_slot] else {
            return Err(Invalid::MissingTime(self.cfg.time.clone()));
        };
        let time = read_time(
            time_span.of(line),
            self.cfg.time_format,
            escapes,
            &mut self.tmp_buf,
            &mut self.dates,
            &self.cfg.time,
        )?;
        if !in_valid_range(time, self.cfg.valid_range) {
            return Err(Invalid::TimeOutOfRange {
                field: self.cfg.time.clone(),
                range: self.cfg.valid_range,
            });
        }

        // Gap.
        let gap = match (&self.cfg.gap_field, self.gap_slot) {
            (Some(field), Some(slot)) => match found[slot] {
                None => None,
                Some(span) => {
                    read_gap(span.of(line), escapes, &mut self.tmp_buf).map_err(|error| {
                        Invalid::BadGap {
                            field: field.clone(),
                            error,
                        }
                    })?
                }
            },
            _ => None,
        };

        // Dedup.
        let dedup = match &self.cfg.dedup {
            DedupMode::Off => None,
            DedupMode::Record => Some(xxhash_rust::xxh3::xxh3_128(line)),
            DedupMode::Field(_) => self
                .dedup_slot
                .and_then(|slot| found[slot])
                .map(|span| span.of(line))
                .filter(|raw| *raw != b"null")
                .map(xxhash_rust::xxh3::xxh3_128),
        };

        Ok(Decoded {
            key,
            time,
            gap,
            dedup,
            line,
            found: &self.found,
            value_slots: &self.value_slots,
        })
    }
}

/// The content of a raw JSON string, unescaped into `tmp` when needed.
#[inline]
fn content<'a>(raw: &'a [u8], escapes: bool, tmp: &'a mut Vec<u8>) -> Result<&'a [u8], JsonError> {
    match plain_content(raw, escapes) {
        Some(c) => Ok(c),
        None => {
            tmp.clear();
            json::unescape_string(raw, tmp)?;
            Ok(tmp)
        }
    }
}

#[inline]
fn read_time(
    raw: &[u8],
    format: TimeFormat,
    escapes: bool,
    tmp: &mut Vec<u8>,
    dates: &mut timefmt::DateCache,
    field: &FieldPath,
) -> Result<EventTime, Invalid> {
    let bad = |error| Invalid::BadTime {
        field: field.clone(),
        error,
    };
    let kind = json::kind(raw);
    if kind == JsonKind::Null {
        return Err(Invalid::NullTime(field.clone()));
    }
    match format {
        TimeFormat::Rfc3339 => match kind {
            JsonKind::String => {
                timefmt::parse_timestamp_cached(content(raw, escapes, tmp)?, dates).map_err(bad)
            }
            JsonKind::Number => Err(Invalid::TimeIsNumber(field.clone())),
            k => Err(Invalid::TimeKind {
                field: field.clone(),
                expected: "an RFC 3339 string",
                found: k.describe(),
            }),
        },
        TimeFormat::EpochMs | TimeFormat::EpochS => {
            let unit = if format == TimeFormat::EpochMs {
                EpochUnit::Millis
            } else {
                EpochUnit::Seconds
            };
            match kind {
                JsonKind::Number => timefmt::parse_epoch(raw, unit).map_err(bad),
                JsonKind::String => {
                    timefmt::parse_epoch(content(raw, escapes, tmp)?, unit).map_err(bad)
                }
                k => Err(Invalid::TimeKind {
                    field: field.clone(),
                    expected: "a number",
                    found: k.describe(),
                }),
            }
        }
    }
}

/// `Ok(None)` for null.
#[inline]
fn read_gap(raw: &[u8], escapes: bool, tmp: &mut Vec<u8>) -> Result<Option<DurationMs>, GapError> {
    match json::kind(raw) {
        JsonKind::Null => Ok(None),
        JsonKind::String => {
            let text =
                content(raw, escapes, tmp).map_err(|_| GapError::Kind("a malformed string"))?;
            Ok(Some(timefmt::parse_duration_bytes(text)?))
        }
        JsonKind::Number => {
            if !json::is_integer(raw) || raw.first() == Some(&b'-') {
                return Err(GapError::BadNumber);
            }
            let mut v: i64 = 0;
            for &b in raw {
                let d = b.wrapping_sub(b'0');
                if d > 9 {
                    return Err(GapError::BadNumber);
                }
                v = v
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(i64::from(d)))
                    .ok_or(GapError::TooLong)?;
            }
            if v > timefmt::MAX_DURATION.0 {
                return Err(GapError::TooLong);
            }
            Ok(Some(DurationMs(v)))
        }
        k => Err(GapError::Kind(k.describe())),
    }
}
