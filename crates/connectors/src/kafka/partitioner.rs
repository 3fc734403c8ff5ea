//! Kafka's default partitioner, so that a record keyed by anything lands in the partition
//! that a Java producer would pick for the *session key*: `toPositive(murmur2(key)) % n`
//! (`org.apache.kafka.common.utils.Utils.murmur2`, seed `0x9747b28c`).
//!
//! The output records are keyed by `session_id`, but SPEC §3 places them by the session
//! key, so every record of one key stays in order in one partition — the partition its
//! input records came from when the input topic is keyed by the session key and has as
//! many partitions.

/// Kafka's 32-bit murmur2 of `data`, exactly as `Utils.murmur2` (Java) computes it.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives `key` among `partitions`.
pub fn partition_for(key: &[u8], partitions: usize) -> i32 {
    let positive = (murmur2(key) & 0x7fff_ffff) as u32;
    (positive % partitions.max(1) as u32) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed with `org.apache.kafka.common.utils.Utils` of kafka-clients 4.1.1:
    /// `murmur2(key.getBytes(UTF_8))`, then `toPositive(h) % 4` and `% 7`.
    const JAVA: &[(&str, i32, i32, i32)] = &[
        ("", 275646681, 1, 2),
        ("a", -1563381124, 0, 5),
        ("ab", 316155434, 2, 0),
        ("abc", 479470107, 3, 4),
        ("abcd", -1323649548, 0, 5),
        ("abcde", 461995741, 1, 4),
        ("21", -973932308, 0, 3),
        ("v1", -69590245, 3, 5),
        ("visit-000042", 516433208, 0, 4),
        ("v-123456789", -375299107, 1, 1),
        ("héllo", 614509002, 2, 2),
        ("0123456789abcdef0123", 203624608, 0, 5),
    ];

    #[test]
    fn murmur2_and_partitions_agree_with_the_java_client() {
        for &(key, hash, p4, p7) in JAVA {
            assert_eq!(murmur2(key.as_bytes()), hash, "murmur2({key:?})");
            assert_eq!(partition_for(key.as_bytes(), 4), p4, "{key:?} among 4");
            assert_eq!(partition_for(key.as_bytes(), 7), p7, "{key:?} among 7");
        }
    }
}
