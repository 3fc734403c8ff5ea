//! A session operator's state in a checkpoint or a changelog, one rule for every job:
//! the command line's shards and Kafka tasks, and the library's session windows (which
//! differ only in how one key's sessions are encoded: the built-in aggregates' codec or
//! the user's accumulator as JSON).

pub(crate) use crate::error::KeyStateError;
use crate::runtime::shard_of;
use sessionizer_checkpoint::state::LiveError;
use sessionizer_checkpoint::stores::StoreReader;
use sessionizer_checkpoint::{LoadedState, StateEntries, StoreImageDir, WatermarkState};
use sessionizer_core::{DurationMs, EventTime, Watermark};
use sessionizer_window::keyed::key_hash;
use sessionizer_window::session::KeySessions;
use sessionizer_window::spill::{BaseImage, EncodeError, SpillError};
use sessionizer_window::{SessionAggregate, SessionOperator};
use std::collections::VecDeque;

/// Encodes one key's sessions into a buffer, or says why it cannot (a user's
/// accumulator its JSON writer refuses).
pub(crate) type Encode<'a, Acc> =
    dyn FnMut(&KeySessions<Acc>, &mut Vec<u8>) -> Result<(), EncodeError> + 'a;

/// The built-in aggregates' encoder (the command line's jobs): it refuses nothing.
pub(crate) fn encode_builtin(sessions: &KeySessions, buf: &mut Vec<u8>) -> Result<(), EncodeError> {
    sessionizer_window::codec::encode_sessions(sessions, buf);
    Ok(())
}

/// Keeps the first refusal of an [`Encode`], naming its key.
fn refusal(first: &mut Option<SpillError>, key: &[u8], encoded: Result<(), EncodeError>) -> bool {
    match encoded {
        Ok(()) => true,
        Err(reason) => {
            first.get_or_insert_with(|| SpillError::Encode {
                key: String::from_utf8_lossy(key).into_owned(),
                reason,
            });
            false
        }
    }
}

/// Where event time stands for `op`, whose largest event time so far is `max_time`: the
/// watermark, the largest gap, and the floor of new keys.
pub(crate) fn progress<A: SessionAggregate>(
    op: &SessionOperator<A>,
    max_time: Option<EventTime>,
) -> WatermarkState {
    WatermarkState {
        max_event_time_ms: max_time.map(EventTime::millis),
        watermark_ms: op.watermark().millis(),
        largest_gap_ms: op.largest_gap().millis(),
        new_key_floor_ms: Some(op.new_key_floor()),
        late_watermark_ms: None,
    }
}

/// Puts [`progress`] back into `op`, before any key: the largest gap first (restored
/// timers of final sessions depend on it), then the watermark and the new keys' floor.
pub(crate) fn restore_progress<A: SessionAggregate>(
    op: &mut SessionOperator<A>,
    w: &WatermarkState,
) {
    op.observe_gap(DurationMs(w.largest_gap_ms));
    op.restore_watermark(Watermark::at(EventTime(w.watermark_ms)));
    op.restore_new_key_floor(w.new_key_floor_ms);
}

/// Encodes `op`'s keyed state into `out` for a checkpoint: every key for a `base`, else
/// the keys changed (or removed: a tombstone) since the previous one. A base returns the
/// image of the state backend's store when it makes one (RocksDB): its keys are then not
/// in `out`, the checkpoint keeps the image. Errors are the store's.
pub(crate) fn encode_keys<A: SessionAggregate>(
    op: &mut SessionOperator<A>,
    base: bool,
    out: &mut StateEntries,
    encode: &mut Encode<'_, A::Acc>,
) -> Result<Option<BaseImage>, SpillError> {
    out.clear();
    let mut refused = None;
    let mut put = |out: &mut StateEntries, key: &[u8], sessions: &KeySessions<A::Acc>| {
        out.put_with(key, |buf| {
            refusal(&mut refused, key, encode(sessions, buf));
        });
    };
    let mut image = None;
    if base {
        image = op.base_keys(|key, sessions| put(out, key, sessions))?;
    } else {
        op.drain_changes(|key, sessions| match sessions {
            Some(s) => put(out, key, s),
            None => out.tombstone(key),
        });
    }
    match op.take_spill_error().or(refused) {
        Some(e) => Err(e),
        None => Ok(image),
    }
}

/// What a base checkpoint keeps of a store's image ([`encode_keys`]): its directory,
/// moved into the state directory by the writer, and its counts.
pub(crate) fn store_dir(b: BaseImage) -> StoreImageDir {
    StoreImageDir {
        keys: b.keys,
        open_sessions: b.open_sessions,
        path: b.image.into_dir(),
    }
}

#[cfg(feature = "kafka")]
/// Hears one changed key: its encoded state, or `None` when it has none any more.
pub(crate) type PutChange<'a> = dyn FnMut(&[u8], Option<&[u8]>) + 'a;

/// Calls `f` with every key changed since the last call, encoded into `buf` (`None`: the
/// key was removed), for a changelog. A key `encode` refuses is not handed out: the
/// first refusal is the error.
#[cfg(feature = "kafka")]
pub(crate) fn drain_encoded<A: SessionAggregate>(
    op: &mut SessionOperator<A>,
    buf: &mut Vec<u8>,
    encode: &mut Encode<'_, A::Acc>,
    f: &mut PutChange<'_>,
) -> Result<(), SpillError> {
    let mut refused = None;
    op.drain_changes(|key, sessions| match sessions {
        Some(s) => {
            buf.clear();
            if refusal(&mut refused, key, encode(s, buf)) {
                f(key, Some(buf));
            }
        }
        None => f(key, None),
    });
    refused.map_or(Ok(()), Err)
}

/// Calls `f` with every key that has state, in memory or in the store, encoded: a
/// snapshot of the whole state. A key `encode` refuses is not handed out: the first
/// refusal is the error.
#[cfg(feature = "kafka")]
pub(crate) fn for_each_encoded<A: SessionAggregate>(
    op: &SessionOperator<A>,
    encode: &mut Encode<'_, A::Acc>,
    f: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<(), SpillError> {
    let mut buf = Vec::new();
    let mut refused = None;
    op.for_each_key(|key, sessions| {
        buf.clear();
        if refusal(&mut refused, key, encode(sessions, &mut buf)) {
            f(key, &buf);
        }
    })?;
    refused.map_or(Ok(()), Err)
}

/// Why putting a checkpoint's keys back stopped: a damaged file, no reader of its
/// store copies, or a key (named) whose value was refused.
pub(crate) type Stopped = LiveError<(Vec<u8>, KeyStateError)>;

/// Reads every live key of `state` (its base file, deltas and — with `reader` — its
/// store copies) and checks it with `check` alone, changing nothing: a job that must
/// refuse a checkpoint whole calls it before [`restore_keys`]. Returns the number of
/// keys.
pub(crate) fn check_keys(
    state: &LoadedState,
    reader: Option<&dyn StoreReader>,
    mut check: impl FnMut(&[u8], &[u8]) -> Result<(), KeyStateError>,
) -> Result<u64, Stopped> {
    let mut keys = 0u64;
    state.for_each_live_with(reader, |key, value| {
        keys += 1;
        check(key, value).map_err(|reason| (key.to_vec(), reason))
    })?;
    Ok(keys)
}

/// As [`check_keys`], the keys of the base file and the deltas only: a restore that
/// starts its stores as the base's store copies ([`restore_over_files`]) reads no
/// key of them. Returns the number of keys with a value.
pub(crate) fn check_files(
    state: &LoadedState,
    mut check: impl FnMut(&[u8], &[u8]) -> Result<(), KeyStateError>,
) -> Result<u64, Stopped> {
    let mut keys = 0u64;
    state.for_each_newest_in_files(|key, value| match value {
        Some(value) => {
            keys += 1;
            check(key, value).map_err(|reason| (key.to_vec(), reason))
        }
        None => Ok(()),
    })?;
    Ok(keys)
}

/// The restore of shards whose spill stores started as a base's store copies, one
/// per shard (so `shards` is the number the checkpoint was written with): every key
/// of the base file and the deltas goes over what the stores hold, with
/// `put(target, shard, key, value)` (`None`: a delta removed the key). The stores'
/// own keys are not read. Returns the number of keys put.
pub(crate) fn restore_over_files<T: ?Sized>(
    state: &LoadedState,
    shards: usize,
    target: &mut T,
    mut put: impl FnMut(&mut T, usize, &[u8], Option<&[u8]>) -> Result<(), KeyStateError>,
) -> Result<u64, Stopped> {
    let mut keys = 0u64;
    state.for_each_newest_in_files(|key, value| {
        keys += 1;
        put(target, shard_of(key, shards) as usize, key, value)
            .map_err(|reason| (key.to_vec(), reason))
    })?;
    Ok(keys)
}

/// Puts every live key of `state` (read as in [`check_keys`]) into the shard of
/// `shards` its hash gives ([`shard_of`]), with `put(target, shard, key, value)`. Each
/// shard is asked for the key's index entry `AHEAD` keys before the key is put
/// (`prefetch(target, shard, hash)`): with millions of keys every insert would
/// otherwise wait for memory. `progress` hears the number of keys read since it last
/// heard, every 65,536 keys and at the end. Returns the number of keys.
pub(crate) fn restore_keys<T: ?Sized>(
    state: &LoadedState,
    reader: Option<&dyn StoreReader>,
    shards: usize,
    target: &mut T,
    prefetch: impl Fn(&T, usize, u64),
    mut put: impl FnMut(&mut T, usize, &[u8], &[u8]) -> Result<(), KeyStateError>,
    mut progress: impl FnMut(u64),
) -> Result<u64, Stopped> {
    const AHEAD: usize = 16;
    const PROGRESS_EVERY: u64 = 1 << 16;
    let (mut keys, mut reported) = (0u64, 0u64);
    // The keys waiting are copies (the state hands each out for its call only), in
    // buffers that go round.
    let mut ahead: VecDeque<(usize, Vec<u8>, Vec<u8>)> = VecDeque::with_capacity(AHEAD + 1);
    let mut spare: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(AHEAD + 1);
    let mut put_one = |target: &mut T, (s, k, v): (usize, Vec<u8>, Vec<u8>)| {
        put(target, s, &k, &v).map_err(|reason| (k.clone(), reason))?;
        Ok::<_, (Vec<u8>, KeyStateError)>((k, v))
    };
    state.for_each_live_with(reader, |key, value| {
        let s = shard_of(key, shards) as usize;
        keys += 1;
        if keys % PROGRESS_EVERY == 0 {
            progress(keys - reported);
            reported = keys;
        }
        prefetch(target, s, key_hash(key));
        let (mut k, mut v) = spare.pop().unwrap_or_default();
        k.clear();
        k.extend_from_slice(key);
        v.clear();
        v.extend_from_slice(value);
        ahead.push_back((s, k, v));
        if ahead.len() > AHEAD {
            let waiting = ahead.pop_front().expect("a key waits");
            spare.push(put_one(target, waiting)?);
        }
        Ok(())
    })?;
    for waiting in ahead.drain(..) {
        put_one(target, waiting).map_err(LiveError::Apply)?;
    }
    if keys > reported {
        progress(keys - reported);
    }
    Ok(keys)
}
