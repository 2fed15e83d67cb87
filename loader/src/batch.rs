//! Batches: per-tensor bytes with dtype and shape, either borrowed from the mapped shard (cache
//! order, no copy) or gathered once into a pooled buffer.

use crate::cache::{Inner, Shard};
use dsc_format::{Dtype, TensorRole};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Reusable gather buffers, one pool per open cache: shared by a loader's threads and kept
/// from one loader (epoch) to the next.
///
/// Why per cache and not per loader: a loader's first batches would otherwise fault in and zero
/// fresh pages for every buffer, and dropping the loader unmap them again (TLB shootdowns on
/// every core): 30 paired rounds of two-thread epochs on `dsc bench`'s cache took 59,337 page
/// faults with a pool per loader and 8,745 with one per cache (docs/PERFORMANCE.md).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Freed buffers kept: the most any loader of the cache has asked for (so the memory held
    /// between epochs is what one epoch's loader needed anyway).
    limit: AtomicUsize,
}

impl Pool {
    /// Keeps at least `n` freed buffers from now on.
    pub fn keep_at_least(&self, n: usize) {
        self.limit.fetch_max(n, Ordering::Relaxed);
    }

    /// A buffer of at least `len` bytes (contents unspecified): the smallest freed one that
    /// is long enough, else a new one. Buffers keep their length for life, so that a reused
    /// buffer is never filled again: zeroing a buffer regrown for a larger tensor or a longer
    /// trimmed batch took an eighth of the shuffled gather's time.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().expect("pool lock");
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                vec![0; len]
            }
        }
    }

    fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().expect("pool lock");
        if free.len() < self.limit.load(Ordering::Relaxed) {
            free.push(buf);
        }
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

/// One tensor of a batch.
#[derive(Debug)]
pub struct BatchTensor {
    name: String,
    dtype: Dtype,
    role: TensorRole,
    shape: Vec<usize>,
    data: Data,
}

impl BatchTensor {
    fn new(spec: &dsc_format::TensorSpec, shape: Vec<usize>, data: Data) -> Self {
        BatchTensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            role: spec.role,
            shape,
            data,
        }
    }

    /// A view of `len` bytes at `start` of shard `shard` of split `split`, a hot (mapped) one.
    pub(crate) fn mapped(
        spec: &dsc_format::TensorSpec,
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
        Self::new(spec, shape, data)
    }

    /// A view of `len` bytes at `start` of a compressed shard's decompressed bytes.
    pub(crate) fn shared(
        spec: &dsc_format::TensorSpec,
        shape: Vec<usize>,
        bytes: Arc<Vec<u8>>,
        start: usize,
        len: usize,
    ) -> Self {
        Self::new(spec, shape, Data::Shared { bytes, start, len })
    }

    /// A tensor of the first `len` bytes of `buf`, a buffer of `pool`.
    pub(crate) fn owned(
        spec: &dsc_format::TensorSpec,
        shape: Vec<usize>,
        buf: Vec<u8>,
        len: usize,
        pool: Arc<Pool>,
    ) -> Self {
        Self::new(spec, shape, Data::Owned { buf, len, pool })
    }

    /// The tensor's name (`x`, `length`, a categorical column, …).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// What the tensor means.
    pub fn role(&self) -> TensorRole {
        self.role
    }
    /// Shape: `[batch, ..]`, with the sequence axis trimmed when the loader trims.
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
    /// Contexts in the batch.
    pub size: usize,
    /// Sequence length of the sequence tensors (the longest stored length when trimmed).
    pub seq_len: usize,
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
    /// The context keys, in batch order.
    pub fn keys(&self) -> Vec<i64> {
        self.tensor("key")
            .map(|t| {
                t.bytes()
                    .chunks_exact(8)
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
