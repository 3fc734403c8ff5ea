//! The naive reference model (tests/support/reference.rs): hand-worked self-tests, and a
//! property test comparing the engine with it record for record.

mod support;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use support::*;

// ---------------------------------------------------------------------------------------
// Self-tests of the reference: each hand-worked scenario (derivations in support/mod.rs).
// ---------------------------------------------------------------------------------------

fn check_reference(s: Scenario) {
    let got = run_reference(&s.events, &s.params);
    assert_eq!(
        got, s.expected,
        "reference disagrees with the hand-worked scenario {}",
        s.name
    );
}

#[test]
fn ref_exact_gap_is_one_session() {
    check_reference(exact_gap());
}

#[test]
fn ref_gap_plus_one_is_two_sessions() {
    check_reference(gap_plus_one());
}

#[test]
fn ref_bridge_merges_open_sessions() {
    check_reference(bridge_open());
}

#[test]
fn ref_bridge_on_update_retracts_and_continues_revisions() {
    check_reference(bridge_open_on_update());
}

#[test]
fn ref_on_update_record_precedes_completions() {
    check_reference(on_update_order());
}

#[test]
fn ref_on_update_late_applied_only_completes() {
    check_reference(on_update_late_applied());
}

#[test]
fn ref_window_end_at_watermark() {
    check_reference(window_end_at_watermark());
}

#[test]
fn ref_lateness_within_and_beyond() {
    check_reference(lateness_within_and_beyond());
}

#[test]
fn ref_late_event_moves_start() {
    check_reference(late_moves_start());
}

#[test]
fn ref_late_event_merges_emitted_sessions() {
    check_reference(late_merges_emitted());
}

#[test]
fn ref_dedup_basic() {
    check_reference(dedup_basic());
}

#[test]
fn ref_dedup_across_merge() {
    check_reference(dedup_across_merge());
}

#[test]
fn ref_dedup_off() {
    check_reference(dedup_off());
}

#[test]
fn ref_per_event_gaps() {
    check_reference(per_event_gaps());
}

#[test]
fn ref_session_final_rejection() {
    check_reference(session_final_rejection());
}

#[test]
fn ref_aggregates() {
    check_reference(aggregates());
}

#[test]
fn ref_completion_order() {
    check_reference(completion_order());
}

#[test]
fn ref_retracted_id_not_retracted_again() {
    check_reference(retracted_id_not_retracted_again());
}

#[test]
fn ref_final_forgotten_at_boundary() {
    check_reference(final_forgotten_at_boundary());
}

#[test]
fn ref_final_remembered_before_boundary() {
    check_reference(final_remembered_before_boundary());
}

#[test]
fn ref_bridge_created_out_of_order() {
    check_reference(bridge_created_out_of_order());
}

#[test]
fn ref_bridge_emitted_created_out_of_order() {
    check_reference(bridge_emitted_created_out_of_order());
}

#[test]
fn ref_floor_issue_example() {
    check_reference(floor_issue_example());
}

#[test]
fn ref_floor_chain() {
    check_reference(floor_chain());
}

#[test]
fn ref_floor_after_a_larger_gap() {
    check_reference(floor_after_a_larger_gap());
}

#[test]
fn ref_all_scenarios_have_distinct_names() {
    // Each scenario has its own name, so a failure points at one case.
    let names: std::collections::HashSet<_> = all_scenarios().iter().map(|s| s.name).collect();
    assert_eq!(names.len(), all_scenarios().len());
}

// ---------------------------------------------------------------------------------------
// Property test: engine == reference.
// ---------------------------------------------------------------------------------------

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

/// How one event is generated: key index, clock step, displacement, gap, dedup, value.
type RawEvent = (usize, i64, i64, Option<i64>, Option<u64>, Option<i64>);

fn raw_event(n_keys: usize) -> impl Strategy<Value = RawEvent> {
    (
        0..n_keys,
        0i64..=12,
        // Out-of-order jitter most of the time, occasionally far late.
        prop_oneof![6 => Just(0i64), 6 => 0i64..=25, 1 => 40i64..=200],
        prop_oneof![6 => Just(None), 1 => prop::sample::select(vec![0i64, 3, 10, 25, 45]).prop_map(Some)],
        prop_oneof![2 => Just(None), 3 => (0u64..4).prop_map(Some)],
        prop_oneof![1 => Just(None), 3 => (-2i64..=6).prop_map(Some)],
    )
}

fn stream() -> impl Strategy<Value = Vec<RefEvent>> {
    (1usize..=4)
        .prop_flat_map(|n_keys| prop::collection::vec(raw_event(n_keys), 1..=60))
        .prop_map(|raws| {
            let mut clock = 1_000i64;
            raws.into_iter()
                .map(|(k, step, back, gap, dedup, value)| {
                    clock += step;
                    RefEvent {
                        key: KEYS[k].to_string(),
                        time: clock - back,
                        gap,
                        dedup,
                        value,
                    }
                })
                .collect()
        })
}

fn params_strategy() -> impl Strategy<Value = RefParams> {
    (
        0i64..=50,
        0i64..=30,
        0i64..=60,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(gap, delay, lateness, on_update, dedup)| RefParams {
            gap,
            delay,
            lateness,
            on_update,
            dedup,
        })
}

/// Where two runs first differ, for a readable failure.
fn first_difference(engine: &RefRun, reference: &RefRun) -> Option<String> {
    let n = engine.out.len().max(reference.out.len());
    for i in 0..n {
        let (e, r) = (engine.out.get(i), reference.out.get(i));
        if e != r {
            return Some(format!(
                "output record #{i}:\n  engine:    {e:?}\n  reference: {r:?}"
            ));
        }
    }
    let n = engine.late.len().max(reference.late.len());
    for i in 0..n {
        let (e, r) = (engine.late.get(i), reference.late.get(i));
        if e != r {
            return Some(format!(
                "late record #{i}:\n  engine:    {e:?}\n  reference: {r:?}"
            ));
        }
    }
    let counts = |r: &RefRun| (r.applied, r.duplicates, r.late_count);
    if counts(engine) != counts(reference) {
        return Some(format!(
            "counts (applied, duplicates, late): engine {:?}, reference {:?}",
            counts(engine),
            counts(reference)
        ));
    }
    None
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // SourceParallel cannot place files for an integration test (no lib.rs above
        // tests/); `cargo test` runs in the package root, so this is
        // crates/window/proptest-regressions/reference_props.txt.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/reference_props.txt",
        ))),
        ..ProptestConfig::default()
    }
}

/// A session's `[start, close]`.
type Span = (i64, i64);

/// Per key, the `close` of every session by `start`.
type View = std::collections::BTreeMap<String, std::collections::BTreeMap<i64, i64>>;

/// The final view of a run's output: per key, the `[start, close]` of the latest
/// record of every session not retracted.
fn final_view(run: &RefRun) -> View {
    let mut view = View::new();
    for o in &run.out {
        match o {
            RefOut::Session {
                key, start, close, ..
            } => {
                view.entry(key.clone()).or_default().insert(*start, *close);
            }
            RefOut::Retract { key, start } => {
                let removed = view.get_mut(key).and_then(|s| s.remove(start));
                assert!(
                    removed.is_some(),
                    "retraction of a session never emitted: {key} {start}"
                );
            }
        }
    }
    view
}

/// The first two sessions of one key in the final view whose `[start, close]`
/// intervals touch (bounds included): two sessions within the gap of each other.
fn touching_pair(run: &RefRun) -> Option<(String, Span, Span)> {
    for (key, sessions) in final_view(run) {
        let list: Vec<Span> = sessions.into_iter().collect();
        for (i, &a) in list.iter().enumerate() {
            for &b in &list[i + 1..] {
                if a.0 <= b.1 && b.0 <= a.1 {
                    return Some((key, a, b));
                }
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(config())]

    /// docs/semantics.md S-30: whatever arrives late, no two sessions of one
    /// key in the final output (latest revisions, retracted ones removed) are within
    /// the gap of each other — with per-event gaps, their `[start, close]` intervals
    /// never touch — for every gap, delay and lateness.
    #[test]
    fn no_two_sessions_of_a_key_are_within_the_gap(events in stream(), p in params_strategy()) {
        let engine = run_engine(&events, &p);
        if let Some((key, a, b)) = touching_pair(&engine) {
            prop_assert!(false, "key {} has sessions {:?} and {:?} within the gap\nparams: {:?}\nevents: {:?}", key, a, b, p, events);
        }
        let reference = run_reference(&events, &p);
        prop_assert_eq!(touching_pair(&reference), None, "the reference");
    }

    #[test]
    fn engine_matches_reference(events in stream(), p in params_strategy()) {
        let reference = run_reference(&events, &p);
        prop_assert_eq!(
            reference.applied + reference.duplicates + reference.late_count,
            events.len() as u64,
            "reference accounting"
        );
        if p.lateness == 0 && !p.on_update {
            // docs/semantics.md S-10: with A = 0 nothing is ever emitted twice or
            // retracted.
            for o in &reference.out {
                prop_assert!(
                    matches!(o, RefOut::Session { revision: 0, .. }),
                    "A = 0 but {:?}", o
                );
            }
        }
        let engine = run_engine(&events, &p);
        if let Some(diff) = first_difference(&engine, &reference) {
            prop_assert!(false, "engine != reference at {}\nparams: {:?}\nevents: {:?}", diff, p, events);
        }
    }

    /// An advance made in parts (`advance_at_most`, a few sessions per call, as the end
    /// of input is emitted) gives exactly the records of one `advance_to`.
    #[test]
    fn engine_in_parts_matches_reference(
        events in stream(),
        p in params_strategy(),
        parts in prop::collection::vec(1usize..=3, 1..=4),
    ) {
        let reference = run_reference(&events, &p);
        let engine = run_engine_in_parts(&events, &p, &parts);
        if let Some(diff) = first_difference(&engine, &reference) {
            prop_assert!(false, "engine in parts {:?} != reference at {}\nparams: {:?}\nevents: {:?}", parts, diff, p, events);
        }
    }

    /// Without aggregates a key's single session is stored compactly (32-bit offsets
    /// from its start, inline in the slot) and changed in place: bounds, counts,
    /// revisions, retractions and late events are still exactly the reference's, whole
    /// or in parts.
    #[test]
    fn engine_without_aggregates_matches_reference(
        events in stream(),
        p in params_strategy(),
        parts in prop::collection::vec(1usize..=3, 0..=2),
    ) {
        let mut reference = run_reference(&events, &p);
        bounds_only(&mut reference);
        let engine = run_engine_without_aggregates(&events, &p, &parts);
        if let Some(diff) = first_difference(&engine, &reference) {
            prop_assert!(false, "engine without aggregates != reference at {}\nparams: {:?}\nevents: {:?}", diff, p, events);
        }
    }
}

/// Hot-tier budgets from none at all (every key but the current one is evicted at every
/// event) to a few keys' worth.
fn hot_bytes() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 1usize..=400]
}

proptest! {
    #![proptest_config(config())]

    /// The `rocksdb` backend's logic with the in-memory spill store: keys evicted past a
    /// tiny hot tier and taken back on events and due timers give exactly the
    /// reference's records, whole or in parts.
    #[test]
    fn engine_with_a_spill_store_matches_reference(
        events in stream(),
        p in params_strategy(),
        parts in prop::collection::vec(1usize..=3, 0..=2),
        hot in hot_bytes(),
    ) {
        let reference = run_reference(&events, &p);
        let engine = run_engine_on(&events, &p, &parts, Backend::Map(hot));
        if let Some(diff) = first_difference(&engine, &reference) {
            prop_assert!(false, "engine spilling past {} bytes != reference at {}\nparams: {:?}\nevents: {:?}", hot, diff, p, events);
        }
    }
}

#[cfg(feature = "rocksdb")]
fn rocks_config() -> ProptestConfig {
    ProptestConfig {
        cases: (cases() / 4).max(1),
        ..config()
    }
}

#[cfg(feature = "rocksdb")]
proptest! {
    #![proptest_config(rocks_config())]

    /// The `rocksdb` backend: the same, with the keys (encoded by the checkpoint codec)
    /// and their timers in RocksDB's two column families.
    #[test]
    fn engine_on_rocksdb_matches_reference(
        events in stream(),
        p in params_strategy(),
        parts in prop::collection::vec(1usize..=3, 0..=2),
        hot in hot_bytes(),
    ) {
        let reference = run_reference(&events, &p);
        let engine = run_engine_on(&events, &p, &parts, Backend::Rocks(hot));
        if let Some(diff) = first_difference(&engine, &reference) {
            prop_assert!(false, "engine on RocksDB past {} bytes != reference at {}\nparams: {:?}\nevents: {:?}", hot, diff, p, events);
        }
    }
}

#[cfg(feature = "rocksdb")]
proptest! {
    #![proptest_config(rocks_config())]

    /// A rocksdb base kept as RocksDB's own checkpoint and restored from it: the store
    /// opened from the image (its keys keep their deadlines), the keys that were in
    /// memory put over it, then the run goes on — with a hot tier as tiny as before, or
    /// one that evicts nothing more (so only the restored store's own deadlines bring
    /// its keys back). Exactly the reference's records.
    #[test]
    fn engine_restored_from_a_rocksdb_base_matches_reference(
        events in stream(),
        p in params_strategy(),
        hot in hot_bytes(),
        cut in 0usize..1000,
        roomy in any::<bool>(),
    ) {
        let reference = run_reference(&events, &p);
        let at = cut % events.len().max(1);
        let hot_after = if roomy { 1 << 30 } else { hot };
        let engine = run_engine_on(&events, &p, &[], Backend::RocksRestored { hot, at, hot_after });
        if let Some(diff) = first_difference(&engine, &reference) {
            prop_assert!(false, "engine restored after event {} (hot {} then {}) != reference at {}\nparams: {:?}\nevents: {:?}", at, hot, hot_after, diff, p, events);
        }
    }
}

/// The reference's records without their aggregates.
fn bounds_only(run: &mut RefRun) {
    for o in &mut run.out {
        if let RefOut::Session {
            collect,
            first,
            last,
            sum,
            count_distinct,
            min,
            max,
            ..
        } = o
        {
            collect.clear();
            *first = None;
            *last = None;
            *sum = None;
            *count_distinct = 0;
            *min = None;
            *max = None;
        }
    }
}

/// The final view of a run: each session's latest record, retracted ones removed,
/// in `(close, key, start)` order.
fn latest_records(run: &RefRun) -> Vec<RefOut> {
    let mut latest: std::collections::BTreeMap<(String, i64), RefOut> = Default::default();
    for o in &run.out {
        match o {
            RefOut::Session { key, start, .. } => {
                latest.insert((key.clone(), *start), o.clone());
            }
            RefOut::Retract { key, start } => {
                latest.remove(&(key.clone(), *start));
            }
        }
    }
    let mut out: Vec<RefOut> = latest.into_values().collect();
    out.sort_by_key(|o| match o {
        RefOut::Session {
            key, start, close, ..
        } => (*close, key.clone(), *start),
        RefOut::Retract { .. } => unreachable!("removed"),
    });
    out
}

proptest! {
    #![proptest_config(config())]

    /// docs/semantics.md S-18a: `--emit final` writes each session once, when it can no
    /// longer change, in `(close, key, start)` order: exactly the final view of an
    /// `on-close` run (revision 0, no retraction), with the same late verdicts — in
    /// memory and with keys evicted to a spill store.
    #[test]
    fn final_emission_is_the_final_view_of_on_close(events in stream(), p in params_strategy()) {
        let p = RefParams { on_update: false, ..p };
        let on_close = run_engine(&events, &p);
        let want: Vec<RefOut> = latest_records(&on_close)
            .into_iter()
            .map(|o| match o {
                RefOut::Session { key, start, end, close, count, complete, collect, first, last, sum, count_distinct, min, max, .. } =>
                    RefOut::Session { key, start, end, close, count, revision: 0, complete, collect, first, last, sum, count_distinct, min, max },
                r => r,
            })
            .collect();
        for backend in [Backend::Memory, Backend::Map(2)] {
            let got = run_engine_final(&events, &p, backend);
            prop_assert_eq!(&got.out, &want, "params: {:?}\nevents: {:?}", p, events);
            prop_assert_eq!(&got.late, &on_close.late);
            prop_assert_eq!(
                (got.applied, got.duplicates, got.late_count),
                (on_close.applied, on_close.duplicates, on_close.late_count)
            );
        }
    }
}
