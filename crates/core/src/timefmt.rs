//! Text forms of times and durations: RFC 3339 timestamps, epoch numbers and humane
//! durations (`1h30m`).
//!
//! All functions here are allocation-free except the ones that return a `String`
//! ([`format_rfc3339_ms`], [`format_duration`]) and the error paths of [`parse_duration`].

use crate::time::{DurationMs, EventTime};
use std::fmt;

const MS_PER_SEC: i64 = 1_000;
const MS_PER_MIN: i64 = 60 * MS_PER_SEC;
const MS_PER_HOUR: i64 = 60 * MS_PER_MIN;
const MS_PER_DAY: i64 = 24 * MS_PER_HOUR;

/// The longest duration [`parse_duration`] accepts: 100 years of 365.25 days.
pub const MAX_DURATION: DurationMs = DurationMs(36_525 * MS_PER_DAY);

/// Why a timestamp (RFC 3339 text or epoch number) could not be read.
///
/// The `Display` text is a short human reason such as `month 13 out of range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// The input was empty.
    #[error("empty timestamp")]
    Empty,
    /// A required part was missing or malformed; the payload says what was expected,
    /// e.g. `'T' or space after the date`.
    #[error("expected {0}")]
    Expected(&'static str),
    /// A field was out of its range, e.g. `month 13 out of range`.
    #[error("{field} {value} out of range")]
    OutOfRange {
        /// The field's name (`month`, `hour`, `offset minutes`, ...).
        field: &'static str,
        /// The value as written.
        value: u32,
    },
    /// The day does not exist in that month (`day 30 out of range for 2023-02`).
    #[error("day {day} out of range for {year:04}-{month:02}")]
    DayOutOfRange {
        /// Year as written.
        year: u32,
        /// Month as written (1-12).
        month: u32,
        /// Day as written.
        day: u32,
    },
    /// Second 60 (a leap second) was written; it has no representation in epoch time.
    #[error("second 60 (a leap second) is not supported; seconds must be 0-59")]
    LeapSecond,
    /// Something followed a complete timestamp.
    #[error("unexpected characters after the timestamp")]
    Trailing,
    /// An epoch value was not a number (JSON number grammar).
    #[error("not a number")]
    NotANumber,
    /// An epoch value does not fit in an `i64` of milliseconds.
    #[error("number out of range for epoch {}", unit.plural())]
    EpochOutOfRange {
        /// The unit the number was read in (the `--time-format`).
        unit: EpochUnit,
    },
}

// ---------------------------------------------------------------------------------------
// Calendar arithmetic (Howard Hinnant's algorithms, proleptic Gregorian calendar).
// ---------------------------------------------------------------------------------------

/// Days since 1970-01-01 of the civil date `y-m-d` (`m` 1-12, `d` 1-31).
#[inline]
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The civil date `(year, month, day)` of a day number since 1970-01-01.
#[inline]
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[inline]
fn is_leap(y: u32) -> bool {
    y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400))
}

#[inline]
fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// ---------------------------------------------------------------------------------------
// RFC 3339 parsing
// ---------------------------------------------------------------------------------------

/// Reads exactly `N` ASCII digits at `pos`.
#[inline(always)]
fn digits<const N: usize>(s: &[u8], pos: usize, what: &'static str) -> Result<u32, TimeError> {
    let Some(chunk) = s.get(pos..pos + N) else {
        return Err(TimeError::Expected(what));
    };
    let mut v = 0u32;
    for &b in chunk {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return Err(TimeError::Expected(what));
        }
        v = v * 10 + u32::from(d);
    }
    Ok(v)
}

#[inline(always)]
fn expect_byte(s: &[u8], pos: usize, b: u8, what: &'static str) -> Result<(), TimeError> {
    if s.get(pos) == Some(&b) {
        Ok(())
    } else {
        Err(TimeError::Expected(what))
    }
}

/// Parses an RFC 3339 / ISO-8601 timestamp into milliseconds since the epoch.
///
/// Accepted: `YYYY-MM-DDTHH:MM:SS[.fraction][Z|z|±HH:MM|±HHMM|±HH]`, with `T`, `t` or one
/// space between date and time, and also a bare date `YYYY-MM-DD` (midnight UTC). No zone
/// means UTC. The fraction may have any number of digits (at least one); digits beyond
/// milliseconds are dropped, which rounds toward negative infinity also before 1970.
/// Years are 0000-9999; month, day (leap years included), hour (0-23), minute and second
/// (0-59; a leap second 60 is rejected) and the offset (hours <= 23, minutes <= 59) are
/// checked.
///
/// ```
/// use sessionizer_core::timefmt::parse_timestamp;
/// let t = parse_timestamp(b"2024-01-01T00:03:00.250+01:00").unwrap();
/// assert_eq!(t.millis(), 1_704_063_780_250);
/// ```
pub fn parse_timestamp(s: &[u8]) -> Result<EventTime, TimeError> {
    let [year, month, day, hour, minute, second] = match fixed_prefix(s) {
        Some(fields) => fields,
        None => return parse_timestamp_slow(s),
    };
    check_date(year, month, day)?;
    check_time(hour, minute, second)?;
    let days = days_from_civil(i64::from(year), month, day);
    finish_timestamp(s, days, hour, minute, second)
}

/// The date of the last timestamp that [`parse_timestamp_cached`] found valid, and its
/// day number: the events of one stream mostly fall on the day of the event before.
#[derive(Debug, Clone, Copy, Default)]
pub struct DateCache {
    /// Bytes 0..8 (`YYYY-MM-`) and 8..10 (`DD`) of that timestamp, little endian; both 0
    /// while empty (a valid date is digits and dashes).
    head: u64,
    day: u16,
    days: i64,
}

/// [`parse_timestamp`], the same result and the same errors, with the day number of a
/// date equal to the one `cache` holds taken from there instead of checked and computed
/// again.
#[inline]
pub fn parse_timestamp_cached(s: &[u8], cache: &mut DateCache) -> Result<EventTime, TimeError> {
    let Some((head, rest)) = s.split_first_chunk::<8>() else {
        return parse_timestamp_slow(s);
    };
    let Some(day) = rest.first_chunk::<2>() else {
        return parse_timestamp_slow(s);
    };
    let (head, day) = (u64::from_le_bytes(*head), u16::from_le_bytes(*day));
    if head == cache.head && day == cache.day {
        // The date is one already found valid: `fixed_prefix` would accept its bytes and
        // `check_date` pass, so only the time of day is left to check.
        let Some([hour, minute, second]) = fixed_time(s) else {
            return parse_timestamp_slow(s);
        };
        check_time(hour, minute, second)?;
        return finish_timestamp(s, cache.days, hour, minute, second);
    }
    let [year, month, d, hour, minute, second] = match fixed_prefix(s) {
        Some(fields) => fields,
        None => return parse_timestamp_slow(s),
    };
    check_date(year, month, d)?;
    let days = days_from_civil(i64::from(year), month, d);
    *cache = DateCache { head, day, days };
    check_time(hour, minute, second)?;
    finish_timestamp(s, days, hour, minute, second)
}

/// The fields of the fixed-width `YYYY-MM-DDTHH:MM:SS` prefix when all its digits and
/// separators are in place (the common case), checked eight bytes at a time.
#[inline(always)]
fn fixed_prefix(s: &[u8]) -> Option<[u32; 6]> {
    let (digits_at, byte, d) = (digits_in, byte_of, digit_of);
    let p: &[u8; 19] = s.first_chunk::<19>()?;
    let (a, rest) = p.split_first_chunk::<8>()?;
    let (b, _) = rest.split_first_chunk::<8>()?;
    let (_, c) = p.split_last_chunk::<8>()?;
    // a = "YYYY-MM-", b = "DDTHH:MM", c = "HH:MM:SS" (overlapping b).
    let (a, b, c) = (
        u64::from_le_bytes(*a),
        u64::from_le_bytes(*b),
        u64::from_le_bytes(*c),
    );
    let ok = digits_at(a, 0x00FF_FF00_FFFF_FFFF)
        & (byte(a, 4) == b'-')
        & (byte(a, 7) == b'-')
        & digits_at(b, 0xFFFF_00FF_FF00_FFFF)
        & matches!(byte(b, 2), b'T' | b't' | b' ')
        & (byte(b, 5) == b':')
        & digits_at(c, 0xFFFF_0000_0000_0000)
        & (byte(c, 5) == b':');
    if !ok {
        return None;
    }
    Some([
        d(a, 0) * 1000 + d(a, 1) * 100 + d(a, 2) * 10 + d(a, 3),
        d(a, 5) * 10 + d(a, 6),
        d(b, 0) * 10 + d(b, 1),
        d(b, 3) * 10 + d(b, 4),
        d(b, 6) * 10 + d(b, 7),
        d(c, 6) * 10 + d(c, 7),
    ])
}

/// The hour, minute and second of `s` when bytes 8..19 are `DDTHH:MM:SS` with all their
/// digits and separators in place (the checks of [`fixed_prefix`] past the month).
#[inline(always)]
fn fixed_time(s: &[u8]) -> Option<[u32; 3]> {
    let p: &[u8; 19] = s.first_chunk::<19>()?;
    let (_, rest) = p.split_first_chunk::<8>()?;
    let (b, _) = rest.split_first_chunk::<8>()?;
    let (_, c) = p.split_last_chunk::<8>()?;
    let (b, c) = (u64::from_le_bytes(*b), u64::from_le_bytes(*c));
    let ok = digits_in(b, 0xFFFF_00FF_FF00_FFFF)
        & matches!(byte_of(b, 2), b'T' | b't' | b' ')
        & (byte_of(b, 5) == b':')
        & digits_in(c, 0xFFFF_0000_0000_0000)
        & (byte_of(c, 5) == b':');
    ok.then(|| {
        [
            digit_of(b, 3) * 10 + digit_of(b, 4),
            digit_of(b, 6) * 10 + digit_of(b, 7),
            digit_of(c, 6) * 10 + digit_of(c, 7),
        ]
    })
}

/// Whether the bytes of `w` selected by `mask` (0xFF per byte) are all ASCII digits.
#[inline(always)]
fn digits_in(w: u64, mask: u64) -> bool {
    let high = 0xF0F0_F0F0_F0F0_F0F0 & mask;
    let zeros = 0x3030_3030_3030_3030 & mask;
    let six = 0x0606_0606_0606_0606 & mask;
    // 0x30..=0x39 keep their high nibble 3 when 6 is added; 0x3A..=0x3F do not.
    (w & high) == zeros && (w.wrapping_add(six) & high) == zeros
}

#[inline(always)]
fn byte_of(w: u64, i: u32) -> u8 {
    (w >> (8 * i)) as u8
}

/// The value of byte `i` of `w`, an ASCII digit.
#[inline(always)]
fn digit_of(w: u64, i: u32) -> u32 {
    u32::from(byte_of(w, i) & 0x0F)
}

fn check_date(year: u32, month: u32, day: u32) -> Result<(), TimeError> {
    if !(1..=12).contains(&month) {
        return Err(TimeError::OutOfRange {
            field: "month",
            value: month,
        });
    }
    if day == 0 || day > days_in_month(year, month) {
        return Err(TimeError::DayOutOfRange { year, month, day });
    }
    Ok(())
}

fn check_time(hour: u32, minute: u32, second: u32) -> Result<(), TimeError> {
    if hour > 23 {
        return Err(TimeError::OutOfRange {
            field: "hour",
            value: hour,
        });
    }
    if minute > 59 {
        return Err(TimeError::OutOfRange {
            field: "minute",
            value: minute,
        });
    }
    if second == 60 {
        return Err(TimeError::LeapSecond);
    }
    if second > 59 {
        return Err(TimeError::OutOfRange {
            field: "second",
            value: second,
        });
    }
    Ok(())
}

/// Field by field, with a precise error for the first thing that is wrong.
#[cold]
fn parse_timestamp_slow(s: &[u8]) -> Result<EventTime, TimeError> {
    if s.is_empty() {
        return Err(TimeError::Empty);
    }
    let year = digits::<4>(s, 0, "a 4-digit year")?;
    expect_byte(s, 4, b'-', "'-' after the year")?;
    let month = digits::<2>(s, 5, "a 2-digit month")?;
    expect_byte(s, 7, b'-', "'-' after the month")?;
    let day = digits::<2>(s, 8, "a 2-digit day")?;
    check_date(year, month, day)?;
    if s.len() == 10 {
        return Ok(EventTime(
            days_from_civil(i64::from(year), month, day) * MS_PER_DAY,
        ));
    }
    match s[10] {
        b'T' | b't' | b' ' => {}
        _ => return Err(TimeError::Expected("'T' or space after the date")),
    }
    let hour = digits::<2>(s, 11, "a 2-digit hour")?;
    expect_byte(s, 13, b':', "':' after the hour")?;
    let minute = digits::<2>(s, 14, "2-digit minutes")?;
    expect_byte(s, 16, b':', "':' after the minutes")?;
    let second = digits::<2>(s, 17, "2-digit seconds")?;
    check_time(hour, minute, second)?;
    let days = days_from_civil(i64::from(year), month, day);
    finish_timestamp(s, days, hour, minute, second)
}

/// The fraction and zone after a valid `YYYY-MM-DDTHH:MM:SS` prefix whose date is day
/// `days` since the epoch, and the result.
#[inline(always)]
fn finish_timestamp(
    s: &[u8],
    days: i64,
    hour: u32,
    minute: u32,
    second: u32,
) -> Result<EventTime, TimeError> {
    let time_of_day = i64::from(hour) * MS_PER_HOUR
        + i64::from(minute) * MS_PER_MIN
        + i64::from(second) * MS_PER_SEC;
    // The common form `.mmmZ`, at once.
    if let Some(&[b'.', m0, m1, m2, b'Z' | b'z']) = s.get(19..)
        && m0.is_ascii_digit()
        && m1.is_ascii_digit()
        && m2.is_ascii_digit()
    {
        let millis = i64::from(m0 - b'0') * 100 + i64::from(m1 - b'0') * 10 + i64::from(m2 - b'0');
        return Ok(EventTime(days * MS_PER_DAY + time_of_day + millis));
    }
    let mut pos = 19;
    let mut millis = 0i64;
    if s.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while let Some(&b) = s.get(pos) {
            if !b.is_ascii_digit() {
                break;
            }
            if pos - start < 3 {
                millis = millis * 10 + i64::from(b - b'0');
            }
            pos += 1;
        }
        let n = pos - start;
        if n == 0 {
            return Err(TimeError::Expected("digits after the decimal point"));
        }
        if n == 1 {
            millis *= 100;
        } else if n == 2 {
            millis *= 10;
        }
    }
    let offset_ms = match s.get(pos) {
        None => 0,
        Some(b'Z' | b'z') => {
            pos += 1;
            0
        }
        Some(&sign @ (b'+' | b'-')) => {
            let oh = digits::<2>(s, pos + 1, "a 2-digit offset hour after the sign")?;
            pos += 3;
            let om = match s.get(pos) {
                None => 0,
                Some(b':') => {
                    let om = digits::<2>(s, pos + 1, "2-digit offset minutes after ':'")?;
                    pos += 3;
                    om
                }
                Some(_) => {
                    let om = digits::<2>(s, pos, "2-digit offset minutes")?;
                    pos += 2;
                    om
                }
            };
            if oh > 23 {
                return Err(TimeError::OutOfRange {
                    field: "offset hour",
                    value: oh,
                });
            }
            if om > 59 {
                return Err(TimeError::OutOfRange {
                    field: "offset minutes",
                    value: om,
                });
            }
            let off = i64::from(oh) * MS_PER_HOUR + i64::from(om) * MS_PER_MIN;
            if sign == b'-' { -off } else { off }
        }
        Some(_) => {
            return Err(TimeError::Expected(
                "'Z' or an offset like +01:00 after the time",
            ));
        }
    };
    if pos != s.len() {
        return Err(TimeError::Trailing);
    }
    let local = days * MS_PER_DAY + time_of_day + millis;
    Ok(EventTime(local - offset_ms))
}

// ---------------------------------------------------------------------------------------
// RFC 3339 formatting
// ---------------------------------------------------------------------------------------

#[inline(always)]
fn push2(out: &mut Vec<u8>, v: u32) {
    out.push(b'0' + (v / 10) as u8);
    out.push(b'0' + (v % 10) as u8);
}

/// Appends `t` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, always three fraction digits).
///
/// Any `i64` is handled, before 1970 too. Years outside 0000-9999 are written with a
/// sign and at least four digits (`+10000-01-01T...`, `-0001-12-31T...`), like chrono.
pub fn write_rfc3339_ms(t: EventTime, out: &mut Vec<u8>) {
    let ms = t.0;
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY) as u32; // [0, 86_399_999]
    let (y, m, d) = civil_from_days(days);
    if (0..=9999).contains(&y) {
        let y = y as u32;
        push2(out, y / 100);
        push2(out, y % 100);
    } else {
        out.push(if y < 0 { b'-' } else { b'+' });
        let abs = y.unsigned_abs();
        let mut buf = itoa::Buffer::new();
        let digits = buf.format(abs).as_bytes();
        for _ in digits.len()..4 {
            out.push(b'0');
        }
        out.extend_from_slice(digits);
    }
    out.push(b'-');
    push2(out, m);
    out.push(b'-');
    push2(out, d);
    out.push(b'T');
    let secs = in_day / 1000;
    push2(out, secs / 3600);
    out.push(b':');
    push2(out, secs / 60 % 60);
    out.push(b':');
    push2(out, secs % 60);
    out.push(b'.');
    let frac = in_day % 1000;
    out.push(b'0' + (frac / 100) as u8);
    push2(out, frac % 100);
    out.push(b'Z');
}

/// `t` as a `String` in the form of [`write_rfc3339_ms`].
pub fn format_rfc3339_ms(t: EventTime) -> String {
    let mut out = Vec::with_capacity(24);
    write_rfc3339_ms(t, &mut out);
    // Only ASCII is ever written.
    String::from_utf8(out).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Epoch numbers
// ---------------------------------------------------------------------------------------

/// The unit of an epoch number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EpochUnit {
    /// Milliseconds since the epoch.
    Millis,
    /// Seconds since the epoch.
    Seconds,
}

impl EpochUnit {
    /// `milliseconds` or `seconds`.
    pub fn plural(self) -> &'static str {
        match self {
            EpochUnit::Millis => "milliseconds",
            EpochUnit::Seconds => "seconds",
        }
    }
}

/// Converts a JSON number text (`1700000000000`, `1700000000.25`, `1.7e9`, `-5`) in the
/// given unit to milliseconds since the epoch.
///
/// The conversion is exact (decimal, no floating point); a fraction of a millisecond is
/// dropped toward negative infinity. The text must follow the JSON number grammar exactly
/// (no `+`, no leading zeros, no spaces, no `NaN`/`Infinity`). Values outside `i64`
/// milliseconds are rejected.
pub fn parse_epoch(raw_number: &[u8], unit: EpochUnit) -> Result<EventTime, TimeError> {
    let s = raw_number;
    if s.is_empty() {
        return Err(TimeError::Empty);
    }
    let mut i = 0;
    let negative = s[0] == b'-';
    if negative {
        i = 1;
    }
    // Integer part.
    let int_start = i;
    match s.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            while s.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        _ => return Err(TimeError::NotANumber),
    }
    let int_digits = &s[int_start..i];
    // Fraction.
    let mut frac_digits: &[u8] = &[];
    if s.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while s.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return Err(TimeError::NotANumber);
        }
        frac_digits = &s[start..i];
    }
    // Exponent, saturated far beyond anything meaningful.
    let mut exp: i64 = 0;
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        let mut exp_neg = false;
        match s.get(i) {
            Some(b'+') => i += 1,
            Some(b'-') => {
                exp_neg = true;
                i += 1;
            }
            _ => {}
        }
        let start = i;
        while let Some(&b) = s.get(i) {
            if !b.is_ascii_digit() {
                break;
            }
            exp = (exp * 10 + i64::from(b - b'0')).min(1_000_000);
            i += 1;
        }
        if i == start {
            return Err(TimeError::NotANumber);
        }
        if exp_neg {
            exp = -exp;
        }
    }
    if i != s.len() {
        return Err(TimeError::NotANumber);
    }
    // value_ms = D * 10^shift, D = int_digits ++ frac_digits as an integer.
    let shift = exp - frac_digits.len() as i64
        + match unit {
            EpochUnit::Millis => 0,
            EpochUnit::Seconds => 3,
        };
    let all = int_digits.iter().chain(frac_digits.iter()).copied();
    // Skip leading zeros so that the digit count is meaningful.
    let significant: usize = {
        let total = int_digits.len() + frac_digits.len();
        let zeros = all.clone().take_while(|&b| b == b'0').count();
        total - zeros
    };
    if significant == 0 {
        return Ok(EventTime(0));
    }
    // Number of digits of D that form the integer part of the value.
    let int_len = significant as i64 + shift;
    let out_of_range = TimeError::EpochOutOfRange { unit };
    if int_len > 20 {
        return Err(out_of_range);
    }
    let mut magnitude: u128 = 0;
    let mut remainder = false;
    let mut taken: i64 = 0;
    for b in all.skip_while(|&b| b == b'0') {
        if taken < int_len {
            magnitude = magnitude * 10 + u128::from(b - b'0');
            taken += 1;
        } else if b != b'0' {
            remainder = true;
            break;
        }
    }
    // Positive shift: append zeros (int_len <= 20 keeps this within u128).
    while taken < int_len {
        magnitude *= 10;
        taken += 1;
    }
    let value: i128 = if negative {
        -(magnitude as i128) - i128::from(remainder)
    } else {
        magnitude as i128
    };
    i64::try_from(value)
        .map(EventTime)
        .map_err(|_| out_of_range)
}

// ---------------------------------------------------------------------------------------
// Durations
// ---------------------------------------------------------------------------------------

/// Why a duration text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The text was empty (or only spaces).
    #[error("empty duration; write e.g. 30m, 1h30m or 250ms")]
    Empty,
    /// A number without a unit, e.g. `30`.
    #[error(
        "'{number}' has no unit; write {number}s, {number}m, {number}h, {number}d or {number}ms"
    )]
    MissingUnit {
        /// The digits as written.
        number: String,
    },
    /// A unit that is not one of `ms`, `s`, `m`, `h`, `d`.
    #[error("unknown unit '{unit}'; use ms, s, m, h or d")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
    },
    /// Something other than a number where a number was expected.
    #[error("expected a number at '{rest}' (durations look like 30m, 1h30m or 250ms)")]
    ExpectedNumber {
        /// The remaining text from the offending position.
        rest: String,
    },
    /// A leading minus sign.
    #[error("a duration cannot be negative")]
    Negative,
    /// A decimal point (`1.5h`).
    #[error("fractions are not supported; combine units instead, e.g. 1h30m")]
    Fraction,
    /// The total exceeds [`MAX_DURATION`] (or overflows).
    #[error("duration longer than 100 years")]
    TooLong,
    /// A unit given twice (`1h1h`), which would otherwise silently add up.
    #[error("unit '{unit}' is given twice; write each unit once, largest first, e.g. 1h30m")]
    RepeatedUnit {
        /// The unit.
        unit: String,
    },
    /// A unit after a smaller one (`30s1m`).
    #[error(
        "'{unit}' comes after the smaller unit '{previous}'; write the units largest first (d, h, m, s, ms), each once, e.g. 1h30m"
    )]
    UnitOrder {
        /// The unit out of order.
        unit: String,
        /// The smaller unit before it.
        previous: String,
    },
}

fn lossy(s: &[u8]) -> String {
    String::from_utf8_lossy(s).into_owned()
}

/// Parses a humane duration: one or more `<integer><unit>` parts with units `ms`, `s`,
/// `m`, `h`, `d` (`10m`, `1h30m`, `250ms`, `1d2h`, `0s`), spaces allowed between parts and
/// between a number and its unit. Parts add up; each unit appears at most once, largest
/// first (`1h1h` and `30s1m` are rejected: likely typos); a bare number is rejected with
/// a hint to add a unit; a minus sign is rejected; totals above 100 years
/// ([`MAX_DURATION`]) are rejected.
///
/// ```
/// use sessionizer_core::timefmt::parse_duration;
/// assert_eq!(parse_duration("1h30m").unwrap().millis(), 5_400_000);
/// assert!(parse_duration("30").unwrap_err().to_string().contains("30s"));
/// ```
pub fn parse_duration(s: &str) -> Result<DurationMs, DurationError> {
    parse_duration_bytes(s.as_bytes())
}

/// [`parse_duration`] on bytes (the content of a JSON string, say). Non-ASCII bytes are
/// never valid in a duration, so UTF-8 validity does not matter.
pub fn parse_duration_bytes(s: &[u8]) -> Result<DurationMs, DurationError> {
    let is_space = |b: &u8| b.is_ascii_whitespace();
    let mut i = 0;
    let n = s.len();
    while i < n && is_space(&s[i]) {
        i += 1;
    }
    if i == n {
        return Err(DurationError::Empty);
    }
    let mut total: i64 = 0;
    // The previous part's unit, as its rank from days (0) down to milliseconds (4).
    let mut previous: Option<(usize, &[u8])> = None;
    while i < n {
        // Number.
        let num_start = i;
        let mut value: i64 = 0;
        let mut overflow = false;
        while i < n && s[i].is_ascii_digit() {
            match value
                .checked_mul(10)
                .and_then(|v| v.checked_add(i64::from(s[i] - b'0')))
            {
                Some(v) => value = v,
                None => overflow = true,
            }
            i += 1;
        }
        if i == num_start {
            return Err(match s[i] {
                b'-' => DurationError::Negative,
                b'.' => DurationError::Fraction,
                _ => DurationError::ExpectedNumber {
                    rest: lossy(&s[i..]),
                },
            });
        }
        let number = &s[num_start..i];
        if s.get(i) == Some(&b'.') {
            return Err(DurationError::Fraction);
        }
        while i < n && is_space(&s[i]) {
            i += 1;
        }
        // Unit.
        let unit_start = i;
        while i < n && s[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &s[unit_start..i];
        let (rank, scale) = match unit {
            b"d" => (0, MS_PER_DAY),
            b"h" => (1, MS_PER_HOUR),
            b"m" => (2, MS_PER_MIN),
            b"s" => (3, MS_PER_SEC),
            b"ms" => (4, 1),
            b"" => {
                return Err(DurationError::MissingUnit {
                    number: lossy(number),
                });
            }
            _ => return Err(DurationError::UnknownUnit { unit: lossy(unit) }),
        };
        match previous {
            Some((r, _)) if r == rank => {
                return Err(DurationError::RepeatedUnit { unit: lossy(unit) });
            }
            Some((r, before)) if r > rank => {
                return Err(DurationError::UnitOrder {
                    unit: lossy(unit),
                    previous: lossy(before),
                });
            }
            _ => previous = Some((rank, unit)),
        }
        if overflow {
            return Err(DurationError::TooLong);
        }
        total = value
            .checked_mul(scale)
            .and_then(|v| v.checked_add(total))
            .ok_or(DurationError::TooLong)?;
        if total > MAX_DURATION.0 {
            return Err(DurationError::TooLong);
        }
        while i < n && is_space(&s[i]) {
            i += 1;
        }
    }
    Ok(DurationMs(total))
}

/// The shortest text of `d` that [`parse_duration`] reads back: its non-zero parts from
/// days down to milliseconds (`1h30m`, `1m500ms`, `1d2h`), or `0s` for zero.
pub fn format_duration(d: DurationMs) -> String {
    struct Disp(i64);
    impl fmt::Display for Disp {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.0 == 0 {
                return f.write_str("0s");
            }
            if self.0 < 0 {
                f.write_str("-")?;
            }
            let mut rest = self.0.unsigned_abs();
            for (scale, unit) in [
                (MS_PER_DAY as u64, "d"),
                (MS_PER_HOUR as u64, "h"),
                (MS_PER_MIN as u64, "m"),
                (MS_PER_SEC as u64, "s"),
                (1, "ms"),
            ] {
                let q = rest / scale;
                rest %= scale;
                if q != 0 {
                    write!(f, "{q}{unit}")?;
                }
            }
            Ok(())
        }
    }
    Disp(d.0).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip() {
        for z in (-800_000i64..800_000).step_by(7) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2200, 1, 1), 84_006);
    }
}
