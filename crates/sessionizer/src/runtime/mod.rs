//! How every job runs keyed operators on several workers — the command line's pipeline
//! (its file, stdin and Kafka drivers) and the library's session windows and stateful
//! jobs alike, so that there is one scheme and one set of its bugs:
//!
//! - keys are split into shards by a fixed hash of the key ([`shard_of`]), the same for
//!   every run, so a checkpoint restores onto any number of workers;
//! - shard `i` always runs on worker thread `i` ([`Workers::on_each`]);
//! - every shard sees the events of its own keys and every event that raises the
//!   batch's (or decode range's) largest time or gap ([`Walks`]) — no other event
//!   changes its watermark or largest gap — and emits, for its own keys, exactly the records one
//!   operator would, each at the step (input position) that caused it ([`walk`], the
//!   one loop every job's shards run);
//!   [`merge_order`] puts the shards' records back in one operator's order, so the
//!   output is the same, record for record, for any number of workers.

pub(crate) mod backend;
pub(crate) mod commit;
pub(crate) mod durable;
mod idle;
pub(crate) mod instance;
#[cfg(feature = "kafka")]
pub(crate) mod kafka;
pub(crate) mod kafka_sink;
mod order;
pub(crate) mod state;
pub(crate) mod tagged;
mod walks;
mod workers;

pub(crate) use idle::{idle_watermark, millis};
pub(crate) use order::{END_PART, Place, end_part_lens, merge_by, merge_order};
pub(crate) use walks::{Step, Walked, Walker, Walks, walk};
pub(crate) use workers::{Padded, Workers, shard_of};

/// The threads of `--workers N` (none for one worker: the pipeline thread does it all).
pub(crate) fn start_workers(workers: usize) -> Result<Workers, crate::error::RunError> {
    Workers::start(workers, "sessionizer-worker").map_err(|e| crate::error::RunError::Workers {
        workers,
        message: e.to_string(),
    })
}
