//! A session window job as a task of the Kafka group driver (feature `kafka`).

use super::checkpoint::{JsonAcc, state_options};
use super::{GapFn, SessionWindowJob, Trigger, WindowOutput};
use crate::api::late::Late;
use crate::api::sink::{Sink, SinkError};
use crate::api::stream::{KeyFn, TimeFn};
use crate::runtime::state;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sessionizer_core::{EventTime, Watermark};
use sessionizer_window::WatermarkStrategy;
use sessionizer_window::aggregate::Aggregator;
use sessionizer_window::clock::Clock;
use sessionizer_window::session::KeySessions;
use sessionizer_window::spill::{SpillError, StateCodec};

/// What the Kafka group driver (`crate::api::kafka::group`) runs a job as: one job per input
/// partition, on one worker, its state in memory; the driver decodes the records,
/// cuts the batches, moves idle partitions on and keeps the state in the changelog.
impl<E, K, T, W, A, G, C> SessionWindowJob<E, K, T, W, A, G, C>
where
    K: KeyFn<E>,
    T: TimeFn<E>,
    W: WatermarkStrategy,
    A: Aggregator<E>,
    A::Acc: Serialize + DeserializeOwned,
    G: GapFn<E>,
    C: Clock,
{
    /// Puts a state store of the group's backend below the job's operator, for task
    /// `task` (before it is restored).
    pub(crate) fn attach_task_store(
        &mut self,
        stores: &crate::runtime::backend::TaskStores,
        task: &str,
    ) -> Result<(), crate::error::RunError>
    where
        A::Acc: 'static,
    {
        let codec = Box::new(JsonAcc::<A::Acc>(std::marker::PhantomData));
        let (store, hot) = stores.store_for(task, codec)?;
        self.op.spill_to(store, hot);
        Ok(())
    }

    /// The first failure of the job's state store since the last call (a key it could
    /// not read back, so a changelog drain may have missed it): the step is not
    /// committed.
    pub(crate) fn take_task_store_error(&mut self) -> Option<SpillError> {
        self.store_error().err()
    }

    /// Whether the job may retract a record it emitted: a late event that moves or
    /// merges an emitted session (allowed lateness with on-close emission), or open
    /// sessions that merge (on-update emission). Final emission never does.
    pub(crate) fn task_can_retract(&self) -> bool {
        let c = self.op.config();
        match c.emit {
            sessionizer_window::EmitMode::Final => false,
            sessionizer_window::EmitMode::OnClose => c.allowed_lateness.millis() > 0,
            _ => true,
        }
    }

    /// Why the job cannot be a task of a group, if it cannot.
    pub(crate) fn task_refusal(&self) -> Option<crate::error::GroupJobRefusal> {
        crate::api::kafka::task_refusal(
            !self.workers.is_empty(),
            self.spill_root.is_some(),
            self.counts.events > 0 || self.checkpointed,
        )
    }

    /// The key of `event`, as the job computes it.
    pub(crate) fn key_into(&self, event: &E, out: &mut String) {
        self.key.key_into(event, out);
    }

    /// Pushes the decoded events of a batch whose first record has sequence number
    /// `first_seq` (the records after it count up from there).
    pub(crate) fn push_task_batch<S>(
        &mut self,
        events: Vec<E>,
        first_seq: u64,
        sessions: &mut S,
        on_late: impl FnMut(usize, Late<E>) -> Result<(), SinkError>,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        self.seq = self.seq.max(first_seq);
        self.push_events_with(events, sessions, on_late).map(drop)
    }

    /// Moves the watermark to `to` without events: an idle partition (`end` false), or
    /// the end of a bounded input (`end`: every session).
    pub(crate) fn advance_task<S>(
        &mut self,
        to: Watermark,
        end: bool,
        sessions: &mut S,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        if end {
            return self.advance_all(Watermark::MAX, Trigger::EndOfInput, None, sessions);
        }
        if to <= self.op.watermark() {
            return Ok(());
        }
        self.watermark.resume_at(to);
        let now = self.clock.now();
        self.advance_all(to, Trigger::Idle, Some(now), sessions)
    }

    /// From now on the watermark follows [`observe_task_upstream`](Self::observe_task_upstream)
    /// alone (a task of a re-keyed topic).
    pub(crate) fn follow_task_upstream(&mut self) {
        self.follow_upstream = true;
    }

    /// The upstream partitions' time rose to `t`: the watermark strategy observes it as
    /// an event time, and the sessions it completes are emitted.
    pub(crate) fn observe_task_upstream<S>(
        &mut self,
        t: EventTime,
        sessions: &mut S,
    ) -> Result<(), SinkError>
    where
        S: Sink<WindowOutput<A::Output>>,
    {
        let w = self.watermark.observe(t);
        if w <= self.op.watermark() {
            return Ok(());
        }
        let now = self.clock.now();
        self.advance_all(w, Trigger::Watermark, Some(now), sessions)
    }

    /// The time of `event` when it is valid (inside the valid time range), as the
    /// re-keying side of a group job reads it.
    pub(crate) fn task_time_of(&self, event: &E) -> Option<EventTime> {
        crate::api::stream::valid_time_of(&self.time, self.valid, event)
    }

    /// Where event time stands.
    pub(crate) fn task_progress(&self) -> sessionizer_checkpoint::WatermarkState {
        state::progress(&self.op, self.max_time)
    }

    /// Puts event time back, before any key.
    pub(crate) fn restore_task_progress(&mut self, w: &sessionizer_checkpoint::WatermarkState) {
        state::restore_progress(&mut self.op, w);
        self.watermark.resume_at(Watermark(w.watermark_ms));
        self.max_time = w.max_event_time_ms.map(EventTime);
        self.checkpointed = true;
    }

    /// The options that shape the state, as its checkpoints record them.
    pub(crate) fn task_state_options(&self) -> Vec<(String, String)> {
        state_options::<A, E>(self.op.config(), self.valid)
    }

    /// Puts one key's sessions back from their encoding (the checkpoints').
    pub(crate) fn restore_task_key(
        &mut self,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), crate::error::KeyStateError> {
        let sessions = JsonAcc::<A::Acc>(std::marker::PhantomData).decode(value)?;
        self.op.restore_key(key, sessions);
        Ok(())
    }

    /// Starts remembering which keys change.
    pub(crate) fn track_task_changes(&mut self) {
        self.op.track_changes(true);
    }

    /// Calls `f` with every key whose sessions changed since the last call, encoded
    /// (`None`: gone); an accumulator its JSON writer refuses is an error naming it.
    pub(crate) fn drain_task_changes(
        &mut self,
        f: &mut crate::runtime::kafka::PutChange<'_>,
    ) -> Result<(), SpillError> {
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let mut encode = |s: &KeySessions<A::Acc>, buf: &mut Vec<u8>| json.encode(s, buf);
        state::drain_encoded(&mut self.op, &mut Vec::new(), &mut encode, f)
    }

    /// Calls `f` with every key and its encoded sessions.
    pub(crate) fn for_each_task_key(
        &self,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), SpillError> {
        let json = JsonAcc::<A::Acc>(std::marker::PhantomData);
        let mut encode = |s: &KeySessions<A::Acc>, buf: &mut Vec<u8>| json.encode(s, buf);
        state::for_each_encoded(&self.op, &mut encode, f)
    }
}
