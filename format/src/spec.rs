//! The compile spec: everything `dsc compile` was asked to do, as recorded in the manifest and as
//! written in a `dsc.toml` spec file.

use crate::spelling::OptionError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which rows of an over-long sequence are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Truncate {
    /// Keep the first `max_len` rows (in `order_by` order).
    #[default]
    Head,
    /// Keep the last `max_len` rows.
    Tail,
    /// Keep a seeded uniform sample of `max_len` rows, in their original order.
    Sample,
}

/// What to do with a null, NaN or infinite value in a numeric feature or target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NanPolicy {
    /// Stop with an error naming the file, column and row.
    #[default]
    Error,
    /// Store 0 in the encoded tensor.
    Zero,
    /// Store the encoded train-split mean of the column.
    Mean,
}

/// What to do with rows whose key has no row in the context table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UnmatchedRows {
    /// Stop with an error naming the key and where it was found.
    #[default]
    Error,
    /// Leave those contexts out of the cache and count them in the summary.
    Drop,
}

/// What to do with context-table rows whose key has no rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EmptyContexts {
    /// Stop with an error naming the key.
    #[default]
    Error,
    /// Leave them out of the cache and count them in the summary.
    Drop,
    /// Keep them as sequences of length 0 (all padding).
    Keep,
}

crate::choice!(Truncate, "truncate", { Head => "head", Tail => "tail", Sample => "sample" });
crate::choice!(NanPolicy, "nan", { Error => "error", Zero => "zero", Mean => "mean" });
crate::choice!(UnmatchedRows, "unmatched_rows", { Error => "error", Drop => "drop" });
crate::choice!(EmptyContexts, "empty_contexts", {
    Error => "error",
    Drop => "drop",
    Keep => "keep",
});

/// A per-row lookup table joined on one column (e.g. sensor geometry on `sensor_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinSpec {
    /// A CSV or Parquet file.
    pub file: String,
    /// The column present in both the rows table and this file.
    pub on: String,
}

/// A byte count for people: `512 B`, `3.2 GiB` (binary units up to EiB); the inverse, roughly,
/// of [`parse_size`].
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Parses a size such as `256MiB`, `1GiB`, `64M` or `1000000` (bytes); the error says what is
/// wrong with it.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| "expected a number with an optional unit".to_string())?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use B, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * scale;
    // `as u64` saturates: a size past 2^64 bytes became 16 EiB without a word.
    if bytes >= u64::MAX as f64 {
        return Err(format!(
            "{s} is more than this machine can address (2^64 bytes)"
        ));
    }
    Ok(bytes as u64)
}

/// Default target shard size: 256 MiB.
pub const DEFAULT_SHARD_SIZE: u64 = 256 << 20;

/// The resolved compile spec. Field names are the spec-file keys; see `docs/FORMAT.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompileSpec {
    /// Rows files: paths or glob patterns, read in sorted path order.
    pub rows: Vec<String>,
    /// The column naming each row's context (an integer column). Empty (absent): a table of
    /// records, every row its own context, keyed by its row number across the rows files, and
    /// stored without a step axis.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// The column that orders rows within a context; file order when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_by: Option<String>,
    /// The context table (one row per context): Parquet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The context table's key column; defaults to `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_key: Option<String>,
    /// Context-table columns stored as targets `y`, in order.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Context-table columns stored as per-context features `c`, in order.
    #[serde(default)]
    pub context_features: Vec<String>,
    /// Per-row lookup tables.
    #[serde(default)]
    pub joins: Vec<JoinSpec>,
    /// Per-row numeric features stored in `x`, in order.
    #[serde(default)]
    pub features: Vec<String>,
    /// Per-row categorical columns, each stored as its own i32 code tensor.
    #[serde(default)]
    pub categorical: Vec<String>,
    /// Encoding chains by column, e.g. `charge = "log1p,zscore"`; identity otherwise.
    #[serde(default)]
    pub encode: BTreeMap<String, String>,
    /// N-grams kept at most by an `ngrams:N` encoding (the train split's most frequent)
    /// [default: 4096].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ngram_vocab: Option<usize>,
    /// The padded sequence length `L`; the longest sequence when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// Which rows of an over-long sequence are kept.
    #[serde(default)]
    pub truncate: Truncate,
    /// Fraction of contexts in the validation split.
    #[serde(default)]
    pub val_fraction: f64,
    /// Seed of the key hash that assigns splits and of `truncate = "sample"`; independent of
    /// `seed`, so a reshuffle keeps the same split and the same rows.
    #[serde(default)]
    pub split_seed: u64,
    /// A context-table column naming each context's split (`train`, `val`, `test`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_by: Option<String>,
    /// Split name → a file of keys, one per line; unlisted keys are `train`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub split_keys: BTreeMap<String, String>,
    /// Seed of the global shuffle.
    #[serde(default)]
    pub seed: u64,
    /// Null/NaN/inf policy for numeric features and targets.
    #[serde(default)]
    pub nan: NanPolicy,
    /// Policy for rows whose key is missing from the context table.
    #[serde(default)]
    pub unmatched_rows: UnmatchedRows,
    /// Policy for context-table keys with no rows.
    #[serde(default)]
    pub empty_contexts: EmptyContexts,
    /// Target shard size in bytes.
    #[serde(default = "default_shard_size")]
    pub shard_size: u64,
    /// Decoded input bytes per compile bucket (default [`DEFAULT_BUCKET_SIZE`]). The compile
    /// holds a few buckets in memory at a time; shards never span two, so this shapes shard
    /// boundaries (never the order or the values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_size: Option<u64>,
    /// `mostlyai`: reproduce mostlyai-engine 2.7.3's statistics and sequential encoding
    /// (every non-key column of both tables; see `docs/COMPAT-mostlyai.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// With a profile: the file listing the validation keys, one per line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_keys: Option<String>,
    /// With a profile: the engine's number of partitions (its statistics depend on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<usize>,
    /// Another cache whose fitted parameters (normalisation, vocabularies, string encodings,
    /// fills, `max_len`) this compile takes instead of fitting its own: a test set encoded as
    /// its training set was, or an append to that cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit_from: Option<String>,
}

/// Every key of [`CompileSpec`], in its order (a test holds it equal to the fields).
pub const SPEC_KEYS: &[&str] = &[
    "rows",
    "key",
    "order_by",
    "context",
    "context_key",
    "targets",
    "context_features",
    "joins",
    "features",
    "categorical",
    "encode",
    "ngram_vocab",
    "max_len",
    "truncate",
    "val_fraction",
    "split_seed",
    "split_by",
    "split_keys",
    "seed",
    "nan",
    "unmatched_rows",
    "empty_contexts",
    "shard_size",
    "bucket_size",
    "profile",
    "val_keys",
    "partitions",
    "fit_from",
];

/// Decoded input bytes per compile bucket unless the spec says otherwise.
pub const DEFAULT_BUCKET_SIZE: u64 = 32 << 20;

fn default_shard_size() -> u64 {
    DEFAULT_SHARD_SIZE
}

impl CompileSpec {
    /// A spec with the given rows and key and every other field at its default.
    pub fn new(rows: Vec<String>, key: impl Into<String>) -> Self {
        CompileSpec {
            rows,
            key: key.into(),
            order_by: None,
            context: None,
            context_key: None,
            targets: Vec::new(),
            context_features: Vec::new(),
            joins: Vec::new(),
            features: Vec::new(),
            categorical: Vec::new(),
            encode: BTreeMap::new(),
            ngram_vocab: None,
            max_len: None,
            truncate: Truncate::Head,
            val_fraction: 0.0,
            split_seed: 0,
            seed: 0,
            nan: NanPolicy::Error,
            unmatched_rows: UnmatchedRows::Error,
            empty_contexts: EmptyContexts::Error,
            shard_size: DEFAULT_SHARD_SIZE,
            bucket_size: None,
            profile: None,
            val_keys: None,
            partitions: None,
            fit_from: None,
            split_by: None,
            split_keys: BTreeMap::new(),
        }
    }

    /// The context table's key column.
    pub fn context_key(&self) -> &str {
        self.context_key.as_deref().unwrap_or(&self.key)
    }

    /// A spec file's keys (`base`: a parsed `dsc.toml`, or empty) with `overrides` (the command
    /// line's flags, `dsc.compile`'s keywords) laid over them, by the one rule every front end
    /// follows: a key given replaces the file's, except `encode`, which merges column by column;
    /// a split assignment given (`split_by` or `split_keys`) replaces the file's, whichever kind
    /// it was.
    ///
    /// ```
    /// use dsc_format::CompileSpec;
    /// use serde_json::json;
    ///
    /// let file = json!({"rows": ["a.parquet"], "key": "id", "features": ["x", "y"],
    ///                   "encode": {"x": "zscore", "y": "log1p"}, "split_by": "fold"});
    /// let given = json!({"features": ["x"], "encode": {"y": "minmax"},
    ///                    "split_keys": {"test": "test.txt"}});
    /// let spec = CompileSpec::with_overrides(
    ///     file.as_object().unwrap().clone(),
    ///     given.as_object().unwrap().clone(),
    /// )?;
    /// assert_eq!(spec.features, ["x"]);
    /// assert_eq!(spec.encode["x"], "zscore");
    /// assert_eq!(spec.encode["y"], "minmax");
    /// assert_eq!((spec.split_by, spec.split_keys.len()), (None, 1));
    /// // A value a key cannot hold is refused by its key, with the value.
    /// let bad = json!({"max_len": "long"});
    /// let err = CompileSpec::with_overrides(file.as_object().unwrap().clone(),
    ///                                       bad.as_object().unwrap().clone()).unwrap_err();
    /// assert_eq!((err.key, err.value.as_deref()), ("max_len", Some("long")));
    /// # Ok::<(), dsc_format::spelling::OptionError>(())
    /// ```
    pub fn with_overrides(
        mut base: serde_json::Map<String, serde_json::Value>,
        overrides: serde_json::Map<String, serde_json::Value>,
    ) -> Result<CompileSpec, OptionError> {
        use serde_json::Value;
        // Each key given alone over the defaults first, so that a value of the wrong type or
        // an unknown key is named by its key.
        let defaults = crate::spelling::fields(&CompileSpec::new(vec![], ""));
        crate::spelling::check_each_key::<CompileSpec>(&defaults, &overrides, SPEC_KEYS, "spec")?;
        if overrides.contains_key("split_by") || overrides.contains_key("split_keys") {
            base.remove("split_by");
            base.remove("split_keys");
        }
        for (key, value) in overrides {
            match (key.as_str(), base.get_mut(&key), value) {
                ("encode", Some(Value::Object(mine)), Value::Object(given)) => mine.extend(given),
                (_, _, value) => {
                    base.insert(key, value);
                }
            }
        }
        serde_json::from_value(Value::Object(base))
            .map_err(|e| OptionError::new("spec", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_keys_are_the_fields() {
        let mut spec = CompileSpec::new(vec!["a".into()], "id");
        // Every optional field given, so that each serialises.
        spec.order_by = Some("t".into());
        spec.context = Some("c".into());
        spec.context_key = Some("k".into());
        spec.ngram_vocab = Some(8);
        spec.max_len = Some(8);
        spec.split_by = Some("s".into());
        spec.split_keys.insert("test".into(), "t.txt".into());
        spec.bucket_size = Some(1);
        spec.profile = Some("p".into());
        spec.val_keys = Some("v".into());
        spec.partitions = Some(1);
        spec.fit_from = Some("f".into());
        let keys: Vec<String> = match serde_json::to_value(spec).unwrap() {
            serde_json::Value::Object(m) => m.keys().cloned().collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(keys, SPEC_KEYS);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        // Past 2^64 bytes: an error, not a size saturated to 16 EiB.
        for huge in [
            "99999999999999999999999",
            "99999999999999999999999GiB",
            "16777216TiB",
        ] {
            let err = parse_size(huge).unwrap_err();
            assert!(err.contains("2^64 bytes"), "{huge}: {err}");
        }
    }
}
