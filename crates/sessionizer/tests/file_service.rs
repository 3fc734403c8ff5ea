//! A library job as a restartable service on files, exactly once (the example
//! `file_service`): killed with SIGKILL at random instants and started again, its output
//! files end up byte for byte as those of a run that was never interrupted — which are
//! those of the same job run in one go without checkpoints. And the ways a restart can
//! go wrong are refused: a changed input, a cut output, an output left out.

mod support;

#[path = "../examples/file_service.rs"]
mod file_service;

use file_service::Visit;
use sessionizer::prelude::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const OUTPUTS: [&str; 3] = ["sessions.jsonl", "late.jsonl", "dead-letters.jsonl"];

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn service(input: &Path, state: &Path, out: &Path) -> Command {
    let mut c = Command::new(support::example("file_service"));
    c.arg(input).arg(state).arg(out);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// Runs the service to its end; returns what it said on stderr.
fn run_to_end(input: &Path, state: &Path, out: &Path) -> String {
    let done = service(input, state, out)
        .output()
        .expect("run the example");
    let err = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "the service failed: {err}");
    err
}

/// The same job, in one go, without checkpoints: its sessions and late events as JSON
/// lines.
fn in_one_go(input: &Path, out: &Path) -> (Vec<u8>, Vec<u8>, u64) {
    let mut dead = Vec::new();
    let mut visits = JsonLines::<Visit, _>::files([input], &mut dead).expect("readable");
    let mut job = file_service::job();
    let (s, l) = (out.join("s.jsonl"), out.join("l.jsonl"));
    let (mut sessions, mut late) = (JsonLinesSink::file(&s), JsonLinesSink::file(&l));
    job.run(visits.by_ref(), &mut sessions, &mut late)
        .expect("files");
    visits.finish().expect("read");
    let read = |p: &PathBuf| std::fs::read(p).unwrap_or_default();
    (read(&s), read(&l), dead.len() as u64)
}

#[test]
fn a_service_killed_at_random_instants_writes_every_record_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("visits.jsonl");
    support::write_visit_lines(&input, 80_000);

    let (state, out) = (dir.path().join("state-1"), dir.path().join("out-1"));
    let started = Instant::now();
    let said = run_to_end(&input, &state, &out);
    let took = started.elapsed();
    assert!(said.contains("started from the beginning"), "{said}");

    // The uninterrupted service writes what the job writes in one go.
    let (sessions, late, dead) = in_one_go(&input, dir.path());
    assert!(
        sessions.len() > 100_000,
        "{} bytes of sessions",
        sessions.len()
    );
    assert!(
        read(&out, "sessions.jsonl") == sessions,
        "the service's sessions differ from one run's"
    );
    assert!(!late.is_empty(), "the input has late events");
    assert_eq!(read(&out, "late.jsonl"), late);
    let dead_letters = String::from_utf8(read(&out, "dead-letters.jsonl")).expect("UTF-8");
    assert_eq!(dead_letters.lines().count() as u64, dead);
    assert!(
        dead > 100 && dead_letters.contains("missing field event_time"),
        "{dead}"
    );
    let far = String::from_utf8(late.clone()).expect("UTF-8");
    assert!(
        far.contains("time_out_of_range"),
        "the year-2500 line is rejected as late"
    );

    // Killed with SIGKILL at random instants, started again each time.
    let (state, out) = (dir.path().join("state-2"), dir.path().join("out-2"));
    let support::Killed { kills, resumed } =
        support::kill_at_random_instants(|| service(&input, &state, &out), took, (25, 4), 12, 12);
    eprintln!("{kills} kills, {resumed} runs resumed; an uninterrupted run took {took:?}");
    assert!(kills >= 3, "only {kills} kills: the runs were too short");
    assert!(
        resumed >= 2,
        "only {resumed} runs resumed from a checkpoint"
    );
    for name in OUTPUTS {
        assert!(
            read(&out, name) == read(&dir.path().join("out-1"), name),
            "{name} differs from the uninterrupted run's"
        );
    }

    // Started again once done: it resumes from its last checkpoint and adds nothing.
    let said = run_to_end(&input, &state, &out);
    assert!(said.contains("resumed from checkpoint"), "{said}");
    assert_eq!(read(&out, "sessions.jsonl"), sessions);
}

/// Checkpoints of the example's shape over a small input; returns the directories.
fn checkpointed(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let input = dir.join("visits.jsonl");
    support::write_visit_lines(&input, 5_000);
    let (state, out) = (dir.join("state"), dir.join("out"));
    run_to_end(&input, &state, &out);
    (input, state, out)
}

#[test]
fn a_restart_that_cannot_continue_exactly_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, state, out) = checkpointed(dir.path());
    let files: Vec<PathBuf> = OUTPUTS.iter().map(|n| out.join(n)).collect();

    // A restore without the files the checkpoint committed.
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let sessions = JsonLinesSink::exactly_once(&files[0], &mut checkpoints).expect("joined");
    let text = file_service::job()
        .restore(&mut checkpoints)
        .expect_err("late.jsonl left out")
        .to_string();
    assert!(
        text.contains("late.jsonl") && text.contains("exactly_once"),
        "{text}"
    );
    // An output file is locked while a sink holds it open.
    drop(sessions);
    drop(checkpoints);

    // A file the checkpoint did not commit.
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let text = JsonLinesSink::exactly_once(out.join("other.jsonl"), &mut checkpoints)
        .expect_err("not committed")
        .to_string();
    assert!(
        text.contains("other.jsonl") && text.contains("sessions.jsonl"),
        "{text}"
    );
    drop(checkpoints);

    // An output cut shorter than its committed length (changed outside the job).
    let whole = std::fs::read(&files[0]).expect("sessions");
    std::fs::write(&files[0], &whole[..whole.len() / 2]).expect("cut");
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let text = JsonLinesSink::exactly_once(&files[0], &mut checkpoints)
        .expect_err("shorter than committed")
        .to_string();
    assert!(text.contains("shorter than"), "{text}");
    std::fs::write(&files[0], &whole).expect("put back");
    drop(checkpoints);

    // The same file twice; a source before the restore (which checkpoint the job
    // continues is not settled yet); a file after it (too late to cut it back).
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let outputs: Vec<JsonLinesSink> = files
        .iter()
        .map(|f| JsonLinesSink::exactly_once(f, &mut checkpoints).expect("joined"))
        .collect();
    let text = JsonLinesSink::exactly_once(&files[0], &mut checkpoints)
        .expect_err("joined twice")
        .to_string();
    assert!(text.contains("already"), "{text}");
    let err = JsonLines::<Visit, _>::resume([&input], &mut checkpoints, Vec::new())
        .expect_err("before the restore")
        .to_string();
    assert!(err.contains("after the job's restore()"), "{err}");
    file_service::job()
        .restore(&mut checkpoints)
        .expect("restored");
    let text = JsonLinesSink::exactly_once(out.join("new.jsonl"), &mut checkpoints)
        .expect_err("after the restore")
        .to_string();
    assert!(text.contains("before restore()"), "{text}");
    let _source =
        JsonLines::<Visit, _>::resume([&input], &mut checkpoints, Vec::new()).expect("resumed");
    let err = JsonLines::<Visit, _>::resume([&input], &mut checkpoints, Vec::new())
        .expect_err("a second source")
        .to_string();
    assert!(err.contains("already have a source"), "{err}");
    drop((outputs, checkpoints));

    // A changed input.
    let mut grown = std::fs::read_to_string(&input).expect("input");
    grown
        .push_str("{\"visit_id\":\"v9\",\"event_time\":\"2024-01-02T00:00:00Z\",\"page\":\"/\"}\n");
    std::fs::write(&input, &grown).expect("append");
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let outputs: Vec<JsonLinesSink> = files
        .iter()
        .map(|f| JsonLinesSink::exactly_once(f, &mut checkpoints).expect("joined"))
        .collect();
    file_service::job()
        .restore(&mut checkpoints)
        .expect("restored");
    let err = JsonLines::<Visit, _>::resume([&input], &mut checkpoints, Vec::new())
        .expect_err("changed")
        .to_string();
    assert!(err.contains("changed since the checkpoint"), "{err}");
    drop((outputs, checkpoints));

    // Not a regular file (its length cannot be kept).
    let mut checkpoints = Checkpoints::open(dir.path().join("fresh")).expect("state dir");
    let text = JsonLinesSink::exactly_once("/dev/null", &mut checkpoints)
        .expect_err("a device")
        .to_string();
    assert!(text.contains("not a regular file"), "{text}");
    drop(checkpoints);

    // A state directory whose checkpoints recorded no position.
    let plain = dir.path().join("plain");
    let mut checkpoints = Checkpoints::open(&plain).expect("state dir");
    let mut first = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .session_windows(minutes(10))
        .aggregate(Count)
        .build();
    first.checkpoint(&mut checkpoints).expect("written");
    let err = JsonLines::<Visit, _>::resume([&input], &mut checkpoints, Vec::new())
        .expect_err("no position")
        .to_string();
    assert!(err.contains("recorded no position"), "{err}");
    drop(checkpoints);

    // A cut-off tail is cut: bytes after the committed length go on a restart.
    std::fs::write(
        &input,
        &grown[..grown.len() - grown.lines().last().expect("a line").len() - 1],
    )
    .expect("the input as it was");
    let mut tail = std::fs::OpenOptions::new()
        .append(true)
        .open(&files[0])
        .expect("open");
    std::io::Write::write_all(&mut tail, b"{\"written after\":\"the last checkpoint\"}\n")
        .expect("write");
    drop(tail);
    run_to_end(&input, &state, &out);
    assert_eq!(std::fs::read(&files[0]).expect("sessions"), whole);
}

/// A stateful job writes its file exactly once too: a run that wrote past its last
/// checkpoint and died is cut back and continued, giving an uninterrupted run's file.
#[test]
fn a_stateful_jobs_file_is_written_once_across_a_crash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("visits.jsonl");
    support::write_visit_lines(&input, 6_000);
    // Per visit: its events so far, reported 10 minutes (event time) after its last one.
    let job = || {
        Stream::<Visit>::new()
            .key_by(|v| v.visit_id.clone())
            .event_time(|v| v.event_time)
            .watermark(BoundedOutOfOrderness::new(minutes(1)))
            .flat_map_groups_with_state(
                |visit: &str, events: Vec<Visit>, state: &mut GroupState<'_, u32>| {
                    if state.has_timed_out() {
                        return state.remove().map(|n| format!("{visit}: {n}"));
                    }
                    let n = state.get().copied().unwrap_or(0) + events.len() as u32;
                    state.update(n);
                    let last = events.iter().map(|v| v.event_time).max().expect("events");
                    state.set_timeout_timestamp(last.plus(minutes(10)));
                    None
                },
            )
            .build()
    };
    // Batches of 500 events, a checkpoint after every second one; `crash_after`: the
    // run dies (is dropped) after that many batches, having flushed its output.
    let run = |state: &Path, out: &Path, crash_after: Option<usize>| {
        let mut checkpoints = Checkpoints::open(state).expect("state dir");
        let mut counts = JsonLinesSink::exactly_once(out, &mut checkpoints).expect("joined");
        let mut job = job();
        job.restore_checkpoint(&mut checkpoints).expect("restored");
        let mut visits =
            JsonLines::<Visit, _>::resume([&input], &mut checkpoints, Vec::new()).expect("input");
        for batch in 1.. {
            let events: Vec<Visit> = visits.by_ref().take(500).collect();
            if events.is_empty() {
                break;
            }
            job.process_batch(events, &mut counts, &mut Vec::new())
                .expect("processed");
            counts.flush().expect("written");
            if crash_after == Some(batch) {
                return;
            }
            if batch % 2 == 0 {
                job.checkpoint(&mut checkpoints).expect("checkpoint");
            }
        }
        job.finish(&mut counts, &mut Vec::new()).expect("finished");
        job.checkpoint(&mut checkpoints).expect("checkpoint");
    };
    let whole = dir.path().join("whole.jsonl");
    run(&dir.path().join("state-whole"), &whole, None);
    let expected = std::fs::read(&whole).expect("output");
    assert!(expected.len() > 1_000, "{} bytes", expected.len());

    let crashed = dir.path().join("crashed.jsonl");
    let state = dir.path().join("state-crashed");
    run(&state, &crashed, Some(5));
    let at_crash = std::fs::read(&crashed).expect("output");
    assert!(
        !at_crash.is_empty() && expected.starts_with(&at_crash),
        "the dead run wrote a prefix of the output"
    );
    run(&state, &crashed, Some(8));
    run(&state, &crashed, None);
    assert!(
        std::fs::read(&crashed).expect("output") == expected,
        "the output differs from an uninterrupted run's"
    );
}

/// A job kept open (no `finish`) continues with new files — the next day's — from their
/// start, and gives the sessions of one job over all the files; a file read already is
/// refused, and so are new files for a job that was finished.
#[test]
fn a_job_kept_open_continues_with_the_next_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let days: Vec<PathBuf> = (0..3)
        .map(|d| dir.path().join(format!("day{d}.jsonl")))
        .collect();
    for (d, path) in days.iter().enumerate() {
        let d = d as u64;
        support::write_visit_range(path, d * 4_000..(d + 1) * 4_000);
    }
    let (state, out) = (dir.path().join("state"), dir.path().join("out"));
    std::fs::create_dir_all(&out).expect("out dir");
    // One run of the service over `files`; `finish`: the end of its input.
    let run = |files: &[&PathBuf], finish: bool| -> Result<(), String> {
        let mut checkpoints = Checkpoints::open(&state).map_err(|e| e.to_string())?;
        let mut sessions =
            JsonLinesSink::exactly_once(out.join("sessions.jsonl"), &mut checkpoints)
                .map_err(|e| e.to_string())?;
        let mut late = JsonLinesSink::exactly_once(out.join("late.jsonl"), &mut checkpoints)
            .map_err(|e| e.to_string())?;
        let mut job = file_service::job();
        job.restore(&mut checkpoints).map_err(|e| e.to_string())?;
        let mut visits =
            JsonLines::<Visit, _>::resume(files.iter().copied(), &mut checkpoints, Vec::new())
                .map_err(|e| e.to_string())?;
        job.push_batch(visits.by_ref(), &mut sessions, &mut late)
            .map_err(|e| e.to_string())?;
        visits.finish().map_err(|e| e.to_string())?;
        if finish {
            job.finish(&mut sessions, &mut late)
                .map_err(|e| e.to_string())?;
        }
        job.checkpoint(&mut checkpoints)
            .map_err(|e| e.to_string())?;
        Ok(())
    };
    run(&[&days[0]], false).expect("day 0, kept open");
    let err = run(&[&days[0], &days[1]], false).expect_err("day 0 again");
    assert!(err.contains("already read to its end"), "{err}");
    run(&[&days[1]], false).expect("day 1, its next file");
    run(&[&days[1]], false).expect("day 1 again: at its end, nothing more");
    run(&[&days[2]], true).expect("day 2, then the end");
    let err = run(&[&dir.path().join("day0.jsonl")], false).expect_err("after the end");
    assert!(err.contains("has ended"), "{err}");

    // One job over the three files in one go.
    let mut job = file_service::job();
    let mut visits = JsonLines::<Visit, _>::files(&days, Vec::new()).expect("readable");
    let (whole_s, whole_l) = (dir.path().join("s.jsonl"), dir.path().join("l.jsonl"));
    let (mut s, mut l) = (JsonLinesSink::file(&whole_s), JsonLinesSink::file(&whole_l));
    job.run(visits.by_ref(), &mut s, &mut l).expect("files");
    let expected = std::fs::read(&whole_s).expect("sessions");
    assert!(expected.len() > 10_000);
    assert!(
        std::fs::read(out.join("sessions.jsonl")).expect("sessions") == expected,
        "the sessions differ from one job's over the three files"
    );
    assert_eq!(
        std::fs::read(out.join("late.jsonl")).unwrap_or_default(),
        std::fs::read(&whole_l).unwrap_or_default()
    );
}
