//! Line-oriented input over several sources read one after another.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One input: a file or standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSource {
    /// A file, read from its start (or from a checkpoint's offset).
    File(PathBuf),
    /// Standard input.
    Stdin,
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

/// Where one line of a [`Batch`] sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineSpan {
    /// Start of the line's byte range in [`Batch::data`], without the line terminator (`\n` or `\r\n`).
    pub start: u32,
    /// End of the byte range in [`Batch::data`] (exclusive).
    pub end: u32,
    /// Index of the input in the order given.
    pub input: u32,
    /// 1-based line number within that input.
    pub line_no: u64,
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

/// A block of whole lines read from the inputs, owned, so that workers can decode them
/// in parallel. Only the bytes covered by `lines` are meaningful in `data`.
#[derive(Debug, Default)]
pub struct Batch {
    /// The bytes read; a buffer reused across batches.
    pub data: Vec<u8>,
    /// The lines in `data`, in input order.
    pub lines: Vec<LineSpan>,
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
        }
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
            if let InputSource::File(p) = s {
                open(p).map_err(|source| InputError {
                    name: self.names[i].clone(),
                    source,
                })?;
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
                ..
            } = self;
            let Some(cur) = current.as_mut() else {
                batch.end = *finished;
                batch.consumed = *bytes_read;
                return Ok(!batch.lines.is_empty());
            };
            // Up to the batch's target; for a line longer than that, as much again as
            // the line has so far, so that its reads double in size.
            let want = target_bytes
                .saturating_sub(filled)
                .max(CHUNK_MIN)
                .max(filled - start);
            // Line positions are 32-bit: only a single line of 4 GiB gets here.
            let want = want.min(LINE_MAX - filled);
            if want == 0 {
                return Err(InputError {
                    name: names[cur.index].clone(),
                    source: io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("line {} is longer than 4 GiB", cur.line_no + 1),
                    ),
                });
            }
            if batch.data.len() < filled + want {
                batch.data.resize(filled + want, 0);
            }
            let n = loop {
                match cur.reader.read(&mut batch.data[filled..filled + want]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(InputError {
                            name: names[cur.index].clone(),
                            source,
                        });
                    }
                }
            };
            let read_from = filled;
            filled += n;
            *bytes_read += n as u64;
            cur.read += n as u64;
            let input = cur.index as u32;
            let mut pos = read_from;
            while let Some(nl) = memchr::memchr(b'\n', &batch.data[pos..filled]) {
                let stop = pos + nl;
                cur.line_no += 1;
                push_line(batch, start, stop, input, cur.line_no);
                start = stop + 1;
                pos = start;
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
        };
        self.current = Some(Current {
            index,
            reader,
            line_no: resume.line_no,
            read: resume.offset,
            live,
        });
        Ok(true)
    }
}

/// Reads at least this much per call, so that small targets still read efficiently.
const CHUNK_MIN: usize = 64 * 1024;

/// The largest batch: line positions are 32-bit.
const LINE_MAX: usize = u32::MAX as usize;

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
        line_no,
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn collect(inputs: &mut Inputs, target: usize) -> Vec<(u32, u64, String)> {
        let mut out = Vec::new();
        let mut batch = Batch::default();
        while inputs.next_batch(&mut batch, target).expect("read") {
            for (i, l) in batch.lines.iter().enumerate() {
                out.push((
                    l.input,
                    l.line_no,
                    String::from_utf8_lossy(batch.line(i)).into_owned(),
                ));
            }
        }
        out
    }

    #[test]
    fn lines_of_several_files_in_order_with_numbers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.jsonl");
        let b = dir.path().join("b.jsonl");
        std::fs::write(&a, "one\r\ntwo\n\nfour").expect("write");
        std::fs::write(&b, "x\n").expect("write");
        let mut inputs = Inputs::new(vec![InputSource::File(a), InputSource::File(b)]);
        assert_eq!(
            collect(&mut inputs, 1 << 20),
            vec![
                (0, 1, "one".into()),
                (0, 2, "two".into()),
                (0, 3, "".into()),
                (0, 4, "four".into()),
                (1, 1, "x".into()),
            ]
        );
    }

    #[test]
    fn lines_longer_than_a_batch_and_across_batch_borders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("big.jsonl");
        let long = "y".repeat(CHUNK_MIN * 5 + 17);
        let mut f = File::create(&p).expect("create");
        let mut expected = Vec::new();
        for i in 0..3000 {
            let line = format!("{i}-{}", "z".repeat(i % 700));
            if i % 7 == 0 {
                write!(f, "{line}\r\n").expect("write");
            } else {
                writeln!(f, "{line}").expect("write");
            }
            expected.push(line);
        }
        writeln!(f, "{long}").expect("write");
        expected.push(long);
        drop(f);
        for target in [1, 1000, CHUNK_MIN, 1 << 20] {
            let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]);
            let got: Vec<String> = collect(&mut inputs, target)
                .into_iter()
                .map(|l| l.2)
                .collect();
            assert_eq!(got, expected, "target {target}");
            assert_eq!(
                inputs.bytes_read(),
                std::fs::metadata(&p).expect("meta").len()
            );
        }
    }

    #[test]
    fn resuming_at_any_batch_end_gives_the_remaining_lines_with_their_numbers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.jsonl");
        let b = dir.path().join("b.jsonl");
        let c = dir.path().join("c.jsonl");
        let mut text = String::new();
        for i in 0..500 {
            text.push_str(&format!("a{i}-{}\n", "x".repeat(i % 37)));
        }
        std::fs::write(&a, &text).expect("write");
        std::fs::write(&b, "").expect("write");
        std::fs::write(&c, "c1\r\nc2\n\nc4 without newline").expect("write");
        let sources = vec![
            InputSource::File(a.clone()),
            InputSource::File(b),
            InputSource::File(c),
        ];
        let all = collect(&mut Inputs::new(sources.clone()), 1 << 20);
        for target in [1, 700, 5000] {
            let mut inputs = Inputs::new(sources.clone());
            let mut batch = Batch::default();
            let mut seen = 0;
            while inputs.next_batch(&mut batch, target).expect("read") {
                seen += batch.lines.len();
                let rest = collect(&mut Inputs::starting_at(sources.clone(), batch.end), target);
                assert_eq!(
                    &all[seen..],
                    &rest[..],
                    "resumed at {:?} (target {target})",
                    batch.end
                );
            }
        }
        let mut inputs = Inputs::new(sources.clone());
        let mut batch = Batch::default();
        let mut last = ReadPosition::default();
        while inputs.next_batch(&mut batch, 1 << 20).expect("read") {
            last = batch.end;
        }
        assert_eq!(
            last,
            ReadPosition {
                input: 2,
                offset: 26,
                line_no: 4
            },
            "the end of the last input, whole"
        );
    }

    /// Regression (issue 8): a line longer than a batch was copied again on every
    /// read — 100 MB took 20 s. Counting the bytes carried between batches (and the
    /// reads) shows the cost is linear, whatever the batch target.
    #[test]
    fn a_line_longer_than_a_batch_is_carried_over_at_most_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("long.jsonl");
        let long = "L".repeat(8 << 20);
        let mut text = String::new();
        for i in 0..2000 {
            text.push_str(&format!("short {i}\n"));
        }
        text.push_str(&long);
        text.push('\n');
        text.push_str("after\n");
        text.push_str(&long);
        std::fs::write(&p, &text).expect("write");
        let n = text.len() as u64;
        for target in [1, 1000, CHUNK_MIN, 1 << 20, 4 << 20] {
            let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]);
            let got = collect(&mut inputs, target);
            assert_eq!(got.len(), 2003, "target {target}");
            assert_eq!(got[2000].2.len(), long.len());
            assert_eq!(got[2002].2.len(), long.len());
            assert!(
                inputs.moved <= 2 * n,
                "target {target}: {} bytes carried for {n} bytes of input",
                inputs.moved
            );
        }
    }

    #[test]
    fn batches_report_the_bytes_consumed_through_their_last_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a.jsonl");
        std::fs::write(&p, "one\ntwo\nthree\nfour without newline").expect("write");
        let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]);
        let mut batch = Batch::default();
        let mut ends = Vec::new();
        while inputs.next_batch(&mut batch, 1).expect("read") {
            ends.push((batch.lines.len(), batch.consumed));
        }
        // One read takes the whole file: the three whole lines (14 bytes), then the
        // last line once the end of the file shows it is complete.
        assert_eq!(ends, vec![(3, 14), (1, 34)]);
    }

    #[test]
    fn a_missing_file_is_named() {
        let inputs = Inputs::new(vec![InputSource::File("/nonexistent/x.jsonl".into())]);
        let err = inputs.check_readable().expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/x.jsonl"), "{err}");
    }
}
