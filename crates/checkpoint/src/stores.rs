//! The RocksDB checkpoints a base of the `rocksdb` state backend builds on.
//!
//! With that backend most keys live in each worker's RocksDB store, not in memory. A
//! base then does not copy them into its base file: the backend makes a RocksDB
//! checkpoint of each store (a memtable flush, then hard links to its immutable table
//! files), and the state directory adopts those checkpoints as they are:
//!
//! ```text
//! DIR/base-0000000040.ckpt                 the keys that were in memory
//! DIR/rocksdb-0000000040/shard-0/...       worker 0's store: *.sst (hard links), MANIFEST-*, CURRENT, OPTIONS-*
//! DIR/rocksdb-0000000040/shard-1/...
//! ```
//!
//! A table file is never changed once written, so successive bases share the files they
//! have in common (the same inode under both directories): a base writes only the table
//! files that are new since the previous one, and a restore onto the same number of
//! workers links the files back into new stores instead of inserting every key again.
//! The manifest lists every file with its length and CRC32; recovery reads each one back
//! and compares, as it checks a base file, and a damaged file makes the checkpoint
//! unusable like a damaged base file.
//!
//! This crate does not read RocksDB: the keys of a store checkpoint are read through a
//! [`StoreReader`] that a build with the backend provides.

use crate::dir::{StateDir, TMP_PREFIX, read_damage};
use crate::error::{CheckpointError, Damage};
use crate::manifest::{StateFileRef, StoreFileRef, StoreRef};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const STORE_DIR_PREFIX: &str = "rocksdb-";

/// The name of the directory of a base's store checkpoints.
pub fn store_dir_name(epoch: u64) -> String {
    format!("{STORE_DIR_PREFIX}{epoch:010}")
}

/// The epoch of a directory named by [`store_dir_name`], `None` for other names.
pub fn parse_store_dir_name(name: &str) -> Option<u64> {
    let epoch = name.strip_prefix(STORE_DIR_PREFIX)?;
    if epoch.is_empty() || !epoch.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    epoch.parse().ok()
}

/// Why the keys of a store checkpoint cannot be read without a [`StoreReader`].
pub const NO_READER: &str = "this checkpoint keeps most of its keys in RocksDB files (written with --state-backend rocksdb), and this build cannot read them: use a sessionizer built with the cargo feature `rocksdb`";

/// One worker's store as the backend hands it to a base: a RocksDB checkpoint in a
/// directory of its own (on the state directory's file system, so that it can be moved
/// in rather than copied), and what it holds.
#[derive(Debug)]
pub struct StoreImageDir {
    /// The checkpoint's directory; it is moved into the state directory.
    pub path: PathBuf,
    /// Keys in it.
    pub keys: u64,
    /// Sessions among them that are not final.
    pub open_sessions: u64,
}

/// A store checkpoint of a verified base, ready to be restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedStore {
    /// Its directory.
    pub path: PathBuf,
    /// Keys in it.
    pub keys: u64,
    /// Sessions among them that are not final.
    pub open_sessions: u64,
}

/// Reads the keys of a store checkpoint (a build with the `rocksdb` state backend gives
/// one): calls `f` with every key and its value in the checkpoint codec, until `f`
/// returns `false`. The error says why the store cannot be read.
pub trait StoreReader {
    /// Reads the store checkpoint in `dir`.
    fn for_each(
        &self,
        dir: &Path,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreReadError>;
}

/// Why a [`StoreReader`] could not read a store checkpoint: the store's own error (the
/// checkpoint crate knows no store). The checkpoint reports it as a [`Damage`] of the
/// store's directory.
///
/// [`Damage`]: crate::Damage
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreReadError(pub Box<dyn std::error::Error + Send + Sync>);

/// What [`StateDir::adopt_stores`] did.
#[derive(Debug, Default)]
pub struct Adopted {
    /// The stores, for the base's manifest entry.
    pub stores: Vec<StoreRef>,
    /// Bytes of the files new since the previous base (not shared with it).
    pub new_bytes: u64,
}

impl StateDir {
    /// Moves the store checkpoints of base `epoch` into `rocksdb-<epoch>/shard-<i>` and
    /// makes them durable: every file new since `previous` (the base before, if it had
    /// stores) is read for its CRC32 and synced; a file that is the same file (inode) as
    /// one of `previous`'s keeps its recorded CRC. Nothing is visible under the final
    /// name before all of it is synced. On an error the images are removed.
    pub fn adopt_stores(
        &mut self,
        epoch: u64,
        images: Vec<StoreImageDir>,
        previous: Option<&StateFileRef>,
    ) -> Result<Adopted, CheckpointError> {
        let inject = self.count_write();
        let name = store_dir_name(epoch);
        let tmp = self.path().join(format!("{TMP_PREFIX}{name}"));
        let target = self.path().join(&name);
        let prior = previous.map_or(&[][..], |p| &p.stores[..]);
        let result = (|| {
            remove_dir_if_there(&tmp).map_err(|e| ("remove", tmp.clone(), e))?;
            fs::create_dir(&tmp).map_err(|e| ("create", tmp.clone(), e))?;
            let mut adopted = Adopted::default();
            for (i, image) in images.iter().enumerate() {
                let dest = tmp.join(format!("shard-{i}"));
                move_dir(&image.path, &dest).map_err(|e| ("move", image.path.clone(), e))?;
                let mut names = Vec::new();
                for entry in fs::read_dir(&dest).map_err(|e| ("read", dest.clone(), e))? {
                    let entry = entry.map_err(|e| ("read", dest.clone(), e))?;
                    match entry.file_name().into_string() {
                        Ok(name) => names.push(name),
                        Err(name) => {
                            return Err((
                                "adopt",
                                dest.join(name),
                                io::Error::other("a file name that is not UTF-8"),
                            ));
                        }
                    }
                }
                names.sort();
                let mut files = Vec::with_capacity(names.len());
                for file in names {
                    let path = dest.join(&file);
                    let meta = fs::metadata(&path).map_err(|e| ("read", path.clone(), e))?;
                    let shared = prior.get(i).and_then(|p| {
                        let f = p.files.iter().find(|f| f.name == file)?;
                        let before = fs::metadata(self.path().join(&p.dir).join(&file)).ok()?;
                        (before.dev() == meta.dev() && before.ino() == meta.ino())
                            .then_some(f.crc32)
                    });
                    let crc32 = match shared {
                        Some(crc) => crc,
                        None => {
                            adopted.new_bytes += meta.len();
                            let (crc, _) = crc_of(&path).map_err(|e| ("read", path.clone(), e))?;
                            File::open(&path)
                                .and_then(|f| f.sync_all())
                                .map_err(|e| ("sync", path.clone(), e))?;
                            crc
                        }
                    };
                    files.push(StoreFileRef {
                        name: file,
                        bytes: meta.len(),
                        crc32,
                    });
                }
                sync_dir(&dest).map_err(|e| ("sync", dest.clone(), e))?;
                adopted.stores.push(StoreRef {
                    dir: format!("{name}/shard-{i}"),
                    keys: image.keys,
                    open_sessions: image.open_sessions,
                    files,
                });
            }
            if inject {
                return Err((
                    "write",
                    target.clone(),
                    io::Error::new(
                        io::ErrorKind::StorageFull,
                        "no space left on device (injected by the write-failure test hook)",
                    ),
                ));
            }
            sync_dir(&tmp).map_err(|e| ("sync", tmp.clone(), e))?;
            fs::rename(&tmp, &target).map_err(|e| ("rename into place", target.clone(), e))?;
            Ok(adopted)
        })();
        match result {
            Ok(adopted) => {
                self.sync_dir()?;
                Ok(adopted)
            }
            Err((action, path, source)) => {
                let _ = fs::remove_dir_all(&tmp);
                for image in &images {
                    let _ = fs::remove_dir_all(&image.path);
                }
                Err(CheckpointError::Write {
                    action,
                    path,
                    source,
                })
            }
        }
    }

    /// Checks the store checkpoints of `base`: each directory is the one its base's
    /// epoch names, and each file is there with its recorded length and CRC32.
    pub(crate) fn check_stores(&self, base: &StateFileRef) -> Result<Vec<LoadedStore>, Damage> {
        let mut loaded = Vec::with_capacity(base.stores.len());
        for (i, store) in base.stores.iter().enumerate() {
            let want = format!("{}/shard-{i}", store_dir_name(base.epoch));
            if store.dir != want {
                return Err(Damage {
                    file: store.dir.clone(),
                    reason: format!(
                        "the manifest names it as worker {i}'s store of base {}",
                        base.epoch
                    ),
                });
            }
            let dir = self.path().join(&store.dir);
            for f in &store.files {
                let name = format!("{}/{}", store.dir, f.name);
                if f.name.is_empty() || f.name.contains('/') || f.name.starts_with('.') {
                    return Err(Damage {
                        file: name,
                        reason: "not a file name of a store".into(),
                    });
                }
                let (crc, len) = crc_of(&dir.join(&f.name)).map_err(|e| read_damage(&name, e))?;
                if len != f.bytes {
                    return Err(Damage {
                        file: name,
                        reason: format!(
                            "file length is {len} bytes, the manifest says {}: truncated or extended",
                            f.bytes
                        ),
                    });
                }
                if crc != f.crc32 {
                    return Err(Damage {
                        file: name,
                        reason: "checksum mismatch: the file is damaged".into(),
                    });
                }
            }
            loaded.push(LoadedStore {
                path: dir,
                keys: store.keys,
                open_sessions: store.open_sessions,
            });
        }
        Ok(loaded)
    }
}

/// The CRC32 and length of a file's contents, read in large pieces.
fn crc_of(path: &Path) -> io::Result<(u32, u64)> {
    let mut file = File::open(path)?;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; crate::state::READ_BUFFER];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((crc.finalize(), len));
        }
        crc.update(&buf[..n]);
        len += n as u64;
    }
}

/// Moves directory `from` to `to`: a rename on one file system, else a copy of its
/// files (hard links cannot cross file systems either) and a removal.
fn move_dir(from: &Path, to: &Path) -> io::Result<()> {
    match fs::rename(from, to) {
        Err(e) if e.kind() == io::ErrorKind::CrossesDevices => {
            fs::create_dir(to)?;
            for entry in fs::read_dir(from)? {
                let entry = entry?;
                fs::copy(entry.path(), to.join(entry.file_name()))?;
            }
            fs::remove_dir_all(from)
        }
        other => other,
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes `dir` and what it holds, if it is there.
pub(crate) fn remove_dir_if_there(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_dir_names_round_trip_and_others_are_ignored() {
        assert_eq!(store_dir_name(42), "rocksdb-0000000042");
        assert_eq!(parse_store_dir_name("rocksdb-0000000042"), Some(42));
        for other in [
            "rocksdb-",
            "rocksdb-4x",
            "rocks-0000000042",
            "base-0000000042.ckpt",
        ] {
            assert_eq!(parse_store_dir_name(other), None, "{other}");
        }
    }
}
