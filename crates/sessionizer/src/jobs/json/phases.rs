//! The phases of a batch — decode, sessionize, merge — and the steps without input:
//! moving the watermark on while a live input is quiet, and the end-of-input flush.

use super::Job;
use super::parse::{self, Parsed};
use super::shard::Shard;
use crate::config::OnInvalid;
use crate::error::RunError;
use crate::runtime::kafka_sink::Side;
use crate::runtime::tagged::Tag;
use crate::runtime::{END_PART, Padded, merge_by, merge_order};
use crate::telemetry::Telemetry;
use sessionizer_connectors::Batch;
use sessionizer_core::Watermark;
use sessionizer_core::decode::Decoder;
use std::time::Instant;

/// Where a completion record of the end of input goes in the merged output.
fn position<'a>(s: &'a Shard, t: &Tag) -> (i64, &'a [u8], i64) {
    t.place.completion(s.out.key(t))
}

impl<'c> Job<'c> {
    /// Moves every shard's watermark to `w` while a live input is quiet, and writes out
    /// what became due.
    pub(super) fn advance_idle(
        &mut self,
        w: Watermark,
        step: u64,
        telemetry: &Telemetry,
    ) -> Result<(), RunError> {
        if w <= self.shards[0].op.watermark() {
            return Ok(());
        }
        let moved = Instant::now();
        for s in &mut self.shards {
            s.clear_outputs();
        }
        self.pool
            .on_each(&mut self.shards, |_, s| s.advance_idle(w, step));
        self.check_state_stores()?;
        self.merge()?;
        // A live reader is waiting for these: write them out now.
        for w in [&mut self.sessions, &mut self.late] {
            w.finish()?;
        }
        telemetry.sessions_completed(self.completed(), moved);
        if self.topics.is_none() {
            telemetry.outputs_written();
        }
        telemetry.batch(&[self.report()]);
        Ok(())
    }

    /// Stops the run when a shard's spill store failed: before anything the step
    /// emitted is written (a key that could not be read back was taken for a new one).
    pub(super) fn check_state_stores(&mut self) -> Result<(), RunError> {
        for s in &mut self.shards {
            if let Some(e) = s.op.take_spill_error() {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Phase one: decode the batch's lines, in parallel ranges.
    pub(super) fn decode(&mut self, batch: &Batch) -> Result<(), RunError> {
        let n = batch.lines.len();
        let ranges = self.parsed.len();
        let per = n.div_ceil(ranges).max(1);
        let on_invalid = self.cfg.on_invalid;
        let settings = parse::ParseSettings {
            aggregates: self.cfg.aggregates.len(),
            shards: self.shards.len(),
            on_invalid,
            names: &self.names,
            max_record: self.cfg.max_record,
        };
        let work = |(i, (decoder, out)): (usize, (&mut Padded<Decoder>, &mut Parsed))| {
            let range = (i * per).min(n)..((i + 1) * per).min(n);
            parse::parse_range(batch, range, decoder, settings, out);
        };
        match self.pool.pool() {
            Some(pool) => {
                use rayon::prelude::*;
                let (decoders, parsed) = (&mut self.decoders, &mut self.parsed);
                pool.install(|| {
                    decoders
                        .par_iter_mut()
                        .zip(parsed.par_iter_mut())
                        .enumerate()
                        .for_each(work)
                });
            }
            None => work((0, (&mut self.decoders[0], &mut self.parsed[0]))),
        }

        let (mut blank, mut invalid, mut read) = (0, 0, 0);
        for part in &self.parsed {
            if let Some((line, reason)) = &part.first_invalid {
                let span = batch.lines[*line as usize];
                return Err(RunError::InvalidRecord {
                    position: self.names[span.input as usize].pos(span.at).to_string(),
                    reason: reason.clone(),
                });
            }
            blank += part.blank;
            invalid += part.invalid;
            read += part.recs.len() as u64 - part.blank;
            if on_invalid == OnInvalid::DeadLetter {
                match &mut self.topics {
                    Some(t) if t.routes(Side::DeadLetter) => {
                        t.side(Side::DeadLetter, &part.dead)?
                    }
                    _ => self.dead.append(&part.dead, part.invalid)?,
                }
            }
        }
        // Counted once the batch is sure to be sessionized: a run stopped by a closed
        // output reports counts that add up.
        self.stats.blank_lines += blank;
        self.stats.invalid += invalid;
        self.stats.records_read += read;
        self.stats.bytes_read = batch.consumed;
        Ok(())
    }

    /// Phase two: every shard runs the batch.
    pub(super) fn sessionize(&mut self, batch: &Batch, first_step: u64) {
        let parsed = &self.parsed[..];
        let names = &self.names[..];
        for s in &mut self.shards {
            s.clear_outputs();
        }
        let process = |_, s: &mut Shard| s.process(batch, parsed, first_step, names);
        self.pool.on_each(&mut self.shards, process);
    }

    /// The end of a bounded input: the watermark becomes +infinity and every session is
    /// emitted, in rounds of at most [`END_PART`] sessions per shard written out as they
    /// go, so that memory does not grow with the number of sessions still open.
    ///
    /// Each shard emits its sessions in `(close, key, start)` order. With several
    /// shards, a round writes every record up to the smallest last record of a shard
    /// with more to come — nothing any shard emits later sorts before it — and keeps the
    /// others for the next round; a shard holding more than half a part sits a round
    /// out. So the merged output is exactly that of one operator, for any number of
    /// workers, and each shard holds at most one and a half parts.
    pub(super) fn flush_at_end(&mut self, telemetry: &Telemetry) -> Result<(), RunError> {
        let ended = Instant::now();
        for s in &mut self.shards {
            s.clear_outputs();
            s.ending = true;
        }
        while self.shards.iter().any(|s| s.ending) {
            let round = |_, s: &mut Shard| {
                if s.ending && s.out.tags.len() <= END_PART / 2 {
                    s.ending = s.finish_part(END_PART);
                }
            };
            self.pool.on_each(&mut self.shards, round);
            self.check_state_stores()?;
            let completed = self.shards.iter_mut();
            let completed = completed.map(|s| std::mem::take(&mut s.out.completed));
            telemetry.sessions_completed(completed.sum(), ended);
            self.merge_end_part()?;
        }
        Ok(())
    }

    /// Writes the records of a round of [`flush_at_end`](Self::flush_at_end) that no
    /// later record can precede, and drops them from the shards.
    fn merge_end_part(&mut self) -> Result<(), RunError> {
        if let [only] = &mut self.shards[..] {
            match &mut self.topics {
                Some(t) => t.sessions(&only.out)?,
                None => {
                    let records = only.out.encoder.records;
                    self.sessions.append(&only.out.encoder.buf, records)?;
                }
            }
            only.out.clear();
            return Ok(());
        }
        let shards = &self.shards;
        // Everything up to the last record of every shard with more to come is known.
        let Some(written) = crate::runtime::end_part_lens(
            shards.len(),
            |s| shards[s].ending,
            |s| shards[s].out.tags.len(),
            |s, t| position(&shards[s], &shards[s].out.tags[t]),
        ) else {
            return Ok(()); // A shard emits in the next round.
        };
        // Each shard's records come by position; keys differ across shards, so no
        // two records are equal.
        merge_by(&mut self.order, &written, |(sa, ta), (sb, tb)| {
            let (a, b) = (&shards[sa], &shards[sb]);
            position(a, &a.out.tags[ta]).cmp(&position(b, &b.out.tags[tb]))
        });
        for &(si, ti) in &self.order {
            let t = &shards[si].out.tags[ti];
            match &mut self.topics {
                Some(topics) => topics.session(&shards[si].out, t)?,
                None => {
                    let (from, len) = t.bytes;
                    self.sessions
                        .append(&shards[si].out.encoder.buf[from..from + len], 1)?;
                }
            }
        }
        for (s, n) in self.shards.iter_mut().zip(written) {
            s.out.drop_front(n);
        }
        Ok(())
    }

    /// Phase three: the shards' records in the order of one operator.
    pub(super) fn merge(&mut self) -> Result<(), RunError> {
        if let [only] = &mut self.shards[..] {
            let lates = only.late_steps.len() as u64;
            match &mut self.topics {
                Some(t) => {
                    t.sessions(&only.out)?;
                    if t.routes(Side::Late) {
                        t.side(Side::Late, &only.late)?;
                    } else {
                        self.late.append(&only.late, lates)?;
                    }
                }
                None => {
                    let records = only.out.encoder.records;
                    self.sessions.append(&only.out.encoder.buf, records)?;
                    self.late.append(&only.late, lates)?;
                }
            }
            return Ok(());
        }
        let shards = &self.shards;
        merge_order(
            &mut self.order,
            shards.iter().map(|s| s.out.tags.len()),
            |si, ti| shards[si].out.tags[ti].place,
            |si, ti| shards[si].out.key(&shards[si].out.tags[ti]),
        );
        for &(si, ti) in &self.order {
            let t = &shards[si].out.tags[ti];
            match &mut self.topics {
                Some(topics) => topics.session(&shards[si].out, t)?,
                None => {
                    let buf = &shards[si].out.encoder.buf;
                    let (from, len) = t.bytes;
                    self.sessions.append(&buf[from..from + len], 1)?;
                }
            }
        }

        let mut lates: Vec<(u64, usize, usize)> = Vec::new();
        for (si, s) in shards.iter().enumerate() {
            lates.extend((0..s.late_steps.len()).map(|i| (s.late_steps[i].0, si, i)));
        }
        lates.sort_unstable();
        for (_, si, i) in lates {
            let (_, from, len) = shards[si].late_steps[i];
            let record = &shards[si].late[from..from + len];
            match &mut self.topics {
                Some(t) if t.routes(Side::Late) => t.side(Side::Late, record)?,
                _ => self.late.append(record, 1)?,
            }
        }
        Ok(())
    }
}
