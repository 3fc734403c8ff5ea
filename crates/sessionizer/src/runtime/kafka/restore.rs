//! Restoring a task (docs/semantics.md K-3): its state, watermark and counters are read
//! back from its changelog partition — all of it, or only the tail after a local snapshot
//! (`--state-dir`) or a standby copy (`--standby-replicas`) that already holds the rest.

use crate::error::ProgressRecordError;
use crate::runtime::kafka::task::{META_VERSION, TaskMeta};
use sessionizer_connectors::kafka::changelog::Entry;
use std::collections::HashMap;

/// How long a restore reads on for the changelog records of a commit whose offsets are
/// already stable (its markers are written within milliseconds).
pub(super) const MARKER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long after its timeout a transaction left open by a process that died may still
/// hold its partitions: the coordinator looks for expired transactions every ten
/// seconds (the brokers' default `transaction.abort.timed.out.transaction.cleanup.interval.ms`),
/// and a little more.
pub(super) const EXPIRY_CHECK: std::time::Duration = std::time::Duration::from_secs(12);

/// A task's state being put together, as its changelog records say it: each key's
/// latest encoded state and the latest progress record, up to a changelog offset.
#[derive(Debug, Default)]
pub(super) struct Restoring {
    pub(super) states: HashMap<Vec<u8>, Vec<u8>>,
    pub(super) meta: Option<TaskMeta>,
    /// The changelog offset of the next record to apply (`None`: from the beginning).
    pub(super) offset: Option<i64>,
    /// Where the state came from before the changelog was read: `changelog`,
    /// `snapshot` or `standby`.
    pub(super) source: &'static str,
}

impl Restoring {
    /// Nothing yet: the whole changelog is to be read.
    pub(super) fn empty() -> Restoring {
        Restoring {
            source: "changelog",
            ..Restoring::default()
        }
    }

    /// Applies one changelog record.
    pub(super) fn apply(&mut self, entry: Entry<'_>) -> Result<(), ProgressRecordError> {
        match entry {
            Entry::State {
                key,
                value: Some(v),
            } => {
                self.states.insert(key.to_vec(), v.to_vec());
            }
            Entry::State { key, value: None } => {
                self.states.remove(key);
            }
            Entry::Meta(bytes) => self.meta = Some(parse_meta(bytes)?),
        }
        Ok(())
    }
}

/// Reads a progress record.
pub(super) fn parse_meta(bytes: &[u8]) -> Result<TaskMeta, ProgressRecordError> {
    let m: TaskMeta = serde_json::from_slice(bytes).map_err(ProgressRecordError::Unreadable)?;
    if m.version != META_VERSION {
        return Err(ProgressRecordError::Version {
            found: m.version,
            reads: META_VERSION,
        });
    }
    Ok(m)
}
