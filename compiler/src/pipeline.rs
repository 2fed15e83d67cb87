//! The compile, stage by stage: plan → read and spill into buckets → per bucket: group, join
//! contexts, split, partial statistics → merge statistics, fit encodings → per bucket: group
//! again, encode, write its shards → stats.json → manifest.json → commit.

use crate::bucket::ColumnId;
use crate::bucket::{RowColumn, Shared};
use crate::budget;
use crate::cache::{
    commit_cache, fingerprint_files, stamp_files, CompileOptions, CompileReport, Timer,
};
use crate::error::{CompileError, Result};
use crate::fit::{self, Merged};
use crate::lookup::{self, ContextPart, ContextSide, Keyed};
use crate::plan::{self, Source};
use crate::read::{self, Role};
use crate::runs::ValueRuns;
use crate::shards::{self, Layout, WritePart};
use crate::spill::{self, Buckets, Described, Spill, SpillTo};
use crate::split;
use crate::write::Staging;
use dsc_format::manifest::Inputs;
use dsc_format::spec::{CompileSpec, DEFAULT_BUCKET_SIZE};
use dsc_format::{Manifest, ShardEntry, Stage};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// Decodes the named columns of Parquet files and discards them: the floor a compile is
/// measured against. Returns the rows decoded.
pub fn decode_parquet(files: &[PathBuf], columns: &[String]) -> Result<u64> {
    let rows: Vec<u64> = files
        .par_iter()
        .map(|path| {
            let opened = read::open(path)?;
            let indices: Vec<usize> = columns
                .iter()
                .map(|c| {
                    opened
                        .schema
                        .index_of(c)
                        .map_err(|_| CompileError::MissingColumn {
                            path: path.clone(),
                            column: c.clone(),
                            role: "a decoded column".into(),
                            available: read::column_list(&opened.schema),
                        })
                })
                .collect::<Vec<Result<_>>>()
                .into_iter()
                .collect::<Result<_>>()?;
            let mut n = 0u64;
            for batch in opened.into_reader(&indices)? {
                n += batch
                    .map_err(|e| CompileError::BadParquet {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?
                    .num_rows() as u64;
            }
            Ok(n)
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    Ok(rows.iter().sum())
}

/// Runs a compile.
pub fn compile(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let result = check_profile(spec).and_then(|()| match spec.profile {
        None => run(spec, opts),
        Some(_) => crate::mostlyai::compile(spec, opts),
    });
    opts.progress.finish();
    result
}

/// Refuses an unknown profile, and the profile's options without it.
pub(crate) fn check_profile(spec: &CompileSpec) -> Result<()> {
    match spec.profile.as_deref() {
        None if spec.val_keys.is_some() || spec.partitions.is_some() => Err(CompileError::Spec(
            format!(
                "val_keys (--val-keys) and partitions (--partitions) only apply with the {:?} profile",
                crate::mostlyai::PROFILE
            ),
        )),
        None | Some(crate::mostlyai::PROFILE) => Ok(()),
        Some(other) => Err(CompileError::Spec(format!(
            "unknown profile {other:?} (known: {:?})",
            crate::mostlyai::PROFILE
        ))),
    }
}

/// Everything every stage of a compile reads the same way, before any bucket is touched: the
/// plan, the inputs' footers, the side tables (context table, joins) and the buckets.
pub(crate) struct Setup<'s> {
    pub spec: &'s CompileSpec,
    pub plan: plan::Plan,
    pub named_inputs: Vec<(PathBuf, &'static str)>,
    pub inputs: Option<read::Inputs>,
    pub joins: Vec<Keyed>,
    /// The context table, once spilled ([`Setup::spill_context`], [`Setup::attach_context`]).
    pub context: Option<ContextSide>,
    pub buckets: Buckets,
    pub width: u64,
    pub rows_read: u64,
    chains: Vec<Vec<Stage>>,
    context_chains: Vec<Vec<Stage>>,
}

impl<'s> Setup<'s> {
    /// Plans `spec`, checks its encodings, opens every rows file's footer and reads the side
    /// tables.
    pub fn new(spec: &'s CompileSpec) -> Result<Setup<'s>> {
        let plan = plan::plan(spec)?;
        let mut chains = Vec::new();
        for rc in &plan.row_columns {
            let chain = if rc.categorical {
                Vec::new()
            } else {
                chain_of(spec, &rc.name)?
            };
            fit::unfitted_prefix(&rc.name, &chain)?;
            chains.push(chain);
        }
        let mut context_chains = Vec::new();
        for name in spec.targets.iter().chain(&spec.context_features) {
            let chain = chain_of(spec, name)?;
            fit::unfitted_prefix(name, &chain)?;
            context_chains.push(chain);
        }
        let named_inputs = input_files(spec, &plan.rows_files);
        Ok(Setup {
            spec,
            named_inputs,
            inputs: None,
            joins: Vec::new(),
            context: None,
            buckets: Buckets { bits: 0, seed: 0 },
            width: 0,
            rows_read: 0,
            chains,
            context_chains,
            plan,
        })
    }

    /// Opens every rows file (footers), sizes the buckets and reads the side tables.
    pub fn open(&mut self) -> Result<()> {
        let spec = self.spec;
        let inputs = read::open_all(&self.plan.rows_files, &self.plan.rows_wants)?;
        self.rows_read = *inputs.offsets.last().unwrap_or(&0);
        self.width = spill::row_width(&inputs.types);
        self.buckets = Buckets::for_size(
            self.rows_read * self.width,
            spec.bucket_size.unwrap_or(DEFAULT_BUCKET_SIZE),
            spec.seed,
        );
        self.inputs = Some(inputs);
        self.joins = self
            .plan
            .joins
            .iter()
            .map(|(path, on, wants)| lookup::read_keyed(path, on, Role::JoinOn, wants))
            .collect::<Vec<Result<_>>>()
            .into_iter()
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// The opened rows files, to be read, and what describes them (paths, first rows, types).
    pub fn take_inputs(&mut self) -> (read::Inputs, Described) {
        let inputs = self.inputs.take().expect("opened");
        let described = Described {
            files: inputs.opened.iter().map(|o| o.path.clone()).collect(),
            offsets: inputs.offsets.clone(),
            types: inputs.types.clone(),
        };
        (inputs, described)
    }

    /// Spills the context table (if any) into the buckets, in `dir`.
    pub fn spill_context(
        &self,
        (dir, name): (&Path, &str),
        budget: u64,
    ) -> Result<Option<ContextPart>> {
        let Some(path) = &self.spec.context else {
            return Ok(None);
        };
        lookup::spill_context(
            Path::new(path),
            &lookup::context_wants(self.spec),
            self.spec.split_by.as_deref(),
            self.buckets,
            budget::read_share(budget),
            (dir, name),
        )
        .map(Some)
    }

    /// Reads the context table back from what [`Setup::spill_context`] wrote in `dir`.
    pub fn attach_context(&mut self, dir: &Path, part: Option<ContextPart>) -> Result<()> {
        if let (Some(path), Some(part)) = (&self.spec.context, part) {
            self.context = Some(ContextSide::new(
                Path::new(path),
                self.spec.context_key(),
                lookup::context_wants(self.spec),
                part,
                self.buckets,
                dir,
            )?);
        }
        Ok(())
    }

    /// What each bucket shares, over the spilled rows `spill`.
    pub fn shared<'a>(&'a self, spill: &'a Spill, splits: &'a split::Splits<'a>) -> Shared<'a> {
        let spec = self.spec;
        Shared {
            spec,
            spill,
            context: self.context.as_ref(),
            splits,
            columns: self
                .plan
                .row_columns
                .iter()
                .zip(&self.chains)
                .map(|(rc, chain)| RowColumn {
                    name: &rc.name,
                    join: match rc.source {
                        Source::Rows => None,
                        Source::Join(j) => Some(&self.joins[j]),
                    },
                    categorical: rc.categorical,
                    chain: chain.clone(),
                })
                .collect(),
            context_columns: spec
                .targets
                .iter()
                .map(|n| (n.as_str(), true))
                .chain(spec.context_features.iter().map(|n| (n.as_str(), false)))
                .zip(&self.context_chains)
                .map(|((n, t), c)| (n, t, c.clone()))
                .collect(),
        }
    }

    /// How many buckets may be in memory at once under `budget`, given the largest one; an
    /// error when even one does not fit.
    pub fn at_once(&self, spill: &Spill, budget: u64) -> Result<usize> {
        let largest = (0..self.buckets.count())
            .map(|b| spill.rows(b))
            .max()
            .unwrap_or(0);
        budget::at_once(largest, largest * self.width, budget)
    }

    /// The key column, as the manifest describes it.
    pub fn key_id(&self, spill: &Spill) -> ColumnId {
        let info = spill.type_of(&self.spec.key);
        ColumnId {
            name: self.spec.key.clone(),
            table: "rows",
            source_type: info.name.clone(),
            kind: info.kind,
        }
    }
}

fn run(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let progress = opts.progress;
    let mut timer = Timer::start();
    let mut setup = Setup::new(spec)?;
    if opts.force {
        refuse_inputs_inside(&opts.out, spec, &setup.plan.rows_files)?;
    }
    let mut staging = Staging::create(&opts.out, opts.force)?;
    staging.storage = opts.storage.check()?;
    let stamps = stamp_files(&setup.named_inputs)?;

    progress.stage("reading", setup.plan.rows_files.len() as u64);
    setup.open()?;
    let budget = opts.max_memory.unwrap_or_else(budget::default_budget);
    let spill_dir = staging.dir.join(spill::SPILL_DIR);
    std::fs::create_dir_all(&spill_dir).map_err(|e| CompileError::io(&spill_dir, e))?;
    let (inputs, described) = setup.take_inputs();
    let files = 0..inputs.opened.len();
    let part = spill::spill_rows(
        inputs,
        files,
        &setup.plan.rows_wants,
        SpillTo {
            dir: &spill_dir,
            name: "rows",
            buckets: setup.buckets,
            budget: budget::read_share(budget),
            // A quarter of the budget may hold the whole spill: then nothing is written.
            in_memory: setup.rows_read * setup.width <= budget / 4,
        },
        progress,
    )?;
    let spill = Spill::from_parts(
        &spill_dir,
        vec![part],
        setup.buckets,
        described,
        setup.plan.rows_wants.clone(),
    );
    let context = setup.spill_context((&spill_dir, "context"), budget)?;
    setup.attach_context(&spill_dir, context)?;
    timer.lap("read");

    let splits = split::plan(spec, setup.context.as_ref())?;
    let at_once = setup.at_once(&spill, budget)?;
    let shared = setup.shared(&spill, &splits);
    let buckets = 0..setup.buckets.count();
    progress.stage("statistics", buckets.len() as u64);
    let runs = ValueRuns::create(spill_dir.join("values-0.spill"), 0)?;
    let part = fit::fit_buckets(&shared, buckets.clone(), at_once, &runs, progress)?;
    let values = runs.finish()?;
    let merged = fit::merge(&shared, &[part], &[values], setup.rows_read)?;
    timer.lap("statistics");

    progress.stage("writing shards", buckets.len() as u64);
    let layout = Layout::new(&setup.key_id(&spill), &merged, spec.shard_size);
    let written = shards::write_buckets(
        &shared,
        &merged,
        &layout,
        buckets,
        at_once,
        &staging.dir,
        progress,
    )?;
    timer.lap("write");
    std::fs::remove_dir_all(&spill_dir).map_err(|e| CompileError::io(&spill_dir, e))?;
    let inputs = fingerprint_files(&setup.named_inputs, &stamps)?;
    finish(
        &setup,
        &splits,
        merged,
        layout,
        vec![written],
        inputs,
        staging,
        timer,
        progress,
    )
}

/// Builds the manifest from what the shards passes wrote and commits the cache.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish(
    setup: &Setup,
    splits: &split::Splits,
    merged: Merged,
    layout: Layout,
    written: Vec<WritePart>,
    inputs: Inputs,
    staging: Staging,
    timer: Timer,
    progress: &dyn crate::Progress,
) -> Result<CompileReport> {
    let mut summary = merged.summary;
    summary.values_filled = written.iter().map(|w| w.filled).sum();
    summary.contexts_truncated = written.iter().map(|w| w.truncated).sum();
    let mut builder = Manifest::builder(
        env!("CARGO_PKG_VERSION"),
        merged.max_len,
        layout.tensors,
        inputs,
        resolved_spec(setup.spec, merged.max_len),
    );
    for (s, name) in splits.names.iter().enumerate() {
        let rows_stored: u64 = written.iter().map(|w| w.rows_stored[s]).sum();
        summary.rows_stored += rows_stored;
        let mut mine: Vec<ShardEntry> = written
            .iter()
            .flat_map(|w| w.entries.iter().filter(|e| e.split == *name).cloned())
            .collect();
        mine.sort_by_key(|e| e.index);
        builder = builder.split(name, rows_stored, mine);
    }
    let manifest = builder.summary(summary);
    commit_cache(staging, manifest, merged.stats, timer, progress)
}

/// `--force` replaces the output directory: refuse when that would delete an input.
fn refuse_inputs_inside(out: &Path, spec: &CompileSpec, rows_files: &[PathBuf]) -> Result<()> {
    let Ok(out) = out.canonicalize() else {
        return Ok(()); // nothing there yet to replace
    };
    let others = spec
        .context
        .iter()
        .chain(spec.joins.iter().map(|j| &j.file))
        .map(PathBuf::from);
    for input in rows_files.iter().cloned().chain(others) {
        if input.canonicalize().is_ok_and(|p| p.starts_with(&out)) {
            return Err(CompileError::Spec(format!(
                "--force would replace {} but the input {} is inside it; choose another --out",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

fn chain_of(spec: &CompileSpec, name: &str) -> Result<Vec<Stage>> {
    match spec.encode.get(name) {
        Some(chain) => plan::parse_chain(name, chain),
        None => Ok(vec![Stage::Identity]),
    }
}

fn resolved_spec(spec: &CompileSpec, max_len: usize) -> CompileSpec {
    let mut resolved = spec.clone();
    resolved.max_len = Some(max_len);
    resolved.context_key = spec
        .context
        .as_ref()
        .map(|_| spec.context_key().to_string());
    resolved
}

/// Every file a compile of `spec` reads, with its role.
fn input_files<'a>(spec: &CompileSpec, rows_files: &[PathBuf]) -> Vec<(PathBuf, &'a str)> {
    let mut named: Vec<(PathBuf, &str)> = rows_files.iter().map(|p| (p.clone(), "rows")).collect();
    if let Some(c) = &spec.context {
        named.push((PathBuf::from(c), "context"));
    }
    for j in &spec.joins {
        named.push((PathBuf::from(&j.file), "join"));
    }
    for file in spec.split_keys.values() {
        named.push((PathBuf::from(file), "split_keys"));
    }
    named
}
