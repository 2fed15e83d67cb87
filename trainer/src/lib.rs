//! The reference training loop on a dsc cache, as a library: the `dsc-train` binary is a thin
//! command line over it, and one's own tch program can use its parts.
//!
//! The modules follow the data: [`feed`] streams batches from the dsc loader into a ring of
//! (pinned) host buffers; [`session`] copies them to the device as [`model::Inputs`] and owns
//! the network ([`model`], its inputs scaled by [`normalise`]), the loss ([`task`]) and the
//! optimizer ([`optim`]); [`step`] launches a training step, eagerly or as CUDA graphs
//! ([`graph`]); [`train`] and [`diag`] drive a session; [`checkpoint`], [`report`],
//! [`timing`], [`readback`] and [`nvml`] (GPU busy) record what happened. [`device`] and [`cuda`] pick the device and
//! make libtorch's CUDA backend usable, [`machine`] records what a run chose from its machine; [`alloc`] keeps freed step memory for the next step.
//!
//! Can a small network learn from a cache? Overfit one batch of it:
//!
//! ```
//! use dsc_train::{diag, RunConfig, Session, Task};
//!
//! # let dir = tempfile::tempdir()?;
//! # let sample = dsc_gen::icecube::IcecubeOptions {
//! #     files: 1, events_per_file: 200, seed: 7, ..Default::default()
//! # };
//! # dsc_gen::icecube::generate(&dir.path().join("data"), &sample)?;
//! # let data = dir.path().join("data");
//! # let rows = data.join("train/batch_*.parquet");
//! # let mut spec = dsc_compiler::CompileSpec::new(vec![rows.display().to_string()], "event_id");
//! # spec.features = vec!["time".into(), "charge".into(), "auxiliary".into()];
//! # spec.context = Some(data.join("train_meta.parquet").display().to_string());
//! # spec.targets = vec!["azimuth".into(), "zenith".into()];
//! # spec.max_len = Some(32);
//! # dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
//! #     out: dir.path().join("cache"), force: false, max_memory: None,
//! #     storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
//! # })?;
//! // A cache of IceCube-like events whose targets are two angles.
//! let mut cfg = RunConfig::new(dir.path().join("cache"), Task::Regression);
//! (cfg.dim, cfg.layers, cfg.heads, cfg.batch.batch_size) = (32, 1, 2, 16);
//! let session = Session::new(cfg, tch::Device::Cpu, 2)?;   // validates, opens the cache
//! let summary = diag::overfit_batch(session, 300)?;
//! assert_eq!(summary.overfit_passed, Some(true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod alloc;
pub mod checkpoint;
pub mod config;
pub mod cuda;
pub mod device;
pub mod diag;
pub mod error;
pub mod feed;
pub mod graph;
pub mod machine;
pub mod model;
pub mod normalise;
pub mod nvml;
pub mod optim;
pub mod readback;
pub mod report;
pub mod session;
pub mod step;
pub mod task;
pub mod timing;
pub mod train;

pub use config::{Amp, ModelKind, RunConfig, Task};
pub use error::{Result, TrainError};
pub use session::Session;
