//! Checkpoint and restore of the session window (issue 4), as a property: random
//! streams (several keys, out of order, far-late events, per-event gaps, duplicates, all
//! seven aggregates, both emit modes) run through one operator without interruption, and
//! through a second one that is checkpointed incrementally at random points — a base,
//! then deltas of the keys that changed (`drain_changes`) — and restored at the last
//! point into a fresh operator from the encoded state alone (`codec`), with timers
//! derived from the sessions. The records must be the same, one for one; and at every
//! checkpoint the state rebuilt from base + deltas must equal the live state, so no
//! change escapes the tracking.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::codec::{decode_sessions, encode_sessions};
use sessionizer_window::{
    AggKind, BoundedOutOfOrderness, Emit, EmitMode, Event, SessionOperator, SessionView, Verdict,
    WindowConfig,
};
use std::collections::BTreeMap;

const AGGS: [AggKind; 7] = [
    AggKind::Collect,
    AggKind::First,
    AggKind::Last,
    AggKind::Sum,
    AggKind::CountDistinct,
    AggKind::Min,
    AggKind::Max,
];

#[derive(Debug, Clone)]
struct Ev {
    key: &'static str,
    time: i64,
    gap: Option<i64>,
    dedup: Option<u64>,
    value: Option<i64>,
}

#[derive(Debug, Clone, Copy)]
struct Params {
    gap: i64,
    delay: i64,
    lateness: i64,
    on_update: bool,
    dedup: bool,
}

/// Records as text: everything an output record carries.
#[derive(Default)]
struct Sink(Vec<String>);

impl Emit for Sink {
    fn session(&mut self, s: &SessionView<'_>) {
        let mut aggs = Vec::new();
        for a in s.aggregates {
            a.write_json(&mut aggs);
            aggs.push(b' ');
        }
        self.0.push(format!(
            "{} {}..{} close {} n {} rev {} complete {} {}",
            String::from_utf8_lossy(s.key),
            s.start.millis(),
            s.end.millis(),
            s.close.millis(),
            s.event_count,
            s.revision,
            s.complete,
            String::from_utf8_lossy(&aggs)
        ));
    }

    fn retraction(&mut self, key: &[u8], start: EventTime) {
        self.0.push(format!(
            "retract {} {}",
            String::from_utf8_lossy(key),
            start.millis()
        ));
    }
}

fn config(p: &Params) -> WindowConfig {
    WindowConfig {
        gap: DurationMs(p.gap),
        allowed_lateness: DurationMs(p.lateness),
        emit: if p.on_update {
            EmitMode::OnUpdate
        } else {
            EmitMode::OnClose
        },
        aggregates: AGGS.to_vec(),
        dedup: p.dedup,
    }
}

/// One operator and its watermark strategy, driven as the pipeline drives a shard.
struct Job {
    op: SessionOperator,
    wm: BoundedOutOfOrderness,
    p: Params,
    verdicts: Vec<Verdict>,
}

impl Job {
    fn new(p: Params) -> Job {
        Job {
            op: SessionOperator::new(config(&p)),
            wm: BoundedOutOfOrderness::new(DurationMs(p.delay)),
            p,
            verdicts: Vec::new(),
        }
    }

    fn step(&mut self, seq: usize, e: &Ev, out: &mut Sink) {
        let text = e.value.map(|v| v.to_string());
        let values = [text.as_deref().map(str::as_bytes); AGGS.len()];
        let ev = Event {
            key: e.key.as_bytes(),
            time: EventTime(e.time),
            gap: DurationMs(e.gap.unwrap_or(self.p.gap)),
            seq: seq as u64,
            dedup: e.dedup.map(u128::from),
            values: &values,
        };
        self.verdicts.push(self.op.on_event(&ev, out));
        let w = self.wm.observe(EventTime(e.time));
        self.op.advance_to(w, out);
    }

    fn finish(&mut self, out: &mut Sink) {
        self.op.advance_to(Watermark::MAX, out);
    }

    /// Every key's encoded state.
    fn encoded(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.op
            .store()
            .iter()
            .map(|(_, k, s)| {
                let mut v = Vec::new();
                encode_sessions(s, &mut v);
                (k.to_vec(), v)
            })
            .collect()
    }
}

fn raw_event() -> impl Strategy<Value = (usize, i64, i64, Option<i64>, Option<u64>, Option<i64>)> {
    (
        0usize..4,
        0i64..=12,
        prop_oneof![6 => Just(0i64), 6 => 0i64..=25, 1 => 40i64..=200],
        prop_oneof![6 => Just(None), 1 => prop::sample::select(vec![0i64, 3, 10, 25, 45]).prop_map(Some)],
        prop_oneof![2 => Just(None), 3 => (0u64..4).prop_map(Some)],
        prop_oneof![1 => Just(None), 3 => (-2i64..=6).prop_map(Some)],
    )
}

fn stream() -> impl Strategy<Value = Vec<Ev>> {
    prop::collection::vec(raw_event(), 1..=80).prop_map(|raws| {
        let mut clock = 1_000i64;
        raws.into_iter()
            .map(|(k, step, back, gap, dedup, value)| {
                clock += step;
                Ev {
                    key: ["a", "b", "c", "d"][k],
                    time: clock - back,
                    gap,
                    dedup,
                    value,
                }
            })
            .collect()
    })
}

fn params() -> impl Strategy<Value = Params> {
    (
        0i64..=50,
        0i64..=30,
        0i64..=60,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(gap, delay, lateness, on_update, dedup)| Params {
            gap,
            delay,
            lateness,
            on_update,
            dedup,
        })
}

fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(512),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/checkpoint_props.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn restore_from_base_plus_deltas_continues_exactly(
        events in stream(),
        p in params(),
        cuts in prop::collection::vec((0.0f64..=1.0, any::<bool>()), 1..=5),
    ) {
        let mut whole = Job::new(p);
        let mut want = Sink::default();
        for (i, e) in events.iter().enumerate() {
            whole.step(i, e, &mut want);
        }
        whole.finish(&mut want);

        // Checkpoint points in input order; the first is a base, later ones a delta or
        // (when drawn) a new base.
        let mut points: Vec<(usize, bool)> = cuts
            .iter()
            .map(|&(f, base)| (((events.len() as f64) * f) as usize, base))
            .collect();
        points.sort_by_key(|c| c.0);
        let mut job = Job::new(p);
        job.op.track_changes(true);
        let mut got = Sink::default();
        let mut disk: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut next = 0;
        for (n, &(at, base)) in points.iter().enumerate() {
            while next < at {
                job.step(next, &events[next], &mut got);
                next += 1;
            }
            if n == 0 || base {
                job.op.forget_changes();
                disk = job.encoded();
            } else {
                job.op.drain_changes(|k, s| match s {
                    Some(s) => {
                        let mut v = Vec::new();
                        encode_sessions(s, &mut v);
                        disk.insert(k.to_vec(), v);
                    }
                    None => {
                        disk.remove(k);
                    }
                });
            }
            prop_assert_eq!(&disk, &job.encoded(), "base + deltas != live state at event {}", at);
        }

        // Restore into a fresh operator from the bytes alone and continue.
        let mut restored = Job::new(p);
        if let Some(t) = job.wm.max_time() {
            restored.wm.observe(t);
        }
        restored.op.observe_gap(job.op.largest_gap());
        restored.op.restore_watermark(job.op.watermark());
        restored.op.restore_new_key_floor(Some(job.op.new_key_floor()));
        for (k, v) in &disk {
            let sessions = decode_sessions(v, restored.op.config()).expect("decodes");
            restored.op.restore_key(k, sessions);
        }
        prop_assert_eq!(restored.op.open_sessions(), job.op.open_sessions());
        prop_assert_eq!(restored.op.keys(), job.op.keys());
        prop_assert_eq!(restored.op.new_key_floor(), job.op.new_key_floor());
        for (i, e) in events.iter().enumerate().skip(next) {
            restored.step(i, e, &mut got);
        }
        restored.finish(&mut got);
        let verdicts: Vec<Verdict> = job.verdicts.iter().chain(&restored.verdicts).copied().collect();
        prop_assert_eq!(&verdicts, &whole.verdicts);
        prop_assert_eq!(&got.0, &want.0);
    }
}

#[test]
fn a_damaged_value_is_an_error_not_a_panic() {
    let p = Params {
        gap: 10,
        delay: 0,
        lateness: 5,
        on_update: false,
        dedup: true,
    };
    let mut job = Job::new(p);
    let mut out = Sink::default();
    for (i, t) in [0, 3, 5].iter().enumerate() {
        job.step(
            i,
            &Ev {
                key: "k",
                time: *t,
                gap: None,
                dedup: Some(i as u64),
                value: Some(i as i64),
            },
            &mut out,
        );
    }
    let encoded = job.encoded();
    let value = &encoded[&b"k".to_vec()];
    assert!(decode_sessions(value, job.op.config()).is_ok());
    for len in 0..value.len() {
        assert!(
            decode_sessions(&value[..len], job.op.config()).is_err(),
            "truncated to {len}"
        );
    }
    for i in 0..value.len() {
        let mut bad = value.clone();
        bad[i] = 0xff;
        // Either refused or read as some other state: never a panic.
        let _ = decode_sessions(&bad, job.op.config());
    }
    let mut other = config(&p);
    other.aggregates.pop();
    assert!(decode_sessions(value, &other).is_err(), "aggregates differ");
}
