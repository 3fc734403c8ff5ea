//! The byte-at-a-time scanner: the portable path of [`Extractor::scan`], and the one
//! that words the error when the structural pass rejects a line.

use super::strings::validate_escape;
use super::{Extractor, HI, JsonError, JsonKind, LO, MAX_DEPTH, MAX_PATHS, Span, kind, syntax};

impl Extractor {
    /// [`scan`](Extractor::scan) one byte at a time: the portable path, and the one that
    /// finds the exact error when the structural pass rejects a line.
    pub(super) fn scan_bytewise(
        &self,
        line: &[u8],
        found: &mut [Option<Span>],
    ) -> Result<(), JsonError> {
        let mut sc = Scanner {
            s: line,
            ex: self,
            found,
            high: 0,
            escaped: false,
            err: JsonError::TooDeep,
        };
        let result = sc.document();
        if (result.is_err() || sc.high & HI != 0)
            && let Err(e) = std::str::from_utf8(line)
        {
            return Err(JsonError::NotUtf8 {
                offset: e.valid_up_to(),
            });
        }
        result
    }
}

/// A mask whose lowest set bit (if any) marks the first byte of `x` (little endian) that
/// is `"`, `\` or below 0x20. Higher bits may be false positives; the lowest is exact.
#[inline(always)]
fn special_mask(x: u64) -> u64 {
    #[inline(always)]
    fn has_zero(v: u64) -> u64 {
        v.wrapping_sub(LO) & !v & HI
    }
    let quote = has_zero(x ^ (LO * u64::from(b'"')));
    let backslash = has_zero(x ^ (LO * u64::from(b'\\')));
    let control = x.wrapping_sub(LO * 0x20) & !x & HI;
    quote | backslash | control
}

#[inline(always)]
fn is_ws(b: u8) -> bool {
    b == b' ' || b == b'\n' || b == b'\r' || b == b'\t'
}

/// The index of the first non-whitespace byte at or after `i`.
#[inline(always)]
fn skip_ws(s: &[u8], i: usize) -> usize {
    match s.get(i) {
        Some(&b) if b <= b' ' => skip_ws_slow(s, i),
        _ => i,
    }
}

#[inline(never)]
fn skip_ws_slow(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(|&b| is_ws(b)) {
        i += 1;
    }
    i
}

/// The scanner's state for one line. The hot functions take and return the position
/// (`Option<usize>`, `None` on error with the error stored in `err`) so that it stays in a
/// register.
struct Scanner<'a, 'f> {
    s: &'a [u8],
    ex: &'a Extractor,
    found: &'f mut [Option<Span>],
    /// OR of the string bytes seen, to know whether any was non-ASCII.
    high: u64,
    /// Set when a string with an escape was scanned.
    escaped: bool,
    /// The error, when a function returned `None`.
    err: JsonError,
}

impl Scanner<'_, '_> {
    #[cold]
    #[inline(never)]
    fn fail(&mut self, offset: usize, what: &'static str) -> Option<usize> {
        self.err = JsonError::NotJson { offset, what };
        None
    }

    #[cold]
    #[inline(never)]
    fn too_deep(&mut self) -> Option<usize> {
        self.err = JsonError::TooDeep;
        None
    }

    fn document(&mut self) -> Result<(), JsonError> {
        let s = self.s;
        let i = skip_ws(s, 0);
        let Some(&first) = s.get(i) else {
            return Err(syntax(i, "empty line, expected a JSON object"));
        };
        let all = if self.ex.n_paths == MAX_PATHS {
            u64::MAX
        } else {
            (1u64 << self.ex.n_paths) - 1
        };
        let end = match first {
            b'{' => self.object(i + 1, 0, all),
            b'[' => self.array(i + 1, 0),
            _ => self.scalar(i),
        };
        let Some(end) = end else {
            return Err(self.err);
        };
        let end = skip_ws(s, end);
        if end != s.len() {
            return Err(syntax(end, "unexpected characters after the JSON value"));
        }
        match kind(&[first]) {
            JsonKind::Object => Ok(()),
            k => Err(JsonError::NotObject {
                found: k.describe(),
            }),
        }
    }

    /// A string, number or literal at `i`; the index after it.
    #[inline(always)]
    fn scalar(&mut self, i: usize) -> Option<usize> {
        match self.s.get(i) {
            Some(b'"') => self.string(i + 1),
            Some(b'-' | b'0'..=b'9') => self.number(i),
            Some(b't') => self.literal(i, b"true"),
            Some(b'f') => self.literal(i, b"false"),
            Some(b'n') => self.literal(i, b"null"),
            Some(_) => self.fail(i, "expected a JSON value"),
            None => self.fail(i, "unexpected end of line, expected a JSON value"),
        }
    }

    /// Any value at `i` inside a container at nesting `depth`; the index after it.
    #[inline(always)]
    fn value(&mut self, i: usize, depth: usize, active: u64) -> Option<usize> {
        match self.s.get(i) {
            Some(b'{') => {
                if depth + 1 >= MAX_DEPTH - 1 {
                    return self.too_deep();
                }
                self.object(i + 1, depth + 1, active)
            }
            Some(b'[') => {
                if depth + 1 >= MAX_DEPTH - 1 {
                    return self.too_deep();
                }
                self.array(i + 1, depth + 1)
            }
            _ => self.scalar(i),
        }
    }

    #[inline(always)]
    fn literal(&mut self, i: usize, lit: &'static [u8]) -> Option<usize> {
        if self.s.get(i..i + lit.len()) == Some(lit) {
            Some(i + lit.len())
        } else {
            self.fail(i, "expected a JSON value (true, false or null?)")
        }
    }

    /// The members of an object whose `{` was just before `i`, at path depth `depth`;
    /// `active` holds the paths that may continue here. Returns the index after `}`.
    fn object(&mut self, i: usize, depth: usize, active: u64) -> Option<usize> {
        let s = self.s;
        let mut i = skip_ws(s, i);
        if s.get(i) == Some(&b'}') {
            return Some(i + 1);
        }
        loop {
            if s.get(i) != Some(&b'"') {
                return self.fail(i, "expected a string as object key");
            }
            let key_start = i + 1;
            self.escaped = false;
            i = self.string(key_start)?;
            let hit = if active == 0 {
                0
            } else {
                self.ex
                    .match_key(depth, s, key_start, i - 1, self.escaped, active)
            };
            i = skip_ws(s, i);
            if s.get(i) != Some(&b':') {
                return self.fail(i, "expected ':' after object key");
            }
            i = skip_ws(s, i + 1);
            if hit == 0 {
                i = self.value(i, depth, 0)?;
            } else {
                i = self.matched_value(i, depth, hit)?;
            }
            i = skip_ws(s, i);
            match s.get(i) {
                Some(b',') => i = skip_ws(s, i + 1),
                Some(b'}') => return Some(i + 1),
                _ => return self.fail(i, "expected ',' or '}' after object member"),
            }
        }
    }

    /// The value at `i` of a member whose name matched the paths `hit`.
    #[inline(never)]
    fn matched_value(&mut self, i: usize, depth: usize, hit: u64) -> Option<usize> {
        // A repeated member replaces the earlier one, with everything below it.
        let mut m = hit;
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            m &= m - 1;
            self.found[b] = None;
        }
        let ends = self.ex.levels.get(depth).map_or(0, |l| l.ends) & hit;
        let end = self.value(i, depth, hit & !ends)?;
        let span = Some(Span {
            start: i as u32,
            end: end as u32,
        });
        let mut m = ends;
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            m &= m - 1;
            self.found[b] = span;
        }
        Some(end)
    }

    /// The elements of an array whose `[` was just before `i`, at nesting `depth`.
    fn array(&mut self, i: usize, depth: usize) -> Option<usize> {
        let s = self.s;
        let mut i = skip_ws(s, i);
        if s.get(i) == Some(&b']') {
            return Some(i + 1);
        }
        loop {
            i = self.value(i, depth, 0)?;
            i = skip_ws(s, i);
            match s.get(i) {
                Some(b',') => i = skip_ws(s, i + 1),
                Some(b']') => return Some(i + 1),
                _ => return self.fail(i, "expected ',' or ']' after array element"),
            }
        }
    }

    /// A string whose opening quote was just before `i`; the index after the closing
    /// quote. Escapes, control characters and the end of the line go to the slow path.
    #[inline(always)]
    fn string(&mut self, mut i: usize) -> Option<usize> {
        let s = self.s;
        while let Some(chunk) = s.get(i..).and_then(<[u8]>::first_chunk::<8>) {
            let x = u64::from_le_bytes(*chunk);
            self.high |= x;
            let m = special_mask(x);
            if m != 0 {
                let bit = m.trailing_zeros();
                let k = (bit / 8) as usize;
                if (x >> (bit & !7)) as u8 == b'"' {
                    return Some(i + k + 1);
                }
                return self.string_slow(i + k);
            }
            i += 8;
        }
        self.string_slow(i)
    }

    /// The rest of a string from `i`, one byte at a time.
    #[inline(never)]
    fn string_slow(&mut self, mut i: usize) -> Option<usize> {
        let s = self.s;
        loop {
            let Some(&b) = s.get(i) else {
                return self.fail(i, "unterminated string");
            };
            self.high |= u64::from(b);
            match b {
                b'"' => return Some(i + 1),
                b'\\' => {
                    self.escaped = true;
                    match validate_escape(s, i) {
                        Ok(next) => i = next,
                        Err(e) => {
                            self.err = e;
                            return None;
                        }
                    }
                }
                0..=0x1f => return self.fail(i, "control character in string (must be escaped)"),
                _ => i += 1,
            }
        }
    }

    #[inline(always)]
    fn number(&mut self, mut i: usize) -> Option<usize> {
        let s = self.s;
        if s.get(i) == Some(&b'-') {
            i += 1;
        }
        match s.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                i += 1;
                while s.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return self.fail(i, "expected a digit in number"),
        }
        match s.get(i) {
            Some(b'.' | b'e' | b'E') => self.number_tail(i),
            _ => Some(i),
        }
    }

    /// Fraction and exponent of a number, from `i` at `.`, `e` or `E`.
    #[inline(never)]
    fn number_tail(&mut self, mut i: usize) -> Option<usize> {
        let s = self.s;
        if s.get(i) == Some(&b'.') {
            i += 1;
            if !s.get(i).is_some_and(u8::is_ascii_digit) {
                return self.fail(i, "expected a digit after the decimal point");
            }
            while s.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        if matches!(s.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(s.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !s.get(i).is_some_and(u8::is_ascii_digit) {
                return self.fail(i, "expected a digit in the exponent");
            }
            while s.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_mask_finds_first() {
        let cases: &[(&[u8; 8], Option<usize>)] = &[
            (b"abcdefgh", None),
            (b"abc\"efgh", Some(3)),
            (b"\\bcdefgh", Some(0)),
            (b"abcdefg\n", Some(7)),
            (b"\x01\"\\\x00\x1f\x7f\xff\x80", Some(0)),
            (b"\xff\xfe\x80\x7f\x20!#\"", Some(7)),
        ];
        for (bytes, want) in cases {
            let m = special_mask(u64::from_le_bytes(**bytes));
            let got = (m != 0).then(|| (m.trailing_zeros() / 8) as usize);
            assert_eq!(got, *want, "{bytes:?}");
        }
    }
}
