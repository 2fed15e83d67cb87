//! The on-disk contract of a dsc cache.
//!
//! A cache is a directory holding `manifest.json` (the commit point), `stats.json` and
//! `shards/{split}-{NNNNN}.safetensors`. This crate owns the types of those files, the shard
//! naming and layout, their validation and checksums, and the seeded generators that fix every
//! order in a cache (and, in `system`, the machine's memory both size themselves by). The compiler
//! writes through it and the loader reads through it; they never import each other. The normative description is `docs/FORMAT.md`.
//!
//! A shard is a safetensors file whose header this crate writes and reads back; every tensor
//! holds `n` contexts of its sample shape:
//!
//! ```
//! use dsc_format::shard::{build_header, read_layout, ShardMeta};
//! use dsc_format::{Dtype, TensorRole, TensorSpec};
//!
//! // `x`: 3 steps of 2 features per context, 10 contexts.
//! let x = TensorSpec {
//!     name: "x".into(),
//!     dtype: Dtype::F32,
//!     role: TensorRole::Features,
//!     sample_shape: vec![3, 2],
//!     columns: Vec::new(),
//! };
//! let meta = ShardMeta { split: "train", index: 0, first_context: 0, profile: None };
//! let (mut bytes, layout) = build_header(&[x], 10, &meta);
//! assert_eq!(layout.tensors[0].shape, [10, 3, 2]);
//! bytes.resize(bytes.len() + 10 * 3 * 2 * 4, 0);
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("train-00000.safetensors");
//! std::fs::write(&path, &bytes)?;
//! assert_eq!(read_layout(&path)?, layout);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod checksum;
pub mod choice;
mod error;
pub mod failpoint;
pub mod generation;
mod identity;
pub mod keys;
pub mod manifest;
mod manifest_file;
pub mod rng;
pub mod sample;
pub mod shard;
pub mod spec;
pub mod spelling;
pub mod stats;
pub mod stored;
pub mod system;
pub mod verify;

pub use error::FormatError;
pub use generation::GenerationRef;
pub use manifest::{
    Codec, ColumnSource, ColumnSpec, Compressed, Dtype, Encoding, KeyTableEntry, Manifest,
    ManifestBuilder, ManifestProblem, ShardEntry, SplitInfo, Stage, TensorRole, TensorSpec,
};
pub use spec::CompileSpec;
pub use stats::Stats;

/// The format version this build writes.
pub const FORMAT_VERSION: u32 = 2;
/// The value of the manifest's `format` field.
pub const FORMAT_NAME: &str = "dsc-cache";
/// The manifest's file name inside a cache directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The statistics file's name inside a cache directory.
pub const STATS_FILE: &str = "stats.json";
/// The name of the `stats.json` entry over every split together; no split may take it (here,
/// beside the other names of the format, for both the manifest's split rule and `stats`).
pub const ALL_SPLITS: &str = "all";
/// The folder holding the generations after the first (FORMAT.md §14).
pub const GENERATIONS_DIR: &str = "generations";
/// The folder holding the shards.
pub const SHARDS_DIR: &str = "shards";
/// A compile into `NAME` writes into the sibling `.NAME.dsc-partial` and renames it to `NAME` as
/// its last step; readers refuse directories named so ([`FormatError::NotCommitted`]).
pub const STAGING_SUFFIX: &str = "dsc-partial";
/// A replaced cache, under the sibling name `.NAME.dsc-old` while it is removed.
pub const REPLACED_SUFFIX: &str = "dsc-old";
