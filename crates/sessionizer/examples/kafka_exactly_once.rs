//! An exactly-once service on Apache Kafka (cargo feature `kafka`): visits from a
//! topic (the JSON lines of `sessionizer generate`), sessions (with the pages visited)
//! to a topic, the job's state and the
//! source's position in a state directory, and the output's transactions committed with
//! each checkpoint. Killed at any instant and started again with the same arguments, it
//! goes on where its last checkpoint was, and a `read_committed` reader of the output
//! topic sees every session record exactly once.
//!
//! ```text
//! cargo run --release -p sessionizer --features kafka --example kafka_exactly_once -- \
//!     BROKERS INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC STATE_DIR [IDLE_SECONDS]
//! ```
//!
//! Input records that are not visits go to DEAD_LETTER_TOPIC, in the same transactions
//! as the sessions, keyed by their `topic/partition@offset`. It checkpoints after every
//! poll (at most every 200 ms) and stops, after a last checkpoint, once no record has
//! arrived for IDLE_SECONDS (absent: it runs until killed).

use sessionizer::kafka::{KafkaJson, KafkaJsonSink};
use sessionizer::prelude::*;
use std::time::{Duration, Instant};

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
    let [brokers, input, output, dead, state, rest @ ..] = &args[..] else {
        return Err("usage: kafka_exactly_once BROKERS INPUT_TOPIC OUTPUT_TOPIC DEAD_LETTER_TOPIC STATE_DIR [IDLE_SECONDS]".into());
    };
    let idle = rest.first().map(|s| s.parse()).transpose()?;
    let idle = idle.map(Duration::from_secs);

    // The order matters: the state directory, the exactly-once sink (it settles which
    // checkpoint is the last committed one), the job's restore, then the source (it
    // starts where that checkpoint had read).
    let mut checkpoints = Checkpoints::open(state)?;
    let mut sessions = KafkaJsonSink::exactly_once(brokers, output, "key", &mut checkpoints)?;
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(seconds(30)))
        .session_windows(minutes(2))
        .allowed_lateness(minutes(2))
        .aggregate(Collect(|v: &Visit| Some(v.page.clone())).named("pages"))
        .build();
    if let Some(resumed) = job.restore(&mut checkpoints)? {
        eprintln!(
            "resumed from checkpoint {} ({} events, {} keys)",
            resumed.epoch, resumed.events, resumed.keys
        );
    }
    let dead_letters = sessions.also_to(dead, "source")?; // the same transactions
    let mut visits = KafkaJson::<Visit, _>::open(brokers, input, &mut checkpoints, dead_letters)?;

    let (mut events, mut late) = (Vec::new(), Vec::new());
    let mut last_record = Instant::now();
    loop {
        if visits.poll(Duration::from_millis(200), 20_000, &mut events)? > 0 {
            last_record = Instant::now();
        }
        job.push_batch(events.drain(..), &mut sessions, &mut late)?;
        late.clear(); // a real service would send these somewhere too
        job.checkpoint(&mut checkpoints)?; // and the sessions' transaction commits
        if idle.is_some_and(|d| last_record.elapsed() >= d) {
            let counts = visits.counts();
            eprintln!(
                "idle: stopping after {} records ({} invalid)",
                counts.records, counts.invalid
            );
            return Ok(());
        }
    }
}
