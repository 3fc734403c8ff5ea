//! The validated options of a pipeline run.

use sessionizer_connectors::{InputSource, OutputTarget};
use sessionizer_core::decode::{DecoderConfig, DedupMode, TimeFormat};
use sessionizer_core::json::FieldPath;
use sessionizer_core::{DurationMs, EventTime};
use sessionizer_window::{AggKind, EmitMode, WindowConfig};

/// What to do with an invalid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInvalid {
    DeadLetter,
    Skip,
    Fail,
}

/// One aggregate of the output record.
#[derive(Debug, Clone)]
pub struct Aggregate {
    pub kind: AggKind,
    pub field: FieldPath,
    pub name: String,
}

/// Everything a pipeline run needs, checked.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub inputs: Vec<InputSource>,
    pub output: OutputTarget,
    pub dead_letter: OutputTarget,
    pub late_output: OutputTarget,
    pub key: FieldPath,
    pub time: FieldPath,
    pub time_format: TimeFormat,
    pub gap: DurationMs,
    pub gap_field: Option<FieldPath>,
    pub watermark_delay: DurationMs,
    pub allowed_lateness: DurationMs,
    pub valid_range: (EventTime, EventTime),
    pub aggregates: Vec<Aggregate>,
    pub dedup: DedupMode,
    pub emit: EmitMode,
    pub on_invalid: OnInvalid,
    /// Worker threads; keys are shared among them by hash. The output is the same for
    /// every value.
    pub workers: usize,
}

impl PipelineConfig {
    /// The decoder's view of the options.
    pub fn decoder_config(&self) -> DecoderConfig {
        DecoderConfig {
            key: self.key.clone(),
            time: self.time.clone(),
            time_format: self.time_format,
            gap_field: self.gap_field.clone(),
            dedup: self.dedup.clone(),
            valid_range: self.valid_range,
            value_fields: self.aggregates.iter().map(|a| a.field.clone()).collect(),
        }
    }

    /// The session window's view of the options.
    pub fn window_config(&self) -> WindowConfig {
        WindowConfig {
            gap: self.gap,
            allowed_lateness: self.allowed_lateness,
            emit: self.emit,
            aggregates: self.aggregates.iter().map(|a| a.kind).collect(),
            dedup: !matches!(self.dedup, DedupMode::Off),
        }
    }

    pub fn aggregate_names(&self) -> Vec<String> {
        self.aggregates.iter().map(|a| a.name.clone()).collect()
    }
}
