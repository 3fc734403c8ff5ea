//! A library window on the command line's state backends (docs/semantics.md S-36): with
//! `rocksdb` and a budget far below its state, most keys live in RocksDB, and the job's
//! output, accounting and checkpoints are the memory backend's.

mod support;

#[cfg(feature = "rocksdb")]
use proptest::prelude::*;
use sessionizer::config::StateBackend;
use sessionizer::prelude::*;
use sessionizer::window::ProcessingTime;

use support::Visit;

/// `n` events over `keys` visits, 200 ms apart, out of order by up to 4 minutes, some
/// far late, in a pseudo-random order fixed by `seed`.
fn visits(n: i64, keys: u64, seed: u64) -> Vec<Visit> {
    support::visits(n, keys, 200, seed)
}

type Job = support::VisitJob;
type Out = support::VisitOut;

fn job(gap: DurationMs, lateness: DurationMs, emit: EmitMode) -> Job {
    support::visit_job(
        gap,
        lateness,
        emit,
        None,
        ManualClock::new(ProcessingTime(0)),
    )
}

/// A budget far below the job's state: a few hundred keys in memory.
fn rocks(dir: &std::path::Path) -> StateBackend {
    StateBackend::RocksDb {
        memory_bytes: 64 << 10,
        dir: Some(dir.to_path_buf()),
    }
}

fn run(job: Job, input: &[Visit]) -> (Vec<Out>, Vec<Late<Visit>>, WindowCounts, Job) {
    support::run_visits(job, input)
}

/// Choosing a backend once the job has state is refused (it would hold keys the store
/// never saw), whatever the build.
#[test]
fn a_backend_is_chosen_before_the_first_event() {
    let mut j = job(minutes(3), minutes(5), EmitMode::OnClose);
    let (mut out, mut late) = (Vec::<Out>::new(), Vec::new());
    j.push(visits(1, 1, 7).remove(0), &mut out, &mut late)
        .expect("vectors");
    let dir = tempfile::tempdir().expect("temp dir");
    let err = j
        .set_state_backend(&rocks(dir.path()))
        .expect_err("too late");
    assert!(
        err.to_string().contains("before the job's first event"),
        "{err}"
    );
    // The memory backend is what the job has: asking for it is as late.
    assert!(j.set_state_backend(&StateBackend::Memory).is_err());
}

/// `Memory` is what a job has without asking: choosing it changes nothing.
#[test]
fn the_memory_backend_is_the_default() {
    let input = visits(5_000, 300, 11);
    let (expected, expected_late, counts, _) =
        run(job(minutes(3), minutes(5), EmitMode::OnClose), &input);
    let mut chosen = job(minutes(3), minutes(5), EmitMode::OnClose);
    chosen
        .set_state_backend(&StateBackend::Memory)
        .expect("memory");
    let (out, late, chosen_counts, chosen) = run(chosen, &input);
    assert!(chosen.operator().spill_counts().is_none(), "no store below");
    assert_eq!(
        (out, late, chosen_counts),
        (expected, expected_late, counts)
    );
}

#[cfg(not(feature = "rocksdb"))]
#[test]
fn without_the_feature_rocksdb_is_refused_by_name() {
    let mut j = job(minutes(3), minutes(5), EmitMode::OnClose);
    let dir = tempfile::tempdir().expect("temp dir");
    let err = j
        .set_state_backend(&rocks(dir.path()))
        .expect_err("no rocksdb");
    assert!(err.to_string().contains("cargo feature `rocksdb`"), "{err}");
}

/// On RocksDB with most keys evicted and taken back, a dirty stream (late events,
/// revisions, merges, retractions) gives the memory backend's records, late events and
/// counts, in the same order.
#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_gives_the_memory_backends_output_with_most_keys_on_disk() {
    let input = visits(40_000, 5_000, 0x9e37_79b9_7f4a_7c15);
    for emit in [EmitMode::OnClose, EmitMode::OnUpdate] {
        let (expected, expected_late, counts, _) = run(job(minutes(3), minutes(30), emit), &input);
        assert!(
            counts.late > 0 && counts.retractions > 0,
            "the input exercises lateness and merges: {counts:?}"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let store = dir.path().join("rocks");
        let mut on_disk = job(minutes(3), minutes(30), emit);
        on_disk.set_state_backend(&rocks(&store)).expect("rocksdb");
        let (out, late, disk_counts, on_disk) = run(on_disk, &input);
        let spilled = on_disk.operator().spill_counts().expect("a store");
        assert!(
            spilled.evicted > 10_000 && spilled.unspilled > 10_000,
            "most keys went to disk and came back: {spilled:?}"
        );
        assert!(store.exists(), "the store lives in the directory given");
        assert_eq!(out.len(), expected.len(), "{emit:?}");
        assert_eq!(out, expected, "{emit:?}");
        assert_eq!(late, expected_late, "{emit:?}");
        assert_eq!(disk_counts, counts, "{emit:?}");
        drop(on_disk);
        let left = std::fs::read_dir(&store)
            .expect("the directory given stays")
            .count();
        assert_eq!(left, 0, "the store is scratch space, emptied with the job");
    }
}

/// A job on `workers` workers restored from the checkpoint in `dir` (on RocksDB in
/// `store` if given), which must cover the first `covered` events of `input`, then
/// run over the rest: what it emits, its counts and what it resumed from.
#[cfg(feature = "rocksdb")]
fn resume(
    dir: &std::path::Path,
    (store, workers): (Option<&std::path::Path>, usize),
    lateness: DurationMs,
    input: &[Visit],
    covered: usize,
) -> (Vec<Out>, Vec<Late<Visit>>, WindowCounts, Resumed) {
    let mut checkpoints = Checkpoints::open(dir).expect("state dir");
    let mut job = job(minutes(3), lateness, EmitMode::OnClose);
    job.set_workers(workers).expect("workers");
    if let Some(store) = store {
        job.set_state_backend(&rocks(store)).expect("rocksdb");
    }
    let resumed = job
        .restore(&mut checkpoints)
        .expect("restored")
        .expect("a checkpoint");
    assert_eq!(resumed.events as usize, covered);
    let (mut out, mut late) = (Vec::new(), Vec::new());
    let counts = job
        .run(input.iter().skip(covered).cloned(), &mut out, &mut late)
        .expect("vectors");
    (out, late, counts, resumed)
}

/// A job on RocksDB checkpointed (a base with most keys on disk, then a delta), killed,
/// and restored onto RocksDB or onto memory emits, with what it committed before,
/// exactly the records of an uninterrupted run: the checkpoint holds every key,
/// wherever it was, in the one format.
#[cfg(feature = "rocksdb")]
#[test]
fn a_checkpoint_of_a_rocksdb_job_restores_on_either_backend() {
    let input = visits(30_000, 4_000, 0x2545_f491_4f6c_dd1d);
    let lateness = minutes(30);
    let (expected, expected_late, counts, _) =
        run(job(minutes(3), lateness, EmitMode::OnClose), &input);
    let scratch = tempfile::tempdir().expect("temp dir");
    for restore_on_disk in [true, false] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut committed, mut committed_late) = (Vec::<Out>::new(), Vec::new());
        {
            let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
            let mut first = job(minutes(3), lateness, EmitMode::OnClose);
            first
                .set_state_backend(&rocks(&scratch.path().join("first")))
                .expect("rocksdb");
            let (mut out, mut late) = (Vec::new(), Vec::new());
            for (i, v) in input.iter().cloned().enumerate() {
                first.push(v, &mut out, &mut late).expect("vectors");
                if i + 1 == 12_000 || i + 1 == 20_000 {
                    let spilled = first.operator().spill_counts().expect("a store");
                    assert!(
                        spilled.keys > 1_000,
                        "keys on disk at the checkpoint: {spilled:?}"
                    );
                    let keys = first.operator().keys() as u64;
                    let written = first.checkpoint(&mut checkpoints).expect("checkpoint");
                    if i + 1 == 12_000 {
                        // The base keeps an image of the store (a RocksDB checkpoint)
                        // for the keys on disk instead of reading and encoding them.
                        assert_eq!(written.kind, sessionizer::checkpoints::FileKind::Base);
                        assert!(
                            written.store_bytes > 0 && written.puts + spilled.keys as u64 == keys,
                            "{written:?}, {spilled:?}, {keys} keys"
                        );
                    }
                    committed.append(&mut out);
                    committed_late.append(&mut late);
                }
                if i + 1 == 25_000 {
                    break; // killed: what it emitted since event 20,000 is lost
                }
            }
        }
        let store = scratch.path().join("second");
        let on_disk = restore_on_disk.then_some(store.as_path());
        let (mut out, mut late, second_counts, resumed) =
            resume(dir.path(), (on_disk, 1), lateness, &input, 20_000);
        // Onto RocksDB, the store starts as the base's copy of it: its keys are not
        // read (the command line's restore on the same number of workers).
        assert_eq!(
            resumed.keys_linked > 1_000,
            restore_on_disk,
            "on disk: {restore_on_disk}, {resumed:?}"
        );
        committed.append(&mut out);
        committed_late.append(&mut late);
        assert_eq!(
            committed.len(),
            expected.len(),
            "on disk: {restore_on_disk}"
        );
        assert_eq!(committed, expected, "on disk: {restore_on_disk}");
        assert_eq!(committed_late, expected_late, "on disk: {restore_on_disk}");
        assert_eq!(second_counts, counts, "one accounting across the restart");
    }
}

/// A RocksDB job's checkpoint (a base with each worker's store copy, then a delta)
/// restored onto RocksDB with as many workers starts each store as its copy, reading
/// only the keys in the files; onto another number it reads every key into the shards
/// of that number. Either way, with what was committed before the kill: exactly the
/// uninterrupted run's records, late events and counts. A minute of lateness, so that
/// keys on disk at the base are gone by the delta (a restore that left them in the
/// store copies would emit their sessions again).
#[cfg(feature = "rocksdb")]
#[test]
fn a_rocksdb_checkpoint_restores_onto_the_same_or_another_number_of_workers() {
    let input = visits(30_000, 4_000, 0x1405_7b7e_f767_814f);
    let lateness = minutes(1);
    let (expected, expected_late, counts, _) =
        run(job(minutes(3), lateness, EmitMode::OnClose), &input);
    for (before, after) in [(2, 2), (3, 3), (2, 3), (3, 1)] {
        let scratch = tempfile::tempdir().expect("temp dir");
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut committed, mut committed_late) = (Vec::<Out>::new(), Vec::new());
        let mut on_disk_at_base = 0;
        {
            let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
            let mut first = job(minutes(3), lateness, EmitMode::OnClose);
            first.set_workers(before).expect("workers");
            first
                .set_state_backend(&rocks(&scratch.path().join("first")))
                .expect("rocksdb");
            let (mut out, mut late) = (Vec::new(), Vec::new());
            for (i, chunk) in input[..25_000].chunks(1_000).enumerate() {
                first
                    .push_batch(chunk.iter().cloned(), &mut out, &mut late)
                    .expect("vectors");
                if i + 1 == 12 || i + 1 == 20 {
                    if i + 1 == 12 {
                        on_disk_at_base = first
                            .operators()
                            .map(|op| op.spill_counts().expect("a store").keys)
                            .sum::<usize>();
                    }
                    first.checkpoint(&mut checkpoints).expect("checkpoint");
                    committed.append(&mut out);
                    committed_late.append(&mut late);
                }
            }
        }
        assert!(
            on_disk_at_base > 1_000,
            "keys on disk at the base: {on_disk_at_base}"
        );
        let store = scratch.path().join("second");
        let (mut out, mut late, second_counts, resumed) =
            resume(dir.path(), (Some(&store), after), lateness, &input, 20_000);
        let case = format!("{before} -> {after} workers, {resumed:?}");
        let linked = if before == after {
            on_disk_at_base as u64
        } else {
            0
        };
        assert_eq!(resumed.keys_linked, linked, "{case}");
        committed.append(&mut out);
        committed_late.append(&mut late);
        assert_eq!(committed.len(), expected.len(), "{case}");
        assert_eq!(committed, expected, "{case}");
        assert_eq!(committed_late, expected_late, "{case}");
        assert_eq!(second_counts, counts, "{case}");
    }
}

/// Two workers, each with a RocksDB store of its own within one budget: the output of
/// one worker in memory.
#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_on_two_workers_gives_one_memory_workers_output() {
    let input = visits(30_000, 4_000, 0x5851_f42d_4c95_7f2d);
    let expected = run(job(minutes(3), minutes(30), EmitMode::OnClose), &input);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut on_disk = job(minutes(3), minutes(30), EmitMode::OnClose);
    on_disk.set_workers(2).expect("workers");
    on_disk
        .set_state_backend(&rocks(dir.path()))
        .expect("rocksdb");
    let (out, late, counts, on_disk) = run(on_disk, &input);
    for op in on_disk.operators() {
        let spilled = op.spill_counts().expect("a store per worker");
        assert!(spilled.evicted > 1_000, "keys went to disk: {spilled:?}");
    }
    assert_eq!(out, expected.0);
    assert_eq!(late, expected.1);
    assert_eq!(counts, expected.2);
}

#[cfg(feature = "rocksdb")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any stream, any gap and lateness, a budget of a few keys: RocksDB's output is
    /// the memory backend's.
    #[test]
    fn rocksdb_matches_memory_on_any_stream(
        seed in any::<u64>(),
        n in 1i64..3_000,
        keys in 1u64..800,
        gap_s in 1i64..600,
        lateness_s in 0i64..3_600,
        on_update in any::<bool>(),
    ) {
        let input = visits(n, keys, seed);
        let emit = if on_update { EmitMode::OnUpdate } else { EmitMode::OnClose };
        let (gap, lateness) = (seconds(gap_s), seconds(lateness_s));
        let (expected, expected_late, counts, _) = run(job(gap, lateness, emit), &input);
        let dir = tempfile::tempdir().expect("temp dir");
        let mut on_disk = job(gap, lateness, emit);
        on_disk
            .set_state_backend(&StateBackend::RocksDb { memory_bytes: 4 << 10, dir: Some(dir.path().join("r")) })
            .expect("rocksdb");
        let (out, late, disk_counts, _) = run(on_disk, &input);
        prop_assert_eq!(out, expected);
        prop_assert_eq!(late, expected_late);
        prop_assert_eq!(disk_counts, counts);
    }
}

/// More keys changed and evicted between two checkpoints than the budget would hold as
/// a list: the job forgets them and writes its next checkpoint as a base instead of a
/// delta (its memory stays bounded), and a restore from that base gives the
/// uninterrupted output.
#[cfg(feature = "rocksdb")]
#[test]
fn too_many_evicted_changes_make_the_next_checkpoint_a_base() {
    use sessionizer::checkpoints::FileKind;
    let input = visits(60_000, 40_000, 0x9e37_79b9_7f4a_7c15);
    let lateness = minutes(30);
    let (expected, expected_late, _, _) = run(job(minutes(3), lateness, EmitMode::OnClose), &input);
    let scratch = tempfile::tempdir().expect("temp dir");
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut committed, mut committed_late) = (Vec::<Out>::new(), Vec::new());
    let mut kinds = Vec::new();
    {
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut first = job(minutes(3), lateness, EmitMode::OnClose);
        first
            .set_state_backend(&rocks(&scratch.path().join("first")))
            .expect("rocksdb");
        let (mut out, mut late) = (Vec::new(), Vec::new());
        for (i, v) in input.iter().cloned().enumerate() {
            first.push(v, &mut out, &mut late).expect("vectors");
            if i + 1 == 10_000 || i + 1 == 40_000 || i + 1 == 41_000 {
                kinds.push(first.checkpoint(&mut checkpoints).expect("checkpoint").kind);
                committed.append(&mut out);
                committed_late.append(&mut late);
            }
            if i + 1 == 41_000 {
                break;
            }
        }
    }
    // 30,000 events over 40,000 keys between the first two: a base; then a delta.
    assert_eq!(kinds, [FileKind::Base, FileKind::Base, FileKind::Delta]);
    let store = scratch.path().join("second");
    let (mut out, mut late, _, _) = resume(dir.path(), (Some(&store), 1), lateness, &input, 41_000);
    committed.append(&mut out);
    committed_late.append(&mut late);
    assert_eq!(committed, expected);
    assert_eq!(committed_late, expected_late);
}
