//! The reference training loop on a dsc cache, as a library: the `dsc-train` binary is a thin
//! command line over it, and one's own tch program can use its parts.
//!
//! The modules follow the data: [`feed`] streams batches from the dsc loader into a ring of
//! (pinned) host buffers; [`session`] copies them to the device as [`model::Inputs`] and owns
//! the network ([`model`], its inputs scaled by [`normalise`]), the loss ([`task`]) and the
//! optimizer ([`optim`]); [`train`] and [`diag`] drive a session; [`checkpoint`], [`report`],
//! [`timing`], [`readback`] and [`nvml`] (GPU busy) record what happened. [`device`] and [`cuda`] pick the device and
//! make libtorch's CUDA backend usable; [`alloc`] keeps freed step memory for the next step.
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
pub mod model;
pub mod normalise;
pub mod nvml;
pub mod optim;
pub mod readback;
pub mod report;
pub mod session;
pub mod task;
pub mod timing;
pub mod train;

pub use config::{Amp, ModelKind, RunConfig, Task};
pub use error::{Result, TrainError};
pub use session::Session;
