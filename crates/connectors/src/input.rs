//! Line-oriented input over several sources read one after another.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// One input: a file or standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSource {
    File(PathBuf),
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
    pub name: String,
    #[source]
    pub source: io::Error,
}

/// One line of input, without its line terminator (`\n` or `\r\n`).
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub bytes: &'a [u8],
    /// Index of the input in the order given.
    pub input: usize,
    /// 1-based line number within that input.
    pub line_no: u64,
}

const CHUNK: usize = 1 << 20;

/// Reads inputs in order and hands out their lines.
#[derive(Debug)]
pub struct Inputs {
    sources: Vec<InputSource>,
    names: Vec<String>,
    bytes_read: u64,
}

impl Inputs {
    pub fn new(sources: Vec<InputSource>) -> Inputs {
        let names = sources.iter().map(InputSource::display_name).collect();
        Inputs {
            sources,
            names,
            bytes_read: 0,
        }
    }

    /// The display name of input `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

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

    /// Calls `f` with every line of every input, in order. `f` returns `Err` to stop.
    pub fn for_each_line<E>(
        &mut self,
        mut f: impl FnMut(Line<'_>) -> Result<(), E>,
    ) -> Result<(), LinesError<E>> {
        let mut buf = vec![0u8; CHUNK];
        for i in 0..self.sources.len() {
            let reader: Box<dyn Read> = match &self.sources[i] {
                InputSource::File(p) => Box::new(open(p).map_err(|source| {
                    LinesError::Input(InputError {
                        name: self.names[i].clone(),
                        source,
                    })
                })?),
                InputSource::Stdin => Box::new(io::stdin().lock()),
            };
            self.read_lines(i, reader, &mut buf, &mut f)?;
        }
        Ok(())
    }

    fn read_lines<E>(
        &mut self,
        input: usize,
        mut reader: Box<dyn Read>,
        buf: &mut Vec<u8>,
        f: &mut impl FnMut(Line<'_>) -> Result<(), E>,
    ) -> Result<(), LinesError<E>> {
        let mut line_no = 0u64;
        // buf[..filled] holds bytes not yet handed out; they start a line.
        let mut filled = 0usize;
        loop {
            if filled == buf.len() {
                // One line longer than the buffer: grow.
                buf.resize(buf.len() * 2, 0);
            }
            let n = match reader.read(&mut buf[filled..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(LinesError::Input(InputError {
                        name: self.names[input].clone(),
                        source,
                    }));
                }
            };
            self.bytes_read += n as u64;
            let end = filled + n;
            let eof = n == 0;
            let mut start = 0usize;
            for nl in memchr::memchr_iter(b'\n', &buf[filled..end]) {
                let stop = filled + nl;
                line_no += 1;
                f(Line {
                    bytes: trim_cr(&buf[start..stop]),
                    input,
                    line_no,
                })
                .map_err(LinesError::Stopped)?;
                start = stop + 1;
            }
            if eof {
                if start < end {
                    line_no += 1;
                    f(Line {
                        bytes: trim_cr(&buf[start..end]),
                        input,
                        line_no,
                    })
                    .map_err(LinesError::Stopped)?;
                }
                return Ok(());
            }
            buf.copy_within(start..end, 0);
            filled = end - start;
        }
    }
}

/// Why [`Inputs::for_each_line`] stopped early.
#[derive(Debug)]
pub enum LinesError<E> {
    Input(InputError),
    Stopped(E),
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
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

    fn collect(inputs: &mut Inputs) -> Vec<(usize, u64, String)> {
        let mut out = Vec::new();
        inputs
            .for_each_line(|l| {
                out.push((
                    l.input,
                    l.line_no,
                    String::from_utf8_lossy(l.bytes).into_owned(),
                ));
                Ok::<(), ()>(())
            })
            .map_err(|_| "read failed")
            .expect("lines");
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
            collect(&mut inputs),
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
    fn lines_longer_than_the_buffer_and_across_chunk_borders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("big.jsonl");
        let long = "y".repeat(CHUNK * 2 + 17);
        let mut f = File::create(&p).expect("create");
        let mut expected = Vec::new();
        for i in 0..3000 {
            let line = format!("{i}-{}", "z".repeat(i % 700));
            writeln!(f, "{line}").expect("write");
            expected.push(line);
        }
        writeln!(f, "{long}").expect("write");
        expected.push(long);
        drop(f);
        let mut inputs = Inputs::new(vec![InputSource::File(p)]);
        let got: Vec<String> = collect(&mut inputs).into_iter().map(|l| l.2).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_missing_file_is_named() {
        let inputs = Inputs::new(vec![InputSource::File("/nonexistent/x.jsonl".into())]);
        let err = inputs.check_readable().expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/x.jsonl"), "{err}");
    }
}
