//! `sessionizer._native`, the Python package's native module: the command line run in
//! the interpreter's process (`python -m sessionizer ...`), and one run of it for the
//! package's declarative jobs, whose statistics come back as JSON. The Python side
//! (`python/sessionizer/`) builds the arguments; everything per event runs here, with
//! the interpreter's lock released.

use pyo3::prelude::*;

mod stateful;
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

/// `sessionizer ARGV...` (the program name first), as the binary runs it; returns the
/// exit code. Ctrl-C stops a run between two batches as SIGINT stops the binary (its
/// exit code then says so); the interpreter's own signal handling is left as it was.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> PyResult<u8> {
    let (code, _) = on_a_thread(py, move |options| app::main(argv, options))?;
    Ok(code)
}

/// `sessionizer run ARGS...` without its summary on stderr: returns the run's
/// statistics as JSON text, or raises `SessionizerError`. Ctrl-C (KeyboardInterrupt)
/// stops the run between two batches, as SIGINT stops the binary — what was processed
/// is written out, and checkpointed with a state directory — and is then raised.
#[pyfunction]
fn run(py: Python<'_>, args: Vec<String>) -> PyResult<String> {
    let (result, interrupted) = on_a_thread(py, move |options| {
        app::run_args(
            args,
            RunOptions {
                summary: false,
                ..options
            },
        )
    })?;
    if let Some(e) = interrupted {
        return Err(e);
    }
    match result {
        Ok(stats) => serde_json::to_string(&stats)
            .map_err(|e| SessionizerError::new_err(format!("cannot encode the statistics: {e}"))),
        Err(failure) => {
            let err = SessionizerError::new_err(failure.message);
            let value = err.value(py);
            value.setattr("code", failure.code)?;
            let stats = failure.stats.and_then(|s| serde_json::to_string(&s).ok());
            value.setattr("stats_json", stats)?;
            Err(err)
        }
    }
}

/// Runs `job` on a thread of its own, the interpreter's lock released, with options
/// whose stop flag the calling thread sets at the first Ctrl-C (which it looks for
/// every [`SIGNAL_TICK`]); a second Ctrl-C ends the process at once, as a second signal
/// ends the binary (exit code 1). Returns what `job` returned and the first interrupt.
fn on_a_thread<T: Send + 'static>(
    py: Python<'_>,
    job: impl FnOnce(RunOptions) -> T + Send + 'static,
) -> PyResult<(T, Option<PyErr>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let options = RunOptions {
        signals: false,
        stop: Some(stop.clone()),
        summary: true,
    };
    let job = std::thread::Builder::new()
        .name("sessionizer".into())
        .spawn(move || job(options))
        .map_err(|e| SessionizerError::new_err(format!("cannot start the run's thread: {e}")))?;
    let mut interrupted = None;
    while !job.is_finished() {
        if let Err(e) = py.check_signals() {
            if interrupted.is_some() {
                // The second one: the binary's way out.
                std::process::exit(1);
            }
            stop.store(true, Ordering::Release);
            interrupted = Some(e);
        }
        py.detach(|| std::thread::sleep(SIGNAL_TICK));
    }
    match py.detach(|| job.join()) {
        Ok(value) => Ok((value, interrupted)),
        Err(_) => Err(pyo3::exceptions::PyRuntimeError::new_err(
            "the run panicked (a bug: please report it with the message printed on stderr)",
        )),
    }
}

/// A stateful job whose function is Python code (`sessionizer.spark`): `call` is the
/// Python side's per-call wrapper, `options` the job as JSON (files or a Kafka topic).
/// Returns the run's statistics as JSON, or raises the function's own exception (with the key in a note) or
/// `SessionizerError`. Ctrl-C stops the run after its micro-batch (checkpointed) and
/// is then raised.
#[pyfunction]
fn run_stateful(py: Python<'_>, call: Py<PyAny>, options: &str) -> PyResult<String> {
    let options: stateful::Options = serde_json::from_str(options)
        .map_err(|e| SessionizerError::new_err(format!("bad options: {e}")))?;
    let (result, interrupted) = on_a_thread(py, move |run| {
        let stop = run.stop.unwrap_or_default();
        stateful::run(call, options, stop)
    })?;
    if let Some(e) = interrupted {
        return Err(e);
    }
    match result {
        Ok(stats) => Ok(stats),
        Err(stateful::Stop::Python(e)) => Err(e),
        Err(stateful::Stop::Engine(message)) => {
            let err = SessionizerError::new_err(message);
            err.value(py).setattr("code", 1)?;
            Err(err)
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(run_stateful, m)?)?;
    m.add("SessionizerError", m.py().get_type::<SessionizerError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
