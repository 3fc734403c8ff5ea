//! The state directory on real files: commits, restore = base + deltas, folding into a
//! new base, garbage collection, recovery from damage, write failures, and the fixture
//! that pins format version 2 (and the one of version 1, still read).

use sessionizer_checkpoint::dir::file_name;
use sessionizer_checkpoint::{
    CheckpointError, CheckpointWriter, EncodedState, FileKind, Manifest, StateDir, StateEntries,
};
use std::collections::BTreeMap;
use std::path::Path;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn live(dir: &StateDir) -> (Manifest, Model) {
    let rec = dir.recover().expect("recover").found.expect("a checkpoint");
    let mut m = Model::new();
    rec.state
        .for_each_live::<()>(|k, v| {
            assert!(m.insert(k.to_vec(), v.to_vec()).is_none(), "key twice");
            Ok(())
        })
        .expect("apply");
    (rec.manifest, m)
}

/// Commits `changes` (a `None` value removes the key) as a delta, or everything as a
/// base when the writer asks for one, like the pipeline does.
fn commit(w: &mut CheckpointWriter, model: &mut Model, changes: &[(&str, Option<&str>)], seq: u64) {
    let mut entries = StateEntries::default();
    for (k, v) in changes {
        match v {
            Some(v) => {
                model.insert(k.as_bytes().to_vec(), v.as_bytes().to_vec());
            }
            None => {
                model.remove(k.as_bytes());
            }
        }
    }
    if w.next_is_base() {
        for (k, v) in model.iter() {
            entries.put_with(k, |out| out.extend_from_slice(v));
        }
    } else {
        for (k, v) in changes {
            match v {
                Some(v) => {
                    entries.put_with(k.as_bytes(), |out| out.extend_from_slice(v.as_bytes()))
                }
                None => entries.tombstone(k.as_bytes()),
            }
        }
    }
    let state = EncodedState {
        parts: entries.parts().collect(),
        puts: entries.puts(),
        tombstones: entries.tombstones(),
    };
    let manifest = Manifest {
        next_seq: seq,
        keys: model.len() as u64,
        ..Manifest::default()
    };
    w.commit(&state, manifest).expect("commit");
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    v.sort();
    v
}

#[test]
fn restore_is_base_plus_deltas_and_only_three_checkpoints_are_kept() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::open(tmp.path()).expect("open");
    let mut w = CheckpointWriter::new(dir, None)
        .expect("writer")
        .max_deltas(3);
    let mut model = Model::new();
    commit(
        &mut w,
        &mut model,
        &[("a", Some("1")), ("b", Some("1")), ("c", Some("1"))],
        1,
    );
    commit(&mut w, &mut model, &[("a", Some("2")), ("b", None)], 2);
    commit(&mut w, &mut model, &[("d", Some("3")), ("b", Some("3"))], 3);
    let reader = StateDir::existing(tmp.path()).expect("open");
    let (m, got) = live(&reader);
    assert_eq!(got, model);
    assert_eq!(m.epoch, 3);
    assert_eq!(m.next_seq, 3);
    assert_eq!(m.deltas.len(), 2);
    assert_eq!(m.deltas[0].tombstones, 1);
    for i in 4..12u64 {
        let key = format!("k{}", i % 4);
        let value = i.to_string();
        commit(
            &mut w,
            &mut model,
            &[(key.as_str(), Some(value.as_str())), ("a", None)],
            i,
        );
        let (m, got) = live(&reader);
        assert_eq!(got, model, "after checkpoint {i}");
        assert!(m.deltas.len() <= 3, "the chain is folded into a new base");
    }
    let listing = reader.list().expect("list");
    assert_eq!(
        listing.manifests,
        vec![9, 10, 11],
        "the last three manifests are kept"
    );
    let kept: std::collections::HashSet<String> = listing
        .manifests
        .iter()
        .flat_map(|&e| {
            let m = reader.read_manifest(e).expect("manifest");
            std::iter::once(m.base.file)
                .chain(m.deltas.into_iter().map(|d| d.file))
                .collect::<Vec<_>>()
        })
        .collect();
    for (_, _, name) in &listing.state_files {
        assert!(
            kept.contains(name),
            "{name} is not referenced and should be gone"
        );
    }
    assert!(listing.temp_files.is_empty());
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_and_none_valid_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut w =
        CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None).expect("writer");
    let mut model = Model::new();
    commit(&mut w, &mut model, &[("a", Some("1"))], 1);
    commit(&mut w, &mut model, &[("a", Some("2"))], 2);
    let reader = StateDir::existing(tmp.path()).expect("open");

    // A flipped byte in the newest delta: checkpoint 1 is used, 2 is reported.
    let delta = tmp.path().join(file_name(FileKind::Delta, 2));
    let mut bytes = std::fs::read(&delta).expect("read");
    let last_payload_byte = bytes.len() - 5;
    bytes[last_payload_byte] ^= 1;
    std::fs::write(&delta, &bytes).expect("write");
    let rec = reader.recover().expect("recover");
    assert_eq!(rec.found.as_ref().map(|r| r.manifest.epoch), Some(1));
    assert_eq!(rec.skipped.len(), 1);
    assert_eq!(
        rec.skipped[0].1.file, "delta-0000000002.ckpt",
        "{}",
        rec.skipped[0].1
    );

    // A truncated base as well: nothing is valid, and that is an error, not a fresh start.
    let base = tmp.path().join(file_name(FileKind::Base, 1));
    let len = std::fs::metadata(&base).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .expect("open")
        .set_len(len - 3)
        .expect("truncate");
    match reader.recover() {
        Err(CheckpointError::NoValidCheckpoint { details, .. }) => assert_eq!(details.len(), 2),
        other => panic!("expected NoValidCheckpoint, got {other:?}"),
    }
    let msg = reader.recover().expect_err("refused").to_string();
    assert!(
        msg.contains("no valid checkpoint") && msg.contains("base-0000000001.ckpt"),
        "{msg}"
    );
}

#[test]
fn a_failed_write_leaves_the_previous_checkpoint_usable_and_no_temp_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut w =
        CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None).expect("writer");
    let mut model = Model::new();
    commit(&mut w, &mut model, &[("a", Some("1"))], 1);
    let before = model.clone();
    // Writes so far: base 1, manifest 1. Fail the 4th (the manifest of checkpoint 2),
    // after its delta was written.
    w.dir_mut().fail_write_at(Some(4));
    let mut entries = StateEntries::default();
    entries.put_with(b"a", |o| o.extend_from_slice(b"2"));
    let state = EncodedState {
        parts: entries.parts().collect(),
        puts: 1,
        tombstones: 0,
    };
    let err = w
        .commit(&state, Manifest::default())
        .expect_err("injected failure");
    let msg = err.to_string();
    assert!(
        msg.contains("manifest-0000000002.ckpt") && msg.contains("previous checkpoint"),
        "{msg}"
    );
    assert!(
        !names(tmp.path()).iter().any(|n| n.starts_with(".tmp-")),
        "{:?}",
        names(tmp.path())
    );
    let (m, got) = live(&StateDir::existing(tmp.path()).expect("open"));
    assert_eq!((m.epoch, got), (1, before));
}

/// The files of `tests/fixtures/v2`, written by format version 2. A build that cannot
/// read them, or that writes different bytes for the same checkpoint, changed the format:
/// bump `FORMAT_VERSION`, document it, and keep this fixture for the old version (as
/// `tests/fixtures/v1` is kept for version 1).
fn write_fixture(dir: &Path) {
    let mut d = StateDir::open(dir).expect("open");
    let mut base = StateEntries::default();
    base.put_with(b"v1", |o| o.extend_from_slice(b"state-of-v1"));
    base.put_with(b"v2", |o| o.extend_from_slice(b"state-of-v2"));
    let base_ref = d
        .write_state(FileKind::Base, 1, &base.parts().collect::<Vec<_>>(), 2, 0)
        .expect("base");
    let mut delta = StateEntries::default();
    delta.put_with(b"v3", |o| o.extend_from_slice(b"state-of-v3"));
    delta.tombstone(b"v1");
    let delta_ref = d
        .write_state(FileKind::Delta, 2, &delta.parts().collect::<Vec<_>>(), 1, 1)
        .expect("delta");
    let manifest = Manifest {
        epoch: 2,
        created_unix_ms: 1_704_067_200_000,
        base: base_ref,
        deltas: vec![delta_ref],
        options: vec![
            ("key".into(), "visit_id".into()),
            ("gap".into(), "30m".into()),
        ],
        inputs: vec![sessionizer_checkpoint::InputPosition {
            path: "day1.jsonl".into(),
            size: 1000,
            head_xxh3: "0123456789abcdef".into(),
            offset: 600,
            line: 6,
        }],
        next_seq: 6,
        watermark: sessionizer_checkpoint::WatermarkState {
            max_event_time_ms: Some(1_704_067_260_000),
            watermark_ms: 1_704_067_200_000,
            largest_gap_ms: 1_800_000,
            new_key_floor_ms: Some(1_704_065_400_000),
            late_watermark_ms: None,
        },
        outputs: vec![sessionizer_checkpoint::OutputCommit {
            role: "sessions".into(),
            path: "out.jsonl".into(),
            committed_bytes: 250,
        }],
        counters: sessionizer_checkpoint::Counters {
            records_read: 6,
            in_sessions: 5,
            invalid: 1,
            ..Default::default()
        },
        keys: 2,
        open_sessions: 2,
        finished: false,
        flushed: false,
        kafka_txn: None,
        kafka_positions: Vec::new(),
        kafka_source: None,
        staged: Vec::new(),
        delta: Vec::new(),
    };
    d.write_manifest(&manifest).expect("manifest");
}

fn fixture(version: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(version)
}

fn fixture_entries() -> Model {
    [("v2", "state-of-v2"), ("v3", "state-of-v3")]
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

#[test]
fn format_v2_fixture_is_read_and_written_byte_for_byte() {
    let fixture = fixture("v2");
    if std::env::var_os("SESSIONIZER_WRITE_FIXTURES").is_some() {
        write_fixture(&fixture);
    }
    let dir = StateDir::existing(&fixture).expect("fixture dir");
    let (m, got) = live(&dir);
    assert_eq!(m.epoch, 2);
    assert_eq!(m.inputs[0].offset, 600);
    assert_eq!(m.watermark.largest_gap_ms, 1_800_000);
    assert_eq!(m.watermark.new_key_floor_ms, Some(1_704_065_400_000));
    assert_eq!(m.counters.records_read, 6);
    assert_eq!(got, fixture_entries());
    let state = dir.recover().expect("recover").found.expect("found").state;
    assert_eq!(state.format_version(), 2);

    let tmp = tempfile::tempdir().expect("tempdir");
    write_fixture(tmp.path());
    for name in names(&fixture) {
        assert_eq!(
            std::fs::read(tmp.path().join(&name)).expect("written"),
            std::fs::read(fixture.join(&name)).expect("fixture"),
            "{name} differs from the format-2 fixture"
        );
    }
}

/// Files written by format version 1 (the build before the floor) are still read: the
/// manifest has no new-key floor and the state says its version, so that the window
/// decodes its values as format 1.
#[test]
fn format_v1_fixture_is_still_read() {
    let dir = StateDir::existing(&fixture("v1")).expect("fixture dir");
    let (m, got) = live(&dir);
    assert_eq!(m.epoch, 2);
    assert_eq!(m.inputs[0].offset, 600);
    assert_eq!(m.watermark.largest_gap_ms, 1_800_000);
    assert_eq!(m.watermark.new_key_floor_ms, None);
    assert_eq!(got, fixture_entries());
    let state = dir.recover().expect("recover").found.expect("found").state;
    assert_eq!(state.format_version(), 1);
}

/// A run resuming a format-1 checkpoint does not continue its chain: its first
/// checkpoint is a new base, so that no chain mixes two value layouts. A checkpoint of
/// this format with few deltas is continued with a delta.
#[test]
fn resuming_an_older_format_starts_a_new_base() {
    for (version, base) in [("v1", true), ("v2", false)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        for name in names(&fixture(version)) {
            std::fs::copy(fixture(version).join(&name), tmp.path().join(&name)).expect("copy");
        }
        let dir = StateDir::open(tmp.path()).expect("open");
        let found = dir.recover().expect("recover").found.expect("found");
        let w = CheckpointWriter::new(dir, Some((&found.manifest, &found.state))).expect("writer");
        assert_eq!(w.next_is_base(), base, "resuming {version}");
    }
}

/// A manifest whose state files are of two format versions is damaged (no build writes
/// one): recovery falls back to the previous checkpoint and says why.
#[test]
fn a_chain_of_mixed_format_versions_is_damaged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in names(&fixture("v1")) {
        std::fs::copy(fixture("v1").join(&name), tmp.path().join(&name)).expect("copy");
    }
    let mut dir = StateDir::open(tmp.path()).expect("open");
    let (old, _) = live(&dir);
    let mut delta = StateEntries::default();
    delta.put_with(b"v4", |o| o.extend_from_slice(b"state-of-v4"));
    let delta_ref = dir
        .write_state(FileKind::Delta, 3, &delta.parts().collect::<Vec<_>>(), 1, 0)
        .expect("delta");
    let mut mixed = old.clone();
    mixed.epoch = 3;
    mixed.deltas.push(delta_ref);
    dir.write_manifest(&mixed).expect("manifest");
    let rec = dir.recover().expect("recover");
    assert_eq!(
        rec.found.expect("the previous checkpoint").manifest.epoch,
        2
    );
    assert_eq!(rec.skipped.len(), 1);
    let why = rec.skipped[0].1.to_string();
    assert!(
        why.contains("delta-0000000003.ckpt") && why.contains("format 2, its base in format 1"),
        "{why}"
    );
}

/// Two runs on one state directory would overwrite each other's checkpoints: the second
/// is refused while the first holds the lock, and admitted once it is gone.
#[test]
fn a_state_directory_is_used_by_one_run_at_a_time() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let first = StateDir::open(tmp.path()).expect("first run");
    let err = StateDir::open(tmp.path()).expect_err("second run while the first holds it");
    assert!(matches!(err, CheckpointError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("another sessionizer run"), "{err}");
    drop(first);
    StateDir::open(tmp.path()).expect("admitted after the first is gone");
}

#[test]
fn uncommitted_checkpoints_are_discarded_and_the_committed_one_is_resumed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::open(tmp.path()).expect("open");
    let mut w = CheckpointWriter::new(dir, None)
        .expect("writer")
        .max_deltas(8);
    let mut model = Model::new();
    commit(&mut w, &mut model, &[("a", Some("1"))], 1);
    commit(&mut w, &mut model, &[("b", Some("2"))], 2);
    let committed = model.clone();
    // Two checkpoints whose (Kafka) transactions never committed.
    commit(&mut w, &mut model, &[("c", Some("3")), ("a", None)], 3);
    commit(&mut w, &mut model, &[("d", Some("4"))], 4);
    let gone = w.dir_mut().discard_after(Some(2)).expect("discard");
    assert_eq!(gone, vec![4, 3], "newest first");
    assert_eq!(
        names(tmp.path()),
        vec![
            "LOCK",
            "base-0000000001.ckpt",
            "delta-0000000002.ckpt",
            "manifest-0000000002.ckpt",
        ],
        "the discarded checkpoints' manifests and state files are gone"
    );
    let reader = StateDir::existing(tmp.path()).expect("open");
    let (m, got) = live(&reader);
    assert_eq!(m.epoch, 2);
    assert_eq!(got, committed);
    assert!(
        w.dir_mut().discard_after(None).expect("discard all") == vec![2],
        "None discards every checkpoint"
    );
    assert!(reader.recover().expect("recover").found.is_none());
    assert_eq!(names(tmp.path()), vec!["LOCK"]);
}

#[test]
fn a_manifest_with_a_kafka_transaction_round_trips_and_one_without_has_no_field() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut d = StateDir::open(tmp.path()).expect("open");
    let txn = sessionizer_checkpoint::KafkaTxn {
        transactional_id: "sessionizer-file-x".into(),
        output_topic: "sessions".into(),
        progress_topic: "sessions-sessionizer-progress".into(),
        progress_partition: 0,
        progress_offset: 41,
        fallback_epoch: Some(6),
    };
    let positions = vec![sessionizer_checkpoint::KafkaPosition {
        topic: "visits".into(),
        partition: 2,
        next_offset: 1_700,
    }];
    let with = Manifest {
        epoch: 7,
        kafka_txn: Some(txn.clone()),
        kafka_positions: positions.clone(),
        kafka_source: Some(sessionizer_checkpoint::KafkaSource {
            topic: "visits".into(),
            partition: Some(2),
        }),
        ..Manifest::default()
    };
    d.write_manifest(&with).expect("write");
    let read = d.read_manifest(7).expect("read");
    assert_eq!(
        (read.kafka_txn, read.kafka_positions, read.kafka_source),
        (Some(txn), positions, with.kafka_source.clone())
    );
    let without = Manifest {
        epoch: 8,
        ..Manifest::default()
    };
    d.write_manifest(&without).expect("write");
    let raw = std::fs::read(tmp.path().join(file_name(FileKind::Manifest, 8))).expect("raw");
    assert!(
        !String::from_utf8_lossy(&raw).contains("kafka_txn")
            && !String::from_utf8_lossy(&raw).contains("kafka_positions")
            && !String::from_utf8_lossy(&raw).contains("kafka_source"),
        "a run without a Kafka output writes the manifest as before"
    );
}

/// A base whose entries come partly from the state given and partly appended while the
/// file is written (the rocksdb backend streams its spilled keys so): the checkpoint
/// holds them all, counts them all, and a delta on top of it restores as usual. A
/// failing append leaves no file and the previous checkpoint usable.
#[test]
fn a_base_streamed_in_blocks_restores_every_entry() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::open(tmp.path()).expect("open");
    let mut w = CheckpointWriter::new(dir, None).expect("writer");
    let mut model = Model::new();
    let mut first = StateEntries::default();
    for i in 0..1_000u32 {
        let (k, v) = (format!("hot-{i}"), format!("state-{i}"));
        first.put_with(k.as_bytes(), |o| o.extend_from_slice(v.as_bytes()));
        model.insert(k.into_bytes(), v.into_bytes());
    }
    let streamed: Vec<(String, String)> = (0..5_000u32)
        .map(|i| (format!("cold-{i}"), "x".repeat(i as usize % 300)))
        .collect();
    for (k, v) in &streamed {
        model.insert(k.clone().into_bytes(), v.clone().into_bytes());
    }
    let state = EncodedState {
        parts: first.parts().collect(),
        puts: first.puts(),
        tombstones: 0,
    };
    let committed = w
        .commit_with(
            &state,
            &mut |file| {
                for block in streamed.chunks(700) {
                    let mut entries = StateEntries::default();
                    for (k, v) in block {
                        entries.put_with(k.as_bytes(), |o| o.extend_from_slice(v.as_bytes()));
                    }
                    file.append_entries(&entries)?;
                }
                Ok(())
            },
            Manifest {
                keys: model.len() as u64,
                ..Manifest::default()
            },
        )
        .expect("commit");
    assert_eq!((committed.kind, committed.puts), (FileKind::Base, 6_000));
    commit(
        &mut w,
        &mut model,
        &[("cold-7", None), ("hot-3", Some("new"))],
        2,
    );
    drop(w);
    let dir = StateDir::open(tmp.path()).expect("open");
    assert_eq!(live(&dir).1, model);

    // An append that fails: nothing is written, the checkpoint before stays.
    let mut w = CheckpointWriter::new(dir, None).expect("writer");
    let failed = w.commit_with(
        &EncodedState {
            parts: Vec::new(),
            puts: 0,
            tombstones: 0,
        },
        &mut |_| {
            Err(CheckpointError::Write {
                action: "read",
                path: "the image".into(),
                source: std::io::Error::other("a store failed"),
            })
        },
        Manifest::default(),
    );
    assert!(failed.is_err());
    drop(w);
    let names = names(tmp.path());
    assert!(!names.iter().any(|n| n.starts_with(".tmp")), "{names:?}");
    let dir = StateDir::open(tmp.path()).expect("open");
    assert_eq!(live(&dir).1, model);
}

/// A base is checked as it is read, in pieces rather than whole (as bases above 256 MiB
/// are): any flipped byte of its file, and a payload whose entries do not fit it under
/// a valid checksum, make the checkpoint invalid, with the base named; the undamaged
/// base restores every key.
#[test]
fn a_damaged_base_read_in_pieces_is_refused_whatever_byte_is_damaged() {
    damaged_base_is_refused(Some(0));
}

/// The same with the base read whole (the default for bases up to 256 MiB).
#[test]
fn a_damaged_base_read_whole_is_refused_whatever_byte_is_damaged() {
    damaged_base_is_refused(None);
}

fn damaged_base_is_refused(stream_above: Option<u64>) {
    use sessionizer_checkpoint::frame;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut w =
        CheckpointWriter::new(StateDir::open(tmp.path()).expect("open"), None).expect("writer");
    let mut model = Model::new();
    let changes: Vec<(String, String)> = (0..40)
        .map(|i| (format!("key-{i}"), format!("v{i}")))
        .collect();
    let changes: Vec<(&str, Option<&str>)> = changes
        .iter()
        .map(|(k, v)| (k.as_str(), Some(v.as_str())))
        .collect();
    commit(&mut w, &mut model, &changes, 1);
    let mut reader = StateDir::existing(tmp.path()).expect("open");
    if let Some(n) = stream_above {
        reader.stream_bases_above(n);
    }
    assert_eq!(live(&reader).1, model);

    let base = tmp.path().join(file_name(FileKind::Base, 1));
    let good = std::fs::read(&base).expect("read");
    let refused = |why: &str| match reader.recover() {
        Err(CheckpointError::NoValidCheckpoint { details, .. }) => {
            assert_eq!(details.len(), 1, "{why}");
            assert_eq!(details[0].1.file, "base-0000000001.ckpt", "{why}");
            details[0].1.reason.clone()
        }
        other => panic!("{why}: expected NoValidCheckpoint, got {other:?}"),
    };
    for i in 0..good.len() {
        let mut bytes = good.clone();
        bytes[i] ^= 0x10;
        std::fs::write(&base, &bytes).expect("write");
        refused(&format!("byte {i} flipped"));
    }
    // A count of entries larger than the payload holds, framed with a valid checksum:
    // the entries' check refuses it, not the checksum.
    let payload = frame::decode(&good, FileKind::Base, 1).expect("valid");
    let mut wrong = payload.to_vec();
    wrong[..8].copy_from_slice(&41u64.to_le_bytes());
    std::fs::write(&base, frame::encode(FileKind::Base, 1, &wrong)).expect("write");
    let reason = refused("one entry too many");
    assert!(reason.contains("runs past the end"), "{reason}");
    // Trailing bytes after the last entry (a count one too small).
    wrong[..8].copy_from_slice(&39u64.to_le_bytes());
    std::fs::write(&base, frame::encode(FileKind::Base, 1, &wrong)).expect("write");
    let reason = refused("one entry too few");
    assert!(reason.contains("after the last entry"), "{reason}");
    std::fs::write(&base, &good).expect("write");
    assert_eq!(live(&reader).1, model);
}
