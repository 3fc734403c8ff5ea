//! The table side of the Delta output: opening or creating the table, its recovery, and
//! the commit of a prepared epoch.

use super::error::DeltaError;
use super::stats::file_stats;
use super::store::Location;
use crate::parquet::{ParquetFiles, ParquetOptions, SessionSchema};
use deltalake::DeltaTable;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Add, StructType, Transaction};
use deltalake::logstore::ObjectStoreRef;
use deltalake::logstore::object_store::path::Path as StorePath;
use deltalake::logstore::object_store::{ObjectStore, ObjectStoreExt as _};
use deltalake::protocol::{DeltaOperation, OutputMode, SaveMode};
use sessionizer_checkpoint::{DeltaEpoch, DeltaFileRef};
use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The application id of a job's transactions in a table: `sessionizer-<job>`, `job`
/// being the job's instance id.
pub fn app_id(job: &str) -> String {
    format!("sessionizer-{job}")
}

/// How a checkpoint records the table at `location` (a directory: its absolute path;
/// an `s3://` URL as given), so that a restart that names it another way finds it.
pub fn recorded_location(location: &str) -> Result<String, DeltaError> {
    Ok(Location::parse(location)?.record())
}

/// What [`DeltaOutput::open`] did to bring the table back to the checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The table was created (it did not exist).
    pub created: bool,
    /// The epoch whose recorded files were committed now (the run before stopped
    /// between its checkpoint and the table's commit).
    pub rolled_forward: Option<u64>,
    /// The job's data files deleted: no commit names them or ever will (paths relative
    /// to the table's root, sorted).
    pub deleted: Vec<String>,
}

/// A Delta table that session records are appended to, in epochs (see the module's
/// documentation for the protocol).
pub struct DeltaOutput {
    /// Where the data files are written: the table's directory, or for a table on S3
    /// a local staging directory they are uploaded from.
    staging: PathBuf,
    /// Whether the data files are uploaded from `staging`.
    remote: bool,
    /// The table's object store, rooted at the table.
    store: ObjectStoreRef,
    /// Its location as given, for messages.
    label: String,
    /// Its absolute path or URL, for the checkpoint's record.
    location: String,
    /// The job's instance id: its data files' names start with it.
    job: String,
    app_id: String,
    runtime: tokio::runtime::Runtime,
    table: DeltaTable,
    files: ParquetFiles,
    /// The epoch prepared last, until it is committed.
    prepared: Option<DeltaEpoch>,
    /// Commit to the table at most this often (`None`: every epoch).
    commit_every: Option<Duration>,
    /// When the table was last committed to (or the output opened).
    last_commit: Instant,
    /// The files of the epochs prepared since the last table commit.
    pending: Vec<DeltaFileRef>,
    /// The next epoch is the run's last: it commits.
    finishing: bool,
}

impl fmt::Debug for DeltaOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeltaOutput")
            .field("table", &self.label)
            .field("app_id", &self.app_id)
            .field("version", &self.table.version())
            .field("files", &self.files)
            .field("prepared", &self.prepared.as_ref().map(|p| p.epoch))
            .finish()
    }
}

impl DeltaOutput {
    /// Opens the table at `location` — a local directory or `s3://bucket/path` (see
    /// [`store`](super::store)) — (created, with the columns of `schema`, when it has no
    /// table yet) for job `job` (its instance id), whose next rows belong to
    /// checkpoint epoch `epoch`; `committed` is what the checkpoint resumed from
    /// recorded of this output (`None`: no checkpoint).
    /// Brings the table back to that checkpoint first: the recorded epoch is committed
    /// if it was not, and the job's files that no commit names are deleted.
    pub fn open(
        location: &str,
        schema: SessionSchema,
        job: &str,
        epoch: u64,
        committed: Option<&DeltaEpoch>,
    ) -> Result<(DeltaOutput, Recovered), DeltaError> {
        let label = location.to_string();
        let app_id = app_id(job);
        let where_ = Location::parse(location)?;
        // The record names a local table by its absolute path: the run may be started
        // from another directory, or name the table another way. (A table directory that
        // is gone is still the one recorded: its recorded files are then found missing.)
        let recorded = where_.record();
        if let Some(c) = committed
            && (c.app_id != app_id || recorded != c.table)
        {
            return Err(DeltaError::Mismatch {
                recorded_table: c.table.clone(),
                recorded_app: c.app_id.clone(),
                table: label,
                app_id,
            });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(DeltaError::Runtime)?;
        let mut found = Recovered::default();
        let url = where_.url(&label)?;
        let (table, created) = runtime.block_on(open_or_create(url, &label, &schema))?;
        found.created = created;
        let staging = where_.staging(&app_id)?;
        let store = table.log_store().object_store(None);
        let mut output = DeltaOutput {
            staging: staging.clone(),
            remote: where_.is_remote(),
            store,
            location: where_.record(),
            label,
            job: job.to_string(),
            app_id,
            runtime,
            table,
            files: ParquetFiles::new(
                &staging,
                schema,
                ParquetOptions {
                    final_names: Some(job.to_string()),
                    ..ParquetOptions::default()
                },
                epoch,
            )?,
            prepared: None,
            commit_every: None,
            last_commit: Instant::now(),
            pending: Vec::new(),
            finishing: false,
        };
        let version = output.transaction_version()?;
        let resumed = committed.map(|c| c.epoch);
        if let Some(v) = version
            && resumed.is_none_or(|e| v > e as i64)
        {
            return Err(DeltaError::Ahead {
                table: output.label,
                app_id: output.app_id,
                committed: v,
                resumed,
            });
        }
        if let Some(c) = committed
            && !c.files.is_empty()
            && version.is_none_or(|v| v < c.epoch as i64)
        {
            for f in &c.files {
                output.check_recorded(f)?;
            }
            if c.pending {
                // Written before the checkpoint, committed by none yet: the next
                // commit takes them.
                output.pending = c.files.clone();
            } else {
                output.commit_epoch(c)?;
                found.rolled_forward = Some(c.epoch);
            }
        }
        found.deleted = output.delete_unnamed(job, committed)?;
        Ok((output, found))
    }

    /// The table's location, as given.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The job's application id in the table.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// Commits to the table at most every `every` (`None`: at every epoch); the epochs
    /// in between record their files, which the next commit adds.
    pub fn set_commit_interval(&mut self, every: Option<Duration>) {
        self.commit_every = every;
    }

    /// The next epoch prepared is the run's last: it commits whatever the interval.
    pub fn finish(&mut self) {
        self.finishing = true;
    }

    /// The epoch whose rows are being written.
    pub fn epoch(&self) -> u64 {
        self.files.epoch()
    }

    /// Adds encoded session records (JSON lines), as
    /// [`ParquetFiles::write`](crate::parquet::ParquetFiles::write) does; returns how
    /// many there were.
    pub fn write(&mut self, records: &[u8]) -> Result<u64, DeltaError> {
        Ok(self.files.write(records)?)
    }

    /// Phase one of epoch `epoch`: its files are closed and synced, and returned with
    /// what their Add actions need, for the checkpoint to record (its `role` left
    /// empty: the caller's).
    pub fn prepare(&mut self, epoch: u64) -> Result<DeltaEpoch, DeltaError> {
        let staged = self.files.prepare(epoch)?;
        let mut files = Vec::with_capacity(staged.files.len());
        for f in staged.files {
            let path = self.staging.join(&f.name);
            let (stats, rows) = file_stats(&path)?;
            let modified = if self.remote {
                self.upload(&path, &f.name)?;
                SystemTime::now()
            } else {
                fs::metadata(&path)
                    .and_then(|m| m.modified())
                    .map_err(io_error("inspect", &path))?
            };
            files.push(DeltaFileRef {
                path: f.name,
                rows,
                bytes: f.bytes,
                modified_unix_ms: modified
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64),
                stats,
            });
        }
        self.pending.extend(files);
        let due = self.finishing
            || self
                .commit_every
                .is_none_or(|every| self.last_commit.elapsed() >= every);
        let mark = DeltaEpoch {
            role: String::new(),
            table: self.location.clone(),
            app_id: self.app_id.clone(),
            epoch,
            files: self.pending.clone(),
            pending: !due,
        };
        self.prepared = Some(mark.clone());
        Ok(mark)
    }

    /// Phase two: when the epoch prepared last is due to commit, its files and those of
    /// the epochs before it since the last commit are committed to the table, in one
    /// commit carrying the transaction `(app id, epoch)`. Returns the table version it
    /// made (`None`: no rows, not due, or nothing was prepared).
    pub fn commit(&mut self) -> Result<Option<u64>, DeltaError> {
        let Some(mark) = self.prepared.take() else {
            return Ok(None);
        };
        if mark.pending {
            return Ok(None);
        }
        let version = match mark.files.is_empty() {
            true => None,
            false => Some(self.commit_epoch(&mark)?),
        };
        self.pending.clear();
        self.last_commit = Instant::now();
        Ok(version)
    }

    /// Drops the open epoch: its files are deleted (they are in no commit).
    pub fn abort(&mut self) -> Result<(), DeltaError> {
        if let Some(mark) = self.prepared.take()
            && self.remote
        {
            // Uploaded when prepared: the epoch's own files (not those of the pending
            // epochs before it, which a later commit still adds).
            let own = |f: &DeltaFileRef| epoch_of(&f.path, &self.job) == Some(mark.epoch);
            for f in mark.files.iter().filter(|f| own(f)) {
                self.delete(&f.path)?;
            }
            self.pending.retain(|f| !own(f));
        }
        Ok(self.files.abort()?)
    }

    /// Uploads the data file `path` (in the staging directory) as `name` in the table,
    /// then removes the local copy.
    fn upload(&self, path: &Path, name: &str) -> Result<(), DeltaError> {
        let store = self.store.clone();
        let target = StorePath::from(name);
        let result: Result<(), deltalake::ObjectStoreError> = self.runtime.block_on(async {
            use tokio::io::AsyncWriteExt as _;
            let mut file = tokio::fs::File::open(path).await.map_err(|e| {
                deltalake::ObjectStoreError::Generic {
                    store: "local staging",
                    source: Box::new(e),
                }
            })?;
            let mut writer =
                deltalake::logstore::object_store::buffered::BufWriter::new(store, target);
            tokio::io::copy(&mut file, &mut writer).await.map_err(|e| {
                deltalake::ObjectStoreError::Generic {
                    store: "S3",
                    source: Box::new(e),
                }
            })?;
            writer
                .shutdown()
                .await
                .map_err(|e| deltalake::ObjectStoreError::Generic {
                    store: "S3",
                    source: Box::new(e),
                })
        });
        result.map_err(self.store_failed("upload a data file"))?;
        fs::remove_file(path).map_err(io_error("remove the uploaded", path))
    }

    /// Deletes the data file `name` of the table (gone already is fine).
    fn delete(&self, name: &str) -> Result<(), DeltaError> {
        let path = StorePath::from(name);
        match self.runtime.block_on(self.store.delete(&path)) {
            Ok(()) | Err(deltalake::ObjectStoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_failed("delete a data file")(e)),
        }
    }

    /// A recorded file must be there, as long as recorded, before a commit names it.
    fn check_recorded(&self, f: &DeltaFileRef) -> Result<(), DeltaError> {
        let path = StorePath::from(f.path.as_str());
        let lost = |what: String| DeltaError::Lost {
            path: PathBuf::from(format!("{}/{}", self.label.trim_end_matches('/'), f.path)),
            what,
        };
        match self.runtime.block_on(self.store.head(&path)) {
            Ok(m) if m.size == f.bytes => Ok(()),
            Ok(m) => Err(lost(format!(
                "{} bytes long, not the {} recorded",
                m.size, f.bytes
            ))),
            Err(deltalake::ObjectStoreError::NotFound { .. }) => Err(lost("missing".into())),
            Err(e) => Err(self.store_failed("inspect a recorded data file")(e)),
        }
    }

    fn store_failed(
        &self,
        action: &'static str,
    ) -> impl FnOnce(deltalake::ObjectStoreError) -> DeltaError + use<> {
        let table = self.label.clone();
        move |source| DeltaError::Table {
            table,
            action,
            source: Box::new(source.into()),
        }
    }

    /// The table's last transaction version of this job.
    pub fn transaction_version(&self) -> Result<Option<i64>, DeltaError> {
        let table = &self.table;
        self.runtime
            .block_on(async {
                let state = table.snapshot()?;
                state
                    .transaction_version(table.log_store().as_ref(), &self.app_id)
                    .await
            })
            .map_err(self.failed("read the transaction of its application id"))
    }

    /// The table's version.
    pub fn version(&self) -> Option<u64> {
        self.table.version()
    }

    fn commit_epoch(&mut self, mark: &DeltaEpoch) -> Result<u64, DeltaError> {
        let actions = mark
            .files
            .iter()
            .map(|f| {
                Action::Add(Add {
                    path: f.path.clone(),
                    partition_values: HashMap::new(),
                    size: f.bytes as i64,
                    modification_time: f.modified_unix_ms,
                    data_change: true,
                    stats: Some(f.stats.clone()),
                    tags: None,
                    deletion_vector: None,
                    base_row_id: None,
                    default_row_commit_version: None,
                    clustering_provider: None,
                })
            })
            .collect();
        let version = mark.epoch as i64;
        let properties = CommitProperties::default()
            .with_application_transaction(Transaction::new(&self.app_id, version));
        let operation = DeltaOperation::StreamingUpdate {
            output_mode: OutputMode::Append,
            query_id: self.app_id.clone(),
            epoch_id: version,
        };
        let app_id = self.app_id.clone();
        let table = &mut self.table;
        let committed = self
            .runtime
            .block_on(async {
                let snapshot = table.snapshot()?;
                let done = CommitBuilder::from(properties)
                    .with_actions(actions)
                    .build(Some(snapshot), table.log_store(), operation)
                    .await;
                match done {
                    Ok(done) => {
                        // The commit's own snapshot: reloading the table would read the
                        // log again.
                        table.state = Some(done.snapshot());
                        Ok(done.version())
                    }
                    Err(e) => {
                        // Another writer of the same application id (a process that held
                        // the job's work before) may have committed this very epoch
                        // first: then it is in the table, once, and that is a success.
                        table.update_incremental(None).await?;
                        let state = table.snapshot()?;
                        let theirs = state
                            .transaction_version(table.log_store().as_ref(), &app_id)
                            .await?;
                        match (theirs, table.version()) {
                            (Some(t), Some(v)) if t >= version => Ok(v),
                            _ => Err(e),
                        }
                    }
                }
            })
            .map_err(self.failed_commit())?;
        Ok(committed)
    }

    fn failed(
        &self,
        action: &'static str,
    ) -> impl FnOnce(deltalake::DeltaTableError) -> DeltaError {
        let table = self.label.clone();
        move |source| DeltaError::Table {
            table,
            action,
            source: Box::new(source),
        }
    }

    fn failed_commit(&self) -> impl FnOnce(deltalake::DeltaTableError) -> DeltaError + use<> {
        let table = self.label.clone();
        move |source| DeltaError::Table {
            table,
            action: "commit",
            source: Box::new(source),
        }
    }

    /// Deletes the job's data files that no commit names or will name: those of epochs
    /// after the checkpoint resumed from, and those of its epoch that it does not list.
    fn delete_unnamed(
        &self,
        job: &str,
        committed: Option<&DeltaEpoch>,
    ) -> Result<Vec<String>, DeltaError> {
        let listed = self
            .runtime
            .block_on(self.store.list_with_delimiter(None))
            .map_err(self.store_failed("list the data files"))?;
        let mut deleted = Vec::new();
        for object in listed.objects {
            let Some(name) = object.location.filename() else {
                continue;
            };
            let Some(epoch) = epoch_of(name, job) else {
                continue;
            };
            let named = match committed {
                None => false,
                Some(c) => epoch < c.epoch || c.files.iter().any(|f| f.path == name),
            };
            if !named {
                self.delete(name)?;
                deleted.push(name.to_string());
            }
        }
        if !deleted.is_empty() && !self.remote {
            fs::File::open(&self.staging)
                .and_then(|d| d.sync_all())
                .map_err(io_error("sync the directory", &self.staging))?;
        }
        deleted.sort();
        Ok(deleted)
    }
}

/// The last transaction version of application id `app_id` in the table at `location`
/// (a local directory or `s3://bucket/path`; `None`: it never committed there), and the
/// table's version; without writing anything.
pub fn committed_version(
    location: &str,
    app_id: &str,
) -> Result<(Option<i64>, Option<u64>), DeltaError> {
    let label = location.to_string();
    let url = Location::parse(location)?.read_url(&label)?;
    let failed = |source| DeltaError::Table {
        table: label.clone(),
        action: "read the table",
        source: Box::new(source),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DeltaError::Runtime)?;
    runtime
        .block_on(async {
            let table = deltalake::open_table(url).await?;
            let state = table.snapshot()?;
            let txn = state
                .transaction_version(table.log_store().as_ref(), app_id)
                .await?;
            Ok((txn, table.version()))
        })
        .map_err(failed)
}

/// Loads the table at `dir`, or creates it with `schema`'s columns; an existing table
/// must have exactly those columns. Returns whether it was created.
async fn open_or_create(
    url: url::Url,
    label: &str,
    schema: &SessionSchema,
) -> Result<(DeltaTable, bool), DeltaError> {
    let failed = |action| {
        move |source| DeltaError::Table {
            table: label.to_string(),
            action,
            source: Box::new(source),
        }
    };
    let ours: StructType = schema
        .arrow_schema()
        .as_ref()
        .try_into_kernel()
        .map_err(|e| failed("convert the session columns")(e.into()))?;
    let mut table = deltalake::DeltaTableBuilder::from_url(url)
        .and_then(deltalake::DeltaTableBuilder::build)
        .map_err(failed("open the location"))?;
    // A location without a log is no table yet: loading it would fail (and delta-rs
    // would log that failure as an error).
    if table
        .log_store()
        .is_delta_table_location()
        .await
        .map_err(failed("look for the log"))?
    {
        table.load().await.map_err(failed("read the log"))?;
    }
    if table.version().is_none() {
        let created = table
            .clone()
            .create()
            .with_columns(ours.fields().cloned())
            .with_save_mode(SaveMode::ErrorIfExists)
            .with_comment("sessions written by sessionizer")
            // Losing the race for version 0 to another writer must fail: retried, the
            // creation would land as a later version with a table id of its own, and
            // every other writer's next commit would be refused for the changed
            // metadata.
            .with_commit_properties(CommitProperties::default().with_max_retries(0))
            .await;
        match created {
            Ok(table) => return Ok((table, true)),
            // Another writer created it first (its version 0 is put if absent): the
            // table is theirs, as if it had been there.
            Err(_)
                if table
                    .log_store()
                    .is_delta_table_location()
                    .await
                    .unwrap_or(false) =>
            {
                table.load().await.map_err(failed("read the log"))?;
            }
            Err(e) => return Err(failed("create the table")(e)),
        }
    }
    let theirs = table
        .snapshot()
        .map_err(failed("read the schema"))?
        .schema();
    let differences = schema_differences(&theirs, &ours);
    if !differences.is_empty() {
        return Err(DeltaError::Schema {
            table: label.to_string(),
            differences,
        });
    }
    Ok((table, false))
}

/// How the table's columns `theirs` differ from the session records' `ours` (names,
/// types, and a column of ours that may be null where the table's may not).
pub(super) fn schema_differences(theirs: &StructType, ours: &StructType) -> Vec<String> {
    let mut out = Vec::new();
    for field in ours.fields() {
        match theirs.field(field.name()) {
            None => out.push(format!(
                "the table has no column `{}` ({})",
                field.name(),
                field.data_type()
            )),
            Some(t) if t.data_type() != field.data_type() => out.push(format!(
                "column `{}` is {} in the table, {} in the session records",
                field.name(),
                t.data_type(),
                field.data_type()
            )),
            Some(t) if field.is_nullable() && !t.is_nullable() => out.push(format!(
                "column `{}` is not nullable in the table, but the session records may leave it null",
                field.name()
            )),
            Some(_) => {}
        }
    }
    for field in theirs.fields() {
        if ours.field(field.name()).is_none() {
            out.push(format!(
                "the table has a column `{}` ({}) that the session records do not have",
                field.name(),
                field.data_type()
            ));
        }
    }
    out
}

/// The epoch of a data file of job `job`, from its name
/// `part-<job>-<epoch>-<n>.parquet`.
fn epoch_of(name: &str, job: &str) -> Option<u64> {
    let stem = name
        .strip_prefix("part-")?
        .strip_prefix(job)?
        .strip_prefix('-')?
        .strip_suffix(".parquet")?;
    let (epoch, n) = stem.split_once('-')?;
    if epoch.len() != 20 || n.len() != 5 {
        return None;
    }
    n.parse::<u32>().ok()?;
    epoch.parse().ok()
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DeltaError + use<> {
    let path = path.to_path_buf();
    move |source| DeltaError::Io {
        action,
        path,
        source,
    }
}
