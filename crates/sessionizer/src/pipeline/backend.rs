//! The state backend of a run's shards (`--state-backend`, SPEC §4): with `memory`
//! every key stays in the shard's operator; with `rocksdb` each shard's operator gets a
//! RocksDB spill store of its own below it (`window::spill`), all within one memory
//! budget.
//!
//! The spill stores are scratch space, not the durable state: a checkpoint holds every
//! key (cold ones read back from RocksDB), so the stores start empty in every run and
//! a restore fills them again by evicting. Their files live in `<state-dir>/spill/`
//! (or a temporary directory without a state directory) while the run lasts.

use super::RunError;
use super::shard::Shard;
use crate::config::{PipelineConfig, StateBackend};
use std::path::{Path, PathBuf};

/// The directory of a run's spill stores; a temporary one is removed when dropped
/// (after the shards, whose stores remove their own directories).
#[derive(Debug)]
pub(crate) struct SpillRoot {
    path: PathBuf,
    temporary: bool,
}

impl Drop for SpillRoot {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Puts the configured backend below every shard (before anything is restored).
pub(crate) fn attach(
    cfg: &PipelineConfig,
    shards: &mut [Shard],
    state_dir: Option<&Path>,
) -> Result<Option<SpillRoot>, RunError> {
    match &cfg.state_backend {
        StateBackend::Memory => Ok(None),
        StateBackend::RocksDb { memory_bytes, dir } => {
            let root = match (dir, state_dir) {
                (Some(d), _) => SpillRoot {
                    path: d.clone(),
                    temporary: false,
                },
                (None, Some(s)) => SpillRoot {
                    path: s.join("spill"),
                    temporary: false,
                },
                (None, None) => SpillRoot {
                    path: std::env::temp_dir().join(format!(
                        "sessionizer-spill-{}-{}",
                        std::process::id(),
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_nanos())
                    )),
                    temporary: true,
                },
            };
            open_rocks(cfg, shards, &root.path, *memory_bytes)?;
            Ok(Some(root))
        }
    }
}

#[cfg(feature = "rocksdb")]
fn open_rocks(
    cfg: &PipelineConfig,
    shards: &mut [Shard],
    root: &Path,
    memory_bytes: u64,
) -> Result<(), RunError> {
    use sessionizer_window::spill::{RocksMemory, RocksSpill};
    let total = usize::try_from(memory_bytes).unwrap_or(usize::MAX);
    // Half for the keys in memory, shared evenly by the shards; half for RocksDB's
    // cache and write buffers, shared by all the stores.
    let memory = RocksMemory::new(total / 2);
    let hot = total / 2 / shards.len().max(1);
    for shard in shards {
        let dir = root.join(format!("shard-{}", shard.index));
        let store = RocksSpill::open(&dir, cfg.window_config(), &memory)?;
        shard.op.spill_to(Box::new(store), hot);
    }
    Ok(())
}

#[cfg(not(feature = "rocksdb"))]
fn open_rocks(_: &PipelineConfig, _: &mut [Shard], _: &Path, _: u64) -> Result<(), RunError> {
    Err(RunError::Unsupported(
        "this sessionizer was built without the RocksDB state backend; build it with `cargo build --release --features rocksdb`, or use --state-backend memory".into(),
    ))
}
