//! Errors of reading and validating a cache.

use std::path::PathBuf;

/// A problem with a cache: every variant names the file it is about and, where it applies, the
/// tensor and the expected and found values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `manifest.json` is missing: the directory is not a (complete) cache.
    #[error(
        "{dir}: not a dsc cache (no manifest.json; a compile that did not finish leaves none)"
    )]
    NotACache {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory is a compile's staging directory (or a replaced cache being removed), not
    /// a committed cache: its contents may be half-written even where a manifest exists.
    #[error(
        "{dir}: the staging directory of an unfinished or killed dsc compile, not a cache; \
         open the `out` directory it was compiling (a new compile removes this one)"
    )]
    NotCommitted {
        /// The directory.
        dir: PathBuf,
    },
    /// The generation asked for is not in the cache.
    #[error("{dir}: no {asked} ({have})")]
    NoGeneration {
        /// The cache.
        dir: PathBuf,
        /// What was asked for: `generation 7`, `tag "x"`, `content id …`.
        asked: String,
        /// What the cache has.
        have: String,
    },
    /// A JSON file did not parse into the expected structure.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error, with line and column.
        source: serde_json::Error,
    },
    /// The manifest parsed but contradicts itself.
    #[error("{path}: invalid manifest: {problem}")]
    InvalidManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is inconsistent.
        problem: crate::manifest::ManifestProblem,
    },
    /// The cache was written by a format version this build cannot read.
    #[error(
        "{path}: format version {found} is not supported (this dsc reads versions {supported})"
    )]
    UnsupportedVersion {
        /// The manifest file.
        path: PathBuf,
        /// The version in the manifest.
        found: u32,
        /// The versions this build reads.
        supported: String,
    },
    /// A shard's size differs from the manifest: truncated, extended or replaced.
    #[error("{shard}: size is {found} bytes, the manifest says {expected}")]
    ShardSize {
        /// The shard file.
        shard: PathBuf,
        /// Size in the manifest.
        expected: u64,
        /// Size on disk.
        found: u64,
    },
    /// A shard's safetensors header is malformed or disagrees with the manifest.
    #[error("{shard}: bad safetensors header: {reason}")]
    ShardHeader {
        /// The shard file.
        shard: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A shard's content hash differs from the manifest.
    #[error(
        "{shard}: checksum mismatch: the manifest says xxh3 {expected}, the file hashes to {found}"
    )]
    Checksum {
        /// The shard file.
        shard: PathBuf,
        /// Hash in the manifest.
        expected: String,
        /// Hash of the file.
        found: String,
    },
    /// A compressed shard does not decompress to the safetensors file the manifest describes.
    #[error("{shard}: cannot decompress: {reason}")]
    Decompress {
        /// The shard file.
        shard: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// `stats.json` does not describe the cache its manifest describes.
    #[error("{path}: {reason}")]
    StatsMismatch {
        /// The statistics file.
        path: PathBuf,
        /// What disagrees.
        reason: String,
    },
    /// A value stored in a shard breaks a rule of the format (length out of bounds, non-zero
    /// padding, a code outside its vocabulary, a value no encoding produces, a repeated key).
    #[error("{shard}: tensor {tensor}, sample {sample}: {reason}")]
    BadValue {
        /// The shard file.
        shard: PathBuf,
        /// The tensor.
        tensor: String,
        /// The sample index within the shard.
        sample: usize,
        /// What is wrong.
        reason: String,
    },
}

impl FormatError {
    /// An I/O failure on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}
