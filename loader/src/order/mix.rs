//! The order of an epoch of a mix: several caches drawn in the proportions of their weights,
//! fixed or scheduled along the run ([`Schedule`], `schedule.rs`).
//!
//! An epoch of a mix is `samples` positions (by default as many as its sources hold together),
//! cut into blocks of `block` positions (the order's `window`). Each block draws from the
//! schedule's piece in force at its start; inside a run of blocks of one piece (a segment), the
//! first `n` positions hold `apportion(weights, n)[s]` of source `s` (`n` times its normalised
//! weight, rounded by largest remainder, ties to the lower source), and a block holds the
//! difference of the apportionments of its end and its start. So every whole-block prefix of a
//! segment holds each source within one position of its weight, and with fixed weights (one
//! segment an epoch) the default weights (the sources' sizes) draw each source exactly once per
//! epoch. A shuffled block places its sources with `Xoshiro256::for_stream(epoch_seed,
//! MIX_BLOCK + b)`; an unshuffled one spreads each source evenly through the block.
//!
//! Each source is read in its own epoch order ([`EpochOrder`], its own window shuffle, seeded
//! with the mix's seed and the source's index), one epoch after another: the `j`-th draw of
//! source `s` since the mix's epoch 0 is position `j mod n_s` of the source's epoch
//! `j div n_s`. A source that runs out within a mix epoch so continues with its next epoch,
//! reshuffled, and a large source is read on from where the previous mix epoch left it,
//! whatever the weights do meanwhile. The draws before a position are summed over the
//! schedule's pieces ([`Schedule::draws_before_epoch`]), so any position is found with one
//! block arrangement and one window of one source: a resume costs O(pieces + block + window),
//! never a replay.

use super::live::SplitContexts;
use super::schedule::{add_draws, Schedule, Segment};
use super::window::{epoch_seed, EpochOrder, Sample, WindowCursor};
use dsc_format::rng::{mix64, stream, Xoshiro256};
use std::sync::Arc;

/// One source of a mix, as its order sees it.
#[derive(Debug, Clone)]
struct Source {
    /// Contexts per shard of the source's split, compiled order.
    contexts: Arc<SplitContexts>,
    /// Contexts of the split a reader sees.
    len: usize,
    /// The source's first position among the positions of all sources one after another.
    base: usize,
    /// The seed of the source's own epoch orders.
    seed: u64,
}

/// The order of one epoch of a mix of several caches' splits.
#[derive(Debug, Clone)]
pub struct MixOrder {
    sources: Vec<Source>,
    schedule: Arc<Schedule>,
    /// The epoch's runs of blocks of one piece of the schedule.
    segments: Vec<Segment>,
    /// Each segment's draws of each source since mix epoch 0, before its first position.
    before: Vec<Vec<u64>>,
    block: usize,
    total: usize,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    window: usize,
    interleave: usize,
}

/// What a mix keeps between lookups: the last block's arrangement, and the epoch order of each
/// source's current epoch. Start with `MixCursor::default()`.
#[derive(Debug, Clone)]
pub struct MixCursor {
    block: usize,
    /// Source of each position of the block.
    arrangement: Vec<u32>,
    /// For each position of the block, how many of its source's positions come before it in
    /// the block.
    nth: Vec<u32>,
    /// Each source's draws since mix epoch 0 before the block.
    seats: Vec<u64>,
    /// Per source: the epoch whose order is kept, that order and its cursor.
    sources: Vec<Option<(u64, EpochOrder, WindowCursor)>>,
}

impl Default for MixCursor {
    fn default() -> MixCursor {
        MixCursor {
            block: usize::MAX,
            arrangement: Vec::new(),
            nth: Vec::new(),
            seats: Vec::new(),
            sources: Vec::new(),
        }
    }
}

impl MixOrder {
    /// The order of mix epoch `epoch` of sources whose splits hold `sizes[s]` contexts per
    /// shard (those a reader sees), drawn in proportion to fixed `weights`
    /// ([`super::apportion`]) in blocks of `window` positions, `samples` positions in the
    /// epoch. Every source must hold at least one context, and every weight must be positive
    /// and at least one position of a block.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sizes: &[Arc<SplitContexts>],
        weights: &[f64],
        samples: usize,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        window: usize,
        interleave: usize,
    ) -> MixOrder {
        let sum: f64 = weights.iter().sum();
        let normal = weights.iter().map(|w| w / sum).collect();
        let schedule = Schedule::fixed(normal, samples as u64, window.max(1) as u64);
        let params = Params {
            shuffle,
            seed,
            window,
            interleave,
        };
        MixOrder::scheduled(sizes, Arc::new(schedule), params, epoch)
    }

    /// The order of mix epoch `epoch` of sources whose splits hold `sizes[s]` contexts per
    /// shard, drawn as `schedule` has it (its epochs' positions and blocks).
    pub fn scheduled(
        sizes: &[Arc<SplitContexts>],
        schedule: Arc<Schedule>,
        params: Params,
        epoch: u64,
    ) -> MixOrder {
        let mut base = 0;
        let sources = sizes
            .iter()
            .enumerate()
            .map(|(s, contexts)| {
                let len = contexts.len();
                assert!(len > 0, "every source of a mix holds contexts");
                let source = Source {
                    contexts: contexts.clone(),
                    len,
                    base,
                    seed: mix64(params.seed ^ mix64((s as u64).wrapping_add(stream::MIX_SOURCE))),
                };
                // Positions count every stored context, as the sources' lengths do.
                base += contexts.stored_len();
                source
            })
            .collect();
        let segments = schedule.segments(epoch);
        let mut drawn = schedule.draws_before_epoch(epoch);
        let mut before = Vec::with_capacity(segments.len());
        for segment in &segments {
            before.push(drawn.clone());
            add_draws(&mut drawn, 1, schedule.segment_draws(segment));
        }
        let block = params.window.max(1);
        MixOrder {
            sources,
            total: schedule.epoch_len() as usize,
            schedule,
            segments,
            before,
            block,
            shuffle: params.shuffle,
            seed: params.seed,
            epoch,
            window: block,
            interleave: params.interleave,
        }
    }

    /// Positions in the epoch.
    pub fn len(&self) -> usize {
        self.total
    }

    /// True when the epoch has no positions.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Positions per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Sources mixed.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Contexts of each source's split, in order.
    pub fn lens(&self) -> Vec<usize> {
        self.sources.iter().map(|s| s.len).collect()
    }

    /// The schedule this epoch is drawn from.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Shards of all sources.
    pub fn shards(&self) -> usize {
        self.sources.iter().map(|s| s.contexts.shards()).sum()
    }

    /// The most distinct shards of one source that two consecutive windows of its own order
    /// read ([`EpochOrder::shards_in_reach`]), over the sources.
    pub fn shards_in_reach(&self) -> usize {
        (0..self.sources.len())
            .map(|s| self.source_order(s, 0).shards_in_reach())
            .max()
            .unwrap_or(0)
    }

    /// The segment block `b` is in.
    fn segment_of(&self, b: usize) -> usize {
        self.segments
            .partition_point(|s| s.first <= b)
            .saturating_sub(1)
    }

    /// Each source's draws since mix epoch 0 before block `b`, and the block's counts.
    fn block_seats(&self, b: usize) -> (Vec<u64>, Vec<usize>) {
        let k = self.segment_of(b);
        let segment = &self.segments[k];
        let w = self.schedule.weights(segment);
        let a = ((b - segment.first) * self.block) as u64;
        let start = b * self.block;
        let len = (start + self.block).min(self.total.max(start + 1)) - start;
        let seats = self
            .schedule
            .drawn(w, a)
            .into_iter()
            .zip(&self.before[k])
            .map(|(d, b)| d + b)
            .collect();
        (seats, self.schedule.block_counts(w, a, len as u64))
    }

    /// Draws of each source since mix epoch 0 before position `p` of the epoch.
    pub fn draws_before(&self, p: usize) -> Vec<u64> {
        let (b, i) = (p / self.block, p % self.block);
        if b >= self.segments.last().map_or(0, |s| s.end) {
            let (mut n, counts) = self.block_seats(b.saturating_sub(1));
            for (n, c) in n.iter_mut().zip(counts) {
                *n += c as u64;
            }
            return n;
        }
        let (mut n, _) = self.block_seats(b);
        if i > 0 {
            for &s in &self.arrangement(b)[..i] {
                n[s as usize] += 1;
            }
        }
        n
    }

    /// The source of each position of block `b` (the last block may be partial).
    fn arrangement(&self, b: usize) -> Vec<u32> {
        let (_, counts) = self.block_seats(b);
        let mut out: Vec<u32> = Vec::with_capacity(counts.iter().sum());
        if self.shuffle {
            for (s, &c) in counts.iter().enumerate() {
                out.extend(std::iter::repeat_n(s as u32, c));
            }
            Xoshiro256::for_stream(
                epoch_seed(self.seed, self.epoch),
                stream::MIX_BLOCK + b as u64,
            )
            .shuffle(&mut out);
        } else {
            // Each source's k-th position at (k + 1/2) / count of the block, in that order.
            let mut at: Vec<(f64, u32)> = Vec::with_capacity(out.capacity());
            for (s, &c) in counts.iter().enumerate() {
                at.extend((0..c).map(|k| ((k as f64 + 0.5) / c as f64, s as u32)));
            }
            at.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            out.extend(at.into_iter().map(|(_, s)| s));
        }
        out
    }

    /// The `j`-th draw of source `s` since mix epoch 0, as (the source's epoch, position in it).
    fn draw(&self, s: usize, j: u64) -> (u64, usize) {
        let len = self.sources[s].len as u64;
        (j / len, (j % len) as usize)
    }

    /// The epoch order of source `s`'s epoch `epoch`.
    fn source_order(&self, s: usize, epoch: u64) -> EpochOrder {
        let source = &self.sources[s];
        EpochOrder::over(
            source.contexts.clone(),
            self.shuffle,
            source.seed,
            epoch,
            self.window,
            self.interleave,
        )
    }

    /// Where position `p` of the epoch lives, keeping what later lookups reuse in `cursor`.
    pub fn sample_at(&self, p: usize, mix: &mut MixCursor) -> Sample {
        let b = p / self.block;
        if mix.sources.len() != self.sources.len() {
            mix.sources = vec![None; self.sources.len()];
        }
        if mix.block != b {
            mix.arrangement = self.arrangement(b);
            let mut seen = vec![0u32; self.sources.len()];
            mix.nth = mix
                .arrangement
                .iter()
                .map(|&s| {
                    seen[s as usize] += 1;
                    seen[s as usize] - 1
                })
                .collect();
            mix.seats = self.block_seats(b).0;
            mix.block = b;
        }
        let i = p % self.block;
        let s = mix.arrangement[i] as usize;
        let source = &self.sources[s];
        let j = mix.seats[s] + u64::from(mix.nth[i]);
        let (epoch, q) = self.draw(s, j);
        let kept = &mut mix.sources[s];
        if kept.as_ref().is_none_or(|(e, _, _)| *e != epoch) {
            *kept = Some((epoch, self.source_order(s, epoch), WindowCursor::default()));
        }
        let (_, order, inner) = kept.as_mut().expect("just set");
        let sample = order.sample_at(q, inner);
        Sample {
            source: s,
            position: source.base + sample.position,
            ..sample
        }
    }

    /// The shard ranges `(source, shard, first offset, end offset)` that positions `range` of
    /// the epoch read: for each source, the whole windows of its own order its draws there fall
    /// in.
    pub fn spans(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize, usize, usize)> {
        let end = range.end.min(self.total);
        if range.start >= end {
            return Vec::new();
        }
        let (lo, hi) = (self.draws_before(range.start), self.draws_before(end));
        let mut out = Vec::new();
        for s in 0..self.sources.len() {
            if hi[s] == lo[s] {
                continue;
            }
            let (first, last) = (self.draw(s, lo[s]), self.draw(s, hi[s] - 1));
            for epoch in first.0..=last.0 {
                let order = self.source_order(s, epoch);
                let from = if epoch == first.0 { first.1 } else { 0 };
                let to = if epoch == last.0 {
                    last.1 + 1
                } else {
                    order.len()
                };
                let w = order.window();
                let covered = (from / w * w)..to.div_ceil(w).saturating_mul(w);
                out.extend(
                    order
                        .spans(covered)
                        .into_iter()
                        .map(|(shard, a, b)| (s, shard, a, b)),
                );
                if epoch - first.0 > 2 {
                    // A small source read many times over in the range: all its shards.
                    break;
                }
            }
        }
        out
    }
}

/// How a mix's epochs are shuffled and read: what [`MixOrder::scheduled`] takes beside the
/// schedule.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Shuffle the blocks and each source's own order.
    pub shuffle: bool,
    /// The mix's seed.
    pub seed: u64,
    /// Positions per block, and each source's own shuffle window.
    pub window: usize,
    /// Shards read side by side in each source's own order.
    pub interleave: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::{apportion, Cursor, Order};

    #[test]
    fn apportionments_sum_exactly_and_never_take_a_position_back() {
        let mut rng = Xoshiro256::seed_from(11);
        for _ in 0..200 {
            let k = 2 + rng.below(4) as usize;
            let block = 16 + rng.below(200) as usize;
            // Weights of at least one position of a block.
            let weights: Vec<f64> = (0..k).map(|_| 1.0 + rng.below(1000) as f64).collect();
            let sum: f64 = weights.iter().sum();
            if weights.iter().any(|w| w / sum * (block as f64) < 1.0) {
                continue;
            }
            let mut last = vec![0; k];
            for b in 1..50 {
                let seats = apportion(&weights, b * block);
                assert_eq!(seats.iter().sum::<usize>(), b * block);
                for s in 0..k {
                    assert!(seats[s] >= last[s], "{weights:?} block {block}");
                    let exact = weights[s] / sum * (b * block) as f64;
                    assert!((seats[s] as f64 - exact).abs() < 1.0);
                }
                last = seats;
            }
        }
    }

    #[test]
    fn any_position_is_found_without_replay_in_both_orders() {
        let sizes: Vec<Arc<SplitContexts>> = [&[40, 40, 13][..], &[7, 9], &[250]]
            .into_iter()
            .map(|s| Arc::new(SplitContexts::all(s)))
            .collect();
        for shuffle in [true, false] {
            let order = Order::Mix(MixOrder::new(
                &sizes,
                &[0.5, 0.2, 0.3],
                1000,
                shuffle,
                3,
                2,
                64,
                2,
            ));
            let all: Vec<Sample> = order.iter_from(0).collect();
            for start in [0, 1, 63, 64, 500, 999] {
                assert_eq!(order.iter_from(start).collect::<Vec<_>>(), all[start..]);
            }
            let mut cursor = Cursor::default();
            for p in [999, 3, 640, 2] {
                assert_eq!(order.sample_at(p, &mut cursor), all[p]);
            }
        }
    }

    /// The orders of fixed weights are those mixes have always had (the hash of many epochs of
    /// several mixes, shuffled and not, a partial last block included): a state saved before
    /// schedules existed resumes on the same batches.
    #[test]
    fn fixed_weights_keep_their_order_to_the_bit() {
        let sizes: Vec<Arc<SplitContexts>> = [&[40, 40, 13][..], &[7, 9], &[250]]
            .into_iter()
            .map(|s| Arc::new(SplitContexts::all(s)))
            .collect();
        let mut hash = 0u64;
        for (weights, samples, window) in [
            (&[0.5, 0.2, 0.3][..], 1000, 64),
            (&[1.0, 1.0, 1.0], 777, 50),
            (&[93.0, 16.0, 250.0], 359, 16),
            (&[0.05, 0.05, 0.9], 4000, 100),
        ] {
            for shuffle in [true, false] {
                for epoch in [0, 1, 2, 7] {
                    let order = Order::Mix(MixOrder::new(
                        &sizes, weights, samples, shuffle, 5, epoch, window, 2,
                    ));
                    for s in order.iter_from(0) {
                        hash = mix64(hash ^ (s.position as u64) ^ ((s.source as u64) << 40));
                    }
                }
            }
        }
        assert_eq!(hash, 0xcaa0_4615_6640_4a3e, "{hash:#x}");
    }
}
