//! What an append's new data looks like against the parameters it is encoded with: the first
//! generation's train split, which they were fitted on. Printed by `dsc append` before anyone
//! trains on the new data, with a warning when a refit (a new compile) is due.

use crate::encode::NumericResult;
use crate::fit::{FittedColumn, Merged};
use crate::frozen::Frozen;
use dsc_format::stats::{ColumnStats, Stats};
use dsc_format::{ColumnSource, ColumnSpec, Encoding};
use serde::Serialize;

/// Past this shift of the mean, in the fitted standard deviations, a column has drifted.
pub const MEAN_SHIFT: f64 = 0.5;
/// Past this ratio of standard deviations (or below its inverse).
pub const STD_RATIO: f64 = 1.5;
/// Past this share of values outside the fitted range, or of categories not in the vocabulary.
pub const OUTSIDE_SHARE: f64 = 0.05;
/// Past this rise of the share of sequences longer than `max_len`.
pub const TRUNCATED_RISE: f64 = 0.1;

/// The new data of an append against the fitted parameters.
#[derive(Debug, Clone, Serialize)]
pub struct Drift {
    /// One entry per numeric and categorical column.
    pub columns: Vec<ColumnDrift>,
    /// Sequence lengths.
    pub lengths: LengthDrift,
    /// Whether some figure is past its threshold: the new data is far from what the encodings
    /// were fitted on, and a new compile (a refit) is due.
    pub refit_due: bool,
    /// What is past its threshold, in words.
    pub reasons: Vec<String>,
}

/// One column's new values against the fitted ones.
#[derive(Debug, Clone, Serialize)]
pub struct ColumnDrift {
    /// The column.
    pub column: String,
    /// `rows`, `join` or `context`.
    pub table: String,
    /// Non-null finite values of the new data.
    pub values: u64,
    /// Numeric: the new mean minus the fitted train mean, in fitted standard deviations.
    pub mean_shift_sd: Option<f64>,
    /// Numeric: the new standard deviation over the fitted one.
    pub std_ratio: Option<f64>,
    /// Numeric: the share of new values outside the fitted train minimum and maximum.
    pub outside_range: Option<f64>,
    /// Categorical: the share of new values outside the vocabulary (stored as code 1).
    pub unknown: Option<f64>,
}

/// Sequence lengths of the new data against the fitted train split's.
#[derive(Debug, Clone, Serialize)]
pub struct LengthDrift {
    /// Mean length (before truncation) of the new contexts.
    pub mean: f64,
    /// Of the train contexts the parameters were fitted on.
    pub fitted_mean: f64,
    /// Share of the new contexts longer than `max_len`.
    pub truncated: f64,
    /// Of the fitted train contexts.
    pub fitted_truncated: f64,
}

/// The drift of `added` (the new data's statistics) from `frozen`'s fitted parameters, with
/// `merged`'s counts of values outside the fitted range.
pub(crate) fn report(frozen: &Frozen, merged: &Merged, added: &Stats) -> Drift {
    let all = added
        .splits
        .iter()
        .find(|s| s.split == dsc_format::ALL_SPLITS);
    let new_column = |spec: &ColumnSpec| {
        all.and_then(|s| {
            s.columns
                .iter()
                .find(|c| c.name == spec.name && c.table == table_of(&spec.source))
        })
    };
    let mut columns = Vec::new();
    let numeric = merged
        .columns
        .iter()
        .filter_map(|c| match c {
            FittedColumn::Numeric(r, spec) => Some((r, spec)),
            FittedColumn::Category(..) => None,
        })
        .chain(merged.context.iter().map(|(r, spec, _)| (r, spec)));
    for (result, spec) in numeric {
        if let Some(new) = new_column(spec) {
            columns.push(numeric_drift(frozen, spec, result, new));
        }
    }
    for spec in merged.columns.iter().filter_map(|c| match c {
        FittedColumn::Category(_, spec) => Some(spec),
        FittedColumn::Numeric(..) => None,
    }) {
        if let Some(new) = new_column(spec) {
            columns.push(category_drift(frozen, spec, new));
        }
    }
    let lengths = all.map(|s| (&s.lengths, s.contexts));
    let fitted = frozen.lengths_fitted_on();
    let share = |l: Option<(&dsc_format::stats::LengthStats, u64)>| {
        l.map_or(0.0, |(l, n)| l.truncated as f64 / n.max(1) as f64)
    };
    let lengths = LengthDrift {
        mean: lengths.map_or(0.0, |(l, _)| l.mean),
        fitted_mean: fitted.map_or(0.0, |(l, _)| l.mean),
        truncated: share(lengths),
        fitted_truncated: share(fitted),
    };
    let mut reasons = Vec::new();
    for c in &columns {
        let name = &c.column;
        if let Some(s) = c.mean_shift_sd.filter(|s| s.abs() > MEAN_SHIFT) {
            reasons.push(format!(
                "{name}: the mean moved {s:+.2} standard deviations"
            ));
        }
        if let Some(r) = c
            .std_ratio
            .filter(|r| *r > STD_RATIO || *r < 1.0 / STD_RATIO)
        {
            reasons.push(format!(
                "{name}: the standard deviation is {r:.2}x the fitted one"
            ));
        }
        if let Some(o) = c.outside_range.filter(|o| *o > OUTSIDE_SHARE) {
            reasons.push(format!(
                "{name}: {:.1}% of values lie outside the fitted range",
                o * 100.0
            ));
        }
        if let Some(u) = c.unknown.filter(|u| *u > OUTSIDE_SHARE) {
            reasons.push(format!(
                "{name}: {:.1}% of values are not in the vocabulary",
                u * 100.0
            ));
        }
    }
    if lengths.truncated - lengths.fitted_truncated > TRUNCATED_RISE {
        reasons.push(format!(
            "lengths: {:.1}% of the new sequences are cut to max_len ({:.1}% of those fitted on)",
            lengths.truncated * 100.0,
            lengths.fitted_truncated * 100.0
        ));
    }
    Drift {
        columns,
        lengths,
        refit_due: !reasons.is_empty(),
        reasons,
    }
}

fn table_of(source: &ColumnSource) -> &'static str {
    match source {
        ColumnSource::Rows => "rows",
        ColumnSource::Join { .. } => "join",
        ColumnSource::Context => "context",
    }
}

fn numeric_drift(
    frozen: &Frozen,
    spec: &ColumnSpec,
    result: &NumericResult,
    new: &ColumnStats,
) -> ColumnDrift {
    let table = table_of(&spec.source);
    let fitted = frozen
        .fitted_on(table, &spec.name)
        .and_then(|c| c.numeric.as_ref());
    let now = new.numeric.as_ref();
    let (shift, ratio) = match (fitted, now) {
        (Some(f), Some(n)) if f.std > 0.0 => (Some((n.mean - f.mean) / f.std), Some(n.std / f.std)),
        _ => (None, None),
    };
    ColumnDrift {
        column: spec.name.clone(),
        table: table.into(),
        values: new.count,
        mean_shift_sd: shift,
        std_ratio: ratio,
        outside_range: result
            .outside
            .filter(|_| new.count > 0)
            .map(|o| o as f64 / new.count as f64),
        unknown: None,
    }
}

fn category_drift(frozen: &Frozen, spec: &ColumnSpec, new: &ColumnStats) -> ColumnDrift {
    let table = table_of(&spec.source);
    let known = match frozen.encoding_of(table, &spec.name) {
        Some(Encoding::Category { vocabulary }) => vocabulary.as_slice(),
        _ => &[],
    };
    let unknown: u64 = new
        .vocabulary
        .iter()
        .flatten()
        .filter(|e| !known.contains(&e.value))
        .map(|e| e.count)
        .sum();
    ColumnDrift {
        column: spec.name.clone(),
        table: table.into(),
        values: new.count,
        mean_shift_sd: None,
        std_ratio: None,
        outside_range: None,
        unknown: (new.count > 0).then(|| unknown as f64 / new.count as f64),
    }
}
