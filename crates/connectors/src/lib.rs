#![warn(missing_docs)]
//! Sources and sinks at the edges of sessionizer.
//!
//! * [`input`] — JSON-lines input from files (read in the order given) or stdin, split
//!   into lines with their file and line number, in large buffered reads.
//! * [`encode`] — the output records (sessions, retractions, dead letters, late events;
//!   docs/semantics.md S-16, S-9, S-14, S-6) written as JSON lines into batch buffers.
//! * [`source`] — what every input offers a reader: batches of whole records with
//!   their positions (the [`Source`](source::Source) trait: files and stdin, Kafka).
//! * [`output`] — where those bytes go: a file or stdout.
//! * [`sink`] — the outputs: the [`RecordWriter`] that buffers encoded records, the
//!   [`Storage`](sink::Storage) trait every kind of output implements (JSON lines here,
//!   Parquet and Delta below: recover, write, prepare an epoch, commit it), and what an
//!   exactly-once output offers the runtime's committer (the mark a checkpoint records).
//! * `parquet` (cargo feature `parquet`) — session records as typed Parquet files in a
//!   directory, rolled per checkpoint and committed in two phases.
//! * `delta` (cargo feature `delta`) — session records appended to a Delta Lake table
//!   as those Parquet files, one table commit per checkpoint, exactly once.
//! * `kafka` (cargo feature `kafka`) — Apache Kafka topics: a consumer group member,
//!   a transactional producer, the changelog topics of the tasks' state.

#[cfg(feature = "delta")]
pub mod delta;
pub mod encode;
pub mod input;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod output;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod secrets;
pub mod sink;
pub mod source;

pub use encode::SessionEncoder;
pub use input::{Batch, InputSource, Inputs, LineSpan};
pub use output::OutputTarget;
pub use sink::RecordWriter;
