//! What makes a manifest invalid, and which names a split may have.

use super::*;

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
    /// A shard names a generation this manifest cannot hold: none after the first in a first
    /// generation's manifest, none later than the manifest's own.
    #[error(
        "shard {file}: written by generation {generation}, which generation {number} cannot list"
    )]
    ShardGeneration {
        /// The shard file.
        file: String,
        /// The generation it names.
        generation: u32,
        /// The manifest's generation.
        number: u32,
    },
    /// A generation names a folder that is not one of its own.
    #[error("generation {number} names the folder {folder:?}, not generations/{number:05}-ID (16 hex digits)")]
    GenerationFolder {
        /// The folder named.
        folder: String,
        /// The generation.
        number: u32,
    },
    /// A generation's manifest says another number than its file name.
    #[error("it is generation {found}, its name says {expected}")]
    GenerationNumber {
        /// The number it holds.
        found: u32,
        /// The number of its name.
        expected: u32,
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
    /// An encoded string column's tensor is not as wide as its encoding.
    #[error("tensor {tensor:?} holds {found} values per row where its encoding gives {width}")]
    EncodedWidth {
        /// The tensor.
        tensor: String,
        /// Its last axis.
        found: usize,
        /// What its encoding gives.
        width: usize,
    },
    /// An encoded string column's tensor has another encoding than bits, chars or ngrams.
    #[error(
        "tensor {tensor:?} is an encoded string column without a bits, chars or ngrams encoding"
    )]
    NotEncoded {
        /// The tensor.
        tensor: String,
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
    /// A shard's removed rows are not a list of its rows.
    #[error(
        "shard {file}: its removed rows are not increasing offsets below its {contexts} contexts"
    )]
    Removed {
        /// The shard file.
        file: String,
        /// Its contexts.
        contexts: usize,
    },
    /// A split's context count differs from the sum over its shards.
    #[error(
        "split {split:?} says {said} contexts, its shards hold {held} (not counting hidden ones)"
    )]
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
/// [`ALL_SPLITS`](crate::ALL_SPLITS) for every split together.
pub fn split_name_problem(name: &str) -> Option<&'static str> {
    let safe = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !safe {
        Some("must be non-empty lower-case letters, digits or _ (it becomes part of the shard file names)")
    } else if name == crate::ALL_SPLITS {
        Some("is reserved: stats.json uses it for every split together")
    } else {
        None
    }
}
