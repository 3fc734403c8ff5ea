//! The end of a bounded input emits every open session (docs/semantics.md S-11: the
//! watermark goes to +infinity). The pipeline emits them in parts, a few thousand per
//! shard at a time, so that memory does not grow with their number; the merged output
//! must still be exactly that of one operator — sessions in (close, key, start) order,
//! the same bytes for any number of workers — also when thousands of sessions close at
//! the same instant.

use sessionizer::config::{Aggregate, OnInvalid, PipelineConfig};
use sessionizer::connectors::{InputSource, OutputTarget};
use sessionizer::core::decode::{DEFAULT_VALID_RANGE, DedupMode, TimeFormat};
use sessionizer::core::json::FieldPath;
use sessionizer::prelude::*;
use sessionizer::window::AggKind;
use std::path::Path;

const T0: i64 = 1_704_067_200_000;

/// 40,000 visits open at the end of the input (several parts' worth per shard):
/// 12,000 with one event at the same instant (so their sessions close together), 3
/// visits per millisecond after that, and every 5th visit with a second event later
/// (its timer was set before its session grew).
fn write_input(path: &Path) -> usize {
    let mut lines = String::new();
    let mut sessions = 0;
    for i in 0..40_000i64 {
        let t = if i < 12_000 { T0 } else { T0 + 1 + i / 3 };
        lines.push_str(&format!(
            "{{\"visit_id\":\"v{i:05}\",\"event_time\":\"{}\",\"page\":\"/a/{}\"}}\n",
            EventTime(t),
            i % 7
        ));
        sessions += 1;
    }
    for i in (0..40_000i64).step_by(5) {
        let t = T0 + 20_000 + (i % 1_000);
        lines.push_str(&format!(
            "{{\"visit_id\":\"v{i:05}\",\"event_time\":\"{}\",\"page\":\"/b\"}}\n",
            EventTime(t)
        ));
    }
    std::fs::write(path, lines).expect("write input");
    sessions
}

fn config(dir: &Path, input: &Path, workers: usize) -> PipelineConfig {
    PipelineConfig {
        inputs: vec![InputSource::File(input.to_path_buf())],
        output: OutputTarget::File(dir.join(format!("out-{workers}.jsonl"))),
        output_format: Default::default(),
        dead_letter: OutputTarget::File(dir.join("dead.jsonl")),
        late_output: OutputTarget::File(dir.join("late.jsonl")),
        key: FieldPath::parse("visit_id").expect("path"),
        time: FieldPath::parse("event_time").expect("path"),
        time_format: TimeFormat::Rfc3339,
        gap: minutes(60),
        gap_field: None,
        watermark_delay: minutes(1),
        allowed_lateness: DurationMs(0),
        valid_range: DEFAULT_VALID_RANGE,
        aggregates: vec![Aggregate {
            kind: AggKind::Collect,
            field: FieldPath::parse("page").expect("path"),
            name: "page".into(),
        }],
        dedup: DedupMode::Off,
        emit: EmitMode::OnClose,
        on_invalid: OnInvalid::DeadLetter,
        workers,
        kafka: None,
        state_backend: Default::default(),
        max_record: sessionizer_connectors::input::DEFAULT_MAX_RECORD,
        idle_timeout: None,
    }
}

#[test]
fn sessions_open_at_the_end_come_out_in_close_key_order_for_every_number_of_workers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("visits.jsonl");
    let expected = write_input(&input);

    let stats = sessionizer::pipeline::run(
        &config(dir.path(), &input, 1),
        &sessionizer::telemetry::Telemetry::default(),
    )
    .expect("one worker");
    assert_eq!(stats.sessions_emitted, expected as u64);
    let one = std::fs::read(dir.path().join("out-1.jsonl")).expect("output");

    // One operator's order: by close (the last event time plus the one gap), then key.
    let mut previous: Option<(String, String)> = None;
    let mut keys = std::collections::BTreeSet::new();
    for line in String::from_utf8(one.clone()).expect("utf8").lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let end = v["end"].as_str().expect("end").to_string();
        let key = v["key"].as_str().expect("key").to_string();
        assert!(keys.insert(key.clone()), "{key} emitted twice");
        let here = (end, key);
        if let Some(p) = &previous {
            assert!(p < &here, "{p:?} before {here:?}");
        }
        previous = Some(here);
    }
    assert_eq!(keys.len(), expected);

    for workers in [2, 3] {
        let cfg = config(dir.path(), &input, workers);
        let stats = sessionizer::pipeline::run(&cfg, &sessionizer::telemetry::Telemetry::default())
            .unwrap_or_else(|e| panic!("{workers} workers: {e}"));
        assert_eq!(stats.sessions_emitted, expected as u64);
        let out = std::fs::read(dir.path().join(format!("out-{workers}.jsonl"))).expect("output");
        assert!(
            out == one,
            "the output of {workers} workers differs from one worker's"
        );
    }
}
