//! The order of an epoch: a pure function of (shard sizes, seed, epoch, window).
//!
//! Positions `0..N` of a split are the contexts in compiled order (shard 0 first). With shuffle
//! on, an epoch
//!
//! 1. permutes the shards with `Xoshiro256::for_stream(seed ^ mix64(epoch), EPOCH_ORDER)`
//!    (Fisher–Yates, as at compile time), giving a virtual sequence of all contexts, shard after
//!    shard;
//! 2. cuts that sequence into windows of `window` contexts and permutes each window with
//!    `Xoshiro256::for_stream(seed ^ mix64(epoch), EPOCH_ORDER + 1 + w)` for window `w`.
//!
//! So reads stay within a window's few shards (sequential on disk, bounded resident memory),
//! batches mix those shards, and since the cache was shuffled at compile time the result is close
//! to a uniform permutation. Any position of the epoch is found in O(log shards) plus one window
//! permutation, so resuming costs O(window), never a replay. With shuffle off the order is the
//! compiled order. `docs/FORMAT.md` ("Epoch order") states the same for other implementations.

use dsc_format::rng::{mix64, stream, Xoshiro256};

/// Default window: contexts permuted together.
pub const DEFAULT_WINDOW: usize = 32_768;

/// The order of one epoch of one split.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    /// Contexts per shard, in compiled order.
    sizes: Vec<usize>,
    /// First compiled position of each shard.
    starts: Vec<usize>,
    /// Shards in epoch order.
    shard_order: Vec<usize>,
    /// First virtual position of each shard in epoch order (one extra entry: N).
    virtual_starts: Vec<usize>,
    shuffle: bool,
    window: usize,
    seed: u64,
    epoch: u64,
}

impl EpochOrder {
    /// The order for `epoch` over shards holding `sizes` contexts each. `window` is clamped to at
    /// least 1.
    pub fn new(sizes: &[usize], shuffle: bool, seed: u64, epoch: u64, window: usize) -> Self {
        let mut starts = Vec::with_capacity(sizes.len());
        let mut acc = 0;
        for &s in sizes {
            starts.push(acc);
            acc += s;
        }
        let mut shard_order: Vec<usize> = (0..sizes.len()).collect();
        if shuffle {
            Xoshiro256::for_stream(epoch_seed(seed, epoch), stream::EPOCH_ORDER)
                .shuffle(&mut shard_order);
        }
        let mut virtual_starts = Vec::with_capacity(sizes.len() + 1);
        let mut acc = 0;
        for &s in &shard_order {
            virtual_starts.push(acc);
            acc += sizes[s];
        }
        virtual_starts.push(acc);
        EpochOrder {
            sizes: sizes.to_vec(),
            starts,
            shard_order,
            virtual_starts,
            shuffle,
            window: window.max(1),
            seed,
            epoch,
        }
    }

    /// Contexts in the epoch.
    pub fn len(&self) -> usize {
        *self.virtual_starts.last().unwrap_or(&0)
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

    /// (shard, offset within shard) of virtual position `v`.
    fn locate(&self, v: usize) -> (usize, usize) {
        let k = self.virtual_starts.partition_point(|&s| s <= v) - 1;
        let shard = self.shard_order[k];
        (shard, v - self.virtual_starts[k])
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
        perm
    }

    /// The compiled position (split-local) at epoch position `p`, given window `w`'s
    /// permutation `perm` (`p` must lie in window `w`).
    pub fn position_in(&self, perm: &[u32], p: usize) -> Sample {
        let w = p / self.window;
        let v = w * self.window + perm[p - w * self.window] as usize;
        let (shard, offset) = self.locate(v);
        Sample {
            shard,
            offset,
            position: self.starts[shard] + offset,
        }
    }

    /// The shard sample ranges covering virtual positions `range`, as
    /// `(shard, first offset, end offset)`.
    pub fn spans(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut v = range.start;
        while v < range.end.min(self.len()) {
            let k = self.virtual_starts.partition_point(|&s| s <= v) - 1;
            let (lo, next) = (self.virtual_starts[k], self.virtual_starts[k + 1]);
            out.push((self.shard_order[k], v - lo, range.end.min(next) - lo));
            v = next;
        }
        out
    }

    /// Contexts per shard.
    pub fn shard_sizes(&self) -> &[usize] {
        &self.sizes
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

fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    seed ^ mix64(epoch.wrapping_add(0xD1B5_4A32_D192_ED03))
}

/// Where one context of the epoch lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Shard index within the split.
    pub shard: usize,
    /// Sample index within that shard.
    pub offset: usize,
    /// Position in the split's compiled order.
    pub position: usize,
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
}

impl Steps {
    /// Steps of an epoch of `contexts`: the global batch is `batch_size * world_size`; a partial
    /// last global batch is dropped (`drop_last`) or completed by repeating the epoch's first
    /// positions, so every rank gets the same number of batches.
    pub fn new(contexts: usize, batch_size: usize, world_size: usize, drop_last: bool) -> Steps {
        let global = (batch_size * world_size).max(1);
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
        }
    }

    /// Epoch positions of rank `rank`'s batch at `step` (positions past the end wrap around).
    pub fn positions(&self, step: usize, rank: usize) -> impl Iterator<Item = usize> + '_ {
        let first = step * self.batch_size * self.world_size + rank * self.batch_size;
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
        let samples: Vec<Sample> = self.iter_from(0).collect();
        let batch = batch_size.max(1);
        let mut distinct_total = 0usize;
        let mut batches = 0usize;
        let mut seen: Vec<usize> = Vec::new();
        for chunk in samples.chunks(batch) {
            seen.clear();
            seen.extend(chunk.iter().map(|s| s.shard));
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
            shards: self.sizes.len(),
            neighbour_entropy: neighbour_entropy(samples.iter().map(|s| s.position)),
            uniform_entropy: neighbour_entropy(uniform.into_iter()),
            window: self.window,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(order: &EpochOrder) -> Vec<usize> {
        order.iter_from(0).map(|s| s.position).collect()
    }

    #[test]
    fn unshuffled_is_compiled_order() {
        let o = EpochOrder::new(&[3, 0, 4], false, 1, 0, 2);
        assert_eq!(all(&o), (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn each_epoch_is_a_permutation_that_depends_on_seed_and_epoch() {
        let sizes = [100, 37, 250, 1, 64];
        let a = all(&EpochOrder::new(&sizes, true, 7, 0, 50));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..452).collect::<Vec<_>>());
        assert_eq!(a, all(&EpochOrder::new(&sizes, true, 7, 0, 50)));
        assert_ne!(a, all(&EpochOrder::new(&sizes, true, 7, 1, 50)));
        assert_ne!(a, all(&EpochOrder::new(&sizes, true, 8, 0, 50)));
    }

    #[test]
    fn iterating_from_the_middle_matches() {
        let o = EpochOrder::new(&[40, 40, 40], true, 3, 2, 16);
        let full = all(&o);
        for start in [0, 1, 15, 16, 17, 63, 119] {
            let tail: Vec<usize> = o.iter_from(start).map(|s| s.position).collect();
            assert_eq!(tail, full[start..]);
        }
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
        let q = EpochOrder::new(&sizes, true, 1, 0, 4000).quality(64);
        assert!(q.distinct_shards_per_batch > 3.0, "{q:?}");
        assert!(q.neighbour_entropy > 0.8 * q.uniform_entropy, "{q:?}");
        let flat = EpochOrder::new(&sizes, false, 1, 0, 4000).quality(64);
        assert!(flat.neighbour_entropy < 0.1, "{flat:?}");
    }
}
