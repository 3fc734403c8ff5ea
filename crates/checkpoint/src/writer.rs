//! The write side: which kind of state file the next checkpoint writes, and the commit
//! of one checkpoint (state file, then manifest, then garbage collection).

use crate::dir::StateDir;
use crate::error::CheckpointError;
use crate::frame::{FORMAT_VERSION, FileKind};
use crate::manifest::{Manifest, StateFileRef};
use crate::state::LoadedState;

/// After this many deltas the next checkpoint writes a new base, so that a restore never
/// reads a long chain.
pub const DEFAULT_MAX_DELTAS: usize = 8;

/// What one commit wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The checkpoint's epoch.
    pub epoch: u64,
    /// Whether the state file is a base or a delta.
    pub kind: FileKind,
    /// Bytes of the state file, frame included.
    pub state_bytes: u64,
    /// Bytes of the manifest file, frame included.
    pub manifest_bytes: u64,
    /// Keys with a value in the state file.
    pub puts: u64,
    /// Keys removed in the state file (deltas only).
    pub tombstones: u64,
    /// A base with RocksDB store checkpoints: bytes of their files that are new since
    /// the previous base (the others are shared with it). 0 otherwise.
    pub store_bytes_new: u64,
    /// A base with RocksDB store checkpoints: bytes of all their files. 0 otherwise.
    pub store_bytes: u64,
}

/// The keyed state of one checkpoint, encoded (see [`crate::state`]): payload parts
/// (one per shard) and their entry counts.
#[derive(Debug)]
pub struct EncodedState<'a> {
    /// The entries, as consecutive parts of the payload (the entry count in front of
    /// them is added when writing).
    pub parts: Vec<&'a [u8]>,
    /// Put entries in `parts`.
    pub puts: u64,
    /// Tombstone entries in `parts`.
    pub tombstones: u64,
}

/// Writes the checkpoints of one run.
#[derive(Debug)]
pub struct CheckpointWriter {
    dir: StateDir,
    /// The base and deltas of the last checkpoint (written or resumed from).
    chain: Option<(StateFileRef, Vec<StateFileRef>)>,
    /// The last base with store checkpoints, written or resumed from (also when a
    /// resume started a new chain): a new base's files that are the same as its files
    /// keep their checksums.
    previous_base: Option<StateFileRef>,
    next_epoch: u64,
    max_deltas: usize,
}

impl CheckpointWriter {
    /// Continues after `resumed` (the checkpoint restored and its state, if any). Epochs
    /// continue past every file in the directory, so a damaged newer checkpoint is never
    /// overwritten in place. A checkpoint of an older format version is not continued:
    /// the next checkpoint is a new base, so that a chain's files share one version.
    pub fn new(
        dir: StateDir,
        resumed: Option<(&Manifest, &LoadedState)>,
    ) -> Result<Self, CheckpointError> {
        let next_epoch = dir.list()?.max_epoch() + 1;
        dir.remove_temp_files()?;
        Ok(CheckpointWriter {
            dir,
            chain: resumed
                .filter(|(_, state)| state.format_version() == FORMAT_VERSION)
                .map(|(m, _)| (m.base.clone(), m.deltas.clone())),
            previous_base: resumed
                .map(|(m, _)| m.base.clone())
                .filter(|b| !b.stores.is_empty()),
            next_epoch,
            max_deltas: DEFAULT_MAX_DELTAS,
        })
    }

    /// Continues after `resumed` instead of the checkpoint given to [`new`](Self::new)
    /// (a newer one turned out not to be usable: its Kafka transaction never committed).
    /// The next epoch stays past every file in the directory.
    pub fn resume_from(&mut self, resumed: Option<(&Manifest, &LoadedState)>) {
        self.chain = resumed
            .filter(|(_, state)| state.format_version() == FORMAT_VERSION)
            .map(|(m, _)| (m.base.clone(), m.deltas.clone()));
        self.previous_base = resumed
            .map(|(m, _)| m.base.clone())
            .filter(|b| !b.stores.is_empty());
    }

    /// Sets how many deltas may follow a base.
    pub fn max_deltas(mut self, n: usize) -> Self {
        self.max_deltas = n;
        self
    }

    /// The directory.
    pub fn dir_mut(&mut self) -> &mut StateDir {
        &mut self.dir
    }

    /// Whether the next checkpoint must be a full snapshot: there is none yet, the chain
    /// of deltas is long, or the deltas together outgrew their base (restoring from a
    /// fresh base is then cheaper than replaying them).
    pub fn next_is_base(&self) -> bool {
        match &self.chain {
            None => true,
            Some((base, deltas)) => {
                deltas.len() >= self.max_deltas
                    || deltas.iter().map(|d| d.bytes).sum::<u64>() >= base.state_bytes()
            }
        }
    }

    /// Whether the next checkpoint can be of the kind the caller encoded (`base`: every
    /// key; else the changes). A base always can — it holds every key, so it stands in
    /// for a delta and starts a new chain; a delta only where
    /// [`next_is_base`](Self::next_is_base) says no.
    pub fn settle_kind(&mut self, base: bool) -> bool {
        if base {
            self.chain = None;
        }
        base == self.next_is_base()
    }

    /// The epoch the next checkpoint gets.
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch
    }

    /// Writes one checkpoint: the state (a base if [`next_is_base`](Self::next_is_base)
    /// said so, the caller having encoded every key; else a delta of the changed keys),
    /// then `manifest` with its epoch, time and chain filled in, then deletes what the
    /// last [`KEEP_MANIFESTS`](crate::dir::KEEP_MANIFESTS) checkpoints do not need.
    pub fn commit(
        &mut self,
        state: &EncodedState<'_>,
        manifest: Manifest,
    ) -> Result<Committed, CheckpointError> {
        self.commit_with(state, &mut |_| Ok(()), manifest)
    }

    /// As [`commit`](Self::commit), with more entries than `state` holds: after its
    /// parts, `more` appends blocks of encoded entries to the state file as it is
    /// written (a base of state too large to encode in memory at once).
    pub fn commit_with(
        &mut self,
        state: &EncodedState<'_>,
        more: &mut dyn FnMut(&mut crate::StateFile) -> Result<(), CheckpointError>,
        manifest: Manifest,
    ) -> Result<Committed, CheckpointError> {
        self.commit_full(state, more, Vec::new(), manifest)
    }

    /// As [`commit_with`](Self::commit_with); a base also keeps `stores`, the RocksDB
    /// checkpoints of the workers' stores that hold the keys `state` does not
    /// ([`crate::stores`]): they are moved into the state directory before the base
    /// file is written. A delta takes none (they are removed).
    pub fn commit_full(
        &mut self,
        state: &EncodedState<'_>,
        more: &mut dyn FnMut(&mut crate::StateFile) -> Result<(), CheckpointError>,
        stores: Vec<crate::stores::StoreImageDir>,
        mut manifest: Manifest,
    ) -> Result<Committed, CheckpointError> {
        let epoch = self.next_epoch;
        let kind = if self.next_is_base() {
            FileKind::Base
        } else {
            FileKind::Delta
        };
        // The epoch is used up even if the write fails, so a retry never meets a
        // half-written file of its own name.
        self.next_epoch += 1;
        let adopted = if kind == FileKind::Base && !stores.is_empty() {
            let previous = self.previous_base.as_ref();
            self.dir.adopt_stores(epoch, stores, previous)?
        } else {
            for s in &stores {
                let _ = std::fs::remove_dir_all(&s.path);
            }
            crate::stores::Adopted::default()
        };
        let store_bytes_new = adopted.new_bytes;
        let mut file = self.dir.write_state_with(
            kind,
            epoch,
            &state.parts,
            state.puts,
            state.tombstones,
            more,
        )?;
        file.stores = adopted.stores;
        let store_bytes = file.state_bytes() - file.bytes;
        let (puts, tombstones) = (file.puts, file.tombstones);
        let state_bytes = file.bytes;
        let (base, deltas) = match (kind, self.chain.take()) {
            (FileKind::Delta, Some((base, mut deltas))) => {
                deltas.push(file);
                (base, deltas)
            }
            _ => (file, Vec::new()),
        };
        manifest.epoch = epoch;
        manifest.created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        manifest.base = base.clone();
        manifest.deltas = deltas.clone();
        let manifest_bytes = self.dir.write_manifest(&manifest)?;
        self.previous_base = Some(base.clone()).filter(|b| !b.stores.is_empty());
        self.chain = Some((base, deltas));
        self.dir.collect_garbage()?;
        Ok(Committed {
            epoch,
            kind,
            state_bytes,
            manifest_bytes,
            puts,
            tombstones,
            store_bytes_new,
            store_bytes,
        })
    }
}
