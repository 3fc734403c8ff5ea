//! The Spark-style example on the seed's scenario (visits keyed by `visit_id`, a
//! 1-minute watermark delay, micro-batches) gives exactly the sessions that the seed's
//! `map_visits_to_session` would give. The expected sessions below were derived by hand
//! from the function's three branches and Spark's micro-batch rules, never by running
//! code.

#[path = "../examples/spark_style.rs"]
#[allow(dead_code)]
mod spark_style;

use sessionizer::prelude::*;
use spark_style::{SessionOut, Visit, VisitedPage, map_visits_to_session};

const T0: i64 = 1_704_103_200_000; // 2024-01-01T10:00:00Z

fn at(min: i64, sec: i64) -> i64 {
    T0 + min * 60_000 + sec * 1_000
}

fn page(t: i64, page: &str) -> VisitedPage {
    VisitedPage {
        event_time_as_milliseconds: t,
        page: page.to_string(),
    }
}

fn session(visit_id: &str, user_id: &str, pages: Vec<VisitedPage>) -> SessionOut {
    let first = pages[0].event_time_as_milliseconds;
    let last = pages[pages.len() - 1].event_time_as_milliseconds;
    SessionOut {
        visit_id: visit_id.into(),
        start_time: EventTime(first).to_string(),
        end_time: EventTime(last).to_string(),
        visited_pages: pages,
        duration_in_milliseconds: last - first,
        user_id: user_id.into(),
    }
}

#[test]
fn spark_style_gives_the_seed_functions_sessions() {
    // Batch 1 (W unset = Spark's 0). v1 {10:00, 10:01}: first call with W unset ->
    //   base = max event time 10:01 -> timeout 10:11. v2 {10:00:30}: base 10:00:30 ->
    //   timeout 10:10:30. End: W = 10:01 - 1m = 10:00. Nothing due.
    // Batch 2 (W 10:00). v1 {10:03}: W set -> base = W = 10:00 -> timeout 10:10 (earlier
    //   than before: the seed bases the expiry on the watermark). v3 {10:04}: timeout
    //   10:10. End: W = 10:04 - 1m = 10:03. Nothing due.
    // Batch 3 (W 10:03). v2 {10:12}: timeout was 10:10:30 > W, so no timeout; new data
    //   -> base W 10:03 -> timeout 10:13; one session despite the 11.5 min pause.
    //   End: W = 10:12 - 1m = 10:11: v1 (10:10) and v3 (10:10) time out -> emitted
    //   (branch 1), in (deadline, key) order.
    // Batch 4 (W 10:11). v1 {10:12:30}: no state (removed) -> new state, base W 10:11 ->
    //   timeout 10:21. v4 {10:09}: 10:09 <= W -> late, dropped (Spark drops rows at or
    //   behind the watermark with an event-time timeout). End: W = 10:11:30.
    // Batch 5 (W 10:11:30). v5 {10:30}: base W 10:11:30 -> timeout 10:21:30. End:
    //   W = 10:29: v2 (10:13), v1 (10:21), v5 (10:21:30) all time out, in that order.
    // Every deadline is strictly below the watermark that fires it, so Spark's
    // `timeout < watermark` and our `timeout <= watermark` agree here.
    let expected_per_batch: Vec<Vec<SessionOut>> = vec![
        vec![],
        vec![],
        vec![
            session(
                "v1",
                "u1",
                vec![
                    page(at(0, 0), "/home"),
                    page(at(1, 0), "/search"),
                    page(at(3, 0), "/products/7"),
                ],
            ),
            session("v3", "u3", vec![page(at(4, 0), "/home")]),
        ],
        vec![],
        vec![
            session(
                "v2",
                "u2",
                vec![page(at(0, 30), "/home"), page(at(12, 0), "/cart")],
            ),
            session("v1", "u1", vec![page(at(12, 30), "/home")]),
            session("v5", "u5", vec![page(at(30, 0), "/home")]),
        ],
    ];
    let expected_late: Vec<Vec<&str>> = vec![vec![], vec![], vec![], vec!["v4"], vec![]];

    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .flat_map_groups_with_state(map_visits_to_session)
        .build();
    for (n, batch) in spark_style::MICRO_BATCHES.iter().enumerate() {
        let visits: Vec<Visit> = batch
            .lines()
            .map(|l| serde_json::from_str(l).expect("valid visit"))
            .collect();
        let mut sessions = Vec::new();
        let mut late = Vec::new();
        job.process_batch(visits, &mut sessions, &mut late)
            .expect("vectors never refuse");
        assert_eq!(
            sessions,
            expected_per_batch[n],
            "sessions of batch {}",
            n + 1
        );
        let late: Vec<&str> = late.iter().map(|l| l.event.visit_id.as_str()).collect();
        assert_eq!(late, expected_late[n], "late visits of batch {}", n + 1);
    }
    let mut rest = Vec::new();
    job.finish(&mut rest, &mut Vec::new())
        .expect("vectors never refuse");
    assert!(rest.is_empty(), "nothing left at the end: {rest:?}");
    assert_eq!(job.operator().keys(), 0, "every state was removed");
}

#[test]
fn the_first_call_uses_the_event_time_as_base_and_later_ones_the_watermark() {
    // One visit, two batches: the first call sets the timeout from the event time
    // (10:05 + 10m), the second from the watermark of its batch (10:05 - 1m + 10m).
    let visit = |t: i64| Visit {
        visit_id: "v".into(),
        event_time: EventTime(t),
        user_id: "u".into(),
        page: "/".into(),
    };
    let mut timeouts = Vec::new();
    let mut job = Stream::<Visit>::new()
        .key_by(|v| v.visit_id.clone())
        .event_time(|v| v.event_time)
        .watermark(BoundedOutOfOrderness::new(minutes(1)))
        .flat_map_groups_with_state(|k: &str, rows: Vec<Visit>, s: &mut GroupState<'_, _>| {
            let out = map_visits_to_session(k, rows, s);
            timeouts.push(s.timeout_timestamp());
            out
        })
        .build();
    job.process_batch([visit(at(5, 0))], &mut Vec::new(), &mut Vec::new())
        .expect("ok");
    job.process_batch([visit(at(6, 0))], &mut Vec::new(), &mut Vec::new())
        .expect("ok");
    drop(job);
    assert_eq!(
        timeouts,
        [Some(EventTime(at(15, 0))), Some(EventTime(at(14, 0)))]
    );
}
