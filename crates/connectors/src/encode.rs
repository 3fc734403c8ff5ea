//! The output records (docs/semantics.md S-16, S-9, S-14, S-6), encoded as JSON lines
//! into a batch buffer that is written out in large blocks.

use crate::output::OutputTarget;
use sessionizer_core::json::write_json_string;
use sessionizer_core::timefmt::write_rfc3339_ms;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::{Emit, SessionView, session_id};
use std::io::{self, Write};

const FLUSH_AT: usize = 1 << 16;

/// The members a session record may have besides its aggregates: an aggregate named
/// like one of them would make a record with a member twice (or a table with a column
/// twice), so it is refused.
pub const FIXED_FIELDS: [&str; 9] = [
    "key",
    "session_id",
    "start",
    "end",
    "duration_ms",
    "event_count",
    "revision",
    "complete",
    "retract",
];

/// An error writing an output, naming it.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {name}: {source}")]
pub struct OutputError {
    /// The output's display name ([`OutputTarget::display_name`]).
    pub name: String,
    /// The underlying I/O error.
    #[source]
    pub source: io::Error,
}

/// Where a [`RecordWriter`]'s bytes go once opened. Regular files are kept as files so
/// that a checkpoint can sync them and know their length.
enum Sink {
    File(std::fs::File),
    Stream(Box<dyn Write + Send>),
    /// Session records as Parquet files in a directory, which the records are read back
    /// into (`--output-format parquet`).
    #[cfg(feature = "parquet")]
    Parquet(Box<crate::parquet::ParquetFiles>),
    /// Session records appended to a Delta Lake table, as Parquet data files
    /// committed with the checkpoints.
    #[cfg(feature = "delta")]
    Delta(Box<crate::delta::DeltaOutput>),
}

impl Sink {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::File(f) => f.write_all(bytes),
            Sink::Stream(w) => w.write_all(bytes),
            #[cfg(feature = "parquet")]
            Sink::Parquet(p) => p.write(bytes).map(drop).map_err(io::Error::other),
            #[cfg(feature = "delta")]
            Sink::Delta(d) => d.write(bytes).map(drop).map_err(io::Error::other),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::File(f) => f.flush(),
            Sink::Stream(w) => w.flush(),
            // Rows become a row group when there are enough of them, a file at the
            // checkpoint.
            #[cfg(feature = "parquet")]
            Sink::Parquet(_) => Ok(()),
            #[cfg(feature = "delta")]
            Sink::Delta(_) => Ok(()),
        }
    }
}

/// What a Parquet output is opened with, and the epoch it staged last.
#[cfg(feature = "parquet")]
struct ParquetSetup {
    schema: crate::parquet::SessionSchema,
    options: crate::parquet::ParquetOptions,
    staged: Option<crate::parquet::Staged>,
}

/// A JSON-lines output: records are encoded into `buf` and written in blocks. The
/// target is opened on the first write unless [`open`](Self::open) is called first, so
/// that side outputs nobody needed leave no empty file behind.
pub struct RecordWriter {
    target: OutputTarget,
    out: Option<Sink>,
    /// Encoded records not yet written.
    pub buf: Vec<u8>,
    records: u64,
    /// Bytes in the target: its length when opened plus everything written since.
    written: u64,
    /// A write, flush or sync failed: how much of the buffer reached the target is not
    /// known, so nothing more is written (a checkpoint's recovery cuts back instead).
    failed: bool,
    /// Records written as Parquet files into the target directory instead.
    #[cfg(feature = "parquet")]
    parquet: Option<Box<ParquetSetup>>,
    /// Records appended to the Delta table in the target directory instead: the
    /// table's columns.
    #[cfg(feature = "delta")]
    delta: Option<(crate::parquet::SessionSchema, Option<std::time::Duration>)>,
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
    /// A writer to `target`, which is not opened yet.
    pub fn new(target: OutputTarget) -> RecordWriter {
        RecordWriter {
            target,
            out: None,
            buf: Vec::with_capacity(FLUSH_AT * 2),
            records: 0,
            written: 0,
            failed: false,
            #[cfg(feature = "parquet")]
            parquet: None,
            #[cfg(feature = "delta")]
            delta: None,
        }
    }

    /// A writer of session records as Parquet files into the directory `target`
    /// (created if needed), opened with [`open_staged`](Self::open_staged).
    #[cfg(feature = "parquet")]
    pub fn parquet(
        target: OutputTarget,
        schema: crate::parquet::SessionSchema,
        options: crate::parquet::ParquetOptions,
    ) -> RecordWriter {
        let mut w = RecordWriter::new(target);
        w.parquet = Some(Box::new(ParquetSetup {
            schema,
            options,
            staged: None,
        }));
        w
    }

    /// A writer of session records into the Delta table in the directory `target`,
    /// opened with [`open_delta`](Self::open_delta), committing to the table at most
    /// every `commit_every` (`None`: at every checkpoint).
    #[cfg(feature = "delta")]
    pub fn delta(
        target: OutputTarget,
        schema: crate::parquet::SessionSchema,
        commit_every: Option<std::time::Duration>,
    ) -> RecordWriter {
        let mut w = RecordWriter::new(target);
        w.delta = Some((schema, commit_every));
        w
    }

    /// Whether the records become visible only when a checkpoint commits them (files
    /// staged under temporary names: Parquet; data files a table commit names: Delta).
    pub fn is_staged(&self) -> bool {
        #[cfg(feature = "parquet")]
        if self.parquet.is_some() {
            return true;
        }
        self.is_delta()
    }

    /// Whether the records go to a Delta table.
    pub fn is_delta(&self) -> bool {
        #[cfg(feature = "delta")]
        if self.delta.is_some() {
            return true;
        }
        false
    }

    /// Opens a Delta table output to write epoch `epoch` on, for job `job` (its
    /// instance id): the table is created if missing, and brought back to the
    /// checkpoint that recorded `committed` (see [`crate::delta`]).
    #[cfg(feature = "delta")]
    pub fn open_delta(
        &mut self,
        epoch: u64,
        job: &str,
        committed: Option<&crate::delta::DeltaEpoch>,
    ) -> Result<crate::delta::Recovered, OutputError> {
        let OutputTarget::File(dir) = &self.target else {
            return Err(self.error(io::Error::other(
                "a Delta table is a directory, not stdout or stderr",
            )));
        };
        let Some((schema, commit_every)) = &self.delta else {
            return Err(self.error(io::Error::other("not a Delta table output")));
        };
        // The table's location (a directory or an s3:// URL) as the user gave it.
        let location = dir.to_string_lossy();
        let (mut output, found) =
            crate::delta::DeltaOutput::open(&location, schema.clone(), job, epoch, committed)
                .map_err(|e| self.error(io::Error::other(e)))?;
        output.set_commit_interval(*commit_every);
        self.out = Some(Sink::Delta(Box::new(output)));
        Ok(found)
    }

    /// The next epoch of a Delta table output is the run's last: it commits to the
    /// table whatever the commit interval.
    #[cfg(feature = "delta")]
    pub fn finish_delta(&mut self) {
        if let Some(Sink::Delta(table)) = &mut self.out {
            table.finish();
        }
    }

    /// Phase one of epoch `epoch` of a Delta table output: everything buffered is
    /// written, the epoch's data files are closed, synced and listed.
    #[cfg(feature = "delta")]
    pub fn prepare_delta(&mut self, epoch: u64) -> Result<crate::delta::DeltaEpoch, OutputError> {
        self.write_buffer()?;
        let prepared = match &mut self.out {
            Some(Sink::Delta(table)) => table.prepare(epoch),
            _ => return Err(self.error(io::Error::other("the Delta table is not open"))),
        };
        prepared.map_err(|e| {
            self.failed = true;
            self.error(io::Error::other(e))
        })
    }

    /// Phase two: the epoch prepared last is committed to the Delta table.
    #[cfg(feature = "delta")]
    pub fn commit_delta(&mut self) -> Result<(), OutputError> {
        match &mut self.out {
            Some(Sink::Delta(table)) => table
                .commit()
                .map(drop)
                .map_err(|e| error(&self.target, io::Error::other(e))),
            _ => Ok(()),
        }
    }

    /// Opens a Parquet output to write epoch `epoch` on: the directory is brought back
    /// to the checkpoint `committed` (its files renamed if they were not yet, every
    /// other temporary file deleted, and the final files of later epochs — or of any
    /// epoch without a checkpoint: an earlier run's — deleted, as a JSON-lines file is
    /// cut back or emptied). Returns the files deleted.
    #[cfg(feature = "parquet")]
    pub fn open_staged(
        &mut self,
        epoch: u64,
        committed: Option<&crate::parquet::Staged>,
    ) -> Result<Vec<String>, OutputError> {
        use crate::parquet::ParquetFiles;
        let OutputTarget::File(dir) = &self.target else {
            return Err(self.error(io::Error::other(
                "Parquet files go to a directory, not to stdout or stderr",
            )));
        };
        let dir = dir.clone();
        let Some(setup) = &self.parquet else {
            return Err(self.error(io::Error::other("not a Parquet output")));
        };
        std::fs::create_dir_all(&dir).map_err(|e| self.error(e))?;
        let found =
            ParquetFiles::recover(&dir, committed).map_err(|e| self.error(io::Error::other(e)))?;
        for later in &found.later {
            let path = dir.join(later);
            std::fs::remove_file(&path).map_err(|e| self.error(e))?;
        }
        let files = ParquetFiles::new(&dir, setup.schema.clone(), setup.options.clone(), epoch)
            .map_err(|e| self.error(io::Error::other(e)))?;
        self.out = Some(Sink::Parquet(Box::new(files)));
        let mut gone = found.deleted;
        gone.extend(found.later);
        Ok(gone)
    }

    /// Phase one of epoch `epoch` of a Parquet output: everything buffered is written,
    /// the epoch's files are closed, synced and staged.
    #[cfg(feature = "parquet")]
    pub fn prepare_staged(&mut self, epoch: u64) -> Result<crate::parquet::Staged, OutputError> {
        self.write_buffer()?;
        let staged = match &mut self.out {
            Some(Sink::Parquet(files)) => files.prepare(epoch),
            _ => return Err(self.error(io::Error::other("the Parquet output is not open"))),
        };
        let staged = staged.map_err(|e| {
            self.failed = true;
            self.error(io::Error::other(e))
        })?;
        if let Some(setup) = &mut self.parquet {
            setup.staged = Some(staged.clone());
        }
        Ok(staged)
    }

    /// Phase two: the epoch staged last becomes visible (its files renamed).
    #[cfg(feature = "parquet")]
    pub fn commit_staged(&mut self) -> Result<(), OutputError> {
        let staged = self.parquet.as_mut().and_then(|s| s.staged.take());
        match (&self.out, staged) {
            (Some(Sink::Parquet(files)), Some(staged)) => files
                .commit(&staged)
                .map_err(|e| error(&self.target, io::Error::other(e))),
            _ => Ok(()),
        }
    }

    /// The open epoch of a Delta table output, prepared and committed at once: the end
    /// of a run without checkpoints.
    #[cfg(feature = "delta")]
    pub fn end_delta(&mut self) -> Result<(), OutputError> {
        let epoch = match &mut self.out {
            Some(Sink::Delta(table)) => {
                table.finish();
                table.epoch()
            }
            _ => return Ok(()),
        };
        self.prepare_delta(epoch)?;
        self.commit_delta()
    }

    /// Drops the open epoch of a Delta table output: what was buffered, and the data
    /// files written for it (a run without checkpoints that did not end).
    #[cfg(feature = "delta")]
    pub fn abort_delta(&mut self) -> Result<(), OutputError> {
        self.buf.clear();
        match &mut self.out {
            Some(Sink::Delta(table)) => table
                .abort()
                .map_err(|e| error(&self.target, io::Error::other(e))),
            _ => Ok(()),
        }
    }

    /// The open epoch of a Parquet output, staged and committed at once: the end of a
    /// run without checkpoints.
    #[cfg(feature = "parquet")]
    pub fn end_staged(&mut self) -> Result<(), OutputError> {
        let epoch = match &self.out {
            Some(Sink::Parquet(files)) => files.epoch(),
            _ => return Ok(()),
        };
        self.prepare_staged(epoch)?;
        self.commit_staged()
    }

    /// Where the records go.
    pub fn target(&self) -> &OutputTarget {
        &self.target
    }

    /// Opens (creates or truncates) the target now.
    pub fn open(&mut self) -> Result<(), OutputError> {
        if self.is_delta() && self.out.is_none() {
            return Err(self.error(io::Error::other(
                "a Delta table is written with checkpoints only (exactly once): give a state directory",
            )));
        }
        #[cfg(feature = "parquet")]
        if self.parquet.is_some() && self.out.is_none() {
            // A run without a checkpoint: the directory starts empty at epoch 1.
            return self.open_staged(1, None).map(drop);
        }
        if self.out.is_none() {
            let sink = match &self.target {
                OutputTarget::File(p) => {
                    let f = crate::output::open_locked(p, true).map_err(|e| self.error(e))?;
                    if is_regular(&f) {
                        Sink::File(f)
                    } else {
                        Sink::Stream(Box::new(f))
                    }
                }
                other => Sink::Stream(other.open().map_err(|e| self.error(e))?),
            };
            self.out = Some(sink);
            self.written = 0;
        }
        Ok(())
    }

    /// Opens a file target to continue after its first `committed` bytes: anything after
    /// them (written after the last checkpoint by a run that then died) is cut off, and
    /// new records are appended. A missing file counts as empty; a file shorter than
    /// `committed` was changed by someone else, and continuing it would not give the
    /// output of an uninterrupted run, so that is an error. Devices and other
    /// non-regular files are opened for writing as they are.
    pub fn open_at(&mut self, committed: u64) -> Result<(), OutputError> {
        let OutputTarget::File(p) = &self.target else {
            return self.open();
        };
        let f = crate::output::open_locked(p, false).map_err(|e| self.error(e))?;
        if !is_regular(&f) {
            self.out = Some(Sink::Stream(Box::new(f)));
            return Ok(());
        }
        let len = f.metadata().map_err(|e| self.error(e))?.len();
        if len < committed {
            return Err(self.error(io::Error::other(format!(
                "the file is {len} bytes, shorter than the {committed} bytes committed by the checkpoint: it was changed outside sessionizer, so the run cannot continue it exactly; restore the file, or start over with an empty state directory"
            ))));
        }
        let mut f = f;
        f.set_len(committed).map_err(|e| self.error(e))?;
        io::Seek::seek(&mut f, io::SeekFrom::Start(committed)).map_err(|e| self.error(e))?;
        self.out = Some(Sink::File(f));
        self.written = committed;
        Ok(())
    }

    /// Writes everything buffered and makes it durable: a file is synced to disk and its
    /// committed length returned (what a checkpoint records); stdout and stderr are only
    /// flushed (at least once: a recovery cannot take back what they printed), `None`.
    pub fn commit(&mut self) -> Result<Option<u64>, OutputError> {
        let synced = match self.prepare_commit()? {
            Some(pending) => pending.sync().map(Some),
            None => Ok(None),
        };
        // After a failed sync the kernel may have dropped the pages: a later sync that
        // succeeds would not make them durable.
        self.failed |= synced.is_err();
        synced
    }

    /// The first half of [`commit`](Self::commit): writes everything buffered and notes
    /// the length, returning what is left to make it durable — a sync that another
    /// thread may run while this writer goes on appending (the sync then covers more
    /// than the committed length, which is harmless: recovery cuts back to it). `None`
    /// for stdout and stderr, which are only flushed.
    pub fn prepare_commit(&mut self) -> Result<Option<PendingSync>, OutputError> {
        self.finish()?;
        match &self.out {
            Some(Sink::File(f)) => Ok(Some(PendingSync {
                name: self.target.display_name(),
                file: Some(f.try_clone().map_err(|e| error(&self.target, e))?),
                len: self.written,
            })),
            None if matches!(self.target, OutputTarget::File(_)) => Ok(Some(PendingSync {
                name: self.target.display_name(),
                file: None,
                len: self.written,
            })),
            _ => Ok(None),
        }
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
        if let Some(out) = &mut self.out {
            let flushed = out.flush();
            self.failed |= flushed.is_err();
            flushed.map_err(|e| error(&self.target, e))?;
        }
        Ok(())
    }

    fn write_buffer(&mut self) -> Result<(), OutputError> {
        if self.failed {
            // Part of a block may have been written: writing it again would put it in
            // twice, and the length kept here would not be the file's.
            return Err(self.error(io::Error::other(
                "an earlier write to it failed, so what it holds is not known; nothing more is written",
            )));
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        self.open()?;
        if let Some(out) = &mut self.out {
            let wrote = out.write_all(&self.buf);
            self.failed |= wrote.is_err();
            wrote.map_err(|e| error(&self.target, e))?;
            self.written += self.buf.len() as u64;
        }
        self.buf.clear();
        Ok(())
    }

    fn error(&self, source: io::Error) -> OutputError {
        error(&self.target, source)
    }
}

fn is_regular(f: &std::fs::File) -> bool {
    f.metadata().is_ok_and(|m| m.is_file())
}

fn error(target: &OutputTarget, source: io::Error) -> OutputError {
    OutputError {
        name: target.display_name(),
        source,
    }
}

/// A file output's length at a checkpoint, not yet synced to disk.
#[derive(Debug)]
pub struct PendingSync {
    name: String,
    /// A handle on the file (`None`: it was never opened, so nothing to sync).
    file: Option<std::fs::File>,
    len: u64,
}

impl PendingSync {
    /// The committed length this sync makes durable.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the committed length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Syncs the file's data to disk; returns the committed length.
    pub fn sync(&self) -> Result<u64, OutputError> {
        if let Some(f) = &self.file {
            f.sync_data().map_err(|source| OutputError {
                name: self.name.clone(),
                source,
            })?;
        }
        Ok(self.len)
    }
}

/// Encodes sessions and retractions (the operator's [`Emit`]) as JSON lines into `buf`.
#[derive(Debug, Clone)]
pub struct SessionEncoder {
    /// Encoded records not yet taken.
    pub buf: Vec<u8>,
    /// Records encoded into `buf` since it was last taken.
    pub records: u64,
    /// `,"name":` of each aggregate, pre-encoded.
    agg_prefixes: Vec<Vec<u8>>,
    with_complete: bool,
    with_revision: bool,
    retractions: u64,
}

impl SessionEncoder {
    /// `agg_names` are the output names of the aggregates in order. The record's fields
    /// follow the emit mode, and are the same for every record of a run: `--emit
    /// on-update` adds `complete`; `--emit final` leaves out `revision` (a session is
    /// written once, when it can no longer change).
    pub fn new(agg_names: &[String], emit: sessionizer_window::EmitMode) -> Self {
        use sessionizer_window::EmitMode;
        let agg_prefixes = agg_names
            .iter()
            .map(|n| {
                let mut p = b",".to_vec();
                write_json_string(n.as_bytes(), &mut p);
                p.push(b':');
                p
            })
            .collect();
        SessionEncoder {
            buf: Vec::with_capacity(FLUSH_AT),
            records: 0,
            agg_prefixes,
            with_complete: emit == EmitMode::OnUpdate,
            with_revision: emit != EmitMode::Final,
            retractions: 0,
        }
    }

    /// Retraction records encoded so far (not reset when `buf` is taken).
    pub fn retractions(&self) -> u64 {
        self.retractions
    }
}

fn write_id(key: &[u8], start: EventTime, out: &mut Vec<u8>) {
    out.extend_from_slice(b"\"session_id\":\"");
    let id = session_id(key, start.millis());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((id >> (shift * 4)) & 0xf) as usize]);
    }
    out.push(b'"');
}

fn write_time(name: &[u8], t: EventTime, out: &mut Vec<u8>) {
    out.extend_from_slice(name);
    out.push(b'"');
    write_rfc3339_ms(t, out);
    out.push(b'"');
}

impl Emit for SessionEncoder {
    fn session(&mut self, s: &SessionView<'_>) {
        let out = &mut self.buf;
        let mut num = itoa::Buffer::new();
        out.extend_from_slice(b"{\"key\":");
        write_json_string(s.key, out);
        out.push(b',');
        write_id(s.key, s.start, out);
        write_time(b",\"start\":", s.start, out);
        write_time(b",\"end\":", s.end, out);
        out.extend_from_slice(b",\"duration_ms\":");
        out.extend_from_slice(num.format(s.end.millis() - s.start.millis()).as_bytes());
        out.extend_from_slice(b",\"event_count\":");
        out.extend_from_slice(num.format(s.event_count).as_bytes());
        if self.with_revision {
            out.extend_from_slice(b",\"revision\":");
            out.extend_from_slice(num.format(s.revision).as_bytes());
        }
        if self.with_complete {
            out.extend_from_slice(if s.complete {
                b",\"complete\":true"
            } else {
                b",\"complete\":false"
            });
        }
        for (prefix, agg) in self.agg_prefixes.iter().zip(s.aggregates) {
            out.extend_from_slice(prefix);
            agg.write_json(out);
        }
        out.extend_from_slice(b"}\n");
        self.records += 1;
    }

    fn retraction(&mut self, key: &[u8], start: EventTime) {
        let out = &mut self.buf;
        out.extend_from_slice(b"{\"key\":");
        write_json_string(key, out);
        out.push(b',');
        write_id(key, start, out);
        out.extend_from_slice(b",\"retract\":true}\n");
        self.retractions += 1;
        self.records += 1;
    }
}

/// How a position within an input is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionStyle {
    /// `file:line`, the 1-based line number.
    Line,
    /// `topic/partition@offset`, the record's offset.
    Offset,
}

/// An input as named in dead-letter and late records: a file (`visits.jsonl`, `stdin`)
/// or a Kafka partition (`visits/3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceName {
    /// The display name.
    pub name: String,
    /// How positions within it are written.
    pub style: PositionStyle,
}

impl SourceName {
    /// A file or stdin, whose positions are line numbers.
    pub fn lines(name: impl Into<String>) -> SourceName {
        SourceName {
            name: name.into(),
            style: PositionStyle::Line,
        }
    }

    /// A Kafka partition, whose positions are offsets.
    pub fn partition(topic: &str, partition: i32) -> SourceName {
        SourceName {
            name: format!("{topic}/{partition}"),
            style: PositionStyle::Offset,
        }
    }

    /// The position `at` (a line number or an offset) within this input.
    pub fn pos(&self, at: u64) -> SourcePos<'_> {
        SourcePos {
            name: &self.name,
            at,
            style: self.style,
        }
    }
}

/// Where a record came from: `file:line` or `topic/partition@offset`.
#[derive(Debug, Clone, Copy)]
pub struct SourcePos<'a> {
    /// The input's display name.
    pub name: &'a str,
    /// The 1-based line number, or the offset.
    pub at: u64,
    /// Which of the two `at` is.
    pub style: PositionStyle,
}

impl std::fmt::Display for SourcePos<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sep = match self.style {
            PositionStyle::Line => ':',
            PositionStyle::Offset => '@',
        };
        write!(f, "{}{sep}{}", self.name, self.at)
    }
}

fn write_source(pos: SourcePos<'_>, out: &mut Vec<u8>) {
    let mut s = Vec::with_capacity(pos.name.len() + 12);
    s.extend_from_slice(pos.name.as_bytes());
    s.push(match pos.style {
        PositionStyle::Line => b':',
        PositionStyle::Offset => b'@',
    });
    s.extend_from_slice(itoa::Buffer::new().format(pos.at).as_bytes());
    write_json_string(&s, out);
}

/// `{"reason":..,"source":"file:line","raw":"<the record as read>"}`. A JSON string
/// holds only UTF-8, so when the record is not UTF-8 `raw` has U+FFFD in place of the
/// bad bytes and `"raw_base64"` follows with the exact bytes (standard base64, padded).
pub fn encode_dead_letter(out: &mut Vec<u8>, reason: &str, pos: SourcePos<'_>, raw: &[u8]) {
    out.extend_from_slice(b"{\"reason\":");
    write_json_string(reason.as_bytes(), out);
    out.extend_from_slice(b",\"source\":");
    write_source(pos, out);
    out.extend_from_slice(b",\"raw\":");
    match std::str::from_utf8(raw) {
        Ok(_) => write_json_string(raw, out),
        Err(_) => {
            write_json_string(String::from_utf8_lossy(raw).as_bytes(), out);
            out.extend_from_slice(b",\"raw_base64\":\"");
            out.extend_from_slice(base64_of(raw).as_bytes());
            out.push(b'"');
        }
    }
    out.extend_from_slice(b"}\n");
}

/// The dead-letter `raw_base64` of a record: its exact bytes in standard base64 when
/// they are not UTF-8 (so that `raw`, a JSON string, cannot hold them), else `None`.
pub fn raw_base64(raw: &[u8]) -> Option<String> {
    std::str::from_utf8(raw).is_err().then(|| base64_of(raw))
}

fn base64_of(raw: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(raw)
}

/// `{"reason":..,"source":..,"watermark":..,"behind_watermark_ms":..,"event":<as read>}`.
pub fn encode_late(
    out: &mut Vec<u8>,
    reason: &str,
    pos: SourcePos<'_>,
    watermark: Watermark,
    time: EventTime,
    event: &[u8],
) {
    out.extend_from_slice(b"{\"reason\":\"");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\",\"source\":");
    write_source(pos, out);
    write_time(b",\"watermark\":", watermark.as_time(), out);
    out.extend_from_slice(b",\"behind_watermark_ms\":");
    let behind = watermark.millis().saturating_sub(time.millis());
    out.extend_from_slice(itoa::Buffer::new().format(behind).as_bytes());
    out.extend_from_slice(b",\"event\":");
    out.extend_from_slice(event.trim_ascii());
    out.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 8): bytes that are not UTF-8 were replaced by U+FFFD in `raw`
    /// and lost; `raw_base64` keeps them.
    #[test]
    fn a_dead_letter_of_bytes_that_are_not_utf8_keeps_them_in_raw_base64() {
        let name = SourceName::lines("in.jsonl");
        let pos = name.pos(3);
        let mut out = Vec::new();
        encode_dead_letter(&mut out, "not valid JSON", pos, b"ab\xffc\"");
        let rec: serde_json::Value = serde_json::from_slice(&out).expect("one JSON line");
        assert_eq!(rec["raw"], "ab\u{fffd}c\"");
        assert_eq!(rec["raw_base64"], "YWL/YyI=", "base64 of 61 62 ff 63 22");
        assert_eq!(raw_base64(b"ab\xffc\""), Some("YWL/YyI=".to_string()));

        out.clear();
        encode_dead_letter(&mut out, "not valid JSON", pos, "é\"".as_bytes());
        let rec: serde_json::Value = serde_json::from_slice(&out).expect("one JSON line");
        assert_eq!(rec["raw"], "é\"");
        assert!(rec.get("raw_base64").is_none(), "{rec}");
        assert_eq!(raw_base64("é".as_bytes()), None);
    }

    /// Writes part of its first block, then fails; later writes succeed.
    struct FailsOnce {
        out: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
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
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut w = RecordWriter::new(OutputTarget::Stdout);
        w.out = Some(Sink::Stream(Box::new(FailsOnce {
            out: out.clone(),
            failed: false,
        })));
        w.append(b"{\"a\":1}\n", 1).expect("buffered");
        assert!(w.finish().is_err(), "the first write fails");
        let again = w.finish().expect_err("refused after a failure");
        assert!(again.to_string().contains("an earlier write"), "{again}");
        w.append(b"{\"b\":2}\n", 1).expect("buffered");
        assert!(w.commit().is_err());
        assert_eq!(
            *out.lock().expect("lock"),
            b"{\"a\"".to_vec(),
            "only the half written"
        );
    }

    #[test]
    fn commit_reports_the_synced_length_and_open_at_cuts_back_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.jsonl");
        let mut w = RecordWriter::new(OutputTarget::File(path.clone()));
        w.open().expect("open");
        w.append(b"{\"a\":1}\n", 1).expect("append");
        assert_eq!(w.commit().expect("commit"), Some(8));
        w.append(b"{\"uncommitted\":true}\n", 1).expect("append");
        w.finish().expect("finish");
        drop(w);

        let mut w = RecordWriter::new(OutputTarget::File(path.clone()));
        w.open_at(8).expect("open at");
        w.append(b"{\"b\":2}\n", 1).expect("append");
        assert_eq!(w.commit().expect("commit"), Some(16));
        drop(w);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\"a\":1}\n{\"b\":2}\n"
        );

        let mut w = RecordWriter::new(OutputTarget::File(path.clone()));
        let err = w.open_at(100).expect_err("shorter than committed");
        assert!(
            err.to_string().contains("shorter than the 100 bytes"),
            "{err}"
        );

        let mut w = RecordWriter::new(OutputTarget::Stderr);
        assert_eq!(w.commit().expect("commit"), None, "stderr has no length");
    }
}
