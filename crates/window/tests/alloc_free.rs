//! The command line's hot path stays allocation-free per event: with no aggregates and
//! no dedup, once the keyed store has grown to the job's size, judging an event, applying
//! it, completing sessions and dropping keys allocate nothing. (A counting global
//! allocator; this file is its own test binary so that nothing else is counted.)

use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::{
    BoundedOutOfOrderness, Emit, EmitMode, Event, SessionOperator, SessionView, WindowConfig,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

struct Discard(u64);

impl Emit for Discard {
    fn session(&mut self, s: &SessionView<'_>) {
        self.0 += s.event_count;
    }
    fn retraction(&mut self, _: &[u8], _: EventTime) {}
}

/// One round of a visit-like workload: 500 keys, 8 events each, 20 s apart, slightly out
/// of order, then a jump so that every session closes and every key is dropped.
fn round(
    op: &mut SessionOperator,
    wm: &mut BoundedOutOfOrderness,
    t0: i64,
    seq: &mut u64,
    out: &mut Discard,
) {
    let mut key = [0u8; 12];
    for step in 0..8i64 {
        for k in 0..500u32 {
            key[..4].copy_from_slice(b"key-");
            key[4..12].copy_from_slice(format_args_free(k).as_slice());
            let t = t0 + step * 20_000 + i64::from(k % 7) * 1_000;
            let ev = Event {
                key: &key,
                time: EventTime(t),
                gap: DurationMs(600_000),
                seq: *seq,
                dedup: None,
                values: &[],
            };
            *seq += 1;
            op.on_event(&ev, out);
            let w = wm.observe(EventTime(t));
            op.advance_to(w, out);
        }
    }
    // A far later event closes everything of the round (and is a key of its own).
    let t = t0 + 10_000_000;
    let ev = Event {
        key: b"tick",
        time: EventTime(t),
        gap: DurationMs(600_000),
        seq: *seq,
        dedup: None,
        values: &[],
    };
    *seq += 1;
    op.on_event(&ev, out);
    let w = wm.observe(EventTime(t));
    op.advance_to(w, out);
}

/// The digits of `k`, zero-padded to 8, without allocating.
fn format_args_free(mut k: u32) -> [u8; 8] {
    let mut d = [b'0'; 8];
    for i in (0..8).rev() {
        d[i] = b'0' + (k % 10) as u8;
        k /= 10;
    }
    d
}

#[test]
fn no_allocation_per_event_without_aggregates() {
    let mut op = SessionOperator::new(WindowConfig {
        gap: DurationMs(600_000),
        allowed_lateness: DurationMs(0),
        emit: EmitMode::OnClose,
        aggregates: Vec::new(),
        dedup: false,
    });
    let mut wm = BoundedOutOfOrderness::new(DurationMs(60_000));
    let mut out = Discard(0);
    let mut seq = 0;
    // Warm-up: the store, the timer heap and the scratch vectors reach their size.
    for r in 0..3 {
        round(
            &mut op,
            &mut wm,
            1_704_067_200_000 + r * 20_000_000,
            &mut seq,
            &mut out,
        );
    }
    let region = Region::new(GLOBAL);
    for r in 3..6 {
        round(
            &mut op,
            &mut wm,
            1_704_067_200_000 + r * 20_000_000,
            &mut seq,
            &mut out,
        );
    }
    let change = region.change();
    let allocations = change.allocations + change.reallocations;
    op.advance_to(Watermark::MAX, &mut out);
    assert!(out.0 > 10_000, "sessions were emitted");
    assert_eq!(
        allocations, 0,
        "allocations over 12,000 steady-state events"
    );
}
