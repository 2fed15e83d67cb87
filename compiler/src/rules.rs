//! What the stages of dsc's own compile read of a spec beyond its columns ([`Rules`]): taken
//! from the spec once when the job is built, so that no stage reads the spec itself.

use dsc_format::spec::{CompileSpec, EmptyContexts, NanPolicy, Truncate, UnmatchedRows};
use std::collections::BTreeMap;

/// What the stages of dsc's own compile read of a spec beyond its columns, taken from it once
/// when the job is built ([`Rules::of`]), so that no stage reads the spec itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'s> {
    /// The column ordering a context's rows (file order when `None`).
    pub order_by: Option<&'s str>,
    /// The longest padded sequence asked for (the longest stored one when `None`).
    pub max_len: Option<usize>,
    /// Which rows of a longer sequence are kept.
    pub truncate: Truncate,
    /// Seed of the split hash and of `truncate = "sample"`.
    pub split_seed: u64,
    /// Seed of the global shuffle.
    pub seed: u64,
    /// Null, NaN and infinity in numeric columns.
    pub nan: NanPolicy,
    /// N-grams kept at most by an `ngrams:N` encoding (`None`: `text::DEFAULT_NGRAM_VOCAB`).
    pub ngram_vocab: Option<usize>,
    /// Rows whose key has no context row.
    pub unmatched_rows: UnmatchedRows,
    /// Context rows with no rows.
    pub empty_contexts: EmptyContexts,
    /// Which split each context belongs to.
    pub splits: SplitRules<'s>,
    /// What is read of the context table.
    pub context: ContextRules<'s>,
}

/// The options that assign splits ([`crate::split`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SplitRules<'s> {
    /// A column of the context table naming each context's split.
    pub split_by: Option<&'s str>,
    /// Split name to a file of keys.
    pub split_keys: &'s BTreeMap<String, String>,
    /// Fraction of contexts carved out of `train` as `val`.
    pub val_fraction: f64,
    /// Seed of the key hash that carves it.
    pub split_seed: u64,
}

/// The columns read from the context table ([`crate::lookup::context_wants`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContextRules<'s> {
    /// Its key column.
    pub key: &'s str,
    /// Targets, stored in `y`.
    pub targets: &'s [String],
    /// Per-context features, stored in `c`.
    pub features: &'s [String],
    /// Its split column, if it has one.
    pub split_by: Option<&'s str>,
}

impl<'s> Rules<'s> {
    /// The rules of `spec`.
    pub fn of(spec: &'s CompileSpec) -> Rules<'s> {
        Rules {
            order_by: spec.order_by.as_deref(),
            max_len: spec.max_len,
            truncate: spec.truncate,
            split_seed: spec.split_seed,
            seed: spec.seed,
            nan: spec.nan,
            ngram_vocab: spec.ngram_vocab,
            unmatched_rows: spec.unmatched_rows,
            empty_contexts: spec.empty_contexts,
            splits: SplitRules {
                split_by: spec.split_by.as_deref(),
                split_keys: &spec.split_keys,
                val_fraction: spec.val_fraction,
                split_seed: spec.split_seed,
            },
            context: ContextRules {
                key: spec.context_key(),
                targets: &spec.targets,
                features: &spec.context_features,
                split_by: spec.split_by.as_deref(),
            },
        }
    }
}
