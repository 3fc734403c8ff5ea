//! Bytes of state per open session: opens N sessions (one event each, distinct keys,
//! none closing) in a `SessionOperator` and divides the growth of the resident set by N.
//!
//! Run: `cargo bench -p sessionizer-window --bench state_size -- 1000000`
//! (the argument is N; default 1,000,000). Linux only (reads /proc/self/status).

use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::{
    AggKind, Emit, EmitMode, Event, SessionOperator, SessionView, WindowConfig,
};

struct Discard;

impl Emit for Discard {
    fn session(&mut self, _: &SessionView<'_>) {}
    fn retraction(&mut self, _: &[u8], _: EventTime) {}
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn measure(n: u64, aggregates: Vec<AggKind>, value: Option<&[u8]>) -> f64 {
    let values: Vec<Option<&[u8]>> = aggregates.iter().map(|_| value).collect();
    let mut op = SessionOperator::new(WindowConfig {
        gap: DurationMs(30 * 60_000),
        allowed_lateness: DurationMs(0),
        emit: EmitMode::OnClose,
        aggregates,
        dedup: false,
    });
    let before = rss_bytes();
    let mut key = Vec::with_capacity(32);
    let t0 = 1_704_067_200_000i64;
    for i in 0..n {
        key.clear();
        // Shaped like the generator's visit ids: "v-000000123-7f3a" (16 bytes).
        key.extend_from_slice(format!("v-{i:09}-{:04x}", i % 65_536).as_bytes());
        let ev = Event {
            key: &key,
            time: EventTime(t0 + (i as i64 % 1000)),
            gap: DurationMs(30 * 60_000),
            seq: i,
            dedup: None,
            values: &values,
        };
        op.on_event(&ev, &mut Discard);
        op.advance_to(Watermark::at(EventTime(t0)), &mut Discard);
    }
    assert_eq!(op.open_sessions() as u64, n);
    let grown = rss_bytes().saturating_sub(before);
    drop(op);
    grown as f64 / n as f64
}

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let plain = measure(n, vec![], None);
    println!("open sessions: {n}");
    println!("bytes per open session, no aggregates:             {plain:.1}");
    let collected = measure(n, vec![AggKind::Collect], Some(b"\"/products/1234\""));
    println!("bytes per open session, --collect page (1 value):  {collected:.1}");
}
