//! The payload of base and delta files: per-key entries, the value opaque to this crate
//! (the session window encodes its per-key state; see `sessionizer_window::codec`).
//!
//! ```text
//! payload  := count:u64 entry*count
//! entry    := key_len:u32 key value_len:u32 value     (a put)
//!           | key_len:u32 key 0xFFFF_FFFF             (a tombstone: the key has no state)
//! ```
//!
//! All integers little-endian. A base holds puts only; a delta holds puts for the keys
//! that changed since the previous checkpoint and tombstones for the keys that were
//! removed. Restore = the base, then every delta in order, the newest entry of a key
//! winning.
//!
//! Entries are built per shard ([`StateEntries`]) and written as consecutive parts of
//! one payload after a shared count ([`count_header`]), so shards can encode in parallel
//! and nothing is copied into one buffer.

use crate::error::Damage;
use std::collections::HashSet;
use std::io::Read;
use std::path::PathBuf;

const TOMBSTONE: u32 = u32::MAX;

/// Bytes per chunk of a [`StateEntries`] buffer.
const CHUNK: usize = 1 << 20;

/// Entries of one shard, appended to a state payload.
///
/// The bytes are kept in chunks of about 1 MiB (an entry never straddles two) rather
/// than one growing vector: a base of a million keys is ~100 MiB, and doubling a vector
/// up to that copies it about twice over and faults in every page again.
#[derive(Debug, Default)]
pub struct StateEntries {
    chunks: Vec<Vec<u8>>,
    /// Chunks in use (the others are kept for reuse).
    used: usize,
    puts: u64,
    tombstones: u64,
}

impl StateEntries {
    /// Forgets the entries, keeping the buffers.
    pub fn clear(&mut self) {
        for c in &mut self.chunks[..self.used] {
            c.clear();
        }
        self.used = 0;
        self.puts = 0;
        self.tombstones = 0;
    }

    /// The chunk to append the next entry to.
    fn chunk(&mut self) -> &mut Vec<u8> {
        let full = self.used == 0 || self.chunks[self.used - 1].len() >= CHUNK;
        if full {
            if self.chunks.len() == self.used {
                self.chunks.push(Vec::with_capacity(CHUNK + CHUNK / 4));
            }
            self.used += 1;
        }
        &mut self.chunks[self.used - 1]
    }

    /// Adds `key` with the value that `encode` appends to the buffer it is given.
    ///
    /// # Panics
    /// If a key or value exceeds 4 GiB - 2 bytes (no session state comes near).
    pub fn put_with(&mut self, key: &[u8], encode: impl FnOnce(&mut Vec<u8>)) {
        let buf = self.chunk();
        push_len(buf, key.len());
        buf.extend_from_slice(key);
        let at = buf.len();
        buf.extend_from_slice(&[0; 4]);
        encode(buf);
        let len = buf.len() - at - 4;
        assert!(len < TOMBSTONE as usize, "state value of 4 GiB");
        buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.puts += 1;
    }

    /// Records that `key` has no state any more.
    pub fn tombstone(&mut self, key: &[u8]) {
        let buf = self.chunk();
        push_len(buf, key.len());
        buf.extend_from_slice(key);
        buf.extend_from_slice(&TOMBSTONE.to_le_bytes());
        self.tombstones += 1;
    }

    /// The encoded entries, as consecutive parts of a payload.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks[..self.used].iter().map(Vec::as_slice)
    }

    /// The encoded entries in one buffer (tests, small states).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.parts().flatten().copied().collect()
    }

    /// Put entries appended.
    pub fn puts(&self) -> u64 {
        self.puts
    }

    /// Tombstone entries appended.
    pub fn tombstones(&self) -> u64 {
        self.tombstones
    }

    /// Entries in all.
    pub fn len(&self) -> u64 {
        self.puts + self.tombstones
    }

    /// Whether no entry was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn push_len(buf: &mut Vec<u8>, len: usize) {
    assert!(len < TOMBSTONE as usize, "state key of 4 GiB");
    buf.extend_from_slice(&(len as u32).to_le_bytes());
}

/// The first 8 bytes of a state payload: the number of entries that follow.
pub fn count_header(entries: u64) -> [u8; 8] {
    entries.to_le_bytes()
}

/// One entry read back: `None` is a tombstone.
pub type Entry<'a> = (&'a [u8], Option<&'a [u8]>);

/// Reads the entries of a state payload, checking every length against the bytes there
/// are (the frame's checksum already passed, so a failure here means a bug or a file
/// written by something else). The iterator ends after the first error.
pub fn entries(payload: &[u8]) -> Entries<'_> {
    let mut cursor = Cursor { bytes: payload };
    let (left, error) = match cursor.u64() {
        Ok(n) => (n, None),
        Err(e) => (0, Some(e)),
    };
    Entries {
        cursor,
        left,
        error,
    }
}

/// The entries of a state payload, in order; see [`entries`].
#[derive(Debug)]
pub struct Entries<'a> {
    cursor: Cursor<'a>,
    left: u64,
    error: Option<EntryError>,
}

impl<'a> Entries<'a> {
    fn entry(&mut self) -> Result<Entry<'a>, EntryError> {
        let r = &mut self.cursor;
        let key_len = r.u32()?;
        let key = r.take(key_len as usize)?;
        let value_len = r.u32()?;
        let value = if value_len == TOMBSTONE {
            None
        } else {
            Some(r.take(value_len as usize)?)
        };
        Ok((key, value))
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, EntryError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.error.take() {
            self.left = 0;
            return Some(Err(e));
        }
        if self.left == 0 {
            if !self.cursor.bytes.is_empty() {
                let extra = self.cursor.bytes.len();
                self.cursor.bytes = &[];
                return Some(Err(EntryError::Trailing(extra as u64)));
            }
            return None;
        }
        self.left -= 1;
        match self.entry() {
            Ok(e) => Some(Ok(e)),
            Err(e) => {
                self.left = 0;
                self.cursor.bytes = &[];
                Some(Err(e))
            }
        }
    }
}

/// Every entry of a payload, or the first problem.
pub fn collect_entries(payload: &[u8]) -> Result<Vec<Entry<'_>>, EntryError> {
    entries(payload).collect()
}

#[derive(Debug)]
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EntryError> {
        if self.bytes.len() < n {
            return Err(EntryError::PastEnd {
                wanted: n as u64,
                left: self.bytes.len() as u64,
            });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, EntryError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, EntryError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// The verified payloads of one checkpoint's base and deltas, oldest first.
#[derive(Debug)]
pub struct LoadedState {
    /// `(file name, payload)`: the base first, then the deltas in order.
    pub(crate) files: Vec<(String, Payload)>,
    /// The format version of every one of the files (a chain is never mixed: after a
    /// resume from an older version the first checkpoint is a new base).
    pub(crate) format_version: u16,
    /// The base's RocksDB store checkpoints, verified (the `rocksdb` backend's bases;
    /// empty otherwise): keys besides the base file's, none of them in it.
    pub(crate) stores: Vec<crate::stores::LoadedStore>,
}

/// A state file's payload, checked: in memory (deltas), or where it lies in its file
/// (a base: it can be as large as the whole state, so it is read twice rather than held
/// — once to check its frame and entries, once to apply it — and never in memory all at
/// once).
#[derive(Debug)]
pub(crate) enum Payload {
    Bytes(Vec<u8>),
    File { path: PathBuf, len: u64 },
}

impl Payload {
    fn len(&self) -> u64 {
        match self {
            Payload::Bytes(b) => b.len() as u64,
            Payload::File { len, .. } => *len,
        }
    }
}

/// Bytes read from a base file at a time.
pub(crate) const READ_BUFFER: usize = 4 << 20;

impl LoadedState {
    /// The checkpoint format version the values were written in: how to decode them
    /// (`sessionizer_window::codec::decode_value`).
    pub fn format_version(&self) -> u16 {
        self.format_version
    }

    /// The base's RocksDB store checkpoints (a base of the `rocksdb` backend), by
    /// worker index; empty when the base file holds every key.
    pub fn stores(&self) -> &[crate::stores::LoadedStore] {
        &self.stores
    }

    /// Calls `f` once for every key that has state at the checkpoint, with its newest
    /// value, in no particular order. Stops at the first error of `f`. The slices live
    /// for the call only (the base is read from its file piece by piece). A checkpoint
    /// whose base keeps keys in RocksDB store checkpoints ([`stores`](Self::stores))
    /// needs [`for_each_live_with`](Self::for_each_live_with) and a reader of them.
    pub fn for_each_live<E>(
        &self,
        f: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), LiveError<E>> {
        self.for_each_live_with(None, f)
    }

    /// As [`for_each_live`](Self::for_each_live), the keys of the base's store
    /// checkpoints read with `reader` (without one, a checkpoint that has them is an
    /// error that says so).
    pub fn for_each_live_with<E>(
        &self,
        reader: Option<&dyn crate::stores::StoreReader>,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), LiveError<E>> {
        if !self.stores.is_empty() && reader.is_none() {
            return Err(LiveError::NoStoreReader);
        }
        let seen = self.for_each_newest_in_files(|key, value| match value {
            Some(v) => f(key, v),
            None => Ok(()),
        })?;
        let Some(reader) = reader else {
            return Ok(());
        };
        for store in &self.stores {
            let mut failed = None;
            reader
                .for_each(&store.path, &mut |key, value| {
                    if seen.contains(key) {
                        return true;
                    }
                    match f(key, value) {
                        Ok(()) => true,
                        Err(e) => {
                            failed = Some(e);
                            false
                        }
                    }
                })
                .map_err(|e| {
                    LiveError::Damaged(Damage {
                        file: store.path.display().to_string(),
                        reason: e.to_string(),
                    })
                })?;
            if let Some(e) = failed {
                return Err(LiveError::Apply(e));
            }
        }
        Ok(())
    }

    /// Calls `f` once for every key of the base file and the deltas with its newest
    /// entry there: its value, or `None` where a delta removed it. Not the keys of the
    /// base's store checkpoints (restored as they are, then overridden by these).
    /// Returns the keys the deltas name.
    pub fn for_each_newest_in_files<E>(
        &self,
        mut f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>,
    ) -> Result<HashSet<&[u8]>, LiveError<E>> {
        let damaged = |name: &str, reason: String| {
            LiveError::Damaged(Damage {
                file: name.to_string(),
                reason,
            })
        };
        // Newest delta first: a key's first appearance is its newest entry (a delta
        // holds each key once); older entries and the base's are skipped. Only the
        // deltas' keys are remembered, so the base streams through without a copy.
        let mut seen: HashSet<&[u8]> = HashSet::new();
        for (name, payload) in self.files.iter().skip(1).rev() {
            let Payload::Bytes(payload) = payload else {
                return Err(damaged(name, "a delta read as a base".into()));
            };
            for entry in entries(payload) {
                let (key, value) = entry.map_err(|r| damaged(name, r.to_string()))?;
                if seen.insert(key) {
                    f(key, value).map_err(LiveError::Apply)?;
                }
            }
        }
        match self.files.first() {
            None => {}
            Some((name, Payload::Bytes(payload))) => {
                for entry in entries(payload) {
                    let (key, value) = entry.map_err(|r| damaged(name, r.to_string()))?;
                    if let Some(v) = value.filter(|_| !seen.contains(key)) {
                        f(key, Some(v)).map_err(LiveError::Apply)?;
                    }
                }
            }
            Some((name, Payload::File { path, len })) => {
                let cannot = |e| LiveError::Damaged(crate::dir::read_damage(name, e));
                let mut file = std::fs::File::open(path).map_err(cannot)?;
                let mut head = [0u8; crate::frame::HEADER_LEN];
                file.read_exact(&mut head).map_err(cannot)?;
                let reader = std::io::BufReader::with_capacity(READ_BUFFER, file.take(*len));
                let mut stream =
                    StreamEntries::new(reader, *len).map_err(|r| damaged(name, r.to_string()))?;
                while let Some(has_value) =
                    stream.next().map_err(|r| damaged(name, r.to_string()))?
                {
                    if has_value && !seen.contains(&stream.key[..]) {
                        f(&stream.key, Some(&stream.value)).map_err(LiveError::Apply)?;
                    }
                }
            }
        }
        Ok(seen)
    }

    /// Checks that the in-memory files' entries are well formed, without applying them
    /// (a base read from its file was checked as it was read).
    pub fn check(&self) -> Result<(), Damage> {
        for (name, payload) in &self.files {
            let Payload::Bytes(payload) = payload else {
                continue;
            };
            for entry in entries(payload) {
                entry.map_err(|reason| Damage {
                    file: name.clone(),
                    reason: reason.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// Bytes of state read (base and deltas, payloads only).
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, p)| p.len()).sum()
    }
}

/// The entries of a payload read from a stream, one at a time into reused buffers,
/// with the same checks as [`entries`]: every length against the bytes there are, and
/// nothing after the last entry.
pub(crate) struct StreamEntries<R> {
    r: R,
    /// Entries still to read.
    left: u64,
    /// Payload bytes still to read.
    bytes_left: u64,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

impl<R: Read> StreamEntries<R> {
    /// Reads the count of a payload of `len` bytes.
    pub(crate) fn new(r: R, len: u64) -> Result<Self, EntryError> {
        let mut s = StreamEntries {
            r,
            left: 0,
            bytes_left: len,
            key: Vec::new(),
            value: Vec::new(),
        };
        let mut count = [0u8; 8];
        Self::fill(&mut s.r, &mut s.bytes_left, &mut count)?;
        s.left = u64::from_le_bytes(count);
        Ok(s)
    }

    /// Fails unless `n` more bytes are left in the payload.
    fn room(bytes_left: u64, n: u64) -> Result<(), EntryError> {
        if n > bytes_left {
            return Err(EntryError::PastEnd {
                wanted: n,
                left: bytes_left,
            });
        }
        Ok(())
    }

    /// Reads `out.len()` payload bytes.
    fn fill(r: &mut R, bytes_left: &mut u64, out: &mut [u8]) -> Result<(), EntryError> {
        Self::room(*bytes_left, out.len() as u64)?;
        r.read_exact(out).map_err(EntryError::Read)?;
        *bytes_left -= out.len() as u64;
        Ok(())
    }

    /// Reads `len` payload bytes into `buf` (checked before it grows: a damaged length
    /// must not allocate 4 GiB).
    fn fill_vec(
        r: &mut R,
        bytes_left: &mut u64,
        buf: &mut Vec<u8>,
        len: u32,
    ) -> Result<(), EntryError> {
        Self::room(*bytes_left, u64::from(len))?;
        buf.clear();
        buf.resize(len as usize, 0);
        Self::fill(r, bytes_left, buf)
    }

    fn u32(&mut self) -> Result<u32, EntryError> {
        let mut b = [0u8; 4];
        Self::fill(&mut self.r, &mut self.bytes_left, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// The next entry into `key` and `value`: `Some(true)` a put, `Some(false)` a
    /// tombstone, `None` after the last.
    pub(crate) fn next(&mut self) -> Result<Option<bool>, EntryError> {
        if self.left == 0 {
            if self.bytes_left > 0 {
                return Err(EntryError::Trailing(self.bytes_left));
            }
            return Ok(None);
        }
        self.left -= 1;
        let key_len = self.u32()?;
        Self::fill_vec(&mut self.r, &mut self.bytes_left, &mut self.key, key_len)?;
        let value_len = self.u32()?;
        if value_len == TOMBSTONE {
            self.value.clear();
            return Ok(Some(false));
        }
        Self::fill_vec(
            &mut self.r,
            &mut self.bytes_left,
            &mut self.value,
            value_len,
        )?;
        Ok(Some(true))
    }
}

/// Why the entries of a state payload cannot be read: the file holding them is damaged
/// (its checksum passed, so it was written by something else, or by a bug), or could
/// not be read. A checkpoint reports it as a [`Damage`] of that file and falls back to
/// the one before.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// A length points past the payload's end.
    #[error("entry runs past the end of the payload ({wanted} bytes wanted, {left} left)")]
    PastEnd {
        /// Bytes the entry needs.
        wanted: u64,
        /// Bytes the payload has left.
        left: u64,
    },
    /// Bytes follow the last entry the count announces.
    #[error("{0} bytes after the last entry")]
    Trailing(u64),
    /// The file could not be read (a base read from its file).
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
}

/// Why [`LoadedState::for_each_live`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum LiveError<E> {
    /// A state file's entries are malformed.
    #[error("damaged state file {0}")]
    Damaged(Damage),
    /// The callback returned this error.
    #[error(transparent)]
    Apply(E),
    /// The base keeps keys in RocksDB store checkpoints and there is no reader of them
    /// (a build without the `rocksdb` state backend): [`crate::stores::NO_READER`].
    #[error("{}", crate::stores::NO_READER)]
    NoStoreReader,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(parts: &[&StateEntries]) -> Vec<u8> {
        let n = parts.iter().map(|p| p.len()).sum();
        let mut out = count_header(n).to_vec();
        for p in parts {
            out.extend_from_slice(&p.to_bytes());
        }
        out
    }

    #[test]
    fn entries_round_trip_across_parts() {
        let mut a = StateEntries::default();
        a.put_with(b"k1", |b| b.extend_from_slice(b"v1"));
        a.tombstone(b"k2");
        let mut b = StateEntries::default();
        b.put_with(b"", |_| {});
        let p = payload(&[&a, &b]);
        assert_eq!(
            collect_entries(&p).expect("valid"),
            vec![
                (&b"k1"[..], Some(&b"v1"[..])),
                (&b"k2"[..], None),
                (&b""[..], Some(&b""[..]))
            ]
        );
        assert!(collect_entries(&p[..p.len() - 1]).is_err());
        let mut extra = p.clone();
        extra.push(0);
        assert!(collect_entries(&extra).is_err());
    }

    #[test]
    fn entries_spanning_many_chunks_read_back_whole() {
        let mut e = StateEntries::default();
        for round in 0..2 {
            e.clear();
            for i in 0..30_000u32 {
                e.put_with(&i.to_le_bytes(), |v| {
                    v.extend_from_slice(&[round as u8; 100])
                });
            }
            assert!(e.parts().count() > 2, "several chunks");
            let p = payload(&[&e]);
            let all = collect_entries(&p).expect("valid");
            assert_eq!(all.len(), 30_000);
            assert!(all.iter().enumerate().all(|(i, (k, v))| {
                *k == (i as u32).to_le_bytes() && v.is_some_and(|v| v == [round as u8; 100])
            }));
        }
    }

    #[test]
    fn newest_entry_wins_and_tombstones_remove() {
        let mut base = StateEntries::default();
        for k in ["a", "b", "c"] {
            base.put_with(k.as_bytes(), |v| v.extend_from_slice(b"0"));
        }
        let mut d1 = StateEntries::default();
        d1.put_with(b"a", |v| v.extend_from_slice(b"1"));
        d1.tombstone(b"b");
        d1.put_with(b"d", |v| v.extend_from_slice(b"1"));
        let mut d2 = StateEntries::default();
        d2.put_with(b"b", |v| v.extend_from_slice(b"2"));
        d2.tombstone(b"d");
        let state = LoadedState {
            files: vec![
                ("base".into(), Payload::Bytes(payload(&[&base]))),
                ("d1".into(), Payload::Bytes(payload(&[&d1]))),
                ("d2".into(), Payload::Bytes(payload(&[&d2]))),
            ],
            format_version: crate::FORMAT_VERSION,
            stores: Vec::new(),
        };
        let mut live = Vec::new();
        state
            .for_each_live::<()>(|k, v| {
                live.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .expect("apply");
        live.sort();
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "1"), ("b", "2"), ("c", "0")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(live, want);
    }

    /// A store checkpoint's keys, as a reader of RocksDB files would hand them out.
    struct Stores(Vec<(std::path::PathBuf, Vec<(&'static str, &'static str)>)>);

    impl crate::stores::StoreReader for Stores {
        fn for_each(
            &self,
            dir: &std::path::Path,
            f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
        ) -> Result<(), crate::stores::StoreReadError> {
            let (_, keys) = self
                .0
                .iter()
                .find(|(p, _)| p == dir)
                .ok_or_else(|| crate::stores::StoreReadError("no such store".into()))?;
            for (k, v) in keys {
                if !f(k.as_bytes(), v.as_bytes()) {
                    break;
                }
            }
            Ok(())
        }
    }

    #[test]
    fn keys_of_a_bases_stores_are_live_unless_a_delta_changed_them() {
        // The base file holds the keys in memory ("m"), the stores the others; the
        // deltas change and remove keys of both.
        let mut base = StateEntries::default();
        base.put_with(b"m", |v| v.extend_from_slice(b"0"));
        let mut d1 = StateEntries::default();
        d1.put_with(b"s1", |v| v.extend_from_slice(b"1"));
        d1.tombstone(b"s2");
        d1.put_with(b"new", |v| v.extend_from_slice(b"1"));
        let store = |n: &str| crate::stores::LoadedStore {
            path: n.into(),
            keys: 2,
            open_sessions: 2,
        };
        let state = LoadedState {
            files: vec![
                ("base".into(), Payload::Bytes(payload(&[&base]))),
                ("d1".into(), Payload::Bytes(payload(&[&d1]))),
            ],
            format_version: crate::FORMAT_VERSION,
            stores: vec![store("shard-0"), store("shard-1")],
        };
        let reader = Stores(vec![
            ("shard-0".into(), vec![("s1", "0"), ("s2", "0")]),
            ("shard-1".into(), vec![("s3", "0"), ("s4", "0")]),
        ]);
        let mut live = Vec::new();
        state
            .for_each_live_with::<()>(Some(&reader), |k, v| {
                live.push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
                Ok(())
            })
            .expect("apply");
        live.sort();
        let want: Vec<(String, Vec<u8>)> = [
            ("m", "0"),
            ("new", "1"),
            ("s1", "1"),
            ("s3", "0"),
            ("s4", "0"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
        assert_eq!(live, want);

        // What a restore onto the stores as they are applies: the files' newest entries,
        // removals included, and nothing of the stores.
        let mut over = Vec::new();
        let named = state
            .for_each_newest_in_files::<()>(|k, v| {
                over.push((
                    String::from_utf8_lossy(k).into_owned(),
                    v.map(<[u8]>::to_vec),
                ));
                Ok(())
            })
            .expect("apply");
        over.sort();
        assert_eq!(
            over,
            vec![
                ("m".to_string(), Some(b"0".to_vec())),
                ("new".to_string(), Some(b"1".to_vec())),
                ("s1".to_string(), Some(b"1".to_vec())),
                ("s2".to_string(), None),
            ]
        );
        assert_eq!(named.len(), 3);

        // Without a reader the stores' keys cannot be read: said, not skipped.
        let err = state
            .for_each_live::<String>(|_, _| Ok(()))
            .expect_err("no reader");
        assert!(matches!(err, LiveError::NoStoreReader), "{err}");
        assert!(err.to_string().contains("cargo feature `rocksdb`"), "{err}");
    }
}
