//! Checkpoints of a library job, in the command line's checkpoint format
//! (`docs/checkpoint-format.md`): a state directory of manifests, bases and deltas,
//! written atomically with checksums by `sessionizer-checkpoint`, one key's sessions
//! encoded by `sessionizer_window::codec` — the files `sessionizer run --state-dir`
//! writes, and `sessionizer inspect` lists.
//!
//! ```
//! use sessionizer::prelude::*;
//!
//! let dir = tempfile::tempdir().expect("temp dir");
//! let events = [("v1", 0), ("v1", 60_000), ("v2", 0), ("v1", 3_600_000)]
//!     .map(|(k, t)| (k, EventTime(t)));
//! let job = || {
//!     Stream::<(&str, EventTime)>::new()
//!         .key_by(|e| e.0)
//!         .event_time(|e| e.1)
//!         .session_windows(minutes(10))
//!         .aggregate(Count)
//!         .build()
//! };
//!
//! // A first run: two events, a checkpoint, then it stops (or dies).
//! let mut first = job();
//! let mut checkpoints = Checkpoints::open(dir.path()).expect("a state directory");
//! let mut out = Vec::new();
//! for e in &events[..2] {
//!     first.push(*e, &mut out, &mut Vec::new()).expect("vectors");
//! }
//! first.checkpoint(&mut checkpoints).expect("written");
//! drop((first, checkpoints));
//!
//! // The next run resumes: it skips the events the checkpoint covers.
//! let mut checkpoints = Checkpoints::open(dir.path()).expect("a state directory");
//! let mut job = job();
//! let resumed = job.restore(&mut checkpoints).expect("restored").expect("a checkpoint");
//! assert_eq!(resumed.events, 2);
//! let rest = events.into_iter().skip(resumed.events as usize);
//! job.run(rest, &mut out, &mut Vec::new()).expect("vectors");
//! let counts: Vec<u64> = out.iter().filter_map(WindowOutput::session).map(|s| s.value).collect();
//! assert_eq!(counts, [1, 2, 1]); // v2 [0], v1 [0, 1 min], v1 [1 h]
//! ```

use crate::api::joined::{JoinedSource, SharedWriter, SourceProgress};
use crate::error::CommitError;
use crate::error::SourceError;
pub use crate::error::StateError;
use crate::error::{RestoreError, StateFailure};
use crate::runtime::commit::{Committer, StateChanges};
use sessionizer_checkpoint::{
    CheckpointError, CheckpointWriter, Damage, InputPosition, LoadedState, Manifest, StateDir,
    StateEntries,
};
use sessionizer_connectors::OutputTarget;
use sessionizer_connectors::RecordWriter;
use sessionizer_connectors::sink::{EpochSink, FileSink};
use sessionizer_window::spill::BaseImage;
use std::path::{Path, PathBuf};

/// The role of a library job's exactly-once file in a manifest's outputs (the command
/// line's are `sessions`, `dead-letter` and `late`).
const FILE_ROLE: &str = "file";
/// The role of a library job's Delta tables in a checkpoint.
const TABLE_ROLE: &str = "table";

/// What one checkpoint wrote, and whether its state file is a base or a delta.
pub use sessionizer_checkpoint::{Committed, FileKind};

/// A state directory a job checkpoints into and restores from.
///
/// Opening it finds the newest valid checkpoint (a damaged newer one is skipped and
/// listed in [`skipped`](Self::skipped); a directory none of whose checkpoints is valid
/// is refused). A directory is used by one job at a time (it is locked).
#[derive(Debug)]
pub struct Checkpoints {
    pub(crate) path: PathBuf,
    /// Writes the checkpoints, committing the exactly-once outputs with them.
    pub(crate) committer: Committer,
    /// The newest valid checkpoint, until a job restores it.
    pub(crate) found: Option<(Manifest, LoadedState)>,
    /// The epoch of the checkpoint found, whether or not it was restored.
    pub(crate) found_epoch: Option<u64>,
    pub(crate) restored: bool,
    skipped: Vec<(u64, Damage)>,
    /// How far the job's Kafka source had read at the checkpoint found (and what it
    /// reads), then as recorded by the source: written into every checkpoint.
    pub(crate) kafka: SourceProgress,
    /// An exactly-once Kafka output (`KafkaJsonSink::exactly_once`): its open
    /// transaction commits with each checkpoint, in two phases.
    pub(crate) transaction: Option<SharedTopicSink>,
    /// How far the job's file source had read each input at the checkpoint found;
    /// every checkpoint writes the position of the source that joined
    /// ([`JsonLines::resume`]), as `sessionizer run --state-dir` writes its inputs'.
    ///
    /// [`JsonLines::resume`]: crate::api::source::JsonLines::resume
    pub(crate) inputs: Vec<InputPosition>,
    /// The source reading for the job (files or a Kafka topic), whose position each
    /// checkpoint records.
    pub(crate) source: Option<JoinedSource>,
    /// The checkpoint restored had its watermark at +infinity: its job was finished
    /// (every session emitted), so new files are not a continuation of it.
    pub(crate) restored_ended: bool,
    /// The exactly-once file outputs ([`JsonLinesSink::exactly_once`]), by path as
    /// written in the manifest: each is synced and its length committed with every
    /// checkpoint.
    ///
    /// [`JsonLinesSink::exactly_once`]: crate::api::sink::JsonLinesSink::exactly_once
    files: Vec<(String, SharedWriter)>,
    /// The Delta tables written exactly once (a [`DeltaSink`](crate::api::sink::DeltaSink)
    /// each), by their location as the checkpoints record it.
    tables: Vec<(String, SharedWriter)>,
    /// Why these checkpoints take no more writes or restores: the exactly-once output
    /// failed in a checkpoint or while joining (what Kafka committed is then not known
    /// here; only a reopened state directory resolves it).
    failed: Option<String>,
}

/// A transactional Kafka output shared by a sink (which sends) and the checkpoints
/// (which commit).
#[derive(Clone)]
pub(crate) struct SharedTopicSink(
    std::sync::Arc<std::sync::Mutex<Box<dyn crate::runtime::kafka_sink::TopicSink + Send>>>,
);

impl SharedTopicSink {
    /// The sink, for one call (a panic elsewhere while it was held does not matter:
    /// the transaction is then aborted by the next process of the job).
    pub(crate) fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Box<dyn crate::runtime::kafka_sink::TopicSink + Send>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for SharedTopicSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sink = self.lock();
        let (id, topic) = sink.identity();
        f.debug_struct("TopicSink")
            .field("transactional_id", &id)
            .field("topic", &topic)
            .finish()
    }
}

impl Checkpoints {
    /// Opens (creating it if needed) the state directory at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoints, CheckpointError> {
        let path = path.as_ref().to_path_buf();
        let dir = StateDir::open(&path)?;
        let recovery = dir.recover()?;
        let found = recovery.found.map(|r| (r.manifest, r.state));
        let kafka = SourceProgress::of(found.as_ref());
        let inputs = found
            .as_ref()
            .map_or_else(Vec::new, |(m, _)| m.inputs.clone());
        let writer = CheckpointWriter::new(dir, found.as_ref().map(|(m, s)| (m, s)))?;
        let committer = Committer::new(writer, found.as_ref().map(|(m, _)| m.epoch));
        Ok(Checkpoints {
            path,
            committer,
            found_epoch: found.as_ref().map(|(m, _)| m.epoch),
            found,
            restored: false,
            skipped: recovery.skipped,
            kafka,
            transaction: None,
            inputs,
            source: None,
            restored_ended: false,
            files: Vec::new(),
            tables: Vec::new(),
            failed: None,
        })
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The epoch of the newest valid checkpoint found when opening, if any.
    pub fn latest(&self) -> Option<u64> {
        self.found_epoch
    }

    /// Newer checkpoints that were damaged and skipped when opening, newest first.
    pub fn skipped(&self) -> &[(u64, Damage)] {
        &self.skipped
    }
}

/// The bookkeeping both library jobs share around their own state: which checkpoint
/// comes next, writing it, and handing the one found over to a restore.
impl Checkpoints {
    /// Whether the job's next checkpoint is a full base (`checkpointed`: the job wrote
    /// or restored one before). A directory holding a checkpoint the job did not
    /// restore is refused: checkpointing over it would mix two jobs' state.
    pub(crate) fn next_is_base(&self, checkpointed: bool) -> Result<bool, StateError> {
        if let Some(epoch) = self.found_epoch
            && !self.restored
        {
            return Err(StateError::NotRestored {
                dir: self.path.clone(),
                epoch,
            });
        }
        Ok(self.committer.next_is_base() || !checkpointed)
    }

    /// Writes a checkpoint: the job's `parts` of encoded keys (every key when `base`,
    /// else the changes; a part per worker), a base's `images` of the workers' RocksDB
    /// stores (the keys the parts do not hold), and its `manifest`, with the source's
    /// position and the exactly-once outputs committed by the runtime's committer. A
    /// checkpoint that failed leaves the next one a full base (the job drained its
    /// changed keys into it); one whose outputs failed leaves these checkpoints
    /// refusing more: what was committed is then not known here.
    pub(crate) fn write(
        &mut self,
        base: bool,
        parts: Vec<StateEntries>,
        images: Vec<BaseImage>,
        mut manifest: Manifest,
    ) -> Result<Committed, StateError> {
        self.refuse_if_failed()?;
        // Where the source stands now: just after the last record it handed out.
        match &self.source {
            Some(JoinedSource::Files(files)) => self.inputs = files.positions(),
            #[cfg(feature = "kafka")]
            Some(JoinedSource::Kafka(offsets)) => self.kafka = offsets.progress(),
            None => {}
        }
        manifest.kafka_positions = self.kafka.positions.clone();
        manifest.kafka_source = self.kafka.source.clone();
        manifest.inputs = self.inputs.clone();
        let state = StateChanges {
            parts,
            images,
            base,
        };
        // The outputs, in the order the manifest lists them: the files, then a Kafka
        // transaction (two phases: prepared with a progress record naming this
        // checkpoint, committed once it is written).
        let mut writers: Vec<_> = self.files.iter().map(|(_, w)| w.lock()).collect();
        let mut tables: Vec<_> = self.tables.iter().map(|(_, w)| w.lock()).collect();
        let mut files: Vec<FileSink<'_>> = writers
            .iter_mut()
            .map(|w| FileSink {
                role: FILE_ROLE,
                writer: w,
            })
            .chain(tables.iter_mut().map(|w| FileSink {
                role: TABLE_ROLE,
                writer: w,
            }))
            .collect();
        let mut transaction = self.transaction.as_ref().map(SharedTopicSink::lock);
        let mut sinks: Vec<&mut dyn EpochSink> =
            files.iter_mut().map(|f| f as &mut dyn EpochSink).collect();
        if let Some(t) = transaction.as_deref_mut() {
            sinks.push(&mut **t);
        }
        let written = self
            .committer
            .checkpoint(state, manifest, &mut sinks, true)
            .and_then(|_| self.committer.wait());
        // A checkpoint whose second phase failed is durable, but its outputs were not
        // committed: the error stands.
        drop(sinks);
        drop(transaction);
        drop(files);
        drop(writers);
        drop(tables);
        match written {
            Ok(Some(written)) => {
                self.restored = true;
                self.found_epoch = Some(written.committed.epoch);
                Ok(written.committed)
            }
            Ok(None) => Err(StateError::from(CommitError::Disagree {
                dir: self.path.display().to_string(),
                what: "a checkpoint that was waited for was not reported",
            })),
            Err(e) => {
                // An output that failed holds records of unknown extent past its
                // committed length (a file) or a transaction in an unknown state: only
                // a restart, which resolves them from the checkpoints, continues it.
                if matches!(e, CommitError::Sink(_)) || self.transaction.is_some() {
                    self.failed = Some(format!("checkpoint failed: {e}"));
                }
                Err(e.into())
            }
        }
    }

    /// Refuses when the exactly-once output failed earlier (see `failed`).
    fn refuse_if_failed(&self) -> Result<(), StateError> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(StateError::Output(format!(
                "the checkpoints in {} take no more writes or restores after their exactly-once output failed ({why}): stop the job and start it again on the same state directory, which resumes from the last checkpoint whose records were committed",
                self.path.display()
            ))),
        }
    }

    /// Hands the checkpoint found over to a job that has processed `events` so far
    /// (refused unless none) and whose state-shaping options are `options` (refused,
    /// naming the differences, unless equal); `None` when there is none. Give it back
    /// with [`keep_found`](Self::keep_found) if the restore fails.
    pub(crate) fn take_found(
        &mut self,
        events: u64,
        options: &[(String, String)],
    ) -> Result<Option<(Manifest, LoadedState)>, StateError> {
        self.refuse_if_failed()?;
        if events > 0 {
            return Err(StateError::NotFresh { events });
        }
        let Some((manifest, state)) = self.found.take() else {
            return Ok(None);
        };
        if let Some(txn) = &manifest.kafka_txn
            && self.transaction.is_none()
        {
            let (epoch, topic) = (manifest.epoch, txn.output_topic.clone());
            self.found = Some((manifest, state));
            return Err(StateError::Output(format!(
                "checkpoint {epoch} in {} belongs to a job whose records went exactly once to the Kafka topic {topic}: open KafkaJsonSink::exactly_once on these checkpoints before restore(), or use another state directory",
                self.path.display()
            )));
        }
        let differences = manifest.option_differences(options);
        if !differences.is_empty() {
            self.found = Some((manifest, state));
            return Err(StateError::OptionsChanged {
                dir: self.path.clone(),
                differences,
            });
        }
        let unopened = manifest
            .outputs
            .iter()
            .find(|o| !self.files.iter().any(|(path, _)| *path == o.path));
        let unopened_table = manifest
            .delta
            .iter()
            .find(|d| !self.tables.iter().any(|(table, _)| *table == d.table));
        if let Some(d) = unopened_table {
            let error = StateError::Output(format!(
                "checkpoint {} in {} wrote into the Delta table {} exactly once: open DeltaSink::exactly_once({:?}) on these checkpoints before restore(), so that the table is brought back to the checkpoint, or use another state directory",
                manifest.epoch,
                self.path.display(),
                d.table,
                d.table
            ));
            self.found = Some((manifest, state));
            return Err(error);
        }
        if let Some(o) = unopened {
            let error = StateError::Output(format!(
                "checkpoint {} in {} committed the file {} exactly once: open JsonLinesSink::exactly_once({:?}) on these checkpoints before restore(), so that what was written after the checkpoint is cut off, or use another state directory",
                manifest.epoch,
                self.path.display(),
                o.path,
                o.path
            ));
            self.found = Some((manifest, state));
            return Err(error);
        }
        self.restored_ended = manifest.watermark.watermark_ms == i64::MAX;
        Ok(Some((manifest, state)))
    }

    /// Whether a source may join: after the job restored the checkpoint found (a
    /// Kafka output joining before the restore may fall back to an older one), and
    /// once.
    pub(crate) fn can_join_source(&self) -> Result<(), SourceError> {
        if let Some((m, _)) = &self.found {
            return Err(SourceError::Resume(format!(
                "open the source after the job's restore() of checkpoint {} in {}: until then which checkpoint the job continues is not settled",
                m.epoch,
                self.path.display()
            )));
        }
        if self.source.is_some() {
            return Err(SourceError::Resume(format!(
                "the checkpoints in {} already have a source; a job reads its input through one",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// The source reading for the job: every checkpoint records its position.
    pub(crate) fn join_source(&mut self, position: JoinedSource) {
        self.source = Some(position);
    }

    /// Joins the exactly-once file output at `path` to these checkpoints, before the
    /// job restores: it is continued from the length the checkpoint found committed
    /// (what follows is cut off), or emptied when there is no checkpoint.
    pub(crate) fn join_file(&mut self, path: PathBuf) -> Result<SharedWriter, StateError> {
        self.refuse_if_failed()?;
        let name = path.display().to_string();
        if self.restored {
            return Err(StateError::Output(format!(
                "the exactly-once file {name} joins the checkpoints in {} before restore() and the first checkpoint",
                self.path.display()
            )));
        }
        if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
            return Err(StateError::Output(format!(
                "{name} is not a regular file: its committed length cannot be kept, so it cannot be written exactly once"
            )));
        }
        if self.files.iter().any(|(n, _)| *n == name) {
            return Err(StateError::Output(format!(
                "the file {name} is already an exactly-once output of these checkpoints"
            )));
        }
        let mut writer = RecordWriter::new(OutputTarget::File(path));
        let marks = self.found_marks();
        let mark = writer.find(FILE_ROLE, &marks).cloned();
        if let Some((m, _)) = &self.found
            && mark.is_none()
        {
            let listed: Vec<&str> = m.outputs.iter().map(|o| o.path.as_str()).collect();
            return Err(StateError::Output(format!(
                "checkpoint {} in {} did not commit the file {name}, so it cannot be continued exactly once (the checkpoint's files: {}); open the files of the job's first run, or use another state directory",
                m.epoch,
                self.path.display(),
                if listed.is_empty() {
                    "none".to_string()
                } else {
                    listed.join(", ")
                }
            )));
        }
        writer
            .recover(self.next_epoch(), mark.as_ref(), &mut || {
                unreachable!("a file names no job")
            })
            .map_err(|e| StateError::Output(e.to_string()))?;
        let shared = SharedWriter::new(writer);
        self.files.push((name, shared.clone()));
        Ok(shared)
    }

    /// Joins the exactly-once Delta table output at `location` (a directory or an
    /// `s3://` URL), with the columns `schema`, to these checkpoints, before the job
    /// restores: the table is created if missing and brought back to the checkpoint
    /// found (its recorded epoch committed if it was not; the job's data files no
    /// commit names deleted). The job's application id in the table is
    /// `sessionizer-<instance id of the state directory>`.
    #[cfg(feature = "delta")]
    pub(crate) fn join_table(
        &mut self,
        location: &str,
        schema: sessionizer_connectors::parquet::SessionSchema,
    ) -> Result<SharedWriter, StateError> {
        self.refuse_if_failed()?;
        if self.restored {
            return Err(StateError::Output(format!(
                "the Delta table {location} joins the checkpoints in {} before restore() and the first checkpoint",
                self.path.display()
            )));
        }
        let recorded = sessionizer_connectors::delta::recorded_location(location)
            .map_err(|e| StateError::Output(e.to_string()))?;
        if self.tables.iter().any(|(t, _)| *t == recorded) {
            return Err(StateError::Output(format!(
                "the Delta table {location} is already an exactly-once output of these checkpoints"
            )));
        }
        let target = OutputTarget::File(location.into());
        let mut writer = sessionizer_connectors::delta::DeltaStorage::writer(target, schema, None);
        let marks = self.found_marks();
        let mark = writer.find(TABLE_ROLE, &marks).cloned();
        if let Some((m, _)) = &self.found
            && mark.is_none()
        {
            return Err(StateError::Output(format!(
                "checkpoint {} in {} did not write into the Delta table {location}, so it cannot be continued exactly once; open the tables of the job's first run, or use another state directory",
                m.epoch,
                self.path.display(),
            )));
        }
        let dir = self.path.clone();
        let mut job =
            || crate::runtime::instance::persisted_instance(&dir).map_err(std::io::Error::other);
        writer
            .recover(self.next_epoch(), mark.as_ref(), &mut job)
            .map_err(|e| StateError::Output(e.to_string()))?;
        let shared = SharedWriter::new(writer);
        self.tables.push((recorded, shared.clone()));
        Ok(shared)
    }

    /// The output marks of the checkpoint found (none without one).
    fn found_marks(&self) -> Vec<sessionizer_connectors::sink::SinkMark> {
        self.found
            .as_ref()
            .map(|(m, _)| sessionizer_connectors::sink::marks_of(m))
            .unwrap_or_default()
    }

    /// The epoch of the next checkpoint: the one an output joining now writes.
    fn next_epoch(&self) -> u64 {
        self.committer
            .next_epoch()
            .unwrap_or_else(|| self.found_epoch.map_or(1, |e| e + 1))
    }

    /// Puts back a checkpoint whose restore failed (nothing of it was applied) and
    /// returns the error of `reason`.
    pub(crate) fn keep_found(
        &mut self,
        found: (Manifest, LoadedState),
        reason: impl Into<RestoreError>,
    ) -> StateError {
        self.found = Some(found);
        StateError::State {
            dir: self.path.clone(),
            reason: Box::new(StateFailure::Restore(reason.into())),
        }
    }

    /// A restore succeeded: the job's next checkpoint continues this directory.
    pub(crate) fn mark_restored(&mut self) {
        self.restored = true;
    }

    /// Joins the exactly-once Kafka output `sink` to these checkpoints, before the job
    /// restores: the sink claims the job's transactional id (kept in the directory's
    /// `instance-id`, fencing an earlier process of the job and aborting what it left
    /// open); when the newest checkpoint's transaction never committed, the checkpoint
    /// it fell back to becomes the one found, and the newer ones are discarded.
    #[cfg(feature = "kafka")]
    pub(crate) fn join_transaction(
        &mut self,
        mut sink: Box<dyn crate::runtime::kafka_sink::TopicSink + Send>,
    ) -> Result<SharedTopicSink, StateError> {
        use sessionizer_checkpoint::Recovered;
        if self.restored || self.transaction.is_some() {
            return Err(StateError::Output(
                "an exactly-once Kafka output joins the checkpoints before restore() and the first checkpoint, once".into(),
            ));
        }
        if !self.files.is_empty() || !self.tables.is_empty() {
            // Joining may fall back to an older checkpoint, whose file lengths differ.
            return Err(StateError::Output(
                "open the exactly-once Kafka output before the exactly-once files".into(),
            ));
        }
        self.refuse_if_failed()?;
        sink.claim(Some(&self.path)).map_err(StateError::output)?;
        let found = self
            .found
            .take()
            .map(|(manifest, state)| Recovered { manifest, state });
        let warn = &mut |m: &str| tracing::warn!("{m}");
        let Some(writer) = self.committer.writer_mut() else {
            return Err(StateError::from(CommitError::Disagree {
                dir: self.path.display().to_string(),
                what: "a Kafka output joined while a checkpoint was being written",
            }));
        };
        let resolved = crate::runtime::durable::resolve_transaction(
            writer.dir_mut(),
            found,
            Some(sink.as_mut()),
            warn,
        )
        .map_err(StateError::output);
        // The checkpoint found was handed over: after a failure these checkpoints no
        // longer know what to restore.
        let (found, discard) = match resolved {
            Ok(r) => r,
            Err(e) => {
                self.failed = Some(format!("joining the exactly-once output failed: {e}"));
                return Err(e);
            }
        };
        let found = found.map(|r| (r.manifest, r.state));
        if let Some(after) = discard {
            writer.resume_from(found.as_ref().map(|(m, s)| (m, s)));
            if let Err(e) = writer.dir_mut().discard_after(after) {
                self.failed = Some(format!("discarding uncommitted checkpoints failed: {e}"));
                return Err(e.into());
            }
            self.kafka = SourceProgress::of(found.as_ref());
            self.inputs = found
                .as_ref()
                .map_or_else(Vec::new, |(m, _)| m.inputs.clone());
        }
        self.found_epoch = found.as_ref().map(|(m, _)| m.epoch);
        self.committer.set_committed(self.found_epoch);
        self.found = found;
        let shared = SharedTopicSink(std::sync::Arc::new(std::sync::Mutex::new(sink)));
        self.transaction = Some(shared.clone());
        Ok(shared)
    }
}

/// What a job resumed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumed {
    /// The checkpoint's epoch.
    pub epoch: u64,
    /// Events the checkpoint covers (every event pushed before it): skip that many of a
    /// replayable source, or resume the source at its own position stored alongside.
    pub events: u64,
    /// Keys with state at the checkpoint.
    pub keys: u64,
    /// Of those, the keys that came back without being read: a session window on
    /// RocksDB with as many workers as the checkpoint's base had starts each worker's
    /// store as the base's copy of it (0 otherwise).
    pub keys_linked: u64,
}

#[cfg(all(test, feature = "kafka"))]
mod tests {
    //! The bookkeeping around a failed two-phase checkpoint, with an output whose first
    //! phase fails from its second checkpoint on (as when the brokers stop answering):
    //! the real Kafka paths are in `tests/kafka_exactly_once.rs`.
    use super::*;
    use crate::error::RunError;
    use crate::prelude::*;
    use crate::runtime::kafka_sink::{Outcome, Side, TopicSink};
    use crate::runtime::tagged::{Tag, Tagged};
    use sessionizer_checkpoint::KafkaTxn;
    use sessionizer_connectors::sink::{Prepared, SinkError, SinkMark};

    /// Takes records; its first checkpoint commits, then `prepare` fails.
    #[derive(Default)]
    struct Unreachable {
        prepared: u64,
    }

    impl TopicSink for Unreachable {
        fn claim(&mut self, _: Option<&Path>) -> Result<(), RunError> {
            Ok(())
        }
        fn identity(&self) -> (&str, &str) {
            ("sessionizer-lib-test", "sessions")
        }
        fn routes(&self, _: Side) -> bool {
            false
        }
        fn session(&mut self, _: &Tagged, _: &Tag) -> Result<(), RunError> {
            unreachable!("a library job sends with keyed()")
        }
        fn side(&mut self, _: Side, _: &[u8]) -> Result<(), RunError> {
            unreachable!("a library job sends with keyed()")
        }
        fn keyed(&mut self, _: usize, _: Option<&[u8]>, _: &[u8]) -> Result<(), RunError> {
            Ok(())
        }
        fn deliver(&mut self) -> Result<(), RunError> {
            Ok(())
        }
        fn add_topic(&mut self, _: &str) -> Result<usize, RunError> {
            Ok(1)
        }
        fn poll(&mut self) {}
        fn due(&self) -> bool {
            false
        }
        fn commit_open(&mut self) -> Result<(), RunError> {
            unreachable!("a library job commits with its checkpoints")
        }
        fn outcome(&mut self, _: &KafkaTxn, _: u64) -> Result<Outcome, RunError> {
            unreachable!("there is no checkpoint to resolve")
        }
    }

    impl EpochSink for Unreachable {
        fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>, SinkError> {
            self.prepared += 1;
            if self.prepared > 1 {
                return Err(SinkError::Kafka(
                    sessionizer_connectors::kafka::KafkaError::Invalid(format!(
                        "the brokers did not answer (checkpoint {epoch})"
                    )),
                ));
            }
            let txn = KafkaTxn {
                transactional_id: "sessionizer-lib-test".into(),
                output_topic: "sessions".into(),
                progress_topic: "sessions-sessionizer-progress".into(),
                progress_partition: 0,
                progress_offset: 0,
                fallback_epoch: None,
            };
            Ok(Some(Prepared {
                mark: SinkMark::Transaction(txn),
                sync: None,
            }))
        }
        fn two_phase(&self) -> bool {
            true
        }
    }

    fn job() -> impl FnMut(&mut Checkpoints, &str) -> Result<Committed, StateError> {
        let mut job = Stream::<(String, EventTime)>::new()
            .key_by(|e| e.0.clone())
            .event_time(|e| e.1)
            .session_windows(minutes(10))
            .aggregate(Count)
            .build();
        // Pushes an event of `key`, then checkpoints.
        move |checkpoints, key| {
            let event = (key.to_string(), EventTime(0));
            job.push(event, &mut Vec::new(), &mut Vec::new())
                .expect("vectors");
            job.checkpoint(checkpoints)
        }
    }

    #[test]
    fn a_failed_two_phase_checkpoint_refuses_further_writes_and_restores() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut checkpoints = Checkpoints::open(dir.path()).expect("state dir");
        let sink = Box::<Unreachable>::default();
        checkpoints.join_transaction(sink).expect("joined");
        let mut push_and_checkpoint = job();
        push_and_checkpoint(&mut checkpoints, "v1").expect("the first commits");
        assert!(!checkpoints.committer.next_is_base(), "a delta comes next");
        let failed = push_and_checkpoint(&mut checkpoints, "v2").expect_err("prepare fails");
        assert!(failed.to_string().contains("did not answer"), "{failed}");
        assert_eq!(
            checkpoints.committer.next_epoch(),
            Some(2),
            "nothing more was written"
        );
        assert!(
            checkpoints.committer.next_is_base(),
            "the job drained its changes into the failed one: a retry must be a full base"
        );
        let again = push_and_checkpoint(&mut checkpoints, "v3").expect_err("refused");
        assert!(again.to_string().contains("take no more writes"), "{again}");
        let mut other = Stream::<(&str, EventTime)>::new()
            .key_by(|e| e.0)
            .event_time(|e| e.1)
            .session_windows(minutes(10))
            .aggregate(Count)
            .build();
        let restore = other.restore(&mut checkpoints).expect_err("refused");
        let restore = restore.to_string();
        assert!(restore.contains("take no more writes"), "{restore}");
        let manifests = dir.path().read_dir().expect("dir").filter(|e| {
            let name = e.as_ref().expect("entry").file_name();
            name.to_string_lossy().starts_with("manifest-")
        });
        assert_eq!(manifests.count(), 1, "only the first checkpoint's manifest");
    }
}
