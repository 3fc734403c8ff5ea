//! The `sessionizer` command line, in three stages (ripgrep's habit):
//!
//! 1. [`args`] — raw clap arguments, as typed;
//! 2. [`config`] — a validated [`config::RunConfig`], merged with the `--config` TOML
//!    file (flags win), every duration and path checked;
//! 3. [`pipeline`] — the running job: inputs → decoder → watermark → session operator →
//!    outputs, with the accounting of SPEC §2.
//!
//! [`generate`] writes sample visit events.

pub mod args;
pub mod config;
pub mod generate;
pub mod pipeline;
pub mod progress;
pub mod stats;
