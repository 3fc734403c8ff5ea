//! Shared test support: the naive reference model, builders, the hand-worked rule
//! scenarios (run against the reference in `reference_props.rs` and against the engine
//! in `rules.rs`), and the engine adapter.
#![allow(dead_code, unused_imports)]

pub mod reference;

pub use engine::{
    Backend, run_engine, run_engine_final, run_engine_in_parts, run_engine_on,
    run_engine_without_aggregates,
};
pub use reference::{RefEvent, RefLate, RefOut, RefParams, RefRun, run_reference};

// ---------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------

pub fn ev(key: &str, time: i64) -> RefEvent {
    RefEvent {
        key: key.to_string(),
        time,
        gap: None,
        dedup: None,
        value: None,
    }
}

pub trait EvExt {
    fn gap(self, g: i64) -> Self;
    fn dedup(self, d: u64) -> Self;
    fn val(self, v: i64) -> Self;
}

impl EvExt for RefEvent {
    fn gap(mut self, g: i64) -> Self {
        self.gap = Some(g);
        self
    }
    fn dedup(mut self, d: u64) -> Self {
        self.dedup = Some(d);
        self
    }
    fn val(mut self, v: i64) -> Self {
        self.value = Some(v);
        self
    }
}

pub fn params(gap: i64, delay: i64, lateness: i64) -> RefParams {
    RefParams {
        gap,
        delay,
        lateness,
        on_update: false,
        dedup: false,
    }
}

/// A complete session record whose events carry no values.
pub fn sess(key: &str, start: i64, end: i64, close: i64, count: u64, revision: u32) -> RefOut {
    RefOut::Session {
        key: key.to_string(),
        start,
        end,
        close,
        count,
        revision,
        complete: true,
        collect: vec![],
        first: None,
        last: None,
        sum: None,
        count_distinct: 0,
        min: None,
        max: None,
    }
}

/// The same as an on-update record of a still-open session.
pub fn open(key: &str, start: i64, end: i64, close: i64, count: u64, revision: u32) -> RefOut {
    match sess(key, start, end, close, count, revision) {
        RefOut::Session {
            key,
            start,
            end,
            close,
            count,
            revision,
            collect,
            first,
            last,
            sum,
            count_distinct,
            min,
            max,
            ..
        } => RefOut::Session {
            key,
            start,
            end,
            close,
            count,
            revision,
            complete: false,
            collect,
            first,
            last,
            sum,
            count_distinct,
            min,
            max,
        },
        RefOut::Retract { .. } => unreachable!(),
    }
}

pub fn retract(key: &str, start: i64) -> RefOut {
    RefOut::Retract {
        key: key.to_string(),
        start,
    }
}

pub fn late(index: usize, reason: &'static str, watermark: i64) -> RefLate {
    RefLate {
        index,
        reason,
        watermark,
    }
}

// ---------------------------------------------------------------------------------------
// Hand-worked scenarios. Every expected output below was derived by hand from the rules
// of docs/semantics.md (the derivation is in the comments), never by
// running code. Notation: "W" is the watermark before an event, "W'" the one after it.
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub params: RefParams,
    pub events: Vec<RefEvent>,
    pub expected: RefRun,
}

fn run(out: Vec<RefOut>, late: Vec<RefLate>, applied: u64, duplicates: u64) -> RefRun {
    let late_count = late.len() as u64;
    RefRun {
        out,
        late,
        applied,
        duplicates,
        late_count,
    }
}

/// Events exactly G apart chain into one session (the gap rule is inclusive).
pub fn exact_gap() -> Scenario {
    // G=10 D=0 A=0.
    // k@0: applied, W'=0; session [0] close 10 > 0.
    // k@10: W=0; touches [0..10] (10 <= 10); R={0,10} close 20; 20 > 0: applied. W'=10.
    // end: the one session, close 20.
    Scenario {
        name: "exact_gap",
        params: params(10, 0, 0),
        events: vec![ev("k", 0), ev("k", 10)],
        expected: run(vec![sess("k", 0, 10, 20, 2, 0)], vec![], 2, 0),
    }
}

/// Events G+1 apart are two sessions; the first completes when W reaches its close.
pub fn gap_plus_one() -> Scenario {
    // G=10 D=0 A=0.
    // k@0: W'=0. k@11: 11 > close 10: new session; W'=11 >= 10: [0] completes (rev 0),
    // and becomes final (10+0 <= 11). end: [11] close 21.
    Scenario {
        name: "gap_plus_one",
        params: params(10, 0, 0),
        events: vec![ev("k", 0), ev("k", 11)],
        expected: run(
            vec![sess("k", 0, 0, 10, 1, 0), sess("k", 11, 11, 21, 1, 0)],
            vec![],
            2,
            0,
        ),
    }
}

/// An out-of-order event bridging two open sessions merges them; aggregates follow
/// event-time order.
pub fn bridge_open() -> Scenario {
    // G=10 D=100 A=0: W stays far behind, nothing completes before the end.
    // k@0 v1 -> [0] close 10. k@15 v2: 15 > 10 -> new [15] close 25.
    // k@8 v3: touches [0] (8 <= 10) and [15] (15 <= 18) -> one session {0,8,15} close 25.
    // Nothing was emitted: no retraction. end: collect in time order [1,3,2].
    Scenario {
        name: "bridge_open",
        params: params(10, 100, 0),
        events: vec![ev("k", 0).val(1), ev("k", 15).val(2), ev("k", 8).val(3)],
        expected: run(
            vec![RefOut::Session {
                key: "k".into(),
                start: 0,
                end: 15,
                close: 25,
                count: 3,
                revision: 0,
                complete: true,
                collect: vec![1, 3, 2],
                first: Some(1),
                last: Some(2),
                sum: Some(6),
                count_distinct: 3,
                min: Some(1),
                max: Some(3),
            }],
            vec![],
            3,
            0,
        ),
    }
}

/// The same bridge in on-update mode: both parts were emitted as updates, so the part
/// whose start is not the merged start is retracted; the merged session continues the
/// revisions of the part that keeps its id.
pub fn bridge_open_on_update() -> Scenario {
    // G=10 D=100 A=0 on-update.
    // k@0: update [0] rev 0 (close 10 > W'=-100). k@15: update [15] rev 0.
    // k@8: R={0,8,15}; both parts emitted; [15] start != 0 -> retract(k,15);
    //      R keeps the emitted mark (part [0] has start 0), next rev = max(1,1) = 1;
    //      update rev 1 (close 25 > W'=-85).
    // end: completion rev 2.
    let mut p = params(10, 100, 0);
    p.on_update = true;
    Scenario {
        name: "bridge_open_on_update",
        params: p,
        events: vec![ev("k", 0), ev("k", 15), ev("k", 8)],
        expected: run(
            vec![
                open("k", 0, 0, 10, 1, 0),
                open("k", 15, 15, 25, 1, 0),
                retract("k", 15),
                open("k", 0, 15, 25, 3, 1),
                sess("k", 0, 15, 25, 3, 2),
            ],
            vec![],
            3,
            0,
        ),
    }
}

/// In one step the update record of the changed session comes before the completions.
pub fn on_update_order() -> Scenario {
    // G=10 D=0 A=0 on-update.
    // k@0: W'=0, update [0] rev0. k@10: R={0,10} close 20 > W'=10: update rev1.
    // k@25: 25 > 20, new [25] close 35 > W'=25: update [25] rev0; then completion of
    //       {0,10} (close 20 <= 25) rev 2.
    // end: completion of [25] rev 1.
    let mut p = params(10, 0, 0);
    p.on_update = true;
    Scenario {
        name: "on_update_order",
        params: p,
        events: vec![ev("k", 0), ev("k", 10), ev("k", 25)],
        expected: run(
            vec![
                open("k", 0, 0, 10, 1, 0),
                open("k", 0, 10, 20, 2, 1),
                open("k", 25, 25, 35, 1, 0),
                sess("k", 0, 10, 20, 2, 2),
                sess("k", 25, 25, 35, 1, 1),
            ],
            vec![],
            3,
            0,
        ),
    }
}

/// On-update: a late event applied to a complete session (close stays <= W') gets only a
/// completion record, no update record.
pub fn on_update_late_applied() -> Scenario {
    // G=10 D=0 A=20 on-update.
    // k@0: update [0] rev0 (close 10 > 0).
    // x@25: update [x25] rev0 (close 35 > 25); completion k[0] (10 <= 25) rev1.
    // k@5: W=25; R={0,5} close 15; 15+20=35 > 25 applied; same start, no retraction;
    //      close 15 <= W'=25 -> no update; completion rev 2.
    // end: x[25] completion rev 1.
    let mut p = params(10, 0, 20);
    p.on_update = true;
    Scenario {
        name: "on_update_late_applied",
        params: p,
        events: vec![ev("k", 0), ev("x", 25), ev("k", 5)],
        expected: run(
            vec![
                open("k", 0, 0, 10, 1, 0),
                open("x", 25, 25, 35, 1, 0),
                sess("k", 0, 0, 10, 1, 1),
                sess("k", 0, 5, 15, 2, 2),
                sess("x", 25, 25, 35, 1, 1),
            ],
            vec![],
            3,
            0,
        ),
    }
}

/// close(R) + A == W is too late; close(R) + A == W + 1 is applied. Completions at the
/// end come in (close, key, start) order.
pub fn window_end_at_watermark() -> Scenario {
    // G=10 D=0 A=0.
    // a@100: W'=100.
    // b@90: W=100; R={90} close 100; 100+0 <= 100 -> too late, window_closed, W 100.
    //       maxT stays 100.
    // b@91: W=100; close 101 > 100 -> applied; 101 > W'=100, nothing completes.
    // end: b (close 101) before a (close 110).
    Scenario {
        name: "window_end_at_watermark",
        params: params(10, 0, 0),
        events: vec![ev("a", 100), ev("b", 90), ev("b", 91)],
        expected: run(
            vec![sess("b", 91, 91, 101, 1, 0), sess("a", 100, 100, 110, 1, 0)],
            vec![late(1, "window_closed", 100)],
            2,
            0,
        ),
    }
}

/// Late events within the allowed lateness are applied (and re-emitted with the next
/// revision); beyond it they are too late.
pub fn lateness_within_and_beyond() -> Scenario {
    // G=10 D=0 A=20.
    // 0 k@0: W'=0.
    // 1 x@25: W'=25; k[0] close 10 <= 25 -> completion rev0; 10+20=30 > 25, not final.
    // 2 k@5: W=25; R={0,5} close 15; 35 > 25 -> applied; same start; completion rev1
    //        (15 <= 25).
    // 3 x@50: new x[50] (50 > 35); W'=50: x[25] completes rev0 (35 <= 50);
    //        k{0,5} final (15+20 <= 50) and forgotten in the same step (15+20+10 <= 50);
    //        x[25]: 35+20=55 > 50 stays.
    // 4 k@8: W=50; R={8} close 18; 38 <= 50 -> window_closed, W 50.
    // 5 x@30: W=50; touches x[25] (30 <= 35): R={25,30} close 40; 60 > 50 -> applied;
    //        same start; completion rev1 (40 <= 50).
    // end: x[50] close 60 rev0.
    Scenario {
        name: "lateness_within_and_beyond",
        params: params(10, 0, 20),
        events: vec![
            ev("k", 0),
            ev("x", 25),
            ev("k", 5),
            ev("x", 50),
            ev("k", 8),
            ev("x", 30),
        ],
        expected: run(
            vec![
                sess("k", 0, 0, 10, 1, 0),
                sess("k", 0, 5, 15, 2, 1),
                sess("x", 25, 25, 35, 1, 0),
                sess("x", 25, 30, 40, 2, 1),
                sess("x", 50, 50, 60, 1, 0),
            ],
            vec![late(4, "window_closed", 50)],
            5,
            0,
        ),
    }
}

/// A late event that moves an emitted session's start: retraction of the old id, the
/// session under its new id with revision 1.
pub fn late_moves_start() -> Scenario {
    // G=10 D=0 A=20.
    // k@10: W'=10. x@25: W'=25; k[10] completes rev0 (20 <= 25); 40 > 25 not final.
    // k@5: W=25; touches k[10] (5 <= 20, 10 <= 15): R={5,10} close 20; 40 > 25 applied;
    //      old start 10 != 5 and emitted -> retract(k,10); next rev 1; completes now
    //      (20 <= 25) with rev 1.
    // end: x[25] close 35.
    Scenario {
        name: "late_moves_start",
        params: params(10, 0, 20),
        events: vec![ev("k", 10), ev("x", 25), ev("k", 5)],
        expected: run(
            vec![
                sess("k", 10, 10, 20, 1, 0),
                retract("k", 10),
                sess("k", 5, 10, 20, 2, 1),
                sess("x", 25, 25, 35, 1, 0),
            ],
            vec![],
            3,
            0,
        ),
    }
}

/// A late event that merges two emitted sessions: one retraction (the later start), the
/// merged session with revision 1.
pub fn late_merges_emitted() -> Scenario {
    // G=10 D=0 A=30.
    // k@0: W'=0. k@15: new [15]; W'=15: k[0] completes rev0 (10 <= 15).
    // x@30: W'=30: k[15] completes rev0 (25 <= 30). No finals (10+30 > 30).
    // k@8: W=30; touches [0] and [15]; R={0,8,15} close 25; 55 > 30 applied;
    //      retract(k,15); next rev max(1,1) = 1; completes (25 <= 30) rev 1.
    // end: x[30] close 40.
    Scenario {
        name: "late_merges_emitted",
        params: params(10, 0, 30),
        events: vec![ev("k", 0), ev("k", 15), ev("x", 30), ev("k", 8)],
        expected: run(
            vec![
                sess("k", 0, 0, 10, 1, 0),
                sess("k", 15, 15, 25, 1, 0),
                retract("k", 15),
                sess("k", 0, 15, 25, 3, 1),
                sess("x", 30, 30, 40, 1, 0),
            ],
            vec![],
            4,
            0,
        ),
    }
}

/// Duplicates: same dedup value within the session it would join; no dedup value is
/// never a duplicate; a different session is no duplicate; lateness is judged first.
pub fn dedup_basic() -> Scenario {
    // G=10 D=0 A=0 dedup.
    // 0 k@0 d7: applied, W'=0. 1 k@5 d7: joins [0] which holds d7 -> duplicate, W'=5.
    // 2 k@6 (none): applied. 3 k@7 (none): applied (no value, never a duplicate).
    // 4 k@30 d7: 30 > 17 -> new session, no duplicate; W'=30: {0,6,7} completes
    //   (close 17), then final.
    // 5 k@1 d7: W=30; R={1} close 11 <= 30 -> window_closed (before any dedup check).
    // end: [30].
    let mut p = params(10, 0, 0);
    p.dedup = true;
    Scenario {
        name: "dedup_basic",
        params: p,
        events: vec![
            ev("k", 0).dedup(7),
            ev("k", 5).dedup(7),
            ev("k", 6),
            ev("k", 7),
            ev("k", 30).dedup(7),
            ev("k", 1).dedup(7),
        ],
        expected: run(
            vec![sess("k", 0, 7, 17, 3, 0), sess("k", 30, 30, 40, 1, 0)],
            vec![late(5, "window_closed", 30)],
            4,
            1,
        ),
    }
}

/// Duplicate detection looks into every session the event would merge.
pub fn dedup_across_merge() -> Scenario {
    // G=10 D=100 A=0 dedup.
    // m@0 d1 -> [0]. m@15 d2 -> [15]. m@8 d2: would merge [0] and [15]; [15] holds d2
    // -> duplicate. m@8 d3: applied, merges. end: {0,8,15} close 25.
    let mut p = params(10, 100, 0);
    p.dedup = true;
    Scenario {
        name: "dedup_across_merge",
        params: p,
        events: vec![
            ev("m", 0).dedup(1),
            ev("m", 15).dedup(2),
            ev("m", 8).dedup(2),
            ev("m", 8).dedup(3),
        ],
        expected: run(vec![sess("m", 0, 15, 25, 3, 0)], vec![], 3, 1),
    }
}

/// Without dedup the same stream applies everything.
pub fn dedup_off() -> Scenario {
    let mut s = dedup_across_merge();
    s.name = "dedup_off";
    s.params.dedup = false;
    s.expected = run(vec![sess("m", 0, 15, 25, 4, 0)], vec![], 4, 0);
    s
}

/// Per-event gaps: each event covers [t, t+g]; close = max(t+g).
pub fn per_event_gaps() -> Scenario {
    // G=10 D=100 A=0: nothing completes before the end.
    // k@0 g30 -> [0,30]. k@25 (g10) -> 25 <= 30 joins; close max(30,35)=35.
    // k@50 g5 -> [50,55], new. k@40 g2 -> [40,42]: 40 > 35, and [50..55] starts after 42:
    // new. k@44 g6 -> [44,50]: 44 > 42; touches [50..55] (50 <= 50): {44,50} close 55.
    // j@0 g50 -> [0,50]; j@10 (g10) joins; close stays 50.
    // end, by close: k{0,25} 35, k{40} 42, j{0,10} 50, k{44,50} 55.
    Scenario {
        name: "per_event_gaps",
        params: params(10, 100, 0),
        events: vec![
            ev("k", 0).gap(30),
            ev("k", 25),
            ev("k", 50).gap(5),
            ev("k", 40).gap(2),
            ev("k", 44).gap(6),
            ev("j", 0).gap(50),
            ev("j", 10),
        ],
        expected: run(
            vec![
                sess("k", 0, 25, 35, 2, 0),
                sess("k", 40, 40, 42, 1, 0),
                sess("j", 0, 10, 50, 2, 0),
                sess("k", 44, 50, 55, 2, 0),
            ],
            vec![],
            7,
            0,
        ),
    }
}

/// An event that would join a final session is too late ("session_final") even though
/// its own window is still open; one just past the final session is applied.
pub fn session_final_rejection() -> Scenario {
    // G=10 D=0 A=5.
    // k@0: W'=0. x@20: W'=20; k[0] completes rev0 (10 <= 20) and is final (15 <= 20);
    //      remembered until W >= 10+5+10 = 25.
    // k@10: W=20; R={10} close 20; 25 > 20 so not window_closed; touches final [0,10]
    //       (10 <= 10) -> session_final, W 20.
    // k@12: W=20; close 22; 27 > 20; [12,22] does not touch [0,10] -> applied.
    // end by close: k[12] 22, x[20] 30.
    Scenario {
        name: "session_final_rejection",
        params: params(10, 0, 5),
        events: vec![ev("k", 0), ev("x", 20), ev("k", 10), ev("k", 12)],
        expected: run(
            vec![
                sess("k", 0, 0, 10, 1, 0),
                sess("k", 12, 12, 22, 1, 0),
                sess("x", 20, 20, 30, 1, 0),
            ],
            vec![late(2, "session_final", 20)],
            3,
            0,
        ),
    }
}

/// Aggregates: (time, input order) order, nulls skipped, empty results.
pub fn aggregates() -> Scenario {
    // G=10 D=100 A=0.
    // k: (5,#0,3) (0,#1,-) (5,#2,1) (2,#3,3) (8,#4,-); order by (time, index):
    //    (0,#1,-) (2,#3,3) (5,#0,3) (5,#2,1) (8,#4,-) -> collect [3,3,1], first 3, last 1,
    //    sum 7, distinct 2, min 1, max 3. close 18.
    // e@100 without value: collect [], everything null, distinct 0. close 110.
    Scenario {
        name: "aggregates",
        params: params(10, 100, 0),
        events: vec![
            ev("k", 5).val(3),
            ev("k", 0),
            ev("k", 5).val(1),
            ev("k", 2).val(3),
            ev("k", 8),
            ev("e", 100),
        ],
        expected: run(
            vec![
                RefOut::Session {
                    key: "k".into(),
                    start: 0,
                    end: 8,
                    close: 18,
                    count: 5,
                    revision: 0,
                    complete: true,
                    collect: vec![3, 3, 1],
                    first: Some(3),
                    last: Some(1),
                    sum: Some(7),
                    count_distinct: 2,
                    min: Some(1),
                    max: Some(3),
                },
                sess("e", 100, 100, 110, 1, 0),
            ],
            vec![],
            6,
            0,
        ),
    }
}

/// Completions of one step come in (close, key bytes, start) order.
pub fn completion_order() -> Scenario {
    // G=10 D=0 A=0, per-event gaps to get equal closes (input in time order, D=0).
    // b@0 g20: [0,20], W'=0. a@5 g15: [5,20], W'=5. c@8 g5: [8,13], W'=8.
    // a@19 g1: [19,20] touches a[5,20] -> close max(20,20)=20; W'=19: c (13 <= 19)
    // completes.
    // z@40: W'=40: a{5,19} close 20 and b[0] close 20 complete: order (20,"a",5),
    // (20,"b",0). end: z.
    Scenario {
        name: "completion_order",
        params: params(10, 0, 0),
        events: vec![
            ev("b", 0).gap(20),
            ev("a", 5).gap(15),
            ev("c", 8).gap(5),
            ev("a", 19).gap(1),
            ev("z", 40),
        ],
        expected: run(
            vec![
                sess("c", 8, 8, 13, 1, 0),
                sess("a", 5, 19, 20, 2, 0),
                sess("b", 0, 0, 20, 1, 0),
                sess("z", 40, 40, 50, 1, 0),
            ],
            vec![],
            5,
            0,
        ),
    }
}

/// A session whose emitted id was retracted does not carry the "emitted" mark: when its
/// start moves again before it is emitted, nothing more is retracted.
pub fn retracted_id_not_retracted_again() -> Scenario {
    // G=10 D=0 A=100.
    // 0 k@10: W'=10. 1 x@30: W'=30; k[10] completes rev0 (close 20 <= 30).
    // 2 k@5 g40: W=30; touches k[10] (5 <= 20, 10 <= 45): R={5,10} close 45; 145 > 30
    //   applied; emitted part start 10 != 5 -> retract(k,10); R not emitted (no emitted
    //   part starts at 5), next rev 1; 45 > W'=30: not complete.
    // 3 k@2: W=30; touches R [5,45] (2 <= 45, 5 <= 12): R'={2,5,10} close 45; applied;
    //   R was never emitted -> no retraction; next rev stays 1.
    // end by close: x[30] 40, k{2,5,10} 45 rev 1.
    Scenario {
        name: "retracted_id_not_retracted_again",
        params: params(10, 0, 100),
        events: vec![ev("k", 10), ev("x", 30), ev("k", 5).gap(40), ev("k", 2)],
        expected: run(
            vec![
                sess("k", 10, 10, 20, 1, 0),
                retract("k", 10),
                sess("x", 30, 30, 40, 1, 0),
                sess("k", 2, 10, 45, 3, 1),
            ],
            vec![],
            4,
            0,
        ),
    }
}

/// A final session's bounds are forgotten at W >= close + A + Gmax; from then on the
/// floor stands in for them: an event that would have touched them is still too late.
pub fn final_forgotten_at_boundary() -> Scenario {
    // G=10 D=0 A=5, Gmax = 10 until event 3.
    // 0 k@0: W'=0 (k's floor: W was -inf). 1 x@20: W'=20; k[0] completes rev0
    //   (10 <= 20) and is final (15 <= 20); forgotten at W >= 10+5+10 = 25.
    // 2 y@25: W'=25: k's final bounds forgotten, its floor raised to 10; k has no state
    //   left and goes. New keys' floor: the largest W - A - Gmax so far, 25-5-10 = 10.
    // 3 k@10 g40: W=25; Gmax=40; R={10} close 50; 55 > 25 (not window_closed); no state,
    //   but 10 <= the floor of new keys, 10 -> session_final. (Without the floor it was
    //   applied: [10, 50] touches the forgotten [0, 10]. With the plain W - A - Gmax at
    //   creation, 25-5-40 = -20, it would be applied too: S-30's larger-gap case.)
    // end by close: x 30, y 35.
    Scenario {
        name: "final_forgotten_at_boundary",
        params: params(10, 0, 5),
        events: vec![ev("k", 0), ev("x", 20), ev("y", 25), ev("k", 10).gap(40)],
        expected: run(
            vec![
                sess("k", 0, 0, 10, 1, 0),
                sess("x", 20, 20, 30, 1, 0),
                sess("y", 25, 25, 35, 1, 0),
            ],
            vec![late(3, "session_final", 25)],
            3,
            0,
        ),
    }
}

const MIN: i64 = 60_000;

/// The example of issue 9, in minutes: a visit's first session S1 is final and
/// forgotten, a live session S2 starts 12 minutes after it, and a late event 4 minutes
/// after S1 would join S2 (within the gap of its start): it is turned away by the
/// key's floor. An event just after the floor is applied.
pub fn floor_issue_example() -> Scenario {
    // G=10m D=1m A=0.
    // 0 k@0: W'=-1m; S1 [0] close 10m. k's floor: W was -inf -> -inf.
    // 1 k@12m: 12m > 10m -> new S2 [12m] close 22m; W'=11m: S1 completes rev0 and is
    //   final (10m+0 <= 11m); forgotten at W >= 10m+0+10m = 20m.
    // 2 k@20m: joins S2 -> [12m,20m] close 30m; W'=19m.
    // 3 k@21m: joins S2 -> [12m,21m] close 31m; W'=20m: S1's bounds forgotten, k's floor
    //   raised to 10m.
    // 4 k@4m: W=20m; [4m,14m] touches S2 (12m <= 14m): R={4m,12m,20m,21m} close 31m;
    //   31m > 20m, not window_closed; no final bounds; 4m <= floor 10m -> session_final.
    //   (Without the floor: applied, S2 = [4m, 21m], 4 minutes after S1.)
    // 5 k@11m: W=20m; [11m,21m] touches S2: close 31m > 20m; 11m > floor 10m ->
    //   applied; S2's start moves to 11m (never emitted: no retraction), 11 minutes
    //   after S1: more than the gap.
    // end: S2 [11m,21m] close 31m, 4 events, rev 0.
    Scenario {
        name: "floor_issue_example",
        params: params(10 * MIN, MIN, 0),
        events: vec![
            ev("k", 0),
            ev("k", 12 * MIN),
            ev("k", 20 * MIN),
            ev("k", 21 * MIN),
            ev("k", 4 * MIN),
            ev("k", 11 * MIN),
        ],
        expected: run(
            vec![
                sess("k", 0, 0, 10 * MIN, 1, 0),
                sess("k", 11 * MIN, 21 * MIN, 31 * MIN, 4, 0),
            ],
            vec![late(4, "session_final", 20 * MIN)],
            5,
            0,
        ),
    }
}

/// The chain of docs/semantics.md S-30: a live session extended backwards towards a
/// session whose bounds were forgotten stops at the key's floor. An event at or below
/// the floor whose own session would already be closed is `window_closed` (S-20).
pub fn floor_chain() -> Scenario {
    // G=10 D=0 A=0.
    // 0 k@90: W'=90; [90] close 100; k's floor -inf (W was -inf).
    // 1 k@105: 105 > 100 -> new [105] close 115; W'=105: [90] completes rev0 and is
    //   final (100 <= 105); forgotten at W >= 100+0+10 = 110.
    // 2 k@110: joins [105] -> [105,110] close 120; W'=110: [90]'s bounds forgotten, k's
    //   floor raised to 100.
    // 3 k@95: W=110; [95,105] touches [105,110]: R close 120 > 110, not window_closed;
    //   95 <= floor 100 -> session_final.
    // 4 k@80: W=110; [80,90] touches nothing: R={80} close 90 <= 110 -> window_closed,
    //   judged before the floor.
    // end: [105,110] close 120.
    Scenario {
        name: "floor_chain",
        params: params(10, 0, 0),
        events: vec![
            ev("k", 90),
            ev("k", 105),
            ev("k", 110),
            ev("k", 95),
            ev("k", 80),
        ],
        expected: run(
            vec![sess("k", 90, 90, 100, 1, 0), sess("k", 105, 110, 120, 2, 0)],
            vec![late(3, "session_final", 110), late(4, "window_closed", 110)],
            3,
            0,
        ),
    }
}

/// Per-event gaps: a key forgotten under a small largest gap comes back with an event
/// of a larger gap. Its new floor is the largest W - A - Gmax so far, not the one of
/// this moment (which the larger gap lowered): the event reaching back over the
/// forgotten session is too late, one just after it is applied.
pub fn floor_after_a_larger_gap() -> Scenario {
    // G=10 D=0 A=0.
    // 0 k@90: W'=90; [90] close 100.
    // 1 x@110: W'=110: k[90] completes rev0, is final and forgotten (110 >= 100+0+10);
    //   k has no state left. New keys' floor: 110-0-10 = 100.
    // 2 k@95 g50: Gmax=50; no state; [95,145]: 145 > 110, not window_closed; 95 <= 100
    //   -> session_final. (W - A - Gmax now is 110-0-50 = 60: a floor of 60 would apply
    //   it, and [95,145] would overlap the forgotten [90,100].)
    // 3 k@101 g50: 101 > 100 -> applied, new state, [101] close 151. W'=110.
    // end by close: x 120, k 151.
    Scenario {
        name: "floor_after_a_larger_gap",
        params: params(10, 0, 0),
        events: vec![
            ev("k", 90),
            ev("x", 110),
            ev("k", 95).gap(50),
            ev("k", 101).gap(50),
        ],
        expected: run(
            vec![
                sess("k", 90, 90, 100, 1, 0),
                sess("x", 110, 110, 120, 1, 0),
                sess("k", 101, 101, 151, 1, 0),
            ],
            vec![late(2, "session_final", 110)],
            3,
            0,
        ),
    }
}

/// One millisecond earlier the final bounds are still remembered: "session_final".
pub fn final_remembered_before_boundary() -> Scenario {
    // As final_forgotten_at_boundary with y@24: at W'=24 < 25 k's final [0,10] stays.
    // 3 k@10 g40: W=24; close 50+5 > 24; touches final [0,10] (10 <= 10) ->
    //   session_final, W 24.
    // end by close: x 30, y 34.
    Scenario {
        name: "final_remembered_before_boundary",
        params: params(10, 0, 5),
        events: vec![ev("k", 0), ev("x", 20), ev("y", 24), ev("k", 10).gap(40)],
        expected: run(
            vec![
                sess("k", 0, 0, 10, 1, 0),
                sess("x", 20, 20, 30, 1, 0),
                sess("y", 24, 24, 34, 1, 0),
            ],
            vec![late(3, "session_final", 24)],
            3,
            0,
        ),
    }
}

/// The same bridge when the later session was created first (the key's sessions are not
/// stored in start order).
pub fn bridge_created_out_of_order() -> Scenario {
    // G=10 D=100 A=0.
    // k@15 v2 -> [15] close 25. k@0 v1: [0,10] does not reach 15 -> new [0] close 10.
    // k@8 v3: touches [0] (8 <= 10) and [15] (15 <= 18) -> {0,8,15} close 25.
    // end: collect in time order [1,3,2].
    Scenario {
        name: "bridge_created_out_of_order",
        params: params(10, 100, 0),
        events: vec![ev("k", 15).val(2), ev("k", 0).val(1), ev("k", 8).val(3)],
        expected: run(
            vec![RefOut::Session {
                key: "k".into(),
                start: 0,
                end: 15,
                close: 25,
                count: 3,
                revision: 0,
                complete: true,
                collect: vec![1, 3, 2],
                first: Some(1),
                last: Some(2),
                sum: Some(6),
                count_distinct: 3,
                min: Some(1),
                max: Some(3),
            }],
            vec![],
            3,
            0,
        ),
    }
}

/// The bridge of an emitted earlier session and an open later one, the earlier created
/// second (the property test's first minimal failure).
pub fn bridge_emitted_created_out_of_order() -> Scenario {
    // G=2 D=0 A=2.
    // a@1000: W'=1000; [1000] close 1002.
    // a@997: W=1000; [997,999] does not reach 1000 -> new session; 999+2 > 1000 applied;
    //   W'=1000: [997] completes rev0 (999 <= 1000), not final (1001 > 1000).
    // a@999: W=1000; touches [997] (999 <= 999) and [1000] (1000 <= 1001) ->
    //   {997,999,1000} close 1002; 1004 > 1000 applied; the emitted part keeps the start
    //   -> no retraction, next rev 1; 1002 > W'=1000: open.
    // end: rev 1.
    Scenario {
        name: "bridge_emitted_created_out_of_order",
        params: params(2, 0, 2),
        events: vec![ev("a", 1000), ev("a", 997), ev("a", 999)],
        expected: run(
            vec![
                sess("a", 997, 997, 999, 1, 0),
                sess("a", 997, 1000, 1002, 3, 1),
            ],
            vec![],
            3,
            0,
        ),
    }
}

pub fn all_scenarios() -> Vec<Scenario> {
    vec![
        exact_gap(),
        gap_plus_one(),
        bridge_open(),
        bridge_open_on_update(),
        on_update_order(),
        on_update_late_applied(),
        window_end_at_watermark(),
        lateness_within_and_beyond(),
        late_moves_start(),
        late_merges_emitted(),
        dedup_basic(),
        dedup_across_merge(),
        dedup_off(),
        per_event_gaps(),
        session_final_rejection(),
        aggregates(),
        completion_order(),
        retracted_id_not_retracted_again(),
        final_forgotten_at_boundary(),
        final_remembered_before_boundary(),
        bridge_created_out_of_order(),
        bridge_emitted_created_out_of_order(),
        floor_issue_example(),
        floor_chain(),
        floor_after_a_larger_gap(),
    ]
}

// ---------------------------------------------------------------------------------------
// The engine adapter: drives `SessionOperator` the way the job does and translates its
// output into the reference's types.
// ---------------------------------------------------------------------------------------

pub mod engine {
    use super::{RefEvent, RefLate, RefOut, RefParams, RefRun};
    use sessionizer_core::{DurationMs, EventTime, Watermark};
    use sessionizer_window::spill::MapSpill;
    use sessionizer_window::{
        AggKind, BoundedOutOfOrderness, Emit, EmitMode, Event, LateReason, SessionOperator,
        SessionView, Verdict, WindowConfig,
    };

    /// The aggregates every run computes, all over the one value field, in the order
    /// the reference's record lists them.
    const AGGS: [AggKind; 7] = [
        AggKind::Collect,
        AggKind::First,
        AggKind::Last,
        AggKind::Sum,
        AggKind::CountDistinct,
        AggKind::Min,
        AggKind::Max,
    ];

    #[derive(Default)]
    struct Sink {
        out: Vec<RefOut>,
    }

    fn key_text(key: &[u8]) -> String {
        String::from_utf8(key.to_vec()).expect("keys are UTF-8 in these tests")
    }

    fn json(a: &sessionizer_window::AggState) -> serde_json::Value {
        let mut buf = Vec::new();
        a.write_json(&mut buf);
        serde_json::from_slice(&buf).unwrap_or_else(|e| {
            panic!(
                "aggregate {a:?} wrote invalid JSON {:?}: {e}",
                String::from_utf8_lossy(&buf)
            )
        })
    }

    fn opt_int(v: &serde_json::Value) -> Option<i64> {
        if v.is_null() {
            None
        } else {
            Some(v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}")))
        }
    }

    impl Emit for Sink {
        fn session(&mut self, s: &SessionView<'_>) {
            if s.aggregates.is_empty() {
                self.out.push(RefOut::Session {
                    key: key_text(s.key),
                    start: s.start.millis(),
                    end: s.end.millis(),
                    close: s.close.millis(),
                    count: s.event_count,
                    revision: s.revision,
                    complete: s.complete,
                    collect: vec![],
                    first: None,
                    last: None,
                    sum: None,
                    count_distinct: 0,
                    min: None,
                    max: None,
                });
                return;
            }
            assert_eq!(s.aggregates.len(), AGGS.len());
            let a: Vec<serde_json::Value> = s.aggregates.iter().map(json).collect();
            let collect = a[0]
                .as_array()
                .unwrap_or_else(|| panic!("collect is not an array: {}", a[0]))
                .iter()
                .map(|v| v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}")))
                .collect();
            self.out.push(RefOut::Session {
                key: key_text(s.key),
                start: s.start.millis(),
                end: s.end.millis(),
                close: s.close.millis(),
                count: s.event_count,
                revision: s.revision,
                complete: s.complete,
                collect,
                first: opt_int(&a[1]),
                last: opt_int(&a[2]),
                sum: opt_int(&a[3]),
                count_distinct: a[4].as_u64().unwrap_or_else(|| panic!("count: {}", a[4])),
                min: opt_int(&a[5]),
                max: opt_int(&a[6]),
            });
        }

        fn retraction(&mut self, key: &[u8], start: EventTime) {
            self.out.push(RefOut::Retract {
                key: key_text(key),
                start: start.millis(),
            });
        }
    }

    /// Runs the engine over a bounded input: per event `on_event`, then the watermark
    /// strategy observes the time, then `advance_to`; at the end `advance_to(+inf)`.
    pub fn run_engine(events: &[RefEvent], p: &RefParams) -> RefRun {
        run_engine_in_parts(events, p, &[])
    }

    /// Where the engine keeps the keys memory has no room for.
    #[derive(Debug, Clone, Copy)]
    pub enum Backend {
        /// Every key in memory (the `memory` backend).
        Memory,
        /// Keys beyond a hot tier of this many bytes in a [`MapSpill`].
        Map(usize),
        /// Keys beyond a hot tier of this many bytes in RocksDB (the `rocksdb` backend).
        #[cfg(feature = "rocksdb")]
        Rocks(usize),
        /// As `Rocks(hot)`, and after event `at` the operator is checkpointed as a
        /// rocksdb base (its keys in memory encoded, an image of its store) and replaced
        /// by one restored from that base: a store opened from the image, the encoded
        /// keys put over it, a hot tier of `hot_after` bytes.
        #[cfg(feature = "rocksdb")]
        RocksRestored {
            hot: usize,
            at: usize,
            hot_after: usize,
        },
    }

    /// [`run_engine_in_parts`] on `backend`.
    pub fn run_engine_on(
        events: &[RefEvent],
        p: &RefParams,
        parts: &[usize],
        backend: Backend,
    ) -> RefRun {
        run_engine_with_backend(events, p, parts, &AGGS, backend)
    }

    /// [`run_engine`] with every advance made by `advance_at_most` calls emitting at
    /// most `parts[i]` sessions each (cycling through `parts`; empty: `advance_to`).
    pub fn run_engine_in_parts(events: &[RefEvent], p: &RefParams, parts: &[usize]) -> RefRun {
        run_engine_with(events, p, parts, &AGGS)
    }

    /// [`run_engine_in_parts`] of a window without aggregates (its records carry
    /// bounds, counts and revisions only): the state the engine keeps most compactly.
    pub fn run_engine_without_aggregates(
        events: &[RefEvent],
        p: &RefParams,
        parts: &[usize],
    ) -> RefRun {
        run_engine_with(events, p, parts, &[])
    }

    fn run_engine_with(
        events: &[RefEvent],
        p: &RefParams,
        parts: &[usize],
        aggregates: &[AggKind],
    ) -> RefRun {
        run_engine_with_backend(events, p, parts, aggregates, Backend::Memory)
    }

    /// The engine's run with `--emit final`: each session once, when it can no longer
    /// change (`p.on_update` is ignored).
    pub fn run_engine_final(events: &[RefEvent], p: &RefParams, backend: Backend) -> RefRun {
        run_engine_emitting(events, p, &[], &AGGS, backend, EmitMode::Final)
    }

    fn run_engine_with_backend(
        events: &[RefEvent],
        p: &RefParams,
        parts: &[usize],
        aggregates: &[AggKind],
        backend: Backend,
    ) -> RefRun {
        let emit = if p.on_update {
            EmitMode::OnUpdate
        } else {
            EmitMode::OnClose
        };
        run_engine_emitting(events, p, parts, aggregates, backend, emit)
    }

    fn run_engine_emitting(
        events: &[RefEvent],
        p: &RefParams,
        parts: &[usize],
        aggregates: &[AggKind],
        backend: Backend,
        emit: EmitMode,
    ) -> RefRun {
        let cfg = WindowConfig {
            gap: DurationMs(p.gap),
            allowed_lateness: DurationMs(p.lateness),
            emit,
            aggregates: aggregates.to_vec(),
            dedup: p.dedup,
        };
        let mut op = SessionOperator::new(cfg.clone());
        #[cfg(feature = "rocksdb")]
        let dir = tempfile::tempdir().expect("a temporary directory");
        match backend {
            Backend::Memory => {}
            Backend::Map(hot) => op.spill_to(Box::new(MapSpill::default()), hot),
            #[cfg(feature = "rocksdb")]
            Backend::Rocks(hot) | Backend::RocksRestored { hot, .. } => {
                let memory = sessionizer_window::spill::RocksMemory::new(8 << 20);
                let store = sessionizer_window::spill::RocksSpill::open(
                    &dir.path().join("spill"),
                    cfg.clone(),
                    &memory,
                )
                .expect("a RocksDB spill store opens");
                op.spill_to(Box::new(store), hot);
            }
        }
        let mut wm = BoundedOutOfOrderness::new(DurationMs(p.delay));
        let mut sink = Sink::default();
        let mut run = RefRun::default();
        let mut calls = 0;
        for (idx, e) in events.iter().enumerate() {
            let text = e.value.map(|v| v.to_string());
            let value: Option<&[u8]> = text.as_deref().map(str::as_bytes);
            let values = [value; AGGS.len()];
            let values = &values[..aggregates.len()];
            let ev = Event {
                key: e.key.as_bytes(),
                time: EventTime(e.time),
                gap: DurationMs(e.gap.unwrap_or(p.gap)),
                seq: idx as u64,
                // The caller passes the value whenever the event has one; the operator
                // must ignore it when dedup is off.
                dedup: e.dedup.map(u128::from),
                values,
            };
            let before = op.watermark();
            match op.on_event(&ev, &mut sink) {
                Verdict::Applied => run.applied += 1,
                Verdict::Duplicate => run.duplicates += 1,
                Verdict::Late(reason) => {
                    run.late_count += 1;
                    assert!(before.is_finite(), "late at watermark {before}");
                    run.late.push(RefLate {
                        index: idx,
                        reason: match reason {
                            LateReason::WindowClosed => "window_closed",
                            LateReason::SessionFinal => "session_final",
                        },
                        watermark: before.millis(),
                    });
                }
            }
            let w = wm.observe(EventTime(e.time));
            advance(&mut op, w, &mut sink, parts, &mut calls);
            #[cfg(feature = "rocksdb")]
            if let Backend::RocksRestored { at, hot_after, .. } = backend
                && at == idx
            {
                op = restored(&mut op, &cfg, dir.path(), hot_after);
            }
        }
        advance(&mut op, Watermark::MAX, &mut sink, parts, &mut calls);
        if let Some(e) = op.take_spill_error() {
            panic!("the spill store failed: {e}");
        }
        assert_eq!(op.keys(), 0, "every key is dropped at +infinity");
        run.out = sink.out;
        run
    }

    /// A new operator restored from a rocksdb base of `op` (see
    /// [`Backend::RocksRestored`]), its store in `dir`.
    #[cfg(feature = "rocksdb")]
    fn restored(
        op: &mut SessionOperator,
        cfg: &WindowConfig,
        dir: &std::path::Path,
        hot_after: usize,
    ) -> SessionOperator {
        use sessionizer_window::codec;
        use sessionizer_window::spill::RocksSpill;
        let mut in_memory: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let image = op
            .base_keys(|key, sessions| {
                let mut value = Vec::new();
                codec::encode_sessions(sessions, &mut value);
                in_memory.push((key.to_vec(), value));
            })
            .expect("a base")
            .expect("a rocksdb store makes an image");
        let copy = image.image.into_dir();
        let mut back = SessionOperator::new(cfg.clone());
        back.observe_gap(op.largest_gap());
        back.restore_watermark(op.watermark());
        back.restore_new_key_floor(Some(op.new_key_floor()));
        let memory = sessionizer_window::spill::RocksMemory::new(8 << 20);
        let codec_of = Box::new(sessionizer_window::spill::SessionsCodec(cfg.clone()));
        let store = RocksSpill::open_from(&dir.join("restored"), &copy, codec_of, &memory)
            .expect("a store opens from the image");
        back.spill_restored(
            Box::new(store),
            hot_after,
            image.keys as usize,
            image.open_sessions as usize,
        )
        .expect("restored store");
        for (key, value) in in_memory {
            let sessions =
                codec::decode_value(&value, cfg, codec::FORMAT, back.watermark()).expect("decodes");
            back.restore_over(&key, Some(sessions)).expect("restore");
        }
        assert_eq!(back.keys(), op.keys(), "every key restored");
        assert_eq!(
            back.open_sessions(),
            op.open_sessions(),
            "open sessions counted"
        );
        back
    }

    fn advance(
        op: &mut SessionOperator,
        w: Watermark,
        sink: &mut Sink,
        parts: &[usize],
        calls: &mut usize,
    ) {
        if parts.is_empty() {
            op.advance_to(w, sink);
            return;
        }
        loop {
            let max = parts[*calls % parts.len()];
            *calls += 1;
            let before = sink.out.len();
            let more = op.advance_at_most(w, max, sink);
            assert!(
                sink.out.len() - before <= max + 1,
                "advance_at_most({max}) emitted {} records",
                sink.out.len() - before
            );
            if !more {
                return;
            }
        }
    }
}
