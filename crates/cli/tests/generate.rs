//! Tests of `sessionizer generate` through the library API.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use clap::Parser;
use serde_json::Value;
use sessionizer_cli::generate::{GenerateArgs, GenerateReport, generate};

#[derive(Parser)]
struct T {
    #[command(flatten)]
    a: GenerateArgs,
}

fn args(flags: &[&str]) -> GenerateArgs {
    T::try_parse_from(std::iter::once("generate").chain(flags.iter().copied()))
        .unwrap_or_else(|e| panic!("bad flags {flags:?}: {e}"))
        .a
}

fn run(a: &GenerateArgs) -> (Vec<u8>, GenerateReport) {
    let mut out = Vec::new();
    let report = generate(a, &mut out).expect("generate");
    (out, report)
}

fn lines(out: &[u8]) -> Vec<&[u8]> {
    assert!(
        out.is_empty() || out.ends_with(b"\n"),
        "output must end with a newline"
    );
    out.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect()
}

const MIN: i64 = 60_000;
const YEAR_2200: i64 = 7_258_118_400_000;

/// Days since 1970-01-01 (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

/// Parses the generator's RFC 3339 form `YYYY-MM-DDTHH:MM:SS.mmmZ` strictly.
fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 24
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'.'
        || b[23] != b'Z'
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<i64> {
        let p = &b[r];
        p.iter()
            .all(u8::is_ascii_digit)
            .then(|| p.iter().fold(0, |a, &c| a * 10 + i64::from(c - b'0')))
    };
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, sec, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    Some(((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms)
}

/// A valid event as the sessionizer would see it with default options, or why not.
#[derive(Debug)]
struct Event {
    visit_id: String,
    time: i64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Invalid {
    NotJson,
    NotObject,
    MissingKey,
    NullTime,
    BadTime,
    OutOfRange,
}

fn classify(line: &[u8]) -> Result<Event, Invalid> {
    let v: Value = serde_json::from_slice(line).map_err(|_| Invalid::NotJson)?;
    let obj = v.as_object().ok_or(Invalid::NotObject)?;
    let visit_id = match obj.get("visit_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(Invalid::MissingKey),
    };
    let time = match obj.get("event_time") {
        None | Some(Value::Null) => return Err(Invalid::NullTime),
        Some(Value::String(s)) => parse_time(s).ok_or(Invalid::BadTime)?,
        Some(Value::Number(n)) => n.as_i64().ok_or(Invalid::BadTime)?,
        Some(_) => return Err(Invalid::BadTime),
    };
    if !(0..YEAR_2200).contains(&time) {
        return Err(Invalid::OutOfRange);
    }
    // The other fields every event carries.
    assert!(
        obj.get("page")
            .and_then(Value::as_str)
            .is_some_and(|p| p.starts_with('/')),
        "page"
    );
    assert!(
        obj.get("user_id").and_then(Value::as_str).is_some(),
        "user_id"
    );
    assert!(
        obj.get("event_id").and_then(Value::as_str).is_some(),
        "event_id"
    );
    assert!(
        obj.get("duration_ms").and_then(Value::as_u64).is_some(),
        "duration_ms"
    );
    let login = v.pointer("/context/user/login").and_then(Value::as_str);
    assert!(
        login.is_some_and(|l| l.starts_with("user")),
        "context.user.login in {v}"
    );
    assert!(
        v.pointer("/context/device/type")
            .and_then(Value::as_str)
            .is_some()
    );
    Ok(Event { visit_id, time })
}

/// Splits the output into (events in order, duplicate count, invalid kinds), checking that every
/// duplicate repeats a recent event line.
struct Parsed {
    events: Vec<Event>,
    duplicates: u64,
    invalid: Vec<Invalid>,
}

fn parse(out: &[u8]) -> Parsed {
    let ls = lines(out);
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let mut p = Parsed {
        events: Vec::new(),
        duplicates: 0,
        invalid: Vec::new(),
    };
    for (i, line) in ls.iter().enumerate() {
        if seen.contains(line) {
            p.duplicates += 1;
            let recent = &ls[i.saturating_sub(40)..i];
            assert!(
                recent.contains(line),
                "line {i} repeats a line more than 40 lines back"
            );
            assert!(
                classify(line).is_ok(),
                "line {i}: only event lines are duplicated"
            );
            continue;
        }
        seen.insert(line);
        match classify(line) {
            Ok(e) => p.events.push(e),
            Err(kind) => p.invalid.push(kind),
        }
    }
    p
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let flags = [
        "--events",
        "5000",
        "--keys",
        "50",
        "--out-of-order",
        "10s",
        "--late-fraction",
        "0.02",
        "--duplicate-fraction",
        "0.02",
        "--invalid-fraction",
        "0.02",
    ];
    let (a, ra) = run(&args(&flags));
    let (b, rb) = run(&args(&flags));
    assert_eq!(ra, rb);
    assert!(a == b, "two runs with one seed differ");
    let mut other = flags.to_vec();
    other.extend(["--seed", "43"]);
    let (c, _) = run(&args(&other));
    assert!(a != c, "another seed gives the same output");
}

#[test]
fn counts_match_the_output() {
    let a = args(&[
        "--events",
        "20000",
        "--keys",
        "300",
        "--out-of-order",
        "5s",
        "--late-fraction",
        "0.02",
        "--duplicate-fraction",
        "0.03",
        "--invalid-fraction",
        "0.03",
    ]);
    let (out, r) = run(&a);
    assert_eq!(r.events, 20_000);
    assert!(r.late > 0 && r.duplicates > 0 && r.invalid > 0, "{r:?}");
    assert!(r.late < r.events);
    assert_eq!(
        lines(&out).len() as u64,
        r.events + r.duplicates + r.invalid
    );

    let p = parse(&out);
    assert_eq!(p.events.len() as u64, r.events);
    assert_eq!(p.duplicates, r.duplicates);
    assert_eq!(p.invalid.len() as u64, r.invalid);
    let visits: BTreeSet<&str> = p.events.iter().map(|e| e.visit_id.as_str()).collect();
    assert_eq!(visits.len() as u64, r.visits);
    // Roughly the requested shares (binomial, generous bounds).
    for (n, f) in [(r.late, 0.02), (r.duplicates, 0.03), (r.invalid, 0.03)] {
        let expect = 20_000.0 * f;
        assert!(
            (n as f64) > expect * 0.7 && (n as f64) < expect * 1.3,
            "{n} vs {expect}"
        );
    }
}

#[test]
fn invalid_lines_cycle_through_every_kind_and_are_never_events() {
    let a = args(&[
        "--events",
        "600",
        "--keys",
        "20",
        "--invalid-fraction",
        "0.5",
    ]);
    let (out, r) = run(&a);
    let p = parse(&out);
    assert_eq!(p.invalid.len() as u64, r.invalid);
    assert_eq!(p.events.len(), 600);
    let kinds: BTreeMap<Invalid, usize> = p.invalid.iter().fold(BTreeMap::new(), |mut m, k| {
        *m.entry(*k).or_default() += 1;
        m
    });
    for kind in [
        Invalid::NotJson,
        Invalid::NotObject,
        Invalid::MissingKey,
        Invalid::NullTime,
        Invalid::BadTime,
        Invalid::OutOfRange,
    ] {
        assert!(
            kinds.get(&kind).copied().unwrap_or(0) >= 10,
            "{kind:?} missing: {kinds:?}"
        );
    }
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("\"event_time\":\"yesterday\""));
    assert!(text.contains("\"event_time\":\"2500-"));
    assert!(text.contains("\"event_time\":null"));
}

#[test]
fn in_order_without_jitter_or_late_events() {
    let (out, r) = run(&args(&["--events", "20000", "--keys", "500"]));
    assert_eq!((r.late, r.duplicates, r.invalid), (0, 0, 0));
    let p = parse(&out);
    assert_eq!(p.events.len(), 20_000);
    for w in p.events.windows(2) {
        assert!(w[0].time <= w[1].time, "{:?} then {:?}", w[0], w[1]);
    }
}

#[test]
fn jitter_is_bounded_by_out_of_order() {
    let (out, _) = run(&args(&[
        "--events",
        "20000",
        "--keys",
        "500",
        "--out-of-order",
        "5s",
    ]));
    let p = parse(&out);
    let mut max = i64::MIN;
    let mut behind = 0;
    for e in &p.events {
        assert!(
            e.time >= max.saturating_sub(5000),
            "{e:?} is more than 5s behind {max}"
        );
        behind += usize::from(e.time < max);
        max = max.max(e.time);
    }
    assert!(
        behind > 1000,
        "--out-of-order 5s should reorder events ({behind})"
    );
}

#[test]
fn late_events_are_about_late_by_behind() {
    let a = args(&[
        "--events",
        "20000",
        "--keys",
        "500",
        "--late-fraction",
        "0.05",
        "--late-by",
        "2h",
    ]);
    let (out, r) = run(&a);
    let p = parse(&out);
    let mut max = i64::MIN;
    let mut detected = 0u64;
    for e in &p.events {
        let behind = max.saturating_sub(e.time);
        if e.time < max {
            // Without --out-of-order only late events go backwards, by 2h ± 10%.
            assert!(
                behind > 60 * MIN && behind <= 132 * MIN,
                "{e:?} behind by {behind}ms"
            );
            detected += 1;
        }
        max = max.max(e.time);
    }
    assert!(r.late > 500, "{r:?}");
    // A late event among the very first lines has nothing before it to be behind.
    assert!(
        detected <= r.late && r.late - detected <= 2,
        "{detected} vs {r:?}"
    );
}

#[test]
fn visits_are_new_keys_and_some_return_around_the_gap() {
    // Without returns, no visit has a pause anywhere near 30m: a visit id is never reused.
    let (out, _) = run(&args(&[
        "--events",
        "30000",
        "--keys",
        "300",
        "--return-fraction",
        "0",
    ]));
    let parsed = parse(&out);
    let gaps = max_gap_per_visit(&parsed.events);
    assert!(
        gaps.values().all(|&g| g < 10 * MIN),
        "a visit id came back after a long pause"
    );

    // With returns, some visits pause for a little less and some for a little more than 30m.
    let (out, r) = run(&args(&[
        "--events",
        "30000",
        "--keys",
        "300",
        "--return-fraction",
        "0.2",
    ]));
    let parsed = parse(&out);
    let gaps = max_gap_per_visit(&parsed.events);
    let merges = gaps
        .values()
        .filter(|&&g| (25 * MIN..=30 * MIN).contains(&g))
        .count();
    let splits = gaps
        .values()
        .filter(|&&g| g > 30 * MIN && g <= 35 * MIN)
        .count();
    assert!(
        merges > 50 && splits > 50,
        "merges {merges}, splits {splits}, {r:?}"
    );
    assert!(
        gaps.values()
            .all(|&g| g < 10 * MIN || (25 * MIN..=35 * MIN).contains(&g))
    );
}

fn max_gap_per_visit(events: &[Event]) -> BTreeMap<&str, i64> {
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    let mut gaps: BTreeMap<&str, i64> = BTreeMap::new();
    for e in events {
        if let Some(prev) = last.insert(&e.visit_id, e.time) {
            let g = gaps.entry(&e.visit_id).or_default();
            *g = (*g).max(e.time - prev);
        }
    }
    gaps
}

#[test]
fn mean_line_length_is_realistic() {
    for format in ["rfc3339", "epoch-ms"] {
        let a = args(&["--events", "20000", "--time-format", format]);
        let (out, r) = run(&a);
        let mean = out.len() as f64 / r.events as f64;
        assert!(
            (300.0..470.0).contains(&mean),
            "{format}: mean line length {mean}"
        );
    }
}

#[test]
fn epoch_ms_times_are_numbers() {
    let (out, _) = run(&args(&["--events", "1000", "--time-format", "epoch-ms"]));
    for line in lines(&out) {
        let v: Value = serde_json::from_slice(line).unwrap();
        assert!(v["event_time"].is_i64(), "{v}");
    }
    let p = parse(&out);
    assert!(p.events.iter().all(|e| e.time >= 1_704_067_200_000));
}

#[test]
fn start_sets_the_first_event_time() {
    let (out, _) = run(&args(&[
        "--events",
        "100",
        "--start",
        "2030-05-06T07:08:09Z",
    ]));
    let p = parse(&out);
    let start = parse_time("2030-05-06T07:08:09.000Z").unwrap();
    let first = p.events[0].time;
    assert!(
        first >= start && first <= start + 20_000,
        "first event at {first}, start {start}"
    );
}

#[test]
fn defaults_and_bad_options() {
    let d = GenerateArgs::with_events(7);
    assert_eq!(d.events, 7);
    assert_eq!(d.keys, 1000);
    assert_eq!(d.seed, 42);
    assert_eq!(d.output.to_str(), Some("-"));
    assert_eq!(d.mean_interval, 20_000);
    assert_eq!(d.out_of_order, 0);
    assert_eq!(d.late_by, 2 * 60 * MIN);
    assert_eq!(d.start, 1_704_067_200_000);
    let (out, r) = run(&d);
    assert_eq!(lines(&out).len(), 7);
    assert_eq!(r.events, 7);

    let (out, r) = run(&GenerateArgs::with_events(0));
    assert!(out.is_empty());
    assert_eq!(r, GenerateReport::default());

    for bad in [
        &["--keys", "0"][..],
        &["--late-fraction", "1.5"],
        &["--invalid-fraction", "-0.1"],
        &["--mean-interval", "soon"],
        &["--start", "yesterday"],
        &["--session-length", "0.5"],
        &["--time-format", "epoch-s"],
    ] {
        let mut flags = vec!["generate", "--events", "10"];
        flags.extend_from_slice(bad);
        assert!(T::try_parse_from(&flags).is_err(), "{bad:?} accepted");
    }
    assert!(
        T::try_parse_from(["generate"]).is_err(),
        "--events is required"
    );

    // The library checks what clap would have refused.
    let mut a = GenerateArgs::with_events(10);
    a.duplicate_fraction = 2.0;
    let err = generate(&a, &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
