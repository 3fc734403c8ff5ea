//! `--repartition` (docs/semantics.md K-6): an input that is not partitioned by the
//! session key, re-keyed through the job's internal topic, gives the final sessions and
//! the late events of the same events produced keyed — whatever order the internal
//! topic's partitions interleave the input partitions' records in, with a producer
//! lagging behind the others, a member joining, one killed with SIGKILL. And a quiet
//! input partition holds every task back unless `--idle-timeout` lets it go.

#![cfg(feature = "kafka")]

#[path = "support/kafka.rs"]
mod kafka;
#[path = "support/kafka_runs.rs"]
mod kafka_runs;
#[path = "support/process.rs"]
mod process;

use kafka::{produce_lines, produce_to_partition, read_committed, text};
use kafka_runs::{OPTIONS, Topics, as_strs, assert_adds_up, final_sessions, stats_of};
use process::{bin, run_ok, s, signal};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The session options of these runs: a watermark a minute behind (the data's disorder
/// is at most 30 s), a 10-minute gap.
const SESSION: &[&str] = &[
    "--gap",
    "10m",
    "--watermark-delay",
    "1m",
    "--dedup",
    "--collect",
    "page",
    "--checkpoint-interval",
    "200ms",
];

/// 20,000 generated visits (out of order by up to 30 s, some duplicated, some invalid),
/// and a few copies of visits a day before their neighbours: late in any run.
fn visits(dir: &Path) -> Vec<String> {
    let path = dir.join("generated.jsonl");
    run_ok(&[
        "generate",
        "--events",
        "20000",
        "--keys",
        "300",
        "--seed",
        "29",
        "--out-of-order",
        "30s",
        "--late-fraction",
        "0",
        "--duplicate-fraction",
        "0.005",
        "--invalid-fraction",
        "0.003",
        "--output",
        s(&path),
    ]);
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .expect("read")
        .lines()
        .map(String::from)
        .collect();
    for tenth in [3, 5, 7, 9] {
        let at = lines.len() * tenth / 10;
        let valid = (at..).find(|&i| lines[i].contains("\"event_time\":\"2024-01-01T"));
        let a_day_before =
            lines[valid.expect("a valid visit")].replace("2024-01-01T", "2023-12-31T");
        lines.insert(at, a_day_before);
    }
    lines
}

/// The final sessions of a run. Events of one visit with equal times are collected in
/// the order they reach the task, which differs between input partitions read in
/// any order: their pages are compared as a multiset.
fn sessions_of(topic: &str) -> Vec<(String, String, String, u64, String)> {
    let mut sessions = final_sessions(&read_committed(topic));
    for s in &mut sessions {
        let mut pages: Vec<serde_json::Value> = serde_json::from_str(&s.4).expect("pages");
        pages.sort_by_key(|p| p.to_string());
        s.4 = serde_json::Value::Array(pages).to_string();
    }
    sessions.sort();
    sessions
}

/// The late events of a run, each event's JSON text, sorted.
fn late_events(topic: &str) -> Vec<String> {
    let mut late: Vec<String> = read_committed(topic)
        .iter()
        .flatten()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&text(r)).expect("JSON");
            v["event"].to_string()
        })
        .collect();
    late.sort();
    late
}

/// A member of the repartitioning group, logging into `dir`.
fn member(t: &Topics, dir: &Path, name: &str, extra: &[&str]) -> Child {
    let mut args = t.args();
    args.retain(|x| !OPTIONS.contains(&x.as_str()));
    args.extend(SESSION.iter().chain(extra).map(|a| a.to_string()));
    args.extend(["--repartition", "--kafka-instance-id", name].map(String::from));
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    bin()
        .args(as_strs(&args))
        .env("RUST_LOG", "sessionizer=info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn sessionizer")
}

#[test]
fn a_repartitioned_input_gives_the_sessions_and_late_events_of_a_keyed_one_however_it_is_read() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let lines = visits(dir.path());
    let data = dir.path().join("visits.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").expect("write");

    // The reference: the same events, keyed by visit, in one run.
    let keyed = Topics::new(4);
    assert_eq!(produce_lines(&keyed.input, &data, "visit_id"), lines.len());
    let mut args = keyed.args();
    args.retain(|x| !OPTIONS.contains(&x.as_str()));
    args.extend(SESSION.iter().map(|a| a.to_string()));
    let keyed_stats = dir.path().join("keyed.json");
    args.extend(["--stop-at-end", "--stats-file", s(&keyed_stats)].map(String::from));
    run_ok(&as_strs(&args));
    let keyed_stats = stats_of(&keyed_stats);
    let want = sessions_of(&keyed.output);
    let want_late = late_events(&keyed.late);
    assert!(want.len() > 1000, "{} sessions", want.len());
    assert_eq!(
        want_late.len(),
        4,
        "the visits a day early, and no other: {want_late:?}"
    );

    // The same events spread over four partitions by their place in the file, not by
    // visit; the bulk of partitions 2 and 3 produced 3 s after 0 and 1, each over 5 s,
    // while the group runs: a member reads the early partitions far ahead of the late
    // ones. Each partition brings its first event at once: until every input
    // partition has said something, a re-keyed task judges nothing late (K-6), so a
    // member that read one late partition's backlog before the other's first record
    // would take the day-early visits in it for sessions — the rule, not the reading
    // order, would then differ from the keyed run.
    let random = Topics::new(4);
    let first = member(&random, dir.path(), "rp-1", &[]);
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let mut part: Vec<String> = lines.iter().skip(p).step_by(4).cloned().collect();
            let topic = random.input.clone();
            std::thread::spawn(move || {
                if p >= 2 {
                    let first_event = part
                        .iter()
                        .position(|l| {
                            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| {
                                v["visit_id"].is_string() && v["event_time"].is_string()
                            })
                        })
                        .expect("an event");
                    let rest = part.split_off(first_event + 1);
                    produce_to_partition(&topic, &part, p as i32, Duration::ZERO);
                    std::thread::sleep(Duration::from_secs(3));
                    part = rest;
                }
                produce_to_partition(&topic, &part, p as i32, Duration::from_secs(5));
            })
        })
        .collect();
    // A member joins mid-run; the first is killed a little later.
    std::thread::sleep(Duration::from_secs(2));
    let mut second = member(&random, dir.path(), "rp-2", &[]);
    std::thread::sleep(Duration::from_secs(3));
    let mut first = first;
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    for p in producers {
        p.join().expect("producer");
    }
    std::thread::sleep(Duration::from_secs(2));
    // The second stops as asked (SIGTERM) and a third runs to the end of the input.
    signal(&second, "-TERM");
    let began = Instant::now();
    while second.try_wait().expect("wait").is_none() {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "rp-2 did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = dir.path().join("random.json");
    let mut last = member(
        &random,
        dir.path(),
        "rp-3",
        &["--stop-at-end", "--stats-file", s(&stats)],
    );
    assert!(last.wait().expect("wait").success(), "rp-3 failed");
    let stats = stats_of(&stats);

    let got = sessions_of(&random.output);
    let missing: Vec<_> = want.iter().filter(|w| !got.contains(w)).take(3).collect();
    let extra: Vec<_> = got.iter().filter(|g| !want.contains(g)).take(3).collect();
    assert!(
        got == want,
        "the sessions of the keyed input: {} sessions, {} wanted; missing {missing:?}, not wanted {extra:?}; the members' logs in {}",
        got.len(),
        want.len(),
        dir.keep().display()
    );
    assert_eq!(late_events(&random.late), want_late, "the late events");
    assert_adds_up(&stats["kafka"]["job"], lines.len() as u64);
    for what in ["invalid", "duplicates", "late"] {
        assert_eq!(
            stats["kafka"]["job"][what], keyed_stats["kafka"]["job"][what],
            "{what}"
        );
    }

    // Dead letters name where the record was read first: the input topic, not the
    // internal one, and their raw text is the record's.
    let inputs = read_committed(&random.input);
    let mut n = 0;
    for r in read_committed(&random.dead).iter().flatten() {
        let v: serde_json::Value = serde_json::from_str(&text(r)).expect("JSON");
        let source = v["source"].as_str().expect("source");
        let (name, offset) = source.rsplit_once('@').expect("@offset");
        let (topic, partition) = name.rsplit_once('/').expect("topic/partition");
        assert_eq!(topic, random.input, "{source}");
        let p: usize = partition.parse().expect("partition");
        let o: i64 = offset.parse().expect("offset");
        let original = inputs[p]
            .iter()
            .find(|x| x.offset == o)
            .expect("the record exists");
        assert_eq!(
            v["raw"].as_str().map(str::as_bytes),
            original.value.as_deref()
        );
        n += 1;
    }
    assert_eq!(
        n,
        stats["kafka"]["job"]["invalid"].as_u64().expect("invalid")
    );
}

/// Visits of a few keys, all in partition 0 of a two-partition input, the last an hour
/// after the others: it completes every earlier session — once the watermark may move.
fn one_partition_only(t: &Topics) {
    let lines: Vec<String> = (0..20)
        .map(|i| {
            let (hour, minute) = if i == 19 { (1, 10) } else { (0, i) };
            format!(
                r#"{{"visit_id":"v{}","event_time":"2024-01-01T{hour:02}:{minute:02}:00Z","page":"/p{i}"}}"#,
                i % 3
            )
        })
        .collect();
    produce_to_partition(&t.input, &lines, 0, Duration::ZERO);
}

/// Waits up to `limit` for committed sessions in `topic`; their number.
fn sessions_within(topic: &str, limit: Duration) -> usize {
    let began = Instant::now();
    loop {
        let n = read_committed(topic).iter().flatten().count();
        if n > 0 || began.elapsed() > limit {
            return n;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_quiet_input_partition_holds_the_watermark_back_unless_it_is_idle() {
    let _one_at_a_time = kafka::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    // Without --idle-timeout: partition 1 said nothing, so no time is known for it and
    // no session completes.
    let held = Topics::new(2);
    one_partition_only(&held);
    let mut job = member(&held, dir.path(), "quiet-1", &[]);
    let n = sessions_within(&held.output, Duration::from_secs(8));
    job.kill().expect("kill");
    job.wait().expect("reap");
    assert_eq!(
        n, 0,
        "a session completed while an input partition said nothing"
    );
    // With it: partition 1 is idle after 1 s and left out; partition 0's time completes
    // the three visits' first sessions, and nothing is late.
    let idle = Topics::new(2);
    one_partition_only(&idle);
    let mut job = member(&idle, dir.path(), "quiet-2", &["--idle-timeout", "1s"]);
    let n = sessions_within(&idle.output, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    job.kill().expect("kill");
    job.wait().expect("reap");
    let log = std::fs::read_to_string(dir.path().join("quiet-2.log")).unwrap_or_default();
    assert!(n > 0, "no session completed: {log}");
    let sessions = final_sessions(&read_committed(&idle.output));
    assert_eq!(sessions.len(), 3, "{sessions:?}");
    assert!(read_committed(&idle.late).iter().flatten().next().is_none());
}
