//! The fast path of [`Extractor::scan`]: a structural pass in the manner of simdjson
//! (stage 1, 64 bytes at a time; [`simd`](super::simd) classifies the bytes) that lists
//! the positions of the line's tokens, then a walk over that list (stage 2) that checks
//! the grammar and records the wanted spans.
//!
//! It answers only "valid object, here are the spans" or "not sure": any error, and the
//! rare valid lines it does not handle (nesting at the depth limit), make
//! [`Extractor::scan`] run the byte-at-a-time scanner, which then finds the exact error
//! and offset. So the reasons of invalid records are those of that scanner, by
//! construction, and the fast path only has to be right about what it accepts: exactly
//! the lines that scanner accepts, with the same spans (the tests check both on random
//! and mutated lines, at every SIMD level the CPU has and the portable one).
//!
//! # Stage 1
//!
//! For each 64-byte block (the last one padded with spaces) it computes, one bit per
//! byte: the escaped bytes (those after an odd run of backslashes), the unescaped quotes,
//! the bytes inside strings (a prefix XOR of the quotes, carried across blocks), and from
//! them the *tokens*: every opening quote, every structural character outside strings,
//! and the first byte of every run of other non-whitespace bytes outside strings (a
//! number or literal, or garbage). Closing quotes are not tokens: a string is one token,
//! and only whitespace can stand between its closing quote and the next token. A control
//! character inside a string, an invalid escape sequence, an unterminated string or
//! invalid UTF-8 (checked only when a byte of 0x80 or above was seen) end the fast path
//! here.
//!
//! # Stage 2
//!
//! Objects on a path are walked recursively: member names are matched against the
//! paths, and the values on a path get their spans. Other containers are only checked.
//! Every token is checked against the byte it points at. A scalar is parsed from its
//! first byte, and the byte after it must be whitespace, a structural character, a quote
//! or the end of the line: so every byte outside strings is whitespace or belongs to a
//! token that was checked.

use super::simd::{Level, Masks};
use super::strings::{has_backslash, validate_escape};
use super::{Extractor, MAX_DEPTH, MAX_PATHS, Span};

/// Bit `i` of the result is bit `0 ^ 1 ^ ... ^ i` of `x` (the SIMD levels use a
/// carry-less multiplication instead).
#[inline(always)]
pub(super) fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// Writes `base` plus the index of every set bit of `bits` to `out`, in order; their
/// number. (Entries past it may be overwritten.)
#[inline(always)]
pub(super) fn flatten(mut bits: u64, base: u32, out: &mut [u32; 64]) -> usize {
    let mut k = 0;
    while bits != 0 {
        out[k & 63] = base + bits.trailing_zeros();
        bits &= bits - 1;
        k += 1;
    }
    k
}

/// What stage 1 learnt besides the tokens.
pub(super) struct Stage1 {
    /// The number of tokens.
    count: usize,
    /// Whether the line holds a backslash (so a member name may need unescaping).
    backslash: bool,
}

/// The escaped bytes of the block at `start` of `s`, whose backslashes are `backslash`;
/// `carry` is 1 when the block's first byte is escaped, and is set for the next block.
/// Checks every escape sequence that starts at or after `checked_until` (advancing it):
/// `false` when one is invalid.
#[inline(never)]
fn escapes(
    s: &[u8],
    start: usize,
    backslash: u64,
    carry: &mut u64,
    checked_until: &mut usize,
) -> (u64, bool) {
    let mut escaped = *carry;
    *carry = 0;
    // A backslash that is itself escaped escapes nothing.
    let mut escapers = backslash & !escaped;
    let mut ok = true;
    while escapers != 0 {
        let i = escapers.trailing_zeros();
        let at = start + i as usize;
        // (The second half of a surrogate pair was checked with the first.)
        if at >= *checked_until {
            match validate_escape(s, at) {
                Ok(next) => *checked_until = next,
                Err(_) => ok = false,
            }
        }
        if i == 63 {
            *carry = 1;
            break;
        }
        escaped |= 1 << (i + 1);
        // This backslash and the byte it escapes.
        escapers &= !(3u64 << i);
    }
    (escaped, ok)
}

/// Writes the positions of the tokens of `s` to `idx` (grown as needed); `None` when
/// the line is certainly invalid. `classify` is one of [`simd`](super::simd)'s
/// classifications: this function is inlined into a copy per SIMD level, compiled with
/// that level's CPU features ([`Level::stage1`]).
#[inline(always)]
pub(super) fn stage1(
    s: &[u8],
    idx: &mut Vec<u32>,
    classify: impl Fn(&[u8; 64]) -> Masks,
    prefix_xor: impl Fn(u64) -> u64,
    flatten: impl Fn(u64, u32, &mut [u32; 64]) -> usize,
) -> Option<Stage1> {
    // Room for every byte to be a token, and for a whole block more.
    if idx.len() < s.len() + 64 {
        idx.resize(s.len() + 64, 0);
    }
    let mut count = 0;
    let mut in_string = 0u64;
    let mut escaped_carry = 0u64;
    let mut scalar_carry = 0u64;
    let mut checked_until = 0usize;
    let mut backslash = false;
    let mut high = 0u64;
    let mut ctrl_in_string = 0u64;
    let mut start = 0;
    while start < s.len() {
        let m = match s.get(start..start + 64).map(<&[u8; 64]>::try_from) {
            // Straight from the line: a copy to the stack would stall the wide load.
            Some(Ok(block)) => classify(block),
            _ => {
                let mut buf = [b' '; 64];
                let rest = s.get(start..).unwrap_or_default();
                buf[..rest.len()].copy_from_slice(rest);
                classify(&buf)
            }
        };
        let escaped = if m.backslash | escaped_carry == 0 {
            0
        } else {
            backslash = true;
            let (escaped, ok) = escapes(
                s,
                start,
                m.backslash,
                &mut escaped_carry,
                &mut checked_until,
            );
            if !ok {
                return None;
            }
            escaped
        };
        let quote = m.quote & !escaped;
        let in_str = prefix_xor(quote) ^ in_string;
        in_string = ((in_str as i64) >> 63) as u64;
        ctrl_in_string |= m.ctrl & in_str;
        high |= m.high;
        let outside = !in_str;
        let scalar = !(m.op | m.ws | quote) & outside;
        // (`rotate_left` rather than shifts: LLVM turns a shifted movemask into a
        // shuffle of one-bit lanes, which AVX2 code does one bit at a time.)
        let rotated = scalar.rotate_left(1);
        let scalar_start = scalar & !((rotated & !1) | scalar_carry);
        scalar_carry = rotated & 1;
        // An opening quote is inside its string.
        let bits = (m.op & outside) | (quote & in_str) | scalar_start;
        let out: &mut [u32; 64] = idx.get_mut(count..count + 64)?.try_into().ok()?;
        count += flatten(bits, start as u32, out);
        start += 64;
    }
    if ctrl_in_string != 0 || in_string != 0 || (high != 0 && std::str::from_utf8(s).is_err()) {
        return None;
    }
    Some(Stage1 { count, backslash })
}

/// Stage 2: the walk over the tokens. The cursor (the index of the next token to take)
/// is passed and returned by value, so that it stays in a register across the calls of
/// the recursion, and the walk itself is never written to.
struct Walk<'a> {
    s: &'a [u8],
    ex: &'a Extractor,
    /// The token positions.
    idx: &'a [u32],
    /// Whether the line holds a backslash.
    backslash: bool,
}

/// Whether `b` may follow a scalar: whitespace, a structural character, a quote.
#[inline(always)]
fn ends_scalar(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\n' | b'\r' | b',' | b'}' | b']' | b':' | b'{' | b'[' | b'"'
    )
}

#[inline(always)]
fn digits(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// The end of the number at `i` (RFC 8259 grammar), or `None`.
#[inline(always)]
fn number_end(s: &[u8], mut i: usize) -> Option<usize> {
    if s.get(i) == Some(&b'-') {
        i += 1;
    }
    match s.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(s, i + 1),
        _ => return None,
    }
    if s.get(i) == Some(&b'.') {
        if !s.get(i + 1).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        i = digits(s, i + 1);
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !s.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        i = digits(s, i);
    }
    Some(i)
}

impl Walk<'_> {
    /// Token `i`: its position and byte.
    #[inline(always)]
    fn token(&self, i: usize) -> Option<(usize, u8)> {
        let p = *self.idx.get(i)? as usize;
        Some((p, *self.s.get(p)?))
    }

    /// The byte of token `i`.
    #[inline(always)]
    fn byte(&self, i: usize) -> Option<u8> {
        Some(self.token(i)?.1)
    }

    /// The index after the closing quote of the string whose opening quote at `p` is the
    /// token before token `next`: the last byte before token `next` that is not
    /// whitespace.
    #[inline(always)]
    fn string_end(&self, p: usize, next: usize) -> Option<usize> {
        let mut end = *self.idx.get(next)? as usize;
        // Most often the next token follows the closing quote.
        if end > p + 1 && self.s.get(end - 1) == Some(&b'"') {
            return Some(end);
        }
        while end > p + 1 && matches!(self.s.get(end - 1), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            end -= 1;
        }
        (end > p + 1 && self.s.get(end - 1) == Some(&b'"')).then_some(end)
    }

    /// The end of the number or literal whose first byte `c` is at `p`.
    #[inline(always)]
    fn scalar(&self, p: usize, c: u8) -> Option<usize> {
        let s = self.s;
        let end = match c {
            b't' if s.get(p..p + 4) == Some(b"true") => p + 4,
            b'f' if s.get(p..p + 5) == Some(b"false") => p + 5,
            b'n' if s.get(p..p + 4) == Some(b"null") => p + 4,
            b'-' | b'0'..=b'9' => number_end(s, p)?,
            _ => return None,
        };
        s.get(end).is_none_or(|&b| ends_scalar(b)).then_some(end)
    }

    /// Checks the object whose `{` is the token before token `i`, at nesting `depth`;
    /// the index of the token after its `}`.
    fn skip_object(&self, mut i: usize, depth: usize) -> Option<usize> {
        let mut c = self.byte(i)?;
        if c == b'}' {
            return Some(i + 1);
        }
        loop {
            // A member name (one token), then `:`.
            if c != b'"' || self.byte(i + 1)? != b':' {
                return None;
            }
            let (v, vc) = self.token(i + 2)?;
            i = self.other_value(i + 3, v, vc, depth)?;
            match self.byte(i)? {
                b',' => {
                    c = self.byte(i + 1)?;
                    i += 1;
                }
                b'}' => return Some(i + 1),
                _ => return None,
            }
        }
    }

    /// Checks the array whose `[` is the token before token `i`, at nesting `depth`; the
    /// index of the token after its `]`.
    fn skip_array(&self, mut i: usize, depth: usize) -> Option<usize> {
        let (mut p, mut c) = self.token(i)?;
        if c == b']' {
            return Some(i + 1);
        }
        loop {
            i = self.other_value(i + 1, p, c, depth)?;
            match self.byte(i)? {
                b',' => {
                    (p, c) = self.token(i + 1)?;
                    i += 1;
                }
                b']' => return Some(i + 1),
                _ => return None,
            }
        }
    }

    /// Checks a value no path wants, whose first token `(p, c)` is the token before
    /// token `i`, in a container at nesting `depth`; the index of the token after it.
    #[inline(always)]
    fn other_value(&self, i: usize, p: usize, c: u8, depth: usize) -> Option<usize> {
        match c {
            // A string is one token.
            b'"' => Some(i),
            b'{' | b'[' if depth + 1 >= MAX_DEPTH - 1 => None,
            b'{' => self.skip_object(i, depth + 1),
            b'[' => self.skip_array(i, depth + 1),
            _ => self.scalar(p, c).map(|_| i),
        }
    }

    /// The index after the closing bracket of a container whose last token is the one
    /// before token `next`.
    #[inline(always)]
    fn container_end(&self, next: usize) -> Option<usize> {
        Some(*self.idx.get(next.checked_sub(1)?)? as usize + 1)
    }

    /// The members of an object on a path whose `{` is the token before token `i`, at
    /// nesting `depth`, where the paths `active` continue; the index of the token after
    /// its `}`.
    fn object(
        &self,
        found: &mut [Option<Span>],
        mut i: usize,
        depth: usize,
        active: u64,
    ) -> Option<usize> {
        let s = self.s;
        let level = self.ex.levels.get(depth);
        let (mut p, mut c) = self.token(i)?;
        if c == b'}' {
            return Some(i + 1);
        }
        loop {
            if c != b'"' {
                return None;
            }
            // The member name's closing quote is right before its `:` (token `i + 1`).
            let key_end = self.string_end(p, i + 1)? - 1;
            let hit = match level {
                Some(level) => {
                    let escaped = self.backslash && has_backslash(s.get(p + 1..key_end)?);
                    level.match_name(s, p + 1, key_end, escaped, active)
                }
                None => 0,
            };
            if self.byte(i + 1)? != b':' {
                return None;
            }
            let (v, vc) = self.token(i + 2)?;
            i = if hit == 0 {
                self.other_value(i + 3, v, vc, depth)?
            } else {
                let ends = level.map_or(0, |l| l.ends) & hit;
                if vc == b'"' && ends == hit {
                    // The common case inline: a string that ends every path it is on
                    // (so nothing below it needs clearing).
                    let span = Some(Span {
                        start: v as u32,
                        end: self.string_end(v, i + 3)? as u32,
                    });
                    let mut m = hit;
                    while m != 0 {
                        *found.get_mut(m.trailing_zeros() as usize)? = span;
                        m &= m - 1;
                    }
                    i + 3
                } else {
                    self.matched_value(found, i + 3, v, vc, depth, hit, ends)?
                }
            };
            match self.byte(i)? {
                b',' => {
                    (p, c) = self.token(i + 1)?;
                    i += 1;
                }
                b'}' => return Some(i + 1),
                _ => return None,
            }
        }
    }

    /// The value of a member whose name matched the paths `hit` (of which `ends` end
    /// here), whose first token `(p, c)` is the token before token `i`; the index of the
    /// token after it.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn matched_value(
        &self,
        found: &mut [Option<Span>],
        i: usize,
        p: usize,
        c: u8,
        depth: usize,
        hit: u64,
        ends: u64,
    ) -> Option<usize> {
        // A repeated member replaces the earlier one, with everything below it.
        let mut m = hit;
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            m &= m - 1;
            *found.get_mut(b)? = None;
        }
        let active = hit & !ends;
        let (next, end) = match c {
            b'"' => (i, self.string_end(p, i)?),
            b'{' | b'[' if depth + 1 >= MAX_DEPTH - 1 => return None,
            b'{' if active != 0 => {
                let next = self.object(found, i, depth + 1, active)?;
                (next, self.container_end(next)?)
            }
            b'{' => {
                let next = self.skip_object(i, depth + 1)?;
                (next, self.container_end(next)?)
            }
            b'[' => {
                let next = self.skip_array(i, depth + 1)?;
                (next, self.container_end(next)?)
            }
            _ => (i, self.scalar(p, c)?),
        };
        let span = Some(Span {
            start: p as u32,
            end: end as u32,
        });
        let mut m = ends;
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            m &= m - 1;
            *found.get_mut(b)? = span;
        }
        Some(next)
    }
}

/// Scans `line` for `ex`'s paths with the structural pass at `level`, listing the
/// tokens in `idx` (scratch space, grown as needed). `Some` when the line is a valid
/// JSON object (then `found` holds the spans, exactly as the byte-at-a-time scanner
/// would set them), holding whether the line has a backslash; `None` when it is not
/// valid, or when this pass leaves the line to that scanner. `found` must hold
/// `ex.len()` entries, all `None`.
pub(super) fn scan(
    ex: &Extractor,
    level: Level,
    line: &[u8],
    found: &mut [Option<Span>],
    idx: &mut Vec<u32>,
) -> Option<bool> {
    let st = level.stage1(line, idx)?;
    let w = Walk {
        s: line,
        ex,
        idx: idx.get(..st.count).unwrap_or_default(),
        backslash: st.backslash,
    };
    let all = if ex.n_paths == MAX_PATHS {
        u64::MAX
    } else {
        (1u64 << ex.n_paths) - 1
    };
    let end = match w.byte(0) {
        Some(b'{') if all != 0 => w.object(found, 1, 0, all),
        Some(b'{') => w.skip_object(1, 0),
        _ => None,
    };
    (end == Some(st.count)).then_some(st.backslash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::FieldPath;
    use proptest::prelude::*;

    fn extractor(paths: &[&str]) -> Extractor {
        let paths: Vec<FieldPath> = paths
            .iter()
            .map(|p| FieldPath::parse(p).expect("valid path"))
            .collect();
        Extractor::new(&paths)
    }

    /// At every level this CPU supports, the structural pass accepts `line` exactly when
    /// the byte-at-a-time scanner does, with the same spans.
    fn check(ex: &Extractor, line: &[u8]) -> Result<(), TestCaseError> {
        let mut want = vec![None; ex.len()];
        let verdict = ex.scan_bytewise(line, &mut want);
        for level in Level::all_supported() {
            let mut got = vec![None; ex.len()];
            let answer = scan(ex, level, line, &mut got, &mut Vec::new());
            let ok = answer.is_some();
            if let Some(backslash) = answer {
                prop_assert_eq!(backslash, line.contains(&b'\\'), "{:?}", level);
            }
            prop_assert_eq!(
                ok,
                verdict.is_ok(),
                "{:?} on {:?}: byte-at-a-time says {:?}",
                level,
                String::from_utf8_lossy(line),
                verdict
            );
            if ok {
                prop_assert_eq!(
                    &got,
                    &want,
                    "{:?} on {:?}",
                    level,
                    String::from_utf8_lossy(line)
                );
            }
        }
        Ok(())
    }

    fn check_all(ex: &Extractor, line: &[u8]) {
        if let Err(e) = check(ex, line) {
            panic!("{e}");
        }
    }

    const VISIT: &str = r#"{"visit_id":"v-000000980-2370","event_time":"2024-01-01T00:00:00.012Z","user_id":"u-00881","page":"/","referrer":"https://www.google.com/","event_id":"e-507584e8b7a8","duration_ms":14583,"context":{"user":{"login":"user881","country":"CA","plan":"free"},"device":{"type":"mobile","os":"Android 13","browser":"Samsung Internet 25"},"app":{"version":"3.14.1","lang":"en-CA"}}}"#;

    fn visit_extractor() -> Extractor {
        extractor(&[
            "visit_id",
            "event_time",
            "page",
            "context.user.login",
            "context.app",
            "duration_ms",
        ])
    }

    #[test]
    fn visit_line_is_accepted_with_the_same_spans() {
        let ex = visit_extractor();
        check_all(&ex, VISIT.as_bytes());
        for level in Level::all_supported() {
            let mut found = vec![None; ex.len()];
            assert_eq!(
                scan(&ex, level, VISIT.as_bytes(), &mut found, &mut Vec::new()),
                Some(false),
                "{level:?}"
            );
            let text = |i: usize| found[i].map(|s| &VISIT[s.range()]);
            assert_eq!(text(0), Some("\"v-000000980-2370\""));
            assert_eq!(text(2), Some("\"/\""));
            assert_eq!(text(3), Some("\"user881\""));
            assert_eq!(text(4), Some(r#"{"version":"3.14.1","lang":"en-CA"}"#));
            assert_eq!(text(5), Some("14583"));
        }
    }

    /// Escapes, scalars and strings placed across every offset of a block boundary.
    #[test]
    fn tokens_across_block_boundaries() {
        let ex = extractor(&["p", "q", "a\\b"]);
        let bodies: &[&str] = &[
            r#""\\""#,
            r#""\\\\""#,
            r#""\"""#,
            r#""\\\"""#,
            r#""x\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\y""#,
            r#""\ud83d\ude00""#,
            r#""\u00e9\/\b\f\n\r\t""#,
            r#""\ud83d""#,
            r#""\ud83d\u0041""#,
            r#""\x""#,
            r#""\u12g4""#,
            "\"a\x01b\"",
            "\"\u{e9}\"",
            "\"\u{1F600}\"",
            "\"\u{80}\"",
            "\"\u{7f}\"",
            "12345",
            "-0.5e+10",
            "01",
            "1.",
            "true",
            "truex",
            "nul",
            "[1,[2,{\"q\":3}],\"]\"]",
            "{\"q\":{},\"q\":[]}",
            "\"unterminated",
        ];
        for body in bodies {
            for pad in 0..140 {
                let x = "x".repeat(pad);
                for line in [
                    format!(r#"{{"s":"{x}","p":{body}}}"#),
                    format!(r#"{{"s":"{x}","a\\b":{body},"q":1}}"#),
                    format!(r#"{{"{x}":0, "p" : {body} , "q":[{body}]}}"#),
                    format!("{{\"s\":\"{x}\",\"p\":{body}"),
                    format!("{x}{{\"p\":{body}}}"),
                    format!("{{\"p\":{body}}}{x}"),
                ] {
                    check_all(&ex, line.as_bytes());
                }
            }
        }
    }

    /// A repeated member whose value is a string (taken inline by the walk) or not.
    #[test]
    fn repeated_members_with_string_values() {
        let ex = extractor(&["a", "b", "b.c", "d.e"]);
        for line in [
            r#"{"a":"s","a":"t"}"#,
            r#"{"a":{"z":1},"a":"s"}"#,
            r#"{"a":"s","a":{"z":1}}"#,
            r#"{"a":"s","a":7}"#,
            r#"{"b":{"c":"x"},"b":"s"}"#,
            r#"{"b":"s","b":{"c":"x"}}"#,
            r#"{"d":{"e":"x"},"d":{"e":"y","e":{}}}"#,
            r#"{"a":"s" , "a" : "t\"" }"#,
        ] {
            check_all(&ex, line.as_bytes());
        }
    }

    #[test]
    fn nesting_at_the_limit() {
        let ex = extractor(&["a.a.a"]);
        for n in [1, 2, 62, 63, 64, 65, 125, 126, 127, 128, 129, 200] {
            for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
                let line = format!("{{\"a\":{}1{}}}", open.repeat(n - 1), close.repeat(n - 1));
                check_all(&ex, line.as_bytes());
            }
        }
    }

    #[test]
    fn whitespace_and_garbage_between_tokens() {
        let ex = extractor(&["a", "b"]);
        for line in [
            " \t\r\n{ \"a\" : 1 , \"b\" : [ ] } \n",
            "{\"a\":1 2}",
            "{\"a\":1\x0c}",
            "{\"a\":1,\x0c\"b\":2}",
            "{\"a\":1;}",
            "{\"a\" \"b\":1}",
            "{\"a\":1}}",
            "{\"a\":1} x",
            "{\"a\":\\\"1\"}",
            "{\"a\":1}\x00",
            "{\"a\":tru\x1ae}",
            "{\"a\":\u{a0}1}",
            "\u{feff}{\"a\":1}",
            "{\"a\":[1,]}",
            "{\"a\":[,1]}",
            "{\"a\":{\"b\":}}",
            "{\"a\":}",
            "{:1}",
            "{\"a\"}",
            "[]",
            "\"a\"",
            "",
            "{",
        ] {
            check_all(&ex, line.as_bytes());
        }
    }

    /// A line and a few byte edits of it.
    fn mutated(base: &'static str) -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => proptest::sample::select(&b"{}[]\":,\\ 0123456789.eE+-tfnulrux\t\n"[..]),
            1 => any::<u8>(),
        ];
        let edit = (any::<proptest::sample::Index>(), 0u8..3, byte);
        proptest::collection::vec(edit, 1..4).prop_map(move |edits| {
            let mut line = base.as_bytes().to_vec();
            for (at, op, b) in edits {
                let i = at.index(line.len() + 1);
                match op {
                    0 if i < line.len() => {
                        line.remove(i);
                    }
                    1 if i < line.len() => line[i] = b,
                    _ => line.insert(i, b),
                }
            }
            line
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn mutated_visit_lines_agree(line in mutated(VISIT)) {
            check(&visit_extractor(), &line)?;
        }

        #[test]
        fn arbitrary_bytes_agree(line in proptest::collection::vec(any::<u8>(), 0..200)) {
            check(&extractor(&["a", "b.c"]), &line)?;
        }

        #[test]
        fn json_alphabet_agrees(
            line in proptest::collection::vec(
                proptest::sample::select(&b"{}[]\":,\\ \t0123456789.eE+-aeflnrstu/bfx\xc3\xa9\x01"[..]),
                0..300,
            )
        ) {
            let mut line = line;
            line.insert(0, b'{');
            check(&extractor(&["a", "a.a", "\\"]), &line)?;
        }
    }
}
