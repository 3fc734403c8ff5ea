//! A naive reference model of the session rules of `docs/semantics.md` (rules S-1
//! to S-31).
//!
//! Written for being obviously correct, not fast:
//! - every applied event of every live session is kept;
//! - a key's sessions are recomputed from scratch by clustering its live events
//!   (sort by time, chain the intervals `[t, t + g]`);
//! - the identity of a session (its "emitted" mark, its next revision, whether it
//!   changed since its last completion) is carried from the old sessions to the new
//!   one by event-set containment;
//! - aggregates are computed at emission time from the session's full event list;
//! - a key's floor (docs/semantics.md S-30) is computed from the list of every
//!   watermark and largest gap the run has had, kept whole.
//!
//! All arithmetic on times is done in `i128`, so no saturation questions arise.

use std::collections::{BTreeMap, BTreeSet};

/// One valid input event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefEvent {
    pub key: String,
    pub time: i64,
    /// The event's own gap; `None` means the default gap `G`.
    pub gap: Option<i64>,
    /// The dedup value; `None` = no dedup value (never a duplicate).
    pub dedup: Option<u64>,
    /// The aggregated field; `None` = missing/null (skipped by every aggregate).
    pub value: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefParams {
    /// Default gap `G`.
    pub gap: i64,
    /// Watermark delay `D`.
    pub delay: i64,
    /// Allowed lateness `A`.
    pub lateness: i64,
    /// `--emit on-update` (otherwise on-close).
    pub on_update: bool,
    /// Duplicate detection on the events' dedup values.
    pub dedup: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefOut {
    Session {
        key: String,
        start: i64,
        end: i64,
        close: i64,
        count: u64,
        revision: u32,
        /// `false` only for on-update records of a still-open session.
        complete: bool,
        collect: Vec<i64>,
        first: Option<i64>,
        last: Option<i64>,
        /// S-17: an empty result is `null` (only collect and count-distinct differ).
        sum: Option<i64>,
        count_distinct: u64,
        min: Option<i64>,
        max: Option<i64>,
    },
    Retract {
        key: String,
        start: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefLate {
    /// Position of the event in the input slice.
    pub index: usize,
    /// `"window_closed"` or `"session_final"`.
    pub reason: &'static str,
    /// The watermark before the event (never minus infinity: nothing is late then).
    pub watermark: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RefRun {
    pub out: Vec<RefOut>,
    pub late: Vec<RefLate>,
    pub applied: u64,
    pub duplicates: u64,
    pub late_count: u64,
}

/// An applied event as the model keeps it.
#[derive(Clone, Debug)]
struct Applied {
    time: i128,
    /// `time + own gap` — the end of the event's interval.
    reach: i128,
    dedup: Option<u64>,
    value: Option<i64>,
}

/// A live session: a set of applied events (by input index) plus its identity marks.
#[derive(Clone, Debug)]
struct Sess {
    members: BTreeSet<usize>,
    /// Some record (update or completion) carrying this session's id was emitted.
    emitted: bool,
    next_rev: u32,
    /// Changed since its last completion record.
    dirty: bool,
}

#[derive(Clone, Debug, Default)]
struct KeyState {
    sessions: Vec<Sess>,
    /// Final sessions: only their bounds `(start, close)` are remembered.
    finals: Vec<(i128, i128)>,
    /// S-30: a key with state keeps a floor, set when the key's state is
    /// created, raised to the close of every final session whose bounds are forgotten.
    /// `None` = minus infinity.
    floor: Option<i128>,
}

/// Watermark: `None` = minus infinity.
type Wm = Option<i128>;

fn wm_reached(w: Wm, t: i128) -> bool {
    matches!(w, Some(w) if w >= t)
}

struct Model<'a> {
    p: &'a RefParams,
    applied: BTreeMap<usize, Applied>,
    keys: BTreeMap<String, KeyState>,
    gmax: i128,
    /// The watermark and the largest gap after every step so far, in order.
    history: Vec<(Wm, i128)>,
    run: RefRun,
}

impl Model<'_> {
    /// The floor of a key whose state is created now. Plainly `W - A - Gmax`; with
    /// per-event gaps `Gmax` may have grown since bounds of an earlier life of the key
    /// were forgotten (at `W' >= close + A + Gmax'`), so docs/semantics.md S-30 takes
    /// the largest `W - A - Gmax` of any step so far. Minus infinity while `W` is.
    fn new_key_floor(&self) -> Option<i128> {
        let a = self.p.lateness as i128;
        self.history
            .iter()
            .filter_map(|&(w, gmax)| w.map(|w| w - a - gmax))
            .max()
    }

    fn start_of(&self, members: &BTreeSet<usize>) -> i128 {
        members
            .iter()
            .map(|i| self.applied[i].time)
            .min()
            .expect("empty session")
    }
    fn last_of(&self, members: &BTreeSet<usize>) -> i128 {
        members
            .iter()
            .map(|i| self.applied[i].time)
            .max()
            .expect("empty session")
    }
    fn close_of(&self, members: &BTreeSet<usize>) -> i128 {
        members
            .iter()
            .map(|i| self.applied[i].reach)
            .max()
            .expect("empty session")
    }

    /// Cluster a set of applied events: sort by (time, index), chain the intervals.
    fn cluster(&self, members: impl IntoIterator<Item = usize>) -> Vec<BTreeSet<usize>> {
        let mut evs: Vec<(i128, usize)> = members
            .into_iter()
            .map(|i| (self.applied[&i].time, i))
            .collect();
        evs.sort();
        let mut out: Vec<BTreeSet<usize>> = Vec::new();
        let mut cur_close = i128::MIN;
        for (t, i) in evs {
            if out.is_empty() || t > cur_close {
                out.push(BTreeSet::new());
                cur_close = i128::MIN;
            }
            out.last_mut().unwrap().insert(i);
            cur_close = cur_close.max(self.applied[&i].reach);
        }
        out
    }

    fn record(&self, key: &str, s: &Sess, revision: u32, complete: bool) -> RefOut {
        let mut evs: Vec<(i128, usize)> = s
            .members
            .iter()
            .map(|&i| (self.applied[&i].time, i))
            .collect();
        evs.sort();
        let values: Vec<i64> = evs
            .iter()
            .filter_map(|(_, i)| self.applied[i].value)
            .collect();
        let distinct: BTreeSet<i64> = values.iter().copied().collect();
        RefOut::Session {
            key: key.to_string(),
            start: self.start_of(&s.members) as i64,
            end: self.last_of(&s.members) as i64,
            close: self.close_of(&s.members) as i64,
            count: s.members.len() as u64,
            revision,
            complete,
            collect: values.clone(),
            first: values.first().copied(),
            last: values.last().copied(),
            sum: if values.is_empty() {
                None
            } else {
                Some(values.iter().sum())
            },
            count_distinct: distinct.len() as u64,
            min: values.iter().copied().min(),
            max: values.iter().copied().max(),
        }
    }

    /// Step 6b (and 7): every dirty live session with `close <= w` gets a completion
    /// record, in (close, key bytes, start) order.
    fn emit_completions(&mut self, w: Wm) {
        let mut due: Vec<(i128, String, i128, usize)> = Vec::new();
        for (k, ks) in &self.keys {
            for (si, s) in ks.sessions.iter().enumerate() {
                let close = self.close_of(&s.members);
                if s.dirty && wm_reached(w, close) {
                    due.push((close, k.clone(), self.start_of(&s.members), si));
                }
            }
        }
        // String ordering is byte ordering for UTF-8.
        due.sort();
        for (_, k, _, si) in due {
            let s = self.keys[&k].sessions[si].clone();
            let rec = self.record(&k, &s, s.next_rev, true);
            self.run.out.push(rec);
            let s = &mut self.keys.get_mut(&k).unwrap().sessions[si];
            s.next_rev += 1;
            s.emitted = true;
            s.dirty = false;
        }
    }

    /// Steps 6c and 6d.
    fn finalize_and_forget(&mut self, w: Wm) {
        let a = self.p.lateness as i128;
        let gmax = self.gmax;
        let mut new_keys = BTreeMap::new();
        for (k, mut ks) in std::mem::take(&mut self.keys) {
            let mut keep = Vec::new();
            for s in ks.sessions {
                let (start, close) = (self.start_of(&s.members), self.close_of(&s.members));
                if wm_reached(w, close + a) {
                    // A final session is never dirty: its completion was emitted at
                    // W >= close, and close <= close + A.
                    assert!(!s.dirty, "finalizing a dirty session");
                    ks.finals.push((start, close));
                    for i in &s.members {
                        self.applied.remove(i);
                    }
                } else {
                    keep.push(s);
                }
            }
            ks.sessions = keep;
            let (kept, forgotten): (Vec<_>, Vec<_>) = ks
                .finals
                .iter()
                .partition(|&&(_, close)| !wm_reached(w, close + a + gmax));
            for (_, close) in forgotten {
                ks.floor = Some(ks.floor.map_or(close, |f| f.max(close)));
            }
            ks.finals = kept;
            if !ks.sessions.is_empty() || !ks.finals.is_empty() {
                new_keys.insert(k, ks);
            }
        }
        self.keys = new_keys;
    }

    /// Self-check: the live sessions of every key are exactly the clusters of its
    /// live events.
    fn check_invariants(&self) {
        for ks in self.keys.values() {
            let all: BTreeSet<usize> = ks
                .sessions
                .iter()
                .flat_map(|s| s.members.iter().copied())
                .collect();
            let mut clusters = self.cluster(all.iter().copied());
            let mut sessions: Vec<BTreeSet<usize>> =
                ks.sessions.iter().map(|s| s.members.clone()).collect();
            clusters.sort();
            sessions.sort();
            assert_eq!(
                clusters, sessions,
                "sessions are not the clusters of their events"
            );
        }
    }

    /// One valid event, steps 1–6 of the draft.
    fn event(&mut self, idx: usize, e: &RefEvent, w: Wm, max_t: &mut Option<i128>) -> Wm {
        let p = self.p;
        let t = e.time as i128;
        let g = e.gap.unwrap_or(p.gap) as i128;
        // 1.
        self.gmax = self.gmax.max(g);
        // 2. Tentatively add e and re-cluster the key's live events.
        self.applied.insert(
            idx,
            Applied {
                time: t,
                reach: t + g,
                dedup: e.dedup,
                value: e.value,
            },
        );
        let ks = self.keys.get(&e.key).cloned().unwrap_or_else(|| KeyState {
            floor: self.new_key_floor(),
            ..KeyState::default()
        });
        let mut live: BTreeSet<usize> = ks
            .sessions
            .iter()
            .flat_map(|s| s.members.iter().copied())
            .collect();
        live.insert(idx);
        let r_members = self
            .cluster(live.iter().copied())
            .into_iter()
            .find(|c| c.contains(&idx))
            .unwrap();
        let j: Vec<usize> = (0..ks.sessions.len())
            .filter(|&si| ks.sessions[si].members.is_subset(&r_members))
            .collect();
        // Cross-check the containment J with the draft's "touches" definition.
        let touched: Vec<usize> = (0..ks.sessions.len())
            .filter(|&si| {
                let m = &ks.sessions[si].members;
                t <= self.close_of(m) && self.start_of(m) <= t + g
            })
            .collect();
        assert_eq!(j, touched, "containment and touching disagree");
        let r_start = self.start_of(&r_members);
        let r_close = self.close_of(&r_members);
        let f_touched = ks.finals.iter().any(|&(fs, fc)| t <= fc && fs <= t + g);
        // "An event at or before the floor is too late (session_final)."
        let below_floor = ks.floor.is_some_and(|f| t <= f);

        // 3. Lateness.
        let late = if wm_reached(w, r_close + p.lateness as i128) {
            Some("window_closed")
        } else if f_touched || below_floor {
            Some("session_final")
        } else {
            None
        };
        // 4. Duplicates.
        let dup = late.is_none()
            && p.dedup
            && e.dedup.is_some()
            && j.iter().any(|&si| {
                ks.sessions[si]
                    .members
                    .iter()
                    .any(|m| *m != idx && self.applied[m].dedup == e.dedup)
            });

        let mut applied_r: Option<BTreeSet<usize>> = None;
        if let Some(reason) = late {
            self.applied.remove(&idx);
            self.run.late.push(RefLate {
                index: idx,
                reason,
                watermark: w.unwrap() as i64,
            });
            self.run.late_count += 1;
        } else if dup {
            self.applied.remove(&idx);
            self.run.duplicates += 1;
        } else {
            // 5. Applied.
            self.run.applied += 1;
            let parts: Vec<Sess> = j.iter().map(|&si| ks.sessions[si].clone()).collect();
            let mut retract: Vec<i128> = parts
                .iter()
                .filter(|s| s.emitted)
                .map(|s| self.start_of(&s.members))
                .filter(|&st| st != r_start)
                .collect();
            retract.sort();
            for st in retract {
                self.run.out.push(RefOut::Retract {
                    key: e.key.clone(),
                    start: st as i64,
                });
            }
            let r = Sess {
                members: r_members.clone(),
                emitted: parts
                    .iter()
                    .any(|s| s.emitted && self.start_of(&s.members) == r_start),
                next_rev: parts.iter().map(|s| s.next_rev).max().unwrap_or(0),
                dirty: true,
            };
            let floor = ks.floor;
            let ks = self.keys.entry(e.key.clone()).or_insert_with(|| KeyState {
                floor,
                ..KeyState::default()
            });
            ks.sessions.retain(|s| !s.members.is_subset(&r_members));
            ks.sessions.push(r);
            applied_r = Some(r_members);
        }

        // 6. Advance the watermark.
        *max_t = Some(max_t.map_or(t, |m| m.max(t)));
        let cand = max_t.unwrap() - p.delay as i128;
        let w2 = Some(w.map_or(cand, |w| w.max(cand)));

        // 6a.
        if p.on_update
            && let Some(rm) = applied_r
            && !wm_reached(w2, r_close)
        {
            let ks = self.keys.get_mut(&e.key).unwrap();
            let si = ks.sessions.iter().position(|s| s.members == rm).unwrap();
            let s = ks.sessions[si].clone();
            let rec = self.record(&e.key, &s, s.next_rev, false);
            self.run.out.push(rec);
            let s = &mut self.keys.get_mut(&e.key).unwrap().sessions[si];
            s.next_rev += 1;
            s.emitted = true;
        }
        // 6b–6d.
        self.emit_completions(w2);
        self.finalize_and_forget(w2);
        self.history.push((w2, self.gmax));
        self.check_invariants();
        w2
    }
}

/// Run the reference over a bounded input (the end of input is watermark +infinity).
pub fn run_reference(events: &[RefEvent], p: &RefParams) -> RefRun {
    let mut m = Model {
        p,
        applied: BTreeMap::new(),
        keys: BTreeMap::new(),
        gmax: p.gap as i128,
        history: Vec::new(),
        run: RefRun::default(),
    };
    let mut w: Wm = None;
    let mut max_t = None;
    for (idx, e) in events.iter().enumerate() {
        w = m.event(idx, e, w, &mut max_t);
    }
    // 7. End of input: W = +infinity, every dirty session is emitted.
    m.emit_completions(Some(i128::MAX));
    m.run
}
