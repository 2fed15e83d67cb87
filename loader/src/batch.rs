//! Batches: per-tensor bytes with dtype and shape, either borrowed from the mapped shard (cache
//! order, no copy) or gathered once into a pooled buffer.

use crate::body::Shard;
use crate::cache::Inner;
use crate::pool::Pool;
use dsc_format::{Dtype, TensorRole};
use serde::Serialize;
use std::sync::Arc;

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
    /// A range of a compressed shard's decompressed bytes, or of a fetched shard's map (no
    /// copy).
    Shared {
        bytes: crate::body::Held,
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
        bytes: crate::body::Held,
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
            (Data::Shared { bytes, start, len }, _) => &(**bytes).as_ref()[*start..*start + *len],
            (Data::Mapped { .. }, view) => {
                let (shard, start, len) = view.expect("a mapped tensor has a view");
                match &shard.body {
                    crate::body::Body::Mapped(map) => &map.bytes()[start..start + len],
                    _ => unreachable!("views are of mapped shards only"),
                }
            }
        }
    }
    /// For a view into a mapped shard: the shard file and the byte range of the view in it, so
    /// that a caller can make a mapping of its own (e.g. a private, writable one) of the same
    /// bytes. `None` for gathered bytes.
    pub fn mapped_source(&self) -> Option<(&std::fs::File, u64, usize)> {
        self.view()
            .and_then(|(shard, start, len)| Some((shard.file.as_ref()?, start as u64, len)))
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

/// What a filled batch is, beyond its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    /// Length of the sequence axis of padded per-step tensors (`L`, or the batch's longest
    /// stored sequence when trimmed); for a pack, its longest sequence.
    pub seq_len: usize,
    /// For a packed batch: its sequences, tokens and whether it repeats an earlier pack.
    pub pack: Option<PackInfo>,
}

/// What a packed batch holds beyond its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PackInfo {
    /// Sequences in the pack (the leading rows of the per-context tensors).
    pub seqs: usize,
    /// Tokens in the pack (the leading rows of the per-step tensors).
    pub tokens: usize,
    /// The longest sequence in the pack.
    pub max_seqlen: usize,
    /// A pack trained a second time this epoch: without `drop_last`, the last global step is
    /// completed with the epoch's first packs. Count none of its sequences when evaluating.
    pub repeated: bool,
}
