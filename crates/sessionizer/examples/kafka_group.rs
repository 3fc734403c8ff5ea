//! A session-window service in a Kafka consumer group (cargo feature `kafka`): visits
//! from a topic (the JSON lines of `sessionizer generate`), sessions with the pages
//! visited to a topic, exactly once. Start it as often as you like with the same GROUP
//! and a different INSTANCE_ID each: the processes share the topic's partitions, each
//! partition's sessions are those of its records alone, and a process that dies, is
//! killed or leaves hands its partitions, with their state, to the others. Stopped with
//! SIGTERM or Ctrl-C it commits what it did and leaves the group.
//!
//! ```text
//! cargo run --release -p sessionizer --features kafka --example kafka_group -- \
//!     BROKERS GROUP INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC INSTANCE_ID [--stop-at-end] [--stateful]
//! ```
//!
//! With `--stateful` it runs the same service as a stateful function in Flink's way
//! (`run_stateful`, one event per call): each visit's pages in its state, emitted as
//! `{"visit_id":..,"pages":[..],"first":..,"last":..}` (keyed by the visit) by an
//! event-time timeout 2 minutes after its last event.
//!
//! Records that are not visits, or whose time is outside 1970..2200, go to
//! DEAD_LETTER_TOPIC with their `topic/partition@offset`; too-late events to stderr.
//! With `--stop-at-end` it reads every partition up to its end at the start, emits
//! every session and ends once the whole group is done; it then prints its accounting
//! as JSON on stdout.

use sessionizer::kafka::KafkaGroup;
use sessionizer::pipeline::Quiet;
use sessionizer::prelude::*;
use sessionizer::telemetry::Telemetry;
use std::time::Duration;

/// The fields the job reads of a visit (`sessionizer generate` writes such lines; the
/// other fields are ignored).
#[derive(Debug, serde::Deserialize)]
pub struct Visit {
    pub visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    pub event_time: EventTime,
    pub page: String,
}

/// What the stateful service emits per visit.
#[derive(Debug, serde::Serialize)]
pub struct VisitPages {
    pub visit_id: String,
    pub pages: Vec<String>,
    pub first: EventTime,
    pub last: EventTime,
}

/// The stateful service's function: the pages of a visit so far and its time span, in
/// its state until an event-time timeout 2 minutes after its last event emits them.
pub fn visit_pages(
    visit: &str,
    events: Vec<Visit>,
    state: &mut GroupState<'_, (Vec<String>, EventTime, EventTime)>,
) -> Option<VisitPages> {
    if state.has_timed_out() {
        return state.remove().map(|(pages, first, last)| VisitPages {
            visit_id: visit.to_string(),
            pages,
            first,
            last,
        });
    }
    let (mut pages, mut first, mut last) =
        state
            .remove()
            .unwrap_or((Vec::new(), EventTime(i64::MAX), EventTime(i64::MIN)));
    for e in events {
        first = first.min(e.event_time);
        last = last.max(e.event_time);
        pages.push(e.page);
    }
    state.update((pages, first, last));
    state.set_timeout_timestamp(last.plus(minutes(2)));
    None
}

/// Records of a partition per micro-batch of the stateful job.
pub const MICRO_BATCH: usize = 500;

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, group, input, output, dead, instance, rest @ ..] = &args[..] else {
        return Err("usage: kafka_group BROKERS GROUP INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC INSTANCE_ID [--stop-at-end] [--stateful]".into());
    };
    let stop_at_end = rest.iter().any(|a| a == "--stop-at-end");
    let stateful = rest.iter().any(|a| a == "--stateful");
    // Logs on stderr at the level RUST_LOG gives (rebalances, restores, commits at
    // `info`).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    // SIGTERM and Ctrl-C ask for a clean stop: commit, then leave the group.
    let telemetry = Telemetry::new(Quiet);
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, telemetry.stop_flag())?;
    }
    let group = KafkaGroup::new(brokers, group, input, output)
        .dead_letter_topic(dead)
        .instance_id(instance)
        .commit_interval(Duration::from_millis(500))
        .stop_at_end(stop_at_end)
        .telemetry(&telemetry);
    let stats = if stateful {
        group.run_stateful(|| {
            Stream::<Visit>::new()
                .key_by(|v| v.visit_id.clone())
                .event_time(|v| v.event_time)
                .watermark(BoundedOutOfOrderness::new(seconds(30)))
                .flat_map_groups_with_state(visit_pages)
                // Spark's micro-batches, cut by each partition's records: two runs,
                // and a run killed and restarted, call the function alike.
                .batching(Batching::Events(MICRO_BATCH))
                .build()
        })?
    } else {
        group.run_windows(|| {
            Stream::<Visit>::new()
                .key_by(|v| v.visit_id.clone())
                .event_time(|v| v.event_time)
                .watermark(BoundedOutOfOrderness::new(seconds(30)))
                .session_windows(minutes(2))
                .allowed_lateness(minutes(2))
                .aggregate(Collect(|v: &Visit| Some(v.page.clone())).named("pages"))
                .build()
        })?
    };
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}
