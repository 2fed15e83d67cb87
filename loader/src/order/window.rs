//! The order of an epoch: a pure function of (shard sizes, seed, epoch, window, interleave).
//!
//! Positions `0..N` of a split are its contexts in compiled order (shard 0 first). With shuffle
//! on, an epoch
//!
//! 1. permutes the shards with `Xoshiro256::for_stream(epoch_seed, EPOCH_ORDER)` (Fisher–Yates,
//!    as at compile time), where `epoch_seed = seed ^ mix64(epoch + 0xD1B54A32D192ED03)`;
//! 2. reads the permuted shards `interleave` at a time, in rounds: each round takes the next
//!    block of `window / interleave` contexts from every shard of the group that has any left.
//!    This gives a virtual sequence of all contexts in which every stretch of `window` contexts
//!    spans several shards, while each shard is still read front to back;
//! 3. cuts that sequence into windows of `window` contexts and permutes window `w` with
//!    `Xoshiro256::for_stream(epoch_seed, EPOCH_ORDER + 1 + w)`.
//!
//! With **length bucketing** (`EpochOrder::bucketed`), the window is rounded up to a whole number
//! of global batches; each window's permutation is then sorted by stored length (stably, so
//! equal lengths keep their shuffled order), cut into global batches, and those batches are
//! permuted with `Xoshiro256::for_stream(epoch_seed, BUCKET_ORDER + w)` (a partial batch, only
//! possible in the last window, stays last). Each batch then holds contexts of similar length
//! and is trimmed to its longest one, while the batches still come in random order and every
//! context still appears once per epoch.
//!
//! Reads stay inside one window (about `window` × bytes per context resident), batches mix the
//! window's shards, and as the cache was shuffled at compile time the result is close to a
//! uniform permutation (see [`EpochOrder::quality`]). Any position is found by a binary search
//! plus one window permutation, so a resume costs O(window), never a replay. With shuffle off
//! the order is the compiled order. `docs/FORMAT.md` ("Epoch order") states the same for other
//! implementations.

use super::live::SplitContexts;
use dsc_format::rng::{mix64, stream, Xoshiro256};
use std::sync::Arc;

/// Default window: contexts permuted together.
pub const DEFAULT_WINDOW: usize = 4096;
/// Default number of shards read side by side.
pub const DEFAULT_INTERLEAVE: usize = 8;

/// A run of consecutive contexts of one shard in the epoch's virtual sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    vstart: usize,
    shard: usize,
    offset: usize,
    len: usize,
}

/// The order of one epoch of one split.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    /// The split's contexts per shard, those a reader sees and those stored.
    contexts: Arc<SplitContexts>,
    /// First compiled position of each shard (counting every stored context).
    starts: Vec<usize>,
    /// Shards in epoch order.
    shard_order: Vec<usize>,
    /// The virtual sequence, as runs of shards.
    segments: Vec<Segment>,
    total: usize,
    shuffle: bool,
    window: usize,
    interleave: usize,
    seed: u64,
    epoch: u64,
    buckets: Option<Buckets>,
}

/// Length bucketing of an epoch.
#[derive(Debug, Clone)]
struct Buckets {
    /// Stored length of every context, by compiled position.
    lengths: Arc<[u32]>,
    /// Contexts per bucket: the global batch.
    batch: usize,
}

impl EpochOrder {
    /// The order for `epoch` over shards holding `sizes` contexts each; `window` and
    /// `interleave` are clamped to at least 1.
    pub fn new(
        sizes: &[usize],
        shuffle: bool,
        seed: u64,
        epoch: u64,
        window: usize,
        interleave: usize,
    ) -> Self {
        let contexts = Arc::new(SplitContexts::all(sizes));
        Self::over(contexts, shuffle, seed, epoch, window, interleave)
    }

    /// The order for `epoch` over the contexts a reader sees of `contexts`: the epoch as if the
    /// hidden ones were not stored, its samples at their stored offsets and positions.
    pub fn over(
        contexts: Arc<SplitContexts>,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        window: usize,
        interleave: usize,
    ) -> Self {
        let window = window.max(1);
        let mut starts = Vec::with_capacity(contexts.shards());
        let mut at = 0;
        for &s in contexts.stored() {
            starts.push(at);
            at += s;
        }
        let sizes = contexts.live();
        let acc = contexts.len();
        let mut shard_order: Vec<usize> = (0..sizes.len()).collect();
        let mut segments = Vec::new();
        let mut vstart = 0;
        let mut push = |shard: usize, offset: usize, len: usize| {
            if len > 0 {
                segments.push(Segment {
                    vstart,
                    shard,
                    offset,
                    len,
                });
                vstart += len;
            }
        };
        if shuffle {
            Xoshiro256::for_stream(epoch_seed(seed, epoch), stream::EPOCH_ORDER)
                .shuffle(&mut shard_order);
            let k = interleave.max(1);
            let block = (window / k).max(1);
            for group in shard_order.chunks(k) {
                let longest = group.iter().map(|&s| sizes[s]).max().unwrap_or(0);
                for round in 0..longest.div_ceil(block) {
                    for &shard in group {
                        let offset = round * block;
                        push(
                            shard,
                            offset,
                            block.min(sizes[shard].saturating_sub(offset)),
                        );
                    }
                }
            }
        } else {
            for (shard, &size) in sizes.iter().enumerate() {
                push(shard, 0, size);
            }
        }
        EpochOrder {
            contexts,
            starts,
            shard_order,
            segments,
            total: acc,
            shuffle,
            window,
            interleave,
            seed,
            epoch,
            buckets: None,
        }
    }

    /// This order with length bucketing for global batches of `global_batch` contexts:
    /// `lengths` holds every context's stored length in compiled order. The window is rounded
    /// up to a multiple of `global_batch` (the virtual sequence is rebuilt for it).
    pub fn bucketed(self, lengths: Arc<[u32]>, global_batch: usize) -> Self {
        let batch = global_batch.max(1);
        let window = self.window.div_ceil(batch).saturating_mul(batch);
        let mut order = if window == self.window {
            self
        } else {
            Self::over(
                self.contexts.clone(),
                self.shuffle,
                self.seed,
                self.epoch,
                window,
                self.interleave,
            )
        };
        assert_eq!(
            lengths.len(),
            order.contexts.stored_len(),
            "one stored length per context of the split"
        );
        order.buckets = Some(Buckets { lengths, batch });
        order
    }

    /// Whether batches are length-bucketed.
    pub fn is_bucketed(&self) -> bool {
        self.buckets.is_some()
    }

    /// Contexts in the epoch.
    pub fn len(&self) -> usize {
        self.total
    }

    /// True when the split is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The window size in contexts.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Shards in the order this epoch visits them.
    pub fn shard_order(&self) -> &[usize] {
        &self.shard_order
    }

    /// (shard, stored offset within shard) of virtual position `v`.
    fn locate(&self, v: usize) -> (usize, usize) {
        let k = self.segments.partition_point(|s| s.vstart <= v) - 1;
        let seg = &self.segments[k];
        let live = seg.offset + v - seg.vstart;
        (seg.shard, self.contexts.stored_offset(seg.shard, live))
    }

    /// The permutation of window `w` (its positions relative to the window start).
    pub fn window_perm(&self, w: usize) -> Vec<u32> {
        let start = w * self.window;
        let len = self.window.min(self.len().saturating_sub(start));
        let mut perm: Vec<u32> = (0..len as u32).collect();
        if self.shuffle {
            Xoshiro256::for_stream(
                epoch_seed(self.seed, self.epoch),
                stream::EPOCH_ORDER + 1 + w as u64,
            )
            .shuffle(&mut perm);
        }
        match &self.buckets {
            Some(b) => self.bucket(w, perm, b),
            None => perm,
        }
    }

    /// Window `w`'s permutation `perm` sorted by length, cut into global batches, and those
    /// batches permuted.
    fn bucket(&self, w: usize, mut perm: Vec<u32>, b: &Buckets) -> Vec<u32> {
        let start = w * self.window;
        perm.sort_by_cached_key(|&i| {
            let (shard, offset) = self.locate(start + i as usize);
            b.lengths[self.starts[shard] + offset]
        });
        let whole = perm.len() / b.batch;
        let mut batches: Vec<usize> = (0..whole).collect();
        if self.shuffle {
            Xoshiro256::for_stream(
                epoch_seed(self.seed, self.epoch),
                stream::BUCKET_ORDER + w as u64,
            )
            .shuffle(&mut batches);
        }
        let mut out = Vec::with_capacity(perm.len());
        for k in batches {
            out.extend_from_slice(&perm[k * b.batch..(k + 1) * b.batch]);
        }
        out.extend_from_slice(&perm[whole * b.batch..]);
        out
    }

    /// Where epoch position `p` lives, keeping the last window permutation computed in
    /// `cursor` (start with `WindowCursor::default()`).
    pub fn sample_at(&self, p: usize, cursor: &mut WindowCursor) -> Sample {
        let w = p / self.window;
        if cursor.window != w || cursor.perm.is_empty() {
            (cursor.window, cursor.perm) = (w, self.window_perm(w));
        }
        self.position_in(&cursor.perm, p)
    }

    /// The compiled position (split-local) at epoch position `p`, given window `w`'s
    /// permutation `perm` (`p` must lie in window `w`).
    pub fn position_in(&self, perm: &[u32], p: usize) -> Sample {
        let w = p / self.window;
        let v = w * self.window + perm[p - w * self.window] as usize;
        let (shard, offset) = self.locate(v);
        Sample {
            source: 0,
            shard,
            offset,
            position: self.starts[shard] + offset,
            step: 0,
        }
    }

    /// The shard sample ranges covering virtual positions `range`, as
    /// `(shard, first offset, end offset)`.
    pub fn spans(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize, usize)> {
        let end = range.end.min(self.total);
        if range.start >= end {
            return Vec::new();
        }
        let first = self.segments.partition_point(|s| s.vstart <= range.start) - 1;
        self.segments[first..]
            .iter()
            .take_while(|s| s.vstart < end)
            .map(|s| {
                let lo = range.start.max(s.vstart) - s.vstart;
                let hi = end.min(s.vstart + s.len) - s.vstart;
                // Stored offsets: a run of live contexts spans the hidden ones between them.
                let stored = |live| self.contexts.stored_offset(s.shard, live);
                (
                    s.shard,
                    stored(s.offset + lo),
                    stored(s.offset + hi - 1) + 1,
                )
            })
            .collect()
    }

    /// The most distinct shards any two consecutive windows read: what must stay resident so
    /// that a pass over this order never goes back to a shard it has let go of (a compressed
    /// shard would be decompressed again).
    pub fn shards_in_reach(&self) -> usize {
        let windows = self.total.div_ceil(self.window).max(1);
        let mut seen: Vec<usize> = Vec::new();
        (0..windows)
            .map(|w| {
                let start = w * self.window;
                seen.clear();
                seen.extend(
                    self.spans(start..start.saturating_add(2 * self.window))
                        .into_iter()
                        .map(|(shard, _, _)| shard),
                );
                seen.sort_unstable();
                seen.dedup();
                seen.len()
            })
            .max()
            .unwrap_or(0)
    }

    /// Contexts a reader sees per shard.
    pub fn shard_sizes(&self) -> &[usize] {
        self.contexts.live()
    }

    /// An iterator over the whole epoch, computing one window permutation at a time.
    pub fn iter_from(&self, start: usize) -> OrderIter<'_> {
        OrderIter {
            order: self,
            next: start,
            window: usize::MAX,
            perm: Vec::new(),
        }
    }
}

pub(crate) fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    seed ^ mix64(epoch.wrapping_add(0xD1B5_4A32_D192_ED03))
}

/// Where one context of the epoch lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The cache it comes from: 0, or its index among a mix's sources.
    pub source: usize,
    /// Shard index within the split.
    pub shard: usize,
    /// Sample index within that shard.
    pub offset: usize,
    /// Position in the split's compiled order (of a mix: in its sources' splits one after
    /// another).
    pub position: usize,
    /// The first stored step read: 0, or a series window's start ([`super::SeriesOrder`]).
    pub step: usize,
}

/// What an epoch order keeps between lookups of nearby positions: the last window's
/// permutation. Start with `WindowCursor::default()`.
#[derive(Debug, Clone)]
pub struct WindowCursor {
    window: usize,
    perm: Vec<u32>,
}

impl Default for WindowCursor {
    fn default() -> WindowCursor {
        WindowCursor {
            window: usize::MAX,
            perm: Vec::new(),
        }
    }
}

/// Iterates epoch positions from a starting point.
#[derive(Debug)]
pub struct OrderIter<'a> {
    order: &'a EpochOrder,
    next: usize,
    window: usize,
    perm: Vec<u32>,
}

impl Iterator for OrderIter<'_> {
    type Item = Sample;
    fn next(&mut self) -> Option<Sample> {
        if self.next >= self.order.len() {
            return None;
        }
        let w = self.next / self.order.window;
        if w != self.window {
            self.perm = self.order.window_perm(w);
            self.window = w;
        }
        let s = self.order.position_in(&self.perm, self.next);
        self.next += 1;
        Some(s)
    }
}

/// How a split's epoch is cut into steps for `world_size` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    /// Contexts per rank per step.
    pub batch_size: usize,
    /// Ranks.
    pub world_size: usize,
    /// Steps in the epoch.
    pub steps: usize,
    /// Contexts in the epoch.
    pub contexts: usize,
    /// Epoch positions before step 0 (a resume at another global batch starts there).
    pub start: usize,
}

impl Steps {
    /// Steps of an epoch of `contexts`: the global batch is `batch_size * world_size`; a partial
    /// last global batch is dropped (`drop_last`) or completed by repeating the epoch's first
    /// positions, so every rank gets the same number of batches.
    pub fn new(contexts: usize, batch_size: usize, world_size: usize, drop_last: bool) -> Steps {
        let global = batch_size.saturating_mul(world_size).max(1);
        let steps = if drop_last {
            contexts / global
        } else {
            contexts.div_ceil(global)
        };
        Steps {
            batch_size,
            world_size,
            steps,
            contexts,
            start: 0,
        }
    }

    /// The same cut, its step 0 `start` positions into the epoch: a resume at another global
    /// batch continues the one global order from where it stood.
    pub fn after(self, start: usize, drop_last: bool) -> Steps {
        let start = start.min(self.contexts);
        let rest = self.contexts - start;
        let global = self.batch_size.saturating_mul(self.world_size).max(1);
        Steps {
            start,
            steps: if drop_last {
                rest / global
            } else {
                rest.div_ceil(global)
            },
            ..self
        }
    }

    /// Epoch positions of rank `rank`'s batch at `step` (positions past the end wrap around).
    pub fn positions(&self, step: usize, rank: usize) -> impl Iterator<Item = usize> + '_ {
        let first = self.start + step * self.batch_size * self.world_size + rank * self.batch_size;
        (first..first + self.batch_size).map(move |p| {
            if self.contexts == 0 {
                0
            } else {
                p % self.contexts
            }
        })
    }
}

/// Shuffle-quality measures of an epoch for a batch size.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Quality {
    /// Mean number of distinct shards in a batch.
    pub distinct_shards_per_batch: f64,
    /// Shards in the split.
    pub shards: usize,
    /// Entropy (bits) of the distribution of log2 |Δ compiled position| between neighbours.
    pub neighbour_entropy: f64,
    /// The same for a uniform random permutation of the split (seeded, for reference).
    pub uniform_entropy: f64,
    /// Window size in contexts.
    pub window: usize,
}

fn neighbour_entropy(positions: impl Iterator<Item = usize>) -> f64 {
    let mut counts = [0u64; 65];
    let mut prev: Option<usize> = None;
    let mut n = 0u64;
    for p in positions {
        if let Some(q) = prev {
            let d = p.abs_diff(q) as u64;
            counts[(64 - d.leading_zeros()) as usize] += 1;
            n += 1;
        }
        prev = Some(p);
    }
    if n == 0 {
        return 0.0;
    }
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n as f64;
            -p * p.log2()
        })
        .sum()
}

impl EpochOrder {
    /// Shuffle quality of this epoch for batches of `batch_size`.
    pub fn quality(&self, batch_size: usize) -> Quality {
        quality_of(
            self.iter_from(0).collect(),
            self.contexts.shards(),
            self.window,
            batch_size,
        )
    }
}

/// Shuffle quality of an epoch of `samples` over `shards` shards read `window` at a time, for
/// batches of `batch_size`.
pub(crate) fn quality_of(
    samples: Vec<Sample>,
    shards: usize,
    window: usize,
    batch_size: usize,
) -> Quality {
    let batch = batch_size.max(1);
    let mut distinct_total = 0usize;
    let mut batches = 0usize;
    let mut seen: Vec<usize> = Vec::new();
    for chunk in samples.chunks(batch) {
        seen.clear();
        seen.extend(chunk.iter().map(|s| (s.source << 32) | s.shard));
        seen.sort_unstable();
        seen.dedup();
        distinct_total += seen.len();
        batches += 1;
    }
    let mut uniform: Vec<usize> = (0..samples.len()).collect();
    Xoshiro256::seed_from(0x5EED).shuffle(&mut uniform);
    Quality {
        distinct_shards_per_batch: if batches == 0 {
            0.0
        } else {
            distinct_total as f64 / batches as f64
        },
        shards,
        neighbour_entropy: neighbour_entropy(samples.iter().map(|s| s.position)),
        uniform_entropy: neighbour_entropy(uniform.into_iter()),
        window,
    }
}

/// The length a trimmed batch whose longest stored sequence is `longest` is cut to: `longest`
/// (at least 1) rounded up the ladder of `multiple` (m, 2m, 3m, 4m, then four sizes per
/// doubling: 5m, 6m, 7m, 8m, 10m, 12m, 14m, 16m, 20m, …), at most `max_len`. Every size of the
/// ladder wastes at most a quarter of a batch past 4m, and lengths up to `L` meet about
/// `4 + 4·log2(L / 4m)` sizes of it. A `multiple` of 1 (or 0) keeps exact lengths.
pub fn trimmed_len(longest: usize, multiple: usize, max_len: usize) -> usize {
    let longest = longest.max(1);
    let rounded = if multiple <= 1 {
        longest
    } else {
        let units = longest.div_ceil(multiple);
        // Above 4 units, a step of 2^(floor(log2(units - 1)) - 2) units: 1 up to 8, 2 up to
        // 16, 4 up to 32, …
        let step = if units <= 4 {
            1
        } else {
            1usize << ((usize::BITS - 1 - (units - 1).leading_zeros()) - 2)
        };
        units
            .div_ceil(step)
            .saturating_mul(step)
            .saturating_mul(multiple)
    };
    rounded.min(max_len.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimmed_lengths_climb_a_ladder_of_few_sizes() {
        let ladder = |m: usize, max_len: usize| {
            (0..=max_len)
                .map(|l| trimmed_len(l, m, max_len))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(ladder(32, 128), [32, 64, 96, 128]);
        assert_eq!(ladder(16, 128), [16, 32, 48, 64, 80, 96, 112, 128]);
        assert_eq!(
            ladder(1, 5),
            [1, 2, 3, 4, 5],
            "a multiple of 1 keeps lengths"
        );
        assert_eq!(ladder(8, 100)[..9], [8, 16, 24, 32, 40, 48, 56, 64, 80]);
        assert_eq!(*ladder(8, 100).last().unwrap(), 100, "capped at L");
        // Logarithmic in L: 4 + 4·log2(L / 4m) sizes.
        assert_eq!(ladder(32, 4096).len(), 4 + 4 * 5);
        for m in [1, 2, 16, 32, 48] {
            let mut last = 0;
            for l in 0..5000 {
                let t = trimmed_len(l, m, 4096);
                assert!(
                    t >= l.clamp(1, 4096) && t <= 4096 && t >= last,
                    "{l} {m} -> {t}"
                );
                if l > 4 * m && t < 4096 {
                    assert!(
                        t * 4 <= l * 5 + 4 * m,
                        "more than a quarter wasted: {l} {m} -> {t}"
                    );
                }
                last = t;
            }
        }
        assert_eq!(trimmed_len(usize::MAX, 1 << 16, usize::MAX), usize::MAX);
    }

    fn all(order: &EpochOrder) -> Vec<usize> {
        order.iter_from(0).map(|s| s.position).collect()
    }

    #[test]
    fn unshuffled_is_compiled_order() {
        let o = EpochOrder::new(&[3, 0, 4], false, 1, 0, 2, 2);
        assert_eq!(all(&o), (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn each_epoch_is_a_permutation_that_depends_on_seed_and_epoch() {
        let sizes = [100, 37, 250, 1, 64];
        let a = all(&EpochOrder::new(&sizes, true, 7, 0, 50, 3));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..452).collect::<Vec<_>>());
        assert_eq!(a, all(&EpochOrder::new(&sizes, true, 7, 0, 50, 3)));
        assert_ne!(a, all(&EpochOrder::new(&sizes, true, 7, 1, 50, 3)));
        assert_ne!(a, all(&EpochOrder::new(&sizes, true, 8, 0, 50, 3)));
    }

    #[test]
    fn hidden_contexts_take_no_place_and_live_ones_keep_their_positions() {
        let hiding = [(10, &[1u32, 5][..]), (7, &[][..]), (5, &[0u32, 4][..])];
        let contexts = Arc::new(SplitContexts::hiding(hiding));
        let positions = contexts.positions();
        // The epoch over the live contexts alone, each sample at its stored place.
        for (shuffle, epoch) in [(true, 0), (true, 3), (false, 0)] {
            let ours = EpochOrder::over(contexts.clone(), shuffle, 7, epoch, 6, 2);
            let live = EpochOrder::new(&[8, 7, 3], shuffle, 7, epoch, 6, 2);
            let mapped: Vec<usize> = all(&live).into_iter().map(|p| positions[p]).collect();
            assert_eq!(all(&ours), mapped);
            for (p, s) in ours.iter_from(0).enumerate() {
                assert_eq!(s.position, mapped[p]);
                // Its window's reads (virtual positions) cover it.
                let w = p / 6 * 6;
                assert!(ours
                    .spans(w..w + 6)
                    .iter()
                    .any(|&(shard, lo, hi)| { shard == s.shard && (lo..hi).contains(&s.offset) }));
            }
        }
        // Buckets sort by the stored lengths of the live contexts only.
        let lengths: Arc<[u32]> = (0..22u32).map(|i| (i * 7) % 11).collect();
        let bucketed = EpochOrder::over(contexts, true, 7, 0, 6, 2).bucketed(lengths, 3);
        let mut seen = all(&bucketed);
        seen.sort_unstable();
        assert_eq!(seen, positions);
    }

    #[test]
    fn iterating_from_the_middle_matches() {
        let o = EpochOrder::new(&[40, 40, 40], true, 3, 2, 16, 2);
        let full = all(&o);
        for start in [0, 1, 15, 16, 17, 63, 119] {
            let tail: Vec<usize> = o.iter_from(start).map(|s| s.position).collect();
            assert_eq!(tail, full[start..]);
        }
    }

    #[test]
    fn windows_span_several_shards_and_spans_cover_them() {
        let sizes = [30, 30, 30, 30, 5];
        let o = EpochOrder::new(&sizes, true, 4, 0, 12, 4);
        let first: Vec<usize> = o.iter_from(0).take(12).map(|s| s.shard).collect();
        let mut distinct = first.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= 3, "{first:?}");
        let mut covered = 0;
        for (shard, lo, hi) in o.spans(0..o.len()) {
            assert!(lo < hi && hi <= sizes[shard]);
            covered += hi - lo;
        }
        assert_eq!(covered, 125);
        let part: usize = o.spans(7..31).iter().map(|(_, lo, hi)| hi - lo).sum();
        assert_eq!(part, 24);
    }

    #[test]
    fn steps_cover_the_epoch_with_equal_rank_batches() {
        let s = Steps::new(10, 2, 2, false);
        assert_eq!(s.steps, 3);
        let got: Vec<Vec<usize>> = (0..3)
            .flat_map(|st| (0..2).map(move |r| (st, r)))
            .map(|(st, r)| s.positions(st, r).collect())
            .collect();
        assert_eq!(got.concat(), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]);
        assert_eq!(Steps::new(10, 2, 2, true).steps, 2);
    }

    #[test]
    fn quality_of_a_window_shuffle_is_near_uniform() {
        let sizes = vec![1000; 20];
        let q = EpochOrder::new(&sizes, true, 1, 0, 4000, 8).quality(64);
        assert!(q.distinct_shards_per_batch > 3.0, "{q:?}");
        assert!(q.neighbour_entropy > 0.8 * q.uniform_entropy, "{q:?}");
        let flat = EpochOrder::new(&sizes, false, 1, 0, 4000, 8).quality(64);
        assert!(flat.neighbour_entropy < 0.1, "{flat:?}");
    }

    #[test]
    fn a_bucketed_epoch_is_a_permutation_of_length_sorted_batches() {
        let sizes = [100, 37, 250, 1, 64];
        let n: usize = sizes.iter().sum();
        // Lengths with many ties, in compiled order.
        let lengths: Arc<[u32]> = (0..n as u32).map(|i| (i * 7919) % 50).collect();
        let o = EpochOrder::new(&sizes, true, 7, 0, 50, 3).bucketed(lengths.clone(), 16);
        assert_eq!(o.window(), 64, "rounded up to whole global batches");
        let a = all(&o);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        for (w, window) in a.chunks(64).enumerate() {
            let mut lens: Vec<u32> = window.iter().map(|&p| lengths[p]).collect();
            let batches: Vec<Vec<u32>> = lens.chunks(16).map(<[u32]>::to_vec).collect();
            lens.sort_unstable();
            let mut expect: Vec<Vec<u32>> = lens.chunks(16).map(<[u32]>::to_vec).collect();
            if window.len() < 64 {
                // The last window's partial batch holds its longest contexts and comes last.
                assert_eq!(batches.last(), expect.last(), "window {w}");
            }
            let mut got = batches.clone();
            got.sort();
            expect.sort();
            assert_eq!(got, expect, "window {w}");
        }
        // Resuming anywhere needs no replay.
        for start in [0, 1, 63, 64, 300, n - 1] {
            let tail: Vec<usize> = o.iter_from(start).map(|s| s.position).collect();
            assert_eq!(tail, a[start..]);
        }
        let other = EpochOrder::new(&sizes, true, 7, 1, 50, 3).bucketed(lengths.clone(), 16);
        assert_ne!(a, all(&other));
        // Unshuffled: each window sorted by length, batches in order.
        let flat = all(&EpochOrder::new(&sizes, false, 7, 0, 50, 3).bucketed(lengths.clone(), 16));
        for window in flat.chunks(64) {
            assert!(window.windows(2).all(|p| lengths[p[0]] <= lengths[p[1]]));
        }
    }

    #[test]
    fn shards_in_reach_covers_any_two_consecutive_windows() {
        for (sizes, window, interleave) in [
            (vec![10usize; 40], 64, 2),
            (vec![100, 3, 50, 7, 80, 1, 64], 16, 3),
            (vec![5; 9], 1000, 8),
        ] {
            let o = EpochOrder::new(&sizes, true, 9, 1, window, interleave);
            let shards: Vec<usize> = o.iter_from(0).map(|s| s.shard).collect();
            let brute = shards
                .chunks(o.window())
                .collect::<Vec<_>>()
                .windows(2)
                .map(|pair| {
                    let mut d = pair.concat();
                    d.sort_unstable();
                    d.dedup();
                    d.len()
                })
                .max()
                .unwrap_or_else(|| {
                    let mut d = shards.clone();
                    d.sort_unstable();
                    d.dedup();
                    d.len()
                });
            assert_eq!(
                o.shards_in_reach(),
                brute,
                "{sizes:?} {window} {interleave}"
            );
        }
    }
}
