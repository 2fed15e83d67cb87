//! Reading a batch's bytes from the shards, whatever its shape: the caches read ([`Source`]),
//! the shards a batch lies in resolved (mapped, decompressed or fetched) and held while it is
//! copied, a batch of consecutive contexts handed over as views, a block's tensors laid at
//! aligned offsets, and the kernel told what to read ahead and what to release. How a shape
//! cuts its rows and copies them is its room's ([`crate::shape`]); `rows` copies rows a few at
//! a time.

use crate::batch::{Batch, BatchTensor, TensorLayout};
use crate::body::Shard;
use crate::body::{Body, ShardBytes};
use crate::cache::Inner;
use crate::error::LoadError;
use crate::mmap::Mapped;
use crate::order::{Order, Sample};
use dsc_format::{TensorRole, TensorSpec};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Tensors of a block ([`crate::Loader::fill_block`]) start at multiples of this many bytes:
/// any dtype's alignment, and a GPU's preferred access granularity.
pub const BLOCK_ALIGN: usize = 256;

/// Where tensors of `lens` bytes lie in a block: each at a multiple of [`BLOCK_ALIGN`], one
/// after another; and the block's used bytes.
pub(crate) fn block_ranges(lens: impl IntoIterator<Item = usize>) -> (Vec<(usize, usize)>, usize) {
    let mut end = 0usize;
    let ranges = lens
        .into_iter()
        .map(|len| {
            let start = end.next_multiple_of(BLOCK_ALIGN);
            end = start + len;
            (start, len)
        })
        .collect();
    (ranges, end)
}

/// `block` cut into the slices of `ranges` (in order, not overlapping).
pub(crate) fn split_block<'a>(block: &'a mut [u8], ranges: &[(usize, usize)]) -> Vec<&'a mut [u8]> {
    let mut slices = Vec::with_capacity(ranges.len());
    let mut rest = block;
    let mut at = 0;
    for &(start, len) in ranges {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
        let (slice, tail) = tail.split_at_mut(len);
        slices.push(slice);
        rest = tail;
        at = start + len;
    }
    slices
}

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

/// The shards of the caches a loader reads, as every batch shape reads them.
#[derive(Debug)]
pub(crate) struct Reader {
    /// The caches read: one, or a mix's sources.
    pub sources: Vec<Source>,
    /// Loaded tensors (the first entries of a batch's layout).
    pub loaded: usize,
    /// `L` of the batches: the longest of the sources', or a series window's.
    pub max_len: usize,
    /// Whether any source's shards are compressed (decompressed on use, not mapped).
    pub cold: bool,
    /// Whether the split's pages stay in the process's page tables between windows and epochs
    /// (the split fits the loader's resident budget) instead of being released behind the
    /// reader.
    pub keep_resident: bool,
    /// This epoch's (and the next one's) shard order, given to the fetcher of each source in
    /// object storage: withdrawn when the loader is dropped.
    #[cfg(feature = "remote")]
    pub plans: Vec<crate::remote::PlanGuard>,
    /// Set by [`crate::Loader::interrupt`] (Ctrl-C, a close): a wait for a shard's download
    /// gives up with [`LoadError::Stopped`] instead of lasting until it arrives.
    pub stopped: AtomicBool,
}

/// Whether a stored tensor has a step axis (`[n, L, ..]`), trimmed or packed by the loader.
pub(crate) fn is_sequence(spec: &TensorSpec) -> bool {
    matches!(
        spec.role,
        TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded
    )
}

impl Reader {
    /// [`crate::Loader::interrupt`]: sets the flag every wait for a download reads, and wakes
    /// the waits (they look at it every few milliseconds).
    pub(crate) fn interrupt(&self) {
        self.stopped.store(true, Ordering::Relaxed);
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

    /// The bytes of the shards that `samples` lie in that are not mapped at open (compressed,
    /// or in object storage; a hot local cache's maps are read directly), held for one batch.
    pub(crate) fn resolve(&self, samples: &[Sample]) -> Result<Resolved<'_>, LoadError> {
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

    /// Sample `s`'s stored length, read from its shard.
    pub(crate) fn stored_length(&self, s: &Sample, held: &Resolved<'_>) -> usize {
        let source = self.source(s);
        let size = 4;
        let start = source.shards()[s.shard].tensor_starts[source.length_index] + s.offset * size;
        let b = &self.shard_bytes(s, held)[start..start + size];
        i32::from_le_bytes(b.try_into().expect("4 bytes")).max(0) as usize
    }

    /// Bytes of one sample of loaded tensor `t` cut (or padded) to `seq_len` steps.
    pub(crate) fn copy_bytes(&self, t: usize, seq_len: usize) -> usize {
        let source = &self.sources[0];
        let spec = source.spec(t);
        if is_sequence(spec) {
            spec.sample_bytes() / source.max_len.max(1) * seq_len
        } else {
            spec.sample_bytes()
        }
    }

    /// The content id of the data read: each cache's generation's, joined by `+`.
    pub(crate) fn content_id(&self) -> String {
        crate::cache::content_of(self.sources.iter().map(|s| &s.cache.manifest))
    }

    /// Whether `samples` are consecutive contexts of one shard of a source of the batches' `L`:
    /// a batch of them can be views of the shard.
    pub(crate) fn contiguous(&self, samples: &[Sample]) -> bool {
        samples.windows(2).all(|w| {
            w[1].source == w[0].source && w[1].shard == w[0].shard && w[1].offset == w[0].offset + 1
        }) && samples
            .first()
            .is_some_and(|s| self.source(s).max_len == self.max_len)
    }

    /// Batch `step` of `samples` ([`Reader::contiguous`]) as views of the loaded tensors of
    /// `layout`: of the map of a hot shard, of the decompressed bytes of a cold one, of the
    /// fetched copy of a remote one.
    pub(crate) fn view(
        &self,
        step: usize,
        samples: &[Sample],
        layout: &[TensorLayout],
    ) -> Result<Batch, LoadError> {
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
        let tensors = (0..self.loaded)
            .map(|t| {
                let (start, size) = source.range(&first, t);
                let mut shape = layout[t].shape.clone();
                shape[0] = n;
                match &cold {
                    Some(ShardBytes::Held(bytes)) => {
                        BatchTensor::shared(&layout[t], shape, bytes.clone(), start, n * size)
                    }
                    _ => BatchTensor::mapped(
                        &layout[t],
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
            seq_len: self.max_len,
            pack: None,
            tensors,
        })
    }
    /// Page-cache hints for the window after `w` (read ahead) and the one before `w - 1`
    /// (release from this process's resident set).
    pub fn advise(&self, order: &Order, w: usize) {
        let window = order.window();
        let total = order.len();
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
            for (source, shard, _, _) in order.spans(ahead) {
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
            for (source, shard, _, _) in order.spans(ahead) {
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
        self.for_spans(order, ahead, |map, start, len| map.will_need(start, len));
        if w >= 2 {
            let behind = (w - 2) * window..(w - 1) * window;
            self.for_spans(order, behind, |map, start, len| map.release(start, len));
        }
    }

    /// Calls `f` with the map and byte range of every loaded tensor of the hot shards that
    /// epoch positions `range` read.
    fn for_spans(
        &self,
        order: &Order,
        range: std::ops::Range<usize>,
        f: impl Fn(&Mapped, usize, usize),
    ) {
        for (source, shard, lo, hi) in order.spans(range) {
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
