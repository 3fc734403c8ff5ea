//! The `--kafka-*` options of `sessionizer run` (docs/semantics.md K-1 to K-7): raw
//! flags, their config-file names, and their check into a [`KafkaConfig`].

use crate::config::ConfigError;
use clap::{Args, ValueEnum};
use serde::Deserialize;
use sessionizer::config::{KafkaConfig, KafkaStart, Partitioner};
use sessionizer_core::timefmt::parse_duration;
use std::time::Duration;

/// Kafka options of `sessionizer run`. They need a binary built with
/// `--features kafka`; without it they are refused with that advice.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Kafka (build with --features kafka)")]
pub struct KafkaArgs {
    /// Kafka bootstrap servers, e.g. 127.0.0.1:9092.
    #[arg(long, value_name = "HOSTS")]
    pub kafka_brokers: Option<String>,

    /// Input topic (repeat for several). Its records' values are the events; each
    /// partition is a task with its own watermark and state. Replaces --input.
    #[arg(long, value_name = "TOPIC")]
    pub kafka_topic: Vec<String>,

    /// Consumer group, and the job's name in Kafka: its changelog topics are
    /// <GROUP>-<topic>-changelog and its transactional ids start with <GROUP>-.
    #[arg(long, value_name = "GROUP")]
    pub kafka_group: Option<String>,

    /// Where a partition the group never committed starts. [default: earliest]
    #[arg(long, value_enum, value_name = "WHERE")]
    pub kafka_start: Option<KafkaStartArg>,

    /// Read each partition up to the end offset it had when the run started, then end
    /// as at the end of a file (every session emitted unless --keep-open) and exit.
    #[arg(long)]
    pub stop_at_end: bool,

    /// Topic for the session records (key: session_id; value: the JSON record;
    /// retractions are tombstones with header retract=true). Exactly once with a Kafka
    /// input, or with file input and --state-dir. Replaces --output.
    #[arg(long, value_name = "TOPIC")]
    pub kafka_output_topic: Option<String>,

    /// Topic for invalid records (instead of --dead-letter).
    #[arg(long, value_name = "TOPIC")]
    pub dead_letter_topic: Option<String>,

    /// Topic for too-late events (instead of --late-output).
    #[arg(long, value_name = "TOPIC")]
    pub late_topic: Option<String>,

    /// This process's stable name in the group: its transactional id is
    /// <GROUP>-<ID> (sessionizer-file-<ID> for a file or stdin input), so a restarted
    /// process fences its predecessor at once. Give each process of a group its own.
    /// [default: kept in --state-dir, else random per process]
    #[arg(long, value_name = "ID")]
    pub kafka_instance_id: Option<String>,

    /// How long the broker keeps a vanished process's transaction open before aborting
    /// it (a restart without --kafka-instance-id waits that long for its partitions).
    /// [default: 10s]
    #[arg(long, value_name = "DUR")]
    pub kafka_transaction_timeout: Option<String>,

    /// How long a call to the cluster (metadata, commit, restore) may take before it
    /// fails (at the start, the run then fails; later, see --kafka-outage-limit).
    /// [default: 30s]
    #[arg(long, value_name = "DUR")]
    pub kafka_timeout: Option<String>,

    /// How long a running job with a Kafka input, or a file input with --state-dir and a
    /// Kafka output, waits for a cluster that does not answer (a broker restarting, a
    /// leader or coordinator moving) before it stops with an error: meanwhile it
    /// retries, aborts its open transaction and goes back to its last commit (or
    /// checkpoint). [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub kafka_outage_limit: Option<String>,

    /// Extra librdkafka client property KEY=VALUE (repeat), e.g. security settings.
    #[arg(long, value_name = "KEY=VALUE")]
    pub kafka_config: Vec<String>,

    /// Keep a warm copy of each task of the other processes of the group on N of them
    /// (by following their changelogs), so that a partition whose owner dies resumes
    /// without a full restore. [default: 0]
    #[arg(long, value_name = "N")]
    pub standby_replicas: Option<usize>,

    /// The input topic is not partitioned by the session key: re-key its records
    /// through the internal topic <GROUP>-repartition (created by the job, with as many
    /// partitions as the first input topic) and sessionize from there, exactly once
    /// across both hops. The tasks' watermark follows the slowest input partition (a
    /// quiet one holds it back; --idle-timeout lets it go).
    #[arg(long)]
    pub repartition: bool,

    /// How the input topics are keyed. standard: by the session key with a standard
    /// partitioner (the Java client's murmur2, librdkafka's CRC-32 consistent_random,
    /// or their variants); every record is checked and one in a partition no standard
    /// partitioner gives its key stops the job, naming --repartition. custom: by the
    /// session key with a partitioner of the producer's own, every key in one
    /// partition; not checked. [default: standard]
    #[arg(long, value_enum, value_name = "HOW")]
    pub kafka_partitioner: Option<PartitionerArg>,

    /// With --state-dir and a Kafka job: how often each task's state is snapshotted to
    /// the directory (after a commit), so that a restart reads only the changelog's
    /// tail. [default: 30s]
    #[arg(long, value_name = "DUR")]
    pub snapshot_interval: Option<String>,
}

/// `--kafka-partitioner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionerArg {
    /// A standard partitioner over the session key: checked.
    Standard,
    /// The producer's own partitioner, every key in one partition: trusted.
    Custom,
}

/// `--kafka-start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KafkaStartArg {
    /// The first record still in the partition.
    Earliest,
    /// Only records produced from now on.
    Latest,
}

/// The same options in the TOML config file (kebab-case names, as the flags).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct KafkaFile {
    pub kafka_brokers: Option<String>,
    pub kafka_topic: Option<Vec<String>>,
    pub kafka_group: Option<String>,
    pub kafka_start: Option<KafkaStartArg>,
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
    pub kafka_partitioner: Option<PartitionerArg>,
}

/// What the rest of the configuration needs to know to check the Kafka options.
#[derive(Debug, Clone)]
pub struct Context {
    /// `--input` was given (on the command line or in the file).
    pub inputs_given: bool,
    /// `--output` was given.
    pub output_given: bool,
    /// `--dead-letter` was given.
    pub dead_letter_given: bool,
    /// `--late-output` was given.
    pub late_output_given: bool,
    /// `--state-dir`.
    pub state_dir: Option<std::path::PathBuf>,
    /// `--keep-open`.
    pub keep_open: bool,
    /// `--checkpoint-interval`, or the default.
    pub interval: Duration,
}

/// Flags over the file; `None` when no Kafka option is used.
pub fn resolve(
    args: KafkaArgs,
    file: KafkaFile,
    ctx: Context,
) -> Result<Option<KafkaConfig>, ConfigError> {
    let topics = if args.kafka_topic.is_empty() {
        file.kafka_topic.unwrap_or_default()
    } else {
        args.kafka_topic
    };
    let group = args.kafka_group.or(file.kafka_group);
    let output_topic = args.kafka_output_topic.or(file.kafka_output_topic);
    let dead_letter_topic = args.dead_letter_topic.or(file.dead_letter_topic);
    let late_topic = args.late_topic.or(file.late_topic);
    let stop_at_end = args.stop_at_end || file.stop_at_end.unwrap_or(false);
    let start = args.kafka_start.or(file.kafka_start);
    let instance_id = args.kafka_instance_id.or(file.kafka_instance_id);
    let txn_timeout = args
        .kafka_transaction_timeout
        .or(file.kafka_transaction_timeout);
    let timeout = args.kafka_timeout.or(file.kafka_timeout);
    let outage_limit = args.kafka_outage_limit.or(file.kafka_outage_limit);
    let standby_replicas = args.standby_replicas.or(file.standby_replicas);
    let snapshot_interval = args.snapshot_interval.or(file.snapshot_interval);
    let repartition = args.repartition || file.repartition.unwrap_or(false);
    let partitioner = args.kafka_partitioner.or(file.kafka_partitioner);
    let file_config = file.kafka_config.unwrap_or_default();
    let config_given = !file_config.is_empty() || !args.kafka_config.is_empty();
    let properties = client_properties(&file_config, &args.kafka_config)?;
    let brokers = args.kafka_brokers.or(file.kafka_brokers);
    let used = [
        ("--kafka-topic", !topics.is_empty()),
        ("--kafka-group", group.is_some()),
        ("--kafka-output-topic", output_topic.is_some()),
        ("--dead-letter-topic", dead_letter_topic.is_some()),
        ("--late-topic", late_topic.is_some()),
        ("--stop-at-end", stop_at_end),
        ("--kafka-start", start.is_some()),
        ("--kafka-instance-id", instance_id.is_some()),
        ("--kafka-transaction-timeout", txn_timeout.is_some()),
        ("--kafka-timeout", timeout.is_some()),
        ("--kafka-outage-limit", outage_limit.is_some()),
        ("--standby-replicas", standby_replicas.is_some()),
        ("--snapshot-interval", snapshot_interval.is_some()),
        ("--kafka-config", config_given),
        ("--kafka-partitioner", partitioner.is_some()),
    ];
    let Some(brokers) = brokers else {
        if let Some((name, _)) = used.iter().find(|(_, on)| *on) {
            return Err(ConfigError::Conflict(format!(
                "{name} needs --kafka-brokers (the bootstrap servers, e.g. 127.0.0.1:9092)"
            )));
        }
        return Ok(None);
    };
    let conflict = |m: &str| Err(ConfigError::Conflict(m.to_string()));
    if topics.is_empty() && output_topic.is_none() {
        return conflict(
            "--kafka-brokers needs --kafka-topic (a Kafka input) or --kafka-output-topic (a Kafka output)",
        );
    }
    if topics.is_empty() && ctx.state_dir.is_none() && outage_limit.is_some() {
        return conflict(
            "--kafka-outage-limit needs --kafka-topic, or --state-dir with --kafka-output-topic: it bounds how long a job waits for its cluster, and a file input can wait only when it can go back to a checkpoint",
        );
    }
    if !topics.is_empty() && ctx.inputs_given {
        return conflict("give either --input or --kafka-topic, not both");
    }
    if output_topic.is_some() && ctx.output_given {
        return conflict("give either --output or --kafka-output-topic, not both");
    }
    if dead_letter_topic.is_some() && ctx.dead_letter_given {
        return conflict("give either --dead-letter or --dead-letter-topic, not both");
    }
    if late_topic.is_some() && ctx.late_output_given {
        return conflict("give either --late-output or --late-topic, not both");
    }
    if topics.is_empty() {
        // Files or stdin in, Kafka out: the file driver with a Kafka sink. Its state
        // and checkpoints are those of a file run (--state-dir, --checkpoint-interval).
        for (name, on) in [
            ("--stop-at-end", stop_at_end),
            ("--kafka-start", start.is_some()),
            ("--kafka-group", group.is_some()),
            ("--standby-replicas", standby_replicas.is_some()),
            ("--snapshot-interval", snapshot_interval.is_some()),
            ("--repartition", repartition),
            ("--kafka-partitioner", partitioner.is_some()),
        ] {
            if on {
                return Err(ConfigError::Conflict(format!(
                    "{name} applies to a Kafka input; give --kafka-topic (a file or stdin run with --kafka-output-topic is named by --kafka-instance-id and checkpoints to --state-dir)"
                )));
            }
        }
    }
    if ctx.state_dir.is_some() && output_topic.is_none() {
        return conflict(
            "--state-dir with a Kafka input needs --kafka-output-topic (the state lives in the job's changelog topics, the directory keeps local snapshots of it); a Kafka input written to files keeps its state in memory only",
        );
    }
    if output_topic.is_none() {
        for (name, on) in [
            ("--standby-replicas", standby_replicas.is_some()),
            ("--snapshot-interval", snapshot_interval.is_some()),
            ("--repartition", repartition),
        ] {
            if on {
                return Err(ConfigError::Conflict(format!(
                    "{name} needs --kafka-output-topic: it works on the job's changelog topics"
                )));
            }
        }
    }
    if snapshot_interval.is_some() && ctx.state_dir.is_none() {
        return conflict("--snapshot-interval needs --state-dir: the snapshots are kept there");
    }
    if output_topic.is_some() && group.is_none() && !topics.is_empty() {
        return conflict(
            "--kafka-output-topic with a Kafka input needs --kafka-group: the group names the job (its changelog topics, its committed offsets)",
        );
    }
    if output_topic.is_none() && ctx.keep_open {
        return conflict(
            "--keep-open with a Kafka input needs --kafka-output-topic: the sessions in progress are kept in the job's changelog",
        );
    }
    let transaction_timeout = at_least_1s("--kafka-transaction-timeout", txn_timeout, 10)?;
    let timeout = at_least_1s("--kafka-timeout", timeout, 30)?;
    let outage_limit = at_least_1s("--kafka-outage-limit", outage_limit, 300)?;
    let snapshot_interval = match snapshot_interval {
        Some(v) => {
            let d = parse_duration(&v).map_err(|e| ConfigError::Invalid {
                option: "--snapshot-interval",
                value: v.clone(),
                reason: e.to_string(),
            })?;
            Duration::from_millis(d.millis().max(0) as u64)
        }
        None => Duration::from_secs(30),
    };
    Ok(Some(KafkaConfig {
        brokers,
        properties: properties.into(),
        timeout,
        topics,
        group,
        start: match start {
            Some(KafkaStartArg::Latest) => KafkaStart::Latest,
            _ => KafkaStart::Earliest,
        },
        stop_at_end,
        output_topic,
        dead_letter_topic,
        late_topic,
        instance_id,
        transaction_timeout,
        commit_interval: ctx.interval,
        keep_open: ctx.keep_open,
        state_dir: ctx.state_dir,
        snapshot_interval,
        standby_replicas: standby_replicas.unwrap_or(0),
        repartition,
        partitioner: match partitioner {
            Some(PartitionerArg::Custom) => Partitioner::Custom,
            _ => Partitioner::Standard,
        },
        outage_limit,
    }))
}

/// The client properties of every Kafka client: the config file's `kafka-config`, then
/// the environment's (`SESSIONIZER_KAFKA_SASL_PASSWORD=...` is `sasl.password`), then
/// the `--kafka-config` flags, a later one winning per key — so a secret kept in the
/// file or the environment stays when other flags are given, and never needs to be on
/// the command line (where `ps` shows it).
pub fn client_properties(
    file: &[String],
    flags: &[String],
) -> Result<Vec<(String, String)>, ConfigError> {
    use sessionizer_connectors::secrets;
    let file = parse_properties(file)?;
    let flags = parse_properties(flags)?;
    let env = secrets::env_properties();
    let merged = secrets::merge(&[&file, &env, &flags]);
    secrets::register(&merged);
    Ok(merged)
}

/// `KEY=VALUE` pairs of `--kafka-config`.
fn parse_properties(list: &[String]) -> Result<Vec<(String, String)>, ConfigError> {
    list.iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
            None => Err(ConfigError::Invalid {
                option: "--kafka-config",
                value: sessionizer_connectors::secrets::redact(p).into_owned(),
                reason: "expected KEY=VALUE, e.g. security.protocol=SSL".into(),
            }),
        })
        .collect()
}

/// A duration option of at least one second (`default_s` seconds when not given).
fn at_least_1s(
    option: &'static str,
    value: Option<String>,
    default_s: u64,
) -> Result<Duration, ConfigError> {
    let Some(v) = value else {
        return Ok(Duration::from_secs(default_s));
    };
    let d = parse_duration(&v).map_err(|e| ConfigError::Invalid {
        option,
        value: v.clone(),
        reason: e.to_string(),
    })?;
    if d.millis() < 1000 {
        return Err(ConfigError::Invalid {
            option,
            value: v,
            reason: "give at least 1s".into(),
        });
    }
    Ok(Duration::from_millis(d.millis() as u64))
}

/// `sessionizer generate --kafka-topic`: the generated lines as records of `topic`,
/// keyed by `visit_id`.
#[cfg(feature = "kafka")]
pub fn generate_into(
    args: &crate::generate::GenerateArgs,
    brokers: &str,
    topic: &str,
) -> anyhow::Result<crate::generate::GenerateReport> {
    use sessionizer_connectors::kafka::{KafkaSettings, admin::Admin, producer::LineProducer};
    let settings =
        KafkaSettings::new(brokers).properties(client_properties(&[], &args.kafka_config)?);
    Admin::new(&settings)?.require(topic, "--kafka-topic")?;
    let mut out = LineWriter {
        producer: LineProducer::new(&settings, topic, "visit_id")?,
        partial: Vec::new(),
    };
    let report = crate::generate::generate(args, &mut out)?;
    std::io::Write::flush(&mut out)?;
    out.producer.flush()?;
    Ok(report)
}

/// `sessionizer generate --kafka-topic` in a build without Kafka.
#[cfg(not(feature = "kafka"))]
pub fn generate_into(
    _: &crate::generate::GenerateArgs,
    _: &str,
    _: &str,
) -> anyhow::Result<crate::generate::GenerateReport> {
    anyhow::bail!(
        "this sessionizer was built without Kafka support; build it with `cargo build --release --features kafka`"
    )
}

/// Cuts the generator's output into lines and sends each as one record.
#[cfg(feature = "kafka")]
struct LineWriter {
    producer: sessionizer_connectors::kafka::producer::LineProducer,
    partial: Vec<u8>,
}

#[cfg(feature = "kafka")]
impl std::io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let line = if self.partial.is_empty() {
                &rest[..i]
            } else {
                self.partial.extend_from_slice(&rest[..i]);
                &self.partial[..]
            };
            self.producer.send(line).map_err(std::io::Error::other)?;
            self.partial.clear();
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.producer.send(&line).map_err(std::io::Error::other)?;
        }
        Ok(())
    }
}
