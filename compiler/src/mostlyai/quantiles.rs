//! numpy's `np.quantile(..., method="closest_observation")` and the engine's
//! `find_distinct_bins`, on sorted data.

/// numpy's `np.linspace(0, 1, n)`: `i * (1 / (n - 1))`, the last point exactly 1.
pub fn linspace01(n: usize) -> Vec<f64> {
    match n {
        0 => Vec::new(),
        1 => vec![0.0],
        _ => {
            let step = 1.0 / (n - 1) as f64;
            let mut q: Vec<f64> = (0..n).map(|i| i as f64 * step).collect();
            q[n - 1] = 1.0;
            q
        }
    }
}

/// The index numpy's `closest_observation` picks for level `q` among `n` sorted values:
/// virtual index `n*q - 1 - 0.5` (two roundings, as numpy evaluates it), the lower neighbour
/// when it is exactly an odd integer, the upper otherwise, clipped at 0.
pub fn closest_observation_index(n: usize, q: f64) -> usize {
    let index = (n as f64 * q) - 1.0 - 0.5;
    let previous = index.floor();
    let gamma = index - previous;
    let pick = if gamma == 0.0 && previous.rem_euclid(2.0) == 1.0 {
        previous
    } else {
        previous + 1.0
    };
    if pick < 0.0 {
        0
    } else {
        (pick as usize).min(n - 1)
    }
}

/// Quantiles of `sorted` (ascending, non-empty) at `levels`.
pub fn closest_observation<T: Copy>(sorted: &[T], levels: &[f64]) -> Vec<T> {
    levels
        .iter()
        .map(|&q| sorted[closest_observation_index(sorted.len(), q)])
        .collect()
}

/// How [`find_distinct_bins`] ended (for tests against the reference cases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    /// At most `n` values or distinct values: the sorted distinct values.
    FewDistinct,
    /// A quantile count gave exactly `n + 1` distinct values.
    Exact,
    /// More than `n + 1` distinct: the first `n/2 + 1` and last `n/2` kept.
    CutToNPlus1,
    /// The quantile count passed `n_max`: the last set.
    FallbackNMax,
}

/// The engine's `find_distinct_bins(x, n, n_max=1000)`: raise the quantile count until the
/// quantiles hold `n + 1` distinct values. Returns the bins, the branch and the number of
/// quantile evaluations. Generic so that integer input keeps its exact values (the engine's own
/// numeric path clips to floats first). Inputs must not hold NaN.
pub fn find_distinct_bins<T: Copy + PartialOrd>(
    x: &[T],
    n: usize,
    n_max: usize,
) -> (Vec<T>, Branch, usize) {
    let mut sorted = x.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).expect("no NaN in quantile input"));
    let distinct = dedup_sorted(&sorted);
    if x.len() <= n || distinct.len() <= n {
        return (distinct, Branch::FewDistinct, 0);
    }
    let mut count = n;
    let mut iterations = 0;
    let mut last = Vec::new();
    while count <= n_max {
        iterations += 1;
        let qs = closest_observation(&sorted, &linspace01(count + 1));
        let bins = dedup_sorted(&qs);
        if bins.len() > n {
            if bins.len() > n + 1 {
                let mut cut = bins[..n / 2 + 1].to_vec();
                cut.extend_from_slice(&bins[bins.len() - n / 2..]);
                return (cut, Branch::CutToNPlus1, iterations);
            }
            return (bins, Branch::Exact, iterations);
        }
        count += 1 + n.saturating_sub(bins.len());
        last = bins;
    }
    (last, Branch::FallbackNMax, iterations)
}

/// Distinct values of an ascending slice (numerically equal values collapse to the first).
fn dedup_sorted<T: Copy + PartialOrd>(sorted: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(sorted.len().min(2048));
    for &v in sorted {
        if out.last().is_none_or(|l| *l != v) {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_observation_small() {
        // numpy: np.quantile([1,2,3,4], [0, .25, .5, .75, 1], method="closest_observation")
        // == [1, 1, 2, 3, 4]
        let s = [1.0, 2.0, 3.0, 4.0];
        let q = closest_observation(&s, &[0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(q, vec![1.0, 1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn few_distinct_returns_sorted_set() {
        let (b, br, _) = find_distinct_bins(&[3.0, 1.0, 3.0, 2.0], 10, 1000);
        assert_eq!((b, br), (vec![1.0, 2.0, 3.0], Branch::FewDistinct));
    }
}
