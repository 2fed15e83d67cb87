//! The dsc compiler: Parquet rows grouped by a context key become statistics, encodings, a global
//! order and padded safetensors shards, in bounded memory.
//!
//! [`compile`] runs the whole job for a [`CompileSpec`] in one process; [`partition`] runs it as
//! stages on many machines and merges. A compile is a recipe (`own`: dsc's own; [`mostlyai`]:
//! the profile) run by a driver (`local`, [`partition`]); `job` picks the recipe and `recipe`
//! names the steps every driver calls in the same order. The spec stops at the job: `plan`
//! checks it and resolves its columns, `rules` takes what else the stages read of it, and no
//! stage reads the spec itself. The modules of dsc's own recipe follow the data: `spill` (rows
//! files into buckets), `bucket` (group, join contexts, split), `fit` (statistics, encodings),
//! `shards` (layout, encode, write), `write` (staging and commit).
//!
//! ```
//! use dsc_compiler::{compile, CompileOptions, CompileSpec, NoProgress, Storage};
//!
//! # let dir = tempfile::tempdir()?;
//! # let sample = dsc_gen::icecube::IcecubeOptions {
//! #     files: 2, events_per_file: 200, seed: 7, ..Default::default()
//! # };
//! # dsc_gen::icecube::generate(&dir.path().join("data"), &sample)?;
//! // IceCube-like pulses: one row per pulse, grouped into events by `event_id`.
//! let rows = dir.path().join("data/train/batch_*.parquet");
//! let mut spec = CompileSpec::new(vec![rows.display().to_string()], "event_id");
//! spec.features = vec!["time".into(), "charge".into()];
//! spec.encode.insert("charge".into(), "log1p,zscore".into());
//! spec.max_len = Some(64);
//! spec.val_fraction = 0.1;
//! let opts = CompileOptions {
//!     out: dir.path().join("cache"),
//!     force: false,
//!     max_memory: None,
//!     storage: Storage::Hot,
//!     progress: &NoProgress,
//! };
//! let report = compile(&spec, &opts)?;
//! assert_eq!(report.manifest.max_len(), 64);
//! assert!(report.manifest.split("val").is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// One exception, `write::exchange` (renameat2 with RENAME_EXCHANGE: the atomic replacement of a
// cache, which std does not offer); everything else is safe code.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

mod append;
mod bucket;
mod budget;
mod codec;
mod column;
mod commit;
mod drift;
mod encode;
mod error;
mod fit;
mod frozen;
mod group;
mod heap;
mod hidden;
mod job;
mod lineage;
mod lists;
mod local;
mod lookup;
mod memory;
pub mod mostlyai;
mod own;
pub mod partition;
mod phases;
mod plan;
mod progress;
mod read;
mod recipe;
pub mod remote;
mod replaced;
mod retain;
mod rules;
mod runs;
mod shards;
mod spill;
mod split;
mod stats;
mod storage;
mod text;
mod write;

pub use append::{append, compact, AppendInputs, Existing};
pub use codec::Storage;
pub use commit::{CompileOptions, CompileReport};
pub use drift::{ColumnDrift, Drift, LengthDrift};
pub use dsc_format::spec::CompileSpec;
pub use error::{signal_name, CompileError, Result};
pub use heap::keep_freed_memory;
pub use local::compile;
pub use memory::{MemoryInput, MEMORY_PREFIX};
#[cfg(feature = "progress-bar")]
pub use progress::TerminalBars;
pub use progress::{stop_on_signals, Interrupt, NoProgress, Progress};
pub use read::decode_parquet;
pub use replaced::{is_replaced_name, remove_leftover, Replaced};
pub use retain::{gc, tag, GcReport, Keep};
pub use storage::{export, restore, StorageReport};
