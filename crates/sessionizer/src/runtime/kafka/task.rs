//! One input partition as a task: its operator, watermark, offsets and counters, and
//! its progress record in the changelog.

use crate::runtime::kafka::op::TaskOp;
use crate::stats::RunStats;
use serde::{Deserialize, Serialize};
use sessionizer_checkpoint::{Counters, WatermarkState};
use sessionizer_connectors::Batch;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_core::Watermark;
use std::collections::BTreeMap;
use std::time::Instant;

/// The version of the progress record's layout.
pub(super) const META_VERSION: u32 = 1;

/// A task's progress, the `m` record of its changelog partition (JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskMeta {
    /// Layout version of this record.
    pub(super) version: u32,
    /// The checkpoint format version of the state records (the value codec).
    pub(super) state_format: u16,
    /// The next input offset to read.
    pub(super) next_offset: i64,
    /// The sequence number of the task's next record (orders values of equal time).
    pub(super) next_seq: u64,
    /// Where event time stands in this partition.
    pub(super) watermark: WatermarkState,
    /// The task's accounting, cumulative over every process that held it.
    pub(super) counters: Counters,
    /// The end of the input was reached without `--keep-open`: every session was emitted.
    pub(super) flushed: bool,
    /// The options that shape the state; a restore with others is refused.
    pub(super) options: Vec<(String, String)>,
    /// A task of a re-keyed topic: the latest watermark record of each input partition
    /// (`topic/partition`) read so far.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) upstream: BTreeMap<String, UpstreamMark>,
    /// With a Delta table output: the task's last prepared epoch, its data files and
    /// whether they wait for a later table commit. Committed in the same transaction
    /// as the offsets, it is what a restore rolls the table forward to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) delta: Option<sessionizer_checkpoint::DeltaEpoch>,
}

/// What an input partition said of its time in its latest watermark record
/// (docs/semantics.md K-6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct UpstreamMark {
    /// The largest valid event time it forwarded (`i64::MAX`: it reached its end).
    pub(super) time: i64,
    /// It brought no record for the idle timeout: it does not hold the others back
    /// until its next record.
    pub(super) idle: bool,
}

impl UpstreamMark {
    /// Reads a watermark record's header: `topic/partition time` or `topic/partition
    /// idle`. An idle mark keeps the time it had.
    pub(super) fn hear(marks: &mut BTreeMap<String, UpstreamMark>, header: &[u8]) -> bool {
        let Some((name, what)) = std::str::from_utf8(header)
            .ok()
            .and_then(|h| h.rsplit_once(' '))
        else {
            return false;
        };
        if !marks.contains_key(name) {
            let unheard = UpstreamMark {
                time: i64::MIN,
                idle: false,
            };
            marks.insert(name.to_string(), unheard);
        }
        let mark = marks.get_mut(name).expect("inserted");
        match what {
            "idle" => mark.idle = true,
            t => match t.parse::<i64>() {
                Ok(t) => {
                    mark.time = mark.time.max(t);
                    mark.idle = false;
                }
                Err(_) => return false,
            },
        }
        true
    }

    /// The time a task of a re-keyed topic follows: the smallest over the input
    /// partitions `inputs` that are not idle, or, when all are idle, the largest of
    /// their times (every input is quiet: nothing holds the others back); `None` while
    /// one of them has said nothing yet.
    pub(super) fn least(marks: &BTreeMap<String, UpstreamMark>, inputs: &[String]) -> Option<i64> {
        let mut least: Option<i64> = None;
        let mut largest = i64::MIN;
        for name in inputs {
            let m = marks.get(name)?;
            largest = largest.max(m.time);
            if !m.idle {
                least = Some(least.map_or(m.time, |l| l.min(m.time)));
            }
        }
        least.or((largest > i64::MIN).then_some(largest))
    }
}

/// One input partition: its operator, watermark, offsets and counters. The tasks sit
/// side by side in the driver's map and several are processed at once on the workers:
/// on cache lines of their own, see [`Padded`](crate::runtime::Padded).
#[repr(align(128))]
pub(super) struct Task<O> {
    pub(super) tp: TopicPartition,
    /// `topic/partition` of the task first, then those of the partitions its records
    /// came from when they were re-keyed (`--repartition`): positions in side outputs
    /// name where a record was read first.
    pub(super) names: Vec<SourceName>,
    /// The offset of the last record staged (the task's own partition).
    pub(super) last_offset: i64,
    /// Its operator: decode, state, timers, outputs.
    pub(super) op: O,
    /// With `--on-invalid fail`: the first invalid record of the last batch (line,
    /// reason), which was not processed.
    pub(super) first_invalid: Option<(u32, String)>,
    /// The check that records are keyed into this partition by their session key
    /// (`None`: the topic is declared co-partitioned by a custom partitioner, or it is
    /// the job's own re-keying topic).
    pub(super) placement: Option<KeyPlacement>,
    /// The last batch's records that cannot belong to this partition: how many, and
    /// the first (line, key). The batch was not processed.
    pub(super) misplaced: (u64, Option<(u32, String)>),
    /// Records staged since the last processing: values as lines, line number = offset.
    pub(super) batch: Batch,
    /// The staged records' keys (`(start, len)` in `keys`, `len == u32::MAX`: none).
    pub(super) key_spans: Vec<(u32, u32)>,
    pub(super) keys: Vec<u8>,
    /// The staged records' offsets in the task's own partition.
    pub(super) offsets: Vec<i64>,
    /// Staged records held back from the last step because they do not fill a
    /// micro-batch of the operator ([`TaskOp::batch_records`]): staged again once the
    /// step's outputs are sent.
    pub(super) held: Option<Held>,
    /// Process what is staged even if it does not fill a micro-batch (the partition was
    /// quiet for the idle timeout).
    pub(super) cut: bool,
    /// When the last record was staged.
    pub(super) staged_at: Instant,
    /// The next offset to read (after the last record processed).
    pub(super) next_offset: i64,
    pub(super) next_seq: u64,
    /// `--stop-at-end`: the offset at which this partition is done.
    pub(super) end: Option<i64>,
    /// The changelog offset after the task's last committed record (what a local
    /// snapshot of the committed state covers); `None` before the first.
    pub(super) changelog_end: Option<i64>,
    /// Counters from before this process held the task.
    pub(super) carried: Counters,
    /// The task's cumulative counters at its last commit by this process (`carried`
    /// before the first).
    pub(super) committed: Counters,
    /// This process's counters for the task (the operator keeps its verdict counts).
    pub(super) run: RunStats,
    /// Processed records not yet committed.
    pub(super) dirty: bool,
    pub(super) flushed: bool,
    pub(super) last_input: Instant,
    pub(super) watermark_at_last_input: Watermark,
    /// A task of a re-keyed topic: the latest watermark record of each input partition.
    pub(super) upstream: BTreeMap<String, UpstreamMark>,
    /// A watermark record came since the watermark last followed them.
    pub(super) upstream_changed: bool,
    /// With a Delta table output: the task's own writer of the table (see
    /// `runtime/kafka/table.rs`).
    #[cfg_attr(not(feature = "delta"), allow(dead_code))]
    pub(super) table: Option<sessionizer_connectors::RecordWriter>,
    /// The task's last epoch of the table that a transaction committed (or is
    /// committing: see `table_prepared`).
    pub(super) delta: Option<sessionizer_checkpoint::DeltaEpoch>,
    /// An epoch of the table was prepared for the open transaction: once that commits,
    /// the table commits it.
    #[cfg_attr(not(feature = "delta"), allow(dead_code))]
    pub(super) table_prepared: bool,
}

impl<O: TaskOp> Task<O> {
    /// Runs the staged records through the operator (what comes out waits in its
    /// outputs); returns whether it ran (not when the records do not fill a
    /// micro-batch yet). With `--on-invalid fail`, a batch holding an invalid record is
    /// not processed: [`first_invalid`](Self::first_invalid) names the record.
    pub(super) fn process_staged(&mut self) -> bool {
        self.first_invalid = None;
        self.misplaced = (0, None);
        let staged = self.batch.lines.len();
        let n = self.whole_batches(staged);
        if n == 0 {
            return false;
        }
        if n < staged {
            self.held = Some(self.hold_from(n));
        }
        let p = self
            .op
            .process(&self.batch, &self.names, self.next_seq, &mut self.placement);
        self.first_invalid = p.first_invalid;
        self.misplaced = (p.misplaced, p.first_misplaced);
        if self.first_invalid.is_some() || self.misplaced.1.is_some() {
            return true;
        }
        self.run.blank_lines += p.blank;
        self.run.invalid += p.invalid;
        self.run.records_read += p.records;
        self.run.bytes_read += self.batch.data.len() as u64;
        self.next_seq += n as u64;
        // The records held back are read again after a restart: the task's position
        // is the first of them.
        self.next_offset = match &self.held {
            Some(h) => h.offsets[0],
            None => self.last_offset + 1,
        };
        self.dirty = true;
        self.last_input = Instant::now();
        self.watermark_at_last_input = self.op.watermark();
        true
    }

    /// How many of the `staged` records the next step runs: all of them, unless the
    /// operator cuts its input into micro-batches of `m` records whose boundaries must
    /// be the input's alone — then only whole micro-batches, the rest waiting for more
    /// records, the end of the partition (`--stop-at-end`) or a quiet partition.
    fn whole_batches(&mut self, staged: usize) -> usize {
        let cut = std::mem::take(&mut self.cut);
        let to_end = self.end.is_some_and(|e| self.last_offset + 1 >= e);
        match self.op.batch_records() {
            Some(m) if m > 1 && !cut && !to_end => staged / m * m,
            _ => staged,
        }
    }

    /// Takes the staged records from `at` on out of the batch.
    fn hold_from(&mut self, at: usize) -> Held {
        let batch = self.batch.split_off(at);
        let mut keys = Vec::new();
        let key_spans = self
            .key_spans
            .drain(at..)
            .map(|(from, len)| {
                if len == u32::MAX {
                    return (0, len);
                }
                let start = keys.len() as u32;
                keys.extend_from_slice(&self.keys[from as usize..(from + len) as usize]);
                (start, len)
            })
            .collect();
        let offsets = self.offsets.split_off(at);
        Held {
            batch,
            key_spans,
            keys,
            offsets,
        }
    }

    /// Forgets the records of the step just sent and stages again what was held back.
    pub(super) fn clear_processed(&mut self) {
        match self.held.take() {
            Some(h) => {
                self.batch = h.batch;
                self.key_spans = h.key_spans;
                self.keys = h.keys;
                self.offsets = h.offsets;
            }
            None => {
                self.batch.clear();
                self.key_spans.clear();
                self.keys.clear();
                self.offsets.clear();
            }
        }
    }

    /// This process's counts for the task, the operator's included.
    pub(super) fn run_counts(&self) -> RunStats {
        let mut total = self.run.clone();
        self.op.add_counts(&mut total);
        total
    }

    pub(super) fn counters(&self) -> Counters {
        let mut total = self.run_counts();
        total.add_counters(&self.carried);
        total.counters()
    }

    /// A watermark record at `offset` (its header `mark`) of the task's re-keyed
    /// partition: remembered, and the task's position moves past it. A malformed one is
    /// ignored (the job writes them all).
    pub(super) fn hear_upstream(&mut self, offset: i64, mark: &[u8]) {
        if UpstreamMark::hear(&mut self.upstream, mark) {
            self.upstream_changed = true;
        }
        if self.batch.lines.is_empty() {
            self.next_offset = offset + 1;
        } else {
            // Past it once the staged records before it are processed.
            self.last_offset = offset;
        }
        self.last_input = Instant::now();
        self.dirty = true;
    }

    /// Whether a record at `offset` is one this task processed or staged already.
    pub(super) fn is_stale(&self, offset: i64) -> bool {
        offset < self.next_offset || (!self.batch.lines.is_empty() && offset <= self.last_offset)
    }

    pub(super) fn done(&self) -> bool {
        self.end.is_some_and(|e| self.next_offset >= e)
    }

    pub(super) fn meta(&self, options: &[(String, String)], state_format: u16) -> TaskMeta {
        TaskMeta {
            version: META_VERSION,
            state_format,
            next_offset: self.next_offset,
            next_seq: self.next_seq,
            watermark: self.op.progress(),
            counters: self.counters(),
            flushed: self.flushed,
            options: options.to_vec(),
            upstream: self.upstream.clone(),
            delta: self.delta.clone(),
        }
    }
}

/// Staged records a step held back (see [`Task::held`]).
pub(super) struct Held {
    batch: Batch,
    key_spans: Vec<(u32, u32)>,
    keys: Vec<u8>,
    offsets: Vec<i64>,
}

/// Appends one record to a task's batch; returns the bytes staged.
pub(super) fn stage<O>(
    task: &mut Task<O>,
    offset: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    origin: Option<&[u8]>,
    max_record: usize,
) -> usize {
    let value = value.unwrap_or_default();
    // A re-keyed record is named by where it was read first.
    let (input, at) = origin
        .and_then(|o| std::str::from_utf8(o).ok())
        .and_then(|o| o.rsplit_once('@'))
        .and_then(|(name, at)| Some((name, at.parse::<u64>().ok()?)))
        .and_then(|(name, at)| {
            let (topic, partition) = name.rsplit_once('/')?;
            let source = SourceName::partition(topic, partition.parse().ok()?);
            let i = match task.names.iter().position(|n| *n == source) {
                Some(i) => i,
                None => {
                    task.names.push(source);
                    task.names.len() - 1
                }
            };
            Some((i as u32, at))
        })
        .unwrap_or((0, offset as u64));
    task.batch.push_record(value, input, at, max_record);
    task.offsets.push(offset);
    task.last_offset = offset;
    task.staged_at = Instant::now();
    match key {
        Some(k) => {
            task.key_spans
                .push((task.keys.len() as u32, k.len() as u32));
            task.keys.extend_from_slice(k);
        }
        None => task.key_spans.push((0, u32::MAX)),
    }
    value.len()
}

/// The Kafka key of the record on line `line` of a task's batch.
pub(super) fn message_key<O>(task: &Task<O>, line: usize) -> Option<&[u8]> {
    let &(from, len) = task.key_spans.get(line)?;
    (len != u32::MAX).then(|| &task.keys[from as usize..(from + len) as usize])
}
