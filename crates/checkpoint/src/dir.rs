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

const TMP_PREFIX: &str = ".tmp-";

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
}

impl Listing {
    /// The largest epoch of any checkpoint file (complete or orphaned), 0 when none.
    pub fn max_epoch(&self) -> u64 {
        self.manifests
            .iter()
            .copied()
            .chain(self.state_files.iter().map(|f| f.1))
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
}

impl StateDir {
    /// Opens `path`, creating it when missing.
    pub fn open(path: &Path) -> Result<StateDir, CheckpointError> {
        fs::create_dir_all(path).map_err(|source| CheckpointError::Write {
            action: "create the state directory",
            path: path.to_path_buf(),
            source,
        })?;
        let lock_path = path.join(LOCK_FILE);
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| CheckpointError::Write {
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
                return Err(CheckpointError::Write {
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
        })
    }

    /// Makes the `n`-th file write (1-based, counting state files and manifests) fail
    /// half-way with an injected "storage full" error, as a full disk would. For the
    /// tests of write failures; the binary sets it from an environment variable.
    pub fn fail_write_at(&mut self, n: Option<u64>) {
        self.fail_write_at = n;
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
            }
        }
        listing.manifests.sort_unstable();
        listing.state_files.sort_by_key(|f| f.1);
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
        fs::read(self.path.join(name)).map_err(|e| Damage {
            file: name.to_string(),
            reason: if e.kind() == io::ErrorKind::NotFound {
                "missing".to_string()
            } else {
                format!("cannot read: {e}")
            },
        })
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
            let mut bytes = self.read_file(&r.file)?;
            if bytes.len() as u64 != r.bytes {
                return Err(Damage {
                    file: r.file.clone(),
                    reason: format!("{} bytes, the manifest recorded {}", bytes.len(), r.bytes),
                });
            }
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
            files.push((r.file.clone(), bytes));
        }
        let loaded = LoadedState {
            files,
            format_version: format_version.unwrap_or(frame::FORMAT_VERSION),
        };
        loaded.check()?;
        Ok(loaded)
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
            let attempt = self
                .read_manifest(epoch)
                .and_then(|m| self.load_state(&m).map(|state| (m, state)));
            match attempt {
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
    /// (state files are checked too).
    pub fn checkpoints(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let listing = self.list()?;
        Ok(listing
            .manifests
            .iter()
            .rev()
            .map(|&epoch| {
                let manifest_bytes =
                    fs::metadata(self.path.join(file_name(FileKind::Manifest, epoch)))
                        .map_or(0, |m| m.len());
                let status = self
                    .read_manifest(epoch)
                    .and_then(|m| self.load_state(&m).map(|_| m));
                CheckpointInfo {
                    epoch,
                    manifest_bytes,
                    status,
                }
            })
            .collect())
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
        let count = state::count_header(puts + tombstones);
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&count);
        all.extend_from_slice(parts);
        let (head, trailer) = frame::frame_parts(kind, epoch, &all);
        let name = file_name(kind, epoch);
        let mut framed: Vec<&[u8]> = Vec::with_capacity(all.len() + 2);
        framed.push(&head);
        framed.extend_from_slice(&all);
        framed.push(&trailer);
        let bytes = self.write_atomic(&name, &framed)?;
        Ok(StateFileRef {
            file: name,
            epoch,
            bytes,
            puts,
            tombstones,
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
        self.writes += 1;
        let inject = self.fail_write_at == Some(self.writes);
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

    fn sync_dir(&self) -> Result<(), CheckpointError> {
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
            remove(&self.path.join(name))?;
        }
        Ok(())
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
}
