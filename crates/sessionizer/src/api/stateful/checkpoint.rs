//! A stateful job's keyed state: the state backend below its operators, snapshots,
//! and checkpoints written and restored.

use super::{StatefulCounts, StatefulJob};
use crate::api::checkpoints::{Checkpoints, Resumed, StateError};
use crate::api::sink::SinkError;
use crate::config::StateBackend;
use crate::error::RestoreError;
#[cfg(feature = "rocksdb")]
use crate::runtime::backend::SpillRoot;
use crate::runtime::state;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::{Counters, Manifest, StateEntries, WatermarkState};
use sessionizer_core::Watermark;
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::clock::Clock;
use sessionizer_window::stateful::{BatchRules, LatePolicy, SnapshotError};

impl<E, K, T, W: WatermarkStrategy, S, F, C: Clock> StatefulJob<E, K, T, W, S, F, C> {
    /// Keys with state or a pending timeout, on every worker.
    pub fn keys(&self) -> usize {
        self.op.keys() + self.workers.iter().map(|w| w.op.keys()).sum::<usize>()
    }

    /// The first failure of the state backend's store: the batch that met it may have
    /// treated a key it could not read back as new, so the job stops.
    pub(super) fn store_error(&mut self) -> Result<(), SinkError> {
        if let Some(e) = self.op.take_spill_error() {
            return Err(e.into());
        }
        for w in &mut self.workers {
            if let Some(e) = w.op.take_spill_error() {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Chooses where the keys live (docs/semantics.md S-36): [`StateBackend::Memory`]
    /// (the default) keeps them all in memory; [`StateBackend::RocksDb`] (cargo feature
    /// `rocksdb`) keeps about half of `memory_bytes` of keys in memory, split evenly
    /// among the workers, and the keys beyond it — those longest without an event — in a
    /// RocksDB store of each worker (`dir/shard-N`, or a temporary directory; scratch
    /// space, emptied when the job starts and removed when it is dropped), with the
    /// deadlines of their timers, timeouts and state expiry; the other half (at least
    /// 8 MiB) is RocksDB's block cache and write buffers. A key
    /// comes back into memory when an event for it arrives or before the batch end at
    /// which something of it is due, so **the calls and outputs are those of the memory
    /// backend**, in the same order; checkpoints hold every key, wherever it is, in the
    /// same format. An evicted state is written as JSON and read back, as a checkpoint
    /// does: a type whose JSON does not read back as the same value (a skipped field)
    /// sees the value read back. A state's size in memory is estimated from its JSON
    /// size. A state that cannot be written as JSON stops the job with
    /// [`SinkError::StateStore`] when it is evicted. Call it
    /// after [`set_workers`](Self::set_workers), before the first event and before
    /// [`restore_checkpoint`](Self::restore_checkpoint), once.
    pub fn set_state_backend(&mut self, backend: &StateBackend) -> Result<(), StateError>
    where
        S: Serialize + DeserializeOwned + Send + 'static,
    {
        if self.counts.events > 0
            || self.keys() > 0
            || self.checkpointed
            || self.spill_root.is_some()
        {
            return Err(StateError::Backend(
                "set_state_backend() must come once, before the job's first event and before restore_checkpoint()".into(),
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
    fn open_rocks(
        &mut self,
        memory_bytes: u64,
        dir: Option<&std::path::Path>,
    ) -> Result<(), StateError>
    where
        S: Serialize + DeserializeOwned + Send + 'static,
    {
        use crate::runtime::backend::rocks_budget;
        use sessionizer_window::spill::RocksSpill;
        use sessionizer_window::stateful::KeyRecordCodec;
        let root = SpillRoot::choose(dir, None);
        let (memory, hot) = rocks_budget(memory_bytes, 1 + self.workers.len());
        let open = |i: u32| {
            RocksSpill::open_with(
                &root.part(i),
                Box::new(KeyRecordCodec::<S>::default()),
                &memory,
            )
        };
        // Every store opened before any is attached: a failure leaves the job as it was
        // (and its stores' directories are removed with them).
        let mut stores = (0..1 + self.workers.len() as u32)
            .map(open)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter();
        self.op
            .spill_to(Box::new(stores.next().expect("one per operator")), hot);
        for (w, store) in self.workers.iter_mut().zip(stores) {
            w.op.spill_to(Box::new(store), hot);
        }
        self.spill_root = Some(root);
        Ok(())
    }

    #[cfg(not(feature = "rocksdb"))]
    fn open_rocks(&mut self, _: u64, _: Option<&std::path::Path>) -> Result<(), StateError> {
        Err(StateError::Backend(
            crate::error::Unsupported::NoRocksDbLibrary.to_string(),
        ))
    }
}

impl<E, K, T, W, S, F, C> StatefulJob<E, K, T, W, S, F, C>
where
    W: WatermarkStrategy,
    C: Clock,
    S: Serialize + DeserializeOwned,
{
    /// The keyed state and watermark as bytes (see
    /// [`StatefulOperator::snapshot`](sessionizer_window::stateful::StatefulOperator::snapshot));
    /// between batches only.
    /// Refused with workers ([`checkpoint`](Self::checkpoint) works with any number).
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        if !self.workers.is_empty() {
            return Err(SnapshotError::Unsupported(
                "snapshot() holds one operator's state: a job with workers checkpoints with checkpoint()",
            ));
        }
        self.op.snapshot()
    }

    /// Continues from a [`snapshot`](Self::snapshot) (refused with workers).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        if !self.workers.is_empty() {
            return Err(SnapshotError::Unsupported(
                "restore() takes one operator's state: a job with workers restores with restore_checkpoint()",
            ));
        }
        self.op.restore(bytes)
    }

    /// Writes a checkpoint of the job into `checkpoints`, in the command line's format
    /// (`docs/checkpoint-format.md`): every key's state, timeouts and timers, the
    /// watermark, the counts and the number of events it covers — the first a full
    /// base, later ones deltas of the keys changed since (with a new base now and
    /// then). Between batches only ([`end_batch`](Self::end_batch) first).
    ///
    /// A job that stops after a checkpoint and is
    /// [`restore_checkpoint`](Self::restore_checkpoint)ed from it continues exactly as
    /// if it had not stopped, given the events after those the checkpoint covers. What
    /// the job emitted after the checkpoint is emitted again: write your outputs, then
    /// checkpoint, for exactly once.
    pub fn checkpoint(
        &mut self,
        checkpoints: &mut Checkpoints,
    ) -> Result<sessionizer_checkpoint::Committed, StateError> {
        // Changes of evicted keys that were forgotten (the `rocksdb` backend): a base.
        let base = checkpoints.next_is_base(self.checkpointed)?
            || self.op.changes_lost()
            || self.workers.iter().any(|w| w.op.changes_lost());
        let mut entries = StateEntries::default();
        let mut put = |key: &[u8], record: Option<&[u8]>| match record {
            Some(r) => entries.put_with(key, |buf| buf.extend_from_slice(r)),
            None => entries.tombstone(key),
        };
        let encoded = self.op.encode_state(base, &mut put).and_then(|()| {
            self.workers
                .iter_mut()
                .try_for_each(|w| w.op.encode_state(base, &mut put))
        });
        encoded.map_err(|e| StateError::State {
            dir: checkpoints.path().to_path_buf(),
            reason: Box::new(e.into()),
        })?;
        let c = self.counts;
        let manifest = Manifest {
            options: self.state_options(),
            next_seq: c.events,
            watermark: WatermarkState {
                max_event_time_ms: None,
                watermark_ms: self.op.watermark().millis(),
                largest_gap_ms: 0,
                new_key_floor_ms: None,
                late_watermark_ms: self.late_watermark_record(),
            },
            counters: Counters {
                records_read: c.events,
                in_sessions: c.events - c.late - c.invalid,
                late: c.late,
                invalid: c.invalid,
                sessions_emitted: c.outputs,
                ..Counters::default()
            },
            keys: self.keys() as u64,
            ..Manifest::default()
        };
        let committed = checkpoints.write(base, vec![entries], Vec::new(), manifest)?;
        self.op.track_changes(true);
        self.op.bound_tracked_changes();
        for w in &mut self.workers {
            w.op.track_changes(true);
            w.op.bound_tracked_changes();
        }
        self.checkpointed = true;
        Ok(committed)
    }

    /// Continues from the newest checkpoint in `checkpoints` (`None` when there is
    /// none: the job starts afresh). Call it before the first event; then skip the
    /// [`Resumed::events`] the checkpoint covers. Refused, changing nothing, when the
    /// checkpoint was taken with other options (valid time range, late events, state
    /// TTL, state type) or by another kind of job, or its state cannot be read. The
    /// counts of events, late, invalid and outputs go on from the checkpoint's; calls
    /// and batches count this run.
    pub fn restore_checkpoint(
        &mut self,
        checkpoints: &mut Checkpoints,
    ) -> Result<Option<Resumed>, StateError> {
        let options = self.state_options();
        let Some((manifest, state)) = checkpoints.take_found(self.counts.events, &options)? else {
            return Ok(None);
        };
        // Every key is decoded once before anything changes, then again to be put in
        // (the engine's restore, as the session windows'): no copy of the whole state.
        let op = &self.op;
        let checked = state::check_keys(&state, None, |key, value| Ok(op.check_key(key, value)?));
        let restored = checked.map_err(RestoreError::from).and_then(|_| {
            // Every operator emptied at the checkpoint's watermark, then the keys.
            let watermark = Watermark(manifest.watermark.watermark_ms);
            let none = std::iter::empty::<(&[u8], &[u8])>;
            self.op.restore_state(watermark, 0, none())?;
            self.restore_late_watermark(&manifest.watermark);
            for w in &mut self.workers {
                w.op.restore_state(watermark, 0, none())?;
            }
            let shards = 1 + self.workers.len();
            let ops = (&mut self.op, &mut self.workers);
            state::restore_keys(
                &state,
                None,
                shards,
                &mut { ops },
                |_, _, _| {},
                |(lead, workers), i, key, value| {
                    Ok(match i {
                        0 => lead.restore_key(key, value),
                        i => workers[i - 1].op.restore_key(key, value),
                    }?)
                },
                |_| {},
            )
            .map_err(RestoreError::from)
        });
        if let Err(reason) = restored {
            // Nothing of it stays: every operator back to no state.
            let none = std::iter::empty::<(&[u8], &[u8])>;
            let _ = self.op.restore_state(Watermark::MIN, 0, none());
            for w in &mut self.workers {
                let _ = w.op.restore_state(Watermark::MIN, 0, none());
            }
            return Err(checkpoints.keep_found((manifest, state), reason));
        }
        let c = &manifest.counters;
        self.counts = StatefulCounts {
            events: c.records_read,
            late: c.late,
            invalid: c.invalid,
            outputs: c.sessions_emitted,
            ..StatefulCounts::default()
        };
        self.op.track_changes(true);
        self.op.bound_tracked_changes();
        for w in &mut self.workers {
            w.op.track_changes(true);
            w.op.bound_tracked_changes();
        }
        self.checkpointed = true;
        checkpoints.mark_restored();
        Ok(Some(Resumed {
            epoch: manifest.epoch,
            events: c.records_read,
            keys: manifest.keys,
            keys_linked: 0,
        }))
    }

    /// The watermark late events are judged by, as a checkpoint or a task's progress
    /// record keeps it: only on Spark's rules, where it is the previous batch's.
    pub(super) fn late_watermark_record(&self) -> Option<i64> {
        (self.rules == BatchRules::Spark).then(|| self.op.late_watermark().millis())
    }

    /// Puts back the late watermark of a checkpoint or progress record (its watermark
    /// when it kept none), after the watermark.
    pub(super) fn restore_late_watermark(&mut self, w: &WatermarkState) {
        let late = w.late_watermark_ms.unwrap_or(w.watermark_ms);
        self.op.restore_late_watermark(Watermark(late));
    }

    /// The options a checkpoint of this job records (a restore with others is refused).
    pub(super) fn state_options(&self) -> Vec<(String, String)> {
        let pair = |k: &str, v: String| (k.to_string(), v);
        vec![
            pair("job", "library stateful".into()),
            pair(
                "state record",
                sessionizer_window::stateful::SNAPSHOT_VERSION.to_string(),
            ),
            pair(
                "--valid-time-range",
                self.valid
                    .map_or("any".into(), |(a, b)| format!("{a}..{b}")),
            ),
            pair(
                "late events",
                match self.late_policy {
                    LatePolicy::Drop => "drop",
                    LatePolicy::Deliver => "deliver",
                }
                .into(),
            ),
            pair(
                "state ttl",
                self.state_ttl.map_or("none".into(), |d| d.to_string()),
            ),
            pair("state type", std::any::type_name::<S>().to_string()),
        ]
        .into_iter()
        .chain(
            // Only a job on Spark's rules names them: checkpoints of earlier jobs stay
            // restorable.
            (self.rules == BatchRules::Spark).then(|| pair("batch rules", "spark".into())),
        )
        .collect()
    }
}
