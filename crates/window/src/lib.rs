//! The event-time session window of sessionizer, built on a small keyed-state + timers
//! core.
//!
//! * [`keyed`] — per-key state slots with one event-time timer per key, indexed by
//!   deadline (never a scan of all keys per watermark step).
//! * [`session`] — one key's sessions: which ones an event touches, merging.
//! * [`aggregate`] — the mergeable per-session aggregates (`--collect`, `--first`, ...).
//! * [`operator`] — [`SessionOperator`]: pure and synchronous, it takes events and
//!   watermarks and reports sessions, retractions and verdicts through [`Emit`]. It never
//!   reads a clock, a file or a socket.
//! * [`watermark`] — watermark strategies ([`BoundedOutOfOrderness`]).
//!
//! The rules implemented here are SPEC §2, refined in `docs/semantics.md`.

pub mod aggregate;
pub mod keyed;
pub mod operator;
pub mod session;
pub mod watermark;

pub use aggregate::{AggKind, AggState};
pub use operator::{
    Emit, EmitMode, Event, LateReason, SessionOperator, SessionView, Verdict, WindowConfig,
};
pub use session::session_id;
pub use watermark::BoundedOutOfOrderness;
