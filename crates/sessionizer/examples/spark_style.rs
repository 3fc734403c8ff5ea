//! The seed's Spark job, in sessionizer's stateful API:
//!
//! ```python
//! visits.withWatermark("event_time", "1 minute").groupBy("visit_id")
//!     .applyInPandasWithState(map_visits_to_session, ..., timeoutConf="EventTimeTimeout")
//! ```
//!
//! `map_visits_to_session` has three branches, reproduced one for one below:
//! 1. timed out → emit the session built from the state, remove the state;
//! 2. otherwise pick the expiry base: the largest event time of the new visits on a call
//!    where the watermark is still unset (Spark's `0`: the first micro-batch), else the
//!    watermark;
//! 3. add the new visits to the state (the user id of a new state comes from the visits)
//!    and set the timeout to base + 10 minutes.
//!
//! The input comes in five micro-batches (as Kafka would deliver them to Spark). The
//! seed truncates event times to whole seconds; the scenario's times are whole seconds.
//! One difference of engine, not of function: Spark fires a timeout once the watermark
//! has passed it, sessionizer once it has reached it; no deadline here equals a
//! watermark, so the two agree (see `tests/spark_seed.rs`).
//! Run: `cargo run -p sessionizer --example spark_style` (the scenario), or with a file
//! of visits as its argument (micro-batches of 500; `tests/library.rs` of the CLI
//! checks that on the generator's visits it emits the sessions the CLI's 10-minute
//! session window emits).

use serde::{Deserialize, Serialize};
use sessionizer::prelude::*;
use std::io::Write;

/// One visit event, as on the Kafka topic.
#[derive(Debug, Clone, Deserialize)]
pub struct Visit {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub event_time: EventTime,
    pub user_id: String,
    pub page: String,
}

/// One visited page, as the seed keeps it in the state (`visits`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VisitedPage {
    pub event_time_as_milliseconds: i64,
    pub page: String,
}

/// The seed's `stateStructType`: the visits so far and the user id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSession {
    pub visits: Vec<VisitedPage>,
    pub user_id: String,
}

/// The seed's `outputStructType`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionOut {
    pub visit_id: String,
    pub start_time: String,
    pub end_time: String,
    pub visited_pages: Vec<VisitedPage>,
    pub duration_in_milliseconds: i64,
    pub user_id: String,
}

const SESSION_EXPIRATION: DurationMs = minutes(10);

/// `get_session_to_return`: the visits sorted by event time.
fn session_to_return(visit_id: &str, mut visits: Vec<VisitedPage>, user_id: String) -> SessionOut {
    visits.sort_by_key(|v| v.event_time_as_milliseconds);
    let first = visits.first().map_or(0, |v| v.event_time_as_milliseconds);
    let last = visits.last().map_or(0, |v| v.event_time_as_milliseconds);
    SessionOut {
        visit_id: visit_id.to_string(),
        start_time: EventTime(first).to_string(),
        end_time: EventTime(last).to_string(),
        visited_pages: visits,
        duration_in_milliseconds: last - first,
        user_id,
    }
}

/// `map_visits_to_session`, branch for branch.
pub fn map_visits_to_session(
    visit_id: &str,
    input_rows: Vec<Visit>,
    state: &mut GroupState<'_, PendingSession>,
) -> Option<SessionOut> {
    if state.has_timed_out() {
        // Branch 1: emit the session and remove the state.
        let PendingSession { visits, user_id } = state.remove()?;
        return Some(session_to_return(visit_id, visits, user_id));
    }
    // Branch 2: the expiry base. Spark's watermark is 0 in the first micro-batch; ours
    // is `Watermark::MIN` until the first batch has ended.
    let watermark_unset = state.current_watermark() == Watermark::MIN;
    let base = if watermark_unset {
        input_rows.iter().map(|v| v.event_time).max()?
    } else {
        state.current_watermark().as_time()
    };
    // Branch 3: accumulate and set the timeout.
    let mut user_id = input_rows
        .first()
        .map(|v| v.user_id.clone())
        .unwrap_or_default();
    let new_visits = input_rows.into_iter().map(|v| VisitedPage {
        event_time_as_milliseconds: v.event_time.millis(),
        page: v.page,
    });
    let mut visits_so_far = Vec::new();
    if let Some(existing) = state.remove() {
        visits_so_far = existing.visits;
        user_id = existing.user_id;
    }
    visits_so_far.extend(new_visits);
    state.update(PendingSession {
        visits: visits_so_far,
        user_id,
    });
    state.set_timeout_timestamp(base.plus(SESSION_EXPIRATION));
    None
}

/// The micro-batches of the seed's scenario: visits keyed by `visit_id`.
pub const MICRO_BATCHES: [&str; 5] = [
    r#"{"visit_id":"v1","event_time":"2024-01-01T10:00:00Z","user_id":"u1","page":"/home"}
{"visit_id":"v1","event_time":"2024-01-01T10:01:00Z","user_id":"u1","page":"/search"}
{"visit_id":"v2","event_time":"2024-01-01T10:00:30Z","user_id":"u2","page":"/home"}"#,
    r#"{"visit_id":"v1","event_time":"2024-01-01T10:03:00Z","user_id":"u1","page":"/products/7"}
{"visit_id":"v3","event_time":"2024-01-01T10:04:00Z","user_id":"u3","page":"/home"}"#,
    r#"{"visit_id":"v2","event_time":"2024-01-01T10:12:00Z","user_id":"u2","page":"/cart"}"#,
    r#"{"visit_id":"v1","event_time":"2024-01-01T10:12:30Z","user_id":"u1","page":"/home"}
{"visit_id":"v4","event_time":"2024-01-01T10:09:00Z","user_id":"u4","page":"/home"}"#,
    r#"{"visit_id":"v5","event_time":"2024-01-01T10:30:00Z","user_id":"u5","page":"/home"}"#,
];

/// The job's type, its functions as `fn` pointers.
pub type SparkJob = StatefulJob<
    Visit,
    fn(&Visit) -> String,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    PendingSession,
    fn(&str, Vec<Visit>, &mut GroupState<'_, PendingSession>) -> Option<SessionOut>,
    SystemClock,
>;

/// The job: visits keyed by `visit_id`, a 1-minute watermark delay, the seed's
/// function, micro-batches of `batch` visits when run over an input.
pub fn job(batch: usize) -> SparkJob {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .flat_map_groups_with_state(
            map_visits_to_session
                as fn(&str, Vec<Visit>, &mut GroupState<'_, PendingSession>) -> Option<SessionOut>,
        )
        .batching(Batching::Events(batch))
        .build()
}

/// Runs the job on the JSON-lines file `input` in micro-batches of `batch` visits,
/// writing its sessions as JSON lines, then its late (and rejected) visits and its
/// dead letters, then the accounting.
pub fn run_on(
    input: &std::path::Path,
    batch: usize,
    out: &mut impl Write,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut dead_letters: Vec<DeadLetter> = Vec::new();
    let mut visits = JsonLines::<Visit, _>::files([input], &mut dead_letters)?;
    let mut job = job(batch);
    let (mut sessions, mut late) = (Vec::new(), Vec::new());
    let counts = job.run(visits.by_ref(), &mut sessions, &mut late)?;
    let read = visits.finish()?;
    for s in &sessions {
        writeln!(out, "{}", serde_json::to_string(s)?)?;
    }
    for l in &late {
        writeln!(
            out,
            "late: {} at {} ({})",
            l.event.visit_id, l.time, l.reason
        )?;
    }
    for d in &dead_letters {
        let name = d.source.rsplit('/').next().unwrap_or(&d.source);
        writeln!(out, "dead letter: {name}: {}", d.reason)?;
    }
    writeln!(
        out,
        "records {} = in sessions {} + late {} + invalid {}",
        read.records,
        counts.events - counts.late - counts.invalid,
        counts.late,
        read.invalid + counts.invalid
    )?;
    Ok(())
}

/// Runs the job over [`MICRO_BATCHES`], writing each session (and each late visit) as a
/// JSON line, with the batch it came out of.
pub fn run(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let mut job = job(1);
    for (n, batch) in MICRO_BATCHES.iter().enumerate() {
        let visits = batch
            .lines()
            .map(serde_json::from_str::<Visit>)
            .collect::<Result<Vec<_>, _>>()?;
        let mut sessions = Vec::new();
        let mut late = Vec::new();
        job.process_batch(visits, &mut sessions, &mut late)?;
        for s in sessions {
            writeln!(
                out,
                "batch {}: session {}",
                n + 1,
                serde_json::to_string(&s)?
            )?;
        }
        for l in late {
            writeln!(
                out,
                "batch {}: late {} at {} (watermark {})",
                n + 1,
                l.event.visit_id,
                l.time,
                l.watermark
            )?;
        }
    }
    let mut sessions = Vec::new();
    job.finish(&mut sessions, &mut Vec::new())?;
    for s in sessions {
        writeln!(out, "end: session {}", serde_json::to_string(&s)?)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = &mut std::io::stdout().lock();
    match std::env::args_os().nth(1) {
        // A file of visits (`sessionizer generate` writes one), in micro-batches of 500.
        Some(input) => run_on(std::path::Path::new(&input), 500, out),
        None => run(out),
    }
}
