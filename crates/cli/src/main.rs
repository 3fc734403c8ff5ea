//! The `sessionizer` binary: the command line of [`sessionizer_cli::app`], run in its own
//! process.
//!
//! Exit codes: 0 success; 1 the run failed (unreadable input, unwritable output, an
//! invalid record with `--on-invalid fail`); 2 bad options or config file.

use sessionizer_cli::app::{self, RunOptions};
use std::process::ExitCode;

/// Sessions are created and dropped at a high rate, often by another thread than the
/// one that reads the input: mimalloc's thread-local free lists handle that pattern much
/// better than the system allocator (see BENCHMARKS.md). Built without transparent huge
/// pages (the `no_thp` feature): resident memory then follows the state.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    ExitCode::from(app::main(std::env::args_os(), RunOptions::binary()))
}
