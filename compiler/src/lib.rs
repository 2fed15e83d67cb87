//! The dsc compiler: Parquet rows grouped by a context key become statistics, encodings, a global
//! shuffle and padded safetensors shards.
//!
//! [`compile`] runs the whole job for a [`CompileSpec`]; [`gen`] writes the sample data sets used
//! by the README, the tests and the benchmarks.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod column;
mod encode;
mod error;
pub mod gen;
mod group;
mod lookup;
pub mod mostlyai;
mod pipeline;
mod plan;
mod read;
mod stats;
mod write;

pub use dsc_format::spec::CompileSpec;
pub use error::{CompileError, Result};
pub use pipeline::{compile, decode_parquet, CompileOptions, CompileReport};

/// Receives progress of a long compile. Every method has an empty default.
pub trait Progress: Sync {
    /// A stage begins; `total` units of work are expected (0 when unknown).
    fn stage(&self, _name: &str, _total: u64) {}
    /// `n` more units of the current stage are done.
    fn advance(&self, _n: u64) {}
    /// The compile has finished or failed.
    fn finish(&self) {}
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}
