//! The declarative window as a long-running service: it survives a restart through a
//! checkpoint in the command line's format, and a quiet input still closes sessions
//! (idle advance).

mod support;

use sessionizer::checkpoints::FileKind;
use sessionizer::prelude::*;
use sessionizer::window::ProcessingTime;

use support::{T0, Visit};

/// A dirty stream: 60 concurrent visits, times out of order by up to 4 minutes, some
/// far late, in a fixed pseudo-random order.
fn visits(n: i64) -> Vec<Visit> {
    support::visits(n, 60, 2_000, 0x9e37_79b9_7f4a_7c15)
}

type Job = support::VisitJob;
type Out = support::VisitOut;

fn job(gap: DurationMs) -> Job {
    let clock = ManualClock::new(ProcessingTime(0));
    support::visit_job(gap, minutes(5), EmitMode::OnClose, None, clock)
}

/// A library job stopped at any point after a checkpoint and restored from it emits,
/// with what it committed before, exactly the records of a run that never stopped:
/// sessions, revisions, retractions and late events.
#[test]
fn a_restored_job_gives_the_output_of_an_uninterrupted_one() {
    let input = visits(3_000);
    let mut whole = job(minutes(3));
    let (mut expected, mut expected_late) = (Vec::<Out>::new(), Vec::new());
    whole
        .run(input.iter().cloned(), &mut expected, &mut expected_late)
        .expect("vectors");
    let counts = whole.counts();
    assert!(
        counts.late > 0 && counts.retractions > 0,
        "the input exercises lateness: {counts:?}"
    );

    // Checkpoints after events 700 (a base) and 1500 (a delta); the job then dies at
    // event 2100, losing what it emitted since the last checkpoint.
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut committed, mut committed_late) = (Vec::<Out>::new(), Vec::new());
    {
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut first = job(minutes(3));
        assert_eq!(first.restore(&mut checkpoints).expect("empty dir"), None);
        let (mut out, mut late) = (Vec::new(), Vec::new());
        for (i, v) in input.iter().cloned().enumerate() {
            first.push(v, &mut out, &mut late).expect("vectors");
            if i + 1 == 700 || i + 1 == 1500 {
                let written = first.checkpoint(&mut checkpoints).expect("checkpoint");
                let kind = if i + 1 == 700 {
                    FileKind::Base
                } else {
                    FileKind::Delta
                };
                assert_eq!(written.kind, kind);
                committed.append(&mut out);
                committed_late.append(&mut late);
            }
            if i + 1 == 2100 {
                break;
            }
        }
    }

    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let mut second = job(minutes(3));
    let resumed = second
        .restore(&mut checkpoints)
        .expect("restored")
        .expect("a checkpoint");
    assert_eq!(resumed.events, 1500);
    let (mut out, mut late) = (Vec::new(), Vec::new());
    second
        .run(
            input.iter().skip(resumed.events as usize).cloned(),
            &mut out,
            &mut late,
        )
        .expect("vectors");
    committed.append(&mut out);
    committed_late.append(&mut late);

    assert_eq!(committed.len(), expected.len());
    assert_eq!(committed, expected);
    assert_eq!(committed_late, expected_late);
    assert_eq!(second.counts(), counts, "one accounting across the restart");
}

/// A checkpoint taken with other options is refused, naming the difference; a
/// directory holding a checkpoint is not written over by a job that did not restore it.
#[test]
fn a_checkpoint_of_other_options_is_refused_and_never_overwritten() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let mut first = job(minutes(3));
        let mut out = Vec::new();
        for v in visits(50) {
            first.push(v, &mut out, &mut Vec::new()).expect("vectors");
        }
        first.checkpoint(&mut checkpoints).expect("checkpoint");
    }
    let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
    let mut other = job(minutes(4));
    let err = other.restore(&mut checkpoints).expect_err("another gap");
    let text = err.to_string();
    assert!(
        text.contains("--gap was 3m when the checkpoint was taken, this run has 4m"),
        "{text}"
    );
    let err = other
        .checkpoint(&mut checkpoints)
        .expect_err("not restored");
    assert!(matches!(err, StateError::NotRestored { .. }), "{err}");
    // The right job still restores it.
    let mut same = job(minutes(3));
    let resumed = same.restore(&mut checkpoints).expect("same options");
    assert_eq!(resumed.map(|r| r.events), Some(50));
}

/// The stateful style too: with an idle timeout a quiet input lets the watermark move
/// on with the clock and a quiet key's event-time timeout fires — on one worker and on
/// two alike.
#[test]
fn idle_advance_fires_a_quiet_keys_event_time_timeout() {
    type Ev = (&'static str, EventTime);
    let at = |min: i64| EventTime(T0 + min * 60_000);
    for workers in [1, 2] {
        let clock = ManualClock::new(ProcessingTime(0));
        let build = |idle: bool| {
            let builder = Stream::<Ev>::new()
                .key_by(|e| e.0)
                .event_time(|e| e.1)
                .flat_map_groups_with_state(
                    |key: &str, events: Vec<Ev>, state: &mut GroupState<'_, EventTime>| {
                        if state.has_timed_out() {
                            state.remove();
                            return Some(key.to_string());
                        }
                        let last = events.iter().map(|e| e.1).max().expect("events");
                        state.update(last);
                        state.set_timeout_timestamp(last.plus(minutes(10)));
                        None
                    },
                )
                .clock(clock.clone());
            let mut job = if idle {
                builder.idle_timeout(minutes(1)).build()
            } else {
                builder.build()
            };
            if workers > 1 {
                job.set_workers(workers).expect("workers");
            }
            job
        };
        let mut job = build(true);
        let (mut out, mut late) = (Vec::new(), Vec::new());
        job.push(("k", at(0)), &mut late).expect("vectors");
        job.push(("j", at(1)), &mut late).expect("vectors");
        job.end_batch(&mut out).expect("vectors");
        clock.advance(seconds(30));
        job.tick(&mut out).expect("vectors");
        assert_eq!(job.watermark(), Watermark::at(at(1)), "not idle yet");
        clock.advance(seconds(30));
        job.tick(&mut out).expect("vectors");
        assert_eq!(
            job.watermark(),
            Watermark::at(at(2)),
            "W of the last event + 1 min"
        );
        assert!(out.is_empty());
        // 12 minutes of quiet: W = 13 min, past k's timeout (10) and j's (11).
        clock.advance(minutes(11));
        job.tick(&mut out).expect("vectors");
        assert_eq!(job.watermark(), Watermark::at(at(13)));
        assert_eq!(out, ["k", "j"], "{workers} workers");
        // Later events are judged against the watermark the idle advance reached.
        job.push(("k", at(5)), &mut late).expect("vectors");
        assert_eq!(late.len(), 1, "behind the idle watermark: {late:?}");
        // Without an idle timeout, tick moves no watermark.
        let mut plain = build(false);
        let mut out = Vec::new();
        plain.push(("k", at(0)), &mut late).expect("vectors");
        plain.end_batch(&mut out).expect("vectors");
        clock.advance(hours(1));
        plain.tick(&mut out).expect("vectors");
        assert!(out.is_empty());
        assert_eq!(plain.watermark(), Watermark::at(at(0)));
    }
}

/// With an idle timeout, a quiet input lets the watermark move on with the clock and
/// close a quiet key's session, as the command line's `--idle-timeout` does.
#[test]
fn idle_advance_closes_a_quiet_keys_session() {
    let clock = ManualClock::new(ProcessingTime(0));
    let at = |min: i64| EventTime(T0 + min * 60_000);
    let mut job = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .session_windows(minutes(10))
        .idle_timeout(minutes(1))
        .clock(clock.clone())
        .build();
    let (mut out, mut late) = (Vec::new(), Vec::new());
    job.push(("k", at(0)), &mut out, &mut late)
        .expect("vectors");
    job.push(("j", at(1)), &mut out, &mut late)
        .expect("vectors");
    clock.advance(seconds(30));
    job.tick(&mut out).expect("vectors");
    assert_eq!(job.watermark(), Watermark::at(at(1)), "not idle yet");
    clock.advance(seconds(30));
    job.tick(&mut out).expect("vectors");
    assert_eq!(
        job.watermark(),
        Watermark::at(at(2)),
        "W of the last event + 1 min"
    );
    assert!(out.is_empty());
    // 10 minutes of quiet: W = 11 min, past k's close (10) and j's (11).
    clock.advance(minutes(9));
    job.tick(&mut out).expect("vectors");
    let closed: Vec<(String, sessionizer::windowed::Trigger, Watermark)> = out
        .iter()
        .filter_map(WindowOutput::session)
        .map(|s| (s.key.clone(), s.emitted.trigger, s.emitted.watermark))
        .collect();
    let idle = sessionizer::windowed::Trigger::Idle;
    assert_eq!(
        closed,
        [
            ("k".to_string(), idle, Watermark::at(at(11))),
            ("j".to_string(), idle, Watermark::at(at(11))),
        ]
    );
    // Later events are judged against the watermark the idle advance reached.
    job.push(("k", at(5)), &mut out, &mut late)
        .expect("vectors");
    assert_eq!(late.len(), 1, "k's session is final: {late:?}");
    // Without an idle timeout, tick does nothing.
    let mut plain = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .session_windows(minutes(10))
        .clock(clock.clone())
        .build();
    let mut out = Vec::new();
    plain
        .push(("k", at(0)), &mut out, &mut Vec::new())
        .expect("vectors");
    clock.advance(hours(1));
    plain.tick(&mut out).expect("vectors");
    assert!(out.is_empty());
    assert_eq!(plain.watermark(), Watermark::at(at(0)));
}
