//! Riding out a Kafka cluster that does not answer for a while: a broker restarting, a
//! partition's leader or a coordinator moving, a rolling restart of the cluster.
//!
//! Errors that usually pass ([`KafkaError::is_transient`]) do not end the job:
//!
//! * met while **polling** the input, they need nothing of the job — the consumer
//!   reconnects by itself and resumes where it stood. The job stops committing (a
//!   commit could only time out) and asks the cluster once a second whether it answers
//!   again; then it goes on, and commits as usual.
//! * met in the middle of a **step** — a commit, a rebalance, a restore — they leave the
//!   open transaction and the tasks in a state nobody can vouch for. In exactly-once
//!   mode the job then waits with a growing pause (up to two seconds) and, once the
//!   cluster answers, replaces its transactional producer (the new one, registering the
//!   same transactional id, aborts whatever the old one left open — also when the
//!   coordinator had aborted it already because it outlived the transaction timeout)
//!   and rewinds every task to its last commit, restoring it from its changelog. Without
//!   exactly-once mode (no consumer group) there is no commit to go back to: such an
//!   error ends the run.
//!
//! A run with **file inputs, a Kafka output and a state directory** goes back to its
//! last checkpoint instead ([`checkpointed_riding_out`]): it waits for the cluster and
//! runs again, resuming as a rerun of the same command would.
//!
//! Either way the wait is bounded: once the cluster has not answered for
//! `--kafka-outage-limit` the job stops with [`RunError::KafkaOutage`]. While it waits
//! the job is not ready, and it says so once, with the first error, not per retry.

use super::KafkaJob;
use crate::config::KafkaConfig;
use crate::error::RunError;
use crate::runtime::kafka::op::TaskFactory;
use crate::stats::RunStats;
use crate::telemetry::Telemetry;
use sessionizer_connectors::kafka::KafkaError;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::kafka::consumer::StartAt;
use sessionizer_connectors::kafka::producer::TxnProducer;
use std::time::{Duration, Instant};

/// How long one question to the cluster ("do you answer?") may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest pause between two attempts to go on after a failed step.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long after the cluster answered again a failure still belongs to the outage
/// that just ended: errors the clients queued while it lasted, a transaction the
/// coordinator aborted meanwhile. Such a failure is not a new outage to announce.
const AFTERMATH: Duration = Duration::from_secs(10);

/// A time during which the cluster did not answer.
#[derive(Debug)]
pub(super) struct Outage {
    since: Instant,
    /// The last error met.
    cause: String,
    /// When the cluster was last asked whether it answers again.
    probed: Option<Instant>,
    /// Whether it was announced (not the aftermath of the one before).
    announced: bool,
}

/// What the job did through outages, for its summary.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Outages {
    pub count: u64,
    pub waited: Duration,
    /// When the last one ended.
    pub ended: Option<Instant>,
}

impl Outages {
    fn in_aftermath(&self) -> bool {
        self.ended.is_some_and(|e| e.elapsed() < AFTERMATH)
    }
}

/// Runs `attempt` — a run with file inputs, a Kafka output and a state directory — and,
/// when it fails with an error that may pass, waits for the cluster and runs it again:
/// a rerun goes on from the last checkpoint (its Kafka transaction settled: committed, or
/// aborted by the rerun's producer, which registers the same transactional id), so the
/// committed records are those of one uninterrupted run. The wait is announced once and
/// bounded by `--kafka-outage-limit`, counted from the first failure; an attempt that
/// fails again soon after the cluster answered (within [`AFTERMATH`]) belongs to the
/// same outage.
pub(crate) fn checkpointed_riding_out(
    kafka: &KafkaConfig,
    telemetry: &Telemetry,
    mut attempt: impl FnMut() -> Result<RunStats, RunError>,
) -> Result<RunStats, RunError> {
    let mut since: Option<Instant> = None;
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    loop {
        let started = Instant::now();
        let result = attempt();
        let e = match result.as_ref().err().map(kafka_cause) {
            // Brokers that never answered this run: a wrong address more likely than a
            // restart. The run fails at its start, as a job with a Kafka input does.
            Some(Some(KafkaError::Unreachable { .. })) if first => return result,
            Some(Some(e)) if e.is_transient() => e.to_string(),
            _ => return result,
        };
        first = false;
        if started.elapsed() > AFTERMATH {
            // The attempt ran well: this is a new outage.
            since = None;
            backoff = Duration::from_millis(100);
        }
        let new = since.is_none();
        let began = *since.get_or_insert_with(Instant::now);
        telemetry.waiting(&e, kafka.outage_limit, new);
        loop {
            if began.elapsed() > kafka.outage_limit {
                return Err(RunError::KafkaOutage {
                    brokers: kafka.brokers.clone(),
                    waited: began.elapsed(),
                    limit: kafka.outage_limit,
                    cause: e,
                });
            }
            if telemetry.stop_requested() {
                return result;
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let answers = Admin::new(&kafka.settings()).and_then(|a| {
                a.require(kafka.output_topic.as_deref().unwrap_or_default(), "output")
            });
            if answers.is_ok() {
                break;
            }
        }
        telemetry.answered(began.elapsed(), new);
    }
}

/// The Kafka error behind `e`, if Kafka is what failed (also when the run wrapped it
/// with its counts).
fn kafka_cause(e: &RunError) -> Option<&KafkaError> {
    match e {
        RunError::Kafka(k) => Some(k),
        RunError::Failed { error, .. } => kafka_cause(error),
        _ => None,
    }
}

/// Whether `e` may pass by itself.
pub(super) fn is_transient(e: &RunError) -> bool {
    kafka_cause(e).is_some_and(KafkaError::is_transient)
}

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// An error that usually passes, met while polling the input: the job goes on
    /// reading (the consumer reconnects by itself) but commits nothing until the
    /// cluster answers again. Fails once the outage outlasts the limit.
    pub(super) fn poll_failed(&mut self, e: KafkaError) -> Result<(), RunError> {
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
    pub(super) fn waiting_for_cluster(&mut self) -> Result<bool, RunError> {
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
    pub(super) fn ride_out(&mut self, e: RunError) -> Result<(), RunError> {
        if !self.durable {
            return Err(e);
        }
        let RunError::Kafka(k) = &e else {
            return Err(e);
        };
        self.outage_began(k);
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
