//! Raw command-line arguments. Doc comments here are the `--help` text.
//!
//! Run options are all optional at this stage: a missing flag may come from the
//! `--config` file, and defaults are applied in [`crate::config`].

use crate::generate::GenerateArgs;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Turns event streams into sessions: per key, runs of activity closed by a gap of
/// inactivity, in event time, with watermarks, allowed lateness and merging.
#[derive(Debug, Parser)]
#[command(name = "sessionizer", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sessionize JSON-lines events from files or stdin into JSON-lines sessions.
    Run(Box<RunArgs>),
    /// Write generated visit events (JSON lines) to stdout or a file.
    Generate(GenerateArgs),
    /// Show the checkpoints of a state directory: positions, watermark, counts, and on
    /// request the sessions in progress (--keys, --key K).
    Inspect(InspectArgs),
}

/// Options of `sessionizer inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The state directory of a job (`run --state-dir`).
    #[arg(long, value_name = "DIR", required_unless_present = "kafka_group")]
    pub state_dir: Option<PathBuf>,

    /// A Kafka job instead: its bootstrap servers (needs --kafka-group and
    /// --kafka-topic; the tasks are read from the job's changelog topic).
    #[arg(
        long,
        value_name = "HOSTS",
        requires = "kafka_group",
        conflicts_with = "state_dir"
    )]
    pub kafka_brokers: Option<String>,

    /// The Kafka job's group (`run --kafka-group`).
    #[arg(long, value_name = "GROUP", requires_all = ["kafka_brokers", "kafka_topic"])]
    pub kafka_group: Option<String>,

    /// The Kafka job's input topic (`run --kafka-topic`; for a --repartition job, the
    /// internal topic <GROUP>-repartition).
    #[arg(long, value_name = "TOPIC")]
    pub kafka_topic: Option<String>,

    /// Extra librdkafka client property KEY=VALUE (repeat), e.g. security settings;
    /// also taken from SESSIONIZER_KAFKA_* environment variables
    /// (SESSIONIZER_KAFKA_SASL_PASSWORD is sasl.password), the flag winning per key.
    #[arg(long, value_name = "KEY=VALUE", requires = "kafka_group")]
    pub kafka_config: Vec<String>,

    /// Only this partition of the Kafka job. [default: every partition]
    #[arg(long, value_name = "P", requires = "kafka_group")]
    pub partition: Option<i32>,

    /// Also show this key's sessions.
    #[arg(long, value_name = "K", conflicts_with = "keys")]
    pub key: Option<String>,

    /// Also list every key with its sessions (by default only their number is shown).
    #[arg(long)]
    pub keys: bool,

    /// Print one JSON object instead of text (with "sessions" only with --keys or --key).
    #[arg(long)]
    pub json: bool,
}

/// Options of `sessionizer run`.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// Input file, or '-' for stdin. Repeat to read several files in order.
    /// [default: -]
    #[arg(long, value_name = "PATH")]
    pub input: Vec<String>,

    /// Read the rows of the Delta Lake table at PATH (a directory or
    /// s3://bucket/path) as the input, each row a JSON object, in the order the table's
    /// commits added them. With --state-dir a later run reads only the rows committed
    /// since (with --keep-open the open sessions wait for them). The table must be
    /// append-only. Repeat to read several tables in order; not with --input or a
    /// Kafka input. Needs a build with the cargo feature `delta`.
    #[arg(long, value_name = "PATH")]
    pub delta_input: Vec<String>,

    /// Session output file, or '-' for stdout; with --output-format parquet, a
    /// directory. [default: -]
    #[arg(long, value_name = "PATH")]
    pub output: Option<String>,

    /// How session records are written to --output: jsonl, one JSON object per line;
    /// parquet, Parquet files in the --output directory, one session per row with typed
    /// columns, visible once their checkpoint commits (with --state-dir; else at the end
    /// of the run). Dead letters and late events stay JSON lines. Needs a build with
    /// the cargo feature `parquet`. [default: jsonl]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output_format: Option<OutputFormatArg>,

    /// With --output-format parquet: write the files into dt=YYYY-MM-DD/ directories by
    /// the session's start date (UTC), as Hive, Spark and pyarrow read them.
    #[arg(long)]
    pub partition_by_date: bool,

    /// Append the sessions to the Delta Lake table in directory PATH, or at
    /// s3://bucket/path (created with the session columns if it has no table yet)
    /// instead of writing --output: with --state-dir exactly once, one table commit per
    /// checkpoint (see --delta-commit-interval); with a Kafka input --kafka-group
    /// instead: each partition commits its own epochs after the group's transactions;
    /// without either (stdin, say) the run commits its rows once, at its end (a run
    /// killed or stopped before adds none, a rerun adds its rows again). The emit mode defaults to final (plain inserts); on-close and
    /// on-update are refused. Dead letters and late events stay JSON lines (on stderr
    /// for a table on S3 or a Kafka input, unless named). S3 settings come from
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ENDPOINT_URL. Needs
    /// a build with the cargo feature `delta`.
    #[arg(long, value_name = "PATH")]
    pub delta_table: Option<String>,

    /// Commit to the --delta-table at most this often (e.g. 1m) instead of at every
    /// checkpoint: the checkpoints in between record the data files written, which the
    /// next commit adds, and the run's last checkpoint always commits. Fewer, larger
    /// table versions; rows become visible later. Needs --state-dir (or a Kafka input).
    /// [default: every checkpoint]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub delta_commit_interval: Option<String>,

    /// Field holding the session key; a dotted path reaches into nested objects.
    /// [default: visit_id]
    #[arg(long, value_name = "FIELD")]
    pub key: Option<String>,

    /// Field holding the event time. [default: event_time]
    #[arg(long, value_name = "FIELD")]
    pub time: Option<String>,

    /// How the time field is written. [default: rfc3339]
    #[arg(long, value_enum)]
    pub time_format: Option<TimeFormatArg>,

    /// Inactivity that closes a session, e.g. 30m, 1h30m, 250ms. [default: 30m]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub gap: Option<String>,

    /// Field that may carry an event's own gap (a duration string or integer
    /// milliseconds); events without it use --gap.
    #[arg(long, value_name = "FIELD")]
    pub gap_field: Option<String>,

    /// How far the watermark trails the largest event time seen. [default: 1m]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub watermark_delay: Option<String>,

    /// How long a complete session still accepts late events (re-emitted with the next
    /// revision). [default: 0s]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub allowed_lateness: Option<String>,

    /// Event times outside START..END are invalid (START inclusive, END exclusive;
    /// RFC 3339 times or dates). [default: 1970-01-01..2200-01-01]
    #[arg(long, value_name = "START..END")]
    pub valid_time_range: Option<String>,

    /// Output the field's values in event-time order (ties in input order). Every
    /// aggregate is named after the field's last path segment; NAME=FIELD names it
    /// (e.g. --sum total=amount --min min_amount=amount).
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub collect: Vec<String>,

    /// Output the first non-null value of the field (in event time).
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub first: Vec<String>,

    /// Output the last non-null value of the field (in event time).
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub last: Vec<String>,

    /// Output the number of distinct non-null values of the field.
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub count_distinct: Vec<String>,

    /// Output the sum of the field's numeric values (an integer while every value is
    /// one; a sum beyond the float range is the string "Infinity" or "-Infinity").
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub sum: Vec<String>,

    /// Output the smallest numeric value of the field.
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub min: Vec<String>,

    /// Output the largest numeric value of the field.
    #[arg(long, value_name = "[NAME=]FIELD")]
    pub max: Vec<String>,

    /// Drop an event identical (byte for byte) to one already in the session it joins.
    #[arg(long, conflicts_with = "dedup_field")]
    pub dedup: bool,

    /// Drop an event whose FIELD value equals that of an event already in the session
    /// it joins.
    #[arg(long, value_name = "FIELD")]
    pub dedup_field: Option<String>,

    /// on-close: emit complete sessions (again, with the next revision, when a late
    /// event changes one within --allowed-lateness); on-update: also emit open sessions
    /// each time they change (records then carry "complete"); final: emit each session
    /// once, when it can no longer change (the watermark passed its close plus
    /// --allowed-lateness): no revisions, no retractions, no "revision" field — plain
    /// inserts for a table. [default: on-close; final with --delta-table, which takes
    /// no other]
    #[arg(long, value_enum)]
    pub emit: Option<EmitArg>,

    /// What to do with invalid records. [default: dead-letter]
    #[arg(long, value_enum)]
    pub on_invalid: Option<OnInvalidArg>,

    /// The largest record, e.g. 16MB or 512KB (MB = 2^20 bytes), at most 1GB: a longer
    /// line (or Kafka message) is invalid. It is skipped as it is read, never held
    /// whole, and its dead letter gives its position, its length and its first 1,024
    /// bytes. [default: 16MB]
    #[arg(long, value_name = "SIZE")]
    pub max_record_size: Option<String>,

    /// Where invalid records go. [default: <output>.dead-letter.jsonl next to the
    /// output file, or stderr when the output is stdout]
    #[arg(long, value_name = "PATH")]
    pub dead_letter: Option<String>,

    /// Where too-late events go. [default: <output>.late.jsonl next to the output file,
    /// or stderr when the output is stdout]
    #[arg(long, value_name = "PATH")]
    pub late_output: Option<String>,

    /// With stdin input: once no input has come for this long, the watermark moves on
    /// with the wall clock, so quiet keys still see their sessions close (a live tail).
    /// Off unless given; 0s is refused.
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub idle_timeout: Option<String>,

    /// Worker threads; keys are shared among them by hash, decoding is parallel too
    /// (with a Kafka input, the partitions' tasks are shared among them). The output is
    /// byte-identical for every N. [default: 1]
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Keep the job's state in DIR and checkpoint it, so that a killed run resumes
    /// where it stopped with file outputs exactly once (stdout: at least once).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Where the keyed state lives: memory (every key in the heap), or rocksdb (keys
    /// beyond --state-memory on local disk, in <state-dir>/spill or a temporary
    /// directory; needs a build with `--features rocksdb`; with Kafka inputs, one store
    /// per task). Same output byte for byte, same checkpoints. [default: memory]
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub state_backend: Option<StateBackendArg>,

    /// With --state-backend rocksdb: the memory the state may take, e.g. 512MB or 2GB
    /// (MB = 2^20 bytes): half for the keys kept in memory, half for RocksDB's block
    /// cache and write buffers, shared by the workers. The process needs some more
    /// for input and output buffers, and RocksDB's index and filter blocks (about 1.3
    /// bytes per key on disk). [default: 1GB]
    #[arg(long, value_name = "SIZE")]
    pub state_memory: Option<String>,

    /// Time between checkpoints (checked between batches of about 4 MiB of input).
    /// [default: 10s]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub checkpoint_interval: Option<String>,

    /// Also checkpoint after every N records read.
    #[arg(long, value_name = "N")]
    pub checkpoint_every_records: Option<u64>,

    /// At the end of the input keep the sessions in progress in the state directory
    /// instead of emitting them: a later run with the same --state-dir and the next
    /// input continues them.
    #[arg(long)]
    pub keep_open: bool,

    /// Also write the run's summary as one JSON object to this file (also when stdout
    /// is closed early; checked before the run starts).
    #[arg(long, value_name = "PATH")]
    pub stats_file: Option<PathBuf>,

    /// Read options from a TOML file; flags given on the command line win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Progress line on stderr: auto (only when stderr is a terminal) or never.
    /// [default: auto]
    #[arg(long, value_enum)]
    pub progress: Option<ProgressArg>,

    /// Serve Prometheus metrics (/metrics), the sessions in progress of a key
    /// (/sessions?key=K) and health checks (/health, /health/ready) over HTTP on ADDR:
    /// HOST:PORT, or PORT / :PORT for 127.0.0.1:PORT. Port 0 picks a free one; the
    /// address is printed on stderr.
    #[arg(long, value_name = "ADDR")]
    pub http_addr: Option<String>,

    #[command(flatten)]
    pub kafka: crate::kafka::KafkaArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeFormatArg {
    Rfc3339,
    EpochMs,
    EpochS,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputFormatArg {
    Jsonl,
    Parquet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmitArg {
    OnClose,
    OnUpdate,
    Final,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnInvalidArg {
    DeadLetter,
    Skip,
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateBackendArg {
    Memory,
    Rocksdb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgressArg {
    Auto,
    Never,
}
