//! Where a job's outputs go: sessions, late events, dead letters.
//!
//! A [`Sink`] takes items one at a time. Closures, vectors and std channels are sinks;
//! [`JsonLinesSink`] writes any serde type as JSON lines through the command line's
//! output writer (files or stdout, buffered in blocks).

use crate::api::checkpoints::{Checkpoints, StateError};
use crate::api::joined::SharedWriter;
pub use crate::error::SinkError;
use serde::Serialize;
use sessionizer_connectors::RecordWriter;
use std::path::PathBuf;
use std::sync::mpsc;

/// Where a [`JsonLinesSink`] writes: a file, stdout or stderr (also in the prelude).
pub use sessionizer_connectors::OutputTarget;

/// A destination for items of type `T`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a sink of `{T}`",
    label = "this cannot take `{T}` items",
    note = "a sink is a `Vec<{T}>` (or `&mut Vec<{T}>`), a closure `FnMut({T})`, a std `Sender<{T}>`, a `JsonLinesSink` (for serde types), or your own `impl Sink<{T}>`"
)]
///
/// ```
/// use sessionizer::sink::Sink;
///
/// let mut seen = Vec::new();
/// let mut to_vec: Vec<u32> = Vec::new();
/// let mut closure = |x: u32| seen.push(x * 10);
/// to_vec.send(1).expect("a vector never refuses");
/// closure.send(2).expect("a closure never refuses");
/// assert_eq!(to_vec, [1]);
/// assert_eq!(seen, [20]);
/// ```
pub trait Sink<T> {
    /// Takes one item.
    fn send(&mut self, item: T) -> Result<(), SinkError>;

    /// Writes out what is buffered (the end of a run calls it).
    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

impl<T, F: FnMut(T)> Sink<T> for F {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self(item);
        Ok(())
    }
}

impl<T> Sink<T> for Vec<T> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.push(item);
        Ok(())
    }
}

/// Lets a job fill a vector the caller keeps using (a source's dead letters, say).
impl<T> Sink<T> for &mut Vec<T> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.push(item);
        Ok(())
    }
}

impl<T> Sink<T> for mpsc::Sender<T> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        mpsc::Sender::send(self, item).map_err(|_| SinkError::Closed)
    }
}

/// Blocks while the channel is full: the job slows down to the consumer's pace.
impl<T> Sink<T> for mpsc::SyncSender<T> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        mpsc::SyncSender::send(self, item).map_err(|_| SinkError::Closed)
    }
}

/// Writes items as JSON lines to a file or stdout, through the command line's
/// [`RecordWriter`] (records are buffered and written in large blocks; call
/// [`Sink::flush`] at the end).
///
/// ```
/// use sessionizer::prelude::*;
///
/// let dir = tempfile::tempdir().expect("temp dir");
/// let path = dir.path().join("out.jsonl");
/// let mut sink = JsonLinesSink::file(&path);
/// sink.send(serde_json::json!({"key": "v1", "pages": 3})).expect("encoded");
/// sink.flush().expect("written");
/// assert_eq!(std::fs::read_to_string(path).expect("read"), "{\"key\":\"v1\",\"pages\":3}\n");
/// ```
///
/// [`exactly_once`](Self::exactly_once) opens a file whose committed length is kept by
/// the job's [`Checkpoints`]: a restarted job cuts off what was written after its last
/// checkpoint and writes it again, so the file holds every record once.
#[derive(Debug)]
pub struct JsonLinesSink {
    writer: Writer,
    line: Vec<u8>,
}

/// The writer of a sink: its own, or one it shares with the checkpoints that commit it.
#[derive(Debug)]
enum Writer {
    Own(RecordWriter),
    Committed(SharedWriter),
}

impl Writer {
    fn with<R>(&mut self, f: impl FnOnce(&mut RecordWriter) -> R) -> R {
        match self {
            Writer::Own(w) => f(w),
            Writer::Committed(shared) => f(&mut shared.lock()),
        }
    }
}

impl JsonLinesSink {
    /// A sink writing to `target` (created or truncated on the first write).
    pub fn new(target: OutputTarget) -> Self {
        JsonLinesSink {
            writer: Writer::Own(RecordWriter::new(target)),
            line: Vec::new(),
        }
    }

    /// A file written exactly once across restarts: its length is committed with each
    /// of the job's checkpoints (the file synced to disk first), and a job restored from
    /// `checkpoints` continues the file from the length its checkpoint committed,
    /// cutting off anything written after it (by a process that then died). Without a
    /// checkpoint the file is emptied.
    ///
    /// Open it before [`restore`](crate::api::windowed::SessionWindowJob::restore), as the
    /// state directory's other outputs: a checkpoint names the files it committed, and
    /// a restore is refused while one of them is not open. Read the input with
    /// [`JsonLines::resume`](crate::api::source::JsonLines::resume) (or skip
    /// [`Resumed::events`](crate::api::checkpoints::Resumed::events) of a replayable source
    /// whose dead letters go elsewhere: those of the skipped lines would come again) so
    /// that the records are produced again from where the checkpoint stood. A write or
    /// sync that fails stops the checkpoints: a restart continues from the last one.
    pub fn exactly_once(
        path: impl Into<PathBuf>,
        checkpoints: &mut Checkpoints,
    ) -> Result<Self, StateError> {
        let shared = checkpoints.join_file(path.into())?;
        Ok(JsonLinesSink {
            writer: Writer::Committed(shared),
            line: Vec::new(),
        })
    }

    /// A sink writing to the file at `path` (created or truncated on the first write).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::new(OutputTarget::File(path.into()))
    }

    /// A sink writing to standard output.
    pub fn stdout() -> Self {
        Self::new(OutputTarget::Stdout)
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        match &self.writer {
            Writer::Own(w) => w.records(),
            Writer::Committed(shared) => shared.lock().records(),
        }
    }

    /// Writes out everything buffered and flushes the target.
    pub fn flush(&mut self) -> Result<(), SinkError> {
        self.writer.with(RecordWriter::finish)?;
        Ok(())
    }
}

impl<T: Serialize> Sink<T> for JsonLinesSink {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &item)?;
        self.line.push(b'\n');
        let line = &self.line;
        self.writer.with(|w| w.append(line, 1))?;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        JsonLinesSink::flush(self)
    }
}

/// Lets a source or a job write into a sink the caller keeps using.
impl<T: Serialize> Sink<T> for &mut JsonLinesSink {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        Sink::<T>::send(&mut **self, item)
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        JsonLinesSink::flush(self)
    }
}
