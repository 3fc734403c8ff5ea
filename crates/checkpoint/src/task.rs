//! Local snapshots of Kafka tasks (docs/semantics.md K-3): with `--state-dir`, a process
//! keeps a copy of each task's state on disk, with the changelog offset it covers, so
//! that a restart (or a partition coming back) reads only the changelog's tail — Kafka
//! Streams' local checkpoint file idea, for a state that lives in memory.
//!
//! One file per task, `task-<changelog topic>-<partition>.snap`, written atomically
//! (temp file, fsync, rename) in a frame of kind 4 with epoch 0:
//!
//! ```text
//! payload := header_len:u32 header[header_len] state
//! header  := UTF-8 JSON chosen by the writer (which task, the changelog offset, its progress)
//! state   := the payload of a base file: count:u64 entry{count}
//! ```
//!
//! A snapshot is a cache: one that is damaged, missing or does not fit the changelog is
//! ignored, and the task is restored from the changelog alone.

use crate::dir::StateDir;
use crate::error::{CheckpointError, Damage};
use crate::frame::{self, FileKind};
use crate::state::{self, StateEntries};

/// The file name of the snapshot of partition `partition` of changelog `changelog`.
pub fn file_name(changelog: &str, partition: i32) -> String {
    format!("task-{changelog}-{partition}.snap")
}

/// A task snapshot as read back.
#[derive(Debug)]
pub struct TaskSnapshot {
    /// The format version it was written with.
    pub format: u16,
    /// The writer's header (JSON).
    pub header: Vec<u8>,
    payload: Vec<u8>,
    /// Where the state entries start in `payload`.
    state_at: usize,
}

impl TaskSnapshot {
    /// The state entries: `(key, value)`, every value present.
    pub fn entries(&self) -> state::Entries<'_> {
        state::entries(&self.payload[self.state_at..])
    }
}

impl StateDir {
    /// Writes a task snapshot atomically; returns its length in bytes.
    pub fn write_task_snapshot(
        &mut self,
        name: &str,
        header: &[u8],
        entries: &StateEntries,
    ) -> Result<u64, CheckpointError> {
        let header_len = u32::try_from(header.len())
            .map_err(|_| CheckpointError::Encode(serde::ser::Error::custom("header too large")))?
            .to_le_bytes();
        let count = state::count_header(entries.len());
        let mut parts: Vec<&[u8]> = vec![&header_len, header, &count];
        parts.extend(entries.parts());
        let (head, trailer) = frame::frame_parts(FileKind::TaskSnapshot, 0, &parts);
        let mut framed: Vec<&[u8]> = Vec::with_capacity(parts.len() + 2);
        framed.push(&head);
        framed.extend_from_slice(&parts);
        framed.push(&trailer);
        self.write_atomic(name, &framed)
    }

    /// Reads and checks a task snapshot; `Ok(None)` when there is none.
    pub fn read_task_snapshot(&self, name: &str) -> Result<Option<TaskSnapshot>, Damage> {
        if !self.path().join(name).exists() {
            return Ok(None);
        }
        let bytes = self.read_file(name)?;
        let damage = |reason: String| Damage {
            file: name.to_string(),
            reason,
        };
        let (format, payload) = frame::decode_versioned(&bytes, FileKind::TaskSnapshot, 0)
            .map_err(|e| damage(e.to_string()))?;
        let len = payload
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| damage("no header".into()))?;
        let header = payload
            .get(4..4 + len)
            .ok_or_else(|| damage("truncated header".into()))?
            .to_vec();
        let snapshot = TaskSnapshot {
            format,
            header,
            payload: payload.to_vec(),
            state_at: 4 + len,
        };
        if let Some(Err(e)) = snapshot.entries().find(Result::is_err) {
            return Err(damage(e.to_string()));
        }
        Ok(Some(snapshot))
    }

    /// Removes a task snapshot (a task that no longer fits its changelog).
    pub fn remove_task_snapshot(&self, name: &str) -> Result<(), CheckpointError> {
        match std::fs::remove_file(self.path().join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CheckpointError::Write {
                action: "remove the task snapshot",
                path: self.path().join(name),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_snapshot_round_trips_and_damage_is_detected() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut dir = StateDir::open(tmp.path()).expect("open");
        let mut entries = StateEntries::default();
        entries.put_with(b"k1", |b| b.extend_from_slice(b"v1"));
        entries.put_with(b"k2", |b| b.extend_from_slice(b"value two"));
        let name = file_name("job-visits-changelog", 3);
        assert_eq!(name, "task-job-visits-changelog-3.snap");
        assert!(dir.read_task_snapshot(&name).expect("read").is_none());
        dir.write_task_snapshot(&name, br#"{"offset":42}"#, &entries)
            .expect("write");
        let snap = dir.read_task_snapshot(&name).expect("read").expect("some");
        assert_eq!(snap.header, br#"{"offset":42}"#);
        assert_eq!(snap.format, crate::FORMAT_VERSION);
        let got: Vec<(Vec<u8>, Option<Vec<u8>>)> = snap
            .entries()
            .map(|e| e.expect("entry"))
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(
            got,
            vec![
                (b"k1".to_vec(), Some(b"v1".to_vec())),
                (b"k2".to_vec(), Some(b"value two".to_vec()))
            ]
        );
        // A flipped byte is caught by the CRC; the file is not trusted.
        let path = tmp.path().join(&name);
        let mut bytes = std::fs::read(&path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let err = dir.read_task_snapshot(&name).expect_err("damaged");
        assert_eq!(err.file, name);
        // Checkpoint listings ignore snapshots.
        assert!(dir.list().expect("list").state_files.is_empty());
    }
}
