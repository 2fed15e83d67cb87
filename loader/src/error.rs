//! Errors of opening and reading a cache.

use dsc_format::spelling::OptionError;
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
         larger `shard_size` for fewer shards, or raise the limit"
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
    /// An option does not fit the cache or the other options: which, and why.
    #[error(transparent)]
    Options(#[from] OptionError),
    /// The cache has no split of this name.
    #[error("{}: no split {split:?} (splits: {splits:?})", dir.display())]
    NoSplit {
        /// The cache.
        dir: PathBuf,
        /// The split asked for.
        split: String,
        /// The cache's splits.
        splits: Vec<String>,
    },
    /// The cache has no tensor of this name.
    #[error("{}: no tensor {tensor:?} to load (tensors: {tensors:?})", dir.display())]
    NoTensor {
        /// The cache.
        dir: PathBuf,
        /// The tensor asked for.
        tensor: String,
        /// The cache's tensors.
        tensors: Vec<String>,
    },
    /// A cache of a mix holds other tensors than the mix's first cache.
    #[error(
        "{}: cannot be mixed with {}: tensor {tensor:?} {problem}",
        dir.display(),
        first.display()
    )]
    Mismatch {
        /// The cache refused.
        dir: PathBuf,
        /// The mix's first cache.
        first: PathBuf,
        /// The tensor that differs.
        tensor: String,
        /// How it differs.
        problem: String,
    },
    /// A split has fewer shards than the index asked for.
    #[error("{}: split {split:?} has no shard {index}", dir.display())]
    NoShard {
        /// The cache.
        dir: PathBuf,
        /// The split.
        split: String,
        /// The shard asked for.
        index: usize,
    },
    /// A resume state does not fit the options or the cache: the field that differs (as the
    /// state's JSON names it), and how.
    #[error("cannot resume: {problem}")]
    State {
        /// The state's field (`seed`, `split`, `global_batch`, …).
        field: String,
        /// What differs.
        problem: String,
    },
    /// A call that breaks the loader's contract (a step outside the epoch, a buffer of the wrong
    /// size): a bug in the caller, not in the options or the cache.
    #[error("{0}")]
    Call(String),
    /// A loader thread could not be started (e.g. a process or container thread limit).
    #[error("cannot start a loader thread: {0}")]
    Threads(std::io::Error),
    /// A cache in object storage could not be read (its URL, and why).
    #[cfg(feature = "remote")]
    #[error(transparent)]
    Store(#[from] dsc_store::StoreError),
    /// A shard of a cache in object storage could not be fetched (a download that failed on
    /// a fetch thread, or a local folder that could not be claimed).
    #[error("{url}: cannot fetch: {reason}")]
    Fetch {
        /// The shard's URL (or the folder's path).
        url: String,
        /// Why.
        reason: String,
    },
    /// A URL was given to a build without object storage support.
    #[error(
        "{url}: this build of dsc reads no object storage (the dsc-loader crate's `remote` \
         feature)"
    )]
    NoRemote {
        /// The URL.
        url: String,
    },
    /// The loader was interrupted ([`crate::Loader::interrupt`]: Ctrl-C, a close) while a
    /// batch waited for a shard downloading from object storage.
    #[error("{url}: the wait for this shard's download was interrupted")]
    Stopped {
        /// The shard's URL.
        url: String,
    },
    /// A prefetch thread stopped unexpectedly (a bug in dsc).
    #[error("a prefetch thread stopped unexpectedly")]
    WorkerLost,
}
