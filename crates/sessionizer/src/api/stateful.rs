//! Arbitrary stateful processing over the user's own events: a function called per key
//! with the key's new events and a [`GroupState`] handle, in micro-batches.
//!
//! The rules — which events a call gets, which watermark it sees, when timeouts fire —
//! are those of [`sessionizer_window::stateful`]; this module adds the key and time
//! extractors, the batching of an input into micro-batches ([`Batching`]) and the sinks.

use crate::api::checkpoints::StateError;
use crate::api::late::{Late, TIME_OUT_OF_RANGE};
use crate::api::sink::{Sink, SinkError};
use crate::api::stream::{KeyFn, Stream, TimeFn, ValidTimes, time_is_valid};
use crate::runtime::backend::SpillRoot;
use crate::runtime::shard_of;
use sessionizer_core::Watermark;
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::clock::{Clock, SystemClock};
use sessionizer_window::stateful::{
    BatchReport, BatchRules, GroupState, LateEvent, LatePolicy, StatefulOperator,
};
use std::fmt;

mod checkpoint;
mod parallel;
#[cfg(feature = "kafka")]
mod task;

/// How [`StatefulJob::run`] cuts its input into micro-batches. Explicit batches
/// ([`StatefulJob::process_batch`]) are always possible too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// Every event is a batch of its own: the function sees each event as it comes and
    /// the watermark moves after each (the way Flink runs a `KeyedProcessFunction`).
    PerEvent,
    /// Batches of `n` consecutive events (the last may be shorter), like Spark
    /// micro-batches of `n` records. `0` counts as 1. In a Kafka consumer group
    /// (`KafkaGroup::run_stateful`, feature `kafka`) a
    /// micro-batch is `n` consecutive records of a partition — the records that are no
    /// event count too — so that its boundaries depend on the partition alone, never
    /// on how the records were polled: two runs, and a run restarted after a crash,
    /// call the function with the same events. A shorter micro-batch runs at the
    /// partition's end (`stop_at_end`) and when nothing came after its records for the
    /// idle timeout; without an idle timeout, records of a quiet partition wait until
    /// `n` are there.
    Events(usize),
}

impl Batching {
    fn size(self) -> usize {
        match self {
            Batching::PerEvent => 1,
            Batching::Events(n) => n.max(1),
        }
    }
}

/// Configures a stateful job; made by [`Stream::flat_map_groups_with_state`].
pub struct StatefulBuilder<E, K, T, W, S, F, C> {
    stream: Stream<E, K, T, W>,
    f: F,
    clock: C,
    late_policy: LatePolicy,
    rules: BatchRules,
    batching: Batching,
    state_ttl: Option<sessionizer_core::DurationMs>,
    idle_timeout: Option<sessionizer_core::DurationMs>,
    _state: std::marker::PhantomData<fn() -> S>,
}

impl<E, K, T, W: fmt::Debug, S, F, C: fmt::Debug> fmt::Debug
    for StatefulBuilder<E, K, T, W, S, F, C>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatefulBuilder")
            .field("stream", &self.stream)
            .field("clock", &self.clock)
            .field("late_policy", &self.late_policy)
            .field("rules", &self.rules)
            .field("batching", &self.batching)
            .field("state_ttl", &self.state_ttl)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl<E, K, T, W, S, F> StatefulBuilder<E, K, T, W, S, F, SystemClock> {
    pub(crate) fn new(stream: Stream<E, K, T, W>, f: F) -> Self {
        StatefulBuilder {
            stream,
            f,
            clock: SystemClock,
            late_policy: LatePolicy::Drop,
            rules: BatchRules::default(),
            batching: Batching::PerEvent,
            state_ttl: None,
            idle_timeout: None,
            _state: std::marker::PhantomData,
        }
    }
}

impl<E, K, T, W, S, F, C> StatefulBuilder<E, K, T, W, S, F, C> {
    /// The processing-time clock (default [`SystemClock`]; a
    /// [`ManualClock`](sessionizer_window::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> StatefulBuilder<E, K, T, W, S, F, C2> {
        StatefulBuilder {
            stream: self.stream,
            f: self.f,
            clock,
            late_policy: self.late_policy,
            rules: self.rules,
            batching: self.batching,
            state_ttl: self.state_ttl,
            idle_timeout: self.idle_timeout,
            _state: std::marker::PhantomData,
        }
    }

    /// What happens to events at or behind their batch's watermark (default
    /// [`LatePolicy::Drop`]: they go to the late sink).
    pub fn late_events(mut self, policy: LatePolicy) -> Self {
        self.late_policy = policy;
        self
    }

    /// The rules by which batches judge late events and fire timeouts (default
    /// [`BatchRules::Standard`]; [`BatchRules::Spark`] for Spark's).
    pub fn batch_rules(mut self, rules: BatchRules) -> Self {
        self.rules = rules;
        self
    }

    /// Lets a key's state expire once `ttl` of processing time has passed since a call
    /// last wrote it (`update`, `get_mut`), as Flink's `StateTtlConfig`
    /// (`OnCreateAndWrite`, never returning expired state): expired state is not handed
    /// to the function and is cleared at the first batch end that reaches its expiry,
    /// without a call. Off by default.
    pub fn state_ttl(mut self, ttl: sessionizer_core::DurationMs) -> Self {
        self.state_ttl = Some(ttl);
        self
    }

    /// Lets the watermark move on with the clock while the input is quiet (the command
    /// line's `--idle-timeout`, docs/semantics.md S-32, as
    /// [`SessionWindowBuilder::idle_timeout`](crate::api::windowed::SessionWindowBuilder::idle_timeout)
    /// does for session windows): once no event has come for `timeout` of processing
    /// time, [`StatefulJob::tick`] moves the watermark to the one of the last event plus
    /// the processing time passed since, so a quiet key's event-time timeouts still
    /// fire. Later events are judged against the watermark it reached. Off by default
    /// (a bounded input ends with [`finish`](StatefulJob::finish) instead). A job run by
    /// a [`KafkaGroup`](crate::api::kafka::KafkaGroup) moves each partition on by the
    /// group's own `idle_timeout`.
    pub fn idle_timeout(mut self, timeout: sessionizer_core::DurationMs) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// How [`StatefulJob::run`] cuts its input into batches (default
    /// [`Batching::PerEvent`]).
    pub fn batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
        self
    }

    /// The job.
    pub fn build(self) -> StatefulJob<E, K, T, W, S, F, C>
    where
        W: WatermarkStrategy,
        C: Clock,
    {
        let mut op = StatefulOperator::new(self.stream.watermark, self.clock)
            .with_late_policy(self.late_policy)
            .with_batch_rules(self.rules);
        if let Some(ttl) = self.state_ttl {
            op = op.with_state_ttl(ttl);
        }
        StatefulJob {
            op,
            key: self.stream.key,
            time: self.stream.time,
            valid: self.stream.valid,
            f: self.f,
            batching: self.batching,
            key_buf: String::new(),
            counts: StatefulCounts::default(),
            late_policy: self.late_policy,
            rules: self.rules,
            state_ttl: self.state_ttl,
            idle_timeout: self.idle_timeout,
            last_input: None,
            checkpointed: false,
            workers: Vec::new(),
            parallel: None,
            spill_root: None,
        }
    }
}

/// A stateful job's accounting: every event pushed was given to the function, late, or
/// invalid (`events = given to the function + late + invalid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatefulCounts {
    /// Events pushed.
    pub events: u64,
    /// Events sent to the late sink as behind the watermark.
    pub late: u64,
    /// Events whose time is outside the valid time range (sent to the late sink with
    /// reason [`TIME_OUT_OF_RANGE`], never given to the function).
    pub invalid: u64,
    /// Batches ended.
    pub batches: u64,
    /// Calls with events.
    pub data_calls: u64,
    /// Calls with `has_timed_out()`.
    pub timeout_calls: u64,
    /// Outputs the function returned.
    pub outputs: u64,
}

/// A running stateful job; made by [`StatefulBuilder::build`].
///
/// ```
/// use sessionizer::prelude::*;
///
/// // Pages per visit, reported once a visit has been quiet for 10 minutes of event time.
/// let mut job = Stream::<(String, EventTime)>::new()
///     .key_by(|(visit, _)| visit.clone())
///     .event_time(|(_, t)| *t)
///     .flat_map_groups_with_state(
///         |visit: &str, events: Vec<(String, EventTime)>, state: &mut GroupState<'_, u32>| {
///             if state.has_timed_out() {
///                 return state.remove().map(|pages| format!("{visit}: {pages} pages"));
///             }
///             let pages = state.get().copied().unwrap_or(0) + events.len() as u32;
///             state.update(pages);
///             let last = events.iter().map(|e| e.1).max().unwrap_or(EventTime(0));
///             state.set_timeout_timestamp(last.plus(minutes(10)));
///             None
///         },
///     )
///     .build();
/// let events = [("v1", 0), ("v1", 60_000), ("v2", 120_000)]
///     .map(|(v, t)| (v.to_string(), EventTime(t)));
/// let mut out = Vec::new();
/// job.run(events, &mut out, &mut Vec::new()).expect("vectors never refuse");
/// assert_eq!(out, ["v1: 2 pages", "v2: 1 pages"]);
/// ```
pub struct StatefulJob<E, K, T, W, S, F, C> {
    op: StatefulOperator<E, S, W, C>,
    key: K,
    time: T,
    valid: ValidTimes,
    f: F,
    batching: Batching,
    key_buf: String,
    counts: StatefulCounts,
    late_policy: LatePolicy,
    rules: BatchRules,
    state_ttl: Option<sessionizer_core::DurationMs>,
    idle_timeout: Option<sessionizer_core::DurationMs>,
    /// The processing time of the last event and the watermark it leads to (for the
    /// idle timeout).
    last_input: Option<(sessionizer_window::clock::ProcessingTime, Watermark)>,
    /// A checkpoint was written or restored: the next one may be a delta.
    checkpointed: bool,
    /// With [`set_workers`](StatefulJob::set_workers): the operators that own the other
    /// shards' keys, and their threads.
    workers: Vec<parallel::Worker<E, S, F>>,
    parallel: Option<Parallel<E, S, W, C, F>>,
    /// With the `rocksdb` backend ([`set_state_backend`](StatefulJob::set_state_backend)):
    /// where the operators' spill stores live.
    spill_root: Option<SpillRoot>,
}

/// How a job with workers runs a step on all its operators (chosen in
/// [`StatefulJob::set_workers`], where the thread-safety bounds hold, so that `push`,
/// `end_batch` and `finish` need no more bounds than with one worker), and the batch's
/// bookkeeping.
struct Parallel<E, S, W, C, F> {
    threads: crate::runtime::Workers,
    beat: parallel::Beat,
    on_all: OnAll<E, S, W, C, F>,
    /// A batch is open; the next event's index in it (its key's rank if it is the key's
    /// first); its late events (the job's own late check).
    open: bool,
    next_rank: u32,
    late: u64,
    /// The first operator's events of the open batch.
    first: parallel::Pending<E>,
}

impl<E, S, W: WatermarkStrategy, C: Clock, F> Parallel<E, S, W, C, F> {
    /// Opens a batch on the first operator, if none is open (it reads the clock), and
    /// gives the others its processing time.
    fn open_batch(&mut self, first: &mut StatefulOperator<E, S, W, C>) {
        if !self.open {
            self.beat.set_now(first.begin_batch());
            self.open = true;
        }
    }
}

/// Runs a step on every operator; the outputs come back merged, as a
/// `Vec<R::Item>` behind `Any` (the output type is the function's, which the job's
/// type does not name).
type OnAll<E, S, W, C, F> = fn(
    &crate::runtime::Workers,
    parallel::Step,
    &mut StatefulOperator<E, S, W, C>,
    &mut F,
    &mut parallel::Pending<E>,
    &mut [parallel::Worker<E, S, F>],
) -> (BatchReport, Box<dyn std::any::Any>);

fn on_all<E, S, W, C, F, R>(
    threads: &crate::runtime::Workers,
    step: parallel::Step,
    op: &mut StatefulOperator<E, S, W, C>,
    f: &mut F,
    first: &mut parallel::Pending<E>,
    workers: &mut [parallel::Worker<E, S, F>],
) -> (BatchReport, Box<dyn std::any::Any>)
where
    E: Send,
    S: Send,
    W: WatermarkStrategy + Send,
    C: Clock + Send,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R + Send,
    R: IntoIterator,
    R::Item: Send + 'static,
{
    let mut items: Vec<R::Item> = Vec::new();
    let report = parallel::run_step(threads, step, (op, f, first), workers, &mut |o| {
        items.push(o)
    });
    (report, Box::new(items))
}

impl<E, K, T, W: fmt::Debug, S: fmt::Debug, F, C: fmt::Debug> fmt::Debug
    for StatefulJob<E, K, T, W, S, F, C>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatefulJob")
            .field("op", &self.op)
            .field("batching", &self.batching)
            .field("counts", &self.counts)
            .finish()
    }
}

fn to_late<E>(l: LateEvent<E>) -> Late<E> {
    Late {
        event: l.event,
        time: l.time,
        watermark: l.watermark,
        reason: "behind_watermark",
    }
}

impl<E, K, T, W, S, F, C, R> StatefulJob<E, K, T, W, S, F, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    C: Clock,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
    R: IntoIterator,
    R::Item: 'static,
{
    /// Adds one event to the open batch (opening one: the clock is read then). A late
    /// event, or one whose time is outside the valid time range, goes to `late` at once.
    pub fn push<L: Sink<Late<E>>>(&mut self, event: E, late: &mut L) -> Result<(), SinkError> {
        let time = self.time.time_of(&event);
        self.counts.events += 1;
        if !time_is_valid(self.valid, time) {
            self.counts.invalid += 1;
            return late.send(Late {
                event,
                time,
                watermark: self.op.watermark(),
                reason: TIME_OUT_OF_RANGE,
            });
        }
        self.key.key_into(&event, &mut self.key_buf);
        let pushed = match &mut self.parallel {
            None => self.op.push(&self.key_buf, time, event),
            Some(p) => {
                p.open_batch(&mut self.op);
                let rank = p.next_rank;
                p.next_rank += 1;
                // The late check of one operator, here; each operator pushes its own
                // keys' events on its own thread when the batch ends.
                let late = self.op.is_late(time);
                self.op.observe(time);
                if late {
                    p.late += 1;
                    Some(LateEvent {
                        event,
                        time,
                        watermark: self.op.late_watermark(),
                    })
                } else {
                    match shard_of(self.key_buf.as_bytes(), 1 + self.workers.len()) {
                        0 => p.first.add(&self.key_buf, time, event, rank),
                        w => {
                            self.workers[w as usize - 1]
                                .batch
                                .add(&self.key_buf, time, event, rank)
                        }
                    }
                    None
                }
            }
        };
        if self.idle_timeout.is_some() {
            // The time keeper (the first operator) has seen every event's time.
            let watermark = self.op.next_watermark().max(self.op.watermark());
            self.last_input = Some((self.op.now(), watermark));
        }
        if let Some(l) = pushed {
            self.counts.late += 1;
            late.send(to_late(l))?;
        }
        Ok(())
    }

    /// Runs `step` on every operator (with workers), outputs to `out` in one
    /// operator's order.
    fn on_all<O: Sink<R::Item>>(
        &mut self,
        step: parallel::Step,
        out: &mut O,
    ) -> Result<BatchReport, SinkError> {
        let p = self.parallel.as_mut().expect("called with workers only");
        let (mut events, mut late) = (0, 0);
        if let parallel::Step::EndBatch = step {
            p.open_batch(&mut self.op);
            p.beat.set_watermark(self.op.next_watermark());
            p.open = false;
            events = u64::from(std::mem::take(&mut p.next_rank));
            late = std::mem::take(&mut p.late);
        }
        let (mut report, items) = (p.on_all)(
            &p.threads,
            step,
            &mut self.op,
            &mut self.f,
            &mut p.first,
            &mut self.workers,
        );
        report.events = events;
        report.late = late;
        let items = items
            .downcast::<Vec<R::Item>>()
            .expect("on_all was chosen for this job's output type");
        for item in *items {
            out.send(item)?;
        }
        Ok(report)
    }

    /// Ends the open batch (an empty one if none is open): data calls, watermark step,
    /// timeout calls; their outputs go to `out` in that order.
    pub fn end_batch<O: Sink<R::Item>>(&mut self, out: &mut O) -> Result<BatchReport, SinkError> {
        if self.parallel.is_some() {
            let report = self.on_all(parallel::Step::EndBatch, out)?;
            self.count(&report);
            self.store_error()?;
            return Ok(report);
        }
        let mut error = None;
        let report = self.op.end_batch(&mut self.f, &mut |o| {
            if error.is_none()
                && let Err(e) = out.send(o)
            {
                error = Some(e);
            }
        });
        self.count(&report);
        self.store_error()?;
        error.map_or(Ok(report), Err)
    }

    /// One explicit micro-batch: pushes `events`, then ends the batch.
    pub fn process_batch<I, O, L>(
        &mut self,
        events: I,
        out: &mut O,
        late: &mut L,
    ) -> Result<BatchReport, SinkError>
    where
        I: IntoIterator<Item = E>,
        O: Sink<R::Item>,
        L: Sink<Late<E>>,
    {
        for event in events {
            self.push(event, late)?;
        }
        self.end_batch(out)
    }

    /// Call on a timer while no events may come (a service does, say, every second):
    /// ends the open batch, or an empty one, so that processing-time timeouts that are
    /// due fire. With an [`idle_timeout`](StatefulBuilder::idle_timeout), once no event
    /// has come for that long the watermark also moves on with the clock — to the
    /// watermark of the last event plus the processing time passed since it, as the
    /// command line's `--idle-timeout` does — and the event-time timeouts due by then
    /// fire. Without an idle timeout, or before the first event, only the first.
    pub fn tick<O: Sink<R::Item>>(&mut self, out: &mut O) -> Result<BatchReport, SinkError> {
        let mut report = self.end_batch(out)?;
        let (Some(limit), Some((at, w))) = (self.idle_timeout, self.last_input) else {
            return Ok(report);
        };
        let quiet = self.op.now().0.saturating_sub(at.0);
        let Some(target) = crate::runtime::idle_watermark(limit.millis(), quiet, w)
            .filter(|&t| t > self.op.watermark())
        else {
            return Ok(report);
        };
        // No batch is open now: the time keeper moves, the batch end fires what is due
        // (on every operator: the others follow its watermark).
        self.op.raise_watermark(target);
        report.then(self.end_batch(out)?);
        Ok(report)
    }

    /// The end of a bounded input: ends the open batch, then every event-time timeout
    /// fires (watermark +∞); both sinks are flushed.
    pub fn finish<O, L>(&mut self, out: &mut O, late: &mut L) -> Result<StatefulCounts, SinkError>
    where
        O: Sink<R::Item>,
        L: Sink<Late<E>>,
    {
        if let Some(open) = self.parallel.as_ref().map(|p| p.open) {
            if open {
                self.end_batch(out)?;
            }
            if self.rules == BatchRules::Spark {
                // The no-data batch, as one operator's finish runs it.
                self.end_batch(out)?;
            }
            let now = self.op.now();
            let p = self.parallel.as_ref().expect("with workers");
            p.beat.set(Watermark::MAX, now);
            let report = self.on_all(parallel::Step::FinishAt(now), out)?;
            self.count(&report);
            self.store_error()?;
            out.flush()?;
            late.flush()?;
            return Ok(self.counts);
        }
        let mut error = None;
        let report = self.op.finish(&mut self.f, &mut |o| {
            if error.is_none()
                && let Err(e) = out.send(o)
            {
                error = Some(e);
            }
        });
        self.count(&report);
        self.store_error()?;
        if let Some(e) = error {
            return Err(e);
        }
        out.flush()?;
        late.flush()?;
        Ok(self.counts)
    }

    /// Runs a bounded input: batches of [`Batching`] events, then
    /// [`finish`](Self::finish).
    pub fn run<I, O, L>(
        &mut self,
        events: I,
        out: &mut O,
        late: &mut L,
    ) -> Result<StatefulCounts, SinkError>
    where
        I: IntoIterator<Item = E>,
        O: Sink<R::Item>,
        L: Sink<Late<E>>,
    {
        let size = self.batching.size();
        let mut in_batch = 0;
        for event in events {
            self.push(event, late)?;
            in_batch += 1;
            if in_batch == size {
                self.end_batch(out)?;
                in_batch = 0;
            }
        }
        self.finish(out, late)
    }

    fn count(&mut self, report: &BatchReport) {
        self.counts.batches = self.op.batches();
        self.counts.data_calls += report.data_calls;
        self.counts.timeout_calls += report.timeout_calls;
        self.counts.outputs += report.outputs;
    }

    /// The watermark of the open (or next) batch.
    pub fn watermark(&self) -> Watermark {
        self.op.watermark()
    }

    /// The accounting so far.
    pub fn counts(&self) -> StatefulCounts {
        self.counts
    }

    /// The state of `key`, if any. With the `rocksdb` backend only a key in memory is
    /// seen: [`with_state`](Self::with_state) sees them all.
    pub fn state(&self, key: &str) -> Option<&S> {
        match shard_of(key.as_bytes(), 1 + self.workers.len()) {
            0 => self.op.state(key),
            w => self.workers[w as usize - 1].op.state(key),
        }
    }

    /// Calls `f` with the state of `key` (`None`: it has none), wherever it is: in
    /// memory or, with the `rocksdb` backend, on disk.
    pub fn with_state<Q>(
        &self,
        key: &str,
        f: impl FnOnce(Option<&S>) -> Q,
    ) -> Result<Q, sessionizer_window::spill::SpillError> {
        match shard_of(key.as_bytes(), 1 + self.workers.len()) {
            0 => self.op.with_state(key, f),
            w => self.workers[w as usize - 1].op.with_state(key, f),
        }
    }

    /// The underlying operator (on the same keyed-state + timers core as the session
    /// window); with [`set_workers`](Self::set_workers), the first worker's.
    pub fn operator(&self) -> &StatefulOperator<E, S, W, C> {
        &self.op
    }

    /// Runs the job on `workers` threads (the command line's `--workers`), each owning
    /// the keys of one hash shard with an operator and a copy of the function of its
    /// own; the first keeps time for all (it sees every event's time and reads the clock
    /// once per batch), and each batch end runs on all of them at once. **The outputs,
    /// late events and counts are those of one worker, in the same order**: data calls
    /// by their key's first appearance in the batch, then timeouts and timers by
    /// deadline and key. Checkpoints are the same files whatever the number of workers
    /// and restore onto any number. Call it before the first event and before
    /// [`restore_checkpoint`](Self::restore_checkpoint).
    ///
    /// Each worker calls its own clone of the function: a function that keeps state
    /// of its own between calls (outside `GroupState`) sees only its workers' keys.
    /// Workers pay off with large batches ([`Batching::Events`]); with
    /// [`Batching::PerEvent`] every event is a step on every thread.
    pub fn set_workers(&mut self, workers: usize) -> Result<(), StateError>
    where
        E: Send,
        S: Send,
        W: Send,
        C: Send,
        F: Clone + Send,
        R::Item: Send,
    {
        if self.counts.events > 0
            || self.op.keys() > 0
            || self.checkpointed
            || self.spill_root.is_some()
        {
            return Err(StateError::Workers(
                "set_workers() must come before the job's first event, restore_checkpoint() and set_state_backend()"
                    .into(),
            ));
        }
        let workers = workers.max(1);
        if workers == 1 {
            self.workers.clear();
            self.parallel = None;
            return Ok(());
        }
        let threads =
            crate::runtime::Workers::start(workers, "sessionizer-stateful").map_err(|e| {
                StateError::Workers(format!("cannot start {workers} worker threads: {e}"))
            })?;
        let beat = parallel::Beat::default();
        self.workers = (1..workers)
            .map(|_| {
                let mut op = StatefulOperator::new(beat.clone(), beat.clone())
                    .with_late_policy(self.late_policy)
                    .with_batch_rules(self.rules);
                if let Some(ttl) = self.state_ttl {
                    op = op.with_state_ttl(ttl);
                }
                parallel::Worker {
                    op,
                    f: self.f.clone(),
                    batch: parallel::Pending::default(),
                }
            })
            .collect();
        self.parallel = Some(Parallel {
            threads,
            beat,
            on_all: on_all::<E, S, W, C, F, R>,
            open: false,
            next_rank: 0,
            late: 0,
            first: parallel::Pending::default(),
        });
        Ok(())
    }
}
