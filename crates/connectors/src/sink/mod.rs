//! What every exactly-once output of a checkpointed job offers the runtime's committer:
//! two phases per checkpoint (an *epoch*).
//!
//! 1. [`EpochSink::prepare`]: everything the sink took so far reaches its storage,
//!    where a recovery can still take it back or find it: a file is written out (its
//!    length noted, its fsync left to the committer's thread), a Kafka transaction is
//!    flushed with a progress record naming the epoch. The sink answers with a
//!    [`SinkMark`], which the checkpoint records.
//! 2. The committer writes the checkpoint (state, source positions, the marks) and,
//!    once it is durable, calls [`EpochSink::commit`] on the sinks whose records become
//!    visible only then ([`EpochSink::two_phase`]: a transaction). A file needs no
//!    second phase: the checkpoint naming its length is its commit.
//!
//! A crash before the checkpoint is durable leaves the previous one as the newest: a
//! file is cut back to the length it names, a transaction was never committed. A crash
//! between the checkpoint and a second phase leaves a prepared epoch, which recovery
//! resolves from the mark: rolled forward if the sink committed it, else the job goes
//! back to the checkpoint before (the mark names it).

mod lines;
pub mod writer;

use sessionizer_checkpoint::Manifest;
pub use sessionizer_checkpoint::{DeltaEpoch, KafkaTxn, OutputCommit, StagedFileRef, StagedOutput};
use std::io;
pub use writer::RecordWriter;

/// What a checkpoint records of one sink's prepared epoch: data, read back on recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkMark {
    /// A file, whose first `committed_bytes` the checkpoint covers: recovery cuts it
    /// back to them.
    File(OutputCommit),
    /// A Kafka transaction holding the epoch's records and a progress record naming
    /// the epoch; recovery reads that record back to learn whether it committed.
    Transaction(KafkaTxn),
    /// Files written under temporary names (Parquet), renamed when the epoch commits;
    /// recovery renames those of the checkpoint it resumes from and deletes the rest.
    Staged(StagedOutput),
    /// Data files written into a Delta table, committed to its log with a transaction
    /// `(app id, epoch)` when the epoch commits; recovery commits them if the table's
    /// transaction version for the app id is below the epoch.
    Delta(DeltaEpoch),
}

/// One sink's prepared epoch.
#[derive(Debug)]
pub struct Prepared {
    /// What the checkpoint records of it.
    pub mark: SinkMark,
    /// What is left to make the epoch's records durable (a file's fsync): the
    /// committer runs it off the driver's thread, before the checkpoint is written.
    pub sync: Option<PendingSync>,
}

/// Why a sink could not take part in a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Writing or syncing a file failed.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Kafka refused or did not answer.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),
    /// The sink was asked something its setup cannot do (a bug, not an input).
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// An output that the runtime's committer makes exactly once with the job's
/// checkpoints (see the module's documentation for the protocol).
pub trait EpochSink {
    /// Phase one of checkpoint `epoch`; `None` when the sink has nothing a checkpoint
    /// can record or take back (stdout: at least once).
    fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>, SinkError>;
    /// Whether the epoch's records become visible only through
    /// [`commit`](Self::commit), which must then wait until the checkpoint is durable.
    fn two_phase(&self) -> bool {
        false
    }
    /// Phase two: checkpoint `epoch`, which recorded this sink's mark, is durable.
    fn commit(&mut self, epoch: u64) -> Result<(), SinkError> {
        let _ = epoch;
        Ok(())
    }
    /// The run failed: what was taken since the last commit does not become visible
    /// where the sink can prevent it (an open transaction is aborted; a file keeps the
    /// bytes past its committed length until the next run cuts them off).
    fn abort(&mut self) {}
}

/// A [`RecordWriter`] in the role `role` of a checkpoint (`sessions`, `dead-letter`,
/// `late`, or a library job's `file` and `table`): the committer's view of it. What a
/// checkpoint records and what a commit does are its [`Storage`]'s.
#[derive(Debug)]
pub struct FileSink<'w> {
    /// The output's role in the checkpoint's manifest.
    pub role: &'w str,
    /// The writer.
    pub writer: &'w mut RecordWriter,
}

impl EpochSink for FileSink<'_> {
    fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>, SinkError> {
        Ok(self.writer.prepare(epoch, self.role)?)
    }

    fn two_phase(&self) -> bool {
        self.writer.two_phase()
    }

    fn commit(&mut self, _epoch: u64) -> Result<(), SinkError> {
        Ok(self.writer.commit()?)
    }
}

/// An error writing an output, naming it.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {name}: {source}")]
pub struct OutputError {
    /// The output's display name ([`OutputTarget::display_name`](crate::OutputTarget::display_name)).
    pub name: String,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

impl OutputError {
    /// The output `target` failed for `reason` (an error of its format or store).
    pub fn of(
        target: &crate::OutputTarget,
        reason: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> OutputError {
        OutputError {
            name: target.display_name(),
            source: io::Error::other(reason),
        }
    }
}

/// Where the records of one output are kept: one implementation per kind of output
/// (JSON lines in a file or stream, Parquet files, a Delta table). A [`RecordWriter`]
/// buffers encoded records (JSON lines) and hands them over in blocks; the runtime's
/// committer and recovery speak to every kind through these calls alone, so a new
/// kind of output is one more implementation.
pub trait Storage: Send {
    /// The mark this output made in role `role` among the marks of the checkpoint a
    /// job resumes from (`None`: the checkpoint did not record it).
    fn find<'m>(&self, role: &str, marks: &'m [SinkMark]) -> Option<&'m SinkMark>;

    /// Brings the output back to the checkpoint that recorded `mark` (`None`: no
    /// checkpoint did, and the output starts empty) and opens it for the records of
    /// epoch `epoch`: a file is cut back to its committed length, a prepared epoch that
    /// did not commit is rolled forward or dropped. `job` names the job's instance,
    /// asked for by an output whose commits carry it (a Delta table's transactions).
    fn recover(
        &mut self,
        epoch: u64,
        mark: Option<&SinkMark>,
        job: &mut dyn FnMut() -> io::Result<String>,
    ) -> Result<Recovered, OutputError>;

    /// Takes a block of encoded records. An output not recovered opens itself empty
    /// first, when it can (a file is created or truncated).
    fn write(&mut self, records: &[u8]) -> Result<(), OutputError>;

    /// Hands what was written to the target where it waits in a buffer (a stream);
    /// rows gathered for a columnar file stay until the epoch is prepared.
    fn flush(&mut self) -> Result<(), OutputError>;

    /// Phase one of checkpoint `epoch` (see [`EpochSink::prepare`]), the output being
    /// in role `role`.
    fn prepare(&mut self, epoch: u64, role: &str) -> Result<Option<Prepared>, OutputError>;

    /// Whether the records become visible only through [`commit`](Self::commit).
    fn two_phase(&self) -> bool {
        false
    }

    /// Phase two: the epoch prepared last becomes visible.
    fn commit(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    /// The next epoch prepared is the run's last: an output that commits less often
    /// than it prepares commits that one whatever its interval.
    fn closing(&mut self) {}

    /// The end of a run without checkpoints, whose records were all written: when it
    /// `completed` its input they become visible (one epoch, prepared and committed);
    /// when it stopped before, an output that can take a run's records only whole
    /// drops them ([`EndOfRun::Dropped`]).
    fn end(&mut self, completed: bool) -> Result<EndOfRun, OutputError>;
}

/// What [`Storage::recover`] found and did; the paths relative to the output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The output's checkpoint mark was given.
    pub found: bool,
    /// The output did not exist and was created (a table).
    pub created: bool,
    /// The epoch the checkpoint prepared and the output had not committed, committed
    /// now (the run before stopped between the two phases).
    pub rolled_forward: Option<u64>,
    /// Files of the job that no checkpoint committed, deleted.
    pub removed: Vec<String>,
}

/// How a run without checkpoints left an output ([`Storage::end`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndOfRun {
    /// Its records are visible.
    Visible,
    /// The run stopped before the end of its input and none of its records were
    /// committed (a table takes a run's records whole or not at all): `output` says
    /// which, for the message.
    Dropped {
        /// The output, as a message names it (`the Delta table /data/t`).
        output: String,
    },
}

/// Every output mark `manifest` records, for [`Storage::find`].
pub fn marks_of(manifest: &Manifest) -> Vec<SinkMark> {
    let files = manifest.outputs.iter().cloned().map(SinkMark::File);
    let staged = manifest.staged.iter().cloned().map(SinkMark::Staged);
    let tables = manifest.delta.iter().cloned().map(SinkMark::Delta);
    files.chain(staged).chain(tables).collect()
}

/// A file output's length at a checkpoint, not yet synced to disk.
#[derive(Debug)]
pub struct PendingSync {
    pub(crate) name: String,
    /// A handle on the file (`None`: it was never opened, so nothing to sync).
    pub(crate) file: Option<std::fs::File>,
    pub(crate) len: u64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputTarget;

    #[test]
    fn a_file_is_recorded_with_the_length_written_and_stdout_is_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.jsonl");
        let mut writer = RecordWriter::new(OutputTarget::File(path.clone()));
        writer.append(b"{\"a\":1}\n", 1).expect("buffered");
        let mut sink = FileSink {
            role: "sessions",
            writer: &mut writer,
        };
        let prepared = sink.prepare(3).expect("prepared").expect("a file");
        let SinkMark::File(commit) = &prepared.mark else {
            panic!("a file's mark: {:?}", prepared.mark);
        };
        assert_eq!(commit.role, "sessions");
        assert_eq!(commit.committed_bytes, 8);
        assert_eq!(std::fs::read(&path).expect("written"), b"{\"a\":1}\n");
        assert_eq!(prepared.sync.expect("a sync").sync().expect("synced"), 8);
        assert!(!sink.two_phase());
        let mut stdout = RecordWriter::new(OutputTarget::Stdout);
        let mut sink = FileSink {
            role: "sessions",
            writer: &mut stdout,
        };
        assert!(sink.prepare(3).expect("flushed").is_none());
    }
}
