//! The driver's steps, each an `impl KafkaJob` block over the job's parts: taking
//! partitions on and giving them up (assignment), committing a step (commit), ending a `--stop-at-end` run (end),
//! riding out an outage (outage), sending a step's outputs (output), restoring tasks
//! from their changelogs (restore), writing local snapshots (snapshot), a Delta table's
//! epochs (table), and watermarks that move without a record (time). The parts they
//! work on (`runtime/kafka/{outage,output,restore,snapshot,table}.rs`, ...) know
//! nothing of the job, so that the driver's files import in one direction.

mod assignment;
mod commit;
mod end;
mod outage;
mod output;
mod restore;
mod snapshot;
#[cfg(feature = "delta")]
mod table;
mod time;
