//! Tests of one key's sessions: the inline and boxed forms hold the same fields and
//! behave alike.
use super::*;
use crate::keyed::Timed;

fn session(start: i64, last: i64, close: i64) -> Session {
    Session {
        start,
        last,
        close,
        count: 3,
        next_revision: 2,
        flags: EMITTED | DIRTY,
        contents: None,
    }
}

fn list(sessions: Vec<Session>) -> SessionList<Vec<AggState>> {
    sessions.into_iter().collect()
}

/// One session without contents is kept inline with its bounds as offsets; more
/// sessions, or fields beyond 32 bits of its start, take the boxed form; either way
/// every field reads back exactly.
#[test]
fn a_single_session_is_compact_and_anything_else_is_boxed_with_every_field_kept() {
    let mut k = KeySessions::from_parts(list(vec![session(1_000, 1_500, 2_000)]), 900);
    assert!(k.is_compact());
    k.set_timer(2_000);
    let s = k.sessions().next().expect("one session");
    assert_eq!(
        (
            s.start(),
            s.last(),
            s.close(),
            s.event_count(),
            s.next_revision()
        ),
        (1_000, 1_500, 2_000, 3, 2)
    );
    assert!(s.emitted() && s.is_dirty() && !s.is_final());
    assert_eq!((k.floor(), k.timer()), (900, 2_000));

    // A second session: boxed; back to one: inline again, with floor and timer.
    k.edit(|sessions, _| sessions.push(session(5_000, 5_000, 6_000)));
    assert!(!k.is_compact());
    assert_eq!(k.session_count(), 2);
    k.set_timer(6_000);
    k.edit(|sessions, floor| {
        sessions.retain(|s| s.start == 5_000);
        *floor = 2_000;
    });
    assert!(k.is_compact());
    assert_eq!((k.floor(), k.timer()), (2_000, 6_000));
    // A timer before the start does not fit the offsets.
    k.set_timer(4_999);
    assert!(!k.is_compact());
    assert_eq!(k.timer(), 4_999);
    k.set_timer(6_000);
    assert_eq!(k.sessions().next().map(|s| s.start()), Some(5_000));

    // Past 32 bits: a close 50 days after the start, a floor of minus infinity, a
    // timer just at the edge, or a floor 50 days before the start.
    let far = 50 * 86_400_000;
    let wide = KeySessions::from_parts(list(vec![session(0, 10, far)]), i64::MIN);
    assert!(!wide.is_compact());
    assert_eq!(wide.sessions().next().map(|s| s.close()), Some(far));
    let mut k = KeySessions::from_parts(list(vec![session(0, 10, 20)]), i64::MIN);
    assert!(k.is_compact());
    assert_eq!(k.floor(), i64::MIN);
    k.set_timer(i64::from(u32::MAX));
    assert!(!k.is_compact(), "u32::MAX stands for no timer");
    assert_eq!(k.timer(), i64::from(u32::MAX));
    let k = KeySessions::from_parts(list(vec![session(far, far, far)]), -1);
    assert!(!k.is_compact());
    assert_eq!(k.floor(), -1);
}

/// Extending the single session in place gives what the list form gives, and a
/// revision past the inline range moves the state to the boxed form.
#[test]
fn the_inline_session_extends_and_counts_revisions_like_the_list() {
    let mut k = KeySessions::from_parts(list(vec![session(1_000, 1_000, 1_100)]), i64::MIN);
    assert_eq!(k.extend_one(1_050, 1_150), Some((1_000, 1_150)));
    assert_eq!(k.extend_one(999, 1_099), None, "before the start");
    assert_eq!(k.extend_one(1_151, 1_251), None, "after the close");
    let s = k.sessions().next().expect("session");
    assert_eq!((s.last(), s.close(), s.event_count()), (1_050, 1_150, 4));
    for _ in 2..u32::from(u16::MAX) {
        k.take_revision(1_000, true);
    }
    assert!(k.is_compact());
    let (rev, _) = k.take_revision(1_000, true).expect("live");
    assert_eq!(rev, u32::from(u16::MAX));
    assert!(!k.is_compact());
    let (rev, _) = k.take_revision(1_000, false).expect("live");
    assert_eq!(rev, u32::from(u16::MAX) + 1);
    assert!(k.take_revision(7, true).is_none());
}
