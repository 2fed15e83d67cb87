//! The order of an epoch: of one cache's split ([`EpochOrder`], `window.rs`: shards permuted,
//! contexts permuted inside windows), of the windows cut from its long series ([`SeriesOrder`],
//! `series.rs`: the same order over windows instead of contexts), or of a mix of several caches
//! ([`MixOrder`], `mix.rs`: blocks of positions apportioned to the caches by weight, each cache
//! read in its own epoch orders). All are pure functions of their inputs; [`Order`] is what a
//! loader holds.

mod live;
mod mix;
mod schedule;
mod series;
mod window;

pub use live::SplitContexts;
pub use mix::{MixCursor, MixOrder, Params};
pub use schedule::{apportion, Progress, Schedule, Stage, StageShare, MAX_RAMP_STEPS};
pub(crate) use series::WindowIndex;
pub use series::{SeriesOrder, SeriesWindows};
use window::quality_of;
pub use window::{
    trimmed_len, EpochOrder, OrderIter, Quality, Sample, Steps, WindowCursor, DEFAULT_INTERLEAVE,
    DEFAULT_WINDOW,
};

/// The order of an epoch: of one cache's split, or of a mix of several.
#[derive(Debug, Clone)]
pub enum Order {
    /// One split.
    One(EpochOrder),
    /// Several caches' splits drawn in the proportions of their weights, fixed or scheduled.
    Mix(MixOrder),
    /// Windows cut from one split's long series.
    Series(SeriesOrder),
}

impl Order {
    /// Positions in the epoch.
    pub fn len(&self) -> usize {
        match self {
            Order::One(o) => o.len(),
            Order::Mix(m) => m.len(),
            Order::Series(s) => s.len(),
        }
    }

    /// True when the epoch has no positions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions read together: a window (one split), a block (a mix).
    pub fn window(&self) -> usize {
        match self {
            Order::One(o) => o.window(),
            Order::Mix(m) => m.block(),
            Order::Series(s) => s.windows_order().window(),
        }
    }

    /// Whether batches are length-bucketed.
    pub fn is_bucketed(&self) -> bool {
        matches!(self, Order::One(o) if o.is_bucketed())
    }

    /// Where epoch position `p` lives ([`EpochOrder::sample_at`], [`MixOrder::sample_at`]).
    pub fn sample_at(&self, p: usize, cursor: &mut Cursor) -> Sample {
        match self {
            Order::One(o) => o.sample_at(p, &mut cursor.window),
            Order::Mix(m) => m.sample_at(p, cursor.mix.get_or_insert_default()),
            Order::Series(s) => s.sample_at(p, &mut cursor.window),
        }
    }

    /// An iterator over the epoch from position `start`.
    pub fn iter_from(&self, start: usize) -> impl Iterator<Item = Sample> + '_ {
        let mut cursor = Cursor::default();
        (start..self.len()).map(move |p| self.sample_at(p, &mut cursor))
    }

    /// The shard ranges `(source, shard, first offset, end offset)` that epoch positions
    /// `range` read.
    pub fn spans(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize, usize, usize)> {
        match self {
            Order::One(o) => {
                // A window's positions are its stretch of the virtual sequence, permuted.
                let w = o.window();
                let covered = (range.start / w * w)..range.end.div_ceil(w).saturating_mul(w);
                o.spans(covered)
                    .into_iter()
                    .map(|(shard, a, b)| (0, shard, a, b))
                    .collect()
            }
            Order::Mix(m) => m.spans(range),
            Order::Series(s) => {
                let w = s.windows_order().window();
                let covered = (range.start / w * w)..range.end.div_ceil(w).saturating_mul(w);
                s.spans(covered)
                    .into_iter()
                    .map(|(shard, a, b)| (0, shard, a, b))
                    .collect()
            }
        }
    }

    /// The series windows this order reads, if it reads windows.
    pub fn series(&self) -> Option<&SeriesWindows> {
        match self {
            Order::Series(s) => Some(s.windows()),
            _ => None,
        }
    }

    /// Shuffle quality of this epoch for batches of `batch_size` (shards count per source).
    pub fn quality(&self, batch_size: usize) -> Quality {
        match self {
            Order::One(o) => o.quality(batch_size),
            Order::Mix(m) => quality_of(
                self.iter_from(0).collect(),
                m.shards(),
                m.block(),
                batch_size,
            ),
            Order::Series(s) => s.windows_order().quality(batch_size),
        }
    }
}

/// What an order keeps between lookups of nearby positions (a window's permutation; a mix's
/// block and its caches' current epochs). Start with `Cursor::default()`.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    window: WindowCursor,
    mix: Option<MixCursor>,
}

/// What padding costs in an epoch's batches, and how length-homogeneous they are.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Padding {
    /// Stored values ÷ values in the batches when each is trimmed to its longest sequence
    /// (1 means no padding at all).
    pub padding_efficiency: f64,
    /// Stored values ÷ values in batches padded to the cache's L (no trimming).
    pub padding_efficiency_untrimmed: f64,
    /// Mean over batches of the spread (standard deviation) of the lengths inside a batch,
    /// ÷ the spread of all lengths: about 1 for batches drawn at random, 0 when every batch
    /// holds a single length. What bucketing gives up in randomness of a batch's make-up.
    pub length_spread_in_batch: f64,
    /// Mean trimmed sequence length of a batch.
    pub mean_batch_len: f64,
    /// The trimmed lengths of the epoch's batches (every rank's), each with how many batches
    /// have it: the shapes a trimmed run sees.
    pub batch_lens: std::collections::BTreeMap<usize, usize>,
}

/// The padding of every rank's batch of an epoch (`steps` cut from `order`), from each
/// context's stored length (`lengths`, compiled order) and the cache's `max_len`, batches
/// trimmed up the ladder of `multiple` ([`trimmed_len`]).
pub fn padding(
    order: &Order,
    steps: &Steps,
    lengths: &[u32],
    max_len: usize,
    multiple: usize,
) -> Padding {
    let mut batch_lens = std::collections::BTreeMap::new();
    let (mut stored, mut trimmed, mut untrimmed) = (0u64, 0u64, 0u64);
    let (mut spread, mut batch_len, mut batches) = (0f64, 0f64, 0usize);
    let mut cursor = Cursor::default();
    let mut batch: Vec<f64> = Vec::with_capacity(steps.batch_size);
    for step in 0..steps.steps {
        for rank in 0..steps.world_size {
            batch.clear();
            batch.extend(steps.positions(step, rank).map(|p| {
                let s = order.sample_at(p, &mut cursor);
                let stored = lengths[s.position] as usize;
                // A series window holds its real steps of the context's.
                let len = order
                    .series()
                    .map_or(stored, |w| w.input_steps(s.step, stored));
                len as f64
            }));
            let longest = trimmed_len(
                batch.iter().copied().fold(0f64, f64::max) as usize,
                multiple,
                max_len,
            );
            *batch_lens.entry(longest).or_insert(0) += 1;
            let longest = longest as f64;
            stored += batch.iter().sum::<f64>() as u64;
            trimmed += (longest as usize * batch.len()) as u64;
            untrimmed += (max_len.max(1) * batch.len()) as u64;
            spread += std_dev(&batch);
            batch_len += longest;
            batches += 1;
        }
    }
    let all: Vec<f64> = lengths.iter().map(|&l| f64::from(l)).collect();
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Padding {
        padding_efficiency: ratio(stored as f64, trimmed as f64),
        padding_efficiency_untrimmed: ratio(stored as f64, untrimmed as f64),
        length_spread_in_batch: ratio(ratio(spread, batches as f64), std_dev(&all)),
        mean_batch_len: ratio(batch_len, batches as f64),
        batch_lens,
    }
}

/// Population standard deviation (0 for fewer than two values).
fn std_dev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64).sqrt()
}
