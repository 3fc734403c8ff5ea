//! The seed's Flink job, in sessionizer's declarative API:
//!
//! ```java
//! visits.assignTimestampsAndWatermarks(
//!         WatermarkStrategy.forBoundedOutOfOrderness(Duration.ofMinutes(20)))
//!     .keyBy(visit -> visit.visitId)
//!     .window(EventTimeSessionWindows.withGap(Time.minutes(10)))
//!     .allowedLateness(Time.minutes(15))
//!     .process(new VisitToSessionConverter());
//! ```
//!
//! Flink hands `VisitToSessionConverter` all the elements of a fired window; a session
//! window here keeps a mergeable accumulator instead (sessions merge when a late visit
//! bridges two of them), so the converter is an [`Aggregator`]: it collects the visited
//! pages and `finish` builds the session's contents, while the window supplies the key,
//! bounds, count and revision.
//!
//! Input: the README's `examples/data/visits.jsonl`, read with the command line's
//! JSON-lines connector (its last line is invalid and goes to the dead letters).
//! Run: `cargo run -p sessionizer --example flink_style`

use serde::{Deserialize, Serialize};
use sessionizer::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One visit event.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Visit {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub event_time: EventTime,
    pub page: String,
}

/// What the converter adds to the window's session record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VisitSession {
    pub visited_pages: Vec<String>,
}

/// The seed's `VisitToSessionConverter`, as a mergeable aggregate.
#[derive(Debug, Clone, Copy)]
pub struct VisitToSessionConverter;

impl Aggregator<Visit> for VisitToSessionConverter {
    type Acc = Vec<(Position, String)>;
    type Output = VisitSession;

    fn create(&self) -> Self::Acc {
        Vec::new()
    }

    fn add(&self, acc: &mut Self::Acc, visit: &Visit, at: Position) {
        acc.push((at, visit.page.clone()));
    }

    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        acc.extend(other);
    }

    /// Pages in event-time order (ties in arrival order), whatever the merges were.
    fn finish(&self, acc: &Self::Acc) -> VisitSession {
        let mut pages = acc.clone();
        pages.sort_by_key(|(at, _)| *at);
        VisitSession {
            visited_pages: pages.into_iter().map(|(_, page)| page).collect(),
        }
    }
}

/// `examples/data/visits.jsonl` at the workspace root.
pub fn input_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/data/visits.jsonl")
}

/// Runs the job on `examples/data/visits.jsonl`.
pub fn run(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    run_on(&input_path(), out)
}

/// Runs the job on the JSON-lines file `input`, writing its sessions as JSON lines,
/// then its late (and rejected) visits and its dead letters, then the accounting.
pub fn run_on(input: &Path, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let mut dead_letters: Vec<DeadLetter> = Vec::new();
    let mut visits = JsonLines::<Visit, _>::files([input], &mut dead_letters)?;

    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(minutes(20)))
        .session_windows(minutes(10))
        .allowed_lateness(minutes(15))
        .aggregate(VisitToSessionConverter)
        .build();

    let mut sessions = Vec::new();
    let mut late = Vec::new();
    let counts = job.run(visits.by_ref(), &mut sessions, &mut late)?;
    let read = visits.finish()?;

    for s in &sessions {
        writeln!(out, "{}", serde_json::to_string(s)?)?;
    }
    for l in &late {
        writeln!(out, "late: {}", serde_json::to_string(l)?)?;
    }
    // The source path differs per machine: show the file name only.
    for d in &dead_letters {
        let name = d.source.rsplit('/').next().unwrap_or(&d.source);
        writeln!(out, "dead letter: {name}: {}", d.reason)?;
    }
    writeln!(
        out,
        "records {} = in sessions {} + late {} + invalid {}",
        read.records,
        counts.in_sessions,
        counts.late,
        read.invalid + counts.invalid
    )?;
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout().lock())
}
