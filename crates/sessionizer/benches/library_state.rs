//! A library session-window job's state through a checkpoint: N open sessions (one per
//! key, nothing closes), checkpointed as a base and restored into a new job, on the
//! memory backend or (cargo feature `rocksdb`) on RocksDB with a budget far below the
//! state. Prints the time of the base checkpoint and of the restore, the bytes of the
//! state directory, and the peak RSS of the whole process (run one backend per process
//! to compare their peaks).
//!
//! Run: `cargo bench -p sessionizer --bench library_state --features rocksdb -- [memory|rocksdb] [N]`

use sessionizer::prelude::*;
use std::time::Instant;

#[derive(Clone)]
struct Visit {
    visit: u64,
    at: EventTime,
}

type Job = sessionizer::windowed::SessionWindowJob<
    Visit,
    fn(&Visit) -> u64,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    sessionizer::aggregators::Count,
    sessionizer::windowed::FixedGap,
>;

fn job(backend: &StateBackend) -> Job {
    let mut job = Stream::<Visit>::new()
        .key_by((|v| v.visit) as fn(&Visit) -> u64)
        .event_time((|v| v.at) as fn(&Visit) -> EventTime)
        .session_windows(minutes(60_000))
        .aggregate(sessionizer::aggregators::Count)
        .build();
    job.set_state_backend(backend).expect("backend");
    job
}

/// Counts what the sink hears.
struct Tally(u64);

impl<O> Sink<WindowOutput<O>> for Tally {
    fn send(&mut self, _: WindowOutput<O>) -> Result<(), SinkError> {
        self.0 += 1;
        Ok(())
    }
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata().expect("metadata");
        total += if m.is_dir() {
            dir_bytes(&e.path())
        } else {
            m.len()
        };
    }
    total
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let which = args.next().unwrap_or_else(|| "memory".into());
    let n: u64 = args.next().map_or(1_000_000, |a| a.parse().expect("N"));
    let scratch = tempfile::tempdir().expect("temp dir");
    let backend = match which.as_str() {
        "memory" => StateBackend::Memory,
        "rocksdb" => StateBackend::RocksDb {
            memory_bytes: 64 << 20,
            dir: Some(scratch.path().join("store")),
        },
        other => panic!("memory or rocksdb, not {other}"),
    };
    let t0 = 1_704_067_200_000i64;
    let state = scratch.path().join("state");
    let began = Instant::now();
    let mut first = job(&backend);
    let mut out = Tally(0);
    let batch: Vec<Visit> = Vec::with_capacity(4096);
    let mut batch = batch;
    for i in 0..n {
        batch.push(Visit {
            visit: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            at: EventTime(t0 + i as i64),
        });
        if batch.len() == 4096 || i + 1 == n {
            first
                .push_batch(batch.drain(..), &mut out, &mut Vec::new())
                .expect("sink");
        }
    }
    let fed = began.elapsed();
    let on_disk = first.operator().spill_counts().map_or(0, |c| c.keys);
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let began = Instant::now();
    let written = first.checkpoint(&mut checkpoints).expect("checkpoint");
    let base = began.elapsed();
    drop(first);
    drop(checkpoints);
    let bytes = dir_bytes(&state);

    let began = Instant::now();
    let mut checkpoints = Checkpoints::open(&state).expect("state dir");
    let mut second = job(&StateBackend::RocksDb {
        memory_bytes: 64 << 20,
        dir: Some(scratch.path().join("store2")),
    });
    if which == "memory" {
        second = job(&StateBackend::Memory);
    }
    let resumed = second
        .restore(&mut checkpoints)
        .expect("restore")
        .expect("a checkpoint");
    let restore = began.elapsed();
    assert_eq!(resumed.keys, n);
    assert_eq!(second.open_sessions() as u64, n);
    println!(
        "library_state {which:8} {n} open sessions: fed in {:.2} s ({} on disk); base checkpoint {:.2} s ({} keys encoded, state dir {} MiB); restore {:.2} s ({} keys linked); peak RSS {:.0} MiB",
        fed.as_secs_f64(),
        on_disk,
        base.as_secs_f64(),
        written.puts,
        bytes >> 20,
        restore.as_secs_f64(),
        resumed.keys_linked,
        peak_rss_mib()
    );
}
