//! Phase two of a batch: one shard of the keys runs its own session operator over the
//! batch's records in input order.
//!
//! The watermark is a function of all event times, and final bounds are kept for the
//! largest gap of any event, so each shard must see every record that moves either:
//! it walks the records whose key it owns and every record that is a new largest time
//! or gap of its range ([`Parsed::walks`]) — no other record changes its watermark or
//! largest gap. So each shard computes the same watermark sequence as a single operator
//! would. Only the shard that owns a record's key judges and applies it (the loop is
//! the engine's [`walk`], the library's session windows run the same). What a shard
//! emits is tagged with the step (the record's position in the input) so that the
//! outputs of all shards can be put back in exactly the order one operator would have
//! produced them.

use crate::error::KeyStateError;
use crate::jobs::json::parse::{Kind, Parsed};
use crate::runtime::durable::CheckpointShard;
use crate::runtime::tagged::{END_STEP, Tagged};
use crate::runtime::{Step, Walked, Walker, state, walk};
use crate::stats::RunStats;
use crate::telemetry::TaskCounts;
use sessionizer_checkpoint::{StateEntries, WatermarkState};
use sessionizer_connectors::encode::{SourceName, encode_late};
use sessionizer_connectors::{Batch, SessionEncoder};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::codec;
use sessionizer_window::spill::{BaseImage, SpillError};
use sessionizer_window::watermark::WatermarkStrategy;
use sessionizer_window::{BoundedOutOfOrderness, Event, SessionOperator, Verdict, WindowConfig};

// The window encodes the values of the format the checkpoint files are framed with.
const _: () = assert!(codec::FORMAT == sessionizer_checkpoint::FORMAT_VERSION);

/// How many records ahead a shard asks for a key's index entry, and for its state.
const INDEX_AHEAD: usize = 16;
const STATE_AHEAD: usize = 8;

/// A shard walking one decoded range of a batch.
struct Range<'a> {
    shard: &'a mut Shard,
    batch: &'a Batch,
    part: &'a Parsed,
    first_step: u64,
    names: &'a [SourceName],
    aggregates: usize,
}

impl Walker for Range<'_> {
    #[inline]
    fn ahead(&mut self, later: &[Step]) {
        // With many keys their state is not in cache: ask for it ahead, the index
        // entry first, the slot it names later.
        let recs = &self.part.recs;
        let me = self.shard.index;
        if let Some(s) = later.get(INDEX_AHEAD - 1)
            && s.owner == me
        {
            self.shard.op.prefetch_index(recs[s.at as usize].hash);
        }
        if let Some(s) = later.get(STATE_AHEAD - 1)
            && s.owner == me
        {
            self.shard.op.prefetch_state(recs[s.at as usize].hash);
        }
    }

    #[inline]
    fn event(&mut self, step: &Step) -> Walked {
        debug_assert_eq!(self.part.recs[step.at as usize].kind, Kind::Valid);
        Walked {
            owner: step.owner,
            gap: step.own_gap().unwrap_or(self.shard.default_gap),
            watermark: match self.shard.follow_upstream {
                true => self.shard.op.watermark(),
                false => self.shard.watermark.observe(EventTime(step.mark)),
            },
        }
    }

    #[inline]
    fn watermark(&self) -> Watermark {
        self.shard.op.watermark()
    }

    #[inline]
    fn apply(&mut self, at: u32) {
        let (part, batch, shard) = (self.part, self.batch, &mut *self.shard);
        let rec = &part.recs[at as usize];
        let step = self.first_step + u64::from(rec.line);
        shard.out.step = step;
        let key = if rec.key_in_arena {
            &part.key_arena[rec.key.0 as usize..(rec.key.0 + rec.key.1) as usize]
        } else {
            &batch.data[rec.key.0 as usize..(rec.key.0 + rec.key.1) as usize]
        };
        let at = rec.values_at as usize;
        // Filled in place (collecting would move the whole array).
        let mut values: Values<'_> = Values::new();
        values.extend(
            part.values[at..at + self.aggregates]
                .iter()
                .map(|v| v.map(|(o, l)| &batch.data[o as usize..(o + l) as usize])),
        );
        let event = Event {
            key,
            time: EventTime(rec.time),
            gap: rec.gap.map_or(shard.default_gap, DurationMs),
            seq: step,
            dedup: rec.dedup,
            values: &values,
        };
        let before = shard.op.watermark();
        match shard.op.on_event_hashed(&event, rec.hash, &mut shard.out) {
            Verdict::Applied => shard.in_sessions += 1,
            Verdict::Duplicate => shard.duplicates += 1,
            Verdict::Late(reason) => {
                shard.late_count += 1;
                let span = batch.lines[rec.line as usize];
                let pos = self.names[span.input as usize].pos(span.at);
                let from = shard.late.len();
                let line = batch.line(rec.line as usize);
                encode_late(
                    &mut shard.late,
                    reason.as_str(),
                    pos,
                    before,
                    event.time,
                    line,
                );
                shard.late_steps.push((step, from, shard.late.len() - from));
            }
        }
    }

    #[inline]
    fn hear_gap(&mut self, gap: DurationMs) {
        self.shard.op.observe_gap(gap);
    }

    #[inline]
    fn advance(&mut self, at: u32, to: Watermark) {
        let rec = &self.part.recs[at as usize];
        self.shard.out.step = self.first_step + u64::from(rec.line);
        self.shard.op.advance_to(to, &mut self.shard.out);
    }
}

/// One shard: an operator, its own copy of the watermark, its outputs for the batch.
/// Written on every event by its worker: on cache lines of its own, see
/// [`Padded`](crate::runtime::Padded).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Shard {
    pub index: u32,
    pub op: SessionOperator,
    watermark: BoundedOutOfOrderness,
    default_gap: DurationMs,
    pub out: Tagged,
    /// Late-event records of the batch, and the step of each.
    pub late: Vec<u8>,
    pub late_steps: Vec<(u64, usize, usize)>,
    pub in_sessions: u64,
    pub duplicates: u64,
    pub late_count: u64,
    /// At the end of input, more sessions are still to be emitted.
    pub ending: bool,
    /// The watermark follows the upstream partitions of a re-keyed topic
    /// ([`observe_upstream`](Self::observe_upstream)), not the records' times.
    follow_upstream: bool,
}

/// The per-event aggregate values, on the stack for up to 8 aggregates.
type Values<'a> = smallvec::SmallVec<[Option<&'a [u8]>; 8]>;

impl Shard {
    pub fn new(
        index: u32,
        window: WindowConfig,
        delay: DurationMs,
        encoder: SessionEncoder,
        tagging: bool,
    ) -> Shard {
        Shard {
            index,
            default_gap: window.gap,
            op: SessionOperator::new(window),
            watermark: BoundedOutOfOrderness::new(delay),
            out: Tagged {
                encoder,
                tags: Vec::new(),
                keys: Vec::new(),
                completed: 0,
                tagging,
                step: 0,
                by_key: false,
            },
            late: Vec::new(),
            late_steps: Vec::new(),
            in_sessions: 0,
            duplicates: 0,
            late_count: 0,
            ending: false,
            follow_upstream: false,
        }
    }

    /// Runs the batch's records (decoded in `parsed`, range after range) through this
    /// shard. `first_step` is the input position of the batch's first line.
    pub fn process(
        &mut self,
        batch: &Batch,
        parsed: &[Parsed],
        first_step: u64,
        names: &[SourceName],
    ) {
        let aggregates = self.op.config().aggregates.len();
        for part in parsed {
            let me = self.index;
            let mut range = Range {
                shard: self,
                batch,
                part,
                first_step,
                names,
                aggregates,
            };
            walk(me, part.walks.of(me), &mut range);
        }
    }

    /// Moves the watermark to `w` without an event (a quiet live input, docs/semantics.md
    /// S-32): later events are judged against it, as if event time had moved on.
    pub fn advance_idle(&mut self, w: Watermark, step: u64) {
        self.watermark.resume_at(w);
        self.out.step = step;
        self.op.advance_to(w, &mut self.out);
    }

    /// From now on only [`observe_upstream`](Self::observe_upstream) moves the
    /// watermark.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn follow_upstream(&mut self) {
        self.follow_upstream = true;
    }

    /// The upstream partitions' time rose to `t`: the watermark strategy observes it
    /// as an event time, and the operator moves to the watermark that gives.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn observe_upstream(&mut self, t: EventTime, step: u64) {
        let w = self.watermark.observe(t);
        self.out.step = step;
        self.op.advance_to(w, &mut self.out);
    }

    /// The end of a bounded input: the watermark becomes +infinity, every session at
    /// once (the Kafka driver's end; the file pipeline uses
    /// [`finish_part`](Self::finish_part)).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn finish(&mut self) {
        self.out.step = END_STEP;
        self.op.advance_to(Watermark::MAX, &mut self.out);
    }

    /// The end of a bounded input in parts: the watermark becomes +infinity and at most
    /// `max` sessions are emitted (added to the outputs); returns whether more are due.
    pub fn finish_part(&mut self, max: usize) -> bool {
        self.out.step = END_STEP;
        self.op.advance_at_most(Watermark::MAX, max, &mut self.out)
    }

    pub fn clear_outputs(&mut self) {
        self.out.clear();
        self.late.clear();
        self.late_steps.clear();
    }

    /// The largest valid event time seen (by every shard alike).
    pub fn max_event_time(&self) -> Option<EventTime> {
        self.watermark.max_time()
    }

    /// Where event time stands, as a checkpoint records it.
    pub fn progress(&self) -> WatermarkState {
        state::progress(&self.op, self.max_event_time())
    }

    /// Encodes this shard's keyed state for a checkpoint: every key (`base`), or the keys
    /// changed or removed since the last checkpoint. Either way the changes are then
    /// forgotten: the checkpoint holds them. In a delta, keys spilled to the state
    /// backend's store are read back from it; for a base, the store gives an image of
    /// its keys (a RocksDB checkpoint) that the checkpoint writer reads on its own
    /// thread, so only the keys in memory are encoded here.
    pub fn encode_state(
        &mut self,
        base: bool,
        out: &mut StateEntries,
    ) -> Result<Option<BaseImage>, SpillError> {
        state::encode_keys(&mut self.op, base, out, &mut state::encode_builtin)
    }

    /// Puts one key's state back from a checkpoint of format `format` (after
    /// [`restore_progress`](Self::restore_progress): a format-1 value gets the floor its
    /// state implies at the restored watermark).
    pub fn restore_key(
        &mut self,
        key: &[u8],
        value: &[u8],
        format: u16,
    ) -> Result<(), KeyStateError> {
        let sessions = codec::decode_value(value, self.op.config(), format, self.op.watermark())?;
        self.op.restore_key(key, sessions);
        Ok(())
    }

    /// Puts one key's newest entry in a checkpoint's base file or deltas (`None`: a
    /// removal) over the store copy a restore started this shard's spill store from.
    pub fn restore_over(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        format: u16,
    ) -> Result<(), KeyStateError> {
        let sessions = value
            .map(|v| codec::decode_value(v, self.op.config(), format, self.op.watermark()))
            .transpose()?;
        Ok(self.op.restore_over(key, sessions)?)
    }

    /// Starts remembering which keys change, for incremental checkpoints.
    pub fn track_changes(&mut self) {
        self.op.track_changes(true);
    }

    /// Puts the watermark back: the largest event time and gap seen, and the
    /// operator's watermark (+infinity when the checkpointed run had flushed every
    /// session at the end of its input).
    pub fn restore_progress(&mut self, w: &WatermarkState) {
        if let Some(t) = w.max_event_time_ms {
            self.watermark.observe(EventTime(t));
        }
        state::restore_progress(&mut self.op, w);
    }
}

/// A task's counts for [`Telemetry::batch`]: the run's (`run`: records read, invalid,
/// blank lines, bytes) with its shards' (verdicts, emitted records).
pub(crate) fn task_counts(run: &RunStats, shards: &[Shard]) -> TaskCounts {
    let mut c = TaskCounts {
        invalid: run.invalid,
        blank_lines: run.blank_lines,
        bytes_read: run.bytes_read,
        ..TaskCounts::default()
    };
    for s in shards {
        let counts = s.op.counts();
        c.in_sessions += s.in_sessions;
        c.duplicates += s.duplicates;
        c.late += s.late_count;
        c.sessions_emitted += counts.sessions_emitted;
        c.retractions += counts.retractions;
    }
    c
}

/// Adds the shards' own counts (verdicts, emitted records) to the run's.
pub(crate) fn add_shard_counts(stats: &mut RunStats, shards: &[Shard]) {
    for s in shards {
        let counts = s.op.counts();
        stats.in_sessions += s.in_sessions;
        stats.duplicates += s.duplicates;
        stats.late += s.late_count;
        stats.sessions_emitted += counts.sessions_emitted;
        stats.retractions += counts.retractions;
    }
}

impl CheckpointShard for Shard {
    fn changes_lost(&self) -> bool {
        self.op.changes_lost()
    }

    fn encode_state(
        &mut self,
        base: bool,
        out: &mut StateEntries,
    ) -> Result<Option<BaseImage>, SpillError> {
        Shard::encode_state(self, base, out)
    }

    fn progress(&self) -> WatermarkState {
        Shard::progress(self)
    }

    fn keys(&self) -> u64 {
        self.op.keys() as u64
    }

    fn open_sessions(&self) -> u64 {
        self.op.open_sessions() as u64
    }

    fn add_counts(&self, stats: &mut RunStats) {
        add_shard_counts(stats, std::slice::from_ref(self));
    }
}
