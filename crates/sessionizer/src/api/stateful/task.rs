//! A stateful job as the operator of one partition's task in the Kafka group driver
//! (feature `kafka`).

use super::StatefulJob;
use crate::api::sink::SinkError;
use crate::api::stream::{KeyFn, TimeFn};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_checkpoint::WatermarkState;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::clock::Clock;
use sessionizer_window::stateful::{BatchRules, GroupState, SnapshotError};

/// What the Kafka driver needs of a job that is the operator of one partition's task
/// (`crate::api::kafka::group`): the same job, stepped batch by batch, its outputs tagged
/// with the key of the call that returned them, its state key by key in the
/// checkpoints' record layout.
impl<E, K, T, W, S, F, C, R> StatefulJob<E, K, T, W, S, F, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    C: Clock,
    S: Serialize + DeserializeOwned,
    F: FnMut(&str, Vec<E>, &mut GroupState<'_, S>) -> R,
    R: IntoIterator,
    R::Item: 'static,
{
    /// Why the job cannot be a task of a group, if it cannot.
    pub(crate) fn task_refusal(&self) -> Option<crate::error::GroupJobRefusal> {
        crate::api::kafka::task_refusal(
            !self.workers.is_empty(),
            self.spill_root.is_some(),
            self.counts.events > 0 || self.checkpointed,
        )
    }

    /// Puts a state store of the group's backend below the job's operator, for task
    /// `task` (before it is restored).
    pub(crate) fn attach_task_store(
        &mut self,
        stores: &crate::runtime::backend::TaskStores,
        task: &str,
    ) -> Result<(), crate::error::RunError>
    where
        S: Send + 'static,
    {
        use sessionizer_window::stateful::KeyRecordCodec;
        let (store, hot) = stores.store_for(task, Box::new(KeyRecordCodec::<S>::default()))?;
        self.op.spill_to(store, hot);
        Ok(())
    }

    /// What the job's state store did (`None`: in memory).
    pub(crate) fn task_spill_counts(&self) -> Option<sessionizer_window::spill::SpillCounts> {
        self.op.spill_counts()
    }

    /// The key of `event`, as the job computes it.
    pub(crate) fn key_into(&self, event: &E, out: &mut String) {
        self.key.key_into(event, out);
    }

    /// The number of events a micro-batch holds at most ([`Batching`](super::Batching)).
    pub(crate) fn batch_size(&self) -> usize {
        self.batching.size()
    }

    /// Ends the open batch (an empty one if none is open), each output with its call's
    /// key; a state store's failure is an error.
    pub(crate) fn end_task_batch(
        &mut self,
        out: &mut dyn FnMut(&[u8], R::Item),
    ) -> Result<(), SinkError> {
        let report = self
            .op
            .end_batch_ordered(&mut self.f, &mut |o, item| out(o.key(), item));
        self.count(&report);
        self.store_error()
    }

    /// Moves the watermark to `w` without an event (an idle partition), firing what is
    /// due; `finish` moves it to +∞ (the end of a bounded input).
    pub(crate) fn advance_task(
        &mut self,
        w: Watermark,
        out: &mut dyn FnMut(&[u8], R::Item),
    ) -> Result<(), SinkError> {
        let report = self
            .op
            .advance_to(w, &mut self.f, &mut |o, item| out(o.key(), item));
        self.count(&report);
        self.store_error()
    }

    /// The end of a bounded input: with Spark's rules a batch without events first
    /// (Spark's no-data batch), then the watermark +∞.
    pub(crate) fn finish_task(
        &mut self,
        out: &mut dyn FnMut(&[u8], R::Item),
    ) -> Result<(), SinkError> {
        if self.rules == BatchRules::Spark {
            self.end_task_batch(out)?;
        }
        self.advance_task(Watermark::MAX, out)
    }

    /// From now on the watermark follows [`observe_task_upstream`](Self::observe_task_upstream)
    /// alone (a task of a re-keyed topic).
    pub(crate) fn follow_task_upstream(&mut self) {
        self.op.follow_external_time();
    }

    /// The upstream partitions' time rose to `t`: the watermark strategy observes it,
    /// and an empty batch ends at the watermark that gives, firing what is due.
    pub(crate) fn observe_task_upstream(
        &mut self,
        t: EventTime,
        out: &mut dyn FnMut(&[u8], R::Item),
    ) -> Result<(), SinkError> {
        self.op.observe_external(t);
        let w = self.op.next_watermark();
        if w <= self.op.watermark() {
            return Ok(());
        }
        self.advance_task(w, out)
    }

    /// The time of `event` when it is valid (inside the valid time range), as the
    /// re-keying side of a group job reads it.
    pub(crate) fn task_time_of(&self, event: &E) -> Option<EventTime> {
        crate::api::stream::valid_time_of(&self.time, self.valid, event)
    }

    /// Where event time stands, for the changelog's progress records.
    pub(crate) fn task_progress(&self) -> WatermarkState {
        WatermarkState {
            max_event_time_ms: None,
            watermark_ms: self.op.watermark().millis(),
            largest_gap_ms: 0,
            new_key_floor_ms: None,
            late_watermark_ms: self.late_watermark_record(),
        }
    }

    /// Puts event time back and empties the state, before any key.
    pub(crate) fn restore_task_progress(
        &mut self,
        w: &WatermarkState,
    ) -> Result<(), SnapshotError> {
        let none = std::iter::empty::<(&[u8], &[u8])>();
        self.op.restore_state(Watermark(w.watermark_ms), 0, none)?;
        self.restore_late_watermark(w);
        self.checkpointed = true;
        Ok(())
    }

    /// The options that shape the state, as its checkpoints record them.
    pub(crate) fn task_state_options(&self) -> Vec<(String, String)> {
        self.state_options()
    }

    /// Puts one key back from its record.
    pub(crate) fn restore_task_key(
        &mut self,
        key: &[u8],
        record: &[u8],
    ) -> Result<(), crate::error::KeyStateError> {
        Ok(self.op.restore_key(key, record)?)
    }

    /// Starts remembering which keys change.
    pub(crate) fn track_task_changes(&mut self) {
        self.op.track_changes(true);
    }

    /// Calls `f` with every key whose state changed since the last call, as its record
    /// (`None`: gone).
    pub(crate) fn drain_task_changes(
        &mut self,
        f: &mut crate::runtime::kafka::PutChange<'_>,
    ) -> Result<(), SnapshotError> {
        self.op.encode_state(false, f)
    }

    /// Calls `f` with every key and its record.
    pub(crate) fn for_each_task_key(
        &self,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), sessionizer_window::spill::SpillError> {
        use sessionizer_window::spill::SpillError;
        self.op.for_each_key_record(f).map_err(|e| match e {
            SnapshotError::Spill(e) => e,
            SnapshotError::State { key, source } => SpillError::Encode {
                key,
                reason: source.into(),
            },
            other => {
                unreachable!("a key record is refused only by its state or the store: {other}")
            }
        })
    }
}
