//! The rolling files of a Parquet output and their two-phase commit per epoch.

use super::error::ParquetError;
use super::schema::{Builders, Row, SessionSchema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Component, Path, PathBuf};

/// How a [`ParquetFiles`] splits its rows into row groups, files and directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Rows per row group; they wait in memory until then (or until the file is
    /// closed). Default 65,536.
    pub row_group_rows: usize,
    /// A file is closed after the row group that takes it to this many bytes or more,
    /// so a file may pass it by up to one row group. Default 128 MiB.
    pub max_file_bytes: u64,
    /// Files in Hive-style directories by the UTC date of the session's start
    /// (`dt=2024-01-01/`). Default off.
    pub partition_by_date: bool,
    /// Files written under their final names `part-<tag>-<epoch>-<n>.parquet` from the
    /// start, for a directory whose readers see only the files something else lists
    /// (a Delta table's log): the epoch's commit then names them rather than renaming
    /// them, and the tag tells one writer's files from another's. Default `None`:
    /// hidden temporary names, renamed on commit.
    pub final_names: Option<String>,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            row_group_rows: 65_536,
            max_file_bytes: 128 << 20,
            partition_by_date: false,
            final_names: None,
        }
    }
}

/// The files of one prepared epoch, under their temporary names: what a checkpoint
/// records so that the epoch can be committed, also by a later process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    /// The checkpoint epoch.
    pub epoch: u64,
    /// The files, in the order they were opened.
    pub files: Vec<StagedFile>,
}

/// One staged file, as a checkpoint's manifest records it: the temporary path
/// (`.part-<epoch>-<n>.parquet.tmp`) and the final one (`part-<epoch>-<n>.parquet`, or
/// under `dt=YYYY-MM-DD/`), relative to the output directory with `/` between names, its
/// rows and its length.
pub use sessionizer_checkpoint::StagedFileRef as StagedFile;

/// What [`ParquetFiles::recover`] did and found. Paths as in [`StagedFile`], sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Files of the committed epoch renamed now: the run stopped before renaming them.
    pub renamed: Vec<String>,
    /// Temporary files deleted: they belonged to epochs that never committed.
    pub deleted: Vec<String>,
    /// Final files of epochs after the committed one (every final file when none
    /// committed), left in place: a checkpoint that committed them is gone, so a run
    /// that replays those rows writes them again under other names. The caller decides
    /// whether that is an error.
    pub later: Vec<String>,
}

/// A Parquet output directory written in epochs.
///
/// Rows go to the open file of their directory (one per date when partitioned), under
/// a temporary name. [`prepare`](Self::prepare) closes the epoch's files and hands back
/// their list; [`commit`](Self::commit) gives them their final names.
pub struct ParquetFiles {
    dir: PathBuf,
    schema: SessionSchema,
    options: ParquetOptions,
    props: WriterProperties,
    /// The epoch whose rows are being written.
    epoch: u64,
    /// The number of the next file of the epoch.
    next_file: u32,
    /// The open file of each directory (`""` or `dt=...`).
    open: BTreeMap<String, OpenFile>,
    /// Files of the epoch closed because they were full.
    closed: Vec<StagedFile>,
    /// A write failed: what the open files hold is not known.
    failed: bool,
}

struct OpenFile {
    file: StagedFile,
    /// The temporary file's full path.
    path: PathBuf,
    builders: Builders,
    writer: ArrowWriter<File>,
}

impl fmt::Debug for ParquetFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParquetFiles")
            .field("dir", &self.dir)
            .field("epoch", &self.epoch)
            .field("open", &self.open.keys().collect::<Vec<_>>())
            .field("closed", &self.closed.len())
            .field("failed", &self.failed)
            .finish()
    }
}

impl ParquetFiles {
    /// An output into `dir` (created if missing) whose first rows belong to checkpoint
    /// epoch `epoch`. A restarted run calls [`recover`](Self::recover) first.
    pub fn new(
        dir: impl Into<PathBuf>,
        schema: SessionSchema,
        options: ParquetOptions,
        epoch: u64,
    ) -> Result<ParquetFiles, ParquetError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_error("create the directory", &dir))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(options.row_group_rows.max(1)))
            .build();
        Ok(ParquetFiles {
            dir,
            schema,
            options,
            props,
            epoch,
            next_file: 0,
            open: BTreeMap::new(),
            closed: Vec::new(),
            failed: false,
        })
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The table's columns.
    pub fn schema(&self) -> &SessionSchema {
        &self.schema
    }

    /// The epoch whose rows are being written (the next to be prepared).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Adds the encoded records in `records` (JSON lines; blank lines are skipped) and
    /// returns how many there were. Either every record of the call fits the table and
    /// all are added, or none is. After a failed write or sync nothing more is written
    /// or prepared until [`abort`](Self::abort): how much of the open files reached the
    /// disk is not known.
    pub fn write(&mut self, records: &[u8]) -> Result<u64, ParquetError> {
        if self.failed {
            return Err(self.failed_error());
        }
        if self.schema.is_rows() {
            let batches = self.schema.decode_rows(records)?;
            let mut rows = 0;
            for batch in &batches {
                let added = self.add_batch(batch);
                self.failed |= added.is_err();
                added?;
                rows += batch.num_rows() as u64;
            }
            return Ok(rows);
        }
        let rows = records
            .split(|&b| b == b'\n')
            .filter(|line| !line.trim_ascii().is_empty())
            .map(|line| {
                self.schema
                    .parse(line)
                    .map_err(|reason| ParquetError::Record {
                        record: shorten(line),
                        reason,
                    })
            })
            .collect::<Result<Vec<Row>, _>>()?;
        for row in &rows {
            let added = self.add(row);
            self.failed |= added.is_err();
            added?;
        }
        Ok(rows.len() as u64)
    }

    fn add(&mut self, row: &Row) -> Result<(), ParquetError> {
        let sub = if self.options.partition_by_date {
            row.date_dir()
        } else {
            String::new()
        };
        let (group_rows, max_bytes) = (self.options.row_group_rows, self.options.max_file_bytes);
        let open = self.open_file(sub.clone())?;
        open.builders.append(row);
        open.file.rows += 1;
        if open.builders.rows() >= group_rows {
            open.write_group()?;
            if open.file.bytes >= max_bytes {
                self.close(&sub)?;
            }
        }
        Ok(())
    }

    /// The open file of directory `sub`, opened now if there is none.
    fn open_file(&mut self, sub: String) -> Result<&mut OpenFile, ParquetError> {
        Ok(match self.open.entry(sub) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let n = self.next_file;
                let file = create(
                    &self.dir,
                    e.key(),
                    (self.epoch, n),
                    self.options.final_names.as_deref(),
                    &self.schema,
                    &self.props,
                )?;
                self.next_file += 1;
                e.insert(file)
            }
        })
    }

    /// Adds a batch of a library job's own rows (no directories by date: the columns
    /// are the user's).
    fn add_batch(&mut self, batch: &arrow_array::RecordBatch) -> Result<(), ParquetError> {
        let max_bytes = self.options.max_file_bytes;
        let open = self.open_file(String::new())?;
        // The writer cuts its row groups itself.
        open.writer.write(batch).map_err(open.parquet_error())?;
        open.file.rows += batch.num_rows() as u64;
        open.file.bytes = (open.writer.bytes_written() + open.writer.in_progress_size()) as u64;
        if open.file.bytes >= max_bytes {
            self.close("")?;
        }
        Ok(())
    }

    fn close(&mut self, sub: &str) -> Result<(), ParquetError> {
        if let Some(open) = self.open.remove(sub) {
            let file = open.finish()?;
            self.closed.push(file);
        }
        Ok(())
    }

    /// Closes every open file of epoch `epoch` (the open epoch): the last row group and
    /// the footer are written, the files and their directories synced. Returns the
    /// epoch's files under their temporary names, for the checkpoint to record; the
    /// next rows belong to epoch `epoch + 1`. An epoch without rows has no files.
    pub fn prepare(&mut self, epoch: u64) -> Result<Staged, ParquetError> {
        if self.failed {
            return Err(self.failed_error());
        }
        if epoch != self.epoch {
            return Err(ParquetError::Epoch {
                asked: epoch,
                open: self.epoch,
            });
        }
        let staged = self.stage(epoch);
        // A failed sync may have dropped pages: the files are not to be trusted.
        self.failed |= staged.is_err();
        staged
    }

    fn stage(&mut self, epoch: u64) -> Result<Staged, ParquetError> {
        self.close_all()?;
        // The new names must survive a crash too, or the commit after it finds nothing.
        let mut dirs: BTreeSet<PathBuf> = self
            .closed
            .iter()
            .filter_map(|f| self.dir.join(&f.temp).parent().map(Path::to_path_buf))
            .collect();
        if !self.closed.is_empty() {
            dirs.insert(self.dir.clone());
        }
        for d in &dirs {
            sync_dir(d)?;
        }
        let mut files = std::mem::take(&mut self.closed);
        files.sort_by(|a, b| base_name(&a.name).cmp(base_name(&b.name)));
        self.epoch += 1;
        self.next_file = 0;
        Ok(Staged { epoch, files })
    }

    fn close_all(&mut self) -> Result<(), ParquetError> {
        while let Some((_, open)) = self.open.pop_first() {
            let file = open.finish()?;
            self.closed.push(file);
        }
        Ok(())
    }

    /// Gives the files of a prepared epoch their final names and syncs their
    /// directories. A file already renamed is skipped, so a commit may be repeated (as
    /// recovery does); a file under neither name is an error.
    pub fn commit(&self, staged: &Staged) -> Result<(), ParquetError> {
        commit_in(&self.dir, staged).map(|_| ())
    }

    /// Drops the open epoch: its files, open or already closed, are deleted. Epochs
    /// prepared before are not touched (a restart's [`recover`](Self::recover) deletes
    /// those that did not commit). The next rows start the epoch's files again from
    /// number 0.
    pub fn abort(&mut self) -> Result<(), ParquetError> {
        let open = std::mem::take(&mut self.open);
        let mut temps: Vec<String> = self.closed.drain(..).map(|f| f.temp).collect();
        temps.extend(open.into_values().map(|o| o.file.temp));
        self.next_file = 0;
        self.failed = false;
        for temp in temps {
            let path = self.dir.join(&temp);
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_error("remove", &path)(e));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Brings `dir` back to the state after epoch `committed` (the one the restarted
    /// run resumes from; `None` when there is none): the committed epoch's files not
    /// yet renamed are renamed, and every other temporary file is deleted.
    pub fn recover(dir: &Path, committed: Option<&Staged>) -> Result<Recovered, ParquetError> {
        let mut found = Recovered::default();
        if let Some(staged) = committed {
            found.renamed = commit_in(dir, staged)?;
        }
        let mut dirs = vec![(String::new(), dir.to_path_buf())];
        for (name, path) in entries(dir)? {
            if name.starts_with("dt=") && path.is_dir() {
                dirs.push((format!("{name}/"), path));
            }
        }
        for (sub, path) in dirs {
            let mut deleted_here = false;
            for (name, file) in entries(&path)? {
                if is_temp_name(&name) {
                    fs::remove_file(&file).map_err(io_error("remove", &file))?;
                    found.deleted.push(format!("{sub}{name}"));
                    deleted_here = true;
                } else if let Some(epoch) = final_epoch(&name)
                    && committed.is_none_or(|c| epoch > c.epoch)
                {
                    found.later.push(format!("{sub}{name}"));
                }
            }
            if deleted_here {
                sync_dir(&path)?;
            }
        }
        found.renamed.sort();
        found.deleted.sort();
        found.later.sort();
        Ok(found)
    }

    fn failed_error(&self) -> ParquetError {
        ParquetError::Failed {
            dir: self.dir.clone(),
        }
    }
}

impl OpenFile {
    /// Writes the rows gathered as one row group.
    fn write_group(&mut self) -> Result<(), ParquetError> {
        let batch = self.builders.finish()?;
        self.writer.write(&batch).map_err(self.parquet_error())?;
        self.writer.flush().map_err(self.parquet_error())?;
        self.file.bytes = self.writer.bytes_written() as u64;
        Ok(())
    }

    /// Writes the last row group and the footer and syncs the file.
    fn finish(mut self) -> Result<StagedFile, ParquetError> {
        if self.builders.rows() > 0 {
            self.write_group()?;
        }
        let failed = self.parquet_error();
        let file = self.writer.into_inner().map_err(failed)?;
        file.sync_all().map_err(io_error("sync", &self.path))?;
        self.file.bytes = file
            .metadata()
            .map_err(io_error("inspect", &self.path))?
            .len();
        Ok(self.file)
    }

    fn parquet_error(&self) -> impl FnOnce(parquet::errors::ParquetError) -> ParquetError + use<> {
        let path = self.path.clone();
        move |source| ParquetError::Parquet { path, source }
    }
}

/// Opens file `n` of `epoch` in directory `sub` of `dir`, under its temporary name (or,
/// with a `final_tag`, under its final name).
fn create(
    dir: &Path,
    sub: &str,
    (epoch, n): (u64, u32),
    final_tag: Option<&str>,
    schema: &SessionSchema,
    props: &WriterProperties,
) -> Result<OpenFile, ParquetError> {
    let stem = match final_tag {
        None => format!("part-{epoch:020}-{n:05}"),
        Some(tag) => format!("part-{tag}-{epoch:020}-{n:05}"),
    };
    let (temp, name) = if final_tag.is_some() {
        let name = if sub.is_empty() {
            format!("{stem}.parquet")
        } else {
            let sub_dir = dir.join(sub);
            fs::create_dir_all(&sub_dir).map_err(io_error("create the directory", &sub_dir))?;
            format!("{sub}/{stem}.parquet")
        };
        (name.clone(), name)
    } else if sub.is_empty() {
        (format!(".{stem}.parquet.tmp"), format!("{stem}.parquet"))
    } else {
        let sub_dir = dir.join(sub);
        fs::create_dir_all(&sub_dir).map_err(io_error("create the directory", &sub_dir))?;
        (
            format!("{sub}/.{stem}.parquet.tmp"),
            format!("{sub}/{stem}.parquet"),
        )
    };
    let path = dir.join(&temp);
    let file = File::create(&path).map_err(io_error("create", &path))?;
    let writer = ArrowWriter::try_new(file, schema.arrow_schema(), Some(props.clone())).map_err(
        |source| ParquetError::Parquet {
            path: path.clone(),
            source,
        },
    )?;
    Ok(OpenFile {
        path,
        file: StagedFile {
            temp,
            name,
            rows: 0,
            bytes: 0,
        },
        builders: Builders::new(schema),
        writer,
    })
}

/// Renames the staged files of `staged` in `dir` to their final names; returns those
/// renamed now (the others were renamed before).
fn commit_in(dir: &Path, staged: &Staged) -> Result<Vec<String>, ParquetError> {
    let mut renamed = Vec::new();
    let mut dirs = BTreeSet::new();
    for f in &staged.files {
        let temp = inside(dir, &f.temp)?;
        let name = inside(dir, &f.name)?;
        match fs::rename(&temp, &name) {
            Ok(()) => renamed.push(f.name.clone()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match fs::symlink_metadata(&name) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(ParquetError::Lost { temp, name });
                }
                Err(e) => return Err(io_error("inspect", &name)(e)),
            },
            Err(e) => return Err(io_error("rename", &temp)(e)),
        }
        if let Some(parent) = name.parent() {
            dirs.insert(parent.to_path_buf());
        }
    }
    for d in &dirs {
        sync_dir(d)?;
    }
    Ok(renamed)
}

/// `dir` joined with a staged file's relative path, which must stay inside `dir`.
fn inside(dir: &Path, rel: &str) -> Result<PathBuf, ParquetError> {
    let path = Path::new(rel);
    let plain = path.components().count() > 0
        && path.components().all(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(dir.join(path))
    } else {
        Err(ParquetError::StagedName(rel.to_string()))
    }
}

/// The entries of `dir` whose names are UTF-8 (ours all are), with their paths; none
/// when `dir` does not exist.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, ParquetError> {
    let list = match fs::read_dir(dir) {
        Ok(list) => list,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("list", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in list {
        let entry = entry.map_err(io_error("list", dir))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}

fn is_temp_name(name: &str) -> bool {
    name.starts_with(".part-") && name.ends_with(".parquet.tmp")
}

/// The epoch of a final file name `part-<epoch>-<n>.parquet`.
fn final_epoch(name: &str) -> Option<u64> {
    let stem = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    let (epoch, n) = stem.split_once('-')?;
    n.parse::<u32>().ok()?;
    epoch.parse().ok()
}

fn base_name(rel: &str) -> &str {
    rel.rsplit('/').next().unwrap_or(rel)
}

fn sync_dir(dir: &Path) -> Result<(), ParquetError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync the directory", dir))
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ParquetError {
    let path = path.to_path_buf();
    move |source| ParquetError::Io {
        action,
        path,
        source,
    }
}

/// A record for an error message: lossy UTF-8, at most 200 characters.
pub(super) fn shorten(line: &[u8]) -> String {
    const SHOWN: usize = 200;
    let text = String::from_utf8_lossy(line.trim_ascii());
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    }
}
