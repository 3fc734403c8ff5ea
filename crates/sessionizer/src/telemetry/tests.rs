//! Tests of the telemetry: its events, metrics and readiness.

use super::*;

fn report(task: &str, in_sessions: u64, late: u64, w: i64) -> TaskReport<'_> {
    TaskReport {
        task,
        counts: TaskCounts {
            in_sessions,
            late,
            ..TaskCounts::default()
        },
        watermark: Watermark::at(EventTime(w)),
        open_sessions: 3,
        keys: 2,
    }
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn counters_follow_cumulative_reports_and_restart_with_a_new_task() {
    let t = Telemetry::default();
    t.batch(&[report("0", 5, 1, 1_000)]);
    t.batch(&[report("0", 8, 1, 2_000)]);
    let text = t.encode_metrics();
    assert_eq!(
        sample(
            &text,
            r#"sessionizer_records_total{task="0",outcome="in_sessions"}"#
        ),
        Some(8.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"sessionizer_records_total{task="0",outcome="late"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"sessionizer_open_sessions{task="0"}"#),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, r#"sessionizer_watermark_seconds{task="0"}"#),
        Some(2.0)
    );
    assert_eq!(sample(&text, "sessionizer_tasks"), Some(1.0));
    // A task given up and taken on again reports from zero: the counter goes on.
    t.task_removed("0");
    assert_eq!(sample(&t.encode_metrics(), "sessionizer_tasks"), Some(0.0));
    t.batch(&[report("0", 2, 0, 3_000)]);
    assert_eq!(
        sample(
            &t.encode_metrics(),
            r#"sessionizer_records_total{task="0",outcome="in_sessions"}"#
        ),
        Some(10.0)
    );
}

#[test]
fn the_watermark_is_absent_until_it_is_finite() {
    let t = Telemetry::default();
    t.batch(&[TaskReport {
        watermark: Watermark::MIN,
        ..report("a/0", 0, 0, 0)
    }]);
    let text = t.encode_metrics();
    assert!(!text.contains("sessionizer_watermark_seconds{"), "{text}");
    assert!(
        !text.contains("sessionizer_watermark_lag_seconds{"),
        "{text}"
    );
}

#[test]
fn emission_delay_counts_completed_sessions_once_written() {
    let t = Telemetry::default();
    let at = Instant::now();
    t.sessions_completed(3, at);
    let text = t.encode_metrics();
    assert_eq!(
        sample(&text, "sessionizer_emission_delay_seconds_count"),
        Some(0.0)
    );
    t.outputs_written();
    t.sessions_completed(2, at);
    t.outputs_discarded();
    t.outputs_written();
    let text = t.encode_metrics();
    assert_eq!(
        sample(&text, "sessionizer_emission_delay_seconds_count"),
        Some(3.0)
    );
}

#[test]
fn questions_wait_for_the_pipeline_and_are_refused_when_not_running() {
    let t = Telemetry::default();
    assert_eq!(
        t.query("k", Duration::from_millis(10)).unwrap_err(),
        QueryError::NotRunning(Phase::Starting)
    );
    t.running();
    let asker = {
        let t = t.clone();
        std::thread::spawn(move || t.query("k", Duration::from_secs(10)))
    };
    let mut asked = Vec::new();
    while asked.is_empty() {
        t.answer_queries(|key| {
            asked.push(key.to_string());
            let record = format!(r#"{{"key":"{key}","status":"open"}}"#);
            vec![KeyView {
                task: "0".into(),
                floor: i64::MIN,
                watermark: Watermark::at(EventTime(0)),
                sessions: vec![serde_json::value::RawValue::from_string(record).unwrap()],
            }]
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    let answer = asker.join().unwrap().unwrap();
    assert!(answer.found);
    assert_eq!(
        answer.json,
        r#"{"key":"k","floor":"-inf","tasks":[{"task":"0","floor":"-inf","watermark":"1970-01-01T00:00:00.000Z"}],"sessions":[{"key":"k","status":"open"}]}"#
    );
    assert_eq!(asked, ["k"]);
    t.ended(Ok(&RunStats::default()));
    assert_eq!(
        t.query("k", Duration::from_millis(10)).unwrap_err(),
        QueryError::NotRunning(Phase::Ended)
    );
}
