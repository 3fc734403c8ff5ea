//! A Nexmark q11 equivalent: bids (bidder, event time, price) from an in-process
//! generator, a session window per bidder with a 10 s gap, the number of bids per
//! session; sessions are counted and discarded. This is the query behind Flink's
//! published Nexmark q11 figure (39.7K events/s per core).
//!
//! Run: `cargo bench -p sessionizer-window --bench q11 -- 10000000`
//! (the argument is the number of bids; default 10,000,000).
//!
//! The generator follows Nexmark's shape: event time advances 0.1 ms per event in
//! order (10,000 events/s of event time, Nexmark's default rate), bidders are drawn
//! from a pool where a few "hot" bidders place half of the bids, and the watermark
//! trails the largest event time by nothing (Nexmark's generator is in order).

use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::{
    AggKind, BoundedOutOfOrderness, Emit, EmitMode, Event, SessionOperator, SessionView, Verdict,
    WindowConfig,
};
use std::time::Instant;

/// Counts sessions and the bids in them, and drops them.
#[derive(Default)]
struct CountSink {
    sessions: u64,
    bids: u64,
}

impl Emit for CountSink {
    fn session(&mut self, s: &SessionView<'_>) {
        self.sessions += 1;
        self.bids += s.event_count;
    }
    fn retraction(&mut self, _: &[u8], _: EventTime) {}
}

/// xorshift64*: a tiny deterministic generator, enough for a load generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

const BIDDERS: u64 = 100_000;
const HOT_BIDDERS: u64 = 100;

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let mut op = SessionOperator::new(WindowConfig {
        gap: DurationMs(10_000),
        allowed_lateness: DurationMs(0),
        emit: EmitMode::OnClose,
        aggregates: Vec::<AggKind>::new(),
        dedup: false,
    });
    let mut wm = BoundedOutOfOrderness::new(DurationMs(0));
    let mut sink = CountSink::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let t0 = 1_704_067_200_000i64;
    let mut key = itoa::Buffer::new();
    let mut late = 0u64;
    let started = Instant::now();
    for i in 0..n {
        let r = rng.next();
        let bidder = if r & 1 == 0 {
            (r >> 1) % HOT_BIDDERS
        } else {
            HOT_BIDDERS + (r >> 1) % (BIDDERS - HOT_BIDDERS)
        };
        let time = EventTime(t0 + (i / 10) as i64);
        let ev = Event {
            key: key.format(1000 + bidder).as_bytes(),
            time,
            gap: DurationMs(10_000),
            seq: i,
            dedup: None,
            values: &[],
        };
        if op.on_event(&ev, &mut sink) != Verdict::Applied {
            // With no watermark delay, a bid exactly `gap` after its bidder's last one
            // arrives when that session is already complete (W == close): too late.
            late += 1;
        }
        op.advance_to(wm.observe(time), &mut sink);
    }
    op.advance_to(Watermark::MAX, &mut sink);
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        sink.bids + late,
        n,
        "every bid is in exactly one session or late"
    );
    println!(
        "q11: {n} bids, {} sessions, {late} late, {secs:.3} s, {:.2}M events/s on one core",
        sink.sessions,
        n as f64 / secs / 1e6
    );
}
