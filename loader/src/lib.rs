//! The dsc loader: opens a compiled cache by memory map and streams batches.
//!
//! This crate is being built in the loader issue; for now it re-exports the format types that
//! training code needs to read a cache's manifest.
#![deny(missing_docs)]

pub use dsc_format::{Manifest, Stats};
