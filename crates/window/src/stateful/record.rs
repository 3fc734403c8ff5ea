//! One key's record in a snapshot or checkpoint (flags, timeouts, timers, expiry, the
//! state as JSON): writing and reading it, its codec for a spill store, and its JSON
//! view for `sessionizer inspect`.

use super::snapshot::SnapshotError;
use super::{KeyState, TimeoutKind, Timer};
use crate::clock::ProcessingTime;
use crate::spill::{EncodeError, StateCodec, StateDecodeError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_core::EventTime;
use std::fmt;

/// How a stateful operator's spill store writes a key: its checkpoint record (flags,
/// timeouts, timers, expiry, the state as JSON; see
/// [`StatefulOperator::encode_state`](super::StatefulOperator::encode_state)), so that
/// an image of the store holds what a checkpoint's base does.
pub struct KeyRecordCodec<S>(std::marker::PhantomData<fn() -> S>);

impl<S> fmt::Debug for KeyRecordCodec<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyRecordCodec")
    }
}

impl<S> Default for KeyRecordCodec<S> {
    fn default() -> Self {
        KeyRecordCodec(std::marker::PhantomData)
    }
}

impl<S: Serialize + DeserializeOwned> StateCodec<KeyState<S>> for KeyRecordCodec<S> {
    fn encode(&self, ks: &KeyState<S>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        Ok(write_key_record(ks, out)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<KeyState<S>, StateDecodeError> {
        let mut r = Reader { bytes, at: 0 };
        let ks = decode_key_record(b"", &mut r)?;
        if r.at != bytes.len() {
            return Err(SnapshotError::Truncated.into());
        }
        Ok(ks)
    }
}

/// One key's record: flags, timeouts, timers, expiry, state as JSON (the per-key part
/// of the layout of [`SNAPSHOT_MAGIC`](super::SNAPSHOT_MAGIC), after the key).
pub(super) fn encode_key_record<S: Serialize>(
    key: &[u8],
    ks: &KeyState<S>,
    out: &mut Vec<u8>,
) -> Result<(), SnapshotError> {
    write_key_record(ks, out).map_err(|source| SnapshotError::State {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

/// [`encode_key_record`] without the key: the error is the state's JSON writer's, the
/// only thing that can refuse.
fn write_key_record<S: Serialize>(
    ks: &KeyState<S>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let flags = u8::from(ks.state.is_some())
        | u8::from(ks.event_timeout.is_some()) << 1
        | u8::from(ks.proc_timeout.is_some()) << 2
        | u8::from(!ks.timers.is_empty()) << 3
        | u8::from(ks.expires.is_some()) << 4;
    out.push(flags);
    if let Some(t) = ks.event_timeout {
        out.extend_from_slice(&t.millis().to_le_bytes());
    }
    if let Some(t) = ks.proc_timeout {
        out.extend_from_slice(&t.millis().to_le_bytes());
    }
    if !ks.timers.is_empty() {
        put_len(out, ks.timers.len());
        for t in &ks.timers {
            out.push(u8::from(t.kind() == TimeoutKind::ProcessingTime));
            out.extend_from_slice(&t.millis().to_le_bytes());
        }
    }
    if let Some(t) = ks.expires {
        out.extend_from_slice(&t.millis().to_le_bytes());
    }
    if let Some(s) = &ks.state {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        serde_json::to_writer(&mut *out, s)?;
        let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    Ok(())
}

/// Reads one key's record (see [`encode_key_record`]).
pub(super) fn decode_key_record<S: DeserializeOwned>(
    key: &[u8],
    r: &mut Reader<'_>,
) -> Result<KeyState<S>, SnapshotError> {
    let key_text = std::str::from_utf8(key).map_err(|_| SnapshotError::BadKey)?;
    let flags = r.array::<1>()?[0];
    let event_timeout = (flags & 2 != 0)
        .then(|| r.array().map(|b| EventTime(i64::from_le_bytes(b))))
        .transpose()?;
    let proc_timeout = (flags & 4 != 0)
        .then(|| r.array().map(|b| ProcessingTime(i64::from_le_bytes(b))))
        .transpose()?;
    let mut timers = Vec::new();
    if flags & 8 != 0 {
        for _ in 0..r.len()? {
            let domain = r.array::<1>()?[0];
            let t = i64::from_le_bytes(r.array()?);
            timers.push(match domain {
                0 => Timer::EventTime(EventTime(t)),
                1 => Timer::ProcessingTime(ProcessingTime(t)),
                _ => return Err(SnapshotError::Truncated),
            });
        }
        timers.sort_unstable();
        timers.dedup();
    }
    let expires = (flags & 16 != 0)
        .then(|| r.array().map(|b| ProcessingTime(i64::from_le_bytes(b))))
        .transpose()?;
    let state = if flags & 1 != 0 {
        let len = r.len()?;
        let json = r.take(len)?;
        Some(
            serde_json::from_slice(json).map_err(|source| SnapshotError::State {
                key: key_text.to_owned(),
                source,
            })?,
        )
    } else {
        None
    };
    Ok(KeyState {
        state,
        event_timeout,
        proc_timeout,
        timers,
        expires,
        ..KeyState::default()
    })
}

/// One key's checkpoint record (as
/// [`StatefulOperator::encode_state`](super::StatefulOperator::encode_state) writes it)
/// as JSON, for `sessionizer inspect`: the state as the job wrote it, the timeouts, the
/// registered timers and the expiry, times as RFC 3339.
pub fn describe_record(key: &[u8], record: &[u8]) -> Result<serde_json::Value, SnapshotError> {
    use serde_json::json;
    let mut r = Reader {
        bytes: record,
        at: 0,
    };
    let ks: KeyState<serde_json::Value> = decode_key_record(key, &mut r)?;
    if r.at != record.len() {
        return Err(SnapshotError::Truncated);
    }
    let time = |ms: i64| sessionizer_core::timefmt::format_rfc3339_ms(EventTime(ms));
    let timers: Vec<serde_json::Value> = ks
        .timers
        .iter()
        .map(|t| match t {
            Timer::EventTime(t) => json!({"event_time": time(t.millis())}),
            Timer::ProcessingTime(t) => json!({"processing_time": time(t.millis())}),
        })
        .collect();
    Ok(json!({
        "state": ks.state,
        "event_timeout": ks.event_timeout.map(|t| time(t.millis())),
        "processing_timeout": ks.proc_timeout.map(|t| time(t.millis())),
        "timers": timers,
        "expires": ks.expires.map(|t| time(t.millis())),
    }))
}

pub(super) fn put_len(out: &mut Vec<u8>, len: usize) {
    // Keys and states beyond 4 GiB are not supported by the format.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
}

/// A cursor over snapshot bytes that reports truncation instead of panicking.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).ok_or(SnapshotError::Truncated)?;
        let slice = self
            .bytes
            .get(self.at..end)
            .ok_or(SnapshotError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let slice = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(slice);
        Ok(a)
    }

    pub(super) fn len(&mut self) -> Result<usize, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }
}
