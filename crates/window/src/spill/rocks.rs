//! The RocksDB spill store (cargo feature `rocksdb`): a key's state in the column
//! family `sessions` (key -> its two deadlines, then the state in the store's
//! [`StateCodec`]: for sessions the checkpoint codec, [`crate::codec`]), its next timer
//! on each clock in `timers` (clock byte ++ deadline big-endian ++ key -> empty), so the
//! keys due by a watermark or a processing time are one range scan in deadline order.
//!
//! The store is scratch space below the hot tier, not the job's durable state: the
//! checkpoints hold every key (`docs/checkpoint-format.md`), so the directory is
//! emptied when a store opens and removed when it closes, and nothing is written to
//! RocksDB's write-ahead log. Memory is bounded by [`RocksMemory`]: one LRU block
//! cache of data blocks that the memtables are also charged to, shared by every
//! shard's store; index and filter blocks (about 1.3 bytes per key) stay with the open
//! table files.

use super::{
    Deadlines, Domain, SessionsCodec, SpillError, SpillStore, StateCodec, StoreDamage, StoreImage,
    deadline_bytes, deadline_of,
};
use crate::keyed::KeyBytes;
use crate::operator::WindowConfig;
use crate::session::KeySessions;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, Options, WriteBatch,
    WriteBufferManager, WriteOptions,
};
use std::fmt;
use std::path::{Path, PathBuf};

const SESSIONS: &str = "sessions";
const TIMERS: &str = "timers";
/// Keys per write batch of an eviction.
const PUT_BATCH: usize = 16_384;
/// A `sessions` value starts with the event-time and the processing-time deadline.
const VALUE_HEAD: usize = 16;
const DOMAINS: [Domain; 2] = [Domain::EventTime, Domain::ProcessingTime];

/// The memory RocksDB may use, shared by the stores of every shard: a block cache of
/// `bytes`, half of which the memtables may take.
#[derive(Clone)]
pub struct RocksMemory {
    cache: Cache,
    buffers: WriteBufferManager,
    bytes: usize,
}

impl fmt::Debug for RocksMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RocksMemory")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl RocksMemory {
    /// A budget of `bytes` (at least 8 MiB) for RocksDB's caches and write buffers.
    pub fn new(bytes: usize) -> RocksMemory {
        let bytes = bytes.max(8 << 20);
        let cache = Cache::new_lru_cache(bytes);
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            bytes / 2,
            false,
            cache.clone(),
        );
        RocksMemory {
            cache,
            buffers,
            bytes,
        }
    }
}

/// A [`SpillStore`] in a RocksDB database of its own: of the command line's sessions
/// by default, of any state `S` with a [`StateCodec`] of it
/// ([`open_with`](RocksSpill::open_with)).
pub struct RocksSpill<S = KeySessions> {
    db: Option<DB>,
    dir: PathBuf,
    codec: Box<dyn StateCodec<S>>,
    write: WriteOptions,
    /// By [`Domain`]: every timer entry of that clock left is at or after this deadline
    /// (where a scan starts, past the deletions of keys taken back).
    due_from: [i64; 2],
    scratch: Vec<u8>,
}

impl<S> fmt::Debug for RocksSpill<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RocksSpill")
            .field("dir", &self.dir)
            .finish()
    }
}

impl RocksSpill {
    /// Opens an empty store in `dir` (whatever it held is deleted first) for sessions of
    /// a window configured as `cfg`, within `memory`.
    pub fn open(dir: &Path, cfg: WindowConfig, memory: &RocksMemory) -> Result<Self, SpillError> {
        RocksSpill::open_with(dir, Box::new(SessionsCodec(cfg)), memory)
    }
}

impl<S> RocksSpill<S> {
    /// Opens an empty store in `dir` (whatever it held is deleted first) for states that
    /// `codec` writes and reads, within `memory`.
    pub fn open_with(
        dir: &Path,
        codec: Box<dyn StateCodec<S>>,
        memory: &RocksMemory,
    ) -> Result<Self, SpillError> {
        Self::fresh_dir(dir)?;
        Self::open_db(dir, codec, memory)
    }

    /// Opens a store in `dir` (whatever it held is deleted first) that starts as the
    /// store checkpoint in `checkpoint` (a base's copy of a store, see
    /// [`StoreImage::into_dir`]): its table files are hard-linked (they never change,
    /// so the checkpoint's copies stay as they are while the store goes on), its other
    /// files copied. Its keys keep the deadlines they were evicted with.
    pub fn open_from(
        dir: &Path,
        checkpoint: &Path,
        codec: Box<dyn StateCodec<S>>,
        memory: &RocksMemory,
    ) -> Result<Self, SpillError> {
        Self::fresh_dir(dir)?;
        let linked = (|| {
            for entry in std::fs::read_dir(checkpoint)? {
                let entry = entry?;
                let to = dir.join(entry.file_name());
                let table = entry.file_name().to_string_lossy().ends_with(".sst");
                if !(table && std::fs::hard_link(entry.path(), &to).is_ok()) {
                    std::fs::copy(entry.path(), &to)?;
                }
            }
            Ok(())
        })();
        linked.map_err(|source| SpillError::Dir {
            dir: checkpoint.display().to_string(),
            source,
        })?;
        Self::open_db(dir, codec, memory)
    }

    /// Empties `dir` (and removes an image a killed run left beside it).
    fn fresh_dir(dir: &Path) -> Result<(), SpillError> {
        let dir_error = |source| SpillError::Dir {
            dir: dir.display().to_string(),
            source,
        };
        remove_if_there(dir).map_err(dir_error)?;
        remove_if_there(&image_dir(dir)).map_err(dir_error)?;
        std::fs::create_dir_all(dir).map_err(dir_error)
    }

    fn open_db(
        dir: &Path,
        codec: Box<dyn StateCodec<S>>,
        memory: &RocksMemory,
    ) -> Result<Self, SpillError> {
        let name = dir.display().to_string();
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_write_buffer_manager(&memory.buffers);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(1);
        db_opts.set_max_open_files(-1);
        let buffer = (memory.bytes / 8).clamp(1 << 20, 64 << 20);
        let cf = |bloom: bool, compression: DBCompressionType| {
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&memory.cache);
            // Index and filter blocks stay with their open table files, outside the
            // cache (about 1.3 bytes per key for the filter): in a cache much smaller
            // than the data, a lookup would read and check a whole filter block again.
            table.set_cache_index_and_filter_blocks(false);
            if bloom {
                table.set_bloom_filter(10.0, false);
            }
            let mut o = Options::default();
            o.set_block_based_table_factory(&table);
            o.set_write_buffer_size(buffer);
            o.set_max_write_buffer_number(2);
            o.set_compression_type(compression);
            if bloom {
                // Most lookups are of new keys, not there: a filter on the memtable too
                // answers them without searching it.
                o.set_memtable_prefix_bloom_ratio(0.05);
                o.set_memtable_whole_key_filtering(true);
            }
            o
        };
        let cfs = vec![
            ColumnFamilyDescriptor::new(SESSIONS, cf(true, DBCompressionType::Lz4)),
            ColumnFamilyDescriptor::new(TIMERS, cf(false, DBCompressionType::None)),
        ];
        let db = DB::open_cf_descriptors(&db_opts, dir, cfs).map_err(|e| SpillError::Store {
            dir: name.clone(),
            message: e.into_string(),
        })?;
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        Ok(RocksSpill {
            db: Some(db),
            dir: dir.to_path_buf(),
            codec,
            write,
            due_from: [i64::MIN; 2],
            scratch: Vec::new(),
        })
    }

    fn db(&self) -> &DB {
        self.db.as_ref().expect("the database is open until drop")
    }

    fn error(&self, e: rocksdb::Error) -> SpillError {
        SpillError::Store {
            dir: self.dir.display().to_string(),
            message: e.into_string(),
        }
    }

    fn damaged(&self, key: &[u8], reason: StoreDamage) -> SpillError {
        damaged(&self.dir, key, reason)
    }

    /// A `sessions` value: the deadlines, then the state.
    fn decode(&self, key: &[u8], value: &[u8]) -> Result<(S, Deadlines), SpillError> {
        let (deadlines, state) = split_value(&self.dir, key, value)?;
        let state = self
            .codec
            .decode(state)
            .map_err(|e| self.damaged(key, e.into()))?;
        Ok((state, deadlines))
    }

    fn timer_key(domain: Domain, deadline: i64, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(9 + key.len());
        k.push(domain as u8);
        k.extend_from_slice(&deadline_bytes(deadline));
        k.extend_from_slice(key);
        k
    }

    /// Deletes `key`'s timer entries (those it has) in `batch`.
    fn delete_timers(
        batch: &mut WriteBatch,
        timers: &rocksdb::ColumnFamily,
        key: &[u8],
        deadlines: Deadlines,
    ) {
        for d in DOMAINS {
            if deadlines.of(d) != Deadlines::NONE {
                batch.delete_cf(timers, Self::timer_key(d, deadlines.of(d), key));
            }
        }
    }

    fn cfs(&self) -> (&rocksdb::ColumnFamily, &rocksdb::ColumnFamily) {
        let db = self.db();
        (
            db.cf_handle(SESSIONS).expect("opened with it"),
            db.cf_handle(TIMERS).expect("opened with it"),
        )
    }
}

/// A `sessions` value of the store in `dir`: the deadlines, then the encoded state.
fn split_value<'v>(
    dir: &Path,
    key: &[u8],
    value: &'v [u8],
) -> Result<(Deadlines, &'v [u8]), SpillError> {
    match value.split_first_chunk::<VALUE_HEAD>() {
        Some((head, state)) => {
            let (event, processing) = head.split_at(8);
            let deadlines = Deadlines {
                event: i64::from_le_bytes(event.try_into().expect("8 bytes")),
                processing: i64::from_le_bytes(processing.try_into().expect("8 bytes")),
            };
            Ok((deadlines, state))
        }
        None => Err(damaged(dir, key, StoreDamage::Short)),
    }
}

/// The value of `key` in the store in `dir` does not decode.
fn damaged(dir: &Path, key: &[u8], reason: StoreDamage) -> SpillError {
    SpillError::Damaged {
        dir: dir.display().to_string(),
        key: String::from_utf8_lossy(key).into_owned(),
        reason: Box::new(reason),
    }
}

/// Removes `dir` and what it holds, if it is there.
fn remove_if_there(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Where the image of the store in `dir` goes (beside it, on the same file system: its
/// table files are hard links).
fn image_dir(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(".image");
    PathBuf::from(name)
}

/// A [`RocksSpill`]'s keys at one instant: a RocksDB checkpoint, opened read-only when
/// read, removed when dropped unless handed over ([`StoreImage::into_dir`]).
#[derive(Debug)]
pub struct RocksImage {
    dir: PathBuf,
    kept: bool,
}

impl RocksImage {
    /// Calls `f` with every key of the store checkpoint in `dir` and its encoded state
    /// (after the deadlines: for sessions, the checkpoint codec's value), in key order,
    /// until `f` returns `false`. Nothing is written into `dir`: RocksDB's info log of
    /// the read goes to a temporary directory, removed after.
    pub fn read(dir: &Path, f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), SpillError> {
        let log = std::env::temp_dir().join(format!(
            "sessionizer-read-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let mut opts = Options::default();
        opts.set_db_log_dir(&log);
        let read = Self::read_with(&opts, dir, f);
        let _ = std::fs::remove_dir_all(&log);
        read
    }

    fn read_with(
        opts: &Options,
        dir: &Path,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), SpillError> {
        let error = |e: rocksdb::Error| SpillError::Store {
            dir: dir.display().to_string(),
            message: e.into_string(),
        };
        let db = DB::open_cf_for_read_only(opts, dir, [SESSIONS, TIMERS], false).map_err(error)?;
        let cf = db.cf_handle(SESSIONS).expect("opened with it");
        let mut it = db.raw_iterator_cf(cf);
        it.seek_to_first();
        while it.valid() {
            if let (Some(k), Some(v)) = (it.key(), it.value())
                && !f(k, split_value(dir, k, v)?.1)
            {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(error)
    }
}

impl StoreImage for RocksImage {
    fn for_each_encoded(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError> {
        Self::read_with(&Options::default(), &self.dir, &mut |k, v| {
            f(k, v);
            true
        })
    }

    fn into_dir(mut self: Box<Self>) -> PathBuf {
        self.kept = true;
        self.dir.clone()
    }
}

impl Drop for RocksImage {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl<S> Drop for RocksSpill<S> {
    fn drop(&mut self) {
        // Scratch space: closed, then deleted.
        self.db = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl<S> SpillStore<S> for RocksSpill<S> {
    fn take(&mut self, key: &[u8]) -> Result<Option<(S, Deadlines)>, SpillError> {
        let (sessions, timers) = self.cfs();
        let Some(value) = self
            .db()
            .get_pinned_cf(sessions, key)
            .map_err(|e| self.error(e))?
        else {
            return Ok(None);
        };
        let (state, deadlines) = self.decode(key, &value)?;
        drop(value);
        let mut batch = WriteBatch::default();
        batch.delete_cf(sessions, key);
        Self::delete_timers(&mut batch, timers, key, deadlines);
        self.db()
            .write_opt(batch, &self.write)
            .map_err(|e| self.error(e))?;
        Ok(Some((state, deadlines)))
    }

    fn peek(&self, key: &[u8], f: &mut dyn FnMut(&S)) -> Result<bool, SpillError> {
        let (sessions, _) = self.cfs();
        match self
            .db()
            .get_pinned_cf(sessions, key)
            .map_err(|e| self.error(e))?
        {
            Some(value) => {
                f(&self.decode(key, &value)?.0);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn put(&mut self, evicted: &mut Vec<(KeyBytes, S, Deadlines)>) -> Result<(), SpillError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let (sessions, timers) = self.cfs();
        let mut earliest = [i64::MAX; 2];
        let mut written = Ok(());
        let mut refused = None;
        // In batches of a few MiB: one eviction can move hundreds of thousands of keys.
        'chunks: for chunk in evicted.chunks(PUT_BATCH) {
            let mut batch = WriteBatch::default();
            for (key, state, deadlines) in chunk {
                scratch.clear();
                scratch.extend_from_slice(&deadlines.event.to_le_bytes());
                scratch.extend_from_slice(&deadlines.processing.to_le_bytes());
                if let Err(reason) = self.codec.encode(state, &mut scratch) {
                    refused = Some(SpillError::Encode {
                        key: String::from_utf8_lossy(key).into_owned(),
                        reason,
                    });
                    break 'chunks;
                }
                batch.put_cf(sessions, key, &scratch);
                for d in DOMAINS {
                    let at = deadlines.of(d);
                    if at != Deadlines::NONE {
                        batch.put_cf(timers, Self::timer_key(d, at, key), []);
                        earliest[d as usize] = earliest[d as usize].min(at);
                    }
                }
            }
            written = self.db().write_opt(batch, &self.write);
            if written.is_err() {
                break;
            }
        }
        evicted.clear();
        self.scratch = scratch;
        if let Some(e) = refused {
            return Err(e);
        }
        written.map_err(|e| self.error(e))?;
        for (from, earliest) in self.due_from.iter_mut().zip(earliest) {
            *from = (*from).min(earliest);
        }
        Ok(())
    }

    fn earliest(&self, domain: Domain) -> Result<i64, SpillError> {
        let (_, timers) = self.cfs();
        let mut it = self.db().raw_iterator_cf(timers);
        it.seek([domain as u8]);
        let first = match it.key() {
            Some(k) if k.first() == Some(&(domain as u8)) => match k[1..].first_chunk::<8>() {
                Some(d) => deadline_of(*d),
                None => return Err(self.damaged(k, StoreDamage::TimerWithoutDeadline)),
            },
            _ => i64::MAX,
        };
        it.status().map_err(|e| self.error(e))?;
        Ok(first)
    }

    fn take_due(
        &mut self,
        domain: Domain,
        upto: i64,
        max: usize,
        f: &mut dyn FnMut(&[u8], S, Deadlines),
    ) -> Result<i64, SpillError> {
        let (sessions, timers) = self.cfs();
        let db = self.db();
        let mut due: Vec<(i64, KeyBytes)> = Vec::new();
        let mut next = i64::MAX;
        {
            let mut it = db.raw_iterator_cf(timers);
            let mut from = vec![domain as u8];
            from.extend_from_slice(&deadline_bytes(self.due_from[domain as usize]));
            it.seek(&from);
            while it.valid() {
                let Some(k) = it.key() else { break };
                let Some((&clock, k)) = k.split_first() else {
                    return Err(self.damaged(k, StoreDamage::EmptyTimer));
                };
                if clock != domain as u8 {
                    // Past this clock's entries.
                    break;
                }
                let Some((d, key)) = k.split_first_chunk::<8>() else {
                    return Err(self.damaged(k, StoreDamage::TimerWithoutDeadline));
                };
                let deadline = deadline_of(*d);
                if deadline > upto
                    || (due.len() >= max.max(1) && due.last().map(|l| l.0) != Some(deadline))
                {
                    next = deadline;
                    break;
                }
                due.push((deadline, KeyBytes::from_slice(key)));
                it.next();
            }
            it.status().map_err(|e| self.error(e))?;
        }
        let values = db.batched_multi_get_cf(sessions, due.iter().map(|(_, k)| &k[..]), false);
        let mut batch = WriteBatch::default();
        let mut states = Vec::with_capacity(due.len());
        for ((_, key), value) in due.iter().zip(values) {
            let value = value.map_err(|e| self.error(e))?;
            let Some(value) = value else {
                return Err(self.damaged(key, StoreDamage::TimerWithoutState));
            };
            let (state, deadlines) = self.decode(key, &value)?;
            states.push((state, deadlines));
            batch.delete_cf(sessions, key);
            Self::delete_timers(&mut batch, timers, key, deadlines);
        }
        db.write_opt(batch, &self.write)
            .map_err(|e| self.error(e))?;
        for ((_, key), (state, deadlines)) in due.iter().zip(states) {
            f(key, state, deadlines);
        }
        self.due_from[domain as usize] = next;
        Ok(next)
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8], &S)) -> Result<(), SpillError> {
        let (sessions, _) = self.cfs();
        let mut it = self.db().raw_iterator_cf(sessions);
        it.seek_to_first();
        while it.valid() {
            if let (Some(k), Some(v)) = (it.key(), it.value()) {
                f(k, &self.decode(k, v)?.0);
            }
            it.next();
        }
        it.status().map_err(|e| self.error(e))
    }

    fn clear(&mut self) -> Result<(), SpillError> {
        let (sessions, timers) = self.cfs();
        for cf in [sessions, timers] {
            let mut batch = WriteBatch::default();
            let mut it = self.db().raw_iterator_cf(cf);
            it.seek_to_first();
            while let Some(k) = it.key() {
                batch.delete_cf(cf, k);
                it.next();
            }
            it.status().map_err(|e| self.error(e))?;
            drop(it);
            self.db()
                .write_opt(batch, &self.write)
                .map_err(|e| self.error(e))?;
        }
        self.due_from = [i64::MIN; 2];
        Ok(())
    }

    /// A RocksDB checkpoint of the store (its memtables flushed, its table files hard
    /// links) in `<dir>.image`: taking it costs a flush, not a read of every key.
    fn image(&mut self) -> Result<Option<Box<dyn StoreImage>>, SpillError> {
        let dir = image_dir(&self.dir);
        remove_if_there(&dir).map_err(|source| SpillError::Dir {
            dir: dir.display().to_string(),
            source,
        })?;
        rocksdb::checkpoint::Checkpoint::new(self.db())
            .and_then(|c| c.create_checkpoint(&dir))
            .map_err(|e| self.error(e))?;
        Ok(Some(Box::new(RocksImage { dir, kept: false })))
    }

    fn disk_bytes(&self) -> u64 {
        let (sessions, timers) = self.cfs();
        [sessions, timers]
            .into_iter()
            .filter_map(|cf| {
                self.db()
                    .property_int_value_cf(cf, "rocksdb.total-sst-files-size")
                    .ok()
                    .flatten()
            })
            .sum()
    }
}
