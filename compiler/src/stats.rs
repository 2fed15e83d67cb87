//! Statistics: moments by Welford's method merged with Chan's formula in a fixed order (so the
//! result does not depend on the thread count); exact quantiles by selection, the reference the
//! rank queries over sorted runs (`fit`) are tested against.

use dsc_format::stats::{Quantile, QUANTILE_LEVELS};
use rayon::prelude::*;

/// Running count, mean and sum of squared deviations.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Moments {
    pub n: u64,
    pub mean: f64,
    pub m2: f64,
    pub min: f64,
    pub max: f64,
}

impl Moments {
    pub fn push(&mut self, x: f64) {
        if self.n == 0 {
            self.min = x;
            self.max = x;
        } else {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Chan et al.'s pairwise combination.
    pub fn merge(&self, other: &Moments) -> Moments {
        if self.n == 0 {
            return *other;
        }
        if other.n == 0 {
            return *self;
        }
        let n = self.n + other.n;
        let d = other.mean - self.mean;
        let mean = self.mean + d * other.n as f64 / n as f64;
        let m2 = self.m2 + other.m2 + d * d * (self.n as f64 * other.n as f64 / n as f64);
        Moments {
            n,
            mean,
            m2,
            min: self.min.min(other.min),
            max: self.max.max(other.max),
        }
    }

    /// Population standard deviation.
    pub fn std(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            (self.m2 / self.n as f64).max(0.0).sqrt()
        }
    }

    /// Moments of the values `x` each taken `count` times, in one pass over the distinct values
    /// in the order given (Welford's update weighted by the count, finite wherever per-value
    /// Welford is): what a column read by index costs per joined row instead of per row, the
    /// same bits whatever the rows' order.
    pub fn of_counted(values: impl Iterator<Item = (f64, u64)>) -> Moments {
        let mut m = Moments::default();
        for (x, c) in values.filter(|&(_, c)| c > 0) {
            if m.n == 0 {
                (m.min, m.max) = (x, x);
            }
            m.min = m.min.min(x);
            m.max = m.max.max(x);
            m.n += c;
            let d = x - m.mean;
            m.mean += d * (c as f64 / m.n as f64);
            m.m2 += c as f64 * d * (x - m.mean);
        }
        m
    }

    /// Moments of `values` computed over fixed 64 Ki-value chunks in parallel and merged in
    /// chunk order: the same bits for any thread count.
    pub fn of(values: &[f64]) -> Moments {
        let parts: Vec<Moments> = values
            .par_chunks(LANES * CHUNK)
            .flat_map_iter(chunk_moments)
            .collect();
        parts.iter().fold(Moments::default(), |acc, m| acc.merge(m))
    }
}

/// Values per chunk of [`Moments::of`]: fixed, so that the result does not depend on threads.
const CHUNK: usize = 1 << 16;
/// Chunks whose Welford chains advance together.
const LANES: usize = 4;

/// The moments of each `CHUNK` of `values` (at most `LANES` chunks). A Welford step waits for
/// the previous step's division, so one chain leaves the CPU idle; the chunks advance together,
/// one value of each per round over the length they share, then each finishes alone: each chain
/// does exactly what it would alone (the same bits), while their divisions overlap. With fewer
/// than `LANES` chunks the spare lanes repeat the last one and are dropped.
fn chunk_moments(values: &[f64]) -> Vec<Moments> {
    let chunks: Vec<&[f64]> = values.chunks(CHUNK).collect();
    let Some(&last) = chunks.last() else {
        return Vec::new();
    };
    let lane = |j: usize| chunks.get(j).copied().unwrap_or(last);
    let (a, b, c, d) = (lane(0), lane(1), lane(2), lane(3));
    let shared = last.len();
    let mut lanes = [Moments::default(); LANES];
    for i in 0..shared {
        lanes[0].push(a[i]);
        lanes[1].push(b[i]);
        lanes[2].push(c[i]);
        lanes[3].push(d[i]);
    }
    chunks
        .iter()
        .zip(lanes)
        .map(|(chunk, mut m)| {
            chunk[shared..].iter().for_each(|&x| m.push(x));
            m
        })
        .collect()
}

/// Quantiles at `QUANTILE_LEVELS` of `n` values by numpy's default linear rule (as
/// [`crate::stats::quantiles`]), from `kth(k)`, the `k`-th smallest (from 0); empty when `n = 0`.
pub(crate) fn linear_quantiles(
    n: u64,
    mut kth: impl FnMut(u64) -> crate::error::Result<f64>,
) -> crate::error::Result<Vec<Quantile>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    QUANTILE_LEVELS
        .iter()
        .map(|&q| {
            let h = (n - 1) as f64 * q;
            let k = (h.floor() as u64).min(n - 1);
            let frac = h - k as f64;
            let lo = kth(k)?;
            let value = if frac > 0.0 && k + 1 < n {
                lo + frac * (kth(k + 1)? - lo)
            } else {
                lo
            };
            Ok(Quantile { q, value })
        })
        .collect()
}

/// Moves the order statistics at positions `ks` (ascending, unique, offset by `offset`) into
/// place: afterwards `values[k - offset]` is the k-th smallest. Recursing on the median index
/// costs O(n log |ks|), against O(n |ks|) for one selection per index.
#[cfg(test)]
fn select_many(values: &mut [f64], ks: &[usize], offset: usize) {
    if ks.is_empty() || values.is_empty() {
        return;
    }
    let mid = ks.len() / 2;
    let k = ks[mid] - offset;
    let (left, _, right) = values.select_nth_unstable_by(k, f64::total_cmp);
    select_many(left, &ks[..mid], offset);
    select_many(right, &ks[mid + 1..], offset + k + 1);
}

/// Exact quantiles of `values` (reordered in place) with numpy's default linear rule:
/// position `h = (n - 1) q`, value `v[floor h] + (h - floor h) (v[floor h + 1] - v[floor h])`.
#[cfg(test)]
pub(crate) fn quantiles(values: &mut [f64], levels: &[f64]) -> Vec<Quantile> {
    let n = values.len();
    if n == 0 {
        return Vec::new();
    }
    let positions: Vec<(usize, f64)> = levels
        .iter()
        .map(|&q| {
            let h = (n - 1) as f64 * q;
            let k = (h.floor() as usize).min(n - 1);
            (k, h - k as f64)
        })
        .collect();
    let mut ks: Vec<usize> = positions
        .iter()
        .flat_map(|&(k, frac)| [Some(k), (frac > 0.0 && k + 1 < n).then_some(k + 1)])
        .flatten()
        .collect();
    ks.sort_unstable();
    ks.dedup();
    select_many(values, &ks, 0);
    levels
        .iter()
        .zip(positions)
        .map(|(&q, (k, frac))| {
            let value = if frac > 0.0 && k + 1 < n {
                values[k] + frac * (values[k + 1] - values[k])
            } else {
                values[k]
            };
            Quantile { q, value }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_numpy_linear() {
        // numpy.quantile([1, 2, 3, 4, 10], [0, .1, .5, .9, 1]) = [1, 1.4, 3, 7.6, 10]
        let mut v = vec![10.0, 3.0, 1.0, 4.0, 2.0];
        let q = quantiles(&mut v, &[0.0, 0.1, 0.5, 0.9, 1.0]);
        let got: Vec<f64> = q.iter().map(|q| q.value).collect();
        for (g, e) in got.iter().zip([1.0, 1.4, 3.0, 7.6, 10.0]) {
            assert!((g - e).abs() < 1e-12, "{got:?}");
        }
    }

    #[test]
    fn quantiles_equal_those_of_a_full_sort() {
        let mut values: Vec<f64> = (0..10_001)
            .map(|i| ((i * 7919) % 10_007) as f64 / 3.0)
            .collect();
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let got = quantiles(&mut values, &QUANTILE_LEVELS);
        for q in got {
            let h = (sorted.len() - 1) as f64 * q.q;
            let k = h.floor() as usize;
            let want = if k + 1 < sorted.len() {
                sorted[k] + (h - k as f64) * (sorted[k + 1] - sorted[k])
            } else {
                sorted[k]
            };
            assert_eq!(q.value, want, "q = {}", q.q);
        }
    }

    #[test]
    fn merged_moments_equal_direct_ones() {
        let values: Vec<f64> = (0..200_000)
            .map(|i| ((i * 7919) % 1000) as f64 * 0.5 + 1e6)
            .collect();
        let m = Moments::of(&values);
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let var = values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / values.len() as f64;
        assert!((m.mean - mean).abs() < 1e-6);
        assert!((m.std() - var.sqrt()).abs() < 1e-6);
        assert_eq!(m.min, 1e6);
        assert_eq!(m.max, 1e6 + 499.5);
    }

    /// Chains advanced together give the bits of one chain per chunk, merged in chunk order,
    /// for lengths around the lanes' edges.
    #[test]
    fn chunks_advanced_together_give_the_bits_of_one_chain_each() {
        for n in [
            0,
            1,
            CHUNK - 1,
            CHUNK,
            3 * CHUNK + 5,
            4 * CHUNK,
            9 * CHUNK + 17,
        ] {
            let values: Vec<f64> = (0..n)
                .map(|i| (i as f64 * 0.37).sin() * 1e4 + 7.0)
                .collect();
            let mut want = Moments::default();
            for chunk in values.chunks(CHUNK) {
                let mut m = Moments::default();
                chunk.iter().for_each(|&x| m.push(x));
                want = want.merge(&m);
            }
            let got = Moments::of(&values);
            assert_eq!(
                (
                    got.n,
                    got.mean.to_bits(),
                    got.m2.to_bits(),
                    got.min,
                    got.max
                ),
                (
                    want.n,
                    want.mean.to_bits(),
                    want.m2.to_bits(),
                    want.min,
                    want.max
                ),
                "n = {n}"
            );
        }
    }

    #[test]
    fn moments_do_not_depend_on_thread_count() {
        let values: Vec<f64> = (0..300_000).map(|i| (i as f64).sin() * 1e3).collect();
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let two = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let a = one.install(|| Moments::of(&values));
        let b = two.install(|| Moments::of(&values));
        assert_eq!(a.mean.to_bits(), b.mean.to_bits());
        assert_eq!(a.m2.to_bits(), b.m2.to_bits());
    }

    #[test]
    fn counted_moments_are_those_of_the_values_they_stand_for() {
        let mut rng = dsc_format::rng::Xoshiro256::seed_from(11);
        // A sensor table's coordinates, each read by a few to a few thousand rows; one unread.
        let table: Vec<f64> = (0..500).map(|_| rng.unit_f64() * 1000.0 - 500.0).collect();
        let counts: Vec<u64> = (0..500)
            .map(|i| if i == 7 { 0 } else { 1 + rng.below(3000) })
            .collect();
        let expanded: Vec<f64> = table
            .iter()
            .zip(&counts)
            .flat_map(|(&x, &c)| std::iter::repeat_n(x, c as usize))
            .collect();
        let want = Moments::of(&expanded);
        let got = Moments::of_counted(table.iter().copied().zip(counts.iter().copied()));
        assert_eq!((got.n, got.min, got.max), (want.n, want.min, want.max));
        assert!((got.mean - want.mean).abs() <= 1e-12 * want.mean.abs().max(1.0));
        assert!((got.m2 - want.m2).abs() <= 1e-12 * want.m2);
        // Unread values count for nothing, not even the extremes.
        let min_unread = Moments::of_counted([(-1e9, 0), (2.0, 3), (4.0, 1)].into_iter());
        assert_eq!(
            (min_unread.n, min_unread.min, min_unread.max),
            (4, 2.0, 4.0)
        );
        assert_eq!((min_unread.mean, min_unread.m2), (2.5, 3.0));
        assert_eq!(Moments::of_counted([(1.0, 0)].into_iter()).n, 0);
        // Huge values: a sum of value times count would leave f64, the mean does not.
        let huge = Moments::of_counted([(1e306, 200), (2e306, 300)].into_iter());
        let mean = Moments::of(&[vec![1e306; 200], vec![2e306; 300]].concat()).mean;
        assert!(huge.mean.is_finite() && (huge.mean - mean).abs() <= 1e-12 * mean);
    }
}
