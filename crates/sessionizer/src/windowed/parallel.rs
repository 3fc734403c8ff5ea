//! Several workers for one session window job ([`SessionWindowJob::set_workers`]), by
//! the command line's scheme (`pipeline/shard.rs`, `pipeline/mod.rs`'s merge):
//!
//! 1. the calling thread reads each event of a batch once — its time (the valid-time
//!    guard), key, gap, the worker that owns the key, and the watermark after it — so
//!    the watermark sequence is that of one operator;
//! 2. every worker walks the whole batch on its own thread: it judges and applies the
//!    events of its keys, hears every gap, and advances its operator at every step,
//!    tagging what it emits with the step and the record's place;
//! 3. the records are merged back in the order one operator emits them (by step, then
//!    the step's own records, then its completions by (close, key, start)), and the
//!    late events in input order.
//!
//! So the output is the same, record for record, for any number of workers.

use super::{
    EmitTo, GapFn, KeyFn, Late, Outcome, SessionWindowJob, Sink, SinkError, TimeFn, Trigger,
    WindowOutput,
};
use crate::late::TIME_OUT_OF_RANGE;
use crate::stream::time_is_valid;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::aggregate::{Aggregator, Custom};
use sessionizer_window::clock::{Clock, ProcessingTime};
use sessionizer_window::{SessionOperator, TypedEvent, Verdict, WatermarkStrategy};

/// Events per batch of [`SessionWindowJob::run`] and
/// [`SessionWindowJob::push_batch`] with several workers.
pub(super) const BATCH: usize = 4096;

/// The step of the end of input and of an idle advance, after every event of the batch.
const AFTER: u64 = u64::MAX;

/// Where one emitted record goes in the merged output (the command line's `Tag`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    /// The event of the batch whose step emitted it.
    pub step: u64,
    /// 0: caused by the step's own event (a retraction, an on-update record), in
    /// emission order; 1: a completion, ordered by (close, key, start) across workers.
    pub class: u8,
    pub close: i64,
    pub start: i64,
}

type Op<A, E> = SessionOperator<Custom<A, E>>;

/// One event of a batch as every worker sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prep {
    /// The owner of its key; `u32::MAX`: outside the valid time range (seen by none).
    worker: u32,
    /// The key in the batch's key bytes.
    key: (usize, usize),
    time: EventTime,
    gap: DurationMs,
    seq: u64,
    /// The watermark strategy's watermark after it.
    w: Watermark,
}

/// What the workers do with a batch, or an advance of the watermark without events.
pub(super) enum Task<'a, E, C> {
    Batch {
        events: &'a [E],
        preps: &'a [Prep],
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
}

/// One worker's outputs of a task.
pub(super) struct Outputs<O> {
    records: Vec<WindowOutput<O>>,
    places: Vec<Place>,
    late: Vec<(usize, Watermark, Outcome)>,
    in_sessions: u64,
    sessions: u64,
    retractions: u64,
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
        }
    }
}

/// Runs a task on every worker of a pool: the operators (the first, then the others)
/// each with its outputs. A plain function chosen where the thread-safety bounds hold
/// ([`SessionWindowJob::set_workers`]), so that `push`, `run`, `finish` and `tick` need
/// no more bounds than with one worker.
type OnWorkers<E, A, C> = fn(
    &rayon::ThreadPool,
    &mut Op<A, E>,
    &mut [Op<A, E>],
    &mut [Outputs<<A as Aggregator<E>>::Output>],
    &Task<'_, E, C>,
);

/// The workers' threads and what they run.
pub(super) struct Workers<E, A: Aggregator<E>, C> {
    pool: rayon::ThreadPool,
    on_workers: OnWorkers<E, A, C>,
    outs: Vec<Outputs<A::Output>>,
}

impl<E, A: Aggregator<E>, C> Workers<E, A, C>
where
    E: Sync,
    A: Send,
    A::Acc: Send,
    A::Output: Send,
    C: Clock + Sync,
{
    pub(super) fn new(pool: rayon::ThreadPool, workers: usize) -> Self {
        Workers {
            pool,
            on_workers: on_pool::<E, A, C>,
            outs: (0..workers).map(|_| Outputs::default()).collect(),
        }
    }
}

fn on_pool<E, A, C>(
    pool: &rayon::ThreadPool,
    first: &mut Op<A, E>,
    rest: &mut [Op<A, E>],
    outs: &mut [Outputs<A::Output>],
    task: &Task<'_, E, C>,
) where
    E: Sync,
    A: Aggregator<E> + Send,
    A::Acc: Send,
    A::Output: Send,
    C: Clock + Sync,
{
    // The first operator's part runs on this thread, the others' on the pool.
    let (first_out, rest_out) = outs.split_first_mut().expect("one operator at least");
    pool.in_place_scope(|scope| {
        for ((i, op), out) in (1u32..).zip(rest.iter_mut()).zip(rest_out.iter_mut()) {
            scope.spawn(move |_| work(i, op, out, task));
        }
        work(0, first, first_out, task);
    });
}

/// One worker's part of a task.
fn work<E, A: Aggregator<E>, C: Clock>(
    me: u32,
    op: &mut Op<A, E>,
    out: &mut Outputs<A::Output>,
    task: &Task<'_, E, C>,
) {
    let Outputs {
        records,
        places,
        late,
        in_sessions,
        sessions,
        retractions,
    } = out;
    records.clear();
    places.clear();
    late.clear();
    *in_sessions = 0;
    match task {
        Task::Batch {
            events,
            preps,
            keys,
            clock,
        } => {
            let mut emit = EmitTo::new(records, *clock, Watermark::MIN, Trigger::Update);
            emit.places = Some(places);
            for (j, p) in preps.iter().enumerate() {
                if p.worker == u32::MAX {
                    continue;
                }
                let mine = p.worker == me;
                let before = op.watermark();
                emit.step = j as u64;
                if mine {
                    emit.watermark = before;
                    emit.trigger = Trigger::Update;
                    let event = TypedEvent {
                        key: &keys[p.key.0..p.key.0 + p.key.1],
                        time: p.time,
                        gap: p.gap,
                        seq: p.seq,
                        dedup: None,
                        input: &events[j],
                    };
                    match op.on_typed(&event, &mut emit) {
                        Verdict::Applied | Verdict::Duplicate => *in_sessions += 1,
                        Verdict::Late(reason) => late.push((j, before, Outcome::Late(reason))),
                    }
                } else {
                    op.observe_gap(p.gap);
                }
                if mine || p.w > before {
                    emit.watermark = p.w.max(before);
                    emit.trigger = Trigger::Watermark;
                    op.advance_to(p.w, &mut emit);
                }
            }
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
            let mut emit = EmitTo::new(records, *clock, *shown, *trigger);
            emit.now = *now;
            emit.places = Some(places);
            emit.step = AFTER;
            op.advance_to(*to, &mut emit);
            *sessions = emit.sessions;
            *retractions = emit.retractions;
        }
    }
}

fn key_of<O>(record: &WindowOutput<O>) -> &str {
    match record {
        WindowOutput::Session(s) => &s.key,
        WindowOutput::Retraction(r) => &r.key,
    }
}

/// Sends the workers' records to `sessions` in the order one operator emits them.
fn merge<O, S: Sink<WindowOutput<O>>>(
    outs: &mut [Outputs<O>],
    sessions: &mut S,
) -> Result<(), SinkError> {
    let mut order: Vec<(usize, usize)> = Vec::new();
    for (w, o) in outs.iter().enumerate() {
        order.extend((0..o.places.len()).map(|i| (w, i)));
    }
    order.sort_unstable_by(|&(wa, ia), &(wb, ib)| {
        let (pa, pb) = (&outs[wa].places[ia], &outs[wb].places[ib]);
        pa.step
            .cmp(&pb.step)
            .then(pa.class.cmp(&pb.class))
            .then_with(|| {
                if pa.class == 0 {
                    // The step's own records all come from one worker, in order.
                    (wa, ia).cmp(&(wb, ib))
                } else {
                    let ka = key_of(&outs[wa].records[ia]);
                    let kb = key_of(&outs[wb].records[ib]);
                    (pa.close, ka, pa.start).cmp(&(pb.close, kb, pb.start))
                }
            })
    });
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

impl<E, K, T, W, A, G, C> SessionWindowJob<E, K, T, W, A, G, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    G: GapFn<E>,
    C: Clock,
{
    /// Pushes the events of a batch through every worker; returns what became of the
    /// last one.
    pub(super) fn push_parallel<S, L>(
        &mut self,
        events: Vec<E>,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<Outcome, SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        let workers = 1 + self.workers.len();
        let mut preps = Vec::with_capacity(events.len());
        let mut keys = Vec::new();
        let mut rejected = Vec::new();
        let mut current = self.op.watermark();
        for (j, event) in events.iter().enumerate() {
            let time = self.time.time_of(event);
            if !time_is_valid(self.valid, time) {
                rejected.push((j, current, Outcome::OutOfRange));
                preps.push(Prep {
                    worker: u32::MAX,
                    key: (0, 0),
                    time,
                    gap: self.gap,
                    seq: 0,
                    w: current,
                });
                continue;
            }
            self.key.key_into(event, &mut self.key_buf);
            let key = (keys.len(), self.key_buf.len());
            keys.extend_from_slice(self.key_buf.as_bytes());
            let w = self.watermark.observe(time);
            self.max_time = Some(self.max_time.map_or(time, |m| m.max(time)));
            preps.push(Prep {
                worker: crate::pipeline::parse::shard_of(self.key_buf.as_bytes(), workers),
                key,
                time,
                gap: self.gap_fn.gap_of(event).unwrap_or(self.gap),
                seq: self.seq,
                w,
            });
            self.seq += 1;
            current = current.max(w);
        }
        let parallel = self.parallel.as_mut().expect("several workers");
        (parallel.on_workers)(
            &parallel.pool,
            &mut self.op,
            &mut self.workers,
            &mut parallel.outs,
            &Task::Batch {
                events: &events,
                preps: &preps,
                keys: &keys,
                clock: &self.clock,
            },
        );
        self.store_error()?;

        let parallel = self.parallel.as_mut().expect("several workers");
        let mut lates = rejected;
        for o in &mut parallel.outs {
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
        merge(&mut parallel.outs, sessions)?;
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
            late.send(Late {
                event,
                time,
                watermark,
                reason,
            })?;
        }
        if self.idle_timeout.is_some() {
            self.last_input = Some((self.clock.now(), self.op.watermark()));
        }
        Ok(last)
    }

    /// Moves every worker's watermark to `to` without events (the end of input, an idle
    /// advance) and sends what that emits.
    pub(super) fn advance_parallel<S>(
        &mut self,
        to: Watermark,
        trigger: Trigger,
        now: Option<ProcessingTime>,
        sessions: &mut S,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        let shown = if trigger == Trigger::EndOfInput {
            self.op.watermark()
        } else {
            to
        };
        let parallel = self.parallel.as_mut().expect("several workers");
        (parallel.on_workers)(
            &parallel.pool,
            &mut self.op,
            &mut self.workers,
            &mut parallel.outs,
            &Task::Advance {
                to,
                shown,
                trigger,
                now,
                clock: &self.clock,
            },
        );
        self.store_error()?;
        let parallel = self.parallel.as_mut().expect("several workers");
        for o in &parallel.outs {
            self.counts.sessions_emitted += o.sessions;
            self.counts.retractions += o.retractions;
        }
        merge(&mut parallel.outs, sessions)
    }

    /// The end of a bounded input with several workers (see `finish`).
    pub(super) fn finish_parallel<S, L>(
        &mut self,
        sessions: &mut S,
        late: &mut L,
    ) -> Result<super::WindowCounts, SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
        L: Sink<Late<E>>,
    {
        self.advance_parallel(Watermark::MAX, Trigger::EndOfInput, None, sessions)?;
        sessions.flush()?;
        late.flush()?;
        Ok(self.counts)
    }
}
