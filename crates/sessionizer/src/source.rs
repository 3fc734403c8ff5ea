//! Sources of events. Any `IntoIterator` of events is a source (a vector, a std channel's
//! `Receiver::iter`, a generator); [`JsonLines`] reads the command line's JSON-lines
//! inputs (files in order, or stdin) into the user's own serde type, sending the lines
//! that do not parse to a dead-letter sink with their reason and position.

use crate::sink::{Sink, SinkError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_connectors::input::{Batch, InputError, Inputs};
use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;

/// Where [`JsonLines`] reads: a file or stdin (also in the prelude).
pub use sessionizer_connectors::InputSource;

/// A record that could not be read as an event, in the command line's dead-letter shape:
/// `{"reason":..,"source":"file:line","raw":..}`, plus `"raw_base64"` when the record is
/// not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Why (serde's message, e.g. ``missing field `visit_id` at line 1 column 40``).
    pub reason: String,
    /// `file:line` (or `stdin:line`; `topic/partition@offset` for a Kafka source).
    pub source: String,
    /// The record as read (bytes that are not UTF-8 replaced by U+FFFD).
    pub raw: String,
    /// The exact bytes of the record, in standard base64, when they are not UTF-8 (so
    /// that `raw` could not hold them); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_base64: Option<String>,
}

impl DeadLetter {
    /// The dead letter of the record `raw` read at `source`, refused for `reason`.
    pub(crate) fn of(reason: String, source: String, raw: &[u8]) -> DeadLetter {
        DeadLetter {
            reason,
            source,
            raw: String::from_utf8_lossy(raw).into_owned(),
            raw_base64: sessionizer_connectors::encode::raw_base64(raw),
        }
    }
}

/// Why a source stopped.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// An input could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The dead-letter sink refused a record.
    #[error("cannot write a dead letter: {0}")]
    DeadLetter(#[from] SinkError),
    /// Reading Kafka failed (a [`KafkaJson`](crate::kafka::KafkaJson) source).
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] sessionizer_connectors::kafka::KafkaError),
}

/// What a [`JsonLines`] source read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// Records read (blank lines are not records).
    pub records: u64,
    /// Records sent to the dead-letter sink.
    pub invalid: u64,
    /// Empty or whitespace-only lines, skipped.
    pub blank_lines: u64,
}

/// Events of type `E` read from JSON lines: an iterator of the records that parse.
///
/// Records that do not parse go to the dead-letter sink `D`. An input error ends the
/// iteration; [`finish`](Self::finish) reports it (call it after the run, it also flushes
/// the dead letters).
///
/// ```
/// use serde::Deserialize;
/// use sessionizer::prelude::*;
///
/// #[derive(Deserialize)]
/// struct Visit { visit_id: String }
///
/// let dir = tempfile::tempdir().expect("temp dir");
/// let path = dir.path().join("visits.jsonl");
/// std::fs::write(&path, "{\"visit_id\":\"v1\"}\n\n{\"page\":\"/\"}\n").expect("write");
/// let mut dead = Vec::new();
/// let mut source = JsonLines::<Visit, _>::files([&path], &mut dead).expect("readable");
/// let ids: Vec<String> = source.by_ref().map(|v| v.visit_id).collect();
/// let counts = source.finish().expect("no input error");
/// assert_eq!(ids, ["v1"]);
/// assert_eq!((counts.records, counts.invalid, counts.blank_lines), (2, 1, 1));
/// assert!(dead[0].reason.starts_with("missing field `visit_id`"));
/// assert!(dead[0].source.ends_with("visits.jsonl:3"));
/// ```
pub struct JsonLines<E, D> {
    inputs: Inputs,
    batch: Batch,
    next_line: usize,
    dead: D,
    error: Option<SourceError>,
    counts: SourceCounts,
    _events: PhantomData<fn() -> E>,
}

impl<E, D> fmt::Debug for JsonLines<E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonLines")
            .field("inputs", &self.inputs)
            .field("counts", &self.counts)
            .finish()
    }
}

/// How much input one read brings in.
const BATCH_BYTES: usize = 1 << 20;

impl<E: DeserializeOwned, D: Sink<DeadLetter>> JsonLines<E, D> {
    /// Reads the files `paths` in order; checks first that every one can be opened.
    pub fn files<P: Into<PathBuf>>(
        paths: impl IntoIterator<Item = P>,
        dead_letters: D,
    ) -> Result<Self, SourceError> {
        let sources = paths
            .into_iter()
            .map(|p| InputSource::File(p.into()))
            .collect();
        Self::open(sources, dead_letters)
    }

    /// Reads standard input, line by line as lines arrive.
    pub fn stdin(dead_letters: D) -> Result<Self, SourceError> {
        Self::open(vec![InputSource::Stdin], dead_letters)
    }

    /// Reads `sources` in order (files, or stdin; [`InputSource::parse`] reads `-` as
    /// stdin, like `--input`); checks first that every file can be opened.
    pub fn open(sources: Vec<InputSource>, dead_letters: D) -> Result<Self, SourceError> {
        let inputs = Inputs::new(sources);
        inputs.check_readable()?;
        Ok(JsonLines {
            inputs,
            batch: Batch::default(),
            next_line: 0,
            dead: dead_letters,
            error: None,
            counts: SourceCounts::default(),
            _events: PhantomData,
        })
    }

    /// What was read so far.
    pub fn counts(&self) -> SourceCounts {
        self.counts
    }

    /// Flushes the dead-letter sink; returns the counts, or the error that ended the
    /// iteration early.
    pub fn finish(mut self) -> Result<SourceCounts, SourceError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.dead.flush()?;
        Ok(self.counts)
    }
}

impl<E: DeserializeOwned, D: Sink<DeadLetter>> Iterator for JsonLines<E, D> {
    type Item = E;

    fn next(&mut self) -> Option<E> {
        if self.error.is_some() {
            return None;
        }
        loop {
            if self.next_line >= self.batch.lines.len() {
                match self.inputs.next_batch(&mut self.batch, BATCH_BYTES) {
                    Ok(true) => self.next_line = 0,
                    Ok(false) => return None,
                    Err(e) => {
                        self.error = Some(e.into());
                        return None;
                    }
                }
                continue;
            }
            let i = self.next_line;
            self.next_line += 1;
            let line = self.batch.line(i);
            if line.trim_ascii().is_empty() {
                self.counts.blank_lines += 1;
                continue;
            }
            self.counts.records += 1;
            match serde_json::from_slice::<E>(line) {
                Ok(event) => return Some(event),
                Err(e) => {
                    self.counts.invalid += 1;
                    let span = self.batch.lines[i];
                    let source =
                        format!("{}:{}", self.inputs.name(span.input as usize), span.line_no);
                    let letter = DeadLetter::of(e.to_string(), source, line);
                    if let Err(e) = self.dead.send(letter) {
                        self.error = Some(e.into());
                        return None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Visit {
        #[allow(dead_code)]
        visit_id: String,
    }

    /// Regression (issue 8): a line that is not UTF-8 lost its bytes in the dead letter.
    #[test]
    fn dead_letters_carry_the_exact_bytes_of_lines_that_are_not_utf8() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in.jsonl");
        std::fs::write(
            &p,
            b"{\"visit_id\":\"a\"}\n{\"visit_id\":\xff}\n{\"x\":1}\n",
        )
        .expect("write");
        let mut dead = Vec::new();
        let mut source =
            JsonLines::<Visit, _>::open(vec![InputSource::File(p)], &mut dead).expect("open");
        assert_eq!(source.by_ref().count(), 1);
        source.finish().expect("finish");
        assert_eq!(dead.len(), 2);
        assert_eq!(dead[0].raw, "{\"visit_id\":\u{fffd}}");
        assert_eq!(
            dead[0].raw_base64.as_deref(),
            Some("eyJ2aXNpdF9pZCI6/30="),
            "base64 of the exact bytes"
        );
        assert_eq!(dead[1].raw_base64, None);
        let json = serde_json::to_value(&dead[1]).expect("json");
        assert!(
            json.get("raw_base64").is_none(),
            "absent when UTF-8: {json}"
        );
    }
}
