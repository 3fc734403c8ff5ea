//! How a session window job runs its events: in batches, on one worker or on several
//! ([`SessionWindowJob::set_workers`]), by the scheme of every job ([`crate::runtime`];
//! the command line's side of it is `jobs/json/shard.rs`). One worker is the same path
//! with one shard, whose records need no merge:
//!
//! 1. the calling thread reads each event of a batch once — its time (the valid-time
//!    guard), key, gap, the worker that owns the key, and the watermark after it — so
//!    the watermark sequence is that of one operator;
//! 2. every worker walks, on its own thread, the events of its keys and every event
//!    that raises the batch's largest watermark or gap ([`Walks`]; no other event
//!    changes its operator): it judges and applies the events of its keys, hears
//!    the gaps, and advances its operator whenever the watermark moves, tagging what it
//!    emits with the step and the record's place (the engine's [`walk`], the loop the
//!    command line's shards run too);
//! 3. the records are merged back in the order one operator emits them (by step, then
//!    the step's own records, then its completions by (close, key, start)), and the
//!    late events in input order.
//!
//! So the output is the same, record for record, for any number of workers.

use super::{
    Emission, GapFn, KeyFn, Late, Outcome, Retraction, SessionRecord, SessionWindowJob, Sink,
    SinkError, TimeFn, Trigger, WindowOutput,
};
use crate::api::late::TIME_OUT_OF_RANGE;
use crate::api::stream::time_is_valid;
use crate::runtime::{
    END_PART, Padded, Place, Step, Walked, Walker, Walks, end_part_lens, merge_order, shard_of,
    walk,
};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::aggregate::{Aggregator, Custom, CustomView};
use sessionizer_window::clock::{Clock, ProcessingTime};
use sessionizer_window::{
    Emit, SessionOperator, SessionView, TypedEvent, Verdict, WatermarkStrategy, session_id,
};

/// Events per batch of [`SessionWindowJob::run`] and
/// [`SessionWindowJob::push_batch`].
pub(super) const BATCH: usize = 4096;

/// The step of the end of input and of an idle advance, after every event of the batch.
const AFTER: u64 = u64::MAX;

type Op<A, E> = SessionOperator<Custom<A, E>>;

/// One event of a batch as every worker sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prep {
    /// The key in the batch's key bytes.
    key: (usize, usize),
    time: EventTime,
    gap: DurationMs,
    seq: u64,
}

/// What the workers do with a batch, or an advance of the watermark without events.
pub(super) enum Task<'a, E, C> {
    Batch {
        events: &'a [E],
        preps: &'a [Prep],
        /// Per worker, the indexes of the events it walks.
        walks: &'a Walks,
        keys: &'a [u8],
        clock: &'a C,
    },
    Advance {
        to: Watermark,
        /// The watermark the records show.
        shown: Watermark,
        trigger: Trigger,
        now: Option<ProcessingTime>,
        clock: &'a C,
    },
    /// A round of the end of input in parts ([`END_PART`]): a worker with more to
    /// emit and at most half a part unwritten emits up to a part more, after what it
    /// holds.
    FinishPart {
        /// The watermark the records show.
        shown: Watermark,
        now: ProcessingTime,
        clock: &'a C,
    },
}

/// One worker's outputs of a task (written by its worker on every event: on cache lines
/// of its own, see [`Padded`](crate::runtime::Padded)).
#[repr(align(128))]
pub(super) struct Outputs<O> {
    records: Vec<WindowOutput<O>>,
    places: Vec<Place>,
    late: Vec<(usize, Watermark, Outcome)>,
    in_sessions: u64,
    sessions: u64,
    retractions: u64,
    /// At the end of input, more sessions are still to be emitted.
    ending: bool,
}

impl<O> Default for Outputs<O> {
    fn default() -> Self {
        Outputs {
            records: Vec::new(),
            places: Vec::new(),
            late: Vec::new(),
            in_sessions: 0,
            sessions: 0,
            retractions: 0,
            ending: false,
        }
    }
}

/// Runs a task on every worker: the operators (the first, then the others) each with
/// its outputs. A plain function chosen where the thread-safety bounds hold
/// ([`SessionWindowJob::set_workers`]), so that `push`, `run`, `finish` and `tick` need
/// no more bounds than with one worker.
type OnWorkers<E, A, C> = fn(
    &crate::runtime::Workers,
    &mut Op<A, E>,
    &mut [Padded<Op<A, E>>],
    &mut [Outputs<<A as Aggregator<E>>::Output>],
    &Task<'_, E, C>,
);

/// The workers' threads and what they run.
pub(super) struct Workers<E, A: Aggregator<E>, C> {
    threads: crate::runtime::Workers,
    on_workers: OnWorkers<E, A, C>,
}

impl<E, A: Aggregator<E>, C> Workers<E, A, C>
where
    E: Sync,
    A: Send,
    A::Acc: Send,
    A::Output: Send,
    C: Clock + Sync,
{
    pub(super) fn new(threads: crate::runtime::Workers) -> Self {
        Workers {
            threads,
            on_workers: on_pool::<E, A, C>,
        }
    }
}

fn on_pool<E, A, C>(
    threads: &crate::runtime::Workers,
    first: &mut Op<A, E>,
    rest: &mut [Padded<Op<A, E>>],
    outs: &mut [Outputs<A::Output>],
    task: &Task<'_, E, C>,
) where
    E: Sync,
    A: Aggregator<E> + Send,
    A::Acc: Send,
    A::Output: Send,
    C: Clock + Sync,
{
    let mut parts: Vec<_> = std::iter::once(first)
        .chain(rest.iter_mut().map(|op| &mut op.0))
        .zip(outs.iter_mut())
        .collect();
    threads.on_each(&mut parts, |i, (op, out)| work(i as u32, op, out, task));
}

/// The operator's [`Emit`] for a worker's part of a task: builds the records, stamped
/// with the emission context (the clock is read once, at the first record), and notes
/// each one's place in the merged output.
struct EmitTo<'s, O, C> {
    records: &'s mut Vec<WindowOutput<O>>,
    places: &'s mut Vec<Place>,
    clock: &'s C,
    now: Option<ProcessingTime>,
    watermark: Watermark,
    trigger: Trigger,
    sessions: u64,
    retractions: u64,
    step: u64,
}

impl<'s, O, C: Clock> EmitTo<'s, O, C> {
    /// Emits into a worker's outputs, the records stamped with `watermark` and
    /// `trigger` (and `now`, else the clock at the first record).
    fn new(
        out: (&'s mut Vec<WindowOutput<O>>, &'s mut Vec<Place>),
        clock: &'s C,
        now: Option<ProcessingTime>,
        watermark: Watermark,
        trigger: Trigger,
    ) -> Self {
        EmitTo {
            records: out.0,
            places: out.1,
            clock,
            now,
            watermark,
            trigger,
            sessions: 0,
            retractions: 0,
            step: 0,
        }
    }

    fn emission(&mut self, complete: bool) -> Emission {
        let processing_time = *self.now.get_or_insert_with(|| self.clock.now());
        Emission {
            watermark: self.watermark,
            processing_time,
            trigger: match self.trigger {
                Trigger::Watermark | Trigger::Update if !complete => Trigger::Update,
                Trigger::Update => Trigger::Watermark,
                other => other,
            },
        }
    }
}

impl<A, E, C> Emit<Custom<A, E>> for EmitTo<'_, A::Output, C>
where
    A: Aggregator<E>,
    C: Clock,
{
    fn session<'a>(&mut self, s: &SessionView<'a, CustomView<'a, A, E>>) {
        self.sessions += 1;
        let emitted = self.emission(s.complete);
        self.places
            .push(Place::session(self.step, s.complete, s.close, s.start));
        self.records.push(WindowOutput::Session(SessionRecord {
            key: String::from_utf8_lossy(s.key).into_owned(),
            session_id: session_id(s.key, s.start.millis()),
            start: s.start,
            end: s.end,
            event_count: s.event_count,
            revision: s.revision,
            complete: s.complete,
            value: s.aggregates.finish(),
            emitted,
        }));
    }

    fn retraction(&mut self, key: &[u8], start: EventTime) {
        self.retractions += 1;
        self.places.push(Place::retraction(self.step, start));
        let emitted = self.emission(true);
        self.records.push(WindowOutput::Retraction(Retraction {
            key: String::from_utf8_lossy(key).into_owned(),
            session_id: session_id(key, start.millis()),
            start,
            emitted,
        }));
    }
}

/// A worker walking a batch of events.
struct BatchWalk<'a, 'e, E, A: Aggregator<E>, C> {
    op: &'a mut Op<A, E>,
    emit: &'a mut EmitTo<'e, A::Output, C>,
    events: &'a [E],
    preps: &'a [Prep],
    keys: &'a [u8],
    late: &'a mut Vec<(usize, Watermark, Outcome)>,
    in_sessions: &'a mut u64,
}

impl<E, A: Aggregator<E>, C: Clock> Walker for BatchWalk<'_, '_, E, A, C> {
    fn event(&mut self, step: &Step) -> Walked {
        // Listed with its own gap and the watermark after it: the record itself is
        // read only by the worker that owns its key.
        Walked {
            owner: step.owner,
            gap: step.own_gap().expect("every event is listed with its gap"),
            watermark: Watermark(step.mark),
        }
    }

    fn watermark(&self) -> Watermark {
        self.op.watermark()
    }

    fn apply(&mut self, at: u32) {
        let j = at as usize;
        let p = &self.preps[j];
        let before = self.op.watermark();
        self.emit.step = j as u64;
        self.emit.watermark = before;
        self.emit.trigger = Trigger::Update;
        let event = TypedEvent {
            key: &self.keys[p.key.0..p.key.0 + p.key.1],
            time: p.time,
            gap: p.gap,
            seq: p.seq,
            dedup: None,
            input: &self.events[j],
        };
        match self.op.on_typed(&event, self.emit) {
            Verdict::Applied | Verdict::Duplicate => *self.in_sessions += 1,
            Verdict::Late(reason) => self.late.push((j, before, Outcome::Late(reason))),
        }
    }

    fn hear_gap(&mut self, gap: DurationMs) {
        self.op.observe_gap(gap);
    }

    fn advance(&mut self, at: u32, to: Watermark) {
        self.emit.step = u64::from(at);
        self.emit.watermark = to.max(self.op.watermark());
        self.emit.trigger = Trigger::Watermark;
        self.op.advance_to(to, self.emit);
    }
}

/// One worker's part of a task.
fn work<E, A: Aggregator<E>, C: Clock>(
    me: u32,
    op: &mut Op<A, E>,
    out: &mut Outputs<A::Output>,
    task: &Task<'_, E, C>,
) {
    if let Task::FinishPart { shown, now, clock } = task {
        // The records of earlier rounds not yet written stay, in order.
        (out.sessions, out.retractions) = (0, 0);
        if out.ending && out.records.len() <= END_PART / 2 {
            let mut emit = EmitTo::new(
                (&mut out.records, &mut out.places),
                *clock,
                Some(*now),
                *shown,
                Trigger::EndOfInput,
            );
            emit.step = AFTER;
            out.ending = op.advance_at_most(Watermark::MAX, END_PART, &mut emit);
            (out.sessions, out.retractions) = (emit.sessions, emit.retractions);
        }
        return;
    }
    let Outputs {
        records,
        places,
        late,
        in_sessions,
        sessions,
        retractions,
        ending: _,
    } = out;
    records.clear();
    places.clear();
    late.clear();
    *in_sessions = 0;
    match task {
        Task::Batch {
            events,
            preps,
            walks,
            keys,
            clock,
        } => {
            let mut emit = EmitTo::new(
                (records, places),
                *clock,
                None,
                Watermark::MIN,
                Trigger::Update,
            );
            let mut batch = BatchWalk {
                op,
                emit: &mut emit,
                events,
                preps,
                keys,
                late,
                in_sessions,
            };
            walk(me, walks.of(me), &mut batch);
            *sessions = emit.sessions;
            *retractions = emit.retractions;
        }
        Task::Advance {
            to,
            shown,
            trigger,
            now,
            clock,
        } => {
            let mut emit = EmitTo::new((records, places), *clock, *now, *shown, *trigger);
            emit.step = AFTER;
            op.advance_to(*to, &mut emit);
            *sessions = emit.sessions;
            *retractions = emit.retractions;
        }
        Task::FinishPart { .. } => unreachable!("handled above"),
    }
}

fn key_of<O>(record: &WindowOutput<O>) -> &[u8] {
    match record {
        WindowOutput::Session(s) => s.key.as_bytes(),
        WindowOutput::Retraction(r) => r.key.as_bytes(),
    }
}

/// Sends the workers' records to `sessions` in the order one operator emits them.
fn merge<O, S: Sink<WindowOutput<O>>>(
    outs: &mut [Outputs<O>],
    sessions: &mut S,
) -> Result<(), SinkError> {
    if let [only] = outs {
        for record in only.records.drain(..) {
            sessions.send(record)?;
        }
        return Ok(());
    }
    let mut order: Vec<(usize, usize)> = Vec::new();
    merge_order(
        &mut order,
        outs.iter().map(|o| o.places.len()),
        |w, i| outs[w].places[i],
        |w, i| key_of(&outs[w].records[i]),
    );
    let mut records: Vec<Vec<Option<WindowOutput<O>>>> = outs
        .iter_mut()
        .map(|o| o.records.drain(..).map(Some).collect())
        .collect();
    for (w, i) in order {
        let record = records[w][i].take().expect("each record is sent once");
        sessions.send(record)?;
    }
    Ok(())
}

/// Sends the records of a round of the end of input in parts that no later record can
/// precede, in the order one operator emits them, and drops them from the workers'
/// outputs (the others wait for the next round).
fn merge_end_part<O, S: Sink<WindowOutput<O>>>(
    outs: &mut [Outputs<O>],
    sessions: &mut S,
) -> Result<(), SinkError> {
    let Some(lens) = end_part_lens(
        outs.len(),
        |w| outs[w].ending,
        |w| outs[w].places.len(),
        |w, i| outs[w].places[i].completion(key_of(&outs[w].records[i])),
    ) else {
        return Ok(()); // A worker emits in the next round.
    };
    let mut order: Vec<(usize, usize)> = Vec::new();
    merge_order(
        &mut order,
        lens.iter().copied(),
        |w, i| outs[w].places[i],
        |w, i| key_of(&outs[w].records[i]),
    );
    let mut records: Vec<Vec<Option<WindowOutput<O>>>> = outs
        .iter_mut()
        .zip(&lens)
        .map(|(o, &n)| {
            o.places.drain(..n);
            o.records.drain(..n).map(Some).collect()
        })
        .collect();
    for (w, i) in order {
        let record = records[w][i].take().expect("each record is sent once");
        sessions.send(record)?;
    }
    Ok(())
}

/// Runs a task on the job's one operator, or on every worker.
fn run_task<E, A: Aggregator<E>, C: Clock>(
    parallel: Option<&Workers<E, A, C>>,
    first: &mut Op<A, E>,
    rest: &mut [Padded<Op<A, E>>],
    outs: &mut [Outputs<A::Output>],
    task: &Task<'_, E, C>,
) {
    match parallel {
        Some(p) => (p.on_workers)(&p.threads, first, rest, outs, task),
        None => work(0, first, &mut outs[0], task),
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
    /// Pushes the events of a batch through the job's operators; returns what became of
    /// the last one.
    pub(super) fn push_events<S, L>(
        &mut self,
        events: Vec<E>,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<Outcome, SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        self.push_events_with(events, sessions, |_, l| late.send(l))
    }

    /// [`push_events`](Self::push_events), each late (or rejected) event given to
    /// `on_late` with its index in `events`.
    pub(crate) fn push_events_with<S>(
        &mut self,
        events: Vec<E>,
        sessions: &mut S,
        mut on_late: impl FnMut(usize, Late<E>) -> Result<(), SinkError>,
    ) -> Result<Outcome, SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        let workers = 1 + self.workers.len();
        let mut preps = Vec::with_capacity(events.len());
        let mut keys = Vec::new();
        let mut rejected = Vec::new();
        let mut current = self.op.watermark();
        self.walks.start(workers);
        for (j, event) in events.iter().enumerate() {
            let time = self.time.time_of(event);
            if !time_is_valid(self.valid, time) {
                rejected.push((j, current, Outcome::OutOfRange));
                preps.push(Prep {
                    key: (0, 0),
                    time,
                    gap: self.gap,
                    seq: 0,
                });
                continue;
            }
            self.key.key_into(event, &mut self.key_buf);
            let key = (keys.len(), self.key_buf.len());
            keys.extend_from_slice(self.key_buf.as_bytes());
            let w = match self.follow_upstream {
                true => current,
                false => self.watermark.observe(time),
            };
            self.max_time = Some(self.max_time.map_or(time, |m| m.max(time)));
            let worker = shard_of(self.key_buf.as_bytes(), workers);
            let gap = self.gap_fn.gap_of(event).unwrap_or(self.gap);
            preps.push(Prep {
                key,
                time,
                gap,
                seq: self.seq,
            });
            self.walks
                .list(j as u32, worker, w.millis(), Some(gap.millis()));
            self.seq += 1;
            current = current.max(w);
        }
        run_task(
            self.parallel.as_ref(),
            &mut self.op,
            &mut self.workers,
            &mut self.outputs,
            &Task::Batch {
                events: &events,
                preps: &preps,
                walks: &self.walks,
                keys: &keys,
                clock: &self.clock,
            },
        );
        self.store_error()?;

        let mut lates = rejected;
        for o in &mut self.outputs {
            self.counts.in_sessions += o.in_sessions;
            self.counts.sessions_emitted += o.sessions;
            self.counts.retractions += o.retractions;
            lates.append(&mut o.late);
        }
        lates.sort_unstable_by_key(|l| l.0);
        self.counts.events += events.len() as u64;
        let last = match lates.last() {
            Some(&(j, _, outcome)) if j + 1 == events.len() => outcome,
            _ => Outcome::InSession,
        };
        merge(&mut self.outputs, sessions)?;
        let mut lates = lates.into_iter().peekable();
        for (j, event) in events.into_iter().enumerate() {
            let Some(&(at, watermark, outcome)) = lates.peek() else {
                break;
            };
            if at != j {
                continue;
            }
            lates.next();
            let reason = match outcome {
                Outcome::Late(reason) => {
                    self.counts.late += 1;
                    reason.as_str()
                }
                _ => {
                    self.counts.invalid += 1;
                    TIME_OUT_OF_RANGE
                }
            };
            let time = preps[j].time;
            on_late(
                j,
                Late {
                    event,
                    time,
                    watermark,
                    reason,
                },
            )?;
        }
        if self.idle_timeout.is_some() {
            self.last_input = Some((self.clock.now(), self.op.watermark()));
        }
        Ok(last)
    }

    /// Moves every operator's watermark to `to` without events (the end of input, an
    /// idle advance) and sends what that emits.
    pub(crate) fn advance_all<S>(
        &mut self,
        to: Watermark,
        trigger: Trigger,
        now: Option<ProcessingTime>,
        sessions: &mut S,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        if trigger == Trigger::EndOfInput {
            return self.finish_in_parts(sessions);
        }
        run_task(
            self.parallel.as_ref(),
            &mut self.op,
            &mut self.workers,
            &mut self.outputs,
            &Task::Advance {
                to,
                shown: to,
                trigger,
                now,
                clock: &self.clock,
            },
        );
        self.store_error()?;
        for o in &self.outputs {
            self.counts.sessions_emitted += o.sessions;
            self.counts.retractions += o.retractions;
        }
        merge(&mut self.outputs, sessions)
    }

    /// The end of a bounded input: the watermark becomes +∞ and every session is
    /// emitted, in rounds of at most [`END_PART`] per worker written out as they come
    /// (records show the last watermark the events gave and one processing time), so
    /// that memory does not grow with the open sessions; the records are those of one
    /// `advance_to(+∞)` of one operator, in its order.
    fn finish_in_parts<S>(&mut self, sessions: &mut S) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        let (shown, now) = (self.op.watermark(), self.clock.now());
        for o in &mut self.outputs {
            o.records.clear();
            o.places.clear();
            o.late.clear();
            o.ending = true;
        }
        while self.outputs.iter().any(|o| o.ending) {
            run_task(
                self.parallel.as_ref(),
                &mut self.op,
                &mut self.workers,
                &mut self.outputs,
                &Task::FinishPart {
                    shown,
                    now,
                    clock: &self.clock,
                },
            );
            self.store_error()?;
            for o in &self.outputs {
                self.counts.sessions_emitted += o.sessions;
                self.counts.retractions += o.retractions;
            }
            // The last round, with no worker left to emit, writes all it holds.
            merge_end_part(&mut self.outputs, sessions)?;
        }
        Ok(())
    }
}
