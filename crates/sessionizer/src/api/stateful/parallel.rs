//! A stateful job on several workers ([`StatefulJob::set_workers`]): each owns the keys
//! of one hash shard (the command line's assignment of keys to shards) with an
//! operator of its own. The job's first operator keeps time for all: it sees every
//! event's time, reads the clock once per batch, and the others follow its watermark
//! and processing time through a [`Beat`]. Every batch end runs on all operators at
//! once; their outputs, each tagged with its call's [`CallOrder`], are merged into the
//! order one operator emits them.
//!
//! [`StatefulJob::set_workers`]: super::StatefulJob::set_workers

use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::clock::{Clock, ProcessingTime};
use sessionizer_window::stateful::{
    BatchReport, CallOrder, DueRank, GroupState, StatefulOperator, TimeoutKind,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// The watermark and processing time of the batch being ended, set by the first
/// operator's side of the job for the others.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    watermark: AtomicI64,
    now: AtomicI64,
}

/// The time source of the operators that follow the first: a watermark strategy and a
/// clock that give what the job set.
#[derive(Debug, Clone, Default)]
pub(crate) struct Beat(Arc<Shared>);

impl Beat {
    pub(crate) fn set(&self, watermark: Watermark, now: ProcessingTime) {
        self.0
            .watermark
            .store(watermark.millis(), Ordering::Relaxed);
        self.0.now.store(now.millis(), Ordering::Relaxed);
    }

    pub(crate) fn set_now(&self, now: ProcessingTime) {
        self.0.now.store(now.millis(), Ordering::Relaxed);
    }

    pub(crate) fn set_watermark(&self, watermark: Watermark) {
        self.0
            .watermark
            .store(watermark.millis(), Ordering::Relaxed);
    }
}

impl WatermarkStrategy for Beat {
    fn observe(&mut self, _t: EventTime) -> Watermark {
        self.current()
    }

    fn current(&self) -> Watermark {
        match self.0.watermark.load(Ordering::Relaxed) {
            i64::MIN => Watermark::MIN,
            i64::MAX => Watermark::MAX,
            ms => Watermark::at(EventTime(ms)),
        }
    }
}

impl Clock for Beat {
    fn now(&self) -> ProcessingTime {
        ProcessingTime(self.0.now.load(Ordering::Relaxed))
    }
}

/// An operator that follows the first, with its own copy of the function (written by
/// its worker on every event: on cache lines of its own, see
/// [`Padded`](crate::runtime::Padded)).
#[repr(align(128))]
pub(crate) struct Worker<E, S, F> {
    pub(crate) op: StatefulOperator<E, S, Beat, Beat>,
    pub(crate) f: F,
    pub(crate) batch: Pending<E>,
}

/// The events of one operator's keys in the open batch, pushed by the operator's own
/// thread when the batch ends (none of them late: the job checked that).
pub(crate) struct Pending<E> {
    /// The keys, one after another.
    keys: String,
    /// (key's end in `keys`, time, event, rank of the event in the batch).
    events: Vec<(usize, EventTime, E, u32)>,
}

impl<E> Default for Pending<E> {
    fn default() -> Self {
        Pending {
            keys: String::new(),
            events: Vec::new(),
        }
    }
}

impl<E> Pending<E> {
    pub(crate) fn add(&mut self, key: &str, time: EventTime, event: E, rank: u32) {
        self.keys.push_str(key);
        self.events.push((self.keys.len(), time, event, rank));
    }

    /// Pushes every event into `op` (in input order), emptying the batch.
    fn push_into<S, W: WatermarkStrategy, C: Clock>(
        &mut self,
        op: &mut StatefulOperator<E, S, W, C>,
    ) {
        let mut start = 0;
        for (end, time, event, rank) in self.events.drain(..) {
            let late = op.push_ranked(&self.keys[start..end], time, event, rank);
            debug_assert!(late.is_none(), "the job pushes no late event");
            start = end;
        }
        self.keys.clear();
    }
}

/// [`CallOrder`], owned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tag {
    Data(u32),
    Due(TimeoutKind, i64, Vec<u8>, DueRank),
}

impl From<CallOrder<'_>> for Tag {
    fn from(o: CallOrder<'_>) -> Tag {
        match o {
            CallOrder::Data(rank, _) => Tag::Data(rank),
            CallOrder::Due(kind, at, key, what) => Tag::Due(kind, at, key.to_vec(), what),
        }
    }
}

/// What all operators do at once: end the open batch, or the second half of a finish.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    EndBatch,
    FinishAt(ProcessingTime),
}

/// One operator's part of a step: the first (it keeps time for all) or a follower.
enum Part<'a, E, S, W, C, F> {
    First(
        &'a mut StatefulOperator<E, S, W, C>,
        &'a mut F,
        &'a mut Pending<E>,
    ),
    Follower(&'a mut Worker<E, S, F>),
}

/// Runs `step` on every operator, each on its worker thread, then hands the outputs to
/// `emit` in one operator's order; returns the sum of the reports (the first
/// operator's watermark).
pub(crate) fn run_step<E, S, W, C, F, R>(
    threads: &crate::runtime::Workers,
    step: Step,
    first: (&mut StatefulOperator<E, S, W, C>, &mut F, &mut Pending<E>),
    workers: &mut [Worker<E, S, F>],
    emit: &mut impl FnMut(R::Item),
) -> BatchReport
where
    E: Send,
    S: Send,
    W: WatermarkStrategy + Send,
    C: Clock + Send,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R + Send,
    R: IntoIterator,
    R::Item: Send,
{
    fn one<E, S, W, C, F, R>(
        op: &mut StatefulOperator<E, S, W, C>,
        f: &mut F,
        batch: &mut Pending<E>,
        step: Step,
        out: &mut Vec<(Tag, R::Item)>,
    ) -> BatchReport
    where
        W: WatermarkStrategy,
        C: Clock,
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
    {
        batch.push_into(op);
        let mut tagged = |o: CallOrder<'_>, item| out.push((Tag::from(o), item));
        match step {
            Step::EndBatch => op.end_batch_ordered(f, &mut tagged),
            Step::FinishAt(now) => op.finish_at(now, f, &mut tagged),
        }
    }

    let mut outs: Vec<Vec<(Tag, R::Item)>> = (0..=workers.len()).map(|_| Vec::new()).collect();
    let mut reports = vec![BatchReport::default(); workers.len() + 1];
    let mut parts: Vec<_> = std::iter::once(Part::First(first.0, first.1, first.2))
        .chain(workers.iter_mut().map(Part::Follower))
        .zip(outs.iter_mut().zip(reports.iter_mut()))
        .collect();
    threads.on_each(&mut parts, |_, (part, (out, report))| {
        **report = match part {
            Part::First(op, f, batch) => one(op, f, batch, step, out),
            Part::Follower(w) => one(&mut w.op, &mut w.f, &mut w.batch, step, out),
        };
    });
    drop(parts);
    let mut all: Vec<(Tag, R::Item)> = outs.into_iter().flatten().collect();
    // Stable: the outputs of one call keep their order.
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, item) in all {
        emit(item);
    }
    let mut sum = reports[0];
    for r in &reports[1..] {
        sum.events += r.events;
        sum.late += r.late;
        sum.data_calls += r.data_calls;
        sum.timeout_calls += r.timeout_calls;
        sum.outputs += r.outputs;
    }
    sum
}
