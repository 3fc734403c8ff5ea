//! The checkpoint encoding of one key's session state: the value of a key in a base or
//! delta file (`docs/checkpoint-format.md`, "Value: one key's sessions").
//!
//! Hand-written rather than serde: the state is the bulk of a checkpoint (1M open
//! sessions restore in well under a second), its layout is documented and versioned
//! with the file format, and decoding checks every length against the bytes there are,
//! so a value never panics the restore whatever it holds.
//!
//! The command line's sessions (JSON aggregates) are encoded by [`encode_sessions`]; a
//! window over a user's own aggregate (the library's `SessionWindowJob`) uses the same
//! layout with its accumulator written by the caller ([`encode_sessions_with`]).

use crate::aggregate::AggState;
use crate::operator::WindowConfig;
use crate::session::{KeySessions, Session, SessionList};
use sessionizer_core::Watermark;

/// Why a value cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value ends before its last field.
    #[error("session state is truncated")]
    Truncated,
    /// Bytes follow the last session.
    #[error("session state has {0} bytes after its end")]
    Trailing(usize),
    /// An aggregate tag this version does not know.
    #[error("unknown aggregate kind {0} in session state")]
    AggKind(u8),
    /// The state holds another number of aggregates than the job configures.
    #[error("session state holds {found} aggregates where this job has {expected}")]
    Aggregates {
        /// The job's aggregates.
        expected: usize,
        /// The encoded ones.
        found: usize,
    },
    /// An aggregate of another kind than the job configures at that position.
    #[error("session state holds a {found} aggregate where this job has {expected}")]
    AggMismatch {
        /// The job's aggregate kind.
        expected: &'static str,
        /// The encoded kind.
        found: &'static str,
    },
    /// A flag or marker byte with a value the layout does not allow.
    #[error("invalid {what} byte {value} in session state")]
    Byte {
        /// Which field.
        what: &'static str,
        /// The byte found.
        value: u8,
    },
    /// A key is stored with zero sessions (a key without sessions has no state).
    #[error("a key with no sessions in session state")]
    Empty,
    /// A checkpoint format whose value layout this build does not know.
    #[error(
        "session state of checkpoint format {0}, which this build does not read (it reads formats 1 to {FORMAT})"
    )]
    Format(u16),
    /// A user accumulator ([`decode_sessions_with`]) could not be read: its JSON
    /// does not decode as the job's accumulator type (serde's reason).
    #[error("cannot read a session's aggregate state: {0}")]
    Accumulator(#[source] serde_json::Error),
}

/// Appends little-endian integers and length-prefixed bytes.
pub(crate) struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u128(&mut self, v: u128) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i128(&mut self, v: i128) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }
    pub fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    /// `len:u32 bytes`.
    ///
    /// # Panics
    /// If `b` exceeds 4 GiB (a single aggregate value; the collect buffer already
    /// refuses that).
    pub fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).expect("value larger than 4 GiB"));
        self.0.extend_from_slice(b);
    }
    /// A count that fits the layout's `u32`.
    pub fn count(&mut self, n: usize) {
        self.u32(u32::try_from(n).expect("more than 2^32 items"));
    }
}

/// Reads what [`Writer`] wrote, refusing to run past the end.
pub(crate) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.0.len() < n {
            return Err(CodecError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, CodecError> {
        self.array().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Result<u64, CodecError> {
        self.array().map(u64::from_le_bytes)
    }
    pub fn i64(&mut self) -> Result<i64, CodecError> {
        self.array().map(i64::from_le_bytes)
    }
    pub fn u128(&mut self) -> Result<u128, CodecError> {
        self.array().map(u128::from_le_bytes)
    }
    pub fn i128(&mut self) -> Result<i128, CodecError> {
        self.array().map(i128::from_le_bytes)
    }
    pub fn f64(&mut self) -> Result<f64, CodecError> {
        self.u64().map(f64::from_bits)
    }
    pub fn bool(&mut self, what: &'static str) -> Result<bool, CodecError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(CodecError::Byte { what, value }),
        }
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// A count of items of at least `min_size` bytes each, checked against the bytes
    /// left so that a damaged count cannot make a huge allocation.
    pub fn count(&mut self, min_size: usize) -> Result<usize, CodecError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size.max(1)) > self.0.len() {
            return Err(CodecError::Truncated);
        }
        Ok(n)
    }
}

/// The checkpoint format version (`docs/checkpoint-format.md`) whose value layout
/// [`encode_sessions`] writes and [`decode_sessions`] reads: the key's floor, then its
/// sessions. Format 1 had no floor; [`decode_value`] still reads it.
pub const FORMAT: u16 = 2;

/// Appends the checkpoint encoding of one key's state (format [`FORMAT`]): its floor,
/// then its sessions. A key usually has one or two sessions, but a long allowed
/// lateness or a large per-event gap can keep hundreds: the count is a `u32`.
pub fn encode_sessions(sessions: &KeySessions, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.i64(sessions.floor());
    w.count(sessions.session_count());
    for s in sessions.sessions() {
        s.encode(&mut w);
    }
}

/// The fewest bytes one encoded session takes (bounds, count, revision, flags).
const SESSION_MIN_BYTES: usize = 8 * 3 + 8 + 4 + 1;

/// Reads one key's state written by [`encode_sessions`] (format [`FORMAT`]) for a
/// window configured as `cfg` (its aggregates must be the ones encoded).
pub fn decode_sessions(bytes: &[u8], cfg: &WindowConfig) -> Result<KeySessions, CodecError> {
    let mut r = Reader(bytes);
    let floor = r.i64()?;
    let sessions = read_sessions(&mut r, |r| Session::decode(r, &cfg.aggregates))?;
    Ok(KeySessions::from_parts(sessions, floor))
}

/// Reads one key's value written in checkpoint format `format` (1 or [`FORMAT`]) for a
/// window configured as `cfg`. Format 1 stored no floor: the key gets the floor its
/// state implies at watermark `w`, the checkpoint's
/// ([`KeySessions::implied_floor`], docs/semantics.md S-30).
pub fn decode_value(
    bytes: &[u8],
    cfg: &WindowConfig,
    format: u16,
    w: Watermark,
) -> Result<KeySessions, CodecError> {
    match format {
        1 => {
            let sessions =
                read_sessions(&mut Reader(bytes), |r| Session::decode(r, &cfg.aggregates))?;
            let mut state = KeySessions::from_parts(sessions, i64::MIN);
            let floor =
                state.implied_floor(w.millis(), cfg.allowed_lateness.millis(), cfg.gap.millis());
            state.set_floor(floor);
            Ok(state)
        }
        FORMAT => decode_sessions(bytes, cfg),
        other => Err(CodecError::Format(other)),
    }
}

/// Reads one key's value of checkpoint format `format` without knowing the job's
/// options (`inspect`): the aggregates are taken as encoded. A format-1 value has no
/// floor: the result's is minus infinity (a resumed run derives one, see
/// [`decode_value`]).
pub fn decode_sessions_any(bytes: &[u8], format: u16) -> Result<KeySessions, CodecError> {
    let mut r = Reader(bytes);
    let floor = match format {
        1 => i64::MIN,
        FORMAT => r.i64()?,
        other => return Err(CodecError::Format(other)),
    };
    let sessions = read_sessions(&mut r, |r| {
        let kinds = peek_kinds(r.0)?;
        Session::decode(r, &kinds)
    })?;
    Ok(KeySessions::from_parts(sessions, floor))
}

/// Appends one key's state (format [`FORMAT`]) of a window whose accumulators are of
/// the caller's type: the layout of [`encode_sessions`], with each session's `aggs`
/// replaced by `len:u32 bytes[len]`, the bytes that `acc` appends (the library writes
/// the accumulator as JSON).
pub fn encode_sessions_with<Acc>(
    sessions: &KeySessions<Acc>,
    out: &mut Vec<u8>,
    acc: impl Fn(&Acc, &mut Vec<u8>),
) {
    let mut w = Writer(out);
    w.i64(sessions.floor());
    w.count(sessions.session_count());
    for s in sessions.sessions() {
        s.encode_with(&mut w, |a, w| {
            let at = w.0.len();
            w.u32(0);
            acc(a, w.0);
            let len = u32::try_from(w.0.len() - at - 4).expect("an accumulator of 4 GiB");
            w.0[at..at + 4].copy_from_slice(&len.to_le_bytes());
        });
    }
}

/// Reads one key's state written by [`encode_sessions_with`], each accumulator from its
/// bytes by `acc` (whose error, its JSON reader's, becomes [`CodecError::Accumulator`]).
pub fn decode_sessions_with<Acc>(
    bytes: &[u8],
    mut acc: impl FnMut(&[u8]) -> Result<Acc, serde_json::Error>,
) -> Result<KeySessions<Acc>, CodecError> {
    let mut r = Reader(bytes);
    let floor = r.i64()?;
    let sessions = read_sessions(&mut r, |r| {
        Session::decode_with(r, |r| {
            let len = r.u32()? as usize;
            acc(r.take(len)?).map_err(CodecError::Accumulator)
        })
    })?;
    Ok(KeySessions::from_parts(sessions, floor))
}

/// The session count and the sessions, each read by `one`; nothing may follow.
fn read_sessions<Acc>(
    r: &mut Reader<'_>,
    mut one: impl FnMut(&mut Reader<'_>) -> Result<Session<Acc>, CodecError>,
) -> Result<SessionList<Acc>, CodecError> {
    let n = r.count(SESSION_MIN_BYTES)?;
    if n == 0 {
        return Err(CodecError::Empty);
    }
    let mut sessions = SessionList::with_capacity(n);
    for _ in 0..n {
        sessions.push(one(r)?);
    }
    if !r.0.is_empty() {
        return Err(CodecError::Trailing(r.0.len()));
    }
    Ok(sessions)
}

/// The aggregate kinds of the encoded session at the start of `bytes`, found by reading
/// it once with each kind as it comes.
fn peek_kinds(bytes: &[u8]) -> Result<Vec<crate::aggregate::AggKind>, CodecError> {
    let mut r = Reader(bytes);
    r.take(8 * 3 + 8 + 4 + 1)?;
    if !r.bool("contents marker")? || !r.bool("aggregates marker")? {
        return Ok(Vec::new());
    }
    let n = r.u8()? as usize;
    let mut kinds = Vec::with_capacity(n);
    for _ in 0..n {
        let code = r.0.first().copied().ok_or(CodecError::Truncated)?;
        let kind = crate::aggregate::AggKind::from_code(code).ok_or(CodecError::AggKind(code))?;
        AggState::decode(&mut r, kind)?;
        kinds.push(kind);
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{Emit, EmitMode, Event, SessionOperator, SessionView};
    use sessionizer_core::{DurationMs, EventTime, Watermark};

    struct Discard;
    impl Emit for Discard {
        fn session(&mut self, _: &SessionView<'_>) {}
        fn retraction(&mut self, _: &[u8], _: EventTime) {}
    }

    fn at(key: &'static [u8], time: i64, seq: u64) -> Event<'static> {
        Event {
            key,
            time: EventTime(time),
            gap: DurationMs(10),
            seq,
            dedup: None,
            values: &[],
        }
    }

    /// The floor is part of a key's value (format 2); a format-1 value (the same
    /// without the floor) gets `min(W - A - G, earliest start - 1)`; an unknown format
    /// is refused by number.
    #[test]
    fn the_floor_round_trips_and_a_format_1_value_gets_the_floor_its_state_implies() {
        let cfg = WindowConfig {
            gap: DurationMs(10),
            allowed_lateness: DurationMs(5),
            emit: EmitMode::OnClose,
            aggregates: Vec::new(),
            dedup: false,
        };
        let mut op = SessionOperator::new(cfg.clone());
        // k: [0] final and forgotten at W = 25 (floor 10), then [40, 48] live.
        for (i, t) in [0i64, 40, 48].into_iter().enumerate() {
            op.on_event(&at(b"k", t, i as u64), &mut Discard);
            op.advance_to(Watermark::at(EventTime(t)), &mut Discard);
        }
        let id = op.store().find(b"k").expect("key k");
        let state = op.store().state(id);
        assert_eq!(state.floor(), 10);
        let mut bytes = Vec::new();
        encode_sessions(state, &mut bytes);
        assert_eq!(decode_sessions(&bytes, &cfg).expect("decodes").floor(), 10);
        let w = Watermark::at(EventTime(60));
        assert_eq!(
            decode_value(&bytes, &cfg, FORMAT, w)
                .expect("decodes")
                .floor(),
            10
        );
        assert_eq!(
            decode_sessions_any(&bytes, FORMAT)
                .expect("decodes")
                .floor(),
            10
        );

        let format_1 = &bytes[8..];
        let old = decode_value(format_1, &cfg, 1, w).expect("format 1 decodes");
        assert_eq!(old.session_count(), 1);
        // W - A - G = 60 - 5 - 10 = 45; the earliest start - 1 = 39.
        assert_eq!(old.floor(), 39);
        let early = decode_value(format_1, &cfg, 1, Watermark::at(EventTime(50))).expect("decodes");
        assert_eq!(early.floor(), 35, "W - A - G = 50 - 5 - 10");
        let none = decode_value(format_1, &cfg, 1, Watermark::MIN).expect("decodes");
        assert_eq!(none.floor(), i64::MIN, "minus infinity while W is");
        assert_eq!(
            decode_sessions_any(format_1, 1).expect("decodes").floor(),
            i64::MIN
        );
        assert!(matches!(
            decode_value(&bytes, &cfg, 3, w).map(|s| s.floor()),
            Err(CodecError::Format(3))
        ));
        assert!(
            CodecError::Format(3).to_string().contains("formats 1 to 2"),
            "{}",
            CodecError::Format(3)
        );
    }

    /// A long allowed lateness keeps hundreds of sessions of one key: they all go
    /// through the codec (a one-byte count once made checkpointing panic here).
    #[test]
    fn a_key_with_hundreds_of_sessions_round_trips() {
        let cfg = WindowConfig {
            gap: DurationMs(1),
            allowed_lateness: DurationMs(86_400_000),
            emit: EmitMode::OnClose,
            aggregates: Vec::new(),
            dedup: false,
        };
        let mut op = SessionOperator::new(cfg.clone());
        for i in 0..300i64 {
            let ev = Event {
                key: b"k",
                time: EventTime(i * 10),
                gap: DurationMs(1),
                seq: i as u64,
                dedup: None,
                values: &[],
            };
            op.on_event(&ev, &mut Discard);
            op.advance_to(Watermark::at(EventTime(i * 10)), &mut Discard);
        }
        let id = op.store().find(b"k").expect("key k");
        let sessions = op.store().state(id);
        assert_eq!(sessions.session_count(), 300);
        let mut bytes = Vec::new();
        encode_sessions(sessions, &mut bytes);
        let back = decode_sessions(&bytes, &cfg).expect("decodes");
        assert_eq!(back.session_count(), 300);
        let starts: Vec<i64> = back.sessions().map(|s| s.start()).collect();
        let expected: Vec<i64> = sessions.sessions().map(|s| s.start()).collect();
        assert_eq!(starts, expected);
    }
}
