//! Kafka's default partitioner, so that a record keyed by anything lands in the partition
//! that a Java producer would pick for the *session key*: `toPositive(murmur2(key)) % n`
//! (`org.apache.kafka.common.utils.Utils.murmur2`, seed `0x9747b28c`).
//!
//! The output records are keyed by `session_id`, but docs/semantics.md K-7 places them by
//! the session key, so every record of one key stays in order in one partition — the
//! partition its input records came from when the input topic is keyed by the session key
//! and has as many partitions.

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

/// The partition librdkafka's `consistent` and `consistent_random` partitioners (its
/// default) give `key` among `partitions`: CRC-32 of the key, modulo the count.
pub fn crc32_partition_for(key: &[u8], partitions: usize) -> i32 {
    (crc32fast::hash(key) % partitions.max(1) as u32) as i32
}

/// The standard partitioners a producer may have placed a keyed record with.
const MURMUR2: u8 = 1;
const CRC32: u8 = 2;

/// Checks that the records of one input partition are placed by their session key: each
/// must sit in the partition that the Java client's default partitioner (murmur2; also
/// librdkafka's `murmur2` and `murmur2_random`) or librdkafka's default
/// (`consistent_random`, CRC-32; also `consistent`) gives its key. One producer uses one
/// of them, so once a key rules one out, later keys must fit the other: a topic that
/// is not keyed by the session key shows itself within a few records, while every key
/// of a keyed topic fits whichever partitioner produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPlacement {
    partition: i32,
    partitions: usize,
    /// The partitioners still consistent with every key seen.
    candidates: u8,
}

impl KeyPlacement {
    /// The check for partition `partition` of a topic of `partitions` partitions.
    pub fn new(partition: i32, partitions: usize) -> KeyPlacement {
        KeyPlacement {
            partition,
            partitions,
            candidates: MURMUR2 | CRC32,
        }
    }

    /// Whether a record whose session key is `key` can belong to this partition, given
    /// the keys seen before it. `false` means the topic is not partitioned by the key.
    pub fn admits(&mut self, key: &[u8]) -> bool {
        if self.partitions <= 1 {
            return true;
        }
        let mut fits = 0;
        if self.candidates & MURMUR2 != 0 && partition_for(key, self.partitions) == self.partition {
            fits |= MURMUR2;
        }
        if self.candidates & CRC32 != 0
            && crc32_partition_for(key, self.partitions) == self.partition
        {
            fits |= CRC32;
        }
        if fits == 0 {
            return false;
        }
        self.candidates = fits;
        true
    }

    /// The partitions the standard partitioners give `key`: (murmur2, CRC-32).
    pub fn expected(&self, key: &[u8]) -> (i32, i32) {
        (
            partition_for(key, self.partitions),
            crc32_partition_for(key, self.partitions),
        )
    }

    /// The partition checked, and the number of partitions of its topic.
    pub fn partition(&self) -> (i32, usize) {
        (self.partition, self.partitions)
    }
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

    /// librdkafka's `rd_crc32` is zlib's CRC-32; the values are those of Python's
    /// `zlib.crc32(key) % n`.
    #[test]
    fn crc32_partitions_agree_with_librdkafka_consistent() {
        for (key, crc, p4, p7) in [
            ("v1", 0x6962_ccb5_u32, 1, 3),
            ("visit-000042", 0xf213_84f9, 1, 0),
            ("", 0, 0, 0),
        ] {
            assert_eq!(crc32fast::hash(key.as_bytes()), crc, "crc32({key:?})");
            assert_eq!(
                crc32_partition_for(key.as_bytes(), 4),
                p4,
                "{key:?} among 4"
            );
            assert_eq!(
                crc32_partition_for(key.as_bytes(), 7),
                p7,
                "{key:?} among 7"
            );
        }
    }

    #[test]
    fn keys_placed_by_either_standard_partitioner_pass_and_mixed_placement_does_not() {
        let keys: Vec<String> = (0..200).map(|i| format!("visit-{i}")).collect();
        for n in [2usize, 3, 8] {
            for by in [partition_for, crc32_partition_for] {
                let mut checks: Vec<KeyPlacement> =
                    (0..n as i32).map(|p| KeyPlacement::new(p, n)).collect();
                for k in &keys {
                    let p = by(k.as_bytes(), n) as usize;
                    assert!(checks[p].admits(k.as_bytes()), "{k} in {p} of {n}");
                }
            }
            // Round robin: some record of some partition soon fits neither.
            let mut checks: Vec<KeyPlacement> =
                (0..n as i32).map(|p| KeyPlacement::new(p, n)).collect();
            let refused = keys
                .iter()
                .enumerate()
                .position(|(i, k)| !checks[i % n].admits(k.as_bytes()));
            assert!(
                refused.is_some_and(|i| i < 20),
                "round robin among {n}: {refused:?}"
            );
        }
        // One partition: every record belongs.
        assert!(KeyPlacement::new(0, 1).admits(b"anything"));
    }

    #[test]
    fn murmur2_and_partitions_agree_with_the_java_client() {
        for &(key, hash, p4, p7) in JAVA {
            assert_eq!(murmur2(key.as_bytes()), hash, "murmur2({key:?})");
            assert_eq!(partition_for(key.as_bytes(), 4), p4, "{key:?} among 4");
            assert_eq!(partition_for(key.as_bytes(), 7), p7, "{key:?} among 7");
        }
    }
}
