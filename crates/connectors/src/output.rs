//! Output targets: a file or stdout, opened lazily when asked to.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Where one output stream goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// A file, created or truncated when opened.
    File(PathBuf),
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl OutputTarget {
    /// `-` means stdout.
    pub fn parse(s: &str) -> OutputTarget {
        if s == "-" {
            OutputTarget::Stdout
        } else {
            OutputTarget::File(PathBuf::from(s))
        }
    }

    /// How the target is named in messages: the path, `stdout` or `stderr`.
    pub fn display_name(&self) -> String {
        match self {
            OutputTarget::File(p) => p.display().to_string(),
            OutputTarget::Stdout => "stdout".to_string(),
            OutputTarget::Stderr => "stderr".to_string(),
        }
    }

    /// Opens the target for writing (a file is created or truncated, once this
    /// process holds its lock: [`open_locked`]).
    pub fn open(&self) -> io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            OutputTarget::File(p) => Box::new(open_locked(p, true)?),
            OutputTarget::Stdout => Box::new(io::stdout()),
            OutputTarget::Stderr => Box::new(io::stderr()),
        })
    }
}

/// Opens `path` for writing, creating it when missing, and — when it is a regular file
/// — takes an exclusive lock on it for as long as the file stays open (the OS releases
/// it when the process ends, killed or not) before anything is written or cut:
/// `truncate` empties it only once the lock is held. A file another process holds the
/// lock of is refused with an error that says so, so that two runs writing one output
/// cannot interleave their records. Devices, pipes and other files that are not
/// regular are opened as they are, unlocked (`/dev/null` may be shared).
pub fn open_locked(path: &Path, truncate: bool) -> io::Result<File> {
    const LOCK_TRIES: u32 = 50;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Ok(f);
    }
    // A lock this process just released can stay held for a moment by a child being
    // started elsewhere in the process (between its fork and its exec it shares every
    // open file): a holder that keeps it is a writer that is really there.
    let mut tries = 0;
    loop {
        match f.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if tries < LOCK_TRIES => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "another process is writing this file (it holds the file's lock): two runs cannot share an output; give each its own",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    if truncate {
        f.set_len(0)?;
    }
    Ok(f)
}
