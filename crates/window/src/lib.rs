#![warn(missing_docs)]
//! The two operators of sessionizer — the event-time session window and user-defined
//! stateful functions — built on one small keyed-state + timers core.
//!
//! * [`keyed`] — per-key state slots with one event-time and one processing-time timer
//!   per key, indexed by deadline (never a scan of all keys per watermark step).
//! * [`clock`] — processing time, injected ([`Clock`], [`SystemClock`], [`ManualClock`]).
//! * [`session`] — one key's sessions: which ones an event touches, merging.
//! * [`aggregate`] — mergeable per-session aggregates: the built-in JSON ones
//!   (`--collect`, `--first`, ...) and user-defined ones ([`Aggregator`]).
//! * [`operator`] — [`SessionOperator`]: pure and synchronous, it takes events and
//!   watermarks and reports sessions, retractions and verdicts through [`Emit`]. It never
//!   reads a clock, a file or a socket.
//! * [`stateful`] — [`StatefulOperator`]: user code called per key with the key's new
//!   events and a [`GroupState`] handle (Spark's `flatMapGroupsWithState`, Flink's
//!   `KeyedProcessFunction`), with event-time and processing-time timeouts and
//!   snapshot / restore of the keyed state.
//! * [`watermark`] — watermark strategies ([`BoundedOutOfOrderness`], or any
//!   [`WatermarkStrategy`]).
//! * [`spill`] — the state-backend seam below the keyed store: where keys go that
//!   memory has no room for ([`spill::MapSpill`]; with the `rocksdb` feature
//!   `spill::RocksSpill`).
//! * [`codec`] — the checkpoint encoding of one key's sessions (the keyed state of
//!   `sessionizer run --state-dir`).
//!
//! The rules implemented here are those of `docs/semantics.md`; the stateful
//! operator's batching and timeout rules are in `docs/library.md`.

pub mod aggregate;
pub mod clock;
pub mod codec;
mod index;
pub mod keyed;
pub mod operator;
pub mod session;
pub mod spill;
pub mod stateful;
pub mod watermark;
mod wheel;

pub use aggregate::{
    Accumulate, AggKind, AggState, Aggregator, Custom, CustomView, JsonAggregates, Position,
    SessionAggregate,
};
pub use clock::{Clock, ManualClock, ProcessingTime, SystemClock};
pub use operator::{
    Emit, EmitMode, Event, LateReason, OperatorCounts, SessionOperator, SessionView, SpillCounts,
    TypedEvent, Verdict, WindowConfig,
};
pub use session::session_id;
pub use stateful::{BatchRules, GroupState, LatePolicy, StatefulOperator, TimeoutKind, Timer};
pub use watermark::{BoundedOutOfOrderness, WatermarkStrategy};
