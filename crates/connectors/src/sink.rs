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

use crate::encode::{OutputError, PendingSync, RecordWriter};
use crate::output::OutputTarget;
pub use sessionizer_checkpoint::{DeltaEpoch, KafkaTxn, OutputCommit, StagedFileRef, StagedOutput};

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

/// A JSON-lines output in the role `role` of a checkpoint (`sessions`, `dead-letter`,
/// `late`, or a library job's `file`): a regular file is recorded with its length;
/// stdout and stderr are only flushed.
#[derive(Debug)]
pub struct FileSink<'w> {
    /// The output's role in the checkpoint's manifest.
    pub role: &'w str,
    /// The writer.
    pub writer: &'w mut RecordWriter,
}

impl EpochSink for FileSink<'_> {
    fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>, SinkError> {
        #[cfg(feature = "delta")]
        if self.writer.is_delta() {
            let mut mark = self.writer.prepare_delta(epoch)?;
            mark.role = self.role.to_string();
            return Ok(Some(Prepared {
                mark: SinkMark::Delta(mark),
                // The files were synced as they were closed.
                sync: None,
            }));
        }
        #[cfg(feature = "parquet")]
        if self.writer.is_staged() {
            let staged = self.writer.prepare_staged(epoch)?;
            let OutputTarget::File(dir) = self.writer.target() else {
                return Err(SinkError::Internal(
                    "a Parquet output that is not a directory",
                ));
            };
            return Ok(Some(Prepared {
                mark: SinkMark::Staged(staged_output(self.role, dir, &staged)),
                // The files were synced as they were closed.
                sync: None,
            }));
        }
        let _ = epoch;
        let pending = self.writer.prepare_commit()?;
        let (Some(pending), OutputTarget::File(path)) = (pending, self.writer.target()) else {
            return Ok(None);
        };
        Ok(Some(Prepared {
            mark: SinkMark::File(OutputCommit {
                role: self.role.to_string(),
                path: path.display().to_string(),
                committed_bytes: pending.len(),
            }),
            sync: Some(pending),
        }))
    }

    fn two_phase(&self) -> bool {
        self.writer.is_staged()
    }

    fn commit(&mut self, epoch: u64) -> Result<(), SinkError> {
        let _ = epoch;
        #[cfg(feature = "delta")]
        if self.writer.is_delta() {
            self.writer.commit_delta()?;
            return Ok(());
        }
        #[cfg(feature = "parquet")]
        if self.writer.is_staged() {
            self.writer.commit_staged()?;
        }
        Ok(())
    }
}

/// What a checkpoint records of a Parquet output's staged epoch.
#[cfg(feature = "parquet")]
fn staged_output(
    role: &str,
    dir: &std::path::Path,
    staged: &crate::parquet::Staged,
) -> StagedOutput {
    StagedOutput {
        role: role.to_string(),
        dir: dir.display().to_string(),
        epoch: staged.epoch,
        files: staged.files.clone(),
    }
}

/// A checkpoint's record of a Parquet output's staged epoch, as the output's recovery
/// takes it.
#[cfg(feature = "parquet")]
pub fn staged_of(output: &StagedOutput) -> crate::parquet::Staged {
    crate::parquet::Staged {
        epoch: output.epoch,
        files: output.files.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
