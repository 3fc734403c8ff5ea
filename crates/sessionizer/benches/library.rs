//! A library session window job (`Stream` .. `build()`), fed events of the user's own
//! type, on one worker and on two (`set_workers`): the library's cost on top of the
//! operator (`sessionizer-window`'s `operator` bench), and what its workers give.
//!
//! With the cargo feature `rocksdb`, the stateful count also runs on the RocksDB state
//! backend: with a budget its keys fit in, and with one far below them.
//!
//! Run: `cargo bench -p sessionizer --bench library [--features rocksdb]`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sessionizer::prelude::*;
use std::hint::black_box;

#[derive(Clone)]
struct Visit {
    visit: u64,
    at: EventTime,
    page: &'static str,
}

const PAGES: [&str; 4] = ["/", "/products/1234", "/cart", "/checkout"];

/// Visit-like events, as in the operator bench: 1,000 concurrent visits, ~12 events
/// each, 20 ms apart in event time, slightly out of order.
fn events(n: usize) -> Vec<Visit> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut visit_of_slot: Vec<u64> = (0..1000).collect();
    let mut next_visit = 1000u64;
    let t0 = 1_704_067_200_000i64;
    (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let slot = (state % 1000) as usize;
            if state.is_multiple_of(12) {
                visit_of_slot[slot] = next_visit;
                next_visit += 1;
            }
            let jitter = (state >> 40) as i64 % 2_000;
            Visit {
                visit: visit_of_slot[slot],
                at: EventTime(t0 + i as i64 * 20 - jitter),
                page: PAGES[(state >> 20) as usize % PAGES.len()],
            }
        })
        .collect()
}

/// Counts the sessions' events instead of keeping the records.
struct Tally(u64);

impl<O> Sink<WindowOutput<O>> for Tally {
    fn send(&mut self, record: WindowOutput<O>) -> Result<(), SinkError> {
        if let Some(s) = record.session() {
            self.0 += s.event_count;
        }
        Ok(())
    }
}

/// A 30-minute session window with `aggregate` on `workers` workers; returns the
/// events in the sessions emitted.
fn window<A>(events: &[Visit], workers: usize, aggregate: A) -> u64
where
    A: Aggregator<Visit> + Clone + Send,
    A::Acc: Send,
    A::Output: Send,
{
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit)
        .event_time(|v| v.at)
        .session_windows(minutes(30))
        .aggregate(aggregate)
        .build();
    job.set_workers(workers).expect("before the first event");
    let mut tally = Tally(0);
    job.run(events.iter().cloned(), &mut tally, &mut Vec::new())
        .expect("sinks never refuse");
    tally.0
}

fn count_only(events: &[Visit], workers: usize) -> u64 {
    window(events, workers, Count)
}

fn collect_page(events: &[Visit], workers: usize) -> u64 {
    window(events, workers, Collect(|v: &Visit| Some(v.page)))
}

/// Spark's flatMapGroupsWithState in its simplest session form: a count per visit,
/// reported when the watermark passes 30 minutes after the visit's last event.
fn stateful_count(events: &[Visit], workers: usize) -> u64 {
    stateful_count_on(events, workers, &StateBackend::Memory)
}

/// [`stateful_count`] on `backend`.
fn stateful_count_on(events: &[Visit], workers: usize, backend: &StateBackend) -> u64 {
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit)
        .event_time(|v| v.at)
        .flat_map_groups_with_state(
            |_: &str, events: Vec<Visit>, state: &mut GroupState<'_, u64>| {
                if state.has_timed_out() {
                    return state.remove();
                }
                let n = state.get().copied().unwrap_or(0) + events.len() as u64;
                state.update(n);
                let last = events
                    .iter()
                    .map(|v| v.at)
                    .max()
                    .expect("a data call has events");
                state.set_timeout_timestamp(last.plus(minutes(30)));
                None
            },
        )
        .batching(Batching::Events(4096))
        .build();
    job.set_workers(workers).expect("before the first event");
    job.set_state_backend(backend)
        .expect("a backend of this build");
    let mut total = 0;
    let mut sum = |n: u64| total += n;
    job.run(events.iter().cloned(), &mut sum, &mut Vec::new())
        .expect("sinks never refuse");
    total
}

fn bench(c: &mut Criterion) {
    let evs = events(1_000_000);
    assert_eq!(count_only(&evs, 1), evs.len() as u64);
    assert_eq!(count_only(&evs, 2), evs.len() as u64);
    assert_eq!(stateful_count(&evs, 2), stateful_count(&evs, 1));
    let mut g = c.benchmark_group("library");
    g.throughput(Throughput::Elements(evs.len() as u64));
    g.sample_size(10);
    for workers in [1, 2] {
        g.bench_function(format!("1M visits, count only, {workers} worker(s)"), |b| {
            b.iter(|| black_box(count_only(&evs, workers)))
        });
        g.bench_function(
            format!("1M visits, collect page, {workers} worker(s)"),
            |b| b.iter(|| black_box(collect_page(&evs, workers))),
        );
        g.bench_function(
            format!("1M visits, stateful count, batches of 4096, {workers} worker(s)"),
            |b| b.iter(|| black_box(stateful_count(&evs, workers))),
        );
    }
    #[cfg(feature = "rocksdb")]
    {
        // About 8,500 keys are live at a time (each stays 30 minutes of event time after
        // its last event), ~160 bytes each in memory; RocksDB's half of the budget is at
        // least 8 MiB.
        for (name, bytes) in [
            ("64MB: every key fits", 64u64 << 20),
            ("256KB: most keys on disk", 256 << 10),
        ] {
            let backend = StateBackend::RocksDb {
                memory_bytes: bytes,
                dir: None,
            };
            assert_eq!(
                stateful_count_on(&evs, 1, &backend),
                stateful_count(&evs, 1)
            );
            g.bench_function(format!("1M visits, stateful count, rocksdb {name}"), |b| {
                b.iter(|| black_box(stateful_count_on(&evs, 1, &backend)))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
