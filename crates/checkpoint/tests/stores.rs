//! Bases that keep RocksDB store checkpoints (the `rocksdb` backend), on real files: the
//! state directory adopts a store's checkpoint directory as it is, shares unchanged
//! (hard-linked) files with the previous base, verifies every file on recovery, falls
//! back past a damaged one, and removes the directories no kept checkpoint names. The
//! files here stand in for RocksDB's (this crate never reads them); the RocksDB backend's
//! own tests restore from real ones.

use sessionizer_checkpoint::stores::store_dir_name;
use sessionizer_checkpoint::{
    CheckpointError, CheckpointWriter, Committed, EncodedState, Manifest, StateDir, StateEntries,
    StoreImageDir,
};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A store's live directory, as RocksDB keeps one: table files that never change once
/// written, and files it rewrites.
struct LiveStore {
    dir: PathBuf,
    images: u32,
}

impl LiveStore {
    fn new(root: &Path) -> LiveStore {
        let dir = root.join("spill/shard-0");
        std::fs::create_dir_all(&dir).expect("mkdir");
        LiveStore { dir, images: 0 }
    }

    fn table(&self, name: &str, bytes: usize) {
        let body: Vec<u8> = (0..bytes).map(|i| (i * 7 + name.len()) as u8).collect();
        std::fs::write(self.dir.join(name), body).expect("write");
    }

    fn drop_table(&self, name: &str) {
        std::fs::remove_file(self.dir.join(name)).expect("remove");
    }

    /// An image as RocksDB's checkpoint makes one: table files hard-linked, the others
    /// copied.
    fn image(&mut self, keys: u64) -> StoreImageDir {
        self.images += 1;
        let path = self
            .dir
            .with_file_name(format!("shard-0.image{}", self.images));
        std::fs::create_dir(&path).expect("mkdir");
        for e in std::fs::read_dir(&self.dir).expect("read") {
            let e = e.expect("entry");
            let to = path.join(e.file_name());
            if e.file_name().to_string_lossy().ends_with(".sst") {
                std::fs::hard_link(e.path(), to).expect("link");
            } else {
                std::fs::copy(e.path(), to).expect("copy");
            }
        }
        std::fs::write(
            path.join("MANIFEST-000001"),
            format!("image {}", self.images),
        )
        .expect("write");
        StoreImageDir {
            path,
            keys,
            open_sessions: keys / 2,
        }
    }
}

/// A checkpoint whose base file holds `in_memory` keys and, for a base, the stores.
fn commit(w: &mut CheckpointWriter, in_memory: &[&str], stores: Vec<StoreImageDir>) -> Committed {
    let mut entries = StateEntries::default();
    for k in in_memory {
        entries.put_with(k.as_bytes(), |v| v.extend_from_slice(b"state"));
    }
    let state = EncodedState {
        parts: entries.parts().collect(),
        puts: entries.puts(),
        tombstones: entries.tombstones(),
    };
    w.commit_full(&state, &mut |_| Ok(()), stores, Manifest::default())
        .expect("commit")
}

fn ino(p: &Path) -> u64 {
    std::fs::metadata(p).expect("metadata").ino()
}

fn len(p: &Path) -> u64 {
    std::fs::metadata(p).expect("metadata").len()
}

#[test]
fn a_base_keeps_its_stores_and_shares_unchanged_table_files_with_the_previous_base() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut live = LiveStore::new(tmp.path());
    live.table("000007.sst", 5000);
    live.table("000008.sst", 3000);
    let mut w = CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None)
        .expect("writer")
        .max_deltas(1);

    let first = commit(&mut w, &["hot"], vec![live.image(40)]);
    let one = tmp.path().join(store_dir_name(first.epoch)).join("shard-0");
    // Adopted as it is: the table files are the store's own (hard links), all new.
    assert_eq!(
        ino(&one.join("000007.sst")),
        ino(&live.dir.join("000007.sst"))
    );
    assert_eq!(
        first.store_bytes_new,
        5000 + 3000 + len(&one.join("MANIFEST-000001"))
    );
    assert_eq!(first.store_bytes, first.store_bytes_new);
    assert!(
        !tmp.path().join("spill/shard-0.image1").exists(),
        "the image was moved"
    );

    commit(&mut w, &["hot"], Vec::new()); // a delta
    // The store compacts: one table file goes, one comes.
    live.drop_table("000008.sst");
    live.table("000009.sst", 2000);
    let second = commit(&mut w, &["hot", "warm"], vec![live.image(41)]);
    let two = tmp
        .path()
        .join(store_dir_name(second.epoch))
        .join("shard-0");
    // Only what is new since the previous base is read and synced.
    assert_eq!(
        second.store_bytes_new,
        2000 + len(&two.join("MANIFEST-000001"))
    );
    assert_eq!(ino(&two.join("000007.sst")), ino(&one.join("000007.sst")));

    drop(w);
    let dir = StateDir::open(tmp.path()).expect("reopen");
    let found = dir.recover().expect("recover").found.expect("a checkpoint");
    assert_eq!(found.manifest.epoch, second.epoch);
    let stores = found.state.stores();
    assert_eq!(stores.len(), 1);
    assert_eq!(stores[0].path, two);
    assert_eq!((stores[0].keys, stores[0].open_sessions), (41, 20));
    let files: Vec<&str> = found.manifest.base.stores[0]
        .files
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(files, ["000007.sst", "000009.sst", "MANIFEST-000001"]);
    // A base's stores count as its size: one small delta does not call for a base.
    assert!(found.manifest.base.state_bytes() > found.manifest.base.bytes + 7000);
}

#[test]
fn store_directories_no_kept_checkpoint_names_are_removed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut live = LiveStore::new(tmp.path());
    live.table("000001.sst", 100);
    let mut w = CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None)
        .expect("writer")
        .max_deltas(0);
    let mut epochs = Vec::new();
    for i in 0..5 {
        epochs.push(commit(&mut w, &["k"], vec![live.image(i)]).epoch);
    }
    let dirs: Vec<String> = std::fs::read_dir(tmp.path())
        .expect("read")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .filter(|n| n.starts_with("rocksdb-"))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let kept: Vec<String> = epochs[2..].iter().map(|&e| store_dir_name(e)).collect();
    assert_eq!(dirs, kept);
    // The table file lives on in the kept copies (and the store), whatever went.
    assert_eq!(
        ino(&tmp.path().join(&kept[0]).join("shard-0/000001.sst")),
        ino(&live.dir.join("000001.sst"))
    );

    // Discarding checkpoints (an uncommitted Kafka transaction) takes their stores too.
    drop(w);
    let dir = StateDir::open(tmp.path()).expect("reopen");
    dir.discard_after(Some(epochs[3])).expect("discard");
    assert!(!tmp.path().join(store_dir_name(epochs[4])).exists());
    assert!(tmp.path().join(store_dir_name(epochs[3])).exists());
}

#[test]
fn a_damaged_store_file_makes_its_checkpoints_unusable_and_recovery_falls_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut live = LiveStore::new(tmp.path());
    live.table("000001.sst", 4000);
    let mut w = CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None)
        .expect("writer")
        .max_deltas(0);
    let first = commit(&mut w, &["a"], vec![live.image(1)]).epoch;
    live.table("000002.sst", 4000);
    let second = commit(&mut w, &["a"], vec![live.image(2)]).epoch;
    let newest_only = tmp
        .path()
        .join(store_dir_name(second))
        .join("shard-0/000002.sst");

    // One flipped byte in a file only the newest base has: back to the one before.
    let mut bytes = std::fs::read(&newest_only).expect("read");
    bytes[1234] ^= 0x40;
    std::fs::write(&newest_only, &bytes).expect("write");
    drop(w);
    let dir = StateDir::open(tmp.path()).expect("reopen");
    let rec = dir.recover().expect("recover");
    assert_eq!(rec.found.expect("older").manifest.epoch, first);
    assert_eq!(rec.skipped.len(), 1);
    assert!(
        rec.skipped[0].1.to_string().contains("000002.sst")
            && rec.skipped[0].1.reason.contains("checksum"),
        "{:?}",
        rec.skipped
    );

    // A missing file, and then a shortened one shared by both: nothing valid is left,
    // and the run refuses to start rather than start empty.
    std::fs::remove_file(&newest_only).expect("remove");
    let shared = tmp
        .path()
        .join(store_dir_name(first))
        .join("shard-0/000001.sst");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shared)
        .expect("open");
    f.set_len(100).expect("truncate");
    match dir.recover() {
        Err(CheckpointError::NoValidCheckpoint { details, .. }) => {
            assert_eq!(details.len(), 2, "{details:?}");
            assert!(details[1].1.reason.contains("truncated"), "{details:?}");
        }
        other => panic!("expected no valid checkpoint, got {other:?}"),
    }
}

#[test]
fn a_failed_adoption_leaves_the_previous_checkpoint_and_no_leftovers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut live = LiveStore::new(tmp.path());
    live.table("000001.sst", 100);
    let mut dir = StateDir::open(tmp.path()).expect("open");
    // Writes: the first base's stores (1), its file (2), its manifest (3); then the
    // second base's stores (4) fail.
    dir.fail_write_at(Some(4));
    let mut w = CheckpointWriter::new(dir, None)
        .expect("writer")
        .max_deltas(0);
    let first = commit(&mut w, &["a"], vec![live.image(1)]).epoch;
    let mut entries = StateEntries::default();
    entries.put_with(b"a", |v| v.extend_from_slice(b"state"));
    let state = EncodedState {
        parts: entries.parts().collect(),
        puts: 1,
        tombstones: 0,
    };
    let image = live.image(2);
    let image_path = image.path.clone();
    let err = w
        .commit_full(&state, &mut |_| Ok(()), vec![image], Manifest::default())
        .expect_err("injected failure");
    assert!(err.to_string().contains("no space left"), "{err}");
    assert!(!image_path.exists(), "the image was not removed");
    let left: Vec<String> = std::fs::read_dir(tmp.path())
        .expect("read")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .filter(|n| n.starts_with(".tmp") || n.starts_with("rocksdb-"))
        .collect();
    assert_eq!(left, [store_dir_name(first)]);
    drop(w);
    let dir = StateDir::open(tmp.path()).expect("reopen");
    let found = dir.recover().expect("recover").found.expect("checkpoint");
    assert_eq!(found.manifest.epoch, first);
}
