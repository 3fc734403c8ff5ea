//! The tests' S3-compatible object store: SeaweedFS started by `scripts/s3-dev.sh` on
//! 127.0.0.1, on a port below Linux's ephemeral range, with its data in a home of its own
//! (`SESSIONIZER_TEST_S3_HOME`, or `~/.cache/sessionizer-s3-tests`; `scripts/test.sh`
//! wipes it before every run of the suite).
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The S3 port of the tests' server (its other listeners take the nine ports above).
pub const PORT: u16 = 28333;

fn script(args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-dev.sh");
    let home = std::env::var("SESSIONIZER_TEST_S3_HOME").unwrap_or_else(|_| {
        format!(
            "{}/.cache/sessionizer-s3-tests",
            std::env::var("HOME").expect("HOME is set")
        )
    });
    let out = Command::new("bash")
        .arg(&path)
        .args(args)
        .env("S3_DEV_PORT", PORT.to_string())
        .env("S3_DEV_HOME", home)
        .output()
        .expect("run scripts/s3-dev.sh");
    assert!(
        out.status.success(),
        "scripts/s3-dev.sh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

/// The server's client settings (`AWS_ENDPOINT_URL`, keys, region), started on first
/// use.
pub fn server() -> &'static [(String, String)] {
    static ENV: OnceLock<Vec<(String, String)>> = OnceLock::new();
    ENV.get_or_init(|| {
        script(&["start"]);
        script(&["env"])
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// A location `s3://sessionizer-tests/<prefix>-<unique>` no other test (or earlier run)
/// uses, in the tests' one bucket (made on first use).
pub fn unique(prefix: &str) -> String {
    static BUCKET: OnceLock<()> = OnceLock::new();
    static N: AtomicU32 = AtomicU32::new(0);
    server();
    BUCKET.get_or_init(|| {
        script(&["bucket", BUCKET_NAME]);
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!(
        "s3://{BUCKET_NAME}/{prefix}-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The tests' bucket.
pub const BUCKET_NAME: &str = "sessionizer-tests";
