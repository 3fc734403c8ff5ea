//! Which events of a batch each shard must walk. A shard's operator changes only
//! through the events of its own keys, its watermark and its largest gap. So besides
//! its own events it needs only the *peaks*: the events that raise the largest mark
//! (event time, or the watermark after the event) or the largest gap seen so far in the
//! batch. Any other event of another shard's key cannot move its watermark or largest gap
//! (a peak listed before it already did) and is skipped. One worker lists every event.

use sessionizer_core::{DurationMs, Watermark};

/// One event of a shard's walk: what deciding whether it concerns the shard takes,
/// kept beside its index so that a shard reads the record itself (written by another
/// worker's decode, often on another core) only for the events of its own keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    /// The event's index in the batch (or decode range).
    pub at: u32,
    /// The shard that owns its key.
    pub owner: u32,
    /// Its time, or the watermark after it (what the job listed).
    pub mark: i64,
    /// Its own gap; [`NO_GAP`]: the job's gap.
    pub gap: i64,
}

/// [`Step::gap`] of an event without a gap of its own.
pub(crate) const NO_GAP: i64 = i64::MIN;

impl Step {
    /// The event's own gap, if it has one.
    #[inline]
    pub fn own_gap(&self) -> Option<DurationMs> {
        (self.gap != NO_GAP).then_some(DurationMs(self.gap))
    }
}

/// Per shard, the events of a batch it walks, in input order.
#[derive(Debug, Default)]
pub(crate) struct Walks {
    shards: Vec<Vec<Step>>,
    max_mark: i64,
    max_gap: i64,
}

impl Walks {
    /// Starts a batch (or a decode range) for `shards` shards; keeps the lists' memory.
    pub fn start(&mut self, shards: usize) {
        self.shards.resize_with(shards, Vec::new);
        for w in &mut self.shards {
            w.clear();
        }
        (self.max_mark, self.max_gap) = (i64::MIN, i64::MIN);
    }

    /// Lists event `at` of the key of shard `owner`, with its time or watermark `mark`
    /// and its own gap (`None`: the job's gap, which every operator starts from): in the
    /// owner's walk, and in every shard's if it is a peak.
    #[inline]
    pub fn list(&mut self, at: u32, owner: u32, mark: i64, gap: Option<i64>) {
        let step = Step {
            at,
            owner,
            mark,
            gap: gap.unwrap_or(NO_GAP),
        };
        if let [only] = &mut self.shards[..] {
            only.push(step); // one shard walks every event: no peaks to track
            return;
        }
        let gap_peak = gap.is_some_and(|g| g > self.max_gap);
        if mark > self.max_mark || gap_peak {
            self.max_mark = self.max_mark.max(mark);
            self.max_gap = self.max_gap.max(gap.unwrap_or(i64::MIN));
            for w in &mut self.shards {
                w.push(step);
            }
        } else {
            self.shards[owner as usize].push(step);
        }
    }

    /// The events shard `shard` walks.
    pub fn of(&self, shard: u32) -> &[Step] {
        &self.shards[shard as usize]
    }
}

/// One event of a shard's walk, as [`walk`] needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walked {
    /// The shard that owns its key.
    pub owner: u32,
    /// Its gap.
    pub gap: DurationMs,
    /// The job's watermark after it.
    pub watermark: Watermark,
}

/// A shard's operator and the batch it walks, seen by [`walk`].
pub(crate) trait Walker {
    /// Event `step` of the batch (a shard's copy of the job's watermark strategy
    /// observes its time here).
    fn event(&mut self, step: &Step) -> Walked;
    /// The operator's watermark.
    fn watermark(&self) -> Watermark;
    /// Judges and applies event `at`, of one of this shard's keys.
    fn apply(&mut self, at: u32);
    /// Hears the gap of another shard's event: final bounds are kept for the largest.
    fn hear_gap(&mut self, gap: DurationMs);
    /// Advances the operator to `to`, what it emits caused by event `at`.
    fn advance(&mut self, at: u32, to: Watermark);
    /// The events after the current one (to ask for their state ahead).
    #[inline]
    fn ahead(&mut self, _later: &[Step]) {}
}

/// Walks shard `me`'s events of a batch ([`Walks::of`]), the rule of every job: the
/// shard judges and applies the events of its own keys, hears the gaps of the others,
/// and advances its operator whenever the watermark moves past its own (or after an
/// event of its own) — so its watermark sequence is that of one operator over every
/// event, and it emits, for its keys, just what that operator would.
#[inline]
pub(crate) fn walk(me: u32, events: &[Step], shard: &mut impl Walker) {
    for (j, step) in events.iter().enumerate() {
        shard.ahead(&events[j + 1..]);
        let e = shard.event(step);
        let mine = e.owner == me;
        if mine {
            shard.apply(step.at);
        } else {
            shard.hear_gap(e.gap);
        }
        if mine || e.watermark > shard.watermark() {
            shard.advance(step.at, e.watermark);
        }
    }
}
