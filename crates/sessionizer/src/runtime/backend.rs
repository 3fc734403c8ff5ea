//! The state backend of a run's shards (`--state-backend`, docs/semantics.md S-36): with
//! `memory` every key stays in the shard's operator; with `rocksdb` each shard's operator
//! gets a RocksDB spill store of its own below it (`window::spill`), all within one
//! memory budget.
//!
//! The spill stores live in `<state-dir>/spill/` (or a temporary directory without a
//! state directory) while the run lasts. A checkpoint's base keeps a RocksDB
//! checkpoint of each store (`sessionizer_checkpoint::stores`); a run that restores
//! it with as many workers starts each store from its copy (hard links, no key read or
//! written), any other run reads the copies' keys into its shards like a base file's.
//! Stores start empty otherwise.

use crate::config::{PipelineConfig, StateBackend};
use crate::error::RunError;
use crate::error::Unsupported;
use sessionizer_checkpoint::{LoadedState, LoadedStore, StoreReader};
use sessionizer_window::SessionOperator;
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

/// The backend below a run's shards ([`attach`]).
#[derive(Debug, Default)]
pub(crate) struct Attached {
    /// The spill stores' directory (`rocksdb`).
    pub root: Option<SpillRoot>,
    /// The stores started as the restored checkpoint's copies of them: the restore
    /// puts only the checkpoint's base file and deltas over them.
    pub stores_restored: bool,
}

/// Puts the configured backend below every shard (before anything else is restored).
/// With `rocksdb`, a checkpoint to restore whose base keeps a store per shard of this
/// run (as many workers as then) gives each shard's store its start.
pub(crate) fn attach(
    cfg: &PipelineConfig,
    shards: Vec<&mut SessionOperator>,
    state_dir: Option<&Path>,
    restoring: Option<&LoadedState>,
) -> Result<Attached, RunError> {
    let stores = restoring.map_or(&[][..], LoadedState::stores);
    if !stores.is_empty() && store_reader().is_none() {
        return Err(RunError::Unsupported(Unsupported::NoStoreReader));
    }
    match &cfg.state_backend {
        StateBackend::Memory => Ok(Attached::default()),
        StateBackend::RocksDb { memory_bytes, dir } => {
            let root = SpillRoot::choose(dir.as_deref(), state_dir);
            let from = Some(stores).filter(|s| s.len() == shards.len());
            open_rocks(cfg, shards, &root, *memory_bytes, from)?;
            Ok(Attached {
                root: Some(root),
                stores_restored: from.is_some(),
            })
        }
    }
}

#[cfg(feature = "rocksdb")]
fn open_rocks(
    cfg: &PipelineConfig,
    shards: Vec<&mut SessionOperator>,
    root: &SpillRoot,
    memory_bytes: u64,
    from: Option<&[LoadedStore]>,
) -> Result<(), RunError> {
    let codec = || -> Box<dyn sessionizer_window::spill::StateCodec<_>> {
        Box::new(sessionizer_window::spill::SessionsCodec(
            cfg.window_config(),
        ))
    };
    Ok(open_stores(shards, root, memory_bytes, codec, from)?)
}

/// Gives each of `ops` (a run's shards or a library job's workers; the `i`-th is part
/// `i` of `root`), none of which has a store, a RocksDB store of its own within a
/// `memory_bytes` budget, its keys written with `codec`: an empty one, or with `copies`
/// (a base's store copies, one per operator) one that starts as its copy, with the
/// copy's counts. Every store is opened before any is attached.
#[cfg(feature = "rocksdb")]
pub(crate) fn open_stores<A: sessionizer_window::SessionAggregate>(
    ops: Vec<&mut sessionizer_window::SessionOperator<A>>,
    root: &SpillRoot,
    memory_bytes: u64,
    codec: impl Fn() -> Box<
        dyn sessionizer_window::spill::StateCodec<sessionizer_window::session::KeySessions<A::Acc>>,
    >,
    copies: Option<&[LoadedStore]>,
) -> Result<(), sessionizer_window::spill::SpillError>
where
    A::Acc: 'static,
{
    use sessionizer_window::spill::RocksSpill;
    let (memory, hot) = rocks_budget(memory_bytes, ops.len());
    let stores = (0u32..)
        .zip(&ops)
        .map(|(i, _)| match copies {
            Some(copies) => {
                let copy = &copies[i as usize].path;
                RocksSpill::open_from(&root.part(i), copy, codec(), &memory)
            }
            None => RocksSpill::open_with(&root.part(i), codec(), &memory),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    for (i, (op, store)) in ops.into_iter().zip(stores).enumerate() {
        match copies {
            Some(copies) => {
                let copy = &copies[i];
                op.spill_restored(
                    Box::new(store),
                    hot,
                    count(copy.keys),
                    count(copy.open_sessions),
                )?;
            }
            None => op.spill_to(Box::new(store), hot),
        }
    }
    Ok(())
}

#[cfg(not(feature = "rocksdb"))]
fn open_rocks(
    _: &PipelineConfig,
    _: Vec<&mut SessionOperator>,
    _: &SpillRoot,
    _: u64,
    _: Option<&[LoadedStore]>,
) -> Result<(), RunError> {
    Err(RunError::Unsupported(Unsupported::NoRocksDb))
}

/// Reads the keys of a base's RocksDB store copies ([`LoadedState::stores`]);
/// `None` in a build without the `rocksdb` feature.
pub fn store_reader() -> Option<&'static dyn StoreReader> {
    #[cfg(feature = "rocksdb")]
    {
        struct Rocks;
        impl StoreReader for Rocks {
            fn for_each(
                &self,
                dir: &Path,
                f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
            ) -> Result<(), sessionizer_checkpoint::stores::StoreReadError> {
                sessionizer_window::spill::RocksImage::read(dir, f)
                    .map_err(|e| sessionizer_checkpoint::stores::StoreReadError(Box::new(e)))
            }
        }
        Some(&Rocks)
    }
    #[cfg(not(feature = "rocksdb"))]
    None
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
                Err(RunError::Unsupported(Unsupported::NoRocksDb))
            }
        }
    }

    /// A store of its own for a library task's operator, which writes its keys with
    /// `codec`, and the bytes of keys the operator keeps in memory.
    pub(crate) fn store_for<S: 'static>(
        &self,
        task: &str,
        codec: Box<dyn sessionizer_window::spill::StateCodec<S>>,
    ) -> Result<(Box<dyn sessionizer_window::spill::SpillStore<S>>, usize), RunError> {
        #[cfg(feature = "rocksdb")]
        {
            use sessionizer_window::spill::RocksSpill;
            let store = RocksSpill::open_with(&self.root.path.join(task), codec, &self.memory)?;
            Ok((Box::new(store), self.hot))
        }
        #[cfg(not(feature = "rocksdb"))]
        {
            let _ = (task, codec, &self.root);
            Err(RunError::Unsupported(Unsupported::NoRocksDb))
        }
    }

    /// Puts a store of its own below a new task's operator (before it is restored).
    pub(crate) fn attach(
        &self,
        cfg: &PipelineConfig,
        op: &mut SessionOperator,
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
            op.spill_to(Box::new(store), self.hot);
            Ok(())
        }
        #[cfg(not(feature = "rocksdb"))]
        {
            let _ = (cfg, op, task, &self.root);
            Err(RunError::Unsupported(Unsupported::NoRocksDb))
        }
    }
}
