//! The state-backend seam: where keys go that the hot tier ([`KeyedStore`](crate::keyed::KeyedStore)) has no room
//! for.
//!
//! Both operators keep every key they work on in a [`KeyedStore`](crate::keyed::KeyedStore) (the hot tier: slots,
//! the hash index, the timing wheel). The `memory` backend is that store alone, without
//! a limit. The `rocksdb` backend puts a [`SpillStore`] below it: when the hot tier
//! grows past its memory budget, the operator evicts its coldest keys — their state and
//! the deadline of their next timer — into the spill store, and takes a key back into
//! the hot tier when an event for it arrives or when the watermark is about to reach
//! its deadline. So the operator's rules run on hot keys only, exactly as with the
//! memory backend, and the output is the same byte for byte.
//!
//! A spill store is narrow: get (and take back) a key's state, put evicted keys with
//! their deadlines, take back the keys whose deadline is due (in deadline order), and
//! iterate every key (a checkpoint's base). Two implementations: [`MapSpill`] (in
//! memory; the reference the property tests compare with) and, with the cargo feature
//! `rocksdb`, [`RocksSpill`] (sessions and timers in two RocksDB column families).

use crate::keyed::KeyBytes;
use std::fmt;

mod map;
#[cfg(feature = "rocksdb")]
mod rocks;
pub(crate) mod tier;

pub use map::MapSpill;
#[cfg(feature = "rocksdb")]
pub use rocks::{RocksImage, RocksMemory, RocksSpill};

/// What a spill store has done, for the run's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillCounts {
    /// Keys in the spill store now.
    pub keys: usize,
    /// Keys evicted from the hot tier so far.
    pub evicted: u64,
    /// Keys taken back into the hot tier so far (an event, or a due timer).
    pub unspilled: u64,
    /// Bytes the spill store takes on disk.
    pub disk_bytes: u64,
}

/// Why a spill store could not do what it was asked. The operator keeps the first one
/// and the pipeline stops the run with it before any output of that batch is written.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// The store itself failed (RocksDB's error text).
    #[error("the state store in {dir} failed: {message}")]
    Store {
        /// The store's directory.
        dir: String,
        /// What the store reported.
        message: String,
    },
    /// A state could not be written (its serde implementation refused it).
    #[error("the state of key {key:?} cannot be written to the state store: {reason}")]
    Encode {
        /// The key, as text.
        key: String,
        /// What the state's writer said.
        #[source]
        reason: EncodeError,
    },
    /// The store's directory could not be made ready.
    #[error("cannot prepare the state store directory {dir}: {source}")]
    Dir {
        /// The directory.
        dir: String,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A value read back does not decode (the store's files are damaged).
    #[error("the state of key {key:?} in the state store in {dir} is damaged: {reason}")]
    Damaged {
        /// The store's directory.
        dir: String,
        /// The key, as text.
        key: String,
        /// What is wrong with it.
        #[source]
        reason: Box<StoreDamage>,
    },
}

/// Why a key's state cannot be written: its serde implementation refused it (a user's
/// state or accumulator type; the built-in sessions are always written). Its text is
/// serde's; what to do is to fix the type's `Serialize` (a map with non-string keys, a
/// failing custom implementation).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EncodeError(#[source] pub serde_json::Error);

impl From<serde_json::Error> for EncodeError {
    fn from(e: serde_json::Error) -> Self {
        EncodeError(e)
    }
}

/// Why a key's state read back does not decode ([`StateCodec::decode`]): the codec's
/// own error. The files or records it came from are damaged, or were written by a job
/// with another state type.
#[derive(Debug, thiserror::Error)]
pub enum StateDecodeError {
    /// One key's sessions ([`crate::codec`], the checkpoint codec).
    #[error(transparent)]
    Sessions(#[from] crate::codec::CodecError),
    /// A stateful function's key record
    /// ([`KeyRecordCodec`](crate::stateful::KeyRecordCodec)).
    #[error(transparent)]
    Record(Box<crate::stateful::SnapshotError>),
}

impl From<crate::stateful::SnapshotError> for StateDecodeError {
    fn from(e: crate::stateful::SnapshotError) -> Self {
        StateDecodeError::Record(Box::new(e))
    }
}

/// What is wrong with an entry a spill store read back ([`SpillError::Damaged`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreDamage {
    /// A key's value is shorter than the deadlines that lead it.
    #[error("shorter than its deadlines")]
    Short,
    /// A timer entry is too short to hold a deadline.
    #[error("a timer entry without its deadline")]
    TimerWithoutDeadline,
    /// A timer entry is empty.
    #[error("an empty timer entry")]
    EmptyTimer,
    /// A timer entry names a key that has no state.
    #[error("a timer entry without its state")]
    TimerWithoutState,
    /// The state after the deadlines does not decode.
    #[error(transparent)]
    State(#[from] StateDecodeError),
}

/// The clock a timer runs on: the watermark's event time, or the processing time of the
/// job's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Due when the watermark reaches it.
    EventTime = 0,
    /// Due when the clock reaches it.
    ProcessingTime = 1,
}

/// An evicted key's next timer on each clock, in milliseconds; [`Deadlines::NONE`]
/// (`i64::MAX`) for none. A key with neither only comes back on its next event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// The next event-time timer.
    pub event: i64,
    /// The next processing-time timer.
    pub processing: i64,
}

impl Deadlines {
    /// No timer on that clock.
    pub const NONE: i64 = i64::MAX;

    /// An event-time timer only (the session window's keys).
    pub const fn event(at: i64) -> Deadlines {
        Deadlines {
            event: at,
            processing: Deadlines::NONE,
        }
    }

    /// The deadline on `domain`'s clock.
    pub const fn of(self, domain: Domain) -> i64 {
        match domain {
            Domain::EventTime => self.event,
            Domain::ProcessingTime => self.processing,
        }
    }
}

/// Where evicted keys live: a key's state `S` and the deadlines of its next timers. A
/// key is either in the hot tier or here, never both.
pub trait SpillStore<S>: fmt::Debug + Send {
    /// Takes `key` out (it goes back to the hot tier): its state and deadlines, `None`
    /// when the key is not here.
    fn take(&mut self, key: &[u8]) -> Result<Option<(S, Deadlines)>, SpillError>;

    /// Calls `f` with `key`'s state if the key is here (it stays); returns whether it was.
    fn peek(&self, key: &[u8], f: &mut dyn FnMut(&S)) -> Result<bool, SpillError>;

    /// Keeps evicted keys (each not here yet) with the deadlines of their next timers.
    fn put(&mut self, evicted: &mut Vec<(KeyBytes, S, Deadlines)>) -> Result<(), SpillError>;

    /// Takes out keys whose deadline on `domain`'s clock is at or before `upto`, in
    /// deadline order, calling `f` with each: every key of the earliest such deadline,
    /// then more up to about `max` keys, always every key of the last deadline taken.
    /// Returns a time at or before every deadline on that clock left (`i64::MAX`: none
    /// left). A deadline of [`Deadlines::NONE`] is never due.
    fn take_due(
        &mut self,
        domain: Domain,
        upto: i64,
        max: usize,
        f: &mut dyn FnMut(&[u8], S, Deadlines),
    ) -> Result<i64, SpillError>;

    /// Calls `f` with every key here and its state (a checkpoint's base), in no
    /// particular order.
    fn for_each(&self, f: &mut dyn FnMut(&[u8], &S)) -> Result<(), SpillError>;

    /// Removes every key (the operator's state is being replaced by a restore).
    fn clear(&mut self) -> Result<(), SpillError>;

    /// The earliest deadline of any key here on `domain`'s clock (`i64::MAX`: none):
    /// where an operator given a store that already holds keys (restored from a
    /// checkpoint) starts taking them back.
    fn earliest(&self, domain: Domain) -> Result<i64, SpillError>;

    /// Bytes the store takes on disk (0 in memory), for the run's report.
    fn disk_bytes(&self) -> u64 {
        0
    }

    /// An image of every key here as it is now, to be read later, perhaps on another
    /// thread, while the store goes on changing (a checkpoint's base); `None` when the
    /// store makes none (its keys are then read at once, with
    /// [`for_each`](Self::for_each)).
    fn image(&mut self) -> Result<Option<Box<dyn StoreImage>>, SpillError> {
        Ok(None)
    }
}

/// The keys of a spill store at one instant ([`SpillStore::image`]), each with its state
/// in the bytes the store's codec wrote (for the command line's sessions: the checkpoint
/// codec's, as a checkpoint's base holds them). Removed when dropped.
pub trait StoreImage: fmt::Debug + Send {
    /// Calls `f` with every key and its encoded state, in key order.
    fn for_each_encoded(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), SpillError>;

    /// The directory the image lies in, handed over to be kept (a checkpoint adopts it
    /// as its copy of the store): it is no longer removed when the image is dropped.
    fn into_dir(self: Box<Self>) -> std::path::PathBuf;
}

/// A spill store's keys for a checkpoint's base
/// ([`SessionOperator::base_keys`](crate::SessionOperator::base_keys)): its image, and
/// what the image holds.
#[derive(Debug)]
pub struct BaseImage {
    /// The image.
    pub image: Box<dyn StoreImage>,
    /// Keys in it.
    pub keys: u64,
    /// Sessions among them that are not final.
    pub open_sessions: u64,
}

/// How a spill store on disk writes a key's state as bytes and reads it back. The
/// command line's sessions use the checkpoint codec ([`SessionsCodec`]); a library
/// window with its own accumulator type writes that layout with the accumulator as
/// JSON. One codec per store: what it wrote, it reads.
pub trait StateCodec<S>: Send {
    /// Appends the bytes of `state` to `out`; the error says why it cannot be written
    /// (a user type that its JSON writer refuses).
    fn encode(&self, state: &S, out: &mut Vec<u8>) -> Result<(), EncodeError>;
    /// Reads back what [`encode`](Self::encode) wrote; the error says what is wrong.
    fn decode(&self, bytes: &[u8]) -> Result<S, StateDecodeError>;
}

/// The command line's sessions in the checkpoint codec ([`crate::codec`]) of a window
/// configured as `.0` (its aggregates decode the values).
#[derive(Debug, Clone)]
pub struct SessionsCodec(pub crate::operator::WindowConfig);

impl StateCodec<crate::session::KeySessions> for SessionsCodec {
    fn encode(
        &self,
        state: &crate::session::KeySessions,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        crate::codec::encode_sessions(state, out);
        Ok(())
    }

    fn decode(&self, bytes: &[u8]) -> Result<crate::session::KeySessions, StateDecodeError> {
        Ok(crate::codec::decode_sessions(bytes, &self.0)?)
    }
}

/// The order of timer entries: a deadline as 8 big-endian bytes that sort like the
/// signed number (the sign bit flipped).
#[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
pub(crate) fn deadline_bytes(deadline: i64) -> [u8; 8] {
    ((deadline as u64) ^ (1 << 63)).to_be_bytes()
}

/// The deadline of [`deadline_bytes`].
#[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
pub(crate) fn deadline_of(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_bytes_sort_like_deadlines() {
        let times = [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        for w in times.windows(2) {
            assert!(deadline_bytes(w[0]) < deadline_bytes(w[1]), "{w:?}");
        }
        for t in times {
            assert_eq!(deadline_of(deadline_bytes(t)), t);
        }
    }
}
