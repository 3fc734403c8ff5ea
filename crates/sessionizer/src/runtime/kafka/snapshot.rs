//! Local snapshots of the tasks (`--state-dir` with a Kafka job, docs/semantics.md K-3):
//! after a commit, now and then, each task's whole state is written to
//! `DIR/task-<changelog>-<partition>.snap` with the changelog offset it covers, so that
//! a restart — or a partition coming back — reads only the changelog's tail. A snapshot
//! is a cache: damaged, too old or not fitting the changelog, it is ignored.

use crate::error::RunError;
use crate::runtime::kafka::op::TaskOp;
use crate::runtime::kafka::task::{Task, TaskMeta};
use serde::{Deserialize, Serialize};
use sessionizer_checkpoint::{StateDir, StateEntries, task};
use std::time::{Duration, Instant};

/// A snapshot older than this is not used: the changelog's compaction may have dropped
/// the tombstone of a key removed since (Kafka keeps tombstones `delete.retention.ms`,
/// 24 h by default, before compacting them away).
pub(super) const MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// The header of a task snapshot.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Header {
    /// `topic/partition` of the input.
    pub(super) task: String,
    /// The changelog topic and partition it copies.
    pub(super) changelog: String,
    pub(super) partition: i32,
    /// The changelog offset after the last record the snapshot covers.
    pub(super) changelog_offset: i64,
    pub(super) created_unix_ms: u64,
    /// The task's progress record as of that offset.
    pub(super) meta: TaskMeta,
}

/// The snapshot side of a Kafka job.
#[derive(Debug)]
pub(super) struct Snapshots {
    pub(super) dir: StateDir,
    pub(super) interval: Duration,
    pub(super) last: Instant,
    pub(super) written: u64,
    pub(super) bytes: u64,
    pub(super) entries: StateEntries,
}

impl Snapshots {
    /// Opens (and locks) the state directory.
    pub(super) fn open(path: &std::path::Path, interval: Duration) -> Result<Snapshots, RunError> {
        Ok(Snapshots {
            dir: StateDir::open(path)?,
            interval,
            last: Instant::now(),
            written: 0,
            bytes: 0,
            entries: StateEntries::default(),
        })
    }

    /// Whether it is time for the next round of snapshots.
    pub(super) fn due(&self) -> bool {
        self.last.elapsed() >= self.interval
    }

    /// The state directory (it also keeps the process's instance id).
    pub(super) fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(super) fn write_one<O: TaskOp>(
    snaps: &mut Snapshots,
    task: &Task<O>,
    changelog: &str,
    offset: i64,
    options: &[(String, String)],
    format: u16,
) -> Result<u64, RunError> {
    let header = Header {
        task: task.names[0].name.clone(),
        changelog: changelog.to_string(),
        partition: task.tp.partition,
        changelog_offset: offset,
        created_unix_ms: now_ms(),
        meta: task.meta(options, format),
    };
    let header = serde_json::to_vec(&header).expect("snapshot header encodes");
    snaps.entries.clear();
    // Every key, in memory or in the task's RocksDB store.
    let entries = &mut snaps.entries;
    task.op.for_each_key(&mut |key, value| {
        entries.put_with(key, |buf| buf.extend_from_slice(value));
    })?;
    let name = task::file_name(changelog, task.tp.partition);
    Ok(snaps
        .dir
        .write_task_snapshot(&name, &header, &snaps.entries)?)
}
