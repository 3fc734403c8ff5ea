//! A job's file outputs compared with another run's, and a run killed at an instant:
//! what the recovery tests of both state backends share. The including test crate
//! declares `mod process` (support/process.rs) beside this module.
#![allow(dead_code)]

use crate::process::bin;
use sessionizer_checkpoint::StateDir;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The three file outputs of a job writing `dir/out.jsonl`.
pub fn outputs(dir: &Path) -> [PathBuf; 3] {
    [
        dir.join("out.jsonl"),
        dir.join("out.dead-letter.jsonl"),
        dir.join("out.late.jsonl"),
    ]
}

/// Asserts that two output files are equal, showing the first line that differs rather
/// than megabytes of bytes.
pub fn assert_same_file(got: &Path, want: &Path) {
    let (g, w) = (
        std::fs::read(got).unwrap_or_else(|e| panic!("{}: {e}", got.display())),
        std::fs::read(want).unwrap_or_else(|e| panic!("{}: {e}", want.display())),
    );
    if g == w {
        return;
    }
    let (gl, wl): (Vec<&[u8]>, Vec<&[u8]>) = (
        g.split(|&b| b == b'\n').collect(),
        w.split(|&b| b == b'\n').collect(),
    );
    let i = gl
        .iter()
        .zip(&wl)
        .position(|(a, b)| a != b)
        .unwrap_or(gl.len().min(wl.len()));
    panic!(
        "{} differs from {} ({} vs {} bytes, {} vs {} lines); first difference at line {}:\n got: {}\nwant: {}",
        got.display(),
        want.display(),
        g.len(),
        w.len(),
        gl.len(),
        wl.len(),
        i + 1,
        gl.get(i)
            .map_or("<none>".into(), |l| String::from_utf8_lossy(l)),
        wl.get(i)
            .map_or("<none>".into(), |l| String::from_utf8_lossy(l)),
    );
}

/// Asserts that the three outputs in `got_dir` equal those in `want_dir`.
pub fn assert_same_outputs(got_dir: &Path, want_dir: &Path) {
    for (g, w) in outputs(got_dir).iter().zip(outputs(want_dir).iter()) {
        assert_same_file(g, w);
    }
}

/// A stats file.
pub fn stats(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("stats file")).expect("stats JSON")
}

/// How much of the input the newest checkpoint has consumed (0 without one).
pub fn done_fraction(state: &Path, events: u64) -> f64 {
    let Ok(dir) = StateDir::existing(state) else {
        return 0.0;
    };
    match dir.recover() {
        Ok(r) => r.found.map_or(0.0, |f| {
            f.manifest.counters.records_read as f64 / events as f64
        }),
        Err(_) => 0.0,
    }
}

/// Runs the binary with `args`, its stderr appended to `log`, for at most `limit`:
/// its exit status if it ended by then, else `None` once it has been killed with
/// SIGKILL and reaped.
pub fn run_or_kill(args: &[String], log: &Path, limit: Duration) -> Option<ExitStatus> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    let mut child = bin()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
            return None;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// How long each run of a crash test lives before it is killed, so that the kills
/// spread over the whole job whatever the machine's speed. A run gets a uniform share
/// of `first` (at least 1 ms); a run that made no progress (killed before its first
/// checkpoint: startup and restore take a while on a slow machine) makes the next get
/// 25% more, so the job always gets through, and progress resets the share. Past 60%
/// of the input with fewer than `want` kills, the share shrinks with what is left
/// (`took`, an uninterrupted run, times the undone fraction, split over the kills
/// still wanted), so that a fast machine does not finish the job first.
#[derive(Debug)]
pub struct KillDelays {
    took: Duration,
    first: Duration,
    slice: Duration,
    want: u32,
    last: Option<f64>,
}

impl KillDelays {
    pub fn new(took: Duration, first: Duration, want: u32) -> KillDelays {
        KillDelays {
            took,
            first,
            slice: first,
            want,
            last: None,
        }
    }

    /// The next run's limit, given how much of the input is done and the kills so far.
    pub fn next(&mut self, done: f64, kills: u32, rng: &mut impl rand::Rng) -> Duration {
        if self.last.is_some_and(|last| last >= done) {
            self.slice = self.slice.mul_f64(1.25);
        } else {
            self.slice = self.first;
        }
        self.last = Some(done);
        let slice = if kills < self.want && done > 0.6 {
            let left = self
                .took
                .mul_f64((1.0 - done) / f64::from(2 * (self.want + 1 - kills)));
            self.slice.min(left)
        } else {
            self.slice
        };
        Duration::from_micros(rng.random_range(500..=slice.as_micros().max(1_000) as u64))
    }
}

/// Runs the job of `args` again and again, each run killed at an instant of
/// [`KillDelays`] (`took` an uninterrupted run's time, `want` the kills wanted, `seed`
/// the instants' seed) until one ends by itself, which must succeed; the runs' stderr
/// goes to `log`. Its progress is read from the state directory `state` of a job over
/// `events` events. Returns the kills.
pub fn kill_until_done(
    args: &[String],
    state: &Path,
    events: u64,
    log: &Path,
    (took, want, seed): (Duration, u32, u64),
) -> u32 {
    use rand::SeedableRng;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut delays = KillDelays::new(took, took / 8, want);
    let (mut kills, mut runs) = (0u32, 0u32);
    loop {
        runs += 1;
        assert!(runs <= 300, "no run finished after {runs} restarts");
        let delay = delays.next(done_fraction(state, events), kills, &mut rng);
        match run_or_kill(args, log, delay) {
            Some(status) if status.success() => return kills,
            Some(status) => panic!(
                "run {runs} failed ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ),
            None => kills += 1,
        }
    }
}
