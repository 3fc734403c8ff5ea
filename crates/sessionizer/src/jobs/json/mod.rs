//! The running job: JSON lines in, sessions out, with the accounting of docs/semantics.md
//! S-13.
//!
//! Input is read in batches of whole lines. Each batch goes through two parallel phases
//! and one sequential one:
//!
//! 1. **decode** (`parse`) — the batch is cut into contiguous ranges, decoded in
//!    parallel; invalid lines become dead-letter records in input order;
//! 2. **sessionize** (`shard`) — each worker owns the keys of one hash shard and runs
//!    its own session operator over all the batch's records in input order: it judges
//!    and applies its own keys' events, and advances the watermark at every step, so the
//!    watermark sequence is the same whatever the number of workers;
//! 3. **merge** — the shards' records are put back in the order one operator would
//!    have produced: by step, then the step's own records (retractions, on-update
//!    records), then its completions by (close, key, start).
//!
//! So the output is byte-identical for every `--workers N` (docs/semantics.md S-19).
//!
//! With a state directory ([`run_with`]), `durable` checkpoints the job between
//! batches and resumes it from the newest valid checkpoint.
//!
//! Both drivers (this one for files and stdin, `kafka` for Kafka inputs) report what
//! they do at batch boundaries to one [`Telemetry`] — logs, metrics, the progress line —
//! and answer its questions about a key between batches.

mod commit;
#[cfg(feature = "kafka")]
mod kafka;
pub(crate) mod lookup;
pub(crate) mod parse;
mod phases;
mod read_ahead;
pub(crate) mod shard;

use crate::config::{CheckpointConfig, OutputFormat, PipelineConfig};
use crate::error::RunError;
use crate::runtime::{Padded, Workers, backend, durable, kafka_sink, shard_of, start_workers};
use crate::stats::RunStats;
use crate::telemetry::{KeyView, RestoreReport, TaskReport, Telemetry};
use durable::{Durable, Start};
use kafka_sink::TopicSink;
use parse::Parsed;
use read_ahead::{Next, ReadAhead, finished_inputs};
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::input::ReadPosition;
use sessionizer_connectors::{InputSource, Inputs, RecordWriter, SessionEncoder};
use sessionizer_core::Watermark;
use sessionizer_core::decode::Decoder;
use shard::Shard;
use shard::{add_shard_counts, task_counts};
use std::time::{Duration, Instant};

/// Bytes of input per batch.
const BATCH_BYTES: usize = 4 << 20;

/// How often a pipeline waiting on a quiet live input wakes up to answer questions
/// about keys (when an HTTP endpoint may ask them).
const QUERY_TICK: Duration = Duration::from_millis(50);

/// With a live input, how long records may wait in an output's buffer while input keeps
/// coming (docs/semantics.md S-32: visible within about 100 ms). When no input is ready
/// they are written at once.
const LIVE_FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Runs the job to the end of its inputs, reporting to `telemetry`.
pub fn run(cfg: &PipelineConfig, telemetry: &Telemetry) -> Result<RunStats, RunError> {
    run_with(cfg, None, telemetry)
}

/// Runs the job to the end of its inputs; with `checkpoint`, durably: resuming from the
/// newest valid checkpoint of its state directory and checkpointing as it goes.
pub fn run_with(
    cfg: &PipelineConfig,
    checkpoint: Option<&CheckpointConfig>,
    telemetry: &Telemetry,
) -> Result<RunStats, RunError> {
    let result = run_driver(cfg, checkpoint, telemetry);
    match &result {
        Ok(stats) => telemetry.ended(Ok(stats)),
        Err(RunError::OutputClosed { stats, .. }) => telemetry.ended(Ok(stats)),
        Err(e) => telemetry.ended(Err(e)),
    }
    result
}

fn run_driver(
    cfg: &PipelineConfig,
    checkpoint: Option<&CheckpointConfig>,
    telemetry: &Telemetry,
) -> Result<RunStats, RunError> {
    if let Some(kafka) = &cfg.kafka
        && kafka.is_source()
    {
        #[cfg(feature = "kafka")]
        return kafka::run(cfg, kafka, telemetry);
        #[cfg(not(feature = "kafka"))]
        return Err(RunError::Unsupported(without_kafka(kafka)));
    }
    #[cfg(feature = "kafka")]
    if let Some(kafka) = &cfg.kafka
        && let Some(checkpoint) = checkpoint
        && cfg.inputs.iter().all(|i| matches!(i, InputSource::File(_)))
    {
        // Files in, Kafka out, with checkpoints: a cluster that does not answer for a
        // while is waited for, and the run goes back to its last checkpoint.
        return crate::runtime::kafka::checkpointed_riding_out(kafka, telemetry, || {
            run_files(cfg, Some(checkpoint), telemetry)
        });
    }
    run_files(cfg, checkpoint, telemetry)
}

/// A run with file or stdin inputs.
fn run_files(
    cfg: &PipelineConfig,
    checkpoint: Option<&CheckpointConfig>,
    telemetry: &Telemetry,
) -> Result<RunStats, RunError> {
    let workers = cfg.workers.max(1);
    let pool = start_workers(workers)?;
    // Files or stdin in, Kafka out: the topics replace some of the writers.
    let topics = match &cfg.kafka {
        Some(kafka) if kafka.is_sink() => {
            #[cfg(feature = "kafka")]
            {
                Some(kafka_sink::open(kafka)?)
            }
            #[cfg(not(feature = "kafka"))]
            return Err(RunError::Unsupported(without_kafka(kafka)));
        }
        _ => None,
    };
    let sessions = sessions_writer(cfg)?;
    Job::new(cfg, workers, pool, topics, sessions).run(checkpoint, telemetry)
}

/// The writer of the session records: JSON lines, Parquet files in a directory, or a
/// Delta table.
fn sessions_writer(cfg: &PipelineConfig) -> Result<RecordWriter, RunError> {
    match cfg.output_format {
        OutputFormat::JsonLines => Ok(RecordWriter::new(cfg.output.clone())),
        #[cfg(feature = "parquet")]
        OutputFormat::Parquet { partition_by_date } => {
            use sessionizer_connectors::parquet::ParquetOptions;
            let options = ParquetOptions {
                partition_by_date,
                ..ParquetOptions::default()
            };
            Ok(sessionizer_connectors::parquet::ParquetStorage::writer(
                cfg.output.clone(),
                session_schema(cfg)?,
                options,
            ))
        }
        #[cfg(not(feature = "parquet"))]
        OutputFormat::Parquet { .. } => {
            Err(RunError::Unsupported(crate::error::Unsupported::NoParquet))
        }
        #[cfg(feature = "delta")]
        OutputFormat::Delta { commit_every } => {
            Ok(sessionizer_connectors::delta::DeltaStorage::writer(
                cfg.output.clone(),
                session_schema(cfg)?,
                commit_every,
            ))
        }
        #[cfg(not(feature = "delta"))]
        OutputFormat::Delta { .. } => {
            Err(RunError::Unsupported(crate::error::Unsupported::NoDelta))
        }
    }
}

/// The columns of the session records' table (Parquet files, a Delta table).
#[cfg(feature = "parquet")]
pub(super) fn session_schema(
    cfg: &PipelineConfig,
) -> Result<sessionizer_connectors::parquet::SessionSchema, RunError> {
    let aggregates: Vec<_> = cfg
        .aggregates
        .iter()
        .map(|a| (a.name.clone(), a.kind))
        .collect();
    // Two aggregates with one name, or one named like a fixed column.
    sessionizer_connectors::parquet::SessionSchema::new(&aggregates, cfg.emit).map_err(|e| {
        RunError::Output(sessionizer_connectors::sink::OutputError {
            name: cfg.output.display_name(),
            source: std::io::Error::other(e),
        })
    })
}

#[cfg(not(feature = "kafka"))]
fn without_kafka(_: &crate::config::KafkaConfig) -> crate::error::Unsupported {
    crate::error::Unsupported::NoKafka
}

/// How often a quiet live input is checked: often enough for the watermark to follow the
/// wall clock smoothly, never busier than every 10 ms.
fn idle_tick(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The state of one run.
struct Job<'c> {
    cfg: &'c PipelineConfig,
    /// The worker threads (none with one worker: everything runs on this thread).
    pool: Workers,
    started: Instant,
    inputs: Inputs,
    names: Vec<SourceName>,
    shards: Vec<Shard>,
    decoders: Vec<Padded<Decoder>>,
    parsed: Vec<Parsed>,
    sessions: RecordWriter,
    dead: RecordWriter,
    late: RecordWriter,
    stats: RunStats,
    /// Scratch for the merge.
    order: Vec<(usize, usize)>,
    /// Checkpointing, with a state directory.
    durable: Option<Durable>,
    /// A Kafka output: the session records (and maybe side outputs) go to topics.
    topics: Option<Box<dyn TopicSink>>,
    /// The directory of the shards' spill stores (`--state-backend rocksdb`); after
    /// `shards`, so that it is removed after them.
    spill_root: Option<backend::SpillRoot>,
    /// What the spill stores did, sampled after every batch.
    store_stats: Option<crate::stats::StateStoreStats>,
    /// The spill stores started as the restored checkpoint's copies of them.
    stores_restored: bool,
}

impl<'c> Job<'c> {
    fn new(
        cfg: &'c PipelineConfig,
        workers: usize,
        pool: Workers,
        topics: Option<Box<dyn TopicSink>>,
        sessions: RecordWriter,
    ) -> Job<'c> {
        let encoder = SessionEncoder::new(&cfg.aggregate_names(), cfg.emit);
        let shards = (0..workers)
            .map(|i| {
                Shard::new(
                    i as u32,
                    cfg.window_config(),
                    cfg.watermark_delay,
                    encoder.clone(),
                    // Several shards are merged by their tags; a Kafka output needs
                    // each record's key and start.
                    workers > 1 || topics.is_some(),
                )
            })
            .collect();
        // More ranges than workers evens out ranges that decode slower.
        let ranges = if workers > 1 { workers * 4 } else { 1 };
        Job {
            cfg,
            pool,
            started: Instant::now(),
            inputs: Inputs::new(cfg.inputs.clone()).with_max_record(cfg.max_record),
            names: cfg
                .inputs
                .iter()
                .map(|i| SourceName::lines(i.display_name()))
                .collect(),
            shards,
            decoders: (0..ranges)
                .map(|_| Padded(Decoder::new(cfg.decoder_config())))
                .collect(),
            parsed: (0..ranges).map(|_| Parsed::default()).collect(),
            sessions,
            dead: RecordWriter::new(cfg.dead_letter.clone()),
            late: RecordWriter::new(cfg.late_output.clone()),
            stats: RunStats::default(),
            order: Vec::new(),
            durable: None,
            topics,
            spill_root: None,
            store_stats: None,
            stores_restored: false,
        }
    }

    fn run(
        mut self,
        checkpoint: Option<&CheckpointConfig>,
        telemetry: &Telemetry,
    ) -> Result<RunStats, RunError> {
        let result = self.drive(checkpoint, telemetry);
        if result.is_err()
            && let Some(t) = &mut self.topics
        {
            // Nothing of a failed run's open transaction becomes visible.
            t.abort();
        }
        match result {
            Err(RunError::Output(e)) if e.source.kind() == std::io::ErrorKind::BrokenPipe => {
                let mut stats = self.stats_so_far();
                stats.output_closed = Some(e.name.clone());
                Err(RunError::OutputClosed {
                    name: e.name,
                    stats: Box::new(stats),
                })
            }
            Err(e) => Err(e.with_stats(self.stats_so_far())),
            ok => ok,
        }
    }

    /// The run's counts so far: this run's, its shards', and with a state directory
    /// those of the job's earlier runs.
    fn stats_so_far(&mut self) -> RunStats {
        let mut stats = std::mem::take(&mut self.stats);
        add_shard_counts(&mut stats, &self.shards);
        if let Some(d) = &self.durable {
            stats.add_counters(&d.carried);
            stats.checkpoints = Some(d.stats.clone());
            stats.scope = crate::stats::Scope::Job;
        }
        stats.elapsed_ms = self.started.elapsed().as_millis() as u64;
        stats.peak_rss_bytes = crate::stats::peak_rss_bytes();
        self.sample_state_stores();
        stats.state_store = self.store_stats.clone();
        stats
    }

    /// Updates what the spill stores did (none: nothing to do).
    fn sample_state_stores(&mut self) {
        if self.spill_root.is_some() {
            let live = self.shards.iter().filter_map(|s| s.op.spill_counts());
            backend::sample_stores(&mut self.store_stats, (0, 0), live);
        }
    }

    /// The one task of a file or stdin input, for telemetry.
    fn report(&self) -> TaskReport<'static> {
        TaskReport {
            task: "0",
            counts: task_counts(&self.stats, &self.shards),
            watermark: self.shards[0].op.watermark(),
            open_sessions: self
                .shards
                .iter()
                .map(|s| s.op.open_sessions() as u64)
                .sum(),
            keys: self.shards.iter().map(|s| s.op.keys() as u64).sum(),
        }
    }

    /// A key's state, from the shard its hash names.
    fn lookup(&self, key: &str) -> Vec<KeyView> {
        let shard = shard_of(key.as_bytes(), self.shards.len()) as usize;
        lookup::describe(&self.shards[shard], key.as_bytes(), "0")
            .into_iter()
            .collect()
    }

    /// Complete session records emitted by the last step.
    fn completed(&self) -> u64 {
        self.shards.iter().map(|s| s.out.completed).sum()
    }

    fn drive(
        &mut self,
        checkpoint: Option<&CheckpointConfig>,
        telemetry: &Telemetry,
    ) -> Result<RunStats, RunError> {
        self.inputs.check_readable()?;
        let start = match checkpoint {
            Some(c) => {
                telemetry.restoring();
                let sink = self.topics.as_deref_mut();
                let (durable, start) =
                    Durable::open(self.cfg, c, self.shards.len(), telemetry, sink)?;
                self.durable = Some(durable);
                // The state directory is locked now: its spill stores may be emptied.
                let restoring = start.restore.as_ref().map(|(_, state)| state);
                let attached = backend::attach(
                    self.cfg,
                    ops(&mut self.shards),
                    Some(&c.state_dir),
                    restoring,
                )?;
                self.spill_root = attached.root;
                self.stores_restored = attached.stores_restored;
                for s in &mut self.shards {
                    s.track_changes();
                    s.op.bound_tracked_changes();
                }
                start
            }
            None => {
                self.spill_root =
                    backend::attach(self.cfg, ops(&mut self.shards), None, None)?.root;
                if let Some(t) = &mut self.topics {
                    t.claim(None)?;
                }
                Start {
                    position: ReadPosition::default(),
                    next_seq: 0,
                    restore: None,
                }
            }
        };
        // Every output is opened up front (so that each reflects this run, even if
        // empty) and brought back to the checkpoint resumed from: a file is cut back to
        // its committed length, a prepared epoch is rolled forward or dropped.
        let marks = start
            .restore
            .as_ref()
            .map(|(m, _)| sessionizer_connectors::sink::marks_of(m))
            .unwrap_or_default();
        let epoch = self.durable.as_ref().map_or(1, Durable::next_epoch);
        // The job's instance names its transactions in an output that keeps them (a
        // Delta table); a run without checkpoints is a job of its own, which commits
        // once, at its end (a killed run adds nothing).
        let state_dir = checkpoint.map(|c| c.state_dir.clone());
        let mut job = || match &state_dir {
            Some(dir) => {
                crate::runtime::instance::persisted_instance(dir).map_err(std::io::Error::other)
            }
            None => Ok(crate::runtime::instance::random_instance()),
        };
        for (w, role) in [&mut self.sessions, &mut self.dead, &mut self.late]
            .into_iter()
            .zip(durable::ROLES)
        {
            let mark = w.find(role, &marks).cloned();
            let found = w.recover(epoch, mark.as_ref(), &mut job)?;
            let name = w.target().display_name();
            if found.created {
                tracing::info!(output = %name, "created");
            }
            if let Some(e) = found.rolled_forward {
                telemetry.warn(&format!(
                    "{name} had not committed checkpoint {e} (the run before stopped in between): committed now"
                ));
            }
            if !found.removed.is_empty() {
                tracing::info!(output = %name, removed = found.removed.len(), "files of no checkpoint removed");
            }
        }
        let mut first_step = start.next_seq;
        // A job whose watermark already went to +infinity stays flushed.
        let flushed_before = start.restore.as_ref().is_some_and(|(m, _)| m.flushed);
        if let Some((manifest, state)) = &start.restore {
            let began = Instant::now();
            let (keys, reported) = self.restore(manifest, state, checkpoint, telemetry)?;
            if let Some(d) = &mut self.durable {
                d.stats.restore_us += began.elapsed().as_micros() as u64;
                let files = std::iter::once(&manifest.base).chain(&manifest.deltas);
                let dir =
                    checkpoint.map_or_else(String::new, |c| c.state_dir.display().to_string());
                telemetry.restored(
                    &RestoreReport {
                        source: &dir,
                        task: "0",
                        epoch: Some(manifest.epoch),
                        records: files.clone().map(|f| f.puts + f.tombstones).sum(),
                        bytes: files.map(|f| f.bytes).sum(),
                        keys,
                        took: Duration::from_micros(d.stats.restore_us),
                    },
                    reported,
                );
            }
        }
        let inputs = Inputs::starting_at(self.cfg.inputs.clone(), start.position)
            .with_max_record(self.cfg.max_record);
        let mut last_end = start.position;
        let mut reader = ReadAhead::start(inputs)?;
        telemetry.running();
        let mut finished_lines = Vec::new();
        // With a live input (stdin) and --idle-timeout, a quiet input lets the watermark
        // move on with the wall clock (docs/semantics.md S-32).
        let idle = match self.cfg.idle_timeout {
            Some(d) if self.cfg.inputs.contains(&InputSource::Stdin) => Some(
                Duration::from_millis(u64::try_from(d.millis()).unwrap_or(0)),
            ),
            _ => None,
        };
        let mut last_input = Instant::now();
        let mut watermark_at_last_input = Watermark::MIN;
        // A live input's reader waits for lines to arrive: whatever the job produced is
        // written out before it waits too, and at least every LIVE_FLUSH_EVERY
        // (docs/semantics.md S-32). File inputs keep writing in large blocks.
        let live = self.cfg.inputs.contains(&InputSource::Stdin);
        let mut flushed_at = Instant::now();
        // A quiet live input still lets questions about keys be answered.
        let mut wait = match (idle.map(idle_tick), telemetry.serves_queries()) {
            (Some(tick), true) => Some(tick.min(QUERY_TICK)),
            (tick, serving) => tick.or(serving.then_some(QUERY_TICK)),
        };
        // A quiet live input still commits its Kafka transactions on time; and any
        // input hears a request to stop while the reader is busy (a record of
        // gigabytes being read past, /dev/zero).
        wait = Some(wait.map_or(QUERY_TICK, |w| w.min(QUERY_TICK)));
        let mut consumed = 0;
        let mut stopped = false;
        loop {
            if telemetry.stop_requested() {
                stopped = true;
                break;
            }
            telemetry.answer_queries(|key| self.lookup(key));
            let ready = if live { reader.ready()? } else { None };
            if live && (ready.is_none() || flushed_at.elapsed() >= LIVE_FLUSH_EVERY) {
                for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
                    w.finish()?;
                }
                match &mut self.topics {
                    // Kafka records are written when their transaction commits.
                    Some(t) => t.poll(),
                    None => telemetry.outputs_written(),
                }
                flushed_at = Instant::now();
            }
            let next = match ready {
                Some(next) => next,
                None => reader.next_within(wait)?,
            };
            let batch = match next {
                Next::End => break,
                Next::Idle => {
                    let quiet = crate::runtime::millis(last_input.elapsed());
                    if let Some(w) = idle.and_then(|limit| {
                        crate::runtime::idle_watermark(
                            crate::runtime::millis(limit),
                            quiet,
                            watermark_at_last_input,
                        )
                    }) {
                        self.advance_idle(w, first_step, telemetry)?;
                    }
                    self.commit_if_due(first_step, telemetry)?;
                    continue;
                }
                Next::Batch(batch) => batch,
            };
            // The watermark moves past sessions' close times while the batch is
            // processed: from now on, for the emission delay.
            let taken = Instant::now();
            self.decode(&batch)?;
            self.sessionize(&batch, first_step);
            self.check_state_stores()?;
            self.merge()?;
            telemetry.sessions_completed(self.completed(), taken);
            if !live && self.topics.is_none() {
                telemetry.outputs_written();
            }
            first_step += batch.lines.len() as u64;
            last_end = batch.end;
            consumed = batch.consumed;
            if let Some(d) = &mut self.durable {
                finished_inputs(&batch, &mut finished_lines);
                d.consumed(batch.end, &finished_lines);
            }
            reader.recycle(batch);
            last_input = Instant::now();
            watermark_at_last_input = self.shards[0].op.watermark();
            self.sample_state_stores();
            telemetry.batch(&[self.report()]);
            if let Some(d) = &mut self.durable {
                d.poll()?;
            }
            if let Some(t) = &mut self.topics {
                t.poll();
            }
            self.commit_if_due(first_step, telemetry)?;
        }
        if stopped {
            // Asked to stop (SIGTERM, SIGINT): what was processed is written out (and
            // checkpointed, so that the same command resumes from here); the sessions
            // in progress are not emitted.
            reader.abandon();
            self.stats.bytes_read = consumed;
            if self.durable.is_some() {
                self.checkpoint(first_step, false, false, telemetry)?;
                if let Some(d) = &mut self.durable {
                    d.wait()?;
                }
            } else {
                self.end_without_checkpoint(telemetry, true)?;
            }
            for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
                w.finish()?;
            }
            telemetry.outputs_written();
            telemetry.batch(&[self.report()]);
            let mut stats = self.stats_so_far();
            stats.stopped = true;
            return Ok(stats);
        }
        self.stats.bytes_read = reader.finish()?;
        let keep_open = self.durable.as_ref().is_some_and(Durable::keep_open) && !flushed_before;
        if !keep_open {
            // End of a bounded input: the watermark becomes +infinity, every session is
            // emitted.
            self.flush_at_end(telemetry)?;
        }
        if let Some(d) = &mut self.durable {
            d.consumed(last_end, &[]);
            self.checkpoint(first_step, true, !keep_open, telemetry)?;
        } else {
            self.end_without_checkpoint(telemetry, false)?;
        }
        self.sessions.finish()?;
        self.dead.finish()?;
        self.late.finish()?;
        telemetry.outputs_written();
        telemetry.batch(&[self.report()]);

        let stats = self.stats_so_far();
        debug_assert!(stats.adds_up(), "accounting does not add up: {stats:?}");
        Ok(stats)
    }
}

/// The session operators of `shards`, for the state backend.
fn ops(shards: &mut [Shard]) -> Vec<&mut sessionizer_window::SessionOperator> {
    shards.iter_mut().map(|s| &mut s.op).collect()
}
