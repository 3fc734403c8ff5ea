//! Decoding throughput on visit lines from `sessionizer generate` (about 375 bytes, 19
//! members in four objects), against the SIMD JSON crates and serde_json on the same
//! lines. Every contender does the same job: validate the line and pull out `visit_id`,
//! `event_time` and `page`.
//!
//! ```text
//! cargo bench -p sessionizer-core --bench decode
//! DECODE_BENCH_LINES=bench-data/visits-1000000.jsonl cargo bench -p sessionizer-core --bench decode
//! ```
//!
//! The lines come from `benches/visits.jsonl` (512 lines of `sessionizer generate --events
//! 512 --seed 7`) or, with `DECODE_BENCH_LINES`, from the first 20,000 lines of that file.
//! Before measuring, each contender is run on eight invalid variants of a line (an error
//! after the wanted fields, in a member nobody asked for) and the bench prints how many it
//! rejects: a contender that does not reject all eight does not validate the whole line.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde::Deserialize;
use sessionizer_core::decode::{Decoder, DecoderConfig};
use sessionizer_core::json::{Extractor, FieldPath, Span};
use std::borrow::Cow;
use std::hint::black_box;
use std::time::Duration;

fn decoder() -> Decoder {
    Decoder::new(DecoderConfig {
        value_fields: vec![FieldPath::parse("page").expect("valid path")],
        ..DecoderConfig::default()
    })
}

fn lines() -> Vec<Vec<u8>> {
    let text = match std::env::var_os("DECODE_BENCH_LINES") {
        Some(path) => std::fs::read(&path)
            .unwrap_or_else(|e| panic!("cannot read DECODE_BENCH_LINES={path:?}: {e}")),
        None => include_bytes!("visits.jsonl").to_vec(),
    };
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .take(20_000)
        .map(<[u8]>::to_vec)
        .collect()
}

/// The wanted fields, for the serde contenders (unknown fields are skipped, and skipping
/// still parses them).
#[derive(Deserialize)]
struct Visit<'a> {
    #[serde(borrow)]
    visit_id: Cow<'a, str>,
    #[serde(borrow)]
    event_time: Cow<'a, str>,
    #[serde(borrow)]
    page: Cow<'a, str>,
}

/// One way of doing the job; `Ok(total length of the three values)` so that nothing is
/// optimised away, `Err(())` when the line is rejected.
trait Contender {
    fn name(&self) -> &'static str;
    fn run(&mut self, line: &[u8]) -> Result<usize, ()>;
}

struct OwnDecoder(Decoder);
impl Contender for OwnDecoder {
    fn name(&self) -> &'static str {
        "own_decoder"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        let d = self.0.decode(line).map_err(|_| ())?;
        Ok(d.key.len() + d.time.0 as usize + d.value(0).map_or(0, <[u8]>::len))
    }
}

struct OwnExtractor(Extractor, Vec<Option<Span>>);
impl Contender for OwnExtractor {
    fn name(&self) -> &'static str {
        "own_extractor"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        self.0.scan(line, &mut self.1).map_err(|_| ())?;
        Ok(self.1.iter().flatten().map(|s| s.of(line).len()).sum())
    }
}

/// simd-json needs a mutable copy (it unescapes in place); the copy, the buffers and the
/// tape are reused, so nothing is allocated per line.
struct SimdJsonTape {
    copy: Vec<u8>,
    buffers: simd_json::Buffers,
    tape: Option<simd_json::Tape<'static>>,
}
impl Contender for SimdJsonTape {
    fn name(&self) -> &'static str {
        "simd_json_tape"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        use simd_json::prelude::*;
        self.copy.clear();
        self.copy.extend_from_slice(line);
        let mut tape = self
            .tape
            .take()
            .unwrap_or_else(simd_json::Tape::null)
            .reset();
        let result = simd_json::fill_tape(&mut self.copy, &mut self.buffers, &mut tape)
            .map_err(|_| ())
            .and_then(|()| {
                let v = tape.as_value();
                let len = |k: &str| v.get(k).and_then(|x| x.as_str().map(str::len)).unwrap_or(0);
                if !v.is_object() {
                    return Err(());
                }
                Ok(len("visit_id") + len("event_time") + len("page"))
            });
        self.tape = Some(tape.reset());
        result
    }
}

struct SimdJsonSerde(Vec<u8>, simd_json::Buffers);
impl Contender for SimdJsonSerde {
    fn name(&self) -> &'static str {
        "simd_json_serde"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        self.0.clear();
        self.0.extend_from_slice(line);
        let v: Visit<'_> =
            simd_json::serde::from_slice_with_buffers(&mut self.0, &mut self.1).map_err(|_| ())?;
        Ok(v.visit_id.len() + v.event_time.len() + v.page.len())
    }
}

struct SonicGetMany(sonic_rs::PointerTree);
impl Contender for SonicGetMany {
    fn name(&self) -> &'static str {
        "sonic_rs_get_many"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        use sonic_rs::JsonValueTrait;
        let found = sonic_rs::get_many(line, &self.0).map_err(|_| ())?;
        Ok(found
            .iter()
            .flatten()
            .map(|v| v.as_str().map_or(0, str::len))
            .sum())
    }
}

struct SonicSerde;
impl Contender for SonicSerde {
    fn name(&self) -> &'static str {
        "sonic_rs_serde"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        let v: Visit<'_> = sonic_rs::from_slice(line).map_err(|_| ())?;
        Ok(v.visit_id.len() + v.event_time.len() + v.page.len())
    }
}

struct SerdeJson;
impl Contender for SerdeJson {
    fn name(&self) -> &'static str {
        "serde_json_serde"
    }
    fn run(&mut self, line: &[u8]) -> Result<usize, ()> {
        let v: Visit<'_> = serde_json::from_slice(line).map_err(|_| ())?;
        Ok(v.visit_id.len() + v.event_time.len() + v.page.len())
    }
}

fn contenders() -> Vec<Box<dyn Contender>> {
    let paths: Vec<FieldPath> = ["visit_id", "event_time", "page"]
        .iter()
        .map(|p| FieldPath::parse(p).expect("valid path"))
        .collect();
    let mut tree = sonic_rs::PointerTree::new();
    tree.add_path(["visit_id"].iter());
    tree.add_path(["event_time"].iter());
    tree.add_path(["page"].iter());
    vec![
        Box::new(OwnDecoder(decoder())),
        Box::new(OwnExtractor(Extractor::new(&paths), vec![None; 3])),
        Box::new(SimdJsonTape {
            copy: Vec::new(),
            buffers: simd_json::Buffers::new(4096),
            tape: None,
        }),
        Box::new(SimdJsonSerde(Vec::new(), simd_json::Buffers::new(4096))),
        Box::new(SonicGetMany(tree)),
        Box::new(SonicSerde),
        Box::new(SerdeJson),
    ]
}

/// Invalid variants of `line`, each broken after the wanted fields, in the nested
/// `context` object that no contender was asked for.
fn invalid_variants(line: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let text = String::from_utf8(line.to_vec()).expect("UTF-8 line");
    let at = text
        .rfind("\"lang\":\"")
        .expect("the line has context.app.lang")
        + 8;
    let (head, tail) = text.split_at(at);
    let with = |mid: &[u8]| [head.as_bytes(), mid, tail.as_bytes()].concat();
    let mut trailing = line.to_vec();
    trailing.extend_from_slice(b" x");
    let mut truncated = line.to_vec();
    truncated.pop();
    vec![
        ("control character in a string", with(b"\x01")),
        ("invalid escape", with(b"\\q")),
        ("lone surrogate escape", with(b"\\ud800")),
        ("invalid UTF-8", with(b"\xff")),
        (
            "bad literal",
            text.replacen("\"context\":{", "\"context\":{\"x\":tru,", 1)
                .into_bytes(),
        ),
        (
            "number with a leading zero",
            text.replacen("\"context\":{", "\"context\":{\"x\":01,", 1)
                .into_bytes(),
        ),
        ("trailing characters", trailing),
        ("missing closing brace", truncated),
    ]
}

fn bench(c: &mut Criterion) {
    let lines = lines();
    let bytes: usize = lines.iter().map(Vec::len).sum();
    println!(
        "decode bench: {} lines, {} bytes, {:.0} bytes per line",
        lines.len(),
        bytes,
        bytes as f64 / lines.len() as f64
    );
    let variants = invalid_variants(&lines[0]);
    for mut c in contenders() {
        for line in &lines {
            assert!(c.run(line).is_ok(), "{} rejects a valid line", c.name());
        }
        let accepted: Vec<&str> = variants
            .iter()
            .filter(|(_, v)| c.run(v).is_ok())
            .map(|(what, _)| *what)
            .collect();
        println!(
            "validation: {:<18} rejects {}/{} invalid variants{}",
            c.name(),
            variants.len() - accepted.len(),
            variants.len(),
            if accepted.is_empty() {
                String::new()
            } else {
                format!(" (accepts: {})", accepted.join(", "))
            }
        );
    }

    let mut group = c.benchmark_group("decode");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(lines.len() as u64));
    for mut c in contenders() {
        group.bench_function(c.name(), |b| {
            b.iter(|| {
                let mut sum = 0;
                for line in &lines {
                    sum += c.run(black_box(line)).unwrap_or(0);
                }
                black_box(sum)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
