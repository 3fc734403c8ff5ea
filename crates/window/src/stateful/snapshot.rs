//! Snapshots and checkpoints of the stateful operator's keyed state: the whole state
//! as one checksummed blob ([`SNAPSHOT_MAGIC`]), or key by key for incremental
//! checkpoints, and restoring either.

use super::record::{Reader, decode_key_record, encode_key_record, put_len};
use super::{KeyState, StatefulOperator};
use crate::clock::Clock;
use crate::keyed::{KeyBytes, KeyedStore};
use crate::spill::SpillError;
use crate::watermark::WatermarkStrategy;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_core::{EventTime, Watermark};

/// Why a snapshot could not be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A batch is open: its pushed events are in no snapshot.
    #[error("a batch is open; end it (end_batch) before taking a snapshot")]
    BatchOpen,
    /// The bytes do not start with [`SNAPSHOT_MAGIC`].
    #[error("not a sessionizer keyed-state snapshot (bad magic bytes)")]
    BadMagic,
    /// A format version this build cannot read.
    #[error(
        "keyed-state snapshot version {0} is not supported (this build reads version {SNAPSHOT_VERSION})"
    )]
    UnsupportedVersion(u16),
    /// The bytes end early.
    #[error("keyed-state snapshot is truncated")]
    Truncated,
    /// The checksum does not match: the bytes were damaged.
    #[error("keyed-state snapshot checksum mismatch: the snapshot is damaged")]
    Checksum,
    /// A key is not UTF-8.
    #[error("keyed-state snapshot holds a key that is not UTF-8")]
    BadKey,
    /// What was asked cannot be done by this job (the reason says why).
    #[error("{0}")]
    Unsupported(&'static str),
    /// A user state could not be written or read (its serde implementation failed, or
    /// its type changed since the snapshot was taken).
    #[error("state of key {key:?}: {source}")]
    State {
        /// The key whose state failed.
        key: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The spill store (the `rocksdb` backend) failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

/// The first bytes of a keyed-state snapshot.
///
/// Layout (all integers little-endian):
///
/// ```text
/// magic       8 bytes  "SZKEYED\0"
/// version     u16      2 (version 1, without timers and expiry, is read too)
/// reserved    u16      0
/// watermark   i64      i64::MIN = unset, i64::MAX = +inf
/// batches     u64      batches ended so far
/// entries     u64      number of keys
/// per key, in key order:
///   key_len   u32, key bytes (UTF-8)
///   flags     u8       bit 0: state, bit 1: event-time timeout, bit 2: processing-time
///                      timeout, bit 3: registered timers, bit 4: state expiry
///   [i64 event-time timeout] [i64 processing-time timeout]   when flagged
///   [u32 count, count × (u8 domain: 0 event time, 1 processing time; i64 time)]
///                                                             registered timers, when flagged
///   [i64 processing time the state expires at]                when flagged
///   [u32 state_len, state as JSON]                            when flagged
/// checksum    u64      xxh3-64 of every byte before it
/// ```
///
/// JSON keeps the user's state self-describing, so a restore into a changed state type
/// fails with serde's message naming the field rather than misreading bytes.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"SZKEYED\0";
/// The snapshot format version written by this build.
pub const SNAPSHOT_VERSION: u16 = 2;

impl<E, S: Serialize + DeserializeOwned, W: WatermarkStrategy, C: Clock>
    StatefulOperator<E, S, W, C>
{
    /// The keyed state (every key's state and timeouts) and the watermark, as bytes
    /// (layout: [`SNAPSHOT_MAGIC`]). Keys are written in order, so equal states give
    /// equal bytes.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        // Every key's record, in key order: those in memory, then the spilled ones.
        let mut entries: Vec<(KeyBytes, Vec<u8>)> = Vec::with_capacity(self.keys());
        for (_, key, ks) in self.store.iter() {
            let mut record = Vec::new();
            encode_key_record(key, ks, &mut record)?;
            entries.push((KeyBytes::from_slice(key), record));
        }
        self.for_each_spilled(|key, ks| {
            let mut record = Vec::new();
            encode_key_record(key, ks, &mut record)?;
            entries.push((KeyBytes::from_slice(key), record));
            Ok(())
        })?;
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));

        let mut out = Vec::with_capacity(
            32 + entries
                .iter()
                .map(|e| 8 + e.0.len() + e.1.len())
                .sum::<usize>(),
        );
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.watermark.millis().to_le_bytes());
        out.extend_from_slice(&self.batches.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (key, record) in entries {
            put_len(&mut out, key.len());
            out.extend_from_slice(&key);
            out.extend_from_slice(&record);
        }
        let checksum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        Ok(out)
    }

    /// Replaces the keyed state and the watermark with a [`snapshot`](Self::snapshot)'s.
    /// On error the operator is left unchanged.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        if bytes.len() < SNAPSHOT_MAGIC.len() || &bytes[..8] != SNAPSHOT_MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let Some((body, sum)) = bytes.split_last_chunk::<8>() else {
            return Err(SnapshotError::Truncated);
        };
        let mut r = Reader { bytes: body, at: 8 };
        let version = u16::from_le_bytes(r.array()?);
        if version != SNAPSHOT_VERSION && version != 1 {
            return Err(SnapshotError::UnsupportedVersion(version));
        }
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(*sum) {
            return Err(SnapshotError::Checksum);
        }
        let _reserved = u16::from_le_bytes(r.array()?);
        let watermark = i64::from_le_bytes(r.array()?);
        let batches = u64::from_le_bytes(r.array()?);
        let count = u64::from_le_bytes(r.array()?);

        let mut keys = Restored::new(self.spill.is_some());
        for _ in 0..count {
            let len = r.len()?;
            let key = r.take(len)?;
            let start = r.at;
            let ks = decode_key_record::<S>(key, &mut r)?;
            keys.add(key, &body[start..r.at], ks);
        }
        if r.at != body.len() {
            return Err(SnapshotError::Truncated);
        }
        self.install(Watermark(watermark), batches, keys)
    }

    /// Starts (or stops) remembering which keys change, for incremental checkpoints
    /// ([`encode_state`](Self::encode_state) with `base == false`).
    pub fn track_changes(&mut self, on: bool) {
        self.tracking = on;
        self.store.track_changes(on);
    }

    /// The keyed state for a checkpoint, key by key, between batches: every key
    /// (`base`), or the keys changed since the last call (`None`: removed). Each value
    /// is one key's record of the snapshot layout (flags, timeouts, timers, expiry,
    /// state as JSON: see [`SNAPSHOT_MAGIC`]); [`restore_state`](Self::restore_state)
    /// reads them back.
    pub fn encode_state(
        &mut self,
        base: bool,
        mut put: impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        if base {
            self.store.forget_changes();
            if let Some(s) = self.spill.as_mut() {
                s.tier.forget_changes();
            }
            return self.for_each_key_record(|key, record| put(key, Some(record)));
        }
        let mut buf = Vec::new();
        let mut failed = None;
        let mut one = |key: &[u8], ks: Option<&KeyState<S>>| {
            if failed.is_some() {
                return;
            }
            match ks {
                None => put(key, None),
                Some(ks) => {
                    buf.clear();
                    match encode_key_record(key, ks, &mut buf) {
                        Ok(()) => put(key, Some(&buf)),
                        Err(e) => failed = Some(e),
                    }
                }
            }
        };
        match self.spill.as_mut() {
            Some(s) => s
                .tier
                .drain_changes(&mut self.store, |key, ks| one(key, ks)),
            None => self.store.drain_changes(|key, ks| one(key, ks)),
        }
        if let Some(e) = self.take_spill_error() {
            return Err(e.into());
        }
        failed.map_or(Ok(()), Err)
    }

    /// Calls `f` with every spilled key and its state (none without a spill store).
    fn for_each_spilled(
        &self,
        mut f: impl FnMut(&[u8], &KeyState<S>) -> Result<(), SnapshotError>,
    ) -> Result<(), SnapshotError> {
        let Some(s) = self.spill.as_ref().filter(|s| s.tier.keys > 0) else {
            return Ok(());
        };
        let mut failed = None;
        s.tier.store().for_each(&mut |key, ks| {
            if failed.is_none()
                && let Err(e) = f(key, ks)
            {
                failed = Some(e);
            }
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// Calls `put` with every key and its record (as [`encode_state`](Self::encode_state)
    /// writes it with `base`), changing nothing: a snapshot taken between batches that
    /// leaves the tracked changes alone.
    pub fn for_each_key_record(
        &self,
        mut put: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), SnapshotError> {
        let mut buf = Vec::new();
        for (_, key, ks) in self.store.iter() {
            buf.clear();
            encode_key_record(key, ks, &mut buf)?;
            put(key, &buf);
        }
        self.for_each_spilled(|key, ks| {
            buf.clear();
            encode_key_record(key, ks, &mut buf)?;
            put(key, &buf);
            Ok(())
        })
    }

    /// Checks that `record` is a key record [`restore_key`](Self::restore_key) takes
    /// (as [`encode_state`](Self::encode_state) wrote it, for this state type),
    /// changing nothing: a restore that must refuse a checkpoint whole checks every key
    /// before putting any.
    pub fn check_key(&self, key: &[u8], record: &[u8]) -> Result<(), SnapshotError> {
        let mut r = Reader {
            bytes: record,
            at: 0,
        };
        decode_key_record::<S>(key, &mut r)?;
        if r.at != record.len() {
            return Err(SnapshotError::Truncated);
        }
        Ok(())
    }

    /// Puts one key back from its record (as [`encode_state`](Self::encode_state)
    /// wrote it), between batches, replacing what the key held: a restore key by key,
    /// after [`restore_state`](Self::restore_state) set the watermark. On error nothing
    /// changes.
    pub fn restore_key(&mut self, key: &[u8], record: &[u8]) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        let mut r = Reader {
            bytes: record,
            at: 0,
        };
        let ks = decode_key_record::<S>(key, &mut r)?;
        if r.at != record.len() {
            return Err(SnapshotError::Truncated);
        }
        put_key(&mut self.store, key, ks);
        self.check_budget(0);
        self.take_spill_error().map_or(Ok(()), |e| Err(e.into()))
    }

    /// Replaces the keyed state with `keys` (key, record as
    /// [`encode_state`](Self::encode_state) wrote it), the watermark and the number of
    /// batches ended. On error the operator is left unchanged.
    pub fn restore_state<'k>(
        &mut self,
        watermark: Watermark,
        batches: u64,
        keys: impl IntoIterator<Item = (&'k [u8], &'k [u8])>,
    ) -> Result<(), SnapshotError> {
        if self.open.is_some() {
            return Err(SnapshotError::BatchOpen);
        }
        let mut restored = Restored::new(self.spill.is_some());
        for (key, record) in keys {
            let mut r = Reader {
                bytes: record,
                at: 0,
            };
            let ks = decode_key_record::<S>(key, &mut r)?;
            if r.at != record.len() {
                return Err(SnapshotError::Truncated);
            }
            restored.add(key, record, ks);
        }
        self.install(watermark, batches, restored)
    }

    /// Replaces the keyed state with the restored `keys` — with a spill store, decoding
    /// them again and evicting as they come (what the store held goes first) — and sets
    /// the watermark and the number of batches ended.
    fn install(
        &mut self,
        watermark: Watermark,
        batches: u64,
        keys: Restored<'_, S>,
    ) -> Result<(), SnapshotError> {
        match keys.store {
            Some(mut store) => {
                store.track_changes(self.tracking);
                self.store = store;
            }
            None => {
                if let Some(s) = self.spill.as_mut() {
                    s.tier.clear()?;
                }
                let mut store = KeyedStore::default();
                store.track_changes(self.tracking);
                self.store = store;
                for (key, record) in keys.records {
                    let mut r = Reader {
                        bytes: record,
                        at: 0,
                    };
                    let ks = decode_key_record(key, &mut r).expect("decoded before");
                    put_key(&mut self.store, key, ks);
                    self.check_budget(0);
                }
                if let Some(e) = self.take_spill_error() {
                    return Err(e.into());
                }
            }
        }
        self.watermark = match watermark.millis() {
            i64::MIN => Watermark::MIN,
            i64::MAX => Watermark::MAX,
            ms => Watermark::at(EventTime(ms)),
        };
        self.strategy.resume_at(self.watermark);
        self.batches = batches;
        self.pending.clear();
        Ok(())
    }
}

/// The keys of a restore, each read once (so a damaged one refuses the restore before
/// anything changes): without a spill store decoded into the store they will live in;
/// with one only checked, and decoded again as they go in, so that the whole state is
/// never in memory at once.
struct Restored<'r, S> {
    store: Option<KeyedStore<KeyState<S>>>,
    records: Vec<(&'r [u8], &'r [u8])>,
}

impl<'r, S> Restored<'r, S> {
    fn new(spilling: bool) -> Self {
        Restored {
            store: (!spilling).then(KeyedStore::default),
            records: Vec::new(),
        }
    }

    /// `key` with its `record`, decoded as `ks`.
    fn add(&mut self, key: &'r [u8], record: &'r [u8], ks: KeyState<S>) {
        match &mut self.store {
            Some(store) => put_key(store, key, ks),
            None => self.records.push((key, record)),
        }
    }
}

/// Puts a decoded key into `store` with its timers scheduled.
fn put_key<S>(store: &mut KeyedStore<KeyState<S>>, key: &[u8], ks: KeyState<S>) {
    let (event, processing) = (ks.next_event_deadline(), ks.next_processing_deadline());
    let id = store.restore(key, ks);
    if let Some(t) = event {
        store.schedule(id, t);
    }
    if let Some(t) = processing {
        store.schedule_processing(id, t);
    }
}
