//! sessionizer as a library: the pipeline behind the `sessionizer` command line.
//!
//! * [`config::PipelineConfig`] — the validated options of a run (inputs, fields, gap,
//!   watermark delay, lateness, aggregates, dedup, outputs).
//! * [`pipeline::run`] — reads JSON lines, decodes, judges each event against the
//!   watermark, runs the session window and writes sessions, late events and dead
//!   letters, keeping the accounting of SPEC §2 in [`stats::RunStats`].
//!
//! The building blocks are re-exported: [`core`] (time types, JSON scanning, decoding),
//! [`window`] (the keyed-state + timers core and the session operator) and
//! [`connectors`] (inputs and output encoding).

pub mod config;
pub mod pipeline;
pub mod stats;

pub use config::PipelineConfig;
pub use sessionizer_connectors as connectors;
pub use sessionizer_core as core;
pub use sessionizer_window as window;
