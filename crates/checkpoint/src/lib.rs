#![warn(missing_docs)]
//! Durable checkpoints of a sessionizer job (docs/semantics.md S-35), for the memory
//! state backend and the file connectors.
//!
//! A checkpoint is a **manifest** ([`Manifest`]: input positions, watermark, committed
//! output lengths, counters, the options fingerprint) plus the keyed state, kept
//! incrementally: a **base** file with every key's state and **delta** files with the
//! keys changed or removed since the previous checkpoint. Every file is framed
//! ([`frame`]: magic, format version, kind, epoch, length, CRC32) and written atomically
//! ([`dir`]: temp file, fsync, rename, fsync of the directory). Recovery takes the
//! newest checkpoint whose files all verify; the last three are kept.
//!
//! This crate knows nothing of sessions: a key's state is opaque bytes encoded by the
//! operator that owns it. The layout is documented in `docs/checkpoint-format.md`.

pub mod dir;
pub mod error;
pub mod frame;
pub mod manifest;
pub mod state;
pub mod stores;
pub mod task;
pub mod writer;

pub use dir::{CheckpointInfo, KEEP_MANIFESTS, Listing, Recovered, Recovery, StateDir, StateFile};
pub use error::{CheckpointError, Damage, FrameError};
pub use frame::{FORMAT_VERSION, FileKind, OLDEST_FORMAT_VERSION};
pub use manifest::{
    Counters, DeltaEpoch, DeltaFileRef, InputPosition, KafkaPosition, KafkaSource, KafkaTxn,
    Manifest, OutputCommit, StagedFileRef, StagedOutput, StateFileRef, StoreFileRef, StoreRef,
    WatermarkState,
};
pub use state::{LoadedState, StateEntries};
pub use stores::{LoadedStore, StoreImageDir, StoreReader};
pub use task::TaskSnapshot;
pub use writer::{CheckpointWriter, Committed, EncodedState};

/// Bytes of an input file's head hashed into its identity.
pub const HEAD_BYTES: usize = 4096;

/// The identity of an input file: its size and the xxh3-64 of its first
/// [`HEAD_BYTES`] bytes (16 hex digits). Cheap to compute, and enough to notice a file
/// that was replaced, truncated, rewritten at its head or grown.
pub fn input_identity(path: &std::path::Path) -> std::io::Result<(u64, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    let mut head = Vec::with_capacity(HEAD_BYTES);
    (&mut f).take(HEAD_BYTES as u64).read_to_end(&mut head)?;
    Ok((size, format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&head))))
}

/// Whether the file at `path` starts with the same bytes as a file that had `size` bytes
/// and head hash `head_xxh3` ([`input_identity`]): true for the same file grown by
/// appending.
pub fn starts_like(path: &std::path::Path, size: u64, head_xxh3: &str) -> std::io::Result<bool> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut head = Vec::with_capacity(HEAD_BYTES);
    f.take(size.min(HEAD_BYTES as u64)).read_to_end(&mut head)?;
    Ok(head.len() as u64 == size.min(HEAD_BYTES as u64)
        && format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&head)) == head_xxh3)
}
