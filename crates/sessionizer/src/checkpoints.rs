//! Checkpoints of a library job, in the command line's checkpoint format (SPEC §4,
//! `docs/checkpoint-format.md`): a state directory of manifests, bases and deltas,
//! written atomically with checksums by `sessionizer-checkpoint`, one key's sessions
//! encoded by `sessionizer_window::codec` — the files `sessionizer run --state-dir`
//! writes, and `sessionizer inspect` lists.
//!
//! ```
//! use sessionizer::prelude::*;
//!
//! let dir = tempfile::tempdir().expect("temp dir");
//! let events = [("v1", 0), ("v1", 60_000), ("v2", 0), ("v1", 3_600_000)]
//!     .map(|(k, t)| (k, EventTime(t)));
//! let job = || {
//!     Stream::<(&str, EventTime)>::new()
//!         .key_by(|e| e.0)
//!         .event_time(|e| e.1)
//!         .session_windows(minutes(10))
//!         .aggregate(Count)
//!         .build()
//! };
//!
//! // A first run: two events, a checkpoint, then it stops (or dies).
//! let mut first = job();
//! let mut checkpoints = Checkpoints::open(dir.path()).expect("a state directory");
//! let mut out = Vec::new();
//! for e in &events[..2] {
//!     first.push(*e, &mut out, &mut Vec::new()).expect("vectors");
//! }
//! first.checkpoint(&mut checkpoints).expect("written");
//! drop((first, checkpoints));
//!
//! // The next run resumes: it skips the events the checkpoint covers.
//! let mut checkpoints = Checkpoints::open(dir.path()).expect("a state directory");
//! let mut job = job();
//! let resumed = job.restore(&mut checkpoints).expect("restored").expect("a checkpoint");
//! assert_eq!(resumed.events, 2);
//! let rest = events.into_iter().skip(resumed.events as usize);
//! job.run(rest, &mut out, &mut Vec::new()).expect("vectors");
//! let counts: Vec<u64> = out.iter().filter_map(WindowOutput::session).map(|s| s.value).collect();
//! assert_eq!(counts, [1, 2, 1]); // v2 [0], v1 [0, 1 min], v1 [1 h]
//! ```

use sessionizer_checkpoint::{
    CheckpointError, CheckpointWriter, Damage, EncodedState, KafkaPosition, LoadedState, Manifest,
    StateDir, StateEntries,
};
use std::path::{Path, PathBuf};

/// What one checkpoint wrote, and whether its state file is a base or a delta.
pub use sessionizer_checkpoint::{Committed, FileKind};

/// A state directory a job checkpoints into and restores from.
///
/// Opening it finds the newest valid checkpoint (a damaged newer one is skipped and
/// listed in [`skipped`](Self::skipped); a directory none of whose checkpoints is valid
/// is refused). A directory is used by one job at a time (it is locked).
#[derive(Debug)]
pub struct Checkpoints {
    pub(crate) path: PathBuf,
    pub(crate) writer: CheckpointWriter,
    /// The newest valid checkpoint, until a job restores it.
    pub(crate) found: Option<(Manifest, LoadedState)>,
    /// The epoch of the checkpoint found, whether or not it was restored.
    pub(crate) found_epoch: Option<u64>,
    pub(crate) restored: bool,
    skipped: Vec<(u64, Damage)>,
    /// How far the job's Kafka source had read at the checkpoint found, then as
    /// recorded by the source: written into every checkpoint.
    pub(crate) kafka_positions: Vec<KafkaPosition>,
}

impl Checkpoints {
    /// Opens (creating it if needed) the state directory at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoints, CheckpointError> {
        let path = path.as_ref().to_path_buf();
        let dir = StateDir::open(&path)?;
        let recovery = dir.recover()?;
        let found = recovery.found.map(|r| (r.manifest, r.state));
        let kafka_positions = found
            .as_ref()
            .map(|(m, _)| m.kafka_positions.clone())
            .unwrap_or_default();
        let writer = CheckpointWriter::new(dir, found.as_ref().map(|(m, s)| (m, s)))?;
        Ok(Checkpoints {
            path,
            writer,
            found_epoch: found.as_ref().map(|(m, _)| m.epoch),
            found,
            restored: false,
            skipped: recovery.skipped,
            kafka_positions,
        })
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The epoch of the newest valid checkpoint found when opening, if any.
    pub fn latest(&self) -> Option<u64> {
        self.found_epoch
    }

    /// Newer checkpoints that were damaged and skipped when opening, newest first.
    pub fn skipped(&self) -> &[(u64, Damage)] {
        &self.skipped
    }
}

/// The bookkeeping both library jobs share around their own state: which checkpoint
/// comes next, writing it, and handing the one found over to a restore.
impl Checkpoints {
    /// Whether the job's next checkpoint is a full base (`checkpointed`: the job wrote
    /// or restored one before). A directory holding a checkpoint the job did not
    /// restore is refused: checkpointing over it would mix two jobs' state.
    pub(crate) fn next_is_base(&self, checkpointed: bool) -> Result<bool, StateError> {
        if let Some(epoch) = self.found_epoch
            && !self.restored
        {
            return Err(StateError::NotRestored {
                dir: self.path.clone(),
                epoch,
            });
        }
        Ok(self.writer.next_is_base() || !checkpointed)
    }

    /// Writes a checkpoint: the job's `entries` (every key when `base`, else the
    /// changes) and its `manifest`.
    pub(crate) fn write(
        &mut self,
        base: bool,
        entries: &StateEntries,
        mut manifest: Manifest,
    ) -> Result<Committed, StateError> {
        if !self.writer.settle_kind(base) {
            // Prevented by next_is_base; the writer labels the file, so they must agree.
            return Err(StateError::State {
                dir: self.path.clone(),
                reason: "internal error: the job and the checkpoint writer disagree on whether this checkpoint is a full base; nothing was written".into(),
            });
        }
        let state = EncodedState {
            parts: entries.parts().collect(),
            puts: entries.puts(),
            tombstones: entries.tombstones(),
        };
        manifest.kafka_positions = self.kafka_positions.clone();
        let committed = self.writer.commit(&state, manifest)?;
        self.restored = true;
        self.found_epoch = Some(committed.epoch);
        Ok(committed)
    }

    /// Hands the checkpoint found over to a job that has processed `events` so far
    /// (refused unless none) and whose state-shaping options are `options` (refused,
    /// naming the differences, unless equal); `None` when there is none. Give it back
    /// with [`keep_found`](Self::keep_found) if the restore fails.
    pub(crate) fn take_found(
        &mut self,
        events: u64,
        options: &[(String, String)],
    ) -> Result<Option<(Manifest, LoadedState)>, StateError> {
        if events > 0 {
            return Err(StateError::NotFresh { events });
        }
        let Some((manifest, state)) = self.found.take() else {
            return Ok(None);
        };
        let differences = manifest.option_differences(options);
        if !differences.is_empty() {
            self.found = Some((manifest, state));
            return Err(StateError::OptionsChanged {
                dir: self.path.clone(),
                differences,
            });
        }
        Ok(Some((manifest, state)))
    }

    /// Puts back a checkpoint whose restore failed (nothing of it was applied) and
    /// returns the error of `reason`.
    pub(crate) fn keep_found(
        &mut self,
        found: (Manifest, LoadedState),
        reason: String,
    ) -> StateError {
        self.found = Some(found);
        StateError::State {
            dir: self.path.clone(),
            reason,
        }
    }

    /// A restore succeeded: the job's next checkpoint continues this directory.
    pub(crate) fn mark_restored(&mut self) {
        self.restored = true;
    }
}

/// Why a job cannot checkpoint or restore.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state directory could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint was taken with other options than this job's.
    #[error(
        "cannot resume from {dir}: the job's options changed: {}. Use the options of the checkpoint, or another state directory",
        differences.join("; ")
    )]
    OptionsChanged {
        /// The state directory.
        dir: PathBuf,
        /// One line per option that differs, naming it.
        differences: Vec<String>,
    },
    /// A key's state in the checkpoint could not be read (a changed accumulator type,
    /// say).
    #[error("cannot resume from {dir}: {reason}")]
    State {
        /// The state directory.
        dir: PathBuf,
        /// What could not be read, naming the key.
        reason: String,
    },
    /// The directory holds a checkpoint that this job did not restore: checkpointing
    /// over it would mix two jobs' state.
    #[error(
        "the state directory {dir} holds checkpoint {epoch}, which this job did not restore: call restore() before the first checkpoint, or use an empty directory"
    )]
    NotRestored {
        /// The state directory.
        dir: PathBuf,
        /// The checkpoint found there.
        epoch: u64,
    },
    /// Restore was called on a job that has already processed events.
    #[error("restore() must come before the job's first event ({events} processed)")]
    NotFresh {
        /// Events the job has processed.
        events: u64,
    },
    /// The state backend's store (RocksDB) failed.
    #[error(transparent)]
    StateStore(#[from] sessionizer_window::spill::SpillError),
    /// The state backend asked for cannot be used (this build lacks it, or the job has
    /// state already).
    #[error("{0}")]
    Backend(String),
    /// The workers asked for cannot be set up (the job has state already, or the
    /// threads did not start).
    #[error("{0}")]
    Workers(String),
}

/// What a job resumed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumed {
    /// The checkpoint's epoch.
    pub epoch: u64,
    /// Events the checkpoint covers (every event pushed before it): skip that many of a
    /// replayable source, or resume the source at its own position stored alongside.
    pub events: u64,
    /// Keys with state at the checkpoint.
    pub keys: u64,
}
