//! The commit protocol of a checkpointed job, in one place: the command line's file
//! and stdin runs and the library's jobs take their checkpoints through it.
//!
//! A checkpoint (an *epoch*) is taken between two batches, when nothing is in flight.
//! The job hands the committer its encoded state changes, a manifest (source
//! positions, watermark, counters, options) and its sinks; the committer then:
//!
//! 1. asks every sink to *prepare* the epoch ([`EpochSink::prepare`]): a file is
//!    written out and its length noted, a Kafka transaction is flushed with a progress
//!    record naming the epoch; each answers with the mark the manifest records (a
//!    transaction's mark also names the checkpoint to fall back to: the newest one
//!    known committed);
//! 2. on a thread of its own, while the job goes on: syncs the files, then writes the
//!    state file and the manifest atomically (`sessionizer-checkpoint`): from then on
//!    the checkpoint exists;
//! 3. when a sink is two-phase (a transaction), waits for step 2 and *commits* it: its
//!    records become visible only now.
//!
//! A crash before step 2 completes leaves the previous checkpoint as the newest (files
//! are cut back to its lengths, the transaction was never committed); a crash between
//! steps 2 and 3 leaves a prepared checkpoint that recovery resolves
//! ([`crate::runtime::durable::resolve_transaction`]). A failed write leaves the
//! writer expecting a full base: the job drained its changed keys into the checkpoint
//! that failed, so a retry as a delta would miss them.
//!
//! One checkpoint is written at a time: the caller [`wait`](Committer::wait)s for the
//! previous one before encoding its state (whether the next is a base is known only
//! then).

#[cfg(feature = "kafka")]
pub(crate) mod txn;

use crate::error::CommitError;
use sessionizer_checkpoint::{CheckpointWriter, Committed, EncodedState, Manifest, StateEntries};
use sessionizer_connectors::sink::PendingSync;
use sessionizer_connectors::sink::{EpochSink, SinkError, SinkMark};
use sessionizer_window::spill::BaseImage;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A job's encoded state for one checkpoint.
#[derive(Debug, Default)]
pub(crate) struct StateChanges {
    /// One buffer of encoded entries per shard or worker: every key for a base, else
    /// the keys changed or removed since the previous checkpoint.
    pub parts: Vec<StateEntries>,
    /// A base's spilled keys: images of the state backend's stores, which the base
    /// keeps as they are.
    pub images: Vec<BaseImage>,
    /// Whether the parts hold every key.
    pub base: bool,
}

/// A checkpoint that is durable.
#[derive(Debug)]
pub(crate) struct Written {
    /// What the writer wrote.
    pub committed: Committed,
    /// The state buffers, emptied, for the next checkpoint.
    pub parts: Vec<StateEntries>,
    /// How long the syncs and the writes took.
    pub took: Duration,
}

/// The checkpoint writer of one job and the protocol around it.
#[derive(Debug)]
pub(crate) struct Committer {
    /// The writer, here between checkpoints; with the thread writing one otherwise.
    writer: Option<CheckpointWriter>,
    in_flight: Option<InFlight>,
    /// The newest checkpoint known to be committed (sinks included): where a recovery
    /// goes if the next one's transaction does not commit.
    committed: Option<u64>,
    /// A checkpoint that became durable while the committer waited for it on its own;
    /// handed out by the next [`poll`](Self::poll) or [`wait`](Self::wait).
    done: Option<Written>,
    /// Why this committer takes no more checkpoints: a second phase failed after its
    /// checkpoint was written (the writer's chain holds a checkpoint whose records were
    /// not committed, so a delta on it must never be written), or the writing thread
    /// could not start (the writer went with it).
    poisoned: Option<String>,
    label: String,
}

/// A checkpoint handed to the committer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandedOff {
    /// When the job could go on: the work was on the writing thread (the wait for a
    /// two-phase sink's commit comes after).
    pub at: Instant,
}

#[derive(Debug)]
struct InFlight {
    epoch: u64,
    /// Whether its sinks' second phase is still to come.
    two_phase: bool,
    thread: JoinHandle<(CheckpointWriter, Result<Written, CommitError>)>,
}

impl Committer {
    /// A committer over `writer`, whose newest committed checkpoint is `committed`
    /// (the one the job resumed from, if any).
    pub fn new(writer: CheckpointWriter, committed: Option<u64>) -> Committer {
        let mut writer = writer;
        let label = writer.dir_mut().path().display().to_string();
        Committer {
            writer: Some(writer),
            in_flight: None,
            committed,
            done: None,
            poisoned: None,
            label,
        }
    }

    /// The writer, between checkpoints (`None` while one is being written).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn writer_mut(&mut self) -> Option<&mut CheckpointWriter> {
        self.writer.as_mut()
    }

    /// The checkpoint to fall back to from now on (after a recovery chose one).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn set_committed(&mut self, epoch: Option<u64>) {
        self.committed = epoch;
    }

    /// The epoch the next checkpoint gets (`None` while one is being written).
    #[cfg_attr(not(feature = "parquet"), allow(dead_code))]
    pub fn next_epoch(&self) -> Option<u64> {
        self.writer.as_ref().map(CheckpointWriter::next_epoch)
    }

    /// Whether the next checkpoint must be a full base (`true` while one is being
    /// written: wait for it first).
    pub fn next_is_base(&self) -> bool {
        self.writer
            .as_ref()
            .is_none_or(CheckpointWriter::next_is_base)
    }

    /// Takes one checkpoint: `state` and `manifest` (whose outputs, Kafka transaction
    /// and epoch are filled in here) with every sink of `sinks` (see the module's
    /// protocol). Returns once the checkpoint is handed to the writing thread, or —
    /// when `wait` or a sink is two-phase — once it is durable and the sinks
    /// committed; the written checkpoint is then handed out by the next
    /// [`poll`](Self::poll) or [`wait`](Self::wait). The previous checkpoint must have
    /// been waited for. After a second phase failed, or the writing thread did not
    /// start, every later checkpoint is refused.
    pub fn checkpoint(
        &mut self,
        state: StateChanges,
        mut manifest: Manifest,
        sinks: &mut [&mut dyn EpochSink],
        wait: bool,
    ) -> Result<HandedOff, CommitError> {
        if let Some(why) = &self.poisoned {
            return Err(CommitError::Poisoned {
                dir: self.label.clone(),
                why: why.clone(),
            });
        }
        let Some(mut writer) = self.writer.take() else {
            return Err(CommitError::Disagree {
                dir: self.label.clone(),
                what: "a checkpoint was started while the previous one was being written",
            });
        };
        let epoch = writer.next_epoch();
        // Phase one.
        let mut syncs: Vec<PendingSync> = Vec::new();
        let mut two_phase = false;
        let mut prepared = || -> Result<(), CommitError> {
            for sink in sinks.iter_mut() {
                let Some(p) = sink.prepare(epoch)? else {
                    continue;
                };
                two_phase |= sink.two_phase();
                syncs.extend(p.sync);
                match p.mark {
                    SinkMark::File(commit) => manifest.outputs.push(commit),
                    SinkMark::Transaction(mut txn) => {
                        txn.fallback_epoch = self.committed;
                        manifest.kafka_txn = Some(txn);
                    }
                    SinkMark::Staged(files) => manifest.staged.push(files),
                    SinkMark::Delta(epoch) => manifest.delta.push(epoch),
                }
            }
            Ok(())
        };
        if let Err(e) = prepared() {
            // The job drained its changes into this checkpoint: the next one must hold
            // every key.
            writer.resume_from(None);
            self.writer = Some(writer);
            return Err(e);
        }
        manifest.epoch = epoch;
        let work = Work {
            syncs,
            state,
            manifest,
        };
        let label = self.label.clone();
        let thread = std::thread::Builder::new()
            .name("sessionizer-checkpoint".into())
            .spawn(move || {
                let began = Instant::now();
                let mut work = work;
                let result = write(&mut writer, &mut work, &label).map(|committed| {
                    work.state.parts.iter_mut().for_each(StateEntries::clear);
                    Written {
                        committed,
                        parts: std::mem::take(&mut work.state.parts),
                        took: began.elapsed(),
                    }
                });
                if result.is_err() {
                    // The job drained its changes into this checkpoint: the next one
                    // must hold every key.
                    writer.resume_from(None);
                }
                (writer, result)
            })
            .map_err(|e| {
                let e = CommitError::Thread(format!("cannot start the checkpoint thread: {e}"));
                self.poisoned = Some(e.to_string());
                e
            })?;
        self.in_flight = Some(InFlight {
            epoch,
            two_phase,
            thread,
        });
        let handed = HandedOff { at: Instant::now() };
        if wait || two_phase {
            self.finish(sinks)?;
        }
        Ok(handed)
    }

    /// The checkpoint being written, if it is durable now (without waiting), or the one
    /// the committer waited for on its own (also when a sink's second phase then
    /// failed: the checkpoint itself is durable).
    pub fn poll(&mut self) -> Result<Option<Written>, CommitError> {
        self.written(false)
    }

    /// Waits for the checkpoint being written, if any.
    pub fn wait(&mut self) -> Result<Option<Written>, CommitError> {
        self.written(true)
    }

    fn written(&mut self, block: bool) -> Result<Option<Written>, CommitError> {
        if self.done.is_none()
            && let Some(f) = &self.in_flight
            && (block || f.thread.is_finished())
        {
            self.finish(&mut [])?;
        }
        Ok(self.done.take())
    }

    /// Joins the writing thread and keeps the written checkpoint in `done`; with
    /// two-phase sinks, commits them.
    fn finish(&mut self, sinks: &mut [&mut dyn EpochSink]) -> Result<(), CommitError> {
        let Some(f) = self.in_flight.take() else {
            return Err(CommitError::Disagree {
                dir: self.label.clone(),
                what: "no checkpoint is being written",
            });
        };
        let (writer, result) = f.thread.join().map_err(|_| {
            CommitError::Thread("the checkpoint thread stopped unexpectedly".into())
        })?;
        self.writer = Some(writer);
        self.done = Some(result?);
        if f.two_phase {
            #[cfg(feature = "fault-injection")]
            exit_before_second_phase(f.epoch);
            // Phase two: the checkpoint naming the sinks' marks is durable.
            for sink in sinks.iter_mut().filter(|s| s.two_phase()) {
                if let Err(e) = sink.commit(f.epoch) {
                    self.poisoned = Some(format!(
                        "the second phase of checkpoint {} failed: {e}",
                        f.epoch
                    ));
                    return Err(e.into());
                }
            }
        }
        self.committed = Some(f.epoch);
        Ok(())
    }
}

/// Test hook (cargo feature `fault-injection` only): with
/// `SESSIONIZER_TEST_EXIT_BEFORE_SECOND_PHASE=N` the process exits (code 86, without
/// cleaning up) once checkpoint N is durable and before its two-phase sinks commit it
/// (Parquet files renamed, a Delta table's commit) — the instant a `kill -9` rarely
/// hits. A build without the feature has no such exit.
#[cfg(feature = "fault-injection")]
fn exit_before_second_phase(epoch: u64) {
    const ENV: &str = "SESSIONIZER_TEST_EXIT_BEFORE_SECOND_PHASE";
    let asked = std::env::var(ENV).ok().and_then(|v| v.parse::<u64>().ok());
    if asked == Some(epoch) {
        eprintln!("sessionizer: {ENV}: exiting before the second phase of checkpoint {epoch}");
        std::process::exit(86);
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // A checkpoint being written is finished (or fails) before the job goes.
        if let Some(f) = self.in_flight.take() {
            let _ = f.thread.join();
        }
    }
}

/// One checkpoint for the writing thread: outputs to sync first, then the state and
/// the manifest to write.
#[derive(Debug)]
struct Work {
    syncs: Vec<PendingSync>,
    state: StateChanges,
    manifest: Manifest,
}

/// Syncs the outputs, then writes the state file and the manifest.
fn write(writer: &mut CheckpointWriter, w: &mut Work, dir: &str) -> Result<Committed, CommitError> {
    // The job encoded either every key (a base) or the changes (a delta); the writer
    // must label the file the same way, or a "base" would silently lack unchanged keys.
    if !writer.settle_kind(w.state.base) {
        return Err(CommitError::Disagree {
            dir: dir.to_string(),
            what: "the checkpoint writer and the job disagree on whether this checkpoint is a full base; nothing was written, the previous checkpoint is intact",
        });
    }
    // Outputs first: the manifest must never claim bytes that are not on disk. A sync
    // failure is fatal, never retried.
    for pending in &w.syncs {
        pending.sync().map_err(SinkError::from)?;
    }
    let state = EncodedState {
        parts: w.state.parts.iter().flat_map(StateEntries::parts).collect(),
        puts: w.state.parts.iter().map(StateEntries::puts).sum(),
        tombstones: w.state.parts.iter().map(StateEntries::tombstones).sum(),
    };
    // A base keeps the stores' images as its copy of the keys in RocksDB.
    let stores = std::mem::take(&mut w.state.images)
        .into_iter()
        .map(crate::runtime::state::store_dir)
        .collect();
    Ok(writer.commit_full(&state, &mut |_| Ok(()), stores, w.manifest.clone())?)
}

#[cfg(test)]
mod tests {
    //! The protocol's order and its failures, with a sink that records what it is asked
    //! and can be told to fail; the real sinks are tested end to end (files in
    //! `tests/`, Kafka in `crates/cli/tests/kafka.rs`).
    use super::*;
    use sessionizer_checkpoint::{KafkaTxn, StateDir};
    use sessionizer_connectors::sink::{Prepared, SinkError};
    use std::sync::{Arc, Mutex};

    /// A two-phase sink writing into a shared log.
    struct Recording {
        log: Arc<Mutex<Vec<String>>>,
        fail_prepare_at: Option<u64>,
        fail_commit_at: Option<u64>,
    }

    impl Recording {
        fn new(log: &Arc<Mutex<Vec<String>>>) -> Recording {
            Recording {
                log: log.clone(),
                fail_prepare_at: None,
                fail_commit_at: None,
            }
        }
    }

    impl EpochSink for Recording {
        fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>, SinkError> {
            self.log.lock().unwrap().push(format!("prepare {epoch}"));
            if self.fail_prepare_at == Some(epoch) {
                return Err(SinkError::Internal("prepare refused"));
            }
            Ok(Some(Prepared {
                mark: SinkMark::Transaction(KafkaTxn {
                    transactional_id: "t".into(),
                    output_topic: "o".into(),
                    progress_topic: "p".into(),
                    progress_partition: 0,
                    progress_offset: epoch as i64,
                    fallback_epoch: Some(999),
                }),
                sync: None,
            }))
        }
        fn two_phase(&self) -> bool {
            true
        }
        fn commit(&mut self, epoch: u64) -> Result<(), SinkError> {
            self.log.lock().unwrap().push(format!("commit {epoch}"));
            if self.fail_commit_at == Some(epoch) {
                return Err(SinkError::Internal("commit refused"));
            }
            Ok(())
        }
    }

    fn committer(dir: &std::path::Path) -> Committer {
        let writer = CheckpointWriter::new(StateDir::open(dir).expect("dir"), None).expect("w");
        Committer::new(writer, None)
    }

    fn one_key(committer: &Committer) -> StateChanges {
        let mut entries = StateEntries::default();
        entries.put_with(b"k", |b| b.extend_from_slice(b"v"));
        StateChanges {
            parts: vec![entries],
            images: Vec::new(),
            base: committer.next_is_base(),
        }
    }

    fn manifests(dir: &std::path::Path) -> Vec<Manifest> {
        let dir = StateDir::open(dir).expect("dir");
        let found = dir.recover().expect("recover").found.expect("a checkpoint");
        vec![found.manifest]
    }

    #[test]
    fn a_transaction_commits_after_its_checkpoint_and_falls_back_to_the_last_committed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut c = committer(dir.path());
        let mut sink = Recording::new(&log);
        for _ in 0..2 {
            let state = one_key(&c);
            c.checkpoint(state, Manifest::default(), &mut [&mut sink], false)
                .expect("checkpoint");
            // Waited for on its own (two-phase), handed out by the next poll.
            let written = c.poll().expect("poll").expect("written");
            assert!(
                written.parts.iter().all(|p| p.puts() == 0),
                "emptied buffers"
            );
        }
        assert_eq!(
            *log.lock().unwrap(),
            ["prepare 1", "commit 1", "prepare 2", "commit 2"]
        );
        drop(c); // its lock on the directory
        let newest = &manifests(dir.path())[0];
        assert_eq!(newest.epoch, 2);
        let txn = newest.kafka_txn.as_ref().expect("the mark");
        assert_eq!(txn.progress_offset, 2);
        assert_eq!(
            txn.fallback_epoch,
            Some(1),
            "the committer names the newest committed checkpoint, whatever the sink said"
        );
    }

    #[test]
    fn a_failed_prepare_writes_nothing_and_leaves_a_base_next() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut c = committer(dir.path());
        let mut sink = Recording::new(&log);
        sink.fail_prepare_at = Some(2);
        let state = one_key(&c);
        c.checkpoint(state, Manifest::default(), &mut [&mut sink], true)
            .expect("first");
        c.wait().expect("wait");
        assert!(!c.next_is_base(), "a delta would come next");
        let state = one_key(&c);
        let e = c
            .checkpoint(state, Manifest::default(), &mut [&mut sink], true)
            .expect_err("prepare fails");
        assert!(e.to_string().contains("prepare refused"), "{e}");
        assert!(
            c.next_is_base(),
            "the job drained its changes into the failed checkpoint"
        );
        assert_eq!(*log.lock().unwrap(), ["prepare 1", "commit 1", "prepare 2"]);
        drop(c);
        assert_eq!(
            manifests(dir.path())[0].epoch,
            1,
            "nothing more was written"
        );
    }

    #[test]
    fn a_failed_second_phase_is_counted_but_refuses_every_later_checkpoint() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut c = committer(dir.path());
        let mut sink = Recording::new(&log);
        sink.fail_commit_at = Some(1);
        let state = one_key(&c);
        let e = c
            .checkpoint(state, Manifest::default(), &mut [&mut sink], false)
            .expect_err("commit fails");
        assert!(e.to_string().contains("commit refused"), "{e}");
        let written = c.poll().expect("poll").expect("the durable checkpoint");
        assert_eq!(written.committed.epoch, 1);
        let state = one_key(&c);
        let again = c
            .checkpoint(state, Manifest::default(), &mut [&mut sink], false)
            .expect_err("refused");
        assert!(again.to_string().contains("take no more writes"), "{again}");
        assert_eq!(
            *log.lock().unwrap(),
            ["prepare 1", "commit 1"],
            "not prepared again"
        );
    }
}
