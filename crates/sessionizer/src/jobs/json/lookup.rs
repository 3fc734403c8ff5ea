//! One key's state in a shard, for `/sessions?key=K` ([`crate::telemetry`]): asked by
//! the pipeline thread between batches, never while the shard works.

use crate::jobs::json::shard::Shard;
use crate::telemetry::KeyView;
use sessionizer_core::EventTime;
use sessionizer_core::timefmt::format_rfc3339_ms;
use sessionizer_window::{Emit, SessionAggregate, SessionView};

/// The sessions `key` has in `shard` (task `task`), oldest first, each as its session
/// record would be written now plus `close`, `status` and `task`; `None` when the
/// shard holds no state for the key.
///
/// `status` is `open` (the watermark has not reached its close), `complete` (emitted
/// and kept for the allowed lateness: a late event can still revise it) or `final`
/// (only its bounds are kept, so that late events cannot join it; no aggregates).
/// `revision` is that of the record an open session will be emitted with next, and
/// that of the last record of a complete or final one.
pub(crate) fn describe(shard: &Shard, key: &[u8], task: &str) -> Option<KeyView> {
    let mut view = None;
    // A spill store that cannot be read answers as if the key had no state; the run
    // itself stops on that error at its next step.
    let _ = shard.op.with_key(key, |state| {
        view = Some(describe_state(shard, key, task, state))
    });
    view
}

fn describe_state(
    shard: &Shard,
    key: &[u8],
    task: &str,
    state: &sessionizer_window::session::KeySessions,
) -> KeyView {
    let watermark = shard.op.watermark();
    let mut encoder = shard.out.encoder.clone();
    encoder.buf.clear();
    let mut list: Vec<_> = state.sessions().collect();
    list.sort_by_key(|s| s.start());
    let mut sessions = Vec::with_capacity(list.len());
    for s in list {
        let status = if s.is_final() {
            "final"
        } else if watermark.has_reached(EventTime(s.close())) {
            "complete"
        } else {
            "open"
        };
        let revision = if status == "open" {
            s.next_revision()
        } else {
            s.next_revision().saturating_sub(1)
        };
        encoder.buf.clear();
        encoder.session(&SessionView {
            key,
            start: EventTime(s.start()),
            end: EventTime(s.last()),
            close: EventTime(s.close()),
            event_count: s.event_count(),
            revision,
            complete: status != "open",
            aggregates: shard.op.aggregate().view(s.acc()),
        });
        // The record as the output has it, then the fields of the answer.
        let record = String::from_utf8_lossy(&encoder.buf);
        let record = record.trim_end().strip_suffix('}').unwrap_or(&record);
        let text = format!(
            r#"{record},"close":"{}","status":"{status}","task":{}}}"#,
            format_rfc3339_ms(EventTime(s.close())),
            serde_json::Value::from(task),
        );
        // The encoder writes valid JSON; a record that were not would be an error
        // value rather than a broken answer.
        let value = serde_json::value::RawValue::from_string(text).unwrap_or_else(|e| {
            serde_json::value::to_raw_value(&serde_json::json!({"error": e.to_string()}))
                .expect("a string encodes")
        });
        sessions.push(value);
    }
    KeyView {
        task: task.to_string(),
        floor: state.floor(),
        watermark,
        sessions,
    }
}
