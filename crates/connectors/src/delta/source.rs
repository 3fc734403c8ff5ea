//! A Delta table as an input: its rows as JSON lines, in the order the table's commits
//! added them.
//!
//! The table must be append-only: its rows are those of the data files its commits
//! added, commit after commit, each file's rows in their order, and a run reads on from
//! where the one before stopped. A position is a row number in that order — the line
//! number of the JSON-lines stream — found again without reading the rows before it,
//! from the row counts the commits give each file (`numRecords` in its statistics).
//! Refused with a message: a commit that removes data files (a delete, an update, a
//! compaction: the history was rewritten), a file without a row count, a commit whose
//! log entry was cleaned up, a data file gone (vacuumed).
//!
//! A run reads the versions committed when it opened the table ([`DeltaRows::open`]);
//! the next run reads those committed since.

use super::error::DeltaError;
use super::store::Location;
use deltalake::arrow::json::writer::{LineDelimited, Writer, WriterBuilder};
use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::logstore::object_store::path::Path as StorePath;
use deltalake::logstore::{LogStore, ObjectStoreRef};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::Arc;

/// One data file of the table, in the order the commits added them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    /// The version of the commit that added it.
    pub version: u64,
    /// Its path relative to the table's root.
    pub path: String,
    /// Its rows.
    pub rows: u64,
}

/// What a table is as an input: its identity and its data files, in order.
#[derive(Debug, Clone)]
pub struct TableHistory {
    /// The table's id (its metadata's), which a rewrite with a new table keeps not.
    pub id: String,
    /// The version read up to.
    pub version: u64,
    /// The data files of versions 0 to `version`, in commit order.
    pub files: Vec<DataFile>,
}

impl TableHistory {
    /// Rows of every file.
    pub fn rows(&self) -> u64 {
        self.files.iter().map(|f| f.rows).sum()
    }
}

/// The rows of a Delta table as JSON lines (a reader of them), from a row on.
pub struct DeltaRows {
    label: String,
    runtime: tokio::runtime::Runtime,
    store: ObjectStoreRef,
    /// The files still to read, with the rows to skip at the start of the first.
    files: VecDeque<DataFile>,
    skip: u64,
    /// The file being read.
    reader: Option<ParquetRecordBatchReader>,
    /// Rendered JSON lines not handed out yet.
    out: Vec<u8>,
    at: usize,
    /// The table's history as opened.
    history: TableHistory,
}

impl std::fmt::Debug for DeltaRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaRows")
            .field("table", &self.label)
            .field("version", &self.history.version)
            .field("files_left", &self.files.len())
            .finish()
    }
}

impl DeltaRows {
    /// Opens the table at `location` (a directory or `s3://bucket/path`) at its current
    /// version, to read its rows from row `from` (0: the first) on.
    pub fn open(location: &str, from: u64) -> Result<DeltaRows, DeltaError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(DeltaError::Runtime)?;
        let (history, store) = runtime.block_on(read_history(location))?;
        let mut files: VecDeque<DataFile> = history.files.iter().cloned().collect();
        // Files wholly before the position are not read at all.
        let mut skip = from;
        while let Some(f) = files.front() {
            if f.rows > skip {
                break;
            }
            skip -= f.rows;
            files.pop_front();
        }
        if files.is_empty() && skip > 0 {
            return Err(DeltaError::Input {
                table: location.to_string(),
                reason: format!(
                    "the position to resume from is row {from}, but the table has {} rows: it is not the table read before",
                    history.rows()
                ),
            });
        }
        Ok(DeltaRows {
            label: location.to_string(),
            runtime,
            store,
            files,
            skip,
            reader: None,
            out: Vec::new(),
            at: 0,
            history,
        })
    }

    /// The table as opened.
    pub fn history(&self) -> &TableHistory {
        &self.history
    }

    /// Renders the next batch of rows into `out`; false once every row was read.
    fn fill(&mut self) -> Result<bool, DeltaError> {
        loop {
            if let Some(reader) = self.reader.as_mut() {
                match reader.next() {
                    Some(Ok(batch)) => {
                        self.out.clear();
                        self.at = 0;
                        let mut w: Writer<&mut Vec<u8>, LineDelimited> =
                            WriterBuilder::new().build(&mut self.out);
                        w.write(&batch)
                            .and_then(|()| w.finish())
                            .map_err(|e| self.input_error(format!("cannot render a row: {e}")))?;
                        if !self.out.is_empty() {
                            return Ok(true);
                        }
                        continue;
                    }
                    Some(Err(e)) => {
                        return Err(self.input_error(format!("cannot read a data file: {e}")));
                    }
                    None => self.reader = None,
                }
            }
            let Some(file) = self.files.pop_front() else {
                return Ok(false);
            };
            let skip = std::mem::take(&mut self.skip) as usize;
            let path = StorePath::from(file.path.as_str());
            let bytes = self
                .runtime
                .block_on(async { self.store.get(&path).await?.bytes().await })
                .map_err(|e| match e {
                    deltalake::ObjectStoreError::NotFound { .. } => self.input_error(format!(
                        "the data file {} added by version {} is gone (vacuumed?): the table's history cannot be read again",
                        file.path, file.version
                    )),
                    e => self.input_error(format!("cannot read the data file {}: {e}", file.path)),
                })?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .map(|b| b.with_offset(skip).with_batch_size(4096))
                .and_then(ParquetRecordBatchReaderBuilder::build)
                .map_err(|e| {
                    self.input_error(format!("cannot read the data file {}: {e}", file.path))
                })?;
            self.reader = Some(reader);
        }
    }

    fn input_error(&self, reason: String) -> DeltaError {
        DeltaError::Input {
            table: self.label.clone(),
            reason,
        }
    }
}

impl Read for DeltaRows {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.out.len() && !self.fill().map_err(io::Error::other)? {
            return Ok(0);
        }
        let n = buf.len().min(self.out.len() - self.at);
        buf[..n].copy_from_slice(&self.out[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The table's identity, version and data files in commit order, and its object store.
async fn read_history(location: &str) -> Result<(TableHistory, ObjectStoreRef), DeltaError> {
    let failed = |action: &'static str| {
        let table = location.to_string();
        move |source: deltalake::DeltaTableError| DeltaError::Table {
            table,
            action,
            source: Box::new(source),
        }
    };
    let refuse = |reason: String| DeltaError::Input {
        table: location.to_string(),
        reason,
    };
    let url = Location::parse(location)?.read_url(location)?;
    let table = deltalake::DeltaTableBuilder::from_url(url)
        .and_then(deltalake::DeltaTableBuilder::build)
        .map_err(failed("open the location"))?;
    let log: Arc<dyn LogStore> = table.log_store();
    if !log
        .is_delta_table_location()
        .await
        .map_err(failed("look for the log"))?
    {
        return Err(refuse(
            "there is no Delta table there (no _delta_log)".into(),
        ));
    }
    let latest = log
        .get_latest_version(0)
        .await
        .map_err(failed("read the log"))?;
    let mut history = TableHistory {
        id: String::new(),
        version: latest,
        files: Vec::new(),
    };
    for version in 0..=latest {
        let Some(entry) = log
            .read_commit_entry(version)
            .await
            .map_err(failed("read the log"))?
        else {
            return Err(refuse(format!(
                "the log entry of version {version} was cleaned up; the table cannot be read from its first version (read it from a table with its whole log)"
            )));
        };
        for line in entry.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let action: serde_json::Value = serde_json::from_slice(line)
                .map_err(|e| refuse(format!("version {version} has an unreadable action: {e}")))?;
            if let Some(meta) = action.get("metaData") {
                let id = meta["id"].as_str().unwrap_or_default().to_string();
                if !history.id.is_empty() && id != history.id {
                    return Err(refuse(format!(
                        "version {version} replaced the table (a new table id): its history was rewritten"
                    )));
                }
                history.id = id;
            }
            if let Some(remove) = action.get("remove")
                && remove["dataChange"].as_bool().unwrap_or(true)
            {
                return Err(refuse(format!(
                    "version {version} removes the data file {}: only append-only tables can be read as an input (a delete, an update or an overwrite rewrote its history)",
                    remove["path"].as_str().unwrap_or("?")
                )));
            }
            if let Some(add) = action.get("add") {
                if !add["dataChange"].as_bool().unwrap_or(true) {
                    continue;
                }
                let path = add["path"].as_str().unwrap_or_default();
                let rows = add["stats"]
                    .as_str()
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
                    .and_then(|s| s["numRecords"].as_u64());
                let Some(rows) = rows else {
                    return Err(refuse(format!(
                        "the data file {path} added by version {version} has no row count (numRecords) in the log: its rows cannot be counted without reading them"
                    )));
                };
                // A log's paths are URL paths (`=` and spaces percent-encoded).
                let path = StorePath::from_url_path(path)
                    .map_err(|e| refuse(format!("version {version} adds the file {path}: {e}")))?
                    .to_string();
                history.files.push(DataFile {
                    version,
                    path,
                    rows,
                });
            }
        }
    }
    let store = log.object_store(None);
    Ok((history, store))
}

/// The table at `location` as an input, without reading its rows.
pub fn table_history(location: &str) -> Result<TableHistory, DeltaError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DeltaError::Runtime)?;
    runtime.block_on(read_history(location)).map(|(h, _)| h)
}
