//! Errors of the checkpoint store. Messages say what happened and what to do.

use crate::frame::FileKind;
use std::io;
use std::path::PathBuf;

/// Why a file's frame is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("file is truncated ({len} bytes, shorter than a frame)")]
    Truncated { len: u64 },
    #[error("not a sessionizer checkpoint file (bad magic bytes)")]
    Magic,
    #[error(
        "checkpoint format version {found} is not supported (this build reads version {})",
        crate::frame::FORMAT_VERSION
    )]
    Version { found: u16 },
    #[error("file length is {found} bytes, the header says {expected}: truncated or extended")]
    Length { expected: u64, found: u64 },
    #[error("checksum mismatch: the file is damaged")]
    Checksum,
    #[error("file holds {} where a {} was expected", found.map_or("an unknown kind", FileKind::as_str), expected.as_str())]
    Kind {
        expected: FileKind,
        found: Option<FileKind>,
    },
    #[error("file belongs to checkpoint {found}, not {expected} as its name says")]
    Epoch { expected: u64, found: u64 },
}

/// Why a checkpoint cannot be used: one of its files is missing, damaged or inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct Damage {
    /// The file at fault, relative to the state directory.
    pub file: String,
    /// What is wrong with it.
    pub reason: String,
}

/// An error of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Writing, syncing or renaming a checkpoint file failed. Fatal: an fsync failure
    /// leaves the page cache in an unknown state, so it is never retried.
    #[error(
        "cannot {action} {path}: {source}; the previous checkpoint is left intact: fix the cause (disk space, permissions) and run again to resume from it"
    )]
    Write {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading the state directory failed.
    #[error("cannot read the state directory {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Checkpoints exist but none of them can be used.
    #[error(
        "no valid checkpoint in {dir}: {}; refusing to start from empty state over existing output. Restore the state directory from a backup, or remove it (and the outputs) to start over",
        details.iter().map(|(epoch, d)| format!("checkpoint {epoch}: {d}")).collect::<Vec<_>>().join("; ")
    )]
    NoValidCheckpoint {
        dir: PathBuf,
        details: Vec<(u64, Damage)>,
    },
    /// Another process holds the state directory's lock.
    #[error(
        "another sessionizer run is using the state directory {path}; wait for it to end (two runs on one state directory would overwrite each other's checkpoints and outputs)"
    )]
    Locked { path: PathBuf },
    /// The manifest could not be encoded (a bug, not an I/O problem).
    #[error("cannot encode the checkpoint manifest: {0}")]
    Encode(#[source] serde_json::Error),
}
