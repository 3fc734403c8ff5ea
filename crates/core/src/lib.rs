#![warn(missing_docs)]
//! Core types of sessionizer: event time, watermarks and durations, the lazy JSON
//! scanner that pulls the needed fields out of a record, and the event decoder.
//!
//! Everything here is pure: no clocks, no files.

pub mod decode;
pub mod json;
pub mod prefetch;
pub mod time;
pub mod timefmt;

pub use time::{DurationMs, EventTime, Watermark};
