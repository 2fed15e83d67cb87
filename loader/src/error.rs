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
    #[error(transparent)]
    Call(#[from] Misuse),
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

/// How a call broke the loader's contract ([`LoadError::Call`]): each names the figures a
/// caller needs to find its bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misuse {
    /// A step number past the end of the epoch.
    #[error("step {step} of an epoch of {steps} steps")]
    StepOutOfEpoch {
        /// The step asked for.
        step: usize,
        /// Steps in the epoch.
        steps: usize,
    },
    /// Not one buffer per tensor.
    #[error("{given} buffers for {tensors} tensors")]
    BufferCount {
        /// Buffers given.
        given: usize,
        /// Tensors of the batch.
        tensors: usize,
    },
    /// A buffer smaller than its tensor.
    #[error("a buffer of {bytes} bytes for a tensor of {need}")]
    BufferTooSmall {
        /// The buffer's bytes.
        bytes: usize,
        /// The tensor's bytes.
        need: usize,
    },
    /// A block smaller than the batch it should hold.
    #[error("a block of {bytes} bytes for a batch of {need}")]
    BlockTooSmall {
        /// The block's bytes.
        bytes: usize,
        /// The batch's bytes.
        need: usize,
    },
    /// A positions buffer that is not 8 bytes per row of the batch.
    #[error("{bytes} bytes of positions for {rows} rows of 8")]
    Positions {
        /// The buffer's bytes.
        bytes: usize,
        /// Rows of the batch.
        rows: usize,
    },
    /// A token rows buffer that is not 8 bytes per token of the pack.
    #[error("{bytes} bytes of token rows for {tokens} tokens of 8")]
    TokenRows {
        /// The buffer's bytes.
        bytes: usize,
        /// Tokens of the pack.
        tokens: usize,
    },
    /// `fill_rows` without its positions and token rows buffers.
    #[error("fill_rows needs a positions and a token rows buffer")]
    FillRowsBuffers,
    /// Rows indexed into one cache from a mix, whose batches come from several.
    #[error("a mix's batches are gathered from its caches, not indexed into one")]
    MixNotIndexed,
    /// Rows indexed by context from series windows, which are cut from the shards.
    #[error("series windows are gathered from the shards, not indexed by context")]
    SeriesNotIndexed,
    /// The padding figures of a packed loader.
    #[error("a packed loader has no padded batches: ask its packs for their figures")]
    NoPaddedBatches,
    /// A mix of nothing.
    #[error("a mix of no caches")]
    EmptyMix,
}
