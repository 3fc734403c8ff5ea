//! The manifest of one checkpoint: everything besides the keyed state, and the names of
//! the state files that hold the keyed state. Stored as JSON inside a frame, so that it
//! stays readable with `sessionizer inspect --json` and can grow optional fields.
//!
//! Every field is consistent with every other: the input positions are the end of the
//! last batch processed, the output lengths were flushed and synced after that batch's
//! records were written, and the state files hold the keyed state right after it.

use serde::{Deserialize, Serialize};

/// One checkpoint's manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The checkpoint's number; higher is newer. Also in the file's name and frame.
    pub epoch: u64,
    /// Wall-clock time of writing, milliseconds since the Unix epoch (informational).
    pub created_unix_ms: u64,
    /// The full snapshot this checkpoint builds on.
    pub base: StateFileRef,
    /// Changes since the base, oldest first; restore applies them in order.
    pub deltas: Vec<StateFileRef>,
    /// The options that shape the state, as `(name, value)` pairs: a run with any
    /// other value is refused, naming it. The number of workers is not among them: state
    /// is re-hashed to any number of shards on restore.
    pub options: Vec<(String, String)>,
    /// The run's inputs, in the order given, with how far each was consumed.
    pub inputs: Vec<InputPosition>,
    /// The input sequence number of the next line (orders values of equal event time
    /// across runs).
    pub next_seq: u64,
    /// Where event time stands.
    pub watermark: WatermarkState,
    /// Every file output with the length that is committed (sessions, late events, dead
    /// letters). Recovery cuts each file back to this length.
    pub outputs: Vec<OutputCommit>,
    /// The accounting of the job up to this checkpoint (docs/semantics.md S-13).
    pub counters: Counters,
    /// Keys with state at this checkpoint.
    pub keys: u64,
    /// Sessions not yet final at this checkpoint.
    pub open_sessions: u64,
    /// The end of the inputs was reached. A finished checkpoint accepts new inputs: the
    /// next run continues its sessions (`--keep-open`).
    pub finished: bool,
    /// The end of the inputs was reached without `--keep-open`: the watermark became
    /// +infinity and every session was emitted.
    pub flushed: bool,
    /// With a Kafka output (file or stdin input): the transaction this checkpoint
    /// prepared. It was written before the transaction was committed, so recovery asks
    /// Kafka whether it committed; absent for a run without a Kafka output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_txn: Option<KafkaTxn>,
    /// A library job reading a Kafka topic itself (`sessionizer::kafka::KafkaJson`):
    /// the next offset of each partition, just after the last record the job had
    /// processed at this checkpoint. The source resumes there. Absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kafka_positions: Vec<KafkaPosition>,
    /// What that source reads: one partition of its topic, or all of them. A source
    /// opened the other way on this checkpoint is refused. Absent when the job has no
    /// such source (and in checkpoints of builds before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_source: Option<KafkaSource>,
    /// Outputs written as files that become visible only when their checkpoint commits
    /// (Parquet): the files this checkpoint staged under temporary names. Recovery
    /// renames those not renamed yet (the checkpoint is durable, so its files are
    /// committed) and deletes every other temporary file. Absent for a run without such
    /// an output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub staged: Vec<StagedOutput>,
    /// Outputs that are Delta Lake tables: the data files this checkpoint wrote into
    /// the table, committed to the table's log (one commit carrying the transaction
    /// `(app_id, epoch)`) only after this manifest is durable. Recovery asks the table
    /// for the job's last transaction version: if it is below this epoch, the files are
    /// committed then (rolled forward). Absent for a run without a Delta table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delta: Vec<DeltaEpoch>,
}

/// The data files an output wrote into a Delta Lake table in one checkpoint
/// ([`Manifest::delta`]): what the table's commit of the epoch adds, so that a later
/// process can make exactly that commit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaEpoch {
    /// The output's role (`sessions`).
    pub role: String,
    /// The table's location: the absolute path of its directory.
    pub table: String,
    /// The application id of the job's transactions in the table.
    pub app_id: String,
    /// The checkpoint's epoch: the version of the transaction that commits the files.
    pub epoch: u64,
    /// The files written since the table's last commit by this job, in the order they
    /// were opened (none when those epochs had no rows: the epoch then makes no commit).
    pub files: Vec<DeltaFileRef>,
    /// The files wait for a later epoch's commit (`--delta-commit-interval` was not due
    /// at this one): this epoch makes no commit, and a run resuming from it carries them
    /// on to the next commit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// One data file of a [`DeltaEpoch`]: what the table's Add action says of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaFileRef {
    /// The path relative to the table's root.
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// The file's length in bytes.
    pub bytes: u64,
    /// When the file was written, milliseconds since the Unix epoch.
    pub modified_unix_ms: i64,
    /// The Delta statistics of the file (JSON: `numRecords`, `minValues`, `maxValues`,
    /// `nullCount`), as its Add action carries them.
    pub stats: String,
}

/// The files an output staged in one checkpoint ([`Manifest::staged`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagedOutput {
    /// The output's role (`sessions`).
    pub role: String,
    /// The output directory, as given.
    pub dir: String,
    /// The checkpoint's epoch, which the files' names carry.
    pub epoch: u64,
    /// The files, in the order they were opened.
    pub files: Vec<StagedFileRef>,
}

/// One staged file of a [`StagedOutput`]; paths relative to its directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagedFileRef {
    /// The temporary path, until the commit renames it.
    pub temp: String,
    /// The final path.
    pub name: String,
    /// Rows in the file.
    pub rows: u64,
    /// The file's length in bytes.
    pub bytes: u64,
}

/// What a library job's Kafka source reads ([`Manifest::kafka_source`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSource {
    /// The topic.
    pub topic: String,
    /// The one partition it reads; `None`: every partition of the topic.
    pub partition: Option<i32>,
}

/// How far a library job's Kafka source read one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaPosition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset of the next record to process.
    pub next_offset: i64,
}

/// The Kafka transaction a checkpoint prepared (two-phase commit with a Kafka output):
/// the transaction holds the output records since the previous checkpoint and a
/// progress record naming this checkpoint's epoch; it is committed only after this
/// manifest is durable. On recovery the progress record is looked up: committed, the
/// run resumes from this checkpoint; aborted (the process died in between), from
/// [`fallback_epoch`](Self::fallback_epoch).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTxn {
    /// The producer's transactional id (the job's name in Kafka).
    pub transactional_id: String,
    /// The session output topic.
    pub output_topic: String,
    /// The topic of the progress records.
    pub progress_topic: String,
    /// The partition of the progress topic that holds this checkpoint's record.
    pub progress_partition: i32,
    /// Its offset there.
    pub progress_offset: i64,
    /// The checkpoint to resume from if this one's transaction did not commit: the
    /// newest one whose transaction did (or the one the run resumed from); `None`: the
    /// job's beginning.
    pub fallback_epoch: Option<u64>,
}

/// A base or delta file of a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFileRef {
    /// File name inside the state directory.
    pub file: String,
    /// The epoch that wrote it (also in its name and frame).
    pub epoch: u64,
    /// File length, frame included.
    pub bytes: u64,
    /// Keys with a value in the file.
    pub puts: u64,
    /// Keys removed (deltas only).
    pub tombstones: u64,
    /// A base of the `rocksdb` state backend: the RocksDB checkpoint of each worker's
    /// store (by worker index), holding the keys that were in RocksDB when the base was
    /// taken; the base file holds the keys that were in memory. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stores: Vec<StoreRef>,
}

/// One worker's RocksDB store as a base keeps it: a RocksDB checkpoint (its table files
/// hard links shared with the store and with earlier bases, its other files copies) in a
/// directory of the state directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreRef {
    /// Its directory inside the state directory: `rocksdb-<base epoch>/shard-<index>`.
    pub dir: String,
    /// Keys it holds.
    pub keys: u64,
    /// Sessions among them that are not final (the operator's count of its keys).
    pub open_sessions: u64,
    /// Every file of the RocksDB checkpoint, by name.
    pub files: Vec<StoreFileRef>,
}

/// One file of a [`StoreRef`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFileRef {
    /// The file's name in the store's directory.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// CRC32 (IEEE) of its contents: recovery reads every file back and compares.
    pub crc32: u32,
}

impl StateFileRef {
    /// Bytes of state this file stands for: its own, and those of the stores a base
    /// builds on.
    pub fn state_bytes(&self) -> u64 {
        self.bytes
            + self
                .stores
                .iter()
                .flat_map(|s| &s.files)
                .map(|f| f.bytes)
                .sum::<u64>()
    }
}

/// How far one input was consumed, and what the file looked like, so that a changed file
/// is noticed instead of resumed at a meaningless offset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputPosition {
    /// The path as given to `--input`.
    pub path: String,
    /// File size when the run started.
    pub size: u64,
    /// xxh3-64 of the file's first 4 KiB (or all of it when shorter), 16 hex digits.
    pub head_xxh3: String,
    /// Bytes consumed: the offset just after the last whole line processed.
    pub offset: u64,
    /// Lines consumed (the line number of the last line processed).
    pub line: u64,
}

/// Where event time stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkState {
    /// Largest valid event time seen (ms), `None` before any valid event.
    pub max_event_time_ms: Option<i64>,
    /// The watermark (ms); `i64::MIN`/`i64::MAX` are minus/plus infinity.
    pub watermark_ms: i64,
    /// Largest gap of any valid event (ms): how long final bounds are remembered.
    pub largest_gap_ms: i64,
    /// The floor a key whose state is created next starts with (ms; `i64::MIN` is minus
    /// infinity): the highest `W - A - Gmax` so far (docs/semantics.md S-30). Since
    /// format 2; absent in a format-1 manifest, where a resumed run derives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_key_floor_ms: Option<i64>,
    /// The watermark the next batch judges late events by (ms), when it is not
    /// `watermark_ms`: a stateful job on Spark's rules judges them by the previous
    /// batch's watermark. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_watermark_ms: Option<i64>,
}

/// The committed length of one file output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputCommit {
    /// `sessions`, `dead-letter` or `late`.
    pub role: String,
    /// The path as given (or derived from `--output`).
    pub path: String,
    /// Bytes committed: everything before is final, anything after is discarded on
    /// recovery.
    pub committed_bytes: u64,
}

/// The job's accounting, cumulative over every run on the state directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counters {
    /// Records read; each ends up in exactly one of `in_sessions`, `duplicates`,
    /// `late` and `invalid`.
    pub records_read: u64,
    /// Records applied to a session.
    pub in_sessions: u64,
    /// Records dropped as duplicates.
    pub duplicates: u64,
    /// Records too late (written to the late output).
    pub late: u64,
    /// Records that are not valid events (written to the dead-letter output).
    pub invalid: u64,
    /// Empty or whitespace-only lines, skipped (not records).
    pub blank_lines: u64,
    /// Session records emitted (every revision counts).
    pub sessions_emitted: u64,
    /// Retraction records emitted.
    pub retractions: u64,
    /// Bytes read from the inputs.
    pub bytes_read: u64,
}

impl Manifest {
    /// The differences between the options of this checkpoint and `now`, one line each,
    /// naming the option: empty when they agree.
    pub fn option_differences(&self, now: &[(String, String)]) -> Vec<String> {
        let mut out = Vec::new();
        let get = |list: &[(String, String)], name: &str| {
            list.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
        };
        for (name, then) in &self.options {
            match get(now, name) {
                Some(v) if &v == then => {}
                Some(v) => out.push(format!(
                    "{name} was {then} when the checkpoint was taken, this run has {v}"
                )),
                None => out.push(format!(
                    "{name} was {then} when the checkpoint was taken, this run does not know it"
                )),
            }
        }
        for (name, v) in now {
            if get(&self.options, name).is_none() {
                out.push(format!(
                    "{name} is {v} in this run, the checkpoint does not know it"
                ));
            }
        }
        out
    }
}
