//! `stats.json`: statistics of the compiled data, per split and overall.
//!
//! Numeric statistics are over the source values (before encoding and before truncation) of
//! every row of every stored context; null, NaN and infinite values are counted apart and left
//! out of the moments and quantiles.

use serde::{Deserialize, Serialize};

/// The quantile levels always reported.
pub const QUANTILE_LEVELS: [f64; 9] = [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0];

/// A quantile: level and value (numpy's default "linear" rule on the exact sorted values).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantile {
    /// Level in `[0, 1]`.
    pub q: f64,
    /// Value.
    pub value: f64,
}

/// One bin of a histogram, `[lo, hi)` (the last bin includes `hi`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    /// Lower edge.
    pub lo: f64,
    /// Upper edge.
    pub hi: f64,
    /// Values in the bin.
    pub count: u64,
}

/// Moments and order statistics of the finite values of a numeric column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumericStats {
    /// Smallest finite value.
    pub min: f64,
    /// Largest finite value.
    pub max: f64,
    /// Mean (Welford, merged in a fixed order with Chan's formula).
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Exact quantiles at [`QUANTILE_LEVELS`].
    pub quantiles: Vec<Quantile>,
    /// 20 equal-width bins between min and max.
    pub histogram: Vec<Bin>,
}

/// A vocabulary entry of a categorical column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VocabEntry {
    /// The value (number or string).
    pub value: serde_json::Value,
    /// Rows holding it.
    pub count: u64,
}

/// Statistics of one column in one split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Column name.
    pub name: String,
    /// `rows`, `join` or `context`.
    pub table: String,
    /// Source type.
    pub source_type: String,
    /// Values that are present and finite.
    pub count: u64,
    /// Null values.
    pub nulls: u64,
    /// NaN values.
    pub nan: u64,
    /// Infinite values.
    pub inf: u64,
    /// Numeric statistics, for numeric and boolean columns with at least one finite value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numeric: Option<NumericStats>,
    /// Distinct non-null values, for categorical columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct: Option<u64>,
    /// Every distinct value with its count, most frequent first (ties: ascending value), for
    /// categorical columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<Vec<VocabEntry>>,
}

/// Sequence lengths of one split, before truncation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LengthStats {
    /// Shortest.
    pub min: u64,
    /// Longest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// Exact quantiles at [`QUANTILE_LEVELS`].
    pub quantiles: Vec<Quantile>,
    /// Power-of-two bins: `[0, 1)`, `[1, 2)`, `[2, 4)`, `[4, 8)`, … up to the longest.
    pub histogram: Vec<Bin>,
    /// Contexts longer than `max_len`.
    pub truncated: u64,
    /// `truncated / contexts`.
    pub truncated_fraction: f64,
}

/// Statistics of one split (or of all splits together).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitStats {
    /// `train`, `val` or `all`.
    pub split: String,
    /// Contexts.
    pub contexts: u64,
    /// Source rows (before truncation).
    pub rows: u64,
    /// Sequence lengths.
    pub lengths: LengthStats,
    /// Per-row columns, then context columns, in spec order.
    pub columns: Vec<ColumnStats>,
}

pub use crate::ALL_SPLITS;

/// The whole `stats.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// The format version of the cache.
    pub format_version: u32,
    /// `all` first, then each split.
    pub splits: Vec<SplitStats>,
    /// In a generation after the first: the generation whose values the quantiles and the
    /// numeric histograms describe (they do not merge exactly; counts, moments, extremes,
    /// length histograms and vocabularies describe this generation's live contexts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantiles_of: Option<u32>,
    /// Per split (and `all`), the contexts these statistics still count that the generation
    /// hides (an append replaced their keys) because their own statistics could not be read
    /// back from their inputs (gone, changed, in memory): the figures then include them. `dsc
    /// compact` makes them the live contexts' again. Absent when none is counted.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub includes_hidden: std::collections::BTreeMap<String, u64>,
}

impl Stats {
    /// Reads the statistics of the generation `manifest` describes of the cache at `dir`
    /// (`stats.json` for the first, `generations/{NNNNN}/stats.json` for a later one).
    pub fn read(
        dir: &std::path::Path,
        manifest: &crate::Manifest,
    ) -> Result<Stats, crate::FormatError> {
        let path = dir.join(manifest.stats_file());
        let bytes = std::fs::read(&path).map_err(|e| crate::FormatError::Io {
            path: path.clone(),
            source: e,
        })?;
        Self::from_json(&bytes, &path)
    }

    /// Parses `stats.json` bytes; `path` is used in errors.
    pub fn from_json(bytes: &[u8], path: &std::path::Path) -> Result<Stats, crate::FormatError> {
        serde_json::from_slice(bytes).map_err(|source| crate::FormatError::Json {
            path: path.into(),
            source,
        })
    }

    /// The statistics of `split` (`all` for every split together).
    pub fn split(&self, split: &str) -> Option<&SplitStats> {
        self.splits.iter().find(|s| s.split == split)
    }
}

impl SplitStats {
    /// The statistics of column `name`.
    pub fn column(&self, name: &str) -> Option<&ColumnStats> {
        self.columns.iter().find(|c| c.name == name)
    }
}
