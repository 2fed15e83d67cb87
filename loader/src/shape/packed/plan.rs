//! Packed batches: whole sequences laid end to end in a fixed budget of tokens. This is their
//! plan over the epoch's order ([`Packs`]); the rest of their room (the size checked against
//! the caches, the layout, the gather of a pack with its own five tensors and its index) is
//! `shape/packed`.
//!
//! A pack holds at most `T` tokens (stored steps) and at most `S` sequences, so every packed
//! batch has the same shapes (what CUDA graphs and compiled steps need) and almost no padding.
//!
//! **The plan is part of the order.** The packs of an epoch are cut from the epoch's order of
//! contexts ([`crate::order`]: the same shard interleave, windows and window permutations as
//! padded batches, so shuffle quality is unchanged) by *next fit*: a pack takes the next context
//! of the order while its stored length fits in the tokens left and fewer than `S` sequences
//! are in the pack; the first context that does not fit starts the next pack. Every pack but
//! the epoch's last therefore wastes fewer than `L` tokens (the cache's longest sequence), and
//! each pack's contexts are consecutive in the order, so a pack is named by where it starts:
//! the plan is `P + 1` positions, a pure function of (manifest, seed, epoch, window,
//! interleave, `T`, `S`). Planning walks the epoch's order once (O(contexts), a few ms per
//! million); the resume state stays a number of packs.
//!
//! **Steps.** Rank `r` of `R` takes pack `k * R + r` at step `k`. With `drop_last`, an epoch
//! has `floor(P_min / R)` steps, the same for every epoch, where `P_min = max(floor(stored
//! tokens / T), floor(contexts / S))` is a count of packs no epoch's plan can go below (a pack
//! holds at most `T` tokens and `S` sequences). So `len()` is fixed, and what is left out of an
//! epoch is the packs past its last step: the last, partial pack and those that next fit's
//! waste added (under `L` tokens a pack: about a pack of contexts when `T` is many times `L`,
//! 9 of 84 packs at `T = 400`, `L = 128`), as `drop_last` leaves out the last partial batch of
//! padded batches (different contexts every epoch: the order is reshuffled). Without
//! `drop_last` every pack is trained: `ceil(P / R)` steps, which can differ by one between
//! epochs, the last global step completed by repeating the epoch's first packs
//! ([`PackInfo::repeated`]).
//!
//! **S.** Unless given, `S` is set from `T` and the cache's stored lengths (mean `μ`, standard
//! deviation `σ`, all splits): the number of sequences whose lengths add up to `T` is about
//! normal with mean `T/μ` and variance `T σ² / μ³` (renewal theory), and `S` is that mean plus
//! four standard deviations, rounded up to a multiple of 8: about one pack in 30,000 is closed
//! by its sequence count rather than by its tokens.

pub use crate::batch::PackInfo;
use crate::order::{Cursor, Order};
use serde::Serialize;
use std::ops::Range;

/// The packs of one epoch of one split.
#[derive(Debug, Clone)]
pub struct Packs {
    /// Epoch position of each pack's first context, then the epoch's length.
    starts: Vec<usize>,
    /// Tokens per pack.
    tokens: usize,
    /// Sequences per pack at most.
    max_seqs: usize,
    world_size: usize,
    steps: usize,
    /// Packs the steps may use: all of them, or without `drop_last`'s repeats only as many as
    /// the split's tokens fill (see [`Packs::plan`]).
    usable: usize,
    /// Packs before step 0 (a resume at another global batch starts there).
    skip: usize,
    /// Packs closed by the sequence limit rather than by tokens.
    closed_by_count: usize,
}

impl Packs {
    /// Cuts `order` into packs of at most `tokens` tokens and `max_seqs` sequences by next fit;
    /// `lengths` holds every context's stored length in compiled order (each at most `max_len`,
    /// which is at most `tokens`). Steps are for `world_size` ranks.
    pub fn plan(
        order: &Order,
        lengths: &[u32],
        max_len: usize,
        (tokens, max_seqs): (usize, usize),
        world_size: usize,
        drop_last: bool,
    ) -> Packs {
        assert!(
            tokens >= max_len.max(1) && max_seqs >= 1,
            "validated pack size"
        );
        let mut starts = Vec::with_capacity(order.len() / max_seqs.min(64) + 2);
        let (mut used, mut count, mut closed_by_count) = (0usize, 0usize, 0usize);
        let mut total = 0u64;
        for (p, sample) in order.iter_from(0).enumerate() {
            let len = (lengths[sample.position] as usize).min(max_len);
            total += len as u64;
            if p == 0 || used + len > tokens || count == max_seqs {
                if p > 0 && count == max_seqs && used + len <= tokens {
                    closed_by_count += 1;
                }
                starts.push(p);
                used = 0;
                count = 0;
            }
            used += len;
            count += 1;
        }
        starts.push(order.len());
        let packs = starts.len() - 1;
        let usable = if drop_last {
            let bound = ((total / tokens as u64) as usize).max(order.len() / max_seqs);
            bound.min(packs)
        } else {
            packs
        };
        Packs {
            starts,
            tokens,
            max_seqs,
            world_size: world_size.max(1),
            steps: 0,
            usable,
            skip: 0,
            closed_by_count,
        }
        .after(0, drop_last)
    }

    /// The same packs, step 0 starting `skip` packs into the epoch: a resume at another world
    /// size continues the one sequence of packs from where it stood.
    pub fn after(mut self, skip: usize, drop_last: bool) -> Packs {
        self.skip = skip.min(self.usable);
        let rest = self.usable - self.skip;
        self.steps = if drop_last {
            rest / self.world_size
        } else {
            rest.div_ceil(self.world_size)
        };
        self
    }

    /// Packs in the epoch's plan, `P`.
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// True when the split is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per pack, `T`.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Sequences per pack at most, `S`.
    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }

    /// Steps (packs per rank) in the epoch.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The pack rank `rank` trains at `step`, and whether it is a repeat of an earlier one.
    pub fn pack_at(&self, step: usize, rank: usize) -> (usize, bool) {
        let q = self.skip + step * self.world_size + rank;
        match self.len() {
            0 => (0, false),
            p => (q % p, q >= p),
        }
    }

    /// The epoch position pack `q` starts at (past the last pack: the epoch's end).
    pub fn start_of(&self, q: usize) -> usize {
        self.starts[q.min(self.starts.len() - 1)]
    }

    /// The epoch positions of pack `q`'s contexts.
    pub fn positions(&self, q: usize) -> Range<usize> {
        match self.starts.get(q + 1) {
            Some(&end) => self.starts[q]..end,
            None => 0..0,
        }
    }

    /// Token efficiency and more of the packs trained in this epoch (every rank's), from the
    /// stored lengths (compiled order) the plan was made from.
    pub fn figures(&self, order: &Order, lengths: &[u32], max_len: usize) -> PackFigures {
        let trained = (self.steps * self.world_size).min(self.len());
        let repeated = self.steps * self.world_size - trained;
        let mut cursor = Cursor::default();
        let mut stored = 0u64;
        let mut contexts = 0usize;
        for q in (0..trained).chain(0..repeated.min(self.len())) {
            for p in self.positions(q) {
                let s = order.sample_at(p, &mut cursor);
                stored += u64::from(lengths[s.position]).min(max_len as u64);
                contexts += 1;
            }
        }
        let slots = (self.steps * self.world_size) as f64;
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        PackFigures {
            tokens: self.tokens,
            max_seqs: self.max_seqs,
            packs: self.len(),
            packs_trained: self.steps * self.world_size,
            token_efficiency: ratio(stored as f64, slots * self.tokens as f64),
            sequences_per_pack: ratio(contexts as f64, slots),
            sequence_slot_use: ratio(contexts as f64, slots * self.max_seqs as f64),
            contexts_left_out: order.len() - self.starts[trained],
            closed_by_sequence_limit: self.closed_by_count,
        }
    }
}

/// What packing gives in one epoch: `dsc order --pack`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PackFigures {
    /// Tokens per pack, `T`.
    pub tokens: usize,
    /// Sequences per pack at most, `S`.
    pub max_seqs: usize,
    /// Packs in the epoch's plan.
    pub packs: usize,
    /// Packs trained in the epoch, every rank's (repeats included).
    pub packs_trained: usize,
    /// Stored tokens ÷ (`T` × packs trained): the share of the per-step tensors that is data.
    pub token_efficiency: f64,
    /// Mean sequences in a trained pack.
    pub sequences_per_pack: f64,
    /// Mean sequences in a pack ÷ `S`: the share of the per-context tensors that is data.
    pub sequence_slot_use: f64,
    /// Contexts of the epoch in packs past the last step (`drop_last`).
    pub contexts_left_out: usize,
    /// Packs closed because they held `S` sequences, not because the next did not fit.
    pub closed_by_sequence_limit: usize,
}

/// The default `S` for packs of `tokens` tokens, from stored lengths (see the module
/// documentation): the mean count of sequences in `tokens` tokens plus four standard
/// deviations, rounded up to a multiple of 8, at least 8 and at most `tokens` (rounded up).
pub fn default_max_seqs(tokens: usize, lengths: impl Iterator<Item = u32>) -> usize {
    let (mut n, mut sum, mut squares) = (0f64, 0f64, 0f64);
    for l in lengths {
        let l = f64::from(l);
        n += 1.0;
        sum += l;
        squares += l * l;
    }
    let t = tokens as f64;
    let s = if n == 0.0 || sum == 0.0 {
        t
    } else {
        let mean = sum / n;
        let var = (squares / n - mean * mean).max(0.0);
        (t / mean + 4.0 * (t * var / mean.powi(3)).sqrt())
            .ceil()
            .min(t)
    };
    (s as usize).max(1).next_multiple_of(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::EpochOrder;
    use dsc_format::rng::Xoshiro256;

    fn lengths(n: usize, max: u32, seed: u64) -> Vec<u32> {
        let mut rng = Xoshiro256::seed_from(seed);
        (0..n)
            .map(|_| 1 + rng.below(u64::from(max)) as u32)
            .collect()
    }

    /// Every context of the epoch in exactly one pack, in the order's sequence, each pack within
    /// its budget, and next fit: a pack ends only where the next context would not fit.
    #[test]
    fn packs_cut_the_epoch_order_by_next_fit() {
        let sizes = [300, 120, 500, 77];
        let n: usize = sizes.iter().sum();
        let lens = lengths(n, 40, 3);
        let order = Order::One(EpochOrder::new(&sizes, true, 9, 2, 128, 2));
        let packs = Packs::plan(&order, &lens, 40, (256, 12), 1, false);
        let seq: Vec<usize> = order.iter_from(0).map(|s| s.position).collect();
        let mut next = 0;
        for q in 0..packs.len() {
            let r = packs.positions(q);
            assert_eq!(r.start, next);
            next = r.end;
            let used: usize = seq[r.clone()].iter().map(|&p| lens[p] as usize).sum();
            assert!(used <= 256 && r.len() <= 12 && !r.is_empty(), "pack {q}");
            if r.end < n && r.len() < 12 {
                assert!(
                    used + lens[seq[r.end]] as usize > 256,
                    "pack {q} closed early"
                );
            }
        }
        assert_eq!(next, n);
        let again = Packs::plan(&order, &lens, 40, (256, 12), 1, false);
        assert_eq!(again.starts, packs.starts, "a pure function");
    }

    #[test]
    fn steps_are_equal_per_rank_and_fixed_across_epochs_with_drop_last() {
        let sizes = [1000, 1000, 1000];
        let lens = lengths(3000, 64, 5);
        let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
        let mut steps = Vec::new();
        for epoch in 0..4 {
            let order = Order::One(EpochOrder::new(&sizes, true, 1, epoch, 512, 3));
            let packs = Packs::plan(&order, &lens, 64, (1024, 64), 3, true);
            assert!(packs.steps() * 3 <= packs.len());
            steps.push(packs.steps());
            let all = Packs::plan(&order, &lens, 64, (1024, 64), 3, false);
            assert_eq!(all.steps(), all.len().div_ceil(3));
            // The last global step repeats the first packs.
            let last = all.steps() - 1;
            let (q, rep) = all.pack_at(last, 2);
            assert_eq!(rep, last * 3 + 2 >= all.len());
            assert!(q < all.len());
            let f = packs.figures(&order, &lens, 64);
            assert!(f.token_efficiency > 0.95, "{f:?}");
            assert_eq!(f.packs_trained, packs.steps() * 3);
        }
        assert!(steps.iter().all(|&s| s == steps[0]), "{steps:?}");
        assert_eq!(steps[0], (total / 1024) as usize / 3);
    }

    #[test]
    fn the_default_sequence_limit_rarely_binds() {
        let lens = lengths(20_000, 128, 7);
        for tokens in [512, 4096, 32768] {
            let s = default_max_seqs(tokens, lens.iter().copied());
            assert_eq!(s % 8, 0);
            let order = Order::One(EpochOrder::new(&[20_000], true, 3, 0, 4096, 1));
            let packs = Packs::plan(&order, &lens, 128, (tokens, s), 1, true);
            assert!(
                packs.closed_by_count * 1000 <= packs.len(),
                "T {tokens} S {s}: {} of {} packs closed by count",
                packs.closed_by_count,
                packs.len()
            );
        }
        assert_eq!(default_max_seqs(100, std::iter::empty()), 104);
        assert_eq!(default_max_seqs(64, [0u32, 0].into_iter()), 64);
    }
}
