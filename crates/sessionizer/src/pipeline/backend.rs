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

impl SpillRoot {
    /// Where the spill stores of a run go: `dir` if given, else `<state_dir>/spill`,
    /// else a new directory under the system's temporary directory (removed on drop).
    pub(crate) fn choose(dir: Option<&Path>, state_dir: Option<&Path>) -> SpillRoot {
        match (dir, state_dir) {
            (Some(d), _) => SpillRoot {
                path: d.to_path_buf(),
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
        }
    }

    /// The directory of part `index`'s store.
    #[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
    pub(crate) fn part(&self, index: u32) -> PathBuf {
        self.path.join(format!("shard-{index}"))
    }
}

/// How `--state-memory` is shared by `parts` operators: half for the keys in memory,
/// evenly per operator (the second value); half for RocksDB's cache and write buffers,
/// shared by all the stores.
#[cfg(feature = "rocksdb")]
pub(crate) fn rocks_budget(
    memory_bytes: u64,
    parts: usize,
) -> (sessionizer_window::spill::RocksMemory, usize) {
    let total = usize::try_from(memory_bytes).unwrap_or(usize::MAX);
    let memory = sessionizer_window::spill::RocksMemory::new(total / 2);
    (memory, total / 2 / parts.max(1))
}

/// A library job's refusal of `StateBackend::RocksDb` in a build without the `rocksdb`
/// feature.
#[cfg(not(feature = "rocksdb"))]
pub(crate) const NO_ROCKSDB_LIBRARY: &str = "this build of the sessionizer crate has no RocksDB state backend: enable its cargo feature `rocksdb`";

/// The refusal of a build without the `rocksdb` feature.
#[cfg(not(feature = "rocksdb"))]
pub(crate) const NO_ROCKSDB: &str = "this sessionizer was built without the RocksDB state backend; build it with `cargo build --release --features rocksdb`, or use --state-backend memory";

/// Updates `seen` with what a run's spill stores did: `live`, the counts of the stores
/// open now, and `released`, the keys evicted and taken back by stores already dropped
/// (Kafka tasks given up).
pub(crate) fn sample_stores(
    seen: &mut Option<crate::stats::StateStoreStats>,
    released: (u64, u64),
    live: impl IntoIterator<Item = sessionizer_window::SpillCounts>,
) {
    let (mut evicted, mut unspilled) = released;
    let (mut keys, mut disk) = (0u64, 0u64);
    for c in live {
        evicted += c.evicted;
        unspilled += c.unspilled;
        keys += c.keys as u64;
        disk += c.disk_bytes;
    }
    let seen = seen.get_or_insert_with(Default::default);
    seen.evicted = evicted;
    seen.unspilled = unspilled;
    seen.spilled_keys_max = seen.spilled_keys_max.max(keys);
    seen.disk_bytes_max = seen.disk_bytes_max.max(disk);
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
            let root = SpillRoot::choose(dir.as_deref(), state_dir);
            open_rocks(cfg, shards, &root, *memory_bytes)?;
            Ok(Some(root))
        }
    }
}

#[cfg(feature = "rocksdb")]
fn open_rocks(
    cfg: &PipelineConfig,
    shards: &mut [Shard],
    root: &SpillRoot,
    memory_bytes: u64,
) -> Result<(), RunError> {
    use sessionizer_window::spill::RocksSpill;
    let (memory, hot) = rocks_budget(memory_bytes, shards.len());
    for shard in shards {
        let store = RocksSpill::open(&root.part(shard.index), cfg.window_config(), &memory)?;
        shard.op.spill_to(Box::new(store), hot);
    }
    Ok(())
}

#[cfg(not(feature = "rocksdb"))]
fn open_rocks(_: &PipelineConfig, _: &mut [Shard], _: &SpillRoot, _: u64) -> Result<(), RunError> {
    Err(RunError::Unsupported(NO_ROCKSDB.into()))
}

/// `--state-backend rocksdb` for Kafka input tasks: every task's operator gets a store
/// of its own in `<root>/<topic>-<partition>` (emptied when the task is created, removed
/// when it is dropped), all within one `--state-memory` budget shared as if every task
/// partition came to this process.
#[cfg(feature = "kafka")]
#[derive(Debug)]
pub(crate) struct TaskStores {
    root: SpillRoot,
    #[cfg(feature = "rocksdb")]
    memory: sessionizer_window::spill::RocksMemory,
    #[cfg(feature = "rocksdb")]
    hot: usize,
}

#[cfg(feature = "kafka")]
impl TaskStores {
    /// The stores of `backend` (`None`: the memory backend).
    pub(crate) fn open(
        backend: &StateBackend,
        state_dir: Option<&Path>,
        partitions: usize,
    ) -> Result<Option<TaskStores>, RunError> {
        match backend {
            StateBackend::Memory => Ok(None),
            #[cfg(feature = "rocksdb")]
            StateBackend::RocksDb { memory_bytes, dir } => {
                let (memory, hot) = rocks_budget(*memory_bytes, partitions);
                Ok(Some(TaskStores {
                    root: SpillRoot::choose(dir.as_deref(), state_dir),
                    memory,
                    hot,
                }))
            }
            #[cfg(not(feature = "rocksdb"))]
            StateBackend::RocksDb { .. } => {
                let _ = (state_dir, partitions);
                Err(RunError::Unsupported(NO_ROCKSDB.into()))
            }
        }
    }

    /// Puts a store of its own below a new task's operator (before it is restored).
    pub(crate) fn attach(
        &self,
        cfg: &PipelineConfig,
        shard: &mut Shard,
        task: &str,
    ) -> Result<(), RunError> {
        #[cfg(feature = "rocksdb")]
        {
            use sessionizer_window::spill::RocksSpill;
            let store = RocksSpill::open(
                &self.root.path.join(task),
                cfg.window_config(),
                &self.memory,
            )?;
            shard.op.spill_to(Box::new(store), self.hot);
            Ok(())
        }
        #[cfg(not(feature = "rocksdb"))]
        {
            let _ = (cfg, shard, task, &self.root);
            Err(RunError::Unsupported(NO_ROCKSDB.into()))
        }
    }
}
