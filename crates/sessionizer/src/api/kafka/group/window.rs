//! A session-window job per partition: [`KafkaGroup::run_windows`], the task that
//! runs one, and its records as JSON.

use super::{KafkaGroup, Outputs, decode_batch};
use crate::api::sink::{Sink, SinkError};
use crate::api::stream::{KeyFn, TimeFn};
use crate::api::windowed::{GapFn, SessionWindowJob, WindowOutput};
use crate::error::{KeyStateError, RunError};
use crate::runtime::backend::TaskStores;
use crate::runtime::kafka::{Processed, PutChange, TaskFactory, TaskOp};
use crate::runtime::tagged::Tagged;
use crate::stats::RunStats;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::WatermarkState;
use sessionizer_connectors::Batch;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_core::Watermark;
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::aggregate::Aggregator;
use sessionizer_window::clock::Clock;
use sessionizer_window::codec;
use sessionizer_window::spill::{SpillCounts, SpillError};

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
        })
    }
}

/// Makes a session-window job per task.
struct WindowTasks<F> {
    new_job: F,
    options: Vec<(String, String)>,
    max_record: usize,
}

impl<F, E, K, T, W, A, G, C> TaskFactory for WindowTasks<F>
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
            out: Tagged::for_records(),
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
}

/// One task's session-window job, and the records of its last step.
struct WindowOp<E, K, T, W, A: Aggregator<E>, G, C> {
    job: SessionWindowJob<E, K, T, W, A, G, C>,
    out: Tagged,
    outputs: Outputs,
    /// The batch line of each decoded event of the last batch.
    lines: Vec<usize>,
    max_record: usize,
    /// The first error (an output or a state its serde implementation refused).
    error: Option<RunError>,
}

/// The job's records into a task's tagged buffer, as JSON.
struct Records<'a>(&'a mut Tagged);

impl<O: Serialize> Sink<WindowOutput<O>> for Records<'_> {
    fn send(&mut self, record: WindowOutput<O>) -> Result<(), SinkError> {
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
            outputs,
            lines,
            ..
        } = self;
        let pushed = job.push_task_batch(events, first_seq, &mut Records(out), |j, l| {
            let i = lines[j];
            outputs.handed_back(batch, names, i, first_seq + i as u64, &l);
            Ok(())
        });
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
        if let Err(e) = self.job.advance_task(w, false, &mut Records(&mut self.out)) {
            self.failed(e.into());
        }
    }

    fn finish(&mut self) {
        if let Err(e) = self
            .job
            .advance_task(Watermark::MAX, true, &mut Records(&mut self.out))
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
