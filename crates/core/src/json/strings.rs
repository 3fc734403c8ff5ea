//! JSON string escapes, and the helpers that work on the raw text of a string value:
//! its content without escapes, decoded, or written with escapes.

use super::{HI, JsonError, LO, syntax};

#[inline]
fn hex4(s: &[u8], i: usize) -> Option<u32> {
    let h = s.get(i..i + 4)?;
    let mut v = 0u32;
    for &b in h {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u32::from(d);
    }
    Some(v)
}

/// Decodes the escape at `s[i] == b'\\'`: the code point and the index after the escape.
#[inline]
fn decode_escape(s: &[u8], i: usize) -> Result<(char, usize), JsonError> {
    let c = match s.get(i + 1) {
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(b'u') => {
            let Some(hi) = hex4(s, i + 2) else {
                return Err(syntax(i, "expected 4 hex digits after \\u"));
            };
            if (0xDC00..=0xDFFF).contains(&hi) {
                return Err(syntax(i, "lone low surrogate in \\u escape"));
            }
            if (0xD800..=0xDBFF).contains(&hi) {
                if s.get(i + 6) != Some(&b'\\') || s.get(i + 7) != Some(&b'u') {
                    return Err(syntax(i, "lone high surrogate in \\u escape"));
                }
                let Some(lo) = hex4(s, i + 8) else {
                    return Err(syntax(i + 6, "expected 4 hex digits after \\u"));
                };
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return Err(syntax(i, "lone high surrogate in \\u escape"));
                }
                let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                let c = char::from_u32(cp).ok_or_else(|| syntax(i, "invalid \\u escape"))?;
                return Ok((c, i + 12));
            }
            let c = char::from_u32(hi).ok_or_else(|| syntax(i, "invalid \\u escape"))?;
            return Ok((c, i + 6));
        }
        Some(_) => return Err(syntax(i, "invalid escape in string")),
        None => return Err(syntax(i, "unterminated string")),
    };
    Ok((c, i + 2))
}

#[inline]
pub(super) fn validate_escape(s: &[u8], i: usize) -> Result<usize, JsonError> {
    match s.get(i + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
        _ => decode_escape(s, i).map(|(_, next)| next),
    }
}

/// Whether the raw (escaped, unquoted) string content `raw` decodes to `target`.
pub(super) fn eq_unescaped(raw: &[u8], target: &[u8]) -> bool {
    let mut i = 0;
    let mut t = 0;
    while let Some(&b) = raw.get(i) {
        if b != b'\\' {
            if target.get(t) != Some(&b) {
                return false;
            }
            i += 1;
            t += 1;
            continue;
        }
        let Ok((c, next)) = decode_escape(raw, i) else {
            return false;
        };
        let mut buf = [0u8; 4];
        let enc = c.encode_utf8(&mut buf).as_bytes();
        if target.get(t..t + enc.len()) != Some(enc) {
            return false;
        }
        t += enc.len();
        i = next;
    }
    t == target.len()
}

/// Whether `s` holds a backslash (eight bytes at a time: short strings are the common case,
/// where a call to `memchr` costs more than the search).
#[inline]
pub(super) fn has_backslash(s: &[u8]) -> bool {
    const BACKSLASHES: u64 = LO * b'\\' as u64;
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or_default()) ^ BACKSLASHES;
        if x.wrapping_sub(LO) & !x & HI != 0 {
            return true;
        }
    }
    chunks.remainder().contains(&b'\\')
}

/// The content of a raw JSON string (with quotes) when it has no escapes, borrowed from
/// `raw_with_quotes`; `None` when it has a backslash or is not a quoted string.
#[inline]
pub fn string_content(raw_with_quotes: &[u8]) -> Option<&[u8]> {
    let inner = raw_with_quotes.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if has_backslash(inner) {
        None
    } else {
        Some(inner)
    }
}

/// Appends the decoded content of a raw JSON string (with quotes) to `out`: escapes are
/// resolved, surrogate pairs combined into one UTF-8 character. A lone surrogate, a bad
/// escape, a raw control character or missing quotes are errors (offsets are relative to
/// `raw_with_quotes`). Non-ASCII bytes are copied as they are (the line was UTF-8).
pub fn unescape_string(raw_with_quotes: &[u8], out: &mut Vec<u8>) -> Result<(), JsonError> {
    let n = raw_with_quotes.len();
    if n < 2 || raw_with_quotes[0] != b'"' || raw_with_quotes[n - 1] != b'"' {
        return Err(syntax(0, "expected a quoted string"));
    }
    let s = &raw_with_quotes[..n - 1];
    let mut i = 1;
    while i < s.len() {
        let rest = &s[i..];
        let run = memchr::memchr(b'\\', rest).unwrap_or(rest.len());
        let plain = &rest[..run];
        if let Some(p) = plain.iter().position(|&b| b < 0x20 || b == b'"') {
            return Err(syntax(
                i + p,
                "unescaped control character or quote in string",
            ));
        }
        out.extend_from_slice(plain);
        i += run;
        if i < s.len() {
            let (c, next) = decode_escape(s, i)?;
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            i = next;
        }
    }
    Ok(())
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` (UTF-8 text) as a JSON string with quotes, escaping `"`, `\` and control
/// characters (`\n`, `\r`, `\t`, `\b`, `\f`, others as `\u00XX`).
pub fn write_json_string(s: &[u8], out: &mut Vec<u8>) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq_unescaped_cases() {
        assert!(eq_unescaped(br"visit\u005fid", b"visit_id"));
        assert!(eq_unescaped(br"a\/b", b"a/b"));
        assert!(!eq_unescaped(br"a\/b", b"a/bc"));
        assert!(!eq_unescaped(br"a\/bc", b"a/b"));
        assert!(eq_unescaped(br"\ud83d\ude00", "😀".as_bytes()));
    }
}
