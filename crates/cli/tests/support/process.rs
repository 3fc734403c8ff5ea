//! Running the real `sessionizer` binary from a test.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The binary under test, with the environment of [`set_env`].
pub fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sessionizer"));
    if let Some(vars) = ENV.get() {
        cmd.envs(vars.iter().map(|(k, v)| (k, v)));
    }
    cmd
}

static ENV: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// Variables every run of the binary in this test binary gets (an object store's
/// endpoint and keys); set once, always with the same values.
pub fn set_env(vars: Vec<(String, String)>) {
    let set = ENV.get_or_init(|| vars.clone());
    assert_eq!(*set, vars, "one environment per test binary");
}

/// Sends `signal` (`-TERM`, `-STOP`, `-CONT`, ...) to a running child, with `kill`.
pub fn signal(child: &std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill {signal} {}", child.id());
}

/// A path as an argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// Runs the binary to its end.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawn sessionizer")
}

/// Runs the binary to its end; it must succeed.
pub fn run_ok(args: &[&str]) -> Output {
    let out = run(args);
    assert!(
        out.status.success(),
        "sessionizer {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// How dirty generated visits are: the fractions of late, duplicated and invalid lines
/// and of keys that come back after a pause (every run here is out of order by up to
/// 30 s, the late ones by up to 4 minutes).
pub struct Dirt {
    pub late: &'static str,
    pub duplicate: &'static str,
    pub invalid: &'static str,
    pub returning: &'static str,
}

/// Dirty enough that every rule shows on a small input.
pub const DIRTY: Dirt = Dirt {
    late: "0.03",
    duplicate: "0.005",
    invalid: "0.002",
    returning: "0.3",
};

/// Dirty as real input tends to be.
pub const LIGHTLY_DIRTY: Dirt = Dirt {
    late: "0.003",
    duplicate: "0.003",
    invalid: "0.001",
    returning: "0.05",
};

/// Generates `events` [`DIRTY`] visits of 2,000 concurrent keys into `path`.
pub fn generate(path: &Path, events: u64, seed: u64) {
    generate_with(path, events, 2000, seed, &DIRTY);
}

/// Generates `events` visits of `keys` concurrent keys, as dirty as `dirt`, into `path`.
pub fn generate_with(path: &Path, events: u64, keys: u64, seed: u64, dirt: &Dirt) {
    run_ok(&[
        "generate",
        "--events",
        &events.to_string(),
        "--keys",
        &keys.to_string(),
        "--seed",
        &seed.to_string(),
        "--out-of-order",
        "30s",
        "--late-fraction",
        dirt.late,
        "--late-by",
        "4m",
        "--duplicate-fraction",
        dirt.duplicate,
        "--invalid-fraction",
        dirt.invalid,
        "--return-fraction",
        dirt.returning,
        "--output",
        s(path),
    ]);
}
