//! A library session window on several workers (`set_workers`, the command line's
//! `--workers`): the same records, late events and counts as on one, in the same
//! order, whatever the stream, and across checkpoints taken and restored with other
//! numbers of workers.

mod support;

use proptest::prelude::*;
use sessionizer::prelude::*;
use sessionizer::window::ProcessingTime;

use support::{T0, Visit};

/// `n` events over `keys` visits, out of order by up to 4 minutes, some far late and
/// a few in the year 2500 (outside the valid time range), in an order fixed by `seed`.
fn visits(n: i64, keys: u64, seed: u64) -> Vec<Visit> {
    let mut next = support::xorshift(seed);
    (0..n)
        .map(|i| {
            let visit = (next() % keys) as u32;
            let jitter = (next() % 240_000) as i64;
            let at = match next() % 1_000 {
                0 => 16_725_225_600_000, // 2500-01-01
                1..=20 => T0 + i * 200 - jitter - 1_800_000,
                21..=120 => T0 + i * 200 - jitter - 300_000,
                _ => T0 + i * 200 - jitter,
            };
            Visit {
                visit,
                at: EventTime(at),
                page: (next() % 7) as u8,
            }
        })
        .collect()
}

type Job = support::VisitJob;
type Out = support::VisitOut;

fn job(
    workers: usize,
    gap: DurationMs,
    lateness: DurationMs,
    emit: EmitMode,
    clock: &ManualClock,
) -> Job {
    let valid = EventTime(T0 - 86_400_000)..EventTime(T0 + 86_400_000 * 30);
    let mut job = support::visit_job(gap, lateness, emit, Some(valid), clock.clone());
    job.set_workers(workers).expect("workers");
    job
}

fn run(job: Job, input: &[Visit]) -> (Vec<Out>, Vec<Late<Visit>>, WindowCounts) {
    let (out, late, counts, _) = support::run_visits(job, input);
    (out, late, counts)
}

fn clock() -> ManualClock {
    ManualClock::new(ProcessingTime(0))
}

/// A dirty stream (late events, merges, retractions, out-of-range times) on 2, 3 and 4
/// workers gives one worker's records in one worker's order, in both emit modes.
#[test]
fn several_workers_give_the_output_of_one() {
    let input = visits(30_000, 3_000, 0x9e37_79b9_7f4a_7c15);
    for emit in [EmitMode::OnClose, EmitMode::OnUpdate] {
        let one = run(job(1, minutes(3), minutes(20), emit, &clock()), &input);
        let counts = one.2;
        assert!(
            counts.late > 0 && counts.retractions > 0 && counts.invalid > 0,
            "the input exercises lateness, merges and the guard: {counts:?}"
        );
        for workers in [2, 3, 4] {
            let many = run(
                job(workers, minutes(3), minutes(20), emit, &clock()),
                &input,
            );
            assert_eq!(many.0.len(), one.0.len(), "{workers} workers, {emit:?}");
            assert_eq!(many.0, one.0, "{workers} workers, {emit:?}");
            assert_eq!(many.1, one.1, "{workers} workers, {emit:?}");
            assert_eq!(many.2, counts, "{workers} workers, {emit:?}");
        }
    }
}

/// `push`, one event at a time, on several workers says what became of each event and
/// emits what `run` does.
#[test]
fn push_one_at_a_time_on_workers_is_run() {
    let input = visits(4_000, 200, 3);
    let expected = run(
        job(1, minutes(3), minutes(5), EmitMode::OnClose, &clock()),
        &input,
    );
    let mut reference = job(1, minutes(3), minutes(5), EmitMode::OnClose, &clock());
    let mut j = job(2, minutes(3), minutes(5), EmitMode::OnClose, &clock());
    let (mut out, mut late) = (Vec::<Out>::new(), Vec::new());
    let (mut ref_out, mut ref_late) = (Vec::<Out>::new(), Vec::new());
    for v in &input {
        let a = j.push(v.clone(), &mut out, &mut late).expect("vectors");
        let b = reference
            .push(v.clone(), &mut ref_out, &mut ref_late)
            .expect("vectors");
        assert_eq!(a, b, "the outcome of {v:?}");
        assert_eq!(j.watermark(), reference.watermark());
    }
    assert_eq!(j.open_sessions(), reference.open_sessions());
    let counts = j.finish(&mut out, &mut late).expect("vectors");
    assert_eq!((out, late, counts), expected);
}

/// The end of input emits the open sessions in parts, a few thousand per worker at a
/// time, so that memory does not grow with their number; the records are still those
/// of one worker, in its order — also when thousands of sessions close at the same
/// instant (40,000 visits open at the end: 12,000 with one event at one instant, the
/// others spread, every 5th with a second event later).
#[test]
fn the_end_of_input_in_parts_gives_one_workers_records_in_its_order() {
    let input: Vec<Visit> = (0..40_000i64)
        .flat_map(|i| {
            let at = if i < 12_000 { T0 } else { T0 + 1 + i / 3 };
            let visit = |at| Visit {
                visit: i as u32,
                at: EventTime(at),
                page: (i % 7) as u8,
            };
            let again = (i % 5 == 0).then(|| visit(at + 30_000));
            std::iter::once(visit(at)).chain(again)
        })
        .collect();
    let outputs: Vec<_> = [1, 2, 3]
        .map(|workers| {
            let mut j = job(workers, hours(1), minutes(0), EmitMode::OnClose, &clock());
            let (mut out, mut late) = (Vec::new(), Vec::new());
            j.push_batch(input.iter().cloned(), &mut out, &mut late)
                .expect("vectors");
            assert!(out.is_empty(), "every session is open until the end");
            j.finish(&mut out, &mut late).expect("vectors");
            (out, late, j.counts())
        })
        .into();
    assert_eq!(outputs[0].0.len(), 40_000);
    let order: Vec<(EventTime, u32)> = outputs[0]
        .0
        .iter()
        .filter_map(WindowOutput::session)
        .map(|s| (s.end, s.key.parse::<u32>().expect("a visit number")))
        .collect();
    assert!(order.windows(2).all(|w| w[0].0 <= w[1].0), "by close time");
    for (workers, got) in [(2, &outputs[1]), (3, &outputs[2])] {
        let want = &outputs[0];
        let at = got
            .0
            .iter()
            .zip(&want.0)
            .take_while(|(g, w)| g == w)
            .count();
        assert!(
            got == want,
            "{workers} workers: {} records, one worker's {}; the first difference at {at}: {:?} against {:?}",
            got.0.len(),
            want.0.len(),
            got.0.get(at),
            want.0.get(at)
        );
    }
}

/// With an idle timeout, a quiet stream's sessions close on a tick, the same on one
/// worker and on three.
#[test]
fn an_idle_timeout_closes_quiet_sessions_on_workers() {
    let input = visits(3_000, 500, 9);
    let mut outputs = Vec::new();
    for workers in [1, 3] {
        let clock = clock();
        let mut j = Stream::<Visit>::new()
            .key_by(|v: &Visit| v.visit)
            .event_time(|v: &Visit| v.at)
            .watermark(BoundedOutOfOrderness::new(minutes(1)))
            .session_windows(minutes(3))
            .allowed_lateness(minutes(5))
            .idle_timeout(minutes(1))
            .clock(clock.clone())
            .aggregate(Count)
            .build();
        j.set_workers(workers).expect("workers");
        let (mut out, mut late) = (Vec::new(), Vec::new());
        j.push_batch(input.iter().cloned(), &mut out, &mut late)
            .expect("vectors");
        let open = j.open_sessions();
        assert!(open > 0, "sessions still open at the end of the events");
        let before = out.len();
        clock.advance(minutes(30));
        j.tick(&mut out).expect("vectors");
        let idle: Vec<_> = out[before..]
            .iter()
            .filter_map(WindowOutput::session)
            .map(|s| s.emitted.trigger)
            .collect();
        assert!(
            !idle.is_empty() && idle.iter().all(|t| *t == Trigger::Idle),
            "{idle:?}"
        );
        outputs.push((out, late, j.counts()));
    }
    assert_eq!(outputs[0], outputs[1]);
}

/// Checkpoints of a job on 2 workers restore onto 1, 2 or 3 workers and continue, with
/// what was committed before, exactly as an uninterrupted one-worker run.
#[test]
fn checkpoints_restore_onto_any_number_of_workers() {
    let input = visits(20_000, 2_000, 0x2545_f491_4f6c_dd1d);
    let lateness = minutes(20);
    let expected = run(
        job(1, minutes(3), lateness, EmitMode::OnClose, &clock()),
        &input,
    );
    for restore_on in [1, 2, 3] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut committed, mut committed_late) = (Vec::<Out>::new(), Vec::new());
        {
            let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
            let mut first = job(2, minutes(3), lateness, EmitMode::OnClose, &clock());
            let (mut out, mut late) = (Vec::new(), Vec::new());
            for (i, chunk) in input[..15_000].chunks(2_500).enumerate() {
                first
                    .push_batch(chunk.iter().cloned(), &mut out, &mut late)
                    .expect("vectors");
                if i == 1 || i == 3 {
                    first.checkpoint(&mut checkpoints).expect("checkpoint");
                    committed.append(&mut out);
                    committed_late.append(&mut late);
                }
            } // killed after 15,000 events: what it emitted since 10,000 is lost
        }
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut second = job(
            restore_on,
            minutes(3),
            lateness,
            EmitMode::OnClose,
            &clock(),
        );
        let resumed = second
            .restore(&mut checkpoints)
            .expect("restored")
            .expect("a checkpoint");
        assert_eq!(resumed.events, 10_000);
        let (mut out, mut late) = (Vec::new(), Vec::new());
        let counts = second
            .run(input.iter().skip(10_000).cloned(), &mut out, &mut late)
            .expect("vectors");
        committed.append(&mut out);
        committed_late.append(&mut late);
        assert_eq!(committed.len(), expected.0.len(), "onto {restore_on}");
        assert_eq!(committed, expected.0, "onto {restore_on}");
        assert_eq!(committed_late, expected.1, "onto {restore_on}");
        assert_eq!(counts, expected.2, "onto {restore_on}");
    }
}

/// Workers are chosen before the first event.
#[test]
fn workers_are_chosen_before_the_first_event() {
    let mut j = job(1, minutes(3), minutes(5), EmitMode::OnClose, &clock());
    let (mut out, mut late) = (Vec::<Out>::new(), Vec::new());
    j.push(visits(1, 1, 7).remove(0), &mut out, &mut late)
        .expect("vectors");
    let err = j.set_workers(2).expect_err("too late");
    assert!(
        err.to_string().contains("before the job's first event"),
        "{err}"
    );
}

/// [`run`] of a job whose events carry their own gap (`gap_fn`): a long one on page 0,
/// a short one on page 1, the window's on the others.
fn run_with_event_gaps(
    workers: usize,
    gap: DurationMs,
    lateness: DurationMs,
    emit: EmitMode,
    input: &[Visit],
) -> Outcomes {
    let valid = EventTime(T0 - 86_400_000)..EventTime(T0 + 86_400_000 * 30);
    let long = DurationMs(gap.millis() * 3);
    let mut job = Stream::<Visit>::new()
        .key_by(|v: &Visit| v.visit)
        .event_time(|v: &Visit| v.at)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .valid_time_range(valid)
        .session_windows(gap)
        .gap_fn(move |v: &Visit| match v.page {
            0 => Some(long),
            1 => Some(seconds(1)),
            _ => None,
        })
        .allowed_lateness(lateness)
        .emit(emit)
        .clock(clock())
        .aggregate((Count, Collect(|v: &Visit| Some(v.page))))
        .build();
    job.set_workers(workers).expect("workers");
    let (mut out, mut late) = (Vec::new(), Vec::new());
    let counts = job
        .run(input.iter().cloned(), &mut out, &mut late)
        .expect("vectors");
    (out, late, counts)
}

/// A worker must hear a larger gap from an event it neither owns nor sees raise the
/// watermark: a new key's floor is `W - A - Gmax` (docs/semantics.md S-30). Gap 10 s,
/// watermark 1 min behind, no lateness: `a` at 160 s (W 100 s, a new key's floor 90 s);
/// `b` at 95 s with a 30 s gap (it raises no time, only the largest gap); `c` at 260 s
/// (W 200 s: a new key's floor is 170 s); the new key `n` at 180 s with a 30 s gap is in
/// time. A worker that missed `b`'s gap would put the floor at 190 s and turn `n` away.
/// The hash decides which worker owns which visit: the case runs with many visit
/// numbers so that `b`'s owner differs from `n`'s in some of them.
#[test]
fn a_larger_gap_reaches_every_worker() {
    let at = |visit: u32, s: i64, page: u8| Visit {
        visit,
        at: EventTime(T0 + s * 1_000),
        page,
    };
    for i in 0..24u32 {
        let v = 4 * i;
        let input = [
            at(v, 160, 3),
            at(v + 1, 95, 0),
            at(v + 2, 260, 3),
            at(v + 3, 180, 0),
        ];
        let run = |workers| {
            run_with_event_gaps(
                workers,
                seconds(10),
                DurationMs(0),
                EmitMode::OnClose,
                &input,
            )
        };
        let one = run(1);
        assert!(one.1.is_empty(), "one worker: nothing is late");
        assert_eq!(one.0.len(), 4, "a session per visit");
        for workers in [2, 3] {
            assert_eq!(run(workers), one, "{workers} workers, visits {v}..");
        }
    }
}

/// What a run gives: records, late events, counts.
type Outcomes = (Vec<Out>, Vec<Late<Visit>>, WindowCounts);

/// One case of the property tests: a stream of [`visits`] and the window's settings.
struct Case {
    seed: u64,
    n: i64,
    keys: u64,
    gap_s: i64,
    lateness_s: i64,
    on_update: bool,
}

impl Case {
    /// What `run` gives on `workers` workers, and on one.
    fn on(
        &self,
        workers: usize,
        run: impl Fn(usize, DurationMs, DurationMs, EmitMode, &[Visit]) -> Outcomes,
    ) -> (Outcomes, Outcomes) {
        let input = visits(self.n, self.keys, self.seed);
        let emit = if self.on_update {
            EmitMode::OnUpdate
        } else {
            EmitMode::OnClose
        };
        let (gap, lateness) = (seconds(self.gap_s), seconds(self.lateness_s));
        let one = run(1, gap, lateness, emit, &input);
        (run(workers, gap, lateness, emit, &input), one)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Per-event gaps: a worker that does not own an event's key must still hear a gap
    /// larger than any before it (final bounds are kept for the largest gap).
    #[test]
    fn workers_match_one_with_event_gaps(
        seed in any::<u64>(),
        n in 1i64..4_000,
        keys in 1u64..5_000,
        gap_s in 1i64..600,
        lateness_s in 0i64..3_600,
        on_update in any::<bool>(),
        workers in 2usize..5,
    ) {
        let case = Case { seed, n, keys, gap_s, lateness_s, on_update };
        let (many, one) = case.on(workers, run_with_event_gaps);
        prop_assert_eq!(many, one);
    }

    /// Any stream, gap, lateness and emit mode: 2 to 4 workers give one worker's output.
    #[test]
    fn workers_match_one_on_any_stream(
        seed in any::<u64>(),
        n in 1i64..6_000,
        keys in 1u64..400,
        gap_s in 1i64..600,
        lateness_s in 0i64..3_600,
        on_update in any::<bool>(),
        workers in 2usize..5,
    ) {
        let case = Case { seed, n, keys, gap_s, lateness_s, on_update };
        let (many, one) = case.on(workers, |workers, gap, lateness, emit, input| {
            run(job(workers, gap, lateness, emit, &clock()), input)
        });
        prop_assert_eq!(many, one);
    }
}
