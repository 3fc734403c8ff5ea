//! Errors of the checkpoint store. Messages say what happened and what to do.

use crate::frame::FileKind;
use std::io;
use std::path::{Path, PathBuf};

/// Why a file's frame is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The file is shorter than a frame's header and trailer together.
    #[error("file is truncated ({len} bytes, shorter than a frame)")]
    Truncated {
        /// The file's length in bytes.
        len: u64,
    },
    /// The file does not start with the checkpoint magic bytes.
    #[error("not a sessionizer checkpoint file (bad magic bytes)")]
    Magic,
    /// The file was written in a format version this build does not read.
    #[error(
        "checkpoint format version {found} is not supported (this build reads versions {} to {}); resume it with the sessionizer release that wrote it",
        crate::frame::OLDEST_FORMAT_VERSION,
        crate::frame::FORMAT_VERSION
    )]
    Version {
        /// The format version in the file's header.
        found: u16,
    },
    /// The file's length disagrees with the payload length in its header.
    #[error("file length is {found} bytes, the header says {expected}: truncated or extended")]
    Length {
        /// Bytes the header implies (header, payload and trailer).
        expected: u64,
        /// Bytes the file actually has.
        found: u64,
    },
    /// The CRC32 in the trailer does not match the file's contents.
    #[error("checksum mismatch: the file is damaged")]
    Checksum,
    /// The file's kind (manifest, base, delta) is not the one its name says.
    #[error("file holds {} where a {} was expected", found.map_or("an unknown kind", FileKind::as_str), expected.as_str())]
    Kind {
        /// The kind the file's name says.
        expected: FileKind,
        /// The kind in the header; `None` for an unknown kind code.
        found: Option<FileKind>,
    },
    /// The epoch in the header is not the one in the file's name.
    #[error("file belongs to checkpoint {found}, not {expected} as its name says")]
    Epoch {
        /// The epoch in the file's name.
        expected: u64,
        /// The epoch in the file's header.
        found: u64,
    },
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
        "cannot {action} {path}: {source}; the previous checkpoint is left intact: {} and run again to resume from it",
        write_remedy(source)
    )]
    Write {
        /// What was being done, e.g. "rename into place".
        action: &'static str,
        /// The file or directory acted on.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The state directory could not be created or locked for writing.
    #[error("cannot {action} {path}: {source}; {}", open_remedy(source))]
    Open {
        /// What was being done, e.g. "create the lock file".
        action: &'static str,
        /// The file or directory acted on.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The state directory is a file, or would be under one.
    #[error("{}", not_a_directory(path, file))]
    NotADirectory {
        /// The state directory.
        path: PathBuf,
        /// The file: `path` itself or one of its parents.
        file: PathBuf,
    },
    /// Reading the state directory failed.
    #[error("cannot read the state directory {path}: {source}")]
    Read {
        /// The state directory.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// Checkpoints exist but none of them can be used.
    #[error(
        "no valid checkpoint in {dir}: {}; refusing to start from empty state over existing output. Restore the state directory from a backup, or remove it (and the outputs) to start over",
        details.iter().map(|(epoch, d)| format!("checkpoint {epoch}: {d}")).collect::<Vec<_>>().join("; ")
    )]
    NoValidCheckpoint {
        /// The state directory.
        dir: PathBuf,
        /// Each checkpoint's epoch and what is wrong with it.
        details: Vec<(u64, Damage)>,
    },
    /// Another process holds the state directory's lock.
    #[error(
        "another sessionizer run is using the state directory {path}; wait for it to end (two runs on one state directory would overwrite each other's checkpoints and outputs)"
    )]
    Locked {
        /// The state directory.
        path: PathBuf,
    },
    /// The manifest could not be encoded (a bug, not an I/O problem).
    #[error("cannot encode the checkpoint manifest: {0}")]
    Encode(#[source] serde_json::Error),
}

/// What to do about a failed write, before running again (the system's text names the
/// cause; "disk space, permissions" only when it is none of these).
fn write_remedy(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::ReadOnlyFilesystem => {
            "the state directory is on a read-only file system: remount it read-write"
        }
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => "free disk space",
        io::ErrorKind::PermissionDenied => {
            "give the user running sessionizer write access to the state directory"
        }
        _ => "fix the cause (disk space, permissions)",
    }
}

/// What to do when the state directory cannot be created or locked.
fn open_remedy(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::ReadOnlyFilesystem => {
            "the state directory is on a read-only file system: remount it read-write, or give --state-dir a directory on a writable file system"
        }
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            "free disk space and run again"
        }
        io::ErrorKind::PermissionDenied => {
            "give the user running sessionizer write access to it, or give --state-dir another directory"
        }
        _ => "fix the cause and run again",
    }
}

fn not_a_directory(path: &Path, file: &Path) -> String {
    if path == file {
        format!(
            "--state-dir {} is a file, not a directory; give --state-dir a directory (it is created when missing), or move the file away",
            path.display()
        )
    } else {
        format!(
            "--state-dir {} cannot be created: {} is a file, not a directory; give --state-dir a path that is not under a file",
            path.display(),
            file.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read-only file system is not a matter of disk space or permissions: the
    /// message says what it is and what to do.
    #[test]
    fn a_read_only_file_system_is_named_with_what_to_do() {
        let erofs = || io::Error::from_raw_os_error(30);
        let write = CheckpointError::Write {
            action: "write",
            path: PathBuf::from("state/delta-0000000007.ckpt"),
            source: erofs(),
        }
        .to_string();
        assert!(
            write.contains("state/delta-0000000007.ckpt")
                && write.contains("read-only file system")
                && write.contains("remount it read-write")
                && write.contains("previous checkpoint is left intact")
                && !write.contains("disk space"),
            "{write}"
        );
        let open = CheckpointError::Open {
            action: "create the lock file",
            path: PathBuf::from("state/LOCK"),
            source: erofs(),
        }
        .to_string();
        assert!(
            open.contains("state/LOCK")
                && open.contains("read-only file system")
                && open.contains("remount it read-write")
                && !open.contains("previous checkpoint")
                && !open.contains("disk space"),
            "{open}"
        );
    }

    #[test]
    fn a_state_directory_that_is_a_file_says_so() {
        let at = |path: &str, file: &str| {
            CheckpointError::NotADirectory {
                path: PathBuf::from(path),
                file: PathBuf::from(file),
            }
            .to_string()
        };
        assert_eq!(
            at("s", "s"),
            "--state-dir s is a file, not a directory; give --state-dir a directory (it is created when missing), or move the file away"
        );
        assert_eq!(
            at("f/s", "f"),
            "--state-dir f/s cannot be created: f is a file, not a directory; give --state-dir a path that is not under a file"
        );
    }
}
