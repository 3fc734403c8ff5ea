//! What the library's tests share: a seeded pseudo-random source and the dirty visit
//! stream most of them run on.

#![allow(dead_code)]

use sessionizer::prelude::*;

/// 2024-01-01T00:00:00Z.
pub const T0: i64 = 1_704_067_200_000;

/// A xorshift64 generator: the same `seed` gives the same numbers (an even seed is
/// made odd; zero would stay zero).
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visit {
    pub visit: u32,
    pub at: EventTime,
    pub page: u8,
}

/// `n` events over `keys` visits, `step_ms` apart, out of order by up to 4 minutes,
/// 2% of them 30 minutes late and 10% 5 minutes late, in an order fixed by `seed`.
pub fn visits(n: i64, keys: u64, step_ms: i64, seed: u64) -> Vec<Visit> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|i| {
            let visit = (next() % keys) as u32;
            let jitter = (next() % 240_000) as i64;
            let far_late = match next() % 50 {
                0 => 1_800_000,
                1..=5 => 300_000,
                _ => 0,
            };
            Visit {
                visit,
                at: EventTime(T0 + i * step_ms - jitter - far_late),
                page: (next() % 7) as u8,
            }
        })
        .collect()
}
