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
//!     BROKERS GROUP INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC INSTANCE_ID [--stop-at-end]
//! ```
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
struct Visit {
    visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    event_time: EventTime,
    page: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [brokers, group, input, output, dead, instance, rest @ ..] = &args[..] else {
        return Err("usage: kafka_group BROKERS GROUP INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC INSTANCE_ID [--stop-at-end]".into());
    };
    let stop_at_end = rest.iter().any(|a| a == "--stop-at-end");
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
    let stats = KafkaGroup::new(brokers, group, input, output)
        .dead_letter_topic(dead)
        .instance_id(instance)
        .commit_interval(Duration::from_millis(500))
        .stop_at_end(stop_at_end)
        .telemetry(&telemetry)
        .run_windows(|| {
            Stream::<Visit>::new()
                .key_by(|v| v.visit_id.clone())
                .event_time(|v| v.event_time)
                .watermark(BoundedOutOfOrderness::new(seconds(30)))
                .session_windows(minutes(2))
                .allowed_lateness(minutes(2))
                .aggregate(Collect(|v: &Visit| Some(v.page.clone())).named("pages"))
                .build()
        })?;
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}
