//! Durable state end to end (docs/semantics.md S-35, docs/checkpoint-format.md): the real
//! binary on real files, killed with SIGKILL, its checkpoints damaged on disk, its writes
//! made to fail. The one property checked everywhere: the file outputs at the end equal,
//! byte for byte, those of one uninterrupted run.

#[path = "support/outputs.rs"]
mod outputs;
#[path = "support/process.rs"]
mod process;

use outputs::{KillDelays, assert_same_outputs, done_fraction, run_or_kill, stats};
use process::{bin, run, run_ok, s};
use rand::{Rng, SeedableRng};
#[cfg(feature = "fault-injection")]
use sessionizer_checkpoint::FileKind;
#[cfg(feature = "fault-injection")]
use sessionizer_checkpoint::dir::file_name;
use sessionizer_checkpoint::{Manifest, StateDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Generates dirty visits: out of order, late, duplicated and invalid lines.
fn generate(path: &Path, events: u64, seed: u64) {
    process::generate_with(path, events, 3000, seed, &process::LIGHTLY_DIRTY);
}

/// The options of every job here: lateness (revisions, retractions, late events),
/// dedup, an aggregate whose order depends on input sequence numbers.
const JOB: &[&str] = &[
    "--collect",
    "page",
    "--last",
    "referrer",
    "--dedup",
    "--gap",
    "10m",
    "--watermark-delay",
    "1m",
    "--allowed-lateness",
    "5m",
    "--progress",
    "never",
];

/// The accounting of a stats file, without timings.
fn counts(path: &Path) -> Vec<(String, u64)> {
    let v = stats(path);
    [
        "records_read",
        "in_sessions",
        "duplicates",
        "late",
        "invalid",
        "sessions_emitted",
        "retractions",
        "bytes_read",
    ]
    .iter()
    .map(|k| (k.to_string(), v[k].as_u64().unwrap_or(u64::MAX)))
    .collect()
}

/// Runs the job once without a state directory into `dir`; returns how long it took.
fn reference(input: &[&Path], dir: &Path) -> Duration {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut args = vec!["run".to_string()];
    for i in input {
        args.extend(["--input".into(), s(i).into()]);
    }
    args.extend(["--output".into(), s(&dir.join("out.jsonl")).into()]);
    args.extend(["--stats-file".into(), s(&dir.join("stats.json")).into()]);
    args.extend(JOB.iter().map(|a| a.to_string()));
    let started = Instant::now();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    run_ok(&argv);
    started.elapsed()
}

/// `run` args for a durable job over `input` writing into `dir`.
fn durable_args(input: &[&Path], dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["run".to_string()];
    for i in input {
        args.extend(["--input".into(), s(i).into()]);
    }
    args.extend(["--output".into(), s(&dir.join("out.jsonl")).into()]);
    args.extend(["--state-dir".into(), s(&dir.join("state")).into()]);
    args.extend(["--stats-file".into(), s(&dir.join("stats.json")).into()]);
    args.extend(JOB.iter().map(|a| a.to_string()));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn run_durable(input: &[&Path], dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let args = durable_args(input, dir, extra);
    let mut cmd = bin();
    cmd.args(&args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("spawn sessionizer")
}

/// docs/semantics.md S-35's promise, tested the hard way: ~1M events, a checkpoint every
/// 20 ms, the process killed with SIGKILL at 20+ random instants (during startup,
/// restore, reading, checkpointing, anywhere) and restarted each time with a random
/// number of workers (the state is re-hashed), until a run finishes. The outputs then
/// equal those of an uninterrupted run, byte for byte, and so does the accounting.
#[test]
fn killed_at_random_instants_and_restarted_the_job_gives_the_uninterrupted_output() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    let events: u64 = std::env::var("SESSIONIZER_CRASH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    generate(&input, events, 11);
    let want = tmp.path().join("want");
    let took = reference(&[&input], &want);

    let seed = std::env::var("SESSIONIZER_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_241_130);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let got = tmp.path().join("got");
    std::fs::create_dir_all(&got).expect("mkdir");
    let log_path = tmp.path().join("runs.log");
    let (mut kills, mut runs) = (0u32, 0u32);
    let mut progress: Vec<f64> = Vec::new();
    let mut delays = KillDelays::new(took, took / 16, 20);
    loop {
        runs += 1;
        assert!(
            runs <= 400,
            "no run finished after {runs} restarts; see {}",
            log_path.display()
        );
        // Each run gets on average 1/32 of the uninterrupted run's time (uniform in
        // [0.5 ms, 1/16]), so the kills spread over the whole job — startup, restore,
        // reading, checkpointing, the end of input — and it takes about 30 runs, 20+
        // of them killed, to finish (see KillDelays for runs without progress and for
        // the last stretch).
        let done = done_fraction(&got.join("state"), events);
        progress.push(done);
        let delay = delays.next(done, kills, &mut rng);
        let workers = rng.random_range(1..=3u32).to_string();
        let args = durable_args(
            &[&input],
            &got,
            &["--checkpoint-interval", "20ms", "--workers", &workers],
        );
        match run_or_kill(&args, &log_path, delay) {
            Some(status) if status.success() => break,
            Some(status) => panic!(
                "run {runs} failed ({status}); log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            ),
            None => kills += 1,
        }
    }
    assert!(
        kills >= 20,
        "only {kills} kills before the job finished (runs take {took:?}); lower the delays"
    );
    let percent: Vec<String> = progress
        .iter()
        .map(|d| format!("{:.0}%", d * 100.0))
        .collect();
    eprintln!(
        "crash test: {events} events, {kills} kills in {runs} runs (uninterrupted: {took:?}); done at each start: {}",
        percent.join(" ")
    );
    assert_same_outputs(&got, &want);
    assert_eq!(
        counts(&got.join("stats.json")),
        counts(&want.join("stats.json"))
    );
}

/// Splits the lines of `input` into two files at line `at`.
fn split(input: &Path, at: usize, a: &Path, b: &Path) {
    let text = std::fs::read(input).expect("read");
    let mut cut = 0;
    for _ in 0..at {
        cut += text[cut..]
            .iter()
            .position(|&c| c == b'\n')
            .expect("enough lines")
            + 1;
    }
    std::fs::write(a, &text[..cut]).expect("write");
    std::fs::write(b, &text[cut..]).expect("write");
}

/// docs/semantics.md S-11, end of input with `--keep-open`: a session that spans midnight
/// comes out whole from two daily runs, and the two runs give exactly the output of one
/// run over both files.
#[test]
fn keep_open_then_the_next_file_equals_one_run_over_both() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let day1 = tmp.path().join("day1.jsonl");
    let day2 = tmp.path().join("day2.jsonl");
    std::fs::write(
        &day1,
        concat!(
            r#"{"visit_id":"noon","event_time":"2024-01-01T12:00:00Z","page":"/a"}"#,
            "\n",
            r#"{"visit_id":"noon","event_time":"2024-01-01T12:05:00Z","page":"/b"}"#,
            "\n",
            r#"{"visit_id":"night","event_time":"2024-01-01T23:40:00Z","page":"/home"}"#,
            "\n",
            r#"{"visit_id":"night","event_time":"2024-01-01T23:48:00Z","page":"/x"}"#,
            "\n",
            r#"{"visit_id":"night","event_time":"2024-01-01T23:55:00Z","page":"/search"}"#,
            "\n",
        ),
    )
    .expect("write");
    std::fs::write(
        &day2,
        concat!(
            r#"{"visit_id":"night","event_time":"2024-01-02T00:04:00Z","page":"/cart"}"#,
            "\n",
            r#"{"visit_id":"morning","event_time":"2024-01-02T08:00:00Z","page":"/m"}"#,
            "\n",
        ),
    )
    .expect("write");
    let want = tmp.path().join("want");
    reference(&[&day1, &day2], &want);

    let got = tmp.path().join("got");
    std::fs::create_dir_all(&got).expect("mkdir");
    let first = run_durable(&[&day1], &got, &["--keep-open"], &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let after_day1 = std::fs::read_to_string(got.join("out.jsonl")).expect("out");
    assert!(
        after_day1.contains("\"noon\"") && !after_day1.contains("night"),
        "{after_day1}"
    );

    let second = run_durable(&[&day2], &got, &["--workers", "2"], &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_same_outputs(&got, &want);
    let night: Vec<serde_json::Value> = std::fs::read_to_string(got.join("out.jsonl"))
        .expect("out")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .filter(|v: &serde_json::Value| v["key"] == "night")
        .collect();
    assert_eq!(night.len(), 1, "{night:?}");
    assert_eq!(night[0]["start"], "2024-01-01T23:40:00.000Z");
    assert_eq!(night[0]["end"], "2024-01-02T00:04:00.000Z");
    assert_eq!(
        night[0]["page"],
        serde_json::json!(["/home", "/x", "/search", "/cart"])
    );
    assert_eq!(
        counts(&got.join("stats.json")),
        counts(&want.join("stats.json"))
    );
}

/// The same on dirty generated data cut in the middle: late events, revisions,
/// retractions, duplicates and dead letters all come out as from one run.
#[test]
fn keep_open_across_a_cut_in_dirty_data_equals_one_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let all = tmp.path().join("all.jsonl");
    generate(&all, 30_000, 5);
    let (a, b) = (tmp.path().join("a.jsonl"), tmp.path().join("b.jsonl"));
    split(&all, 17_000, &a, &b);
    let want = tmp.path().join("want");
    reference(&[&a, &b], &want);
    let got = tmp.path().join("got");
    std::fs::create_dir_all(&got).expect("mkdir");
    let first = run_durable(&[&a], &got, &["--keep-open", "--workers", "3"], &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    // Running the first file again changes nothing: it is resumed at its end.
    let again = run_durable(&[&a], &got, &["--keep-open"], &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    let second = run_durable(&[&b], &got, &[], &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_same_outputs(&got, &want);
    assert_eq!(
        counts(&got.join("stats.json")),
        counts(&want.join("stats.json"))
    );
}

/// The newest manifest of a state directory.
fn newest(state: &Path) -> Manifest {
    StateDir::existing(state)
        .expect("state dir")
        .recover()
        .expect("recover")
        .found
        .expect("a checkpoint")
        .manifest
}

/// Starts a durable job over `input` that stops (as a crash would) when its `nth`
/// checkpoint file write fails; returns the stderr of that run. Through the test hook
/// of the cargo feature `fault-injection`, as every test that calls it.
#[cfg(feature = "fault-injection")]
fn stop_at_write(input: &Path, dir: &Path, nth: u64) -> String {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("mkdir");
    let out = run_durable(
        &[input],
        dir,
        &["--checkpoint-interval", "0s"],
        &[("SESSIONIZER_TEST_FAIL_CHECKPOINT_WRITE", &nth.to_string())],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected the injected failure: {}",
        stderr(&out)
    );
    stderr(&out)
}

#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy)]
enum Damage {
    FlipByte,
    Truncate,
}

#[cfg(feature = "fault-injection")]
fn damage(path: &Path, how: Damage) {
    let mut bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match how {
        Damage::FlipByte => {
            let i = bytes.len() / 3;
            bytes[i] ^= 0x20;
        }
        Damage::Truncate => bytes.truncate(bytes.len() * 2 / 3),
    }
    std::fs::write(path, bytes).expect("write damaged file");
}

/// Flipping a byte in, or truncating, each kind of checkpoint file (manifest, base,
/// delta) of the newest checkpoint is detected and reported; the job resumes from the
/// checkpoint before it and its outputs are still exact.
#[cfg(feature = "fault-injection")]
#[test]
fn a_damaged_newest_checkpoint_of_each_kind_falls_back_and_the_output_stays_exact() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 150_000, 3);
    let want = tmp.path().join("want");
    reference(&[&input], &want);
    let dir = tmp.path().join("got");
    for kind in [FileKind::Manifest, FileKind::Delta, FileKind::Base] {
        for how in [Damage::FlipByte, Damage::Truncate] {
            // Stop the job at successive checkpoint writes until the newest checkpoint
            // is one whose file of this kind no older checkpoint shares.
            let mut found = None;
            for nth in 4..60 {
                stop_at_write(&input, &dir, nth);
                let m = newest(&dir.join("state"));
                let file = match kind {
                    FileKind::Manifest => {
                        Some(file_name(FileKind::Manifest, m.epoch)).filter(|_| m.epoch > 1)
                    }
                    FileKind::Delta => m
                        .deltas
                        .last()
                        .filter(|d| d.epoch == m.epoch)
                        .map(|d| d.file.clone()),
                    FileKind::Base => {
                        Some(m.base.file.clone()).filter(|_| m.base.epoch == m.epoch && m.epoch > 1)
                    }
                    FileKind::TaskSnapshot => unreachable!("not among the kinds tried"),
                };
                if let Some(f) = file {
                    found = Some((m, f));
                    break;
                }
            }
            let (m, file) =
                found.unwrap_or_else(|| panic!("no checkpoint with a fresh {kind:?} file"));
            damage(&dir.join("state").join(&file), how);
            let out = run_durable(&[&input], &dir, &[], &[]);
            let err = stderr(&out);
            assert!(out.status.success(), "{kind:?} {how:?}: {err}");
            assert!(
                err.contains(&format!("checkpoint {} in", m.epoch))
                    && err.contains("damaged")
                    && err.contains(&file),
                "{kind:?} {how:?}: the damage is reported, naming the file: {err}"
            );
            assert_same_outputs(&dir, &want);
            assert_eq!(
                counts(&dir.join("stats.json")),
                counts(&want.join("stats.json"))
            );
        }
    }
}

/// None valid: the run refuses to start, says so, and leaves the outputs alone.
#[cfg(feature = "fault-injection")]
#[test]
fn no_valid_checkpoint_refuses_to_start_over_existing_output() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 60_000, 9);
    let dir = tmp.path().join("got");
    stop_at_write(&input, &dir, 7);
    let state = dir.join("state");
    for epoch in StateDir::existing(&state)
        .expect("dir")
        .list()
        .expect("list")
        .manifests
    {
        damage(
            &state.join(file_name(FileKind::Manifest, epoch)),
            Damage::FlipByte,
        );
    }
    let before = std::fs::read(dir.join("out.jsonl")).expect("out");
    let out = run_durable(&[&input], &dir, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("no valid checkpoint") && err.contains("refusing to start"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.join("out.jsonl")).expect("out"),
        before,
        "output untouched"
    );
}

/// A failure while writing a checkpoint (here an injected "no space left on device" in
/// the middle of a file) stops the run with a message naming the file and saying the
/// previous checkpoint is intact; the next run resumes from it and the output is exact.
#[cfg(feature = "fault-injection")]
#[test]
fn a_failed_checkpoint_write_is_a_clear_error_and_the_previous_checkpoint_resumes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 60_000, 13);
    let want = tmp.path().join("want");
    reference(&[&input], &want);
    let dir = tmp.path().join("got");
    for nth in [1, 2, 5, 6] {
        let err = stop_at_write(&input, &dir, nth);
        assert!(
            err.contains("cannot write")
                && err.contains(".ckpt")
                && err.contains("no space left on device")
                && err.contains("previous checkpoint is left intact"),
            "write {nth}: {err}"
        );
        let names: Vec<String> = std::fs::read_dir(dir.join("state"))
            .expect("state")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(".tmp-")),
            "no temp file left: {names:?}"
        );
        let out = run_durable(&[&input], &dir, &[], &[]);
        assert!(out.status.success(), "write {nth}: {}", stderr(&out));
        assert_same_outputs(&dir, &want);
    }
}

/// Resuming with other options is refused, naming each difference; an input file that
/// changed under the checkpoint is refused, naming it; stdin and stray checkpoint flags
/// are refused up front.
#[cfg(feature = "fault-injection")]
#[test]
fn changed_options_and_changed_inputs_are_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 40_000, 21);
    let dir = tmp.path().join("got");
    stop_at_write(&input, &dir, 3);

    let mut args = durable_args(&[&input], &dir, &[]);
    let gap = args.iter().position(|a| a == "--gap").expect("--gap") + 1;
    args[gap] = "20m".into();
    args.extend(["--first".into(), "user_id".into()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&argv);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--gap was 10m when the checkpoint was taken, this run has 20m"),
        "{err}"
    );
    assert!(
        err.contains("aggregates was collect page as page, last referrer as referrer"),
        "{err}"
    );

    let mut text = std::fs::read(&input).expect("read");
    text.extend_from_slice(b"{\"visit_id\":\"new\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n");
    std::fs::write(&input, text).expect("append");
    let out = run_durable(&[&input], &dir, &[], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "input {} changed since the checkpoint",
            input.display()
        )),
        "{err}"
    );

    let out = run(&["run", "--input", "-", "--state-dir", s(&dir.join("state"))]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("stdin"), "{}", stderr(&out));
    let out = run(&["run", "--input", s(&input), "--keep-open"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--keep-open needs --state-dir"),
        "{}",
        stderr(&out)
    );
}

/// `inspect` shows the checkpoints, positions, watermark, counts and the open sessions,
/// all of them or one key's, as text and as JSON.
#[test]
fn inspect_shows_positions_watermark_counts_and_open_sessions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let day1 = tmp.path().join("day1.jsonl");
    std::fs::write(
        &day1,
        concat!(
            r#"{"visit_id":"v1","event_time":"2024-01-01T23:40:00Z","page":"/home"}"#,
            "\n",
            r#"{"visit_id":"v2","event_time":"2024-01-01T23:50:00Z","page":"/x"}"#,
            "\n",
            r#"{"visit_id":"v1","event_time":"2024-01-01T23:48:00Z","page":"/search"}"#,
            "\n",
        ),
    )
    .expect("write");
    let dir = tmp.path().join("got");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let out = run_durable(&[&day1], &dir, &["--keep-open"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let state = dir.join("state");

    let text = String::from_utf8(run_ok(&["inspect", "--state-dir", s(&state), "--keys"]).stdout)
        .expect("utf8");
    let size = std::fs::metadata(&day1).expect("meta").len();
    for want in [
        "end of input (--keep-open: sessions kept)",
        &format!("{}: {size} of {size} bytes read, 3 lines", day1.display()),
        "watermark: 2024-01-01T23:49:00.000Z",
        "read 3 = in sessions 3 + duplicates 0 + late 0 + invalid 0",
        "--gap 10m",
        "\"v1\"",
        "\"v2\"",
        "[\"/home\",\"/search\"]",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let one =
        String::from_utf8(run_ok(&["inspect", "--state-dir", s(&state), "--key", "v2"]).stdout)
            .expect("utf8");
    assert!(one.contains("\"v2\"") && !one.contains("\"v1\""), "{one}");

    let json: serde_json::Value = serde_json::from_slice(
        &run_ok(&["inspect", "--state-dir", s(&state), "--json", "--keys"]).stdout,
    )
    .expect("json");
    assert_eq!(json["newest_valid"]["finished"], true);
    assert_eq!(json["sessions"].as_array().map(Vec::len), Some(2));
    assert_eq!(json["sessions"][0]["sessions"][0]["event_count"], 2);
}

/// Unmounts a tmpfs when dropped, whatever the test did.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `at`; `None` when this machine does not let us (not
    /// root, no mount namespace): the caller then skips.
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", s(at)])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|st| st.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}"), s(&self.0)])
            .status()
            .expect("mount");
        assert!(st.success(), "remount {size}");
    }

    fn make_read_only(&self) {
        let st = Command::new("mount")
            .args(["-o", "remount,ro", s(&self.0)])
            .status()
            .expect("mount");
        assert!(st.success(), "remount read-only");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A real full disk: the state directory on a 10 MiB tmpfs fills up while the job
/// checkpoints. The run stops with the system's "No space left on device", naming the
/// file; once there is room again, the next run resumes from the last checkpoint that
/// was written whole and the output is exact. Skipped where tmpfs cannot be mounted.
#[test]
fn a_full_disk_while_checkpointing_stops_the_run_and_it_resumes_once_there_is_room() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 150_000, 13);
    let want = tmp.path().join("want");
    reference(&[&input], &want);
    let dir = tmp.path().join("got");
    let Some(disk) = Tmpfs::mount(&dir.join("state"), "10m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let out = run_durable(&[&input], &dir, &["--checkpoint-interval", "0s"], &[]);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the disk should have filled: {err}"
    );
    assert!(
        err.contains("No space left on device")
            && err.contains(".ckpt")
            && err.contains("previous checkpoint is left intact"),
        "{err}"
    );
    let before = newest(&dir.join("state"));
    assert!(
        before.counters.records_read > 0,
        "some checkpoints fit before the disk was full"
    );
    // The failed run still writes its stats file (it left none before), with the
    // error and its counts until then.
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("stats.json")).expect("stats"))
            .expect("stats JSON");
    assert!(
        stats["error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{stats}"
    );
    assert!(stats["records_read"].as_u64() >= Some(before.counters.records_read));
    disk.resize("512m");
    let out = run_durable(&[&input], &dir, &[], &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("resumed from checkpoint {}", before.epoch)),
        "{err}"
    );
    assert_same_outputs(&dir, &want);
    drop(disk);
}

/// `--state-dir` naming a regular file (or a path under one) said "File exists ... fix
/// the cause (disk space, permissions)": the message says it is a file and what to do.
#[test]
fn a_state_dir_that_is_a_file_is_refused_as_a_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    std::fs::write(
        &input,
        "{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .expect("write");
    let file = tmp.path().join("state");
    std::fs::write(&file, "not a directory").expect("write");
    let under = file.join("sub");
    for (state, want) in [
        (
            &file,
            format!("--state-dir {} is a file, not a directory", file.display()),
        ),
        (
            &under,
            format!("{} is a file, not a directory", file.display()),
        ),
    ] {
        let out = run(&[
            "run",
            "--input",
            s(&input),
            "--output",
            s(&tmp.path().join("out.jsonl")),
            "--state-dir",
            s(state),
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(&want), "{want:?} in: {err}");
        assert!(err.contains(s(state)), "{err}");
        assert!(
            !err.contains("disk space") && !err.contains("File exists"),
            "{err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "not a directory",
        "the file is left alone"
    );
}

/// A state directory on a read-only file system (existing or to be created) said "fix
/// the cause (disk space, permissions)": the message names the read-only file system and
/// what to do. Skipped where tmpfs cannot be mounted.
#[test]
fn a_state_dir_on_a_read_only_file_system_is_refused_as_read_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    std::fs::write(
        &input,
        "{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .expect("write");
    let Some(disk) = Tmpfs::mount(&tmp.path().join("ro"), "1m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let existing = tmp.path().join("ro").join("state");
    std::fs::create_dir(&existing).expect("mkdir");
    disk.make_read_only();
    for state in [existing, tmp.path().join("ro").join("new")] {
        let out = run(&[
            "run",
            "--input",
            s(&input),
            "--output",
            s(&tmp.path().join("out.jsonl")),
            "--state-dir",
            s(&state),
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(s(&state))
                && err.contains("read-only file system")
                && err.contains("remount it read-write"),
            "{err}"
        );
        assert!(!err.contains("disk space"), "{err}");
    }
    drop(disk);
}

/// A file read to its end by a --keep-open run and then appended to is not taken for a
/// new file at the same path: that would apply its first lines twice.
#[test]
fn an_input_appended_to_after_a_keep_open_run_is_refused_not_read_twice() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = tmp.path().join("events.jsonl");
    let first = concat!(
        r#"{"visit_id":"a","event_time":"2024-01-01T00:00:00Z","page":"/1"}"#,
        "\n",
        r#"{"visit_id":"a","event_time":"2024-01-01T00:01:00Z","page":"/2"}"#,
        "\n"
    );
    std::fs::write(&log, first).expect("write");
    let out = run_durable(&[&log], tmp.path(), &["--keep-open"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(tmp.path().join("out.jsonl")).expect("output");
    let more = r#"{"visit_id":"a","event_time":"2024-01-01T00:02:00Z","page":"/3"}"#;
    std::fs::write(&log, format!("{first}{more}\n")).expect("append");
    let out = run_durable(&[&log], tmp.path(), &["--keep-open"], &[]);
    assert!(!out.status.success(), "an appended input must be refused");
    let message = stderr(&out);
    assert!(
        message.contains("events.jsonl") && message.contains("grew"),
        "{message}"
    );
    // Also when it comes with a new file (other paths than the checkpoint's).
    let next = tmp.path().join("next.jsonl");
    std::fs::write(&next, format!("{more}\n")).expect("write");
    let out = run_durable(&[&log, &next], tmp.path(), &["--keep-open"], &[]);
    assert!(!out.status.success(), "an appended input among new ones");
    let message = stderr(&out);
    assert!(
        message.contains("events.jsonl") && message.contains("grew"),
        "{message}"
    );
    assert_eq!(
        std::fs::read(tmp.path().join("out.jsonl")).expect("output"),
        before
    );
}

/// Runs `sessionizer` with `args` in `dir` (the format-1 fixture's paths are relative).
fn run_in(dir: &Path, args: &[&str]) -> Output {
    let out = bin()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("spawn sessionizer");
    assert!(
        out.status.success(),
        "sessionizer {args:?} failed: {}",
        stderr(&out)
    );
    out
}

/// The fixture's job: the options its checkpoint records.
const FIXTURE_JOB: &[&str] = &[
    "--output",
    "out.jsonl",
    "--state-dir",
    "state",
    "--gap",
    "10m",
    "--watermark-delay",
    "1m",
    "--allowed-lateness",
    "5m",
    "--collect",
    "page",
    "--dedup",
    "--progress",
    "never",
];

/// A checkpoint of format 1 (written before the per-key floor existed:
/// `tests/fixtures/checkpoint-v1`, its README says how) still resumes. Its keys start
/// with the floor their state implies, `min(W - A - G, earliest start - 1)` at the
/// checkpoint's `W` = 10:28 (docs/semantics.md S-30): the issue's late event of key `a`
/// (4 minutes after its forgotten first session, within the gap of its live one) is
/// turned away as in an uninterrupted run; so is an event reaching back before `long`'s
/// start (08:00), which an uninterrupted run accepts (its floor is minus infinity): the
/// old state cannot tell whether a forgotten session ended just before. The first
/// checkpoint of the resumed run is a new base of format 2, which the next run resumes.
#[test]
fn a_format_1_checkpoint_resumes_with_the_floors_its_state_implies() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-v1");
    let tmp = tempfile::tempdir().expect("tempdir");
    let job = tmp.path();
    std::fs::create_dir_all(job.join("state")).expect("mkdir");
    for name in [
        "day1.jsonl",
        "out.jsonl",
        "out.late.jsonl",
        "out.dead-letter.jsonl",
        "state/manifest-0000000001.ckpt",
        "state/base-0000000001.ckpt",
    ] {
        std::fs::copy(fixture.join(name), job.join(name)).expect("copy fixture");
    }
    let day1_out = std::fs::read_to_string(job.join("out.jsonl")).expect("out");
    let text =
        String::from_utf8(run_in(job, &["inspect", "--state-dir", "state", "--keys"]).stdout)
            .expect("utf8");
    assert!(
        text.contains("\"a\" (floor not stored in format 1: a resumed run derives it)"),
        "{text}"
    );

    let line = |key: &str, time: &str, page: &str| {
        format!(
            "{{\"visit_id\":\"{key}\",\"event_time\":\"2024-01-01T{time}Z\",\"page\":\"{page}\"}}\n"
        )
    };
    std::fs::write(
        job.join("day2.jsonl"),
        [
            line("a", "10:04:00", "/a4"),
            line("ek", "10:14:00", "/e1"),
            line("long", "07:55:00", "/l-1"),
            line("kept", "10:14:00", "/k1"),
            line("new", "10:13:30", "/n0"),
            line("open", "10:31:00", "/o2"),
        ]
        .concat(),
    )
    .expect("write day2");
    let mut args = vec!["run", "--input", "day2.jsonl", "--keep-open"];
    args.extend_from_slice(FIXTURE_JOB);
    run_in(job, &args);

    // By hand, at W = 10:28 (A = 5m, G = 10m; floors: a 10:11:59.999, ek 10:13,
    // kept 10:09:59.999, long 07:59:59.999, open 10:13, new keys 10:13):
    // a@10:04 joins a's live [10:12, 10:27] (close 10:37): 10:04 <= 10:11:59.999 ->
    //   session_final. ek@10:14 joins the emitted [10:15] (close 10:25 + 5 > 10:28),
    //   10:14 > 10:13: applied; its start moves: retraction, then revision 1 (complete).
    // long@07:55 -> session_final (07:55 <= 07:59:59.999). kept@10:14 touches the final
    // [10:10] (close 10:20; 10:24 + 5 > 10:28) -> session_final. new@10:13:30: a new
    // key, 10:23:30 + 5 > 10:28 and 10:13:30 > 10:13: applied and complete at once.
    // open@10:31 joins open; W = 10:30.
    let late: Vec<serde_json::Value> = std::fs::read_to_string(job.join("out.late.jsonl"))
        .expect("late")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let late: Vec<(&str, &str, &str)> = late
        .iter()
        .map(|r| {
            (
                r["event"]["visit_id"].as_str().unwrap_or("?"),
                r["event"]["event_time"].as_str().unwrap_or("?"),
                r["reason"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(
        late,
        [
            ("a", "2024-01-01T10:04:00Z", "session_final"),
            ("long", "2024-01-01T07:55:00Z", "session_final"),
            ("kept", "2024-01-01T10:14:00Z", "session_final"),
        ]
    );

    // The resumed run's checkpoint is a new base, of this format, with the floors.
    let m = newest(&job.join("state"));
    assert_eq!((m.epoch, m.base.epoch, m.deltas.len()), (2, 2, 0));
    assert_eq!(m.watermark.new_key_floor_ms, Some(1_704_104_100_000)); // 10:15
    let json: serde_json::Value = serde_json::from_slice(
        &run_in(
            job,
            &["inspect", "--state-dir", "state", "--json", "--keys"],
        )
        .stdout,
    )
    .expect("json");
    let floors: Vec<(String, String)> = json["sessions"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap_or("?").to_owned(),
                k["floor"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let at = |t: &str| format!("2024-01-01T{t}Z");
    assert_eq!(
        floors,
        [
            ("a".to_owned(), at("10:11:59.999")),
            ("ek".to_owned(), at("10:13:00.000")),
            ("kept".to_owned(), at("10:09:59.999")),
            ("long".to_owned(), at("07:59:59.999")),
            ("new".to_owned(), at("10:13:00.000")),
            ("open".to_owned(), at("10:13:00.000")),
        ]
    );

    // The next run resumes the format-2 checkpoint and flushes.
    std::fs::write(job.join("day3.jsonl"), line("open", "10:40:00", "/o3")).expect("write");
    let mut args = vec!["run", "--input", "day3.jsonl"];
    args.extend_from_slice(FIXTURE_JOB);
    run_in(job, &args);
    let all = std::fs::read_to_string(job.join("out.jsonl")).expect("out");
    let after: Vec<serde_json::Value> = all
        .strip_prefix(day1_out.as_str())
        .expect("day 1's committed output kept")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let got: Vec<String> = after
        .iter()
        .map(|r| {
            if r["retract"] == true {
                format!("retract {}", r["key"].as_str().unwrap_or("?"))
            } else {
                format!(
                    "{} {}..{} n {} rev {} {}",
                    r["key"].as_str().unwrap_or("?"),
                    &r["start"].as_str().unwrap_or("?")[11..16],
                    &r["end"].as_str().unwrap_or("?")[11..16],
                    r["event_count"],
                    r["revision"],
                    r["page"]
                )
            }
        })
        .collect();
    // Day 3: open@10:40 (W = 10:39) completes long (close 10:35) and a (10:37); the end
    // of input flushes open.
    assert_eq!(
        got,
        [
            "retract ek",
            r#"ek 10:14..10:15 n 2 rev 1 ["/e1","/e0"]"#,
            r#"new 10:13..10:13 n 1 rev 0 ["/n0"]"#,
            &format!(
                "long 08:00..10:25 n 30 rev 0 {}",
                serde_json::json!((0..30).map(|i| format!("/l{i}")).collect::<Vec<_>>())
            ),
            r#"a 10:12..10:27 n 3 rev 0 ["/a1","/a2","/a3"]"#,
            r#"open 10:25..10:40 n 4 rev 0 ["/o0","/o1","/o2","/o3"]"#,
        ]
    );
}
