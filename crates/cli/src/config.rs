//! Stage two: raw arguments + the optional TOML file → a validated [`RunConfig`].
//!
//! Precedence: a flag on the command line, else the config file, else the default.
//! Aggregates from the file and from flags are combined (file first); two aggregates
//! with the same output name are refused.

use crate::args::{
    EmitArg, OnInvalidArg, OutputFormatArg, ProgressArg, RunArgs, StateBackendArg, TimeFormatArg,
};
use serde::Deserialize;
use sessionizer::config::{
    Aggregate, CheckpointConfig, OnInvalid, OutputFormat, PipelineConfig, StateBackend,
};
use sessionizer_connectors::{InputSource, OutputTarget};
use sessionizer_core::decode::{DedupMode, TimeFormat};
use sessionizer_core::json::FieldPath;
use sessionizer_core::timefmt::{parse_duration, parse_timestamp};
use sessionizer_core::{DurationMs, EventTime};
use sessionizer_window::{AggKind, EmitMode};
use std::path::{Path, PathBuf};

/// A problem with the options, phrased for the user.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid {option} '{value}': {reason}")]
    Invalid {
        option: &'static str,
        value: String,
        reason: String,
    },
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    ParseFile { path: PathBuf, message: String },
    #[error("{0}")]
    Conflict(String),
}

/// The TOML config file: the same names as the flags (kebab-case), plus `[[aggregate]]`
/// tables that can rename outputs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub input: Option<Vec<String>>,
    pub delta_input: Option<Vec<String>>,
    pub output: Option<String>,
    pub output_format: Option<OutputFormatArg>,
    pub partition_by_date: Option<bool>,
    pub delta_table: Option<String>,
    pub delta_commit_interval: Option<String>,
    pub key: Option<String>,
    pub time: Option<String>,
    pub time_format: Option<TimeFormatArg>,
    pub gap: Option<String>,
    pub gap_field: Option<String>,
    pub watermark_delay: Option<String>,
    pub allowed_lateness: Option<String>,
    pub valid_time_range: Option<String>,
    #[serde(default)]
    pub collect: Vec<String>,
    #[serde(default)]
    pub first: Vec<String>,
    #[serde(default)]
    pub last: Vec<String>,
    #[serde(default)]
    pub count_distinct: Vec<String>,
    #[serde(default)]
    pub sum: Vec<String>,
    #[serde(default)]
    pub min: Vec<String>,
    #[serde(default)]
    pub max: Vec<String>,
    #[serde(default)]
    pub aggregate: Vec<AggregateEntry>,
    pub dedup: Option<bool>,
    pub dedup_field: Option<String>,
    pub emit: Option<EmitArg>,
    pub on_invalid: Option<OnInvalidArg>,
    pub max_record_size: Option<String>,
    pub dead_letter: Option<String>,
    pub late_output: Option<String>,
    pub stats_file: Option<PathBuf>,
    pub progress: Option<ProgressArg>,
    pub http_addr: Option<String>,
    pub workers: Option<usize>,
    pub idle_timeout: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub state_backend: Option<StateBackendArg>,
    pub state_memory: Option<String>,
    pub checkpoint_interval: Option<String>,
    pub checkpoint_every_records: Option<u64>,
    pub keep_open: Option<bool>,
    pub kafka_brokers: Option<String>,
    pub kafka_topic: Option<Vec<String>>,
    pub kafka_group: Option<String>,
    pub kafka_start: Option<crate::kafka::KafkaStartArg>,
    pub stop_at_end: Option<bool>,
    pub kafka_output_topic: Option<String>,
    pub dead_letter_topic: Option<String>,
    pub late_topic: Option<String>,
    pub kafka_instance_id: Option<String>,
    pub kafka_transaction_timeout: Option<String>,
    pub kafka_timeout: Option<String>,
    pub kafka_outage_limit: Option<String>,
    pub kafka_config: Option<Vec<String>>,
    pub standby_replicas: Option<usize>,
    pub snapshot_interval: Option<String>,
    pub repartition: Option<bool>,
    pub kafka_partitioner: Option<crate::kafka::PartitionerArg>,
}

impl FileConfig {
    /// Takes the Kafka options out of the file.
    fn take_kafka(&mut self) -> crate::kafka::KafkaFile {
        crate::kafka::KafkaFile {
            kafka_brokers: self.kafka_brokers.take(),
            kafka_topic: self.kafka_topic.take(),
            kafka_group: self.kafka_group.take(),
            kafka_start: self.kafka_start.take(),
            stop_at_end: self.stop_at_end.take(),
            kafka_output_topic: self.kafka_output_topic.take(),
            dead_letter_topic: self.dead_letter_topic.take(),
            late_topic: self.late_topic.take(),
            kafka_instance_id: self.kafka_instance_id.take(),
            kafka_transaction_timeout: self.kafka_transaction_timeout.take(),
            kafka_timeout: self.kafka_timeout.take(),
            kafka_outage_limit: self.kafka_outage_limit.take(),
            kafka_config: self.kafka_config.take(),
            standby_replicas: self.standby_replicas.take(),
            snapshot_interval: self.snapshot_interval.take(),
            repartition: self.repartition.take(),
            kafka_partitioner: self.kafka_partitioner.take(),
        }
    }
}

/// `[[aggregate]] kind = "collect", field = "page", name = "visited_pages"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AggregateEntry {
    pub kind: AggKindArg,
    pub field: String,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AggKindArg {
    Collect,
    First,
    Last,
    CountDistinct,
    Sum,
    Min,
    Max,
}

impl From<AggKindArg> for AggKind {
    fn from(k: AggKindArg) -> AggKind {
        match k {
            AggKindArg::Collect => AggKind::Collect,
            AggKindArg::First => AggKind::First,
            AggKindArg::Last => AggKind::Last,
            AggKindArg::CountDistinct => AggKind::CountDistinct,
            AggKindArg::Sum => AggKind::Sum,
            AggKindArg::Min => AggKind::Min,
            AggKindArg::Max => AggKind::Max,
        }
    }
}

/// The run options beyond the pipeline's own.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub pipeline: PipelineConfig,
    /// Durable state, with `--state-dir`.
    pub checkpoint: Option<CheckpointConfig>,
    pub stats_file: Option<PathBuf>,
    pub progress: ProgressArg,
    /// Where the HTTP endpoint listens (`--http-addr`).
    pub http_addr: Option<std::net::SocketAddr>,
}

/// Reads the `--config` file, if any.
pub fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::ParseFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// A size such as `512MB`, `2GB`, `1.5GB` or `1048576` (bytes): KB, MB, GB and TB (also
/// KiB, MiB, ... or K, M, G, T) are powers of 1024.
fn size(option: &'static str, value: &str) -> Result<u64, ConfigError> {
    let invalid = |reason: &str| ConfigError::Invalid {
        option,
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| invalid("give a size such as 512MB or 2GB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(invalid("unknown unit; use B, KB, MB, GB or TB")),
    };
    let bytes = number * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(invalid("too large"));
    }
    Ok(bytes as u64)
}

fn duration(
    option: &'static str,
    value: Option<String>,
    default: &str,
) -> Result<DurationMs, ConfigError> {
    let value = value.unwrap_or_else(|| default.to_string());
    // Duration flags accept values starting with '-' (so that `--gap -5m` is refused as
    // negative, not taken for an unknown option); a missing value then takes the next
    // option.
    if value.starts_with("--") {
        return Err(ConfigError::Invalid {
            option,
            value,
            reason: format!("that is an option, not a duration: give {option} a value such as 30m"),
        });
    }
    parse_duration(&value).map_err(|e| ConfigError::Invalid {
        option,
        value: value.clone(),
        reason: e.to_string(),
    })
}

fn field(option: &'static str, value: &str) -> Result<FieldPath, ConfigError> {
    FieldPath::parse(value).map_err(|e| ConfigError::Invalid {
        option,
        value: value.to_string(),
        reason: e.to_string(),
    })
}

fn time_range(value: &str) -> Result<(EventTime, EventTime), ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        option: "--valid-time-range",
        value: value.to_string(),
        reason,
    };
    let (a, b) = value
        .split_once("..")
        .ok_or_else(|| invalid("expected START..END, e.g. 2020-01-01..2030-01-01".into()))?;
    let start = parse_timestamp(a.trim().as_bytes()).map_err(|e| invalid(format!("start: {e}")))?;
    let end = parse_timestamp(b.trim().as_bytes()).map_err(|e| invalid(format!("end: {e}")))?;
    if start >= end {
        return Err(invalid("the start must be before the end".into()));
    }
    Ok((start, end))
}

/// The side-output path next to a file output: `sessions.jsonl` → `sessions.<what>.jsonl`.
fn beside(output: &OutputTarget, what: &str) -> OutputTarget {
    match output {
        OutputTarget::File(p) => {
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "sessions".into());
            OutputTarget::File(p.with_file_name(format!("{stem}.{what}.jsonl")))
        }
        OutputTarget::Stdout | OutputTarget::Stderr => OutputTarget::Stderr,
    }
}

/// Merges flags over the config file and checks everything.
pub fn resolve(mut args: RunArgs) -> Result<RunConfig, ConfigError> {
    let mut file = match &args.config {
        Some(p) => load_file(p)?,
        None => FileConfig::default(),
    };
    let kafka_file = file.take_kafka();
    let kafka_args = std::mem::take(&mut args.kafka);
    let kafka_ctx = crate::kafka::Context {
        inputs_given: !args.input.is_empty() || file.input.is_some(),
        output_given: args.output.is_some() || file.output.is_some(),
        dead_letter_given: args.dead_letter.is_some() || file.dead_letter.is_some(),
        late_output_given: args.late_output.is_some() || file.late_output.is_some(),
        state_dir: args.state_dir.clone().or(file.state_dir.clone()),
        keep_open: args.keep_open || file.keep_open.unwrap_or(false),
        interval: {
            let d = duration(
                "--checkpoint-interval",
                args.checkpoint_interval
                    .clone()
                    .or(file.checkpoint_interval.clone()),
                "10s",
            )?;
            std::time::Duration::from_millis(d.millis().max(0) as u64)
        },
    };
    let kafka = crate::kafka::resolve(kafka_args, kafka_file, kafka_ctx)?;
    let kafka_in = kafka.as_ref().is_some_and(|k| k.is_source());
    let kafka_out = kafka.as_ref().is_some_and(|k| k.is_sink());

    let delta_inputs: Vec<String> = if !args.delta_input.is_empty() {
        std::mem::take(&mut args.delta_input)
    } else {
        file.delta_input.take().unwrap_or_default()
    };
    if !delta_inputs.is_empty() {
        if !args.input.is_empty() || file.input.is_some() || kafka_in {
            return Err(ConfigError::Conflict(
                "--delta-input cannot be combined with --input or a Kafka input: one kind of input per job".into(),
            ));
        }
        for table in &delta_inputs {
            check_table_location("--delta-input", table)?;
        }
    }
    let inputs: Vec<String> = if !args.input.is_empty() {
        args.input
    } else if kafka_in || !delta_inputs.is_empty() {
        Vec::new()
    } else {
        file.input.unwrap_or_else(|| vec!["-".into()])
    };
    if inputs.iter().filter(|i| *i == "-").count() > 1 {
        return Err(ConfigError::Conflict(
            "stdin ('-') can be given as --input only once".into(),
        ));
    }
    let partition_by_date = args.partition_by_date || file.partition_by_date.unwrap_or(false);
    let delta_table = args.delta_table.take().or(file.delta_table.take());
    let explicit_format = args.output_format.or(file.output_format);
    if let Some(table) = &delta_table {
        check_delta_table(
            table,
            &[
                ("--output", args.output.is_some() || file.output.is_some()),
                ("--output-format", explicit_format.is_some()),
                ("--partition-by-date", partition_by_date),
                ("a Kafka output", kafka_out),
            ],
        )?;
        if kafka_in && kafka.as_ref().is_some_and(|k| k.group.is_none()) {
            return Err(ConfigError::Conflict(
                "--delta-table with a Kafka input needs --kafka-group: the table is written exactly once, its epochs committed in the group's transactions with the offsets and the changelogs".into(),
            ));
        }
    }
    // With a Kafka output topic the side outputs default to stderr, as with stdout.
    let output = if kafka_out {
        OutputTarget::Stdout
    } else if let Some(table) = &delta_table {
        OutputTarget::File(PathBuf::from(table))
    } else {
        OutputTarget::parse(&args.output.or(file.output).unwrap_or_else(|| "-".into()))
    };
    let delta_commit_interval = args
        .delta_commit_interval
        .take()
        .or(file.delta_commit_interval.take());
    let commit_every = match delta_commit_interval {
        Some(_) if delta_table.is_none() => {
            return Err(ConfigError::Conflict(
                "--delta-commit-interval applies to --delta-table".into(),
            ));
        }
        Some(d) => {
            let d = duration("--delta-commit-interval", Some(d), "0s")?;
            Some(std::time::Duration::from_millis(d.millis().max(0) as u64))
        }
        None => None,
    };
    let output_format = match explicit_format.unwrap_or(OutputFormatArg::Jsonl) {
        _ if delta_table.is_some() => OutputFormat::Delta { commit_every },
        OutputFormatArg::Jsonl if partition_by_date => {
            return Err(ConfigError::Conflict(
                "--partition-by-date applies to --output-format parquet".into(),
            ));
        }
        OutputFormatArg::Jsonl => OutputFormat::JsonLines,
        OutputFormatArg::Parquet if !matches!(output, OutputTarget::File(_)) => {
            return Err(ConfigError::Conflict(
                "--output-format parquet writes Parquet files into a directory: give it as --output DIR (not stdout, not a Kafka topic)".into(),
            ));
        }
        OutputFormatArg::Parquet => OutputFormat::Parquet { partition_by_date },
    };
    let explicit_dead = args.dead_letter.is_some() || file.dead_letter.is_some();
    let explicit_late = args.late_output.is_some() || file.late_output.is_some();
    // A table in object storage has no directory beside it for the side outputs' files,
    // and the processes of a Kafka group would share them: they default to stderr, as
    // next to a Kafka topic.
    let in_object_store = delta_table.as_deref().is_some_and(|t| t.contains("://"));
    let side = |what| match in_object_store || (kafka_in && delta_table.is_some()) {
        true => OutputTarget::Stderr,
        false => beside(&output, what),
    };
    let dead_letter = match args.dead_letter.or(file.dead_letter) {
        Some(p) => OutputTarget::parse(&p),
        None => side("dead-letter"),
    };
    let late_output = match args.late_output.or(file.late_output) {
        Some(p) => OutputTarget::parse(&p),
        None => side("late"),
    };
    let stats_file = args.stats_file.or(file.stats_file);
    let http_addr = args
        .http_addr
        .or(file.http_addr.take())
        .map(|a| {
            crate::http::parse_addr(&a).map_err(|reason| ConfigError::Invalid {
                option: "--http-addr",
                value: a.clone(),
                reason: reason.to_string(),
            })
        })
        .transpose()?;
    check_distinct_files(
        &inputs,
        args.config.as_deref(),
        &[
            (OutputRole::Output, &output, true),
            (OutputRole::DeadLetter, &dead_letter, explicit_dead),
            (OutputRole::Late, &late_output, explicit_late),
        ],
        stats_file.as_deref(),
    )?;

    let key = field(
        "--key",
        &args.key.or(file.key).unwrap_or_else(|| "visit_id".into()),
    )?;
    let time = field(
        "--time",
        &args
            .time
            .or(file.time)
            .unwrap_or_else(|| "event_time".into()),
    )?;
    let time_format = match args
        .time_format
        .or(file.time_format)
        .unwrap_or(TimeFormatArg::Rfc3339)
    {
        TimeFormatArg::Rfc3339 => TimeFormat::Rfc3339,
        TimeFormatArg::EpochMs => TimeFormat::EpochMs,
        TimeFormatArg::EpochS => TimeFormat::EpochS,
    };
    let gap = duration("--gap", args.gap.or(file.gap), "30m")?;
    let gap_field = match args.gap_field.or(file.gap_field) {
        Some(f) => Some(field("--gap-field", &f)?),
        None => None,
    };
    let watermark_delay = duration(
        "--watermark-delay",
        args.watermark_delay.or(file.watermark_delay),
        "1m",
    )?;
    let allowed_lateness = duration(
        "--allowed-lateness",
        args.allowed_lateness.or(file.allowed_lateness),
        "0s",
    )?;
    let valid_range = time_range(
        &args
            .valid_time_range
            .or(file.valid_time_range)
            .unwrap_or_else(|| "1970-01-01..2200-01-01".into()),
    )?;

    let mut aggregates = Vec::new();
    for entry in file.aggregate {
        let path = field("aggregate field", &entry.field)?;
        let name = entry.name.unwrap_or_else(|| last_segment(&entry.field));
        aggregates.push(Aggregate {
            kind: entry.kind.into(),
            field: path,
            name,
        });
    }
    let by_kind = [
        (AggKind::Collect, "--collect", file.collect, args.collect),
        (AggKind::First, "--first", file.first, args.first),
        (AggKind::Last, "--last", file.last, args.last),
        (
            AggKind::CountDistinct,
            "--count-distinct",
            file.count_distinct,
            args.count_distinct,
        ),
        (AggKind::Sum, "--sum", file.sum, args.sum),
        (AggKind::Min, "--min", file.min, args.min),
        (AggKind::Max, "--max", file.max, args.max),
    ];
    for (kind, option, from_file, from_flags) in by_kind {
        for f in from_file.into_iter().chain(from_flags) {
            // NAME=FIELD names the output; a bare FIELD is named after its last segment.
            let (name, path) = match f.split_once('=') {
                Some((name, path)) => {
                    let name = name.trim();
                    if name.is_empty() {
                        return Err(ConfigError::Invalid {
                            option,
                            value: f.clone(),
                            reason: "NAME=FIELD needs a name before '='".into(),
                        });
                    }
                    (name.to_string(), path.trim())
                }
                None => (last_segment(&f), f.as_str()),
            };
            aggregates.push(Aggregate {
                kind,
                field: field(option, path)?,
                name,
            });
        }
    }
    const RESERVED: &[&str] = &sessionizer_connectors::encode::FIXED_FIELDS;
    for (i, a) in aggregates.iter().enumerate() {
        if RESERVED.contains(&a.name.as_str()) {
            return Err(ConfigError::Conflict(format!(
                "aggregate output name '{}' clashes with a field of the session record; name it with NAME=FIELD (e.g. --sum total=amount) or in the config file ([[aggregate]] name = ...)",
                a.name
            )));
        }
        if aggregates[..i].iter().any(|b| b.name == a.name) {
            return Err(ConfigError::Conflict(format!(
                "two aggregates are named '{}'; name one with NAME=FIELD (e.g. --min min_v=v) or in the config file ([[aggregate]] name = ...)",
                a.name
            )));
        }
    }

    // A dedup flag on the command line replaces whatever the file says about dedup;
    // clap already refuses --dedup together with --dedup-field.
    let dedup = if args.dedup {
        DedupMode::Record
    } else if let Some(f) = &args.dedup_field {
        DedupMode::Field(field("--dedup-field", f)?)
    } else {
        match (file.dedup.unwrap_or(false), file.dedup_field) {
            (true, Some(_)) => {
                return Err(ConfigError::Conflict(
                    "the config file sets both dedup and dedup-field; keep one".into(),
                ));
            }
            (true, None) => DedupMode::Record,
            (false, Some(f)) => DedupMode::Field(field("dedup-field", &f)?),
            (false, None) => DedupMode::Off,
        }
    };
    // A table takes plain inserts: each session once, when final.
    let default_emit = if delta_table.is_some() {
        EmitArg::Final
    } else {
        EmitArg::OnClose
    };
    let emit = match args.emit.or(file.emit).unwrap_or(default_emit) {
        EmitArg::OnClose | EmitArg::OnUpdate if delta_table.is_some() => {
            return Err(ConfigError::Conflict(
                "--delta-table appends each session once, when it is final (--emit final): on-close and on-update emit revisions and retractions, which a table of plain inserts cannot take back; leave --emit out, or write JSON lines or Parquet with --output".into(),
            ));
        }
        EmitArg::OnClose => EmitMode::OnClose,
        EmitArg::OnUpdate => EmitMode::OnUpdate,
        EmitArg::Final => EmitMode::Final,
    };
    let on_invalid = match args
        .on_invalid
        .or(file.on_invalid)
        .unwrap_or(OnInvalidArg::DeadLetter)
    {
        OnInvalidArg::DeadLetter => OnInvalid::DeadLetter,
        OnInvalidArg::Skip => OnInvalid::Skip,
        OnInvalidArg::Fail => OnInvalid::Fail,
    };

    let idle_timeout = match args.idle_timeout.or(file.idle_timeout) {
        Some(v) => {
            let d = duration("--idle-timeout", Some(v.clone()), "0s")?;
            if d.millis() == 0 {
                return Err(ConfigError::Invalid {
                    option: "--idle-timeout",
                    value: v,
                    reason: "the input would count as idle all the time; give how long a quiet input waits before the watermark follows the wall clock (e.g. 30s), or leave --idle-timeout out to move the watermark with events only".into(),
                });
            }
            Some(d)
        }
        None => None,
    };
    let workers = args.workers.or(file.workers).unwrap_or(1);
    if !(1..=256).contains(&workers) {
        return Err(ConfigError::Invalid {
            option: "--workers",
            value: workers.to_string(),
            reason: "give a number of threads from 1 to 256".into(),
        });
    }
    // A Kafka input commits every --checkpoint-interval and keeps --keep-open state in
    // its changelog: those options are its own then. A file or stdin input written to
    // Kafka checkpoints as any file run; without --state-dir its transactions still
    // commit every --checkpoint-interval.
    let checkpoint = if kafka_in {
        None
    } else {
        let state_dir = args.state_dir.or(file.state_dir);
        let interval = args.checkpoint_interval.or(file.checkpoint_interval);
        let interval = interval.filter(|_| !(kafka_out && state_dir.is_none()));
        checkpoint_config(
            state_dir,
            interval,
            args.checkpoint_every_records
                .or(file.checkpoint_every_records),
            args.keep_open || file.keep_open.unwrap_or(false),
            &inputs,
        )?
    };
    if commit_every.is_some() && checkpoint.is_none() && !kafka_in {
        return Err(ConfigError::Conflict(
            "--delta-commit-interval needs --state-dir: without checkpoints a run commits to the table once, at its end".into(),
        ));
    }
    let state_memory = args.state_memory.or(file.state_memory);
    let state_backend = match args.state_backend.or(file.state_backend) {
        None | Some(StateBackendArg::Memory) => {
            if let Some(m) = state_memory {
                return Err(ConfigError::Invalid {
                    option: "--state-memory",
                    value: m,
                    reason: "it bounds the rocksdb backend only (the memory backend keeps every key in memory); add --state-backend rocksdb, or leave --state-memory out".into(),
                });
            }
            StateBackend::Memory
        }
        Some(StateBackendArg::Rocksdb) => {
            let value = state_memory.unwrap_or_else(|| "1GB".into());
            let memory_bytes = size("--state-memory", &value)?;
            if memory_bytes == 0 {
                return Err(ConfigError::Invalid {
                    option: "--state-memory",
                    value,
                    reason: "give the memory the state may take, such as 512MB".into(),
                });
            }
            StateBackend::RocksDb {
                memory_bytes,
                dir: None,
            }
        }
    };
    let max_record = match args.max_record_size.or(file.max_record_size) {
        None => sessionizer_connectors::input::DEFAULT_MAX_RECORD,
        Some(value) => {
            let bytes = size("--max-record-size", &value)?;
            let limit = sessionizer_connectors::input::MAX_RECORD_LIMIT as u64;
            if bytes == 0 || bytes > limit {
                return Err(ConfigError::Invalid {
                    option: "--max-record-size",
                    value,
                    reason: "give a size from 1B to 1GB, such as 16MB".into(),
                });
            }
            bytes as usize
        }
    };
    let pipeline = PipelineConfig {
        inputs: inputs
            .iter()
            .map(|s| InputSource::parse(s))
            .chain(delta_inputs.into_iter().map(InputSource::Delta))
            .collect(),
        output,
        output_format,
        dead_letter,
        late_output,
        key,
        time,
        time_format,
        gap,
        gap_field,
        watermark_delay,
        allowed_lateness,
        valid_range,
        aggregates,
        dedup,
        emit,
        on_invalid,
        workers,
        idle_timeout,
        kafka,
        state_backend,
        max_record,
    };
    Ok(RunConfig {
        pipeline,
        checkpoint,
        stats_file,
        progress: args.progress.or(file.progress).unwrap_or(ProgressArg::Auto),
        http_addr,
    })
}

/// Which output a path is, for naming it in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputRole {
    Output,
    DeadLetter,
    Late,
}

impl OutputRole {
    fn option(self) -> &'static str {
        match self {
            OutputRole::Output => "--output",
            OutputRole::DeadLetter => "--dead-letter",
            OutputRole::Late => "--late-output",
        }
    }

    /// How the output is named in a message: its option, or — for a side output placed
    /// next to `--output` by default — where it came from and how to move it.
    fn describe(self, target: &OutputTarget, explicit: bool) -> String {
        let name = target.display_name();
        match self {
            OutputRole::Output => format!("--output {name}"),
            _ if explicit => format!("{} {name}", self.option()),
            OutputRole::DeadLetter => format!(
                "the dead-letter output {name} (placed next to --output; set --dead-letter to move it)"
            ),
            OutputRole::Late => format!(
                "the late output {name} (placed next to --output; set --late-output to move it)"
            ),
        }
    }
}

/// Refuses a run whose outputs (the session, dead-letter and late outputs, the stats
/// file) name one of its inputs (the input files, the file stdin reads, the config file)
/// or each other — by file identity, so that no spelling (`./s.jsonl`, an absolute path,
/// a symlink, a hard link) gets a file truncated before the run has read it. Devices
/// such as `/dev/null` may be shared. Nothing is created or opened for writing here.
fn check_distinct_files(
    inputs: &[String],
    config_file: Option<&Path>,
    outputs: &[(OutputRole, &OutputTarget, bool)],
    stats_file: Option<&Path>,
) -> Result<(), ConfigError> {
    use crate::paths::{FileId, identify, of_stdio};
    // An identity that cannot be read (no permission) is left to opening the file,
    // which reports it.
    let id = |p: &Path| identify(p).ok().filter(|id| *id != FileId::Special);

    let mut read: Vec<(FileId, String)> = Vec::new();
    for i in inputs {
        if i == "-" {
            if let Some(id) = of_stdio(std::io::stdin()).filter(|id| *id != FileId::Special) {
                read.push((id, "the file stdin reads (--input -)".into()));
            }
        } else if let Some(id) = id(Path::new(i)) {
            read.push((id, format!("--input {i}")));
        }
    }
    if let Some(c) = config_file
        && let Some(id) = id(c)
    {
        read.push((id, format!("--config {}", c.display())));
    }

    let mut written: Vec<(FileId, String)> = Vec::new();
    for &(role, target, explicit) in outputs {
        let id = match target {
            OutputTarget::File(p) => id(p),
            OutputTarget::Stdout => of_stdio(std::io::stdout()),
            OutputTarget::Stderr => of_stdio(std::io::stderr()),
        };
        let Some(id) = id.filter(|id| *id != FileId::Special) else {
            continue;
        };
        // stdout and stderr may share a file (`> out 2>&1`); only an input is out of
        // bounds for them.
        let name = match target {
            OutputTarget::File(_) => role.describe(target, explicit),
            OutputTarget::Stdout => format!("stdout ({} -), redirected to a file,", role.option()),
            OutputTarget::Stderr => format!(
                "stderr (where {} go when the output is stdout), redirected to a file,",
                if role == OutputRole::Late {
                    "late events"
                } else {
                    "invalid records"
                }
            ),
        };
        if let Some((_, input)) = read.iter().find(|(r, _)| *r == id) {
            return Err(same_file_as_input(&name, input));
        }
        if matches!(target, OutputTarget::File(_)) {
            if let Some((_, other)) = written.iter().find(|(w, _)| *w == id) {
                return Err(same_output(&name, other));
            }
            written.push((id, name));
        }
    }
    if let Some(p) = stats_file
        && let Some(id) = id(p)
    {
        let name = format!("--stats-file {}", p.display());
        if let Some((_, input)) = read.iter().find(|(r, _)| *r == id) {
            return Err(same_file_as_input(&name, input));
        }
        if let Some((_, other)) = written.iter().find(|(w, _)| *w == id) {
            return Err(same_output(&name, other));
        }
    }
    Ok(())
}

fn same_file_as_input(output: &str, input: &str) -> ConfigError {
    ConfigError::Conflict(format!(
        "{output} is the same file as {input}: writing it would destroy the input; give the output another path"
    ))
}

fn same_output(output: &str, other: &str) -> ConfigError {
    ConfigError::Conflict(format!(
        "{output} is the same file as {other}: the two would overwrite each other; give each its own path"
    ))
}

/// The environment variable of the write-failure test hook: the n-th checkpoint file
/// write of the run fails as on a full disk. For tests only: read only by a build with
/// the cargo feature `fault-injection`.
#[cfg(feature = "fault-injection")]
pub const FAIL_WRITE_ENV: &str = "SESSIONIZER_TEST_FAIL_CHECKPOINT_WRITE";

/// The write-failure test hook's `N`, if its variable is set.
#[cfg(feature = "fault-injection")]
fn fail_write_at() -> Result<Option<u64>, ConfigError> {
    match std::env::var(FAIL_WRITE_ENV) {
        Ok(v) => Ok(Some(v.parse::<u64>().map_err(|e| {
            ConfigError::Invalid {
                option: FAIL_WRITE_ENV,
                value: v.clone(),
                reason: e.to_string(),
            }
        })?)),
        Err(_) => Ok(None),
    }
}

/// Without the feature `fault-injection` no write is made to fail.
#[cfg(not(feature = "fault-injection"))]
fn fail_write_at() -> Result<Option<u64>, ConfigError> {
    Ok(None)
}

/// A Delta table's location must be a local directory or an S3 location, and
/// `--delta-table` takes the place of the options in `replaced` (name, given).
fn check_delta_table(table: &str, replaced: &[(&str, bool)]) -> Result<(), ConfigError> {
    check_table_location("--delta-table", table)?;
    if let Some((name, _)) = replaced.iter().find(|(_, given)| *given) {
        return Err(ConfigError::Conflict(format!(
            "--delta-table cannot be combined with {name}: the sessions go to the table (dead letters and late events stay JSON lines, --dead-letter and --late-output)"
        )));
    }
    Ok(())
}

/// A Delta table's location (of `option`) is a local directory or `s3://bucket/path`.
fn check_table_location(option: &'static str, table: &str) -> Result<(), ConfigError> {
    if let Some((scheme, rest)) = table.split_once("://") {
        let s3 = scheme.eq_ignore_ascii_case("s3") || scheme.eq_ignore_ascii_case("s3a");
        let reason = match rest.split('/').next() {
            _ if !s3 => format!(
                "{scheme}:// locations are not supported; give a local directory or s3://bucket/path"
            ),
            None | Some("") => "name the bucket: s3://bucket/path".to_string(),
            Some(_) => String::new(),
        };
        if !reason.is_empty() {
            return Err(ConfigError::Invalid {
                option,
                value: table.to_string(),
                reason,
            });
        }
    }
    if table.is_empty() || table == "-" {
        return Err(ConfigError::Invalid {
            option,
            value: table.to_string(),
            reason: "give the table's directory".into(),
        });
    }
    Ok(())
}

fn checkpoint_config(
    state_dir: Option<PathBuf>,
    interval: Option<String>,
    every_records: Option<u64>,
    keep_open: bool,
    inputs: &[String],
) -> Result<Option<CheckpointConfig>, ConfigError> {
    let Some(state_dir) = state_dir else {
        let stray = [
            ("--checkpoint-interval", interval.is_some()),
            ("--checkpoint-every-records", every_records.is_some()),
            ("--keep-open", keep_open),
        ];
        if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(ConfigError::Conflict(format!(
                "{name} needs --state-dir: checkpoints are kept there"
            )));
        }
        return Ok(None);
    };
    if inputs.iter().any(|i| i == "-") {
        return Err(ConfigError::Conflict(
            "--state-dir needs input files: a run over stdin cannot be resumed from a checkpoint (stdin cannot be read again from a position)".into(),
        ));
    }
    let interval_ms = duration("--checkpoint-interval", interval, "10s")?;
    if every_records == Some(0) {
        return Err(ConfigError::Invalid {
            option: "--checkpoint-every-records",
            value: "0".into(),
            reason: "give a number of records above 0".into(),
        });
    }
    let fail_write_at = fail_write_at()?;
    Ok(Some(CheckpointConfig {
        state_dir,
        interval: std::time::Duration::from_millis(interval_ms.millis().max(0) as u64),
        every_records,
        keep_open,
        fail_write_at,
    }))
}

fn last_segment(path: &str) -> String {
    path.rsplit('.').next().unwrap_or(path).to_string()
}
