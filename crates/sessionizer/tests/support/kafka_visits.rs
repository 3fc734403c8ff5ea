//! The visit lines and job of the library's Kafka tests (`kafka.rs`, `kafka_group.rs`).

#![allow(dead_code)]

use serde::{Deserialize, Serialize};
use sessionizer::prelude::*;
use std::io::Write;

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z

/// 2500-01-01T00:00:00Z: past the default valid time range.
pub const FAR: i64 = 16_725_225_600_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Visit {
    pub visit_id: String,
    pub event_time: EventTime,
}

/// `n` visit lines over 40 visits from line `from` on, out of order by up to 2 minutes,
/// some 20 minutes late; every 500th line is not a visit, and with `far_every` every
/// such line is dated [`FAR`].
pub fn lines(from: i64, n: i64, far_every: Option<i64>) -> Vec<String> {
    lines_over(40, from, n, far_every)
}

/// [`lines`] over `visits` visits.
pub fn lines_over(visits: u64, from: i64, n: i64, far_every: Option<i64>) -> Vec<String> {
    let mut next = super::support::xorshift(0x9e37_79b9_7f4a_7c15 ^ from as u64);
    (from..from + n)
        .map(|i| {
            let visit_id = format!("v{}", next() % visits);
            if i % 500 == 499 {
                return format!("{{\"visit_id\": \"{visit_id}\", \"event_time\": \"not a time\"}}");
            }
            if far_every.is_some_and(|k| i % k == k - 1) {
                return format!("{{\"visit_id\": \"{visit_id}\", \"event_time\": {FAR}}}");
            }
            let late = if next().is_multiple_of(40) {
                1_200_000
            } else {
                0
            };
            let visit = Visit {
                visit_id,
                event_time: EventTime(T0 + i * 2_000 - (next() % 120_000) as i64 - late),
            };
            serde_json::to_string(&visit).expect("json")
        })
        .collect()
}

pub type Job = SessionWindowJob<
    Visit,
    fn(&Visit) -> String,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    Count,
    sessionizer::windowed::FixedGap,
    SystemClock,
>;

pub fn job() -> Job {
    job_emitting(EmitMode::OnClose)
}

/// [`job`] with another emission mode.
#[allow(dead_code)]
pub fn job_emitting(mode: EmitMode) -> Job {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .session_windows(minutes(5))
        .allowed_lateness(minutes(10))
        .emit(mode)
        .aggregate(Count)
        .build()
}

/// Produces `lines` to `topic`, keyed by their `visit_id`.
pub fn produce(topic: &str, lines: &[String]) {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for l in lines {
        writeln!(file, "{l}").expect("write");
    }
    file.flush().expect("flush");
    super::kafka::produce_lines(topic, file.path(), "visit_id");
}
