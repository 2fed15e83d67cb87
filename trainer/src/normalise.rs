//! Inputs the network can use, whatever the cache's encodings: a shift and scale for each
//! stored feature column, from the cache's own `stats.json` (train split only).
//!
//! dsc stores a column as its `--encode` chain made it. A `zscore` or `minmax` column is on a
//! unit scale already and a `bool` is 0/1, but an `identity` column is in source units (IceCube's
//! x, y, z are metres, about ±500, which saturate a freshly initialised network) and a `log1p`
//! column is only compressed. So:
//!
//! - chains ending in `zscore` or `minmax`, bools, categories: left as they are;
//! - `identity` chains: the column's train mean and standard deviation;
//! - other chains (e.g. `log1p`): `stats.json` describes values *before* encoding, and a mean
//!   does not pass through a non-linear map, but quantiles pass through any increasing one. The
//!   shift is the encoded median, the scale the encoded inter-quartile range / 1.349 (a unit
//!   normal's IQR); where the IQR is zero (a spike), the encoded 1–99% range / 4.653.
//!
//! `examples/train.py` applies the same rule, so the two reference trainers see the same inputs.

use crate::error::{Result, TrainError};
use dsc_format::manifest::ColumnSource;
use dsc_format::stats::{NumericStats, SplitStats};
use dsc_format::{Encoding, Stage, TensorSpec};

/// The statistics of the cache's train split (never validation data); those of all contexts
/// for a cache without a train split.
pub fn train_stats(cache: &dsc_loader::Cache) -> Result<SplitStats> {
    let stats = cache.stats().map_err(|e| {
        TrainError::cache(
            cache.dir(),
            format!(
                "cannot read the statistics that normalise the inputs (`normalise=false` trains \
                 on the stored values as they are): {e}"
            ),
        )
    })?;
    stats
        .split("train")
        .or_else(|| stats.split("all"))
        .cloned()
        .ok_or_else(|| TrainError::cache(cache.dir(), "stats.json has no train split"))
}

/// Shift and scale per column of a tensor's last axis: the network sees `(x - shift) / scale`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaling {
    /// Subtracted from each column.
    pub shift: Vec<f64>,
    /// Each column is divided by it after the shift.
    pub scale: Vec<f64>,
}

impl Scaling {
    /// `n` columns left as they are.
    pub fn identity(n: usize) -> Scaling {
        Scaling {
            shift: vec![0.0; n],
            scale: vec![1.0; n],
        }
    }

    /// Whether it changes nothing (shift 0, scale 1).
    pub fn is_identity(&self) -> bool {
        self.shift.iter().all(|&s| s == 0.0) && self.scale.iter().all(|&s| s == 1.0)
    }

    /// The scaling of every column of `tensor` from the `train` split's statistics. Columns
    /// without statistics (or with unusable ones) are left as they are.
    pub fn from_stats(tensor: &TensorSpec, train: &SplitStats) -> Scaling {
        Scaling::of_columns(tensor, 0..tensor.columns.len(), train)
    }

    /// The scaling of the columns `which` of `tensor` (e.g. the chosen targets).
    pub fn of_columns(
        tensor: &TensorSpec,
        which: impl IntoIterator<Item = usize>,
        train: &SplitStats,
    ) -> Scaling {
        let (shift, scale) = which
            .into_iter()
            .map(|i| {
                let c = &tensor.columns[i];
                let table = match c.source {
                    ColumnSource::Rows => "rows",
                    ColumnSource::Join { .. } => "join",
                    ColumnSource::Context => "context",
                };
                let stats = train
                    .columns
                    .iter()
                    .find(|s| s.name == c.name && s.table == table)
                    .and_then(|s| s.numeric.as_ref());
                column_scaling(&c.encoding, stats)
            })
            .unzip();
        Scaling { shift, scale }
    }
}

/// `(shift, scale)` of one stored column (see the module documentation for the rule).
pub fn column_scaling(encoding: &Encoding, stats: Option<&NumericStats>) -> (f64, f64) {
    const KEEP: (f64, f64) = (0.0, 1.0);
    let (Encoding::Numeric { stages, .. }, Some(num)) = (encoding, stats) else {
        return KEEP;
    };
    if matches!(
        stages.last(),
        Some(Stage::Zscore { .. } | Stage::Minmax { .. })
    ) {
        return KEEP;
    }
    let (shift, scale) = if stages.iter().all(|s| *s == Stage::Identity) {
        (num.mean, num.std)
    } else {
        let encoded = |level: f64| {
            num.quantiles
                .iter()
                .find(|q| (q.q - level).abs() < 1e-9)
                .map(|q| stages.iter().fold(q.value, |v, s| s.apply(v)))
        };
        let (Some(lo), Some(mid), Some(hi)) = (encoded(0.25), encoded(0.5), encoded(0.75)) else {
            return KEEP;
        };
        let mut scale = (hi - lo) / 1.349;
        if scale.is_nan() || scale <= 0.0 {
            if let (Some(p1), Some(p99)) = (encoded(0.01), encoded(0.99)) {
                scale = (p99 - p1) / 4.653;
            }
        }
        (mid, scale)
    };
    if shift.is_finite() && scale.is_finite() && scale > 0.0 {
        (shift, scale)
    } else {
        KEEP
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsc_format::stats::Quantile;

    fn stats(mean: f64, std: f64, quartiles: [f64; 5]) -> NumericStats {
        let levels = [0.01, 0.25, 0.5, 0.75, 0.99];
        NumericStats {
            min: quartiles[0],
            max: quartiles[4],
            mean,
            std,
            quantiles: levels
                .iter()
                .zip(quartiles)
                .map(|(&q, value)| Quantile { q, value })
                .collect(),
            histogram: Vec::new(),
        }
    }

    fn numeric(stages: Vec<Stage>) -> Encoding {
        Encoding::Numeric { stages, fill: None }
    }

    #[test]
    fn identity_columns_are_standardised_by_their_moments() {
        let s = stats(120.0, 300.0, [-500.0, -100.0, 100.0, 300.0, 500.0]);
        assert_eq!(
            column_scaling(&numeric(vec![Stage::Identity]), Some(&s)),
            (120.0, 300.0)
        );
    }

    #[test]
    fn unit_scale_encodings_and_categories_are_left_alone() {
        let s = stats(120.0, 300.0, [-500.0, -100.0, 100.0, 300.0, 500.0]);
        let z = numeric(vec![Stage::Zscore {
            mean: 1.0,
            std: 2.0,
        }]);
        assert_eq!(column_scaling(&z, Some(&s)), (0.0, 1.0));
        let cat = Encoding::Category { vocabulary: vec![] };
        assert_eq!(column_scaling(&cat, Some(&s)), (0.0, 1.0));
        assert_eq!(
            column_scaling(&numeric(vec![Stage::Identity]), None),
            (0.0, 1.0)
        );
    }

    #[test]
    fn log1p_columns_use_encoded_quantiles() {
        let s = stats(5.0, 9.0, [0.0, 1.0, 3.0, 7.0, 50.0]);
        let (shift, scale) = column_scaling(&numeric(vec![Stage::Log1p]), Some(&s));
        assert!((shift - 4f64.ln()).abs() < 1e-12);
        assert!((scale - (8f64.ln() - 2f64.ln()) / 1.349).abs() < 1e-12);
    }

    #[test]
    fn a_spike_at_the_median_falls_back_to_the_tails_and_constants_are_kept() {
        let s = stats(1.0, 0.5, [0.0, 1.0, 1.0, 1.0, 3.0]);
        let (shift, scale) = column_scaling(&numeric(vec![Stage::Log1p]), Some(&s));
        assert!((shift - 2f64.ln()).abs() < 1e-12);
        assert!((scale - 4f64.ln() / 4.653).abs() < 1e-12);
        let constant = stats(7.0, 0.0, [7.0; 5]);
        assert_eq!(
            column_scaling(&numeric(vec![Stage::Identity]), Some(&constant)),
            (0.0, 1.0)
        );
    }
}
