//! Local snapshots of the tasks (`--state-dir` with a Kafka job, docs/semantics.md K-3):
//! after a commit, now and then, each task's whole state is written to
//! `DIR/task-<changelog>-<partition>.snap` with the changelog offset it covers, so that
//! a restart — or a partition coming back — reads only the changelog's tail. A snapshot
//! is a cache: damaged, too old or not fitting the changelog, it is ignored.

use crate::error::RunError;
use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::restore::Restoring;
use crate::runtime::kafka::task::{Task, TaskMeta};
use serde::{Deserialize, Serialize};
use sessionizer_checkpoint::{StateDir, StateEntries, task};
use sessionizer_connectors::kafka::TopicPartition;
use std::time::{Duration, Instant};

/// A snapshot older than this is not used: the changelog's compaction may have dropped
/// the tombstone of a key removed since (Kafka keeps tombstones `delete.retention.ms`,
/// 24 h by default, before compacting them away).
const MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// The header of a task snapshot.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    /// `topic/partition` of the input.
    task: String,
    /// The changelog topic and partition it copies.
    changelog: String,
    partition: i32,
    /// The changelog offset after the last record the snapshot covers.
    changelog_offset: i64,
    created_unix_ms: u64,
    /// The task's progress record as of that offset.
    meta: TaskMeta,
}

/// The snapshot side of a Kafka job.
#[derive(Debug)]
pub(super) struct Snapshots {
    dir: StateDir,
    interval: Duration,
    last: Instant,
    pub(super) written: u64,
    pub(super) bytes: u64,
    entries: StateEntries,
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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// The local snapshot of a task, if there is one that can be used.
    pub(super) fn load_snapshot(&mut self, changelog: &str, partition: i32) -> Option<Restoring> {
        let snaps = self.snapshots.as_ref()?;
        let name = task::file_name(changelog, partition);
        let snap = match snaps.dir.read_task_snapshot(&name) {
            Ok(s) => s?,
            Err(damage) => {
                tracing::warn!(file = %damage.file, reason = %damage.reason, "damaged task snapshot ignored");
                return None;
            }
        };
        let header: Header = match serde_json::from_slice(&snap.header) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(file = %name, error = %e, "task snapshot header unreadable; ignored");
                return None;
            }
        };
        if header.changelog != changelog || header.partition != partition {
            return None;
        }
        let age = now_ms().saturating_sub(header.created_unix_ms);
        if age > MAX_AGE.as_millis() as u64 {
            tracing::info!(file = %name, age_s = age / 1000, "task snapshot too old to trust; restoring from the changelog");
            return None;
        }
        let mut restoring = Restoring {
            offset: Some(header.changelog_offset),
            meta: Some(header.meta),
            source: "snapshot",
            ..Restoring::default()
        };
        for entry in snap.entries() {
            match entry {
                Ok((key, Some(value))) => {
                    restoring.states.insert(key.to_vec(), value.to_vec());
                }
                Ok((_, None)) => {}
                Err(e) => {
                    tracing::warn!(file = %name, error = %e, "task snapshot damaged; ignored");
                    return None;
                }
            }
        }
        Some(restoring)
    }

    /// Writes the snapshots of `which` tasks (those with a committed changelog
    /// position). Called right after a commit, so each holds exactly the committed state.
    /// A failure is reported and skipped: the changelog still holds everything.
    pub(super) fn write_snapshots(&mut self, which: &[TopicPartition]) {
        let KafkaJob {
            snapshots,
            tasks,
            changelogs,
            options,
            factory,
            ..
        } = self;
        let format = factory.state_format();
        let Some(snaps) = snapshots.as_mut() else {
            return;
        };
        snaps.last = Instant::now();
        for tp in which {
            let Some(task) = tasks.get(tp) else { continue };
            let Some(offset) = task.changelog_end else {
                continue;
            };
            let changelog = &changelogs[tp.topic as usize];
            let began = Instant::now();
            match write_one(snaps, task, changelog, offset, options, format) {
                Ok(bytes) => {
                    snaps.written += 1;
                    snaps.bytes += bytes;
                    tracing::debug!(
                        task = %task.names[0].name,
                        changelog_offset = offset,
                        bytes,
                        ms = began.elapsed().as_millis() as u64,
                        "task snapshot written"
                    );
                }
                Err(e) => {
                    tracing::warn!(task = %task.names[0].name, error = %e, "task snapshot not written")
                }
            }
        }
    }
}

fn write_one<O: TaskOp>(
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
