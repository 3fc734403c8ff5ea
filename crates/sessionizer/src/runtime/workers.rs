//! The worker threads of a job and the assignment of keys to them.

use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

/// Assigns keys to shards: a fixed hash, the same for every run, so a checkpoint's keys
/// find their shard whatever the number of workers.
pub(crate) fn shard_of(key: &[u8], shards: usize) -> u32 {
    if shards == 1 {
        return 0;
    }
    let h = foldhash::fast::FixedState::with_seed(0x5eed_5e55).hash_one(key);
    (h % shards as u64) as u32
}

/// A value on cache lines of its own. What each worker thread writes on every event
/// (its shard, its decoder, its outputs) sits side by side in a vector; were two
/// workers' values to share a cache line, every write would pull that line from the
/// other core (false sharing, which on two workers cost more than a quarter of the
/// shard phase). 128 bytes: two lines, what the hardware prefetcher fetches together.
/// The engine's own per-worker types carry the same alignment (`#[repr(align(128))]`);
/// this wraps the types of other crates.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Padded<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// The threads of `--workers N` / `set_workers(N)`: none for one worker (the calling
/// thread does it all), else a pool of `N`.
#[derive(Debug)]
pub(crate) struct Workers {
    pool: Option<rayon::ThreadPool>,
}

impl Workers {
    /// Starts the threads of `count` workers, named `<name>-<i>`.
    pub fn start(count: usize, name: &'static str) -> Result<Workers, rayon::ThreadPoolBuildError> {
        if count <= 1 {
            return Ok(Workers { pool: None });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(count)
            .thread_name(move |i| format!("{name}-{i}"))
            .build()?;
        Ok(Workers { pool: Some(pool) })
    }

    /// The pool, for work that is not one item per shard (parallel decoding, Kafka
    /// tasks, checkpoint encoding); `None` with one worker.
    pub fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
    }

    /// Runs `f` on every item, item `i` always on worker thread `i` (item `i + N`, if
    /// there are more, on the same thread after it): a shard's state is allocated and
    /// freed by one thread, which keeps the allocator's per-thread caches effective
    /// (work stealing would hand shards from thread to thread). Returns when all are
    /// done. With one worker, or one item, everything runs on the calling thread.
    pub fn on_each<T: Send>(&self, items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
        let pool = match &self.pool {
            Some(pool) if items.len() > 1 => pool,
            _ => {
                for (i, item) in items.iter_mut().enumerate() {
                    f(i, item);
                }
                return;
            }
        };
        let cells: Vec<Mutex<&mut T>> = items.iter_mut().map(Mutex::new).collect();
        pool.broadcast(|ctx| {
            for i in (ctx.index()..cells.len()).step_by(ctx.num_threads()) {
                let mut item = cells[i].lock().unwrap_or_else(PoisonError::into_inner);
                f(i, &mut item);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_on_its_own_thread() {
        let workers = Workers::start(2, "test-worker").expect("threads");
        for n in [1, 2, 5] {
            let mut items: Vec<(usize, Option<String>)> = (0..n).map(|i| (i, None)).collect();
            for _ in 0..3 {
                workers.on_each(&mut items, |i, item| {
                    assert_eq!(item.0, i);
                    let me = std::thread::current().name().map(str::to_string);
                    assert!(item.1.is_none() || item.1 == me, "item {i} moved threads");
                    item.1 = me;
                });
            }
            for (i, (_, thread)) in items.iter().enumerate() {
                let expected = if n == 1 {
                    std::thread::current().name().map(str::to_string)
                } else {
                    Some(format!("test-worker-{}", i % 2))
                };
                assert_eq!(*thread, expected, "{n} items");
            }
        }
    }

    #[test]
    fn keys_keep_their_shard_and_spread_over_all() {
        let mut seen = [0u32; 3];
        for k in 0..300u32 {
            let key = k.to_string();
            let s = shard_of(key.as_bytes(), 3);
            assert_eq!(s, shard_of(key.as_bytes(), 3));
            seen[s as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
        assert_eq!(shard_of(b"any", 1), 0);
    }
}
