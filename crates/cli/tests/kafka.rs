//! Kafka end to end (docs/semantics.md K-1 to K-7): the real binary against a
//! real Apache Kafka broker started by `scripts/kafka-dev.sh`. The property checked
//! everywhere: what a `read_committed` reader finds in each output partition equals,
//! byte for byte in the values, what `sessionizer run` writes for the records of the
//! matching input partition read from a file in offset order.

#![cfg(feature = "kafka")]

#[path = "support/kafka.rs"]
mod kafka;
#[path = "support/kafka_runs.rs"]
mod kafka_runs;
#[path = "support/process.rs"]
mod process;

use kafka::{
    broker, high_watermarks, last_stable_offsets, produce_lines, read_committed, text, unique,
};
use kafka_runs::{
    OPTIONS, Topics, as_strs, assert_adds_up, assert_matches_file_runs, final_sessions, stats_of,
    stats_of_counters,
};
use process::{bin, generate, run, run_ok, s, signal};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn kafka_output_per_partition_equals_the_file_run_of_each_partition_with_two_workers() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 20_000, 7);
    let t = Topics::new(4);
    let produced = produce_lines(&t.input, &data, "visit_id");
    let stats = dir.path().join("stats.json");
    let mut args = t.args();
    // Two threads share the four tasks (the other tests run with one).
    args.extend(
        [
            "--stop-at-end",
            "--workers",
            "2",
            "--checkpoint-interval",
            "300ms",
            "--stats-file",
            s(&stats),
        ]
        .map(String::from),
    );
    run_ok(&as_strs(&args));
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
    let stats = stats_of(&stats);
    assert_adds_up(&stats, records);
    assert_eq!(
        stats["kafka"]["job"],
        stats_of_counters(&stats),
        "one process held the whole job"
    );
    assert!(
        stats["retractions"].as_u64() > Some(0),
        "the data has retractions: {stats}"
    );
    assert!(
        stats["late"].as_u64() > Some(0),
        "the data has late events: {stats}"
    );
    assert!(
        stats["invalid"].as_u64() > Some(0),
        "the data has invalid records: {stats}"
    );

    // Run again: everything was read and committed, so nothing more is written.
    let before = read_committed(&t.output)
        .iter()
        .map(Vec::len)
        .sum::<usize>();
    run_ok(&as_strs(&args));
    let after = read_committed(&t.output)
        .iter()
        .map(Vec::len)
        .sum::<usize>();
    assert_eq!(before, after, "a finished job run again writes nothing");

    // An aborted transaction on the input after the end: its records and marker take
    // offsets but are not records. A run goes past them without complaint, and so does
    // the next one (the committed offsets and the changelogs still agree).
    kafka::produce_aborted(&t.input, 4, 3);
    run_ok(&as_strs(&args));
    run_ok(&as_strs(&args));
    let again = read_committed(&t.output)
        .iter()
        .map(Vec::len)
        .sum::<usize>();
    assert_eq!(before, again, "aborted input records are never read");
}

/// Produces `data` into `t.input` over `over` while the job (its options and `extra`)
/// runs and is killed again and again, each run `kill_ms` after its start and at least
/// `kills` times (so the number of kills does not depend on how fast the machine is);
/// then a run with --stop-at-end finishes the job. Checks that each output partition
/// is the file run of its input partition and returns the last run's stats.
fn killed_while_producing(
    t: &Topics,
    dir: &Path,
    data: &Path,
    over: Duration,
    extra: &[&str],
    (seed, kills, kill_ms): (u64, usize, std::ops::Range<u64>),
) -> serde_json::Value {
    let producer = {
        let (topic, data) = (t.input.clone(), data.to_path_buf());
        std::thread::spawn(move || kafka::produce_lines_paced(&topic, &data, "visit_id", over))
    };
    let stats = dir.join("stats.json");
    let mut live = t.args();
    live.extend(
        [
            "--checkpoint-interval",
            "100ms",
            "--kafka-instance-id",
            "worker-1",
        ]
        .iter()
        .chain(extra)
        .map(|a| a.to_string()),
    );
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut killed = 0;
    while !producer.is_finished() || killed < kills {
        let after = Duration::from_millis(rng.random_range(kill_ms.clone()));
        assert!(run_then_kill(&live, after), "a live run ended by itself");
        killed += 1;
    }
    let produced = producer.join().expect("producer");
    let mut last = live.clone();
    last.extend(["--stop-at-end", "--stats-file", s(&stats)].map(String::from));
    run_ok(&as_strs(&last));
    let records = assert_matches_file_runs(t, dir, 4);
    assert_eq!(records as usize, produced);
    // The last run reports the job's accounting, carried in the changelogs across
    // every killed process, beside its own share.
    let stats = stats_of(&stats);
    assert_adds_up(&stats["kafka"]["job"], records);
    stats
}

#[test]
fn killed_at_random_instants_and_restarted_the_committed_output_is_the_uninterrupted_one() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 60_000, 11);
    let t = Topics::new(4);
    let over = Duration::from_secs(12);
    let stats = killed_while_producing(&t, dir.path(), &data, over, &[], (2024, 10, 300..1300));
    assert_eq!(
        stats["kafka"]["partitions"].as_array().map(Vec::len),
        Some(4)
    );
}

/// `--state-backend rocksdb` on Kafka tasks with a budget that holds few keys: most
/// keys of every task live in its RocksDB store, every restart restores the tasks from
/// their changelogs (or local snapshots, written with the spilled keys) into new
/// stores, and killed at random instants the committed output is still the file run's
/// of each partition.
#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_tasks_killed_and_restarted_give_the_memory_backends_output() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 30_000, 13);
    let t = Topics::new(4);
    let state = dir.path().join("state");
    let extra = [
        "--state-backend",
        "rocksdb",
        "--state-memory",
        "64KB",
        "--state-dir",
        s(&state),
        "--snapshot-interval",
        "300ms",
    ];
    let over = Duration::from_secs(6);
    let stats = killed_while_producing(&t, dir.path(), &data, over, &extra, (77, 5, 500..1500));
    let store = &stats["state_store"];
    assert!(
        store["evicted"].as_u64() > Some(1_000) && store["spilled_keys_max"].as_u64() > Some(100),
        "most keys went to RocksDB: {stats}"
    );
}

#[test]
fn a_second_process_joining_the_group_takes_partitions_with_their_state() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 60_000, 13);
    let t = Topics::new(4);
    let produced = produce_lines(&t.input, &data, "visit_id");
    let mut args = t.args();
    args.extend(["--checkpoint-interval", "100ms"].map(String::from));
    let stats: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("stats-{i}.json")))
        .collect();
    // The first process never finishes a partition by itself (no --stop-at-end: its
    // sessions stay open at the end of its input), however fast it reads; it leaves
    // (SIGTERM) once the second is in, and the second, which stops at the end, takes
    // every partition over with its state.
    let spawn = |i: usize| {
        let mut a = args.clone();
        if i == 1 {
            a.push("--stop-at-end".to_string());
        }
        a.extend(["--stats-file".to_string(), s(&stats[i]).to_string()]);
        bin()
            .args(as_strs(&a))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let first = spawn(0);
    std::thread::sleep(Duration::from_millis(1500));
    let second = spawn(1);
    std::thread::sleep(Duration::from_millis(1500));
    signal(&first, "-TERM");
    for child in [first, second] {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
    // Each process reports its share of the job; together they are the job.
    let mut sum = 0;
    for p in &stats {
        let st = stats_of(p);
        assert_adds_up(&st, st["records_read"].as_u64().expect("records_read"));
        sum += st["records_read"].as_u64().expect("records_read");
    }
    assert_eq!(
        sum, records,
        "the processes' accounting adds up to the input"
    );
    let second = stats_of(&stats[1]);
    assert!(
        second["kafka"]["restored_keys"].as_u64() > Some(0),
        "{second}"
    );
}

#[test]
fn a_missing_topic_an_unreachable_broker_and_a_lost_changelog_are_clear_errors() {
    let _one_at_a_time = kafka::exclusive();
    // A topic that does not exist.
    let out = run(&[
        "run",
        "--kafka-brokers",
        broker(),
        "--kafka-topic",
        &unique("nope"),
        "--kafka-group",
        "g",
        "--stop-at-end",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not exist") && err.contains("create it first"),
        "{err}"
    );

    // Nothing listens there.
    let out = run(&[
        "run",
        "--kafka-brokers",
        "127.0.0.1:1",
        "--kafka-topic",
        "visits",
        "--kafka-timeout",
        "2s",
        "--stop-at-end",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the Kafka brokers at 127.0.0.1:1"),
        "{err}"
    );

    // A job whose changelog was deleted cannot go on as if it had no state.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 2_000, 5);
    let t = Topics::new(2);
    produce_lines(&t.input, &data, "visit_id");
    let mut args = t.args();
    args.extend(["--stop-at-end", "--keep-open"].map(String::from));
    run_ok(&as_strs(&args));
    kafka::delete_topic(&format!("{}-{}-changelog", t.group, t.input));
    std::thread::sleep(Duration::from_millis(500));
    let out = run(&as_strs(&args));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds no state") && err.contains("new --kafka-group"),
        "{err}"
    );
}

/// Waits for a child; its stderr on failure.
fn wait_ok(child: std::process::Child, what: &str) {
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn three_processes_one_killed_one_restarted_give_the_single_process_output() {
    three_processes_one_killed_one_restarted(&[]);
}

/// The same with every assignment and revocation preceded by an aborted transaction
/// (the commit a rebalance fences): every task rewinds in the middle of each hand-over.
#[cfg(feature = "fault-injection")]
#[test]
fn three_processes_with_a_commit_aborted_at_every_rebalance_give_the_single_process_output() {
    three_processes_one_killed_one_restarted(&[(ABORT_ON_REBALANCE, "1")]);
}

/// The same with every fifth commit that runs while the process goes on with its next
/// round aborted (a test hook, 200 ms into the commit): the round processed meanwhile
/// is dropped with the transaction, and both are done again.
#[cfg(feature = "fault-injection")]
#[test]
fn three_processes_with_commits_aborted_while_the_next_round_runs_give_the_single_process_output() {
    let aborts = three_processes_one_killed_one_restarted(&[(REFUSE_COMMIT_EVERY, "5")]);
    assert!(aborts > 0, "no commit was aborted");
}

/// The test hook that aborts the open transaction at each rebalance (cargo feature
/// `fault-injection`).
#[cfg(feature = "fault-injection")]
const ABORT_ON_REBALANCE: &str = "SESSIONIZER_TEST_ABORT_ON_REBALANCE";

/// The test hook that aborts every Nth commit running in the background (cargo feature
/// `fault-injection`).
#[cfg(feature = "fault-injection")]
const REFUSE_COMMIT_EVERY: &str = "SESSIONIZER_TEST_REFUSE_COMMIT_EVERY";

/// Runs the three processes (with `env`) and checks their outputs and accounts;
/// returns how many transactions the processes that ended cleanly aborted.
fn three_processes_one_killed_one_restarted(env: &[(&str, &str)]) -> u64 {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 300_000, 17);
    let t = Topics::new(4);
    let produced = produce_lines(&t.input, &data, "visit_id");
    let base = {
        let mut a = t.args();
        a.extend(["--checkpoint-interval", "100ms"].map(String::from));
        a
    };
    // Only the restarted process stops at the end. The others never finish a
    // partition by themselves (its sessions emitted at its end), so however fast they
    // read, every hand-over below moves partitions whose sessions are still open.
    let spawn = |id: &str, stats: &Path| {
        let mut a = base.clone();
        if stats.ends_with("stats-3.json") {
            a.push("--stop-at-end".to_string());
        }
        a.extend(["--kafka-instance-id", id, "--stats-file", s(stats)].map(String::from));
        bin()
            .args(as_strs(&a))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let stats: Vec<PathBuf> = (0..4)
        .map(|i| dir.path().join(format!("stats-{i}.json")))
        .collect();
    // Three processes started at different times; the second is killed with SIGKILL
    // mid-run, the third stopped (SIGTERM: it commits what it did and leaves) and
    // started again.
    let a = spawn("a", &stats[0]);
    std::thread::sleep(Duration::from_millis(800));
    let mut b = spawn("b", &stats[1]);
    std::thread::sleep(Duration::from_millis(800));
    let mut c = spawn("c", &stats[2]);
    std::thread::sleep(Duration::from_millis(1500));
    b.kill().expect("kill -9 b");
    b.wait().expect("reap b");
    std::thread::sleep(Duration::from_millis(300));
    if c.try_wait().expect("wait").is_some() {
        let out = c.wait_with_output().expect("c's output");
        panic!(
            "c ended before it was stopped ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    signal(&c, "-TERM");
    wait_ok(c, "process c, stopped with SIGTERM");
    let stopped = stats_of(&stats[2]);
    assert_eq!(stopped["stopped"], true, "{stopped}");
    assert_adds_up(
        &stopped,
        stopped["records_read"].as_u64().expect("records_read"),
    );
    let c2 = spawn("c", &stats[3]);
    // a leaves too (SIGTERM) once c is back: c then holds every partition and ends
    // when each is finished.
    std::thread::sleep(Duration::from_millis(1000));
    signal(&a, "-TERM");
    wait_ok(a, "process a, stopped with SIGTERM");
    wait_ok(c2, "process c, restarted");
    // A group member that dies keeps its partitions until its session times out; the
    // survivors then take them over from the changelog.
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
    // Every partition's accounting, carried in its changelog's progress record across
    // every process that held it (killed ones too), adds up to its input; the process
    // that ended last held every partition and reports the same counters; each
    // process's own share adds up.
    let by_partition = changelog_counters(&t);
    assert_eq!(by_partition.len(), 4, "{by_partition:?}");
    let last = stats_of(&stats[3]);
    let held = last["kafka"]["job_by_partition"]
        .as_object()
        .expect("by partition");
    assert_eq!(held.len(), 4, "{last}");
    for (p, c) in held {
        assert_eq!(Some(c), by_partition.get(p), "partition {p}: two accounts");
    }
    for st in [stats_of(&stats[0]), last] {
        assert_adds_up(&st, st["records_read"].as_u64().expect("records_read"));
    }
    assert_eq!(stats_of(&stats[0])["stopped"], true);
    let aborts = [&stats[0], &stats[2], &stats[3]]
        .map(|p| stats_of(p)["kafka"]["aborts"].as_u64().expect("aborts"))
        .iter()
        .sum();
    let mut sum = serde_json::json!({});
    for k in [
        "records_read",
        "in_sessions",
        "duplicates",
        "late",
        "invalid",
    ] {
        sum[k] = by_partition
            .values()
            .map(|c| c[k].as_u64().expect("counter"))
            .sum::<u64>()
            .into();
    }
    assert_adds_up(&sum, records);
    aborts
}

/// Each task's counters from the last progress record of its changelog partition, by
/// `topic/partition`.
fn changelog_counters(t: &Topics) -> BTreeMap<String, serde_json::Value> {
    let changelog = read_committed(&format!("{}-{}-changelog", t.group, t.input));
    let mut out = BTreeMap::new();
    for (p, records) in changelog.iter().enumerate() {
        let meta = records
            .iter()
            .rev()
            .find(|r| r.key.as_deref() == Some(b"m".as_slice()))
            .and_then(|r| r.value.as_deref())
            .expect("a progress record");
        let meta: serde_json::Value = serde_json::from_slice(meta).expect("progress JSON");
        out.insert(format!("{}/{p}", t.input), meta["counters"].clone());
    }
    out
}

/// Runs `args` and kills it (SIGKILL) after `after`, unless it ends first.
fn run_then_kill(args: &[String], after: Duration) -> bool {
    let began = Instant::now();
    run_until_then_kill(args, || began.elapsed() >= after)
}

/// Runs `args` and kills it (SIGKILL) once `until` holds (asked every 20 ms, for at
/// most a minute), unless it ends first.
fn run_until_then_kill(args: &[String], until: impl Fn() -> bool) -> bool {
    let mut child = bin()
        .args(as_strs(args))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let began = Instant::now();
    while !until() {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the condition did not hold within a minute"
        );
        if child.try_wait().expect("wait").is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    true
}

/// The committed records of a job's changelog, per partition.
fn changelog_records(t: &Topics) -> Vec<usize> {
    read_committed(&format!("{}-{}-changelog", t.group, t.input))
        .iter()
        .map(Vec::len)
        .collect()
}

#[test]
fn a_restart_with_state_dir_reads_only_the_changelog_tail_after_its_snapshot() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 60_000, 19);
    let t = Topics::new(4);
    let produced = produce_lines(&t.input, &data, "visit_id");
    let state = dir.path().join("state");
    let stats = dir.path().join("stats.json");
    // The runs that are killed read without --stop-at-end: they never end by
    // themselves (a run that reached its end could otherwise finish between the test's
    // check and its kill); the last run stops at the end.
    let mut plain = t.args();
    plain.extend(
        [
            "--checkpoint-interval",
            "100ms",
            "--kafka-instance-id",
            "w",
            "--stats-file",
            s(&stats),
        ]
        .map(String::from),
    );
    let mut with_dir = plain.clone();
    with_dir.extend(["--state-dir", s(&state), "--snapshot-interval", "200ms"].map(String::from));

    // Killed with snapshots written, then killed again running without them: the
    // snapshots are now behind the changelog, which a restart must read on from.
    let snapshots = || {
        std::fs::read_dir(&state).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".snap"))
            })
            .count()
        })
    };
    let mut child = bin()
        .args(as_strs(&with_dir))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let began = Instant::now();
    while snapshots() < 4 {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "no snapshots written"
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "ran to its end too fast"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    assert_eq!(snapshots(), 4, "one snapshot per task");
    let full = changelog_records(&t);
    // Killed as soon as it has committed changelog records after the snapshots' (a
    // fixed delay let a fast machine finish first): the changelog's last stable offsets
    // pass its ends before the run (the killed run's open transaction included) plus
    // the abort markers that fencing it writes, at most one per partition.
    let changelog = format!("{}-{}-changelog", t.group, t.input);
    let before: i64 = high_watermarks(&changelog, 4).iter().sum::<i64>() + 4;
    assert!(
        run_until_then_kill(&plain, || {
            last_stable_offsets(&changelog, 4).iter().sum::<i64>() > before
        }),
        "ran to its end too fast"
    );
    let st = stats_of_or_none(&stats);
    assert!(st.is_none(), "a killed run writes no stats");

    // Without the directory every task is restored from its whole changelog.
    let full_now = changelog_records(&t);
    let mut last = with_dir.clone();
    last.push("--stop-at-end".to_string());
    run_ok(&as_strs(&last));
    let st = stats_of(&stats);
    let restores = st["kafka"]["restores"]
        .as_array()
        .expect("restores")
        .clone();
    assert_eq!(restores.len(), 4, "{st}");
    let mut tail = 0;
    for r in &restores {
        assert_eq!(r["source"], "snapshot", "{r}");
        tail += r["changelog_records"].as_u64().expect("records");
    }
    let total: usize = full_now.iter().sum();
    assert!(
        (tail as usize) < total,
        "the snapshot restore read {tail} changelog records of {total}"
    );
    assert!(
        (tail as usize) >= full_now.iter().sum::<usize>() - full.iter().sum::<usize>(),
        "it read at least what the run without snapshots added: {tail} vs {full:?} -> {full_now:?}"
    );
    let records = assert_matches_file_runs(&t, dir.path(), 4);
    assert_eq!(records as usize, produced);
}

fn stats_of_or_none(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

#[test]
fn a_standby_takes_over_a_killed_owners_partitions_without_a_full_restore() {
    standby_takes_over(&[]);
}

/// The same with a transaction aborted at every assignment and revocation: the
/// survivor's own tasks rewind from their changelogs while it takes over the dead
/// owner's partitions from its copies.
#[cfg(feature = "fault-injection")]
#[test]
fn a_standby_takes_over_with_a_commit_aborted_at_every_rebalance() {
    standby_takes_over(&[(ABORT_ON_REBALANCE, "1")]);
}

fn standby_takes_over(env: &[(&str, &str)]) {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 200_000, 23);
    let t = Topics::new(4);
    let produced = produce_lines(&t.input, &data, "visit_id");
    let stats = dir.path().join("stats-b.json");
    // a reads without --stop-at-end: it never emits its partitions' sessions at their
    // end, so however fast it reads, the partitions it holds when it is killed are b's
    // to take over (b, which stops at the end, ends only once every partition was
    // finished by its owner).
    let args = |id: &str| {
        let mut a = t.args();
        if id == "b" {
            a.push("--stop-at-end".to_string());
        }
        a.extend(
            [
                "--checkpoint-interval",
                "100ms",
                "--standby-replicas",
                "1",
                "--kafka-instance-id",
                id,
                "--kafka-config",
                "session.timeout.ms=6000",
            ]
            .map(String::from),
        );
        a
    };
    // a runs alone until it has committed state for its partitions; b joins, takes
    // half of them and follows the changelogs of a's other half; then a is killed.
    let mut a = bin()
        .args(as_strs(&args("a")))
        .envs(env.iter().copied())
        .env("RUST_LOG", "sessionizer=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a");
    let a_log = LogLines::of(a.stderr.take().expect("stderr"));
    a_log.wait_for(|l| l.contains("partitions assigned"), "a joined");
    std::thread::sleep(Duration::from_millis(1000));
    let mut b_args = args("b");
    b_args.extend(["--stats-file".to_string(), s(&stats).to_string()]);
    let mut b = bin()
        .args(as_strs(&b_args))
        .envs(env.iter().copied())
        .env("RUST_LOG", "sessionizer=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn b");
    let b_log = LogLines::of(b.stderr.take().expect("stderr"));
    b_log.wait_for(
        |l| l.contains("standby copies followed") && !l.contains("changelogs=[]"),
        "b followed a's changelogs",
    );
    b_log.wait_for(
        |l| l.contains("standby copies updated"),
        "b's copies got records",
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        a.try_wait().expect("wait").is_none(),
        "a ended before it could be killed"
    );
    a.kill().expect("kill -9 a");
    a.wait().expect("reap a");
    let a_log = a_log.rest();
    let status = b.wait().expect("wait b");
    let log = b_log.rest();
    assert!(status.success(), "process b failed: {log}");
    // Both logs on failure, and the failure last: a long log must not hide it.
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_takeover(&t, dir.path(), &stats, produced, !env.is_empty());
    }));
    if let Err(failure) = checked {
        eprintln!(
            "a's log:\n{a_log}\n\nb's log:\n{log}\nb's stats: {}",
            std::fs::read_to_string(&stats).unwrap_or_default()
        );
        let why = failure
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| failure.downcast_ref::<&str>().copied())
            .unwrap_or("(not a message)");
        eprintln!("the failure, again: {why}");
        std::panic::resume_unwind(failure);
    }
}

/// What a finished takeover must show: each partition's file run, and b's stats.
fn check_takeover(t: &Topics, dir: &Path, stats: &Path, produced: usize, aborted: bool) {
    let records = assert_matches_file_runs(t, dir, 4);
    assert_eq!(records as usize, produced);
    let st = stats_of(stats);
    assert_eq!(
        st["kafka"]["partitions"].as_array().map(Vec::len),
        Some(4),
        "{st}"
    );
    assert!(st["kafka"]["standby_records"].as_u64() > Some(0), "{st}");
    if aborted {
        // b's assignments (at its start and at the takeover) were each preceded by an
        // aborted transaction, and its own tasks then rewound from their changelogs.
        assert!(st["kafka"]["aborts"].as_u64() >= Some(2), "{st}");
    }
    let restores = st["kafka"]["restores"].as_array().expect("restores");
    let from_standby: Vec<&serde_json::Value> = restores
        .iter()
        .filter(|r| r["source"] == "standby")
        .collect();
    // A copy of a task that had state when its owner died was handed over with a
    // short tail to read (a partition b took over at its start may have had none yet).
    assert!(
        from_standby.iter().any(|r| r["keys"].as_u64() > Some(0)),
        "a's partitions came from b's copies: {st}"
    );
    // A full restore reads from the changelog's first record; a standby hands over
    // its copy and the read starts where the copy ends (how far behind the copy was
    // depends on how busy the machine is, so no fixed share is asserted).
    for r in from_standby {
        let read = r["changelog_records"].as_i64().expect("records");
        let from = r["changelog_from"].as_i64().expect("from");
        let end = r["changelog_end"].as_i64().expect("end");
        assert!(
            from > 0 && read <= end - from,
            "a standby restore reads only the tail after its copy: {r}"
        );
    }
}

/// A child's stderr, line by line, read on a thread of its own.
struct LogLines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: std::cell::RefCell<Vec<String>>,
}

impl LogLines {
    fn of(stream: std::process::ChildStderr) -> LogLines {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LogLines {
            rx,
            seen: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Waits (at most a minute) for a line that `matches`.
    fn wait_for(&self, matches: impl Fn(&str) -> bool, what: &str) {
        let began = Instant::now();
        loop {
            let left = Duration::from_secs(60).saturating_sub(began.elapsed());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = matches(&line);
                    self.seen.borrow_mut().push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!(
                    "never saw: {what}; the log: {}",
                    self.seen.borrow().join("\n")
                ),
            }
        }
    }

    /// Everything logged (waits for the stream to end).
    fn rest(&self) -> String {
        while let Ok(line) = self.rx.recv() {
            self.seen.borrow_mut().push(line);
        }
        self.seen.borrow().join("\n")
    }
}

/// A topic not partitioned by the session key gave wrong sessions with exit 0 (49,072
/// sessions for 25,615 visits). Now a task notices a record whose key no standard
/// partitioner puts in its partition and the job stops, naming --repartition, with
/// nothing committed; topics keyed by the Java client's murmur2 or librdkafka's CRC-32
/// pass, and --kafka-partitioner custom trusts the producer.
#[test]
fn an_input_not_keyed_by_the_session_key_stops_the_job_and_keyed_ones_pass() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 5000, 41);
    let run_job = |t: &Topics, extra: &[&str], stats: &Path| {
        let mut a = t.args();
        a.extend(["--stop-at-end", "--checkpoint-interval", "200ms"].map(String::from));
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend(["--stats-file".to_string(), s(stats).to_string()]);
        let out = run(&as_strs(&a));
        (out, stats_of(stats))
    };
    let random = Topics::new(2);
    kafka::produce_lines_unkeyed(&random.input, &data);
    let (out, st) = run_job(&random, &[], &dir.path().join("random.json"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not partitioned by the session key")
            && err.contains("--repartition")
            && err.contains("--kafka-partitioner custom")
            && err.contains(&format!("{}/", random.input)),
        "{err}"
    );
    let misplaced = st["kafka"]["records_misplaced"].as_u64().expect("counted");
    assert!(misplaced >= 1, "{st}");
    assert!(
        st["error"]
            .as_str()
            .is_some_and(|e| e.contains("--repartition")),
        "{st}"
    );
    assert!(
        read_committed(&random.output).iter().all(Vec::is_empty),
        "nothing of the refused batch was committed"
    );
    // Declared keyed by a custom partitioner, it is trusted.
    let (out, st) = run_job(
        &random,
        &["--kafka-partitioner", "custom"],
        &dir.path().join("custom.json"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(st["kafka"]["records_misplaced"].as_u64(), Some(0), "{st}");
    // Keyed by either standard partitioner: nothing misplaced.
    let murmur2 = Topics::new(3);
    let produced = produce_lines(&murmur2.input, &data, "visit_id");
    let crc32 = Topics::new(3);
    assert_eq!(
        kafka::produce_lines_crc32(&crc32.input, &data, "visit_id"),
        produced
    );
    assert_ne!(
        high_watermarks(&murmur2.input, 3),
        high_watermarks(&crc32.input, 3),
        "the two partitioners place the keys differently"
    );
    for (t, name) in [(&murmur2, "murmur2.json"), (&crc32, "crc32.json")] {
        let (out, st) = run_job(t, &[], &dir.path().join(name));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(st["kafka"]["records_misplaced"].as_u64(), Some(0), "{st}");
        assert_adds_up(&st["kafka"]["job"], produced as u64);
    }
}

/// A message longer than --max-record-size is a dead letter with its length and first
/// bytes, as a line of a file is.
#[test]
fn a_message_above_the_record_size_limit_is_a_dead_letter() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    let big = format!(
        "{{\"visit_id\":\"big\",\"event_time\":\"2024-01-01T00:00:00Z\",\"page\":\"{}\"}}",
        "p".repeat(5000)
    );
    std::fs::write(
        &data,
        format!("{{\"visit_id\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\"}}\n{big}\n"),
    )
    .expect("write");
    let t = Topics::new(1);
    produce_lines(&t.input, &data, "visit_id");
    let mut a = t.args();
    a.extend(["--stop-at-end", "--max-record-size", "4KB"].map(String::from));
    run_ok(&as_strs(&a));
    let dead: Vec<serde_json::Value> = read_committed(&t.dead)
        .iter()
        .flatten()
        .map(|r| serde_json::from_str(&text(r)).expect("JSON"))
        .collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["source"], format!("{}/0@1", t.input));
    let reason = dead[0]["reason"].as_str().expect("reason");
    assert!(reason.contains(&format!("{} bytes", big.len())), "{reason}");
    assert_eq!(dead[0]["raw"].as_str(), Some(&big[..1024]));
}

#[test]
fn inspect_shows_a_kafka_jobs_tasks_and_a_keys_sessions_from_its_changelog() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 5_000, 31);
    let t = Topics::new(2);
    let produced = produce_lines(&t.input, &data, "visit_id");
    let mut args = t.args();
    args.extend(["--stop-at-end", "--keep-open"].map(String::from));
    run_ok(&as_strs(&args));
    let base = [
        "inspect",
        "--kafka-brokers",
        broker(),
        "--kafka-group",
        &t.group,
        "--kafka-topic",
        &t.input,
    ];
    let mut a = base.to_vec();
    a.push("--json");
    let report: serde_json::Value =
        serde_json::from_slice(&run_ok(&a).stdout).expect("inspect --json");
    let tasks = report["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 2);
    let mut read = 0;
    let mut keys = 0;
    for task in tasks {
        read += task["progress"]["counters"]["records_read"]
            .as_u64()
            .expect("counters");
        keys += task["keys_with_state"].as_u64().expect("keys");
        assert!(task["sessions"].is_null(), "no sessions without --keys");
    }
    assert_eq!(
        read as usize, produced,
        "the tasks' accounting covers the input"
    );
    assert!(keys > 0, "--keep-open kept sessions in the changelog");
    // One key: the partition its session key gives, with its open sessions.
    let key = std::fs::read_to_string(&data)
        .expect("data")
        .lines()
        .rev()
        .find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            v["visit_id"].as_str().map(str::to_string)
        })
        .expect("a visit");
    let mut a = base.to_vec();
    a.extend(["--key", &key, "--json"]);
    let report: serde_json::Value =
        serde_json::from_slice(&run_ok(&a).stdout).expect("inspect --key");
    let tasks = report["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 1, "only the key's partition is read");
    let sessions = tasks[0]["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 1, "{report}");
    assert_eq!(sessions[0]["key"], key.as_str());
    let list = sessions[0]["sessions"].as_array().expect("list");
    assert!(
        list.iter()
            .any(|s| s["final"] == false && s["event_count"].as_u64() > Some(0)),
        "the visit's last session is still open: {report}"
    );
    // The text form says the same.
    let text = String::from_utf8(run_ok(&base).stdout).expect("utf8");
    assert!(text.contains(&format!("task {}/0", t.input)), "{text}");
    assert!(text.contains("next input offset"), "{text}");
}

/// A live group job whose input goes quiet moves each partition's watermark on with
/// the wall clock once `--idle-timeout` has passed (docs/semantics.md S-32): the sessions
/// close and are committed though no later event comes to close them.
#[test]
fn a_quiet_partition_moves_on_with_the_clock_and_its_sessions_close() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    std::fs::write(
        &data,
        [
            r#"{"visit_id":"a","event_time":"2024-01-01T00:00:00Z","page":"/1"}"#,
            r#"{"visit_id":"a","event_time":"2024-01-01T00:00:01Z","page":"/2"}"#,
            r#"{"visit_id":"b","event_time":"2024-01-01T00:00:01.500Z","page":"/1"}"#,
        ]
        .join("\n"),
    )
    .expect("write");
    let t = Topics::new(2);
    produce_lines(&t.input, &data, "visit_id");
    let sessions = || -> Vec<serde_json::Value> {
        read_committed(&t.output)
            .iter()
            .flatten()
            .map(|r| serde_json::from_str(&kafka::text(r)).expect("a session"))
            .collect()
    };
    // Without the idle advance nothing closes them: the watermark stays at 00:00:00.5.
    // With it, it moves on at the wall clock's pace once the input is quiet for 1 s:
    // past b's close (00:00:03.5) about 3 s after the last record was read.
    let mut args = t.args();
    args.truncate(args.len() - OPTIONS.len());
    args.extend(
        [
            "--gap",
            "2s",
            "--watermark-delay",
            "1s",
            "--idle-timeout",
            "1s",
            "--checkpoint-interval",
            "100ms",
        ]
        .map(String::from),
    );
    assert!(
        run_until_then_kill(&args, || sessions().len() >= 2),
        "the job ended by itself"
    );
    let mut got: Vec<(String, u64, u64)> = sessions()
        .iter()
        .map(|s| {
            (
                s["key"].as_str().expect("key").to_string(),
                s["event_count"].as_u64().expect("event_count"),
                s["revision"].as_u64().expect("revision"),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, [("a".to_string(), 2, 0), ("b".to_string(), 1, 0)]);
}

/// A cluster that wants TLS and SCRAM (the project's secure broker): the job's client
/// settings come from a config file, the same exactly-once run killed with -9 again and
/// again gives every partition the committed output of its file run, and `inspect`
/// reads the job's changelogs through the same settings.
#[test]
fn exactly_once_over_sasl_ssl_with_scram_killed_and_restarted() {
    let _one_at_a_time = kafka::exclusive();
    let _secure = kafka::on_secure();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 30_000, 17);
    let t = Topics::new(4);
    let over = Duration::from_secs(8);
    let stats = killed_while_producing(&t, dir.path(), &data, over, &[], (2025, 5, 400..1400));
    assert_eq!(
        stats["kafka"]["partitions"].as_array().map(Vec::len),
        Some(4)
    );
    let mut inspect = vec!["inspect".to_string()];
    inspect.extend(kafka::job_args().into_iter().filter(|a| a != "--config"));
    inspect.retain(|a| !a.ends_with(".toml"));
    for (k, v) in &kafka::secure().sasl_config {
        inspect.extend(["--kafka-config".to_string(), format!("{k}={v}")]);
    }
    inspect.extend(["--kafka-group", &t.group, "--kafka-topic", &t.input].map(String::from));
    let out = run_ok(&as_strs(&inspect));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("{}/3", t.input)), "{text}");
}

/// What a misconfigured client meets: each is an error naming its cause within
/// seconds (librdkafka would retry it as if the brokers were down), and the password
/// appears nowhere in what the run prints.
#[test]
fn a_wrong_password_an_unknown_ca_and_plaintext_on_tls_are_clear_errors_within_seconds() {
    let _one_at_a_time = kafka::exclusive();
    let secure = kafka::secure();
    let base = |brokers: &str| -> Vec<String> {
        [
            "run",
            "--kafka-brokers",
            brokers,
            "--kafka-topic",
            "any-topic",
            "--kafka-group",
            "any-group",
            "--kafka-output-topic",
            "any-output",
        ]
        .map(String::from)
        .to_vec()
    };
    let with = |args: &mut Vec<String>, props: &[(String, String)]| {
        for (k, v) in props {
            args.extend(["--kafka-config".to_string(), format!("{k}={v}")]);
        }
    };
    let without = |key: &str| -> Vec<(String, String)> {
        secure
            .sasl_config
            .iter()
            .filter(|(k, _)| k != key)
            .cloned()
            .collect()
    };
    let wrong_password = "wr0ng-but-secret-pw";
    // A wrong password, from the environment (how a service keeps it off `ps`).
    let mut a = base(&secure.sasl);
    with(&mut a, &without("sasl.password"));
    let mut unknown_ca = base(&secure.sasl);
    let mut props = without("ssl.ca.location");
    props.push(("ssl.ca.location".into(), secure.other_ca.clone()));
    with(&mut unknown_ca, &props);
    let plaintext = base(&secure.sasl);
    for (args, env, cause) in [
        (a, Some(wrong_password), "authentication failed"),
        (unknown_ca, None, "TLS handshake failed"),
        (plaintext, None, "security.protocol"),
    ] {
        let began = Instant::now();
        let mut cmd = bin();
        cmd.args(as_strs(&args));
        if let Some(pw) = env {
            cmd.env("SESSIONIZER_KAFKA_SASL_PASSWORD", pw);
        }
        let out = cmd.output().expect("spawn");
        let took = began.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cause}: {err}");
        assert!(
            err.contains(cause) && err.contains("refused this job's client"),
            "{cause}: {err}"
        );
        assert!(
            took < Duration::from_secs(15),
            "{cause}: took {took:?} (the --kafka-timeout is 30 s)"
        );
        assert!(!err.contains(wrong_password), "{err}");
        assert!(!err.contains("sessionizer-dev-secret"), "{err}");
    }
}

/// A client certificate (mTLS) is enough for the job's clients too: `generate` writes
/// into a topic through the SSL listener, and a run reads it back exactly once.
#[test]
fn a_client_certificate_reaches_the_mtls_listener() {
    let _one_at_a_time = kafka::exclusive();
    let _secure = kafka::on_secure();
    let secure = kafka::secure();
    let t = Topics::new(2);
    let mut gen_args = [
        "generate",
        "--events",
        "2000",
        "--kafka-brokers",
        &secure.mtls,
        "--kafka-topic",
        &t.input,
    ]
    .map(String::from)
    .to_vec();
    for (k, v) in &secure.mtls_config {
        gen_args.extend(["--kafka-config".to_string(), format!("{k}={v}")]);
    }
    run_ok(&as_strs(&gen_args));
    let mut job: Vec<String> = t
        .args()
        .into_iter()
        .filter(|a| a != "--config" && !a.ends_with(".toml"))
        .map(|a| {
            if a == secure.sasl {
                secure.mtls.clone()
            } else {
                a
            }
        })
        .collect();
    for (k, v) in &secure.mtls_config {
        job.extend(["--kafka-config".to_string(), format!("{k}={v}")]);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let stats_file = dir.path().join("stats.json");
    job.extend(["--stop-at-end", "--stats-file", s(&stats_file)].map(String::from));
    run_ok(&as_strs(&job));
    let produced: i64 = high_watermarks(&t.input, 2).iter().sum();
    assert!(produced >= 2000, "{produced} records");
    assert_adds_up(&stats_of(&stats_file)["kafka"]["job"], produced as u64);
    assert!(read_committed(&t.output).iter().any(|p| !p.is_empty()));
}

/// `--emit final` on Kafka: no tombstone, each `session_id` once, and the sessions are
/// the final view of an `on-close` run over the same records.
#[test]
fn emit_final_on_kafka_is_the_final_view_of_on_close_without_tombstones() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("visits.jsonl");
    generate(&data, 8_000, 23);
    let (on_close, fin) = (Topics::new(3), Topics::new(3));
    let produced = produce_lines(&on_close.input, &data, "visit_id");
    assert_eq!(produce_lines(&fin.input, &data, "visit_id"), produced);
    for (t, extra) in [(&on_close, &[][..]), (&fin, &["--emit", "final"][..])] {
        let mut a = t.args();
        a.extend(["--stop-at-end"].iter().chain(extra).map(|s| s.to_string()));
        run_ok(&as_strs(&a));
    }
    let revised = read_committed(&on_close.output)
        .iter()
        .flatten()
        .filter(|r| r.value.is_none() || !text(r).contains("\"revision\":0"))
        .count();
    assert!(revised > 0, "on-close revised or retracted some sessions");
    let records = read_committed(&fin.output);
    let mut ids = std::collections::HashSet::new();
    for r in records.iter().flatten() {
        assert!(r.value.is_some(), "a tombstone");
        assert!(!text(r).contains("\"revision\""), "{}", text(r));
        assert!(ids.insert(r.key.clone()), "a session_id twice");
    }
    assert_eq!(
        final_sessions(&records),
        final_sessions(&read_committed(&on_close.output))
    );
}
