//! Running the real `sessionizer` binary from a test.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sessionizer"))
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

/// Dirty generated visits: out of order, late (some within the lateness, so there are
/// revisions and retractions), duplicated and invalid lines.
pub fn generate(path: &Path, events: u64, seed: u64) {
    run_ok(&[
        "generate",
        "--events",
        &events.to_string(),
        "--keys",
        "2000",
        "--seed",
        &seed.to_string(),
        "--out-of-order",
        "30s",
        "--late-fraction",
        "0.03",
        "--late-by",
        "4m",
        "--duplicate-fraction",
        "0.005",
        "--invalid-fraction",
        "0.002",
        "--return-fraction",
        "0.3",
        "--output",
        s(path),
    ]);
}
