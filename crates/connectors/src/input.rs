//! Line-oriented input over several sources read one after another.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One input: a file, standard input, or a Delta table's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSource {
    /// A file, read from its start (or from a checkpoint's offset).
    File(PathBuf),
    /// Standard input.
    Stdin,
    /// The rows of the Delta table at this location (a directory or `s3://bucket/path`)
    /// as JSON lines, in the order its commits added them (from a checkpoint's row on);
    /// needs the cargo feature `delta`.
    Delta(String),
}

impl InputSource {
    /// `-` means standard input.
    pub fn parse(s: &str) -> InputSource {
        if s == "-" {
            InputSource::Stdin
        } else {
            InputSource::File(PathBuf::from(s))
        }
    }

    /// How records from this input are named in dead-letter and late records.
    pub fn display_name(&self) -> String {
        match self {
            InputSource::File(p) => p.display().to_string(),
            InputSource::Stdin => "stdin".to_string(),
            InputSource::Delta(location) => location.clone(),
        }
    }
}

/// An error reading an input, naming it.
#[derive(Debug, thiserror::Error)]
#[error("cannot read input {name}: {source}")]
pub struct InputError {
    /// The input's display name ([`InputSource::display_name`]).
    pub name: String,
    /// The underlying I/O error.
    #[source]
    pub source: io::Error,
}

/// Where one record of a [`Batch`] sits in the batch, and where it was read.
///
/// `input` and `at` are the record's position, as data: the input it came from (an
/// index into the reader's names: the files in the order given, or the Kafka
/// partitions a task reads) and its place there — a file's 1-based line number, or a
/// partition's offset. How a position is shown is the input's own
/// ([`SourceName::pos`](crate::encode::SourceName::pos): `file:line`,
/// `topic/partition@offset`); nothing else reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineSpan {
    /// Start of the line's byte range in [`Batch::data`], without the line terminator (`\n` or `\r\n`).
    pub start: u32,
    /// End of the byte range in [`Batch::data`] (exclusive).
    pub end: u32,
    /// Index of the input in the order given.
    pub input: u32,
    /// The record's place in its input: a line number (from 1), or an offset.
    pub at: u64,
}

/// How far the inputs have been consumed: everything before `offset` in input `input`
/// (and every input before it) was handed out as whole lines. A checkpoint records it;
/// [`Inputs::starting_at`] resumes from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadPosition {
    /// Index of the input in the order given.
    pub input: u32,
    /// Bytes of that input consumed: just after the last whole line handed out.
    pub offset: u64,
    /// Lines of that input handed out (the number of the last one).
    pub line_no: u64,
}

/// The default largest record (`--max-record-size`): 16 MiB.
pub const DEFAULT_MAX_RECORD: usize = 16 << 20;

/// The largest `--max-record-size` accepted: a batch's positions are 32-bit, and a line
/// is read in reads that double with it, so a record never takes more than about twice
/// the limit.
pub const MAX_RECORD_LIMIT: usize = 1 << 30;

/// Bytes of a record longer than the limit that are kept for its dead letter.
pub const RECORD_HEAD: usize = 1024;

/// A record longer than the record size limit: only its first bytes are in the batch
/// (the line's span), the rest was skipped as it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversized {
    /// Index of the record in [`Batch::lines`].
    pub line: u32,
    /// Its whole length in bytes.
    pub len: u64,
}

/// Why a record longer than the limit is invalid: the dead-letter reason.
pub fn too_large_reason(len: u64, limit: usize) -> String {
    format!(
        "record too large: {len} bytes, above the limit of {limit} bytes (--max-record-size); raw holds its first bytes"
    )
}

/// The first bytes of a record longer than the limit: at most [`RECORD_HEAD`], cut
/// before a UTF-8 sequence rather than inside it.
pub fn record_head(bytes: &[u8]) -> &[u8] {
    if bytes.len() <= RECORD_HEAD {
        return bytes;
    }
    let mut end = RECORD_HEAD;
    // Up to three continuation bytes (10xxxxxx) may follow the cut.
    while end > RECORD_HEAD - 3 && bytes[end] & 0xc0 == 0x80 {
        end -= 1;
    }
    &bytes[..end]
}

/// A block of whole lines read from the inputs, owned, so that workers can decode them
/// in parallel. Only the bytes covered by `lines` are meaningful in `data`.
#[derive(Debug, Default)]
pub struct Batch {
    /// The bytes read; a buffer reused across batches.
    pub data: Vec<u8>,
    /// The lines in `data`, in input order.
    pub lines: Vec<LineSpan>,
    /// The records of `lines` longer than the record size limit, in order: their spans
    /// hold only their first bytes. Empty in nearly every batch.
    pub oversized: Vec<Oversized>,
    /// Where the inputs stand after this batch's last line.
    pub end: ReadPosition,
    /// Bytes of the inputs handed out as whole lines up to the end of this batch, since
    /// reading started ([`Inputs::bytes_read`] less what is read ahead): what a run that
    /// stops after this batch has consumed.
    pub consumed: u64,
}

impl Batch {
    /// The bytes of line `i`.
    pub fn line(&self, i: usize) -> &[u8] {
        let l = self.lines[i];
        &self.data[l.start as usize..l.end as usize]
    }

    /// The whole length of line `i` when it is longer than the record size limit (its
    /// span then holds only its first bytes).
    #[inline]
    pub fn oversized_len(&self, i: usize) -> Option<u64> {
        if self.oversized.is_empty() {
            return None;
        }
        let i = i as u32;
        self.oversized
            .binary_search_by_key(&i, |o| o.line)
            .ok()
            .map(|k| self.oversized[k].len)
    }

    /// Appends one record (a Kafka message's value) read at position (`input`, `at`)
    /// as a line: whole, or only its first bytes when it is longer than `max_record`.
    pub fn push_record(&mut self, value: &[u8], input: u32, at: u64, max_record: usize) {
        let start = self.data.len();
        if value.len() > max_record {
            self.oversized.push(Oversized {
                line: self.lines.len() as u32,
                len: value.len() as u64,
            });
            self.data.extend_from_slice(record_head(value));
        } else {
            self.data.extend_from_slice(value);
        }
        self.lines.push(LineSpan {
            start: u32::try_from(start).expect("batch under 4 GiB"),
            end: u32::try_from(self.data.len()).expect("batch under 4 GiB"),
            input,
            at,
        });
    }

    /// Splits the batch in two at line `at`: `self` keeps the lines before it, the
    /// returned batch holds the others (their bytes copied, their spans and oversized
    /// marks counted from its own start). `end` and `consumed` stay with `self`.
    pub fn split_off(&mut self, at: usize) -> Batch {
        let mut rest = Batch::default();
        if at >= self.lines.len() {
            return rest;
        }
        let base = self.lines[at].start as usize;
        rest.data.extend_from_slice(&self.data[base..]);
        rest.lines = self
            .lines
            .drain(at..)
            .map(|l| LineSpan {
                start: l.start - base as u32,
                end: l.end - base as u32,
                ..l
            })
            .collect();
        let first_moved = self.oversized.partition_point(|o| (o.line as usize) < at);
        rest.oversized = self
            .oversized
            .drain(first_moved..)
            .map(|o| Oversized {
                line: o.line - at as u32,
                len: o.len,
            })
            .collect();
        self.data.truncate(base);
        rest
    }

    /// Empties the batch (its buffer is kept).
    pub fn clear(&mut self) {
        self.data.clear();
        self.lines.clear();
        self.oversized.clear();
    }
}

/// The input currently being read.
struct Current {
    index: usize,
    reader: Box<dyn Read + Send>,
    line_no: u64,
    /// Bytes of this input read so far (including where reading resumed).
    read: u64,
    /// Standard input: hand out lines as soon as they arrive.
    live: bool,
    /// Reading from the input's first byte: a UTF-8 byte-order mark there is skipped.
    at_start: bool,
}

/// A record longer than the limit being read past: its first bytes are in the batch
/// from `start`, the rest is read into scratch space and dropped up to its newline.
#[derive(Debug, Clone, Copy)]
struct Skipping {
    start: usize,
    len: u64,
}

/// Reads inputs in order and hands out their lines in batches.
pub struct Inputs {
    sources: Vec<InputSource>,
    names: Vec<String>,
    bytes_read: u64,
    current: Option<Current>,
    next_input: usize,
    /// The start of a line whose end has not been read yet.
    carry: Vec<u8>,
    /// Where reading starts in the first input opened (a resumed run).
    resume: Option<ReadPosition>,
    /// The end of the last input that was read to its end.
    finished: ReadPosition,
    /// Bytes copied to carry the start of a line over to the next batch (out and back
    /// in). Each byte is carried at most once, so this stays under twice the input
    /// whatever the lengths of its lines; the unit tests check it.
    moved: u64,
    /// The largest record: a longer line is skipped as it is read (its first bytes
    /// kept for its dead letter), never held whole.
    max_record: usize,
    skipping: Option<Skipping>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs")
            .field("sources", &self.sources)
            .field("bytes_read", &self.bytes_read)
            .finish()
    }
}

impl Inputs {
    /// Inputs read from the start, in the order of `sources`. Nothing is opened yet.
    pub fn new(sources: Vec<InputSource>) -> Inputs {
        let names = sources.iter().map(InputSource::display_name).collect();
        Inputs {
            sources,
            names,
            bytes_read: 0,
            current: None,
            next_input: 0,
            carry: Vec::new(),
            resume: None,
            finished: ReadPosition::default(),
            moved: 0,
            max_record: DEFAULT_MAX_RECORD,
            skipping: None,
            scratch: Vec::new(),
        }
    }

    /// Sets the largest record (default [`DEFAULT_MAX_RECORD`], at most
    /// [`MAX_RECORD_LIMIT`]): a longer line is handed out as its first bytes only and
    /// listed in [`Batch::oversized`] with its length.
    pub fn with_max_record(mut self, bytes: usize) -> Inputs {
        self.set_max_record(bytes);
        self
    }

    /// As [`with_max_record`](Self::with_max_record).
    pub fn set_max_record(&mut self, bytes: usize) {
        self.max_record = bytes.clamp(1, MAX_RECORD_LIMIT);
    }

    /// Inputs that continue from `at` (a checkpoint's position): the inputs before
    /// `at.input` are skipped, that one is read from byte `at.offset` on with line
    /// numbers continuing after `at.line_no`. The position must come from a whole-line
    /// boundary of the same files (the caller checks their identity).
    pub fn starting_at(sources: Vec<InputSource>, at: ReadPosition) -> Inputs {
        let mut inputs = Inputs::new(sources);
        inputs.next_input = (at.input as usize).min(inputs.sources.len());
        inputs.resume = Some(at);
        inputs.finished = at;
        inputs
    }

    /// The display name of input `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The display names of all inputs, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Bytes read from all inputs so far (bytes skipped when resuming are not counted).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Checks that every file input can be opened, before any work starts.
    pub fn check_readable(&self) -> Result<(), InputError> {
        for (i, s) in self.sources.iter().enumerate() {
            let name_err = |source| InputError {
                name: self.names[i].clone(),
                source,
            };
            match s {
                InputSource::File(p) => drop(open(p).map_err(name_err)?),
                InputSource::Stdin => {}
                InputSource::Delta(location) => {
                    table_rows(location, 0).map_err(name_err)?;
                }
            }
        }
        Ok(())
    }

    /// Fills `batch` with the next whole lines, about `target_bytes` of them (fewer from
    /// stdin, whose lines are handed out as soon as they arrive; more when one line is
    /// longer). Returns `false` once every input is exhausted and nothing was read.
    ///
    /// A batch always holds at least one whole line (unless the inputs ended), so the
    /// start of a line is carried over to the next batch at most once, and a line longer
    /// than a batch is read in reads that double with it: the cost is linear in the
    /// line's length.
    pub fn next_batch(
        &mut self,
        batch: &mut Batch,
        target_bytes: usize,
    ) -> Result<bool, InputError> {
        batch.lines.clear();
        batch.oversized.clear();
        // `data` keeps its length between batches (only `filled` bytes are meaningful),
        // so that the read buffer is zeroed once, not before every read.
        let mut filled = self.carry.len();
        if batch.data.len() < filled {
            batch.data.resize(filled, 0);
        }
        batch.data[..filled].copy_from_slice(&self.carry);
        self.moved += filled as u64;
        self.carry.clear();
        // Where the next line starts; the carried bytes begin a line.
        let mut start = 0usize;
        loop {
            if !self.open_next_if_needed()? {
                batch.end = self.finished;
                batch.consumed = self.bytes_read;
                return Ok(!batch.lines.is_empty());
            }
            let Inputs {
                current,
                names,
                bytes_read,
                carry,
                finished,
                moved,
                max_record,
                skipping,
                scratch,
                ..
            } = self;
            let max_record = *max_record;
            let Some(cur) = current.as_mut() else {
                batch.end = *finished;
                batch.consumed = *bytes_read;
                return Ok(!batch.lines.is_empty());
            };
            let read_err = |source| InputError {
                name: names[cur.index].clone(),
                source,
            };
            let input = cur.index as u32;
            let read_from;
            let n;
            if let Some(skip) = skipping.as_mut() {
                // Past the limit: read into scratch space and drop the bytes up to the
                // record's newline, so memory stays flat however long it is.
                scratch.resize(CHUNK_MIN, 0);
                n = read_some(&mut cur.reader, scratch).map_err(read_err)?;
                *bytes_read += n as u64;
                cur.read += n as u64;
                let nl = memchr::memchr(b'\n', &scratch[..n]);
                skip.len += nl.unwrap_or(n) as u64;
                if n > 0 && nl.is_none() {
                    continue;
                }
                let skip = skipping.take().expect("skipping");
                cur.line_no += 1;
                push_oversized(batch, skip.start, filled, skip.len, input, cur.line_no);
                start = filled;
                // The bytes after the newline are read as usual below.
                read_from = filled;
                if let Some(nl) = nl {
                    let rest = &scratch[nl + 1..n];
                    if batch.data.len() < filled + rest.len() {
                        batch.data.resize(filled + rest.len(), 0);
                    }
                    batch.data[filled..filled + rest.len()].copy_from_slice(rest);
                    filled += rest.len();
                }
            } else {
                // Up to the batch's target; for a line longer than that, as much again
                // as the line has so far, so that its reads double in size.
                let want = target_bytes
                    .saturating_sub(filled)
                    .max(CHUNK_MIN)
                    .max(filled - start);
                // Line positions are 32-bit; the record limit keeps lines far below.
                let want = want.min(LINE_MAX - filled);
                if batch.data.len() < filled + want {
                    batch.data.resize(filled + want, 0);
                }
                n = read_some(&mut cur.reader, &mut batch.data[filled..filled + want])
                    .map_err(read_err)?;
                read_from = filled;
                filled += n;
                *bytes_read += n as u64;
                cur.read += n as u64;
            }
            if std::mem::take(&mut cur.at_start)
                && batch.data[read_from..filled].starts_with(UTF8_BOM)
            {
                // A byte-order mark is not part of the first record.
                start += UTF8_BOM.len();
            }
            let mut pos = read_from.max(start);
            while let Some(nl) = memchr::memchr(b'\n', &batch.data[pos..filled]) {
                let stop = pos + nl;
                cur.line_no += 1;
                if stop - start > max_record {
                    let len = (stop - start) as u64;
                    push_oversized(batch, start, stop, len, input, cur.line_no);
                } else {
                    push_line(batch, start, stop, input, cur.line_no);
                }
                start = stop + 1;
                pos = start;
            }
            if n > 0 && filled - start > max_record {
                // A line longer than the limit, still without its newline: keep its
                // first bytes, skip the rest as it is read.
                let len = (filled - start) as u64;
                let head = record_head(&batch.data[start..filled]).len();
                filled = start + head;
                *skipping = Some(Skipping { start, len });
                continue;
            }
            if n == 0 {
                // End of this input: a last line without '\n' is still a line.
                if start < filled {
                    cur.line_no += 1;
                    push_line(batch, start, filled, input, cur.line_no);
                    if batch.data.len() == filled {
                        batch.data.push(b'\n');
                    } else {
                        batch.data[filled] = b'\n';
                    }
                    filled += 1;
                    start = filled;
                }
                *finished = ReadPosition {
                    input,
                    offset: cur.read,
                    line_no: cur.line_no,
                };
                *current = None;
            } else if !batch.lines.is_empty() && (filled >= target_bytes || cur.live) {
                carry.extend_from_slice(&batch.data[start..filled]);
                *moved += carry.len() as u64;
                batch.end = ReadPosition {
                    input,
                    offset: cur.read - carry.len() as u64,
                    line_no: cur.line_no,
                };
                batch.consumed = *bytes_read - carry.len() as u64;
                return Ok(true);
            }
        }
    }

    /// Opens the next input when none is open; `false` when all are done.
    fn open_next_if_needed(&mut self) -> Result<bool, InputError> {
        if self.current.is_some() {
            return Ok(true);
        }
        if self.next_input == self.sources.len() {
            return Ok(false);
        }
        let index = self.next_input;
        self.next_input += 1;
        let resume = self
            .resume
            .take()
            .filter(|at| at.input as usize == index)
            .unwrap_or(ReadPosition {
                input: index as u32,
                offset: 0,
                line_no: 0,
            });
        let name_err = |source| InputError {
            name: self.names[index].clone(),
            source,
        };
        let (reader, live): (Box<dyn Read + Send>, bool) = match &self.sources[index] {
            InputSource::File(p) => {
                let mut f = open(p).map_err(name_err)?;
                if resume.offset > 0 {
                    f.seek(SeekFrom::Start(resume.offset)).map_err(name_err)?;
                }
                (Box::new(f), false)
            }
            InputSource::Stdin => (Box::new(io::stdin()), true),
            // A row number is the line number: the table finds it without reading
            // the rows before.
            InputSource::Delta(location) => (
                table_rows(location, resume.line_no).map_err(name_err)?,
                false,
            ),
        };
        self.current = Some(Current {
            index,
            reader,
            line_no: resume.line_no,
            read: resume.offset,
            live,
            at_start: resume.offset == 0,
        });
        Ok(true)
    }
}

/// Reads at least this much per call, so that small targets still read efficiently.
const CHUNK_MIN: usize = 64 * 1024;

/// The largest batch: line positions are 32-bit.
const LINE_MAX: usize = u32::MAX as usize;

/// The UTF-8 byte-order mark, skipped at the start of an input.
const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

/// One read, retried when interrupted.
fn read_some(reader: &mut Box<dyn Read + Send>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Ends the batch's data at `stop` with a record longer than the limit whose first
/// bytes are `start..stop` and whole length `len`.
fn push_oversized(
    batch: &mut Batch,
    start: usize,
    stop: usize,
    len: u64,
    input: u32,
    line_no: u64,
) {
    let head = record_head(&batch.data[start..stop]).len();
    batch.oversized.push(Oversized {
        line: batch.lines.len() as u32,
        len,
    });
    batch.lines.push(LineSpan {
        start: u32::try_from(start).expect("batch under 4 GiB"),
        end: u32::try_from(start + head).expect("batch under 4 GiB"),
        input,
        at: line_no,
    });
}

fn push_line(batch: &mut Batch, start: usize, stop: usize, input: u32, line_no: u64) {
    let end = if stop > start && batch.data[stop - 1] == b'\r' {
        stop - 1
    } else {
        stop
    };
    batch.lines.push(LineSpan {
        // `next_batch` keeps batches under 4 GiB.
        start: u32::try_from(start).expect("batch under 4 GiB"),
        end: u32::try_from(end).expect("batch under 4 GiB"),
        input,
        at: line_no,
    });
}

/// The rows of the Delta table at `location` from row `from` on, as JSON lines.
#[cfg(feature = "delta")]
fn table_rows(location: &str, from: u64) -> io::Result<Box<dyn Read + Send>> {
    let rows = crate::delta::DeltaRows::open(location, from).map_err(io::Error::other)?;
    Ok(Box::new(rows))
}

#[cfg(not(feature = "delta"))]
fn table_rows(_location: &str, _from: u64) -> io::Result<Box<dyn Read + Send>> {
    Err(io::Error::other(
        "reading a Delta table needs a build with the cargo feature `delta`",
    ))
}

fn open(p: &Path) -> io::Result<File> {
    let f = File::open(p)?;
    if f.metadata()?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a directory",
        ));
    }
    Ok(f)
}

/// Files in order, or stdin: blocks of whole lines of about `limit.bytes`; a read
/// waits for its lines (stdin: as they arrive) or the end.
impl crate::source::Source for Inputs {
    fn read(
        &mut self,
        batch: &mut Batch,
        limit: crate::source::Limit,
    ) -> Result<crate::source::Read, crate::source::ReadError> {
        Ok(match self.next_batch(batch, limit.bytes)? {
            true => crate::source::Read::Records,
            false => crate::source::Read::End,
        })
    }

    fn pos(&self, input: u32, at: u64) -> crate::encode::SourcePos<'_> {
        crate::encode::SourcePos {
            name: &self.names[input as usize],
            at,
            style: crate::encode::PositionStyle::Line,
        }
    }

    fn set_max_record(&mut self, bytes: usize) {
        Inputs::set_max_record(self, bytes);
    }
}

#[cfg(test)]
mod tests;
