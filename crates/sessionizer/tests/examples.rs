//! Every example of `crates/sessionizer/examples/` run with its output asserted. The
//! examples are compiled into this test as modules, so what is checked is exactly the
//! code `cargo run --example` runs (their `main` only passes stdout to `run`).
//!
//! The expected outputs were worked out by hand from the rules (the derivations are in
//! the comments), then compared with what the examples print.

#[path = "../examples/custom_expiry.rs"]
mod custom_expiry;
#[path = "../examples/flink_style.rs"]
mod flink_style;
#[path = "../examples/spark_style.rs"]
mod spark_style;
#[path = "../examples/tokio_service.rs"]
mod tokio_service;

fn output_of(run: impl FnOnce(&mut Vec<u8>)) -> Vec<String> {
    let mut out = Vec::new();
    run(&mut out);
    String::from_utf8(out)
        .expect("examples print UTF-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn flink_style_example_output() {
    // G = 10m, D = 20m (the book's watermark), A = 15m on examples/data/visits.jsonl (no
    // dedup, so line 4 counts). The largest time is 00:20, so W never passes -00:00 and
    // nothing completes before the end: v1@5 and v1@14 join and bridge v1's sessions,
    // v2@9 joins v2 [1], v1@23:58 moves v1's start, all before any emission. End (W
    // +inf): v2 [1,9] (close 19), v1 [-2..16] (close 26), v2 [20] (close 30), each once.
    let lines = output_of(|out| flink_style::run(out).expect("flink_style runs"));
    let expected = [
        r#"{"key":"v2","session_id":"6730662b07c663b9","start":"2024-01-01T00:01:00.000Z","end":"2024-01-01T00:09:00.000Z","duration_ms":480000,"event_count":2,"revision":0,"complete":true,"visited_pages":["/home","/products/9"]}"#,
        r#"{"key":"v1","session_id":"24b631fb46eab203","start":"2023-12-31T23:58:00.000Z","end":"2024-01-01T00:16:00.000Z","duration_ms":1080000,"event_count":7,"revision":0,"complete":true,"visited_pages":["/landing","/home","/search?q=lamp","/search?q=lamp","/products/7","/cart","/checkout"]}"#,
        r#"{"key":"v2","session_id":"aebd7ff80410d551","start":"2024-01-01T00:20:00.000Z","end":"2024-01-01T00:20:00.000Z","duration_ms":0,"event_count":1,"revision":0,"complete":true,"visited_pages":["/cart"]}"#,
        "dead letter: visits.jsonl:11: field event_time is not a valid timestamp: expected a 4-digit year",
        "records 11 = in sessions 10 + late 0 + invalid 1",
    ];
    assert_eq!(lines, expected);
}

#[test]
fn spark_style_example_output() {
    // The derivation is in tests/spark_seed.rs, which checks the same sessions field by
    // field; here the printed lines, with the batch each came out of.
    let lines = output_of(|out| spark_style::run(out).expect("spark_style runs"));
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert!(lines[0].starts_with(r#"batch 3: session {"visit_id":"v1","start_time":"2024-01-01T10:00:00.000Z","end_time":"2024-01-01T10:03:00.000Z""#), "{}", lines[0]);
    assert!(
        lines[1].starts_with(r#"batch 3: session {"visit_id":"v3","#),
        "{}",
        lines[1]
    );
    assert_eq!(
        lines[2],
        "batch 4: late v4 at 2024-01-01T10:09:00.000Z (watermark 2024-01-01T10:11:00.000Z)"
    );
    assert!(lines[3].starts_with(r#"batch 5: session {"visit_id":"v2","start_time":"2024-01-01T10:00:30.000Z","end_time":"2024-01-01T10:12:00.000Z""#), "{}", lines[3]);
    assert!(
        lines[4].starts_with(
            r#"batch 5: session {"visit_id":"v1","start_time":"2024-01-01T10:12:30.000Z""#
        ),
        "{}",
        lines[4]
    );
    assert!(
        lines[5].starts_with(r#"batch 5: session {"visit_id":"v5","#),
        "{}",
        lines[5]
    );
    assert_eq!(
        lines[0],
        r#"batch 3: session {"visit_id":"v1","start_time":"2024-01-01T10:00:00.000Z","end_time":"2024-01-01T10:03:00.000Z","visited_pages":[{"event_time_as_milliseconds":1704103200000,"page":"/home"},{"event_time_as_milliseconds":1704103260000,"page":"/search"},{"event_time_as_milliseconds":1704103380000,"page":"/products/7"}],"duration_in_milliseconds":180000,"user_id":"u1"}"#
    );
}

#[test]
fn custom_expiry_example_output() {
    // G = 10m, max length 30m, D = 1m, one batch per event.
    // a: 0, 3, 5 (/logout) -> ends by logout at once. a@7 starts again; its timeout
    //    (7 + 10 = 17) fires when b@24 moves W to 23.
    // b: 0, 8, 16, 24 -> timeout min(last + 10, start + 30) = 30; b@32 comes first (W 23,
    //    before the timeout fired) and is >= start + 30: the session ends by max length
    //    and b@32 starts the next. b@40 -> timeout min(50, 62) = 50, fired at the end of
    //    input: inactivity (50 is last + gap).
    let lines = output_of(|out| custom_expiry::run(out).expect("custom_expiry runs"));
    let expected = [
        r#"{"visit_id":"a","start":"2024-01-01T00:00:00.000Z","end":"2024-01-01T00:05:00.000Z","pages":["/home","/cart","/logout"],"ended_by":"logout"}"#,
        r#"{"visit_id":"a","start":"2024-01-01T00:07:00.000Z","end":"2024-01-01T00:07:00.000Z","pages":["/home"],"ended_by":"inactivity"}"#,
        r#"{"visit_id":"b","start":"2024-01-01T00:00:00.000Z","end":"2024-01-01T00:24:00.000Z","pages":["/home","/search","/products/1","/products/2"],"ended_by":"max_length"}"#,
        r#"{"visit_id":"b","start":"2024-01-01T00:32:00.000Z","end":"2024-01-01T00:40:00.000Z","pages":["/cart","/checkout"],"ended_by":"inactivity"}"#,
    ];
    assert_eq!(lines, expected);
}

#[test]
fn tokio_service_example_output() {
    // G = 10m, D = 1m, A = 0. v1: 0, 4, 6; v2: 1, then 30 -> W' = 29 completes v2 [1]
    // (close 11) and v1 [0..6] (close 16), in close order, and both become final.
    // v1@2 then touches the final session: closes at 12 <= W 29 -> late (window_closed).
    // End of input: v2 [30].
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let lines = output_of(|out| {
        runtime
            .block_on(tokio_service::run(out))
            .expect("tokio_service runs")
    });
    let expected = [
        r#"{"key":"v2","session_id":"6730662b07c663b9","start":"2024-01-01T00:01:00.000Z","end":"2024-01-01T00:01:00.000Z","duration_ms":0,"event_count":1,"revision":0,"complete":true,"pages":["/home"],"distinct_pages":1}"#,
        r#"{"key":"v1","session_id":"785e830f7400a97d","start":"2024-01-01T00:00:00.000Z","end":"2024-01-01T00:06:00.000Z","duration_ms":360000,"event_count":3,"revision":0,"complete":true,"pages":["/home","/products/7","/home"],"distinct_pages":2}"#,
        r#"{"key":"v2","session_id":"83237ac9955a7c18","start":"2024-01-01T00:30:00.000Z","end":"2024-01-01T00:30:00.000Z","duration_ms":0,"event_count":1,"revision":0,"complete":true,"pages":["/cart"],"distinct_pages":1}"#,
        r#"late: "v1""#,
        "service stopped: 6 events, 3 sessions",
    ];
    assert_eq!(lines, expected);
}
