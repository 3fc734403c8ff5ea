//! The session window's side of checkpoints: every key's sessions for a base, the keys
//! changed since the last checkpoint, and putting keys, the watermark and the floor of
//! new keys back.

use super::SessionOperator;
use crate::aggregate::SessionAggregate;
use crate::session::KeySessions;
use crate::spill::{BaseImage, SpillError};
use sessionizer_core::{EventTime, Watermark};

impl<A: SessionAggregate> SessionOperator<A> {
    /// Calls `f` with every key that has state and its sessions: those in memory, then
    /// those in the spill store. Errors are the spill store's.
    pub fn for_each_key(
        &self,
        mut f: impl FnMut(&[u8], &KeySessions<A::Acc>),
    ) -> Result<(), SpillError> {
        for (_, key, sessions) in self.store.iter() {
            f(key, sessions);
        }
        match &self.spill {
            Some(s) => s.store().for_each(&mut f),
            None => Ok(()),
        }
    }

    /// The keys of a checkpoint's base, the cheap way: calls `f` with every key in
    /// memory, and returns an image of the spill store's keys
    /// ([`SpillStore::image`](crate::spill::SpillStore::image)), for the base to keep —
    /// or, when the store makes none, calls `f` with those too.
    /// Either way the changes are forgotten (the base holds them).
    pub fn base_keys(
        &mut self,
        mut f: impl FnMut(&[u8], &KeySessions<A::Acc>),
    ) -> Result<Option<BaseImage>, SpillError> {
        self.forget_changes();
        let mut open_in_memory = 0;
        for (_, key, sessions) in self.store.iter() {
            open_in_memory += sessions.sessions().filter(|s| !s.is_final()).count();
            f(key, sessions);
        }
        let Some(s) = self.spill.as_mut() else {
            return Ok(None);
        };
        match s.store_mut().image()? {
            Some(image) => Ok(Some(BaseImage {
                image,
                keys: s.keys as u64,
                open_sessions: (self.open_sessions - open_in_memory) as u64,
            })),
            None => s.store().for_each(&mut f).map(|()| None),
        }
    }

    /// Calls `f` with `key`'s sessions, in memory or spilled; returns whether the key has
    /// state.
    pub fn with_key(
        &self,
        key: &[u8],
        mut f: impl FnMut(&KeySessions<A::Acc>),
    ) -> Result<bool, SpillError> {
        if let Some(id) = self.store.find(key) {
            f(self.store.state(id));
            return Ok(true);
        }
        match &self.spill {
            Some(s) if s.keys > 0 => s.store().peek(key, &mut f),
            _ => Ok(false),
        }
    }

    /// Starts (or stops) remembering which keys change, for incremental checkpoints
    /// ([`drain_changes`](Self::drain_changes)).
    pub fn track_changes(&mut self, on: bool) {
        self.store.track_changes(on);
    }

    /// For an owner whose next checkpoint may as well be a full base (a state
    /// directory; not a Kafka changelog, which needs every change): with a spill store,
    /// the changed keys remembered for evicted keys are bounded by the hot tier's size;
    /// beyond, they are forgotten and [`changes_lost`](Self::changes_lost) says so.
    pub fn bound_tracked_changes(&mut self) {
        self.bound_changes = true;
    }

    /// The changes since the last checkpoint were forgotten
    /// ([`bound_tracked_changes`](Self::bound_tracked_changes)): the next checkpoint
    /// must be a base ([`forget_changes`](Self::forget_changes) or
    /// [`base_keys`](Self::base_keys) clears it).
    pub fn changes_lost(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.changes_lost)
    }

    /// Calls `f` for every key whose sessions changed since the last call (with them)
    /// or that has none any more (`None`), then forgets the changes.
    /// Keys evicted to the spill store since their change are reported from there (an
    /// error reading one is kept for [`take_spill_error`](Self::take_spill_error)).
    pub fn drain_changes(&mut self, f: impl FnMut(&[u8], Option<&KeySessions<A::Acc>>)) {
        match self.spill.as_mut() {
            Some(s) => s.drain_changes(&mut self.store, f),
            None => self.store.drain_changes(f),
        }
    }

    /// Forgets the changes without reporting them (a full snapshot was just taken).
    pub fn forget_changes(&mut self) {
        self.store.forget_changes();
        if let Some(s) = self.spill.as_mut() {
            s.forget_changes();
        }
    }

    /// Puts a key's sessions (and its floor) back from a checkpoint. Its timer is
    /// derived from them — the earliest of: the close of a changed live session (it
    /// completes then), close + lateness of an emitted one (it becomes final), close +
    /// lateness + the largest gap of a final one (it is forgotten) — which is exactly
    /// when an uninterrupted run would next act on the key, so timers need not be
    /// stored. Call [`observe_gap`](Self::observe_gap) with the checkpoint's largest gap
    /// first.
    pub fn restore_key(&mut self, key: &[u8], sessions: KeySessions<A::Acc>) {
        if sessions.session_count() == 0 {
            return;
        }
        let next = self.next_deadline(&sessions);
        let open = sessions.sessions().filter(|s| !s.is_final()).count();
        let id = self.store.restore(key, sessions);
        self.open_sessions += open;
        self.store.schedule(id, EventTime(next));
        self.check_budget(None);
    }

    /// Makes room for `keys` keys (before restoring that many with
    /// [`restore_key`](Self::restore_key)).
    pub fn reserve_keys(&mut self, keys: usize) {
        self.store.reserve(keys);
    }

    /// Sets the watermark of a restored checkpoint without firing anything: every timer
    /// due by then had fired before the checkpoint was taken.
    pub fn restore_watermark(&mut self, w: Watermark) {
        if w > self.watermark {
            self.watermark = w;
        }
    }

    /// Sets the floor of new keys of a restored checkpoint (after
    /// [`restore_watermark`](Self::restore_watermark)): the checkpoint's
    /// [`new_key_floor`](Self::new_key_floor), or `None` for a checkpoint of format 1,
    /// which stored none: then `W - A - G` with the configured gap `G`, an upper bound of
    /// every `W - A - Gmax` so far (`Gmax >= G`), so no key forgotten before the
    /// checkpoint is given a floor below one of its sessions (docs/semantics.md S-30).
    pub fn restore_new_key_floor(&mut self, floor: Option<i64>) {
        let floor = floor.unwrap_or_else(|| {
            self.watermark
                .millis()
                .saturating_sub(self.cfg.allowed_lateness.millis())
                .saturating_sub(self.cfg.gap.millis())
        });
        self.new_key_floor = self.new_key_floor.max(floor);
    }
}
