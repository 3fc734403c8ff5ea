//! The run's accounting (docs/semantics.md S-13): every record read ends up in exactly
//! one of in_sessions, duplicates, late, invalid.

use serde::Serialize;
use sessionizer_checkpoint::Counters;
use std::fmt::Write as _;

/// What the counters of a [`RunStats`] count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// This run: a file or stdin run without a state directory.
    #[default]
    Run,
    /// The job, over every run that continued it (a state directory).
    Job,
    /// This process's share of a Kafka job: what it committed for the partitions it
    /// held. A process that took over partitions can emit sessions whose records
    /// another process read; the job's totals for the partitions are in `kafka.job`.
    Process,
}

/// The summary of a run; also the `--stats-file` JSON object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunStats {
    /// What the counters below count: `run`, `job` or `process` ([`Scope`]).
    pub scope: Scope,
    /// Records read (blank lines are not records and are counted apart).
    pub records_read: u64,
    /// Records applied to a session.
    pub in_sessions: u64,
    /// Records dropped as duplicates (`--dedup`, `--dedup-field`).
    pub duplicates: u64,
    /// Records too late (written to the late output).
    pub late: u64,
    /// Records that are not valid events (written to the dead-letter output).
    pub invalid: u64,
    /// Empty or whitespace-only lines, skipped.
    pub blank_lines: u64,
    /// Session records emitted (every revision counts).
    pub sessions_emitted: u64,
    /// Retraction records emitted.
    pub retractions: u64,
    /// Bytes read from the inputs.
    pub bytes_read: u64,
    /// Wall-clock time of the run.
    pub elapsed_ms: u64,
    /// Peak resident set size of the process (Linux; absent elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// Checkpointing (`--state-dir` only). With a state directory the counters above are
    /// the job's, cumulative over every run that continued it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointStats>,
    /// Set when the run stopped early because the reader of this output closed it
    /// (`stdout` piped into `head`): the counts are those of the input processed until
    /// then, and they still add up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_closed: Option<String>,
    /// A run asked to stop (SIGTERM, SIGINT) that stopped cleanly before its end:
    /// `true`. A Kafka job committed what it processed; a file or stdin run wrote it
    /// out (and checkpointed it with a state directory) without emitting the sessions
    /// in progress.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// The run failed: why. The counts are those of what it did until then (with a
    /// state directory or Kafka, what it committed is what counts; see the docs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A Kafka input's tasks (`--kafka-topic` only). The counters above are then this
    /// process's share of the job: what it committed for the partitions it held, so
    /// that the processes of a group add up to the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaStats>,
    /// The rocksdb state backend's stores (`--state-backend rocksdb` only), over all
    /// shards: what this run moved between memory and disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_store: Option<StateStoreStats>,
}

/// What the spill stores of a run did (`--state-backend rocksdb`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateStoreStats {
    /// Keys evicted from memory to the stores.
    pub evicted: u64,
    /// Keys taken back into memory (an event for them, or a due timer).
    pub unspilled: u64,
    /// The most keys the stores held at once (sampled after every batch).
    pub spilled_keys_max: u64,
    /// The most bytes the stores' files took on disk (sampled after every batch).
    pub disk_bytes_max: u64,
}

/// What a process of a Kafka job held and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KafkaStats {
    /// The partitions (tasks) it held at the end, as `topic/partition`.
    pub partitions: Vec<String>,
    /// The job's accounting for those partitions, cumulative over every process that
    /// held them (from their changelogs).
    pub job: Counters,
    /// The same, partition by partition (`topic/partition` → counters).
    pub job_by_partition: std::collections::BTreeMap<String, Counters>,
    /// Transactions committed.
    pub commits: u64,
    /// Transactions aborted (the tasks were rewound to their last commit and redone).
    pub aborts: u64,
    /// Partitions gained in rebalances (with their state).
    pub assigned: u64,
    /// Partitions given up in rebalances.
    pub revoked: u64,
    /// Changelog records read to restore tasks.
    pub restored_records: u64,
    /// Bytes of changelog records read to restore tasks.
    pub restored_bytes: u64,
    /// Keys with state restored.
    pub restored_keys: u64,
    /// Time spent restoring tasks (milliseconds).
    pub restore_ms: u64,
    /// Every task restore of the run, in order.
    pub restores: Vec<RestoreStats>,
    /// Partitions whose standby copies it kept at the end (`--standby-replicas`).
    pub standby_partitions: Vec<String>,
    /// Changelog records applied to standby copies.
    pub standby_records: u64,
    /// Local task snapshots written (`--state-dir`), and their bytes.
    pub snapshots_written: u64,
    /// Bytes of the local task snapshots written.
    pub snapshot_bytes: u64,
    /// Records handed out again at offsets a task had already processed (a fetch from
    /// before a rewind's seek): skipped, never applied twice. Expected to stay 0.
    pub stale_records_skipped: u64,
    /// Records whose session key cannot belong to the partition they were read from
    /// (the input is not keyed by the session key): the job stopped at the first batch
    /// holding any, committing nothing of it.
    pub records_misplaced: u64,
    /// Times the cluster stopped answering and the process waited for it.
    pub outages: u64,
    /// Time spent waiting for the cluster (milliseconds).
    pub outage_ms: u64,
    /// For each partition this process worked on, the longest time between two
    /// batches of its records processed (or from taking it on to the first),
    /// milliseconds: how long a broker restart or a rebalance held it up — and how
    /// long its input was quiet, which counts too.
    pub longest_stall_ms: std::collections::BTreeMap<String, u64>,
}

/// One task restore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RestoreStats {
    /// The input partition, `topic/partition`.
    pub task: String,
    /// Where the state came from before the changelog's tail was read: `changelog`
    /// (nothing: the whole changelog was read), `snapshot` (a local snapshot in
    /// `--state-dir`) or `standby` (a standby copy).
    pub source: String,
    /// The changelog offset the read started at: its first record for a full restore,
    /// the offset after the copy's last record otherwise.
    pub changelog_from: i64,
    /// The changelog offset the read ended at (its end when the task was taken).
    pub changelog_end: i64,
    /// Changelog records read.
    pub changelog_records: u64,
    /// Keys with state restored.
    pub keys: u64,
    /// Time it took (milliseconds).
    pub ms: u64,
}

/// What checkpointing did in one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckpointStats {
    /// The epoch of the checkpoint this run resumed from, if any.
    pub resumed_from: Option<u64>,
    /// Records read by earlier runs of the job (included in `records_read`).
    pub records_before: u64,
    /// Checkpoints written.
    pub written: u64,
    /// How many of them were full bases (the rest are deltas).
    pub bases: u64,
    /// Bytes written (state files and manifests).
    pub bytes: u64,
    /// The epoch of the last checkpoint written.
    pub last_epoch: Option<u64>,
    /// Bytes of the last checkpoint (state file and manifest).
    pub last_bytes: u64,
    /// Keys written by the last checkpoint (puts and tombstones).
    pub last_keys: u64,
    /// Time spent writing checkpoints — syncing the outputs, writing the state file
    /// and the manifest — in all and the longest one (microseconds). This happens on a
    /// thread of its own while the pipeline goes on.
    pub write_us_total: u64,
    /// The longest single checkpoint write (microseconds).
    pub write_us_max: u64,
    /// Time the pipeline stood still for checkpoints — flushing outputs, encoding the
    /// changed state, waiting for the previous checkpoint's write — in all and the
    /// longest pause (microseconds).
    pub pause_us_total: u64,
    /// The longest single pause (microseconds).
    pub pause_us_max: u64,
    /// Time spent restoring the checkpoint this run resumed from: reading and checking
    /// its files, decoding every key into its shard (microseconds).
    pub restore_us: u64,
    /// Keys restored without being read: the `rocksdb` backend's stores started as the
    /// copies the checkpoint's base kept of them (hard links to their files).
    pub restore_keys_linked: u64,
    /// Bytes of RocksDB store files that bases adopted new (the files they share with
    /// the previous base are neither copied nor counted).
    pub store_bytes_new: u64,
}

impl RunStats {
    /// Adds the counters of earlier runs of the same job (carried in its checkpoint).
    pub fn add_counters(&mut self, c: &Counters) {
        self.records_read += c.records_read;
        self.in_sessions += c.in_sessions;
        self.duplicates += c.duplicates;
        self.late += c.late;
        self.invalid += c.invalid;
        self.blank_lines += c.blank_lines;
        self.sessions_emitted += c.sessions_emitted;
        self.retractions += c.retractions;
        self.bytes_read += c.bytes_read;
    }

    /// Subtracts counters (those a task had when this process took it on).
    pub fn sub_counters(&mut self, c: &Counters) {
        self.records_read -= c.records_read;
        self.in_sessions -= c.in_sessions;
        self.duplicates -= c.duplicates;
        self.late -= c.late;
        self.invalid -= c.invalid;
        self.blank_lines -= c.blank_lines;
        self.sessions_emitted -= c.sessions_emitted;
        self.retractions -= c.retractions;
        self.bytes_read -= c.bytes_read;
    }

    /// These counts as a checkpoint keeps them.
    pub fn counters(&self) -> Counters {
        Counters {
            records_read: self.records_read,
            in_sessions: self.in_sessions,
            duplicates: self.duplicates,
            late: self.late,
            invalid: self.invalid,
            blank_lines: self.blank_lines,
            sessions_emitted: self.sessions_emitted,
            retractions: self.retractions,
            bytes_read: self.bytes_read,
        }
    }

    /// Whether the four outcomes add up to the records read.
    pub fn adds_up(&self) -> bool {
        self.in_sessions + self.duplicates + self.late + self.invalid == self.records_read
    }

    /// The human summary printed on stderr at the end of a run.
    pub fn summary(&self, output: &str) -> String {
        let secs = self.elapsed_ms as f64 / 1000.0;
        let before = self.checkpoints.as_ref().map_or(0, |c| c.records_before);
        let this_run = self.records_read.saturating_sub(before);
        let rate = if secs > 0.0 {
            format!(" ({}/s)", human(this_run as f64 / secs))
        } else {
            String::new()
        };
        let mut s = String::new();
        if let Some(k) = &self.kafka {
            let _ = writeln!(
                s,
                "sessionizer: this process read {} records in {secs:.2}s{rate} (its share of the job)",
                self.records_read
            );
            let _ = writeln!(
                s,
                "  the job over the partitions it held at the end, every process so far: {} records read, {} sessions emitted",
                k.job.records_read, k.job.sessions_emitted
            );
        } else if before > 0 {
            let _ = writeln!(
                s,
                "sessionizer: read {this_run} records in {secs:.2}s{rate}, {} in all with the earlier runs of this job",
                self.records_read
            );
        } else {
            let _ = writeln!(
                s,
                "sessionizer: read {} records in {secs:.2}s{rate}",
                self.records_read
            );
        }
        let _ = writeln!(
            s,
            "  in sessions {} | duplicates {} | late {} | invalid {}",
            self.in_sessions, self.duplicates, self.late, self.invalid
        );
        let _ = write!(
            s,
            "  sessions emitted {} (retractions {}) to {output}",
            self.sessions_emitted, self.retractions
        );
        if self.blank_lines > 0 {
            let _ = write!(s, "\n  blank lines skipped {}", self.blank_lines);
        }
        if self.stopped && self.kafka.is_some() {
            let _ = write!(
                s,
                "\n  stopped on request: everything read was committed; the sessions in progress stay in the changelogs"
            );
        } else if self.stopped {
            let _ = write!(
                s,
                "\n  stopped on request before the end of the input: the sessions in progress were not emitted"
            );
        }
        if let Some(c) = &self.checkpoints {
            if let Some(epoch) = c.resumed_from {
                let _ = write!(s, "\n  resumed from checkpoint {epoch}");
                if c.restore_keys_linked > 0 {
                    let _ = write!(
                        s,
                        " ({} keys in RocksDB restored by linking the checkpoint's files)",
                        c.restore_keys_linked
                    );
                }
            }
            let _ = write!(
                s,
                "\n  checkpoints written {} ({} bytes",
                c.written, c.bytes
            );
            if c.store_bytes_new > 0 {
                let _ = write!(
                    s,
                    ", and {} bytes of new RocksDB files kept",
                    c.store_bytes_new
                );
            }
            let _ = write!(
                s,
                "; longest write {:.1} ms, longest pause {:.1} ms)",
                c.write_us_max as f64 / 1e3,
                c.pause_us_max as f64 / 1e3
            );
        }
        s
    }
}

/// `1234567.0` → `1.23M`.
pub fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}K", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The process's peak resident set size, from `/proc/self/status` (Linux only).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}
