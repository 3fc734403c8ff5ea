//! The progress line on stderr for long runs: only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sessionizer::core::Watermark;
use sessionizer::pipeline::Observer;
use sessionizer::stats::human;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress line, or nothing when stderr is not a terminal. Clones share the line.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
}

impl Progress {
    /// A progress line when `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Progress {
        let show = wanted && std::io::stderr().is_terminal();
        let bar = show.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// Updates the line: records read, records/s, open sessions, watermark.
    pub fn update(&self, records: u64, open_sessions: usize, watermark: Watermark) {
        if let Some(bar) = &self.bar {
            let secs = self.started.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "read {records} records | {}/s | open sessions {open_sessions} | watermark {watermark}",
                human(records as f64 / secs)
            ));
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Observer for Progress {
    fn progress(&self, records_read: u64, open_sessions: usize, watermark: Watermark) {
        self.update(records_read, open_sessions, watermark);
    }

    fn warn(&self, message: &str) {
        let print = || eprintln!("sessionizer: warning: {message}");
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }
}
