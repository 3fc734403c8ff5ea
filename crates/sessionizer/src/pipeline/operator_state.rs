//! What checkpointing needs from a shard's session operator: the keys changed since the
//! last checkpoint, every key for a base, and putting keys and the watermark back.
//!
//! PLACEHOLDER until the window crate grows change tracking and a state codec: every
//! method reports that checkpoints are not supported yet, and `Durable::open` refuses
//! to start rather than write incomplete checkpoints.

use sessionizer_checkpoint::StateEntries;
use sessionizer_core::{DurationMs, Watermark};
use sessionizer_window::SessionOperator;

/// Whether this build can checkpoint the session operator.
pub(crate) const SUPPORTED: bool = false;

/// The checkpoint seam of an operator.
pub(crate) trait OperatorState {
    /// Starts (or stops) remembering which keys change.
    fn track_changes(&mut self, on: bool);
    /// Encodes every key (`base`) or the changed and removed keys, and forgets the
    /// changes.
    fn encode_state(&mut self, base: bool, out: &mut StateEntries);
    /// Puts one key's encoded state back.
    fn restore_key(&mut self, key: &[u8], value: &[u8]) -> Result<(), String>;
    /// Puts the watermark back without firing anything.
    fn restore_watermark(&mut self, w: Watermark);
    /// The largest gap of any valid event so far.
    fn largest_gap(&self) -> DurationMs;
}

impl OperatorState for SessionOperator {
    fn track_changes(&mut self, _on: bool) {}

    fn encode_state(&mut self, _base: bool, out: &mut StateEntries) {
        out.clear();
    }

    fn restore_key(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), String> {
        Err("this build cannot restore session state yet".into())
    }

    fn restore_watermark(&mut self, _w: Watermark) {}

    fn largest_gap(&self) -> DurationMs {
        self.config().gap
    }
}
