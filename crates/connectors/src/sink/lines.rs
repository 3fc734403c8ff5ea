//! JSON lines in a file, on stdout or on stderr: the output every job has.
//!
//! A regular file is exactly once with the checkpoints: a checkpoint records its
//! length (its fsync runs on the committer's thread), and recovery cuts it back to that
//! length. A stream (stdout, stderr, a pipe or device) is only flushed: at least once.

use super::{EndOfRun, OutputCommit, OutputError, PendingSync, Prepared, Recovered};
use super::{SinkMark, Storage};
use crate::output::OutputTarget;
use std::io::{self, Write};

enum Out {
    File(std::fs::File),
    Stream(Box<dyn Write + Send>),
}

/// The JSON-lines [`Storage`] of one target.
pub(crate) struct Lines {
    target: OutputTarget,
    out: Option<Out>,
    /// Bytes in the target: its length when opened plus everything written since.
    written: u64,
}

impl Lines {
    /// A target not opened yet.
    pub(crate) fn new(target: OutputTarget) -> Lines {
        Lines {
            target,
            out: None,
            written: 0,
        }
    }

    /// Lines going to an open stream.
    #[cfg(test)]
    pub(crate) fn over(target: OutputTarget, stream: Box<dyn Write + Send>) -> Lines {
        Lines {
            target,
            out: Some(Out::Stream(stream)),
            written: 0,
        }
    }

    fn error(&self, source: io::Error) -> OutputError {
        OutputError {
            name: self.target.display_name(),
            source,
        }
    }

    /// Opens (creates or truncates) the target.
    fn open_empty(&mut self) -> Result<(), OutputError> {
        let out = match &self.target {
            OutputTarget::File(p) => {
                let f = crate::output::open_locked(p, true).map_err(|e| self.error(e))?;
                if is_regular(&f) {
                    Out::File(f)
                } else {
                    Out::Stream(Box::new(f))
                }
            }
            other => Out::Stream(other.open().map_err(|e| self.error(e))?),
        };
        self.out = Some(out);
        self.written = 0;
        Ok(())
    }

    /// Opens a file target to continue after its first `committed` bytes: anything
    /// after them (written after the last checkpoint by a run that then died) is cut
    /// off. A missing file counts as empty; a file shorter than `committed` was changed
    /// by someone else, and continuing it would not give the output of an uninterrupted
    /// run, so that is an error. Devices and other non-regular files are opened for
    /// writing as they are.
    fn open_at(&mut self, committed: u64) -> Result<(), OutputError> {
        let OutputTarget::File(p) = &self.target else {
            return self.open_empty();
        };
        let mut f = crate::output::open_locked(p, false).map_err(|e| self.error(e))?;
        if !is_regular(&f) {
            self.out = Some(Out::Stream(Box::new(f)));
            return Ok(());
        }
        let len = f.metadata().map_err(|e| self.error(e))?.len();
        if len < committed {
            return Err(self.error(io::Error::other(format!(
                "the file is {len} bytes, shorter than the {committed} bytes committed by the checkpoint: it was changed outside sessionizer, so the run cannot continue it exactly; restore the file, or start over with an empty state directory"
            ))));
        }
        f.set_len(committed).map_err(|e| self.error(e))?;
        io::Seek::seek(&mut f, io::SeekFrom::Start(committed)).map_err(|e| self.error(e))?;
        self.out = Some(Out::File(f));
        self.written = committed;
        Ok(())
    }

    fn path_text(&self) -> Option<String> {
        match &self.target {
            OutputTarget::File(p) => Some(p.display().to_string()),
            _ => None,
        }
    }
}

impl Storage for Lines {
    fn find<'m>(&self, role: &str, marks: &'m [SinkMark]) -> Option<&'m SinkMark> {
        let path = self.path_text()?;
        marks
            .iter()
            .find(|m| matches!(m, SinkMark::File(c) if c.role == role && c.path == path))
    }

    fn recover(
        &mut self,
        _epoch: u64,
        mark: Option<&SinkMark>,
        _job: &mut dyn FnMut() -> io::Result<String>,
    ) -> Result<Recovered, OutputError> {
        match mark {
            Some(SinkMark::File(c)) => self.open_at(c.committed_bytes)?,
            Some(other) => {
                return Err(self.error(io::Error::other(format!(
                    "the checkpoint recorded it as another kind of output ({other:?})"
                ))));
            }
            None => self.open_empty()?,
        }
        Ok(Recovered {
            found: mark.is_some(),
            ..Recovered::default()
        })
    }

    fn write(&mut self, records: &[u8]) -> Result<(), OutputError> {
        if self.out.is_none() {
            self.open_empty()?;
        }
        let wrote = match self.out.as_mut().expect("opened") {
            Out::File(f) => f.write_all(records),
            Out::Stream(w) => w.write_all(records),
        };
        wrote.map_err(|e| self.error(e))?;
        self.written += records.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), OutputError> {
        let flushed = match &mut self.out {
            Some(Out::File(f)) => f.flush(),
            Some(Out::Stream(w)) => w.flush(),
            None => Ok(()),
        };
        flushed.map_err(|e| self.error(e))
    }

    /// Flushes and notes the length: what is left to make it durable is a sync that
    /// another thread may run while more is appended (the sync then covers more than
    /// the committed length, which is harmless: recovery cuts back to it). A stream has
    /// no length a checkpoint could record: `None`.
    fn prepare(&mut self, _epoch: u64, role: &str) -> Result<Option<Prepared>, OutputError> {
        self.flush()?;
        let Some(path) = self.path_text() else {
            return Ok(None);
        };
        let file = match &self.out {
            Some(Out::File(f)) => Some(f.try_clone().map_err(|e| self.error(e))?),
            // Never written: nothing to sync, the committed length is 0.
            None => None,
            Some(Out::Stream(_)) => return Ok(None),
        };
        let sync = PendingSync {
            name: self.target.display_name(),
            file,
            len: self.written,
        };
        Ok(Some(Prepared {
            mark: SinkMark::File(OutputCommit {
                role: role.to_string(),
                path,
                committed_bytes: self.written,
            }),
            sync: Some(sync),
        }))
    }

    fn end(&mut self, _completed: bool) -> Result<EndOfRun, OutputError> {
        Ok(EndOfRun::Visible)
    }
}

fn is_regular(f: &std::fs::File) -> bool {
    f.metadata().is_ok_and(|m| m.is_file())
}
