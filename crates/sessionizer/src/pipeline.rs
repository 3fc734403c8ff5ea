//! The command line's job as a library call: [`run`] and [`run_with`] run
//! `sessionizer run`'s pipeline over a [`PipelineConfig`](crate::config::PipelineConfig)
//! (files, stdin or Kafka in; files, stdout or Kafka out), reporting to a
//! [`Telemetry`](crate::telemetry::Telemetry).

pub use crate::error::RunError;
pub use crate::jobs::json::{run, run_with};
pub use crate::runtime::backend::store_reader;
pub use crate::telemetry::{Observer, Quiet};
