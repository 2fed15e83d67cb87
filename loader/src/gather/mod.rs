//! Building one batch: which contexts a rank's step holds, and one copy of their bytes from the
//! shards into the batch. Shared by a loader's threads and its fillers. One file per batch
//! shape ([`crate::Batches`]) holds what is its own: `padded` (whole contexts, plain or
//! bucketed, padded to `L` or trimmed), `packed` (sequences end to end; their plan over the
//! order is [`crate::pack`]) and `windows` (windows of long series; their order is
//! `order::series`); what they share (shards resolved, views, blocks, fills) stays here.

use crate::batch::{Batch, BatchTensor, TensorLayout};
use crate::body::Shard;
use crate::body::{Body, ShardBytes};
use crate::cache::Inner;
use crate::error::LoadError;
use crate::mmap::Mapped;
use crate::order::Steps;
use crate::order::{trimmed_len, Cursor, Order, Sample};
use crate::pack::{PackInfo, Packs};
use crate::pool::Pool;
use crate::stats::Counters;
use dsc_format::Dtype;
use dsc_format::{TensorRole, TensorSpec};
use packed::{write_pack_index, PACK_TENSORS};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use windows::SeriesPlan;

pub(crate) mod packed;
pub(crate) mod padded;
pub(crate) mod windows;

/// How an epoch's order is cut into batches.
#[derive(Debug)]
pub(crate) enum Batching {
    /// `batch_size` contexts per rank and step, padded to `L` or (`trim: Some(m)`) cut to the
    /// batch's longest stored sequence rounded up the ladder of `m` ([`trimmed_len`]).
    Padded { steps: Steps, trim: Option<usize> },
    /// One pack per rank and step.
    Packed {
        packs: Packs,
        /// Each context's stored length, compiled order.
        lengths: Arc<[u32]>,
    },
}

impl Batching {
    /// Rows of a batch's per-context tensors: `batch_size`, or a pack's `S`.
    pub fn rows(&self) -> usize {
        match self {
            Batching::Padded { steps, .. } => steps.batch_size,
            Batching::Packed { packs, .. } => packs.max_seqs(),
        }
    }

    /// Steps (batches per rank) in the epoch.
    pub fn steps(&self) -> usize {
        match self {
            Batching::Padded { steps, .. } => steps.steps,
            Batching::Packed { packs, .. } => packs.steps(),
        }
    }

    /// The epoch position of the first context of rank `rank`'s batch at `step`.
    pub fn first_position(&self, step: usize, rank: usize) -> usize {
        match self {
            Batching::Padded { steps, .. } => steps.positions(step, rank).next().unwrap_or(0),
            Batching::Packed { packs, .. } => packs.positions(packs.pack_at(step, rank).0).start,
        }
    }
}

/// The layout of the batches of `slots` (manifest indices): padded batches of `batch_size`, or
/// packs of (`T`, `S`).
pub(crate) fn layout(
    tensors: &[TensorSpec],
    slots: &[usize],
    batch_size: usize,
    pack: Option<(usize, usize)>,
) -> Vec<TensorLayout> {
    let mut out: Vec<TensorLayout> = slots
        .iter()
        .map(|&i| {
            let spec = &tensors[i];
            let (shape, trimmed_axis) = match pack {
                None => {
                    let mut shape = vec![batch_size];
                    shape.extend_from_slice(&spec.sample_shape);
                    (shape, is_sequence(spec).then_some(1))
                }
                Some((tokens, _)) if is_sequence(spec) => {
                    let mut shape = vec![tokens];
                    shape.extend_from_slice(&spec.sample_shape[1..]);
                    (shape, None)
                }
                Some((_, seqs)) => {
                    let mut shape = vec![seqs];
                    shape.extend_from_slice(&spec.sample_shape);
                    (shape, None)
                }
            };
            TensorLayout {
                name: spec.name.clone(),
                dtype: spec.dtype,
                role: Some(spec.role),
                shape,
                trimmed_axis,
            }
        })
        .collect();
    if let Some((tokens, seqs)) = pack {
        for (name, len) in PACK_TENSORS.iter().zip([seqs + 1, tokens, tokens, 1, 1]) {
            out.push(TensorLayout {
                name: (*name).into(),
                dtype: Dtype::I32,
                role: None,
                shape: vec![len],
                trimmed_axis: None,
            });
        }
    }
    out
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

/// Where [`Gather::index_into`] writes a batch's index.
#[derive(Debug)]
pub(crate) struct IndexDst<'a, 'b> {
    /// Each row's compiled-order position, i64 (`Batching::rows` of them).
    pub positions: &'a mut [u8],
    /// The position written for a pack's unused rows (and, times `L`, its unused tokens).
    pub unused: usize,
    /// A pack's token rows, i64 `[T]`, or `None` when not asked for.
    pub token_rows: Option<&'a mut [u8]>,
    /// A pack's own five tensors (empty for padded batches).
    pub pack: &'a mut [&'b mut [u8]],
}

/// Tensors of a block ([`Gather::gather_block`]) start at multiples of this many bytes: any
/// dtype's alignment, and a GPU's preferred access granularity.
pub const BLOCK_ALIGN: usize = 256;

/// One cache a loader reads: the only one, or one source of a mix.
#[derive(Debug)]
pub(crate) struct Source {
    pub cache: Arc<Inner>,
    pub split_index: usize,
    /// Each loaded tensor's index among this cache's manifest tensors (and so among a shard's
    /// tensors), in layout order. The specs stay in the manifest: a categorical column's
    /// vocabulary can be hundreds of KB, and a loader is built every epoch.
    pub slots: Vec<usize>,
    /// The manifest index of `length`, read for trimming whether or not it is loaded.
    pub length_index: usize,
    /// This cache's `L` (a mix pads shorter sources to the longest).
    pub max_len: usize,
    /// Whether the split's shards are held on use rather than mapped at open: compressed
    /// (decompressed on use) or in object storage (fetched ahead of use).
    pub cold: bool,
}

impl Source {
    pub fn shards(&self) -> &[Shard] {
        &self.cache.splits[self.split_index].1
    }

    /// Whether this cache is in object storage.
    fn remote(&self) -> bool {
        !matches!(self.cache.origin, crate::cache::Origin::Folder(_))
    }

    /// The spec of loaded tensor `t` in this cache.
    fn spec(&self, t: usize) -> &TensorSpec {
        &self.cache.manifest.tensors()[self.slots[t]]
    }

    /// Where sample `s`'s bytes of loaded tensor `t` start in its shard, and their length.
    pub(crate) fn range(&self, s: &Sample, t: usize) -> (usize, usize) {
        let size = self.spec(t).sample_bytes();
        (
            self.shards()[s.shard].tensor_starts[self.slots[t]] + s.offset * size,
            size,
        )
    }
}

/// Everything a batch is built from.
#[derive(Debug)]
pub(crate) struct Gather {
    /// The caches read: one, or a mix's sources.
    pub sources: Vec<Source>,
    pub order: Order,
    pub batching: Batching,
    pub rank: usize,
    /// The tensors of every batch, whole (untrimmed): the loaded ones, then a pack's own.
    pub layout: Vec<TensorLayout>,
    /// Loaded tensors (the first entries of `layout`).
    pub loaded: usize,
    /// `L` of the batches: the longest of the sources'.
    pub max_len: usize,
    pub pool: Arc<Pool>,
    /// Whether any source's shards are compressed (decompressed on use, not mapped).
    pub cold: bool,
    /// Whether the split's pages stay in the process's page tables between windows and epochs
    /// (the split fits the loader's resident budget) instead of being released behind the
    /// reader.
    pub keep_resident: bool,
    /// What this epoch's batches have cost and carried ([`crate::LoaderStats`]).
    pub counters: Counters,
    /// Windows of long series: what a row reads beyond its sample (`windows`).
    pub series: Option<SeriesPlan>,
    /// This epoch's (and the next one's) shard order, given to the fetcher of each source in
    /// object storage: withdrawn when the loader is dropped.
    #[cfg(feature = "remote")]
    pub plans: Vec<crate::remote::PlanGuard>,
    /// Set by [`crate::Loader::interrupt`] (Ctrl-C, a close): a wait for a shard's download
    /// gives up with [`LoadError::Stopped`] instead of lasting until it arrives.
    pub stopped: std::sync::atomic::AtomicBool,
}

/// Whether a stored tensor has a step axis (`[n, L, ..]`), trimmed or packed by the loader.
pub(crate) fn is_sequence(spec: &TensorSpec) -> bool {
    matches!(
        spec.role,
        TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded
    )
}

impl Gather {
    /// [`crate::Loader::interrupt`]: sets the flag every wait for a download reads, and wakes
    /// the waits (they look at it every few milliseconds).
    pub(crate) fn interrupt(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn source(&self, s: &Sample) -> &Source {
        &self.sources[s.source]
    }

    /// The spec of loaded tensor `t` (the first source's, for a mix).
    pub(crate) fn spec(&self, t: usize) -> &TensorSpec {
        self.sources[0].spec(t)
    }

    /// The loaded tensors' specs, in manifest order (the first source's, for a mix).
    pub fn specs(&self) -> impl ExactSizeIterator<Item = &TensorSpec> {
        (0..self.loaded).map(|t| self.spec(t))
    }

    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    /// Steps (batches per rank) in the epoch.
    pub fn steps(&self) -> usize {
        self.batching.steps()
    }

    /// The contexts of this rank's batch at `step` (keeping the last window permutation in
    /// `cache`), and whether the batch repeats an earlier pack.
    pub fn samples(&self, step: usize, cursor: &mut Cursor) -> (Vec<Sample>, bool) {
        match &self.batching {
            Batching::Padded { steps, .. } => (
                steps
                    .positions(step, self.rank)
                    .map(|p| self.order.sample_at(p, cursor))
                    .collect(),
                false,
            ),
            Batching::Packed { packs, .. } => {
                let (q, repeated) = packs.pack_at(step, self.rank);
                let samples = packs
                    .positions(q)
                    .map(|p| self.order.sample_at(p, cursor))
                    .collect();
                (samples, repeated)
            }
        }
    }

    /// The bytes of the shards that `samples` lie in that are not mapped at open (compressed,
    /// or in object storage; a hot local cache's maps are read directly), held for one batch.
    fn resolve(&self, samples: &[Sample]) -> Result<Resolved<'_>, LoadError> {
        let mut held: Vec<((usize, usize), ShardBytes<'_>)> = Vec::new();
        for s in samples {
            let source = self.source(s);
            let key = (s.source, s.shard);
            if !source.shards()[s.shard].body.is_mapped() && !held.iter().any(|(k, _)| *k == key) {
                let bytes =
                    source
                        .cache
                        .shard_bytes(source.split_index, s.shard, Some(&self.stopped))?;
                held.push((key, bytes));
            }
        }
        Ok(Resolved(held))
    }

    /// The bytes of the shard sample `s` lies in: its map, or its bytes in `held`.
    pub(crate) fn shard_bytes<'a>(&'a self, s: &Sample, held: &'a Resolved<'a>) -> &'a [u8] {
        match &self.source(s).shards()[s.shard].body {
            Body::Mapped(map) => map.bytes(),
            _ => held.get((s.source, s.shard)),
        }
    }

    pub(crate) fn stored_length(&self, s: &Sample, held: &Resolved<'_>) -> usize {
        let source = self.source(s);
        let size = 4;
        let start = source.shards()[s.shard].tensor_starts[source.length_index] + s.offset * size;
        let b = &self.shard_bytes(s, held)[start..start + size];
        i32::from_le_bytes(b.try_into().expect("4 bytes")).max(0) as usize
    }

    /// The sequence length of a padded batch: `L`, or trimmed its longest stored length
    /// rounded up the ladder ([`trimmed_len`]).
    fn seq_len(&self, samples: &[Sample], held: &Resolved<'_>) -> usize {
        let Batching::Padded {
            trim: Some(multiple),
            ..
        } = self.batching
        else {
            return self.max_len();
        };
        let longest = samples
            .iter()
            .map(|s| self.stored_length(s, held))
            .max()
            .unwrap_or(0);
        trimmed_len(longest, multiple, self.max_len())
    }

    /// Bytes of tensor `t` of the layout in a padded batch of `n` contexts cut to `seq_len`, or
    /// in a pack (whose layout ends with its own tensors).
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

    fn tensor_bytes(&self, t: usize, n: usize, seq_len: usize) -> usize {
        match &self.batching {
            Batching::Padded { .. } => n * self.copy_bytes(t, seq_len),
            Batching::Packed { .. } => self.layout[t].bytes(),
        }
    }

    /// Bytes of one sample of tensor `t` cut (or padded) to `seq_len` steps: a loaded one's,
    /// or one of the tensors a series window adds (fixed).
    pub(crate) fn copy_bytes(&self, t: usize, seq_len: usize) -> usize {
        if t >= self.loaded {
            let l = &self.layout[t];
            return l.bytes() / l.shape[0].max(1);
        }
        let source = &self.sources[0];
        let spec = source.spec(t);
        if is_sequence(spec) {
            spec.sample_bytes() / source.max_len.max(1) * seq_len
        } else {
            spec.sample_bytes()
        }
    }

    /// The shape of tensor `t` of a batch of `n` contexts at `seq_len` (a pack's are fixed).
    fn shape(&self, t: usize, n: usize, seq_len: usize) -> Vec<usize> {
        let l = &self.layout[t];
        let mut shape = l.shape.clone();
        if matches!(self.batching, Batching::Padded { .. }) {
            shape[0] = n;
            if let Some(axis) = l.trimmed_axis {
                shape[axis] = seq_len;
            }
        }
        shape
    }

    /// Copies the batch of `samples` into `dst` (one slice per tensor of the layout, each at
    /// least its bytes).
    pub fn gather_into(
        &self,
        batch: (&[Sample], bool),
        dst: &mut [&mut [u8]],
    ) -> Result<BatchInfo, LoadError> {
        let held = self.resolve(batch.0)?;
        let seq_len = self.seq_len(batch.0, &held);
        Ok(self.fill(batch, &held, seq_len, dst))
    }

    /// Copies the batch of `samples` into one `block`, its tensors one after another (layout
    /// order) at offsets that are multiples of [`BLOCK_ALIGN`], each cut to this batch (a
    /// trimmed batch's length; a pack's fixed shapes), so that the used bytes are one prefix of
    /// the block: one transfer to a device moves the batch. Returns what the batch is and each
    /// tensor's `(offset, bytes)` in the block; an error if the block is shorter than
    /// [`Gather::block_bytes`] would need.
    pub fn gather_block(
        &self,
        batch: (&[Sample], bool),
        block: &mut [u8],
    ) -> Result<(BatchInfo, Vec<(usize, usize)>), LoadError> {
        let held = self.resolve(batch.0)?;
        let seq_len = self.seq_len(batch.0, &held);
        let n = batch.0.len();
        let mut ranges = Vec::with_capacity(self.layout.len());
        let mut end = 0usize;
        for t in 0..self.layout.len() {
            let start = end.next_multiple_of(BLOCK_ALIGN);
            let len = self.tensor_bytes(t, n, seq_len);
            ranges.push((start, len));
            end = start + len;
        }
        if block.len() < end {
            return Err(crate::error::Misuse::BlockTooSmall {
                bytes: block.len(),
                need: end,
            }
            .into());
        }
        let mut slices = Vec::with_capacity(ranges.len());
        let mut rest = &mut block[..];
        let mut at = 0;
        for &(start, len) in &ranges {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let (slice, tail) = tail.split_at_mut(len);
            slices.push(slice);
            rest = tail;
            at = start + len;
        }
        Ok((self.fill(batch, &held, seq_len, &mut slices), ranges))
    }

    /// The most bytes [`Gather::gather_block`] needs: the whole (untrimmed) batch, each tensor
    /// at an aligned offset.
    pub fn block_bytes(&self) -> usize {
        self.layout
            .iter()
            .fold(0, |end, t| end.next_multiple_of(BLOCK_ALIGN) + t.bytes())
    }

    /// Copies `samples` (`held`: the compressed shards they lie in) into `dst` as this epoch
    /// cuts them: a padded batch at `seq_len` steps, or a pack (`repeated`: a repeat of an
    /// earlier one).
    fn fill(
        &self,
        (samples, repeated): (&[Sample], bool),
        held: &Resolved<'_>,
        seq_len: usize,
        dst: &mut [&mut [u8]],
    ) -> BatchInfo {
        match &self.batching {
            Batching::Padded { .. } => {
                match &self.series {
                    Some(plan) => self.gather_windows(plan, samples, held, dst),
                    None => self.gather_padded(samples, held, seq_len, dst),
                }
                BatchInfo {
                    seq_len,
                    pack: None,
                }
            }
            Batching::Packed { packs, lengths } => {
                let pack = self.gather_pack(packs, lengths, (samples, repeated), held, dst);
                BatchInfo {
                    seq_len: pack.max_seqlen,
                    pack: Some(pack),
                }
            }
        }
    }

    /// Batch `batch` as a consumer holding the split's tensors gathers it (a split resident on
    /// a GPU): each row's position in the split's compiled order as i64 into `dst.positions`
    /// (the batch's contexts, or a pack's sequences then `dst.unused` up to `S`), a pack's
    /// token rows into `dst.token_rows` when given, and for a pack its own five tensors into
    /// `dst.pack` (`cu_seqlens`, `seq_idx`, `position`, `num_seqs`, `num_tokens`, as in a
    /// gathered pack). Reads only the split's stored lengths, never the shards; the batch it
    /// describes is the one [`Gather::gather_into`] copies.
    pub fn index_into(
        &self,
        (samples, repeated): (&[Sample], bool),
        lengths: &[u32],
        dst: IndexDst<'_, '_>,
    ) -> BatchInfo {
        let rows = dst.positions.len() / 8;
        let unused = dst.unused as i64;
        write_i64(
            dst.positions,
            samples
                .iter()
                .map(|s| s.position as i64)
                .chain(std::iter::repeat(unused))
                .take(rows),
        );
        match &self.batching {
            Batching::Padded { trim, .. } => BatchInfo {
                seq_len: match trim {
                    Some(multiple) => {
                        let longest = samples.iter().map(|s| lengths[s.position] as usize).max();
                        trimmed_len(longest.unwrap_or(0), *multiple, self.max_len())
                    }
                    None => self.max_len(),
                },
                pack: None,
            },
            Batching::Packed { packs, .. } => {
                let lens = self.pack_lens(lengths, samples);
                if let Some(token_rows) = dst.token_rows {
                    // Row `position * L + step` of the split's tensors flattened to
                    // `[contexts * L, ...]`; the tail reads the consumer's zero row.
                    let l = self.max_len() as i64;
                    let rows = samples.iter().zip(&lens).flat_map(|(s, &len)| {
                        let first = s.position as i64 * l;
                        first..first + len as i64
                    });
                    write_i64(
                        token_rows,
                        rows.chain(std::iter::repeat(unused * l))
                            .take(packs.tokens()),
                    );
                }
                write_pack_index(packs, &lens, dst.pack);
                let max_seqlen = lens.iter().copied().max().unwrap_or(0);
                BatchInfo {
                    seq_len: max_seqlen,
                    pack: Some(PackInfo {
                        seqs: samples.len(),
                        tokens: lens.iter().sum(),
                        max_seqlen,
                        repeated,
                    }),
                }
            }
        }
    }

    /// Rank `rank`'s batch at `step`: a view of the shard where the contexts lie in cache order
    /// and nothing is trimmed or packed, otherwise one gather into pooled buffers.
    pub fn build(&self, step: usize, cursor: &mut Cursor) -> Result<Batch, LoadError> {
        let (samples, repeated) = self.samples(step, cursor);
        let n = samples.len();
        let contiguous = samples.windows(2).all(|w| {
            w[1].source == w[0].source && w[1].shard == w[0].shard && w[1].offset == w[0].offset + 1
        }) && samples
            .first()
            .is_some_and(|s| self.source(s).max_len == self.max_len);
        // (A series window is a part of its context: never a view of whole contexts.)
        let views =
            self.series.is_none() && matches!(self.batching, Batching::Padded { trim: None, .. });
        if views && contiguous && n > 0 {
            return self.view(step, &samples);
        }
        let held = self.resolve(&samples)?;
        let seq_len = self.seq_len(&samples, &held);
        let lens: Vec<usize> = (0..self.layout.len())
            .map(|t| self.tensor_bytes(t, n, seq_len))
            .collect();
        let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&len| self.pool.take(len)).collect();
        let mut slices: Vec<&mut [u8]> = bufs
            .iter_mut()
            .zip(&lens)
            .map(|(b, &len)| &mut b[..len])
            .collect();
        let info = self.fill((&samples, repeated), &held, seq_len, &mut slices);
        drop(held);
        let tensors = bufs
            .into_iter()
            .zip(lens)
            .enumerate()
            .map(|(t, (buf, len))| {
                BatchTensor::owned(
                    &self.layout[t],
                    self.shape(t, n, seq_len),
                    buf,
                    len,
                    self.pool.clone(),
                )
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

    /// A batch of `samples`, consecutive contexts of one shard, as views: of the map of a hot
    /// shard, of the decompressed bytes of a cold one, of the fetched copy of a remote one.
    fn view(&self, step: usize, samples: &[Sample]) -> Result<Batch, LoadError> {
        let n = samples.len();
        let first = samples[0];
        let source = self.source(&first);
        let shard = &source.shards()[first.shard];
        let cold = if shard.body.is_mapped() {
            None
        } else {
            Some(
                source
                    .cache
                    .shard_bytes(source.split_index, first.shard, Some(&self.stopped))?,
            )
        };
        let max_len = self.max_len();
        let tensors = (0..self.loaded)
            .map(|t| {
                let (start, size) = source.range(&first, t);
                let shape = self.shape(t, n, max_len);
                match &cold {
                    Some(ShardBytes::Held(bytes)) => {
                        BatchTensor::shared(&self.layout[t], shape, bytes.clone(), start, n * size)
                    }
                    _ => BatchTensor::mapped(
                        &self.layout[t],
                        shape,
                        source.cache.clone(),
                        (source.split_index, first.shard, start, n * size),
                    ),
                }
            })
            .collect();
        Ok(Batch {
            step,
            size: n,
            seq_len: max_len,
            pack: None,
            tensors,
        })
    }

    /// Page-cache hints for the window after `w` (read ahead) and the one before `w - 1`
    /// (release from this process's resident set).
    pub fn advise(&self, w: usize) {
        let window = self.order.window();
        let total = self.order.len();
        let ahead = ((w + 1) * window).min(total)..((w + 2) * window).min(total);
        // A remote cache's fetcher learns where the reader is: what it may let go and what it
        // fetches next follow from that.
        #[cfg(feature = "remote")]
        for plan in &self.plans {
            plan.at(w);
        }
        if self.cold {
            // Decompress the next window's shards here, off the gathering threads; a failure
            // is reported by the gather that needs the shard. Not a remote cache's: asking
            // for them would put the next window's downloads before the plan's order and its
            // limit (the fetcher reads ahead by itself).
            for (source, shard, _, _) in self.order.spans(ahead) {
                let source = &self.sources[source];
                if !source.remote() {
                    let _ =
                        source
                            .cache
                            .shard_bytes(source.split_index, shard, Some(&self.stopped));
                }
            }
            return;
        }
        if self.keep_resident {
            // Fault each loaded tensor of a shard in once, whole, ahead of its first use; it
            // then stays mapped.
            for (source, shard, _, _) in self.order.spans(ahead) {
                let source = &self.sources[source];
                let shard = &source.shards()[shard];
                let Body::Mapped(map) = &shard.body else {
                    continue;
                };
                for &slot in &source.slots {
                    if !shard.populated[slot].swap(true, Ordering::Relaxed) {
                        let size = source.cache.manifest.tensors()[slot].sample_bytes();
                        map.will_need(shard.tensor_starts[slot], size * shard.entry.contexts);
                    }
                }
            }
            return;
        }
        self.for_spans(ahead, |map, start, len| map.will_need(start, len));
        if w >= 2 {
            let behind = (w - 2) * window..(w - 1) * window;
            self.for_spans(behind, |map, start, len| map.release(start, len));
        }
    }

    /// Calls `f` with the map and byte range of every loaded tensor of the hot shards that
    /// epoch positions `range` read.
    fn for_spans(&self, range: std::ops::Range<usize>, f: impl Fn(&Mapped, usize, usize)) {
        for (source, shard, lo, hi) in self.order.spans(range) {
            let source = &self.sources[source];
            let shard = &source.shards()[shard];
            let Body::Mapped(map) = &shard.body else {
                continue;
            };
            for &slot in &source.slots {
                let size = source.cache.manifest.tensors()[slot].sample_bytes();
                f(map, shard.tensor_starts[slot] + lo * size, (hi - lo) * size);
            }
        }
    }
}

/// Writes `values` as little-endian i32 into `out`, front to back.
pub(crate) fn write_i32(out: &mut [u8], values: impl Iterator<Item = i32>) {
    for (chunk, v) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

/// Writes `values` as little-endian i64 into `out`, front to back.
pub(crate) fn write_i64(out: &mut [u8], values: impl Iterator<Item = i64>) {
    for (chunk, v) in out.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

/// The bytes of the compressed shards one batch reads (by source and shard), held while it is
/// gathered.
pub(crate) struct Resolved<'a>(Vec<((usize, usize), ShardBytes<'a>)>);

impl Resolved<'_> {
    fn get(&self, shard: (usize, usize)) -> &[u8] {
        &self
            .0
            .iter()
            .find(|(k, _)| *k == shard)
            .expect("resolved before the gather")
            .1
    }
}
