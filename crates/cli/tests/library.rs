//! The library's jobs against the `sessionizer` binary on the generator's dirty data:
//! the same sessions, and the same protection against corrupt event times.

use serde::Deserialize;
use sessionizer::core::decode::DEFAULT_VALID_RANGE;
use sessionizer::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// Held while a test has a state directory open (locked), and while a child process is
/// spawned: a child forked in between would inherit the lock's descriptor until its
/// `exec`, and a state directory dropped meanwhile would still look locked to the
/// `sessionizer run` that the test spawns next.
static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn output(cmd: &mut Command) -> std::process::Output {
    let child = {
        let _spawning = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sessionizer")
    };
    child.wait_with_output().expect("sessionizer's output")
}

fn sessionizer(args: &[&str]) {
    let out = output(Command::new(env!("CARGO_BIN_EXE_sessionizer")).args(args));
    assert!(
        out.status.success(),
        "sessionizer {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The generator's dirty data: out of order, late, duplicate and invalid lines (among
/// them events in the year 2500).
fn dirty_input(dir: &Path) -> PathBuf {
    let input = dir.join("visits.jsonl");
    sessionizer(&[
        "generate",
        "--events",
        "20000",
        "--keys",
        "200",
        "--out-of-order",
        "40s",
        "--late-fraction",
        "0.01",
        "--late-by",
        "60s",
        "--duplicate-fraction",
        "0.01",
        "--invalid-fraction",
        "0.01",
        "--output",
        s(&input),
    ]);
    input
}

#[derive(Debug, Clone, Deserialize)]
struct Visit {
    visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    event_time: EventTime,
}

fn far_future_lines(input: &Path) -> usize {
    std::fs::read_to_string(input)
        .expect("read input")
        .lines()
        .filter(|l| l.contains(r#""event_time":"2500-"#))
        .count()
}

/// Regression (issue 12): the library had no valid-time guard, so the generator's
/// far-future lines (year 2500) pushed the watermark past every open session and most
/// later events were late. Now they are rejected as the CLI's `--valid-time-range`
/// default rejects them: reported, counted invalid, and unseen by the watermark.
#[test]
fn far_future_events_are_rejected_and_never_move_the_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dirty_input(dir.path());
    let far = far_future_lines(&input);
    assert!(far > 0, "the generator writes year-2500 lines");

    let run = |guard: bool| {
        let mut dead = Vec::new();
        let mut visits = JsonLines::<Visit, _>::files([&input], &mut dead).expect("readable");
        let stream = Stream::<Visit>::new()
            .key_by(|v| v.visit_id.clone())
            .event_time(|v| v.event_time)
            .watermark(BoundedOutOfOrderness::new(minutes(1)));
        let stream = if guard {
            stream
        } else {
            stream.valid_time_range(..)
        };
        let mut job = stream.session_windows(minutes(30)).build();
        let (mut sessions, mut rejected) = (Vec::new(), Vec::new());
        let mut highest = Watermark::MIN;
        for v in visits.by_ref() {
            job.push(v, &mut sessions, &mut rejected).expect("vectors");
            highest = highest.max(job.watermark());
        }
        let counts = job.finish(&mut sessions, &mut rejected).expect("vectors");
        visits.finish().expect("read to the end");
        (counts, rejected, highest)
    };

    let (counts, rejected, highest) = run(true);
    let out_of_range: Vec<_> = rejected
        .iter()
        .filter(|l| l.reason == "time_out_of_range")
        .collect();
    assert_eq!(
        out_of_range.len(),
        far,
        "every far-future event is reported"
    );
    assert!(out_of_range.iter().all(|l| l.time >= DEFAULT_VALID_RANGE.1));
    assert_eq!(counts.invalid, far as u64);
    assert!(
        highest < Watermark::at(DEFAULT_VALID_RANGE.1),
        "the watermark never left the valid range: {highest}"
    );
    assert_eq!(counts.late, 0, "nothing is late on this input: {counts:?}");
    assert_eq!(
        counts.events,
        counts.in_sessions + counts.late + counts.invalid
    );

    // Without the guard, the first far-future event makes most of what follows late.
    let (unguarded, _, highest) = run(false);
    assert!(highest >= Watermark::at(DEFAULT_VALID_RANGE.1));
    assert!(
        unguarded.late > unguarded.events / 10,
        "without the guard: {unguarded:?}"
    );
}

/// A library job's checkpoint is in the command line's format: `inspect` lists it, and
/// a command-line run refuses to continue it (the options that shape the state differ)
/// rather than mixing two jobs' state.
#[test]
fn a_library_checkpoint_is_listed_by_inspect_and_refused_by_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let spawning = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let mut job = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .session_windows(minutes(30))
        .aggregate(Count)
        .build();
    job.push(
        ("v1", EventTime(1_704_067_200_000)),
        &mut Vec::new(),
        &mut Vec::new(),
    )
    .expect("vectors");
    let written = job.checkpoint(&mut checkpoints).expect("checkpoint");
    drop((checkpoints, spawning));

    let inspect = output(Command::new(env!("CARGO_BIN_EXE_sessionizer")).args([
        "inspect",
        "--state-dir",
        s(&state),
    ]));
    let shown = String::from_utf8_lossy(&inspect.stdout).into_owned()
        + &String::from_utf8_lossy(&inspect.stderr);
    assert!(inspect.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("newest valid checkpoint {}", written.epoch)),
        "{shown}"
    );
    assert!(shown.contains("job library session window"), "{shown}");
    assert!(shown.contains("keys with state 1"), "{shown}");

    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"visit_id\":\"v1\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .expect("write");
    let run = output(Command::new(env!("CARGO_BIN_EXE_sessionizer")).args([
        "run",
        "--input",
        s(&input),
        "--output",
        s(&dir.path().join("out.jsonl")),
        "--state-dir",
        s(&state),
    ]));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(err.contains("job was library session window"), "{err}");
}

/// A library stateful job's checkpoint: `inspect --keys --json` shows each key's state,
/// timeout, timers and expiry; a command-line run refuses the directory.
#[test]
fn a_stateful_library_checkpoint_is_shown_by_inspect_and_refused_by_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let spawning = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let t0 = 1_704_067_200_000;
    let mut job = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .flat_map_groups_with_state(
            |_: &str, events: Vec<(&str, EventTime)>, state: &mut GroupState<'_, u32>| {
                state.update(events.len() as u32);
                state.register_event_time_timer(EventTime(t0 + 3_600_000));
                state.set_timeout_timestamp(EventTime(t0 + 60_000));
                None::<()>
            },
        )
        .clock(ManualClock::new(ProcessingTime(t0)))
        .state_ttl(minutes(5))
        .build();
    job.process_batch(
        [
            ("v1", EventTime(t0)),
            ("v1", EventTime(t0 + 1)),
            ("v2", EventTime(t0)),
        ],
        &mut Vec::new(),
        &mut Vec::new(),
    )
    .expect("vectors");
    job.checkpoint(&mut checkpoints).expect("checkpoint");
    drop((checkpoints, spawning));

    let inspect = output(Command::new(env!("CARGO_BIN_EXE_sessionizer")).args([
        "inspect",
        "--state-dir",
        s(&state),
        "--keys",
        "--json",
    ]));
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("JSON");
    assert_eq!(report["keys_with_state"], 2, "{report}");
    let v1 = &report["keys"][0];
    assert_eq!(v1["key"], "v1", "{report}");
    assert_eq!(v1["state"], 2);
    assert_eq!(v1["event_timeout"], "2024-01-01T00:01:00.000Z");
    assert_eq!(
        v1["timers"],
        serde_json::json!([{"event_time": "2024-01-01T01:00:00.000Z"}])
    );
    assert_eq!(v1["expires"], "2024-01-01T00:05:00.000Z");
    assert_eq!(report["keys"][1]["state"], 1);

    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"visit_id\":\"v1\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .expect("write");
    let run = output(Command::new(env!("CARGO_BIN_EXE_sessionizer")).args([
        "run",
        "--input",
        s(&input),
        "--output",
        s(&dir.path().join("out.jsonl")),
        "--state-dir",
        s(&state),
    ]));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(err.contains("job was library stateful"), "{err}");
}

#[path = "../../sessionizer/examples/flink_style.rs"]
#[allow(dead_code, unreachable_pub)]
mod flink_style;

/// A session record without what only one side writes (`complete`), the collected pages
/// under one name.
fn normalized(line: &str) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
    let o = v.as_object_mut().expect("an object");
    o.remove("complete");
    if let Some(pages) = o.remove("page") {
        o.insert("visited_pages".into(), pages);
    }
    v
}

/// The book's Flink job (`examples/flink_style.rs`), run on the generator's dirty data,
/// emits the sessions the CLI emits with the same options, record for record.
#[test]
fn the_flink_style_example_and_the_cli_emit_the_same_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dirty_input(dir.path());
    let cli_out = dir.path().join("sessions.jsonl");
    let stats = dir.path().join("stats.json");
    sessionizer(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&cli_out),
        "--gap",
        "10m",
        "--watermark-delay",
        "20m",
        "--allowed-lateness",
        "15m",
        "--collect",
        "page",
        "--stats-file",
        s(&stats),
    ]);
    let mut printed = Vec::new();
    flink_style::run_on(&input, &mut printed).expect("the example runs");
    let printed = String::from_utf8(printed).expect("UTF-8");
    let library: Vec<serde_json::Value> = printed
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(normalized)
        .collect();
    let cli: Vec<serde_json::Value> = std::fs::read_to_string(&cli_out)
        .expect("CLI output")
        .lines()
        .map(normalized)
        .collect();
    assert!(cli.len() > 1000, "{} sessions", cli.len());
    assert_eq!(library.len(), cli.len());
    assert_eq!(library, cli);

    assert_same_accounting(&printed, &stats);
}

/// An example's accounting line (`printed`) is the CLI's run's, from its stats file:
/// records = in sessions (duplicates among them: neither job drops them) + late +
/// invalid.
fn assert_same_accounting(printed: &str, stats: &Path) {
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(stats).expect("stats")).expect("JSON");
    let accounting = printed
        .lines()
        .find(|l| l.starts_with("records "))
        .expect("the accounting line");
    let cli_accounting = format!(
        "records {} = in sessions {} + late {} + invalid {}",
        stats["records_read"],
        stats["in_sessions"].as_u64().unwrap_or(0) + stats["duplicates"].as_u64().unwrap_or(0),
        stats["late"],
        stats["invalid"]
    );
    assert_eq!(accounting, cli_accounting);
}

#[path = "../../sessionizer/examples/spark_style.rs"]
#[allow(dead_code, unreachable_pub)]
mod spark_style;

/// A session as both jobs give it: key, first and last event time, the pages in
/// event-time order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Found {
    key: String,
    start: String,
    end: String,
    pages: Vec<String>,
}

/// The book's Spark job (`examples/spark_style.rs`: the seed's `map_visits_to_session`
/// in micro-batches, each visit's session emitted when its event-time timeout, 10
/// minutes past the watermark of its last batch, fires) emits the sessions of the
/// CLI's 10-minute session window on the same data: the generator's visits out of
/// order by up to 20 s (never behind a 1-minute watermark), with duplicate and invalid
/// lines (the year-2500 ones among them), and pauses of 26 to 34 minutes that split a
/// visit in both. The same sessions as sets (the Spark job emits at timeouts, the CLI
/// at closes), and the same accounting.
#[test]
fn the_spark_style_example_and_the_cli_emit_the_same_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("visits.jsonl");
    sessionizer(&[
        "generate",
        "--events",
        "20000",
        "--keys",
        "200",
        "--out-of-order",
        "20s",
        "--return-fraction",
        "0.2",
        "--duplicate-fraction",
        "0.01",
        "--invalid-fraction",
        "0.01",
        "--output",
        s(&input),
    ]);
    assert!(
        far_future_lines(&input) > 0,
        "the year-2500 lines are in the input"
    );
    let cli_out = dir.path().join("sessions.jsonl");
    let stats = dir.path().join("stats.json");
    sessionizer(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&cli_out),
        "--gap",
        "10m",
        "--watermark-delay",
        "1m",
        "--collect",
        "page",
        "--stats-file",
        s(&stats),
    ]);
    let mut printed = Vec::new();
    spark_style::run_on(&input, 500, &mut printed).expect("the example runs");
    let printed = String::from_utf8(printed).expect("UTF-8");

    let mut library: Vec<Found> = printed
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            Found {
                key: v["visit_id"].as_str().expect("visit_id").to_string(),
                start: v["start_time"].as_str().expect("start_time").to_string(),
                end: v["end_time"].as_str().expect("end_time").to_string(),
                pages: v["visited_pages"]
                    .as_array()
                    .expect("visited_pages")
                    .iter()
                    .map(|p| p["page"].as_str().expect("page").to_string())
                    .collect(),
            }
        })
        .collect();
    let mut cli: Vec<Found> = std::fs::read_to_string(&cli_out)
        .expect("CLI output")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(v["revision"], 0, "one record per session: {l}");
            Found {
                key: v["key"].as_str().expect("key").to_string(),
                start: v["start"].as_str().expect("start").to_string(),
                end: v["end"].as_str().expect("end").to_string(),
                pages: v["page"]
                    .as_array()
                    .expect("page")
                    .iter()
                    .map(|p| p.as_str().expect("page").to_string())
                    .collect(),
            }
        })
        .collect();
    library.sort();
    cli.sort();
    assert!(cli.len() > 1_500, "{} sessions", cli.len());
    // Visits split by a pause: the same key in two sessions, on both sides.
    let split = cli.windows(2).filter(|w| w[0].key == w[1].key).count();
    assert!(split > 50, "{split} visits split by a pause");
    assert_eq!(library.len(), cli.len());
    for (l, c) in library.iter().zip(&cli) {
        assert_eq!(l, c);
    }

    // Nothing late; the same events in sessions and invalid.
    assert_same_accounting(&printed, &stats);
    // What went to the late sink is the rejected far-future lines, none behind the
    // watermark.
    let rejected: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("late: "))
        .collect();
    assert_eq!(rejected.len(), far_future_lines(&input), "{rejected:?}");
    for line in rejected {
        let reason = format!("({})", sessionizer::late::TIME_OUT_OF_RANGE);
        assert!(line.ends_with(&reason), "{line}");
    }
}
