//! What every input offers a reader: batches of whole records, each with its position
//! as data (the input it came from and its place there: a file's line number, a
//! partition's offset), read on demand. Files and stdin ([`Inputs`](crate::Inputs))
//! and a Kafka topic's partitions (`kafka::TopicRecords`) implement it; a reader of
//! records — the library's sources — is written once over it.
//!
//! Where a source resumes is given when it is opened (a file's byte offset and line,
//! a partition's offset), from what a checkpoint recorded of the positions it handed
//! out.

use crate::encode::SourcePos;
use crate::input::{Batch, InputError};
use std::time::Duration;

/// How much one [`Source::read`] brings at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// About this many bytes of records (a file reads in blocks of whole lines).
    pub bytes: usize,
    /// At most this many records.
    pub records: usize,
    /// How long to wait for the first record when none is ready (a file or stdin
    /// waits until it has one or ends).
    pub wait: Duration,
}

/// What a [`Source::read`] brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Records (at least one), in the batch.
    Records,
    /// Nothing within the wait; more may come.
    Quiet,
    /// The input ended: nothing more will come.
    End,
}

/// Why a source could not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A file or stdin failed.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Kafka refused or did not answer.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),
}

/// An input read in batches of whole records with their positions.
pub trait Source: Send {
    /// Reads the next records into `batch` (what it held is replaced), each with its
    /// position in [`Batch::lines`]; a record longer than the record size limit is
    /// there as its first bytes only ([`Batch::oversized`]).
    fn read(&mut self, batch: &mut Batch, limit: Limit) -> Result<Read, ReadError>;

    /// Position `at` of input `input` as records name it (`file:line`,
    /// `topic/partition@offset`).
    fn pos(&self, input: u32, at: u64) -> SourcePos<'_>;

    /// The largest record in bytes: a longer one is handed out as its first bytes.
    fn set_max_record(&mut self, bytes: usize);
}
