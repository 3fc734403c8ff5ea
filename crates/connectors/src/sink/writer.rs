//! [`RecordWriter`]: encoded records buffered and handed in large blocks to the
//! [`Storage`] of one output — the same writer whatever the output's format.

use super::lines::Lines;
use super::{EndOfRun, OutputError, Prepared, Recovered, SinkMark, Storage};
use crate::output::OutputTarget;
use std::io;

/// Bytes buffered before a block is handed to the storage.
const FLUSH_AT: usize = 1 << 16;

/// An output of encoded records (JSON lines): records are encoded into `buf` and
/// handed to the output's [`Storage`] in blocks. A JSON-lines target is opened on the
/// first write unless [`recover`](Self::recover) opened it first, so that side outputs
/// nobody needed leave no empty file behind.
pub struct RecordWriter {
    target: OutputTarget,
    store: Box<dyn Storage>,
    /// Encoded records not yet written.
    pub buf: Vec<u8>,
    records: u64,
    /// A write, flush or prepare failed: how much of the buffer reached the target is
    /// not known, so nothing more is written (a checkpoint's recovery cuts back instead).
    failed: bool,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("target", &self.target)
            .field("buffered", &self.buf.len())
            .field("records", &self.records)
            .finish()
    }
}

impl RecordWriter {
    /// A JSON-lines writer to `target`, which is not opened yet.
    pub fn new(target: OutputTarget) -> RecordWriter {
        let store = Box::new(Lines::new(target.clone()));
        RecordWriter::with_storage(target, store)
    }

    /// A writer whose records go to `store`, an output named `target`.
    pub fn with_storage(target: OutputTarget, store: Box<dyn Storage>) -> RecordWriter {
        RecordWriter {
            target,
            store,
            buf: Vec::with_capacity(FLUSH_AT * 2),
            records: 0,
            failed: false,
        }
    }

    /// Where the records go.
    pub fn target(&self) -> &OutputTarget {
        &self.target
    }

    /// The mark this output made in role `role` among a checkpoint's `marks` (see
    /// [`Storage::find`]).
    pub fn find<'m>(&self, role: &str, marks: &'m [SinkMark]) -> Option<&'m SinkMark> {
        self.store.find(role, marks)
    }

    /// Brings the output back to the checkpoint that recorded `mark` (`None`: the
    /// output starts empty) and opens it for the records of epoch `epoch` (see
    /// [`Storage::recover`]).
    pub fn recover(
        &mut self,
        epoch: u64,
        mark: Option<&SinkMark>,
        job: &mut dyn FnMut() -> io::Result<String>,
    ) -> Result<Recovered, OutputError> {
        self.buf.clear();
        self.failed = false;
        self.store.recover(epoch, mark, job)
    }

    /// Opens the output empty, as a job without a checkpoint does (a JSON-lines file is
    /// created or truncated).
    pub fn open(&mut self) -> Result<(), OutputError> {
        let mut no_job = || {
            Err(io::Error::other(
                "it is written with checkpoints only (exactly once): give a state directory",
            ))
        };
        self.recover(1, None, &mut no_job).map(drop)
    }

    /// Phase one of checkpoint `epoch` for this output in role `role`: everything
    /// buffered is written and the epoch made ready to commit (see [`Storage::prepare`]).
    pub fn prepare(&mut self, epoch: u64, role: &str) -> Result<Option<Prepared>, OutputError> {
        self.write_buffer()?;
        let prepared = self.store.prepare(epoch, role);
        self.failed |= prepared.is_err();
        prepared
    }

    /// Whether the records become visible only when a checkpoint commits them.
    pub fn two_phase(&self) -> bool {
        self.store.two_phase()
    }

    /// Phase two: the epoch prepared last becomes visible.
    pub fn commit(&mut self) -> Result<(), OutputError> {
        self.store.commit()
    }

    /// The next epoch is the run's last (see [`Storage::closing`]).
    pub fn closing(&mut self) {
        self.store.closing();
    }

    /// The end of a run without checkpoints: what was written becomes visible as one
    /// epoch when the run `completed` its input; an output that takes a run's records
    /// only whole drops them otherwise (see [`Storage::end`]).
    pub fn end(&mut self, completed: bool) -> Result<EndOfRun, OutputError> {
        self.write_buffer()?;
        self.store.flush().inspect_err(|_| self.failed = true)?;
        self.store.end(completed)
    }

    /// Appends encoded records (`count` of them) and writes them out once the buffer is
    /// large.
    pub fn append(&mut self, bytes: &[u8], count: u64) -> Result<(), OutputError> {
        self.buf.extend_from_slice(bytes);
        self.records += count;
        self.maybe_flush()
    }

    /// Records appended so far (as counted by the callers of [`append`](Self::append)).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes the buffer out once it is large.
    pub fn maybe_flush(&mut self) -> Result<(), OutputError> {
        if self.buf.len() >= FLUSH_AT {
            self.write_buffer()?;
        }
        Ok(())
    }

    /// Writes everything buffered and flushes the target.
    pub fn finish(&mut self) -> Result<(), OutputError> {
        self.write_buffer()?;
        let flushed = self.store.flush();
        self.failed |= flushed.is_err();
        flushed
    }

    fn write_buffer(&mut self) -> Result<(), OutputError> {
        if self.failed {
            // Part of a block may have been written: writing it again would put it in
            // twice, and the length kept here would not be the file's.
            return Err(OutputError::of(
                &self.target,
                "an earlier write to it failed, so what it holds is not known; nothing more is written",
            ));
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        let wrote = self.store.write(&self.buf);
        self.failed |= wrote.is_err();
        wrote?;
        self.buf.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Writes part of its first block, then fails; later writes succeed.
    struct FailsOnce {
        out: Arc<Mutex<Vec<u8>>>,
        failed: bool,
    }

    impl Write for FailsOnce {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut out = self.out.lock().expect("lock");
            if !self.failed {
                self.failed = true;
                out.extend_from_slice(&buf[..buf.len() / 2]);
                return Err(io::Error::other("no space left"));
            }
            out.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A block that failed half-way is never written again after its first half (which
    /// would leave a broken line and a length that is not the target's): the writer
    /// refuses everything after a failure.
    #[test]
    fn after_a_failed_write_nothing_more_is_written() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let stream = FailsOnce {
            out: out.clone(),
            failed: false,
        };
        let store = Lines::over(OutputTarget::Stdout, Box::new(stream));
        let mut w = RecordWriter::with_storage(OutputTarget::Stdout, Box::new(store));
        w.append(b"{\"a\":1}\n", 1).expect("buffered");
        assert!(w.finish().is_err(), "the first write fails");
        let again = w.finish().expect_err("refused after a failure");
        assert!(again.to_string().contains("an earlier write"), "{again}");
        w.append(b"{\"b\":2}\n", 1).expect("buffered");
        assert!(w.prepare(1, "sessions").is_err());
        assert_eq!(
            *out.lock().expect("lock"),
            b"{\"a\"".to_vec(),
            "only the half written"
        );
    }

    /// The committed length of a prepared file, synced.
    fn committed(w: &mut RecordWriter, epoch: u64) -> (SinkMark, u64) {
        let prepared = w
            .prepare(epoch, "sessions")
            .expect("prepared")
            .expect("a file");
        let len = prepared.sync.expect("a sync").sync().expect("synced");
        (prepared.mark, len)
    }

    #[test]
    fn a_file_is_recovered_to_the_length_its_mark_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.jsonl");
        let mut no_job = || -> io::Result<String> { unreachable!("a file needs no job") };
        let mut w = RecordWriter::new(OutputTarget::File(path.clone()));
        w.open().expect("open");
        w.append(b"{\"a\":1}\n", 1).expect("append");
        let (mark, len) = committed(&mut w, 1);
        assert_eq!(len, 8);
        w.append(b"{\"uncommitted\":true}\n", 1).expect("append");
        w.finish().expect("finish");
        drop(w);

        let marks = vec![mark];
        let mut w = RecordWriter::new(OutputTarget::File(path.clone()));
        assert!(w.find("late", &marks).is_none(), "another role's output");
        let found = w.find("sessions", &marks).cloned();
        assert!(found.is_some());
        w.recover(2, found.as_ref(), &mut no_job).expect("cut back");
        w.append(b"{\"b\":2}\n", 1).expect("append");
        assert_eq!(committed(&mut w, 2).1, 16);
        drop(w);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\"a\":1}\n{\"b\":2}\n"
        );

        let longer = SinkMark::File(crate::sink::OutputCommit {
            role: "sessions".into(),
            path: path.display().to_string(),
            committed_bytes: 100,
        });
        let mut w = RecordWriter::new(OutputTarget::File(path.clone()));
        let err = w
            .recover(3, Some(&longer), &mut no_job)
            .expect_err("shorter than committed");
        assert!(
            err.to_string().contains("shorter than the 100 bytes"),
            "{err}"
        );

        let mut w = RecordWriter::new(OutputTarget::Stderr);
        assert!(
            w.prepare(1, "sessions").expect("flushed").is_none(),
            "stderr has no length"
        );
    }
}
