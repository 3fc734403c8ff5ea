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

use crate::aggregate::{AggKind, AggState, JsonAggregates, SessionAggregate};
use crate::keyed::{KeyedStore, SlotId, key_hash};
use crate::session::KeySessions;
pub use crate::spill::SpillCounts;
use crate::spill::tier::Tier;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use std::fmt;

mod advance;
mod checkpoint;
mod events;
mod spill;
#[cfg(test)]
mod tests;

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

    /// Records the gap of a valid event that another shard of the same job processes.
    /// Final bounds are remembered for the largest gap of *any* valid event, so every
    /// shard must hear of every gap to forget at the same moment as one operator would.
    pub fn observe_gap(&mut self, gap: DurationMs) {
        self.largest_gap = self.largest_gap.max(gap.millis());
    }
}
