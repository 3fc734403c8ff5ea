//! What a Kafka job's committed output must equal: for each input partition, the file
//! path's output over that partition's records in offset order (sessions byte for
//! byte, dead letters and late events by offset), and the accounting that adds up.
//! Shared by the Kafka test binaries.

#![allow(dead_code)]

use super::kafka::{self, Read, create_topics, read_committed, text, unique};
use super::process::{run_ok, s};
use std::collections::BTreeMap;
use std::path::Path;

/// The session options every run of a test shares.
pub const OPTIONS: &[&str] = &[
    "--gap",
    "2m",
    "--watermark-delay",
    "10s",
    "--allowed-lateness",
    "2m",
    "--dedup",
    "--collect",
    "page",
];

/// The topics of one job.
pub struct Topics {
    pub input: String,
    pub output: String,
    pub dead: String,
    pub late: String,
    pub group: String,
}

impl Topics {
    pub fn new(partitions: i32) -> Topics {
        let t = Topics {
            input: unique("visits"),
            output: unique("sessions"),
            dead: unique("dead"),
            late: unique("late"),
            group: unique("job"),
        };
        create_topics(&[&t.input, &t.output, &t.dead, &t.late], partitions);
        t
    }

    /// `run` arguments for a Kafka-in, Kafka-out job over these topics.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["run".to_string()];
        a.extend(kafka::job_args());
        a.extend(
            [
                "--kafka-topic",
                &self.input,
                "--kafka-group",
                &self.group,
                "--kafka-output-topic",
                &self.output,
                "--dead-letter-topic",
                &self.dead,
                "--late-topic",
                &self.late,
                "--progress",
                "never",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        a.extend(OPTIONS.iter().map(|s| s.to_string()));
        a
    }
}

pub fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// What the file path writes for one input partition's records in offset order.
pub struct FileRun {
    /// `(session_id, record)` per line; a retraction is `(session_id, None)`.
    pub sessions: Vec<(String, Option<String>)>,
    /// Dead letters: `(offset, reason, raw)`.
    pub dead: Vec<(i64, String, String)>,
    /// Late events: `(offset, reason, event)`.
    pub late: Vec<(i64, String, String)>,
    pub stats: serde_json::Value,
}

pub fn session_line(line: &str) -> (String, Option<String>) {
    let v: serde_json::Value = serde_json::from_str(line).expect("session record is JSON");
    let id = v["session_id"].as_str().expect("session_id").to_string();
    if v.get("retract").is_some() {
        (id, None)
    } else {
        (id, Some(line.to_string()))
    }
}

/// Runs the file path over partition `p`'s records (in offset order) in `dir`.
pub fn file_run(dir: &Path, p: usize, records: &[Read]) -> FileRun {
    let input = dir.join(format!("partition-{p}.jsonl"));
    let mut data = Vec::new();
    for r in records {
        data.extend_from_slice(r.value.as_deref().unwrap_or_default());
        data.push(b'\n');
    }
    std::fs::write(&input, &data).expect("write partition input");
    let output = dir.join(format!("partition-{p}.out.jsonl"));
    let dead = dir.join(format!("partition-{p}.dead.jsonl"));
    let late = dir.join(format!("partition-{p}.late.jsonl"));
    let stats = dir.join(format!("partition-{p}.stats.json"));
    let mut args = vec![
        "run",
        "--input",
        s(&input),
        "--output",
        s(&output),
        "--dead-letter",
        s(&dead),
        "--late-output",
        s(&late),
        "--stats-file",
        s(&stats),
    ];
    args.extend_from_slice(OPTIONS);
    run_ok(&args);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    // Line n of the partition file is the record at offset records[n - 1].offset.
    let offset_of = |source: &str| -> i64 {
        let line: usize = source
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("file:line");
        records[line - 1].offset
    };
    let side = |text: String, payload: &str| -> Vec<(i64, String, String)> {
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("side record is JSON");
                (
                    offset_of(v["source"].as_str().expect("source")),
                    v["reason"].as_str().expect("reason").to_string(),
                    v[payload].to_string(),
                )
            })
            .collect()
    };
    FileRun {
        sessions: read(&output).lines().map(session_line).collect(),
        dead: side(read(&dead), "raw"),
        late: side(read(&late), "event"),
        stats: serde_json::from_str(&read(&stats)).expect("stats JSON"),
    }
}

/// The Kafka output of one partition as `(session_id, record)`, checking the format of
/// docs/semantics.md K-7 on the way: key = session_id, retraction = tombstone with
/// `retract: true`.
pub fn kafka_sessions(records: &[Read]) -> Vec<(String, Option<String>)> {
    records
        .iter()
        .map(|r| {
            let key = String::from_utf8(r.key.clone().expect("session records have a key"))
                .expect("utf8 key");
            match &r.value {
                None => {
                    assert_eq!(
                        r.retract.as_deref(),
                        Some("true"),
                        "a tombstone is a retraction"
                    );
                    (key, None)
                }
                Some(_) => {
                    let line = text(r);
                    let (id, _) = session_line(&line);
                    assert_eq!(id, key, "the record key is the session_id");
                    assert_eq!(r.retract, None);
                    (key, Some(line))
                }
            }
        })
        .collect()
}

/// Side-output records read from a topic, by input partition: `(offset, reason, payload)`.
pub fn kafka_side(
    topic_records: &[Vec<Read>],
    input: &str,
    payload: &str,
) -> BTreeMap<i32, Vec<(i64, String, String)>> {
    let mut out: BTreeMap<i32, Vec<(i64, String, String)>> = BTreeMap::new();
    for r in topic_records.iter().flatten() {
        let v: serde_json::Value = serde_json::from_str(&text(r)).expect("side record is JSON");
        let source = v["source"].as_str().expect("source");
        let (name, offset) = source.rsplit_once('@').expect("topic/partition@offset");
        let (topic, partition) = name.rsplit_once('/').expect("topic/partition");
        assert_eq!(topic, input);
        out.entry(partition.parse().expect("partition"))
            .or_default()
            .push((
                offset.parse().expect("offset"),
                v["reason"].as_str().expect("reason").to_string(),
                v[payload].to_string(),
            ));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Checks a finished job's committed output against the file path, partition by
/// partition; returns the number of input records.
pub fn assert_matches_file_runs(t: &Topics, dir: &Path, partitions: usize) -> u64 {
    let inputs = read_committed(&t.input);
    let outputs = read_committed(&t.output);
    let dead = kafka_side(&read_committed(&t.dead), &t.input, "raw");
    let late = kafka_side(&read_committed(&t.late), &t.input, "event");
    assert_eq!(inputs.len(), partitions);
    let mut total = 0;
    for p in 0..partitions {
        let expected = file_run(dir, p, &inputs[p]);
        let got = kafka_sessions(&outputs[p]);
        assert!(!expected.sessions.is_empty(), "partition {p} has sessions");
        assert_eq!(
            got.len(),
            expected.sessions.len(),
            "partition {p}: record count"
        );
        for (i, (g, e)) in got.iter().zip(&expected.sessions).enumerate() {
            assert_eq!(g, e, "partition {p}, record {i}");
        }
        let mut file_dead = expected.dead.clone();
        file_dead.sort();
        assert_same_side(
            &dead.get(&(p as i32)).cloned().unwrap_or_default(),
            &file_dead,
            &format!("partition {p}: dead letters"),
        );
        let mut file_late = expected.late.clone();
        file_late.sort();
        assert_same_side(
            &late.get(&(p as i32)).cloned().unwrap_or_default(),
            &file_late,
            &format!("partition {p}: late events"),
        );
        total += expected.stats["records_read"]
            .as_u64()
            .expect("records_read");
    }
    total
}

/// Side records read from Kafka equal the file run's; on failure the message lists
/// only the records that differ (each with how many times it was read).
pub fn assert_same_side(got: &[(i64, String, String)], want: &[(i64, String, String)], what: &str) {
    if got == want {
        return;
    }
    let count = |v: &[(i64, String, String)]| {
        let mut m: BTreeMap<(i64, String, String), usize> = BTreeMap::new();
        for r in v {
            *m.entry(r.clone()).or_default() += 1;
        }
        m
    };
    let (g, w) = (count(got), count(want));
    let keys: std::collections::BTreeSet<_> = g.keys().chain(w.keys()).collect();
    let diff: Vec<String> = keys
        .into_iter()
        .filter(|k| g.get(*k) != w.get(*k))
        .map(|k| {
            format!(
                "{k:?}: read {} times, expected {}",
                g.get(k).copied().unwrap_or(0),
                w.get(k).copied().unwrap_or(0)
            )
        })
        .collect();
    panic!(
        "{what}: {} read, {} expected; differing:\n{}",
        got.len(),
        want.len(),
        diff.join("\n")
    );
}

pub fn stats_of(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("stats file")).expect("stats JSON")
}

/// The counters of a stats object, as the `job` object of its `kafka` part has them.
pub fn stats_of_counters(stats: &serde_json::Value) -> serde_json::Value {
    let keys = [
        "records_read",
        "in_sessions",
        "duplicates",
        "late",
        "invalid",
        "blank_lines",
        "sessions_emitted",
        "retractions",
        "bytes_read",
    ];
    serde_json::Value::Object(
        keys.iter()
            .map(|k| (k.to_string(), stats[*k].clone()))
            .collect(),
    )
}

pub fn assert_adds_up(stats: &serde_json::Value, records: u64) {
    let n = |k: &str| {
        stats[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {stats}"))
    };
    assert_eq!(n("records_read"), records, "{stats}");
    assert_eq!(
        n("in_sessions") + n("duplicates") + n("late") + n("invalid"),
        n("records_read"),
        "{stats}"
    );
}

/// The final view of a session output: each session id's latest record, retracted ones
/// removed, as `(key, start, end, event_count, page)`, sorted.
pub fn final_sessions(records: &[Vec<Read>]) -> Vec<(String, String, String, u64, String)> {
    let mut latest: BTreeMap<String, Option<serde_json::Value>> = BTreeMap::new();
    for r in records.iter().flatten() {
        let id = String::from_utf8(r.key.clone().expect("key")).expect("utf8");
        let value = r
            .value
            .as_ref()
            .map(|v| serde_json::from_slice::<serde_json::Value>(v).expect("JSON"));
        latest.insert(id, value);
    }
    let mut out: Vec<_> = latest
        .into_values()
        .flatten()
        .map(|v| {
            (
                v["key"].as_str().expect("key").to_string(),
                v["start"].as_str().expect("start").to_string(),
                v["end"].as_str().expect("end").to_string(),
                v["event_count"].as_u64().expect("count"),
                v["page"].to_string(),
            )
        })
        .collect();
    out.sort();
    out
}
