//! Which events of a batch each shard must walk. A shard's operator changes only
//! through the events of its own keys, its watermark and its largest gap. So besides
//! its own events it needs only the *peaks*: the events that raise the largest mark
//! (event time, or the watermark after the event) or the largest gap seen so far in the
//! batch. Any other event of another shard's key cannot move its watermark or largest gap
//! (a peak listed before it already did) and is skipped. One worker lists every event.

/// Per shard, the indexes of a batch's events it walks, in input order.
#[derive(Debug, Default)]
pub(crate) struct Walks {
    shards: Vec<Vec<u32>>,
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
        if let [only] = &mut self.shards[..] {
            only.push(at); // one shard walks every event: no peaks to track
            return;
        }
        let gap_peak = gap.is_some_and(|g| g > self.max_gap);
        if mark > self.max_mark || gap_peak {
            self.max_mark = self.max_mark.max(mark);
            self.max_gap = self.max_gap.max(gap.unwrap_or(i64::MIN));
            for w in &mut self.shards {
                w.push(at);
            }
        } else {
            self.shards[owner as usize].push(at);
        }
    }

    /// The events shard `shard` walks.
    pub fn of(&self, shard: u32) -> &[u32] {
        &self.shards[shard as usize]
    }
}
