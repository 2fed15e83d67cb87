//! Batches: per-tensor bytes with dtype and shape, either borrowed from the mapped shard (cache
//! order, no copy) or gathered once into a pooled buffer.

use crate::cache::{Inner, Shard};
use crate::pack::PackInfo;
use dsc_format::{Dtype, TensorRole};
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

    fn give(&self, buf: Vec<u8>) {
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

#[derive(Debug)]
enum Data {
    /// A range of a mapped shard: `(split index, shard index, start, len)`.
    Mapped {
        cache: Arc<Inner>,
        split: usize,
        shard: usize,
        start: usize,
        len: usize,
    },
    /// Gathered bytes, returned to the pool on drop.
    Owned {
        buf: Vec<u8>,
        /// The tensor's bytes: the start of `buf`.
        len: usize,
        pool: Arc<Pool>,
    },
    /// A range of a compressed shard's decompressed bytes (no copy).
    Shared {
        bytes: Arc<Vec<u8>>,
        start: usize,
        len: usize,
    },
}

/// One tensor of every batch of a loader: its name, element type and the shape of a whole
/// batch (for callers that bring their own buffers, e.g. pinned memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// What a stored tensor means; `None` for the tensors a packed batch adds (`cu_seqlens`,
    /// `seq_idx`, `position`, `num_seqs`, `num_tokens`).
    pub role: Option<TensorRole>,
    /// Shape of a whole batch: `[batch_size, ..]` padded to `L`, or a pack's `[T, ..]` /
    /// `[S, ..]`.
    pub shape: Vec<usize>,
    /// The axis a trimmed batch cuts to its sequence length (`Some(1)` for per-step tensors of
    /// padded batches).
    pub trimmed_axis: Option<usize>,
}

impl TensorLayout {
    /// Bytes of a whole batch of this tensor.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// One tensor of a batch.
#[derive(Debug)]
pub struct BatchTensor {
    name: String,
    dtype: Dtype,
    role: Option<TensorRole>,
    shape: Vec<usize>,
    data: Data,
}

impl BatchTensor {
    fn new(layout: &TensorLayout, shape: Vec<usize>, data: Data) -> Self {
        BatchTensor {
            name: layout.name.clone(),
            dtype: layout.dtype,
            role: layout.role,
            shape,
            data,
        }
    }

    /// A view of `len` bytes at `start` of shard `shard` of split `split`, a hot (mapped) one.
    pub(crate) fn mapped(
        layout: &TensorLayout,
        shape: Vec<usize>,
        cache: Arc<Inner>,
        (split, shard, start, len): (usize, usize, usize, usize),
    ) -> Self {
        let data = Data::Mapped {
            cache,
            split,
            shard,
            start,
            len,
        };
        Self::new(layout, shape, data)
    }

    /// A view of `len` bytes at `start` of a compressed shard's decompressed bytes.
    pub(crate) fn shared(
        layout: &TensorLayout,
        shape: Vec<usize>,
        bytes: Arc<Vec<u8>>,
        start: usize,
        len: usize,
    ) -> Self {
        Self::new(layout, shape, Data::Shared { bytes, start, len })
    }

    /// A tensor of the first `len` bytes of `buf`, a buffer of `pool`.
    pub(crate) fn owned(
        layout: &TensorLayout,
        shape: Vec<usize>,
        buf: Vec<u8>,
        len: usize,
        pool: Arc<Pool>,
    ) -> Self {
        Self::new(layout, shape, Data::Owned { buf, len, pool })
    }

    /// The tensor's name (`x`, `length`, a categorical column, …).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// What a stored tensor means; `None` for the tensors a packed batch adds.
    pub fn role(&self) -> Option<TensorRole> {
        self.role
    }
    /// Shape: `[batch, ..]`, with the sequence axis trimmed when the loader trims; a pack's
    /// `[T, ..]` (per-step tensors) or `[S, ..]` (per-context tensors).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// For a view: the shard it lies in and its byte range there.
    fn view(&self) -> Option<(&Shard, usize, usize)> {
        match &self.data {
            Data::Mapped {
                cache,
                split,
                shard,
                start,
                len,
            } => Some((&cache.splits[*split].1[*shard], *start, *len)),
            Data::Owned { .. } | Data::Shared { .. } => None,
        }
    }
    /// The bytes, little-endian, row-major.
    pub fn bytes(&self) -> &[u8] {
        match (&self.data, self.view()) {
            (Data::Owned { buf, len, .. }, _) => &buf[..*len],
            (Data::Shared { bytes, start, len }, _) => &bytes[*start..*start + *len],
            (Data::Mapped { .. }, view) => {
                let (shard, start, len) = view.expect("a mapped tensor has a view");
                match &shard.body {
                    crate::body::Body::Mapped(map) => &map.bytes()[start..start + len],
                    crate::body::Body::Cold(_) => unreachable!("views are of hot shards only"),
                }
            }
        }
    }
    /// For a view into a mapped shard: the shard file and the byte range of the view in it, so
    /// that a caller can make a mapping of its own (e.g. a private, writable one) of the same
    /// bytes. `None` for gathered bytes.
    pub fn mapped_source(&self) -> Option<(&std::fs::File, u64, usize)> {
        self.view()
            .map(|(shard, start, len)| (&shard.file, start as u64, len))
    }
    /// For a view into a mapped shard: the shard's path (for messages, e.g. a SIGBUS guard).
    pub fn mapped_path(&self) -> Option<&std::path::Path> {
        self.view().map(|(shard, _, _)| shard.path.as_path())
    }
    /// True when the bytes are a view into the shard (no copy was made): its map, or the
    /// decompressed bytes of a compressed shard.
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.data, Data::Mapped { .. } | Data::Shared { .. })
    }
}

impl Drop for BatchTensor {
    fn drop(&mut self) {
        if let Data::Owned { buf, pool, .. } = &mut self.data {
            pool.give(std::mem::take(buf));
        }
    }
}

/// One batch for one rank.
#[derive(Debug)]
pub struct Batch {
    /// The step of the epoch this batch belongs to.
    pub step: usize,
    /// Contexts in the batch (a pack's sequences).
    pub size: usize,
    /// Sequence length of the sequence tensors (the longest stored length when trimmed); a
    /// pack's longest sequence.
    pub seq_len: usize,
    /// For a packed batch: its sequences, tokens, longest sequence and whether it repeats an
    /// earlier pack.
    pub pack: Option<PackInfo>,
    pub(crate) tensors: Vec<BatchTensor>,
}

impl Batch {
    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&BatchTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
    /// Every tensor, in manifest order.
    pub fn tensors(&self) -> &[BatchTensor] {
        &self.tensors
    }
    /// The context keys, in batch order (a pack's sequences only, not its unused rows).
    pub fn keys(&self) -> Vec<i64> {
        self.tensor("key")
            .map(|t| {
                t.bytes()
                    .chunks_exact(8)
                    .take(self.size)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect()
            })
            .unwrap_or_default()
    }
    /// The tensors, owned: each keeps its bytes (and the mapping they may lie in) alive on its
    /// own.
    pub fn into_tensors(self) -> Vec<BatchTensor> {
        self.tensors
    }
    /// True when every tensor is a view into mapped memory.
    pub fn is_zero_copy(&self) -> bool {
        self.tensors.iter().all(BatchTensor::is_zero_copy)
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
