//! std channels as a source (`Receiver::iter`) and as sinks (`Sender`), across threads;
//! a closed output channel stops the job with `SinkError::Closed` instead of losing
//! sessions silently.

use sessionizer::prelude::*;
use std::sync::mpsc;

#[derive(Debug, Clone)]
struct Click {
    user: u32,
    at: EventTime,
}

#[test]
fn a_job_reads_from_a_channel_and_writes_to_channels() {
    let (events_tx, events_rx) = mpsc::sync_channel::<Click>(4);
    let (mut sessions_tx, sessions_rx) = mpsc::channel();
    let (mut late_tx, late_rx) = mpsc::channel();
    let producer = std::thread::spawn(move || {
        for (user, t) in [(1, 0), (2, 5), (1, 8), (1, 100), (2, 1)] {
            events_tx
                .send(Click {
                    user,
                    at: EventTime(t),
                })
                .expect("job alive");
        }
    });
    let job = std::thread::spawn(move || {
        let mut job = Stream::<Click>::new()
            .key_by(|c| c.user)
            .event_time(|c| c.at)
            .session_windows(millis(10))
            .aggregate(Count)
            .build();
        job.run(events_rx.iter(), &mut sessions_tx, &mut late_tx)
    });
    producer.join().expect("producer");
    let counts = job.join().expect("job thread").expect("channels open");
    let sessions: Vec<(String, i64, u64)> = sessions_rx
        .iter()
        .filter_map(|o: WindowOutput<u64>| {
            o.session()
                .map(|s| (s.key.clone(), s.start.millis(), s.value))
        })
        .collect();
    // W = max time (no delay): 1@100 completes 2 [5] (close 15) and 1 [0, 8] (close 18),
    // in close order; then 2@1 would join the final [5] (close 15 <= W 100): late.
    assert_eq!(
        sessions,
        [("2".into(), 5, 1), ("1".into(), 0, 2), ("1".into(), 100, 1)]
    );
    let late: Vec<u32> = late_rx.iter().map(|l: Late<Click>| l.event.user).collect();
    assert_eq!(late, [2]);
    assert_eq!((counts.events, counts.in_sessions, counts.late), (5, 4, 1));
}

#[test]
fn a_closed_output_channel_is_an_error() {
    let (mut tx, rx) = mpsc::channel::<WindowOutput<()>>();
    drop(rx);
    let mut job = Stream::<Click>::new()
        .key_by(|c| c.user)
        .event_time(|c| c.at)
        .session_windows(millis(10))
        .build();
    let err = job
        .run(
            [Click {
                user: 1,
                at: EventTime(0),
            }],
            &mut tx,
            &mut Vec::new(),
        )
        .expect_err("nobody listens");
    assert!(matches!(err, SinkError::Closed), "{err}");
}
