//! Declarative session windows over the user's own events: key, time, gap (or a gap
//! per event), watermark, allowed lateness and aggregates; the engine does the rest
//! (`docs/semantics.md`).
//!
//! The job drives a [`SessionOperator`] one event at a time, exactly as the command line
//! does: judge the event against the watermark as it stood before it, apply it, move the
//! watermark, emit what became due.

use crate::api::checkpoints::{Checkpoints, Resumed, StateError};
use crate::api::late::Late;
use crate::api::sink::{Sink, SinkError};
use crate::api::stream::{KeyFn, Stream, TimeFn, ValidTimes};
use crate::config::StateBackend;
use crate::error::{RestoreError, StateEncodeError};
use crate::runtime::backend::SpillRoot;
use crate::runtime::state;
use serde::de::DeserializeOwned;
use serde::ser::{Serialize, SerializeMap, Serializer};
use sessionizer_checkpoint::{Counters, Manifest, StateEntries};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::aggregate::{Aggregator, Custom};
use sessionizer_window::clock::{Clock, ProcessingTime, SystemClock};
use sessionizer_window::codec;
use sessionizer_window::session::KeySessions;
use sessionizer_window::spill::{EncodeError, SpillError, StateCodec, StateDecodeError};
use sessionizer_window::{EmitMode, LateReason, SessionOperator, WatermarkStrategy, WindowConfig};
use std::fmt;
use std::path::Path;

mod batches;

/// A per-event gap: `None` means the window's gap.
pub trait GapFn<E> {
    /// The gap of `event`, or `None` for the window's gap.
    fn gap_of(&self, event: &E) -> Option<DurationMs>;
}

/// One gap for every event (the builder's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct FixedGap;

impl<E> GapFn<E> for FixedGap {
    #[inline]
    fn gap_of(&self, _: &E) -> Option<DurationMs> {
        None
    }
}

impl<E, F: Fn(&E) -> Option<DurationMs>> GapFn<E> for F {
    #[inline]
    fn gap_of(&self, event: &E) -> Option<DurationMs> {
        self(event)
    }
}

/// Configures a session window job; made by [`Stream::session_windows`].
///
/// ```
/// use sessionizer::prelude::*;
///
/// #[derive(Debug)]
/// struct Visit { id: &'static str, at: EventTime }
///
/// let mut job = Stream::<Visit>::new()
///     .key_by(|v| v.id)
///     .event_time(|v| v.at)
///     .watermark(BoundedOutOfOrderness::new(minutes(1)))
///     .session_windows(minutes(10))
///     .allowed_lateness(minutes(15))
///     .aggregate(Count)
///     .build();
/// let visits = [("v1", 0), ("v1", 60_000), ("v2", 0), ("v1", 3_600_000)]
///     .map(|(id, t)| Visit { id, at: EventTime(t) });
/// let mut sessions = Vec::new();
/// let mut late = Vec::new();
/// job.run(visits, &mut sessions, &mut late).expect("vectors never refuse");
/// let counts: Vec<(String, u64)> = sessions
///     .iter()
///     .filter_map(WindowOutput::session)
///     .map(|s| (s.key.clone(), s.value))
///     .collect();
/// assert_eq!(counts, [("v2".to_string(), 1), ("v1".to_string(), 2), ("v1".to_string(), 1)]);
/// assert!(late.is_empty());
/// ```
pub struct SessionWindowBuilder<E, K, T, W, A, G, C = SystemClock> {
    stream: Stream<E, K, T, W>,
    gap: DurationMs,
    gap_fn: G,
    allowed_lateness: DurationMs,
    emit: EmitMode,
    aggregate: A,
    clock: C,
    idle_timeout: Option<DurationMs>,
}

impl<E, K, T, W: fmt::Debug, A, G, C> fmt::Debug for SessionWindowBuilder<E, K, T, W, A, G, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionWindowBuilder")
            .field("stream", &self.stream)
            .field("gap", &self.gap)
            .field("allowed_lateness", &self.allowed_lateness)
            .field("emit", &self.emit)
            .finish()
    }
}

impl<E, K: KeyFn<E>, T: TimeFn<E>, W: WatermarkStrategy>
    SessionWindowBuilder<E, K, T, W, (), FixedGap>
{
    pub(crate) fn new(stream: Stream<E, K, T, W>, gap: DurationMs) -> Self {
        SessionWindowBuilder {
            stream,
            gap,
            gap_fn: FixedGap,
            allowed_lateness: DurationMs::ZERO,
            emit: EmitMode::OnClose,
            aggregate: (),
            clock: SystemClock,
            idle_timeout: None,
        }
    }
}

impl<E, K: KeyFn<E>, T: TimeFn<E>, W: WatermarkStrategy, A, G, C>
    SessionWindowBuilder<E, K, T, W, A, G, C>
{
    /// A gap per event (`--gap-field`): `None` means the window's gap. Each event covers
    /// `[t, t + gap]`; the events whose intervals chain form a session.
    pub fn gap_fn<G2>(self, gap_fn: G2) -> SessionWindowBuilder<E, K, T, W, A, G2, C>
    where
        G2: Fn(&E) -> Option<DurationMs>,
    {
        SessionWindowBuilder {
            stream: self.stream,
            gap: self.gap,
            gap_fn,
            allowed_lateness: self.allowed_lateness,
            emit: self.emit,
            aggregate: self.aggregate,
            clock: self.clock,
            idle_timeout: self.idle_timeout,
        }
    }

    /// The processing-time clock (default [`SystemClock`]; a
    /// [`ManualClock`](sessionizer_window::ManualClock) in tests): it stamps every
    /// record's [`Emission::processing_time`]. The rules never read it.
    pub fn clock<C2: Clock>(self, clock: C2) -> SessionWindowBuilder<E, K, T, W, A, G, C2> {
        SessionWindowBuilder {
            stream: self.stream,
            gap: self.gap,
            gap_fn: self.gap_fn,
            allowed_lateness: self.allowed_lateness,
            emit: self.emit,
            aggregate: self.aggregate,
            clock,
            idle_timeout: self.idle_timeout,
        }
    }

    /// How long a complete session still accepts late events (default 0): it is emitted
    /// again, with the next revision, when one changes it.
    pub fn allowed_lateness(mut self, lateness: DurationMs) -> Self {
        self.allowed_lateness = lateness;
        self
    }

    /// When sessions are emitted (default: once complete). `EmitMode::Final` emits each
    /// session once, when the watermark passes its close plus the allowed lateness: no
    /// revision (its `revision` is always 0) and no retraction — what a table wants.
    pub fn emit(mut self, mode: EmitMode) -> Self {
        self.emit = mode;
        self
    }

    /// Lets the watermark move on with the clock while the input is quiet (the command
    /// line's `--idle-timeout`, docs/semantics.md S-32): once no event has come for
    /// `timeout` of processing time, [`SessionWindowJob::tick`] moves the watermark to
    /// the one of the last event plus the processing time passed since, so a quiet key's
    /// session still closes. Off by default (a bounded input ends with
    /// [`finish`](SessionWindowJob::finish) instead).
    pub fn idle_timeout(mut self, timeout: DurationMs) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// What each session computes: one [`Aggregator`] (a tuple of them for several; see
    /// [`crate::api::aggregators`] for the built-ins).
    pub fn aggregate<A2: Aggregator<E>>(
        self,
        aggregate: A2,
    ) -> SessionWindowBuilder<E, K, T, W, A2, G, C> {
        SessionWindowBuilder {
            stream: self.stream,
            gap: self.gap,
            gap_fn: self.gap_fn,
            allowed_lateness: self.allowed_lateness,
            emit: self.emit,
            aggregate,
            clock: self.clock,
            idle_timeout: self.idle_timeout,
        }
    }

    /// The job.
    pub fn build(self) -> SessionWindowJob<E, K, T, W, A, G, C>
    where
        A: Aggregator<E>,
        G: GapFn<E>,
        C: Clock,
    {
        let cfg = WindowConfig {
            gap: self.gap,
            allowed_lateness: self.allowed_lateness,
            emit: self.emit,
            aggregates: Vec::new(),
            dedup: false,
        };
        SessionWindowJob {
            op: SessionOperator::with_aggregate(cfg, Custom::new(self.aggregate)),
            workers: Vec::new(),
            parallel: None,
            outputs: vec![batches::Outputs::default()],
            key: self.stream.key,
            time: self.stream.time,
            watermark: self.stream.watermark,
            gap_fn: self.gap_fn,
            gap: self.gap,
            valid: self.stream.valid,
            clock: self.clock,
            idle_timeout: self.idle_timeout,
            last_input: None,
            max_time: None,
            seq: 0,
            key_buf: String::new(),
            walks: Default::default(),
            counts: WindowCounts::default(),
            checkpointed: false,
            spill_root: None,
            #[cfg(feature = "rocksdb")]
            state_memory: 0,
        }
    }
}

/// Why a record was emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// The watermark reached the session's close time (Flink's event-time trigger
    /// firing). A late event that changes a complete session emits its next revision at
    /// once, with the watermark it was judged against.
    Watermark,
    /// `EmitMode::OnUpdate`: an event changed a session still open (`complete` is
    /// false).
    Update,
    /// The input was quiet for the idle timeout and the watermark moved on with the
    /// clock ([`SessionWindowBuilder::idle_timeout`]).
    Idle,
    /// [`SessionWindowJob::finish`]: the end of a bounded input, where every session is
    /// emitted whatever the watermark.
    EndOfInput,
}

/// The context of an emission, on every record (Flink's `Context.currentWatermark()`
/// and `currentProcessingTime()` at firing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Emission {
    /// The event-time watermark at emission: the one that completed the session (for
    /// [`Trigger::Update`], the one after the event that changed it; for a late event's
    /// revision, the one it was judged against).
    ///
    /// At the end of input ([`Trigger::EndOfInput`]) the engine moves the watermark to
    /// +∞ to emit everything; that is no watermark any event gave, so this field holds
    /// instead the **last watermark the events gave** ([`Watermark::MIN`] if none) — a
    /// session emitted then is incomplete in event time, `watermark` says how far the
    /// input had got.
    pub watermark: Watermark,
    /// The processing time at emission (the job's [`Clock`]).
    pub processing_time: ProcessingTime,
    /// What emitted the record.
    pub trigger: Trigger,
}

/// A session as emitted: its bounds, revision, the aggregate's result `value`, and the
/// context of its emission.
///
/// As JSON (through [`JsonLinesSink`](crate::api::sink::JsonLinesSink)) it has the command
/// line's shape: `key`, `session_id` (16 hex digits), `start`, `end` (RFC 3339),
/// `duration_ms`, `event_count`, `revision`, `complete`, then the fields of `value`, in
/// the value's own order and with its own names (nested objects too):
///
/// - a struct or map: its fields;
/// - a tuple: its elements' fields — a struct or map element (such as a
///   [`Named`](crate::api::aggregators::Named) aggregate's result) contributes its fields,
///   any other element is the field `_1`, `_2`, ... by position;
/// - `()` or `None`: nothing;
/// - anything else: one field `value`.
///
/// The emission context is not written (the command line's records do not have it);
/// map the record to your own type to output it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord<O> {
    /// The key's text.
    pub key: String,
    /// The deterministic id of (key, start) — see [`session_id`](sessionizer_window::session_id).
    pub session_id: u64,
    /// The first event time.
    pub start: EventTime,
    /// The last event time.
    pub end: EventTime,
    /// Events in the session.
    pub event_count: u64,
    /// 0, then 1, 2, ... when late events change an emitted session (always 0 with
    /// `EmitMode::Final`).
    pub revision: u32,
    /// False for `EmitMode::OnUpdate` records of a session still open.
    pub complete: bool,
    /// The aggregate's result.
    pub value: O,
    /// When and why it was emitted.
    pub emitted: Emission,
}

impl<O> SessionRecord<O> {
    /// `end - start`.
    pub fn duration(&self) -> DurationMs {
        DurationMs(self.end.millis() - self.start.millis())
    }

    /// The same record with its value mapped by `f` (to name a tuple's fields, say).
    pub fn map<O2>(self, f: impl FnOnce(O) -> O2) -> SessionRecord<O2> {
        SessionRecord {
            key: self.key,
            session_id: self.session_id,
            start: self.start,
            end: self.end,
            event_count: self.event_count,
            revision: self.revision,
            complete: self.complete,
            value: f(self.value),
            emitted: self.emitted,
        }
    }
}

fn hex_id(id: u64) -> String {
    format!("{id:016x}")
}

impl<O: Serialize> Serialize for SessionRecord<O> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("key", &self.key)?;
        map.serialize_entry("session_id", &hex_id(self.session_id))?;
        map.serialize_entry("start", &self.start.to_string())?;
        map.serialize_entry("end", &self.end.to_string())?;
        map.serialize_entry("duration_ms", &self.duration().millis())?;
        map.serialize_entry("event_count", &self.event_count)?;
        map.serialize_entry("revision", &self.revision)?;
        map.serialize_entry("complete", &self.complete)?;
        // The value's fields become the record's, as the command line's aggregates do,
        // in the value's own order.
        crate::api::flatten::flatten_into(&mut map, &self.value)?;
        map.end()
    }
}

/// A session emitted before that disappeared (merged into another, or its start moved
/// so that its id changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retraction {
    /// The key's text.
    pub key: String,
    /// The id being retracted.
    pub session_id: u64,
    /// The start it had.
    pub start: EventTime,
    /// When and why it was emitted.
    pub emitted: Emission,
}

impl Serialize for Retraction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("key", &self.key)?;
        map.serialize_entry("session_id", &hex_id(self.session_id))?;
        map.serialize_entry("retract", &true)?;
        map.end()
    }
}

/// What a session window job emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowOutput<O> {
    /// A session record.
    Session(SessionRecord<O>),
    /// A retraction (only with allowed lateness).
    Retraction(Retraction),
}

impl<O> WindowOutput<O> {
    /// The session record, if this is one.
    pub fn session(&self) -> Option<&SessionRecord<O>> {
        match self {
            WindowOutput::Session(s) => Some(s),
            WindowOutput::Retraction(_) => None,
        }
    }
}

impl<O: Serialize> Serialize for WindowOutput<O> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WindowOutput::Session(r) => r.serialize(s),
            WindowOutput::Retraction(r) => r.serialize(s),
        }
    }
}

/// A session window job's accounting: every event pushed is in a session, late, or
/// invalid (`events = in_sessions + late + invalid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Events pushed.
    pub events: u64,
    /// Events applied to a session.
    pub in_sessions: u64,
    /// Events too late (sent to the late sink).
    pub late: u64,
    /// Events whose time is outside the valid time range (sent to the late sink with
    /// reason [`TIME_OUT_OF_RANGE`](crate::api::late::TIME_OUT_OF_RANGE)).
    pub invalid: u64,
    /// Session records emitted.
    pub sessions_emitted: u64,
    /// Retractions emitted.
    pub retractions: u64,
}

/// A running session window job; made by [`SessionWindowBuilder::build`].
pub struct SessionWindowJob<E, K, T, W, A: Aggregator<E>, G, C = SystemClock> {
    /// The operator (of the first worker, with several).
    op: SessionOperator<Custom<A, E>>,
    /// The operators of workers 2.. ([`set_workers`](Self::set_workers)); each owns the
    /// keys of one hash shard.
    workers: Vec<SessionOperator<Custom<A, E>>>,
    /// With several workers: their threads.
    parallel: Option<batches::Workers<E, A, C>>,
    /// Each worker's outputs of a batch.
    outputs: Vec<batches::Outputs<A::Output>>,
    key: K,
    time: T,
    watermark: W,
    gap_fn: G,
    gap: DurationMs,
    valid: ValidTimes,
    clock: C,
    idle_timeout: Option<DurationMs>,
    /// The processing time of the last event and the watermark after it (for the idle
    /// advance).
    last_input: Option<(ProcessingTime, Watermark)>,
    /// The largest valid event time pushed.
    max_time: Option<EventTime>,
    seq: u64,
    key_buf: String,
    /// Per worker, the events of a batch it walks (kept between batches).
    walks: crate::runtime::Walks,
    counts: WindowCounts,
    /// A checkpoint was written or restored: the operator tracks changed keys.
    checkpointed: bool,
    /// The directory of the `rocksdb` backend's store (after `op`: dropped after it).
    spill_root: Option<SpillRoot>,
    /// The `rocksdb` backend's memory budget.
    #[cfg(feature = "rocksdb")]
    state_memory: u64,
}

/// What became of one pushed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied to a session.
    InSession,
    /// Too late (sent to the late sink), and why.
    Late(LateReason),
    /// Its time is outside the valid time range: rejected (sent to the late sink with
    /// reason [`TIME_OUT_OF_RANGE`](crate::api::late::TIME_OUT_OF_RANGE)); the watermark did not see it.
    OutOfRange,
}

impl<E, K, T, W: fmt::Debug, A: Aggregator<E>, G, C> fmt::Debug
    for SessionWindowJob<E, K, T, W, A, G, C>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionWindowJob")
            .field("config", self.op.config())
            .field("watermark", &self.op.watermark())
            .field("workers", &(1 + self.workers.len()))
            .field("open_sessions", &self.open_sessions_all())
            .field("counts", &self.counts)
            .finish()
    }
}

impl<E, K, T, W, A, G, C> SessionWindowJob<E, K, T, W, A, G, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    G: GapFn<E>,
    C: Clock,
{
    /// Processes one event: judged against the watermark as it stood before it,
    /// applied (or sent to `late`), then the watermark moves and the sessions it
    /// completes go to `sessions`. An event whose time is outside the valid time range
    /// goes to `late` at once and changes nothing.
    pub fn push<S, L>(
        &mut self,
        event: E,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<Outcome, SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        self.push_events(vec![event], sessions, late)
    }

    /// The end of a bounded input: the watermark becomes +∞ and every session is
    /// emitted (with [`Trigger::EndOfInput`] and the last watermark the events gave, see
    /// [`Emission::watermark`]); then both sinks are flushed.
    pub fn finish<S, L>(
        &mut self,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<WindowCounts, SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        self.advance_all(Watermark::MAX, Trigger::EndOfInput, None, sessions)?;
        sessions.flush()?;
        late.flush()?;
        Ok(self.counts)
    }

    /// Pushes every event of `events`, in batches of 4,096 (through every worker with
    /// [`set_workers`](Self::set_workers)). The records are those of pushing each event
    /// in turn; the emission context's processing time is read once per batch.
    pub fn push_batch<I, S, L>(
        &mut self,
        events: I,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<(), SinkError>
    where
        I: IntoIterator<Item = E>,
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        let mut events = events.into_iter().peekable();
        while events.peek().is_some() {
            let batch: Vec<E> = events.by_ref().take(batches::BATCH).collect();
            self.push_events(batch, sessions, late)?;
        }
        Ok(())
    }

    /// Pushes every event of `events`, then [`finish`](Self::finish)es.
    pub fn run<I, S, L>(
        &mut self,
        events: I,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<WindowCounts, SinkError>
    where
        I: IntoIterator<Item = E>,
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        self.push_batch(events, sessions, late)?;
        self.finish(sessions, late)
    }

    /// Call on a timer while the input may be quiet (a service does, say, every
    /// second): with an [`idle_timeout`](SessionWindowBuilder::idle_timeout), once no
    /// event has come for that long the watermark moves on with the clock — to the
    /// watermark of the last event plus the processing time passed since it, exactly
    /// as the command line's `--idle-timeout` does — and the sessions that completes go
    /// to `sessions` (with [`Trigger::Idle`]). Later events are judged against the
    /// watermark it reached. Without an idle timeout, or before the first event, it
    /// does nothing.
    pub fn tick<S>(&mut self, sessions: &mut S) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        let (Some(limit), Some((at, w))) = (self.idle_timeout, self.last_input) else {
            return Ok(());
        };
        let now = self.clock.now();
        let quiet = now.0.saturating_sub(at.0);
        let Some(target) = crate::runtime::idle_watermark(limit.millis(), quiet, w)
            .filter(|&t| t > self.op.watermark())
        else {
            return Ok(());
        };
        self.watermark.resume_at(target);
        self.advance_all(target, Trigger::Idle, Some(now), sessions)
    }

    /// The watermark the next event is judged against.
    pub fn watermark(&self) -> Watermark {
        self.op.watermark()
    }

    /// Sessions not yet final.
    pub fn open_sessions(&self) -> usize {
        self.open_sessions_all()
    }

    /// The accounting so far.
    pub fn counts(&self) -> WindowCounts {
        self.counts
    }

    /// The underlying operator: the same [`SessionOperator`] the command line runs,
    /// with a user aggregate (with several workers, the first worker's: see
    /// [`operators`](Self::operators)).
    pub fn operator(&self) -> &SessionOperator<Custom<A, E>> {
        &self.op
    }
}

impl<E, K, T, W, A: Aggregator<E>, G, C> SessionWindowJob<E, K, T, W, A, G, C> {
    /// The first failure of the state backend's store: the step that met it may have
    /// treated a key it could not read back as new, so the job stops.
    fn store_error(&mut self) -> Result<(), SpillError> {
        for op in std::iter::once(&mut self.op).chain(self.workers.iter_mut()) {
            if let Some(e) = op.take_spill_error() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Every worker's operator, the first first: each holds the keys of one shard.
    pub fn operators(&self) -> impl Iterator<Item = &SessionOperator<Custom<A, E>>> {
        std::iter::once(&self.op).chain(self.workers.iter())
    }

    fn operators_mut(&mut self) -> impl Iterator<Item = &mut SessionOperator<Custom<A, E>>> {
        std::iter::once(&mut self.op).chain(self.workers.iter_mut())
    }

    fn open_sessions_all(&self) -> usize {
        self.operators().map(SessionOperator::open_sessions).sum()
    }

    /// Runs the job on `workers` threads (the command line's `--workers`), each owning
    /// the keys of one hash shard with an operator of its own. Every worker sees every
    /// event's time and gap, so the watermark is that of one operator, and the workers'
    /// records are merged back in the order one operator emits them: **the output is
    /// the same, record for record, for any number of workers** (one worker is the
    /// same path with one shard). Events are worked on in batches of 4,096: give them
    /// to [`run`](Self::run) or [`push_batch`](Self::push_batch); [`push`](Self::push)
    /// still works, one event at a time, without the speed.
    /// Checkpoints are the same files whatever the number of workers, and restore onto
    /// any number. Call it before the first event, before [`restore`](Self::restore)
    /// and before [`set_state_backend`](Self::set_state_backend).
    pub fn set_workers(&mut self, workers: usize) -> Result<(), StateError>
    where
        E: Sync,
        A: Clone + Send,
        A::Acc: Send,
        A::Output: Send,
        C: Clock + Sync,
    {
        if self.counts.events > 0 || self.op.keys() > 0 || self.spill_root.is_some() {
            return Err(StateError::Workers(
                "set_workers() must come before the job's first event, restore() and set_state_backend()".into(),
            ));
        }
        let workers = workers.max(1);
        self.parallel = if workers > 1 {
            let threads =
                crate::runtime::Workers::start(workers, "sessionizer-worker").map_err(|e| {
                    StateError::Workers(format!("cannot start {workers} worker threads: {e}"))
                })?;
            Some(batches::Workers::new(threads))
        } else {
            None
        };
        let cfg = self.op.config().clone();
        let aggregate = &self.op.aggregate().aggregator;
        self.workers = (1..workers)
            .map(|_| SessionOperator::with_aggregate(cfg.clone(), Custom::new(aggregate.clone())))
            .collect();
        self.outputs = (0..workers).map(|_| batches::Outputs::default()).collect();
        Ok(())
    }
}

/// A library window's state in the checkpoint codec, each accumulator as JSON: how its
/// checkpoints and its `rocksdb` store write a key's sessions.
struct JsonAcc<Acc>(std::marker::PhantomData<fn() -> Acc>);

impl<Acc: Serialize + DeserializeOwned> StateCodec<KeySessions<Acc>> for JsonAcc<Acc> {
    fn encode(&self, sessions: &KeySessions<Acc>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let refused = std::cell::RefCell::new(None);
        codec::encode_sessions_with(sessions, out, |acc, out| {
            if let Err(e) = serde_json::to_writer(out, acc) {
                refused.borrow_mut().get_or_insert(EncodeError(e));
            }
        });
        refused.into_inner().map_or(Ok(()), Err)
    }

    fn decode(&self, bytes: &[u8]) -> Result<KeySessions<Acc>, StateDecodeError> {
        Ok(codec::decode_sessions_with(bytes, |b| {
            serde_json::from_slice::<Acc>(b)
        })?)
    }
}

/// The error of a key an accumulator's JSON writer refused (`Err`: another store error,
/// the store's own).
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn unwritable(e: SpillError) -> Result<StateEncodeError, SpillError> {
    match e {
        SpillError::Encode { key, reason } => Ok(StateEncodeError::Accumulator { key, reason }),
        other => Err(other),
    }
}

/// The options of a job that shape its state, as a checkpoint records them: a restore
/// with any other value is refused, naming it.
fn state_options<A: Aggregator<E>, E>(
    cfg: &WindowConfig,
    valid: ValidTimes,
) -> Vec<(String, String)> {
    let pair = |k: &str, v: String| (k.to_string(), v);
    vec![
        pair("job", "library session window".into()),
        pair("--gap", cfg.gap.to_string()),
        pair("--allowed-lateness", cfg.allowed_lateness.to_string()),
        pair(
            "--emit",
            match cfg.emit {
                EmitMode::OnClose => "on-close",
                EmitMode::OnUpdate => "on-update",
                EmitMode::Final => "final",
            }
            .into(),
        ),
        pair(
            "--valid-time-range",
            valid.map_or("any".into(), |(a, b)| format!("{a}..{b}")),
        ),
        pair(
            "aggregate state",
            std::any::type_name::<A::Acc>().to_string(),
        ),
    ]
}

impl<E, K, T, W, A, G, C> SessionWindowJob<E, K, T, W, A, G, C>
where
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    C: Clock,
{
    /// Writes a checkpoint of the job into `checkpoints`, in the command line's format:
    /// every key's sessions (their aggregate state as JSON), the watermark, the counts,
    /// and the number of events it covers. The first checkpoint is a full base, later
    /// ones deltas of the keys changed since (with a new base now and then).
    ///
    /// A job that stops after a checkpoint and is [`restore`](Self::restore)d from it
    /// continues exactly as if it had not stopped, given the events after the ones the
    /// checkpoint covers. What the job emitted after the checkpoint is emitted again:
    /// commit your outputs with the checkpoint for exactly once — a
    /// [`JsonLinesSink::exactly_once`](crate::api::sink::JsonLinesSink::exactly_once) file or
    /// an exactly-once Kafka sink is committed by this call.
    pub fn checkpoint(
        &mut self,
        checkpoints: &mut Checkpoints,
    ) -> Result<sessionizer_checkpoint::Committed, StateError> {
        let base = checkpoints.next_is_base(self.checkpointed)?
            || self.operators().any(SessionOperator::changes_lost);
        // One part per worker: every key for a base (those in a RocksDB store as its
        // image), else the changes.
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let mut parts = Vec::with_capacity(1 + self.workers.len());
        let mut images = Vec::new();
        for op in std::iter::once(&mut self.op).chain(self.workers.iter_mut()) {
            let mut entries = StateEntries::default();
            let mut encode = |s: &KeySessions<A::Acc>, buf: &mut Vec<u8>| json.encode(s, buf);
            match state::encode_keys(op, base, &mut entries, &mut encode) {
                Ok(image) => images.extend(image),
                Err(SpillError::Encode { key, reason }) => {
                    return Err(StateError::State {
                        dir: checkpoints.path().to_path_buf(),
                        reason: Box::new(StateEncodeError::Accumulator { key, reason }.into()),
                    });
                }
                Err(e) => return Err(e.into()),
            }
            parts.push(entries);
        }
        let c = self.counts;
        let manifest = Manifest {
            options: state_options::<A, E>(self.op.config(), self.valid),
            next_seq: self.seq,
            watermark: state::progress(&self.op, self.max_time),
            counters: Counters {
                records_read: c.events,
                in_sessions: c.in_sessions,
                late: c.late,
                invalid: c.invalid,
                sessions_emitted: c.sessions_emitted,
                retractions: c.retractions,
                ..Counters::default()
            },
            keys: self.operators().map(SessionOperator::keys).sum::<usize>() as u64,
            open_sessions: self.open_sessions_all() as u64,
            ..Manifest::default()
        };
        let committed = checkpoints.write(base, parts, images, manifest)?;
        self.operators_mut().for_each(|op| {
            op.track_changes(true);
            op.bound_tracked_changes();
        });
        self.checkpointed = true;
        Ok(committed)
    }

    /// Keeps the job's keyed state on `backend` (docs/semantics.md S-36), the command
    /// line's `--state-backend`. With [`StateBackend::RocksDb`] (cargo feature `rocksdb`)
    /// the keys in memory are held to about half of `memory_bytes`; the coldest (the
    /// earliest next deadline) go to a RocksDB store in `dir` (or a temporary
    /// directory), within the other half for its cache and write buffers, and come back
    /// when an event for them arrives or their deadline is due. The output is the memory
    /// backend's, record for record; checkpoints hold every key, wherever it is, in the
    /// same format. Your accumulator's size in memory is not measured (the budget
    /// counts keys and sessions). Call it before the first event and before
    /// [`restore`](Self::restore), once.
    pub fn set_state_backend(&mut self, backend: &StateBackend) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        if self.counts.events > 0 || self.op.keys() > 0 || self.spill_root.is_some() {
            return Err(StateError::Backend(
                "set_state_backend() must come once, before the job's first event and before restore()".into(),
            ));
        }
        match backend {
            StateBackend::Memory => Ok(()),
            StateBackend::RocksDb { memory_bytes, dir } => {
                self.open_rocks(*memory_bytes, dir.as_deref())
            }
        }
    }

    #[cfg(feature = "rocksdb")]
    fn open_rocks(&mut self, memory_bytes: u64, dir: Option<&Path>) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        let root = SpillRoot::choose(dir, None);
        self.open_stores(&root, memory_bytes, None)?;
        self.spill_root = Some(root);
        self.state_memory = memory_bytes;
        Ok(())
    }

    /// Gives every worker a RocksDB store in its part of `root`: an empty one, or with
    /// `copies` (a base's store copies, one per worker) one that starts as its
    /// shard's copy. A worker's earlier store is closed first (its directory is
    /// emptied for the new one); the workers hold no key in memory.
    #[cfg(feature = "rocksdb")]
    fn open_stores(
        &mut self,
        root: &SpillRoot,
        memory_bytes: u64,
        copies: Option<&[sessionizer_checkpoint::stores::LoadedStore]>,
    ) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        for op in self.operators_mut() {
            let detached = op.detach_spill();
            debug_assert!(detached, "a worker with keys in memory");
        }
        let codec =
            || -> Box<dyn StateCodec<_>> { Box::new(JsonAcc::<A::Acc>(std::marker::PhantomData)) };
        let ops = self.operators_mut().collect();
        crate::runtime::backend::open_stores(ops, root, memory_bytes, codec, copies)?;
        Ok(())
    }

    /// Starts every worker's store as its copy in a checkpoint's base (`copies`, one
    /// per worker: the base was written by as many), the command line's restore on
    /// RocksDB: their keys are not read. On an error every worker gets an empty store
    /// again, the job as it was.
    #[cfg(feature = "rocksdb")]
    fn link_stores(
        &mut self,
        copies: &[sessionizer_checkpoint::stores::LoadedStore],
    ) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        let root = self.spill_root.take().expect("a job on RocksDB");
        let mut linked = self.open_stores(&root, self.state_memory, Some(copies));
        if let Err(e) = linked {
            linked = self.open_stores(&root, self.state_memory, None).and(Err(e));
        }
        self.spill_root = Some(root);
        linked
    }

    #[cfg(not(feature = "rocksdb"))]
    fn link_stores(
        &mut self,
        _: &[sessionizer_checkpoint::stores::LoadedStore],
    ) -> Result<(), StateError> {
        unreachable!("no store without the rocksdb feature")
    }

    #[cfg(not(feature = "rocksdb"))]
    fn open_rocks(&mut self, _: u64, _: Option<&Path>) -> Result<(), StateError> {
        Err(StateError::Backend(
            crate::error::Unsupported::NoRocksDbLibrary.to_string(),
        ))
    }

    /// Continues from the newest checkpoint in `checkpoints` (`None` when there is
    /// none: the job starts afresh). Call it before the first event; then skip the
    /// [`Resumed::events`] the checkpoint covers. Refused, changing nothing, when the
    /// checkpoint was taken with other options (gap, lateness, emit mode, valid time
    /// range, aggregate state type) or its state cannot be read.
    pub fn restore(&mut self, checkpoints: &mut Checkpoints) -> Result<Option<Resumed>, StateError>
    where
        G: GapFn<E>,
        A::Acc: 'static,
    {
        let options = state_options::<A, E>(self.op.config(), self.valid);
        let Some((manifest, state)) = checkpoints.take_found(self.counts.events, &options)? else {
            return Ok(None);
        };
        if state.format_version() != codec::FORMAT {
            let reason = RestoreError::Format {
                found: state.format_version(),
                reads: codec::FORMAT,
            };
            return Err(checkpoints.keep_found((manifest, state), reason));
        }
        // Every key is decoded once before anything changes (a refused checkpoint
        // leaves the job as it was), then again to be put in: two reads, no copy of
        // the whole state in memory (with RocksDB it may be larger than memory). On
        // RocksDB with the base's number of workers, the stores start as the base's
        // copies of them, and only the keys in its files are read.
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let decodes = |_: &[u8], value: &[u8]| -> Result<(), crate::error::KeyStateError> {
            Ok(json.decode(value).map(drop)?)
        };
        let workers = 1 + self.workers.len();
        let linked = self.spill_root.is_some() && state.stores().len() == workers;
        let reader = crate::runtime::backend::store_reader();
        let checked = if linked {
            state::check_files(&state, decodes)
        } else {
            state::check_keys(&state, reader, decodes)
        };
        let keys = match checked {
            Ok(keys) => usize::try_from(keys).unwrap_or(usize::MAX),
            Err(e) => return Err(checkpoints.keep_found((manifest, state), e)),
        };
        let keys_linked: u64 = if linked {
            state.stores().iter().map(|s| s.keys).sum()
        } else {
            0
        };
        if linked && let Err(e) = self.link_stores(state.stores()) {
            return Err(
                checkpoints.keep_found((manifest, state), RestoreError::Stores(Box::new(e)))
            );
        }
        let w = &manifest.watermark;
        for op in self.operators_mut() {
            state::restore_progress(op, w);
            op.reserve_keys(keys / workers);
        }
        self.watermark.resume_at(Watermark(w.watermark_ms));
        self.max_time = w.max_event_time_ms.map(EventTime);
        let mut ops: Vec<_> = self.operators_mut().collect();
        let restored = if linked {
            state::restore_over_files(&state, workers, &mut ops[..], |ops, i, key, value| {
                let sessions = value.map(|v| json.decode(v)).transpose()?;
                Ok(ops[i].restore_over(key, sessions)?)
            })
        } else {
            state::restore_keys(
                &state,
                reader,
                workers,
                &mut ops[..],
                |ops, i, hash| ops[i].prefetch_index(hash),
                |ops, i, key, value| {
                    ops[i].restore_key(key, json.decode(value)?);
                    Ok(())
                },
                |_| {},
            )
        };
        if let Err(e) = restored {
            return Err(checkpoints.keep_found((manifest, state), e));
        }
        self.store_error()?;
        let c = &manifest.counters;
        self.counts = WindowCounts {
            events: c.records_read,
            in_sessions: c.in_sessions,
            late: c.late,
            invalid: c.invalid,
            sessions_emitted: c.sessions_emitted,
            retractions: c.retractions,
        };
        self.seq = manifest.next_seq;
        for op in self.operators_mut() {
            op.forget_changes();
            op.track_changes(true);
            op.bound_tracked_changes();
        }
        self.checkpointed = true;
        checkpoints.mark_restored();
        Ok(Some(Resumed {
            epoch: manifest.epoch,
            events: c.records_read,
            keys: manifest.keys,
            keys_linked,
        }))
    }
}

/// What the Kafka group driver (`crate::api::kafka::group`) runs a job as: one job per input
/// partition, on one worker, its state in memory; the driver decodes the records,
/// cuts the batches, moves idle partitions on and keeps the state in the changelog.
#[cfg(feature = "kafka")]
impl<E, K, T, W, A, G, C> SessionWindowJob<E, K, T, W, A, G, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    G: GapFn<E>,
    C: Clock,
{
    /// Puts a state store of the group's backend below the job's operator, for task
    /// `task` (before it is restored).
    pub(crate) fn attach_task_store(
        &mut self,
        stores: &crate::runtime::backend::TaskStores,
        task: &str,
    ) -> Result<(), crate::error::RunError>
    where
        A::Acc: 'static,
    {
        let codec = Box::new(JsonAcc::<A::Acc>(std::marker::PhantomData));
        let (store, hot) = stores.store_for(task, codec)?;
        self.op.spill_to(store, hot);
        Ok(())
    }

    /// The first failure of the job's state store since the last call (a key it could
    /// not read back, so a changelog drain may have missed it): the step is not
    /// committed.
    pub(crate) fn take_task_store_error(&mut self) -> Option<SpillError> {
        self.store_error().err()
    }

    /// Why the job cannot be a task of a group, if it cannot.
    pub(crate) fn task_refusal(&self) -> Option<crate::error::GroupJobRefusal> {
        crate::api::kafka::task_refusal(
            !self.workers.is_empty(),
            self.spill_root.is_some(),
            self.counts.events > 0 || self.checkpointed,
        )
    }

    /// The key of `event`, as the job computes it.
    pub(crate) fn key_into(&self, event: &E, out: &mut String) {
        self.key.key_into(event, out);
    }

    /// Pushes the decoded events of a batch whose first record has sequence number
    /// `first_seq` (the records after it count up from there).
    pub(crate) fn push_task_batch<S>(
        &mut self,
        events: Vec<E>,
        first_seq: u64,
        sessions: &mut S,
        on_late: impl FnMut(usize, Late<E>) -> Result<(), SinkError>,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        self.seq = self.seq.max(first_seq);
        self.push_events_with(events, sessions, on_late).map(drop)
    }

    /// Moves the watermark to `to` without events: an idle partition (`end` false), or
    /// the end of a bounded input (`end`: every session).
    pub(crate) fn advance_task<S>(
        &mut self,
        to: Watermark,
        end: bool,
        sessions: &mut S,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        if end {
            return self.advance_all(Watermark::MAX, Trigger::EndOfInput, None, sessions);
        }
        if to <= self.op.watermark() {
            return Ok(());
        }
        self.watermark.resume_at(to);
        let now = self.clock.now();
        self.advance_all(to, Trigger::Idle, Some(now), sessions)
    }

    /// Where event time stands.
    pub(crate) fn task_progress(&self) -> sessionizer_checkpoint::WatermarkState {
        state::progress(&self.op, self.max_time)
    }

    /// Puts event time back, before any key.
    pub(crate) fn restore_task_progress(&mut self, w: &sessionizer_checkpoint::WatermarkState) {
        state::restore_progress(&mut self.op, w);
        self.watermark.resume_at(Watermark(w.watermark_ms));
        self.max_time = w.max_event_time_ms.map(EventTime);
        self.checkpointed = true;
    }

    /// The options that shape the state, as its checkpoints record them.
    pub(crate) fn task_state_options(&self) -> Vec<(String, String)> {
        state_options::<A, E>(self.op.config(), self.valid)
    }

    /// Puts one key's sessions back from their encoding (the checkpoints').
    pub(crate) fn restore_task_key(
        &mut self,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), crate::error::KeyStateError> {
        let sessions = JsonAcc::<A::Acc>(std::marker::PhantomData).decode(value)?;
        self.op.restore_key(key, sessions);
        Ok(())
    }

    /// Starts remembering which keys change.
    pub(crate) fn track_task_changes(&mut self) {
        self.op.track_changes(true);
    }

    /// Calls `f` with every key whose sessions changed since the last call, encoded
    /// (`None`: gone); an accumulator its JSON writer refuses is an error naming it.
    pub(crate) fn drain_task_changes(
        &mut self,
        f: &mut crate::runtime::kafka::PutChange<'_>,
    ) -> Result<(), SpillError> {
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let mut encode = |s: &KeySessions<A::Acc>, buf: &mut Vec<u8>| json.encode(s, buf);
        state::drain_encoded(&mut self.op, &mut Vec::new(), &mut encode, f)
    }

    /// Calls `f` with every key and its encoded sessions.
    pub(crate) fn for_each_task_key(
        &self,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), SpillError> {
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let mut encode = |s: &KeySessions<A::Acc>, buf: &mut Vec<u8>| json.encode(s, buf);
        state::for_each_encoded(&self.op, &mut encode, f)
    }
}
