//! The `sessionizer` command line, in three stages (ripgrep's habit):
//!
//! 1. [`args`] — raw clap arguments, as typed;
//! 2. [`config`] — a validated [`sessionizer::PipelineConfig`], merged with the
//!    `--config` TOML file (flags win), every duration and path checked;
//! 3. [`sessionizer::pipeline`] — the running job (in the `sessionizer` library).
//!
//! [`generate`] writes sample visit events; [`inspect`] shows a state directory;
//! [`http`] serves a running job's metrics, sessions and health (`--http-addr`).

pub mod app;
pub mod args;
pub mod config;
pub mod generate;
pub mod http;
pub mod inspect;
pub mod kafka;
pub mod paths;
pub mod progress;
