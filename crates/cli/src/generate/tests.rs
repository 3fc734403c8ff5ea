//! Tests of the generator.

use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration_arg("0"), Ok(0));
    assert_eq!(parse_duration_arg("0s"), Ok(0));
    assert_eq!(parse_duration_arg("250ms"), Ok(250));
    assert_eq!(parse_duration_arg("1h30m"), Ok(90 * MINUTE));
    assert_eq!(parse_duration_arg("2d"), Ok(48 * 60 * MINUTE));
    assert!(parse_duration_arg("").is_err());
    assert!(parse_duration_arg("10").is_err());
    assert!(parse_duration_arg("1x").is_err());
    assert!(parse_duration_arg("-1s").is_err());
}

#[test]
fn timestamps() {
    assert_eq!(parse_timestamp_arg("1970-01-01T00:00:00Z"), Ok(0));
    assert_eq!(
        parse_timestamp_arg("2024-01-01T00:00:00Z"),
        Ok(1_704_067_200_000)
    );
    assert_eq!(
        parse_timestamp_arg("2024-01-01T00:03:00.250Z"),
        Ok(1_704_067_380_250)
    );
    assert_eq!(
        parse_timestamp_arg("2024-01-01T01:03:00.25+01:00"),
        Ok(1_704_067_380_250)
    );
    assert_eq!(
        parse_timestamp_arg("2024-01-01 00:03:00"),
        Ok(1_704_067_380_000)
    );
    assert!(parse_timestamp_arg("2024-02-30T00:00:00Z").is_err());
    assert!(parse_timestamp_arg("yesterday").is_err());
    assert!(parse_timestamp_arg("2024-01-01T00:00:00Zjunk").is_err());
}

#[test]
fn rfc3339_round_trip() {
    for ms in [
        0i64,
        1_704_067_380_250,
        951_782_400_000,
        4_102_444_799_999,
        16_725_225_600_123,
    ] {
        let mut out = Vec::new();
        write_rfc3339_ms(EventTime(ms), &mut out);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(parse_timestamp_arg(&s), Ok(ms), "{s}");
    }
    let mut out = Vec::new();
    write_rfc3339_ms(EventTime(1_704_067_380_250), &mut out);
    assert_eq!(out, b"2024-01-01T00:03:00.250Z");
}

#[test]
fn time_buf_matches_core() {
    let mut tb = TimeBuf::default();
    let day = MS_PER_DAY;
    let mut times = vec![
        i64::MIN / 2,
        -62_167_219_200_001,
        -1,
        0,
        day - 1,
        day,
        1_709_251_199_999,
        253_402_300_799_999,
        253_402_300_800_000,
        i64::MAX / 2,
    ];
    times.extend((0..20_000).map(|i| 1_704_067_200_000 + i * 7_654_321));
    for ms in times {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        tb.write_rfc3339_ms(&mut a, ms);
        write_rfc3339_ms(EventTime(ms), &mut b);
        assert_eq!(a, b, "{ms}");
    }
}

#[test]
fn far_future() {
    let y2500 = 16_725_225_600_000;
    let at = |s: &str| parse_timestamp_arg(s).unwrap();
    assert_eq!(in_year_2500(at("2024-01-01T00:00:00Z")), y2500);
    assert_eq!(
        in_year_2500(at("2024-03-05T06:07:08.009Z")),
        at("2500-03-05T06:07:08.009Z") + MS_PER_DAY
    );
    assert_eq!(
        in_year_2500(at("2023-12-31T23:59:59.999Z")),
        at("2500-12-31T23:59:59.999Z")
    );
    assert_eq!(in_year_2500(at("0000-01-01T00:00:00Z")), y2500);
    assert_eq!(
        in_year_2500(at("9999-07-01T00:00:00Z")),
        at("2500-07-01T00:00:00Z")
    );
    // Year 10000 and year -1, beyond what parse_timestamp reads.
    assert_eq!(in_year_2500(253_402_300_800_000 + 5), y2500 + 5);
    assert_eq!(
        in_year_2500(-62_167_219_200_000 - 1),
        at("2500-12-31T23:59:59.999Z")
    );
}
