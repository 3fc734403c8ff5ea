//! A checkpoint holding a key whose state the job cannot read back (its accumulator or
//! state type refuses the value) is refused whole, naming the key: both library styles
//! read every key before they put any in, so the job is left without any of the
//! checkpoint's state (not with the keys that happened to come first), on one worker
//! and on several alike. The same job restores a checkpoint without such a key.

use serde::{Deserialize, Deserializer, Serialize};
use sessionizer::prelude::*;

/// A count that refuses to be read back when it is 3.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
struct Picky(u64);

impl<'de> Deserialize<'de> for Picky {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Picky, D::Error> {
        match u64::deserialize(d)? {
            3 => Err(serde::de::Error::custom("three is not read back")),
            n => Ok(Picky(n)),
        }
    }
}

#[derive(Clone)]
struct Count;

impl Aggregator<(String, EventTime)> for Count {
    type Acc = Picky;
    type Output = u64;
    fn create(&self) -> Picky {
        Picky(0)
    }
    fn add(&self, acc: &mut Picky, _: &(String, EventTime), _: Position) {
        acc.0 += 1;
    }
    fn merge(&self, acc: &mut Picky, other: Picky) {
        acc.0 += other.0;
    }
    fn finish(&self, acc: &Picky) -> u64 {
        acc.0
    }
}

const T0: i64 = 1_700_000_000_000;

/// Sixty keys with one event each, all in open sessions, and key `k-7` with `seven`
/// events.
fn events(seven: u64) -> Vec<(String, EventTime)> {
    let mut v: Vec<_> = (0..60)
        .map(|i| (format!("k-{i}"), EventTime(T0 + i * 1_000)))
        .collect();
    for i in 1..seven {
        v.push(("k-7".into(), EventTime(T0 + 60_000 + i as i64)));
    }
    v
}

type Ev = (String, EventTime);
type WindowJob = sessionizer::windowed::SessionWindowJob<
    Ev,
    fn(&Ev) -> String,
    fn(&Ev) -> EventTime,
    BoundedOutOfOrderness,
    Count,
    sessionizer::windowed::FixedGap,
>;

fn window_job(workers: usize) -> WindowJob {
    let mut job = Stream::<Ev>::new()
        .key_by((|e| e.0.clone()) as fn(&Ev) -> String)
        .event_time((|e| e.1) as fn(&Ev) -> EventTime)
        .session_windows(minutes(30))
        .aggregate(Count)
        .build();
    job.set_workers(workers).expect("workers");
    job
}

#[test]
fn a_session_window_checkpoint_with_an_unreadable_key_is_refused_whole() {
    for workers in [1, 3] {
        for (seven, readable) in [(3, false), (2, true)] {
            let dir = tempfile::tempdir().expect("temp dir");
            {
                let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
                let mut first = window_job(workers);
                first
                    .push_batch(events(seven), &mut Vec::new(), &mut Vec::new())
                    .expect("vectors");
                assert_eq!(first.open_sessions(), 60);
                first.checkpoint(&mut checkpoints).expect("checkpoint");
            }
            let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
            let mut second = window_job(workers);
            let restored = second.restore(&mut checkpoints);
            if readable {
                let resumed = restored.expect("readable").expect("a checkpoint");
                assert_eq!((resumed.keys, second.open_sessions()), (60, 60));
                continue;
            }
            let text = restored.expect_err("k-7 holds a 3").to_string();
            assert!(
                text.contains("key k-7") && text.contains("three is not read back"),
                "{workers} workers: {text}"
            );
            assert_eq!(second.open_sessions(), 0, "{workers} workers: no key stays");
            assert_eq!(second.watermark(), Watermark::MIN);
            // Refused again, not skipped: the checkpoint is still the one found.
            assert!(second.restore(&mut checkpoints).is_err());
        }
    }
}

fn count(_: &str, events: Vec<(String, EventTime)>, state: &mut GroupState<'_, Picky>) -> Vec<u64> {
    let mut n = state.get().cloned().unwrap_or_default();
    n.0 += events.len() as u64;
    state.update(n.clone());
    vec![n.0]
}

type F = fn(&str, Vec<(String, EventTime)>, &mut GroupState<'_, Picky>) -> Vec<u64>;

#[test]
fn a_stateful_checkpoint_with_an_unreadable_key_is_refused_whole() {
    let job = |workers: usize| {
        let mut job = Stream::<(String, EventTime)>::new()
            .key_by((|e| e.0.clone()) as fn(&(String, EventTime)) -> String)
            .event_time((|e| e.1) as fn(&(String, EventTime)) -> EventTime)
            .flat_map_groups_with_state(count as F)
            .build();
        job.set_workers(workers).expect("workers");
        job
    };
    for workers in [1, 3] {
        for (seven, readable) in [(3, false), (2, true)] {
            let dir = tempfile::tempdir().expect("temp dir");
            {
                let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
                let mut first = job(workers);
                first
                    .process_batch(events(seven), &mut Vec::new(), &mut Vec::new())
                    .expect("vectors");
                assert_eq!(first.keys(), 60);
                first.checkpoint(&mut checkpoints).expect("checkpoint");
            }
            let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
            let mut second = job(workers);
            let restored = second.restore_checkpoint(&mut checkpoints);
            if readable {
                restored.expect("readable").expect("a checkpoint");
                assert_eq!(second.keys(), 60);
                assert_eq!(second.state("k-7"), Some(&Picky(seven)));
                continue;
            }
            let text = restored.expect_err("k-7 holds a 3").to_string();
            assert!(
                text.contains("k-7") && text.contains("three is not read back"),
                "{workers} workers: {text}"
            );
            assert_eq!(second.keys(), 0, "{workers} workers: no key stays");
            assert!(second.restore_checkpoint(&mut checkpoints).is_err());
        }
    }
}
