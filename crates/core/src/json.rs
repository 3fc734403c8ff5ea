//! A validating, one-pass JSON scanner that pulls the values of a few dotted paths out of
//! one JSON-lines record without building a document.
//!
//! [`Extractor::scan`] checks that a line is exactly one JSON value (RFC 8259), that it is
//! an object, and records the byte [`Span`] of the value at each configured
//! [`FieldPath`]. Nothing is allocated per line: the active paths are tracked per nesting
//! level with a 64-bit mask.
//!
//! Two scanners share that contract. On a CPU with AVX2 or AVX-512 (detected at run
//! time) a structural pass in the manner of simdjson classifies the line 64 bytes at a
//! time and walks its tokens (`json/fast.rs`, with the intrinsics in `json/simd.rs`, the
//! workspace's one module allowed `unsafe`). Whenever that pass does not accept a line,
//! and on other CPUs, the byte-at-a-time scanner (`json/bytewise.rs`) runs (strings
//! eight bytes at a time): it alone words the errors, so a rejected line gets the same
//! reason on every CPU. Tests check that both accept exactly the same lines with the
//! same spans.
//!
//! The helpers ([`kind`], [`string_content`], [`unescape_string`], [`write_json_string`])
//! work on the raw value text that a span points at; the string ones and the escapes are
//! in `json/strings.rs`.
//!
//! # Agreement with `serde_json`
//!
//! A line is accepted exactly when `serde_json::from_slice::<serde_json::Value>` accepts it
//! and the value is an object, with one intentional difference: a number whose magnitude
//! overflows `f64` (`1e400`, a 400-digit integer) is valid JSON by the RFC 8259 grammar and
//! is accepted here, while `serde_json` reports "number out of range". Like `serde_json`,
//! the scanner rejects lone UTF-16 surrogates in `\u` escapes and more than 127 nested
//! arrays/objects.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;

mod bytewise;
mod fast;
mod simd;
mod strings;

use strings::eq_unescaped;
pub use strings::{string_content, unescape_string, write_json_string};

/// Lines longer than this are scanned byte at a time: the structural pass keeps four
/// bytes of scratch space per byte of the longest line a thread has seen.
const FAST_MAX_LINE: usize = 1 << 20;

thread_local! {
    /// Scratch space of the structural pass: the token positions of the line.
    static TOKENS: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most paths one [`Extractor`] can look for.
pub const MAX_PATHS: usize = 64;

/// Arrays and objects may nest at most `MAX_DEPTH - 1` levels deep (the same limit as
/// `serde_json`); the `MAX_DEPTH`-th level is [`JsonError::TooDeep`].
pub const MAX_DEPTH: usize = 128;

// ---------------------------------------------------------------------------------------
// Field paths
// ---------------------------------------------------------------------------------------

/// A dotted path into nested objects, such as `context.user.login`.
///
/// Each segment is compared with object member names after JSON unescaping. A member
/// whose name itself contains a `.` cannot be addressed. Cloning is cheap (reference
/// counted).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPath {
    dotted: Arc<str>,
}

/// Why a dotted field name is not a valid [`FieldPath`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The name was empty.
    #[error("empty field name")]
    Empty,
    /// The name had an empty segment (`a..b`, `.a`, `a.`).
    #[error(
        "field name '{0}' has an empty segment (two dots in a row, or a leading or trailing dot)"
    )]
    EmptySegment(String),
}

impl FieldPath {
    /// Parses a dotted name; every segment must be non-empty.
    pub fn parse(dotted: &str) -> Result<FieldPath, PathError> {
        if dotted.is_empty() {
            return Err(PathError::Empty);
        }
        if dotted.split('.').any(str::is_empty) {
            return Err(PathError::EmptySegment(dotted.to_owned()));
        }
        Ok(FieldPath {
            dotted: Arc::from(dotted),
        })
    }

    /// The dotted name as given.
    pub fn as_str(&self) -> &str {
        &self.dotted
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> impl Iterator<Item = &str> + '_ {
        self.dotted.split('.')
    }

    /// The number of segments (at least 1).
    pub fn depth(&self) -> usize {
        self.segments().count()
    }

    /// The last segment: `login` for `context.user.login`.
    pub fn last_segment(&self) -> &str {
        self.dotted.rsplit('.').next().unwrap_or(&self.dotted)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dotted)
    }
}

impl fmt::Debug for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FieldPath({:?})", &*self.dotted)
    }
}

impl FromStr for FieldPath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldPath::parse(s)
    }
}

impl Serialize for FieldPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.dotted)
    }
}

impl<'de> Deserialize<'de> for FieldPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FieldPath::parse(&s).map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------
// Spans, kinds, errors
// ---------------------------------------------------------------------------------------

/// The byte range `start..end` of a raw JSON value inside its line (a string includes
/// its quotes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte of the value.
    pub start: u32,
    /// One past the last byte of the value.
    pub end: u32,
}

impl Span {
    /// The span as a `usize` range.
    pub fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    /// The raw value text inside `line` (the line that was scanned); an empty slice if
    /// the span does not fit in `line`.
    pub fn of(self, line: &[u8]) -> &[u8] {
        line.get(self.range()).unwrap_or_default()
    }
}

/// The kind of a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JsonKind {
    /// `"..."`
    String,
    /// `-1.5e3` and the like.
    Number,
    /// `true` or `false`.
    Bool,
    /// `null`.
    Null,
    /// `{...}`
    Object,
    /// `[...]`
    Array,
}

impl JsonKind {
    /// The kind with an article, for messages: `a string`, `an array`, `null`.
    pub fn describe(self) -> &'static str {
        match self {
            JsonKind::String => "a string",
            JsonKind::Number => "a number",
            JsonKind::Bool => "a boolean",
            JsonKind::Null => "null",
            JsonKind::Object => "an object",
            JsonKind::Array => "an array",
        }
    }
}

/// The kind of a validated raw JSON value, from its first byte. For text that is not a
/// valid raw value (such as an empty slice) the answer is meaningless.
#[inline]
pub fn kind(raw: &[u8]) -> JsonKind {
    match raw.first() {
        Some(b'"') => JsonKind::String,
        Some(b'{') => JsonKind::Object,
        Some(b'[') => JsonKind::Array,
        Some(b't' | b'f') => JsonKind::Bool,
        Some(b'n') | None => JsonKind::Null,
        Some(_) => JsonKind::Number,
    }
}

/// Whether a validated raw JSON number is an integer as written (no fraction, no exponent).
#[inline]
pub fn is_integer(raw_number: &[u8]) -> bool {
    !raw_number.is_empty() && !raw_number.iter().any(|&b| matches!(b, b'.' | b'e' | b'E'))
}

/// Why a line was rejected by [`Extractor::scan`], or a string by [`unescape_string`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// A syntax error at byte `offset` (0-based) of the line.
    #[error("not valid JSON at byte {offset}: {what}")]
    NotJson {
        /// 0-based byte offset of the problem.
        offset: usize,
        /// What was wrong, e.g. `expected ':' after object key`.
        what: &'static str,
    },
    /// The line is not valid UTF-8 (first bad byte at `offset`).
    #[error("not valid UTF-8 at byte {offset}")]
    NotUtf8 {
        /// 0-based offset of the first byte of the invalid sequence.
        offset: usize,
    },
    /// Valid JSON, but not an object; `found` is e.g. `an array`.
    #[error("not a JSON object (found {found})")]
    NotObject {
        /// The kind found, with its article (see [`JsonKind::describe`]).
        found: &'static str,
    },
    /// Arrays/objects nested [`MAX_DEPTH`] levels deep or more.
    #[error("not valid JSON: nested {MAX_DEPTH} levels deep or more")]
    TooDeep,
}

#[cold]
#[inline(never)]
fn syntax(offset: usize, what: &'static str) -> JsonError {
    JsonError::NotJson { offset, what }
}

// ---------------------------------------------------------------------------------------
// The extractor
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Name {
    bytes: Box<[u8]>,
    /// The first (up to) 8 bytes of `bytes`, little endian, zero padded.
    head: u64,
    /// Bytes 8 to 16 of `bytes`, likewise.
    tail: u64,
    /// The paths whose segment at this level is `bytes`.
    mask: u64,
    /// One more than the index of the next name with the same `by_len` entry; 0: none.
    next_same_len: u8,
}

#[derive(Debug, Clone)]
struct Level {
    /// Distinct segment names at this level.
    names: Vec<Name>,
    /// The paths that end at this level.
    ends: u64,
    /// `by_len[min(len, 63)]` is one more than the index of the first name of byte length
    /// `len` (chained by [`Name::next_same_len`]); 0: no name has it, the quick reject.
    by_len: [u8; 64],
}

impl Default for Level {
    fn default() -> Level {
        Level {
            names: Vec::new(),
            ends: 0,
            by_len: [0; 64],
        }
    }
}

/// Finds the values of up to [`MAX_PATHS`] field paths in JSON-lines records; see
/// [`Extractor::scan`]. Build it once, scan many lines.
#[derive(Debug, Clone)]
pub struct Extractor {
    levels: Vec<Level>,
    n_paths: usize,
    /// The structural pass of [`fast`], when this CPU has SIMD for it.
    fast: Option<simd::Level>,
}

/// The mask of the low `len` bytes of a `u64` (all of it for `len >= 8`).
#[inline(always)]
fn head_mask(len: usize) -> u64 {
    if len >= 8 {
        u64::MAX
    } else {
        (1u64 << (len * 8)) - 1
    }
}

/// The first `min(len, 8)` bytes of `s[start..]` as a little-endian `u64`, zero padded.
#[inline(always)]
fn head_at(s: &[u8], start: usize, len: usize) -> u64 {
    match s.get(start..).and_then(<[u8]>::first_chunk::<8>) {
        Some(c) => u64::from_le_bytes(*c) & head_mask(len),
        None => {
            let mut buf = [0u8; 8];
            let n = len.min(8);
            if let Some(src) = s.get(start..start + n) {
                buf[..n].copy_from_slice(src);
            }
            u64::from_le_bytes(buf)
        }
    }
}

impl Extractor {
    /// An extractor for `paths`; `found[i]` of [`scan`](Extractor::scan) is the value of
    /// `paths[i]`. The same path may be given twice.
    ///
    /// # Panics
    ///
    /// If more than [`MAX_PATHS`] paths are given (a configuration error).
    pub fn new(paths: &[FieldPath]) -> Extractor {
        assert!(
            paths.len() <= MAX_PATHS,
            "an Extractor takes at most {MAX_PATHS} paths, got {}",
            paths.len()
        );
        let mut levels: Vec<Level> = Vec::new();
        for (i, path) in paths.iter().enumerate() {
            let bit = 1u64 << i;
            let depth = path.depth();
            for (d, seg) in path.segments().enumerate() {
                if levels.len() <= d {
                    levels.push(Level::default());
                }
                let level = &mut levels[d];
                let seg = seg.as_bytes();
                match level.names.iter_mut().find(|n| &*n.bytes == seg) {
                    Some(n) => n.mask |= bit,
                    None => {
                        // At most MAX_PATHS names per level: `u8` indices fit.
                        let bucket = &mut level.by_len[seg.len().min(63)];
                        level.names.push(Name {
                            bytes: seg.into(),
                            head: head_at(seg, 0, seg.len()),
                            tail: head_at(seg, 8, seg.len().saturating_sub(8)),
                            mask: bit,
                            next_same_len: *bucket,
                        });
                        *bucket = level.names.len() as u8;
                    }
                }
                if d + 1 == depth {
                    level.ends |= bit;
                }
            }
        }
        let fast = match simd::Level::detect() {
            simd::Level::Portable => None,
            level => Some(level),
        };
        Extractor {
            levels,
            n_paths: paths.len(),
            fast,
        }
    }

    /// The number of paths (the minimum length of `found` for [`scan`](Extractor::scan)).
    pub fn len(&self) -> usize {
        self.n_paths
    }

    /// Whether there are no paths (then `scan` only validates).
    pub fn is_empty(&self) -> bool {
        self.n_paths == 0
    }

    /// Validates `line` and locates the paths' values.
    ///
    /// `line` must be exactly one JSON value per RFC 8259, optionally surrounded by JSON
    /// whitespace, and must be an object ([`JsonError::NotObject`] otherwise). Strings must
    /// have valid escapes (paired surrogates in `\u` escapes) and no raw control
    /// characters; numbers follow the exact grammar; nesting is limited ([`MAX_DEPTH`]).
    /// The line must be valid UTF-8: this is checked here, at no cost for pure-ASCII lines
    /// (the check runs only when a string held a non-ASCII byte, or on error), and
    /// reported as [`JsonError::NotUtf8`] ahead of any syntax error.
    ///
    /// `found` (at least [`len`](Extractor::len) long) is reset, then `found[i]` is set to
    /// the span of the value at path `i`: `None` when absent, including when the path
    /// passes through a non-object value (arrays are not indexed). When a member name
    /// repeats, the last occurrence wins, exactly as if the object were parsed into a map.
    /// On error the contents of `found` are unspecified.
    ///
    /// # Panics
    ///
    /// If `found` is shorter than [`len`](Extractor::len).
    pub fn scan(&self, line: &[u8], found: &mut [Option<Span>]) -> Result<(), JsonError> {
        self.scan_noting_escapes(line, found).map(drop)
    }

    /// [`scan`](Extractor::scan), also saying whether a string of the line may hold an
    /// escape: `Ok(false)` only when no byte of the line is a backslash, so that every
    /// string found is its raw text between the quotes (the structural pass knows it for
    /// free; after the byte-at-a-time scanner the answer is always `true`).
    pub fn scan_noting_escapes(
        &self,
        line: &[u8],
        found: &mut [Option<Span>],
    ) -> Result<bool, JsonError> {
        assert!(
            found.len() >= self.n_paths,
            "`found` must hold at least {} entries",
            self.n_paths
        );
        found.fill(None);
        if line.len() > u32::MAX as usize {
            return Err(syntax(u32::MAX as usize, "line longer than 4 GiB"));
        }
        if let Some(level) = self.fast
            && line.len() <= FAST_MAX_LINE
        {
            if let Some(backslash) =
                TOKENS.with_borrow_mut(|idx| fast::scan(self, level, line, found, idx))
            {
                return Ok(backslash);
            }
            found.fill(None);
        }
        self.scan_bytewise(line, found).map(|()| true)
    }

    /// The paths among `active` whose segment at `depth` equals the member name
    /// `s[start..end]` (raw, between the quotes; `escaped` if it holds a backslash).
    #[inline(always)]
    fn match_key(
        &self,
        depth: usize,
        s: &[u8],
        start: usize,
        end: usize,
        escaped: bool,
        active: u64,
    ) -> u64 {
        match self.levels.get(depth) {
            Some(level) => level.match_name(s, start, end, escaped, active),
            None => 0,
        }
    }
}

impl Level {
    /// The paths among `active` whose segment at this level equals the member name
    /// `s[start..end]` (raw, between the quotes; `escaped` if it holds a backslash).
    #[inline(always)]
    fn match_name(&self, s: &[u8], start: usize, end: usize, escaped: bool, active: u64) -> u64 {
        if escaped {
            return match_escaped(self, s.get(start..end).unwrap_or_default(), active);
        }
        let len = end - start;
        let mut k = self.by_len[len.min(63)];
        if k == 0 {
            return 0;
        }
        let head = head_at(s, start, len);
        let tail = if len > 8 {
            head_at(s, start + 8, len - 8)
        } else {
            0
        };
        // The names of a level are distinct: at most one matches.
        while let Some(name) = self.names.get(usize::from(k).wrapping_sub(1)) {
            if name.head == head
                && name.tail == tail
                && name.bytes.len() == len
                && (len <= 16 || same_after_16(&name.bytes, s, start, end))
            {
                return name.mask & active;
            }
            k = name.next_same_len;
        }
        0
    }
}

/// Whether the bytes of `name` past the 16th equal those of `s[start..end]` (kept out of
/// the matching loop: names that long are rare).
#[cold]
#[inline(never)]
fn same_after_16(name: &[u8], s: &[u8], start: usize, end: usize) -> bool {
    name.get(16..) == s.get(start + 16..end)
}

/// [`Extractor::match_key`] for a member name `raw` that holds escapes.
#[inline(never)]
fn match_escaped(level: &Level, raw: &[u8], active: u64) -> u64 {
    for name in &level.names {
        if name.mask & active != 0 && eq_unescaped(raw, &name.bytes) {
            return name.mask & active;
        }
    }
    0
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;
