//! The JSON scanner and its helpers, checked by hand and against serde_json.

use proptest::prelude::*;
use serde_json::Value;
use sessionizer_core::json::{
    Extractor, FieldPath, JsonError, JsonKind, PathError, Span, is_integer, kind, string_content,
    unescape_string, write_json_string,
};

fn paths(names: &[&str]) -> Vec<FieldPath> {
    names
        .iter()
        .map(|n| FieldPath::parse(n).expect("valid path"))
        .collect()
}

/// Scans `line` for `names`; the raw text found for each.
fn extract<'a>(line: &'a str, names: &[&str]) -> Result<Vec<Option<&'a str>>, JsonError> {
    let ex = Extractor::new(&paths(names));
    let mut found = vec![Some(Span { start: 9, end: 9 }); names.len()];
    ex.scan(line.as_bytes(), &mut found)?;
    Ok(found.iter().map(|s| s.map(|s| &line[s.range()])).collect())
}

fn err(line: &[u8]) -> String {
    let ex = Extractor::new(&[]);
    match ex.scan(line, &mut []) {
        Ok(()) => panic!("{:?} accepted", String::from_utf8_lossy(line)),
        Err(e) => e.to_string(),
    }
}

#[test]
fn field_paths() {
    let p = FieldPath::parse("context.user.login").expect("valid");
    assert_eq!(p.to_string(), "context.user.login");
    assert_eq!(p.as_str(), "context.user.login");
    assert_eq!(
        p.segments().collect::<Vec<_>>(),
        ["context", "user", "login"]
    );
    assert_eq!(p.depth(), 3);
    assert_eq!(p.last_segment(), "login");
    assert_eq!(format!("{p:?}"), "FieldPath(\"context.user.login\")");
    assert_eq!("a".parse::<FieldPath>().expect("valid").last_segment(), "a");
    assert_eq!(FieldPath::parse(""), Err(PathError::Empty));
    for bad in ["a..b", ".a", "a.", "."] {
        assert!(
            matches!(FieldPath::parse(bad), Err(PathError::EmptySegment(_))),
            "{bad}"
        );
    }
    let json = serde_json::to_string(&p).expect("serializes");
    assert_eq!(json, "\"context.user.login\"");
    let back: FieldPath = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, p);
    assert!(serde_json::from_str::<FieldPath>("\"a..b\"").is_err());
}

#[test]
fn top_level_paths() {
    let line = r#"{"visit_id":"v1","event_time":"2024-01-01T00:00:00Z","n":-1.5e3,"b":true,"z":null,"o":{"x":[1,{"y":2}]},"arr":[1,2]}"#;
    let got = extract(
        line,
        &[
            "visit_id",
            "event_time",
            "n",
            "b",
            "z",
            "o",
            "arr",
            "missing",
        ],
    )
    .expect("valid");
    assert_eq!(
        got,
        [
            Some("\"v1\""),
            Some("\"2024-01-01T00:00:00Z\""),
            Some("-1.5e3"),
            Some("true"),
            Some("null"),
            Some(r#"{"x":[1,{"y":2}]}"#),
            Some("[1,2]"),
            None
        ]
    );
}

#[test]
fn nested_paths() {
    let line = r#" { "context" : { "user" : { "login" : "jdoe" , "id" : 7 } , "country" : "DE" } , "user" : "top" } "#;
    let got = extract(
        line,
        &[
            "context.user.login",
            "context.country",
            "user",
            "context.user",
            "context.user.id",
            "context.nope",
            "user.login",
        ],
    )
    .expect("valid");
    assert_eq!(
        got,
        [
            Some("\"jdoe\""),
            Some("\"DE\""),
            Some("\"top\""),
            Some(r#"{ "login" : "jdoe" , "id" : 7 }"#),
            Some("7"),
            None,
            None
        ]
    );
}

#[test]
fn path_through_non_object_is_absent() {
    let line = r#"{"a":[{"b":1}],"c":"s","d":5,"e":null,"f":{"g":{}}}"#;
    let got = extract(line, &["a.b", "a.0", "c.x", "d.x", "e.x", "f.g.h", "f.g"]).expect("valid");
    assert_eq!(got, [None, None, None, None, None, None, Some("{}")]);
}

#[test]
fn repeated_names_last_wins() {
    let line = r#"{"k":1,"k":2,"o":{"a":1,"b":2},"o":{"a":3},"p":{"a":1},"p":5,"q":5,"q":{"a":6}}"#;
    let got = extract(line, &["k", "o.a", "o.b", "o", "p.a", "q.a"]).expect("valid");
    assert_eq!(
        got,
        [
            Some("2"),
            Some("3"),
            None,
            Some(r#"{"a":3}"#),
            None,
            Some("6")
        ]
    );
    // serde_json agrees.
    let v: Value = serde_json::from_str(line).expect("valid");
    assert_eq!(v["o"]["b"], Value::Null);
    assert_eq!(v["k"], 2);
}

#[test]
fn escaped_member_names_match() {
    let line = r#"{"visit\u005fid":"v1","ev\u0065nt_time":1,"a\/b":2,"\u00fc":3,"\ud83d\ude00":4,"x\\y":5,"q\"":6}"#;
    let got = extract(
        line,
        &["visit_id", "event_time", "a/b", "ü", "😀", "x\\y", "q\""],
    )
    .expect("valid");
    assert_eq!(
        got,
        [
            Some("\"v1\""),
            Some("1"),
            Some("2"),
            Some("3"),
            Some("4"),
            Some("5"),
            Some("6")
        ]
    );
    // A raw backslash in a name is not the same as the escape it spells.
    let line = r#"{"x\\\\y":1}"#; // the name is x\\y (two backslashes)
    assert_eq!(
        extract(line, &["x\\y", "x\\\\y"]).expect("valid"),
        [None, Some("1")]
    );
    // Names that only look alike.
    let line = r#"{"visit_i":1,"visit_idd":2,"Visit_id":3,"visit_id ":4}"#;
    assert_eq!(extract(line, &["visit_id"]).expect("valid"), [None]);
}

#[test]
fn long_names_and_many_paths() {
    let long = "a_rather_long_member_name_that_exceeds_eight_bytes";
    let line = format!(
        r#"{{"{long}":1,"{long}x":2,"a_rather_long_member_name_that_exceeds_eight_byteZ":3}}"#
    );
    assert_eq!(extract(&line, &[long]).expect("valid"), [Some("1")]);
    let names: Vec<String> = (0..64).map(|i| format!("f{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let body: Vec<String> = (0..64).rev().map(|i| format!("\"f{i}\":{i}")).collect();
    let line = format!("{{{}}}", body.join(","));
    let got = extract(&line, &refs).expect("valid");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, Some(i.to_string().as_str()));
    }
    // Names of 63 bytes and more share one length bucket; names of one length chain.
    let (n63, n70, n80) = ("q".repeat(63), "q".repeat(70), "q".repeat(80));
    let line = format!(
        r#"{{"{n80}":8,"{n63}":6,"{}":0,"{n70}":7,"ab":1,"cd":2}}"#,
        "q".repeat(64)
    );
    assert_eq!(
        extract(&line, &[&n70, "cd", &n63, "ab", &n80, "ef"]).expect("valid"),
        [Some("7"), Some("2"), Some("6"), Some("1"), Some("8"), None]
    );
}

#[test]
fn lines_over_a_mebibyte() {
    // Past 1 MiB the byte-at-a-time scanner runs instead of the structural pass.
    let big = "x".repeat(1 << 20);
    let line = format!(r#"{{"pad":"{big}","a":{{"b":[1,2]}},"c":"\u00e9"}}"#);
    assert_eq!(
        extract(&line, &["a.b", "c"]).expect("valid"),
        [Some("[1,2]"), Some(r#""\u00e9""#)]
    );
    let bad = format!(r#"{{"pad":"{big}","a":01}}"#);
    assert_eq!(
        extract(&bad, &["a"]),
        Err(JsonError::NotJson {
            offset: bad.len() - 2,
            what: "expected ',' or '}' after object member"
        })
    );
}

#[test]
fn same_path_twice() {
    assert_eq!(
        extract(r#"{"a":{"b":1}}"#, &["a.b", "a", "a.b"]).expect("valid"),
        [Some("1"), Some(r#"{"b":1}"#), Some("1")]
    );
}

#[test]
fn error_messages() {
    assert_eq!(
        err(b"{\"a\" 1}"),
        "not valid JSON at byte 5: expected ':' after object key"
    );
    assert_eq!(err(b"[1,2]"), "not a JSON object (found an array)");
    assert_eq!(err(b"\"s\""), "not a JSON object (found a string)");
    assert_eq!(err(b" 12 "), "not a JSON object (found a number)");
    assert_eq!(err(b"true"), "not a JSON object (found a boolean)");
    assert_eq!(err(b"null"), "not a JSON object (found null)");
    assert_eq!(
        err(b""),
        "not valid JSON at byte 0: empty line, expected a JSON object"
    );
    assert_eq!(
        err(b"   "),
        "not valid JSON at byte 3: empty line, expected a JSON object"
    );
    assert_eq!(
        err(b"{} {}"),
        "not valid JSON at byte 3: unexpected characters after the JSON value"
    );
    assert_eq!(
        err(b"{\"a\":1,}"),
        "not valid JSON at byte 7: expected a string as object key"
    );
    assert_eq!(
        err(b"{\"a\":01}"),
        "not valid JSON at byte 6: expected ',' or '}' after object member"
    );
    assert_eq!(
        err(b"{\"a\":\"\x01\"}"),
        "not valid JSON at byte 6: control character in string (must be escaped)"
    );
    assert_eq!(
        err(b"{\"a\":\"\\x\"}"),
        "not valid JSON at byte 6: invalid escape in string"
    );
    assert_eq!(
        err(b"{\"a\":\"\\ud800\"}"),
        "not valid JSON at byte 6: lone high surrogate in \\u escape"
    );
    assert_eq!(
        err(b"{\"a\":\"\\udc00\"}"),
        "not valid JSON at byte 6: lone low surrogate in \\u escape"
    );
    assert_eq!(
        err(b"{\"a\":\"abc"),
        "not valid JSON at byte 9: unterminated string"
    );
    assert_eq!(
        err(b"{\"a\":tru}"),
        "not valid JSON at byte 5: expected a JSON value (true, false or null?)"
    );
    assert_eq!(
        err(b"{\"a\":1.}"),
        "not valid JSON at byte 7: expected a digit after the decimal point"
    );
    assert_eq!(
        err(b"{\"a\":-}"),
        "not valid JSON at byte 6: expected a digit in number"
    );
    assert_eq!(
        err(b"{\"a\":1e}"),
        "not valid JSON at byte 7: expected a digit in the exponent"
    );
    assert_eq!(err(b"{\"a\":\"\xff\"}"), "not valid UTF-8 at byte 6");
    assert_eq!(err(b"{\"a\":\xff}"), "not valid UTF-8 at byte 5");
    assert_eq!(
        err(b"\xef\xbb\xbf{}"),
        "not valid JSON at byte 0: expected a JSON value"
    );
}

#[test]
fn accepted_oddities() {
    let ex = Extractor::new(&[]);
    for ok in [
        &b"{}"[..],
        b" \t\r\n{ } \n",
        b"{\"\":0}",
        b"{\"a\":\"\\ud83d\\ude00\\u00e9\\/\\b\\f\\n\\r\\t\\\"\\\\\"}",
        b"{\"a\":-0.0e+0,\"b\":1E-2,\"c\":[[],{}],\"d\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
        b"{\"a\":1e400}",
        b"{\"a\":\"\x7f\"}",
    ] {
        ex.scan(ok, &mut [])
            .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(ok)));
    }
}

fn nested(open: &str, close: &str, n: usize) -> String {
    format!("{{\"a\":{}1{}}}", open.repeat(n - 1), close.repeat(n - 1))
}

#[test]
fn nesting_limit_matches_serde_json() {
    let ex = Extractor::new(&paths(&["a.a.a"]));
    let mut found = [None];
    for n in [1, 2, 100, 126, 127, 128, 129, 500] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let line = nested(open, close, n);
            let ours = ex.scan(line.as_bytes(), &mut found);
            let theirs = serde_json::from_str::<Value>(&line);
            assert_eq!(
                ours.is_ok(),
                theirs.is_ok(),
                "depth {n} {open}: {ours:?} {theirs:?}"
            );
            if n >= 128 {
                assert_eq!(ours, Err(JsonError::TooDeep));
            }
        }
    }
    assert_eq!(
        JsonError::TooDeep.to_string(),
        "not valid JSON: nested 128 levels deep or more"
    );
}

#[test]
fn helpers() {
    assert_eq!(kind(b"\"x\""), JsonKind::String);
    assert_eq!(kind(b"-1"), JsonKind::Number);
    assert_eq!(kind(b"12.5"), JsonKind::Number);
    assert_eq!(kind(b"true"), JsonKind::Bool);
    assert_eq!(kind(b"false"), JsonKind::Bool);
    assert_eq!(kind(b"null"), JsonKind::Null);
    assert_eq!(kind(b"{}"), JsonKind::Object);
    assert_eq!(kind(b"[]"), JsonKind::Array);
    assert_eq!(JsonKind::Array.describe(), "an array");
    assert!(is_integer(b"-42"));
    assert!(!is_integer(b"4.0"));
    assert!(!is_integer(b"4e2"));

    assert_eq!(string_content(b"\"abc\""), Some(&b"abc"[..]));
    assert_eq!(string_content(b"\"\""), Some(&b""[..]));
    assert_eq!(string_content(b"\"a\\nb\""), None);
    assert_eq!(string_content(b"12"), None);
    assert_eq!(string_content(b"\""), None);

    let mut out = b"pre:".to_vec();
    unescape_string(r#""a\u005fb\n\ud83d\ude00\"\\\/é""#.as_bytes(), &mut out).expect("valid");
    assert_eq!(String::from_utf8(out).expect("utf8"), "pre:a_b\n😀\"\\/é");
    let mut out = Vec::new();
    for bad in [
        &br#""\ud800""#[..],
        br#""\udc00x""#,
        br#""\ud800\u0041""#,
        br#""\q""#,
        br#""\u12""#,
        b"\"abc",
        b"abc\"",
        b"\"",
        b"\"a\x01\"",
    ] {
        assert!(
            unescape_string(bad, &mut out).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }

    let mut out = Vec::new();
    write_json_string(
        "a\"b\\c\nd\re\tf\u{8}g\u{c}h\u{1}i\u{1f}j\u{7f}é😀/".as_bytes(),
        &mut out,
    );
    assert_eq!(
        String::from_utf8(out).expect("utf8"),
        r#""a\"b\\c\nd\re\tf\bg\fh\u0001i\u001fj"#.to_owned() + "\u{7f}é😀/\""
    );
}

#[test]
fn span_helpers() {
    let s = Span { start: 1, end: 3 };
    assert_eq!(s.range(), 1..3);
    assert_eq!(s.of(b"abcd"), b"bc");
    assert_eq!(s.of(b"ab"), b"");
}

// ---------------------------------------------------------------------------------------
// Properties against serde_json
// ---------------------------------------------------------------------------------------

/// What serde_json says: Some(is_object) when it accepts, None when it rejects; Err(())
/// for the one intentional difference (numbers overflowing f64).
fn serde_verdict(line: &[u8]) -> Result<Option<Value>, ()> {
    match serde_json::from_slice::<Value>(line) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.to_string().starts_with("number out of range") => Err(()),
        Err(_) => Ok(None),
    }
}

/// The value at `segs` following objects only.
fn lookup<'v>(v: &'v Value, segs: &[String]) -> Option<&'v Value> {
    let mut cur = v;
    for s in segs {
        cur = cur.as_object()?.get(s)?;
    }
    Some(cur)
}

/// Checks `scan` against serde_json on `line` for the given paths.
fn check_line(line: &[u8], path_names: &[Vec<String>]) -> Result<(), TestCaseError> {
    let fps: Vec<FieldPath> = path_names
        .iter()
        .map(|segs| FieldPath::parse(&segs.join(".")).expect("valid path"))
        .collect();
    let ex = Extractor::new(&fps);
    let mut found = vec![None; fps.len()];
    let ours = ex.scan(line, &mut found);
    let Ok(verdict) = serde_verdict(line) else {
        return Ok(());
    };
    match (&ours, verdict) {
        (Ok(()), Some(v)) if v.is_object() => {
            for (segs, span) in path_names.iter().zip(&found) {
                let want = lookup(&v, segs);
                let got = span.map(|s| {
                    serde_json::from_slice::<Value>(s.of(line)).expect("span is a valid value")
                });
                prop_assert_eq!(
                    got.as_ref(),
                    want,
                    "path {:?} in {:?}",
                    segs,
                    String::from_utf8_lossy(line)
                );
            }
        }
        (Err(JsonError::NotObject { .. }), Some(v)) if !v.is_object() => {}
        (Err(JsonError::NotJson { .. } | JsonError::NotUtf8 { .. } | JsonError::TooDeep), None) => {
        }
        (ours, theirs) => {
            return Err(TestCaseError::fail(format!(
                "disagree on {:?}: ours {ours:?}, serde_json {theirs:?}",
                String::from_utf8_lossy(line)
            )));
        }
    }
    Ok(())
}

const KEYS: &[&str] = &[
    "a",
    "b",
    "visit_id",
    "ctx",
    "ü",
    "q\"",
    "x\\y",
    "/",
    "~",
    "",
    "long_member_name_x",
];

fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => proptest::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-c]{1,3}",
        1 => any::<String>().prop_filter("no dots", |s| !s.contains('.')),
    ]
}

fn value_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        proptest::sample::select(KEYS).prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((key_strategy(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn object_strategy() -> impl Strategy<Value = Value> {
    proptest::collection::vec((key_strategy(), value_strategy()), 0..8)
        .prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

/// Every object path of `v` (through objects only), plus a few that do not exist.
fn paths_of(v: &Value) -> Vec<Vec<String>> {
    fn walk(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if let Some(map) = v.as_object() {
            for (k, child) in map {
                if k.is_empty() || k.contains('.') {
                    continue;
                }
                prefix.push(k.clone());
                out.push(prefix.clone());
                walk(child, prefix, out);
                prefix.pop();
            }
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out.truncate(56);
    for extra in [
        &["a"][..],
        &["a", "b"],
        &["ctx", "a"],
        &["zzz"],
        &["b", "a", "visit_id"],
    ] {
        out.push(extra.iter().map(|s| (*s).to_owned()).collect());
    }
    out
}

/// A tiny deterministic generator for the choices of `write_variant`.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

/// Writes `v` as JSON with random whitespace and random `\u` escapes (surrogate pairs
/// for astral characters) in strings and member names.
fn write_variant(v: &Value, c: &mut Choices, out: &mut String) {
    let ws = |c: &mut Choices, out: &mut String| {
        if c.one_in(4) {
            out.push_str([" ", "\t", "\n", "\r\n ", "  "][(c.next() % 5) as usize]);
        }
    };
    let string = |s: &str, c: &mut Choices, out: &mut String| {
        out.push('"');
        for ch in s.chars() {
            if c.one_in(3) || ch == '"' || ch == '\\' || (ch as u32) < 0x20 {
                let mut units = [0u16; 2];
                for u in ch.encode_utf16(&mut units) {
                    if c.one_in(2) {
                        out.push_str(&format!("\\u{u:04x}"));
                    } else {
                        out.push_str(&format!("\\u{u:04X}"));
                    }
                }
            } else if ch == '/' && c.one_in(2) {
                out.push_str("\\/");
            } else {
                out.push(ch);
            }
        }
        out.push('"');
    };
    ws(c, out);
    match v {
        Value::Object(map) => {
            out.push('{');
            ws(c, out);
            for (i, (k, child)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(c, out);
                string(k, c, out);
                ws(c, out);
                out.push(':');
                write_variant(child, c, out);
            }
            ws(c, out);
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            ws(c, out);
            for (i, child) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_variant(child, c, out);
            }
            out.push(']');
        }
        Value::String(s) => string(s, c, out),
        other => out.push_str(&other.to_string()),
    }
    ws(c, out);
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(proptest::sample::Index),
    Insert(proptest::sample::Index, u8),
    Replace(proptest::sample::Index, u8),
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        4 => proptest::sample::select(&b"{}[]\":,\\ 0123456789.eE+-tfnulraxu\x01\x1f\x7f"[..]),
        1 => any::<u8>(),
    ];
    prop_oneof![
        any::<proptest::sample::Index>().prop_map(Mutation::Delete),
        (any::<proptest::sample::Index>(), byte.clone()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<proptest::sample::Index>(), byte).prop_map(|(i, b)| Mutation::Replace(i, b)),
    ]
}

fn mutate(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        match m {
            Mutation::Delete(i) if !bytes.is_empty() => {
                let i = i.index(bytes.len());
                bytes.remove(i);
            }
            Mutation::Insert(i, b) => {
                let i = i.index(bytes.len() + 1);
                bytes.insert(i, *b);
            }
            Mutation::Replace(i, b) if !bytes.is_empty() => {
                let i = i.index(bytes.len());
                bytes[i] = *b;
            }
            _ => {}
        }
    }
    bytes
}

/// JSON-like text built from near-valid tokens: mostly valid objects with repeated member
/// names, sometimes a token or separator that is subtly wrong.
fn tokens_strategy() -> impl Strategy<Value = String> {
    const NUMBERS: &[&str] = &[
        "0",
        "-0",
        "1",
        "12",
        "-12",
        "1.5",
        "1e5",
        "1E+5",
        "1e-5",
        "0.0",
        "1.5e3",
        "0e0",
        "123456789012345678901234567890",
    ];
    const BAD_NUMBERS: &[&str] = &["01", "-01", "1.", "-.5", ".5", "1e", "1e+", "00", "-", "+1"];
    const STRINGS: &[&str] = &[
        r#""""#,
        r#""a""#,
        r#""\u0061""#,
        r#""\ud83d\ude00""#,
        "\"é\"",
        r#""\/""#,
        r#""\"""#,
        "\"\u{7f}\"",
    ];
    const BAD_STRINGS: &[&str] = &[
        r#""\ud83d""#,
        r#""\udc00""#,
        r#""\x""#,
        r#""\u00g0""#,
        "\"\t\"",
        r#""\ud83d\u0041""#,
        r#""\ud83d\ud83d""#,
        r#""abc"#,
    ];
    const LITERALS: &[&str] = &["true", "false", "null"];
    const BAD_LITERALS: &[&str] = &["tru", "nul", "True", "nulll"];
    const KEYS: &[&str] = &[r#""a""#, r#""b""#, r#""\u0061""#, r#""c""#, r#""a\\""#];
    const BAD_KEYS: &[&str] = &["a", r#""b"#, "1"];
    const WS: &[&str] = &["", "", "", "", "", "", " ", "\n", "\r", "\t"];
    const BAD_WS: &[&str] = &["\u{c}", "\u{a0}", "\u{0}"];
    const COMMA: &[&str] = &[","];
    const BAD_COMMA: &[&str] = &[",,", ";", ""];
    const COLON: &[&str] = &[":"];
    const BAD_COLON: &[&str] = &["", "::", "="];
    fn pick(
        good: &'static [&'static str],
        bad: &'static [&'static str],
    ) -> impl Strategy<Value = &'static str> + Clone {
        prop_oneof![40 => proptest::sample::select(good), 1 => proptest::sample::select(bad)]
    }
    let ws = || pick(WS, BAD_WS);
    let leaf = prop_oneof![
        pick(NUMBERS, BAD_NUMBERS),
        pick(STRINGS, BAD_STRINGS),
        pick(LITERALS, BAD_LITERALS),
    ]
    .prop_map(str::to_owned);
    let value = leaf.prop_recursive(4, 40, 5, move |inner| {
        prop_oneof![
            (
                proptest::collection::vec(
                    (
                        ws(),
                        pick(KEYS, BAD_KEYS),
                        ws(),
                        pick(COLON, BAD_COLON),
                        ws(),
                        inner.clone(),
                        pick(COMMA, BAD_COMMA)
                    ),
                    0..5,
                ),
                proptest::bool::weighted(0.02),
            )
                .prop_map(|(members, trailing_comma)| {
                    let mut out = String::from("{");
                    let n = members.len();
                    for (i, (w1, k, w2, colon, w3, v, comma)) in members.into_iter().enumerate() {
                        out.push_str(w1);
                        out.push_str(k);
                        out.push_str(w2);
                        out.push_str(colon);
                        out.push_str(w3);
                        out.push_str(&v);
                        if i + 1 < n {
                            out.push_str(comma);
                        } else if trailing_comma {
                            out.push(',');
                        }
                    }
                    out.push('}');
                    out
                }),
            (
                proptest::collection::vec((ws(), inner), 0..4),
                pick(COMMA, BAD_COMMA)
            )
                .prop_map(|(items, comma)| {
                    let parts: Vec<String> =
                        items.into_iter().map(|(w, v)| format!("{w}{v}")).collect();
                    format!("[{}]", parts.join(comma))
                }),
        ]
    });
    (ws(), value, ws()).prop_map(|(a, v, b)| format!("{a}{v}{b}"))
}

#[test]
fn near_valid_tokens_are_often_valid_objects() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = tokens_strategy();
    let (mut objects, mut invalid, n) = (0, 0, 2000);
    for _ in 0..n {
        let line = strategy.new_tree(&mut runner).expect("generates").current();
        match serde_json::from_str::<Value>(&line) {
            Ok(v) if v.is_object() => objects += 1,
            Ok(_) => {}
            Err(_) => invalid += 1,
        }
    }
    assert!(
        objects > n / 5 && invalid > n / 5,
        "{objects} objects, {invalid} invalid of {n}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn arbitrary_bytes_agree_with_serde_json(line in proptest::collection::vec(any::<u8>(), 0..64)) {
        check_line(&line, &[vec!["a".to_owned()]])?;
    }

    #[test]
    fn long_json_alphabet_lines_agree_with_serde_json(
        body in proptest::collection::vec(
            proptest::sample::select(&b"{}[]\":,\\ \t0123456789.eE+-aeflnrstu/bfx\xc3\xa9\x01"[..]),
            60..400,
        )
    ) {
        // Several 64-byte blocks of the structural pass, opening like an object.
        let mut line = b"{\"a\":".to_vec();
        line.extend_from_slice(&body);
        check_line(&line, &[vec!["a".to_owned()], vec!["a".to_owned(), "a".to_owned()]])?;
    }

    #[test]
    fn json_alphabet_agrees_with_serde_json(
        line in proptest::collection::vec(
            proptest::sample::select(&b"{}[]\":,\\ \t0123456789.eE+-aeflnrstu/bfx\xc3\xa9\x01"[..]),
            0..48,
        )
    ) {
        check_line(&line, &[vec!["a".to_owned()], vec!["a".to_owned(), "a".to_owned()]])?;
    }

    #[test]
    fn valid_objects_extract_like_serde_json(v in object_strategy(), seed in 1u64.., pretty in any::<bool>()) {
        let compact = if pretty {
            serde_json::to_string_pretty(&v).expect("serializes")
        } else {
            serde_json::to_string(&v).expect("serializes")
        };
        let paths = paths_of(&v);
        check_line(compact.as_bytes(), &paths)?;
        let mut variant = String::new();
        write_variant(&v, &mut Choices(seed), &mut variant);
        let back: Value = serde_json::from_str(&variant).expect("variant is valid JSON");
        // (Floats may differ in the last bit: serde_json does not round-trip them exactly.)
        prop_assert_eq!(back.as_object().map(|m| m.len()), v.as_object().map(|m| m.len()));
        check_line(variant.as_bytes(), &paths)?;
    }

    #[test]
    fn mutated_objects_agree_with_serde_json(
        v in object_strategy(),
        seed in 1u64..,
        muts in proptest::collection::vec(mutation_strategy(), 1..4),
    ) {
        let mut text = String::new();
        write_variant(&v, &mut Choices(seed), &mut text);
        let line = mutate(text.into_bytes(), &muts);
        check_line(&line, &paths_of(&v))?;
    }

    #[test]
    fn near_valid_tokens_agree_with_serde_json(line in tokens_strategy()) {
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        check_line(line.as_bytes(), &[p("a"), p("a.a"), p("a.b"), p("b"), p("b.a"), p("c"), p("a\\")])?;
    }

    #[test]
    fn any_value_agrees_with_serde_json(v in value_strategy()) {
        let text = serde_json::to_string(&v).expect("serializes");
        check_line(text.as_bytes(), &[vec!["a".to_owned()]])?;
    }

    #[test]
    fn unescape_matches_serde_json(s in any::<String>(), seed in 1u64..) {
        let mut text = String::new();
        write_variant(&Value::String(s.clone()), &mut Choices(seed), &mut text);
        let raw = text.trim_matches(|c: char| c.is_ascii_whitespace());
        let mut out = Vec::new();
        unescape_string(raw.as_bytes(), &mut out).expect("valid string");
        prop_assert_eq!(String::from_utf8(out).expect("utf8"), s.clone());
        prop_assert_eq!(string_content(raw.as_bytes()).is_some(), !raw.contains('\\'));
    }

    #[test]
    fn write_json_string_round_trips(s in any::<String>()) {
        let mut out = Vec::new();
        write_json_string(s.as_bytes(), &mut out);
        let back: String = serde_json::from_slice(&out).expect("valid JSON string");
        prop_assert_eq!(back, s.clone());
        let mut dec = Vec::new();
        unescape_string(&out, &mut dec).expect("valid");
        prop_assert_eq!(dec, s.into_bytes());
    }
}
