//! The driver's steps for snapshot (see `runtime/kafka/snapshot.rs` for its parts).

use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::TaskFactory;
use crate::runtime::kafka::restore::Restoring;
use crate::runtime::kafka::snapshot::{Header, MAX_AGE, now_ms, write_one};
use sessionizer_checkpoint::task;
use sessionizer_connectors::kafka::TopicPartition;
use std::time::Instant;

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// The local snapshot of a task, if there is one that can be used.
    pub(in crate::runtime::kafka) fn load_snapshot(
        &mut self,
        changelog: &str,
        partition: i32,
    ) -> Option<Restoring> {
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
    pub(in crate::runtime::kafka) fn write_snapshots(&mut self, which: &[TopicPartition]) {
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
