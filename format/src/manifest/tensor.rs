//! What a cache stores per context: its tensors, their columns and each column's encoding.

use serde::{Deserialize, Serialize};

/// Element type of a stored tensor, spelled as in safetensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dtype {
    /// 32-bit IEEE float, little-endian.
    F32,
    /// 8-bit unsigned integer: bits and multi-hot vectors.
    U8,
    /// 32-bit signed integer, little-endian.
    I32,
    /// 64-bit signed integer, little-endian.
    I64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::I64 => 8,
        }
    }
    /// The safetensors dtype string.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::U8 => "U8",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
        }
    }
}

/// What a tensor means to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    /// `key` i64 `[n]`: the context key.
    Key,
    /// `length` i32 `[n]`: the number of stored (non-padding) steps, at most `L`.
    Length,
    /// `full_length` i32 `[n]`: the sequence length before truncation.
    FullLength,
    /// `x` f32 `[n, L, F]`: per-row numeric features.
    Features,
    /// i32 `[n, L]`: codes of one per-row categorical column.
    Categorical,
    /// `y` f32 `[n, T]`: per-context targets.
    Targets,
    /// `c` f32 `[n, C]`: per-context features.
    ContextFeatures,
    /// i32 `[n, L + 1]`: the codes of one engine sub-column of the rows table (a
    /// mostlyai-engine compatible cache): steps `0..=length` hold the engine's sequence,
    /// its padding step included; later steps are zero.
    SubColumn,
    /// i32 `[n]`: the code of one engine sub-column of the context table.
    ContextSubColumn,
    /// `[n, L, W]`: one string column of the rows table encoded to a fixed width per row
    /// (`bits` and `ngrams` as u8, `chars` as i32 codes; [`Encoding::Bits`],
    /// [`Encoding::Chars`], [`Encoding::Ngrams`]).
    Encoded,
    /// `[n, W]`: one string column of the context table encoded to a fixed width.
    ContextEncoded,
    /// i32 `[n]`: the category code of one column per context (a table of records, whose every
    /// row is a context).
    ContextCategorical,
}

impl TensorRole {
    /// Axes per sample.
    pub fn rank(self) -> usize {
        match self {
            TensorRole::Key
            | TensorRole::Length
            | TensorRole::FullLength
            | TensorRole::ContextSubColumn
            | TensorRole::ContextCategorical => 0,
            TensorRole::Categorical
            | TensorRole::Targets
            | TensorRole::ContextFeatures
            | TensorRole::SubColumn
            | TensorRole::ContextEncoded => 1,
            TensorRole::Features | TensorRole::Encoded => 2,
        }
    }

    /// The element type a tensor of this role is stored as (for an encoded string column, the
    /// usual one: its encoding decides, [`Encoding::dtype`]).
    pub fn dtype(self) -> Dtype {
        match self {
            TensorRole::Encoded | TensorRole::ContextEncoded => Dtype::U8,
            TensorRole::Key => Dtype::I64,
            TensorRole::Length
            | TensorRole::FullLength
            | TensorRole::Categorical
            | TensorRole::SubColumn
            | TensorRole::ContextSubColumn
            | TensorRole::ContextCategorical => Dtype::I32,
            TensorRole::Features | TensorRole::Targets | TensorRole::ContextFeatures => Dtype::F32,
        }
    }
}

/// Where a column's values come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "table", rename_all = "snake_case")]
pub enum ColumnSource {
    /// The rows table.
    Rows,
    /// A per-row lookup table joined on `on`.
    Join {
        /// The lookup file as given.
        file: String,
        /// The join column.
        on: String,
    },
    /// The context table.
    Context,
}

/// One step of a numeric encoding chain. Each step's parameters were computed on the train split
/// from the output of the steps before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Stage {
    /// `v = x`.
    Identity,
    /// `v = ln(1 + x)`; inverse `x = exp(v) - 1`.
    Log1p,
    /// `v = (x - mean) / std`; inverse `x = v * std + mean`. A zero std is stored as 1.
    Zscore {
        /// Train-split mean of the stage input.
        mean: f64,
        /// Train-split population standard deviation of the stage input (1 when it was 0).
        std: f64,
    },
    /// `v = (x - min) / (max - min)`; inverse `x = v * (max - min) + min`. A zero range is stored
    /// as `max = min + 1`.
    Minmax {
        /// Train-split minimum of the stage input.
        min: f64,
        /// Train-split maximum of the stage input.
        max: f64,
    },
}

impl Stage {
    /// Applies the stage.
    pub fn apply(&self, x: f64) -> f64 {
        match *self {
            Stage::Identity => x,
            Stage::Log1p => x.ln_1p(),
            Stage::Zscore { mean, std } => (x - mean) / std,
            Stage::Minmax { min, max } => (x - min) / (max - min),
        }
    }
    /// Inverts the stage.
    pub fn invert(&self, v: f64) -> f64 {
        match *self {
            Stage::Identity => v,
            Stage::Log1p => v.exp_m1(),
            Stage::Zscore { mean, std } => v * std + mean,
            Stage::Minmax { min, max } => v * (max - min) + min,
        }
    }
    /// The stage with its fitted parameters, for messages: `zscore(mean 3.5, std 2)`.
    pub fn describe(&self) -> String {
        match *self {
            Stage::Zscore { mean, std } => format!("zscore(mean {mean}, std {std})"),
            Stage::Minmax { min, max } => format!("minmax(min {min}, max {max})"),
            _ => self.name().into(),
        }
    }

    /// The stage's name as written in a spec (`log1p`, `zscore`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Identity => "identity",
            Stage::Log1p => "log1p",
            Stage::Zscore { .. } => "zscore",
            Stage::Minmax { .. } => "minmax",
        }
    }
}

/// How a column's source values became stored numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Encoding {
    /// A number through a chain of stages, stored as f32.
    Numeric {
        /// The stages in the order they were applied.
        stages: Vec<Stage>,
        /// The stored value for null/NaN/inf when the NaN policy replaced them (encoded space).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fill: Option<f64>,
    },
    /// A boolean stored as 0 or 1.
    Bool,
    /// Codes: 0 for null, 1 for a value not in the vocabulary, `2 + i` for `vocabulary[i]`. The
    /// vocabulary is the train split's distinct values in ascending order.
    Category {
        /// Distinct train-split values (numbers or strings), ascending.
        vocabulary: Vec<serde_json::Value>,
    },
    /// Stored as read (keys, lengths).
    Raw,
    /// A string of `'0'` and `'1'` stored as that many u8 0s and 1s, every row `width`
    /// characters (a Bloom filter, a bit mask). Null is all zeros.
    Bits {
        /// Characters per row.
        width: usize,
    },
    /// A string's characters as i32 codes, cut or zero-padded to `width`: 0 for padding (and
    /// null), 1 for a character not in the vocabulary, `2 + i` for `vocabulary[i]`, the train
    /// split's distinct characters in ascending (Unicode) order, each a one-character string.
    Chars {
        /// Codes per row.
        width: usize,
        /// The train split's characters, ascending.
        vocabulary: Vec<String>,
    },
    /// The set of a string's character `n`-grams (all `len - n + 1` of them, as read) as a
    /// multi-hot u8 vector over `vocabulary`: the train split's most frequent `n`-grams (rows
    /// holding each), most frequent first, ties in ascending order, at most the spec's
    /// `ngram_vocab`. An n-gram not in it sets nothing. Null is all zeros.
    Ngrams {
        /// Characters per gram.
        n: usize,
        /// The kept n-grams, most frequent first.
        vocabulary: Vec<String>,
    },
    /// A sub-column code of an engine-compatible cache: `0..cardinality`. What the codes mean
    /// is in the engine's statistics file named by `stats`.
    SubColumn {
        /// The engine's name of the sub-column (`tgt:t0/c0__E1`).
        sub_column: String,
        /// Number of codes.
        cardinality: usize,
        /// The statistics file beside the manifest that defines the codes.
        stats: String,
    },
}

impl Encoding {
    /// The encoding with every parameter that decides what a stored value means, for messages
    /// that compare two (`log1p,zscore(mean 0.4, std 1.1), NaN as 0`, `chars:8 over 37
    /// characters`).
    pub fn describe(&self) -> String {
        match self {
            Encoding::Numeric { stages, fill } => {
                let mut s = match stages.iter().all(|s| *s == Stage::Identity) {
                    true => "the value as it is".to_string(),
                    false => stages
                        .iter()
                        .map(Stage::describe)
                        .collect::<Vec<_>>()
                        .join(","),
                };
                if let Some(f) = fill {
                    s.push_str(&format!(", bad values as {f}"));
                }
                s
            }
            Encoding::Bool => "bool 0/1".into(),
            Encoding::Category { vocabulary } => {
                format!("category codes over {} values", vocabulary.len())
            }
            Encoding::Raw => "raw".into(),
            Encoding::Bits { width } => format!("bits:{width}"),
            Encoding::Chars { width, vocabulary } => {
                format!("chars:{width} over {} characters", vocabulary.len())
            }
            Encoding::Ngrams { n, vocabulary } => {
                format!("ngrams:{n} over {} grams", vocabulary.len())
            }
            Encoding::SubColumn {
                sub_column,
                cardinality,
                stats,
            } => format!("sub-column {sub_column} ({cardinality} codes, {stats})"),
        }
    }

    /// The element type an encoded string column is stored as; `None` for the other encodings
    /// (their tensor's role decides).
    pub fn dtype(&self) -> Option<Dtype> {
        match self {
            Encoding::Bits { .. } | Encoding::Ngrams { .. } => Some(Dtype::U8),
            Encoding::Chars { .. } => Some(Dtype::I32),
            _ => None,
        }
    }

    /// Values per row of an encoded string column: its width, or an n-gram vocabulary's size.
    pub fn width(&self) -> Option<usize> {
        match self {
            Encoding::Bits { width } | Encoding::Chars { width, .. } => Some(*width),
            Encoding::Ngrams { vocabulary, .. } => Some(vocabulary.len()),
            _ => None,
        }
    }
}

/// Reserved category code for null (and for padding).
pub const CODE_NULL: i32 = 0;
/// Reserved category code for a value not in the train vocabulary.
pub const CODE_UNKNOWN: i32 = 1;
/// The code of the first vocabulary entry.
pub const CODE_FIRST: i32 = 2;

/// One source column inside a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnSpec {
    /// The column's name in its source table.
    pub name: String,
    /// The table it comes from.
    pub source: ColumnSource,
    /// Its type in the source (Arrow type name, e.g. `Int64`, `Float64`, `Utf8`, `Timestamp(us)`).
    pub source_type: String,
    /// How it was encoded.
    pub encoding: Encoding,
}

/// One tensor present in every shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// The safetensors tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// What the tensor is.
    pub role: TensorRole,
    /// Shape of one sample; a shard holding `n` contexts stores `[n, ..sample_shape]`.
    pub sample_shape: Vec<usize>,
    /// The source columns, in the order of the last axis (one entry for single-column tensors).
    pub columns: Vec<ColumnSpec>,
}

impl TensorSpec {
    /// Elements per sample.
    pub fn sample_elems(&self) -> usize {
        self.sample_shape.iter().product()
    }
    /// Bytes per sample.
    pub fn sample_bytes(&self) -> usize {
        self.sample_elems() * self.dtype.size()
    }
}
