//! Declarative session windows over the user's own events: key, time, gap (or a gap
//! per event), watermark, allowed lateness and aggregates; the engine does the rest
//! (`docs/semantics.md`).
//!
//! The job drives a [`SessionOperator`] one event at a time, exactly as the command line
//! does: judge the event against the watermark as it stood before it, apply it, move the
//! watermark, emit what became due.

use crate::api::checkpoints::StateError;
use crate::api::late::Late;
use crate::api::sink::{Sink, SinkError};
use crate::api::stream::{KeyFn, Stream, TimeFn, ValidTimes};
use crate::runtime::Padded;
use crate::runtime::backend::SpillRoot;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::aggregate::{Aggregator, Custom};
use sessionizer_window::clock::{Clock, ProcessingTime, SystemClock};
use sessionizer_window::spill::SpillError;
use sessionizer_window::{EmitMode, LateReason, SessionOperator, WatermarkStrategy, WindowConfig};
use std::fmt;

mod batches;
mod checkpoint;
mod output;
#[cfg(feature = "kafka")]
mod task;

#[cfg(feature = "kafka")]
pub(crate) use checkpoint::unwritable;
pub use output::{Emission, Retraction, SessionRecord, Trigger, WindowOutput};

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
            follow_upstream: false,
            spill_root: None,
            #[cfg(feature = "rocksdb")]
            state_memory: 0,
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
    workers: Vec<Padded<SessionOperator<Custom<A, E>>>>,
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
    /// A task of a re-keyed topic: the watermark follows the upstream partitions, not
    /// the events (`follow_task_upstream`, feature `kafka`).
    follow_upstream: bool,
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
        for op in self.operators_mut() {
            if let Some(e) = op.take_spill_error() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Every worker's operator, the first first: each holds the keys of one shard.
    pub fn operators(&self) -> impl Iterator<Item = &SessionOperator<Custom<A, E>>> {
        std::iter::once(&self.op).chain(self.workers.iter().map(|op| &op.0))
    }

    fn operators_mut(&mut self) -> impl Iterator<Item = &mut SessionOperator<Custom<A, E>>> {
        std::iter::once(&mut self.op).chain(self.workers.iter_mut().map(|op| &mut op.0))
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
            .map(|_| {
                Padded(SessionOperator::with_aggregate(
                    cfg.clone(),
                    Custom::new(aggregate.clone()),
                ))
            })
            .collect();
        self.outputs = (0..workers).map(|_| batches::Outputs::default()).collect();
        Ok(())
    }
}
