//! The book's stateful Delta Lake job as a restartable library service: visits from JSON
//! lines, their final sessions into a Delta table as rows of the job's own type, exactly
//! once — kill it at any instant, start it again with the same arguments, and the table
//! ends up with the rows of a run that was never interrupted, each once.
//!
//! ```text
//! cargo run -p sessionizer --features delta --example table_service -- \
//!     INPUT STATE_DIR TABLE OUT_DIR [EVERY]
//! ```
//!
//! - `INPUT`: visits as JSON lines (as `sessionizer generate` writes them);
//! - `STATE_DIR`: the checkpoints;
//! - `TABLE`: the Delta table (a directory, or `s3://bucket/path` with the `AWS_*`
//!   variables), created on the first run;
//! - `OUT_DIR`: `late.jsonl` and `dead-letters.jsonl`, also exactly once.
//!
//! Every EVERY events (default 2,000) the job checkpoints: the sessions since the last
//! checkpoint become one commit of the table. Read the table with any Delta reader, e.g.
//! `python3 -c "from deltalake import DeltaTable; print(DeltaTable('TABLE').to_pandas())"`.

#[path = "file_service.rs"]
#[allow(dead_code)]
mod file_service;

pub use file_service::Visit;
use serde::{Deserialize, Serialize};
use sessionizer::aggregators::NamedValue;
use sessionizer::prelude::*;
use sessionizer::table::{DataType, DeltaSink, Field, Schema, TimeUnit, columns_of};
use std::path::Path;
use std::sync::Arc;

/// One row of the sessions table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisitSession {
    pub visit_id: String,
    pub session_id: String,
    /// RFC 3339 text, in a timestamp column (see [`columns`]).
    pub start: String,
    pub end: String,
    pub duration_ms: i64,
    pub event_count: u64,
    pub visited_pages: Vec<String>,
}

impl VisitSession {
    /// The row of a session record of the job.
    pub fn of(r: &SessionRecord<NamedValue<Vec<String>>>) -> VisitSession {
        VisitSession {
            visit_id: r.key.clone(),
            session_id: format!("{:016x}", r.session_id),
            start: r.start.to_string(),
            end: r.end.to_string(),
            duration_ms: r.duration().millis(),
            event_count: r.event_count,
            visited_pages: r.value.value.clone(),
        }
    }
}

/// The table's columns: those of [`VisitSession`], with `start` and `end` as UTC
/// timestamps instead of text.
pub fn columns() -> Result<Schema, Box<dyn std::error::Error>> {
    let traced = columns_of::<VisitSession>()?;
    let time = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let fields: Vec<Arc<Field>> = traced
        .fields()
        .iter()
        .map(|f| match f.name().as_str() {
            "start" | "end" => Arc::new(Field::new(f.name(), time.clone(), false)),
            _ => f.clone(),
        })
        .collect();
    Ok(Schema::new(fields))
}

/// Events between checkpoints, by default.
pub const EVERY: usize = 2_000;

/// The job's type: the functions as plain `fn`s so that it can be named.
pub type VisitJob = file_service::VisitJob;

/// The book's job with final sessions only (a table gets each session once, complete).
pub fn job() -> VisitJob {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .session_windows(minutes(10))
        .allowed_lateness(minutes(15))
        .emit(EmitMode::Final)
        .aggregate(
            Collect((|v: &Visit| Some(v.page.clone())) as fn(&Visit) -> Option<String>)
                .named("visited_pages"),
        )
        .build()
}

/// The job's session records as rows of the table.
struct Rows<'a>(&'a mut DeltaSink<VisitSession>);

impl Sink<WindowOutput<NamedValue<Vec<String>>>> for Rows<'_> {
    fn send(&mut self, out: WindowOutput<NamedValue<Vec<String>>>) -> Result<(), SinkError> {
        match out {
            WindowOutput::Session(r) => self.0.send(VisitSession::of(&r)),
            // Final sessions are never retracted.
            WindowOutput::Retraction(_) => Ok(()),
        }
    }
}

/// Runs (or resumes) the job, with a checkpoint every `every` events; returns the epoch
/// of the checkpoint it resumed from.
pub fn run(
    input: &Path,
    state: &Path,
    table: &str,
    out: &Path,
    every: usize,
) -> Result<Option<u64>, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out)?;
    let mut checkpoints = Checkpoints::open(state)?;
    // The outputs join the checkpoints first: the table is brought back to the
    // checkpoint (a commit it missed made, the files no commit names deleted), the files
    // cut back to their committed lengths.
    let mut table = DeltaSink::exactly_once_with_columns(table, columns()?, &mut checkpoints)?;
    let mut late = JsonLinesSink::exactly_once(out.join("late.jsonl"), &mut checkpoints)?;
    let dead_letters =
        JsonLinesSink::exactly_once(out.join("dead-letters.jsonl"), &mut checkpoints)?;

    let mut job = job();
    let resumed = job.restore(&mut checkpoints)?;
    let mut visits = JsonLines::<Visit, _>::resume([input], &mut checkpoints, dead_letters)?;
    match resumed {
        Some(r) => eprintln!("resumed from checkpoint {} ({} events)", r.epoch, r.events),
        None => eprintln!("started from the beginning"),
    }
    let mut sessions = Rows(&mut table);
    loop {
        let mut pushed = 0;
        for visit in visits.by_ref().take(every) {
            job.push(visit, &mut sessions, &mut late)?;
            pushed += 1;
        }
        if pushed < every {
            break;
        }
        job.checkpoint(&mut checkpoints)?;
    }
    visits.finish()?;
    job.finish(&mut sessions, &mut late)?;
    job.checkpoint(&mut checkpoints)?;
    Ok(resumed.map(|r| r.epoch))
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, state, table, out, every) = match args.as_slice() {
        [input, state, table, out] => (input, state, table, out, EVERY),
        [input, state, table, out, every] => (input, state, table, out, every.parse()?),
        _ => return Err("usage: table_service INPUT STATE_DIR TABLE OUT_DIR [EVERY]".into()),
    };
    if every == 0 {
        return Err("EVERY is at least 1".into());
    }
    run(
        Path::new(input),
        Path::new(state),
        table,
        Path::new(out),
        every,
    )?;
    Ok(())
}
