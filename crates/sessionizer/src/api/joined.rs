//! What a library source or an exactly-once file sink shares with the job's
//! [`Checkpoints`](crate::api::checkpoints::Checkpoints): the source moves its position (or
//! the sink appends) as it goes, and every checkpoint records where it stands. These
//! handles sit below both sides, so that neither imports the other.

use sessionizer_checkpoint::{InputPosition, KafkaPosition, KafkaSource, LoadedState, Manifest};
use sessionizer_connectors::RecordWriter;
use sessionizer_connectors::input::{Batch, ReadPosition};
use std::sync::{Arc, Mutex, MutexGuard};

/// The one source of a job's checkpoints: it moves its position as it hands out
/// records, and every checkpoint records where it stands.
#[derive(Debug, Clone)]
pub(crate) enum JoinedSource {
    /// A [`JsonLines::resume`](crate::api::source::JsonLines::resume) source.
    Files(SharedPosition),
    /// A [`KafkaJson`](crate::api::kafka::KafkaJson) source.
    #[cfg(feature = "kafka")]
    Kafka(SharedOffsets),
}

impl JoinedSource {
    /// Record `i` of `batch` was handed out (as an event, a dead letter or a blank
    /// line): the position the next checkpoint records moves just past it.
    pub(crate) fn consumed(&self, batch: &Batch, i: usize) {
        match self {
            JoinedSource::Files(files) => files.lock().consumed(batch, i),
            #[cfg(feature = "kafka")]
            JoinedSource::Kafka(offsets) => {
                let span = batch.lines[i];
                if let Some(slot) = offsets.lock().next.get_mut(span.input as usize) {
                    *slot = i64::try_from(span.at).ok().map(|o| o + 1);
                }
            }
        }
    }
}

/// What a library job's Kafka source reads and how far it has read each partition, as a
/// checkpoint keeps it.
#[derive(Debug, Clone, Default)]
pub(crate) struct SourceProgress {
    /// One partition of a topic or all of them (`None`: no source recorded one).
    pub(crate) source: Option<KafkaSource>,
    /// The next offset of each partition read.
    pub(crate) positions: Vec<KafkaPosition>,
}

impl SourceProgress {
    /// As the checkpoint `found` holds it (nothing without one).
    pub(crate) fn of(found: Option<&(Manifest, LoadedState)>) -> SourceProgress {
        found.map_or_else(SourceProgress::default, |(m, _)| SourceProgress {
            source: m.kafka_source.clone(),
            positions: m.kafka_positions.clone(),
        })
    }
}

/// A file output shared by a sink (which appends) and the checkpoints (which commit its
/// length with each checkpoint).
#[derive(Debug, Clone)]
pub(crate) struct SharedWriter(Arc<Mutex<RecordWriter>>);

impl SharedWriter {
    pub(crate) fn new(writer: RecordWriter) -> SharedWriter {
        SharedWriter(Arc::new(Mutex::new(writer)))
    }

    /// The writer, for one call (a panic elsewhere while it was held leaves at worst
    /// records after the committed length, which a restore cuts off).
    pub(crate) fn lock(&self) -> MutexGuard<'_, RecordWriter> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How far a resumable source has read, shared by the source (which moves it) and the
/// checkpoints (which record it in every checkpoint).
#[derive(Debug, Clone)]
pub(crate) struct SharedPosition(pub(crate) Arc<Mutex<Tracked>>);

impl SharedPosition {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Tracked> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every file's position, as a checkpoint records it.
    pub(crate) fn positions(&self) -> Vec<InputPosition> {
        self.lock().positions()
    }
}

/// How far a resumable source has read its files: just after the last line handed out
/// (as an event, a dead letter or a blank line).
#[derive(Debug)]
pub(crate) struct Tracked {
    /// Each file as opened (path, size, head hash); its position is filled in when
    /// recorded.
    pub(crate) files: Vec<InputPosition>,
    /// Lines of each file handed out (for the files read to their end).
    pub(crate) lines: Vec<u64>,
    /// Just after the last line handed out.
    pub(crate) at: ReadPosition,
}

impl Tracked {
    /// Line `i` of `batch` was handed out.
    pub(crate) fn consumed(&mut self, batch: &Batch, i: usize) {
        let line = batch.lines[i];
        // A line of the input where the last one ended starts there; one of a later
        // input starts at its beginning.
        let start = if line.input == self.at.input {
            self.at.offset
        } else {
            0
        };
        self.lines[line.input as usize] = line.at;
        self.at = match batch.lines.get(i + 1) {
            // The next line follows this one and its terminator.
            Some(next) if next.input == line.input => ReadPosition {
                input: line.input,
                // A record above the size limit is in the batch as its first bytes
                // only: its length and newline are what it took of the file.
                offset: start
                    + batch
                        .oversized_len(i)
                        .map_or(u64::from(next.start - line.start), |len| len + 1),
                line_no: line.at,
            },
            // The batch's last line of the input it ends in.
            _ if line.input == batch.end.input => batch.end,
            // The last line of an input read to its end: the next input, from its start.
            _ => ReadPosition {
                input: line.input + 1,
                offset: 0,
                line_no: 0,
            },
        };
    }

    /// Every file's position.
    pub(crate) fn positions(&self) -> Vec<InputPosition> {
        let at = self.at.input as usize;
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (offset, line) = match i.cmp(&at) {
                    std::cmp::Ordering::Less => (f.size, self.lines[i]),
                    std::cmp::Ordering::Equal => (self.at.offset, self.at.line_no),
                    std::cmp::Ordering::Greater => (0, 0),
                };
                InputPosition {
                    offset,
                    line,
                    ..f.clone()
                }
            })
            .collect()
    }
}

#[cfg(feature = "kafka")]
/// How far a [`KafkaJson`] source has read (the next offset of each partition, `None`:
/// nothing read from it yet) and what it reads, shared by the source (which moves it
/// with every record it hands out) and the checkpoints (which record it in every
/// checkpoint).
#[derive(Debug, Clone)]
pub(crate) struct SharedOffsets(pub(crate) Arc<Mutex<Offsets>>);

#[cfg(feature = "kafka")]
#[derive(Debug)]
pub(crate) struct Offsets {
    pub(crate) source: KafkaSource,
    pub(crate) next: Vec<Option<i64>>,
}

#[cfg(feature = "kafka")]
impl SharedOffsets {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Offsets> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a checkpoint records of the source.
    pub(crate) fn progress(&self) -> SourceProgress {
        let o = self.lock();
        SourceProgress {
            source: Some(o.source.clone()),
            positions: o
                .next
                .iter()
                .enumerate()
                .filter_map(|(p, at)| {
                    at.map(|next_offset| KafkaPosition {
                        topic: o.source.topic.clone(),
                        partition: p as i32,
                        next_offset,
                    })
                })
                .collect(),
        }
    }
}
