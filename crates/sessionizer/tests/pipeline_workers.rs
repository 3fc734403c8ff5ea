//! The command line's pipeline on several workers gives one worker's files, byte for
//! byte, whatever the stream. A worker walks only the records whose key it owns and
//! the records that raise its range's largest time or per-event gap (`Parsed::walks`):
//! streams with per-event gaps, out-of-order and far-late times, duplicates, invalid
//! and blank lines, in both emit modes and with lateness, check that no record that
//! moves the watermark or the largest gap is missed.

use proptest::prelude::*;
use sessionizer::config::{Aggregate, OnInvalid, PipelineConfig};
use sessionizer::connectors::{InputSource, OutputTarget};
use sessionizer::core::decode::{DEFAULT_VALID_RANGE, DedupMode, TimeFormat};
use sessionizer::core::json::FieldPath;
use sessionizer::prelude::*;
use sessionizer::window::AggKind;
use std::path::Path;

const T0: i64 = 1_704_067_200_000;

/// `n` lines over `keys` keys: times mostly rising by 300 ms with up to 5 minutes of
/// disorder, one in 20 up to an hour behind (on keys without state these test the
/// floor of new keys, `W - A - Gmax`, which needs every worker to hear the largest gap); a per-event `gap` (a number of ms or a duration
/// text) on some; every 97th line blank, every 89th broken, some exact duplicates.
fn lines(n: usize, keys: u64, seed: u64, gaps: bool) -> String {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = String::new();
    let mut last = String::new();
    for i in 0..n {
        if i % 97 == 96 {
            out.push('\n');
            continue;
        }
        if i % 89 == 88 {
            out.push_str("{\"visit_id\":\"v1\",\"event_time\":\n");
            continue;
        }
        if i % 61 == 60 && !last.is_empty() {
            out.push_str(&last);
            continue;
        }
        let jitter = (next() % 300_000) as i64;
        let behind = if next() % 20 == 0 {
            (next() % 3_600_000) as i64
        } else {
            0
        };
        let at = T0 + i as i64 * 300 - jitter - behind;
        let gap = match (gaps, next() % 10) {
            (true, 0) => format!(",\"gap\":{}", 1_000 + next() % 900_000),
            (true, 1) => format!(",\"gap\":\"{}m\"", 1 + next() % 20),
            (true, 2) => ",\"gap\":null".to_string(),
            _ => String::new(),
        };
        last = format!(
            "{{\"visit_id\":\"v{}\",\"event_time\":\"{}\",\"page\":\"/{}\"{gap}}}\n",
            next() % keys,
            EventTime(at),
            next() % 5
        );
        out.push_str(&last);
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Setting {
    workers: usize,
    gap_s: i64,
    lateness_s: i64,
    on_update: bool,
    gaps: bool,
}

fn config(dir: &Path, input: &Path, s: Setting) -> PipelineConfig {
    let name = |what: &str| dir.join(format!("{what}-{}.jsonl", s.workers));
    PipelineConfig {
        inputs: vec![InputSource::File(input.to_path_buf())],
        output: OutputTarget::File(name("out")),
        output_format: Default::default(),
        dead_letter: OutputTarget::File(name("dead")),
        late_output: OutputTarget::File(name("late")),
        key: FieldPath::parse("visit_id").expect("path"),
        time: FieldPath::parse("event_time").expect("path"),
        time_format: TimeFormat::Rfc3339,
        gap: seconds(s.gap_s),
        gap_field: s.gaps.then(|| FieldPath::parse("gap").expect("path")),
        watermark_delay: seconds(20),
        allowed_lateness: seconds(s.lateness_s),
        valid_range: DEFAULT_VALID_RANGE,
        aggregates: vec![Aggregate {
            kind: AggKind::Collect,
            field: FieldPath::parse("page").expect("path"),
            name: "page".into(),
        }],
        dedup: DedupMode::Record,
        emit: if s.on_update {
            EmitMode::OnUpdate
        } else {
            EmitMode::OnClose
        },
        on_invalid: OnInvalid::DeadLetter,
        workers: s.workers,
        kafka: None,
        state_backend: Default::default(),
        max_record: sessionizer_connectors::input::DEFAULT_MAX_RECORD,
        idle_timeout: None,
    }
}

/// The three output files (sessions, dead letters, late events) and the counts of a
/// run of `cfg`.
fn run(cfg: &PipelineConfig) -> (Vec<String>, [u64; 8]) {
    let st = sessionizer::pipeline::run(cfg, &sessionizer::telemetry::Telemetry::default())
        .expect("run");
    let files = [&cfg.output, &cfg.dead_letter, &cfg.late_output].map(|t| match t {
        OutputTarget::File(p) => std::fs::read_to_string(p).expect("output"),
        other => panic!("not a file: {other:?}"),
    });
    let counts = [
        st.records_read,
        st.in_sessions,
        st.duplicates,
        st.late,
        st.invalid,
        st.blank_lines,
        st.sessions_emitted,
        st.retractions,
    ];
    (files.to_vec(), counts)
}

/// One line of the hand-written case.
fn line(key: &str, at: i64, gap_ms: Option<i64>) -> String {
    let gap = gap_ms.map_or(String::new(), |g| format!(",\"gap\":{g}"));
    format!(
        "{{\"visit_id\":\"{key}\",\"event_time\":\"{}\",\"page\":\"/\"{gap}}}\n",
        EventTime(T0 + at)
    )
}

/// A worker must hear a larger gap from a record it neither owns nor sees raise the
/// watermark: a new key's floor is `W - A - Gmax` (docs/semantics.md S-30). With a 10 s
/// gap, no delay and no lateness: `a` at 100 s (a new key's floor: 90 s); `b` at 95 s
/// with a 100 s gap (a record that raises no time, only the largest gap); `c` at 200 s
/// moves the watermark to 200 s, so a new key's floor is 100 s; then the new key `n` at
/// 150 s with a 100 s gap is in time (its interval ends at 250 s). A worker that missed `b`'s gap would put the
/// floor at 190 s and turn `n` away. Filler lines keep the case inside one decode range.
/// Which worker owns which key is the hash's choice: the case runs with many key names
/// so that `b`'s owner differs from `n`'s in some of them.
#[test]
fn a_larger_gap_reaches_every_worker() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("in.jsonl");
    let one = Setting {
        workers: 1,
        gap_s: 10,
        lateness_s: 0,
        on_update: false,
        gaps: true,
    };
    for i in 0..24 {
        let mut text = line(&format!("a{i}"), 100_000, None);
        text += &line(&format!("b{i}"), 95_000, Some(100_000));
        text += &line(&format!("c{i}"), 200_000, None);
        text += &line(&format!("n{i}"), 150_000, Some(100_000));
        for _ in 0..200 {
            text += &line(&format!("z{i}"), 200_000, None);
        }
        std::fs::write(&input, text).expect("input");
        let run_case = |s: Setting| {
            let mut c = config(dir.path(), &input, s);
            c.watermark_delay = DurationMs(0);
            c.dedup = DedupMode::Off;
            run(&c)
        };
        let one_worker = run_case(one);
        let late = one_worker.1[3];
        assert_eq!(late, 0, "one worker: nothing is late");
        let out = &one_worker.0[0];
        assert!(out.contains(&format!("\"n{i}\"")), "{out}");
        for workers in [2, 3] {
            assert!(
                run_case(Setting { workers, ..one }) == one_worker,
                "{workers} workers, keys *{i}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn several_workers_write_one_workers_files(
        seed in any::<u64>(),
        n in 1usize..4_000,
        keys in 1u64..5_000,
        gap_s in 1i64..900,
        lateness_s in 0i64..1_800,
        on_update in any::<bool>(),
        gaps in any::<bool>(),
        workers in 2usize..5,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let input = dir.path().join("in.jsonl");
        std::fs::write(&input, lines(n, keys, seed, gaps)).expect("input");
        let one = Setting { workers: 1, gap_s, lateness_s, on_update, gaps };
        let (files_one, counts_one) = run(&config(dir.path(), &input, one));
        prop_assert!(counts_one[0] > 0 || n < 3);
        let (files, counts) = run(&config(dir.path(), &input, Setting { workers, ..one }));
        prop_assert_eq!(counts, counts_one);
        for (many, one) in files.iter().zip(&files_one) {
            prop_assert!(many == one, "outputs differ with {} workers", workers);
        }
    }
}
