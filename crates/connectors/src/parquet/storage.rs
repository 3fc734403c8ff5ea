//! Parquet files as an output's [`Storage`]: an epoch's files are written under
//! temporary names, closed and synced when it is prepared, renamed when it commits;
//! recovery renames those of the checkpoint it resumes from and deletes the rest.

use super::files::{ParquetFiles, ParquetOptions, Staged};
use super::schema::SessionSchema;
use crate::output::OutputTarget;
use crate::sink::{
    EndOfRun, OutputError, Prepared, RecordWriter, Recovered, SinkMark, StagedOutput, Storage,
};
use std::io;
use std::path::PathBuf;

/// Session records as Parquet files in a directory.
#[derive(Debug)]
pub struct ParquetStorage {
    target: OutputTarget,
    schema: SessionSchema,
    options: ParquetOptions,
    files: Option<ParquetFiles>,
    /// The epoch prepared last, until it is committed.
    staged: Option<Staged>,
}

impl ParquetStorage {
    /// Files of `schema` into the directory `target`, not opened yet.
    pub fn new(target: OutputTarget, schema: SessionSchema, options: ParquetOptions) -> Self {
        ParquetStorage {
            target,
            schema,
            options,
            files: None,
            staged: None,
        }
    }

    /// A writer of session records as Parquet files of `schema` into the directory
    /// `target` (created if needed).
    pub fn writer(
        target: OutputTarget,
        schema: SessionSchema,
        options: ParquetOptions,
    ) -> RecordWriter {
        let store = ParquetStorage::new(target.clone(), schema, options);
        RecordWriter::with_storage(target, Box::new(store))
    }

    fn dir(&self) -> Result<PathBuf, OutputError> {
        match &self.target {
            OutputTarget::File(dir) => Ok(dir.clone()),
            _ => Err(OutputError::of(
                &self.target,
                "Parquet files go to a directory, not to stdout or stderr",
            )),
        }
    }
}

impl Storage for ParquetStorage {
    fn find<'m>(&self, role: &str, marks: &'m [SinkMark]) -> Option<&'m SinkMark> {
        marks
            .iter()
            .find(|m| matches!(m, SinkMark::Staged(s) if s.role == role))
    }

    /// The directory is brought back to the checkpoint: the files of its epoch renamed
    /// if they were not yet, every other temporary file deleted, and the final files
    /// of later epochs — or of any epoch without a checkpoint: an earlier run's —
    /// deleted, as a JSON-lines file is cut back or emptied.
    fn recover(
        &mut self,
        epoch: u64,
        mark: Option<&SinkMark>,
        _job: &mut dyn FnMut() -> io::Result<String>,
    ) -> Result<Recovered, OutputError> {
        let dir = self.dir()?;
        let committed = match mark {
            None => None,
            Some(SinkMark::Staged(s)) => Some(Staged {
                epoch: s.epoch,
                files: s.files.clone(),
            }),
            Some(other) => {
                return Err(OutputError::of(
                    &self.target,
                    format!("the checkpoint recorded it as another kind of output ({other:?})"),
                ));
            }
        };
        std::fs::create_dir_all(&dir).map_err(|e| OutputError::of(&self.target, e))?;
        let found = ParquetFiles::recover(&dir, committed.as_ref())
            .map_err(|e| OutputError::of(&self.target, e))?;
        for later in &found.later {
            std::fs::remove_file(dir.join(later)).map_err(|e| OutputError::of(&self.target, e))?;
        }
        let files = ParquetFiles::new(&dir, self.schema.clone(), self.options.clone(), epoch)
            .map_err(|e| OutputError::of(&self.target, e))?;
        self.files = Some(files);
        self.staged = None;
        let mut removed = found.deleted;
        removed.extend(found.later);
        Ok(Recovered {
            found: mark.is_some(),
            removed,
            ..Recovered::default()
        })
    }

    fn write(&mut self, records: &[u8]) -> Result<(), OutputError> {
        if self.files.is_none() {
            // A run without a checkpoint: the directory starts empty at epoch 1.
            self.recover(1, None, &mut || unreachable!("no job asked"))?;
        }
        let files = self.files.as_mut().expect("opened");
        let target = &self.target;
        files
            .write(records)
            .map(drop)
            .map_err(|e| OutputError::of(target, e))
    }

    /// Rows become a row group when there are enough of them, a file at the checkpoint.
    fn flush(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn prepare(&mut self, epoch: u64, role: &str) -> Result<Option<Prepared>, OutputError> {
        let dir = self.dir()?;
        let Some(files) = self.files.as_mut() else {
            return Err(OutputError::of(
                &self.target,
                "the Parquet output is not open",
            ));
        };
        let staged = files
            .prepare(epoch)
            .map_err(|e| OutputError::of(&self.target, e))?;
        let mark = SinkMark::Staged(StagedOutput {
            role: role.to_string(),
            dir: dir.display().to_string(),
            epoch: staged.epoch,
            files: staged.files.clone(),
        });
        self.staged = Some(staged);
        // The files were synced as they were closed.
        Ok(Some(Prepared { mark, sync: None }))
    }

    fn two_phase(&self) -> bool {
        true
    }

    fn commit(&mut self) -> Result<(), OutputError> {
        match (&self.files, self.staged.take()) {
            (Some(files), Some(staged)) => files
                .commit(&staged)
                .map_err(|e| OutputError::of(&self.target, e)),
            _ => Ok(()),
        }
    }

    /// The open epoch, staged and committed at once (also when the run stopped early:
    /// its files are whole and a file run's rows may be repeated by running it again).
    fn end(&mut self, _completed: bool) -> Result<EndOfRun, OutputError> {
        let Some(epoch) = self.files.as_ref().map(ParquetFiles::epoch) else {
            return Ok(EndOfRun::Visible);
        };
        self.prepare(epoch, "")?;
        self.commit()?;
        Ok(EndOfRun::Visible)
    }
}
