//! A stateful job per partition: [`KafkaGroup::run_stateful`] and the task that runs
//! one, its outputs keyed by the key of the call that returned them.

use super::{KafkaGroup, Outputs, decode_batch};
use crate::api::late::Late;
use crate::api::sink::SinkError;
use crate::api::stateful::StatefulJob;
use crate::api::stream::{KeyFn, TimeFn};
use crate::error::{KeyStateError, RunError};
use crate::runtime::backend::TaskStores;
use crate::runtime::kafka::{Processed, PutChange, TaskFactory, TaskOp, UpstreamTimes};
use crate::runtime::tagged::Tagged;
use crate::stats::RunStats;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::WatermarkState;
use sessionizer_connectors::Batch;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::clock::Clock;
use sessionizer_window::spill::{SpillCounts, SpillError};
use sessionizer_window::stateful::{GroupState, SNAPSHOT_VERSION};

impl KafkaGroup {
    /// Runs a stateful job per partition (`flat_map_groups_with_state`): `new_job`
    /// builds one (on one worker, its store given by [`state_backend`](Self::state_backend)),
    /// called for every task this process takes on. Each output is a message keyed by the key of the call that returned it,
    /// partitioned by that key, its value the output as JSON. The state of each key
    /// (its state value, timeouts, timers, expiry) is in the changelog as in the job's
    /// checkpoints.
    ///
    /// Micro-batches ([`Batching`](crate::api::stateful::Batching)) are cut by the
    /// partition's records alone: with `Events(n)`, records `[k * n, (k + 1) * n)` of
    /// the partition are micro-batch `k` whatever the polls brought, and a commit puts
    /// the task's position before a micro-batch not yet full, so a restart or a
    /// rebalance cuts the same ones (docs/semantics.md K-10). The last, partial one runs
    /// at the end of a `--stop-at-end` partition or once the partition was quiet for the
    /// [`idle_timeout`](Self::idle_timeout). Processing time moves at each batch end.
    pub fn run_stateful<N, E, K, T, W, S, F, C, R>(&self, new_job: N) -> Result<RunStats, RunError>
    where
        N: Fn() -> StatefulJob<E, K, T, W, S, F, C> + Sync,
        StatefulJob<E, K, T, W, S, F, C>: Send,
        E: DeserializeOwned,
        K: KeyFn<E>,
        T: TimeFn<E>,
        W: WatermarkStrategy,
        S: Serialize + DeserializeOwned + Send + 'static,
        F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
        R: IntoIterator,
        R::Item: Serialize + 'static,
        C: Clock,
    {
        let probe = new_job();
        if let Some(refusal) = probe.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        let options = probe.task_state_options();
        drop(probe);
        self.run_tasks(StatefulTasks {
            new_job,
            options,
            max_record: self.max_record,
        })
    }
}

/// Makes a stateful job per task.
struct StatefulTasks<N> {
    new_job: N,
    options: Vec<(String, String)>,
    max_record: usize,
}

impl<N, E, K, T, W, S, F, C, R> TaskFactory for StatefulTasks<N>
where
    N: Fn() -> StatefulJob<E, K, T, W, S, F, C> + Sync,
    StatefulJob<E, K, T, W, S, F, C>: Send,
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    S: Serialize + DeserializeOwned + Send + 'static,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
    R: IntoIterator,
    R::Item: Serialize + 'static,
    C: Clock,
{
    type Op = StatefulOp<E, K, T, W, S, F, C>;

    fn new_op(&self, task: &str, stores: Option<&TaskStores>) -> Result<Self::Op, RunError> {
        let mut job = (self.new_job)();
        if let Some(refusal) = job.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        if let Some(stores) = stores {
            job.attach_task_store(stores, task)?;
        }
        Ok(StatefulOp {
            job,
            out: Tagged::for_keyed_records(),
            outputs: Outputs::default(),
            lines: Vec::new(),
            max_record: self.max_record,
            error: None,
        })
    }

    fn options(&self) -> Vec<(String, String)> {
        self.options.clone()
    }

    fn state_format(&self) -> u16 {
        SNAPSHOT_VERSION
    }

    type Times = StatefulTimes<E, K, T, W, S, F, C>;

    fn upstream_times(&self) -> Self::Times {
        StatefulTimes((self.new_job)(), self.max_record)
    }
}

/// The event times of input records, decoded and timed as a task's job does (with the
/// group's record size limit).
struct StatefulTimes<E, K, T, W, S, F, C>(StatefulJob<E, K, T, W, S, F, C>, usize);

impl<E, K, T, W, S, F, C, R> UpstreamTimes for StatefulTimes<E, K, T, W, S, F, C>
where
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    S: Serialize + DeserializeOwned,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
    R: IntoIterator,
    R::Item: 'static,
    C: Clock,
{
    fn time_of(&mut self, record: &[u8]) -> Option<EventTime> {
        let oversized = (record.len() > self.1).then_some(record.len() as u64);
        let event: E = crate::api::records::decode(record, oversized, self.1).ok()?;
        self.0.task_time_of(&event)
    }
}

/// One task's stateful job, and the records of its last step.
struct StatefulOp<E, K, T, W, S, F, C> {
    job: StatefulJob<E, K, T, W, S, F, C>,
    out: Tagged,
    outputs: Outputs,
    /// The batch line of each decoded event of the last batch.
    lines: Vec<usize>,
    max_record: usize,
    /// The first error (an output or a state its serde implementation refused).
    error: Option<RunError>,
}

impl<E, K, T, W, S, F, C, R> StatefulOp<E, K, T, W, S, F, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    S: Serialize + DeserializeOwned + Send + 'static,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
    R: IntoIterator,
    R::Item: Serialize + 'static,
    C: Clock,
{
    fn failed(&mut self, e: RunError) {
        self.error.get_or_insert(e);
    }

    /// Runs `step` with a writer of the job's outputs into the task's buffer.
    fn step(
        &mut self,
        step: impl FnOnce(
            &mut StatefulJob<E, K, T, W, S, F, C>,
            &mut dyn FnMut(&[u8], R::Item),
        ) -> Result<(), SinkError>,
    ) {
        let mut refused = None;
        let out = &mut self.out;
        let result = step(&mut self.job, &mut |key, item| {
            out.push_with(key, EventTime(0), false, false, |buf| {
                if let Err(e) = serde_json::to_writer(buf, &item) {
                    refused.get_or_insert(e);
                }
            })
        });
        if let Err(e) = result {
            self.failed(e.into());
        }
        if let Some(e) = refused {
            self.failed(SinkError::Encode(e).into());
        }
    }
}

impl<E, K, T, W, S, F, C, R> TaskOp for StatefulOp<E, K, T, W, S, F, C>
where
    StatefulJob<E, K, T, W, S, F, C>: Send,
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    S: Serialize + DeserializeOwned + Send + 'static,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
    R: IntoIterator,
    R::Item: Serialize + 'static,
    C: Clock,
{
    fn process(
        &mut self,
        batch: &Batch,
        names: &[SourceName],
        first_seq: u64,
        placement: &mut Option<KeyPlacement>,
    ) -> Processed {
        self.clear_outputs();
        let mut lines = std::mem::take(&mut self.lines);
        let (events, p) = decode_batch(
            batch,
            names,
            self.max_record,
            &mut self.outputs,
            &mut lines,
            placement,
            |e: &E, key: &mut String| self.job.key_into(e, key),
        );
        if p.first_misplaced.is_some() {
            self.lines = lines;
            return p;
        }
        // The driver hands over whole micro-batches of `size` records (see
        // `batch_records`): the records `[k * size, (k + 1) * size)` of the batch are
        // micro-batch k, and its events are one call per key. A record that is no
        // event (a dead letter, a blank line) still counts, so where a micro-batch
        // ends depends on the partition's records alone.
        let size = self.job.batch_size();
        let mut open: Option<usize> = None;
        // Where the job hands back a late event (one at a time).
        let mut lates: Vec<Late<E>> = Vec::new();
        for (event, &i) in events.into_iter().zip(&lines) {
            let micro_batch = i / size;
            if open.is_some_and(|k| k != micro_batch) {
                self.step(|job, out| job.end_task_batch(out));
            }
            open = Some(micro_batch);
            // A vector never refuses a late event.
            let _ = self.job.push(event, &mut lates);
            if let Some(l) = lates.pop() {
                self.outputs
                    .handed_back(batch, names, i, first_seq + i as u64, &l);
            }
        }
        if open.is_some() {
            self.step(|job, out| job.end_task_batch(out));
        }
        self.lines = lines;
        p
    }

    fn batch_records(&self) -> Option<usize> {
        Some(self.job.batch_size()).filter(|&n| n > 1)
    }

    fn clear_outputs(&mut self) {
        self.out.clear();
        self.outputs.clear();
    }

    fn advance_idle(&mut self, w: Watermark, _step: u64) {
        self.step(|job, out| job.advance_task(w, out));
    }

    fn finish(&mut self) {
        self.step(|job, out| job.finish_task(out));
    }

    fn follow_upstream(&mut self) {
        self.job.follow_task_upstream();
    }

    fn observe_upstream(&mut self, t: EventTime, _step: u64) {
        self.step(|job, out| job.observe_task_upstream(t, out));
    }

    fn sessions(&self) -> &Tagged {
        &self.out
    }

    fn late(&self) -> (&[u8], &[(u64, usize, usize)]) {
        (&self.outputs.late, &self.outputs.late_steps)
    }

    fn dead_letters(&self) -> (&[u8], Vec<usize>) {
        (&self.outputs.dead, self.outputs.dead_lines.clone())
    }

    fn watermark(&self) -> Watermark {
        self.job.watermark()
    }

    fn progress(&self) -> WatermarkState {
        self.job.task_progress()
    }

    fn restore_progress(&mut self, w: &WatermarkState) {
        if let Err(e) = self.job.restore_task_progress(w) {
            self.failed(RunError::Stateful(Box::new(e)));
        }
    }

    fn restore_key(&mut self, key: &[u8], value: &[u8], format: u16) -> Result<(), KeyStateError> {
        if format != SNAPSHOT_VERSION {
            return Err(KeyStateError::Version {
                what: "record version",
                what_short: "version",
                job: "stateful job",
                found: format,
                reads: SNAPSHOT_VERSION,
            });
        }
        self.job.restore_task_key(key, value)
    }

    fn track_changes(&mut self) {
        self.job.track_task_changes();
    }

    fn drain_changes(&mut self, f: &mut PutChange<'_>) {
        if let Err(e) = self.job.drain_task_changes(f) {
            self.failed(RunError::StateEncode(
                crate::error::StateEncodeError::TaskState(e),
            ));
        }
    }

    fn for_each_key(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError> {
        self.job.for_each_task_key(f)
    }

    fn take_error(&mut self) -> Option<RunError> {
        self.error.take()
    }

    fn spill_counts(&self) -> Option<SpillCounts> {
        self.job.task_spill_counts()
    }

    fn add_counts(&self, stats: &mut RunStats) {
        let c = self.job.counts();
        stats.in_sessions += c.events - c.late - c.invalid;
        stats.late += c.late;
        stats.invalid += c.invalid;
        stats.sessions_emitted += c.outputs;
    }

    fn open_sessions(&self) -> u64 {
        self.job.keys() as u64
    }

    fn keys(&self) -> u64 {
        self.job.keys() as u64
    }
}
