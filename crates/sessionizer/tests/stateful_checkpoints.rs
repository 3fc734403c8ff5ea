//! The stateful style as a restartable service: a `StatefulJob` checkpoints into a
//! state directory in the command line's format (bases, then deltas) and a job
//! restored from any of its checkpoints continues exactly as one that never stopped —
//! with its state, Spark-style timeouts, registered timers and state TTL. On several
//! workers (`set_workers`) the job gives one worker's outputs, late events and counts,
//! and its checkpoints restore onto any number of workers. On the `rocksdb` state
//! backend, with a budget far below its state, it gives the memory backend's outputs
//! and its checkpoints restore on either backend.

mod support;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use sessionizer::checkpoints::FileKind;
use sessionizer::prelude::*;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Click {
    user: u32,
    at: EventTime,
}

/// A dirty stream of clicks, out of order by up to 30 s, in a fixed pseudo-random
/// order: five busy users, and sixty who click now and then (their state expires in
/// between).
fn clicks(n: i64) -> Vec<Click> {
    clicks_seeded(n, 0x2545_f491_4f6c_dd1d)
}

fn clicks_seeded(n: i64, seed: u64) -> Vec<Click> {
    clicks_of(n, seed, 60, 5_000)
}

/// [`clicks_seeded`] with `rare` users who click now and then, a click every `every`
/// ms.
fn clicks_of(n: i64, seed: u64, rare: u64, every: i64) -> Vec<Click> {
    let mut next = support::xorshift(seed);
    (0..n)
        .map(|i| Click {
            user: match next() % 4 {
                0 => 5 + (next() % rare) as u32,
                _ => (next() % 5) as u32,
            },
            at: EventTime(i * every - (next() % 30_000) as i64),
        })
        .collect()
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Seen {
    clicks: u64,
    last: Option<i64>,
}

/// Per user: a registered event-time timer one minute after each first click of a
/// burst (reports the burst), a Spark-style timeout ten minutes after the last click
/// (reports and drops the state), a processing-time timer 30 s of clock after a burst
/// starts; the state expires after 25 s of clock without a write (a user whose state
/// is gone is reported `new`).
fn f(user: &str, clicks: Vec<Click>, state: &mut GroupState<'_, Seen>) -> Vec<String> {
    let mut out = Vec::new();
    match state.fired_timer() {
        Some(Timer::EventTime(t)) => {
            let n = state.get().map_or(0, |s| s.clicks);
            out.push(format!("{user} burst@{} {n}", t.millis()));
            return out;
        }
        Some(Timer::ProcessingTime(t)) => {
            out.push(format!("{user} clock@{}", t.millis()));
            return out;
        }
        None => {}
    }
    if state.has_timed_out() {
        let seen = state.remove().unwrap_or_default();
        out.push(format!("{user} quiet {}", seen.clicks));
        return out;
    }
    let mut seen = match state.get() {
        Some(s) => s.clone(),
        None => {
            out.push(format!("{user} new"));
            Seen::default()
        }
    };
    for c in &clicks {
        if seen.last.is_none_or(|l| c.at.millis() > l + 120_000) {
            state.register_event_time_timer(c.at.plus(minutes(1)));
            let now = state.current_processing_time();
            state.register_processing_time_timer(now.plus(seconds(30)));
        }
        seen.clicks += 1;
        seen.last = Some(seen.last.map_or(c.at.millis(), |l| l.max(c.at.millis())));
    }
    if let Some(last) = seen.last {
        state.set_timeout_timestamp(EventTime(last).plus(minutes(10)));
    }
    state.update(seen);
    out
}

type F = fn(&str, Vec<Click>, &mut GroupState<'_, Seen>) -> Vec<String>;
type Job = StatefulJob<
    Click,
    fn(&Click) -> u32,
    fn(&Click) -> EventTime,
    BoundedOutOfOrderness,
    Seen,
    F,
    ManualClock,
>;

fn job(clock: &ManualClock) -> Job {
    Stream::<Click>::new()
        .key_by((|c| c.user) as fn(&Click) -> u32)
        .event_time((|c| c.at) as fn(&Click) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(seconds(20)))
        .flat_map_groups_with_state(f as F)
        .clock(clock.clone())
        .state_ttl(seconds(25))
        .build()
}

const BATCH: usize = 40;

/// Runs batches `from..` of `input` (the clock at 10 s per batch), checkpointing after
/// each batch when `checkpoints` is given; returns the outputs and, per batch, how many
/// outputs there were when it ended.
fn drive(
    job: &mut Job,
    clock: &ManualClock,
    input: &[Click],
    from: usize,
    mut checkpoints: Option<&mut Checkpoints>,
) -> (Vec<String>, Vec<usize>) {
    let mut out = Vec::new();
    let mut marks = Vec::new();
    for (b, batch) in input.chunks(BATCH).enumerate().skip(from) {
        clock.set(ProcessingTime(b as i64 * 10_000));
        job.process_batch(batch.iter().cloned(), &mut out, &mut Vec::new())
            .expect("vectors never refuse");
        if let Some(c) = checkpoints.as_deref_mut() {
            job.checkpoint(c).expect("checkpoint");
        }
        marks.push(out.len());
    }
    clock.set(ProcessingTime(1_000_000));
    job.finish(&mut out, &mut Vec::new()).expect("vectors");
    (out, marks)
}

/// Runs batches `..=stop` of `input` (the clock as in [`drive`]), checkpointing after
/// each batch `b` with `at(b)`; the outputs and the kinds of the checkpoints written.
fn checkpoint_through(
    job: &mut Job,
    clock: &ManualClock,
    input: &[Click],
    stop: usize,
    checkpoints: &mut Checkpoints,
    at: impl Fn(usize) -> bool,
) -> (Vec<String>, Vec<FileKind>) {
    let mut out = Vec::new();
    let mut kinds = Vec::new();
    for (b, batch) in input.chunks(BATCH).enumerate().take(stop + 1) {
        clock.set(ProcessingTime(b as i64 * 10_000));
        job.process_batch(batch.iter().cloned(), &mut out, &mut Vec::new())
            .expect("vectors");
        if at(b) {
            kinds.push(job.checkpoint(checkpoints).expect("checkpoint").kind);
        }
    }
    (out, kinds)
}

#[test]
fn a_stateful_job_restored_from_any_checkpoint_gives_the_uninterrupted_output() {
    let input = clicks(600);
    let batches = input.len().div_ceil(BATCH);
    let clock = ManualClock::default();
    let (want, _) = drive(&mut job(&clock), &clock, &input, 0, None);
    assert!(want.iter().any(|o| o.contains("burst@")), "{want:?}");
    assert!(want.iter().any(|o| o.contains("clock@")), "{want:?}");
    assert!(want.iter().any(|o| o.contains("quiet")), "{want:?}");
    // Some users came back after their state expired (more `new` than users).
    let new = want.iter().filter(|o| o.ends_with(" new")).count();
    assert!(new > 65, "{new} new: {want:?}");

    for stop in [0, 3, batches / 2, batches - 2] {
        let dir = tempfile::tempdir().expect("temp dir");
        // A first run checkpointing after every batch, stopped after batch `stop`.
        let clock = ManualClock::default();
        let mut first = job(&clock);
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let (mut out, kinds) =
            checkpoint_through(&mut first, &clock, &input, stop, &mut checkpoints, |_| true);
        drop((first, checkpoints));
        assert_eq!(kinds[0], FileKind::Base);
        if stop > 0 {
            assert_eq!(kinds[1], FileKind::Delta, "later checkpoints are deltas");
        }

        // The next run resumes from the newest checkpoint.
        let clock = ManualClock::default();
        let mut second = job(&clock);
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let resumed = second
            .restore_checkpoint(&mut checkpoints)
            .expect("restored")
            .expect("a checkpoint");
        let covered = ((stop + 1) * BATCH).min(input.len());
        assert_eq!(resumed.events as usize, covered);
        let (rest, _) = drive(&mut second, &clock, &input, stop + 1, None);
        out.extend(rest);
        assert_eq!(out, want, "stopped after batch {stop}");
    }
}

#[test]
fn a_stateful_checkpoint_is_refused_by_other_options_and_by_a_session_window_job() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::default();
    let mut first = job(&clock);
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    first
        .process_batch(clicks(50), &mut Vec::new(), &mut Vec::new())
        .expect("vectors");
    first.checkpoint(&mut checkpoints).expect("checkpoint");
    drop((first, checkpoints));

    // Another state TTL shapes the state differently: refused, naming it.
    let mut other = Stream::<Click>::new()
        .key_by((|c| c.user) as fn(&Click) -> u32)
        .event_time((|c| c.at) as fn(&Click) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(seconds(20)))
        .flat_map_groups_with_state(f as F)
        .clock(clock.clone())
        .state_ttl(seconds(30))
        .build();
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let err = other
        .restore_checkpoint(&mut checkpoints)
        .expect_err("refused");
    assert!(err.to_string().contains("state ttl"), "{err}");

    // A session window job is another kind of job.
    let mut window = Stream::<Click>::new()
        .key_by(|c| c.user)
        .event_time(|c| c.at)
        .session_windows(minutes(10))
        .aggregate(Count)
        .build();
    let err = window.restore(&mut checkpoints).expect_err("refused");
    assert!(err.to_string().contains("job"), "{err}");
}

fn job_on(clock: &ManualClock, workers: usize) -> Job {
    let mut job = job(clock);
    job.set_workers(workers).expect("before the first event");
    job
}

/// Batches of `batch` events, the clock at 7 s per batch and a tick (an empty batch)
/// after every third; then the end of input. Outputs, late events and counts.
fn drive_all(
    job: &mut Job,
    clock: &ManualClock,
    input: &[Click],
    batch: usize,
) -> (
    Vec<String>,
    Vec<Late<Click>>,
    sessionizer::stateful::StatefulCounts,
    Vec<sessionizer::window::stateful::BatchReport>,
) {
    let (mut out, mut late, mut reports) = (Vec::new(), Vec::new(), Vec::new());
    for (b, events) in input.chunks(batch).enumerate() {
        clock.set(ProcessingTime(b as i64 * 7_000));
        let report = job
            .process_batch(events.iter().cloned(), &mut out, &mut late)
            .expect("vectors");
        reports.push(report);
        if b % 3 == 2 {
            clock.advance(seconds(3));
            reports.push(job.tick(&mut out).expect("vectors"));
        }
    }
    clock.advance(minutes(5));
    let counts = job.finish(&mut out, &mut late).expect("vectors");
    (out, late, counts, reports)
}

#[test]
fn a_stateful_job_on_workers_gives_one_workers_outputs_late_events_and_counts() {
    let input = clicks(800);
    let clock = ManualClock::default();
    let want = drive_all(&mut job(&clock), &clock, &input, BATCH);
    assert!(!want.1.is_empty(), "the input has late events");
    assert!(want.0.iter().any(|o| o.contains("clock@")), "{:?}", want.0);
    for workers in [2, 3, 4] {
        let clock = ManualClock::default();
        let mut job = job_on(&clock, workers);
        let got = drive_all(&mut job, &clock, &input, BATCH);
        assert_eq!(got.0, want.0, "outputs on {workers} workers");
        assert_eq!(got.1, want.1, "late events on {workers} workers");
        assert_eq!(got.2, want.2, "counts on {workers} workers");
        assert_eq!(got.3, want.3, "batch reports on {workers} workers");
    }

    // `run`, in the job's own batches.
    let clock = ManualClock::default();
    let mut one = Vec::new();
    job(&clock)
        .run(input.clone(), &mut one, &mut Vec::new())
        .expect("vectors");
    let mut three = Vec::new();
    job_on(&clock, 3)
        .run(input, &mut three, &mut Vec::new())
        .expect("vectors");
    assert_eq!(three, one);
}

#[test]
fn checkpoints_of_a_stateful_job_on_workers_restore_onto_any_number_of_workers() {
    let input = clicks(600);
    let clock = ManualClock::default();
    let (want, _) = drive(&mut job(&clock), &clock, &input, 0, None);
    let stop = 6;
    for (before, after) in [(2, 1), (2, 3), (1, 2), (3, 2)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::default();
        let mut first = job_on(&clock, before);
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut out = Vec::new();
        for (b, batch) in input.chunks(BATCH).enumerate().take(stop + 1) {
            clock.set(ProcessingTime(b as i64 * 10_000));
            first
                .process_batch(batch.iter().cloned(), &mut out, &mut Vec::new())
                .expect("vectors");
            first.checkpoint(&mut checkpoints).expect("checkpoint");
        }
        let keys = first.keys();
        drop((first, checkpoints));

        let clock = ManualClock::default();
        let mut second = job_on(&clock, after);
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let resumed = second
            .restore_checkpoint(&mut checkpoints)
            .expect("restored")
            .expect("a checkpoint");
        assert_eq!(resumed.keys as usize, keys);
        assert_eq!(second.keys(), keys);
        let (rest, _) = drive(&mut second, &clock, &input, stop + 1, None);
        out.extend(rest);
        assert_eq!(out, want, "{before} workers, then {after}");
    }
}

#[test]
fn stateful_workers_are_set_before_the_first_event_and_snapshots_are_refused() {
    let clock = ManualClock::default();
    let mut job = job(&clock);
    job.push(clicks(1)[0].clone(), &mut Vec::new())
        .expect("vectors");
    let err = job.set_workers(2).expect_err("after an event");
    assert!(
        err.to_string().contains("before the job's first event"),
        "{err}"
    );

    let job = job_on(&clock, 2);
    let err = job.snapshot().expect_err("one operator's format");
    assert!(err.to_string().contains("checkpoint()"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn a_stateful_job_on_workers_matches_one_on_any_stream(
        seed in any::<u64>(),
        n in 1i64..400,
        batch in 1usize..60,
        workers in 2usize..5,
    ) {
        let input = clicks_seeded(n, seed);
        let clock = ManualClock::default();
        let want = drive_all(&mut job(&clock), &clock, &input, batch);
        let clock = ManualClock::default();
        let got = drive_all(&mut job_on(&clock, workers), &clock, &input, batch);
        prop_assert_eq!(got.0, want.0);
        prop_assert_eq!(got.1, want.1);
        prop_assert_eq!(got.2, want.2);
        prop_assert_eq!(got.3, want.3);
    }
}

/// A budget far below a job's state (its hundred-odd keys): a few dozen keys in memory
/// in all.
fn rocks(dir: &std::path::Path) -> sessionizer::config::StateBackend {
    sessionizer::config::StateBackend::RocksDb {
        memory_bytes: 16 << 10,
        dir: Some(dir.to_path_buf()),
    }
}

/// [`job`] on the rocksdb backend of [`rocks`], its store in `store`.
#[cfg(feature = "rocksdb")]
fn rocks_job(clock: &ManualClock, store: &std::path::Path) -> Job {
    let mut job = job(clock);
    job.set_state_backend(&rocks(store)).expect("rocksdb");
    job
}

#[test]
fn a_stateful_backend_is_chosen_before_the_first_event() {
    let clock = ManualClock::default();
    let mut job = job(&clock);
    job.push(clicks(1)[0].clone(), &mut Vec::new())
        .expect("vectors");
    let dir = tempfile::tempdir().expect("temp dir");
    let err = job
        .set_state_backend(&rocks(dir.path()))
        .expect_err("after an event");
    assert!(
        err.to_string().contains("before the job's first event"),
        "{err}"
    );
    // The memory backend is the default: choosing it changes nothing.
    let mut fresh = job_on(&clock, 2);
    fresh
        .set_state_backend(&sessionizer::config::StateBackend::Memory)
        .expect("memory");
    assert!(fresh.operator().spill_counts().is_none(), "no spill store");
    fresh.set_workers(3).expect("workers may still change");
}

#[cfg(not(feature = "rocksdb"))]
#[test]
fn without_the_feature_a_stateful_job_refuses_rocksdb_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = job(&ManualClock::default())
        .set_state_backend(&rocks(dir.path()))
        .expect_err("no rocksdb in this build");
    assert!(err.to_string().contains("cargo feature `rocksdb`"), "{err}");
}

#[cfg(feature = "rocksdb")]
#[test]
fn a_stateful_job_on_rocksdb_gives_the_memory_backends_outputs_with_most_keys_on_disk() {
    let input = clicks_of(6_000, 0x9e37_79b9_7f4a_7c15, 3_000, 100);
    let clock = ManualClock::default();
    let want = drive_all(&mut job(&clock), &clock, &input, BATCH);
    assert!(want.0.iter().any(|o| o.contains("clock@")), "{:?}", want.0);
    assert!(want.0.iter().any(|o| o.contains("quiet")), "{:?}", want.0);
    for workers in [1, 2] {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::default();
        let mut job = job_on(&clock, workers);
        job.set_state_backend(&rocks(dir.path())).expect("rocksdb");
        let err = job.set_workers(3).expect_err("workers come first");
        assert!(err.to_string().contains("set_state_backend()"), "{err}");
        let got = drive_all(&mut job, &clock, &input, BATCH);
        assert_eq!(got.0, want.0, "outputs on {workers} workers");
        assert_eq!(got.1, want.1, "late events on {workers} workers");
        assert_eq!(got.2, want.2, "counts on {workers} workers");
        assert_eq!(got.3, want.3, "batch reports on {workers} workers");
        let spill = job.operator().spill_counts().expect("a spill store");
        assert!(spill.evicted > 500, "{spill:?}");
        assert!(spill.unspilled > 100, "{spill:?}");
    }
}

#[cfg(feature = "rocksdb")]
#[test]
fn a_checkpoint_of_a_stateful_job_on_rocksdb_restores_on_either_backend() {
    let input = clicks_of(4_000, 0x2545_f491_4f6c_dd1d, 2_000, 100);
    let batches = input.len().div_ceil(BATCH);
    let clock = ManualClock::default();
    let (want, _) = drive(&mut job(&clock), &clock, &input, 0, None);
    let stop = batches / 2;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::default();
    let mut first = rocks_job(&clock, store.path());
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let (out, kinds) =
        checkpoint_through(&mut first, &clock, &input, stop, &mut checkpoints, |_| true);
    assert!(kinds.contains(&FileKind::Delta), "{kinds:?}");
    let spilled = first.operator().spill_counts().expect("a spill store").keys;
    assert!(spilled > 50, "{spilled} keys on disk");
    let keys = first.keys();
    drop((first, checkpoints));

    for on_rocks in [true, false] {
        let clock = ManualClock::default();
        let mut second = job(&clock);
        let store = tempfile::tempdir().expect("temp dir");
        if on_rocks {
            second
                .set_state_backend(&rocks(store.path()))
                .expect("rocksdb");
        }
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        second
            .restore_checkpoint(&mut checkpoints)
            .expect("restored")
            .expect("a checkpoint");
        assert_eq!(second.keys(), keys);
        let (rest, _) = drive(&mut second, &clock, &input, stop + 1, None);
        let mut all = out.clone();
        all.extend(rest);
        assert_eq!(all, want, "restored on rocksdb: {on_rocks}");
    }
}

/// More changed keys evicted between two checkpoints than the memory budget would hold
/// the list of: it is dropped, the next checkpoint is a base (it holds every key), and
/// a restore from it gives the uninterrupted output.
#[cfg(feature = "rocksdb")]
#[test]
fn too_many_evicted_changes_make_the_stateful_jobs_next_checkpoint_a_base() {
    // Thousands of users, each clicking once or twice: far more than 4,096 distinct keys
    // change between the two checkpoints.
    let input = clicks_of(40_000, 0x51_7cc1_b727_220a, 40_000, 100);
    let batches = input.len().div_ceil(BATCH);
    let stop = batches - 3;
    let clock = ManualClock::default();
    let (want, _) = drive(&mut job(&clock), &clock, &input, 0, None);

    let dir = tempfile::tempdir().expect("temp dir");
    let store = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::default();
    let mut first = rocks_job(&clock, store.path());
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let (mut out, kinds) =
        checkpoint_through(&mut first, &clock, &input, stop, &mut checkpoints, |b| {
            b == 0 || b == stop
        });
    assert_eq!(
        kinds,
        [FileKind::Base, FileKind::Base],
        "the second one too"
    );
    drop((first, checkpoints));

    let clock = ManualClock::default();
    let mut second = job(&clock);
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    second
        .restore_checkpoint(&mut checkpoints)
        .expect("restored")
        .expect("a checkpoint");
    let (rest, _) = drive(&mut second, &clock, &input, stop + 1, None);
    out.extend(rest);
    assert_eq!(out, want);
}
