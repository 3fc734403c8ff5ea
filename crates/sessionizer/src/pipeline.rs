//! Stage three: the running job.
//!
//! One step per input record: decode → judge against the watermark as it stood before
//! the record → apply → move the watermark → emit what became due. Invalid records go
//! to the dead-letter output, too-late events to the late output, and the counters keep
//! the accounting of SPEC §2.

use crate::config::{OnInvalid, PipelineConfig};
use crate::stats::RunStats;
use sessionizer_connectors::encode::{OutputError, SourcePos, encode_dead_letter, encode_late};
use sessionizer_connectors::input::{InputError, LinesError};
use sessionizer_connectors::{Inputs, RecordWriter, SessionEncoder};
use sessionizer_core::Watermark;
use sessionizer_core::decode::Decoder;
use sessionizer_window::{BoundedOutOfOrderness, Event, SessionOperator, Verdict};
use std::time::Instant;

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(
        "invalid record at {position}: {reason} (stopping because of --on-invalid fail; use --on-invalid dead-letter to set such records aside)"
    )]
    InvalidRecord { position: String, reason: String },
    #[error("cannot write the stats file {path}: {message}")]
    Stats { path: String, message: String },
}

/// The per-event aggregate values, on the stack for up to 8 aggregates.
type Values<'a> = smallvec::SmallVec<[Option<&'a [u8]>; 8]>;

/// How often (in records) the observer hears of progress.
const PROGRESS_EVERY: u64 = 1 << 16;

/// What a running pipeline reports while it works (a progress line, metrics).
pub trait Observer {
    /// Called every 65,536 records.
    fn progress(&self, _records_read: u64, _open_sessions: usize, _watermark: Watermark) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// Runs the job to the end of its inputs.
pub fn run(cfg: &PipelineConfig, observer: &dyn Observer) -> Result<RunStats, RunError> {
    let started = Instant::now();
    let mut inputs = Inputs::new(cfg.inputs.clone());
    inputs.check_readable()?;

    let mut sessions = SessionEncoder::new(
        RecordWriter::new(cfg.output.clone()),
        &cfg.aggregate_names(),
        cfg.emit == sessionizer_window::EmitMode::OnUpdate,
    );
    let mut dead = RecordWriter::new(cfg.dead_letter.clone());
    let mut late = RecordWriter::new(cfg.late_output.clone());
    // Files are created up front so that every output reflects this run, even if empty.
    for w in [&mut sessions.writer, &mut dead, &mut late] {
        if matches!(w.target(), sessionizer_connectors::OutputTarget::File(_)) {
            w.open()?;
        }
    }

    let mut decoder = Decoder::new(cfg.decoder_config());
    let mut op = SessionOperator::new(cfg.window_config());
    let mut watermark = BoundedOutOfOrderness::new(cfg.watermark_delay);
    let mut stats = RunStats::default();
    let names: Vec<String> = cfg.inputs.iter().map(|i| i.display_name()).collect();
    let default_gap = cfg.gap;

    let result = inputs.for_each_line(|line| -> Result<(), RunError> {
        if line.bytes.trim_ascii().is_empty() {
            stats.blank_lines += 1;
            return Ok(());
        }
        let seq = stats.records_read;
        stats.records_read += 1;
        match decoder.decode(line.bytes) {
            Err(invalid) => {
                stats.invalid += 1;
                match cfg.on_invalid {
                    OnInvalid::Fail => {
                        return Err(RunError::InvalidRecord {
                            position: format!("{}:{}", names[line.input], line.line_no),
                            reason: invalid.to_string(),
                        });
                    }
                    OnInvalid::Skip => {}
                    OnInvalid::DeadLetter => {
                        let pos = SourcePos {
                            name: &names[line.input],
                            line: line.line_no,
                        };
                        encode_dead_letter(&mut dead, &invalid.to_string(), pos, line.bytes);
                        dead.maybe_flush()?;
                    }
                }
            }
            Ok(decoded) => {
                let values: Values<'_> = (0..cfg.aggregates.len())
                    .map(|i| decoded.value(i))
                    .collect();
                let event = Event {
                    key: decoded.key,
                    time: decoded.time,
                    gap: decoded.gap.unwrap_or(default_gap),
                    seq,
                    dedup: decoded.dedup,
                    values: &values,
                };
                let before = op.watermark();
                match op.on_event(&event, &mut sessions) {
                    Verdict::Applied => stats.in_sessions += 1,
                    Verdict::Duplicate => stats.duplicates += 1,
                    Verdict::Late(reason) => {
                        stats.late += 1;
                        let pos = SourcePos {
                            name: &names[line.input],
                            line: line.line_no,
                        };
                        encode_late(
                            &mut late,
                            reason.as_str(),
                            pos,
                            before,
                            event.time,
                            line.bytes,
                        );
                        late.maybe_flush()?;
                    }
                }
                let w = watermark.observe(event.time);
                op.advance_to(w, &mut sessions);
                sessions.writer.maybe_flush()?;
            }
        }
        if stats.records_read % PROGRESS_EVERY == 0 {
            observer.progress(stats.records_read, op.open_sessions(), op.watermark());
        }
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(LinesError::Input(e)) => return Err(e.into()),
        Err(LinesError::Stopped(e)) => return Err(e),
    }

    // End of a bounded input: the watermark becomes +infinity and every session is emitted.
    op.advance_to(Watermark::MAX, &mut sessions);
    sessions.writer.finish()?;
    dead.finish()?;
    late.finish()?;

    let counts = op.counts();
    stats.sessions_emitted = counts.sessions_emitted;
    stats.retractions = counts.retractions;
    stats.bytes_read = inputs.bytes_read();
    stats.elapsed_ms = started.elapsed().as_millis() as u64;
    stats.peak_rss_bytes = crate::stats::peak_rss_bytes();
    debug_assert!(stats.adds_up(), "accounting does not add up: {stats:?}");
    Ok(stats)
}
