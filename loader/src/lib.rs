//! The dsc loader: opens a compiled cache by memory map and streams batches.
//!
//! The modules follow a batch. What is asked: [`args`] (every option by its key, declared once
//! for the command lines and Python), `options` ([`LoaderOptions`], [`Batches`], the resume
//! [`State`]). Where the bytes are: `cache` (a cache opened and validated), `body` (a shard's
//! bytes: mapped, decompressed or fetched), `mmap` and [`sigbus`] (the maps and their one
//! fault), `remote` (caches in object storage, fetched ahead of use) with `fetch_plan` (the
//! order handed to the fetchers), `mix` (several caches read as one, and the order of whole
//! contexts drawn from them). Which contexts, in which order: [`order`] (the epoch's order,
//! the order of series windows, mixes). One epoch, planned once: `prepare` ([`Planned`]: the
//! options checked, the sources opened, then the shape asked) and one room per batch shape,
//! `shape` ([`Batches`]): `padded` (whole contexts, trimmed or not), `bucketed` (contexts of
//! like lengths), `packed` (packs of sequences; their plan is published as [`pack`]) and
//! `windows` (windows of long series), each owning its checks against the caches, its order,
//! its steps, its layout, its gather and its index ([`IndexLayout`]). One batch: `gather` (the
//! shards as every shape reads them: resolved, viewed, laid in blocks, hinted; `rows` copies
//! rows a few at a time), `epoch` (a batch built from the shards, the order and the shape),
//! `batch` (its tensors), `pool` (reused buffers). Handing batches over: `front` (where
//! loaders are made, the same calls on a cache and on a mix), `loader` (threads, queue,
//! iterator, fillers), `handoff` (the queue), `stats` (what a loader did). `error` says what
//! went wrong.
//!
//! ```
//! use dsc_loader::{Cache, LoaderOptions};
//! # let dir = tempfile::tempdir()?;
//! # let sample = dsc_gen::icecube::IcecubeOptions {
//! #     files: 2, events_per_file: 300, seed: 7, ..Default::default()
//! # };
//! # dsc_gen::icecube::generate(&dir.path().join("data"), &sample)?;
//! # let rows = dir.path().join("data/train/batch_*.parquet");
//! # let mut spec = dsc_compiler::CompileSpec::new(vec![rows.display().to_string()], "event_id");
//! # spec.features = vec!["time".into(), "charge".into()];
//! # spec.max_len = Some(64);
//! # dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
//! #     out: dir.path().join("cache"), force: false, max_memory: None,
//! #     storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
//! # })?;
//! let cache = Cache::open(dir.path().join("cache"))?;      // O(shards); validates, then maps
//! let mut loader = cache.loader(LoaderOptions { batch_size: 256, epoch: 0, ..Default::default() })?;
//! let mut seen = 0;
//! for batch in &mut loader {
//!     let batch = batch?;
//!     let x = batch.tensor("x").expect("features");       // f32 [256, L, F], little-endian
//!     assert_eq!(x.shape(), [256, 64, 2]);
//!     seen += batch.size;
//! }
//! assert_eq!(seen, 512);                                   // 600 events: two whole batches
//! let state = loader.state();                              // a few numbers (serde)
//! let resumed = cache.loader_from_state(LoaderOptions::default(), &state)?;
//! assert_eq!(resumed.state(), state);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - **Order**: a pure function of (manifest, seed, epoch, split): shards permuted per epoch and
//!   contexts permuted inside windows of several shards ([`order`]); ranks take disjoint slices
//!   of one global order, so the order does not depend on the number of ranks for a fixed global
//!   batch.
//! - **Batches**: views into mapped memory in cache order, otherwise one gather copy into pooled
//!   buffers, or into the caller's buffers with [`Loader::next_into`] (e.g. pinned memory).
//! - **Threads, not processes**: batches are prepared on background threads with a bounded
//!   queue; the kernel is told what to read ahead and what to release.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod args;
mod batch;
mod body;
mod cache;
mod epoch;
mod error;
#[cfg(feature = "remote")]
mod fetch_plan;
mod front;
mod gather;
mod handoff;
mod loader;
mod mix;
mod mmap;
mod options;
pub mod order;
mod pool;
mod prepare;
mod remote;
mod rows;
mod shape;
pub mod sigbus;
mod stats;

pub use batch::BatchInfo;
pub use batch::{Batch, BatchTensor, TensorLayout};
pub use body::ShardBytes;
pub use cache::Cache;
pub use dsc_format::{Dtype, Manifest, Stats, TensorRole};
pub use error::{LoadError, Misuse};
pub use gather::BLOCK_ALIGN;
pub use loader::{Filler, Loader, MixTracker};
pub use mix::Mix;
pub use options::{
    Batches, LoaderOptions, OrderSpec, Pack, State, DEFAULT_BATCH_SIZE, GPU_TRIM_MULTIPLE,
    MAX_PREFETCH, MAX_THREADS, MAX_TRIM_MULTIPLE,
};
pub use order::{Progress, SeriesWindows, Stage};
pub use prepare::Planned;
#[cfg(feature = "remote")]
pub use remote::{fetch_shards, ShardFile, ShardFiles};
pub use remote::{is_remote, read_meta, RemoteOptions, DEFAULT_FETCH_THREADS};
pub use shape::packed::plan as pack;
pub use shape::packed::PACK_TENSORS;
pub use shape::windows::SERIES_TENSORS;
pub use shape::IndexLayout;
pub use stats::LoaderStats;
