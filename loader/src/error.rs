//! Errors of opening and reading a cache.

use std::path::PathBuf;

/// Why a cache could not be opened or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The cache failed validation (manifest, shard size or header).
    #[error(transparent)]
    Format(#[from] dsc_format::FormatError),
    /// A shard could not be opened or mapped.
    #[error("{path}: cannot map: {source}")]
    Map {
        /// The shard file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The kernel refused another memory map (its per-process map limit, or an address-space
    /// limit), typically for a cache of very many shards.
    #[error(
        "{path}: cannot map: {source}: the kernel refused another memory map, with {mapped} of \
         the cache's {shards} shards mapped (this system allows {max_map_count} maps per process, \
         `vm.max_map_count`; an address-space limit, `ulimit -v`, also counts); compile with a \
         larger --shard-size for fewer shards, or raise the limit"
    )]
    OutOfMaps {
        /// The shard that could not be mapped.
        path: PathBuf,
        /// The error (ENOMEM).
        source: std::io::Error,
        /// Shards mapped before it.
        mapped: usize,
        /// Shards in the cache.
        shards: usize,
        /// `/proc/sys/vm/max_map_count`, or "an unknown number".
        max_map_count: String,
    },
    /// The options do not fit the cache.
    #[error("{0}")]
    Options(String),
    /// A resume state does not fit the options or the cache.
    #[error("cannot resume: {0}")]
    State(String),
    /// A loader thread could not be started (e.g. a process or container thread limit).
    #[error("cannot start a loader thread: {0}")]
    Threads(std::io::Error),
    /// A prefetch thread stopped unexpectedly (a bug in dsc).
    #[error("a prefetch thread stopped unexpectedly")]
    WorkerLost,
}
