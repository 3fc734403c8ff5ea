//! Checkpoints of a file or stdin run, and its recovery (docs/semantics.md S-35,
//! docs/checkpoint-format.md): what such a run records in a checkpoint beside its state
//! — how far each input file was read, with its identity — and how a later run
//! continues it. The checkpoint itself is taken by the runtime's committer
//! ([`crate::runtime::commit`]), which also makes the run's file outputs and its Kafka
//! output exactly once with it.
//!
//! A checkpoint is taken between two batches, when nothing is in flight: every record
//! of the batches so far has been judged, applied and encoded. Each shard encodes its
//! keyed state — every key for a base, only the keys changed or removed since the
//! previous checkpoint for a delta (in parallel, one buffer per shard) — and the
//! committer writes it out on a thread of its own while the pipeline goes on.
//!
//! A crash before the checkpoint is durable leaves the previous checkpoint as the
//! newest; the output written since is cut off on recovery and produced again from the
//! recorded input positions — so file outputs are exactly once. Stdout and stderr
//! cannot be cut back: they are at least once.
//!
//! Resuming: the options must equal the checkpoint's, each input must be the file that
//! was being read (same size and head), and the state is re-hashed into the shards of
//! this run, whatever their number. A checkpoint written at the end of the inputs with
//! `--keep-open` instead accepts new inputs: the next run continues its sessions.

use crate::config::{CheckpointConfig, PipelineConfig};
use crate::error::RunError;
use crate::runtime::commit::{Committer, StateChanges, Written};
use crate::runtime::kafka_sink::{Outcome, TopicSink};
use crate::stats::{CheckpointStats, RunStats};
use crate::telemetry::{CheckpointKind, CheckpointReport, Telemetry};
use sessionizer_checkpoint::{
    CheckpointWriter, Counters, InputPosition, LoadedState, Manifest, Recovered, StateDir,
    StateEntries, WatermarkState,
};
use sessionizer_connectors::input::ReadPosition;
use sessionizer_connectors::sink::EpochSink;
use sessionizer_connectors::{InputSource, OutputTarget};
use sessionizer_window::spill::{BaseImage, SpillError};
use std::path::Path;
use std::time::Instant;

/// What a checkpoint takes of one shard of a file or stdin job: its keys' state, where
/// event time stands, and its own counts. The command line's JSON shard is one.
pub(crate) trait CheckpointShard: Send {
    /// The shard forgot which keys changed (too many went to its store): the next
    /// checkpoint must be a base.
    fn changes_lost(&self) -> bool;
    /// Encodes every key (`base`) or the keys changed since the last checkpoint into
    /// `out`, then forgets the changes; a RocksDB store's image for a base.
    fn encode_state(
        &mut self,
        base: bool,
        out: &mut StateEntries,
    ) -> Result<Option<BaseImage>, SpillError>;
    /// Where event time stands.
    fn progress(&self) -> WatermarkState;
    /// Keys with state.
    fn keys(&self) -> u64;
    /// Sessions not yet final.
    fn open_sessions(&self) -> u64;
    /// Adds the shard's own counts (verdicts, records emitted) to `stats`.
    fn add_counts(&self, stats: &mut RunStats);
}
/// The roles of the file outputs, in the order the job holds them.
pub(crate) const ROLES: [&str; 3] = ["sessions", "dead-letter", "late"];

/// Where a run starts, decided from the state directory before anything is opened.
#[derive(Debug)]
pub(crate) struct Start {
    /// Where to start reading the inputs.
    pub position: ReadPosition,
    /// The input sequence number of the first line read.
    pub next_seq: u64,
    /// The checkpoint to restore, if any, with its verified state.
    pub restore: Option<(Manifest, LoadedState)>,
}

/// The checkpointing side of a running job.
#[derive(Debug)]
pub(crate) struct Durable {
    cfg: CheckpointConfig,
    /// Writes the checkpoints (syncing outputs, committing a Kafka output with them).
    committer: Committer,
    options: Vec<(String, String)>,
    /// This run's inputs: identity, and how far each was consumed.
    inputs: Vec<InputPosition>,
    /// The job's counters before this run (a resumed job keeps one accounting).
    pub carried: Counters,
    last_at: Instant,
    records_at_last: u64,
    /// One buffer of encoded entries per shard (with the committer while a
    /// checkpoint is being written).
    parts: Vec<StateEntries>,
    shards: usize,
    /// Input bytes consumed when this run started (a resumed run starts mid-input).
    start_offsets: u64,
    pub stats: CheckpointStats,
    telemetry: Telemetry,
}

fn dir_name(cfg: &CheckpointConfig) -> String {
    cfg.state_dir.display().to_string()
}

impl Durable {
    /// Opens the state directory, finds the checkpoint to resume from (reporting damaged
    /// newer ones to `telemetry`) and checks that this run may continue it. With a Kafka
    /// output (`sink`), its transactional id is claimed once the directory is locked, and
    /// a checkpoint whose transaction did not commit is discarded for the one before.
    pub fn open(
        pipeline: &PipelineConfig,
        cfg: &CheckpointConfig,
        shards: usize,
        telemetry: &Telemetry,
        mut sink: Option<&mut (dyn TopicSink + '_)>,
    ) -> Result<(Durable, Start), RunError> {
        let dir_label = dir_name(cfg);
        let mut inputs = Vec::with_capacity(pipeline.inputs.len());
        for source in &pipeline.inputs {
            match source {
                InputSource::File(path) => inputs.push(unread_input(path)?),
                InputSource::Delta(location) => inputs.push(unread_table(location)?),
                InputSource::Stdin => {
                    return Err(RunError::Resume {
                        dir: dir_label,
                        message:
                            "stdin cannot be resumed from a checkpoint; give input files with --input"
                                .into(),
                    });
                }
            }
        }
        let mut dir = StateDir::open(&cfg.state_dir)?;
        dir.fail_write_at(cfg.fail_write_at);
        // Locked: now this process may fence the job's previous one.
        if let Some(sink) = sink.as_deref_mut() {
            sink.claim(Some(&cfg.state_dir))?;
        }
        let reading = Instant::now();
        let recovery = dir.recover()?;
        for (epoch, damage) in &recovery.skipped {
            telemetry.damaged_checkpoint(&dir_label, *epoch, damage);
        }
        let warn = &mut |m: &str| telemetry.warn(m);
        let (found, discard) = resolve_transaction(&dir, recovery.found, sink, warn)?;
        let read_us = reading.elapsed().as_micros() as u64;
        let options = pipeline.state_options();
        let start = match found {
            None => Start {
                position: ReadPosition::default(),
                next_seq: 0,
                restore: None,
            },
            Some(found) => plan_resume(
                pipeline,
                &dir_label,
                &options,
                &mut inputs,
                found.manifest,
                found.state,
            )?,
        };
        let carried = start
            .restore
            .as_ref()
            .map(|(m, _)| m.counters.clone())
            .unwrap_or_default();
        let mut writer = CheckpointWriter::new(dir, start.restore.as_ref().map(|(m, s)| (m, s)))?;
        if let Some(after) = discard {
            // After the writer chose its next epoch: epochs never repeat.
            let gone = writer.dir_mut().discard_after(after)?;
            tracing::info!(dir = %dir_label, discarded = ?gone, "uncommitted checkpoints discarded");
        }
        let committed = start.restore.as_ref().map(|(m, _)| m.epoch);
        let committer = Committer::new(writer, committed);
        let stats = CheckpointStats {
            resumed_from: start.restore.as_ref().map(|(m, _)| m.epoch),
            records_before: carried.records_read,
            restore_us: if start.restore.is_some() { read_us } else { 0 },
            ..CheckpointStats::default()
        };
        let start_offsets = inputs.iter().map(|p| p.offset).sum();
        Ok((
            Durable {
                cfg: cfg.clone(),
                committer,
                options,
                inputs,
                carried,
                last_at: Instant::now(),
                records_at_last: 0,
                parts: (0..shards).map(|_| StateEntries::default()).collect(),
                shards,
                start_offsets,
                stats,
                telemetry: telemetry.clone(),
            },
            start,
        ))
    }

    /// Whether a checkpoint is due after a batch, `records_read` being the run's count.
    pub fn due(&self, records_read: u64) -> bool {
        self.last_at.elapsed() >= self.cfg.interval
            || self
                .cfg
                .every_records
                .is_some_and(|n| records_read.saturating_sub(self.records_at_last) >= n)
    }

    pub fn keep_open(&self) -> bool {
        self.cfg.keep_open
    }

    /// The epoch the next checkpoint gets (between checkpoints).
    #[cfg_attr(not(feature = "parquet"), allow(dead_code))]
    pub fn next_epoch(&self) -> u64 {
        self.committer.next_epoch().unwrap_or(0)
    }

    /// Notes how far the inputs were consumed after a batch: `end`, and the line counts
    /// of inputs finished within it (`finished_lines`: input index, last line number).
    pub fn consumed(&mut self, end: ReadPosition, finished_lines: &[(u32, u64)]) {
        for &(i, line) in finished_lines {
            if let Some(p) = self.inputs.get_mut(i as usize) {
                p.offset = p.size;
                p.line = line;
            }
        }
        for p in self.inputs.iter_mut().take(end.input as usize) {
            p.offset = p.size;
        }
        if let Some(p) = self.inputs.get_mut(end.input as usize) {
            p.offset = end.offset;
            p.line = end.line_no;
        }
    }

    /// Takes one checkpoint of the job: encodes the state changed since the previous
    /// one (every key for a base) while the pipeline waits, then hands it to the
    /// committer with the run's `sinks` (its file outputs, flushed up to their
    /// committed lengths, and a Kafka output) and returns; `wait` (the last checkpoint
    /// of a run) also waits until it is written. `stats` are the run's counters so far.
    #[allow(clippy::too_many_arguments)]
    pub fn checkpoint<S: CheckpointShard>(
        &mut self,
        pool: Option<&rayon::ThreadPool>,
        shards: &mut [S],
        sinks: &mut [&mut dyn EpochSink],
        stats: &RunStats,
        next_seq: u64,
        finished: bool,
        flushed: bool,
        wait: bool,
    ) -> Result<(), RunError> {
        let paused = Instant::now();
        // One checkpoint at a time: its buffers, and whether the next is a base, come
        // back with it.
        self.wait()?;
        // A shard that forgot its changes (too many evicted ones to remember) needs a
        // base.
        let base = self.committer.next_is_base() || shards.iter().any(S::changes_lost);
        if self.parts.len() != self.shards {
            self.parts = (0..self.shards).map(|_| StateEntries::default()).collect();
        }
        let parts = &mut self.parts;
        let images: Vec<Option<BaseImage>> = match pool {
            Some(pool) => {
                use rayon::prelude::*;
                pool.install(|| {
                    shards
                        .par_iter_mut()
                        .zip(parts.par_iter_mut())
                        .map(|(s, p)| s.encode_state(base, p))
                        .collect::<Result<_, _>>()
                })?
            }
            None => shards
                .iter_mut()
                .zip(parts.iter_mut())
                .map(|(s, p)| s.encode_state(base, p))
                .collect::<Result<_, _>>()?,
        };
        let images = images.into_iter().flatten().collect();
        if finished {
            for p in &mut self.inputs {
                p.offset = p.size;
            }
        }
        let lead = &shards[0];
        let manifest = Manifest {
            options: self.options.clone(),
            inputs: self.inputs.clone(),
            next_seq,
            watermark: lead.progress(),
            counters: self.counters(shards, stats),
            keys: shards.iter().map(S::keys).sum(),
            open_sessions: shards.iter().map(S::open_sessions).sum(),
            finished,
            flushed,
            ..Manifest::default()
        };
        let state = StateChanges {
            parts: std::mem::take(&mut self.parts),
            images,
            base,
        };
        let handed = self.committer.checkpoint(state, manifest, sinks, wait);
        // A checkpoint the committer waited for (a two-phase sink, or `wait`) is
        // counted now, also when a sink's second phase then failed: it is durable.
        self.poll()?;
        let handed = handed?;
        self.last_at = Instant::now();
        self.records_at_last = stats.records_read;
        // The pipeline waited until the work was on the writing thread; a two-phase
        // sink's wait for the write and its commit are the write's time.
        let paused = handed.at.duration_since(paused);
        self.telemetry.checkpoint_paused(paused);
        let pause = paused.as_micros() as u64;
        self.stats.pause_us_total += pause;
        self.stats.pause_us_max = self.stats.pause_us_max.max(pause);
        if wait {
            self.wait()?;
        }
        Ok(())
    }

    /// Takes in the checkpoint being written if it is done, without waiting: it is
    /// reported as soon as it is durable.
    pub fn poll(&mut self) -> Result<(), RunError> {
        if let Some(done) = self.committer.poll()? {
            self.collect(done);
        }
        Ok(())
    }

    /// Waits for the checkpoint being written, if any, and takes back its buffers.
    pub(crate) fn wait(&mut self) -> Result<(), RunError> {
        if let Some(done) = self.committer.wait()? {
            self.collect(done);
        }
        Ok(())
    }

    fn collect(&mut self, done: Written) {
        self.parts = done.parts;
        let committed = done.committed;
        let took_us = done.took.as_micros() as u64;
        let st = &mut self.stats;
        st.written += 1;
        st.bases += u64::from(committed.kind == sessionizer_checkpoint::FileKind::Base);
        st.bytes += committed.state_bytes + committed.manifest_bytes;
        st.store_bytes_new += committed.store_bytes_new;
        st.last_epoch = Some(committed.epoch);
        st.last_bytes = committed.state_bytes + committed.manifest_bytes;
        st.last_keys = committed.puts + committed.tombstones;
        st.write_us_total += took_us;
        st.write_us_max = st.write_us_max.max(took_us);
        let base = committed.kind == sessionizer_checkpoint::FileKind::Base;
        self.telemetry.checkpoint(&CheckpointReport {
            kind: if base {
                CheckpointKind::Base
            } else {
                CheckpointKind::Delta
            },
            epoch: Some(committed.epoch),
            bytes: committed.state_bytes + committed.manifest_bytes,
            keys: committed.puts + committed.tombstones,
            took: done.took,
        });
    }

    /// The job's counters: those carried from before this run plus this run's.
    pub fn counters<S: CheckpointShard>(&self, shards: &[S], stats: &RunStats) -> Counters {
        let mut total = stats.clone();
        for s in shards {
            s.add_counts(&mut total);
        }
        total.add_counters(&self.carried);
        // Bytes up to the input positions, not what the reader has read ahead.
        total.bytes_read = self.carried.bytes_read
            + self
                .inputs
                .iter()
                .map(|p| p.offset)
                .sum::<u64>()
                .saturating_sub(self.start_offsets);
        total.counters()
    }
}

/// With a Kafka output, the checkpoint to resume from is the newest whose transaction
/// committed: the newest valid one if Kafka has its progress record, else the one it
/// falls back to (told to `warn`). Returns it, and — when the newest was never
/// committed — the epoch after which checkpoints are to be discarded (`Some(None)`: all
/// of them). The command line's file runs and the library's exactly-once Kafka sink
/// both resume through it.
#[allow(clippy::type_complexity)]
pub(crate) fn resolve_transaction(
    dir: &StateDir,
    found: Option<Recovered>,
    sink: Option<&mut (dyn TopicSink + '_)>,
    warn: &mut dyn FnMut(&str),
) -> Result<(Option<Recovered>, Option<Option<u64>>), RunError> {
    let label = dir.path().display().to_string();
    let Some(found) = found else {
        return Ok((None, None));
    };
    let epoch = found.manifest.epoch;
    let (txn, sink) = match (&found.manifest.kafka_txn, sink) {
        (None, _) => return Ok((Some(found), None)),
        (Some(txn), None) => {
            return Err(RunError::Resume {
                dir: label,
                message: format!(
                    "its checkpoint {epoch} belongs to a run whose sessions went to the Kafka topic {} (transactional id {}); resume it with --kafka-brokers and --kafka-output-topic {}, or use another --state-dir",
                    txn.output_topic, txn.transactional_id, txn.output_topic
                ),
            });
        }
        (Some(txn), Some(sink)) => (txn.clone(), sink),
    };
    let (id, topic) = sink.identity();
    if txn.output_topic != topic {
        return Err(RunError::Resume {
            dir: label,
            message: format!(
                "its sessions went to the Kafka topic {}, this run writes {topic}; resume with --kafka-output-topic {}, or use another state directory (`--state-dir`)",
                txn.output_topic, txn.output_topic
            ),
        });
    }
    if txn.transactional_id != id {
        return Err(RunError::Resume {
            dir: label,
            message: format!(
                "its Kafka transactions use the transactional id {}, this run's is {id}; resume with the --kafka-instance-id of the first run (none if it had none), or use another --state-dir",
                txn.transactional_id
            ),
        });
    }
    match sink.outcome(&txn, epoch)? {
        Outcome::Committed => Ok((Some(found), None)),
        Outcome::Ahead(newer) => Err(RunError::Resume {
            dir: label,
            message: format!(
                "the Kafka output has committed the records up to checkpoint {newer}, but the newest valid checkpoint here is {epoch} (the newer ones are damaged or gone); resuming would write records twice. Use another state directory (`--state-dir`) to start the job over into a new topic"
            ),
        }),
        Outcome::Aborted => {
            let fallback = match txn.fallback_epoch {
                None => None,
                Some(f) => {
                    let recovered = dir
                        .read_manifest(f)
                        .and_then(|m| dir.load_state(&m).map(|state| (m, state)));
                    match recovered {
                        Ok((manifest, state)) => Some(Recovered { manifest, state }),
                        Err(damage) => {
                            return Err(RunError::Checkpoint(
                                sessionizer_checkpoint::CheckpointError::NoValidCheckpoint {
                                    dir: dir.path().to_path_buf(),
                                    details: vec![(f, damage)],
                                },
                            ));
                        }
                    }
                }
            };
            let to = match txn.fallback_epoch {
                Some(f) => format!("checkpoint {f}"),
                None => "the beginning of the job".to_string(),
            };
            warn(&format!(
                "checkpoint {epoch} in {label} was prepared but its Kafka transaction never committed (the run stopped in between); resuming from {to}"
            ));
            Ok((fallback, Some(txn.fallback_epoch)))
        }
    }
}

/// Decides how a run continues a checkpoint, or why it cannot.
fn plan_resume(
    pipeline: &PipelineConfig,
    dir: &str,
    options: &[(String, String)],
    inputs: &mut [InputPosition],
    manifest: Manifest,
    state: LoadedState,
) -> Result<Start, RunError> {
    let differences = manifest.option_differences(options);
    if !differences.is_empty() {
        return Err(RunError::OptionsChanged {
            dir: dir.to_string(),
            differences,
        });
    }
    let then = &manifest.inputs;
    let new_segment = match continuation(then, inputs, manifest.finished, manifest.flushed) {
        Ok(c) => c == Continuation::NewFiles,
        Err(Refusal::Changed { path, what }) => {
            return Err(RunError::InputChanged {
                dir: dir.to_string(),
                path,
                what,
            });
        }
        Err(Refusal::Grown { path, then, now }) => {
            return Err(RunError::InputChanged {
                dir: dir.to_string(),
                path,
                what: format!(
                    "it grew from {then} to {now} bytes after it was read to its end; each file is read once, so put new events in a new file"
                ),
            });
        }
        Err(Refusal::Midway) => {
            let listed: Vec<&str> = then.iter().map(|i| i.path.as_str()).collect();
            return Err(RunError::Resume {
                dir: dir.to_string(),
                message: format!(
                    "its checkpoint is in the middle of the inputs {}; run again with the same --input list to resume it, or use another --state-dir",
                    listed.join(", ")
                ),
            });
        }
        Err(Refusal::Ended) => {
            return Err(RunError::Resume {
                dir: dir.to_string(),
                message: "the job it holds has ended: at the end of its input every session was emitted (the run had no --keep-open). Use a new --state-dir for new input, or --keep-open to let a later run continue the sessions".into(),
            });
        }
        Err(Refusal::AlreadyRead { path }) => {
            return Err(RunError::Resume {
                dir: dir.to_string(),
                message: format!(
                    "input {path} was already read to its end by the run that wrote the checkpoint; give only new inputs"
                ),
            });
        }
    };
    let position = if new_segment {
        // New inputs, same outputs continued: an output named as before is appended to.
        ReadPosition::default()
    } else {
        let targets = output_paths(pipeline);
        for commit in &manifest.outputs {
            if !targets
                .iter()
                .any(|(r, p)| *r == commit.role && *p == commit.path)
            {
                return Err(RunError::Resume {
                    dir: dir.to_string(),
                    message: format!(
                        "the checkpoint's {} output is {}, which this run does not write; resume with the same outputs, or use another --state-dir",
                        commit.role, commit.path
                    ),
                });
            }
        }
        for (then, now) in manifest.inputs.iter().zip(inputs.iter_mut()) {
            now.offset = then.offset;
            now.line = then.line;
        }
        resume_position(&manifest.inputs)
    };
    Ok(Start {
        position,
        next_seq: manifest.next_seq,
        restore: Some((manifest, state)),
    })
}

/// How a run's inputs continue a checkpoint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Continuation {
    /// The same files (paths, sizes, first 4 KiB): read on from the checkpoint's position.
    Same,
    /// New files after a checkpoint that read all of its own to the end and kept its
    /// sessions open: read from their start.
    NewFiles,
}

/// Why a run's inputs cannot continue a checkpoint's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A file at the same place in the same list is another file now.
    Changed { path: String, what: String },
    /// A file read to its end was appended to since (its start is the same).
    Grown { path: String, then: u64, now: u64 },
    /// Other files, but the checkpoint had not read its own to the end.
    Midway,
    /// Other files, but the checkpoint's job had ended (every session emitted).
    Ended,
    /// Among the new files, one the checkpoint read already.
    AlreadyRead { path: String },
}

/// How the inputs `now` continue a checkpoint whose inputs were `then`, `finished`
/// (every one read to its end) and `flushed` (its job ended): the rule of every file
/// job, the command line's `--state-dir` runs and the library's `JsonLines::resume`.
pub(crate) fn continuation(
    then: &[InputPosition],
    now: &[InputPosition],
    finished: bool,
    flushed: bool,
) -> Result<Continuation, Refusal> {
    // A table read before is the same input with more rows (`a` then, `b` now); a file
    // must be the same bytes.
    let identical = |a: &InputPosition, b: &InputPosition| {
        let table = a.head_xxh3.starts_with(TABLE_IDENTITY);
        a.path == b.path
            && a.head_xxh3 == b.head_xxh3
            && (a.size == b.size || table && b.size >= a.size)
    };
    let same_paths = then.len() == now.len() && then.iter().zip(now).all(|(a, b)| a.path == b.path);
    if flushed
        && then.iter().zip(now).any(|(a, b)| {
            a.head_xxh3.starts_with(TABLE_IDENTITY) && identical(a, b) && b.size > a.size
        })
    {
        // New rows of a table after a run that emitted every session at its end.
        return Err(Refusal::Ended);
    }
    if same_paths {
        let changed: Vec<usize> = (0..now.len())
            .filter(|&i| !identical(&then[i], &now[i]))
            .collect();
        let Some(&first) = changed.first() else {
            return Ok(Continuation::Same);
        };
        // A table is not rotated in place as a daily file is: another table where the
        // one read was means its history is gone.
        let table_changed = changed
            .iter()
            .any(|&i| then[i].head_xxh3.starts_with(TABLE_IDENTITY));
        if table_changed || !(finished && !flushed && changed.len() == now.len()) {
            let (then, now) = (&then[first], &now[first]);
            let what = if then.head_xxh3.starts_with(TABLE_IDENTITY) {
                if then.head_xxh3 != now.head_xxh3 {
                    "it is another Delta table (a new table id): the one read before was replaced"
                        .to_string()
                } else {
                    format!(
                        "the table had {} rows then and has {} now: its history was rewritten",
                        then.size, now.size
                    )
                }
            } else if then.size != now.size {
                format!("{} bytes then, {} bytes now", then.size, now.size)
            } else {
                "its first 4 KiB differ".to_string()
            };
            return Err(Refusal::Changed {
                path: now.path.clone(),
                what,
            });
        }
        // Every file at these paths is new (a daily file rotated in place), unless one
        // grew (below).
    }
    if !finished {
        return Err(Refusal::Midway);
    }
    if flushed {
        return Err(Refusal::Ended);
    }
    // A file at a path read before that is the same file grown by appending: its head
    // would be read a second time.
    for now in now {
        let grown = then.iter().find(|then| {
            then.path == now.path
                && now.size > then.size
                && sessionizer_checkpoint::starts_like(
                    std::path::Path::new(&now.path),
                    then.size,
                    &then.head_xxh3,
                )
                .unwrap_or(false)
        });
        if let Some(then) = grown {
            return Err(Refusal::Grown {
                path: now.path.clone(),
                then: then.size,
                now: now.size,
            });
        }
    }
    if let Some(again) = now.iter().find(|n| then.iter().any(|t| identical(t, n))) {
        return Err(Refusal::AlreadyRead {
            path: again.path.clone(),
        });
    }
    Ok(Continuation::NewFiles)
}

/// How a checkpoint names a Delta table input's identity, in the place of a file's head
/// hash: this prefix and the table's id. Its size is its rows.
const TABLE_IDENTITY: &str = "delta-table:";

/// The Delta table input at `location` as a checkpoint records it, not read yet: its
/// identity (the table's id), its rows now as its size, and position 0.
#[cfg(feature = "delta")]
pub(crate) fn unread_table(location: &str) -> Result<InputPosition, RunError> {
    let history = sessionizer_connectors::delta::table_history(location).map_err(|e| {
        sessionizer_connectors::input::InputError {
            name: location.to_string(),
            source: std::io::Error::other(e),
        }
    })?;
    Ok(InputPosition {
        path: location.to_string(),
        size: history.rows(),
        head_xxh3: format!("{TABLE_IDENTITY}{}", history.id),
        offset: 0,
        line: 0,
    })
}

#[cfg(not(feature = "delta"))]
pub(crate) fn unread_table(_location: &str) -> Result<InputPosition, RunError> {
    Err(RunError::Unsupported(crate::error::Unsupported::NoDelta))
}

/// The input file at `path` as a checkpoint records it, not read yet: its identity (size,
/// hash of its first 4 KiB) and position 0.
pub(crate) fn unread_input(
    path: &Path,
) -> Result<InputPosition, sessionizer_connectors::input::InputError> {
    let (size, head_xxh3) = sessionizer_checkpoint::input_identity(path).map_err(|source| {
        sessionizer_connectors::input::InputError {
            name: path.display().to_string(),
            source,
        }
    })?;
    Ok(InputPosition {
        path: path.display().to_string(),
        size,
        head_xxh3,
        offset: 0,
        line: 0,
    })
}

/// The reading position of a checkpoint: in the last input that was started.
pub(crate) fn resume_position(inputs: &[InputPosition]) -> ReadPosition {
    inputs
        .iter()
        .enumerate()
        .rev()
        .find(|(_, p)| p.offset > 0 || p.line > 0)
        .map_or(ReadPosition::default(), |(i, p)| ReadPosition {
            input: i as u32,
            offset: p.offset,
            line_no: p.line,
        })
}

/// The file outputs of a run, by role.
pub(crate) fn output_paths(cfg: &PipelineConfig) -> Vec<(&'static str, String)> {
    [&cfg.output, &cfg.dead_letter, &cfg.late_output]
        .into_iter()
        .zip(ROLES)
        .filter_map(|(t, role)| match t {
            OutputTarget::File(p) => Some((role, path_text(p))),
            _ => None,
        })
        .collect()
}

fn path_text(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(id: &str, rows: u64) -> InputPosition {
        InputPosition {
            path: "s3://lake/visits".into(),
            size: rows,
            head_xxh3: format!("{TABLE_IDENTITY}{id}"),
            offset: 0,
            line: 0,
        }
    }

    #[test]
    fn a_table_input_continues_with_more_rows_and_nothing_else() {
        let then = [table("a", 100)];
        // Read to its end with the sessions kept open: more rows, or none, go on.
        for rows in [100, 250] {
            assert_eq!(
                continuation(&then, &[table("a", rows)], true, false),
                Ok(Continuation::Same)
            );
        }
        // Also from the middle.
        assert_eq!(
            continuation(&then, &[table("a", 250)], false, false),
            Ok(Continuation::Same)
        );
        // Fewer rows, another table: its history is gone, not rotated like a file.
        for now in [table("a", 99), table("b", 100), table("b", 400)] {
            assert!(matches!(
                continuation(&then, &[now], true, false),
                Err(Refusal::Changed { .. })
            ));
        }
        // New rows after a job that emitted every session at its end.
        assert_eq!(
            continuation(&then, &[table("a", 250)], true, true),
            Err(Refusal::Ended)
        );
        assert_eq!(
            continuation(&then, &[table("a", 100)], true, true),
            Ok(Continuation::Same)
        );
    }
}
