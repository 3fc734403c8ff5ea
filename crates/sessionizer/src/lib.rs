#![warn(missing_docs)]
//! sessionizer as a library: sessionize your own events in your own service, in either
//! style of the field, or run the command line's JSON pipeline.
//!
//! **Declarative session windows** — key, time, gap, watermark, lateness, aggregates:
//!
//! ```
//! use sessionizer::prelude::*;
//!
//! struct Visit { visit_id: String, page: String, at: EventTime }
//!
//! let mut job = Stream::<Visit>::new()
//!     .key_by(|v| v.visit_id.clone())
//!     .event_time(|v| v.at)
//!     .watermark(BoundedOutOfOrderness::new(minutes(1)))
//!     .session_windows(minutes(10))
//!     .allowed_lateness(minutes(15))
//!     .aggregate(Collect(|v: &Visit| Some(v.page.clone())))
//!     .build();
//! # let visits: Vec<Visit> = Vec::new();
//! let (mut sessions, mut late) = (Vec::new(), Vec::new());
//! job.run(visits, &mut sessions, &mut late)?;
//! # Ok::<(), sessionizer::sink::SinkError>(())
//! ```
//!
//! **Arbitrary stateful processing** — a function per key with a state handle and
//! timeouts ([`stateful`]):
//!
//! ```
//! use sessionizer::prelude::*;
//!
//! struct Visit { visit_id: String, at: EventTime }
//!
//! let mut job = Stream::<Visit>::new()
//!     .key_by(|v| v.visit_id.clone())
//!     .event_time(|v| v.at)
//!     .flat_map_groups_with_state(|key: &str, visits: Vec<Visit>, state: &mut GroupState<'_, u64>| {
//!         if state.has_timed_out() {
//!             return state.remove().map(|n| (key.to_string(), n));
//!         }
//!         let n = state.get().copied().unwrap_or(0) + visits.len() as u64;
//!         state.update(n);
//!         let last = visits.iter().map(|v| v.at).max().unwrap_or(EventTime(0));
//!         state.set_timeout_timestamp(last.plus(minutes(10)));
//!         None
//!     })
//!     .batching(Batching::Events(1000))
//!     .build();
//! # let visits: Vec<Visit> = Vec::new();
//! let (mut counts, mut late) = (Vec::new(), Vec::new());
//! job.run(visits, &mut counts, &mut late)?;
//! # Ok::<(), sessionizer::sink::SinkError>(())
//! ```
//!
//! Both run on one keyed-state + timers core ([`window::keyed::KeyedStore`]); the
//! command line's job is the declarative window with the built-in JSON aggregates. The
//! guide, `docs/library.md`, is compiled with the doc-tests (`LibraryGuide` under
//! `cfg(doctest)`).
//!
//! * [`stream`] — [`Stream`]: key and time extractors, watermark strategy.
//! * [`windowed`] — the session window job and its output records.
//! * [`stateful`] — the stateful job, its batching and snapshots.
//! * [`aggregators`] — the built-in aggregates over your events; write your own with
//!   [`window::Aggregator`].
//! * [`sink`], [`source`], [`late`] — where outputs, late (and rejected) events and
//!   dead letters go; JSON-lines input.
//! * [`checkpoints`] — a session window job's checkpoints, in the command line's format.
//! * [`time`] — durations (`minutes(10)`) and RFC 3339 serde helpers.
//!
//! The command line's pipeline:
//!
//! * [`config::PipelineConfig`] — the validated options of a run (inputs, fields, gap,
//!   watermark delay, lateness, aggregates, dedup, outputs).
//! * [`pipeline::run`] — reads JSON lines, decodes, judges each event against the
//!   watermark, runs the session window and writes sessions, late events and dead
//!   letters, keeping the accounting (docs/semantics.md S-13) in [`stats::RunStats`].
//! * [`telemetry::Telemetry`] — the one emit point of a running job's events: logs
//!   (`tracing`), Prometheus metrics, the progress line, and questions about a key.
//!
//! The building blocks are re-exported: [`core`] (time types, JSON scanning, decoding),
//! [`window`] (the keyed-state + timers core and the session operator) and
//! [`connectors`] (inputs and output encoding).

mod api;
pub mod config;
pub mod error;
mod jobs;
pub mod pipeline;
mod runtime;
pub mod stats;
pub mod telemetry;

#[cfg(feature = "kafka")]
pub use api::kafka;
#[cfg(feature = "delta")]
pub use api::table;
pub use api::{aggregators, checkpoints, late, sink, source, stateful, stream, time, windowed};

pub use config::PipelineConfig;
pub use sessionizer_connectors as connectors;
pub use sessionizer_core as core;
pub use sessionizer_window as window;
pub use stream::Stream;

/// The guide `docs/library.md`, compiled: every Rust snippet in it is a doc-test, so the
/// guide cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryGuide;

/// Everything a job needs, in one import.
pub mod prelude {
    pub use crate::aggregators::{
        Collect, Count, CountDistinct, First, Last, Max, Min, Named, Sum,
    };
    pub use crate::checkpoints::{Checkpoints, Resumed, StateError};
    pub use crate::config::StateBackend;
    pub use crate::late::Late;
    pub use crate::sink::{JsonLinesSink, OutputTarget, Sink, SinkError};
    pub use crate::source::{DeadLetter, InputSource, JsonLines, SourceError};
    pub use crate::stateful::{Batching, StatefulJob};
    pub use crate::stream::Stream;
    pub use crate::time::{hours, millis, minutes, seconds};
    pub use crate::windowed::{
        Emission, SessionRecord, SessionWindowJob, Trigger, WindowCounts, WindowOutput,
    };
    pub use sessionizer_core::{DurationMs, EventTime, Watermark};
    pub use sessionizer_window::aggregate::{Aggregator, Position};
    pub use sessionizer_window::clock::{Clock, ManualClock, ProcessingTime, SystemClock};
    pub use sessionizer_window::stateful::{
        BatchRules, GroupState, LatePolicy, TimeoutKind, Timer,
    };
    pub use sessionizer_window::{BoundedOutOfOrderness, EmitMode, WatermarkStrategy};
}
