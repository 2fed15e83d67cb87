//! The one-process driver: every step of a recipe over every file and bucket, spilling into the
//! staging folder (or memory, when a quarter of the budget holds the input), then one commit.

use crate::budget;
use crate::commit::{fingerprint_files, stamp_files, CompileOptions, CompileReport, Timer};
use crate::error::{CompileError, Result};
use crate::job::Job;
use crate::phases::Phase;
use crate::recipe::Recipe;
use crate::runs::ValueRuns;
use crate::spill::{self, SpillTo};
use dsc_format::spec::CompileSpec;
use dsc_format::spelling::OptionError;
use std::path::{Path, PathBuf};

/// Runs a compile of `spec` in this process.
pub fn compile(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let result = Job::new(spec).and_then(|job| match job {
        Job::Own(recipe) => run(recipe, opts),
        Job::Profile(recipe) => run(recipe, opts),
    });
    opts.progress.finish();
    result
}

pub(crate) fn run<R: Recipe>(mut recipe: R, opts: &CompileOptions) -> Result<CompileReport> {
    let progress = opts.progress;
    let mut timer = Timer::start();
    if opts.force {
        refuse_inputs_inside(&opts.out, recipe.inputs())?;
    }
    let mut staging = recipe.staging(&opts.out, opts.force)?;
    staging.storage = opts.storage.check()?;
    let stamps = stamp_files(recipe.inputs())?;
    let budget = opts.max_memory.unwrap_or_else(budget::default_budget);
    let dir = staging.dir.join(spill::SPILL_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| CompileError::io(&dir, e))?;

    progress.stage("reading", recipe.files_to_read() as u64);
    let to = |name| SpillTo {
        dir: &dir,
        name,
        buckets: recipe.buckets(),
        budget: budget::read_share(budget),
        // A quarter of the budget may hold the whole spill: then nothing is written.
        in_memory: recipe.decoded_bytes() <= budget / 4,
    };
    let (rows_to, context_to) = (to("rows"), to("context"));
    let rows = recipe.scan(0..recipe.rows_files(), rows_to, progress)?;
    let context = recipe.scan_context(context_to, progress)?;
    let spilled = recipe.spilled(&dir, vec![rows], context)?;
    timer.lap("read");

    let at_once = recipe.at_once(&spilled, budget)?;
    let buckets = 0..recipe.buckets().count();
    progress.stage("statistics", buckets.len() as u64);
    // The sorted values the statistics rank stay in memory with the input they came from, up to
    // an eighth of the budget (the input takes at most a quarter, and the buckets worked on at
    // once are sized to the budget's rest); past it they move to the values file.
    let held = if recipe.decoded_bytes() <= budget / 4 {
        budget / 8
    } else {
        0
    };
    let runs = ValueRuns::in_memory(dir.join("values-0.spill"), 0, held);
    let fit = recipe.fit(&spilled, buckets.clone(), at_once, &runs, progress)?;
    let values = vec![runs.finish()?];
    let fitted = recipe.reduce(&spilled, vec![fit], &values)?;
    timer.lap("statistics");

    progress.stage("writing shards", buckets.len() as u64);
    let written = recipe.write(
        &spilled,
        &fitted,
        &values,
        buckets,
        at_once,
        &staging.dir,
        progress,
    )?;
    timer.lap("write");
    drop((values, spilled));
    std::fs::remove_dir_all(&dir).map_err(|e| CompileError::io(&dir, e))?;
    let inputs = fingerprint_files(recipe.inputs(), &stamps)?;
    let mut report = recipe.finish(fitted, vec![written], inputs, staging, timer, progress)?;
    report.phases = phases_of(&recipe, &report.timings);
    Ok(report)
}

/// The recipe's phases, with the commit: one step on one thread, so its wall time.
fn phases_of<R: Recipe>(recipe: &R, timings: &[(String, f64)]) -> Vec<(String, f64)> {
    let phases = recipe.phases();
    if let Some((_, s)) = timings.iter().find(|(name, _)| name == "commit") {
        phases.add(Phase::Commit, std::time::Duration::from_secs_f64(*s));
    }
    phases.report()
}

/// `--force` replaces the output directory: refuse when that would delete an input.
fn refuse_inputs_inside(out: &Path, inputs: &[(PathBuf, &str)]) -> Result<()> {
    let Ok(out) = out.canonicalize() else {
        return Ok(()); // nothing there yet to replace
    };
    for (input, _) in inputs {
        if input.canonicalize().is_ok_and(|p| p.starts_with(&out)) {
            return Err(OptionError::new(
                "force",
                format!(
                    "would replace {} but the input {} is inside it; choose another `out`",
                    out.display(),
                    input.display()
                ),
            )
            .into());
        }
    }
    Ok(())
}
