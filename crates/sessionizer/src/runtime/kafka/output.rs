//! Where a task's records go: Kafka topics (in the open transaction) or JSON-lines
//! writers, and how a record becomes a Kafka message (docs/semantics.md K-7).

use crate::error::RunError;
use sessionizer_connectors::kafka::admin::Admin;
use sessionizer_connectors::{OutputTarget, RecordWriter};

/// Where one kind of output goes.
pub(super) enum Out {
    /// A Kafka topic with this many partitions.
    Topic { name: String, partitions: usize },
    /// A file, stdout or stderr.
    Writer(RecordWriter),
    /// A Delta table: each task appends to its own writer of it (`table.rs`).
    Table,
}

impl Out {
    pub(super) fn new(
        topic: &Option<String>,
        target: &OutputTarget,
        admin: &Admin,
        role: &'static str,
    ) -> Result<Out, RunError> {
        Ok(match topic {
            Some(name) => Out::Topic {
                partitions: admin.require(name, role)?,
                name: name.clone(),
            },
            None => Out::Writer(RecordWriter::new(target.clone())),
        })
    }
}
