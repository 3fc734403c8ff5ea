//! The driver's steps for outage (see `runtime/kafka/outage.rs` for its parts).

use crate::error::RunError;
use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::TaskFactory;
use crate::runtime::kafka::outage::{MAX_BACKOFF, Outage, PROBE_TIMEOUT, is_transient};
use sessionizer_connectors::kafka::KafkaError;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::consumer::StartAt;
use sessionizer_connectors::kafka::producer::TxnProducer;
use std::time::{Duration, Instant};

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// An error that usually passes, met while polling the input: the job goes on
    /// reading (the consumer reconnects by itself) but commits nothing until the
    /// cluster answers again. Fails once the outage outlasts the limit.
    pub(in crate::runtime::kafka) fn poll_failed(&mut self, e: KafkaError) -> Result<(), RunError> {
        if self.outage.is_none() && self.outages.in_aftermath() {
            // Queued while the cluster was away; the cluster answered since.
            tracing::debug!(error = %e, "a Kafka error from the outage that just ended");
            return Ok(());
        }
        self.outage_began(&e);
        self.within_limit()
    }

    /// Whether the job is waiting for the cluster. During an outage that began while
    /// polling, asks the cluster once a second whether it answers again, and ends the
    /// outage when it does.
    pub(in crate::runtime::kafka) fn waiting_for_cluster(&mut self) -> Result<bool, RunError> {
        let Some(o) = &mut self.outage else {
            return Ok(false);
        };
        if o.probed
            .is_some_and(|p| p.elapsed() < Duration::from_secs(1))
        {
            return self.within_limit().map(|()| true);
        }
        o.probed = Some(Instant::now());
        if self.cluster_answers() {
            self.outage_ended();
            return Ok(false);
        }
        self.within_limit().map(|()| true)
    }

    /// An error that usually passes interrupted a step (see the module's
    /// documentation): waits for the cluster, then puts the job back to its last
    /// commit. Returns the error itself when the job cannot wait for it, and
    /// [`RunError::KafkaOutage`] when the cluster did not answer within the limit.
    pub(in crate::runtime::kafka) fn ride_out(&mut self, e: RunError) -> Result<(), RunError> {
        if !self.durable {
            return Err(e);
        }
        let RunError::Kafka(k) = &e else {
            return Err(e);
        };
        self.outage_began(k);
        // A commit running on its thread ends first: if it committed, its tasks'
        // counters are this process's share; if not, the rewind below covers it.
        if let Err(again) = self.settle()
            && !is_transient(&again)
        {
            return Err(again);
        }
        // Every partition the job held goes back to its last commit, whatever part of
        // that the failed step had done already.
        let mut parts: Vec<TopicPartition> = self.tasks.keys().copied().collect();
        if let Some(r) = &self.rekey {
            parts.extend(r.positions.keys());
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            self.within_limit()?;
            if self.telemetry.stop_requested() {
                // Nothing can be committed now; what was committed stays.
                return Err(e);
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match self.go_back(&parts) {
                Ok(()) => {
                    self.outage_ended();
                    return Ok(());
                }
                Err(again) if is_transient(&again) => {
                    if let (Some(o), RunError::Kafka(k)) = (&mut self.outage, &again) {
                        o.cause = k.to_string();
                    }
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Once the cluster answers: a new transactional producer, and every task of
    /// `parts` rebuilt from its last commit. A rebalance the failed step left half done
    /// is finished on the way: partitions the group took away are let go (their last
    /// commit is where the next owner starts), partitions it gave are built and read.
    fn go_back(&mut self, parts: &[TopicPartition]) -> Result<(), RunError> {
        if !self.cluster_answers() {
            return Err(RunError::Kafka(KafkaError::Unavailable(
                "the brokers do not answer".into(),
            )));
        }
        if let Some(old) = self.producer.take() {
            let id = old.id().to_string();
            // Dropped first: two producers of one transactional id fence each other.
            drop(old);
            self.producer = Some(TxnProducer::new(
                &self.settings,
                &id,
                self.kafka.transaction_timeout,
            )?);
            // The new producer aborted what the old one left open.
            self.txns
                .abort(None, &self.telemetry, &"the Kafka cluster did not answer")?;
        }
        let (given, taken) = self.consumer.unfinished();
        for tp in parts.iter().chain(&given).chain(&taken) {
            self.release(tp);
        }
        if !taken.is_empty() {
            self.consumer.unassign(&taken)?;
        }
        // What the consumer reads now (a rebalance during the outage may have taken
        // some away) and what the group gave that it does not read yet. Every partition
        // it reads is rebuilt, also one the failed step had let go of already (a rewind
        // that failed between dropping its tasks and restoring them).
        let held = self.consumer.assigned()?;
        for tp in &held {
            self.release(tp);
        }
        let mut rebuild: Vec<TopicPartition> = held
            .iter()
            .copied()
            .chain(given.iter().copied().filter(|tp| !held.contains(tp)))
            .filter(|tp| !taken.contains(tp))
            .collect();
        rebuild.sort_unstable();
        rebuild.dedup();
        let mut new = Vec::new();
        for (tp, start) in self.build_tasks(&rebuild)? {
            if !held.contains(&tp) {
                new.push((tp, start));
            } else if let StartAt::Offset(o) = start {
                self.consumer.seek(tp, o)?;
            }
        }
        if !new.is_empty() {
            self.consumer.assign(&new)?;
        }
        if let Some(s) = &mut self.standbys {
            // The job's tasks may differ now: the copies to keep are asked again.
            s.stale();
        }
        Ok(())
    }

    /// Whether the cluster answers a metadata request now.
    fn cluster_answers(&self) -> bool {
        self.consumer.answers(PROBE_TIMEOUT)
    }

    fn outage_began(&mut self, e: &KafkaError) {
        match &mut self.outage {
            Some(o) => o.cause = e.to_string(),
            None => {
                let new = !self.outages.in_aftermath();
                if new {
                    self.outages.count += 1;
                }
                self.telemetry.waiting(e, self.kafka.outage_limit, new);
                self.outage = Some(Outage {
                    since: Instant::now(),
                    cause: e.to_string(),
                    probed: Some(Instant::now()),
                    announced: new,
                });
            }
        }
    }

    fn outage_ended(&mut self) {
        if let Some(o) = self.outage.take() {
            let waited = o.since.elapsed();
            self.outages.waited += waited;
            self.outages.ended = Some(Instant::now());
            self.telemetry.answered(waited, o.announced);
        }
    }

    fn within_limit(&self) -> Result<(), RunError> {
        match &self.outage {
            Some(o) if o.since.elapsed() > self.kafka.outage_limit => Err(RunError::KafkaOutage {
                brokers: self.kafka.brokers.clone(),
                waited: o.since.elapsed(),
                limit: self.kafka.outage_limit,
                cause: o.cause.clone(),
            }),
            _ => Ok(()),
        }
    }
}
