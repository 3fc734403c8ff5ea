//! A per-key expiry that a declarative session window cannot express: a visit's session
//! ends
//!
//! * on a `/logout` page (the session's end depends on an event's content),
//! * after 10 minutes without a visit (the usual gap, an event-time timeout), or
//! * once it is 30 minutes long, even while the visitor is still active (a session
//!   window would keep extending it).
//!
//! Written with the stateful API: the state is the open session, the timeout is the
//! earlier of "last visit + gap" and "start + maximum length".
//! Run: `cargo run -p sessionizer --example custom_expiry`

use serde::{Deserialize, Serialize};
use sessionizer::prelude::*;
use std::io::Write;

const GAP: DurationMs = minutes(10);
const MAX_LENGTH: DurationMs = minutes(30);

/// One visit event.
#[derive(Debug, Clone, Deserialize)]
pub struct Visit {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub event_time: EventTime,
    pub page: String,
}

/// The state of a key: its open session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenSession {
    pub start: EventTime,
    pub last: EventTime,
    pub pages: Vec<String>,
}

/// A finished session and why it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionEnd {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub start: EventTime,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub end: EventTime,
    pub pages: Vec<String>,
    pub ended_by: &'static str,
}

fn end(visit_id: &str, s: OpenSession, ended_by: &'static str) -> SessionEnd {
    SessionEnd {
        visit_id: visit_id.to_string(),
        start: s.start,
        end: s.last,
        pages: s.pages,
        ended_by,
    }
}

/// The stateful function: called per visit id with its new visits (in input order).
pub fn sessionize(
    visit_id: &str,
    mut visits: Vec<Visit>,
    state: &mut GroupState<'_, OpenSession>,
) -> Vec<SessionEnd> {
    let mut ended = Vec::new();
    if state.has_timed_out() {
        if let Some(s) = state.remove() {
            let by_length = s.start.plus(MAX_LENGTH) <= s.last.plus(GAP);
            ended.push(end(
                visit_id,
                s,
                if by_length {
                    "max_length"
                } else {
                    "inactivity"
                },
            ));
        }
        return ended;
    }
    visits.sort_by_key(|v| v.event_time);
    for v in visits {
        // The timeout may not have fired yet (the watermark lags): check here too.
        if let Some(s) = state.get() {
            if v.event_time > s.last.plus(GAP) {
                ended.extend(state.remove().map(|s| end(visit_id, s, "inactivity")));
            } else if v.event_time >= s.start.plus(MAX_LENGTH) {
                ended.extend(state.remove().map(|s| end(visit_id, s, "max_length")));
            }
        }
        let logout = v.page == "/logout";
        match state.get_mut() {
            Some(s) => {
                s.last = s.last.max(v.event_time);
                s.pages.push(v.page);
            }
            None => state.update(OpenSession {
                start: v.event_time,
                last: v.event_time,
                pages: vec![v.page],
            }),
        }
        if logout {
            ended.extend(state.remove().map(|s| end(visit_id, s, "logout")));
        }
    }
    if let Some(s) = state.get() {
        let deadline = s.last.plus(GAP).min(s.start.plus(MAX_LENGTH));
        state.set_timeout_timestamp(deadline);
    }
    ended
}

/// The visits, in arrival order.
pub const VISITS: &str = r#"{"visit_id":"a","event_time":"2024-01-01T00:00:00Z","page":"/home"}
{"visit_id":"b","event_time":"2024-01-01T00:00:00Z","page":"/home"}
{"visit_id":"a","event_time":"2024-01-01T00:03:00Z","page":"/cart"}
{"visit_id":"a","event_time":"2024-01-01T00:05:00Z","page":"/logout"}
{"visit_id":"a","event_time":"2024-01-01T00:07:00Z","page":"/home"}
{"visit_id":"b","event_time":"2024-01-01T00:08:00Z","page":"/search"}
{"visit_id":"b","event_time":"2024-01-01T00:16:00Z","page":"/products/1"}
{"visit_id":"b","event_time":"2024-01-01T00:24:00Z","page":"/products/2"}
{"visit_id":"b","event_time":"2024-01-01T00:32:00Z","page":"/cart"}
{"visit_id":"b","event_time":"2024-01-01T00:40:00Z","page":"/checkout"}"#;

/// Runs the job (one batch per event), writing each finished session as a JSON line.
pub fn run(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let visits = VISITS
        .lines()
        .map(serde_json::from_str::<Visit>)
        .collect::<Result<Vec<_>, _>>()?;
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .flat_map_groups_with_state(sessionize)
        .batching(Batching::PerEvent)
        .build();
    let mut ended = Vec::new();
    let mut late = Vec::new();
    job.run(visits, &mut ended, &mut late)?;
    for s in &ended {
        writeln!(out, "{}", serde_json::to_string(s)?)?;
    }
    for l in &late {
        writeln!(out, "late: {}", l.event.visit_id)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout().lock())
}
