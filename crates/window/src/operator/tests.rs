//! Tests of the operator's internals: an advance in parts, interrupted by an event.

use super::*;

#[derive(Default)]
struct Keys(Vec<Vec<u8>>);

impl Emit for Keys {
    fn session(&mut self, s: &SessionView<'_>) {
        self.0.push(s.key.to_vec());
    }
    fn retraction(&mut self, _: &[u8], _: EventTime) {}
}

fn event(key: &[u8], t: i64) -> Event<'_> {
    Event {
        key,
        time: EventTime(t),
        gap: DurationMs(10),
        seq: 0,
        dedup: None,
        values: &[],
    }
}

#[test]
fn an_event_during_an_advance_in_parts_first_emits_the_rest() {
    let mut op = SessionOperator::new(WindowConfig {
        gap: DurationMs(10),
        allowed_lateness: DurationMs(0),
        emit: EmitMode::OnClose,
        aggregates: vec![],
        dedup: false,
    });
    let mut out = Keys::default();
    for key in [b"e", b"c", b"a", b"d", b"b"] {
        op.on_event(&event(key, 0), &mut out);
    }
    assert!(op.advance_at_most(Watermark::at(EventTime(100)), 2, &mut out));
    assert_eq!(out.0, [b"a", b"b"], "two of five, in key order");
    op.on_event(&event(b"f", 200), &mut out);
    assert_eq!(out.0, [b"a", b"b", b"c", b"d", b"e"], "the rest first");
    assert_eq!(op.open_sessions(), 1);
    assert!(!op.advance_at_most(Watermark::MAX, 1, &mut out));
    assert_eq!(out.0.len(), 6);
    assert_eq!(op.keys(), 0, "every key is dropped at +infinity");
}
