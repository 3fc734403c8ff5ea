//! `sessionizer._native`, the Python package's native module: the command line run in
//! the interpreter's process (`python -m sessionizer ...`), and one run of it for the
//! package's declarative jobs, whose statistics come back as JSON. The Python side
//! (`python/sessionizer/`) builds the arguments; everything per event runs here, with
//! the interpreter's lock released.

use pyo3::prelude::*;
use sessionizer_cli::app::{self, RunOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Sessions are created and dropped at a high rate: the allocator of the binary (see
/// BENCHMARKS.md), for the Rust side of the process.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pyo3::create_exception!(
    _native,
    SessionizerError,
    pyo3::exceptions::PyException,
    "A run that failed: bad options (`code` 2) or a failed run (`code` 1); its message says why."
);

/// How often a run waiting in the interpreter's main thread looks for Ctrl-C.
const SIGNAL_TICK: Duration = Duration::from_millis(50);

/// `sessionizer ARGV...` (the program name first), as the binary runs it, SIGINT and
/// SIGTERM included (they stop the run between two batches, as in the binary); returns
/// the exit code.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| app::main(argv, RunOptions::binary()))
}

/// `sessionizer run ARGS...` without its summary on stderr: returns the run's
/// statistics as JSON text, or raises
/// `SessionizerError`. Ctrl-C (KeyboardInterrupt) stops the run between two batches,
/// as SIGINT stops the binary — what was processed is written out, and checkpointed
/// with a state directory — and is then raised.
#[pyfunction]
fn run(py: Python<'_>, args: Vec<String>) -> PyResult<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let options = RunOptions {
        signals: false,
        stop: Some(stop.clone()),
        summary: false,
    };
    let job = std::thread::Builder::new()
        .name("sessionizer".into())
        .spawn(move || app::run_args(args, options))
        .map_err(|e| SessionizerError::new_err(format!("cannot start the run's thread: {e}")))?;
    let mut interrupted = None;
    while !job.is_finished() {
        if interrupted.is_none()
            && let Err(e) = py.check_signals()
        {
            stop.store(true, Ordering::Release);
            interrupted = Some(e);
        }
        py.detach(|| std::thread::sleep(SIGNAL_TICK));
    }
    let result = py.detach(|| job.join());
    if let Some(e) = interrupted {
        return Err(e);
    }
    match result {
        Ok(Ok(stats)) => serde_json::to_string(&stats)
            .map_err(|e| SessionizerError::new_err(format!("cannot encode the statistics: {e}"))),
        Ok(Err(failure)) => {
            let err = SessionizerError::new_err(failure.message);
            let value = err.value(py);
            value.setattr("code", failure.code)?;
            let stats = failure.stats.and_then(|s| serde_json::to_string(&s).ok());
            value.setattr("stats_json", stats)?;
            Err(err)
        }
        Err(_) => Err(pyo3::exceptions::PyRuntimeError::new_err(
            "the run panicked (a bug: please report it with the message printed on stderr)",
        )),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add("SessionizerError", m.py().get_type::<SessionizerError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
