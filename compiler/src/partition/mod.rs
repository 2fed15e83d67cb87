//! Partitioned compiles: the stages of a compile run as separate tasks (a Slurm job array, a
//! Kubernetes Indexed Job, Ray tasks) that share a file system, then `dsc merge` commits.
//!
//! - `scan I/N`: rows files `[I·F/N, (I+1)·F/N)` read and spilled into buckets;
//! - `fit I/N`: buckets `[I·B/N, (I+1)·B/N)` grouped and summarised (after every scan);
//! - `write I/N`: every fit merged (each task computes the same merge), the task's buckets
//!   encoded and written as their shards (after every fit);
//! - `merge`: every part checked, `stats.json`, then `manifest.json`, then one rename.
//!
//! Everything lives in a work folder beside the output (`.NAME.dsc-work`). Each part is written
//! under a temporary name and renamed, under a fixed name: a retried or duplicated task writes
//! the same bytes, a killed one leaves nothing a later stage would read. Every part carries the
//! plan's fingerprint (spec, partition count, every input's size and modification time), so
//! parts of another compile, or of inputs changed since, are refused by name. Nothing is a cache
//! until `merge` writes the manifest; the cache is byte-identical to a compile in one process.
//!
//! Nothing a stage reads is trusted: the plan and every part end in a checksum line; spill
//! pieces carry checksums checked when read, a fit's values file and a write's shards are
//! hashed whole against what their part recorded; the side files (context and join tables,
//! key files) are hashed by the last scan and checked by every later stage, since their size
//! and modification time can survive a rewrite. The files a scan or fit writes are named after
//! their attempt and listed by its part, so a retried task killed after writing its files but
//! before renaming its part leaves the earlier attempt's part with the earlier attempt's files.

mod work;

use crate::budget;
use crate::commit::{self, CompileReport, Timer};
use crate::error::{CompileError, Result};
use crate::job::Job;
use crate::recipe::Recipe;
use crate::write::sibling;
use crate::Progress;
use dsc_format::CompileSpec;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};
use work::{attempt, scan_to, with_values, ScanBody, Work};
pub use work::{status, Status};

/// The stages a partition runs, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Read rows files and spill them into buckets.
    Scan,
    /// Group buckets and summarise their statistics.
    Fit,
    /// Encode buckets and write their shards.
    Write,
}

dsc_format::choice!(Stage, "stage", { Scan => "scan", Fit => "fit", Write => "write" });

/// Partition `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Which partition, from 0.
    pub index: usize,
    /// How many.
    pub count: usize,
}

impl Partition {
    /// Parses `I/N` (0 ≤ I < N).
    pub fn parse(text: &str) -> std::result::Result<Partition, String> {
        let (i, n) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not I/N (e.g. 0/4)"))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| format!("{i:?} is not a number"))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("{n:?} is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("partition {index} of {count}: need 0 <= I < N"));
        }
        Ok(Partition { index, count })
    }

    /// The partition from the scheduler's environment: a Slurm job array
    /// (`SLURM_ARRAY_TASK_ID` from `SLURM_ARRAY_TASK_MIN`, `SLURM_ARRAY_TASK_COUNT`) or a
    /// Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`, with the count given as `count`).
    pub fn from_env(
        count: Option<usize>,
        env: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<Partition, String> {
        let num = |name: &str| -> std::result::Result<Option<usize>, String> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("{name}={v:?} is not a number"))
                })
                .transpose()
        };
        let (index, count) = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let n = match (num("SLURM_ARRAY_TASK_COUNT")?, count) {
                (Some(n), Some(given)) if n != given => {
                    return Err(format!(
                        "SLURM_ARRAY_TASK_COUNT is {n} but auto/{given} was given"
                    ))
                }
                (Some(n), _) => n,
                (None, Some(given)) => given,
                (None, None) => return Err("SLURM_ARRAY_TASK_COUNT is not set; give auto/N".into()),
            };
            if id < min {
                return Err(format!(
                    "SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"
                ));
            }
            (id - min, n)
        } else if let Some(i) = num("JOB_COMPLETION_INDEX")? {
            let n = count.ok_or(
                "JOB_COMPLETION_INDEX gives the index only: give the count as auto/N \
                 (the Job's spec.completions)",
            )?;
            (i, n)
        } else {
            return Err(
                "`partition=auto` needs a Slurm job array (SLURM_ARRAY_TASK_ID) or a \
                 Kubernetes Indexed Job (JOB_COMPLETION_INDEX) in the environment"
                    .into(),
            );
        };
        Partition::parse(&format!("{index}/{count}"))
    }

    /// This partition's share of `0..total`: contiguous, in order, every item once.
    fn share(&self, total: usize) -> Range<usize> {
        total * self.index / self.count..total * (self.index + 1) / self.count
    }
}

/// The work folder of a partitioned compile into `out`.
pub fn work_dir(out: &Path) -> PathBuf {
    sibling(out, "dsc-work")
}

/// What a stage task did.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// The stage run.
    pub stage: Stage,
    /// The partition, from 0.
    pub partition: usize,
    /// The partition count.
    pub partitions: usize,
    /// Rows files (scan) or buckets (fit, write) this task handled.
    pub items: usize,
    /// Wall time.
    pub seconds: f64,
    /// Thread-seconds per phase of this task, summed over its threads, in flow order (every
    /// phase, zero where the stage has none of it).
    pub phases: Vec<(String, f64)>,
}

/// Runs one stage of one partition of a compile of `spec` into `out`.
pub fn run_stage(
    spec: &CompileSpec,
    out: &Path,
    max_memory: Option<u64>,
    partition: Partition,
    stage: Stage,
    progress: &dyn Progress,
) -> Result<StageReport> {
    let start = std::time::Instant::now();
    let budget = max_memory.unwrap_or_else(budget::default_budget);
    let (items, phases) = match Job::new(spec)? {
        Job::Own(recipe) => self::stage(recipe, spec, out, budget, partition, stage, progress)?,
        Job::Profile(recipe) => self::stage(recipe, spec, out, budget, partition, stage, progress)?,
    };
    progress.finish();
    Ok(StageReport {
        stage,
        partition: partition.index,
        partitions: partition.count,
        items,
        seconds: start.elapsed().as_secs_f64(),
        phases,
    })
}

/// One stage of one partition of a recipe's compile; returns the items (files or buckets) it
/// handled and its phases.
fn stage<R: Recipe>(
    mut recipe: R,
    spec: &CompileSpec,
    out: &Path,
    budget: u64,
    partition: Partition,
    stage: Stage,
    progress: &dyn Progress,
) -> Result<(usize, Vec<(String, f64)>)> {
    let work = Work::open(out, spec, partition.count, recipe.inputs())?;
    let rows_files = recipe.rows_files();
    if stage == Stage::Scan {
        let files = partition.share(rows_files);
        progress.stage("reading", files.len() as u64);
        let attempt = attempt();
        let rows_name = format!("rows-{attempt}");
        let to = scan_to(&work, recipe.buckets(), &rows_name, budget);
        let spill = recipe.scan(files.clone(), to, progress)?;
        let inputs = commit::hash_files(&recipe.inputs()[files.clone()])?;
        // The last partition also spills the context table, once for every stage, and records
        // what every side file holds.
        let (context, side) = if partition.index + 1 == partition.count {
            let context_name = format!("context-{attempt}");
            let to = scan_to(&work, recipe.buckets(), &context_name, budget);
            let context = recipe.scan_context(to, progress)?;
            (context, commit::hash_files(&recipe.inputs()[rows_files..])?)
        } else {
            (None, Vec::new())
        };
        let body = ScanBody {
            spill,
            inputs,
            context,
            side,
        };
        work.write_part(Stage::Scan, partition, body, Vec::new())?;
        return Ok((files.len(), recipe.phases().report()));
    }
    let scans = work.scans(recipe.inputs(), rows_files)?;
    let spilled = work.spilled(&mut recipe, scans)?;
    let at_once = recipe.at_once(&spilled, budget)?;
    let buckets = partition.share(recipe.buckets().count());
    if stage == Stage::Fit {
        progress.stage("statistics", buckets.len() as u64);
        let (part, values) = with_values(&work, partition.index, |runs| {
            recipe.fit(&spilled, buckets.clone(), at_once, runs, progress)
        })?;
        work.write_part(Stage::Fit, partition, part, vec![values])?;
    } else {
        let (fits, values) = work.fits::<R::FitPart>()?;
        let fitted = recipe.reduce(&spilled, fits, &values)?;
        progress.stage("writing shards", buckets.len() as u64);
        let part = recipe.write(
            &spilled,
            &fitted,
            &values,
            buckets.clone(),
            at_once,
            &work.dir,
            progress,
        )?;
        work.write_part(Stage::Write, partition, part, Vec::new())?;
    }
    Ok((buckets.len(), recipe.phases().report()))
}

/// Commits a partitioned compile into `out` once every partition has run every stage: checks
/// every part, writes `stats.json` and `manifest.json`, moves the shards in and renames the
/// cache into place; then removes the work folder.
pub fn merge(
    out: &Path,
    force: bool,
    storage: crate::Storage,
    progress: &dyn Progress,
) -> Result<CompileReport> {
    let storage = storage.check()?;
    let timer = Timer::start();
    let work = Work::existing(out)?;
    let spec = work.plan.spec.clone();
    let report = match Job::new(&spec)? {
        Job::Own(recipe) => merge_with(recipe, &work, out, force, storage, timer, progress)?,
        Job::Profile(recipe) => merge_with(recipe, &work, out, force, storage, timer, progress)?,
    };
    progress.advance(1);
    progress.finish();
    std::fs::remove_dir_all(&work.dir).map_err(|e| CompileError::io(&work.dir, e))?;
    Ok(report)
}

/// The merge of a recipe's parts: every part checked, then the recipe's statistics and
/// manifest over them, committed.
fn merge_with<R: Recipe>(
    mut recipe: R,
    work: &Work,
    out: &Path,
    force: bool,
    storage: crate::Storage,
    timer: Timer,
    progress: &dyn Progress,
) -> Result<CompileReport> {
    let (scans, writes, mut staging) =
        work.start_merge(out, force, (recipe.inputs(), recipe.rows_files()), progress)?;
    staging.storage = storage;
    let inputs = work.merge_inputs(&scans, &writes, &staging)?;
    let spilled = work.spilled(&mut recipe, scans)?;
    let (fits, values) = work.fits::<R::FitPart>()?;
    let fitted = recipe.reduce(&spilled, fits, &values)?;
    drop((spilled, values));
    recipe.finish(fitted, writes, inputs, staging, timer, progress)
}
