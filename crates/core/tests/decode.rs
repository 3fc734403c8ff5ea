//! One record to one event: every accepted form and every invalidity rule.

use sessionizer_core::decode::{
    DEFAULT_VALID_RANGE, Decoded, Decoder, DecoderConfig, DedupMode, GapError, Invalid, TimeFormat,
};
use sessionizer_core::json::FieldPath;
use sessionizer_core::timefmt::{DurationError, TimeError};
use sessionizer_core::{DurationMs, EventTime};
use xxhash_rust::xxh3::xxh3_128;

fn fp(s: &str) -> FieldPath {
    FieldPath::parse(s).expect("valid path")
}

fn cfg() -> DecoderConfig {
    DecoderConfig::default()
}

/// The owned parts of a [`Decoded`].
#[derive(Debug)]
struct Owned {
    key: Vec<u8>,
    time: EventTime,
    gap: Option<DurationMs>,
}

impl From<&Decoded<'_>> for Owned {
    fn from(e: &Decoded<'_>) -> Self {
        Owned {
            key: e.key.to_vec(),
            time: e.time,
            gap: e.gap,
        }
    }
}

/// Decodes `line` and returns an owned copy (so that the decoder can be reused).
fn dec(d: &mut Decoder, line: &str) -> Result<Owned, Invalid> {
    d.decode(line.as_bytes()).map(|e| Owned::from(&e))
}

fn reason(d: &mut Decoder, line: &[u8]) -> String {
    match d.decode(line) {
        Ok(e) => panic!("{:?} decoded as {e:?}", String::from_utf8_lossy(line)),
        Err(e) => e.to_string(),
    }
}

const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z

#[test]
fn default_config() {
    let c = cfg();
    assert_eq!(c.key.as_str(), "visit_id");
    assert_eq!(c.time.as_str(), "event_time");
    assert_eq!(c.time_format, TimeFormat::Rfc3339);
    assert_eq!(c.valid_range, DEFAULT_VALID_RANGE);
    assert_eq!(
        DEFAULT_VALID_RANGE.1.to_string(),
        "2200-01-01T00:00:00.000Z"
    );
    assert_eq!("epoch-ms".parse::<TimeFormat>(), Ok(TimeFormat::EpochMs));
    assert_eq!("epoch-s".parse::<TimeFormat>(), Ok(TimeFormat::EpochS));
    assert_eq!("rfc3339".parse::<TimeFormat>(), Ok(TimeFormat::Rfc3339));
    assert!("iso".parse::<TimeFormat>().is_err());
    assert_eq!(TimeFormat::EpochS.to_string(), "epoch-s");
}

#[test]
fn string_and_integer_keys() {
    let mut d = Decoder::new(cfg());
    let e = d
        .decode(br#"{"visit_id":"v1","event_time":"2024-01-01T00:00:00Z"}"#)
        .expect("valid");
    assert_eq!(e.key, b"v1");
    assert_eq!(e.time, EventTime(T0));
    assert_eq!(e.gap, None);
    assert_eq!(e.dedup, None);
    let s = dec(
        &mut d,
        r#"{"visit_id":"42","event_time":"2024-01-01T00:00:00Z"}"#,
    )
    .expect("valid");
    let n = dec(
        &mut d,
        r#"{"visit_id":42,"event_time":"2024-01-01T00:00:00Z"}"#,
    )
    .expect("valid");
    assert_eq!(s.key, b"42");
    assert_eq!(n.key, s.key);
    let neg = dec(
        &mut d,
        r#"{"visit_id":-42,"event_time":"2024-01-01T00:00:00Z"}"#,
    )
    .expect("valid");
    assert_eq!(neg.key, b"-42");
    let empty = dec(
        &mut d,
        r#"{"visit_id":"","event_time":"2024-01-01T00:00:00Z"}"#,
    )
    .expect("valid");
    assert_eq!(empty.key, b"");
}

#[test]
fn escaped_keys_and_names() {
    let mut d = Decoder::new(cfg());
    let e = dec(
        &mut d,
        r#"{"visit\u005fid":"v\u00e9\n\"1","event_time":"2024-01-01T00:00:00\u005a"}"#,
    )
    .expect("valid");
    assert_eq!(e.key, "vé\n\"1".as_bytes());
    assert_eq!(e.time, EventTime(T0));
    // The scratch buffer is reused: a later unescaped key is borrowed from its own line.
    let e = dec(
        &mut d,
        r#"{"visit_id":"v\/2","event_time":"2024-01-01T00:00:00Z"}"#,
    )
    .expect("valid");
    assert_eq!(e.key, b"v/2");
    let e = dec(
        &mut d,
        r#"{"visit_id":"plain","event_time":"2024-01-01T00:00:00Z"}"#,
    )
    .expect("valid");
    assert_eq!(e.key, b"plain");
}

#[test]
fn nested_dotted_paths() {
    let mut d = Decoder::new(DecoderConfig {
        key: fp("context.user.login"),
        time: fp("meta.ts"),
        value_fields: vec![
            fp("context.country"),
            fp("page"),
            fp("context.user"),
            fp("nope"),
            fp("n"),
        ],
        ..cfg()
    });
    let line = r#"{"page":"/a","context":{"user":{"login":"jdoe"},"country":"DE"},"meta":{"ts":"2024-01-01T01:00:00+01:00"},"n":null}"#;
    let e = d.decode(line.as_bytes()).expect("valid");
    assert_eq!(e.key, b"jdoe");
    assert_eq!(e.time, EventTime(T0));
    assert_eq!(e.value_count(), 5);
    assert_eq!(e.value(0), Some(&b"\"DE\""[..]));
    assert_eq!(e.value(1), Some(&b"\"/a\""[..]));
    assert_eq!(e.value(2), Some(&br#"{"login":"jdoe"}"#[..]));
    assert_eq!(e.value(3), None);
    assert_eq!(e.value(4), None, "null is None");
    assert_eq!(e.value(5), None, "out of range");
    assert_eq!(e.line(), line.as_bytes());
    assert_eq!(
        reason(
            &mut d,
            br#"{"context":{"user":"jdoe"},"meta":{"ts":"2024-01-01T00:00:00Z"}}"#
        ),
        "missing key field context.user.login"
    );
}

#[test]
fn value_fields_may_repeat_key_and_time() {
    let mut d = Decoder::new(DecoderConfig {
        value_fields: vec![fp("visit_id"), fp("event_time"), fp("visit_id")],
        ..cfg()
    });
    let e = d
        .decode(br#"{"visit_id":"v1","event_time":"2024-01-01T00:00:00Z"}"#)
        .expect("valid");
    assert_eq!(e.value(0), Some(&b"\"v1\""[..]));
    assert_eq!(e.value(1), Some(&b"\"2024-01-01T00:00:00Z\""[..]));
    assert_eq!(e.value(2), Some(&b"\"v1\""[..]));
}

#[test]
fn time_zones() {
    let mut d = Decoder::new(cfg());
    for (ts, want) in [
        ("2024-01-01T00:00:00Z", T0),
        ("2024-01-01T01:00:00+01:00", T0),
        ("2023-12-31T19:00:00-05:00", T0),
        ("2024-01-01T05:30:00.250+0530", T0 + 250),
        ("2024-01-01T00:00:00", T0),
        ("2024-01-01 00:00:00.5", T0 + 500),
        ("2024-01-01", T0),
    ] {
        let line = format!(r#"{{"visit_id":"v","event_time":"{ts}"}}"#);
        assert_eq!(dec(&mut d, &line).expect(ts).time, EventTime(want), "{ts}");
    }
}

#[test]
fn epoch_formats() {
    let mut ms = Decoder::new(DecoderConfig {
        time_format: TimeFormat::EpochMs,
        ..cfg()
    });
    for (t, want) in [
        ("1704067200000", T0),
        ("\"1704067200000\"", T0),
        ("1704067200000.7", T0),
        ("1.7040672e12", T0),
    ] {
        let line = format!(r#"{{"visit_id":"v","event_time":{t}}}"#);
        assert_eq!(dec(&mut ms, &line).expect(t).time, EventTime(want), "{t}");
    }
    let mut s = Decoder::new(DecoderConfig {
        time_format: TimeFormat::EpochS,
        ..cfg()
    });
    for (t, want) in [
        ("1704067200", T0),
        ("\"1704067200.25\"", T0 + 250),
        ("1704067200.0019", T0 + 1),
    ] {
        let line = format!(r#"{{"visit_id":"v","event_time":{t}}}"#);
        assert_eq!(dec(&mut s, &line).expect(t).time, EventTime(want), "{t}");
    }
    assert_eq!(
        reason(
            &mut ms,
            br#"{"visit_id":"v","event_time":"2024-01-01T00:00:00Z"}"#
        ),
        "time field event_time is not a valid timestamp: not a number"
    );
    assert_eq!(
        reason(&mut ms, br#"{"visit_id":"v","event_time":true}"#),
        "time field event_time is not a number (found a boolean)"
    );
    assert_eq!(
        reason(&mut ms, br#"{"visit_id":"v","event_time":1e30}"#),
        "time field event_time is not a valid timestamp: number out of range for epoch milliseconds"
    );
    // The reason names the unit of the --time-format in use (epoch-s said milliseconds).
    for t in ["1e300", "99999999999999999", "\"-1e30\""] {
        let line = format!(r#"{{"visit_id":"v","event_time":{t}}}"#);
        assert_eq!(
            reason(&mut s, line.as_bytes()),
            "time field event_time is not a valid timestamp: number out of range for epoch seconds",
            "{t}"
        );
    }
    assert_eq!(
        reason(&mut s, br#"{"visit_id":"v","event_time":-1}"#),
        "time field event_time is outside the valid time range 1970-01-01T00:00:00.000Z..2200-01-01T00:00:00.000Z"
    );
}

#[test]
fn invalid_records() {
    let mut d = Decoder::new(cfg());
    let ok_time = r#""event_time":"2024-01-01T00:00:00Z""#;
    let cases: &[(&[u8], &str)] = &[
        (b"{\"visit_id\":\"\xff\"}", "not valid UTF-8"),
        (b"\xc3", "not valid UTF-8"),
        (
            b"{\"visit_id\" \"v\"}",
            "not valid JSON at byte 12: expected ':' after object key",
        ),
        (
            b"",
            "not valid JSON at byte 0: empty line, expected a JSON object",
        ),
        (b"[1,2]", "not a JSON object (found an array)"),
        (b"\"v\"", "not a JSON object (found a string)"),
    ];
    for (line, want) in cases {
        assert_eq!(reason(&mut d, line), *want);
    }
    let with_time = |key: &str| format!("{{{key}{ok_time}}}");
    assert_eq!(
        reason(&mut d, with_time("").as_bytes()),
        "missing key field visit_id"
    );
    assert_eq!(
        reason(&mut d, with_time(r#""visit_id":null,"#).as_bytes()),
        "key field visit_id is null"
    );
    for (v, found) in [
        ("1.5", "a float"),
        ("1e3", "a float"),
        ("true", "a boolean"),
        ("{}", "an object"),
        ("[]", "an array"),
    ] {
        assert_eq!(
            reason(&mut d, with_time(&format!(r#""visit_id":{v},"#)).as_bytes()),
            format!("key field visit_id is not a string or integer (found {found})")
        );
    }
    let with_key = |time: &str| format!(r#"{{"visit_id":"v"{time}}}"#);
    assert_eq!(
        reason(&mut d, with_key("").as_bytes()),
        "missing time field event_time"
    );
    assert_eq!(
        reason(&mut d, with_key(r#","event_time":null"#).as_bytes()),
        "time field event_time is null"
    );
    assert_eq!(
        reason(
            &mut d,
            with_key(r#","event_time":"2024-13-01T00:00:00Z""#).as_bytes()
        ),
        "time field event_time is not a valid timestamp: month 13 out of range"
    );
    assert_eq!(
        reason(&mut d, with_key(r#","event_time":"yesterday""#).as_bytes()),
        "time field event_time is not a valid timestamp: expected a 4-digit year"
    );
    assert_eq!(
        reason(
            &mut d,
            with_key(r#","event_time":1704067200000"#).as_bytes()
        ),
        "time field event_time is a number; use --time-format epoch-ms or epoch-s"
    );
    assert_eq!(
        reason(&mut d, with_key(r#","event_time":{"a":1}"#).as_bytes()),
        "time field event_time is not an RFC 3339 string (found an object)"
    );
    for t in [
        "1969-12-31T23:59:59.999Z",
        "2200-01-01T00:00:00Z",
        "9999-01-01T00:00:00Z",
    ] {
        assert_eq!(
            reason(
                &mut d,
                with_key(&format!(r#","event_time":"{t}""#)).as_bytes()
            ),
            "time field event_time is outside the valid time range 1970-01-01T00:00:00.000Z..2200-01-01T00:00:00.000Z"
        );
    }
    // The range bounds: start inclusive, end exclusive.
    assert!(
        d.decode(with_key(r#","event_time":"1970-01-01T00:00:00Z""#).as_bytes())
            .is_ok()
    );
    assert!(
        d.decode(with_key(r#","event_time":"2199-12-31T23:59:59.999Z""#).as_bytes())
            .is_ok()
    );
    // A key problem is reported before a time problem.
    assert_eq!(reason(&mut d, b"{}"), "missing key field visit_id");
}

#[test]
fn invalid_variants_are_structured() {
    let mut d = Decoder::new(cfg());
    let e = d
        .decode(br#"{"visit_id":"v","event_time":"2024-02-30"}"#)
        .expect_err("invalid");
    assert_eq!(
        e,
        Invalid::BadTime {
            field: fp("event_time"),
            error: TimeError::DayOutOfRange {
                year: 2024,
                month: 2,
                day: 30
            }
        }
    );
    assert_eq!(d.decode(b"\xff").expect_err("invalid"), Invalid::NotUtf8);
}

#[test]
fn custom_valid_range() {
    let mut d = Decoder::new(DecoderConfig {
        valid_range: (EventTime(T0), EventTime(T0 + 1000)),
        ..cfg()
    });
    assert!(
        d.decode(br#"{"visit_id":"v","event_time":"2024-01-01T00:00:00.999Z"}"#)
            .is_ok()
    );
    assert_eq!(
        reason(
            &mut d,
            br#"{"visit_id":"v","event_time":"2024-01-01T00:00:01Z"}"#
        ),
        "time field event_time is outside the valid time range 2024-01-01T00:00:00.000Z..2024-01-01T00:00:01.000Z"
    );
}

#[test]
fn gap_field() {
    let mut d = Decoder::new(DecoderConfig {
        gap_field: Some(fp("gap")),
        ..cfg()
    });
    let line =
        |gap: &str| format!(r#"{{"visit_id":"v","event_time":"2024-01-01T00:00:00Z"{gap}}}"#);
    for (g, want) in [
        ("", None),
        (r#","gap":null"#, None),
        (r#","gap":"45m""#, Some(2_700_000)),
        (r#","gap":"1h 30m""#, Some(5_400_000)),
        (r#","gap":"0s""#, Some(0)),
        (r#","gap":"\u0031m""#, Some(60_000)),
        (r#","gap":90000"#, Some(90_000)),
        (r#","gap":0"#, Some(0)),
    ] {
        assert_eq!(
            dec(&mut d, &line(g)).expect(g).gap,
            want.map(DurationMs),
            "{g}"
        );
    }
    let cases = [
        (
            r#","gap":"30""#,
            "gap field gap is not a duration: '30' has no unit; write 30s, 30m, 30h, 30d or 30ms",
        ),
        (
            r#","gap":"soon""#,
            "gap field gap is not a duration: expected a number at 'soon' (durations look like 30m, 1h30m or 250ms)",
        ),
        (
            r#","gap":-5"#,
            "gap field gap is not a duration: a number must be a non-negative integer of milliseconds",
        ),
        (
            r#","gap":1.5"#,
            "gap field gap is not a duration: a number must be a non-negative integer of milliseconds",
        ),
        (
            r#","gap":99999999999999999999"#,
            "gap field gap is not a duration: duration longer than 100 years",
        ),
        (
            r#","gap":true"#,
            "gap field gap is not a duration: expected a duration string like \"45m\" or an integer of milliseconds (found a boolean)",
        ),
        (
            r#","gap":"36526d""#,
            "gap field gap is not a duration: duration longer than 100 years",
        ),
    ];
    for (g, want) in cases {
        assert_eq!(reason(&mut d, line(g).as_bytes()), want);
    }
    assert_eq!(
        d.decode(line(r#","gap":"1x""#).as_bytes())
            .expect_err("invalid"),
        Invalid::BadGap {
            field: fp("gap"),
            error: GapError::Parse(DurationError::UnknownUnit { unit: "x".into() })
        }
    );
}

#[test]
fn dedup_modes() {
    let line = br#"{"visit_id":"v","event_time":"2024-01-01T00:00:00Z","id":"e-1","n":null}"#;
    let mut off = Decoder::new(cfg());
    assert_eq!(off.decode(line).expect("valid").dedup, None);
    let mut rec = Decoder::new(DecoderConfig {
        dedup: DedupMode::Record,
        ..cfg()
    });
    assert_eq!(rec.decode(line).expect("valid").dedup, Some(xxh3_128(line)));
    let mut field = Decoder::new(DecoderConfig {
        dedup: DedupMode::Field(fp("id")),
        ..cfg()
    });
    assert_eq!(
        field.decode(line).expect("valid").dedup,
        Some(xxh3_128(b"\"e-1\""))
    );
    let mut null = Decoder::new(DecoderConfig {
        dedup: DedupMode::Field(fp("n")),
        ..cfg()
    });
    assert_eq!(null.decode(line).expect("valid").dedup, None);
    let mut missing = Decoder::new(DecoderConfig {
        dedup: DedupMode::Field(fp("nope")),
        ..cfg()
    });
    assert_eq!(missing.decode(line).expect("valid").dedup, None);
}

#[test]
fn decoder_is_reusable_across_errors() {
    let mut d = Decoder::new(DecoderConfig {
        value_fields: vec![fp("page")],
        ..cfg()
    });
    assert!(d.decode(br#"{"visit_id":"v","page":"/x""#).is_err());
    let e = d
        .decode(br#"{"visit_id":"v","event_time":"2024-01-01T00:00:00Z"}"#)
        .expect("valid");
    assert_eq!(e.value(0), None, "no stale span from the failed line");
}

// ---------------------------------------------------------------------------------------
// The decoder against serde_json, on visit-shaped lines, their mutations and any bytes
// ---------------------------------------------------------------------------------------

mod differential {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};
    use sessionizer_core::timefmt::parse_timestamp;

    /// What the decoder must say, worked out from serde_json's document.
    #[derive(Debug, PartialEq)]
    enum Want {
        /// Key, time and the `page` value (`None` when absent or null).
        Event(Vec<u8>, EventTime, Option<Value>),
        /// Not JSON (syntax, UTF-8, nesting), or not an object.
        NotJson,
        /// Valid JSON, rejected for its key or time: the reason's first word.
        Field(&'static str),
    }

    fn want(line: &[u8]) -> Option<Want> {
        let v = match serde_json::from_slice::<Value>(line) {
            Ok(v) => v,
            // The scanner accepts numbers beyond f64 (docs of `json`): no verdict.
            Err(e) if e.to_string().starts_with("number out of range") => return None,
            Err(_) => return Some(Want::NotJson),
        };
        let Value::Object(o) = v else {
            return Some(Want::NotJson);
        };
        let key = match o.get("visit_id") {
            None => return Some(Want::Field("missing key")),
            Some(Value::Null) => return Some(Want::Field("null key")),
            Some(Value::String(s)) => s.as_bytes().to_vec(),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string().into_bytes(),
            // serde_json reads an integer beyond i64 and u64 (and "-0") as a float; to the
            // decoder it is an integer key, its digits as written.
            Some(Value::Number(n)) if n.is_f64() => match integer_literal(line) {
                Some(digits) => digits,
                None => return Some(Want::Field("float key")),
            },
            Some(_) => return Some(Want::Field("key kind")),
        };
        let time = match o.get("event_time") {
            None => return Some(Want::Field("missing time")),
            Some(Value::Null) => return Some(Want::Field("null time")),
            Some(Value::String(s)) => match parse_timestamp(s.as_bytes()) {
                Ok(t) if t >= DEFAULT_VALID_RANGE.0 && t < DEFAULT_VALID_RANGE.1 => t,
                Ok(_) => return Some(Want::Field("time range")),
                Err(_) => return Some(Want::Field("bad time")),
            },
            Some(_) => return Some(Want::Field("time kind")),
        };
        let page = o.get("page").filter(|p| !p.is_null()).cloned();
        Some(Want::Event(key, time, page))
    }

    /// The top-level `visit_id` of `line` as written, when it is an integer literal.
    fn integer_literal(line: &[u8]) -> Option<Vec<u8>> {
        let fields: std::collections::HashMap<String, Box<serde_json::value::RawValue>> =
            serde_json::from_slice(line).ok()?;
        let raw = fields.get("visit_id")?.get().as_bytes();
        let digits = raw.strip_prefix(b"-").unwrap_or(raw);
        (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit)).then(|| raw.to_vec())
    }

    fn got(d: &mut Decoder, line: &[u8]) -> Want {
        match d.decode(line) {
            Ok(e) => {
                let page = e.value(0).map(|raw| {
                    serde_json::from_slice::<Value>(raw).expect("a value span is valid JSON")
                });
                Want::Event(e.key.to_vec(), e.time, page)
            }
            Err(Invalid::NotUtf8 | Invalid::Json(_)) => Want::NotJson,
            Err(Invalid::MissingKey(_)) => Want::Field("missing key"),
            Err(Invalid::NullKey(_)) => Want::Field("null key"),
            Err(Invalid::KeyKind {
                found: "a float", ..
            }) => Want::Field("float key"),
            Err(Invalid::KeyKind { .. }) => Want::Field("key kind"),
            Err(Invalid::MissingTime(_)) => Want::Field("missing time"),
            Err(Invalid::NullTime(_)) => Want::Field("null time"),
            Err(Invalid::TimeOutOfRange { .. }) => Want::Field("time range"),
            Err(Invalid::BadTime { .. }) => Want::Field("bad time"),
            Err(Invalid::TimeIsNumber(_) | Invalid::TimeKind { .. }) => Want::Field("time kind"),
            Err(e) => panic!("unexpected reason {e}"),
        }
    }

    fn check(line: &[u8]) -> Result<(), TestCaseError> {
        let mut d = Decoder::new(DecoderConfig {
            value_fields: vec![fp("page")],
            ..cfg()
        });
        let Some(want) = want(line) else {
            return Ok(());
        };
        let got = got(&mut d, line);
        // An integer key is its digits as written; serde_json writes `-0` as `0`.
        let integer = |k: &[u8]| std::str::from_utf8(k).ok()?.parse::<i128>().ok();
        let got = match (got, &want) {
            (Want::Event(k, t, p), Want::Event(w, ..)) if k != *w && integer(&k).is_some() => {
                prop_assert_eq!(integer(&k), integer(w));
                Want::Event(w.clone(), t, p)
            }
            (got, _) => got,
        };
        prop_assert_eq!(&got, &want, "on {:?}", String::from_utf8_lossy(line));
        // The same decoder again, after whatever the previous line left in it.
        let again = self::got(&mut d, line);
        prop_assert_eq!(
            matches!(got, Want::Event(..)),
            matches!(again, Want::Event(..))
        );
        Ok(())
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z0-9/_.-]{0,40}",
            1 => any::<String>(),
            1 => proptest::sample::select(&[
                "2024-01-01T00:00:00.012Z",
                "2024-02-29T23:59:59+01:00",
                "1969-12-31T23:59:59Z",
                "not a time",
                "v-\u{e9}\u{1F600}\"\\/\n",
            ][..]).prop_map(str::to_owned),
        ]
    }

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => text().prop_map(Value::String),
            1 => any::<i64>().prop_map(Value::from),
            1 => any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            1 => Just(Value::Null),
            1 => any::<bool>().prop_map(Value::Bool),
        ]
    }

    /// Mostly valid RFC 3339 times, in and out of the valid range.
    fn time() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => prop_oneof![
                6 => 0..DEFAULT_VALID_RANGE.1.0,
                1 => -100_000_000_000_000i64..100_000_000_000_000,
            ].prop_map(|ms| {
                let mut out = Vec::new();
                sessionizer_core::timefmt::write_rfc3339_ms(EventTime(ms), &mut out);
                String::from_utf8(out).expect("UTF-8")
            }),
            1 => text(),
        ]
    }

    /// A visit line as `sessionizer generate` writes it, with some fields swapped for
    /// other values, dropped, repeated or moved.
    fn visit() -> impl Strategy<Value = String> {
        (
            (text(), scalar(), 0u8..12),
            (time(), scalar(), 0u8..12),
            (text(), scalar(), 0u8..12),
            any::<u64>(),
            proptest::collection::vec((text(), scalar()), 0..4),
            any::<bool>(),
        )
            .prop_map(|(key, time, page, n, extra, pretty)| {
                let mut o = Map::new();
                let mut repeats = Vec::new();
                let mut put = |o: &mut Map<String, Value>, name: &str, (s, other, how): (String, Value, u8)| {
                    match how {
                        0 => {}
                        1 => {
                            o.insert(name.to_owned(), other);
                        }
                        2 => repeats.push((name.to_owned(), other, Value::String(s))),
                        3 => {
                            o.insert(name.to_owned(), json!({ "nested": s }));
                        }
                        _ => {
                            o.insert(name.to_owned(), Value::String(s));
                        }
                    }
                };
                put(&mut o, "visit_id", key);
                o.insert("user_id".into(), json!(format!("u-{:05}", n % 100_000)));
                put(&mut o, "event_time", time);
                put(&mut o, "page", page);
                o.insert("duration_ms".into(), json!(n % 60_000));
                o.insert(
                    "context".into(),
                    json!({"user": {"login": format!("user{}", n % 977), "country": "DE", "plan": "free"},
                           "device": {"type": "mobile", "os": "Android 13", "browser": "Samsung Internet 25"},
                           "app": {"version": "3.14.1", "lang": "en-CA"}, "tags": [1, "two", null, [], {}]}),
                );
                for (k, v) in extra {
                    o.insert(k, v);
                }
                let mut line = if pretty {
                    serde_json::to_string_pretty(&Value::Object(o)).expect("serializes").replace('\n', " ")
                } else {
                    serde_json::to_string(&Value::Object(o)).expect("serializes")
                };
                // A repeated member: the first occurrence is overridden by the last.
                for (name, first, last) in repeats {
                    let body = line.strip_suffix('}').unwrap_or(&line).to_owned();
                    let sep = if body.trim_end().ends_with('{') { "" } else { "," };
                    line = format!(
                        "{{{}:{},{}{sep}{}:{}}}",
                        json!(name),
                        first,
                        &body[1..],
                        json!(name),
                        last
                    );
                }
                line
            })
    }

    fn mutated() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => proptest::sample::select(&b"{}[]\":,\\ 0123456789.eE+-tfnulrux\t\n\x01\x7f"[..]),
            1 => any::<u8>(),
        ];
        let edit = (any::<proptest::sample::Index>(), 0u8..3, byte);
        (visit(), proptest::collection::vec(edit, 1..4)).prop_map(|(line, edits)| {
            let mut line = line.into_bytes();
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
        #![proptest_config(ProptestConfig::with_cases(1500))]

        #[test]
        fn visit_lines_decode_like_serde_json(line in visit()) {
            check(line.as_bytes())?;
        }

        #[test]
        fn mutated_visit_lines_decode_like_serde_json(line in mutated()) {
            check(&line)?;
        }

        #[test]
        fn arbitrary_bytes_decode_like_serde_json(line in proptest::collection::vec(any::<u8>(), 0..400)) {
            check(&line)?;
        }
    }

    /// The generator is worth its time: a good share of its lines decode, and a good
    /// share of the mutated ones do not.
    #[test]
    fn generated_lines_are_mixed() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let (mut events, mut invalid, n) = (0, 0, 500);
        let mut d = Decoder::new(cfg());
        for _ in 0..n {
            let line = visit().new_tree(&mut runner).expect("generates").current();
            events += usize::from(d.decode(line.as_bytes()).is_ok());
            let bad = mutated()
                .new_tree(&mut runner)
                .expect("generates")
                .current();
            invalid += usize::from(matches!(d.decode(&bad), Err(Invalid::Json(_))));
        }
        assert!(
            events > n / 4 && invalid > n / 4,
            "{events} events, {invalid} not JSON of {n}"
        );
    }
}
