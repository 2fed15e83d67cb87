//! One epoch of a loader, planned once: the shards it reads (`gather`), its order, and the
//! room of its batch shape (`shape`) that cuts the order into steps and copies each batch. A
//! batch is built here from those three: as views of a shard, into pooled buffers, into the
//! caller's buffers or one block, or as an index for a consumer holding the split.

use crate::batch::{Batch, BatchInfo, BatchTensor, TensorLayout};
use crate::error::LoadError;
use crate::gather::{block_ranges, split_block, Reader};
use crate::order::{Cursor, Order, Sample};
use crate::pool::Pool;
use crate::shape::{IndexDst, IndexLayout, Shape};
use crate::stats::Counters;
use std::sync::Arc;

/// Everything a batch of one epoch is built from.
#[derive(Debug)]
pub(crate) struct Epoch {
    pub reader: Reader,
    pub order: Order,
    pub shape: Shape,
    pub rank: usize,
    /// The tensors of every batch, whole (untrimmed): the loaded ones, then the shape's own.
    pub layout: Vec<TensorLayout>,
    pub pool: Arc<Pool>,
    /// What this epoch's batches have cost and carried ([`crate::LoaderStats`]).
    pub counters: Counters,
}

impl Epoch {
    /// Where a mix's run stands at `step` of this epoch of `opts` on its weights
    /// ([`crate::order::Schedule::progress`]); `None` for one cache.
    pub(crate) fn mix_progress(
        &self,
        opts: &crate::options::LoaderOptions,
        step: usize,
    ) -> Option<crate::order::Progress> {
        let units = crate::options::State::new(opts, step).ok()?.samples;
        let (order, p, g) = self.mix_position(opts.epoch, units)?;
        let now = order.draws_before(p);
        Some(order.schedule().progress(&opts.order.stages(), g, now))
    }

    /// Where `units` of this epoch (`epoch`: contexts, or packs) end in a mix's order: the
    /// order, the epoch position and the run's global position (epoch × positions + position).
    /// `None` for one cache.
    pub(crate) fn mix_position(
        &self,
        epoch: u64,
        units: usize,
    ) -> Option<(&crate::order::MixOrder, usize, u64)> {
        let Order::Mix(order) = &self.order else {
            return None;
        };
        let p = self.shape.position_of_unit(units).min(order.len());
        Some((order, p, epoch * order.len() as u64 + p as u64))
    }

    /// Steps (batches per rank) in the epoch.
    pub fn steps(&self) -> usize {
        self.shape.steps()
    }

    /// The contexts of this rank's batch at `step` (keeping the last window permutation in
    /// `cursor`), and whether the batch repeats an earlier pack.
    pub fn samples(&self, step: usize, cursor: &mut Cursor) -> (Vec<Sample>, bool) {
        self.shape.samples(&self.order, (step, self.rank), cursor)
    }

    /// Bytes of tensor `t` in a batch of `n` samples at `seq_len`.
    fn tensor_bytes(&self, t: usize, n: usize, seq_len: usize) -> usize {
        self.shape
            .tensor_bytes(&self.reader, &self.layout, (t, n, seq_len))
    }

    /// Bytes of a batch of `info` (of `n` samples): every tensor cut as the batch is.
    pub fn info_bytes(&self, n: usize, info: &BatchInfo) -> usize {
        (0..self.layout.len())
            .map(|t| self.tensor_bytes(t, n, info.seq_len))
            .sum()
    }

    /// Records a batch of `n` samples handed over as `info`.
    pub fn delivered(&self, n: usize, info: &BatchInfo) {
        let contexts = info.pack.map_or(n, |p| p.seqs);
        self.counters.delivered(contexts, self.info_bytes(n, info));
    }

    /// Copies the batch of `samples` into `dst` (one slice per tensor of the layout, each at
    /// least its bytes).
    pub fn gather_into(
        &self,
        batch: (&[Sample], bool),
        dst: &mut [&mut [u8]],
    ) -> Result<BatchInfo, LoadError> {
        let held = self.reader.resolve(batch.0)?;
        let seq_len = self.shape.seq_len(&self.reader, batch.0, &held);
        Ok(self.shape.fill(&self.reader, batch, &held, seq_len, dst))
    }

    /// Copies the batch of `samples` into one `block`, its tensors one after another (layout
    /// order) at offsets that are multiples of [`crate::BLOCK_ALIGN`], each cut to this batch (a
    /// trimmed batch's length; a pack's fixed shapes), so that the used bytes are one prefix of
    /// the block: one transfer to a device moves the batch. Returns what the batch is and each
    /// tensor's `(offset, bytes)` in the block; an error if the block is shorter than
    /// [`Epoch::block_bytes`] would need.
    pub fn gather_block(
        &self,
        batch: (&[Sample], bool),
        block: &mut [u8],
    ) -> Result<(BatchInfo, Vec<(usize, usize)>), LoadError> {
        let held = self.reader.resolve(batch.0)?;
        let seq_len = self.shape.seq_len(&self.reader, batch.0, &held);
        let n = batch.0.len();
        let lens = (0..self.layout.len()).map(|t| self.tensor_bytes(t, n, seq_len));
        let (ranges, end) = block_ranges(lens);
        if block.len() < end {
            return Err(crate::error::Misuse::BlockTooSmall {
                bytes: block.len(),
                need: end,
            }
            .into());
        }
        let mut slices = split_block(block, &ranges);
        let info = self
            .shape
            .fill(&self.reader, batch, &held, seq_len, &mut slices);
        Ok((info, ranges))
    }

    /// The most bytes [`Epoch::gather_block`] needs: the whole (untrimmed) batch, each tensor
    /// at an aligned offset.
    pub fn block_bytes(&self) -> usize {
        block_ranges(self.layout.iter().map(TensorLayout::bytes)).1
    }

    /// The parts of a batch's index ([`IndexLayout`]); `None` where batches are not indexed.
    pub fn index_layout(&self) -> Option<IndexLayout> {
        self.shape.index_layout(&self.layout)
    }

    /// Batch `batch`'s index ([`Shape::index_into`]) from the split's stored `lengths`.
    pub fn index_into(
        &self,
        batch: (&[Sample], bool),
        lengths: &[u32],
        dst: IndexDst<'_, '_>,
    ) -> Result<BatchInfo, LoadError> {
        self.shape
            .index_into(self.reader.max_len, batch, lengths, dst)
    }

    /// Rank `rank`'s batch at `step`: a view of the shard where the contexts lie in cache order
    /// and nothing is trimmed, packed or windowed, otherwise one gather into pooled buffers.
    pub fn build(&self, step: usize, cursor: &mut Cursor) -> Result<Batch, LoadError> {
        let (samples, repeated) = self.samples(step, cursor);
        let n = samples.len();
        if self.shape.viewable() && self.reader.contiguous(&samples) && n > 0 {
            return self.reader.view(step, &samples, &self.layout);
        }
        let held = self.reader.resolve(&samples)?;
        let seq_len = self.shape.seq_len(&self.reader, &samples, &held);
        let lens: Vec<usize> = (0..self.layout.len())
            .map(|t| self.tensor_bytes(t, n, seq_len))
            .collect();
        let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&len| self.pool.take(len)).collect();
        let mut slices: Vec<&mut [u8]> = bufs
            .iter_mut()
            .zip(&lens)
            .map(|(b, &len)| &mut b[..len])
            .collect();
        let info = self.shape.fill(
            &self.reader,
            (&samples, repeated),
            &held,
            seq_len,
            &mut slices,
        );
        drop(held);
        let tensors = bufs
            .into_iter()
            .zip(lens)
            .enumerate()
            .map(|(t, (buf, len))| {
                let shape = self.shape.batch_shape(&self.layout, t, n, seq_len);
                BatchTensor::owned(&self.layout[t], shape, buf, len, self.pool.clone())
            })
            .collect();
        Ok(Batch {
            step,
            size: info.pack.map_or(n, |p| p.seqs),
            seq_len: info.seq_len,
            pack: info.pack,
            tensors,
        })
    }

    /// Page-cache hints for the window after `w` and the one before `w - 1`.
    pub fn advise(&self, w: usize) {
        self.reader.advise(&self.order, w);
    }
}
