//! The library's declarative window over the user's own event type and the command
//! line's JSON pipeline are one engine: on the same input and options they emit the same
//! sessions, revisions, retractions and late events, record for record.

mod support;

use serde::{Deserialize, Serialize};
use sessionizer::config::{Aggregate, OnInvalid, PipelineConfig};
use sessionizer::connectors::{InputSource, OutputTarget};
use sessionizer::core::decode::{DEFAULT_VALID_RANGE, DedupMode, TimeFormat};
use sessionizer::core::json::FieldPath;
use sessionizer::prelude::*;
use sessionizer::window::AggKind;
use std::path::Path;

#[derive(Debug, Clone, Deserialize)]
struct Visit {
    visit_id: String,
    #[serde(with = "sessionizer::time::rfc3339")]
    event_time: EventTime,
    page: String,
}

#[derive(Debug, Serialize)]
struct Pages {
    page: Vec<String>,
}

/// A dirty stream: 200 concurrent visits, times out of order by up to 4 minutes, some
/// events far late, in a fixed pseudo-random order.
fn write_input(path: &Path) {
    let mut next = support::xorshift(0x9e37_79b9_7f4a_7c15);
    let t0 = 1_704_067_200_000i64;
    let mut lines = String::new();
    for i in 0..3000i64 {
        let visit = next() % 200;
        let jitter = (next() % 240_000) as i64;
        let far_late = match next() % 50 {
            0 => 1_800_000,
            1..=5 => 300_000,
            _ => 0,
        };
        let t = t0 + i * 1_000 - jitter - far_late;
        let page = format!("/p/{}", next() % 7);
        lines.push_str(&format!(
            "{{\"visit_id\":\"v{visit}\",\"event_time\":\"{}\",\"page\":\"{page}\"}}\n",
            EventTime(t)
        ));
    }
    std::fs::write(path, lines).expect("write input");
}

fn without_complete(line: &str) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(line).expect("JSON line");
    if let Some(o) = v.as_object_mut() {
        o.remove("complete");
    }
    v
}

#[test]
fn the_library_window_and_the_cli_pipeline_emit_the_same_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("visits.jsonl");
    write_input(&input);

    let (gap, delay, lateness) = (minutes(3), minutes(1), minutes(5));
    let cfg = PipelineConfig {
        inputs: vec![InputSource::File(input.clone())],
        output: OutputTarget::File(dir.path().join("cli.jsonl")),
        output_format: Default::default(),
        dead_letter: OutputTarget::File(dir.path().join("cli.dead.jsonl")),
        late_output: OutputTarget::File(dir.path().join("cli.late.jsonl")),
        key: FieldPath::parse("visit_id").expect("path"),
        time: FieldPath::parse("event_time").expect("path"),
        time_format: TimeFormat::Rfc3339,
        gap,
        gap_field: None,
        watermark_delay: delay,
        allowed_lateness: lateness,
        valid_range: DEFAULT_VALID_RANGE,
        aggregates: vec![Aggregate {
            kind: AggKind::Collect,
            field: FieldPath::parse("page").expect("path"),
            name: "page".into(),
        }],
        dedup: DedupMode::Off,
        emit: EmitMode::OnClose,
        on_invalid: OnInvalid::DeadLetter,
        workers: 1,
        kafka: None,
        state_backend: Default::default(),
        max_record: sessionizer_connectors::input::DEFAULT_MAX_RECORD,
        idle_timeout: None,
    };
    let stats = sessionizer::pipeline::run(&cfg, &sessionizer::telemetry::Telemetry::default())
        .expect("CLI run");
    assert!(
        stats.retractions > 0 && stats.late > 0,
        "the input exercises lateness: {stats:?}"
    );

    let mut dead = Vec::new();
    let mut source =
        JsonLines::<Visit, _>::open(vec![InputSource::File(input)], &mut dead).expect("open");
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(delay))
        .session_windows(gap)
        .allowed_lateness(lateness)
        .aggregate(Collect(|v: &Visit| Some(v.page.clone())))
        .build();
    let mut out = Vec::new();
    let mut late = Vec::new();
    let counts = job
        .run(source.by_ref(), &mut out, &mut late)
        .expect("library run");
    source.finish().expect("read");

    let cli: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("cli.jsonl"))
        .expect("CLI output")
        .lines()
        .map(without_complete)
        .collect();
    let library: Vec<serde_json::Value> = out
        .into_iter()
        .map(|o| match o {
            WindowOutput::Session(s) => WindowOutput::Session(s.map(|page| Pages { page })),
            WindowOutput::Retraction(r) => WindowOutput::Retraction(r),
        })
        .map(|o| without_complete(&serde_json::to_string(&o).expect("encode")))
        .collect();
    assert_eq!(library.len(), cli.len());
    assert_eq!(library, cli);
    assert_eq!(counts.late, stats.late);
    assert_eq!(counts.retractions, stats.retractions);

    let cli_late: Vec<(String, i64)> = std::fs::read_to_string(dir.path().join("cli.late.jsonl"))
        .expect("CLI late output")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            (
                v["reason"].as_str().unwrap_or("").to_string(),
                v["behind_watermark_ms"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let lib_late: Vec<(String, i64)> = late
        .iter()
        .map(|l| (l.reason.to_string(), l.behind_watermark_ms()))
        .collect();
    assert_eq!(lib_late, cli_late);
}
