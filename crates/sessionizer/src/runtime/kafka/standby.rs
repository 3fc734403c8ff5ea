//! Standby replicas (`--standby-replicas N`, docs/semantics.md K-3): warm copies of tasks
//! that other processes of the group own, kept by following their changelog partitions,
//! so that a process taking over a partition (its owner died or left) reads only the few
//! records its copy has not seen yet instead of the whole changelog.
//!
//! Who keeps which copy is computed by every process alike from the group's membership
//! (the coordinator's description of the members and their partitions): members are
//! ordered by their client id, and the copies of a partition owned by the member at
//! position `o` are kept by the members at `o + 1 .. o + N` (cyclically). A copy holds
//! each key's encoded state as the changelog has it, so keeping it costs about the
//! state's encoded size and no session is decoded until the copy becomes a task.

use crate::error::RunError;
use crate::runtime::kafka::restore::Restoring;
use crate::runtime::kafka::task::Task;
use sessionizer_connectors::kafka::KafkaSettings;
use sessionizer_connectors::kafka::TopicPartition;
use sessionizer_connectors::kafka::changelog::Tail;
use sessionizer_connectors::kafka::consumer::{GroupConsumer, Member};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How often the group's membership is asked for.
const REFRESH: Duration = Duration::from_secs(2);
/// How long a copy no longer followed is kept (its partition may be about to come to
/// this process) before it is dropped.
const KEEP_UNFOLLOWED: Duration = Duration::from_secs(60);
/// Records applied to the copies per round of the job's loop, at most.
const PER_ROUND: usize = 20_000;

/// The partitions whose copies member `me` keeps, with `replicas` copies per partition.
pub(super) fn standby_set(members: &[Member], me: &str, replicas: usize) -> Vec<TopicPartition> {
    let mut ids: Vec<&str> = members.iter().map(|m| m.client_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let Some(mine) = ids.iter().position(|id| *id == me) else {
        return Vec::new();
    };
    let n = ids.len();
    let copies = replicas.min(n.saturating_sub(1));
    let mut out = Vec::new();
    for m in members {
        let Some(owner) = ids.iter().position(|id| *id == m.client_id) else {
            continue;
        };
        if (1..=copies).any(|k| (owner + k) % n == mine) {
            out.extend_from_slice(&m.partitions);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The copies this process keeps.
#[derive(Debug)]
pub(super) struct Standbys {
    replicas: usize,
    me: String,
    tail: Tail,
    changelogs: Vec<String>,
    copies: HashMap<TopicPartition, Restoring>,
    /// Since when each copy is no longer followed.
    unfollowed: HashMap<TopicPartition, Instant>,
    /// Partitions whose changelog held a record a copy could not apply: not copied
    /// again (the restore of such a partition reports the damage).
    broken: std::collections::HashSet<TopicPartition>,
    /// The partitions whose changelogs are followed now.
    followed: Vec<TopicPartition>,
    last_refresh: Option<Instant>,
    /// Changelog records applied to copies.
    pub(super) applied: u64,
}

impl Standbys {
    pub(super) fn new(
        settings: &KafkaSettings,
        replicas: usize,
        me: &str,
        changelogs: &[String],
    ) -> Result<Standbys, RunError> {
        Ok(Standbys {
            replicas,
            me: me.to_string(),
            tail: Tail::new(settings)?,
            changelogs: changelogs.to_vec(),
            copies: HashMap::new(),
            unfollowed: HashMap::new(),
            broken: Default::default(),
            followed: Vec::new(),
            last_refresh: None,
            applied: 0,
        })
    }

    /// Makes the next [`refresh`](Self::refresh) ask the group again (after a rebalance).
    pub(super) fn stale(&mut self) {
        self.last_refresh = None;
    }

    /// The partitions with a copy.
    pub(super) fn copied(&self) -> Vec<TopicPartition> {
        let mut v: Vec<TopicPartition> = self.copies.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Now and then: asks the group who owns what, and follows the changelogs of the
    /// partitions this process should keep copies of (never those it owns).
    pub(super) fn refresh<O>(
        &mut self,
        consumer: &GroupConsumer,
        owned: &BTreeMap<TopicPartition, Task<O>>,
    ) -> Result<(), RunError> {
        if self.last_refresh.is_some_and(|t| t.elapsed() < REFRESH) {
            return Ok(());
        }
        self.last_refresh = Some(Instant::now());
        let members = consumer.members()?;
        let wanted: Vec<TopicPartition> = standby_set(&members, &self.me, self.replicas)
            .into_iter()
            .filter(|tp| !owned.contains_key(tp) && !self.broken.contains(tp))
            .collect();
        // A copy no longer wanted is kept a while, no longer followed: the group may be
        // about to hand its partition to this process (its owner just left the member
        // list), and a copy that stands behind is still a valid start — the restore
        // reads the changelog on from where it stands. Then it is dropped: its memory
        // back, and never a copy so old that compaction removed tombstones it missed.
        // Copies of partitions this process owns were handed over already.
        let now = Instant::now();
        for tp in self.copies.keys() {
            if !wanted.contains(tp) {
                self.unfollowed.entry(*tp).or_insert(now);
            }
        }
        let copies = &mut self.copies;
        self.unfollowed.retain(|tp, since| {
            let keep = !wanted.contains(tp) && copies.contains_key(tp);
            if keep && since.elapsed() > KEEP_UNFOLLOWED {
                copies.remove(tp);
                return false;
            }
            keep
        });
        for tp in &wanted {
            self.copies.entry(*tp).or_insert_with(|| Restoring {
                source: "standby",
                ..Restoring::default()
            });
        }
        if self.followed != wanted {
            let names: Vec<String> = wanted
                .iter()
                .map(|tp| format!("{}/{}", self.changelogs[tp.topic as usize], tp.partition))
                .collect();
            tracing::info!(changelogs = ?names, "standby copies followed");
            self.followed = wanted.clone();
        }
        let follow: Vec<(String, i32, Option<i64>)> = wanted
            .iter()
            .map(|tp| {
                let at = self.copies.get(tp).and_then(|c| c.offset);
                (self.changelogs[tp.topic as usize].clone(), tp.partition, at)
            })
            .collect();
        self.tail.follow(&follow)?;
        Ok(())
    }

    /// Applies what the followed changelogs got since the last call.
    pub(super) fn poll(&mut self) -> Result<(), RunError> {
        let Standbys {
            tail,
            copies,
            changelogs,
            applied,
            ..
        } = self;
        let mut failed: Option<(TopicPartition, String)> = None;
        let n = tail.poll(
            PER_ROUND,
            Duration::ZERO,
            |topic, partition, offset, entry| {
                let Some(t) = changelogs.iter().position(|c| c == topic) else {
                    return;
                };
                let tp = TopicPartition {
                    topic: t as u32,
                    partition,
                };
                if let Some(copy) = copies.get_mut(&tp) {
                    if let Err(e) = copy.apply(entry) {
                        failed.get_or_insert((tp, format!("{topic}/{partition}@{offset}: {e}")));
                    }
                    copy.offset = Some(offset + 1);
                }
            },
        )?;
        *applied += n as u64;
        if n > 0 {
            tracing::debug!(records = n, "standby copies updated");
        }
        if let Some((tp, e)) = failed {
            // A copy that cannot be kept is dropped, and not started again: the
            // partition would be restored from its changelog, which reports the damage
            // itself.
            copies.remove(&tp);
            self.broken.insert(tp);
            self.last_refresh = None;
            tracing::warn!(error = %e, "standby copy dropped");
        }
        Ok(())
    }

    /// Hands over the copy of a partition this process now owns.
    pub(super) fn take(&mut self, tp: TopicPartition) -> Option<Restoring> {
        self.copies.remove(&tp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: 0,
            partition: p,
        }
    }

    fn member(id: &str, parts: &[i32]) -> Member {
        Member {
            client_id: id.into(),
            partitions: parts.iter().map(|&p| tp(p)).collect(),
        }
    }

    #[test]
    fn copies_go_to_the_next_members_in_order() {
        let members = [
            member("c", &[4]),
            member("a", &[0, 1]),
            member("b", &[2, 3]),
        ];
        // Order a, b, c: a's partitions are copied by b, b's by c, c's by a.
        assert_eq!(standby_set(&members, "b", 1), vec![tp(0), tp(1)]);
        assert_eq!(standby_set(&members, "c", 1), vec![tp(2), tp(3)]);
        assert_eq!(standby_set(&members, "a", 1), vec![tp(4)]);
        // Two copies: every member copies the other two's partitions.
        assert_eq!(standby_set(&members, "a", 2), vec![tp(2), tp(3), tp(4)]);
        // More copies than members: one fewer than the members.
        assert_eq!(standby_set(&members, "a", 5), vec![tp(2), tp(3), tp(4)]);
        // Alone, or not a member (yet): nothing to copy.
        assert_eq!(standby_set(&[member("a", &[0])], "a", 1), vec![]);
        assert_eq!(standby_set(&members, "z", 1), vec![]);
        // A member without partitions still keeps copies.
        let members = [member("a", &[0, 1, 2]), member("b", &[])];
        assert_eq!(standby_set(&members, "b", 1), vec![tp(0), tp(1), tp(2)]);
        assert_eq!(standby_set(&members, "a", 1), vec![]);
    }
}
