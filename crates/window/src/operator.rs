//! The session window operator: pure and synchronous.
//!
//! The caller drives it one step per event: [`SessionOperator::on_event`] judges the
//! event against the watermark as it stood before it, then
//! [`SessionOperator::advance_to`] moves the watermark and emits what became due. The
//! operator keeps its per-key state in a [`KeyedStore`] and asks it for a timer per key;
//! it never reads a clock, a file or a socket.
//!
//! The operator is generic over what a session accumulates ([`SessionAggregate`]): the
//! command line's JSON aggregates ([`JsonAggregates`], the default, fed by [`Event`]) or a
//! user's [`Aggregator`](crate::aggregate::Aggregator) over the user's own event type
//! (through [`Custom`](crate::aggregate::Custom), fed by [`TypedEvent`]). Either way the
//! aggregate code is monomorphised into the operator; nothing is boxed per event.

use crate::aggregate::{Accumulate, AggKind, AggState, JsonAggregates, SessionAggregate};
use crate::keyed::{KeyedStore, SlotId, Timed, key_hash};
use crate::session::{Arrival, KeySessions, Session};
pub use crate::spill::SpillCounts;
use crate::spill::tier::{KeyCosts, Tier};
use crate::spill::{BaseImage, Deadlines, Domain, SpillError, SpillStore};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use smallvec::SmallVec;
use std::fmt;

/// When sessions are emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmitMode {
    /// Once when complete, again (next revision) when a late event changed it.
    #[default]
    OnClose,
    /// Also after every step that changed an open session.
    OnUpdate,
    /// Once, when the session can no longer change: when the watermark passes its close
    /// plus the allowed lateness (it becomes final then). Never revised, never retracted.
    Final,
}

/// What shapes the window's state.
#[derive(Debug, Clone)]
pub struct WindowConfig {
    /// The default gap `G` (an event may bring its own, see [`Event::gap`]).
    pub gap: DurationMs,
    /// How long a complete session still accepts late events (`A`).
    pub allowed_lateness: DurationMs,
    /// When sessions are emitted.
    pub emit: EmitMode,
    /// The JSON aggregates of [`SessionOperator::new`], one per entry, reading
    /// `Event::values[i]`. Windows built with
    /// [`with_aggregate`](SessionOperator::with_aggregate) ignore it.
    pub aggregates: Vec<AggKind>,
    /// Whether events carry a dedup value to check ([`Event::dedup`]).
    pub dedup: bool,
}

impl WindowConfig {
    /// How long after its close a changed session is emitted: at once (`on-close`,
    /// `on-update`), or once it can no longer change (`final`: the allowed lateness).
    pub fn emit_delay(&self) -> i64 {
        match self.emit {
            EmitMode::Final => self.allowed_lateness.millis(),
            EmitMode::OnClose | EmitMode::OnUpdate => 0,
        }
    }
}

/// One valid event of the JSON pipeline, as the operator needs it.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The key's text.
    pub key: &'a [u8],
    /// The event time.
    pub time: EventTime,
    /// This event's gap (`G` unless the event brings its own).
    pub gap: DurationMs,
    /// Input sequence number: orders values of equal event time.
    pub seq: u64,
    /// Hash of the dedup value (record or field), when dedup is on and the event has one.
    pub dedup: Option<u128>,
    /// Raw JSON of each aggregate's field; `None` when missing or null.
    pub values: &'a [Option<&'a [u8]>],
}

/// One valid event whose aggregate input is `input` (the user's event, say): the
/// generic form of [`Event`].
#[derive(Debug)]
pub struct TypedEvent<'a, I: ?Sized> {
    /// The key's text.
    pub key: &'a [u8],
    /// The event time.
    pub time: EventTime,
    /// This event's gap (`G` unless the event brings its own).
    pub gap: DurationMs,
    /// Input sequence number: orders values of equal event time.
    pub seq: u64,
    /// Hash of the dedup value, when dedup is on and the event has one.
    pub dedup: Option<u128>,
    /// What the window's aggregate adds.
    pub input: &'a I,
}

/// What became of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Joined, extended or merged sessions.
    Applied,
    /// Equal to an event already in the session it would join; not applied.
    Duplicate,
    /// Too late; changed nothing.
    Late(LateReason),
}

/// Why an event was too late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateReason {
    /// The session it would produce closed more than the allowed lateness ago.
    WindowClosed,
    /// It would join or merge a session that is already final.
    SessionFinal,
}

impl LateReason {
    /// The `reason` text of a late-event record: `window_closed` or `session_final`.
    pub fn as_str(self) -> &'static str {
        match self {
            LateReason::WindowClosed => "window_closed",
            LateReason::SessionFinal => "session_final",
        }
    }
}

/// A session being emitted. `V` is what the window's aggregate shows
/// ([`SessionAggregate::View`]): the JSON aggregate states by default.
#[derive(Debug, Clone, Copy)]
pub struct SessionView<'a, V = &'a [AggState]> {
    /// The key's text.
    pub key: &'a [u8],
    /// The first event time.
    pub start: EventTime,
    /// The last event time.
    pub end: EventTime,
    /// When the session completes (largest `t + gap`).
    pub close: EventTime,
    /// Events applied to the session.
    pub event_count: u64,
    /// The session's emission count, continued across merges and id changes: 0 for the
    /// first record of a new session, then 1, 2, ... A session whose id changed (its
    /// start moved) continues its predecessor's count (docs/semantics.md S-22), so
    /// `(session_id, revision)` is unique but a new id need not start at 0.
    pub revision: u32,
    /// False only for `on-update` records of a session still open.
    pub complete: bool,
    /// The aggregate's view of the session's contents.
    pub aggregates: V,
}

/// Where the operator's output goes. `A` is the window's aggregate; the default is the
/// command line's, so the JSON encoder implements plain `Emit`.
pub trait Emit<A: SessionAggregate + ?Sized = JsonAggregates> {
    /// A session record (complete, or an on-update record of an open session).
    fn session<'a>(&mut self, session: &SessionView<'a, A::View<'a>>);
    /// A session that was emitted before has disappeared (merged away, or its start moved).
    fn retraction(&mut self, key: &[u8], start: EventTime);
}

/// Counts kept by the operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OperatorCounts {
    /// Session records emitted (complete and on-update).
    pub sessions_emitted: u64,
    /// Retractions emitted.
    pub retractions: u64,
}

/// The event-time session window (docs/semantics.md), generic over what sessions
/// accumulate.
pub struct SessionOperator<A: SessionAggregate = JsonAggregates> {
    cfg: WindowConfig,
    agg: A,
    store: KeyedStore<KeySessions<A::Acc>>,
    watermark: Watermark,
    /// Largest gap of any valid event so far: how long final bounds are remembered.
    largest_gap: i64,
    /// The floor of a key whose state is created now: the highest `W - A - Gmax` has
    /// been (docs/semantics.md S-30), `i64::MIN` while `W` is minus infinity.
    new_key_floor: i64,
    /// The session the current step changed (key slot, start), for `on-update`.
    changed: Option<(SlotId, i64)>,
    open_sessions: usize,
    counts: OperatorCounts,
    /// The completed sessions of one close time being emitted, sorted by (key, start):
    /// `(slot, start, whether it is its key's last due session)`; `group_next` is the
    /// first not emitted yet. Non-empty between two calls of
    /// [`advance_at_most`](SessionOperator::advance_at_most) that stopped at their limit.
    group: Vec<(SlotId, i64, bool)>,
    group_next: usize,
    /// With a spill store (the `rocksdb` backend), where the keys the hot tier has no
    /// room for go; `None` (the `memory` backend): every key stays in `store`.
    spill: Option<Box<Tier<KeySessions<A::Acc>>>>,
    /// [`bound_tracked_changes`](Self::bound_tracked_changes) was called.
    bound_changes: bool,
}

/// How many due keys a watermark step takes back from the spill store at a time.
const UNSPILL_BATCH: usize = 4096;

/// What a key costs in the hot tier besides its sessions' heap: its slot (key and
/// state), its index entry and its timer entry, with their tables' slack.
const KEY_BYTES: usize = 16 + std::mem::size_of::<KeySessions>() + 16;

/// What the session window tells its spill tier about its keys.
struct SessionCosts<'a, A: SessionAggregate> {
    agg: &'a A,
    lateness: i64,
    retention: i64,
    delay: i64,
}

impl<'a, A: SessionAggregate> SessionCosts<'a, A> {
    /// Of a window configured as `cfg` whose largest gap so far is `largest_gap`.
    fn new(agg: &'a A, cfg: &WindowConfig, largest_gap: i64) -> Self {
        let lateness = cfg.allowed_lateness.millis();
        SessionCosts {
            agg,
            lateness,
            retention: lateness.saturating_add(largest_gap),
            delay: cfg.emit_delay(),
        }
    }
}

impl<A: SessionAggregate> KeyCosts<KeySessions<A::Acc>> for SessionCosts<'_, A> {
    fn bytes(&mut self, key: &[u8], state: &KeySessions<A::Acc>) -> usize {
        KEY_BYTES + key.len().saturating_sub(16) + state.heap_bytes(self.agg)
    }

    /// The coldest keys are those with the earliest next deadline: with one gap for all
    /// it is the last event plus the gap, so they are the keys quiet for the longest in
    /// event time (LRU without a per-event write); each comes back at its deadline to
    /// be emitted.
    fn coldness(&self, state: &KeySessions<A::Acc>) -> i64 {
        state.next_action()
    }

    fn deadlines(&self, state: &KeySessions<A::Acc>) -> Deadlines {
        Deadlines::event(next_deadline(
            state,
            self.lateness,
            self.retention,
            self.delay,
        ))
    }
}

/// When the operator next acts on a key with `sessions` (see
/// [`SessionOperator::restore_key`]), `i64::MAX` for none; a changed session is due
/// `delay` after its close ([`WindowConfig::emit_delay`]).
fn next_deadline<Acc>(
    sessions: &KeySessions<Acc>,
    lateness: i64,
    retention: i64,
    delay: i64,
) -> i64 {
    sessions
        .sessions()
        .map(|s| {
            if s.is_final() {
                s.close().saturating_add(retention)
            } else if s.is_dirty() {
                s.close().saturating_add(delay)
            } else {
                s.close().saturating_add(lateness)
            }
        })
        .min()
        .unwrap_or(i64::MAX)
}

impl<A: SessionAggregate + fmt::Debug> fmt::Debug for SessionOperator<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionOperator")
            .field("cfg", &self.cfg)
            .field("agg", &self.agg)
            .field("watermark", &self.watermark)
            .field("keys", &self.store.len())
            .field("open_sessions", &self.open_sessions)
            .field("counts", &self.counts)
            .finish()
    }
}

impl SessionOperator<JsonAggregates> {
    /// The command line's window: the JSON aggregates of `cfg.aggregates`.
    pub fn new(cfg: WindowConfig) -> SessionOperator<JsonAggregates> {
        let agg = JsonAggregates::new(cfg.aggregates.clone());
        SessionOperator::with_aggregate(cfg, agg)
    }

    /// Judges one valid event against the current watermark and applies it if it is
    /// neither too late nor a duplicate. Retractions caused by the event are emitted
    /// right away; everything else waits for [`advance_to`](Self::advance_to).
    #[inline]
    pub fn on_event(&mut self, ev: &Event<'_>, out: &mut impl Emit) -> Verdict {
        self.on_event_hashed(ev, key_hash(ev.key), out)
    }

    /// [`on_event`](Self::on_event) for a key whose [`key_hash`] the caller computed
    /// already (to [`prefetch`](Self::prefetch_index) its state, say).
    #[inline]
    pub fn on_event_hashed(&mut self, ev: &Event<'_>, hash: u64, out: &mut impl Emit) -> Verdict {
        self.on_typed_hashed(
            &TypedEvent {
                key: ev.key,
                time: ev.time,
                gap: ev.gap,
                seq: ev.seq,
                dedup: ev.dedup,
                input: ev.values,
            },
            hash,
            out,
        )
    }
}

impl<A: SessionAggregate> SessionOperator<A> {
    /// A window whose sessions accumulate with `agg` (`cfg.aggregates` is not read).
    pub fn with_aggregate(cfg: WindowConfig, agg: A) -> SessionOperator<A> {
        SessionOperator {
            largest_gap: cfg.gap.millis(),
            new_key_floor: i64::MIN,
            cfg,
            agg,
            store: KeyedStore::default(),
            watermark: Watermark::MIN,
            changed: None,
            open_sessions: 0,
            counts: OperatorCounts::default(),
            group: Vec::new(),
            group_next: 0,
            spill: None,
            bound_changes: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &WindowConfig {
        &self.cfg
    }

    /// The sessions' aggregate.
    pub fn aggregate(&self) -> &A {
        &self.agg
    }

    /// The watermark every next event is judged against.
    pub fn watermark(&self) -> Watermark {
        self.watermark
    }

    /// Sessions not yet final (open, or complete and kept for lateness).
    pub fn open_sessions(&self) -> usize {
        self.open_sessions
    }

    /// Keys with any state (open or final sessions), in memory or spilled.
    pub fn keys(&self) -> usize {
        self.store.len() + self.spill.as_ref().map_or(0, |s| s.keys)
    }

    /// Sessions and retractions emitted so far.
    pub fn counts(&self) -> OperatorCounts {
        self.counts
    }

    /// The keyed state in memory (the hot tier), for inspection. With a spill store
    /// some keys are elsewhere: [`for_each_key`](Self::for_each_key) and
    /// [`with_key`](Self::with_key) see them all.
    pub fn store(&self) -> &KeyedStore<KeySessions<A::Acc>> {
        &self.store
    }

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
    /// memory, and returns an image of the spill store's keys ([`SpillStore::image`]),
    /// for the base to keep — or, when the store makes none, calls `f` with those too.
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

    /// Puts `store` below the hot tier (the `rocksdb` backend): once the keys in memory
    /// take more than about `hot_bytes`, the coldest (earliest next deadline) are
    /// evicted to it, and taken back when an event for them arrives or their deadline
    /// comes due. The output stays exactly that of an operator without one. Call it
    /// before the first event or restored key.
    pub fn spill_to(&mut self, store: Box<dyn SpillStore<KeySessions<A::Acc>>>, hot_bytes: usize) {
        self.spill = Some(Box::new(Tier::new(store, hot_bytes, KEY_BYTES)));
    }

    /// As [`spill_to`](Self::spill_to), with a store restored from a checkpoint's
    /// [`BaseImage`]: it holds `keys` keys with `open_sessions` sessions not yet final,
    /// each with the deadline it was evicted with. Call it after the watermark and the
    /// largest gap are restored and before any other key is; the checkpoint's other
    /// keys then come with [`restore_over`](Self::restore_over).
    pub fn spill_restored(
        &mut self,
        store: Box<dyn SpillStore<KeySessions<A::Acc>>>,
        hot_bytes: usize,
        keys: usize,
        open_sessions: usize,
    ) -> Result<(), SpillError> {
        self.spill = Some(Box::new(Tier::restored(store, hot_bytes, KEY_BYTES, keys)?));
        self.open_sessions += open_sessions;
        Ok(())
    }

    /// Closes the spill store of an operator that has no key in memory, with the keys
    /// it held (a restore that started it from a checkpoint's copy gave up, or another
    /// store is about to open in its directory). Refused (`false`, nothing changed)
    /// while keys are in memory: their sessions would be counted twice.
    pub fn detach_spill(&mut self) -> bool {
        if !self.store.is_empty() {
            return false;
        }
        self.spill = None;
        // Every session not yet final was in the store.
        self.open_sessions = 0;
        true
    }

    /// Puts a key's newest state from a checkpoint over what a restored spill store
    /// ([`spill_restored`](Self::spill_restored)) holds of it: its copy there is
    /// dropped, then `sessions` are restored as [`restore_key`](Self::restore_key) does
    /// (`None`: the key has no state any more).
    pub fn restore_over(
        &mut self,
        key: &[u8],
        sessions: Option<KeySessions<A::Acc>>,
    ) -> Result<(), SpillError> {
        if let Some(spill) = self.spill.as_mut()
            && let Some(old) = spill.remove(key)?
        {
            self.open_sessions -= old.sessions().filter(|s| !s.is_final()).count();
        }
        if let Some(sessions) = sessions {
            self.restore_key(key, sessions);
        }
        Ok(())
    }

    /// The first error of the spill store since the last call, if any. The operator
    /// cannot go on correctly after one (a key it could not read back was treated as
    /// new): the caller stops before writing what the step emitted.
    pub fn take_spill_error(&mut self) -> Option<SpillError> {
        self.spill.as_mut().and_then(|s| s.take_error())
    }

    /// What the spill store has done (`None`: the operator has none).
    pub fn spill_counts(&self) -> Option<SpillCounts> {
        self.spill.as_ref().map(|s| s.counts())
    }

    /// When the operator next acts on a key with `sessions` (see
    /// [`restore_key`](Self::restore_key)), `i64::MAX` for none.
    fn next_deadline(&self, sessions: &KeySessions<A::Acc>) -> i64 {
        SessionCosts::new(&self.agg, &self.cfg, self.largest_gap)
            .deadlines(sessions)
            .event
    }

    /// A key not in memory: taken back from the spill store if it is there.
    #[inline]
    fn unspill(&mut self, hash: u64, key: &[u8]) -> Option<SlotId> {
        self.spill.as_mut()?.take_back(&mut self.store, hash, key)
    }

    /// Takes back from the spill store the keys due by `w` (some of them: at least
    /// every key of the earliest deadline), so that the timers of memory fire them in
    /// order with the others.
    fn unspill_due(&mut self, w: i64) {
        if let Some(spill) = self.spill.as_mut() {
            spill.take_due(&mut self.store, Domain::EventTime, w, UNSPILL_BATCH);
        }
    }

    /// The earliest deadline in the spill store when it may be due at `w`.
    #[inline]
    fn spill_bound_due(&self, w: Watermark) -> Option<i64> {
        self.spill
            .as_ref()
            .and_then(|s| s.bound_due(Domain::EventTime, w.millis()))
    }

    /// Whether the spill store holds a key due at `w`.
    #[inline]
    fn spilled_due(&self, w: Watermark) -> bool {
        self.spill_bound_due(w).is_some()
    }

    /// After an applied event (or a restored key): when the hot tier may have outgrown
    /// its budget, measures it and, over budget, evicts its coldest keys down to three
    /// quarters of it. `keep` (the key of the current step) stays.
    #[inline]
    fn check_budget(&mut self, keep: Option<SlotId>) {
        if let Some(spill) = self.spill.as_mut()
            && spill.should_check(self.store.len(), 1)
        {
            let mut costs = SessionCosts::new(&self.agg, &self.cfg, self.largest_gap);
            spill.evict(&mut self.store, keep, self.bound_changes, &mut costs);
        }
    }

    /// The largest gap of any valid event so far (`G` before any): how long final
    /// bounds are remembered. Part of a checkpoint.
    pub fn largest_gap(&self) -> DurationMs {
        DurationMs(self.largest_gap)
    }

    /// The floor a key whose state is created now starts with: the highest value
    /// `W - A - Gmax` has had (`i64::MIN` for minus infinity; docs/semantics.md S-30).
    /// Part of a checkpoint.
    pub fn new_key_floor(&self) -> i64 {
        self.new_key_floor
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

    /// Records the gap of a valid event that another shard of the same job processes.
    /// Final bounds are remembered for the largest gap of *any* valid event, so every
    /// shard must hear of every gap to forget at the same moment as one operator would.
    pub fn observe_gap(&mut self, gap: DurationMs) {
        self.largest_gap = self.largest_gap.max(gap.millis());
    }

    /// Judges one valid event against the current watermark and applies it if it is
    /// neither too late nor a duplicate. Retractions caused by the event are emitted
    /// right away; everything else waits for [`advance_to`](Self::advance_to).
    pub fn on_typed<I>(&mut self, ev: &TypedEvent<'_, I>, out: &mut impl Emit<A>) -> Verdict
    where
        A: Accumulate<I>,
        I: ?Sized,
    {
        self.on_typed_hashed(ev, key_hash(ev.key), out)
    }

    /// Asks the CPU for the index entry the lookup of a key with [`key_hash`] `hash`
    /// reads first. With millions of keys, calling it some events ahead (and
    /// [`prefetch_state`](Self::prefetch_state) a few events ahead) lets the cache misses
    /// of several events overlap.
    #[inline]
    pub fn prefetch_index(&self, hash: u64) {
        self.store.prefetch_index(hash);
    }

    /// Asks the CPU for the state of the key with [`key_hash`] `hash` (its index entry
    /// should be in cache: see [`prefetch_index`](Self::prefetch_index)).
    #[inline]
    pub fn prefetch_state(&self, hash: u64) {
        self.store.prefetch_slot(hash);
    }

    /// [`on_typed`](Self::on_typed) for a key whose [`key_hash`] is `hash`.
    #[inline]
    pub fn on_typed_hashed<I>(
        &mut self,
        ev: &TypedEvent<'_, I>,
        hash: u64,
        out: &mut impl Emit<A>,
    ) -> Verdict
    where
        A: Accumulate<I>,
        I: ?Sized,
    {
        // The rest of an advance stopped at its limit comes first (see advance_at_most).
        if self.group_next < self.group.len() {
            self.drain(usize::MAX, out);
        }
        self.observe_gap(ev.gap);
        let gap = ev.gap.millis();
        let arrival = Arrival {
            time: ev.time.millis(),
            end: ev.time.millis().saturating_add(gap),
            seq: ev.seq,
            dedup: ev.dedup,
            input: ev.input,
        };

        let mut slot = self.store.find_hashed(hash, ev.key);
        if slot.is_none() && self.spill.is_some() {
            slot = self.unspill(hash, ev.key);
        }
        if let Some(id) = slot {
            if let Some(verdict) = self.judge(id, &arrival) {
                return verdict;
            }
        } else if arrival
            .end
            .saturating_add(self.cfg.allowed_lateness.millis())
            <= self.watermark.millis()
        {
            return Verdict::Late(LateReason::WindowClosed);
        } else if arrival.time <= self.new_key_floor {
            // At or before the floor the key's new state would have.
            return Verdict::Late(LateReason::SessionFinal);
        }

        let id = match slot {
            Some(id) => id,
            None => {
                let id = self.store.slot_for_hashed(hash, ev.key);
                self.store.state_mut(id).set_floor(self.new_key_floor);
                id
            }
        };
        let (start, close) = self.apply(id, &arrival, out);
        let due = close.saturating_add(self.cfg.emit_delay());
        self.store.schedule(id, EventTime(due));
        self.changed = Some((id, start));
        self.check_budget(Some(id));
        Verdict::Applied
    }

    /// Lateness and dedup verdict for a key that has state; `None` means apply.
    /// `window_closed` comes first, then `session_final` (the event touches a final
    /// session, or lies at or before the key's floor), then duplicates
    /// (docs/semantics.md S-20).
    fn judge<I: ?Sized>(&self, id: SlotId, ev: &Arrival<'_, I>) -> Option<Verdict> {
        let state = self.store.state(id);
        let mut close = ev.end;
        let mut touches_final = false;
        for s in state.sessions().filter(|s| s.touches(ev.time, ev.end)) {
            if s.is_final() {
                touches_final = true;
            } else {
                close = close.max(s.close());
            }
        }
        if close.saturating_add(self.cfg.allowed_lateness.millis()) <= self.watermark.millis() {
            return Some(Verdict::Late(LateReason::WindowClosed));
        }
        if touches_final || ev.time <= state.floor() {
            return Some(Verdict::Late(LateReason::SessionFinal));
        }
        if let Some(h) = ev.dedup.filter(|_| self.cfg.dedup) {
            let seen = state
                .sessions()
                .any(|s| !s.is_final() && s.touches(ev.time, ev.end) && s.has_seen(h));
            if seen {
                return Some(Verdict::Duplicate);
            }
        }
        None
    }

    /// Creates, extends or merges; returns the resulting session's `(start, close)`.
    fn apply<I>(&mut self, id: SlotId, ev: &Arrival<'_, I>, out: &mut impl Emit<A>) -> (i64, i64)
    where
        A: Accumulate<I>,
        I: ?Sized,
    {
        let state = self.store.state_mut(id);
        if let Some(bounds) = state.extend_one(ev.time, ev.end) {
            // One session without contents, extended without moving its start.
            return bounds;
        }
        let (agg, dedup) = (&self.agg, self.cfg.dedup);
        if state.is_empty() && state.start_first(Session::new(ev, agg, dedup)) {
            // A new key.
            self.open_sessions += 1;
            return (ev.time, ev.end);
        }
        let (key, state) = self.store.key_and_state_mut(id);
        let (open, retractions) = (&mut self.open_sessions, &mut self.counts.retractions);
        state.edit(|sessions, _| {
            let mut touched: SmallVec<[usize; 4]> = sessions
                .iter()
                .enumerate()
                .filter(|(_, s)| s.touches(ev.time, ev.end))
                .map(|(i, _)| i)
                .collect();

            if touched.is_empty() {
                sessions.push(Session::new(ev, agg, dedup));
                *open += 1;
                return (ev.time, ev.end);
            }

            if let [only] = touched[..] {
                // One session touched (the common case): it takes the event.
                let s = &mut sessions[only];
                let emitted = s.was_emitted();
                if emitted && ev.time < s.start() {
                    out.retraction(key, EventTime(s.start()));
                    *retractions += 1;
                }
                let keeps_id = emitted && ev.time >= s.start();
                s.absorb_event(ev, agg);
                s.set_emitted(keeps_id);
                return (s.start(), s.close());
            }

            touched.sort_by_key(|&i| sessions[i].start());
            let new_start = ev.time.min(sessions[touched[0]].start());
            for &i in &touched {
                let s = &sessions[i];
                if s.was_emitted() && s.start() != new_start {
                    out.retraction(key, EventTime(s.start()));
                    *retractions += 1;
                }
            }
            let survivor_start = sessions[touched[0]].start();
            let keeps_id = sessions[touched[0]].was_emitted() && survivor_start == new_start;

            // Take the absorbed sessions out from the back so indices stay valid, then
            // fold them into the earliest one in start order.
            let mut absorbed: SmallVec<[Session<A::Acc>; 2]> = SmallVec::new();
            let mut by_index = touched[1..].to_vec();
            by_index.sort_unstable_by(|a, b| b.cmp(a));
            for i in by_index {
                absorbed.push(sessions.swap_remove(i));
            }
            absorbed.sort_by_key(Session::start);
            let target = sessions
                .iter()
                .position(|s| s.start() == survivor_start && !s.is_final())
                .expect("the earliest touched session is still there");
            let merged = &mut sessions[target];
            *open -= absorbed.len();
            for other in absorbed {
                merged.absorb_session(other, agg);
            }
            merged.absorb_event(ev, agg);
            merged.set_emitted(keeps_id);
            (merged.start(), merged.close())
        })
    }

    /// Moves the watermark to `w` (never backwards) and emits what the step made due:
    /// the `on-update` record of the session this step changed, then every completed
    /// session in `(close, key, start)` order. Then sessions past their lateness become
    /// final, and final bounds past their retention are forgotten, raising their key's
    /// floor to their close.
    pub fn advance_to(&mut self, w: Watermark, out: &mut impl Emit<A>) {
        self.advance_at_most(w, usize::MAX, out);
    }

    /// [`advance_to`](Self::advance_to) in parts: emits at most `max` completed
    /// sessions and returns whether more are due. Call it again (with the same `w`, or
    /// a later one) until it returns `false`: the records of all the calls together are
    /// exactly those of one `advance_to(w)`, in the same order, and memory does not
    /// grow with their number (the end of input emits every open session at once). An
    /// event given in between first emits the rest.
    pub fn advance_at_most(&mut self, w: Watermark, max: usize, out: &mut impl Emit<A>) -> bool {
        if w > self.watermark {
            self.watermark = w;
        }
        let w = self.watermark;
        // Every bound forgotten from now on closes at or before W - A - Gmax.
        let lateness = self.cfg.allowed_lateness.millis();
        self.new_key_floor = self.new_key_floor.max(
            w.millis()
                .saturating_sub(lateness)
                .saturating_sub(self.largest_gap),
        );
        if let Some((id, start)) = self.changed.take()
            && self.cfg.emit == EmitMode::OnUpdate
        {
            self.emit_update(id, start, w, out);
        }
        if self.group_next >= self.group.len() && !self.store.may_be_due(w) && !self.spilled_due(w)
        {
            // Nothing pending, no timer due: the common step.
            return false;
        }
        self.drain(max, out)
    }

    /// Emits up to `max` of the completed sessions due at the watermark, in `(close,
    /// key, start)` order; returns whether more are due.
    ///
    /// Keys come off the timer heap in deadline order. A key's timer is never later
    /// than the close of any of its sessions waiting to be emitted, so once no timer at
    /// or before close `c` is left, every session closing at `c` is known: they are
    /// emitted together, sorted by key. A key whose timer fired before its first due
    /// close is re-armed at that close; a key is retired (sessions finalized or
    /// forgotten, the timer re-armed or the key dropped) once its last due session is
    /// out. So only the sessions of one close time are ever held, never all that are due.
    fn drain(&mut self, max: usize, out: &mut impl Emit<A>) -> bool {
        let w = self.watermark;
        let mut emitted = 0;
        let mut unspill_now = false;
        loop {
            while self.group_next < self.group.len() {
                if emitted == max {
                    return true;
                }
                let (id, start, last) = self.group[self.group_next];
                self.group_next += 1;
                self.emit(id, start, true, out);
                emitted += 1;
                if last {
                    self.retire(id, w);
                }
            }
            self.group.clear();
            self.group_next = 0;
            // Spilled keys due no later than the next timer in memory come back first
            // (a batch of them; memory's earlier timers fire before the next batch), and
            // only timers before the earliest deadline still spilled may fire.
            let mut upto = w;
            if let Some(bound) = self.spill_bound_due(w) {
                let in_memory = self.store.next_deadline_bound().unwrap_or(i64::MAX);
                if unspill_now || in_memory >= bound {
                    self.unspill_due(w.millis());
                }
                if let Some(bound) = self.spill_bound_due(w) {
                    upto = Watermark::at(EventTime(bound.saturating_sub(1)));
                }
            }
            unspill_now = false;
            let Some((id, deadline)) = self.store.pop_due_at(upto) else {
                if self.spilled_due(w) {
                    // Nothing in memory before the spilled keys: take them back.
                    unspill_now = true;
                    continue;
                }
                return false;
            };
            self.fire(id, deadline, w);
            // Every other key due at this very deadline joins the group.
            while self.store.next_deadline_bound() == Some(deadline) {
                if let Some((id, at)) = self.store.pop_due_at(Watermark::at(EventTime(deadline))) {
                    self.fire(id, at, w);
                }
            }
            if self.group.len() > 1 {
                let store = &self.store;
                self.group
                    .sort_unstable_by(|a, b| (store.key(a.0), a.1).cmp(&(store.key(b.0), b.1)));
            }
        }
    }

    /// A key's timer fired at `deadline` (at or before `w`): its session closing then
    /// joins the group to emit; with nothing closing then, the key is re-armed at its
    /// next due close, or retired when nothing of it is due to be emitted.
    fn fire(&mut self, id: SlotId, deadline: i64, w: Watermark) {
        // The earliest due session (close, start) and the close of the next one.
        let mut first: Option<(i64, i64)> = None;
        let mut second: Option<i64> = None;
        let delay = self.cfg.emit_delay();
        for s in self.store.state(id).sessions() {
            // When the session is due: its close, or with `final` emission its close
            // plus the lateness (always later by the same amount: the order of closes).
            let c = s.close().saturating_add(delay);
            if s.is_final() || !s.is_dirty() || !w.has_reached(EventTime(c)) {
                continue;
            }
            match first {
                Some((fc, _)) if fc <= c => second = Some(second.map_or(c, |x| x.min(c))),
                _ => {
                    second = first.map(|(fc, _)| fc);
                    first = Some((c, s.start()));
                }
            }
        }
        match first {
            None => self.retire(id, w),
            // The timer was early (the session grew since it was set).
            Some((due, _)) if due > deadline => self.store.schedule(id, EventTime(due)),
            Some((due, start)) => {
                // Two live sessions of one key never close at the same time (they would
                // touch), so the next due one closes later.
                let close = due.saturating_sub(delay);
                if let Some(next) = second {
                    self.store.schedule(id, EventTime(next));
                } else if w.millis() >= close.saturating_add(self.retention()) {
                    // The key is dropped once this session is out: its index entry is
                    // read then (at the end of input, for every key).
                    self.store.prefetch_index(key_hash(self.store.key(id)));
                }
                self.group.push((id, start, second.is_none()));
            }
        }
    }

    /// After its due sessions are emitted: sessions past their lateness become final,
    /// final bounds past their retention are forgotten (raising the key's floor), and
    /// the key is re-armed for what it waits for next, or dropped when nothing is left.
    /// How long after its close a session's bounds are remembered: `A + Gmax`.
    fn retention(&self) -> i64 {
        self.cfg
            .allowed_lateness
            .millis()
            .saturating_add(self.largest_gap)
    }

    fn retire(&mut self, id: SlotId, w: Watermark) {
        let lateness = self.cfg.allowed_lateness.millis();
        let retention = self.retention();
        let delay = self.cfg.emit_delay();
        let state = self.store.state_mut(id);
        let (next, finalized, empty) =
            match state.retire_one(w.millis(), lateness, retention, delay) {
                Some((next, finalized, empty)) => (next, usize::from(finalized), empty),
                None => state.edit(|sessions, floor| {
                    let mut next = i64::MAX;
                    let mut finalized = 0;
                    sessions.retain(|s| {
                        if !s.is_final() && w.millis() >= s.close().saturating_add(lateness) {
                            s.finalize();
                            finalized += 1;
                        }
                        if s.is_final() {
                            let forget_at = s.close().saturating_add(retention);
                            if w.millis() >= forget_at {
                                *floor = (*floor).max(s.close());
                                return false;
                            }
                            next = next.min(forget_at);
                        } else if s.is_dirty() {
                            next = next.min(s.close().saturating_add(delay));
                        } else {
                            next = next.min(s.close().saturating_add(lateness));
                        }
                        true
                    });
                    (next, finalized, sessions.is_empty())
                }),
            };
        self.open_sessions -= finalized;
        if empty {
            self.store.remove(id);
        } else {
            self.store.schedule(id, EventTime(next));
        }
    }

    fn emit_update(&mut self, id: SlotId, start: i64, w: Watermark, out: &mut impl Emit<A>) {
        let still_open = self
            .store
            .state(id)
            .live_at(start)
            .is_some_and(|s| !w.has_reached(EventTime(s.close())));
        if still_open {
            self.emit(id, start, false, out);
        }
    }

    fn emit(&mut self, id: SlotId, start: i64, complete: bool, out: &mut impl Emit<A>) {
        let (key, state) = self.store.key_and_state_mut(id);
        let Some((revision, s)) = state.take_revision(start, complete) else {
            return;
        };
        out.session(&SessionView {
            key,
            start: EventTime(s.start()),
            end: EventTime(s.last()),
            close: EventTime(s.close()),
            event_count: s.event_count(),
            revision,
            complete,
            aggregates: self.agg.view(s.acc()),
        });
        self.counts.sessions_emitted += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Keys(Vec<Vec<u8>>);

    impl Emit for Keys {
        fn session(&mut self, s: &SessionView<'_>) {
            self.0.push(s.key.to_vec());
        }
        fn retraction(&mut self, _: &[u8], _: EventTime) {}
    }

    fn event(key: &[u8], t: i64) -> Event<'_> {
        Event {
            key,
            time: EventTime(t),
            gap: DurationMs(10),
            seq: 0,
            dedup: None,
            values: &[],
        }
    }

    #[test]
    fn an_event_during_an_advance_in_parts_first_emits_the_rest() {
        let mut op = SessionOperator::new(WindowConfig {
            gap: DurationMs(10),
            allowed_lateness: DurationMs(0),
            emit: EmitMode::OnClose,
            aggregates: vec![],
            dedup: false,
        });
        let mut out = Keys::default();
        for key in [b"e", b"c", b"a", b"d", b"b"] {
            op.on_event(&event(key, 0), &mut out);
        }
        assert!(op.advance_at_most(Watermark::at(EventTime(100)), 2, &mut out));
        assert_eq!(out.0, [b"a", b"b"], "two of five, in key order");
        op.on_event(&event(b"f", 200), &mut out);
        assert_eq!(out.0, [b"a", b"b", b"c", b"d", b"e"], "the rest first");
        assert_eq!(op.open_sessions(), 1);
        assert!(!op.advance_at_most(Watermark::MAX, 1, &mut out));
        assert_eq!(out.0.len(), 6);
        assert_eq!(op.keys(), 0, "every key is dropped at +infinity");
    }
}
