//! The session operator alone, on pre-parsed events: no JSON, no I/O.
//!
//! Run: `cargo bench -p sessionizer-window --bench operator`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::{
    AggKind, BoundedOutOfOrderness, Emit, EmitMode, Event, SessionOperator, SessionView,
    WindowConfig,
};
use std::hint::black_box;

struct Discard(u64);

impl Emit for Discard {
    fn session(&mut self, s: &SessionView<'_>) {
        self.0 += s.event_count;
    }
    fn retraction(&mut self, _: &[u8], _: EventTime) {}
}

/// Visit-like events: 1,000 concurrent visits, ~12 events each, 20 s apart, keys of 16
/// bytes, times slightly out of order.
fn events(n: usize) -> Vec<(Vec<u8>, i64)> {
    let mut out = Vec::with_capacity(n);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut visit_of_slot: Vec<u64> = (0..1000).collect();
    let mut next_visit = 1000u64;
    let t0 = 1_704_067_200_000i64;
    for i in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let slot = (state % 1000) as usize;
        if state.is_multiple_of(12) {
            visit_of_slot[slot] = next_visit;
            next_visit += 1;
        }
        let key = format!(
            "v-{:09}-{:04x}",
            visit_of_slot[slot],
            visit_of_slot[slot] % 65_536
        );
        let jitter = (state >> 40) as i64 % 2_000;
        out.push((key.into_bytes(), t0 + i as i64 * 20 - jitter));
    }
    out
}

fn run(events: &[(Vec<u8>, i64)], aggregates: Vec<AggKind>, value: Option<&[u8]>) -> u64 {
    let values: Vec<Option<&[u8]>> = aggregates.iter().map(|_| value).collect();
    let mut op = SessionOperator::new(WindowConfig {
        gap: DurationMs(30 * 60_000),
        allowed_lateness: DurationMs(0),
        emit: EmitMode::OnClose,
        aggregates,
        dedup: false,
    });
    let mut wm = BoundedOutOfOrderness::new(DurationMs(60_000));
    let mut sink = Discard(0);
    for (seq, (key, t)) in events.iter().enumerate() {
        let ev = Event {
            key,
            time: EventTime(*t),
            gap: DurationMs(30 * 60_000),
            seq: seq as u64,
            dedup: None,
            values: &values,
        };
        op.on_event(&ev, &mut sink);
        op.advance_to(wm.observe(ev.time), &mut sink);
    }
    op.advance_to(Watermark::MAX, &mut sink);
    sink.0
}

fn bench(c: &mut Criterion) {
    let evs = events(1_000_000);
    let mut g = c.benchmark_group("operator");
    g.throughput(Throughput::Elements(evs.len() as u64));
    g.sample_size(10);
    g.bench_function("1M visits, count only", |b| {
        b.iter(|| black_box(run(&evs, vec![], None)))
    });
    g.bench_function("1M visits, --collect page", |b| {
        b.iter(|| {
            black_box(run(
                &evs,
                vec![AggKind::Collect],
                Some(b"\"/products/1234\""),
            ))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
