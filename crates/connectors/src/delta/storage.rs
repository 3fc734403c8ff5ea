//! A Delta table as an output's [`Storage`]: an epoch's data files are prepared with
//! the checkpoint and committed to the table's log after it, in one commit carrying
//! the job's transaction `(app id, epoch)`; recovery commits a recorded epoch the
//! table lacks and deletes the job's files no commit names (see [`DeltaOutput`]).

use super::table::{DeltaOutput, recorded_location};
use crate::output::OutputTarget;
use crate::parquet::SessionSchema;
use crate::sink::{EndOfRun, OutputError, Prepared, RecordWriter, Recovered, SinkMark, Storage};
use std::io;
use std::time::Duration;

/// Session records appended to a Delta table.
#[derive(Debug)]
pub struct DeltaStorage {
    target: OutputTarget,
    schema: SessionSchema,
    commit_every: Option<Duration>,
    table: Option<Box<DeltaOutput>>,
}

impl DeltaStorage {
    /// The table at `target` (a directory or an `s3://` URL) with the columns `schema`,
    /// committed to at most every `commit_every` (`None`: every epoch); not opened yet.
    pub fn new(
        target: OutputTarget,
        schema: SessionSchema,
        commit_every: Option<Duration>,
    ) -> Self {
        DeltaStorage {
            target,
            schema,
            commit_every,
            table: None,
        }
    }

    /// A writer of session records into the Delta table at `target` (a directory or
    /// an `s3://` URL) with the columns `schema`, committing to the table at most
    /// every `commit_every` (`None`: at every checkpoint). It takes records only once
    /// [`recover`](RecordWriter::recover)ed.
    pub fn writer(
        target: OutputTarget,
        schema: SessionSchema,
        commit_every: Option<Duration>,
    ) -> RecordWriter {
        let store = DeltaStorage::new(target.clone(), schema, commit_every);
        RecordWriter::with_storage(target, Box::new(store))
    }

    fn table(&mut self) -> Result<&mut DeltaOutput, OutputError> {
        if self.table.is_none() {
            return Err(OutputError::of(&self.target, "the Delta table is not open"));
        }
        Ok(self.table.as_mut().expect("open"))
    }
}

impl Storage for DeltaStorage {
    /// The mark of this table in role `role`: the one naming its location when several
    /// tables share the role (a library job's), else the role's only one — whose other
    /// location the recovery then refuses, naming both.
    fn find<'m>(&self, role: &str, marks: &'m [SinkMark]) -> Option<&'m SinkMark> {
        let mut in_role = marks
            .iter()
            .filter(|m| matches!(m, SinkMark::Delta(d) if d.role == role));
        let recorded = match &self.target {
            OutputTarget::File(p) => recorded_location(&p.to_string_lossy()).ok(),
            _ => None,
        };
        let named = in_role
            .clone()
            .find(|m| matches!(m, SinkMark::Delta(d) if Some(&d.table) == recorded.as_ref()));
        named.or_else(|| match (in_role.next(), in_role.next()) {
            (Some(only), None) => Some(only),
            _ => None,
        })
    }

    fn recover(
        &mut self,
        epoch: u64,
        mark: Option<&SinkMark>,
        job: &mut dyn FnMut() -> io::Result<String>,
    ) -> Result<Recovered, OutputError> {
        let OutputTarget::File(location) = &self.target else {
            return Err(OutputError::of(
                &self.target,
                "a Delta table is a directory, not stdout or stderr",
            ));
        };
        let committed = match mark {
            None => None,
            Some(SinkMark::Delta(d)) => Some(d),
            Some(other) => {
                return Err(OutputError::of(
                    &self.target,
                    format!("the checkpoint recorded it as another kind of output ({other:?})"),
                ));
            }
        };
        let job = job().map_err(|e| OutputError::of(&self.target, e))?;
        // The table's location (a directory or an s3:// URL) as the user gave it.
        let location = location.to_string_lossy().into_owned();
        let (mut table, found) =
            DeltaOutput::open(&location, self.schema.clone(), &job, epoch, committed)
                .map_err(|e| OutputError::of(&self.target, e))?;
        table.set_commit_interval(self.commit_every);
        self.table = Some(Box::new(table));
        Ok(Recovered {
            found: mark.is_some(),
            created: found.created,
            rolled_forward: found.rolled_forward,
            removed: found.deleted,
        })
    }

    fn write(&mut self, records: &[u8]) -> Result<(), OutputError> {
        if self.table.is_none() {
            return Err(OutputError::of(
                &self.target,
                "a Delta table is written with checkpoints only (exactly once): give a state directory",
            ));
        }
        let written = self.table()?.write(records);
        written
            .map(drop)
            .map_err(|e| OutputError::of(&self.target, e))
    }

    /// Rows become a row group when there are enough of them, a file at the checkpoint.
    fn flush(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    /// The epoch's data files are closed and synced (uploaded, for a table on S3) and
    /// listed in the mark; the files were synced as they were closed.
    fn prepare(&mut self, epoch: u64, role: &str) -> Result<Option<Prepared>, OutputError> {
        let prepared = self.table()?.prepare(epoch);
        let mut mark = prepared.map_err(|e| OutputError::of(&self.target, e))?;
        mark.role = role.to_string();
        Ok(Some(Prepared {
            mark: SinkMark::Delta(mark),
            sync: None,
        }))
    }

    fn two_phase(&self) -> bool {
        true
    }

    fn commit(&mut self) -> Result<(), OutputError> {
        let Some(table) = self.table.as_mut() else {
            return Ok(());
        };
        let committed = table.commit();
        committed
            .map(drop)
            .map_err(|e| OutputError::of(&self.target, e))
    }

    fn closing(&mut self) {
        if let Some(table) = self.table.as_mut() {
            table.finish();
        }
    }

    /// A table takes a run without checkpoints whole: the run's rows in one commit
    /// when it completed its input, none when it stopped before (its files deleted;
    /// running the whole input again adds each row once).
    fn end(&mut self, completed: bool) -> Result<EndOfRun, OutputError> {
        let Some(table) = self.table.as_mut() else {
            return Ok(EndOfRun::Visible);
        };
        if !completed {
            let aborted = table.abort();
            aborted.map_err(|e| OutputError::of(&self.target, e))?;
            let output = format!("the Delta table {}", self.target.display_name());
            return Ok(EndOfRun::Dropped { output });
        }
        table.finish();
        let epoch = table.epoch();
        self.prepare(epoch, "")?;
        self.commit()?;
        Ok(EndOfRun::Visible)
    }
}
