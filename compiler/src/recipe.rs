//! What a compile computes, apart from how it is run. A compile is a recipe (dsc's own, in
//! `own`; the mostlyai profile, in `mostlyai`) run by a driver: `local` runs every step in one
//! process, `partition` runs them as scan, fit and write stages on many machines and merges.
//! The drivers write the stage order once each and own everything around it (the staging
//! folder, the budget, spill and values files, the work folder's parts); a recipe supplies the
//! steps, each over a range of rows files or buckets so that a driver can split it.
//!
//! The steps, in the order both drivers call them:
//!
//! 1. [`Recipe::scan`] spills a range of rows files into the buckets, and
//!    [`Recipe::scan_context`] the context table (once);
//! 2. [`Recipe::spilled`] assembles what every scan spilled, ready to read by bucket;
//! 3. [`Recipe::fit`] summarises a range of buckets (its part goes to JSON between stages);
//! 4. [`Recipe::reduce`] merges every fit part into the fitted encodings and layout;
//! 5. [`Recipe::write`] encodes a range of buckets and writes their shards;
//! 6. [`Recipe::finish`] builds the statistics and manifest from every write and commits.

use crate::commit::{CompileReport, Timer};
use crate::error::Result;
use crate::lookup::ContextPart;
use crate::phases::Phases;
use crate::runs::{RunsFile, ValueRuns};
use crate::shards::WritePart;
use crate::spill::{Buckets, SpillPart, SpillTo};
use crate::write::Staging;
use crate::Progress;
use dsc_format::manifest::Inputs;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The steps of one kind of compile, built from its spec with every input's footer open.
pub(crate) trait Recipe {
    /// Every spilled table, read bucket by bucket by the later steps.
    type Spilled;
    /// What the statistics pass found in a range of buckets; partition stages keep it as JSON.
    type FitPart: Serialize + DeserializeOwned;
    /// Every fit part merged: the fitted encodings and the layout the writes follow.
    type Fitted;

    /// Every file the cache depends on, with its role: the rows files first, in order, then
    /// the side files (context and join tables, key files).
    /// The staging folder the compile writes into: by default beside `out`, replacing it at
    /// the commit with `force`.
    fn staging(&mut self, out: &Path, force: bool) -> Result<Staging> {
        Staging::create(out, force)
    }

    fn inputs(&self) -> &[(PathBuf, &'static str)];
    /// How many of [`Recipe::inputs`] are rows files.
    fn rows_files(&self) -> usize;
    /// How many files a whole scan reads (the progress bar's length).
    fn files_to_read(&self) -> usize;
    /// The buckets rows are spilled into.
    fn buckets(&self) -> Buckets;
    /// Whether the compile reads a context table, which [`Recipe::scan_context`] must spill.
    fn has_context(&self) -> bool;
    /// Decoded bytes of every table read: a one-process compile keeps its spill in memory when
    /// a quarter of its budget holds them.
    fn decoded_bytes(&self) -> u64;

    /// Spills rows files `files` (indices into [`Recipe::inputs`]) into the buckets. A recipe
    /// is scanned once: the opened files are handed to the spill.
    fn scan(
        &mut self,
        files: Range<usize>,
        to: SpillTo,
        progress: &dyn Progress,
    ) -> Result<SpillPart>;
    /// Spills the context table, where there is one.
    fn scan_context(&mut self, to: SpillTo, progress: &dyn Progress)
        -> Result<Option<ContextPart>>;
    /// What the scans spilled into `dir`: every rows part in file order, and the context's.
    fn spilled(
        &mut self,
        dir: &Path,
        rows: Vec<SpillPart>,
        context: Option<ContextPart>,
    ) -> Result<Self::Spilled>;

    /// How many buckets may be in memory at once under `budget`.
    fn at_once(&self, spilled: &Self::Spilled, budget: u64) -> Result<usize>;
    /// The statistics pass over `buckets`; sorted values go to `runs`.
    fn fit(
        &self,
        spilled: &Self::Spilled,
        buckets: Range<usize>,
        at_once: usize,
        runs: &ValueRuns,
        progress: &dyn Progress,
    ) -> Result<Self::FitPart>;
    /// Every fit part, in bucket order, merged; `values` are their values files, in order.
    fn reduce(
        &self,
        spilled: &Self::Spilled,
        fits: Vec<Self::FitPart>,
        values: &[RunsFile],
    ) -> Result<Self::Fitted>;
    /// The shards pass over `buckets`, written into `dir`.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        spilled: &Self::Spilled,
        fitted: &Self::Fitted,
        values: &[RunsFile],
        buckets: Range<usize>,
        at_once: usize,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<WritePart>;
    /// Where this compile's time goes, phase by phase.
    fn phases(&self) -> &Phases;
    /// Statistics and manifest from every write part, in bucket order; the cache committed.
    fn finish(
        &self,
        fitted: Self::Fitted,
        written: Vec<WritePart>,
        inputs: Inputs,
        staging: Staging,
        timer: Timer,
        progress: &dyn Progress,
    ) -> Result<CompileReport>;
}
