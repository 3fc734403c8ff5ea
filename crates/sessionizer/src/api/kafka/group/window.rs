//! A session-window job per partition: [`KafkaGroup::run_windows`], the task that
//! runs one, and its records as JSON.

use super::{KafkaGroup, Outputs, decode_batch};
use crate::api::sink::{Sink, SinkError};
use crate::api::stream::{KeyFn, TimeFn};
use crate::api::windowed::{GapFn, SessionRecord, SessionWindowJob, WindowOutput};
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
use sessionizer_window::aggregate::Aggregator;
use sessionizer_window::clock::Clock;
use sessionizer_window::codec;
use sessionizer_window::spill::{SpillCounts, SpillError};
use std::sync::Arc;

/// A user's mapping of a session record to its message, its value already JSON: the
/// message key and value, or `None` to send nothing.
type Shape<O> = Arc<
    dyn Fn(&SessionRecord<O>) -> Result<Option<(String, Vec<u8>)>, serde_json::Error> + Send + Sync,
>;

impl KafkaGroup {
    /// Runs a session-window job per partition: `new_job` builds one (on one worker,
    /// in memory: the group spreads partitions over processes and
    /// [`workers`](Self::workers)); it is called for every task this process takes
    /// on. Returns the run's accounting when it ends ([`stop_at_end`](Self::stop_at_end),
    /// or a stop asked of its [`telemetry`](Self::telemetry)); an error stops it
    /// without committing what the failing step produced.
    pub fn run_windows<F, E, K, T, W, A, G, C>(&self, new_job: F) -> Result<RunStats, RunError>
    where
        F: Fn() -> SessionWindowJob<E, K, T, W, A, G, C> + Sync,
        SessionWindowJob<E, K, T, W, A, G, C>: Send,
        E: DeserializeOwned,
        K: KeyFn<E>,
        T: TimeFn<E>,
        W: WatermarkStrategy,
        A: Aggregator<E>,
        A::Acc: Serialize + DeserializeOwned + 'static,
        A::Output: Serialize,
        G: GapFn<E>,
        C: Clock,
    {
        let probe = new_job();
        if let Some(refusal) = probe.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        let options = probe.task_state_options();
        drop(probe);
        self.run_tasks(WindowTasks {
            new_job,
            options,
            max_record: self.max_record,
            shape: None,
        })
    }

    /// As [`run_windows`](Self::run_windows), each session record shaped by `shape`
    /// into the message the user wants: its key (the partition follows from it) and its
    /// value, written as JSON — the book's `visit_id`, `start_time`, `end_time`,
    /// `visited_pages` and a processing context from the record's
    /// [`emitted`](SessionRecord::emitted) (watermark, processing time, trigger), say.
    /// `None` sends nothing for that record.
    ///
    /// A record keyed by the user's key cannot be retracted (a tombstone under that key
    /// would delete another session's record on a compacted topic), so the job must not
    /// retract: it emits with `EmitMode::Final` — each session once, when it can no
    /// longer change — or on close without allowed lateness. Another job is refused
    /// with [`GroupJobRefusal::Retracts`](crate::error::GroupJobRefusal::Retracts).
    pub fn run_windows_as<F, E, K, T, W, A, G, C, M, U>(
        &self,
        new_job: F,
        shape: M,
    ) -> Result<RunStats, RunError>
    where
        F: Fn() -> SessionWindowJob<E, K, T, W, A, G, C> + Sync,
        SessionWindowJob<E, K, T, W, A, G, C>: Send,
        E: DeserializeOwned,
        K: KeyFn<E>,
        T: TimeFn<E>,
        W: WatermarkStrategy,
        A: Aggregator<E>,
        A::Acc: Serialize + DeserializeOwned + 'static,
        A::Output: Serialize,
        G: GapFn<E>,
        C: Clock,
        M: Fn(&SessionRecord<A::Output>) -> Option<(String, U)> + Send + Sync + 'static,
        U: Serialize,
    {
        let probe = new_job();
        if let Some(refusal) = probe.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        if probe.task_can_retract() {
            return Err(RunError::Unsupported(
                crate::error::GroupJobRefusal::Retracts.into(),
            ));
        }
        let options = probe.task_state_options();
        drop(probe);
        let shape: Shape<A::Output> = Arc::new(move |record| {
            shape(record)
                .map(|(key, value)| serde_json::to_vec(&value).map(|v| (key, v)))
                .transpose()
        });
        self.run_tasks(WindowTasks {
            new_job,
            options,
            max_record: self.max_record,
            shape: Some(shape),
        })
    }
}

/// Makes a session-window job per task.
struct WindowTasks<F, O> {
    new_job: F,
    options: Vec<(String, String)>,
    max_record: usize,
    /// The user's shape of the records (`None`: the session records as they are,
    /// keyed by `session_id`).
    shape: Option<Shape<O>>,
}

impl<F, E, K, T, W, A, G, C> TaskFactory for WindowTasks<F, A::Output>
where
    F: Fn() -> SessionWindowJob<E, K, T, W, A, G, C> + Sync,
    SessionWindowJob<E, K, T, W, A, G, C>: Send,
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned + 'static,
    A::Output: Serialize,
    G: GapFn<E>,
    C: Clock,
{
    type Op = WindowOp<E, K, T, W, A, G, C>;

    fn new_op(&self, task: &str, stores: Option<&TaskStores>) -> Result<Self::Op, RunError> {
        let mut job = (self.new_job)();
        if let Some(refusal) = job.task_refusal() {
            return Err(RunError::Unsupported(refusal.into()));
        }
        if let Some(stores) = stores {
            job.attach_task_store(stores, task)?;
        }
        Ok(WindowOp {
            job,
            // Shaped records are keyed by the user's key, not by `session_id`.
            out: match self.shape {
                Some(_) => Tagged::for_keyed_records(),
                None => Tagged::for_records(),
            },
            shape: self.shape.clone(),
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
        codec::FORMAT
    }

    type Times = WindowTimes<E, K, T, W, A, G, C>;

    fn upstream_times(&self) -> Self::Times {
        WindowTimes((self.new_job)(), self.max_record)
    }
}

/// The event times of input records, decoded and timed as a task's job does (with the
/// group's record size limit).
struct WindowTimes<E, K, T, W, A: Aggregator<E>, G, C>(
    SessionWindowJob<E, K, T, W, A, G, C>,
    usize,
);

impl<E, K, T, W, A, G, C> UpstreamTimes for WindowTimes<E, K, T, W, A, G, C>
where
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    G: GapFn<E>,
    C: Clock,
{
    fn time_of(&mut self, record: &[u8]) -> Option<EventTime> {
        let oversized = (record.len() > self.1).then_some(record.len() as u64);
        let event: E = crate::api::records::decode(record, oversized, self.1).ok()?;
        self.0.task_time_of(&event)
    }
}

/// One task's session-window job, and the records of its last step.
struct WindowOp<E, K, T, W, A: Aggregator<E>, G, C> {
    job: SessionWindowJob<E, K, T, W, A, G, C>,
    out: Tagged,
    shape: Option<Shape<A::Output>>,
    outputs: Outputs,
    /// The batch line of each decoded event of the last batch.
    lines: Vec<usize>,
    max_record: usize,
    /// The first error (an output or a state its serde implementation refused).
    error: Option<RunError>,
}

/// The job's records into a task's tagged buffer, as JSON: as they are, or shaped by
/// the user.
struct Records<'a, O>(&'a mut Tagged, Option<&'a Shape<O>>);

impl<O: Serialize> Sink<WindowOutput<O>> for Records<'_, O> {
    fn send(&mut self, record: WindowOutput<O>) -> Result<(), SinkError> {
        if let Some(shape) = self.1 {
            let WindowOutput::Session(s) = &record else {
                // Refused before the job starts (run_windows_as).
                return Err(SinkError::Refused(
                    "a retraction of a record the user shaped",
                ));
            };
            if let Some((key, value)) = shape(s)? {
                self.0
                    .push_with(key.as_bytes(), s.start, s.complete, false, |buf| {
                        buf.extend_from_slice(&value)
                    });
            }
            return Ok(());
        }
        let mut failed = None;
        let (key, start, complete, retract) = match &record {
            WindowOutput::Session(s) => (s.key.as_bytes(), s.start, s.complete, false),
            WindowOutput::Retraction(r) => (r.key.as_bytes(), r.start, false, true),
        };
        self.0.push_with(key, start, complete, retract, |buf| {
            if let Err(e) = serde_json::to_writer(buf, &record) {
                failed = Some(e);
            }
        });
        failed.map_or(Ok(()), |e| Err(SinkError::Encode(e)))
    }
}

impl<E, K, T, W, A, G, C> WindowOp<E, K, T, W, A, G, C>
where
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned + 'static,
    A::Output: Serialize,
    G: GapFn<E>,
    C: Clock,
{
    fn failed(&mut self, e: RunError) {
        self.error.get_or_insert(e);
    }
}

impl<E, K, T, W, A, G, C> TaskOp for WindowOp<E, K, T, W, A, G, C>
where
    SessionWindowJob<E, K, T, W, A, G, C>: Send,
    E: DeserializeOwned,
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned + 'static,
    A::Output: Serialize,
    G: GapFn<E>,
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
        let (events, p) = decode_batch(
            batch,
            names,
            self.max_record,
            &mut self.outputs,
            &mut self.lines,
            placement,
            |e: &E, key: &mut String| self.job.key_into(e, key),
        );
        if p.first_misplaced.is_some() {
            return p;
        }
        let WindowOp {
            job,
            out,
            shape,
            outputs,
            lines,
            ..
        } = self;
        let pushed = job.push_task_batch(
            events,
            first_seq,
            &mut Records(out, shape.as_ref()),
            |j, l| {
                let i = lines[j];
                outputs.handed_back(batch, names, i, first_seq + i as u64, &l);
                Ok(())
            },
        );
        if let Err(e) = pushed {
            self.failed(e.into());
        }
        p
    }

    fn clear_outputs(&mut self) {
        self.out.clear();
        self.outputs.clear();
    }

    fn advance_idle(&mut self, w: Watermark, _step: u64) {
        if let Err(e) =
            self.job
                .advance_task(w, false, &mut Records(&mut self.out, self.shape.as_ref()))
        {
            self.failed(e.into());
        }
    }

    fn finish(&mut self) {
        if let Err(e) = self.job.advance_task(
            Watermark::MAX,
            true,
            &mut Records(&mut self.out, self.shape.as_ref()),
        ) {
            self.failed(e.into());
        }
    }

    fn follow_upstream(&mut self) {
        self.job.follow_task_upstream();
    }

    fn observe_upstream(&mut self, t: EventTime, _step: u64) {
        if let Err(e) = self
            .job
            .observe_task_upstream(t, &mut Records(&mut self.out, self.shape.as_ref()))
        {
            self.failed(e.into());
        }
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
        self.job.restore_task_progress(w);
    }

    fn restore_key(&mut self, key: &[u8], value: &[u8], format: u16) -> Result<(), KeyStateError> {
        if format != codec::FORMAT {
            return Err(KeyStateError::Version {
                what: "checkpoint format",
                what_short: "format",
                job: "library job",
                found: format,
                reads: codec::FORMAT,
            });
        }
        self.job.restore_task_key(key, value)
    }

    fn track_changes(&mut self) {
        self.job.track_task_changes();
    }

    fn drain_changes(&mut self, f: &mut PutChange<'_>) {
        if let Err(e) = self.job.drain_task_changes(f) {
            self.failed(match crate::api::windowed::unwritable(e) {
                Ok(refused) => refused.into(),
                Err(store) => store.into(),
            });
        }
    }

    fn for_each_key(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError> {
        self.job.for_each_task_key(f)
    }

    fn take_error(&mut self) -> Option<RunError> {
        self.error
            .take()
            .or_else(|| self.job.take_task_store_error().map(RunError::from))
    }

    fn spill_counts(&self) -> Option<SpillCounts> {
        self.job.operator().spill_counts()
    }

    fn add_counts(&self, stats: &mut RunStats) {
        let c = self.job.counts();
        stats.in_sessions += c.in_sessions;
        stats.late += c.late;
        stats.invalid += c.invalid;
        stats.sessions_emitted += c.sessions_emitted;
        stats.retractions += c.retractions;
    }

    fn open_sessions(&self) -> u64 {
        self.job.open_sessions() as u64
    }

    fn keys(&self) -> u64 {
        self.job.operator().keys() as u64
    }
}
