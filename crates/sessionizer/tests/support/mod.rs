//! What the library's tests share: a seeded pseudo-random source and the dirty visit
//! stream most of them run on.

#![allow(dead_code)]

use sessionizer::prelude::*;

/// 2024-01-01T00:00:00Z.
pub const T0: i64 = 1_704_067_200_000;

/// A xorshift64 generator: the same `seed` gives the same numbers (an even seed is
/// made odd; zero would stay zero).
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visit {
    pub visit: u32,
    pub at: EventTime,
    pub page: u8,
}

/// `n` events over `keys` visits, `step_ms` apart, out of order by up to 4 minutes,
/// 2% of them 30 minutes late and 10% 5 minutes late, in an order fixed by `seed`.
pub fn visits(n: i64, keys: u64, step_ms: i64, seed: u64) -> Vec<Visit> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|i| {
            let visit = (next() % keys) as u32;
            let jitter = (next() % 240_000) as i64;
            let far_late = match next() % 50 {
                0 => 1_800_000,
                1..=5 => 300_000,
                _ => 0,
            };
            Visit {
                visit,
                at: EventTime(T0 + i * step_ms - jitter - far_late),
                page: (next() % 7) as u8,
            }
        })
        .collect()
}

/// The window most tests run: `Count` and `Collect` of the page per visit, a watermark
/// a minute behind, on a manual clock.
pub type VisitJob = SessionWindowJob<
    Visit,
    fn(&Visit) -> u32,
    fn(&Visit) -> EventTime,
    BoundedOutOfOrderness,
    (Count, Collect<fn(&Visit) -> Option<u8>>),
    sessionizer::windowed::FixedGap,
    ManualClock,
>;

/// What a [`VisitJob`] emits.
pub type VisitOut = WindowOutput<(u64, Vec<u8>)>;

/// A [`VisitJob`] with `gap`, `lateness` and `emit`, its times limited to `valid` if
/// given.
pub fn visit_job(
    gap: DurationMs,
    lateness: DurationMs,
    emit: EmitMode,
    valid: Option<std::ops::Range<EventTime>>,
    clock: ManualClock,
) -> VisitJob {
    let mut stream = Stream::<Visit>::new()
        .key_by((|v| v.visit) as fn(&Visit) -> u32)
        .event_time((|v| v.at) as fn(&Visit) -> EventTime)
        .watermark(BoundedOutOfOrderness::new(minutes(1)));
    if let Some(valid) = valid {
        stream = stream.valid_time_range(valid);
    }
    stream
        .session_windows(gap)
        .allowed_lateness(lateness)
        .emit(emit)
        .clock(clock)
        .aggregate((
            Count,
            Collect((|v| Some(v.page)) as fn(&Visit) -> Option<u8>),
        ))
        .build()
}

/// Runs `input` through `job` to the end: its records, late events, counts, and the
/// job.
pub fn run_visits(
    mut job: VisitJob,
    input: &[Visit],
) -> (Vec<VisitOut>, Vec<Late<Visit>>, WindowCounts, VisitJob) {
    let (mut out, mut late) = (Vec::new(), Vec::new());
    let counts = job
        .run(input.iter().cloned(), &mut out, &mut late)
        .expect("vectors and the store");
    (out, late, counts, job)
}

/// The binary of example `name`: `target/<profile>/examples/`, next to the test's
/// `deps/`. `cargo test` builds it with the other targets, but not when only one test
/// is named (`--test ...`): then a binary older than a source file of the workspace is
/// refused rather than tested.
pub fn example(name: &str) -> std::path::PathBuf {
    use std::path::Path;
    let exe = std::env::current_exe().expect("test binary");
    let profile = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile.join("examples").join(name);
    let build = format!("cargo build -p sessionizer --features kafka --example {name}");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {build}", bin.display()));
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Some(newer) = newest_source(&crates).filter(|(at, _)| *at > built) {
        panic!(
            "{} is older than {}: {build}",
            bin.display(),
            newer.1.display()
        );
    }
    bin
}

/// The most recently modified `.rs` file under `dir`'s `src/` and `examples/` folders.
fn newest_source(dir: &std::path::Path) -> Option<(std::time::SystemTime, std::path::PathBuf)> {
    let mut newest: Option<(std::time::SystemTime, std::path::PathBuf)> = None;
    let mut todo: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .flat_map(|c| [c.path().join("src"), c.path().join("examples")])
        .collect();
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && let Ok(at) = entry.metadata().and_then(|m| m.modified())
                && newest.as_ref().is_none_or(|(n, _)| at > *n)
            {
                newest = Some((at, path));
            }
        }
    }
    newest
}

/// `n` visit lines over a sliding set of about 60 live visits, out of order by up to 3
/// minutes, 1% half an hour late; every 700th line no visit, one far-future time (year
/// 2500, outside the valid range) and some blank lines, CRLF ends now and then.
pub fn write_visit_lines(path: &std::path::Path, n: u64) {
    write_visit_range(path, 0..n);
}

/// Lines `range` of the input of [`write_visit_lines`] (a later range: later times).
pub fn write_visit_range(path: &std::path::Path, range: std::ops::Range<u64>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(7 + range.start);
    let mut text = String::new();
    let n = range.end;
    for i in range {
        let visit = i / 100 + rng.random_range(0..60);
        let mut ms = 1_704_067_200_000 + i as i64 * 500 - rng.random_range(0..180_000);
        if rng.random_range(0..100) == 0 {
            ms -= 1_800_000;
        }
        let time = sessionizer::core::timefmt::format_rfc3339_ms(EventTime(ms));
        let page = rng.random_range(0..9);
        let end = if i % 97 == 0 { "\r\n" } else { "\n" };
        if i % 700 == 350 {
            text.push_str("{\"visit_id\":\"v-broken\",\"page\":\"/\"}\n");
        }
        if i % 1000 == 999 {
            text.push('\n');
        }
        if i == n / 2 {
            text.push_str(
                "{\"visit_id\":\"v1\",\"event_time\":\"2500-01-01T00:00:00Z\",\"page\":\"/\"}\n",
            );
        }
        text.push_str(&format!(
            "{{\"visit_id\":\"v{visit}\",\"event_time\":\"{time}\",\"page\":\"/p{page}\"}}{end}"
        ));
    }
    std::fs::write(path, text).expect("write the input");
}

/// What [`kill_at_random_instants`] did.
pub struct Killed {
    /// Runs killed.
    pub kills: usize,
    /// Runs that said on stderr that they resumed from a checkpoint.
    pub resumed: usize,
}

/// Starts a restartable service (`service()`, its stderr piped) again and again, each
/// run killed with SIGKILL at a random instant between `took / slowest` and
/// `took / fastest + 2 ms` (`took`: how long an uninterrupted run took), for at most
/// `rounds` runs or until one ends by itself; if none did, one more run to its end.
/// Every run that ends must succeed.
pub fn kill_at_random_instants(
    mut service: impl FnMut() -> std::process::Command,
    took: std::time::Duration,
    (slowest, fastest): (u64, u64),
    rounds: usize,
    seed: u64,
) -> Killed {
    use rand::{Rng, SeedableRng};
    let said_resumed = |stderr: &[u8]| {
        usize::from(String::from_utf8_lossy(stderr).contains("resumed from checkpoint"))
    };
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut done = Killed {
        kills: 0,
        resumed: 0,
    };
    let ms = took.as_millis() as u64;
    for _ in 0..rounds {
        let mut child = service().spawn().expect("spawn the service");
        let wait = rng.random_range(ms / slowest..ms / fastest + 2);
        std::thread::sleep(std::time::Duration::from_millis(wait));
        if child.try_wait().expect("wait").is_some() {
            let ended = child.wait_with_output().expect("output");
            assert!(
                ended.status.success(),
                "{}",
                String::from_utf8_lossy(&ended.stderr)
            );
            done.resumed += said_resumed(&ended.stderr);
            return done;
        }
        child.kill().expect("SIGKILL");
        let killed = child.wait_with_output().expect("reaped");
        done.kills += 1;
        done.resumed += said_resumed(&killed.stderr);
    }
    let ended = service().output().expect("run the service");
    assert!(
        ended.status.success(),
        "{}",
        String::from_utf8_lossy(&ended.stderr)
    );
    done.resumed += said_resumed(&ended.stderr);
    done
}
