//! `--state-backend rocksdb` end to end (docs/semantics.md S-36, issue 14): the real
//! binary on dirty generated input gives the memory backend's outputs byte for byte —
//! with and without lateness, with one and two workers, killed with SIGKILL at random
//! instants and restarted, resumed from a state directory the other backend wrote — while
//! a tiny `--state-memory` makes it keep most keys in RocksDB. The RocksDB tests need the
//! `rocksdb` feature; the option checks run in every build.

#[path = "support/outputs.rs"]
mod outputs;
#[path = "support/process.rs"]
mod process;

#[cfg(feature = "rocksdb")]
use outputs::{KillDelays, assert_same_outputs, done_fraction, run_or_kill, stats};
#[cfg(feature = "rocksdb")]
use process::run_ok;
use process::{run, s};
#[cfg(feature = "rocksdb")]
use std::path::Path;
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn state_memory_without_the_rocksdb_backend_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, "").expect("write");
    let out = tmp.path().join("out.jsonl");
    let o = run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--state-memory",
        "512MB",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--state-memory") && stderr(&o).contains("--state-backend rocksdb"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--state-backend",
        "rocksdb",
        "--state-memory",
        "lots",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("invalid --state-memory 'lots'"),
        "{}",
        stderr(&o)
    );
}

#[cfg(not(feature = "rocksdb"))]
#[test]
fn without_the_feature_the_rocksdb_backend_says_how_to_build_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, "").expect("write");
    let o = run(&[
        "run",
        "--input",
        s(&input),
        "--output",
        s(&tmp.path().join("out.jsonl")),
        "--state-backend",
        "rocksdb",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--features rocksdb"), "{}", stderr(&o));
}

/// Generates dirty visits: out of order, late, duplicated and invalid lines.
#[cfg(feature = "rocksdb")]
fn generate(path: &Path, events: u64, keys: u64, seed: u64) {
    process::generate_with(path, events, keys, seed, &process::LIGHTLY_DIRTY);
}

/// The job: an aggregate whose order depends on input sequence numbers, dedup.
#[cfg(feature = "rocksdb")]
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
    "--progress",
    "never",
];

/// A budget of a few thousand keys: most of the job's keys live in RocksDB.
#[cfg(feature = "rocksdb")]
const TINY: &[&str] = &["--state-backend", "rocksdb", "--state-memory", "1MB"];

/// Runs the job over `input` into `dir` (outputs, stats) with `extra` options.
#[cfg(feature = "rocksdb")]
fn job(input: &[&Path], dir: &Path, extra: &[&str]) -> Output {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut args: Vec<String> = vec!["run".into()];
    for i in input {
        args.extend(["--input".into(), s(i).into()]);
    }
    args.extend(["--output".into(), s(&dir.join("out.jsonl")).into()]);
    args.extend(["--stats-file".into(), s(&dir.join("stats.json")).into()]);
    args.extend(JOB.iter().map(|a| a.to_string()));
    args.extend(extra.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    run_ok(&argv)
}

/// Asserts that the run kept many keys in RocksDB and took them back.
#[cfg(feature = "rocksdb")]
fn assert_spilled(stats_file: &Path, at_least: u64) {
    let st = stats(stats_file);
    let store = &st["state_store"];
    let evicted = store["evicted"].as_u64().unwrap_or(0);
    assert!(
        evicted >= at_least && store["unspilled"].as_u64().unwrap_or(0) > 0,
        "the run should have spilled at least {at_least} keys: {st}"
    );
    assert!(store["spilled_keys_max"].as_u64().unwrap_or(0) > 0, "{st}");
}

#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_gives_the_memory_backends_output_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 150_000, 20_000, 7);
    for lateness in ["0s", "5m"] {
        for workers in ["1", "2"] {
            let common = ["--allowed-lateness", lateness, "--workers", workers];
            let name = format!("l{lateness}-w{workers}");
            let want = tmp.path().join(format!("memory-{name}"));
            job(&[&input], &want, &common);
            let got = tmp.path().join(format!("rocksdb-{name}"));
            let mut extra = common.to_vec();
            extra.extend_from_slice(TINY);
            job(&[&input], &got, &extra);
            assert_same_outputs(&got, &want);
            assert_spilled(&got.join("stats.json"), 10_000);
            let spill_dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
                .expect("tmp")
                .filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("sessionizer-spill-{}-", std::process::id()))
                })
                .collect();
            assert!(
                spill_dirs.is_empty(),
                "a temporary spill directory was left"
            );
        }
    }
}

/// A checkpointed job on the rocksdb backend, killed with SIGKILL at random instants
/// (a random number of workers each time) and restarted until a run finishes, gives
/// the outputs of one uninterrupted run on the memory backend. Its checkpoints are
/// taken while most keys are in RocksDB: bases read them back, deltas carry those
/// evicted since they changed.
#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_killed_at_random_instants_and_restarted_gives_the_uninterrupted_output() {
    use rand::{Rng, SeedableRng};
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    let events: u64 = std::env::var("SESSIONIZER_CRASH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    generate(&input, events, 20_000, 11);
    let want = tmp.path().join("want");
    let started = Instant::now();
    job(&[&input], &want, &["--allowed-lateness", "5m"]);
    let took = started.elapsed();

    let mut rng = rand_pcg::Pcg64::seed_from_u64(20_261_201);
    let got = tmp.path().join("got");
    std::fs::create_dir_all(&got).expect("mkdir");
    let log_path = tmp.path().join("runs.log");
    let (mut kills, mut runs) = (0u32, 0u32);
    let mut progress: Vec<f64> = Vec::new();
    // The rocksdb runs take longer than the memory run measured: a run gets a share of
    // half that time, more after a run without progress, less near the end
    // (KillDelays).
    let mut delays = KillDelays::new(took, took / 2, 12);
    loop {
        let done = done_fraction(&got.join("state"), events);
        progress.push(done);
        runs += 1;
        assert!(
            runs <= 300,
            "no run finished after {runs} restarts; see {}",
            log_path.display()
        );
        let delay = if kills >= 12 && done > 0.3 {
            // Enough kills, and they fell while the job was under way: let it finish.
            Duration::from_secs(3600)
        } else {
            delays.next(done, kills, &mut rng)
        };
        let workers = rng.random_range(1..=3u32).to_string();
        let mut args: Vec<String> = vec![
            "run".into(),
            "--input".into(),
            s(&input).into(),
            "--output".into(),
            s(&got.join("out.jsonl")).into(),
            "--state-dir".into(),
            s(&got.join("state")).into(),
            "--stats-file".into(),
            s(&got.join("stats.json")).into(),
            "--allowed-lateness".into(),
            "5m".into(),
            "--checkpoint-interval".into(),
            "20ms".into(),
            "--workers".into(),
            workers,
        ];
        args.extend(JOB.iter().map(|a| a.to_string()));
        args.extend(TINY.iter().map(|a| a.to_string()));
        match run_or_kill(&args, &log_path, delay) {
            Some(status) if status.success() => break,
            Some(status) => panic!(
                "run {runs} failed ({status}); log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            ),
            None => kills += 1,
        }
    }
    assert!(kills >= 12, "only {kills} kills before the job finished");
    let percent: Vec<String> = progress
        .iter()
        .map(|d| format!("{:.0}%", d * 100.0))
        .collect();
    eprintln!(
        "rocksdb crash test: {events} events, {kills} kills in {runs} runs; done at each start: {}",
        percent.join(" ")
    );
    // The kills fell while the job was under way, not all before its first checkpoint.
    let advanced = progress.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        advanced >= 4 && progress.iter().any(|&d| d > 0.3),
        "the killed runs made too little progress: {percent:?}"
    );
    assert_same_outputs(&got, &want);
    let (g, w) = (
        stats(&got.join("stats.json")),
        stats(&want.join("stats.json")),
    );
    for k in [
        "records_read",
        "in_sessions",
        "duplicates",
        "late",
        "invalid",
        "sessions_emitted",
        "retractions",
    ] {
        assert_eq!(g[k], w[k], "{k}");
    }
}

/// The two backends write the same checkpoint files: a state directory kept open by a
/// memory run continues on rocksdb (and back), `inspect` reads it, and the result
/// equals one run over both inputs.
#[cfg(feature = "rocksdb")]
#[test]
fn a_state_directory_continues_on_the_other_backend_and_inspect_reads_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 120_000, 20_000, 5);
    let text = std::fs::read_to_string(&input).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    let (a, b, c) = (
        tmp.path().join("a.jsonl"),
        tmp.path().join("b.jsonl"),
        tmp.path().join("c.jsonl"),
    );
    let third = lines.len() / 3;
    for (path, part) in [
        (&a, &lines[..third]),
        (&b, &lines[third..2 * third]),
        (&c, &lines[2 * third..]),
    ] {
        std::fs::write(path, part.join("\n") + "\n").expect("write");
    }
    let want = tmp.path().join("want");
    job(&[&a, &b, &c], &want, &[]);

    let got = tmp.path().join("got");
    let state = got.join("state");
    let durable = |input: &Path, extra: &[&str]| {
        let mut args = vec!["--state-dir", s(&state)];
        args.extend_from_slice(extra);
        job(&[input], &got, &args)
    };
    durable(&a, &["--keep-open"]);
    let mut on_rocksdb = vec!["--keep-open", "--workers", "2"];
    on_rocksdb.extend_from_slice(TINY);
    durable(&b, &on_rocksdb);
    assert_spilled(&got.join("stats.json"), 1_000);
    // inspect reads the checkpoint a rocksdb run wrote: the open sessions of all keys,
    // most of which were in RocksDB when it was taken.
    let shown = run_ok(&["inspect", "--state-dir", s(&state), "--json", "--keys"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    let keys = shown["sessions"].as_array().map_or(0, Vec::len);
    assert!(keys > 5_000, "inspect shows {keys} keys");
    durable(&c, &[]);
    assert_same_outputs(&got, &want);
}

/// Splits the lines of `input` into `parts` files of about equal length in `dir`.
#[cfg(feature = "rocksdb")]
fn split(input: &Path, parts: usize, dir: &Path) -> Vec<std::path::PathBuf> {
    let text = std::fs::read_to_string(input).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    let per = lines.len().div_ceil(parts);
    lines
        .chunks(per)
        .enumerate()
        .map(|(i, part)| {
            let path = dir.join(format!("part{i}.jsonl"));
            std::fs::write(&path, part.join("\n") + "\n").expect("write");
            path
        })
        .collect()
}

/// A rocksdb base keeps each worker's store as a RocksDB checkpoint in the state
/// directory (docs/semantics.md S-36: incremental checkpoints from RocksDB's own): a run
/// with as many workers starts its stores from those copies (hard links, no key read or
/// written), one with another number reads their keys; `inspect` lists them; and every
/// way gives one uninterrupted memory run's outputs.
#[cfg(feature = "rocksdb")]
#[test]
fn a_rocksdb_base_keeps_the_stores_and_a_restart_with_as_many_workers_links_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("visits.jsonl");
    generate(&input, 150_000, 20_000, 17);
    let parts = split(&input, 4, tmp.path());
    let want = tmp.path().join("want");
    let all: Vec<&Path> = parts.iter().map(|p| p.as_path()).collect();
    job(&all, &want, &["--allowed-lateness", "5m"]);

    let got = tmp.path().join("got");
    let state = got.join("state");
    let continued = |part: &Path, workers: &str, last: bool| {
        let mut args = vec![
            "--state-dir",
            s(&state),
            "--allowed-lateness",
            "5m",
            "--workers",
            workers,
            // Bases and deltas within a part.
            "--checkpoint-every-records",
            "10000",
        ];
        if !last {
            args.push("--keep-open");
        }
        args.extend_from_slice(TINY);
        job(&[part], &got, &args);
        stats(&got.join("stats.json"))
    };
    continued(&parts[0], "2", false);
    assert_spilled(&got.join("stats.json"), 1_000);
    let manifest = newest_manifest(&state);
    let stores = manifest["base"]["stores"].as_array().expect("stores");
    assert_eq!(stores.len(), 2, "{manifest}");
    let in_stores: u64 = stores.iter().map(|s| s["keys"].as_u64().unwrap_or(0)).sum();
    assert!(in_stores > 5_000, "{manifest}");
    for (i, store) in stores.iter().enumerate() {
        let dir = state.join(store["dir"].as_str().expect("dir"));
        assert!(dir.ends_with(format!("shard-{i}")), "{}", dir.display());
        let tables = store["files"]
            .as_array()
            .expect("files")
            .iter()
            .filter(|f| f["name"].as_str().is_some_and(|n| n.ends_with(".sst")))
            .count();
        assert!(tables > 0 && dir.join("CURRENT").is_file(), "{store}");
    }
    // inspect reads the store copies' keys too.
    let shown = run_ok(&["inspect", "--state-dir", s(&state), "--json", "--keys"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    let listed = shown["sessions"].as_array().map_or(0, Vec::len) as u64;
    assert_eq!(
        Some(listed),
        manifest["keys"].as_u64(),
        "inspect lists every key"
    );

    // As many workers: the stores start as the copies.
    let st = continued(&parts[1], "2", false);
    let linked = st["checkpoints"]["restore_keys_linked"]
        .as_u64()
        .unwrap_or(0);
    assert!(linked > 5_000, "{st}");
    // Bases after the first write only the table files that are new.
    let new_bytes = st["checkpoints"]["store_bytes_new"].as_u64().unwrap_or(0);
    assert!(new_bytes > 0, "{st}");
    // Another number of workers reads the copies' keys into its shards.
    let st = continued(&parts[2], "3", false);
    assert_eq!(st["checkpoints"]["restore_keys_linked"], 0, "{st}");
    let st = continued(&parts[3], "3", true);
    assert!(
        st["checkpoints"]["restore_keys_linked"]
            .as_u64()
            .unwrap_or(0)
            > 1_000,
        "{st}"
    );
    assert_same_outputs(&got, &want);
}

/// The newest manifest of a state directory, as JSON (its payload starts after the
/// 24-byte frame header and ends before the 4-byte checksum).
#[cfg(feature = "rocksdb")]
fn newest_manifest(state: &Path) -> serde_json::Value {
    let newest = std::fs::read_dir(state)
        .expect("read")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("manifest-"))
        .max()
        .expect("a manifest");
    let bytes = std::fs::read(state.join(newest)).expect("read");
    serde_json::from_slice(&bytes[24..bytes.len() - 4]).expect("manifest json")
}
