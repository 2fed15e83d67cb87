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
