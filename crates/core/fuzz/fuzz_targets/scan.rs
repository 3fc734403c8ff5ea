//! The JSON scanner (its SIMD structural pass on a CPU that has AVX2 or AVX-512, else
//! the byte-at-a-time scanner) against serde_json on arbitrary bytes: the same verdict,
//! and the same value at every path. The decoder must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sessionizer_core::decode::{Decoder, DecoderConfig};
use sessionizer_core::json::{Extractor, FieldPath, JsonError, Span};
use std::sync::OnceLock;

const PATHS: [&str; 7] = ["visit_id", "event_time", "page", "a", "a.b", "a.b.c", "b"];

fn lookup<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |cur, seg| cur.as_object()?.get(seg))
}

fuzz_target!(|data: &[u8]| {
    static EX: OnceLock<Extractor> = OnceLock::new();
    let ex = EX.get_or_init(|| {
        let paths: Vec<FieldPath> = PATHS.iter().map(|p| FieldPath::parse(p).unwrap()).collect();
        Extractor::new(&paths)
    });
    let mut found = [None::<Span>; PATHS.len()];
    let ours = ex.scan(data, &mut found);
    match (ours, serde_json::from_slice::<Value>(data)) {
        (Ok(()), Ok(v)) => {
            assert!(v.is_object(), "accepted a non-object");
            for (path, span) in PATHS.iter().zip(found) {
                let got = span.map(|s| {
                    serde_json::from_slice::<Value>(s.of(data)).expect("a span is a JSON value")
                });
                assert_eq!(got.as_ref(), lookup(&v, path), "path {path}");
            }
        }
        (Err(JsonError::NotObject { .. }), Ok(v)) => assert!(!v.is_object()),
        (Err(JsonError::NotJson { .. } | JsonError::NotUtf8 { .. } | JsonError::TooDeep), Err(_)) => {}
        // The one intended difference: numbers beyond f64 are valid JSON.
        (Ok(()) | Err(JsonError::NotObject { .. }), Err(e))
            if e.to_string().starts_with("number out of range") => {}
        (ours, theirs) => panic!("scanner {ours:?}, serde_json {theirs:?}"),
    }
    let mut d = Decoder::new(DecoderConfig::default());
    let _ = d.decode(data);
});
