//! One key's sessions and the rules for joining and merging them (docs/semantics.md S-1
//! to S-3).
//!
//! An event at `t` with gap `g` covers `[t, t + g]`; a session covers `[start, close]`
//! where `close = max(t_i + g_i)`. The event *touches* a session when the two intervals
//! intersect (inclusive) — with one gap `G` for all this is `start - G <= t <= last + G`.

use crate::aggregate::{AggKind, AggState, Position, SessionAggregate};
use crate::codec::{CodecError, Reader, Writer};
use sessionizer_core::EventTime;
use smallvec::SmallVec;
use std::fmt;

mod key_sessions;
#[cfg(test)]
mod tests;

pub use key_sessions::{KeySessions, Sessions};

type FastSet<T> = hashbrown::HashSet<T, foldhash::fast::FixedState>;

/// The deterministic id of the session of `key` starting at `start` (docs/semantics.md
/// S-16): xxh3-64 of the key bytes followed by `start` as little-endian `i64`.
///
/// ```
/// let a = sessionizer_window::session_id(b"v1", 1_704_067_200_000);
/// assert_eq!(a, sessionizer_window::session_id(b"v1", 1_704_067_200_000));
/// assert_ne!(a, sessionizer_window::session_id(b"v1", 1_704_067_200_001));
/// ```
pub fn session_id(key: &[u8], start: i64) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(key);
    h.update(&start.to_le_bytes());
    h.digest()
}

const EMITTED: u8 = 1;
const DIRTY: u8 = 2;
const FINAL: u8 = 4;

/// A session of one key: live (open, or complete and kept for lateness) or final (only
/// its bounds remembered, so that late events cannot join it).
///
/// `Acc` is the accumulator of the window's [`SessionAggregate`]; the CLI's is the list
/// of JSON aggregate states.
pub struct Session<Acc = Vec<AggState>> {
    pub(crate) start: i64,
    pub(crate) last: i64,
    pub(crate) close: i64,
    pub(crate) count: u64,
    pub(crate) next_revision: u32,
    flags: u8,
    /// Boxed and optional so that a session without aggregates or dedup is small and
    /// costs no allocation.
    contents: Option<Box<Contents<Acc>>>,
}

impl<Acc> fmt::Debug for Session<Acc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("start", &self.start)
            .field("last", &self.last)
            .field("close", &self.close)
            .field("count", &self.count)
            .field("next_revision", &self.next_revision)
            .field("flags", &self.flags)
            .field("has_contents", &self.contents.is_some())
            .finish()
    }
}

/// What only some jobs keep: the aggregate accumulator and the dedup set.
struct Contents<Acc> {
    acc: Option<Acc>,
    seen: FastSet<u128>,
}

/// What a new event brings to a session; `input` is what the aggregate adds.
pub(crate) struct Arrival<'a, I: ?Sized> {
    pub time: i64,
    pub end: i64,
    pub seq: u64,
    pub dedup: Option<u128>,
    pub input: &'a I,
}

impl<'a, I: ?Sized> Arrival<'a, I> {
    fn position(&self) -> Position {
        Position {
            time: EventTime(self.time),
            seq: self.seq,
        }
    }
}

impl<Acc> Session<Acc> {
    pub(crate) fn new<A, I>(ev: &Arrival<'_, I>, agg: &A, keep_dedup: bool) -> Session<Acc>
    where
        A: crate::aggregate::Accumulate<I, Acc = Acc>,
        I: ?Sized,
    {
        let acc = agg.create();
        let contents = (acc.is_some() || keep_dedup).then(|| {
            Box::new(Contents {
                acc,
                seen: FastSet::default(),
            })
        });
        let mut s = Session {
            start: ev.time,
            last: ev.time,
            close: ev.end,
            count: 0,
            next_revision: 0,
            flags: DIRTY,
            contents,
        };
        s.absorb_event(ev, agg);
        s
    }

    /// The earliest event time (ms).
    pub fn start(&self) -> i64 {
        self.start
    }

    /// The latest event time (ms).
    pub fn last(&self) -> i64 {
        self.last
    }

    /// When the session completes: the largest `t + gap` (ms).
    pub fn close(&self) -> i64 {
        self.close
    }

    /// Events applied.
    pub fn event_count(&self) -> u64 {
        self.count
    }

    /// Whether only the bounds are left (past the allowed lateness).
    pub fn is_final(&self) -> bool {
        self.flags & FINAL != 0
    }

    /// Whether the session was emitted (and not changed into another id since).
    pub fn emitted(&self) -> bool {
        self.was_emitted()
    }

    /// The revision its next record will carry.
    pub fn next_revision(&self) -> u32 {
        self.next_revision
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.flags & DIRTY != 0
    }

    pub(crate) fn was_emitted(&self) -> bool {
        self.flags & EMITTED != 0
    }

    pub(crate) fn touches(&self, time: i64, end: i64) -> bool {
        time <= self.close && self.start <= end
    }

    /// The accumulator of the session's aggregate, if it keeps one.
    pub fn acc(&self) -> Option<&Acc> {
        self.contents.as_ref().and_then(|c| c.acc.as_ref())
    }

    /// Adds an event that touches this session.
    #[inline]
    pub(crate) fn absorb_event<A, I>(&mut self, ev: &Arrival<'_, I>, agg: &A)
    where
        A: crate::aggregate::Accumulate<I, Acc = Acc>,
        I: ?Sized,
    {
        self.start = self.start.min(ev.time);
        self.last = self.last.max(ev.time);
        self.close = self.close.max(ev.end);
        self.count += 1;
        self.flags |= DIRTY;
        if let Some(c) = &mut self.contents {
            if let Some(acc) = &mut c.acc {
                agg.add(acc, ev.position(), ev.input);
            }
            if let Some(h) = ev.dedup {
                c.seen.insert(h);
            }
        }
    }

    /// Folds `other` (a session of the same key that an event bridged to this one) in.
    /// The emitted mark is settled by the caller, who knows the merged session's start.
    pub(crate) fn absorb_session<A>(&mut self, other: Session<Acc>, agg: &A)
    where
        A: SessionAggregate<Acc = Acc>,
    {
        self.start = self.start.min(other.start);
        self.last = self.last.max(other.last);
        self.close = self.close.max(other.close);
        self.count += other.count;
        self.next_revision = self.next_revision.max(other.next_revision);
        self.flags |= DIRTY;
        if let (Some(mine), Some(theirs)) = (&mut self.contents, other.contents) {
            let theirs = *theirs;
            match (&mut mine.acc, theirs.acc) {
                (Some(a), Some(b)) => agg.merge(a, b),
                (None, b) => mine.acc = b,
                (Some(_), None) => {}
            }
            mine.seen.extend(theirs.seen);
        }
    }

    pub(crate) fn set_emitted(&mut self, emitted: bool) {
        if emitted {
            self.flags |= EMITTED;
        } else {
            self.flags &= !EMITTED;
        }
    }

    /// Marks a record as emitted; returns its revision.
    pub(crate) fn take_revision(&mut self, completes: bool) -> u32 {
        let rev = self.next_revision;
        self.next_revision = self.next_revision.saturating_add(1);
        self.flags |= EMITTED;
        if completes {
            self.flags &= !DIRTY;
        }
        rev
    }

    /// Drops the contents and keeps the bounds.
    pub(crate) fn finalize(&mut self) {
        self.flags = (self.flags | FINAL) & !DIRTY;
        self.contents = None;
    }

    /// Approximate heap bytes held by this session, `agg` being its window's aggregate.
    pub fn heap_bytes<A: SessionAggregate<Acc = Acc>>(&self, agg: &A) -> usize {
        self.contents.as_ref().map_or(0, |c| {
            std::mem::size_of::<Contents<Acc>>()
                + c.acc.as_ref().map_or(0, |a| agg.heap_bytes(a))
                + c.seen.capacity() * 17
        })
    }
}

impl Session<Vec<AggState>> {
    /// The JSON aggregate states (empty when none are configured).
    pub fn aggregates(&self) -> &[AggState] {
        self.acc().map_or(&[], Vec::as_slice)
    }

    /// Reads a session written by [`SessionRef::encode`]; its aggregates must be
    /// `kinds`, in order.
    pub(crate) fn decode(r: &mut Reader<'_>, kinds: &[AggKind]) -> Result<Self, CodecError> {
        Session::decode_with(r, |r| {
            let n = r.u8()? as usize;
            if n != kinds.len() {
                return Err(CodecError::Aggregates {
                    expected: kinds.len(),
                    found: n,
                });
            }
            let mut aggs = Vec::with_capacity(n);
            for &kind in kinds {
                aggs.push(AggState::decode(r, kind)?);
            }
            Ok(aggs)
        })
    }
}

impl<Acc> Session<Acc> {
    /// Reads a session written by [`SessionRef::encode_with`], its accumulator by `acc`.
    pub(crate) fn decode_with(
        r: &mut Reader<'_>,
        mut acc: impl FnMut(&mut Reader<'_>) -> Result<Acc, CodecError>,
    ) -> Result<Self, CodecError> {
        let (start, last, close) = (r.i64()?, r.i64()?, r.i64()?);
        let count = r.u64()?;
        let next_revision = r.u32()?;
        let flags = r.u8()?;
        if flags & !(EMITTED | DIRTY | FINAL) != 0 {
            return Err(CodecError::Byte {
                what: "session flags",
                value: flags,
            });
        }
        let contents = if r.bool("contents marker")? {
            let acc = if r.bool("aggregates marker")? {
                Some(acc(r)?)
            } else {
                None
            };
            let n = r.count(16)?;
            let mut seen = FastSet::with_capacity_and_hasher(n, Default::default());
            for _ in 0..n {
                seen.insert(r.u128()?);
            }
            Some(Box::new(Contents { acc, seen }))
        } else {
            None
        };
        Ok(Session {
            start,
            last,
            close,
            count,
            next_revision,
            flags,
            contents,
        })
    }
}

impl<Acc> Session<Acc> {
    /// A read-only view of this session.
    pub fn as_ref(&self) -> SessionRef<'_, Acc> {
        SessionRef {
            start: self.start,
            last: self.last,
            close: self.close,
            count: self.count,
            next_revision: self.next_revision,
            flags: self.flags,
            contents: self.contents.as_deref(),
        }
    }
}

/// One session of a key as stored, read-only: the bounds, counts and flags, and the
/// aggregate and dedup contents if it keeps any.
pub struct SessionRef<'a, Acc = Vec<AggState>> {
    start: i64,
    last: i64,
    close: i64,
    count: u64,
    next_revision: u32,
    flags: u8,
    contents: Option<&'a Contents<Acc>>,
}

impl<Acc> Clone for SessionRef<'_, Acc> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Acc> Copy for SessionRef<'_, Acc> {}

impl<Acc> fmt::Debug for SessionRef<'_, Acc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionRef")
            .field("start", &self.start)
            .field("last", &self.last)
            .field("close", &self.close)
            .field("count", &self.count)
            .field("next_revision", &self.next_revision)
            .field("flags", &self.flags)
            .field("has_contents", &self.contents.is_some())
            .finish()
    }
}

impl<'a, Acc> SessionRef<'a, Acc> {
    /// The earliest event time (ms).
    pub fn start(&self) -> i64 {
        self.start
    }

    /// The latest event time (ms).
    pub fn last(&self) -> i64 {
        self.last
    }

    /// When the session completes: the largest `t + gap` (ms).
    pub fn close(&self) -> i64 {
        self.close
    }

    /// Events applied.
    pub fn event_count(&self) -> u64 {
        self.count
    }

    /// Whether only the bounds are left (past the allowed lateness).
    pub fn is_final(&self) -> bool {
        self.flags & FINAL != 0
    }

    /// Whether the session was emitted (and not changed into another id since).
    pub fn emitted(&self) -> bool {
        self.flags & EMITTED != 0
    }

    /// The revision its next record will carry.
    pub fn next_revision(&self) -> u32 {
        self.next_revision
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.flags & DIRTY != 0
    }

    pub(crate) fn touches(&self, time: i64, end: i64) -> bool {
        time <= self.close && self.start <= end
    }

    pub(crate) fn has_seen(&self, dedup: u128) -> bool {
        self.contents.is_some_and(|c| c.seen.contains(&dedup))
    }

    /// The accumulator of the session's aggregate, if it keeps one.
    pub fn acc(&self) -> Option<&'a Acc> {
        self.contents.and_then(|c| c.acc.as_ref())
    }
}

impl<'a> SessionRef<'a, Vec<AggState>> {
    /// The JSON aggregate states (empty when none are configured).
    pub fn aggregates(&self) -> &'a [AggState] {
        self.acc().map_or(&[], Vec::as_slice)
    }

    /// Appends the checkpoint encoding of this session (`docs/checkpoint-format.md`).
    pub(crate) fn encode(&self, w: &mut Writer<'_>) {
        self.encode_with(w, |aggs, w| {
            w.u8(u8::try_from(aggs.len()).expect("at most 255 aggregates"));
            for a in aggs {
                a.encode(w);
            }
        });
    }
}

impl<Acc> SessionRef<'_, Acc> {
    /// Appends the checkpoint encoding of this session, its accumulator written by
    /// `acc`.
    pub(crate) fn encode_with(&self, w: &mut Writer<'_>, acc: impl Fn(&Acc, &mut Writer<'_>)) {
        w.i64(self.start);
        w.i64(self.last);
        w.i64(self.close);
        w.u64(self.count);
        w.u32(self.next_revision);
        w.u8(self.flags);
        match self.contents {
            None => w.bool(false),
            Some(c) => {
                w.bool(true);
                match &c.acc {
                    None => w.bool(false),
                    Some(a) => {
                        w.bool(true);
                        acc(a, w);
                    }
                }
                w.count(c.seen.len());
                for &h in &c.seen {
                    w.u128(h);
                }
            }
        }
    }
}

/// A key's sessions while being changed: usually one, rarely more.
pub(crate) type SessionList<Acc> = SmallVec<[Session<Acc>; 1]>;
