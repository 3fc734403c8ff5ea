//! Decoding throughput on a realistic visit record (key + time + one value field).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sessionizer_core::decode::{Decoder, DecoderConfig};
use sessionizer_core::json::FieldPath;
use std::hint::black_box;

const LINE: &str = r#"{"visit_id":"v-000123456","event_time":"2024-03-15T12:34:56.789Z","user_id":"u-48213","page":"/products/electronics/laptops/ultrabook-14-pro?ref=homepage","referrer":"https://www.example.com/search?q=laptop","user_agent":"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/122.0 Safari/537.36","context":{"user":{"login":"jdoe"},"country":"DE","device":"desktop"}}"#;

fn decoder() -> Decoder {
    Decoder::new(DecoderConfig {
        value_fields: vec![FieldPath::parse("page").expect("valid path")],
        ..DecoderConfig::default()
    })
}

/// Many distinct lines, so that the branch predictor cannot learn one line by heart.
fn lines(n: usize) -> Vec<String> {
    let pages = [
        "/",
        "/products",
        "/cart",
        "/checkout/payment",
        "/search?q=usb+c+hub",
    ];
    let devices = ["desktop", "mobile", "tablet"];
    (0..n)
        .map(|i| {
            let page = pages[i % pages.len()];
            let device = devices[i % devices.len()];
            let ms = (i * 7919) % 1000;
            let sec = (i * 31) % 60;
            format!(
                r#"{{"visit_id":"v-{i:09}","event_time":"2024-03-15T12:{:02}:{sec:02}.{ms:03}Z","user_id":"u-{}","page":"{page}","referrer":"https://www.example.com/search?q=laptop&p={}","user_agent":"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/122.0 Safari/537.36","context":{{"user":{{"login":"user{}"}},"country":"DE","device":"{device}"}}}}"#,
                i % 60,
                i % 50_000,
                i % 9,
                i % 1000,
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(1));
    let mut dec = decoder();
    group.bench_function("visit_line", |b| {
        b.iter(|| {
            let d = dec.decode(black_box(LINE.as_bytes())).expect("valid line");
            black_box((d.key, d.time, d.value(0)));
        })
    });
    let many = lines(4096);
    group.throughput(Throughput::Elements(many.len() as u64));
    let mut dec = decoder();
    group.bench_function("4096_distinct_lines", |b| {
        b.iter(|| {
            for line in &many {
                let d = dec.decode(black_box(line.as_bytes())).expect("valid line");
                black_box((d.key, d.time, d.value(0)));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
