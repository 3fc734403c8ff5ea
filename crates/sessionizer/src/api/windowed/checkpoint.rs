//! A session window job's keyed state: its encoding in the checkpoint codec (each
//! accumulator as JSON), writing and restoring checkpoints, and the state backend
//! (`rocksdb`) below its operators.

use super::{GapFn, SessionWindowJob, WindowCounts};
use crate::api::checkpoints::{Checkpoints, Resumed, StateError};
use crate::api::stream::ValidTimes;
use crate::config::StateBackend;
use crate::error::{RestoreError, StateEncodeError};
#[cfg(feature = "rocksdb")]
use crate::runtime::backend::SpillRoot;
use crate::runtime::state;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::{Counters, Manifest, StateEntries};
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::aggregate::Aggregator;
use sessionizer_window::clock::Clock;
use sessionizer_window::codec;
use sessionizer_window::session::KeySessions;
use sessionizer_window::spill::{EncodeError, SpillError, StateCodec, StateDecodeError};
use sessionizer_window::{EmitMode, SessionOperator, WatermarkStrategy, WindowConfig};
use std::path::Path;

/// A library window's state in the checkpoint codec, each accumulator as JSON: how its
/// checkpoints and its `rocksdb` store write a key's sessions.
pub(super) struct JsonAcc<Acc>(pub(super) std::marker::PhantomData<fn() -> Acc>);

impl<Acc: Serialize + DeserializeOwned> StateCodec<KeySessions<Acc>> for JsonAcc<Acc> {
    fn encode(&self, sessions: &KeySessions<Acc>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let refused = std::cell::RefCell::new(None);
        codec::encode_sessions_with(sessions, out, |acc, out| {
            if let Err(e) = serde_json::to_writer(out, acc) {
                refused.borrow_mut().get_or_insert(EncodeError(e));
            }
        });
        refused.into_inner().map_or(Ok(()), Err)
    }

    fn decode(&self, bytes: &[u8]) -> Result<KeySessions<Acc>, StateDecodeError> {
        Ok(codec::decode_sessions_with(bytes, |b| {
            serde_json::from_slice::<Acc>(b)
        })?)
    }
}

/// The error of a key an accumulator's JSON writer refused (`Err`: another store error,
/// the store's own).
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn unwritable(e: SpillError) -> Result<StateEncodeError, SpillError> {
    match e {
        SpillError::Encode { key, reason } => Ok(StateEncodeError::Accumulator { key, reason }),
        other => Err(other),
    }
}

/// The options of a job that shape its state, as a checkpoint records them: a restore
/// with any other value is refused, naming it.
pub(super) fn state_options<A: Aggregator<E>, E>(
    cfg: &WindowConfig,
    valid: ValidTimes,
) -> Vec<(String, String)> {
    let pair = |k: &str, v: String| (k.to_string(), v);
    vec![
        pair("job", "library session window".into()),
        pair("--gap", cfg.gap.to_string()),
        pair("--allowed-lateness", cfg.allowed_lateness.to_string()),
        pair(
            "--emit",
            match cfg.emit {
                EmitMode::OnClose => "on-close",
                EmitMode::OnUpdate => "on-update",
                EmitMode::Final => "final",
            }
            .into(),
        ),
        pair(
            "--valid-time-range",
            valid.map_or("any".into(), |(a, b)| format!("{a}..{b}")),
        ),
        pair(
            "aggregate state",
            std::any::type_name::<A::Acc>().to_string(),
        ),
    ]
}

impl<E, K, T, W, A, G, C> SessionWindowJob<E, K, T, W, A, G, C>
where
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    C: Clock,
{
    /// Writes a checkpoint of the job into `checkpoints`, in the command line's format:
    /// every key's sessions (their aggregate state as JSON), the watermark, the counts,
    /// and the number of events it covers. The first checkpoint is a full base, later
    /// ones deltas of the keys changed since (with a new base now and then).
    ///
    /// A job that stops after a checkpoint and is [`restore`](Self::restore)d from it
    /// continues exactly as if it had not stopped, given the events after the ones the
    /// checkpoint covers. What the job emitted after the checkpoint is emitted again:
    /// commit your outputs with the checkpoint for exactly once — a
    /// [`JsonLinesSink::exactly_once`](crate::api::sink::JsonLinesSink::exactly_once) file or
    /// an exactly-once Kafka sink is committed by this call.
    pub fn checkpoint(
        &mut self,
        checkpoints: &mut Checkpoints,
    ) -> Result<sessionizer_checkpoint::Committed, StateError> {
        let base = checkpoints.next_is_base(self.checkpointed)?
            || self.operators().any(SessionOperator::changes_lost);
        // One part per worker: every key for a base (those in a RocksDB store as its
        // image), else the changes.
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let mut parts = Vec::with_capacity(1 + self.workers.len());
        let mut images = Vec::new();
        for op in self.operators_mut() {
            let mut entries = StateEntries::default();
            let mut encode = |s: &KeySessions<A::Acc>, buf: &mut Vec<u8>| json.encode(s, buf);
            match state::encode_keys(op, base, &mut entries, &mut encode) {
                Ok(image) => images.extend(image),
                Err(SpillError::Encode { key, reason }) => {
                    return Err(StateError::State {
                        dir: checkpoints.path().to_path_buf(),
                        reason: Box::new(StateEncodeError::Accumulator { key, reason }.into()),
                    });
                }
                Err(e) => return Err(e.into()),
            }
            parts.push(entries);
        }
        let c = self.counts;
        let manifest = Manifest {
            options: state_options::<A, E>(self.op.config(), self.valid),
            next_seq: self.seq,
            watermark: state::progress(&self.op, self.max_time),
            counters: Counters {
                records_read: c.events,
                in_sessions: c.in_sessions,
                late: c.late,
                invalid: c.invalid,
                sessions_emitted: c.sessions_emitted,
                retractions: c.retractions,
                ..Counters::default()
            },
            keys: self.operators().map(SessionOperator::keys).sum::<usize>() as u64,
            open_sessions: self.open_sessions_all() as u64,
            ..Manifest::default()
        };
        let committed = checkpoints.write(base, parts, images, manifest)?;
        self.operators_mut().for_each(|op| {
            op.track_changes(true);
            op.bound_tracked_changes();
        });
        self.checkpointed = true;
        Ok(committed)
    }

    /// Keeps the job's keyed state on `backend` (docs/semantics.md S-36), the command
    /// line's `--state-backend`. With [`StateBackend::RocksDb`] (cargo feature `rocksdb`)
    /// the keys in memory are held to about half of `memory_bytes`; the coldest (the
    /// earliest next deadline) go to a RocksDB store in `dir` (or a temporary
    /// directory), within the other half for its cache and write buffers, and come back
    /// when an event for them arrives or their deadline is due. The output is the memory
    /// backend's, record for record; checkpoints hold every key, wherever it is, in the
    /// same format. Your accumulator's size in memory is not measured (the budget
    /// counts keys and sessions). Call it before the first event and before
    /// [`restore`](Self::restore), once.
    pub fn set_state_backend(&mut self, backend: &StateBackend) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        if self.counts.events > 0 || self.op.keys() > 0 || self.spill_root.is_some() {
            return Err(StateError::Backend(
                "set_state_backend() must come once, before the job's first event and before restore()".into(),
            ));
        }
        match backend {
            StateBackend::Memory => Ok(()),
            StateBackend::RocksDb { memory_bytes, dir } => {
                self.open_rocks(*memory_bytes, dir.as_deref())
            }
        }
    }

    #[cfg(feature = "rocksdb")]
    fn open_rocks(&mut self, memory_bytes: u64, dir: Option<&Path>) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        let root = SpillRoot::choose(dir, None);
        self.open_stores(&root, memory_bytes, None)?;
        self.spill_root = Some(root);
        self.state_memory = memory_bytes;
        Ok(())
    }

    /// Gives every worker a RocksDB store in its part of `root`: an empty one, or with
    /// `copies` (a base's store copies, one per worker) one that starts as its
    /// shard's copy. A worker's earlier store is closed first (its directory is
    /// emptied for the new one); the workers hold no key in memory.
    #[cfg(feature = "rocksdb")]
    fn open_stores(
        &mut self,
        root: &SpillRoot,
        memory_bytes: u64,
        copies: Option<&[sessionizer_checkpoint::stores::LoadedStore]>,
    ) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        for op in self.operators_mut() {
            let detached = op.detach_spill();
            debug_assert!(detached, "a worker with keys in memory");
        }
        let codec =
            || -> Box<dyn StateCodec<_>> { Box::new(JsonAcc::<A::Acc>(std::marker::PhantomData)) };
        let ops = self.operators_mut().collect();
        crate::runtime::backend::open_stores(ops, root, memory_bytes, codec, copies)?;
        Ok(())
    }

    /// Starts every worker's store as its copy in a checkpoint's base (`copies`, one
    /// per worker: the base was written by as many), the command line's restore on
    /// RocksDB: their keys are not read. On an error every worker gets an empty store
    /// again, the job as it was.
    #[cfg(feature = "rocksdb")]
    fn link_stores(
        &mut self,
        copies: &[sessionizer_checkpoint::stores::LoadedStore],
    ) -> Result<(), StateError>
    where
        A::Acc: 'static,
    {
        let root = self.spill_root.take().expect("a job on RocksDB");
        let mut linked = self.open_stores(&root, self.state_memory, Some(copies));
        if let Err(e) = linked {
            linked = self.open_stores(&root, self.state_memory, None).and(Err(e));
        }
        self.spill_root = Some(root);
        linked
    }

    #[cfg(not(feature = "rocksdb"))]
    fn link_stores(
        &mut self,
        _: &[sessionizer_checkpoint::stores::LoadedStore],
    ) -> Result<(), StateError> {
        unreachable!("no store without the rocksdb feature")
    }

    #[cfg(not(feature = "rocksdb"))]
    fn open_rocks(&mut self, _: u64, _: Option<&Path>) -> Result<(), StateError> {
        Err(StateError::Backend(
            crate::error::Unsupported::NoRocksDbLibrary.to_string(),
        ))
    }

    /// Continues from the newest checkpoint in `checkpoints` (`None` when there is
    /// none: the job starts afresh). Call it before the first event; then skip the
    /// [`Resumed::events`] the checkpoint covers. Refused, changing nothing, when the
    /// checkpoint was taken with other options (gap, lateness, emit mode, valid time
    /// range, aggregate state type) or its state cannot be read.
    pub fn restore(&mut self, checkpoints: &mut Checkpoints) -> Result<Option<Resumed>, StateError>
    where
        G: GapFn<E>,
        A::Acc: 'static,
    {
        let options = state_options::<A, E>(self.op.config(), self.valid);
        let Some((manifest, state)) = checkpoints.take_found(self.counts.events, &options)? else {
            return Ok(None);
        };
        if state.format_version() != codec::FORMAT {
            let reason = RestoreError::Format {
                found: state.format_version(),
                reads: codec::FORMAT,
            };
            return Err(checkpoints.keep_found((manifest, state), reason));
        }
        // Every key is decoded once before anything changes (a refused checkpoint
        // leaves the job as it was), then again to be put in: two reads, no copy of
        // the whole state in memory (with RocksDB it may be larger than memory). On
        // RocksDB with the base's number of workers, the stores start as the base's
        // copies of them, and only the keys in its files are read.
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let decodes = |_: &[u8], value: &[u8]| -> Result<(), crate::error::KeyStateError> {
            Ok(json.decode(value).map(drop)?)
        };
        let workers = 1 + self.workers.len();
        let linked = self.spill_root.is_some() && state.stores().len() == workers;
        let reader = crate::runtime::backend::store_reader();
        let checked = if linked {
            state::check_files(&state, decodes)
        } else {
            state::check_keys(&state, reader, decodes)
        };
        let keys = match checked {
            Ok(keys) => usize::try_from(keys).unwrap_or(usize::MAX),
            Err(e) => return Err(checkpoints.keep_found((manifest, state), e)),
        };
        let keys_linked: u64 = if linked {
            state.stores().iter().map(|s| s.keys).sum()
        } else {
            0
        };
        if linked && let Err(e) = self.link_stores(state.stores()) {
            return Err(
                checkpoints.keep_found((manifest, state), RestoreError::Stores(Box::new(e)))
            );
        }
        let w = &manifest.watermark;
        for op in self.operators_mut() {
            state::restore_progress(op, w);
            op.reserve_keys(keys / workers);
        }
        self.watermark.resume_at(Watermark(w.watermark_ms));
        self.max_time = w.max_event_time_ms.map(EventTime);
        let mut ops: Vec<_> = self.operators_mut().collect();
        let restored = if linked {
            state::restore_over_files(&state, workers, &mut ops[..], |ops, i, key, value| {
                let sessions = value.map(|v| json.decode(v)).transpose()?;
                Ok(ops[i].restore_over(key, sessions)?)
            })
        } else {
            state::restore_keys(
                &state,
                reader,
                workers,
                &mut ops[..],
                |ops, i, hash| ops[i].prefetch_index(hash),
                |ops, i, key, value| {
                    ops[i].restore_key(key, json.decode(value)?);
                    Ok(())
                },
                |_| {},
            )
        };
        if let Err(e) = restored {
            return Err(checkpoints.keep_found((manifest, state), e));
        }
        self.store_error()?;
        let c = &manifest.counters;
        self.counts = WindowCounts {
            events: c.records_read,
            in_sessions: c.in_sessions,
            late: c.late,
            invalid: c.invalid,
            sessions_emitted: c.sessions_emitted,
            retractions: c.retractions,
        };
        self.seq = manifest.next_seq;
        for op in self.operators_mut() {
            op.forget_changes();
            op.track_changes(true);
            op.bound_tracked_changes();
        }
        self.checkpointed = true;
        checkpoints.mark_restored();
        Ok(Some(Resumed {
            epoch: manifest.epoch,
            events: c.records_read,
            keys: manifest.keys,
            keys_linked,
        }))
    }
}
