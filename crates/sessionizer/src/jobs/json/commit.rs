//! A run's checkpoints and commits: putting a checkpoint's state back, taking
//! checkpoints as they fall due, and committing a Kafka output's transactions.

use super::Job;
use crate::config::CheckpointConfig;
use crate::error::RunError;
use crate::runtime::{backend, durable, state};
use crate::telemetry::{CheckpointKind, CheckpointReport, Telemetry};
use sessionizer_checkpoint::CheckpointError;
use sessionizer_checkpoint::state::LiveError;
use sessionizer_connectors::sink::{EndOfRun, EpochSink, FileSink};
use std::time::Instant;

impl<'c> Job<'c> {
    /// Puts a checkpoint's state back: every key into the shard its hash gives with this
    /// run's number of workers, and the watermark into every shard. Returns the keys
    /// restored, and how many of them were reported to `telemetry` as progress.
    pub(super) fn restore(
        &mut self,
        manifest: &sessionizer_checkpoint::Manifest,
        state: &sessionizer_checkpoint::LoadedState,
        checkpoint: Option<&CheckpointConfig>,
        telemetry: &Telemetry,
    ) -> Result<(u64, u64), RunError> {
        let dir = checkpoint.map_or_else(String::new, |c| c.state_dir.display().to_string());
        // The largest gap first: restored timers of final sessions depend on it.
        for s in &mut self.shards {
            s.restore_progress(&manifest.watermark);
        }
        let shards = self.shards.len();
        // The keys spread evenly over the shards: room for them all up front (for
        // those in memory, when the spill stores started as the checkpoint's copies).
        let in_stores: u64 = if self.stores_restored {
            state.stores().iter().map(|s| s.keys).sum()
        } else {
            0
        };
        let keys = usize::try_from(manifest.keys.saturating_sub(in_stores)).unwrap_or(0);
        for s in &mut self.shards {
            s.op.reserve_keys(keys.div_ceil(shards) + keys / 64);
        }
        let format = state.format_version();
        if self.stores_restored {
            // The stores hold the keys that were in RocksDB at the base; the base file
            // and the deltas go over them.
            let restored = state::restore_over_files(
                state,
                shards,
                &mut self.shards[..],
                |all, s, key, value| all[s].restore_over(key, value, format),
            );
            let keys = self.restore_failed(restored, manifest, &dir)?;
            if let Some(d) = &mut self.durable {
                d.stats.restore_keys_linked = in_stores;
            }
            return Ok((keys + in_stores, 0));
        }
        let mut reported = 0u64;
        let restored = state::restore_keys(
            state,
            backend::store_reader(),
            shards,
            &mut self.shards[..],
            |all, s, hash| all[s].op.prefetch_index(hash),
            |all, s, key, value| all[s].restore_key(key, value, format),
            |keys| {
                telemetry.restore_progress(keys);
                reported += keys;
            },
        );
        let keys = self.restore_failed(restored, manifest, &dir)?;
        Ok((keys, reported))
    }

    /// The error of a restore that failed.
    fn restore_failed<T>(
        &self,
        restored: Result<T, LiveError<(Vec<u8>, crate::error::KeyStateError)>>,
        manifest: &sessionizer_checkpoint::Manifest,
        dir: &str,
    ) -> Result<T, RunError> {
        match restored {
            Ok(done) => Ok(done),
            Err(LiveError::Damaged(d)) => {
                Err(RunError::Checkpoint(CheckpointError::NoValidCheckpoint {
                    dir: dir.into(),
                    details: vec![(manifest.epoch, d)],
                }))
            }
            Err(LiveError::Apply((key, reason))) => Err(RunError::RestoreState {
                dir: dir.to_string(),
                key: String::from_utf8_lossy(&key).into_owned(),
                reason: Box::new(reason),
            }),
            Err(LiveError::NoStoreReader) => Err(RunError::Unsupported(
                crate::error::Unsupported::NoStoreReader,
            )),
        }
    }

    /// Takes a checkpoint when one is due, or — without a state directory — commits
    /// the Kafka output's transaction when that is due.
    pub(super) fn commit_if_due(
        &mut self,
        next_seq: u64,
        telemetry: &Telemetry,
    ) -> Result<(), RunError> {
        let txn_due = self.topics.as_ref().is_some_and(|t| t.due());
        match &self.durable {
            Some(d) if txn_due || d.due(self.stats.records_read) => {
                self.checkpoint(next_seq, false, false, telemetry)
            }
            None if txn_due => self.commit_topics(telemetry),
            _ => Ok(()),
        }
    }

    /// The end of a run without a state directory: the Kafka output's open
    /// transaction commits, Parquet files become visible, and a Delta table gets the
    /// run's rows in one commit — unless the run was `stopped` before the end of its
    /// input: a table then gets none of them (the whole input run again adds each
    /// once).
    pub(super) fn end_without_checkpoint(
        &mut self,
        telemetry: &Telemetry,
        stopped: bool,
    ) -> Result<(), RunError> {
        for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
            if let EndOfRun::Dropped { output } = w.end(!stopped)? {
                telemetry.warn(&format!(
                    "stopped before the end of the input: without --state-dir none of the run's sessions are committed to {output} (run the whole input again)"
                ));
            }
        }
        if self.topics.is_some() {
            self.commit_topics(telemetry)?;
        }
        Ok(())
    }

    /// Commits the Kafka output's open transaction (a run without a state directory).
    fn commit_topics(&mut self, telemetry: &Telemetry) -> Result<(), RunError> {
        let Some(t) = &mut self.topics else {
            return Ok(());
        };
        let began = Instant::now();
        t.commit_open()?;
        telemetry.outputs_written();
        telemetry.checkpoint(&CheckpointReport {
            kind: CheckpointKind::Transaction,
            epoch: None,
            bytes: 0,
            keys: 0,
            took: began.elapsed(),
        });
        Ok(())
    }

    /// Flushes the outputs and takes a checkpoint (its writing goes on in the
    /// background unless `finished`: the last one is waited for). With a Kafka output
    /// it is a two-phase commit: the transaction is prepared (every record on the
    /// brokers, with a progress record naming the checkpoint), the checkpoint written
    /// and waited for, then the transaction committed.
    pub(super) fn checkpoint(
        &mut self,
        next_seq: u64,
        finished: bool,
        flushed: bool,
        telemetry: &Telemetry,
    ) -> Result<(), RunError> {
        let Some(durable) = &mut self.durable else {
            return Ok(());
        };
        if finished {
            // The run's last checkpoint commits whatever an output's commit interval.
            for w in [&mut self.sessions, &mut self.dead, &mut self.late] {
                w.closing();
            }
        }
        let mut files: Vec<FileSink<'_>> = [&mut self.sessions, &mut self.dead, &mut self.late]
            .into_iter()
            .zip(durable::ROLES)
            .map(|(writer, role)| FileSink { role, writer })
            .collect();
        let mut sinks: Vec<&mut dyn EpochSink> =
            files.iter_mut().map(|f| f as &mut dyn EpochSink).collect();
        if let Some(t) = self.topics.as_deref_mut() {
            sinks.push(t);
        }
        // The committer waits for the last checkpoint of a run (`finished`), and for
        // every checkpoint with a two-phase sink (a Kafka transaction, Parquet files).
        durable.checkpoint(
            self.pool.pool(),
            &mut self.shards,
            &mut sinks,
            &self.stats,
            next_seq,
            finished,
            flushed,
            finished,
        )?;
        if self.topics.is_some() {
            telemetry.outputs_written();
        }
        Ok(())
    }
}
