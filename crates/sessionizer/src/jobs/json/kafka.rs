//! The command line's JSON session window as a Kafka task: each partition's records
//! decoded by the command line's decoder and sessionized by one shard, on the runtime's
//! Kafka driver (`runtime::kafka`).

use crate::config::{KafkaConfig, OnInvalid, PipelineConfig};
use crate::error::{KeyStateError, RunError};
use crate::jobs::json::parse::{self, Kind, ParseSettings, Parsed};
use crate::jobs::json::shard::Shard;
use crate::runtime::backend::TaskStores;
use crate::runtime::kafka::{
    DriverSettings, Processed, PutChange, TaskFactory, TaskOp, UpstreamTimes, run_tasks,
};
use crate::runtime::state;
use crate::runtime::tagged::Tagged;
use crate::stats::RunStats;
use crate::telemetry::{KeyView, Telemetry};
use sessionizer_checkpoint::WatermarkState;
use sessionizer_connectors::encode::SourceName;
use sessionizer_connectors::kafka::partitioner::KeyPlacement;
use sessionizer_connectors::{Batch, SessionEncoder};
use sessionizer_core::decode::Decoder;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::spill::{SpillCounts, SpillError};

/// Runs a job whose input is Kafka topics.
pub(crate) fn run(
    cfg: &PipelineConfig,
    kafka: &KafkaConfig,
    telemetry: &Telemetry,
) -> Result<RunStats, RunError> {
    #[allow(unused_mut)]
    let mut settings = DriverSettings::of(cfg);
    match cfg.output_format {
        #[cfg(feature = "delta")]
        crate::config::OutputFormat::Delta { commit_every } => {
            let (target, schema) = (cfg.output.clone(), super::session_schema(cfg)?);
            settings.table = Some(crate::runtime::kafka::TableSettings {
                make: std::sync::Arc::new(move || {
                    sessionizer_connectors::delta::DeltaStorage::writer(
                        target.clone(),
                        schema.clone(),
                        commit_every,
                    )
                }),
            });
        }
        #[cfg(not(feature = "delta"))]
        crate::config::OutputFormat::Delta { .. } => {
            return Err(RunError::Unsupported(crate::error::Unsupported::NoDelta));
        }
        _ => {}
    }
    run_tasks(settings, kafka, JsonTasks::new(cfg), telemetry)
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
            stores.attach(self.cfg, &mut shard.op, task)?;
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

    type Times = JsonTimes;

    fn upstream_times(&self) -> JsonTimes {
        JsonTimes {
            decoder: Decoder::new(self.cfg.decoder_config()),
            max_record: self.cfg.max_record,
        }
    }
}

/// The event times of input records, read as a task reads the record: by the command
/// line's decoder (key, time and its valid range, gap), a record over the size limit
/// refused unread. A record a task refuses has none.
pub(crate) struct JsonTimes {
    decoder: Decoder,
    max_record: usize,
}

impl UpstreamTimes for JsonTimes {
    fn time_of(&mut self, record: &[u8]) -> Option<EventTime> {
        if record.len() > self.max_record {
            return None;
        }
        self.decoder.decode(record).ok().map(|d| d.time)
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

    fn follow_upstream(&mut self) {
        self.shard.follow_upstream();
    }

    fn observe_upstream(&mut self, t: EventTime, step: u64) {
        self.shard.observe_upstream(t, step);
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
        crate::jobs::json::shard::add_shard_counts(stats, std::slice::from_ref(&self.shard));
    }

    fn open_sessions(&self) -> u64 {
        self.shard.op.open_sessions() as u64
    }

    fn keys(&self) -> u64 {
        self.shard.op.keys() as u64
    }

    fn describe(&self, key: &[u8], task: &str) -> Option<KeyView> {
        crate::jobs::json::lookup::describe(&self.shard, key, task)
    }
}
