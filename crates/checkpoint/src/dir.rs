//! The state directory: naming, atomic writes, recovery of the newest valid checkpoint,
//! and garbage collection.
//!
//! ```text
//! DIR/manifest-0000000042.ckpt   one per checkpoint
//! DIR/base-0000000040.ckpt       a full snapshot of the keyed state
//! DIR/delta-0000000041.ckpt      changes since the previous checkpoint
//! DIR/delta-0000000042.ckpt
//! DIR/.tmp-*                     a write in progress (removed on the next start)
//! ```
//!
//! A file is written under a temporary name, synced, renamed into place, and the
//! directory is synced, so that after a crash a file either exists whole under its name
//! or not at all. State files are written before the manifest that names them: a
//! manifest on disk always refers to complete files. Any failure to write or sync is
//! fatal and never retried (a failed fsync may have dropped dirty pages, and retrying it
//! would report success over lost data).

use crate::error::{CheckpointError, Damage};
use crate::frame::{self, FileKind};
use crate::manifest::{Manifest, StateFileRef};
use crate::state::{self, LoadedState};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// How many manifests are kept; older ones and the state files only they refer to are
/// deleted after each checkpoint.
pub const KEEP_MANIFESTS: usize = 3;

pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// The name of a checkpoint file.
pub fn file_name(kind: FileKind, epoch: u64) -> String {
    format!("{}-{epoch:010}.ckpt", kind.as_str())
}

/// The kind and epoch of a checkpoint file name, `None` for other files.
pub fn parse_file_name(name: &str) -> Option<(FileKind, u64)> {
    let stem = name.strip_suffix(".ckpt")?;
    let (kind, epoch) = stem.split_once('-')?;
    let kind = match kind {
        "manifest" => FileKind::Manifest,
        "base" => FileKind::Base,
        "delta" => FileKind::Delta,
        _ => return None,
    };
    if epoch.is_empty() || !epoch.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((kind, epoch.parse().ok()?))
}

/// What a state directory holds.
#[derive(Debug, Default, Clone)]
pub struct Listing {
    /// Epochs of the manifests, ascending.
    pub manifests: Vec<u64>,
    /// Base and delta files: `(kind, epoch, name)`.
    pub state_files: Vec<(FileKind, u64, String)>,
    /// Leftovers of interrupted writes.
    pub temp_files: Vec<String>,
    /// Directories of bases' RocksDB store checkpoints: `(epoch, name)`
    /// ([`crate::stores`]).
    pub store_dirs: Vec<(u64, String)>,
}

impl Listing {
    /// The largest epoch of any checkpoint file (complete or orphaned), 0 when none.
    pub fn max_epoch(&self) -> u64 {
        self.manifests
            .iter()
            .copied()
            .chain(self.state_files.iter().map(|f| f.1))
            .chain(self.store_dirs.iter().map(|d| d.0))
            .max()
            .unwrap_or(0)
    }
}

/// A usable checkpoint: its manifest and its verified state files.
#[derive(Debug)]
pub struct Recovered {
    /// The checkpoint's manifest.
    pub manifest: Manifest,
    /// The payloads of its base and deltas, checksums verified.
    pub state: LoadedState,
}

/// The outcome of looking for a checkpoint to resume from.
#[derive(Debug)]
pub struct Recovery {
    /// The newest valid checkpoint; `None` when the directory holds none at all.
    pub found: Option<Recovered>,
    /// Newer checkpoints that were damaged and skipped, newest first.
    pub skipped: Vec<(u64, Damage)>,
}

/// One checkpoint as `inspect` shows it.
#[derive(Debug)]
pub struct CheckpointInfo {
    /// The checkpoint's epoch.
    pub epoch: u64,
    /// Size of the manifest file, frame included (0 if it cannot be read).
    pub manifest_bytes: u64,
    /// The manifest, or why this checkpoint cannot be used.
    pub status: Result<Manifest, Damage>,
}

/// The lock file inside a state directory.
const LOCK_FILE: &str = "LOCK";

/// A state directory.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    /// The exclusive lock on `DIR/LOCK`, held while this process writes checkpoints
    /// (released by the OS when the process ends, killed or not).
    _lock: Option<fs::File>,
    /// Test hook: the n-th file write of this process fails (see [`Self::fail_write_at`]).
    fail_write_at: Option<u64>,
    writes: u64,
    /// Bases larger than this are read in pieces rather than whole (see
    /// [`Self::stream_bases_above`]).
    stream_above: u64,
}

/// Bases up to this size are read whole (one read, as fast as it gets); larger ones are
/// read in pieces, so that a restore never needs memory for the whole state file.
pub const STREAM_BASES_ABOVE: u64 = 256 << 20;

impl StateDir {
    /// Opens `path`, creating it when missing.
    pub fn open(path: &Path) -> Result<StateDir, CheckpointError> {
        fs::create_dir_all(path).map_err(|source| {
            // The system says "File exists" or "Not a directory", which hides which
            // file is in the way.
            match path
                .ancestors()
                .find(|a| fs::metadata(a).is_ok_and(|m| !m.is_dir()))
            {
                Some(file) => CheckpointError::NotADirectory {
                    path: path.to_path_buf(),
                    file: file.to_path_buf(),
                },
                None => CheckpointError::Open {
                    action: "create the state directory",
                    path: path.to_path_buf(),
                    source,
                },
            }
        })?;
        let lock_path = path.join(LOCK_FILE);
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| CheckpointError::Open {
                action: "create the lock file",
                path: lock_path.clone(),
                source,
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(CheckpointError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err(fs::TryLockError::Error(source)) => {
                return Err(CheckpointError::Open {
                    action: "lock",
                    path: lock_path,
                    source,
                });
            }
        }
        Ok(StateDir {
            path: path.to_path_buf(),
            _lock: Some(lock),
            fail_write_at: None,
            writes: 0,
            stream_above: STREAM_BASES_ABOVE,
        })
    }

    /// Opens an existing directory for reading only (`inspect`): nothing is created.
    pub fn existing(path: &Path) -> Result<StateDir, CheckpointError> {
        if !path.is_dir() {
            return Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source: io::Error::new(io::ErrorKind::NotFound, "no such directory"),
            });
        }
        Ok(StateDir {
            path: path.to_path_buf(),
            _lock: None,
            fail_write_at: None,
            writes: 0,
            stream_above: STREAM_BASES_ABOVE,
        })
    }

    /// Makes the `n`-th file write (1-based, counting state files and manifests) fail
    /// half-way with an injected "storage full" error, as a full disk would. For the
    /// tests of write failures; the binary sets it from an environment variable when it
    /// is built with its cargo feature `fault-injection` (never in a release build).
    pub fn fail_write_at(&mut self, n: Option<u64>) {
        self.fail_write_at = n;
    }

    /// Reads bases larger than `bytes` in pieces when they are loaded (default
    /// [`STREAM_BASES_ABOVE`]; 0 streams every base, as the tests of that path do).
    pub fn stream_bases_above(&mut self, bytes: u64) {
        self.stream_above = bytes;
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lists the checkpoint files.
    pub fn list(&self) -> Result<Listing, CheckpointError> {
        let read_err = |source| CheckpointError::Read {
            path: self.path.clone(),
            source,
        };
        let mut listing = Listing::default();
        for entry in fs::read_dir(&self.path).map_err(read_err)? {
            let entry = entry.map_err(read_err)?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with(TMP_PREFIX) {
                listing.temp_files.push(name);
            } else if let Some((kind, epoch)) = parse_file_name(&name) {
                match kind {
                    FileKind::Manifest => listing.manifests.push(epoch),
                    _ => listing.state_files.push((kind, epoch, name)),
                }
            } else if let Some(epoch) = crate::stores::parse_store_dir_name(&name) {
                listing.store_dirs.push((epoch, name));
            }
        }
        listing.manifests.sort_unstable();
        listing.state_files.sort_by_key(|f| f.1);
        listing.store_dirs.sort_unstable();
        Ok(listing)
    }

    /// Reads and checks one manifest.
    pub fn read_manifest(&self, epoch: u64) -> Result<Manifest, Damage> {
        let name = file_name(FileKind::Manifest, epoch);
        let bytes = self.read_file(&name)?;
        let payload = frame::decode(&bytes, FileKind::Manifest, epoch).map_err(|e| Damage {
            file: name.clone(),
            reason: e.to_string(),
        })?;
        let manifest: Manifest = serde_json::from_slice(payload).map_err(|e| Damage {
            file: name.clone(),
            reason: format!("manifest is not readable: {e}"),
        })?;
        if manifest.epoch != epoch {
            return Err(Damage {
                file: name,
                reason: format!("manifest says epoch {}", manifest.epoch),
            });
        }
        Ok(manifest)
    }

    pub(crate) fn read_file(&self, name: &str) -> Result<Vec<u8>, Damage> {
        fs::read(self.path.join(name)).map_err(|e| read_damage(name, e))
    }

    /// Reads and checks a manifest's base and deltas.
    pub fn load_state(&self, manifest: &Manifest) -> Result<LoadedState, Damage> {
        let mut files = Vec::with_capacity(1 + manifest.deltas.len());
        let mut format_version = None;
        let refs = std::iter::once((FileKind::Base, &manifest.base))
            .chain(manifest.deltas.iter().map(|d| (FileKind::Delta, d)));
        for (kind, r) in refs {
            if file_name(kind, r.epoch) != r.file {
                return Err(Damage {
                    file: r.file.clone(),
                    reason: format!(
                        "the manifest names it as the {} of checkpoint {}",
                        kind.as_str(),
                        r.epoch
                    ),
                });
            }
            if kind == FileKind::Base && r.bytes > self.stream_above {
                let (version, len) = self.check_base(&r.file, r.bytes, r.epoch)?;
                format_version = Some(version);
                files.push((
                    r.file.clone(),
                    state::Payload::File {
                        path: self.path.join(&r.file),
                        len,
                    },
                ));
                continue;
            }
            let mut bytes = self.read_file(&r.file)?;
            check_size(&r.file, bytes.len() as u64, r.bytes)?;
            let (version, payload) =
                frame::decode_versioned(&bytes, kind, r.epoch).map_err(|e| Damage {
                    file: r.file.clone(),
                    reason: e.to_string(),
                })?;
            match format_version {
                None => format_version = Some(version),
                Some(base) if base != version => {
                    return Err(Damage {
                        file: r.file.clone(),
                        reason: format!(
                            "written in checkpoint format {version}, its base in format {base}: a chain is never mixed"
                        ),
                    });
                }
                Some(_) => {}
            }
            let range = frame::HEADER_LEN..frame::HEADER_LEN + payload.len();
            bytes.truncate(range.end);
            bytes.drain(..range.start);
            files.push((r.file.clone(), state::Payload::Bytes(bytes)));
        }
        let loaded = LoadedState {
            files,
            format_version: format_version.unwrap_or(frame::FORMAT_VERSION),
            stores: self.check_stores(&manifest.base)?,
        };
        loaded.check()?;
        Ok(loaded)
    }

    /// Checks a base file as [`load_state`](Self::load_state) checks a delta — its
    /// length, frame, checksum, kind, epoch and entries — reading it in pieces rather
    /// than whole (a base is as large as the state). Returns its format version and
    /// payload length.
    fn check_base(&self, name: &str, bytes: u64, epoch: u64) -> Result<(u16, u64), Damage> {
        use std::io::Read;
        let damage = |reason: String| Damage {
            file: name.to_string(),
            reason,
        };
        let frame_damage = |e: crate::error::FrameError| damage(e.to_string());
        let cannot = |e: io::Error| read_damage(name, e);
        let mut file = File::open(self.path.join(name)).map_err(cannot)?;
        let size = file.metadata().map_err(cannot)?.len();
        check_size(name, size, bytes)?;
        frame::check_length(size).map_err(frame_damage)?;
        let mut head = [0u8; frame::HEADER_LEN];
        file.read_exact(&mut head).map_err(cannot)?;
        let (version, len) = frame::read_header(&head, size).map_err(frame_damage)?;
        // One pass: the checksum over everything read, the entries' structure as they
        // go by. A damaged checksum is reported before a damaged structure (which
        // follows from it), so the rest of the payload is read even after one.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        let structure = {
            let mut reader = Hashing {
                inner: std::io::BufReader::with_capacity(state::READ_BUFFER, (&mut file).take(len)),
                crc: &mut crc,
            };
            let structure = state::StreamEntries::new(&mut reader, len).and_then(|mut s| {
                while s.next()?.is_some() {}
                Ok(())
            });
            io::copy(&mut reader, &mut io::sink()).map_err(cannot)?;
            structure
        };
        let mut trailer = [0u8; frame::TRAILER_LEN];
        file.read_exact(&mut trailer).map_err(cannot)?;
        if crc.finalize() != frame::trailer_crc(&trailer) {
            return Err(frame_damage(crate::error::FrameError::Checksum));
        }
        frame::check_identity(&head, FileKind::Base, epoch).map_err(frame_damage)?;
        structure.map_err(|e| damage(e.to_string()))?;
        Ok((version, len))
    }

    /// Checkpoint `epoch`'s manifest and its checked state files.
    fn load_checkpoint(&self, epoch: u64) -> Result<(Manifest, LoadedState), Damage> {
        let manifest = self.read_manifest(epoch)?;
        let state = self.load_state(&manifest)?;
        Ok((manifest, state))
    }

    /// Finds the newest checkpoint whose manifest and state files are all valid.
    ///
    /// Damaged newer ones are skipped and listed in [`Recovery::skipped`]. A directory
    /// with manifests none of which is valid is an error: starting empty would write
    /// output over output that the lost state had already accounted for.
    pub fn recover(&self) -> Result<Recovery, CheckpointError> {
        let listing = self.list()?;
        let mut skipped = Vec::new();
        for &epoch in listing.manifests.iter().rev() {
            match self.load_checkpoint(epoch) {
                Ok((manifest, state)) => {
                    return Ok(Recovery {
                        found: Some(Recovered { manifest, state }),
                        skipped,
                    });
                }
                Err(damage) => skipped.push((epoch, damage)),
            }
        }
        if skipped.is_empty() {
            Ok(Recovery {
                found: None,
                skipped,
            })
        } else {
            Err(CheckpointError::NoValidCheckpoint {
                dir: self.path.clone(),
                details: skipped,
            })
        }
    }

    /// Every checkpoint in the directory, newest first, with its manifest or its damage
    /// (state files are checked too). A checkpoint pruned by the job writing to the
    /// directory while this reads it is left out.
    pub fn checkpoints(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        Ok(self.checkpoints_of(&self.list()?))
    }

    /// [`checkpoints`](Self::checkpoints) of a listing taken earlier.
    fn checkpoints_of(&self, listing: &Listing) -> Vec<CheckpointInfo> {
        listing
            .manifests
            .iter()
            .rev()
            .filter_map(|&epoch| {
                let manifest = self.path.join(file_name(FileKind::Manifest, epoch));
                let manifest_bytes = fs::metadata(&manifest).map_or(0, |m| m.len());
                let status = self.load_checkpoint(epoch).map(|(m, _)| m);
                // A job prunes a checkpoint by removing its manifest first and only then
                // the files no kept manifest names (collect_garbage, discard_after). So
                // a file that could not be read while its manifest is still there is
                // damage; with the manifest gone too, the checkpoint was pruned after the
                // listing, whichever of its files the read missed.
                let pruned = status.is_err()
                    && fs::symlink_metadata(&manifest)
                        .is_err_and(|e| e.kind() == io::ErrorKind::NotFound);
                (!pruned).then_some(CheckpointInfo {
                    epoch,
                    manifest_bytes,
                    status,
                })
            })
            .collect()
    }

    /// Writes a base or delta file (payload in parts) atomically.
    pub fn write_state(
        &mut self,
        kind: FileKind,
        epoch: u64,
        parts: &[&[u8]],
        puts: u64,
        tombstones: u64,
    ) -> Result<StateFileRef, CheckpointError> {
        self.write_state_with(kind, epoch, parts, puts, tombstones, &mut |_| Ok(()))
    }

    /// As [`write_state`](Self::write_state), with more entries than `parts` hold:
    /// after them, `more` appends blocks of encoded entries to the file as it is
    /// written (a base of state too large to encode in memory at once). If `more`
    /// fails, nothing is written.
    pub fn write_state_with(
        &mut self,
        kind: FileKind,
        epoch: u64,
        parts: &[&[u8]],
        puts: u64,
        tombstones: u64,
        more: &mut dyn FnMut(&mut StateFile) -> Result<(), CheckpointError>,
    ) -> Result<StateFileRef, CheckpointError> {
        let mut file = self.begin_state(kind, epoch)?;
        // Dropped on an error, the file removes its temp file.
        file.append(parts.iter().copied(), puts, tombstones)?;
        more(&mut file)?;
        self.finish_state(file)
    }

    /// Starts a base or delta file that is written block by block of encoded entries
    /// ([`StateFile::append`]), for state too large to encode in memory at once; the
    /// entry count and the payload length in front are filled in by
    /// [`finish_state`](Self::finish_state), which makes it durable and puts it in
    /// place. Nothing is visible under the file's name before that.
    fn begin_state(&mut self, kind: FileKind, epoch: u64) -> Result<StateFile, CheckpointError> {
        let inject = self.count_write();
        let name = file_name(kind, epoch);
        let tmp = self.path.join(format!("{TMP_PREFIX}{name}"));
        let target = self.path.join(name.clone());
        let fail = |action, source| CheckpointError::Write {
            action,
            path: target.clone(),
            source,
        };
        let mut file = File::create(&tmp).map_err(|e| fail("create", e))?;
        // The header and the entry count, filled in at the end.
        file.write_all(&[0; frame::HEADER_LEN + 8])
            .map_err(|e| fail("write", e))?;
        Ok(StateFile {
            file,
            tmp,
            target,
            name,
            kind,
            epoch,
            crc: crc32fast::Hasher::new(),
            len: 0,
            puts: 0,
            tombstones: 0,
            inject,
        })
    }

    /// Completes a file of [`begin_state`](Self::begin_state): header, entry count and
    /// checksum, fsync, rename into place, fsync of the directory.
    fn finish_state(&mut self, mut f: StateFile) -> Result<StateFileRef, CheckpointError> {
        use std::os::unix::fs::FileExt;
        let count = state::count_header(f.puts + f.tombstones);
        let payload = 8 + f.len;
        let head = frame::header(f.kind, f.epoch, payload);
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.update(&count);
        crc.combine(&f.crc);
        let trailer = crc.finalize().to_le_bytes();
        let done = (|| {
            if f.inject {
                return Err((
                    "write",
                    io::Error::new(
                        io::ErrorKind::StorageFull,
                        "no space left on device (injected by the write-failure test hook)",
                    ),
                ));
            }
            f.file.write_all(&trailer).map_err(|e| ("write", e))?;
            f.file.write_all_at(&head, 0).map_err(|e| ("write", e))?;
            f.file
                .write_all_at(&count, frame::HEADER_LEN as u64)
                .map_err(|e| ("write", e))?;
            f.file.sync_all().map_err(|e| ("sync", e))?;
            fs::rename(&f.tmp, &f.target).map_err(|e| ("rename into place", e))
        })();
        if let Err((action, source)) = done {
            let _ = fs::remove_file(&f.tmp);
            return Err(CheckpointError::Write {
                action,
                path: f.target.clone(),
                source,
            });
        }
        self.sync_dir()?;
        Ok(StateFileRef {
            file: std::mem::take(&mut f.name),
            epoch: f.epoch,
            bytes: (frame::HEADER_LEN + frame::TRAILER_LEN) as u64 + payload,
            puts: f.puts,
            tombstones: f.tombstones,
            stores: Vec::new(),
        })
    }

    /// Writes a manifest atomically; returns its length.
    pub fn write_manifest(&mut self, manifest: &Manifest) -> Result<u64, CheckpointError> {
        let json = serde_json::to_vec(manifest).map_err(CheckpointError::Encode)?;
        let bytes = frame::encode(FileKind::Manifest, manifest.epoch, &json);
        self.write_atomic(&file_name(FileKind::Manifest, manifest.epoch), &[&bytes])
    }

    /// Temp file, write, fsync, rename, fsync of the directory.
    pub(crate) fn write_atomic(
        &mut self,
        name: &str,
        parts: &[&[u8]],
    ) -> Result<u64, CheckpointError> {
        let inject = self.count_write();
        let tmp = self.path.join(format!("{TMP_PREFIX}{name}"));
        let target = self.path.join(name);
        let result = write_synced(&tmp, parts, inject).and_then(|len| {
            fs::rename(&tmp, &target)
                .map(|()| len)
                .map_err(|e| ("rename into place", e))
        });
        let len = match result {
            Ok(len) => len,
            Err((action, source)) => {
                let _ = fs::remove_file(&tmp);
                return Err(CheckpointError::Write {
                    action,
                    path: target,
                    source,
                });
            }
        };
        self.sync_dir()?;
        Ok(len)
    }

    /// Counts one more file write; whether the write-failure test hook picks it.
    pub(crate) fn count_write(&mut self) -> bool {
        self.writes += 1;
        self.fail_write_at == Some(self.writes)
    }

    pub(crate) fn sync_dir(&self) -> Result<(), CheckpointError> {
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(|source| CheckpointError::Write {
                action: "sync the state directory",
                path: self.path.clone(),
                source,
            })
    }

    /// Removes temp files left by an interrupted write.
    pub fn remove_temp_files(&self) -> Result<(), CheckpointError> {
        for name in self.list()?.temp_files {
            if self.path.join(&name).is_dir() {
                self.remove_store_dir(&name)?;
            } else {
                remove(&self.path.join(name))?;
            }
        }
        Ok(())
    }

    /// Removes a directory of store checkpoints ([`crate::stores`]), or one left by an
    /// interrupted adoption.
    fn remove_store_dir(&self, name: &str) -> Result<(), CheckpointError> {
        let path = self.path.join(name);
        crate::stores::remove_dir_if_there(&path).map_err(|source| CheckpointError::Write {
            action: "remove the old checkpoint's store directory",
            path,
            source,
        })
    }

    /// Deletes every checkpoint newer than `epoch` (`None`: every checkpoint): their
    /// manifests first, then the state files they wrote (a state file belongs to the
    /// checkpoint of its epoch). For checkpoints that turned out never to have been
    /// committed (a Kafka transaction that was aborted): they must not be resumed from,
    /// nor push the committed one out of the [`KEEP_MANIFESTS`] kept.
    pub fn discard_after(&self, epoch: Option<u64>) -> Result<Vec<u64>, CheckpointError> {
        let listing = self.list()?;
        let newer = |e: u64| epoch.is_none_or(|keep| e > keep);
        let mut discarded = Vec::new();
        for &e in listing.manifests.iter().rev().filter(|&&e| newer(e)) {
            remove(&self.path.join(file_name(FileKind::Manifest, e)))?;
            discarded.push(e);
        }
        if !discarded.is_empty() {
            self.sync_dir()?;
        }
        for (_, e, name) in &listing.state_files {
            if newer(*e) {
                remove(&self.path.join(name))?;
            }
        }
        for (e, name) in &listing.store_dirs {
            if newer(*e) {
                self.remove_store_dir(name)?;
            }
        }
        Ok(discarded)
    }

    /// Keeps the newest [`KEEP_MANIFESTS`] manifests and the state files they name;
    /// deletes everything else that is a checkpoint file, except files newer than the
    /// newest kept manifest (a checkpoint being written). Files named by a damaged kept
    /// manifest cannot be known and may go.
    pub fn collect_garbage(&self) -> Result<(), CheckpointError> {
        let listing = self.list()?;
        let keep_from = listing.manifests.len().saturating_sub(KEEP_MANIFESTS);
        let (old, kept) = listing.manifests.split_at(keep_from);
        let newest = kept.last().copied().unwrap_or(0);
        let mut referenced = std::collections::HashSet::new();
        for &epoch in kept {
            if let Ok(m) = self.read_manifest(epoch) {
                referenced.insert(m.base.file.clone());
                referenced.extend(m.deltas.iter().map(|d| d.file.clone()));
                if !m.base.stores.is_empty() {
                    referenced.insert(crate::stores::store_dir_name(m.base.epoch));
                }
            }
        }
        for &epoch in old {
            remove(&self.path.join(file_name(FileKind::Manifest, epoch)))?;
        }
        for (_, epoch, name) in &listing.state_files {
            if *epoch <= newest && !referenced.contains(name) {
                remove(&self.path.join(name))?;
            }
        }
        for (epoch, name) in &listing.store_dirs {
            if *epoch <= newest && !referenced.contains(name) {
                self.remove_store_dir(name)?;
            }
        }
        Ok(())
    }
}

fn remove(path: &Path) -> Result<(), CheckpointError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CheckpointError::Write {
            action: "remove the old checkpoint file",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `parts` to a new file at `path` and syncs it; returns the length.
/// A base or delta file being written ([`StateDir::write_state_with`]); dropped before
/// it is complete, its temp file is removed.
#[derive(Debug)]
pub struct StateFile {
    file: File,
    tmp: PathBuf,
    target: PathBuf,
    name: String,
    kind: FileKind,
    epoch: u64,
    /// Of the entries written so far.
    crc: crc32fast::Hasher,
    len: u64,
    puts: u64,
    tombstones: u64,
    inject: bool,
}

impl StateFile {
    /// Writes encoded entries (as [`crate::StateEntries`] lays them out, in consecutive
    /// parts) holding `puts` puts and `tombstones` tombstones in all.
    pub fn append<'a>(
        &mut self,
        parts: impl IntoIterator<Item = &'a [u8]>,
        puts: u64,
        tombstones: u64,
    ) -> Result<(), CheckpointError> {
        for part in parts {
            self.file
                .write_all(part)
                .map_err(|source| CheckpointError::Write {
                    action: "write",
                    path: self.target.clone(),
                    source,
                })?;
            self.crc.update(part);
            self.len += part.len() as u64;
        }
        self.puts += puts;
        self.tombstones += tombstones;
        Ok(())
    }

    /// Writes every entry of `entries`.
    pub fn append_entries(&mut self, entries: &crate::StateEntries) -> Result<(), CheckpointError> {
        self.append(entries.parts(), entries.puts(), entries.tombstones())
    }
}

impl Drop for StateFile {
    fn drop(&mut self) {
        // Finished files were renamed away: this removes only an abandoned one.
        if !self.name.is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn write_synced(
    path: &Path,
    parts: &[&[u8]],
    inject_failure: bool,
) -> Result<u64, (&'static str, io::Error)> {
    let mut f = File::create(path).map_err(|e| ("create", e))?;
    let mut len = 0u64;
    for (i, part) in parts.iter().enumerate() {
        if inject_failure && i == parts.len() / 2 {
            f.write_all(&part[..part.len() / 2])
                .map_err(|e| ("write", e))?;
            return Err((
                "write",
                io::Error::new(
                    io::ErrorKind::StorageFull,
                    "no space left on device (injected by the write-failure test hook)",
                ),
            ));
        }
        f.write_all(part).map_err(|e| ("write", e))?;
        len += part.len() as u64;
    }
    f.sync_all().map_err(|e| ("sync", e))?;
    Ok(len)
}

/// Why a state file could not be read: `missing`, or the I/O error.
pub(crate) fn read_damage(name: &str, e: io::Error) -> Damage {
    Damage {
        file: name.to_string(),
        reason: if e.kind() == io::ErrorKind::NotFound {
            "missing".to_string()
        } else {
            format!("cannot read: {e}")
        },
    }
}

/// Fails unless a state file has the size its manifest recorded.
fn check_size(name: &str, found: u64, recorded: u64) -> Result<(), Damage> {
    if found != recorded {
        return Err(Damage {
            file: name.to_string(),
            reason: format!("{found} bytes, the manifest recorded {recorded}"),
        });
    }
    Ok(())
}

/// A reader that adds every byte it hands out to a checksum.
struct Hashing<'h, R> {
    inner: R,
    crc: &'h mut crc32fast::Hasher,
}

impl<R: io::Read> io::Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip_and_others_are_ignored() {
        let n = file_name(FileKind::Delta, 42);
        assert_eq!(n, "delta-0000000042.ckpt");
        assert_eq!(parse_file_name(&n), Some((FileKind::Delta, 42)));
        for other in [
            "delta-.ckpt",
            "delta-x1.ckpt",
            "foo-1.ckpt",
            "base-1.tmp",
            ".tmp-base-1.ckpt",
        ] {
            assert_eq!(parse_file_name(other), None, "{other}");
        }
    }

    /// `inspect` beside a running job: the job prunes old checkpoints between the
    /// listing and the reads. A checkpoint whose manifest went since the listing was
    /// pruned, not damaged; a file missing under a manifest still there is damage.
    #[test]
    fn a_checkpoint_pruned_after_the_listing_is_not_damage_but_a_missing_state_file_is() {
        use crate::writer::{CheckpointWriter, EncodedState};
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut w =
            CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None).expect("writer");
        for i in 1..=4u64 {
            let mut entries = crate::StateEntries::default();
            entries.put_with(b"k", |out| out.extend_from_slice(i.to_string().as_bytes()));
            let state = EncodedState {
                parts: entries.parts().collect(),
                puts: entries.puts(),
                tombstones: entries.tombstones(),
            };
            w.commit(&state, Manifest::default()).expect("commit");
        }
        let reader = StateDir::existing(tmp.path()).expect("existing");
        let listing = reader.list().expect("list");
        assert_eq!(listing.manifests, vec![2, 3, 4]);

        // Between the listing and the reads the job prunes checkpoint 2 the way its
        // garbage collection does (manifest first, then the state files only it named),
        // and the state file written by checkpoint 4 goes missing under its manifest.
        let named = |epoch| {
            let m = reader.read_manifest(epoch).expect("manifest");
            let mut files = vec![m.base.file];
            files.extend(m.deltas.into_iter().map(|d| d.file));
            files
        };
        let kept = [named(3), named(4)].concat();
        let only_2: Vec<String> = named(2).into_iter().filter(|f| !kept.contains(f)).collect();
        let lost = named(4).pop().expect("a state file");
        fs::remove_file(tmp.path().join(file_name(FileKind::Manifest, 2))).expect("remove");
        for name in only_2.iter().chain([&lost]) {
            fs::remove_file(tmp.path().join(name)).expect("remove");
        }

        let seen: Vec<(u64, Result<u64, Damage>)> = reader
            .checkpoints_of(&listing)
            .into_iter()
            .map(|c| (c.epoch, c.status.map(|m| m.epoch)))
            .collect();
        let missing = Damage {
            file: lost.clone(),
            reason: "missing".into(),
        };
        assert_eq!(
            seen,
            vec![(4, Err(missing)), (3, Ok(3)),],
            "checkpoint 2 was pruned, not damaged; checkpoint 4 lost a file"
        );
    }
}
