//! Sources of events. Any `IntoIterator` of events is a source (a vector, a std channel's
//! `Receiver::iter`, a generator); [`JsonLines`] reads the command line's JSON-lines
//! inputs (files in order, or stdin) into the user's own serde type, sending the lines
//! that do not parse to a dead-letter sink with their reason and position.

use crate::api::checkpoints::Checkpoints;
use crate::api::joined::{JoinedSource, SharedPosition, Tracked};
use crate::api::sink::Sink;
pub use crate::error::SourceError;
use crate::runtime::durable::{Continuation, Refusal, continuation, unread_input};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::InputPosition;
use sessionizer_connectors::input::{
    Batch, DEFAULT_MAX_RECORD, Inputs, MAX_RECORD_LIMIT, ReadPosition,
};
use sessionizer_connectors::source::{Limit, Read, Source};
use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where [`JsonLines`] reads: a file or stdin (also in the prelude).
pub use sessionizer_connectors::InputSource;

/// A record that could not be read as an event, in the command line's dead-letter shape:
/// `{"reason":..,"source":"file:line","raw":..}`, plus `"raw_base64"` when the record is
/// not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Why, in the command line's words: `not a JSON object (found an array)`,
    /// `missing field visit_id`, `field page is not a string (found an integer)`,
    /// `record too large: ...`.
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
/// assert_eq!(dead[0].reason, "missing field visit_id");
/// assert!(dead[0].source.ends_with("visits.jsonl:3"));
/// ```
pub struct JsonLines<E, D> {
    reader: Reader<Inputs, D>,
    error: Option<SourceError>,
    /// How much input one read brings in ([`BATCH_BYTES`]; less in tests).
    batch_bytes: usize,
    _events: PhantomData<fn() -> E>,
}

impl<E, D> fmt::Debug for JsonLines<E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonLines")
            .field("inputs", &self.reader.source)
            .field("counts", &self.reader.counts)
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
            reader: Reader::new(inputs, dead_letters, None),
            error: None,
            batch_bytes: BATCH_BYTES,
            _events: PhantomData,
        })
    }

    /// Reads the files `paths` in order from the position the job's checkpoint
    /// recorded, or from their start when the state directory has no checkpoint yet.
    /// Open it after the job's `restore`. The files must be the ones the checkpoint read
    /// (same paths, sizes and first 4 KiB, as `sessionizer run --state-dir` checks its
    /// inputs); a checkpoint without a position of them is refused, since where to
    /// continue is then unknown.
    ///
    /// A checkpoint that had read every one of its files to the end, of a job not
    /// finished (no `finish`: the command line's `--keep-open`), also continues with
    /// *new* files, read from their start — the next day's files, say; a file it read
    /// already, or one that grew after it was read to its end, is refused.
    ///
    /// The source joins `checkpoints`: every later checkpoint records how far it has
    /// read — just after the last line it handed out — so push every event you take
    /// from it before the job's next `checkpoint`. No event is skipped by hand: the
    /// lines after the checkpoint's position are the ones its job has not seen.
    pub fn resume<P: Into<PathBuf>>(
        paths: impl IntoIterator<Item = P>,
        checkpoints: &mut Checkpoints,
        dead_letters: D,
    ) -> Result<Self, SourceError> {
        checkpoints.can_join_source()?;
        let paths: Vec<PathBuf> = paths.into_iter().map(Into::into).collect();
        let sources: Vec<InputSource> = paths.iter().cloned().map(InputSource::File).collect();
        // Reading each file's identity also checks that it can be read.
        let files = paths
            .iter()
            .map(|p| unread_input(p))
            .collect::<Result<Vec<_>, _>>()?;
        let saved = &checkpoints.inputs;
        let dir = checkpoints.path().display();
        // The command line's rule, with "read to the end" and "ended" as the job left
        // them: a library checkpoint's inputs are those of its source.
        let finished = !saved.is_empty() && saved.iter().all(|p| p.offset == p.size);
        let new_files = if saved.is_empty() {
            if let Some(epoch) = checkpoints.latest() {
                return Err(SourceError::Resume(format!(
                    "checkpoint {epoch} in {dir} recorded no position of a file source (its job read no JsonLines::resume source), so where to continue reading is unknown; use another state directory"
                )));
            }
            false
        } else {
            let names = |l: &[InputPosition]| {
                l.iter()
                    .map(|f| f.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            continuation(saved, &files, finished, checkpoints.restored_ended)
                .map(|c| c == Continuation::NewFiles)
                .map_err(|refusal| SourceError::Resume(match refusal {
                Refusal::Changed { path, what } => format!(
                    "cannot resume from {dir}: the input {path} changed since the checkpoint ({what}); each file is read once, so put new events in a new file and start over in another state directory"
                ),
                Refusal::Grown { path, then, now } => format!(
                    "the input {path} grew from {then} to {now} bytes after the job of {dir} read it to its end; each file is read once, so put new events in a new file"
                ),
                Refusal::Midway => format!(
                    "the checkpoint in {dir} read {}; this source reads {}: resume with the same files in the same order, or use another state directory",
                    names(saved),
                    names(&files)
                ),
                Refusal::Ended => format!(
                    "the job of {dir} has ended: finish() emitted every session, so the files {} cannot continue it; use another state directory (or do not finish a job you mean to continue)",
                    names(&files)
                ),
                Refusal::AlreadyRead { path } => format!(
                    "the input {path} was already read to its end by the job of {dir}; give only new files"
                ),
            }))?
        };
        let (at, lines) = if new_files {
            (ReadPosition::default(), vec![0; files.len()])
        } else {
            let lines = (0..files.len())
                .map(|i| saved.get(i).map_or(0, |p| p.line))
                .collect();
            (crate::runtime::durable::resume_position(saved), lines)
        };
        let position = SharedPosition(Arc::new(Mutex::new(Tracked { files, lines, at })));
        let joined = JoinedSource::Files(position);
        checkpoints.join_source(joined.clone());
        Ok(JsonLines {
            reader: Reader::new(Inputs::starting_at(sources, at), dead_letters, Some(joined)),
            error: None,
            batch_bytes: BATCH_BYTES,
            _events: PhantomData,
        })
    }

    /// The largest record in bytes (default 16 MiB, as `--max-record-size`): a longer
    /// line is a dead letter with its length and first bytes, skipped as it is read
    /// and never held whole.
    pub fn max_record_size(mut self, bytes: usize) -> Self {
        self.reader.set_max_record(bytes);
        self
    }

    /// What was read so far.
    pub fn counts(&self) -> SourceCounts {
        self.reader.counts
    }

    /// Flushes the dead-letter sink; returns the counts, or the error that ended the
    /// iteration early.
    pub fn finish(mut self) -> Result<SourceCounts, SourceError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.reader.dead.flush()?;
        Ok(self.reader.counts)
    }
}

impl<E: DeserializeOwned, D: Sink<DeadLetter>> Iterator for JsonLines<E, D> {
    type Item = E;

    fn next(&mut self) -> Option<E> {
        if self.error.is_some() {
            return None;
        }
        let limit = Limit {
            bytes: self.batch_bytes,
            records: usize::MAX,
            wait: Duration::MAX,
        };
        loop {
            match self.reader.next_event() {
                Ok(Some(event)) => return Some(event),
                Ok(None) => {}
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            }
            match self.reader.read(limit) {
                Ok(Read::End) => return None,
                Ok(_) => {}
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            }
        }
    }
}

/// Records of a [`Source`] into events of the user's serde type, for every library
/// source: blank records skipped and counted, records that do not decode sent to the
/// dead-letter sink `D` with their reason and position, and the position of the
/// records handed out moved for the checkpoints the source joined.
pub(crate) struct Reader<S, D> {
    pub(crate) source: S,
    batch: Batch,
    /// The next record of `batch` to hand out.
    next: usize,
    pub(crate) dead: D,
    pub(crate) counts: SourceCounts,
    /// Where reading stands, shared with the checkpoints that record it.
    joined: Option<JoinedSource>,
    max_record: usize,
}

impl<S: Source, D: Sink<DeadLetter>> Reader<S, D> {
    pub(crate) fn new(source: S, dead: D, joined: Option<JoinedSource>) -> Self {
        Reader {
            source,
            batch: Batch::default(),
            next: 0,
            dead,
            counts: SourceCounts::default(),
            joined,
            max_record: DEFAULT_MAX_RECORD,
        }
    }

    /// The largest record (clamped to what a batch takes): a longer one is a dead letter
    /// with its length and first bytes.
    pub(crate) fn set_max_record(&mut self, bytes: usize) {
        self.max_record = bytes.clamp(1, MAX_RECORD_LIMIT);
        self.source.set_max_record(self.max_record);
    }

    /// Reads the next records, once every record read before was handed out.
    pub(crate) fn read(&mut self, limit: Limit) -> Result<Read, SourceError> {
        debug_assert!(
            self.next >= self.batch.lines.len(),
            "records not handed out"
        );
        self.next = 0;
        match self.source.read(&mut self.batch, limit) {
            Ok(read) => Ok(read),
            Err(e) => {
                // Nothing of a failed read is handed out.
                self.batch.clear();
                Err(e.into())
            }
        }
    }

    /// How many records the last read brought.
    #[cfg(feature = "kafka")]
    pub(crate) fn records_read(&self) -> usize {
        self.batch.lines.len()
    }

    /// The next event of the records read (`None`: every one was handed out).
    pub(crate) fn next_event<E: DeserializeOwned>(&mut self) -> Result<Option<E>, SourceError> {
        while self.next < self.batch.lines.len() {
            let i = self.next;
            self.next += 1;
            if let Some(joined) = &self.joined {
                joined.consumed(&self.batch, i);
            }
            let line = self.batch.line(i);
            let oversized = self.batch.oversized_len(i);
            if oversized.is_none() && line.trim_ascii().is_empty() {
                // A blank line, or a Kafka record without a value (a tombstone) or
                // with only whitespace: skipped and counted, not a record.
                self.counts.blank_lines += 1;
                continue;
            }
            self.counts.records += 1;
            match crate::api::records::decode::<E>(line, oversized, self.max_record) {
                Ok(event) => return Ok(Some(event)),
                Err(reason) => {
                    self.counts.invalid += 1;
                    let span = self.batch.lines[i];
                    let source = self.source.pos(span.input, span.at).to_string();
                    self.dead
                        .send(DeadLetter::of(reason.to_string(), source, line))?;
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, PartialEq, serde::Deserialize)]
    struct Id {
        id: u32,
    }

    /// One line of a test file: an event, a line that does not parse, or a blank one.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => (0u32..1000).prop_map(|i| format!("{{\"id\":{i}}}")),
            1 => Just("{\"id\":".to_string()),
            1 => Just("  ".to_string()),
            1 => Just(String::new()),
        ]
    }

    /// Files of lines ended by `\n` or `\r\n`, the last one with or without an end.
    fn file() -> impl Strategy<Value = Vec<u8>> {
        (
            proptest::collection::vec((line(), any::<bool>()), 0..12),
            any::<bool>(),
        )
            .prop_map(|(lines, last_ended)| {
                let mut bytes = Vec::new();
                let n = lines.len();
                for (i, (l, crlf)) in lines.into_iter().enumerate() {
                    bytes.extend_from_slice(l.as_bytes());
                    if i + 1 < n || last_ended {
                        bytes.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
                    }
                }
                bytes
            })
    }

    /// Where a resumed source stands, as the next checkpoint records it.
    fn positions(source: &JsonLines<Id, Vec<DeadLetter>>) -> Vec<InputPosition> {
        match &source.reader.joined {
            Some(JoinedSource::Files(files)) => files.positions(),
            other => panic!("not a resumed file source: {other:?}"),
        }
    }

    /// Everything a source hands out from here on: events and dead letters' positions.
    fn drain(mut source: JsonLines<Id, Vec<DeadLetter>>) -> (Vec<Id>, Vec<String>) {
        let events: Vec<Id> = source.by_ref().collect();
        assert!(source.error.is_none(), "{:?}", source.error);
        let dead = source
            .reader
            .dead
            .iter()
            .map(|d| d.source.clone())
            .collect();
        (events, dead)
    }

    /// Files larger than a read (64 KiB), so that lines are carried from the middle of a
    /// file to the next batch: a source resumed every 997 events hands out each line
    /// once, and ends with every file recorded as read to its end.
    #[test]
    fn a_source_resumed_across_carried_lines_hands_out_each_line_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut paths = Vec::new();
        let mut ids = Vec::new();
        for f in 0..3u32 {
            let mut text = String::new();
            for i in 0..12_000u32 {
                let id = f * 100_000 + i;
                ids.push(Id { id });
                let pad = "x".repeat((i % 37) as usize);
                let end = if i % 5 == 0 { "\r\n" } else { "\n" };
                text.push_str(&format!("{{\"id\":{id},\"pad\":\"{pad}\"}}{end}"));
            }
            let p = dir.path().join(format!("big{f}.jsonl"));
            std::fs::write(&p, &text).expect("write");
            paths.push(p);
        }
        let mut checkpoints = Checkpoints::open(dir.path().join("state")).expect("state dir");
        let mut seen = Vec::new();
        loop {
            checkpoints.source = None;
            let mut source =
                JsonLines::<Id, _>::resume(&paths, &mut checkpoints, Vec::new()).expect("open");
            let got: Vec<Id> = source.by_ref().take(997).collect();
            assert!(source.error.is_none() && source.reader.dead.is_empty());
            checkpoints.inputs = positions(&source);
            let done = got.len() < 997;
            seen.extend(got);
            if done {
                break;
            }
        }
        assert!(
            seen == ids,
            "{} handed out, {} lines",
            seen.len(),
            ids.len()
        );
        for (f, p) in checkpoints.inputs.iter().zip(&paths) {
            assert_eq!(f.offset, std::fs::metadata(p).expect("size").len());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// After any number of events, in batches of any size, a source resumed from the
        /// position it recorded hands out exactly the events and dead letters that the
        /// first one had not handed out yet, whatever the line ends, blank lines and
        /// files read to their end.
        #[test]
        fn a_resumed_source_continues_exactly_after_the_last_line_handed_out(
            files in proptest::collection::vec(file(), 1..4),
            batch in 1usize..48,
            stop_every in 1usize..5,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let paths: Vec<PathBuf> = files
                .iter()
                .enumerate()
                .map(|(i, bytes)| {
                    let p = dir.path().join(format!("in{i}.jsonl"));
                    std::fs::write(&p, bytes).expect("write");
                    p
                })
                .collect();
            let state = dir.path().join("state");
            let mut checkpoints = Checkpoints::open(&state).expect("state dir");
            // A new source, as after a restart (the last one leaves the checkpoints).
            let open = |checkpoints: &mut Checkpoints| {
                checkpoints.source = None;
                let mut s = JsonLines::<Id, _>::resume(&paths, checkpoints, Vec::new())
                    .expect("resumable");
                s.batch_bytes = batch;
                s
            };
            let (all, all_dead) = drain(open(&mut checkpoints));
            // Stop after every `stop_every` events, record the position as a checkpoint
            // does, resume in a new source.
            let mut source = open(&mut checkpoints);
            let (mut seen, mut seen_dead) = (Vec::new(), Vec::new());
            loop {
                let got: Vec<Id> = source.by_ref().take(stop_every).collect();
                prop_assert!(source.error.is_none());
                checkpoints.inputs = positions(&source);
                seen_dead.extend(source.reader.dead.drain(..).map(|d| d.source));
                let done = got.len() < stop_every;
                seen.extend(got);
                if done {
                    break;
                }
                source = open(&mut checkpoints);
            }
            prop_assert_eq!(&seen, &all);
            prop_assert_eq!(&seen_dead, &all_dead);
            // At the end, every file is recorded as read to its end.
            for (f, bytes) in checkpoints.inputs.iter().zip(&files) {
                prop_assert_eq!(f.offset, bytes.len() as u64);
            }
        }
    }

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
