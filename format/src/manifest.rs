//! `manifest.json`: what a cache holds and how it was made. Written last; its presence makes a
//! directory a cache.

use crate::spec::CompileSpec;
use crate::{FormatError, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

/// Element type of a stored tensor, spelled as in safetensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dtype {
    /// 32-bit IEEE float, little-endian.
    F32,
    /// 32-bit signed integer, little-endian.
    I32,
    /// 64-bit signed integer, little-endian.
    I64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::I64 => 8,
        }
    }
    /// The safetensors dtype string.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
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
}

impl TensorRole {
    /// Axes per sample.
    pub fn rank(self) -> usize {
        match self {
            TensorRole::Key
            | TensorRole::Length
            | TensorRole::FullLength
            | TensorRole::ContextSubColumn => 0,
            TensorRole::Categorical
            | TensorRole::Targets
            | TensorRole::ContextFeatures
            | TensorRole::SubColumn => 1,
            TensorRole::Features => 2,
        }
    }

    /// The element type a tensor of this role is stored as.
    pub fn dtype(self) -> Dtype {
        match self {
            TensorRole::Key => Dtype::I64,
            TensorRole::Length
            | TensorRole::FullLength
            | TensorRole::Categorical
            | TensorRole::SubColumn
            | TensorRole::ContextSubColumn => Dtype::I32,
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

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// Path relative to the cache directory, `shards/{split}-{NNNNN}.safetensors`, with `.zst`
    /// appended when the shard is stored compressed.
    pub file: String,
    /// The split it belongs to.
    pub split: String,
    /// Its position among the split's shards (0-based, equal to `NNNNN`).
    pub index: usize,
    /// Contexts stored.
    pub contexts: usize,
    /// Position of its first context in the split's compiled order.
    pub first_context: usize,
    /// Size in bytes of the safetensors file (decompressed, when `compressed`).
    pub bytes: u64,
    /// xxh3-64 of the whole safetensors file (decompressed, when `compressed`), 16 hex digits.
    pub xxh3: String,
    /// Set when the shard is stored compressed: `file` then holds the safetensors file that
    /// `bytes` and `xxh3` describe as one frame of this codec (FORMAT.md §3.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed: Option<Compressed>,
}

/// How a compressed shard is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compressed {
    /// The codec.
    pub codec: Codec,
    /// The level the file was written at (absent in caches compressed before it was
    /// recorded): what `dsc compress --level` compares, to rewrite shards at another level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<i32>,
    /// Size in bytes of the stored (compressed) file.
    pub bytes: u64,
    /// xxh3-64 of the stored (compressed) file, 16 hex digits.
    pub xxh3: String,
}

/// A shard compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Zstandard (RFC 8878), one frame holding the whole safetensors file.
    Zstd,
}

impl Codec {
    /// The suffix appended to the shard's file name.
    pub fn suffix(self) -> &'static str {
        match self {
            Codec::Zstd => ".zst",
        }
    }
}

impl ShardEntry {
    /// The file name this entry must have: `shards/{split}-{NNNNN}.safetensors`, plus the
    /// codec's suffix when compressed.
    pub fn expected_file(&self) -> String {
        let hot = crate::shard::shard_file_name(&self.split, self.index);
        match &self.compressed {
            Some(c) => hot + c.codec.suffix(),
            None => hot,
        }
    }

    /// Bytes the file takes on disk: the compressed size when compressed.
    pub fn stored_bytes(&self) -> u64 {
        self.compressed.as_ref().map_or(self.bytes, |c| c.bytes)
    }
}

/// One split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitInfo {
    /// `train` or `val`.
    pub name: String,
    /// Contexts in the split.
    pub contexts: usize,
    /// Source rows stored (after truncation).
    pub rows_stored: u64,
    /// Shards holding the split.
    pub shards: usize,
}

/// One input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The path as given to the compiler.
    pub path: String,
    /// What it was used as: `rows`, `context` or `join`.
    pub role: String,
    /// Size in bytes.
    pub bytes: u64,
    /// xxh3-64 of its content.
    pub xxh3: String,
}

/// The inputs and their combined fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inputs {
    /// xxh3-64 over every input's role, size and hash, in order: equal fingerprints mean equal
    /// inputs.
    pub fingerprint: String,
    /// The files, in the order read.
    pub files: Vec<InputFile>,
}

/// Counts reported by the compile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CompileSummary {
    /// Rows read from the rows files.
    pub rows_read: u64,
    /// Rows stored in shards (after truncation and dropping).
    pub rows_stored: u64,
    /// Contexts stored.
    pub contexts: usize,
    /// Contexts cut to `max_len`.
    pub contexts_truncated: usize,
    /// Contexts present in rows but not in the context table, dropped by policy.
    pub contexts_without_context_row: usize,
    /// Rows belonging to those contexts.
    pub rows_without_context_row: u64,
    /// Context-table keys with no rows.
    pub contexts_without_rows: usize,
    /// Of those, how many were kept as empty sequences.
    pub empty_contexts_kept: usize,
    /// Null/NaN/inf values replaced by the NaN policy.
    pub values_filled: u64,
}

/// The manifest of a cache. Only ever holds a manifest that passed every rule of the format:
/// it is built by [`ManifestBuilder::build`] (writers) or parsed by [`Manifest::from_json`]
/// (readers), both of which validate, and its fields are read through accessors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ManifestFields")]
pub struct Manifest {
    format: String,
    format_version: u32,
    dsc_version: String,
    max_len: usize,
    splits: Vec<SplitInfo>,
    tensors: Vec<TensorSpec>,
    shards: Vec<ShardEntry>,
    inputs: Inputs,
    summary: CompileSummary,
    spec: CompileSpec,
}

/// The JSON shape of a manifest, before validation: the only way from it to a [`Manifest`] is
/// `TryFrom`, so no unchecked manifest exists outside this module.
#[derive(Deserialize)]
struct ManifestFields {
    format: String,
    format_version: u32,
    dsc_version: String,
    max_len: usize,
    splits: Vec<SplitInfo>,
    tensors: Vec<TensorSpec>,
    shards: Vec<ShardEntry>,
    inputs: Inputs,
    summary: CompileSummary,
    spec: CompileSpec,
}

impl TryFrom<ManifestFields> for Manifest {
    type Error = ManifestProblem;

    fn try_from(f: ManifestFields) -> Result<Manifest, ManifestProblem> {
        let manifest = Manifest {
            format: f.format,
            format_version: f.format_version,
            dsc_version: f.dsc_version,
            max_len: f.max_len,
            splits: f.splits,
            tensors: f.tensors,
            shards: f.shards,
            inputs: f.inputs,
            summary: f.summary,
            spec: f.spec,
        };
        manifest.validate()?;
        Ok(manifest)
    }
}

/// What makes a manifest invalid: each names the tensor, split or shard it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestProblem {
    /// `format` is not `dsc-cache`, or the version is not one this build reads.
    #[error("format {found:?} version {version} (this dsc reads {FORMAT_NAME:?} versions {SUPPORTED_VERSIONS:?})")]
    NotThisFormat {
        /// The `format` field, if any.
        found: Option<String>,
        /// The `format_version` field.
        version: u32,
    },
    /// Two tensors share a name.
    #[error("tensor {tensor:?} appears twice")]
    DuplicateTensor {
        /// The name.
        tensor: String,
    },
    /// A tensor's shape has the wrong number of axes for its role.
    #[error(
        "tensor {tensor:?} has sample shape {shape:?}, a {role:?} tensor has {expected} axes per sample"
    )]
    Rank {
        /// The tensor.
        tensor: String,
        /// Its role.
        role: TensorRole,
        /// Its sample shape.
        shape: Vec<usize>,
        /// Axes its role has.
        expected: usize,
    },
    /// A tensor's dtype does not match its role.
    #[error("tensor {tensor:?} ({role:?}) is {found:?}, it must be {expected:?}")]
    Dtype {
        /// The tensor.
        tensor: String,
        /// Its role.
        role: TensorRole,
        /// Its dtype.
        found: Dtype,
        /// The dtype of its role.
        expected: Dtype,
    },
    /// A sample would be larger than any file.
    #[error("tensor {tensor:?} has an impossible sample shape {shape:?}")]
    ImpossibleShape {
        /// The tensor.
        tensor: String,
        /// Its sample shape.
        shape: Vec<usize>,
    },
    /// A sequence axis differs from `max_len` (`max_len + 1` for engine sub-columns).
    #[error(
        "tensor {tensor:?} has sequence axis {found}, it must be {expected} (max_len {max_len})"
    )]
    SequenceAxis {
        /// The tensor.
        tensor: String,
        /// Its sequence axis.
        found: usize,
        /// The axis its role needs.
        expected: usize,
        /// The manifest's `max_len`.
        max_len: usize,
    },
    /// A tensor lists a different number of source columns than its last axis holds.
    #[error("tensor {tensor:?} lists {found} columns for a width of {width}")]
    Columns {
        /// The tensor.
        tensor: String,
        /// Columns listed.
        found: usize,
        /// Its width.
        width: usize,
    },
    /// The first tensor is not `key`, or another tensor has its role: the one i64 tensor leads so
    /// that every tensor in a shard is aligned to its element size.
    #[error(
        "the first tensor is {first} and {keys} tensors have role Key; \"key\" (role Key) must \
         be first and the only one (so that every tensor is aligned)"
    )]
    KeyNotFirst {
        /// The first tensor's name and role.
        first: String,
        /// Tensors of role Key.
        keys: usize,
    },
    /// A required tensor (`key`, `length`) is absent.
    #[error("tensor {tensor:?} is missing")]
    MissingTensor {
        /// The tensor.
        tensor: &'static str,
    },
    /// A split name is empty, outside the safe alphabet (it becomes part of file names), or the
    /// name `stats.json` keeps for all splits together.
    #[error(
        "split name {split:?} must be non-empty lower-case letters, digits or _, and not \"all\""
    )]
    SplitName {
        /// The name.
        split: String,
    },
    /// Two splits share a name.
    #[error("split {split:?} appears twice")]
    DuplicateSplit {
        /// The name.
        split: String,
    },
    /// A split's shard count differs from the shards listed for it.
    #[error("split {split:?} says {said} shards, {listed} are listed")]
    SplitShards {
        /// The split.
        split: String,
        /// Its `shards` field.
        said: usize,
        /// Shards listed with its name.
        listed: usize,
    },
    /// A split's context count differs from the sum over its shards.
    #[error("split {split:?} says {said} contexts, its shards hold {held}")]
    SplitContexts {
        /// The split.
        split: String,
        /// Its `contexts` field.
        said: usize,
        /// The sum over its shards.
        held: usize,
    },
    /// A shard's file name or index is not the one its position gives.
    #[error("shard {file:?} is listed as index {index} of split {split:?}, expected {expected:?}")]
    ShardName {
        /// The shard's `file`.
        file: String,
        /// Its `index`.
        index: usize,
        /// Its split.
        split: String,
        /// The file name its position gives.
        expected: String,
    },
    /// A shard's first context is not the end of the shard before it.
    #[error("shard {file:?} starts at context {found}, expected {expected}")]
    ShardStart {
        /// The shard's `file`.
        file: String,
        /// Its `first_context`.
        found: usize,
        /// The sum of the contexts before it.
        expected: usize,
    },
    /// A shard names a split the manifest does not list.
    #[error("shard {file:?} names unknown split {split:?}")]
    UnknownSplit {
        /// The shard's `file`.
        file: String,
        /// The split it names.
        split: String,
    },
}

/// The longest split name a compile gives (shard file names hold it, and file systems cap a name
/// at 255 bytes); caches are not refused for a longer one, which an older dsc may have written.
pub const MAX_SPLIT_NAME: usize = 64;

/// Why `name` cannot name a split, if it cannot: split names become part of shard file names
/// (non-empty lower-case ASCII letters, digits and `_`), and `stats.json` keeps
/// [`ALL_SPLITS`](crate::stats::ALL_SPLITS) for every split together.
pub fn split_name_problem(name: &str) -> Option<&'static str> {
    let safe = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !safe {
        Some("must be non-empty lower-case letters, digits or _ (it becomes part of the shard file names)")
    } else if name == crate::stats::ALL_SPLITS {
        Some("is reserved: stats.json uses it for every split together")
    } else {
        None
    }
}

/// Format versions this build reads.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, 2];

impl Manifest {
    /// Starts a manifest for the writers: the dsc release writing it, tensors padded to
    /// `max_len`, the inputs they were compiled from and the resolved spec. Splits are added with their shards; [`build`]
    /// derives the counts and validates.
    ///
    /// [`build`]: ManifestBuilder::build
    pub fn builder(
        dsc_version: &str,
        max_len: usize,
        tensors: Vec<TensorSpec>,
        inputs: Inputs,
        spec: CompileSpec,
    ) -> ManifestBuilder {
        ManifestBuilder {
            dsc_version: dsc_version.into(),
            max_len,
            tensors,
            inputs,
            spec,
            splits: Vec::new(),
            shards: Vec::new(),
            summary: CompileSummary::default(),
        }
    }

    /// Reads and validates `DIR/manifest.json`. Refuses a compile's staging directory, whatever
    /// it holds: only a renamed, committed directory is a cache.
    pub fn read(dir: &Path) -> Result<Manifest, FormatError> {
        Self::read_with(dir, |name| std::fs::read(dir.join(name)))
    }

    /// [`Manifest::read`] with the file's bytes read by `read` from a name relative to `dir`
    /// (e.g. through a directory held open, so that the manifest comes from the directory the
    /// caller holds whatever later happens to the path).
    pub fn read_with(
        dir: &Path,
        read: impl FnOnce(&str) -> std::io::Result<Vec<u8>>,
    ) -> Result<Manifest, FormatError> {
        let staging = dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with('.')
                && [crate::STAGING_SUFFIX, crate::REPLACED_SUFFIX]
                    .iter()
                    .any(|s| n.ends_with(&format!(".{s}")))
        });
        if staging {
            return Err(FormatError::NotCommitted { dir: dir.into() });
        }
        let path = dir.join(MANIFEST_FILE);
        let bytes = match read(MANIFEST_FILE) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(if dir.is_dir() {
                    FormatError::NotACache { dir: dir.into() }
                } else {
                    FormatError::io(dir, e)
                })
            }
            Err(e) => return Err(FormatError::io(&path, e)),
        };
        Self::from_json(&bytes, &path)
    }

    /// An identity of the cache's data: a hash over every shard's file name and checksum, in
    /// order. Two caches with the same identity hold the same bytes in the same shards, so the
    /// same loader order; a recompile with another seed, shard size or input changes it (unlike
    /// `inputs.fingerprint`, which names the input files alone).
    pub fn content_id(&self) -> String {
        let mut h = crate::checksum::Hasher::new();
        for s in &self.shards {
            h.update(format!("{}\0{}\n", s.file, s.xxh3).as_bytes());
        }
        h.hex()
    }

    /// Parses and validates manifest JSON; `path` is used in errors.
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Manifest, FormatError> {
        // Check the version before the full structure, so an old or new cache gets a version
        // error rather than a confusing field error.
        #[derive(Deserialize)]
        struct Head {
            format: Option<String>,
            format_version: Option<u32>,
        }
        let json_err = |source| FormatError::Json {
            path: path.into(),
            source,
        };
        let head: Head = serde_json::from_slice(bytes).map_err(json_err)?;
        let version = head.format_version.unwrap_or(0);
        if head.format.as_deref() != Some(FORMAT_NAME) {
            return Err(FormatError::InvalidManifest {
                path: path.into(),
                problem: ManifestProblem::NotThisFormat {
                    found: head.format,
                    version,
                },
            });
        }
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                path: path.into(),
                found: version,
                supported: format!("{SUPPORTED_VERSIONS:?}"),
            });
        }
        // Parsed into the unchecked shape first, so that a rule broken is a typed problem
        // rather than text inside a JSON error.
        let fields: ManifestFields = serde_json::from_slice(bytes).map_err(json_err)?;
        Manifest::try_from(fields).map_err(|problem| FormatError::InvalidManifest {
            path: path.into(),
            problem,
        })
    }

    /// The manifest as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("manifest serializes");
        out.push(b'\n');
        out
    }

    /// Checks the manifest's internal consistency: unique tensor names, shapes that match their
    /// roles and `max_len`, shard names and indices, and split counts equal to their shards' sums.
    fn validate(&self) -> Result<(), ManifestProblem> {
        if self.format != FORMAT_NAME || !SUPPORTED_VERSIONS.contains(&self.format_version) {
            return Err(ManifestProblem::NotThisFormat {
                found: Some(self.format.clone()),
                version: self.format_version,
            });
        }
        let mut names = BTreeSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(ManifestProblem::DuplicateTensor {
                    tensor: t.name.clone(),
                });
            }
            self.validate_tensor(t)?;
        }
        for required in ["key", "length"] {
            if !names.contains(required) {
                return Err(ManifestProblem::MissingTensor { tensor: required });
            }
        }
        let keys: Vec<&TensorSpec> = self
            .tensors
            .iter()
            .filter(|t| t.role == TensorRole::Key)
            .collect();
        let first = &self.tensors[0];
        if keys.len() != 1 || first.name != "key" || first.role != TensorRole::Key {
            return Err(ManifestProblem::KeyNotFirst {
                first: format!("{:?} ({:?})", first.name, first.role),
                keys: keys.len(),
            });
        }
        let mut split_names = BTreeSet::new();
        for split in &self.splits {
            if !split_names.insert(split.name.as_str()) {
                return Err(ManifestProblem::DuplicateSplit {
                    split: split.name.clone(),
                });
            }
            self.validate_split(split)?;
        }
        if let Some(s) = self
            .shards
            .iter()
            .find(|s| !split_names.contains(s.split.as_str()))
        {
            return Err(ManifestProblem::UnknownSplit {
                file: s.file.clone(),
                split: s.split.clone(),
            });
        }
        Ok(())
    }

    fn validate_tensor(&self, t: &TensorSpec) -> Result<(), ManifestProblem> {
        let expected = t.role.rank();
        if t.sample_shape.len() != expected {
            return Err(ManifestProblem::Rank {
                tensor: t.name.clone(),
                role: t.role,
                shape: t.sample_shape.clone(),
                expected,
            });
        }
        if t.dtype != t.role.dtype() {
            return Err(ManifestProblem::Dtype {
                tensor: t.name.clone(),
                role: t.role,
                found: t.dtype,
                expected: t.role.dtype(),
            });
        }
        let fits = t
            .sample_shape
            .iter()
            .try_fold(t.dtype.size(), |acc, &d| acc.checked_mul(d))
            .is_some_and(|b| b < 1 << 40);
        if !fits {
            return Err(ManifestProblem::ImpossibleShape {
                tensor: t.name.clone(),
                shape: t.sample_shape.clone(),
            });
        }
        // Engine sub-columns carry the engine's one padding step.
        let seq_axis = match t.role {
            TensorRole::Features | TensorRole::Categorical => Some(self.max_len),
            TensorRole::SubColumn => Some(self.max_len.saturating_add(1)),
            _ => None,
        };
        if let Some(expected) = seq_axis.filter(|&e| t.sample_shape[0] != e) {
            return Err(ManifestProblem::SequenceAxis {
                tensor: t.name.clone(),
                found: t.sample_shape[0],
                expected,
                max_len: self.max_len,
            });
        }
        let width = match t.role {
            TensorRole::Features => t.sample_shape[1],
            TensorRole::Targets | TensorRole::ContextFeatures => t.sample_shape[0],
            _ => 1,
        };
        if t.columns.len() != width {
            return Err(ManifestProblem::Columns {
                tensor: t.name.clone(),
                found: t.columns.len(),
                width,
            });
        }
        Ok(())
    }

    fn validate_split(&self, split: &SplitInfo) -> Result<(), ManifestProblem> {
        if split_name_problem(&split.name).is_some() {
            return Err(ManifestProblem::SplitName {
                split: split.name.clone(),
            });
        }
        let listed = self.shards_of(&split.name).count();
        if listed != split.shards {
            return Err(ManifestProblem::SplitShards {
                split: split.name.clone(),
                said: split.shards,
                listed,
            });
        }
        let mut next_first = 0usize;
        for (i, s) in self.shards_of(&split.name).enumerate() {
            let expected = ShardEntry {
                index: i,
                split: split.name.clone(),
                ..s.clone()
            }
            .expected_file();
            if s.index != i || s.file != expected {
                return Err(ManifestProblem::ShardName {
                    file: s.file.clone(),
                    index: s.index,
                    split: split.name.clone(),
                    expected,
                });
            }
            if s.first_context != next_first {
                return Err(ManifestProblem::ShardStart {
                    file: s.file.clone(),
                    found: s.first_context,
                    expected: next_first,
                });
            }
            next_first = next_first.saturating_add(s.contexts);
        }
        if next_first != split.contexts {
            return Err(ManifestProblem::SplitContexts {
                split: split.name.clone(),
                said: split.contexts,
                held: next_first,
            });
        }
        Ok(())
    }

    /// The format version (one of [`SUPPORTED_VERSIONS`]).
    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// The dsc release that wrote the cache.
    pub fn dsc_version(&self) -> &str {
        &self.dsc_version
    }

    /// The padded sequence length `L`.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The splits, `train` first.
    pub fn splits(&self) -> &[SplitInfo] {
        &self.splits
    }

    /// The tensors every shard holds, in storage order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Every shard, by split then index.
    pub fn shards(&self) -> &[ShardEntry] {
        &self.shards
    }

    /// The inputs and their fingerprint.
    pub fn inputs(&self) -> &Inputs {
        &self.inputs
    }

    /// Counts reported by the compile.
    pub fn summary(&self) -> &CompileSummary {
        &self.summary
    }

    /// The resolved compile spec.
    pub fn spec(&self) -> &CompileSpec {
        &self.spec
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The split called `name`.
    pub fn split(&self, name: &str) -> Option<&SplitInfo> {
        self.splits.iter().find(|s| s.name == name)
    }

    /// The shards of one split, in order.
    pub fn shards_of<'a>(&'a self, split: &'a str) -> impl Iterator<Item = &'a ShardEntry> + 'a {
        self.shards.iter().filter(move |s| s.split == split)
    }

    /// The same manifest over `shards` (the same shards stored another way: compressed or
    /// not), validated.
    pub fn with_shards(mut self, shards: Vec<ShardEntry>) -> Result<Manifest, ManifestProblem> {
        self.shards = shards;
        self.validate()?;
        Ok(self)
    }

    /// Bytes per context across all tensors.
    pub fn bytes_per_context(&self) -> usize {
        self.tensors.iter().map(TensorSpec::sample_bytes).sum()
    }
}

/// Assembles the manifest of a compile: the writers give what they wrote, the builder derives
/// every count that follows from it (contexts and shards per split) and validates the whole.
#[derive(Debug, Clone)]
pub struct ManifestBuilder {
    dsc_version: String,
    max_len: usize,
    tensors: Vec<TensorSpec>,
    inputs: Inputs,
    spec: CompileSpec,
    splits: Vec<(String, u64)>,
    shards: Vec<ShardEntry>,
    summary: CompileSummary,
}

impl ManifestBuilder {
    /// Adds a split (after those added before; `train` first) with the source rows it stores
    /// and its shards in index order.
    pub fn split(mut self, name: &str, rows_stored: u64, shards: Vec<ShardEntry>) -> Self {
        self.splits.push((name.to_string(), rows_stored));
        self.shards.extend(shards);
        self
    }

    /// The compile's counts.
    pub fn summary(mut self, summary: CompileSummary) -> Self {
        self.summary = summary;
        self
    }

    /// The manifest, if it satisfies every rule of the format.
    pub fn build(self) -> Result<Manifest, ManifestProblem> {
        let splits = self
            .splits
            .into_iter()
            .map(|(name, rows_stored)| {
                let mine = || self.shards.iter().filter(|s| s.split == name);
                SplitInfo {
                    contexts: mine().map(|s| s.contexts).sum(),
                    shards: mine().count(),
                    rows_stored,
                    name,
                }
            })
            .collect();
        Manifest::try_from(ManifestFields {
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            dsc_version: self.dsc_version,
            max_len: self.max_len,
            splits,
            tensors: self.tensors,
            shards: self.shards,
            inputs: self.inputs,
            summary: self.summary,
            spec: self.spec,
        })
    }
}
