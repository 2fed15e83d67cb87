//! One room per batch shape ([`crate::Batches`]): how an epoch's order is cut into steps, what
//! a batch's tensors are, how one is gathered from the shards and how it is indexed for a
//! consumer that holds the split itself. `padded` (whole contexts padded to `L`, or trimmed),
//! `bucketed` (padded batches of contexts of like lengths, always trimmed), `packed` (sequences
//! end to end; their plan over the order is `packed::plan`, published as [`crate::pack`]) and
//! `windows` (windows of long series). Each room checks its options against the caches and
//! plans its epoch once ([`plan`]); what every shape reads through (shards, views, blocks) is
//! `gather`'s.

pub(crate) mod bucketed;
pub mod packed;
pub(crate) mod padded;
pub(crate) mod windows;

use crate::batch::{BatchInfo, TensorLayout};
use crate::cache::Cache;
use crate::error::{LoadError, Misuse};
use crate::gather::{is_sequence, write_i64, Reader, Resolved, Source};
use crate::options::{Batches, LoaderOptions};
use crate::order::{Cursor, Order, Sample, SplitContexts};
use dsc_format::spec::format_size;
use dsc_format::spelling::OptionError;
use dsc_format::{Dtype, TensorSpec};
use packed::Packed;
use padded::Padded;
use std::sync::Arc;
use windows::Windows;

/// An epoch's batch shape, planned: the one place that knows which shape a batch has.
#[derive(Debug)]
pub(crate) enum Shape {
    /// Whole contexts in the epoch's order, padded to `L` or trimmed.
    Padded(Padded),
    /// Whole contexts of like lengths ([`crate::order::EpochOrder::bucketed`]), trimmed.
    Bucketed(Padded),
    /// One pack per rank and step.
    Packed(Packed),
    /// Windows of long series.
    Windows(Windows),
}

/// What a shape is planned from: the options, and the caches with the tensors they load.
pub(crate) struct Planning<'a> {
    pub caches: &'a [Cache],
    pub sources: &'a [Source],
    /// Each source's contexts per shard.
    pub sizes: &'a [Arc<SplitContexts>],
    pub opts: &'a LoaderOptions,
}

/// A shape planned over its epoch's order, with the layout of its batches.
pub(crate) struct Cut {
    pub shape: Shape,
    pub order: Order,
    /// The tensors of every batch, whole (untrimmed): the loaded ones, then the shape's own.
    pub layout: Vec<TensorLayout>,
    /// `L` of the batches.
    pub max_len: usize,
}

/// The shape `p.opts` asks for, checked against the caches and planned over the epoch's order.
pub(crate) fn plan(p: &Planning<'_>) -> Result<Cut, LoadError> {
    match &p.opts.order.batches {
        Batches::Padded | Batches::Bucketed => padded::plan(p),
        Batches::Packed(pack) => packed::plan(p, *pack),
        Batches::Windows(windows) => windows::plan(p, windows),
    }
}

/// The order of the epoch of `opts` (this one's, or the next one's for the fetcher): windows',
/// a bucketed one, or one cache's or a mix's contexts ([`crate::mix::order`]).
pub(crate) fn order(p: &Planning<'_>, opts: &LoaderOptions) -> Result<Order, LoadError> {
    crate::mix::refuse_mix_options(p.sizes.len(), opts)?;
    match &opts.order.batches {
        Batches::Windows(windows) => windows::order(p.caches, p.sizes, opts, windows),
        Batches::Bucketed => bucketed::order(p.caches, p.sizes, opts),
        Batches::Padded | Batches::Packed(_) => crate::mix::order(p.caches, p.sizes, opts),
    }
}

impl Planning<'_> {
    /// The loaded tensors' specs (the first source's, for a mix).
    pub fn loaded(&self) -> Vec<&TensorSpec> {
        let first = &self.sources[0];
        first
            .slots
            .iter()
            .map(|&i| &first.cache.manifest.tensors()[i])
            .collect()
    }

    /// The longest `L` of the sources: a mix's shorter ones are padded to it.
    pub fn longest(&self) -> usize {
        self.sources.iter().map(|s| s.max_len).max().unwrap_or(0)
    }

    /// The loaded tensors of a batch of `rows` whole contexts of `max_len` steps.
    pub fn stored_layout(&self, rows: usize, max_len: usize) -> Vec<TensorLayout> {
        self.loaded()
            .into_iter()
            .map(|spec| {
                let mut shape = vec![rows];
                shape.extend_from_slice(&spec.sample_shape);
                let trimmed_axis = is_sequence(spec).then_some(1);
                if trimmed_axis.is_some() {
                    shape[1] = max_len;
                }
                TensorLayout {
                    name: spec.name.clone(),
                    dtype: spec.dtype,
                    role: Some(spec.role),
                    shape,
                    trimmed_axis,
                }
            })
            .collect()
    }

    /// The bytes of one stored context of the widest cache.
    fn per_context(&self) -> usize {
        self.caches
            .iter()
            .map(|c| c.manifest())
            .max_by_key(|m| m.max_len())
            .map_or(0, |m| m.bytes_per_context())
    }

    /// Refuses a batch of `bytes` (`None`: past `usize`) larger than half of this machine's
    /// memory, naming the option `key` that asked for `size`: a batch is allocated whole, and
    /// a size this machine cannot hold would overflow or abort the process.
    pub fn bound(
        &self,
        bytes: Option<usize>,
        (key, size): (&'static str, usize),
    ) -> Result<(), LoadError> {
        if bytes.is_some_and(|b| b <= memory_limit() / 2) {
            return Ok(());
        }
        Err(OptionError::new(
            key,
            format!(
                "{size}: one batch of this cache ({} bytes per context) needs {}, more than \
                 half of this machine's memory ({}); use a smaller batch",
                self.per_context(),
                bytes.map_or("more than 16 EiB".into(), |b| format_size(b as u64)),
                format_size(memory_limit() as u64)
            ),
        )
        .into())
    }

    /// The bytes of a batch of `rows` whole contexts of the widest cache, each with `extra`
    /// bytes more, as [`Planning::bound`] weighs them.
    pub fn rows_bytes(&self, rows: usize, extra: usize) -> Option<usize> {
        (self.per_context() + std::mem::size_of::<Sample>())
            .checked_add(extra)
            .and_then(|row| row.checked_mul(rows))
    }
}

/// The memory this process may use (the machine's, or its container's limit when lower).
pub(crate) fn memory_limit() -> usize {
    usize::try_from(dsc_format::system::memory_limit()).unwrap_or(usize::MAX)
}

/// A tensor of `dtype` and `shape` that a shape adds to a batch (it has no stored role).
pub(crate) fn own_tensor(name: &str, dtype: Dtype, shape: Vec<usize>) -> TensorLayout {
    TensorLayout {
        name: name.into(),
        dtype,
        role: None,
        shape,
        trimmed_axis: None,
    }
}

/// What a consumer that holds the split's tensors itself (on a GPU) receives for each batch in
/// place of its bytes ([`crate::Filler::fill_rows`]), part by part: each row's position in the
/// split's compiled order, a pack's token rows, and the tensors of the shape's own that it
/// cannot gather by row (a pack's five), by name. One contract for the Python loader and
/// dsc-train: none of them finds a part by its place in the batch's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexLayout {
    /// i64 `[rows]`: each row's compiled-order position (a batch's contexts, or a pack's
    /// sequences then the unused rows).
    pub positions: TensorLayout,
    /// i64 `[T]` for a pack: each token's row of the split's per-step tensors flattened.
    pub token_rows: Option<TensorLayout>,
    /// The shape's own tensors, written whole (a pack's `cu_seqlens`, `seq_idx`, `position`,
    /// `num_seqs`, `num_tokens`); empty for padded batches.
    pub own: Vec<TensorLayout>,
}

impl IndexLayout {
    /// Every part in the order [`crate::Filler::fill_rows`] takes them: positions, token rows
    /// (an empty part for padded batches), then the shape's own tensors.
    pub fn parts(&self) -> Vec<TensorLayout> {
        let empty = own_tensor("token_rows", Dtype::I64, vec![0]);
        let mut parts = vec![self.positions.clone()];
        parts.push(self.token_rows.clone().unwrap_or(empty));
        parts.extend(self.own.iter().cloned());
        parts
    }
}

impl Shape {
    /// Rows of a batch's per-context tensors: `batch_size`, or a pack's `S`.
    pub fn rows(&self) -> usize {
        match self {
            Shape::Padded(p) | Shape::Bucketed(p) => p.steps.batch_size,
            Shape::Windows(w) => w.steps.batch_size,
            Shape::Packed(p) => p.packs.max_seqs(),
        }
    }

    /// Steps (batches per rank) in the epoch.
    pub fn steps(&self) -> usize {
        match self {
            Shape::Padded(p) | Shape::Bucketed(p) => p.steps.steps,
            Shape::Windows(w) => w.steps.steps,
            Shape::Packed(p) => p.packs.steps(),
        }
    }

    /// The epoch position of the first context of rank `rank`'s batch at `step`.
    pub fn first_position(&self, step: usize, rank: usize) -> usize {
        match self {
            Shape::Padded(p) | Shape::Bucketed(p) => first_of(&p.steps, step, rank),
            Shape::Windows(w) => first_of(&w.steps, step, rank),
            Shape::Packed(p) => p.packs.positions(p.packs.pack_at(step, rank).0).start,
        }
    }

    /// The epoch position unit `u` of the epoch (a context, or a pack) starts at: where a state
    /// `u` units into the epoch continues.
    pub fn position_of_unit(&self, u: usize) -> usize {
        match self {
            Shape::Packed(p) => p.packs.start_of(u),
            _ => u,
        }
    }

    /// The contexts of rank `rank`'s batch at `step` in `order` (keeping the last window
    /// permutation in `cursor`), and whether the batch repeats an earlier pack.
    pub fn samples(
        &self,
        order: &Order,
        (step, rank): (usize, usize),
        cursor: &mut Cursor,
    ) -> (Vec<Sample>, bool) {
        let at = |p| order.sample_at(p, cursor);
        match self {
            Shape::Padded(p) | Shape::Bucketed(p) => {
                (p.steps.positions(step, rank).map(at).collect(), false)
            }
            Shape::Windows(w) => (w.steps.positions(step, rank).map(at).collect(), false),
            Shape::Packed(p) => {
                let (q, repeated) = p.packs.pack_at(step, rank);
                (p.packs.positions(q).map(at).collect(), repeated)
            }
        }
    }

    /// Whether a batch of consecutive contexts of one shard can be handed over as views: whole
    /// contexts, neither trimmed nor packed nor cut into windows.
    pub fn viewable(&self) -> bool {
        matches!(self, Shape::Padded(Padded { trim: None, .. }))
    }

    /// The sequence length of a batch of `samples`: `L`, or trimmed its longest stored length
    /// rounded up the ladder.
    pub fn seq_len(&self, reader: &Reader, samples: &[Sample], held: &Resolved<'_>) -> usize {
        match self {
            Shape::Padded(p) | Shape::Bucketed(p) => p.seq_len(reader, samples, held),
            Shape::Packed(_) | Shape::Windows(_) => reader.max_len,
        }
    }

    /// Bytes of tensor `t` of `layout` in a batch of `n` samples at `seq_len` (a pack's are
    /// fixed).
    pub fn tensor_bytes(
        &self,
        reader: &Reader,
        layout: &[TensorLayout],
        (t, n, seq_len): (usize, usize, usize),
    ) -> usize {
        match self {
            Shape::Packed(_) => layout[t].bytes(),
            _ if t >= reader.loaded => layout[t].bytes() / layout[t].shape[0].max(1) * n,
            _ => n * reader.copy_bytes(t, seq_len),
        }
    }

    /// The shape of tensor `t` of `layout` in a batch of `n` samples at `seq_len` (a pack's are
    /// fixed).
    pub fn batch_shape(
        &self,
        layout: &[TensorLayout],
        t: usize,
        n: usize,
        seq_len: usize,
    ) -> Vec<usize> {
        let l = &layout[t];
        let mut shape = l.shape.clone();
        if !matches!(self, Shape::Packed(_)) {
            shape[0] = n;
            if let Some(axis) = l.trimmed_axis {
                shape[axis] = seq_len;
            }
        }
        shape
    }

    /// Copies the batch of `samples` (`held`: the shards not mapped) into `dst`, one slice per
    /// tensor of the layout, as this shape cuts it at `seq_len`.
    pub fn fill(
        &self,
        reader: &Reader,
        (samples, repeated): (&[Sample], bool),
        held: &Resolved<'_>,
        seq_len: usize,
        dst: &mut [&mut [u8]],
    ) -> BatchInfo {
        let padded = |pack| BatchInfo { seq_len, pack };
        match self {
            Shape::Padded(_) | Shape::Bucketed(_) => {
                padded::gather(reader, samples, held, seq_len, dst);
                padded(None)
            }
            Shape::Windows(w) => {
                w.gather(reader, samples, held, dst);
                padded(None)
            }
            Shape::Packed(p) => {
                let pack = p.gather(reader, (samples, repeated), held, dst);
                BatchInfo {
                    seq_len: pack.max_seqlen,
                    pack: Some(pack),
                }
            }
        }
    }

    /// The parts of a batch's index ([`IndexLayout`]); `None` for windows, which are not
    /// indexed (a window is a part of its context, not a row of the split).
    pub fn index_layout(&self, layout: &[TensorLayout]) -> Option<IndexLayout> {
        let positions = own_tensor("positions", Dtype::I64, vec![self.rows()]);
        match self {
            Shape::Padded(_) | Shape::Bucketed(_) => Some(IndexLayout {
                positions,
                token_rows: None,
                own: Vec::new(),
            }),
            Shape::Packed(p) => Some(IndexLayout {
                positions,
                token_rows: Some(own_tensor("token_rows", Dtype::I64, vec![p.packs.tokens()])),
                own: p.own(layout),
            }),
            Shape::Windows(_) => None,
        }
    }

    /// Batch `batch` as a consumer holding the split's tensors gathers it: each row's position
    /// in the split's compiled order as i64 into `dst.positions` (the batch's contexts, or a
    /// pack's sequences then `dst.unused` up to `S`), and what the shape adds (a pack's token
    /// rows and own tensors). Reads only the split's stored lengths `lengths`, never the shards;
    /// the batch it describes is the one [`Shape::fill`] copies.
    pub fn index_into(
        &self,
        max_len: usize,
        (samples, repeated): (&[Sample], bool),
        lengths: &[u32],
        dst: IndexDst<'_, '_>,
    ) -> Result<BatchInfo, LoadError> {
        let rows = dst.positions.len() / 8;
        write_i64(
            dst.positions,
            samples
                .iter()
                .map(|s| s.position as i64)
                .chain(std::iter::repeat(dst.unused as i64))
                .take(rows),
        );
        match self {
            Shape::Padded(p) | Shape::Bucketed(p) => Ok(BatchInfo {
                seq_len: p.indexed_len(max_len, samples, lengths),
                pack: None,
            }),
            Shape::Packed(p) => {
                let pack = p.index(max_len, (samples, repeated), dst);
                Ok(BatchInfo {
                    seq_len: pack.max_seqlen,
                    pack: Some(pack),
                })
            }
            Shape::Windows(_) => Err(Misuse::SeriesNotIndexed.into()),
        }
    }
}

/// The first position of rank `rank`'s batch at `step` of `steps`.
fn first_of(steps: &crate::order::Steps, step: usize, rank: usize) -> usize {
    steps.positions(step, rank).next().unwrap_or(0)
}

/// Where [`Shape::index_into`] writes a batch's index ([`IndexLayout`]'s parts).
#[derive(Debug)]
pub(crate) struct IndexDst<'a, 'b> {
    /// Each row's compiled-order position, i64 ([`Shape::rows`] of them).
    pub positions: &'a mut [u8],
    /// The position written for a pack's unused rows (and, times `L`, its unused tokens).
    pub unused: usize,
    /// A pack's token rows, i64 `[T]`, or `None` when not asked for.
    pub token_rows: Option<&'a mut [u8]>,
    /// The shape's own tensors (empty for padded batches).
    pub own: &'a mut [&'b mut [u8]],
}
