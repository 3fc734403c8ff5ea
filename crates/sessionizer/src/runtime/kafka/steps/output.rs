//! The driver's steps for output (see `runtime/kafka/output.rs` for its parts).

use crate::error::RunError;
use crate::runtime::commit::txn::commit_error;
use crate::runtime::kafka::KafkaJob;
use crate::runtime::kafka::op::{TaskFactory, TaskOp};
use crate::runtime::kafka::output::Out;
use crate::runtime::kafka::task::message_key;
use sessionizer_connectors::kafka::TopicPartition;

impl<F: TaskFactory> KafkaJob<'_, F> {
    /// Sends a task's outputs of its last step: dead letters of the batch just
    /// processed, sessions and retractions, late events.
    pub(in crate::runtime::kafka) fn send_outputs(
        &mut self,
        id: TopicPartition,
    ) -> Result<(), RunError> {
        let KafkaJob {
            tasks,
            producer,
            sessions,
            dead,
            late,
            key_buf,
            ..
        } = self;
        let task = tasks.get_mut(&id).expect("task exists");
        let out = task.op.sessions();
        self.telemetry
            .sessions_completed(out.completed, std::time::Instant::now());
        // Dead letters first: they come from decoding, before any session of the batch.
        let (records, lines) = task.op.dead_letters();
        if !lines.is_empty() {
            match dead {
                Out::Writer(w) => w.append(records, lines.len() as u64)?,
                Out::Table => unreachable!("only the sessions go to a table"),
                Out::Topic { name, .. } => {
                    let p = producer.as_mut().expect("a topic output has a producer");
                    let records = records.split(|&b| b == b'\n').filter(|r| !r.is_empty());
                    for (&line, record) in lines.iter().zip(records) {
                        let key = message_key(task, line);
                        p.send(name, None, key, Some(record), false)
                            .map_err(commit_error)?;
                    }
                }
            }
        }
        match sessions {
            Out::Writer(w) => w.append(&out.encoder.buf, out.tags.len() as u64)?,
            #[cfg(feature = "delta")]
            Out::Table => crate::runtime::kafka::table::append(
                &mut task.table,
                &out.encoder.buf,
                out.tags.len() as u64,
            )?,
            #[cfg(not(feature = "delta"))]
            Out::Table => unreachable!("a table output needs the delta feature"),
            Out::Topic { name, partitions } => {
                let p = producer.as_mut().expect("a topic output has a producer");
                for tag in &out.tags {
                    let m = out.message(tag, *partitions, key_buf);
                    p.send(name, Some(m.partition), Some(m.key), m.value, m.retract)
                        .map_err(commit_error)?;
                }
            }
        }
        let (records, steps) = task.op.late();
        if !steps.is_empty() {
            match late {
                Out::Writer(w) => w.append(records, steps.len() as u64)?,
                Out::Table => unreachable!("only the sessions go to a table"),
                Out::Topic { name, .. } => {
                    let p = producer.as_mut().expect("a topic output has a producer");
                    let first = task.next_seq - task.batch.lines.len() as u64;
                    for &(step, from, len) in steps {
                        let record = &records[from..from + len];
                        let record = record.strip_suffix(b"\n").unwrap_or(record);
                        let line = step.checked_sub(first).map(|l| l as usize);
                        let key = line.and_then(|l| message_key(task, l));
                        p.send(name, None, key, Some(record), false)
                            .map_err(commit_error)?;
                    }
                }
            }
        }
        Ok(())
    }
}
