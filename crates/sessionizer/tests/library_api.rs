//! The library's API as a user meets it: the valid-time guard, the emission context,
//! sources and sinks from the prelude, JSON output.

use sessionizer::prelude::*;

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z

fn at(min: i64) -> EventTime {
    EventTime(T0 + min * 60_000)
}

/// The stateful job has the same guard as the window: an event in the year 2500 is
/// never given to the function and never moves the watermark.
#[test]
fn the_stateful_job_rejects_times_outside_the_valid_range() {
    let far = sessionizer::time::parse("2500-01-01T00:00:00Z").expect("a time");
    let mut job = Stream::<(&str, EventTime)>::new()
        .key_by(|e| e.0)
        .event_time(|e| e.1)
        .flat_map_groups_with_state(
            |key: &str, events: Vec<(&str, EventTime)>, state: &mut GroupState<'_, u32>| {
                if state.has_timed_out() {
                    return state.remove().map(|n| format!("{key}:{n}"));
                }
                let n = state.get().copied().unwrap_or(0) + events.len() as u32;
                state.update(n);
                state.set_timeout_timestamp(events[0].1.plus(minutes(10)));
                None
            },
        )
        .build();
    let (mut out, mut rejected) = (Vec::new(), Vec::new());
    for e in [("a", at(0)), ("b", far), ("a", at(1))] {
        job.push(e, &mut rejected).expect("vectors");
        job.end_batch(&mut out).expect("vectors");
        assert!(
            job.watermark() <= Watermark::at(at(1)),
            "{}",
            job.watermark()
        );
    }
    job.finish(&mut out, &mut rejected).expect("vectors");
    assert_eq!(out, ["a:2"]);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].event.0, "b");
    assert_eq!(rejected[0].reason, sessionizer::late::TIME_OUT_OF_RANGE);
    let counts = job.counts();
    assert_eq!((counts.events, counts.late, counts.invalid), (3, 0, 1));
}

/// `..` turns the guard off; a bounded range keeps the times it says.
#[test]
fn the_valid_range_can_be_narrowed_or_turned_off() {
    let run =
        |job: &mut dyn FnMut(EventTime) -> bool| [at(-1), at(0), at(59), at(60)].map(job);
    let window = |range: Option<std::ops::Range<EventTime>>| {
        let stream = Stream::<EventTime>::new()
            .key_by(|_| "k")
            .event_time(|t| *t);
        let stream = match range {
            Some(r) => stream.valid_time_range(r),
            None => stream.valid_time_range(..),
        };
        let mut job = stream.session_windows(minutes(1)).build();
        run(&mut |t| {
            let (mut s, mut l): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
            job.push(t, &mut s, &mut l).expect("vectors")
                != sessionizer::windowed::Outcome::OutOfRange
        })
    };
    assert_eq!(window(Some(at(0)..at(60))), [false, true, true, false]);
    assert_eq!(window(None), [true; 4]);
}
