//! Reusable gather buffers: what a gathered batch's tensors own while alive and give back
//! when dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Reusable gather buffers, one pool per open cache: shared by a loader's threads and kept
/// from one loader (epoch) to the next.
///
/// Why per cache and not per loader: a loader's first batches would otherwise fault in and zero
/// fresh pages for every buffer, and dropping the loader unmap them again (TLB shootdowns on
/// every core): 30 paired rounds of two loader settings on `dsc bench`'s cache took 59,337 page
/// faults with a pool per loader and 8,745 with one per cache (docs/PERFORMANCE.md).
#[derive(Debug)]
pub(crate) struct Pool {
    free: Mutex<Free>,
    /// Freed bytes kept: what the most demanding loader of the cache can have in flight
    /// ([`Pool::keep_at_least`]), so that the memory held between epochs is what one loader
    /// needed anyway.
    keep: AtomicUsize,
    /// The process that made the pool: a forked child must not take its lock, which a thread
    /// of the parent (absent in the child) may have held at the fork.
    pid: u32,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            free: Mutex::default(),
            keep: AtomicUsize::new(0),
            pid: std::process::id(),
        }
    }
}

impl Pool {
    /// This pool, or a fresh one in a forked child (see `pid`).
    pub fn for_this_process(self: &Arc<Pool>) -> Arc<Pool> {
        if self.pid == std::process::id() {
            self.clone()
        } else {
            Arc::default()
        }
    }

    /// Keeps up to `bytes` of freed buffers from now on (at least).
    pub fn keep_at_least(&self, bytes: usize) {
        self.keep.fetch_max(bytes, Ordering::Relaxed);
    }

    /// A buffer of at least `len` bytes (contents unspecified): the smallest freed one that
    /// is long enough, else a new one. Buffers keep their length for life, so that a reused
    /// buffer is never filled again: zeroing a buffer regrown for a larger tensor or a longer
    /// trimmed batch took an eighth of the shuffled gather's time.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().expect("pool lock");
        let best = free
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let buf = free.buffers.swap_remove(i);
                free.bytes -= buf.len();
                buf
            }
            None => {
                drop(free);
                vec![0; len]
            }
        }
    }

    pub(crate) fn give(&self, buf: Vec<u8>) {
        if self.pid != std::process::id() {
            return; // a batch dropped in a forked child: freed, not pooled (see `pid`)
        }
        let keep = self.keep.load(Ordering::Relaxed);
        let mut free = self.free.lock().expect("pool lock");
        // When full, a larger buffer displaces smaller ones: it serves every request they
        // could, so loaders that alternate small and large batches (trimmed, bucketed) stop
        // allocating once the largest sizes are pooled.
        let smaller: usize = free
            .buffers
            .iter()
            .map(Vec::len)
            .filter(|&l| l < buf.len())
            .sum();
        if free.bytes - smaller + buf.len() > keep {
            return;
        }
        while free.bytes + buf.len() > keep {
            let smallest = (0..free.buffers.len())
                .min_by_key(|&i| free.buffers[i].len())
                .expect("the smaller buffers make room");
            let dropped = free.buffers.swap_remove(smallest);
            free.bytes -= dropped.len();
        }
        free.bytes += buf.len();
        free.buffers.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_freed_buffers_up_to_the_bytes_asked_for_and_hands_out_the_best_fit() {
        let pool = Pool::default();
        pool.keep_at_least(1000);
        pool.keep_at_least(10); // never lowers it
        for len in [400, 300, 500, 200] {
            pool.give(vec![7; len]);
        }
        // 400 + 300 kept; 500 more would pass the 1000 bytes, so it displaces the 300 (the
        // larger buffer serves every request the smaller could); 200 is smaller than all
        // kept and is let go.
        assert_eq!(pool.free.lock().unwrap().bytes, 900);
        assert_eq!(pool.take(350).len(), 400);
        assert_eq!(pool.take(100).len(), 500);
        assert_eq!(pool.take(100), vec![0; 100], "empty: a new zeroed buffer");
        assert_eq!(pool.free.lock().unwrap().bytes, 0);
    }

    #[test]
    fn a_full_pool_trades_its_smallest_buffers_for_a_larger_one_and_only_then() {
        let pool = Pool::default();
        pool.keep_at_least(1000);
        pool.give(vec![1; 600]);
        pool.give(vec![1; 1001]); // more than the pool may keep at all: let go
        pool.give(vec![1; 700]); // displaces the 600
        pool.give(vec![1; 250]);
        pool.give(vec![1; 300]); // displaces the 250, not the 700
        pool.give(vec![1; 200]); // smaller than all kept: let go, the pool unchanged
        let free = pool.free.lock().unwrap();
        let mut kept: Vec<usize> = free.buffers.iter().map(Vec::len).collect();
        kept.sort_unstable();
        assert_eq!((free.bytes, kept), (1000, vec![300, 700]));
    }

    #[test]
    fn a_forked_child_neither_pools_into_nor_reuses_its_parents_pool() {
        let parent = Arc::new(Pool {
            pid: std::process::id().wrapping_add(1),
            ..Pool::default()
        });
        parent.keep_at_least(1 << 20);
        parent.give(vec![1; 64]);
        assert!(parent.free.lock().unwrap().buffers.is_empty());
        let ours = parent.for_this_process();
        assert!(!Arc::ptr_eq(&ours, &parent));
        assert!(Arc::ptr_eq(&ours.for_this_process(), &ours));
    }
}
