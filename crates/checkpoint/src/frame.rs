//! The frame around every checkpoint file: a fixed header, the payload, and a CRC32 of
//! both, so that a damaged or truncated file is detected before a byte of it is trusted.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "SZCP"
//!      4     2  format version, little-endian (FORMAT_VERSION)
//!      6     1  kind: 1 manifest, 2 base, 3 delta, 4 task snapshot
//!      7     1  reserved, 0
//!      8     8  epoch of the checkpoint that wrote the file, little-endian
//!     16     8  payload length in bytes, little-endian
//!     24     n  payload
//!   24+n     4  CRC32 (IEEE, crc32fast) of bytes 0 .. 24+n, little-endian
//! ```
//!
//! The epoch in the header must match the epoch in the file's name, so a file copied or
//! renamed over another is refused too.

use crate::error::FrameError;

/// The first bytes of every checkpoint file.
pub const MAGIC: [u8; 4] = *b"SZCP";

/// The format version this build writes. Bump it on any change of the layout of a frame,
/// a state payload, a key's value or a manifest, and keep a fixture of the old version.
///
/// Version 2 added the per-key floor to a key's value and the new-key floor to the
/// manifest's watermark (`docs/checkpoint-format.md`).
pub const FORMAT_VERSION: u16 = 2;

/// The oldest format version this build still reads (the value layout of a version is
/// read by `sessionizer_window::codec::decode_value`).
pub const OLDEST_FORMAT_VERSION: u16 = 1;

/// Bytes before the payload.
pub const HEADER_LEN: usize = 24;

/// Bytes after the payload.
pub const TRAILER_LEN: usize = 4;

/// What a checkpoint file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// The manifest of one checkpoint (JSON).
    Manifest,
    /// Every key's state at one checkpoint.
    Base,
    /// The keys changed (or removed) since the previous checkpoint.
    Delta,
    /// A local snapshot of one Kafka task (`crate::task`).
    TaskSnapshot,
}

impl FileKind {
    fn code(self) -> u8 {
        match self {
            FileKind::Manifest => 1,
            FileKind::Base => 2,
            FileKind::Delta => 3,
            FileKind::TaskSnapshot => 4,
        }
    }

    fn from_code(code: u8) -> Option<FileKind> {
        match code {
            1 => Some(FileKind::Manifest),
            2 => Some(FileKind::Base),
            3 => Some(FileKind::Delta),
            4 => Some(FileKind::TaskSnapshot),
            _ => None,
        }
    }

    /// The word used in file names and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Manifest => "manifest",
            FileKind::Base => "base",
            FileKind::Delta => "delta",
            FileKind::TaskSnapshot => "task",
        }
    }
}

/// The header bytes of a frame around a payload of `payload_len` bytes.
pub fn header(kind: FileKind, epoch: u64, payload_len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[6] = kind.code();
    h[7] = 0;
    h[8..16].copy_from_slice(&epoch.to_le_bytes());
    h[16..24].copy_from_slice(&payload_len.to_le_bytes());
    h
}

/// Frames a payload given in parts (so that shards' buffers need not be copied into one):
/// returns the header and the trailer to write around them.
pub fn frame_parts(
    kind: FileKind,
    epoch: u64,
    parts: &[&[u8]],
) -> ([u8; HEADER_LEN], [u8; TRAILER_LEN]) {
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let head = header(kind, epoch, len);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    for p in parts {
        crc.update(p);
    }
    (head, crc.finalize().to_le_bytes())
}

/// Frames a payload into one buffer.
pub fn encode(kind: FileKind, epoch: u64, payload: &[u8]) -> Vec<u8> {
    let (head, trailer) = frame_parts(kind, epoch, &[payload]);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TRAILER_LEN);
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    out.extend_from_slice(&trailer);
    out
}

/// Checks a whole file's frame and returns its payload.
pub fn decode(bytes: &[u8], kind: FileKind, epoch: u64) -> Result<&[u8], FrameError> {
    decode_versioned(bytes, kind, epoch).map(|(_, payload)| payload)
}

/// Checks a whole file's frame and returns its format version (one this build reads:
/// [`OLDEST_FORMAT_VERSION`] to [`FORMAT_VERSION`]) and its payload.
pub fn decode_versioned(
    bytes: &[u8],
    kind: FileKind,
    epoch: u64,
) -> Result<(u16, &[u8]), FrameError> {
    check_length(bytes.len() as u64)?;
    let head: &[u8; HEADER_LEN] = bytes[..HEADER_LEN]
        .try_into()
        .map_err(|_| FrameError::Magic)?;
    let (version, _) = read_header(head, bytes.len() as u64)?;
    let body_end = bytes.len() - TRAILER_LEN;
    let stored = trailer_crc(&bytes[body_end..]);
    if crc32fast::hash(&bytes[..body_end]) != stored {
        return Err(FrameError::Checksum);
    }
    check_identity(head, kind, epoch)?;
    Ok((version, &bytes[HEADER_LEN..body_end]))
}

/// Fails when a file of `file_len` bytes is too short to hold a frame.
pub(crate) fn check_length(file_len: u64) -> Result<(), FrameError> {
    if file_len < (HEADER_LEN + TRAILER_LEN) as u64 {
        return Err(FrameError::Truncated { len: file_len });
    }
    Ok(())
}

/// Checks a frame's header against the length of its file (at least
/// `HEADER_LEN + TRAILER_LEN`): the magic, a format version this build reads, the
/// payload length. Returns the version and the payload length. The kind and the epoch
/// are checked by [`check_identity`] once the checksum holds.
pub(crate) fn read_header(
    head: &[u8; HEADER_LEN],
    file_len: u64,
) -> Result<(u16, u64), FrameError> {
    if head[0..4] != MAGIC {
        return Err(FrameError::Magic);
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(FrameError::Version { found: version });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&head[16..24]);
    let payload_len = u64::from_le_bytes(len);
    let expected = ((HEADER_LEN + TRAILER_LEN) as u64).saturating_add(payload_len);
    if expected != file_len {
        return Err(FrameError::Length {
            expected,
            found: file_len,
        });
    }
    Ok((version, payload_len))
}

/// The checksum a trailer holds.
pub(crate) fn trailer_crc(trailer: &[u8]) -> u32 {
    let mut b = [0u8; TRAILER_LEN];
    b.copy_from_slice(&trailer[..TRAILER_LEN]);
    u32::from_le_bytes(b)
}

/// Checks the kind and the epoch a header names (only trusted once the checksum holds).
pub(crate) fn check_identity(
    head: &[u8; HEADER_LEN],
    kind: FileKind,
    epoch: u64,
) -> Result<(), FrameError> {
    let found_kind = FileKind::from_code(head[6]).ok_or(FrameError::Kind {
        expected: kind,
        found: None,
    })?;
    if found_kind != kind {
        return Err(FrameError::Kind {
            expected: kind,
            found: Some(found_kind),
        });
    }
    let mut e = [0u8; 8];
    e.copy_from_slice(&head[8..16]);
    let found_epoch = u64::from_le_bytes(e);
    if found_epoch != epoch {
        return Err(FrameError::Epoch {
            expected: epoch,
            found: found_epoch,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_every_damage_is_detected() {
        let bytes = encode(FileKind::Delta, 7, b"hello state");
        assert_eq!(
            decode(&bytes, FileKind::Delta, 7).expect("valid"),
            b"hello state"
        );
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(
                decode(&bad, FileKind::Delta, 7).is_err(),
                "flipped byte {i} not detected"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len], FileKind::Delta, 7).is_err(),
                "truncation to {len} not detected"
            );
        }
        assert!(matches!(
            decode(&bytes, FileKind::Base, 7),
            Err(FrameError::Kind { .. })
        ));
        assert!(matches!(
            decode(&bytes, FileKind::Delta, 8),
            Err(FrameError::Epoch { .. })
        ));
    }

    /// Frames of every version from the oldest read to this one are accepted, with
    /// their version; an unknown version is refused by name.
    #[test]
    fn older_versions_are_read_and_newer_ones_refused() {
        let reframe = |version: u16| {
            let mut bytes = encode(FileKind::Base, 3, b"payload");
            bytes[4..6].copy_from_slice(&version.to_le_bytes());
            let end = bytes.len() - TRAILER_LEN;
            let crc = crc32fast::hash(&bytes[..end]).to_le_bytes();
            bytes[end..].copy_from_slice(&crc);
            bytes
        };
        for version in OLDEST_FORMAT_VERSION..=FORMAT_VERSION {
            let bytes = reframe(version);
            assert_eq!(
                decode_versioned(&bytes, FileKind::Base, 3).expect("read"),
                (version, &b"payload"[..])
            );
        }
        for version in [0, FORMAT_VERSION + 1] {
            let err = decode(&reframe(version), FileKind::Base, 3).expect_err("refused");
            assert_eq!(err, FrameError::Version { found: version });
            assert!(
                err.to_string().contains(&format!(
                    "reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn parts_frame_like_one_payload() {
        let one = encode(FileKind::Base, 1, b"abcdef");
        let (h, t) = frame_parts(FileKind::Base, 1, &[b"ab", b"", b"cdef"]);
        let mut parts = h.to_vec();
        parts.extend_from_slice(b"abcdef");
        parts.extend_from_slice(&t);
        assert_eq!(one, parts);
    }
}
