//! The seed's Flink job as a restartable service on files, exactly once: kill it at any
//! instant, start it again with the same arguments, and its three output files end up
//! byte for byte as those of a run that was never interrupted.
//!
//! ```text
//! cargo run -p sessionizer --example file_service -- INPUT STATE_DIR OUT_DIR [EVERY]
//! ```
//!
//! - `INPUT`: visits as JSON lines (`{"visit_id":..,"event_time":..,"page":..}`, as
//!   `sessionizer generate` writes them);
//! - `STATE_DIR`: the checkpoints (the command line's format: `sessionizer inspect
//!   --state-dir STATE_DIR` lists them, with the input position and the files'
//!   committed lengths);
//! - `OUT_DIR`: `sessions.jsonl`, `late.jsonl` and `dead-letters.jsonl`.
//!
//! Every 200 events the sessions and late events are flushed, so that readers of the
//! files see them soon; every EVERY events (default 2,000) the job checkpoints: the three files are synced and their
//! lengths, the input's position and the keyed state are written together. A restart
//! cuts the files back to those lengths (what a killed run wrote after its last
//! checkpoint goes) and reads on from that position. Each run prints one line
//! to stderr saying where it started.

use serde::{Deserialize, Serialize};
use sessionizer::prelude::*;
use std::path::Path;

/// One visit event.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Visit {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub event_time: EventTime,
    pub page: String,
}

/// Events between checkpoints, by default.
pub const EVERY: usize = 2_000;

/// The job's type: the functions as plain `fn`s so that it can be named.
pub type VisitJob = SessionWindowJob<
    Visit,
    fn(&Visit) -> String,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    Named<Collect<fn(&Visit) -> Option<String>>>,
    sessionizer::windowed::FixedGap,
>;

/// The book's Flink job: sessions of each visit, 10 minutes of gap, 15 minutes of
/// allowed lateness, the pages visited.
pub fn job() -> VisitJob {
    Stream::<Visit>::new()
        .key_by((|v: &Visit| v.visit_id.clone()) as fn(&Visit) -> String)
        .event_time((|v: &Visit| v.event_time) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .session_windows(minutes(10))
        .allowed_lateness(minutes(15))
        .aggregate(
            Collect((|v: &Visit| Some(v.page.clone())) as fn(&Visit) -> Option<String>)
                .named("visited_pages"),
        )
        .build()
}

/// Runs (or resumes) the job, with a checkpoint every `every` events; returns the epoch
/// of the checkpoint it resumed from.
pub fn run(
    input: &Path,
    state: &Path,
    out: &Path,
    every: usize,
) -> Result<Option<u64>, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out)?;
    let mut checkpoints = Checkpoints::open(state)?;
    // The outputs join the checkpoints first: a restart cuts each back to the length its
    // checkpoint committed.
    let mut sessions = JsonLinesSink::exactly_once(out.join("sessions.jsonl"), &mut checkpoints)?;
    let mut late = JsonLinesSink::exactly_once(out.join("late.jsonl"), &mut checkpoints)?;
    let dead_letters =
        JsonLinesSink::exactly_once(out.join("dead-letters.jsonl"), &mut checkpoints)?;

    let mut job = job();
    let resumed = job.restore(&mut checkpoints)?;
    // Reads on from the checkpoint's position (the files must be the same); every
    // checkpoint records how far it has read.
    let mut visits = JsonLines::<Visit, _>::resume([input], &mut checkpoints, dead_letters)?;
    match resumed {
        Some(r) => eprintln!("resumed from checkpoint {} ({} events)", r.epoch, r.events),
        None => eprintln!("started from the beginning"),
    }

    loop {
        let mut pushed = 0;
        for visit in visits.by_ref().take(every) {
            job.push(visit, &mut sessions, &mut late)?;
            pushed += 1;
            if pushed % 200 == 0 {
                // Readers of the files see the records soon; the checkpoint makes them
                // final (a restart cuts off what follows its committed lengths).
                sessions.flush()?;
                late.flush()?;
            }
        }
        if pushed < every {
            break;
        }
        job.checkpoint(&mut checkpoints)?;
    }
    // An input error ends the iteration early: it is reported here, before the job is
    // ended as if the input were complete.
    visits.finish()?;
    // The end of the input: every session is emitted, and a last checkpoint commits them
    // (with the source's position at the end of the file).
    job.finish(&mut sessions, &mut late)?;
    job.checkpoint(&mut checkpoints)?;
    Ok(resumed.map(|r| r.epoch))
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, state, out, every) = match args.as_slice() {
        [input, state, out] => (input, state, out, EVERY),
        [input, state, out, every] => (input, state, out, every.parse()?),
        _ => return Err("usage: file_service INPUT STATE_DIR OUT_DIR [EVERY]".into()),
    };
    if every == 0 {
        return Err("EVERY is at least 1".into());
    }
    run(Path::new(input), Path::new(state), Path::new(out), every)?;
    Ok(())
}
