//! Which paths name the same file, whatever their spelling.
//!
//! `s.jsonl`, `./s.jsonl`, `/abs/s.jsonl`, a symlink to it and a hard link to it are one
//! file; an output that is an input (or another output) must be refused before anything
//! is created or truncated, so paths are compared by identity, never by text: an existing
//! file by its device and inode, a file to be created by the canonical path of its
//! directory plus its name (a dangling symlink by the file it would create).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The identity of one file, for comparing paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileId {
    /// An existing regular file (or directory): device and inode.
    Inode {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
    },
    /// A file that does not exist yet: where it would be created.
    New(PathBuf),
    /// A device, pipe or socket (`/dev/null`, `/dev/stdout`): writing it destroys
    /// nothing, so several outputs may share it.
    Special,
}

/// How many symlinks [`identify`] follows before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// The identity of the file `path` names (following symlinks).
pub fn identify(path: &Path) -> io::Result<FileId> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::metadata(&path) {
            Ok(m) => return Ok(of_metadata(&m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // Missing: a dangling symlink would create its target.
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)?;
                path = match path.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
                continue;
            }
            _ => {}
        }
        let name = path.file_name().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "names no file (ends in ..)")
        })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // A directory that does not exist either: the output cannot be created, which
        // opening it will report; as an identity its spelling will do.
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        return Ok(FileId::New(dir.join(name)));
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// The identity of an open file (stdin, stdout).
pub fn of_metadata(m: &std::fs::Metadata) -> FileId {
    if m.is_file() || m.is_dir() {
        FileId::Inode {
            dev: m.dev(),
            ino: m.ino(),
        }
    } else {
        FileId::Special
    }
}

/// The identity of a standard stream of this process (`None`: closed, or unknown).
pub fn of_stdio(fd: impl std::os::fd::AsFd) -> Option<FileId> {
    let owned = fd.as_fd().try_clone_to_owned().ok()?;
    let file = std::fs::File::from(owned);
    file.metadata().ok().map(|m| of_metadata(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_file_have_one_identity_and_others_differ() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.jsonl");
        std::fs::write(&a, "x").expect("write");
        std::os::unix::fs::symlink(&a, dir.path().join("link")).expect("symlink");
        std::fs::hard_link(&a, dir.path().join("hard")).expect("hard link");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        let id = identify(&a).expect("id");
        assert!(matches!(id, FileId::Inode { .. }));
        for p in ["link", "hard", "sub/../a.jsonl", "./a.jsonl"] {
            assert_eq!(identify(&dir.path().join(p)).expect(p), id, "{p}");
        }
        std::fs::write(dir.path().join("b.jsonl"), "x").expect("write");
        assert_ne!(identify(&dir.path().join("b.jsonl")).expect("b"), id);

        // Files to be created: by directory and name.
        let new = identify(&dir.path().join("sub/new.jsonl")).expect("new");
        assert_eq!(
            identify(&dir.path().join("sub/../sub/./new.jsonl")).expect("new"),
            new
        );
        assert!(matches!(&new, FileId::New(p) if p.ends_with("sub/new.jsonl")));
        // A dangling symlink names the file it would create.
        std::os::unix::fs::symlink("sub/new.jsonl", dir.path().join("dangling")).expect("ln");
        assert_eq!(
            identify(&dir.path().join("dangling")).expect("dangling"),
            new
        );

        assert_eq!(
            identify(Path::new("/dev/null")).expect("null"),
            FileId::Special
        );
    }
}
