//! Embedding sessionizer in a tokio service: events arrive on a channel (from a socket,
//! a Kafka consumer, an HTTP handler ...), the service runs a session window over them
//! and hands finished sessions to another channel.
//!
//! The job is synchronous and pure; the service owns it in one task and feeds it what
//! the channel holds (`recv_many`), so no lock is needed and the output is the same
//! whatever the timing.
//! Run: `cargo run -p sessionizer --example tokio_service`

use serde::Deserialize;
use sessionizer::aggregators::NamedValue;
use sessionizer::prelude::*;
use std::io::Write;
use tokio::sync::mpsc;

/// One visit event.
#[derive(Debug, Clone, Deserialize)]
pub struct Visit {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub event_time: EventTime,
    pub page: String,
}

/// A session as the service publishes it: the pages and the number of distinct ones.
pub type Published = WindowOutput<(NamedValue<Vec<String>>, NamedValue<usize>)>;

/// A [`Sink`] into a tokio unbounded channel (a user's own sink: any type can be one).
struct ToChannel<T>(mpsc::UnboundedSender<T>);

impl<T> Sink<T> for ToChannel<T> {
    fn send(&mut self, item: T) -> Result<(), SinkError> {
        self.0.send(item).map_err(|_| SinkError::Closed)
    }
}

/// The service: sessionizes what comes in on `events` until the channel closes.
pub async fn sessionize_service(
    mut events: mpsc::Receiver<Visit>,
    sessions: mpsc::UnboundedSender<Published>,
    late: mpsc::UnboundedSender<Late<Visit>>,
) -> Result<WindowCountsReport, SinkError> {
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .session_windows(minutes(10))
        .aggregate((
            Collect(|v: &Visit| Some(v.page.clone())).named("pages"),
            CountDistinct(|v: &Visit| Some(v.page.clone())).named("distinct_pages"),
        ))
        .build();
    let mut out = ToChannel(sessions);
    let mut late = ToChannel(late);
    let mut buffer = Vec::with_capacity(256);
    while events.recv_many(&mut buffer, 256).await > 0 {
        for visit in buffer.drain(..) {
            job.push(visit, &mut out, &mut late)?;
        }
    }
    // The producer hung up: a bounded input, so every open session is emitted.
    let counts = job.finish(&mut out, &mut late)?;
    Ok(WindowCountsReport {
        events: counts.events,
        sessions: counts.sessions_emitted,
    })
}

/// What the service reports when it stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCountsReport {
    pub events: u64,
    pub sessions: u64,
}

const VISITS: &str = r#"{"visit_id":"v1","event_time":"2024-01-01T00:00:00Z","page":"/home"}
{"visit_id":"v2","event_time":"2024-01-01T00:01:00Z","page":"/home"}
{"visit_id":"v1","event_time":"2024-01-01T00:04:00Z","page":"/products/7"}
{"visit_id":"v1","event_time":"2024-01-01T00:06:00Z","page":"/home"}
{"visit_id":"v2","event_time":"2024-01-01T00:30:00Z","page":"/cart"}
{"visit_id":"v1","event_time":"2024-01-01T00:02:00Z","page":"/search"}"#;

/// Runs the producer, the service and a consumer, writing what the consumer receives.
pub async fn run(
    out: &mut (impl Write + Send),
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (events_tx, events_rx) = mpsc::channel(16);
    let (sessions_tx, mut sessions_rx) = mpsc::unbounded_channel();
    let (late_tx, mut late_rx) = mpsc::unbounded_channel();
    let service = tokio::spawn(sessionize_service(events_rx, sessions_tx, late_tx));

    for line in VISITS.lines() {
        let visit: Visit = serde_json::from_str(line)?;
        events_tx.send(visit).await?;
    }
    drop(events_tx);

    while let Some(session) = sessions_rx.recv().await {
        writeln!(out, "{}", serde_json::to_string(&session)?)?;
    }
    while let Some(l) = late_rx.recv().await {
        writeln!(out, "late: {}", serde_json::to_string(&l.event.visit_id)?)?;
    }
    let report = service.await??;
    writeln!(
        out,
        "service stopped: {} events, {} sessions",
        report.events, report.sessions
    )?;
    Ok(())
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut stdout = std::io::stdout();
    run(&mut stdout).await
}
