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

#[cfg(feature = "kafka")]
mod kafka;
pub(crate) mod lookup;
pub(crate) mod parse;
mod read_ahead;
pub(crate) mod shard;

use crate::config::{CheckpointConfig, OnInvalid, OutputFormat, PipelineConfig};
use crate::error::RunError;
use crate::runtime::tagged::Tag;
use crate::runtime::{
    END_PART, Workers, backend, durable, kafka_sink, merge_order, shard_of, start_workers, state,
};
use crate::stats::RunStats;
use crate::telemetry::{
    CheckpointKind, CheckpointReport, KeyView, RestoreReport, TaskReport, Telemetry,
};
use durable::{Durable, Start};
use kafka_sink::{Side, TopicSink};
use parse::Parsed;
use read_ahead::{Next, ReadAhead, finished_inputs};
use sessionizer_checkpoint::CheckpointError;
use sessionizer_checkpoint::state::LiveError;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::input::ReadPosition;
#[cfg(feature = "parquet")]
use sessionizer_connectors::sink::staged_of;
use sessionizer_connectors::sink::{EpochSink, FileSink};
use sessionizer_connectors::{
    Batch, InputSource, Inputs, OutputTarget, RecordWriter, SessionEncoder,
};
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
            Ok(RecordWriter::parquet(
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
        OutputFormat::Delta => Ok(RecordWriter::delta(
            cfg.output.clone(),
            session_schema(cfg)?,
        )),
        #[cfg(not(feature = "delta"))]
        OutputFormat::Delta => Err(RunError::Unsupported(crate::error::Unsupported::NoDelta)),
    }
}

/// The columns of the session records' table (Parquet files, a Delta table).
#[cfg(feature = "parquet")]
fn session_schema(
    cfg: &PipelineConfig,
) -> Result<sessionizer_connectors::parquet::SessionSchema, RunError> {
    let aggregates: Vec<_> = cfg
        .aggregates
        .iter()
        .map(|a| (a.name.clone(), a.kind))
        .collect();
    // Two aggregates with one name, or one named like a fixed column.
    sessionizer_connectors::parquet::SessionSchema::new(&aggregates, cfg.emit).map_err(|e| {
        RunError::Output(sessionizer_connectors::encode::OutputError {
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

/// Where a completion record of the end of input goes in the merged output.
fn position<'a>(s: &'a Shard, t: &Tag) -> (i64, &'a [u8], i64) {
    t.place.completion(s.out.key(t))
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
    decoders: Vec<Decoder>,
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
                .map(|_| Decoder::new(cfg.decoder_config()))
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
                    outputs: Vec::new(),
                    restore: None,
                }
            }
        };
        // Files are created up front so that every output reflects this run, even if
        // empty; those a checkpoint committed are cut back to their committed length.
        for (w, role) in [&mut self.sessions, &mut self.dead, &mut self.late]
            .into_iter()
            .zip(durable::ROLES)
        {
            if w.is_delta() {
                // A Delta table: its log is brought back to the checkpoint.
                #[cfg(feature = "delta")]
                {
                    let Some(c) = checkpoint else {
                        return Err(RunError::Unsupported(
                            crate::error::Unsupported::DeltaWithoutCheckpoints,
                        ));
                    };
                    let job = crate::runtime::instance::persisted_instance(&c.state_dir)?;
                    let committed = start
                        .restore
                        .as_ref()
                        .and_then(|(m, _)| m.delta.iter().find(|d| d.role == role));
                    let epoch = self.durable.as_ref().map_or(1, Durable::next_epoch);
                    let found = w.open_delta(epoch, &job, committed)?;
                    if found.created {
                        tracing::info!(table = %w.target().display_name(), "Delta table created");
                    }
                    if let Some(e) = found.rolled_forward {
                        telemetry.warn(&format!(
                            "the Delta table {} had not committed checkpoint {e} (the run before stopped in between): committed now",
                            w.target().display_name()
                        ));
                    }
                    if !found.deleted.is_empty() {
                        tracing::info!(output = %w.target().display_name(), removed = found.deleted.len(), "Delta data files of no checkpoint removed");
                    }
                }
                continue;
            }
            if w.is_staged() {
                // Parquet files: the directory is brought back to the checkpoint.
                #[cfg(feature = "parquet")]
                {
                    let committed = start
                        .restore
                        .as_ref()
                        .and_then(|(m, _)| m.staged.iter().find(|s| s.role == role).map(staged_of));
                    let epoch = self.durable.as_ref().map_or(1, Durable::next_epoch);
                    let gone = w.open_staged(epoch, committed.as_ref())?;
                    if !gone.is_empty() {
                        tracing::info!(output = %w.target().display_name(), removed = gone.len(), "Parquet files of no checkpoint removed");
                    }
                }
                continue;
            }
            if let OutputTarget::File(p) = w.target() {
                let path = p.display().to_string();
                match start
                    .outputs
                    .iter()
                    .find(|c| c.role == role && c.path == path)
                {
                    Some(c) => w.open_at(c.committed_bytes)?,
                    None => w.open()?,
                }
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
                self.end_without_checkpoint(telemetry)?;
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
            self.end_without_checkpoint(telemetry)?;
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

    /// Puts a checkpoint's state back: every key into the shard its hash gives with this
    /// run's number of workers, and the watermark into every shard. Returns the keys
    /// restored, and how many of them were reported to `telemetry` as progress.
    fn restore(
        &mut self,
        manifest: &sessionizer_checkpoint::Manifest,
        state: &sessionizer_checkpoint::LoadedState,
        checkpoint: Option<&CheckpointConfig>,
        telemetry: &Telemetry,
    ) -> Result<(u64, u64), RunError> {
        let dir = checkpoint.map_or_else(String::new, |c| c.state_dir.display().to_string());
        // The largest gap first: restored timers of final sessions depend on it.
        for s in &mut self.shards {
            s.restore_progress(&manifest.watermark);
        }
        let shards = self.shards.len();
        // The keys spread evenly over the shards: room for them all up front (for
        // those in memory, when the spill stores started as the checkpoint's copies).
        let in_stores: u64 = if self.stores_restored {
            state.stores().iter().map(|s| s.keys).sum()
        } else {
            0
        };
        let keys = usize::try_from(manifest.keys.saturating_sub(in_stores)).unwrap_or(0);
        for s in &mut self.shards {
            s.op.reserve_keys(keys.div_ceil(shards) + keys / 64);
        }
        let format = state.format_version();
        if self.stores_restored {
            // The stores hold the keys that were in RocksDB at the base; the base file
            // and the deltas go over them.
            let restored = state::restore_over_files(
                state,
                shards,
                &mut self.shards[..],
                |all, s, key, value| all[s].restore_over(key, value, format),
            );
            let keys = self.restore_failed(restored, manifest, &dir)?;
            if let Some(d) = &mut self.durable {
                d.stats.restore_keys_linked = in_stores;
            }
            return Ok((keys + in_stores, 0));
        }
        let mut reported = 0u64;
        let restored = state::restore_keys(
            state,
            backend::store_reader(),
            shards,
            &mut self.shards[..],
            |all, s, hash| all[s].op.prefetch_index(hash),
            |all, s, key, value| all[s].restore_key(key, value, format),
            |keys| {
                telemetry.restore_progress(keys);
                reported += keys;
            },
        );
        let keys = self.restore_failed(restored, manifest, &dir)?;
        Ok((keys, reported))
    }

    /// The error of a restore that failed.
    fn restore_failed<T>(
        &self,
        restored: Result<T, LiveError<(Vec<u8>, crate::error::KeyStateError)>>,
        manifest: &sessionizer_checkpoint::Manifest,
        dir: &str,
    ) -> Result<T, RunError> {
        match restored {
            Ok(done) => Ok(done),
            Err(LiveError::Damaged(d)) => {
                Err(RunError::Checkpoint(CheckpointError::NoValidCheckpoint {
                    dir: dir.into(),
                    details: vec![(manifest.epoch, d)],
                }))
            }
            Err(LiveError::Apply((key, reason))) => Err(RunError::RestoreState {
                dir: dir.to_string(),
                key: String::from_utf8_lossy(&key).into_owned(),
                reason: Box::new(reason),
            }),
            Err(LiveError::NoStoreReader) => Err(RunError::Unsupported(
                crate::error::Unsupported::NoStoreReader,
            )),
        }
    }

    /// Takes a checkpoint when one is due, or — without a state directory — commits
    /// the Kafka output's transaction when that is due.
    fn commit_if_due(&mut self, next_seq: u64, telemetry: &Telemetry) -> Result<(), RunError> {
        let txn_due = self.topics.as_ref().is_some_and(|t| t.due());
        match &self.durable {
            Some(d) if txn_due || d.due(self.stats.records_read) => {
                self.checkpoint(next_seq, false, false, telemetry)
            }
            None if txn_due => self.commit_topics(telemetry),
            _ => Ok(()),
        }
    }

    /// The end of a run without a state directory: the Kafka output's open
    /// transaction commits, and Parquet files become visible.
    fn end_without_checkpoint(&mut self, telemetry: &Telemetry) -> Result<(), RunError> {
        #[cfg(feature = "parquet")]
        self.sessions.end_staged()?;
        if self.topics.is_some() {
            self.commit_topics(telemetry)?;
        }
        Ok(())
    }

    /// Commits the Kafka output's open transaction (a run without a state directory).
    fn commit_topics(&mut self, telemetry: &Telemetry) -> Result<(), RunError> {
        let Some(t) = &mut self.topics else {
            return Ok(());
        };
        let began = Instant::now();
        t.commit_open()?;
        telemetry.outputs_written();
        telemetry.checkpoint(&CheckpointReport {
            kind: CheckpointKind::Transaction,
            epoch: None,
            bytes: 0,
            keys: 0,
            took: began.elapsed(),
        });
        Ok(())
    }

    /// Flushes the outputs and takes a checkpoint (its writing goes on in the
    /// background unless `finished`: the last one is waited for). With a Kafka output
    /// it is a two-phase commit: the transaction is prepared (every record on the
    /// brokers, with a progress record naming the checkpoint), the checkpoint written
    /// and waited for, then the transaction committed.
    fn checkpoint(
        &mut self,
        next_seq: u64,
        finished: bool,
        flushed: bool,
        telemetry: &Telemetry,
    ) -> Result<(), RunError> {
        let Some(durable) = &mut self.durable else {
            return Ok(());
        };
        let mut files: Vec<FileSink<'_>> = [&mut self.sessions, &mut self.dead, &mut self.late]
            .into_iter()
            .zip(durable::ROLES)
            .map(|(writer, role)| FileSink { role, writer })
            .collect();
        let mut sinks: Vec<&mut dyn EpochSink> =
            files.iter_mut().map(|f| f as &mut dyn EpochSink).collect();
        if let Some(t) = self.topics.as_deref_mut() {
            sinks.push(t);
        }
        // The committer waits for the last checkpoint of a run (`finished`), and for
        // every checkpoint with a two-phase sink (a Kafka transaction, Parquet files).
        durable.checkpoint(
            self.pool.pool(),
            &mut self.shards,
            &mut sinks,
            &self.stats,
            next_seq,
            finished,
            flushed,
            finished,
        )?;
        if self.topics.is_some() {
            telemetry.outputs_written();
        }
        Ok(())
    }

    /// Moves every shard's watermark to `w` while a live input is quiet, and writes out
    /// what became due.
    fn advance_idle(
        &mut self,
        w: Watermark,
        step: u64,
        telemetry: &Telemetry,
    ) -> Result<(), RunError> {
        if w <= self.shards[0].op.watermark() {
            return Ok(());
        }
        let moved = Instant::now();
        for s in &mut self.shards {
            s.clear_outputs();
        }
        self.pool
            .on_each(&mut self.shards, |_, s| s.advance_idle(w, step));
        self.check_state_stores()?;
        self.merge()?;
        // A live reader is waiting for these: write them out now.
        for w in [&mut self.sessions, &mut self.late] {
            w.finish()?;
        }
        telemetry.sessions_completed(self.completed(), moved);
        if self.topics.is_none() {
            telemetry.outputs_written();
        }
        telemetry.batch(&[self.report()]);
        Ok(())
    }

    /// Stops the run when a shard's spill store failed: before anything the step
    /// emitted is written (a key that could not be read back was taken for a new one).
    fn check_state_stores(&mut self) -> Result<(), RunError> {
        for s in &mut self.shards {
            if let Some(e) = s.op.take_spill_error() {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Phase one: decode the batch's lines, in parallel ranges.
    fn decode(&mut self, batch: &Batch) -> Result<(), RunError> {
        let n = batch.lines.len();
        let ranges = self.parsed.len();
        let per = n.div_ceil(ranges).max(1);
        let on_invalid = self.cfg.on_invalid;
        let settings = parse::ParseSettings {
            aggregates: self.cfg.aggregates.len(),
            shards: self.shards.len(),
            on_invalid,
            names: &self.names,
            max_record: self.cfg.max_record,
        };
        let work = |(i, (decoder, out)): (usize, (&mut Decoder, &mut Parsed))| {
            let range = (i * per).min(n)..((i + 1) * per).min(n);
            parse::parse_range(batch, range, decoder, settings, out);
        };
        match self.pool.pool() {
            Some(pool) => {
                use rayon::prelude::*;
                let (decoders, parsed) = (&mut self.decoders, &mut self.parsed);
                pool.install(|| {
                    decoders
                        .par_iter_mut()
                        .zip(parsed.par_iter_mut())
                        .enumerate()
                        .for_each(work)
                });
            }
            None => work((0, (&mut self.decoders[0], &mut self.parsed[0]))),
        }

        let (mut blank, mut invalid, mut read) = (0, 0, 0);
        for part in &self.parsed {
            if let Some((line, reason)) = &part.first_invalid {
                let span = batch.lines[*line as usize];
                return Err(RunError::InvalidRecord {
                    position: self.names[span.input as usize]
                        .pos(span.line_no)
                        .to_string(),
                    reason: reason.clone(),
                });
            }
            blank += part.blank;
            invalid += part.invalid;
            read += part.recs.len() as u64 - part.blank;
            if on_invalid == OnInvalid::DeadLetter {
                match &mut self.topics {
                    Some(t) if t.routes(Side::DeadLetter) => {
                        t.side(Side::DeadLetter, &part.dead)?
                    }
                    _ => self.dead.append(&part.dead, part.invalid)?,
                }
            }
        }
        // Counted once the batch is sure to be sessionized: a run stopped by a closed
        // output reports counts that add up.
        self.stats.blank_lines += blank;
        self.stats.invalid += invalid;
        self.stats.records_read += read;
        self.stats.bytes_read = batch.consumed;
        Ok(())
    }

    /// Phase two: every shard runs the batch.
    fn sessionize(&mut self, batch: &Batch, first_step: u64) {
        let parsed = &self.parsed[..];
        let names = &self.names[..];
        for s in &mut self.shards {
            s.clear_outputs();
        }
        let process = |_, s: &mut Shard| s.process(batch, parsed, first_step, names);
        self.pool.on_each(&mut self.shards, process);
    }

    /// The end of a bounded input: the watermark becomes +infinity and every session is
    /// emitted, in rounds of at most [`END_PART`] sessions per shard written out as they
    /// go, so that memory does not grow with the number of sessions still open.
    ///
    /// Each shard emits its sessions in `(close, key, start)` order. With several
    /// shards, a round writes every record up to the smallest last record of a shard
    /// with more to come — nothing any shard emits later sorts before it — and keeps the
    /// others for the next round; a shard holding more than half a part sits a round
    /// out. So the merged output is exactly that of one operator, for any number of
    /// workers, and each shard holds at most one and a half parts.
    fn flush_at_end(&mut self, telemetry: &Telemetry) -> Result<(), RunError> {
        let ended = Instant::now();
        for s in &mut self.shards {
            s.clear_outputs();
            s.ending = true;
        }
        while self.shards.iter().any(|s| s.ending) {
            let round = |_, s: &mut Shard| {
                if s.ending && s.out.tags.len() <= END_PART / 2 {
                    s.ending = s.finish_part(END_PART);
                }
            };
            self.pool.on_each(&mut self.shards, round);
            self.check_state_stores()?;
            let completed = self.shards.iter_mut();
            let completed = completed.map(|s| std::mem::take(&mut s.out.completed));
            telemetry.sessions_completed(completed.sum(), ended);
            self.merge_end_part()?;
        }
        Ok(())
    }

    /// Writes the records of a round of [`flush_at_end`](Self::flush_at_end) that no
    /// later record can precede, and drops them from the shards.
    fn merge_end_part(&mut self) -> Result<(), RunError> {
        if let [only] = &mut self.shards[..] {
            match &mut self.topics {
                Some(t) => t.sessions(&only.out)?,
                None => {
                    let records = only.out.encoder.records;
                    self.sessions.append(&only.out.encoder.buf, records)?;
                }
            }
            only.out.clear();
            return Ok(());
        }
        let shards = &self.shards;
        // Everything up to the last record of every shard with more to come is known.
        let Some(written) = crate::runtime::end_part_lens(
            shards.len(),
            |s| shards[s].ending,
            |s| shards[s].out.tags.len(),
            |s, t| position(&shards[s], &shards[s].out.tags[t]),
        ) else {
            return Ok(()); // A shard emits in the next round.
        };
        self.order.clear();
        for (si, &n) in written.iter().enumerate() {
            self.order.extend((0..n).map(|ti| (si, ti)));
        }
        self.order.sort_unstable_by(|&(sa, ta), &(sb, tb)| {
            let (a, b) = (&shards[sa], &shards[sb]);
            // Keys differ across shards: no two records are equal.
            position(a, &a.out.tags[ta]).cmp(&position(b, &b.out.tags[tb]))
        });
        for &(si, ti) in &self.order {
            let t = &shards[si].out.tags[ti];
            match &mut self.topics {
                Some(topics) => topics.session(&shards[si].out, t)?,
                None => {
                    let (from, len) = t.bytes;
                    self.sessions
                        .append(&shards[si].out.encoder.buf[from..from + len], 1)?;
                }
            }
        }
        for (s, n) in self.shards.iter_mut().zip(written) {
            s.out.drop_front(n);
        }
        Ok(())
    }

    /// Phase three: the shards' records in the order of one operator.
    fn merge(&mut self) -> Result<(), RunError> {
        if let [only] = &mut self.shards[..] {
            let lates = only.late_steps.len() as u64;
            match &mut self.topics {
                Some(t) => {
                    t.sessions(&only.out)?;
                    if t.routes(Side::Late) {
                        t.side(Side::Late, &only.late)?;
                    } else {
                        self.late.append(&only.late, lates)?;
                    }
                }
                None => {
                    let records = only.out.encoder.records;
                    self.sessions.append(&only.out.encoder.buf, records)?;
                    self.late.append(&only.late, lates)?;
                }
            }
            return Ok(());
        }
        let shards = &self.shards;
        merge_order(
            &mut self.order,
            shards.iter().map(|s| s.out.tags.len()),
            |si, ti| shards[si].out.tags[ti].place,
            |si, ti| shards[si].out.key(&shards[si].out.tags[ti]),
        );
        for &(si, ti) in &self.order {
            let t = &shards[si].out.tags[ti];
            match &mut self.topics {
                Some(topics) => topics.session(&shards[si].out, t)?,
                None => {
                    let buf = &shards[si].out.encoder.buf;
                    let (from, len) = t.bytes;
                    self.sessions.append(&buf[from..from + len], 1)?;
                }
            }
        }

        let mut lates: Vec<(u64, usize, usize)> = Vec::new();
        for (si, s) in shards.iter().enumerate() {
            lates.extend((0..s.late_steps.len()).map(|i| (s.late_steps[i].0, si, i)));
        }
        lates.sort_unstable();
        for (_, si, i) in lates {
            let (_, from, len) = shards[si].late_steps[i];
            let record = &shards[si].late[from..from + len];
            match &mut self.topics {
                Some(t) if t.routes(Side::Late) => t.side(Side::Late, record)?,
                _ => self.late.append(record, 1)?,
            }
        }
        Ok(())
    }
}

/// The session operators of `shards`, for the state backend.
fn ops(shards: &mut [Shard]) -> Vec<&mut sessionizer_window::SessionOperator> {
    shards.iter_mut().map(|s| &mut s.op).collect()
}
