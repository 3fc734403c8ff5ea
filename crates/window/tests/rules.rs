//! The hand-worked rule scenarios of tests/support/mod.rs (the rules of
//! docs/semantics.md), run through the engine: the exact records,
//! late records and counts.

mod support;

use support::*;

fn check_engine(s: Scenario) {
    let got = run_engine(&s.events, &s.params);
    assert_eq!(
        got, s.expected,
        "engine disagrees with the hand-worked scenario {}",
        s.name
    );
}

#[test]
fn engine_exact_gap_is_one_session() {
    check_engine(exact_gap());
}

#[test]
fn engine_gap_plus_one_is_two_sessions() {
    check_engine(gap_plus_one());
}

#[test]
fn engine_bridge_merges_open_sessions() {
    check_engine(bridge_open());
}

#[test]
fn engine_bridge_on_update_retracts_and_continues_revisions() {
    check_engine(bridge_open_on_update());
}

#[test]
fn engine_on_update_record_precedes_completions() {
    check_engine(on_update_order());
}

#[test]
fn engine_on_update_late_applied_only_completes() {
    check_engine(on_update_late_applied());
}

#[test]
fn engine_window_end_at_watermark() {
    check_engine(window_end_at_watermark());
}

#[test]
fn engine_lateness_within_and_beyond() {
    check_engine(lateness_within_and_beyond());
}

#[test]
fn engine_late_event_moves_start() {
    check_engine(late_moves_start());
}

#[test]
fn engine_late_event_merges_emitted_sessions() {
    check_engine(late_merges_emitted());
}

#[test]
fn engine_dedup_basic() {
    check_engine(dedup_basic());
}

#[test]
fn engine_dedup_across_merge() {
    check_engine(dedup_across_merge());
}

#[test]
fn engine_dedup_off() {
    check_engine(dedup_off());
}

#[test]
fn engine_per_event_gaps() {
    check_engine(per_event_gaps());
}

#[test]
fn engine_session_final_rejection() {
    check_engine(session_final_rejection());
}

#[test]
fn engine_aggregates() {
    check_engine(aggregates());
}

#[test]
fn engine_completion_order() {
    check_engine(completion_order());
}

#[test]
fn engine_retracted_id_not_retracted_again() {
    check_engine(retracted_id_not_retracted_again());
}

#[test]
fn engine_final_forgotten_at_boundary() {
    check_engine(final_forgotten_at_boundary());
}

#[test]
fn engine_final_remembered_before_boundary() {
    check_engine(final_remembered_before_boundary());
}

#[test]
fn engine_bridge_created_out_of_order() {
    check_engine(bridge_created_out_of_order());
}

#[test]
fn engine_bridge_emitted_created_out_of_order() {
    check_engine(bridge_emitted_created_out_of_order());
}

#[test]
fn engine_floor_issue_example() {
    check_engine(floor_issue_example());
}

#[test]
fn engine_floor_chain() {
    check_engine(floor_chain());
}

#[test]
fn engine_floor_after_a_larger_gap() {
    check_engine(floor_after_a_larger_gap());
}
