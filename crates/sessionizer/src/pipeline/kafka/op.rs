//! What a task runs: the seam between the Kafka driver (partitions, rebalances,
//! changelogs, transactions, restores, standbys — the same for every job) and the
//! operator of one partition. The command line's JSON session window is one
//! implementation ([`JsonOp`]); the library's session-window and stateful jobs are the
//! others (`crate::kafka::group`), so a library job in a consumer group runs on this
//! driver, not on a second one.
//!
//! The driver is generic over the implementation ([`TaskFactory::Op`]), so the
//! command line's path is compiled as before, without dynamic calls per record.

use super::super::RunError;
use super::super::backend::TaskStores;
use super::super::parse::{self, Kind, ParseSettings, Parsed};
use super::super::shard::{Shard, Tagged};
use crate::config::{OnInvalid, PipelineConfig};
use crate::engine::state;
use crate::error::KeyStateError;
use crate::stats::RunStats;
use crate::telemetry::KeyView;
use sessionizer_checkpoint::WatermarkState;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_connectors::{Batch, SessionEncoder};
use sessionizer_core::Watermark;
use sessionizer_core::decode::Decoder;
use sessionizer_window::spill::{SpillCounts, SpillError};

pub(crate) use crate::engine::state::PutChange;

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

    /// Forgets the outputs of the last step.
    fn clear_outputs(&mut self);

    /// Moves the watermark to `w` without an event (an idle partition); `step` is the
    /// sequence number of the next record.
    fn advance_idle(&mut self, w: Watermark, step: u64);

    /// The end of a bounded input: every session is emitted.
    fn finish(&mut self);

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
}

/// The command line's task: its JSON decoder and session window shard.
pub(crate) struct JsonOp {
    shard: Shard,
    decoder: Decoder,
    parsed: Parsed,
    aggregates: usize,
    on_invalid: OnInvalid,
    max_record: usize,
    value_buf: Vec<u8>,
}

/// The command line's tasks, from its configuration.
pub(crate) struct JsonTasks<'c> {
    cfg: &'c PipelineConfig,
    encoder: SessionEncoder,
}

impl<'c> JsonTasks<'c> {
    pub(crate) fn new(cfg: &'c PipelineConfig) -> JsonTasks<'c> {
        JsonTasks {
            cfg,
            encoder: SessionEncoder::new(&cfg.aggregate_names(), cfg.emit),
        }
    }
}

impl TaskFactory for JsonTasks<'_> {
    type Op = JsonOp;

    fn new_op(&self, task: &str, stores: Option<&TaskStores>) -> Result<JsonOp, RunError> {
        let mut shard = Shard::new(
            0,
            self.cfg.window_config(),
            self.cfg.watermark_delay,
            self.encoder.clone(),
            true,
        );
        if let Some(stores) = stores {
            stores.attach(self.cfg, &mut shard, task)?;
        }
        Ok(JsonOp {
            shard,
            decoder: Decoder::new(self.cfg.decoder_config()),
            parsed: Parsed::default(),
            aggregates: self.cfg.aggregates.len(),
            on_invalid: self.cfg.on_invalid,
            max_record: self.cfg.max_record,
            value_buf: Vec::new(),
        })
    }

    fn options(&self) -> Vec<(String, String)> {
        self.cfg.state_options()
    }

    fn state_format(&self) -> u16 {
        sessionizer_checkpoint::FORMAT_VERSION
    }
}

impl TaskOp for JsonOp {
    fn process(
        &mut self,
        batch: &Batch,
        names: &[SourceName],
        first_seq: u64,
        placement: &mut Option<KeyPlacement>,
    ) -> Processed {
        let n = batch.lines.len();
        let settings = ParseSettings {
            aggregates: self.aggregates,
            shards: 1,
            on_invalid: self.on_invalid,
            names,
            max_record: self.max_record,
        };
        parse::parse_range(batch, 0..n, &mut self.decoder, settings, &mut self.parsed);
        let p = &self.parsed;
        let mut processed = Processed {
            records: p.recs.len() as u64 - p.blank,
            blank: p.blank,
            invalid: p.invalid,
            first_invalid: p.first_invalid.clone(),
            ..Processed::default()
        };
        if placement.is_some() {
            for r in p.recs.iter().filter(|r| r.kind == Kind::Valid) {
                let (from, len) = (r.key.0 as usize, r.key.1 as usize);
                let key = match r.key_in_arena {
                    true => &p.key_arena[from..from + len],
                    false => &batch.data[from..from + len],
                };
                processed.check_key(placement, r.line as usize, key);
            }
        }
        if processed.first_invalid.is_none() && processed.first_misplaced.is_none() {
            self.shard.clear_outputs();
            self.shard
                .process(batch, std::slice::from_ref(&self.parsed), first_seq, names);
        }
        processed
    }

    fn clear_outputs(&mut self) {
        self.shard.clear_outputs();
        self.parsed.dead.clear();
        self.parsed.invalid = 0;
    }

    fn advance_idle(&mut self, w: Watermark, step: u64) {
        self.shard.advance_idle(w, step);
    }

    fn finish(&mut self) {
        self.shard.finish();
    }

    fn sessions(&self) -> &Tagged {
        &self.shard.out
    }

    fn late(&self) -> (&[u8], &[(u64, usize, usize)]) {
        (&self.shard.late, &self.shard.late_steps)
    }

    fn dead_letters(&self) -> (&[u8], Vec<usize>) {
        if self.parsed.invalid == 0 || self.on_invalid != OnInvalid::DeadLetter {
            return (&[], Vec::new());
        }
        let lines = self
            .parsed
            .recs
            .iter()
            .filter(|r| r.kind == Kind::Invalid)
            .map(|r| r.line as usize)
            .collect();
        (&self.parsed.dead, lines)
    }

    fn watermark(&self) -> Watermark {
        self.shard.op.watermark()
    }

    fn progress(&self) -> WatermarkState {
        self.shard.progress()
    }

    fn restore_progress(&mut self, w: &WatermarkState) {
        self.shard.restore_progress(w);
    }

    fn restore_key(&mut self, key: &[u8], value: &[u8], format: u16) -> Result<(), KeyStateError> {
        self.shard.restore_key(key, value, format)
    }

    fn track_changes(&mut self) {
        self.shard.track_changes();
    }

    fn drain_changes(&mut self, f: &mut PutChange<'_>) {
        let encode = &mut state::encode_builtin;
        state::drain_encoded(&mut self.shard.op, &mut self.value_buf, encode, f)
            .expect("the built-in aggregates' encoder refuses nothing");
    }

    fn for_each_key(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError> {
        state::for_each_encoded(&self.shard.op, &mut state::encode_builtin, f)
    }

    fn take_error(&mut self) -> Option<RunError> {
        self.shard.op.take_spill_error().map(RunError::from)
    }

    fn spill_counts(&self) -> Option<SpillCounts> {
        self.shard.op.spill_counts()
    }

    fn add_counts(&self, stats: &mut RunStats) {
        super::super::add_shard_counts(stats, std::slice::from_ref(&self.shard));
    }

    fn open_sessions(&self) -> u64 {
        self.shard.op.open_sessions() as u64
    }

    fn keys(&self) -> u64 {
        self.shard.op.keys() as u64
    }

    fn describe(&self, key: &[u8], task: &str) -> Option<KeyView> {
        super::super::lookup::describe(&self.shard, key, task)
    }
}
