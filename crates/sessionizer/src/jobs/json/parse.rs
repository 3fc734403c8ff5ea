//! Phase one of a batch: decode lines into compact records, in parallel over contiguous
//! ranges of the batch, and list, per shard, the records that shard must walk. Nothing
//! here depends on the watermark or on records of other ranges.

use crate::config::OnInvalid;
use crate::runtime::{Walks, shard_of};
use sessionizer_connectors::Batch;
use sessionizer_connectors::encode::{SourceName, encode_dead_letter};
use sessionizer_connectors::input::too_large_reason;
use sessionizer_core::decode::Decoder;

/// What a line turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Blank,
    Invalid,
    Valid,
}

/// One decoded line. Byte ranges point into the batch's data, or into the range's key
/// arena for keys that had to be unescaped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rec {
    pub kind: Kind,
    /// Index of the line in the batch.
    pub line: u32,
    pub key_in_arena: bool,
    pub key: (u32, u32),
    pub shard: u32,
    /// The key's hash in its shard's keyed store
    /// ([`key_hash`](sessionizer_window::keyed::key_hash)), computed here in parallel.
    pub hash: u64,
    pub time: i64,
    pub gap: Option<i64>,
    pub dedup: Option<u128>,
    /// Index of this record's first aggregate value in [`Parsed::values`].
    pub values_at: u32,
}

/// The decoded records of one contiguous range of a batch (each range's written by its
/// own worker: on cache lines of its own, see [`Padded`](crate::runtime::Padded)).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Parsed {
    pub recs: Vec<Rec>,
    /// Per valid record, one span per aggregate (`None`: missing or null).
    pub values: Vec<Option<(u32, u32)>>,
    pub key_arena: Vec<u8>,
    /// Encoded dead-letter records, in input order.
    pub dead: Vec<u8>,
    pub invalid: u64,
    pub blank: u64,
    /// The first invalid record of the range: (line index, reason), for `--on-invalid fail`.
    pub first_invalid: Option<(u32, String)>,
    /// Per shard, the indexes into [`recs`](Self::recs) of the valid records it walks:
    /// those whose key it owns, and those that raise the range's largest time or
    /// per-event gap.
    pub walks: Walks,
}

/// Where `part` sits inside `whole`, if it does.
fn offset_in(whole: &[u8], part: &[u8]) -> Option<u32> {
    let off = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
    (off <= whole.len() && part.len() <= whole.len() - off).then_some(off as u32)
}

/// Why a line is not a valid event.
enum Reason {
    /// Longer than the record size limit (its whole length).
    TooLarge(u64),
    Invalid(sessionizer_core::decode::Invalid),
}

/// What decoding needs to know besides the lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParseSettings<'a> {
    pub aggregates: usize,
    pub shards: usize,
    pub on_invalid: OnInvalid,
    /// Display names of the inputs, for dead-letter positions.
    pub names: &'a [SourceName],
    /// The record size limit, for the reason of a record above it.
    pub max_record: usize,
}

/// Decodes lines `range` of `batch`.
pub(crate) fn parse_range(
    batch: &Batch,
    range: std::ops::Range<usize>,
    decoder: &mut Decoder,
    settings: ParseSettings<'_>,
    out: &mut Parsed,
) {
    let ParseSettings {
        aggregates,
        shards,
        on_invalid,
        names,
        max_record,
    } = settings;
    out.recs.clear();
    out.values.clear();
    out.key_arena.clear();
    out.dead.clear();
    out.invalid = 0;
    out.blank = 0;
    out.first_invalid = None;
    out.walks.start(shards);
    let data = &batch.data[..];
    for i in range {
        let bytes = batch.line(i);
        let mut rec = Rec {
            kind: Kind::Blank,
            line: i as u32,
            key_in_arena: false,
            key: (0, 0),
            shard: 0,
            hash: 0,
            time: 0,
            gap: None,
            dedup: None,
            values_at: out.values.len() as u32,
        };
        let oversized = batch.oversized_len(i);
        if oversized.is_none() && bytes.trim_ascii().is_empty() {
            out.blank += 1;
            out.recs.push(rec);
            continue;
        }
        let decoded = match oversized {
            Some(len) => Err(Reason::TooLarge(len)),
            None => decoder.decode(bytes).map_err(Reason::Invalid),
        };
        match decoded {
            Err(reason) => {
                rec.kind = Kind::Invalid;
                out.invalid += 1;
                let text = || match reason {
                    Reason::TooLarge(len) => too_large_reason(len, max_record),
                    Reason::Invalid(e) => e.to_string(),
                };
                match on_invalid {
                    OnInvalid::Skip => {}
                    OnInvalid::Fail => {
                        if out.first_invalid.is_none() {
                            out.first_invalid = Some((i as u32, text()));
                        }
                    }
                    OnInvalid::DeadLetter => {
                        let span = batch.lines[i];
                        let pos = names[span.input as usize].pos(span.at);
                        encode_dead_letter(&mut out.dead, &text(), pos, bytes);
                    }
                }
            }
            Ok(d) => {
                rec.kind = Kind::Valid;
                rec.time = d.time.millis();
                rec.gap = d.gap.map(|g| g.millis());
                rec.dedup = d.dedup;
                rec.shard = shard_of(d.key, shards);
                rec.hash = sessionizer_window::keyed::key_hash(d.key);
                match offset_in(data, d.key) {
                    Some(off) => rec.key = (off, d.key.len() as u32),
                    None => {
                        rec.key_in_arena = true;
                        rec.key = (out.key_arena.len() as u32, d.key.len() as u32);
                        out.key_arena.extend_from_slice(d.key);
                    }
                }
                for v in 0..aggregates {
                    out.values.push(
                        d.value(v).and_then(|raw| {
                            offset_in(data, raw).map(|off| (off, raw.len() as u32))
                        }),
                    );
                }
                let at = out.recs.len() as u32;
                out.walks.list(at, rec.shard, rec.time, rec.gap);
            }
        }
        out.recs.push(rec);
    }
}
