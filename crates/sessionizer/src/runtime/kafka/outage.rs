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

use crate::config::KafkaConfig;
use crate::error::RunError;
use crate::stats::RunStats;
use crate::telemetry::Telemetry;
use sessionizer_connectors::kafka::KafkaError;
use sessionizer_connectors::kafka::admin::Admin;
use std::time::{Duration, Instant};

/// How long one question to the cluster ("do you answer?") may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest pause between two attempts to go on after a failed step.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long after the cluster answered again a failure still belongs to the outage
/// that just ended: errors the clients queued while it lasted, a transaction the
/// coordinator aborted meanwhile. Such a failure is not a new outage to announce.
pub(super) const AFTERMATH: Duration = Duration::from_secs(10);

/// A time during which the cluster did not answer.
#[derive(Debug)]
pub(super) struct Outage {
    pub(super) since: Instant,
    /// The last error met.
    pub(super) cause: String,
    /// When the cluster was last asked whether it answers again.
    pub(super) probed: Option<Instant>,
    /// Whether it was announced (not the aftermath of the one before).
    pub(super) announced: bool,
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
    pub(super) fn in_aftermath(&self) -> bool {
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
pub(super) fn kafka_cause(e: &RunError) -> Option<&KafkaError> {
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
