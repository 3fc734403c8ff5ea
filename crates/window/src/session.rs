//! One key's sessions and the rules for joining and merging them (SPEC §2).
//!
//! An event at `t` with gap `g` covers `[t, t + g]`; a session covers `[start, close]`
//! where `close = max(t_i + g_i)`. The event *touches* a session when the two intervals
//! intersect (inclusive) — with one gap `G` for all this is `start - G <= t <= last + G`.

use crate::aggregate::{AggKind, AggState};
use smallvec::SmallVec;

type FastSet<T> = hashbrown::HashSet<T, foldhash::fast::FixedState>;

/// The deterministic id of the session of `key` starting at `start` (SPEC §3): xxh3-64 of
/// the key bytes followed by `start` as little-endian `i64`.
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
#[derive(Debug)]
pub struct Session {
    pub(crate) start: i64,
    pub(crate) last: i64,
    pub(crate) close: i64,
    pub(crate) count: u64,
    pub(crate) next_revision: u32,
    flags: u8,
    contents: Option<Box<Contents>>,
}

/// What only some jobs keep: aggregates and the dedup set.
#[derive(Debug, Default)]
struct Contents {
    aggregates: Vec<AggState>,
    seen: FastSet<u128>,
}

/// What a new event brings to a session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival<'a> {
    pub time: i64,
    pub end: i64,
    pub seq: u64,
    pub dedup: Option<u128>,
    pub values: &'a [Option<&'a [u8]>],
}

impl Session {
    pub(crate) fn new(ev: &Arrival<'_>, kinds: &[AggKind], keep_dedup: bool) -> Session {
        let contents = (!kinds.is_empty() || keep_dedup).then(|| {
            Box::new(Contents {
                aggregates: kinds.iter().map(|&k| AggState::new(k)).collect(),
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
        s.absorb_event(ev);
        s
    }

    pub fn start(&self) -> i64 {
        self.start
    }

    pub fn last(&self) -> i64 {
        self.last
    }

    pub fn close(&self) -> i64 {
        self.close
    }

    pub fn event_count(&self) -> u64 {
        self.count
    }

    pub fn is_final(&self) -> bool {
        self.flags & FINAL != 0
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

    pub(crate) fn has_seen(&self, dedup: u128) -> bool {
        self.contents
            .as_ref()
            .is_some_and(|c| c.seen.contains(&dedup))
    }

    pub fn aggregates(&self) -> &[AggState] {
        self.contents.as_ref().map_or(&[], |c| &c.aggregates)
    }

    /// Adds an event that touches this session.
    pub(crate) fn absorb_event(&mut self, ev: &Arrival<'_>) {
        self.start = self.start.min(ev.time);
        self.last = self.last.max(ev.time);
        self.close = self.close.max(ev.end);
        self.count += 1;
        self.flags |= DIRTY;
        if let Some(c) = &mut self.contents {
            for (agg, value) in c.aggregates.iter_mut().zip(ev.values) {
                if let Some(raw) = value {
                    agg.add(ev.time, ev.seq, raw);
                }
            }
            if let Some(h) = ev.dedup {
                c.seen.insert(h);
            }
        }
    }

    /// Folds `other` (a session of the same key that an event bridged to this one) in.
    /// The emitted mark is settled by the caller, who knows the merged session's start.
    pub(crate) fn absorb_session(&mut self, other: Session) {
        self.start = self.start.min(other.start);
        self.last = self.last.max(other.last);
        self.close = self.close.max(other.close);
        self.count += other.count;
        self.next_revision = self.next_revision.max(other.next_revision);
        self.flags |= DIRTY;
        if let (Some(mine), Some(theirs)) = (&mut self.contents, other.contents) {
            let theirs = *theirs;
            for (a, b) in mine.aggregates.iter_mut().zip(theirs.aggregates) {
                a.merge(b);
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

    /// Approximate heap bytes held by this session.
    pub fn heap_bytes(&self) -> usize {
        self.contents.as_ref().map_or(0, |c| {
            std::mem::size_of::<Contents>()
                + c.aggregates.capacity() * std::mem::size_of::<AggState>()
                + c.aggregates.iter().map(AggState::heap_bytes).sum::<usize>()
                + c.seen.capacity() * 17
        })
    }
}

/// All sessions of one key, live and final. Usually one.
#[derive(Debug, Default)]
pub struct KeySessions {
    pub(crate) sessions: SmallVec<[Session; 1]>,
}

impl KeySessions {
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    pub(crate) fn position_of(&self, start: i64) -> Option<usize> {
        self.sessions
            .iter()
            .position(|s| s.start == start && !s.is_final())
    }
}
