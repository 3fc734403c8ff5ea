//! Checkpoints of a running job, and its recovery (SPEC §4).
//!
//! A checkpoint is taken between two batches, when nothing is in flight: every record
//! of the batches so far has been judged, applied and encoded. Then:
//!
//! 1. every file output is flushed and synced, and its length noted (the committed
//!    length: recovery cuts the file back to it);
//! 2. each shard encodes its keyed state — every key for a base, only the keys changed
//!    or removed since the previous checkpoint for a delta (in parallel, one buffer per
//!    shard);
//! 3. the state file, then the manifest (input positions, watermark, output lengths,
//!    counters, options) are written atomically by `sessionizer-checkpoint`.
//!
//! A crash before step 3 completes leaves the previous checkpoint as the newest; the
//! output written since is cut off on recovery and produced again from the recorded
//! input positions — so file outputs are exactly once. Stdout and stderr cannot be cut
//! back: they are at least once.
//!
//! Resuming: the options must equal the checkpoint's, each input must be the file that
//! was being read (same size and head), and the state is re-hashed into the shards of
//! this run, whatever their number. A checkpoint written at the end of the inputs with
//! `--keep-open` instead accepts new inputs: the next run continues its sessions.

use super::RunError;
use super::shard::Shard;
use crate::config::{CheckpointConfig, PipelineConfig};
use crate::stats::{CheckpointStats, RunStats};
use sessionizer_checkpoint::{
    CheckpointWriter, Counters, EncodedState, InputPosition, LoadedState, Manifest, OutputCommit,
    StateDir, StateEntries, WatermarkState,
};
use sessionizer_connectors::input::ReadPosition;
use sessionizer_connectors::{InputSource, OutputTarget};
use std::path::Path;
use std::time::Instant;

/// The roles of the file outputs, in the order the job holds them.
pub(crate) const ROLES: [&str; 3] = ["sessions", "dead-letter", "late"];

/// Where a run starts, decided from the state directory before anything is opened.
#[derive(Debug)]
pub(crate) struct Start {
    /// Where to start reading the inputs.
    pub position: ReadPosition,
    /// The input sequence number of the first line read.
    pub next_seq: u64,
    /// The committed length of each output to continue (by role and path); outputs not
    /// listed are created afresh.
    pub outputs: Vec<OutputCommit>,
    /// The checkpoint to restore, if any, with its verified state.
    pub restore: Option<(Manifest, LoadedState)>,
}

/// The checkpointing side of a running job.
#[derive(Debug)]
pub(crate) struct Durable {
    cfg: CheckpointConfig,
    writer: CheckpointWriter,
    options: Vec<(String, String)>,
    /// This run's inputs: identity, and how far each was consumed.
    inputs: Vec<InputPosition>,
    /// The job's counters before this run (a resumed job keeps one accounting).
    pub carried: Counters,
    last_at: Instant,
    records_at_last: u64,
    /// One buffer of encoded entries per shard.
    parts: Vec<StateEntries>,
    /// Input bytes consumed when this run started (a resumed run starts mid-input).
    start_offsets: u64,
    pub stats: CheckpointStats,
}

fn dir_name(cfg: &CheckpointConfig) -> String {
    cfg.state_dir.display().to_string()
}

impl Durable {
    /// Opens the state directory, finds the checkpoint to resume from (reporting damaged
    /// newer ones through `warn`) and checks that this run may continue it.
    pub fn open(
        pipeline: &PipelineConfig,
        cfg: &CheckpointConfig,
        shards: usize,
        warn: &dyn Fn(&str),
    ) -> Result<(Durable, Start), RunError> {
        let dir_label = dir_name(cfg);
        if !super::operator_state::SUPPORTED {
            return Err(RunError::Resume {
                dir: dir_label,
                message: "this build cannot checkpoint the session window yet".into(),
            });
        }
        let mut inputs = Vec::with_capacity(pipeline.inputs.len());
        for source in &pipeline.inputs {
            let InputSource::File(path) = source else {
                return Err(RunError::Resume {
                    dir: dir_label,
                    message:
                        "stdin cannot be resumed from a checkpoint; give input files with --input"
                            .into(),
                });
            };
            let (size, head_xxh3) =
                sessionizer_checkpoint::input_identity(path).map_err(|source| {
                    RunError::Input(sessionizer_connectors::input::InputError {
                        name: path.display().to_string(),
                        source,
                    })
                })?;
            inputs.push(InputPosition {
                path: path.display().to_string(),
                size,
                head_xxh3,
                offset: 0,
                line: 0,
            });
        }
        let mut dir = StateDir::open(&cfg.state_dir)?;
        dir.fail_write_at(cfg.fail_write_at);
        let reading = Instant::now();
        let recovery = dir.recover()?;
        let read_us = reading.elapsed().as_micros() as u64;
        for (epoch, damage) in &recovery.skipped {
            warn(&format!(
                "checkpoint {epoch} in {dir_label} is damaged ({damage}); using an older one"
            ));
        }
        let options = pipeline.state_options();
        let start = match recovery.found {
            None => Start {
                position: ReadPosition::default(),
                next_seq: 0,
                outputs: Vec::new(),
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
        let writer = CheckpointWriter::new(dir, start.restore.as_ref().map(|(m, _)| m))?;
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
                writer,
                options,
                inputs,
                carried,
                last_at: Instant::now(),
                records_at_last: 0,
                parts: (0..shards).map(|_| StateEntries::default()).collect(),
                start_offsets,
                stats,
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

    /// Writes one checkpoint of the job. `outputs` are the committed lengths (already
    /// synced), `shards` the state, `stats` the run's counters so far.
    #[allow(clippy::too_many_arguments)]
    pub fn checkpoint(
        &mut self,
        pool: Option<&rayon::ThreadPool>,
        shards: &mut [Shard],
        outputs: Vec<OutputCommit>,
        stats: &RunStats,
        next_seq: u64,
        finished: bool,
        flushed: bool,
    ) -> Result<(), RunError> {
        let started = Instant::now();
        let base = self.writer.next_is_base();
        let parts = &mut self.parts;
        match pool {
            Some(pool) => {
                use rayon::prelude::*;
                pool.install(|| {
                    shards
                        .par_iter_mut()
                        .zip(parts.par_iter_mut())
                        .for_each(|(s, p)| s.encode_state(base, p))
                });
            }
            None => {
                for (s, p) in shards.iter_mut().zip(parts.iter_mut()) {
                    s.encode_state(base, p);
                }
            }
        }
        let state = EncodedState {
            parts: self.parts.iter().map(StateEntries::bytes).collect(),
            puts: self.parts.iter().map(StateEntries::puts).sum(),
            tombstones: self.parts.iter().map(StateEntries::tombstones).sum(),
        };
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
            watermark: WatermarkState {
                max_event_time_ms: lead.max_event_time().map(|t| t.millis()),
                watermark_ms: lead.op.watermark().millis(),
                largest_gap_ms: lead.largest_gap().millis(),
            },
            outputs,
            counters: self.counters(shards, stats),
            keys: shards.iter().map(|s| s.op.keys() as u64).sum(),
            open_sessions: shards.iter().map(|s| s.op.open_sessions() as u64).sum(),
            finished,
            flushed,
            ..Manifest::default()
        };
        let committed = self.writer.commit(&state, manifest)?;
        let took = started.elapsed().as_micros() as u64;
        let st = &mut self.stats;
        st.written += 1;
        st.bases += u64::from(base);
        st.bytes += committed.state_bytes + committed.manifest_bytes;
        st.last_epoch = Some(committed.epoch);
        st.last_bytes = committed.state_bytes + committed.manifest_bytes;
        st.last_keys = committed.puts + committed.tombstones;
        st.write_us_total += took;
        st.write_us_max = st.write_us_max.max(took);
        self.last_at = Instant::now();
        self.records_at_last = stats.records_read;
        Ok(())
    }

    /// The job's counters: those carried from before this run plus this run's.
    pub fn counters(&self, shards: &[Shard], stats: &RunStats) -> Counters {
        let mut total = stats.clone();
        super::add_shard_counts(&mut total, shards);
        let c = &self.carried;
        Counters {
            records_read: c.records_read + total.records_read,
            in_sessions: c.in_sessions + total.in_sessions,
            duplicates: c.duplicates + total.duplicates,
            late: c.late + total.late,
            invalid: c.invalid + total.invalid,
            blank_lines: c.blank_lines + total.blank_lines,
            sessions_emitted: c.sessions_emitted + total.sessions_emitted,
            retractions: c.retractions + total.retractions,
            // Bytes up to the input positions, not what the reader has read ahead.
            bytes_read: c.bytes_read
                + self
                    .inputs
                    .iter()
                    .map(|p| p.offset)
                    .sum::<u64>()
                    .saturating_sub(self.start_offsets),
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
    let same_paths = manifest.inputs.len() == inputs.len()
        && manifest
            .inputs
            .iter()
            .zip(inputs.iter())
            .all(|(a, b)| a.path == b.path);
    let identical = |a: &InputPosition, b: &InputPosition| {
        a.path == b.path && a.size == b.size && a.head_xxh3 == b.head_xxh3
    };
    let new_segment = if same_paths {
        let changed: Vec<usize> = (0..inputs.len())
            .filter(|&i| !identical(&manifest.inputs[i], &inputs[i]))
            .collect();
        if changed.is_empty() {
            false
        } else if manifest.finished && !manifest.flushed && changed.len() == inputs.len() {
            // Every file at these paths is new (a daily file rotated in place): the
            // finished checkpoint accepts them as the next input.
            true
        } else {
            let i = changed[0];
            let (then, now) = (&manifest.inputs[i], &inputs[i]);
            let what = if then.size != now.size {
                format!("{} bytes then, {} bytes now", then.size, now.size)
            } else {
                "its first 4 KiB differ".to_string()
            };
            return Err(RunError::InputChanged {
                dir: dir.to_string(),
                path: now.path.clone(),
                what,
            });
        }
    } else {
        true
    };
    let (position, outputs) = if new_segment {
        if !manifest.finished {
            let listed: Vec<&str> = manifest.inputs.iter().map(|i| i.path.as_str()).collect();
            return Err(RunError::Resume {
                dir: dir.to_string(),
                message: format!(
                    "its checkpoint is in the middle of the inputs {}; run again with the same --input list to resume it, or use another --state-dir",
                    listed.join(", ")
                ),
            });
        }
        if manifest.flushed {
            return Err(RunError::Resume {
                dir: dir.to_string(),
                message: "the job it holds has ended: at the end of its input every session was emitted (the run had no --keep-open). Use a new --state-dir for new input, or --keep-open to let a later run continue the sessions".into(),
            });
        }
        if let Some(again) = inputs
            .iter()
            .find(|now| manifest.inputs.iter().any(|then| identical(then, now)))
        {
            return Err(RunError::Resume {
                dir: dir.to_string(),
                message: format!(
                    "input {} was already read to its end by the run that wrote the checkpoint; give only new inputs",
                    again.path
                ),
            });
        }
        // New inputs, same outputs continued: an output named as before is appended to.
        (ReadPosition::default(), manifest.outputs.clone())
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
        (resume_position(&manifest.inputs), manifest.outputs.clone())
    };
    Ok(Start {
        position,
        next_seq: manifest.next_seq,
        outputs,
        restore: Some((manifest, state)),
    })
}

/// The reading position of a checkpoint: in the last input that was started.
fn resume_position(inputs: &[InputPosition]) -> ReadPosition {
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
