//! What a task runs: the seam between the Kafka driver (partitions, rebalances,
//! changelogs, transactions, restores, standbys — the same for every job) and the
//! operator of one partition. The command line's JSON session window is one
//! implementation (`jobs::json::kafka`); the library's session-window and stateful jobs
//! are the others (`jobs::window`, `jobs::stateful`), so a library job in a consumer
//! group runs on this driver, not on a second one.
//!
//! The driver is generic over the implementation ([`TaskFactory::Op`]), so the
//! command line's path is compiled as before, without dynamic calls per record.

use crate::error::KeyStateError;
use crate::error::RunError;
use crate::runtime::backend::TaskStores;
use crate::runtime::tagged::Tagged;
use crate::stats::RunStats;
use crate::telemetry::KeyView;
use sessionizer_checkpoint::WatermarkState;
use sessionizer_connectors::Batch;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::spill::{SpillCounts, SpillError};

pub(crate) use crate::runtime::state::PutChange;

/// What came of decoding a batch ([`TaskOp::process`]).
#[derive(Debug, Default)]
pub(crate) struct Processed {
    /// Records (lines that are not blank).
    pub records: u64,
    /// Blank lines, skipped.
    pub blank: u64,
    /// Records that are not valid events (dead letters).
    pub invalid: u64,
    /// With `--on-invalid fail`, the first invalid record (line, reason): the batch was
    /// not processed.
    pub first_invalid: Option<(u32, String)>,
    /// Records whose key cannot belong to the task's partition ([`KeyPlacement`]).
    pub misplaced: u64,
    /// The first of them (line, key): the batch was not processed.
    pub first_misplaced: Option<(u32, String)>,
}

impl Processed {
    /// Checks the key of the record on line `line` against the partition's placement.
    pub(crate) fn check_key(
        &mut self,
        placement: &mut Option<KeyPlacement>,
        line: usize,
        key: &[u8],
    ) {
        if let Some(p) = placement
            && !p.admits(key)
        {
            self.misplaced += 1;
            if self.first_misplaced.is_none() {
                let key = String::from_utf8_lossy(key).into_owned();
                self.first_misplaced = Some((line as u32, key));
            }
        }
    }
}

/// One task's operator.
pub(crate) trait TaskOp: Send {
    /// Decodes and processes the staged records of `batch` (the line number of a record
    /// is its offset; `names` name the partitions for positions), the first with
    /// sequence number `first_seq` and the others after it in order. What comes out
    /// waits in the outputs until [`clear_outputs`](Self::clear_outputs).
    ///
    /// With a `placement`, every valid record's key is checked against the partition
    /// ([`Processed::check_key`]); when one cannot belong there the batch is not
    /// processed.
    fn process(
        &mut self,
        batch: &Batch,
        names: &[SourceName],
        first_seq: u64,
        placement: &mut Option<KeyPlacement>,
    ) -> Processed;

    /// The number of records one micro-batch of the operator holds, when its
    /// boundaries must be a function of the input alone (`None`: it takes records as
    /// they come). The driver then hands it whole micro-batches only — `n` records, or
    /// fewer when the partition reached its end (`--stop-at-end`) or was quiet for the
    /// idle timeout — and holds the rest back: a commit puts the task's position before
    /// them, so that a restart reads them again into the same micro-batches.
    fn batch_records(&self) -> Option<usize> {
        None
    }

    /// Forgets the outputs of the last step.
    fn clear_outputs(&mut self);

    /// Moves the watermark to `w` without an event (an idle partition); `step` is the
    /// sequence number of the next record.
    fn advance_idle(&mut self, w: Watermark, step: u64);

    /// The end of a bounded input: every session is emitted.
    fn finish(&mut self);

    /// From now on the watermark follows [`observe_upstream`](Self::observe_upstream)
    /// alone, not the times of the task's own records: the task reads a re-keyed topic
    /// (`--repartition`), whose partitions interleave records of every input partition
    /// in whatever order they were read.
    fn follow_upstream(&mut self);

    /// A re-keyed task's upstream time rose to `t` — the smallest, over every input
    /// partition, of the largest event time it forwarded: the watermark moves as if an
    /// event at `t` was observed, and what completes is emitted; `step` is the sequence
    /// number of the next record.
    fn observe_upstream(&mut self, t: EventTime, step: u64);

    /// The session records and retractions of the last step, each tagged with its
    /// session key and start.
    fn sessions(&self) -> &Tagged;

    /// The late-event records of the last step (one line each) and, per record, its
    /// sequence number and place in the buffer.
    fn late(&self) -> (&[u8], &[(u64, usize, usize)]);

    /// The dead-letter records of the last batch (one line each), and the batch line of
    /// each in order.
    fn dead_letters(&self) -> (&[u8], Vec<usize>);

    /// The watermark the next record is judged against.
    fn watermark(&self) -> Watermark;

    /// Where event time stands (the progress record's).
    fn progress(&self) -> WatermarkState;

    /// Puts event time back (before any key is restored).
    fn restore_progress(&mut self, w: &WatermarkState);

    /// Puts one key's state back from its changelog record, written in checkpoint
    /// format `format`.
    fn restore_key(&mut self, key: &[u8], value: &[u8], format: u16) -> Result<(), KeyStateError>;

    /// Starts remembering which keys change, for the changelog.
    fn track_changes(&mut self);

    /// Calls `f` for every key whose state changed since the last call, with the state
    /// encoded (`None`: the key has none any more), then forgets the changes.
    fn drain_changes(&mut self, f: &mut PutChange<'_>);

    /// Calls `f` with every key and its encoded state (a local snapshot).
    fn for_each_key(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError>;

    /// The first error of the task's operator since the last call (its state store
    /// failed, an output it could not write): the job stops before anything of the step
    /// is sent.
    fn take_error(&mut self) -> Option<RunError>;

    /// What the task's state store did (`None`: in memory).
    fn spill_counts(&self) -> Option<SpillCounts>;

    /// Adds the operator's own counts (verdicts, records emitted) to `stats`.
    fn add_counts(&self, stats: &mut RunStats);

    /// Sessions (or keys, for a stateful job) not yet final.
    fn open_sessions(&self) -> u64;

    /// Keys with state.
    fn keys(&self) -> u64;

    /// A key's state, for `/sessions?key=K` (`None`: none, or not shown by this job).
    fn describe(&self, _key: &[u8], _task: &str) -> Option<KeyView> {
        None
    }
}

/// Makes the operator of each task the driver creates, and says what shapes their
/// state.
pub(crate) trait TaskFactory: Sync {
    /// The operator of a task.
    type Op: TaskOp;

    /// The operator of a new task named `task` (`topic-partition`), its state store
    /// attached when the job has one.
    fn new_op(&self, task: &str, stores: Option<&TaskStores>) -> Result<Self::Op, RunError>;

    /// The options that shape the state, kept in every progress record: a restore with
    /// others is refused, naming them.
    fn options(&self) -> Vec<(String, String)>;

    /// The format version of the state records written to the changelogs.
    fn state_format(&self) -> u16;

    /// What reads the event time of an input record on the re-keying side of a
    /// `--repartition` job.
    type Times: UpstreamTimes;

    /// A reader of input records' event times, for the re-keying side.
    fn upstream_times(&self) -> Self::Times;
}

/// Reads the event time of an input record as the job's tasks will (`None`: not a valid
/// event, or its time is outside the valid range): the re-keying side publishes, per
/// input partition, the largest it forwarded.
pub(crate) trait UpstreamTimes {
    fn time_of(&mut self, record: &[u8]) -> Option<EventTime>;
}
