//! All sessions of one key ([`KeySessions`]) in 32 bytes: one session without
//! contents inline, with its bounds as 32-bit offsets from its start, anything else in
//! a box; and the edits the operator makes to them.

use super::{DIRTY, EMITTED, FINAL, Session, SessionList, SessionRef};
use crate::aggregate::{AggState, SessionAggregate};
use crate::keyed::NO_TIMER;
use std::fmt;

/// The session flags of a compact state: `EMITTED | DIRTY | FINAL` bits. An enum so
/// that the byte has values to spare, in which [`Repr`] keeps its own tag: the state of
/// a key is 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Flags {
    F0 = 0,
    F1 = 1,
    F2 = 2,
    F3 = 3,
    F4 = 4,
    F5 = 5,
    F6 = 6,
    F7 = 7,
}

impl Flags {
    fn of(bits: u8) -> Flags {
        match bits & 7 {
            0 => Flags::F0,
            1 => Flags::F1,
            2 => Flags::F2,
            3 => Flags::F3,
            4 => Flags::F4,
            5 => Flags::F5,
            6 => Flags::F6,
            _ => Flags::F7,
        }
    }
}

/// One session without contents, within 32 bits of its start: the state of most keys
/// of a job without aggregates or dedup.
#[derive(Debug, Clone, Copy)]
struct Compact {
    start: i64,
    /// `last - start`.
    last_off: u32,
    /// `close - start`.
    close_off: u32,
    /// `start - floor`, 0 for a floor of minus infinity.
    floor_off: u32,
    /// `timer - start`, `u32::MAX` for no timer.
    timer_off: u32,
    count: u32,
    next_revision: u16,
    flags: Flags,
}

/// Offsets that fit a [`Compact`] field.
fn off(from: i64, to: i64) -> Option<u32> {
    u32::try_from(to.checked_sub(from)?).ok()
}

impl Compact {
    /// The compact form of `s` with `floor` and `timer`, if every field fits.
    fn of<Acc>(s: &Session<Acc>, floor: i64, timer: i64) -> Option<Compact> {
        if s.contents.is_some() {
            return None;
        }
        let floor_off = if floor == i64::MIN {
            0
        } else {
            off(floor, s.start).filter(|&o| o != 0)?
        };
        let timer_off = if timer == NO_TIMER {
            u32::MAX
        } else {
            off(s.start, timer).filter(|&o| o != u32::MAX)?
        };
        Some(Compact {
            start: s.start,
            last_off: off(s.start, s.last)?,
            close_off: off(s.start, s.close)?,
            floor_off,
            timer_off,
            count: u32::try_from(s.count).ok()?,
            next_revision: u16::try_from(s.next_revision).ok()?,
            flags: Flags::of(s.flags),
        })
    }

    fn last(&self) -> i64 {
        self.start + i64::from(self.last_off)
    }

    fn close(&self) -> i64 {
        self.start + i64::from(self.close_off)
    }

    fn floor(&self) -> i64 {
        if self.floor_off == 0 {
            i64::MIN
        } else {
            self.start - i64::from(self.floor_off)
        }
    }

    fn timer(&self) -> i64 {
        if self.timer_off == u32::MAX {
            NO_TIMER
        } else {
            self.start + i64::from(self.timer_off)
        }
    }

    fn session<Acc>(&self) -> Session<Acc> {
        Session {
            start: self.start,
            last: self.last(),
            close: self.close(),
            count: u64::from(self.count),
            next_revision: u32::from(self.next_revision),
            flags: self.flags as u8,
            contents: None,
        }
    }

    fn as_ref<'a, Acc>(&self) -> SessionRef<'a, Acc> {
        SessionRef {
            start: self.start,
            last: self.last(),
            close: self.close(),
            count: u64::from(self.count),
            next_revision: u32::from(self.next_revision),
            flags: self.flags as u8,
            contents: None,
        }
    }
}

/// Everything else: any number of sessions, with contents, full-width fields.
struct Wide<Acc> {
    sessions: SessionList<Acc>,
    floor: i64,
    timer: i64,
}

enum Repr<Acc> {
    /// No session (a new key, or a slot without a key).
    Empty {
        floor: i64,
        timer: i64,
    },
    One(Compact),
    Many(Box<Wide<Acc>>),
}

/// All sessions of one key, live and final (usually one), the key's floor and its live
/// timer, in 32 bytes: one session without aggregates is stored inline with its bounds
/// as 32-bit offsets from its start; anything else (more sessions, aggregates, dedup,
/// a session longer than 49 days) in a box.
pub struct KeySessions<Acc = Vec<AggState>> {
    repr: Repr<Acc>,
}

const _: () = assert!(std::mem::size_of::<KeySessions>() == 32);

impl<Acc> Default for KeySessions<Acc> {
    fn default() -> Self {
        KeySessions {
            repr: Repr::Empty {
                floor: i64::MIN,
                timer: NO_TIMER,
            },
        }
    }
}

impl<Acc> fmt::Debug for KeySessions<Acc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySessions")
            .field("sessions", &self.sessions().collect::<Vec<_>>())
            .field("floor", &self.floor())
            .finish()
    }
}

impl<Acc> crate::keyed::Timed for KeySessions<Acc> {
    #[inline]
    fn timer(&self) -> i64 {
        match &self.repr {
            Repr::Empty { timer, .. } => *timer,
            Repr::One(c) => c.timer(),
            Repr::Many(w) => w.timer,
        }
    }

    #[inline]
    fn set_timer(&mut self, deadline: i64) {
        match &mut self.repr {
            Repr::Empty { timer, .. } => *timer = deadline,
            Repr::One(c) => {
                let fits = if deadline == NO_TIMER {
                    Some(u32::MAX)
                } else {
                    off(c.start, deadline).filter(|&o| o != u32::MAX)
                };
                match fits {
                    Some(o) => c.timer_off = o,
                    None => self.edit_with_timer(deadline, |_, _| ()),
                }
            }
            Repr::Many(w) => w.timer = deadline,
        }
    }

    /// The earliest close of the key's sessions: the operator acts on a key no sooner
    /// than a session completes (at its close), becomes final (its close plus the
    /// allowed lateness) or is forgotten (later still).
    #[inline]
    fn next_action(&self) -> i64 {
        match &self.repr {
            Repr::Empty { timer, .. } => *timer,
            Repr::One(c) => c.close(),
            Repr::Many(w) => w.sessions.iter().map(|s| s.close).min().unwrap_or(w.timer),
        }
    }
}

/// The sessions of a key, each as a [`SessionRef`].
#[derive(Debug)]
pub struct Sessions<'a, Acc> {
    one: Option<SessionRef<'a, Acc>>,
    many: std::slice::Iter<'a, Session<Acc>>,
}

impl<'a, Acc> Iterator for Sessions<'a, Acc> {
    type Item = SessionRef<'a, Acc>;

    #[inline]
    fn next(&mut self) -> Option<SessionRef<'a, Acc>> {
        match self.one.take() {
            Some(s) => Some(s),
            None => self.many.next().map(Session::as_ref),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.one.is_some()) + self.many.len();
        (n, Some(n))
    }
}

impl<Acc> ExactSizeIterator for Sessions<'_, Acc> {}

impl<Acc> KeySessions<Acc> {
    /// A key's state from its sessions (in no particular order) and its floor.
    pub(crate) fn from_parts(sessions: SessionList<Acc>, floor: i64) -> KeySessions<Acc> {
        KeySessions {
            repr: pack(sessions, floor, NO_TIMER),
        }
    }

    /// The key's sessions, live and final, in no particular order.
    #[inline]
    pub fn sessions(&self) -> Sessions<'_, Acc> {
        match &self.repr {
            Repr::Empty { .. } => Sessions {
                one: None,
                many: [].iter(),
            },
            Repr::One(c) => Sessions {
                one: Some(c.as_ref()),
                many: [].iter(),
            },
            Repr::Many(w) => Sessions {
                one: None,
                many: w.sessions.iter(),
            },
        }
    }

    /// How many sessions the key has.
    pub fn session_count(&self) -> usize {
        match &self.repr {
            Repr::Empty { .. } => 0,
            Repr::One(_) => 1,
            Repr::Many(w) => w.sessions.len(),
        }
    }

    /// The key's floor (ms, `i64::MIN` for minus infinity): every session of the key
    /// whose bounds were forgotten closed at or before it, so an event at or before it
    /// is too late (`session_final`). See docs/semantics.md S-30.
    #[inline]
    pub fn floor(&self) -> i64 {
        match &self.repr {
            Repr::Empty { floor, .. } => *floor,
            Repr::One(c) => c.floor(),
            Repr::Many(w) => w.floor,
        }
    }

    /// Sets the key's floor.
    pub(crate) fn set_floor(&mut self, floor: i64) {
        self.edit(|_, f| *f = floor);
    }

    /// Approximate heap bytes held by the key's sessions beyond the state's own 32
    /// bytes, `agg` being the window's aggregate (a spill store's memory budget).
    pub fn heap_bytes<A: SessionAggregate<Acc = Acc>>(&self, agg: &A) -> usize {
        match &self.repr {
            Repr::Empty { .. } | Repr::One(_) => 0,
            Repr::Many(w) => {
                std::mem::size_of::<Wide<Acc>>()
                    + if w.sessions.spilled() {
                        w.sessions.capacity() * std::mem::size_of::<Session<Acc>>()
                    } else {
                        0
                    }
                    + w.sessions.iter().map(|s| s.heap_bytes(agg)).sum::<usize>()
            }
        }
    }

    /// Whether the state is stored inline (one session without contents).
    pub fn is_compact(&self) -> bool {
        !matches!(self.repr, Repr::Many(_))
    }

    /// The floor a checkpoint of format 1 (which stored none) implies for this state,
    /// at watermark `w` with allowed lateness `lateness` and default gap `gap` (ms):
    /// `min(W - A - G, earliest start - 1)`. Every session forgotten before closed at or
    /// before `W - A - Gmax <= W - A - G` when it was forgotten, and before the start of
    /// every session still here unless one of them already touches it (a pair closer
    /// than the gap made before the floor existed, which an event joining that session
    /// does not worsen). See docs/semantics.md S-30.
    pub fn implied_floor(&self, w: i64, lateness: i64, gap: i64) -> i64 {
        let by_watermark = w.saturating_sub(lateness).saturating_sub(gap);
        let by_start = self
            .sessions()
            .map(|s| s.start.saturating_sub(1))
            .min()
            .unwrap_or(i64::MAX);
        by_watermark.min(by_start)
    }

    /// The live (not final) session starting at `start`.
    pub(crate) fn live_at(&self, start: i64) -> Option<SessionRef<'_, Acc>> {
        self.sessions().find(|s| s.start == start && !s.is_final())
    }

    /// Marks a record of the live session starting at `start` as emitted; returns its
    /// revision and the session, or `None` when there is no such session.
    pub(crate) fn take_revision(
        &mut self,
        start: i64,
        completes: bool,
    ) -> Option<(u32, SessionRef<'_, Acc>)> {
        if let Repr::One(c) = &mut self.repr
            && c.start == start
            && c.flags as u8 & FINAL == 0
            && c.next_revision < u16::MAX
        {
            let rev = c.next_revision;
            c.next_revision += 1;
            let mut flags = c.flags as u8 | EMITTED;
            if completes {
                flags &= !DIRTY;
            }
            c.flags = Flags::of(flags);
            return Some((u32::from(rev), c.as_ref()));
        }
        if let Repr::One(c) = &self.repr {
            if c.start != start || c.flags as u8 & FINAL != 0 {
                return None;
            }
            // A revision past the compact range: as a list.
            self.unpack();
        }
        match &mut self.repr {
            Repr::Many(w) => {
                let s = w
                    .sessions
                    .iter_mut()
                    .find(|s| s.start == start && !s.is_final())?;
                let rev = s.take_revision(completes);
                Some((rev, s.as_ref()))
            }
            _ => None,
        }
    }

    /// The single live session extended by an event that touches it without moving its
    /// start, in place: `Some((start, close))`, or `None` when the state is not that
    /// simple (the caller then edits the list).
    #[inline]
    pub(crate) fn extend_one(&mut self, time: i64, end: i64) -> Option<(i64, i64)> {
        let Repr::One(c) = &mut self.repr else {
            return None;
        };
        let close = c.close();
        if c.flags as u8 & FINAL != 0 || time < c.start || time > close {
            return None;
        }
        let last_off = off(c.start, time.max(c.last()))?;
        let close_off = off(c.start, end.max(close))?;
        let count = c.count.checked_add(1)?;
        c.last_off = last_off;
        c.close_off = close_off;
        c.count = count;
        c.flags = Flags::of(c.flags as u8 | DIRTY);
        Some((c.start, c.start + i64::from(close_off)))
    }

    /// The first session of a key without any: `Some` when stored (the key had none),
    /// `None` (and `session` dropped) when the key has sessions.
    #[inline]
    pub(crate) fn start_first(&mut self, session: Session<Acc>) -> bool {
        let Repr::Empty { floor, timer } = self.repr else {
            return false;
        };
        self.repr = match Compact::of(&session, floor, timer) {
            Some(c) => Repr::One(c),
            None => {
                let mut sessions = SessionList::new();
                sessions.push(session);
                Repr::Many(Box::new(Wide {
                    sessions,
                    floor,
                    timer,
                }))
            }
        };
        true
    }

    /// Whether the key has no session.
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.repr, Repr::Empty { .. })
    }

    /// What [`SessionOperator`](crate::SessionOperator) does to a key once its due
    /// sessions are out, in place for a single compact session: finalizes it once the
    /// watermark `w` passed its close plus `lateness`, forgets its bounds once it passed
    /// `retention` more (the key then has nothing left); a changed session is due
    /// `delay` after its close. Returns the key's next deadline, whether a session
    /// became final, and whether nothing is left; `None` when the state is not a single
    /// compact session.
    #[inline]
    pub(crate) fn retire_one(
        &mut self,
        w: i64,
        lateness: i64,
        retention: i64,
        delay: i64,
    ) -> Option<(i64, bool, bool)> {
        let Repr::One(c) = &mut self.repr else {
            return None;
        };
        let close = c.close();
        let mut flags = c.flags as u8;
        let mut finalized = false;
        if flags & FINAL == 0 && w >= close.saturating_add(lateness) {
            flags = (flags | FINAL) & !DIRTY;
            finalized = true;
        }
        c.flags = Flags::of(flags);
        let next = if flags & FINAL != 0 {
            let forget_at = close.saturating_add(retention);
            if w >= forget_at {
                let floor = c.floor().max(close);
                let timer = c.timer();
                self.repr = Repr::Empty { floor, timer };
                return Some((i64::MAX, finalized, true));
            }
            forget_at
        } else if flags & DIRTY != 0 {
            close.saturating_add(delay)
        } else {
            close.saturating_add(lateness)
        };
        Some((next, finalized, false))
    }

    /// Changes the sessions and the floor as a list, then stores them back in the
    /// smallest form that holds them.
    #[inline]
    pub(crate) fn edit<R>(&mut self, f: impl FnOnce(&mut SessionList<Acc>, &mut i64) -> R) -> R {
        let timer = crate::keyed::Timed::timer(self);
        self.edit_with_timer(timer, f)
    }

    fn edit_with_timer<R>(
        &mut self,
        timer: i64,
        f: impl FnOnce(&mut SessionList<Acc>, &mut i64) -> R,
    ) -> R {
        if let Repr::Many(w) = &mut self.repr {
            w.timer = timer;
            let r = f(&mut w.sessions, &mut w.floor);
            if w.sessions.len() <= 1 && w.sessions.iter().all(|s| s.contents.is_none()) {
                let w = std::mem::replace(&mut self.repr, Repr::Empty { floor: 0, timer: 0 });
                let Repr::Many(w) = w else { unreachable!() };
                let Wide {
                    sessions,
                    floor,
                    timer,
                } = *w;
                self.repr = pack(sessions, floor, timer);
            }
            return r;
        }
        let (mut sessions, mut floor) = self.take_list();
        let r = f(&mut sessions, &mut floor);
        self.repr = pack(sessions, floor, timer);
        r
    }

    /// Stores the state as a list (in a box), whatever it holds.
    fn unpack(&mut self) {
        if let Repr::Many(_) = self.repr {
            return;
        }
        let timer = crate::keyed::Timed::timer(self);
        let (sessions, floor) = self.take_list();
        self.repr = Repr::Many(Box::new(Wide {
            sessions,
            floor,
            timer,
        }));
    }

    /// The sessions and floor of an `Empty` or `One` state as a list (the state is left
    /// empty).
    fn take_list(&mut self) -> (SessionList<Acc>, i64) {
        let mut sessions = SessionList::new();
        let floor = self.floor();
        if let Repr::One(c) = &self.repr {
            sessions.push(c.session());
        }
        self.repr = Repr::Empty {
            floor,
            timer: NO_TIMER,
        };
        (sessions, floor)
    }
}

/// The smallest form that holds `sessions`, `floor` and `timer`.
fn pack<Acc>(mut sessions: SessionList<Acc>, floor: i64, timer: i64) -> Repr<Acc> {
    match sessions.len() {
        0 => Repr::Empty { floor, timer },
        1 => match Compact::of(&sessions[0], floor, timer) {
            Some(c) => Repr::One(c),
            None => Repr::Many(Box::new(Wide {
                sessions: std::mem::take(&mut sessions),
                floor,
                timer,
            })),
        },
        _ => Repr::Many(Box::new(Wide {
            sessions,
            floor,
            timer,
        })),
    }
}
