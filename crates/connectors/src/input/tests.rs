//! The line reader's tests: batches, oversized records, positions, inputs read one
//! after another.

use super::*;
use std::io::Write;

#[test]
fn a_split_batch_keeps_each_line_and_its_whole_length() {
    let mut b = Batch::default();
    let long = vec![b'x'; RECORD_HEAD + 10];
    for (i, v) in [b"a".as_slice(), &long, b"ccc", &long, b"e"]
        .iter()
        .enumerate()
    {
        b.push_record(v, 0, 10 + i as u64, RECORD_HEAD);
    }
    let rest = b.split_off(2);
    assert_eq!(b.lines.len(), 2);
    assert_eq!(b.line(0), b"a");
    assert_eq!(b.oversized_len(1), Some(long.len() as u64));
    assert_eq!(b.data.len(), b.lines[1].end as usize);
    assert_eq!(rest.lines.len(), 3);
    assert_eq!(rest.line(0), b"ccc");
    assert_eq!(rest.lines[0].at, 12);
    assert_eq!(rest.oversized_len(0), None);
    assert_eq!(rest.oversized_len(1), Some(long.len() as u64));
    assert_eq!(rest.line(2), b"e");
    assert_eq!(rest.lines[2].at, 14);
    // Split at the end: nothing moves.
    let mut whole = rest;
    assert!(whole.split_off(3).lines.is_empty());
    assert_eq!(whole.lines.len(), 3);
}

fn collect(inputs: &mut Inputs, target: usize) -> Vec<(u32, u64, String)> {
    let mut out = Vec::new();
    let mut batch = Batch::default();
    while inputs.next_batch(&mut batch, target).expect("read") {
        for (i, l) in batch.lines.iter().enumerate() {
            out.push((
                l.input,
                l.at,
                String::from_utf8_lossy(batch.line(i)).into_owned(),
            ));
        }
    }
    out
}

#[test]
fn lines_of_several_files_in_order_with_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    std::fs::write(&a, "one\r\ntwo\n\nfour").expect("write");
    std::fs::write(&b, "x\n").expect("write");
    let mut inputs = Inputs::new(vec![InputSource::File(a), InputSource::File(b)]);
    assert_eq!(
        collect(&mut inputs, 1 << 20),
        vec![
            (0, 1, "one".into()),
            (0, 2, "two".into()),
            (0, 3, "".into()),
            (0, 4, "four".into()),
            (1, 1, "x".into()),
        ]
    );
}

#[test]
fn lines_longer_than_a_batch_and_across_batch_borders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("big.jsonl");
    let long = "y".repeat(CHUNK_MIN * 5 + 17);
    let mut f = File::create(&p).expect("create");
    let mut expected = Vec::new();
    for i in 0..3000 {
        let line = format!("{i}-{}", "z".repeat(i % 700));
        if i % 7 == 0 {
            write!(f, "{line}\r\n").expect("write");
        } else {
            writeln!(f, "{line}").expect("write");
        }
        expected.push(line);
    }
    writeln!(f, "{long}").expect("write");
    expected.push(long);
    drop(f);
    for target in [1, 1000, CHUNK_MIN, 1 << 20] {
        let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]);
        let got: Vec<String> = collect(&mut inputs, target)
            .into_iter()
            .map(|l| l.2)
            .collect();
        assert_eq!(got, expected, "target {target}");
        assert_eq!(
            inputs.bytes_read(),
            std::fs::metadata(&p).expect("meta").len()
        );
    }
}

#[test]
fn resuming_at_any_batch_end_gives_the_remaining_lines_with_their_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    let c = dir.path().join("c.jsonl");
    let mut text = String::new();
    for i in 0..500 {
        text.push_str(&format!("a{i}-{}\n", "x".repeat(i % 37)));
    }
    std::fs::write(&a, &text).expect("write");
    std::fs::write(&b, "").expect("write");
    std::fs::write(&c, "c1\r\nc2\n\nc4 without newline").expect("write");
    let sources = vec![
        InputSource::File(a.clone()),
        InputSource::File(b),
        InputSource::File(c),
    ];
    let all = collect(&mut Inputs::new(sources.clone()), 1 << 20);
    for target in [1, 700, 5000] {
        let mut inputs = Inputs::new(sources.clone());
        let mut batch = Batch::default();
        let mut seen = 0;
        while inputs.next_batch(&mut batch, target).expect("read") {
            seen += batch.lines.len();
            let rest = collect(&mut Inputs::starting_at(sources.clone(), batch.end), target);
            assert_eq!(
                &all[seen..],
                &rest[..],
                "resumed at {:?} (target {target})",
                batch.end
            );
        }
    }
    let mut inputs = Inputs::new(sources.clone());
    let mut batch = Batch::default();
    let mut last = ReadPosition::default();
    while inputs.next_batch(&mut batch, 1 << 20).expect("read") {
        last = batch.end;
    }
    assert_eq!(
        last,
        ReadPosition {
            input: 2,
            offset: 26,
            line_no: 4
        },
        "the end of the last input, whole"
    );
}

/// Regression (issue 8): a line longer than a batch was copied again on every
/// read — 100 MB took 20 s. Counting the bytes carried between batches (and the
/// reads) shows the cost is linear, whatever the batch target.
#[test]
fn a_line_longer_than_a_batch_is_carried_over_at_most_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("long.jsonl");
    let long = "L".repeat(8 << 20);
    let mut text = String::new();
    for i in 0..2000 {
        text.push_str(&format!("short {i}\n"));
    }
    text.push_str(&long);
    text.push('\n');
    text.push_str("after\n");
    text.push_str(&long);
    std::fs::write(&p, &text).expect("write");
    let n = text.len() as u64;
    for target in [1, 1000, CHUNK_MIN, 1 << 20, 4 << 20] {
        let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]);
        let got = collect(&mut inputs, target);
        assert_eq!(got.len(), 2003, "target {target}");
        assert_eq!(got[2000].2.len(), long.len());
        assert_eq!(got[2002].2.len(), long.len());
        assert!(
            inputs.moved <= 2 * n,
            "target {target}: {} bytes carried for {n} bytes of input",
            inputs.moved
        );
    }
}

#[test]
fn batches_report_the_bytes_consumed_through_their_last_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("a.jsonl");
    std::fs::write(&p, "one\ntwo\nthree\nfour without newline").expect("write");
    let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]);
    let mut batch = Batch::default();
    let mut ends = Vec::new();
    while inputs.next_batch(&mut batch, 1).expect("read") {
        ends.push((batch.lines.len(), batch.consumed));
    }
    // One read takes the whole file: the three whole lines (14 bytes), then the
    // last line once the end of the file shows it is complete.
    assert_eq!(ends, vec![(3, 14), (1, 34)]);
}

/// A line longer than the limit is handed out as its first bytes, listed with its
/// whole length, and skipped as it is read: the batch never grows past about twice
/// the limit, however long the line (with or without a newline at the end).
#[test]
fn a_record_longer_than_the_limit_is_skipped_as_it_streams_by() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("big.jsonl");
    let limit = 100_000;
    let big = format!("{{\"x\":\"{}\"}}", "é".repeat(3_000_000));
    let mid = "m".repeat(limit + 1);
    let text = format!("a\n{big}\nb\n{mid}\r\nc\n{big}");
    std::fs::write(&p, &text).expect("write");
    for target in [1, 1000, CHUNK_MIN, 1 << 20] {
        let mut inputs = Inputs::new(vec![InputSource::File(p.clone())]).with_max_record(limit);
        let mut batch = Batch::default();
        let mut lines = Vec::new();
        let mut largest_buffer = 0;
        while inputs.next_batch(&mut batch, target).expect("read") {
            largest_buffer = largest_buffer.max(batch.data.len());
            for i in 0..batch.lines.len() {
                let head = String::from_utf8(batch.line(i).to_vec()).expect("cut at a char");
                lines.push((batch.lines[i].at, head, batch.oversized_len(i)));
            }
        }
        assert!(
            largest_buffer < 3 * limit + (1 << 20) + CHUNK_MIN,
            "target {target}: a buffer of {largest_buffer} bytes"
        );
        let big_len = big.len() as u64;
        let expected_heads = [
            (1, "a".to_string(), None),
            (
                2,
                record_head(big.as_bytes()).len().to_string(),
                Some(big_len),
            ),
            (3, "b".to_string(), None),
            (4, RECORD_HEAD.to_string(), Some(limit as u64 + 2)),
            (5, "c".to_string(), None),
            (
                6,
                record_head(big.as_bytes()).len().to_string(),
                Some(big_len),
            ),
        ];
        let got: Vec<(u64, String, Option<u64>)> = lines
            .iter()
            .map(|(n, head, big)| match big {
                Some(_) => (*n, head.len().to_string(), *big),
                None => (*n, head.clone(), None),
            })
            .collect();
        assert_eq!(got, expected_heads, "target {target}");
        assert!(lines[1].1.starts_with("{\"x\":\"éé"));
        assert_eq!(inputs.bytes_read(), text.len() as u64);
    }
}

/// Regression: reading /dev/zero (one endless line) buffered it whole, gigabytes in
/// seconds. Now the buffer stays near the limit while the line streams by.
#[test]
fn an_endless_line_is_read_in_bounded_memory() {
    let zeros = std::io::repeat(0).take(64 << 20);
    let mut inputs = Inputs::new(vec![InputSource::Stdin]).with_max_record(1 << 20);
    // Stdin stands in for /dev/zero: the reader is swapped for 64 MiB of zeros.
    inputs.open_next_if_needed().expect("open");
    inputs.current.as_mut().expect("open").reader = Box::new(zeros);
    inputs.current.as_mut().expect("open").live = false;
    let mut batch = Batch::default();
    let mut seen = Vec::new();
    while inputs.next_batch(&mut batch, 4 << 20).expect("read") {
        assert!(
            batch.data.len() < 8 << 20,
            "{} bytes buffered",
            batch.data.len()
        );
        seen.extend(batch.oversized.iter().map(|o| o.len));
    }
    assert_eq!(seen, vec![64 << 20]);
}

#[test]
fn a_byte_order_mark_at_the_start_of_a_file_is_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    std::fs::write(&a, b"\xef\xbb\xbf{\"v\":1}\n{\"v\":2}\n").expect("write");
    // Only at the very start: a mark inside a line stays.
    std::fs::write(&b, b"\xef\xbb\xbfx\n\xef\xbb\xbfy\n").expect("write");
    let mut inputs = Inputs::new(vec![InputSource::File(a.clone()), InputSource::File(b)]);
    let got = collect(&mut inputs, 1 << 20);
    assert_eq!(
        got,
        vec![
            (0, 1, "{\"v\":1}".to_string()),
            (0, 2, "{\"v\":2}".to_string()),
            (1, 1, "x".to_string()),
            (1, 2, "\u{feff}y".to_string()),
        ]
    );
    // Resumed after the first line, the mark is not looked for again.
    let at = ReadPosition {
        input: 0,
        offset: 11,
        line_no: 1,
    };
    let rest = collect(
        &mut Inputs::starting_at(vec![InputSource::File(a)], at),
        1 << 20,
    );
    assert_eq!(rest, vec![(0, 2, "{\"v\":2}".to_string())]);
}

#[test]
fn a_missing_file_is_named() {
    let inputs = Inputs::new(vec![InputSource::File("/nonexistent/x.jsonl".into())]);
    let err = inputs.check_readable().expect_err("missing file");
    assert!(err.to_string().contains("/nonexistent/x.jsonl"), "{err}");
}
