//! The compile, stage by stage: plan → read and spill into buckets → per bucket: group, join
//! contexts, split, partial statistics → merge statistics, fit encodings → per bucket: group
//! again, encode, write its shards → stats.json → manifest.json → commit.

use crate::column::Values;
use crate::encode::{
    Access, CatValue, CategoryCoder, NumericEncoder, NumericResult, DROPPED, TRAIN,
};
use crate::error::{CompileError, Result};
use crate::fit::{self, ColumnId, ValueRuns};
use crate::group::{self, Group};
use crate::lookup::{self, Keyed};
use crate::plan::{self, Source};
use crate::read::{self, Role, RowsTable, Want};
use crate::spill::{self, Buckets, Spill};
use crate::split;
use crate::write::{ShardWriter, Staging};
use crate::Progress;
use dsc_format::manifest::{CompileSummary, InputFile, Inputs};
use dsc_format::rng::position_hash;
use dsc_format::spec::{CompileSpec, EmptyContexts, UnmatchedRows, DEFAULT_BUCKET_SIZE};
use dsc_format::stats::{Bin, ColumnStats, LengthStats, SplitStats, QUANTILE_LEVELS};
use dsc_format::{
    shard, ColumnSource, ColumnSpec, Dtype, Encoding, Manifest, ManifestBuilder, ShardEntry, Stage,
    Stats, TensorRole, TensorSpec,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The folder inside the staging directory that holds a compile's spill files.
const SPILL_DIR: &str = "spill";

/// Where and how to write.
pub struct CompileOptions<'a> {
    /// The cache directory to create.
    pub out: PathBuf,
    /// Replace `out` if it exists and is not empty.
    pub force: bool,
    /// Memory the compile may use (bytes); `None`: half of the machine's. The cache does not
    /// depend on it.
    pub max_memory: Option<u64>,
    /// Progress receiver.
    pub progress: &'a dyn Progress,
}

impl std::fmt::Debug for CompileOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileOptions")
            .field("out", &self.out)
            .field("force", &self.force)
            .finish_non_exhaustive()
    }
}

/// What a compile produced.
#[derive(Debug)]
pub struct CompileReport {
    /// The cache directory.
    pub out: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its statistics.
    pub stats: Stats,
    /// Bytes of all shards.
    pub cache_bytes: u64,
    /// Seconds spent per stage, in order.
    pub timings: Vec<(String, f64)>,
}

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

/// Wall time per compile stage, for the report.
pub(crate) struct Timer {
    last: Instant,
    timings: Vec<(String, f64)>,
}

impl Timer {
    pub(crate) fn start() -> Timer {
        Timer {
            last: Instant::now(),
            timings: Vec::new(),
        }
    }

    pub(crate) fn lap(&mut self, name: &str) {
        let now = Instant::now();
        self.timings
            .push((name.into(), (now - self.last).as_secs_f64()));
        self.last = now;
    }
}

#[derive(Debug, Clone, Copy)]
struct Context {
    group: Group,
    ctx_row: Option<u32>,
    split: u8,
}

/// Runs a compile.
pub fn compile(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let result = match spec.profile.as_deref() {
        None if spec.val_keys.is_some() || spec.partitions.is_some() => Err(CompileError::Spec(
            format!(
                "val_keys (--val-keys) and partitions (--partitions) only apply with the {:?} profile",
                crate::mostlyai::PROFILE
            ),
        )),
        None => run(spec, opts),
        Some(crate::mostlyai::PROFILE) => crate::mostlyai::compile(spec, opts),
        Some(other) => Err(CompileError::Spec(format!(
            "unknown profile {other:?} (known: {:?})",
            crate::mostlyai::PROFILE
        ))),
    };
    opts.progress.finish();
    result
}

/// The memory a compile may use when not told: half of the machine's, at least 256 MiB.
#[allow(unsafe_code)]
fn default_budget() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let total = if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        8 << 30
    };
    (total / 2).max(256 << 20)
}

/// A bucket in memory takes about this many times its decoded rows (the rows, the grouping,
/// gathered values, encode buffers).
const BUCKET_OVERHEAD: u64 = 4;

/// One row column of the compile: where it comes from and how it is encoded.
struct RowColumn<'a> {
    name: &'a str,
    join: Option<&'a Keyed>,
    categorical: bool,
    chain: Vec<Stage>,
}

/// Everything a bucket needs that is shared by all of them.
struct Shared<'a> {
    spec: &'a CompileSpec,
    spill: &'a Spill,
    context: Option<&'a Keyed>,
    /// Context-table rows by bucket, ascending.
    ctx_by_bucket: Vec<Vec<u32>>,
    splits: &'a split::Splits<'a>,
    columns: Vec<RowColumn<'a>>,
    /// Targets, then context features: (name, is_target, chain).
    context_columns: Vec<(&'a str, bool, Vec<Stage>)>,
}

/// What only the whole input shows is wrong: kept per bucket, decided after all of them.
#[derive(Debug, Default)]
struct Issues {
    /// Contexts with rows but no context row: count, rows, and the smallest key's first row.
    unmatched: (usize, u64, Option<(i64, PathBuf, u64)>),
    /// Context rows with no rows: count and the first (row, key).
    empty: (usize, Option<(u64, i64)>),
    /// Listed keys (key files) that are contexts.
    found: Vec<i64>,
}

/// One bucket grouped into contexts, each with its split.
struct Prepared {
    table: RowsTable,
    grouped: group::Groups,
    contexts: Vec<Context>,
    row_tags: Vec<u8>,
    /// Context-table rows of the stored contexts, ascending, with their splits.
    ctx_rows: Vec<u32>,
    ctx_tags: Vec<u8>,
    issues: Issues,
    truncated: usize,
}

impl Shared<'_> {
    /// Loads bucket `b` and groups it; `max_len` truncates (none when `None`).
    fn prepare(&self, b: usize, max_len: Option<usize>) -> Result<Prepared> {
        let spec = self.spec;
        let table = self.spill.load(b)?;
        let Values::Int(keys) = &table.columns[0].values else {
            unreachable!("the key is an integer column; checked when opened")
        };
        let order = spec.order_by.as_deref().and_then(|o| table.column(o));
        let mut grouped = group::group(keys, order);
        let mut issues = Issues::default();
        let mut contexts: Vec<Context> = Vec::with_capacity(grouped.groups.len());
        match self.context {
            None => contexts.extend(grouped.groups.iter().map(|&group| Context {
                group,
                ctx_row: None,
                split: TRAIN,
            })),
            Some(ctx) => {
                let mine = &self.ctx_by_bucket[b];
                let mut seen = vec![false; mine.len()];
                for g in &grouped.groups {
                    match ctx.index.get(g.key) {
                        Some(r) => {
                            let i = mine.binary_search(&r).expect("a key's bucket is its own");
                            seen[i] = true;
                            contexts.push(Context {
                                group: *g,
                                ctx_row: Some(r),
                                split: TRAIN,
                            });
                        }
                        None => {
                            let u = &mut issues.unmatched;
                            u.0 += 1;
                            u.1 += g.len as u64;
                            if u.2.is_none() {
                                // Groups are ascending by key: the first is the smallest.
                                let (path, row) = table.locate(grouped.perm[g.start] as usize);
                                u.2 = Some((g.key, path.into(), row));
                            }
                        }
                    }
                }
                let Values::Int(ctx_keys) = &ctx.table.columns[0].values else {
                    unreachable!("context keys are integers")
                };
                for (i, &r) in mine.iter().enumerate() {
                    if seen[i] {
                        continue;
                    }
                    issues.empty.0 += 1;
                    if issues.empty.1.is_none() {
                        issues.empty.1 = Some((u64::from(r), ctx_keys[r as usize]));
                    }
                    if spec.empty_contexts == EmptyContexts::Keep {
                        contexts.push(Context {
                            group: Group {
                                key: ctx_keys[r as usize],
                                start: 0,
                                len: 0,
                                kept_start: 0,
                                kept: 0,
                            },
                            ctx_row: Some(r),
                            split: TRAIN,
                        });
                    }
                }
                contexts.sort_by_key(|c| c.group.key);
            }
        }
        let mut truncated = 0;
        if let Some(max_len) = max_len {
            // Sampling is seeded by the split seed, not the shuffle seed, so that a reshuffle
            // stores exactly the same rows.
            truncated = group::truncate(&mut grouped, max_len, spec.truncate, spec.split_seed);
            refresh_groups(&mut contexts, &grouped.groups);
        }
        for c in &mut contexts {
            c.split = self.splits.of(c.group.key, c.ctx_row)?;
            if self.splits.is_listed(c.group.key) {
                issues.found.push(c.group.key);
            }
        }
        // Statistics describe every row of the stored contexts, also those cut by `max_len`.
        let mut row_tags = vec![DROPPED; table.rows()];
        for c in &contexts {
            let g = &c.group;
            for &r in &grouped.perm[g.start..g.start + g.len] {
                row_tags[r as usize] = c.split;
            }
        }
        let mut ctx: Vec<(u32, u8)> = contexts
            .iter()
            .filter_map(|c| c.ctx_row.map(|r| (r, c.split)))
            .collect();
        ctx.sort_unstable();
        let (ctx_rows, ctx_tags) = ctx.into_iter().unzip();
        Ok(Prepared {
            table,
            grouped,
            contexts,
            row_tags,
            ctx_rows,
            ctx_tags,
            issues,
            truncated,
        })
    }

    /// The access to row column `i` in a bucket's table.
    fn access<'t>(&'t self, i: usize, table: &'t RowsTable) -> Access<'t> {
        let rc = &self.columns[i];
        match rc.join {
            None => Access {
                name: rc.name,
                table,
                column: table.column(rc.name).expect("read"),
                join: None,
            },
            Some(keyed) => Access {
                name: rc.name,
                table,
                column: keyed.column(rc.name).expect("read"),
                join: Some((table.column(&keyed.key).expect("join column read"), keyed)),
            },
        }
    }

    /// What row column `i` is, without a bucket at hand.
    fn column_id(&self, i: usize) -> ColumnId {
        let rc = &self.columns[i];
        let info = match rc.join {
            None => self.spill.type_of(rc.name),
            Some(keyed) => &keyed.column(rc.name).expect("read").info,
        };
        ColumnId {
            name: rc.name.into(),
            table: if rc.join.is_some() { "join" } else { "rows" },
            source_type: info.name.clone(),
            kind: info.kind,
        }
    }

    fn context_access(&self, i: usize) -> Access<'_> {
        let k = self.context.expect("context columns need a context table");
        let name = self.context_columns[i].0;
        Access {
            name,
            table: &k.table,
            column: k.column(name).expect("read"),
            join: None,
        }
    }
}

/// A row column's statistics of one bucket.
enum Partial {
    Numeric(fit::NumericPartial),
    Category(fit::CategoryPartial),
}

/// What the statistics pass learns from one bucket.
struct BucketFit {
    contexts: Vec<u64>,
    lengths: Vec<fit::LengthCounts>,
    longest: usize,
    columns: Vec<Partial>,
    context_columns: Vec<fit::NumericPartial>,
    issues: Issues,
}

/// Runs `f` on every bucket, at most `at_once` of them in memory together; results in bucket
/// order.
fn for_buckets<T: Send>(
    count: usize,
    at_once: usize,
    progress: &dyn Progress,
    f: impl Fn(usize) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let mut out = Vec::with_capacity(count);
    let all: Vec<usize> = (0..count).collect();
    for chunk in all.chunks(at_once.max(1)) {
        let done: Vec<Result<T>> = chunk
            .par_iter()
            .map(|&b| {
                let r = f(b);
                progress.advance(1);
                r
            })
            .collect();
        out.extend(done);
    }
    out
}

/// The first error in bucket order, or every result.
fn all_ok<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    results.into_iter().collect()
}

fn run(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let progress = opts.progress;
    let mut timer = Timer::start();
    let plan = plan::plan(spec)?;
    if opts.force {
        refuse_inputs_inside(&opts.out, spec, &plan.rows_files)?;
    }
    let mut columns: Vec<(usize, Vec<Stage>)> = Vec::new();
    for (i, rc) in plan.row_columns.iter().enumerate() {
        let chain = if rc.categorical {
            Vec::new()
        } else {
            chain_of(spec, &rc.name)?
        };
        fit::unfitted_prefix(&rc.name, &chain)?;
        columns.push((i, chain));
    }
    let mut context_chains = Vec::new();
    for name in spec.targets.iter().chain(&spec.context_features) {
        let chain = chain_of(spec, name)?;
        fit::unfitted_prefix(name, &chain)?;
        context_chains.push(chain);
    }
    let staging = Staging::create(&opts.out, opts.force)?;
    let named_inputs = input_files(spec, &plan.rows_files);
    let stamps = stamp_files(&named_inputs)?;

    progress.stage("reading", plan.rows_files.len() as u64);
    let inputs = read::open_all(&plan.rows_files, &plan.rows_wants)?;
    let rows_read = *inputs.offsets.last().unwrap_or(&0);
    let width = spill::row_width(&inputs.types);
    let buckets = Buckets::for_size(
        rows_read * width,
        spec.bucket_size.unwrap_or(DEFAULT_BUCKET_SIZE),
        spec.seed,
    );
    let budget = opts.max_memory.unwrap_or_else(default_budget);
    let joins: Vec<Keyed> = plan
        .joins
        .iter()
        .map(|(path, on, wants)| lookup::read_keyed(path, on, Role::JoinOn, wants))
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let context: Option<Keyed> = match &spec.context {
        None => None,
        Some(path) => {
            let mut wants: Vec<Want> = spec
                .targets
                .iter()
                .chain(&spec.context_features)
                .map(|n| Want {
                    name: n.clone(),
                    role: Role::Numeric,
                })
                .collect();
            wants.extend(spec.split_by.iter().map(|n| Want {
                name: n.clone(),
                role: Role::Split,
            }));
            Some(lookup::read_keyed(
                Path::new(path),
                spec.context_key(),
                Role::Key,
                &wants,
            )?)
        }
    };
    let splits = split::plan(spec, context.as_ref())?;
    let n_splits = splits.names.len();
    let threads = rayon::current_num_threads().max(1) as u64;
    let spill_dir = staging.dir.join(SPILL_DIR);
    std::fs::create_dir_all(&spill_dir).map_err(|e| CompileError::io(&spill_dir, e))?;
    // Half the budget for reading, shared by the files read at once.
    let read_share = (budget / 2 / threads).max(1 << 20) as usize;
    let spill = spill::spill_rows(
        inputs,
        plan.rows_wants.clone(),
        buckets,
        read_share,
        &spill_dir,
        progress,
    )?;
    timer.lap("read");

    let largest = (0..buckets.count())
        .map(|b| spill.rows(b))
        .max()
        .unwrap_or(0);
    let bucket_bytes = (largest * width * BUCKET_OVERHEAD).max(1);
    if bucket_bytes > budget {
        return Err(CompileError::Spec(format!(
            "--max-memory {} is too small: one bucket of this input holds {largest} rows and \
             needs about {} in memory; give at least that, or a smaller --bucket-size",
            human_bytes(budget),
            human_bytes(bucket_bytes)
        )));
    }
    let at_once = ((budget / bucket_bytes) as usize).clamp(1, threads as usize);
    let mut ctx_by_bucket: Vec<Vec<u32>> = vec![Vec::new(); buckets.count()];
    if let Some(k) = &context {
        let Values::Int(keys) = &k.table.columns[0].values else {
            unreachable!("context keys are integers")
        };
        for (r, &key) in keys.iter().enumerate() {
            ctx_by_bucket[buckets.of(key)].push(r as u32);
        }
    }
    let shared = Shared {
        spec,
        spill: &spill,
        context: context.as_ref(),
        ctx_by_bucket,
        splits: &splits,
        columns: plan
            .row_columns
            .iter()
            .zip(&columns)
            .map(|(rc, (_, chain))| RowColumn {
                name: &rc.name,
                join: match rc.source {
                    Source::Rows => None,
                    Source::Join(j) => Some(&joins[j]),
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
            .zip(context_chains)
            .map(|((n, t), c)| (n, t, c))
            .collect(),
    };

    // The statistics pass: every bucket grouped, its columns gathered and summarised.
    progress.stage("statistics", buckets.count() as u64);
    let runs = ValueRuns::create(fit::runs_path(&spill_dir))?;
    let fits = all_ok(for_buckets(buckets.count(), at_once, progress, |b| {
        let p = shared.prepare(b, spec.max_len)?;
        let mut contexts = vec![0u64; n_splits];
        let mut lengths = vec![fit::LengthCounts::new(); n_splits];
        let mut longest = 0;
        for c in &p.contexts {
            contexts[c.split as usize] += 1;
            *lengths[c.split as usize]
                .entry(c.group.len as u64)
                .or_insert(0) += 1;
            longest = longest.max(c.group.len);
        }
        let mut partials = Vec::with_capacity(shared.columns.len());
        for (i, rc) in shared.columns.iter().enumerate() {
            let access = shared.access(i, &p.table);
            partials.push(if rc.categorical {
                Partial::Category(fit::category_partial(&access, &p.row_tags, n_splits)?)
            } else {
                let prefix = fit::unfitted_prefix(rc.name, &rc.chain)?;
                Partial::Numeric(fit::numeric_partial(
                    &access,
                    &p.row_tags,
                    None,
                    n_splits,
                    prefix,
                    &runs,
                )?)
            });
        }
        let mut context_partials = Vec::with_capacity(shared.context_columns.len());
        for (i, (name, _, chain)) in shared.context_columns.iter().enumerate() {
            let access = shared.context_access(i);
            let prefix = fit::unfitted_prefix(name, chain)?;
            context_partials.push(fit::numeric_partial(
                &access,
                &p.ctx_tags,
                Some(&p.ctx_rows),
                n_splits,
                prefix,
                &runs,
            )?);
        }
        Ok(BucketFit {
            contexts,
            lengths,
            longest,
            columns: partials,
            context_columns: context_partials,
            issues: p.issues,
        })
    }))?;
    let mut summary = CompileSummary {
        rows_read,
        ..Default::default()
    };
    check_issues(spec, &fits, context.as_ref(), &mut summary)?;
    let per_split: Vec<u64> = (0..n_splits)
        .map(|s| fits.iter().map(|f| f.contexts[s]).sum())
        .collect();
    let found: std::collections::HashSet<i64> = fits
        .iter()
        .flat_map(|f| f.issues.found.iter().copied())
        .collect();
    splits.check(&per_split, &found, per_split.iter().sum())?;
    let longest = fits.iter().map(|f| f.longest).max().unwrap_or(0);
    let max_len = spec
        .max_len
        .unwrap_or_else(|| longest.clamp(1, plan::MAX_LEN));

    // Merge the buckets' statistics and fit the encodings on train.
    let map = runs.map()?;
    let map: &[u8] = map.as_deref().unwrap_or(&[]);
    let mut column_stats: Vec<Vec<ColumnStats>> = Vec::new();
    let mut fitted_columns: Vec<FittedColumn> = Vec::new();
    for (i, rc) in shared.columns.iter().enumerate() {
        let id = shared.column_id(i);
        let source = match rc.join {
            None => ColumnSource::Rows,
            Some(keyed) => ColumnSource::Join {
                file: keyed.path.display().to_string(),
                on: keyed.key.clone(),
            },
        };
        if rc.categorical {
            let parts: Vec<&fit::CategoryPartial> = fits
                .iter()
                .map(|f| match &f.columns[i] {
                    Partial::Category(p) => p,
                    Partial::Numeric(_) => unreachable!("column kinds agree across buckets"),
                })
                .collect();
            let (stats, vocabulary) = fit::merge_categories(&id, &parts, n_splits);
            let encoding = Encoding::Category {
                vocabulary: vocabulary.iter().map(|v| v.json(id.kind)).collect(),
            };
            column_stats.push(stats);
            fitted_columns.push(FittedColumn::Category(
                vocabulary,
                column_spec(rc.name, source, &id, encoding),
            ));
        } else {
            let parts: Vec<&fit::NumericPartial> = fits
                .iter()
                .map(|f| match &f.columns[i] {
                    Partial::Numeric(p) => p,
                    Partial::Category(_) => unreachable!("column kinds agree across buckets"),
                })
                .collect();
            let result = fit::merge_numeric(&id, &parts, n_splits, &rc.chain, map)?;
            let encoding = NumericEncoder::encoding_of(id.kind, &result, spec.nan);
            column_stats.push(result.stats.clone());
            fitted_columns.push(FittedColumn::Numeric(
                result,
                column_spec(rc.name, source, &id, encoding),
            ));
        }
    }
    let mut fitted_context: Vec<(NumericResult, ColumnSpec, bool)> = Vec::new();
    for (i, (name, is_target, chain)) in shared.context_columns.iter().enumerate() {
        let mut id = ColumnId::of(&shared.context_access(i));
        id.table = "context";
        let parts: Vec<&fit::NumericPartial> = fits.iter().map(|f| &f.context_columns[i]).collect();
        let result = fit::merge_numeric(&id, &parts, n_splits, chain, map)?;
        let encoding = NumericEncoder::encoding_of(id.kind, &result, spec.nan);
        column_stats.push(result.stats.clone());
        fitted_context.push((
            result,
            column_spec(name, ColumnSource::Context, &id, encoding),
            *is_target,
        ));
    }
    let stats = build_stats(&fits, &splits.names, max_len, column_stats);
    timer.lap("statistics");

    let key_id = ColumnId {
        name: spec.key.clone(),
        table: "rows",
        source_type: spill.type_of(&spec.key).name.clone(),
        kind: spill.type_of(&spec.key).kind,
    };
    let key_column = column_spec(&spec.key, ColumnSource::Rows, &key_id, Encoding::Raw);
    let features: Vec<ColumnSpec> = fitted_columns
        .iter()
        .filter_map(|f| match f {
            FittedColumn::Numeric(_, c) => Some(c.clone()),
            FittedColumn::Category(..) => None,
        })
        .collect();
    let categoricals: Vec<ColumnSpec> = fitted_columns
        .iter()
        .filter_map(|f| match f {
            FittedColumn::Category(_, c) => Some(c.clone()),
            FittedColumn::Numeric(..) => None,
        })
        .collect();
    let context_specs: Vec<(ColumnSpec, bool)> = fitted_context
        .iter()
        .map(|(_, c, t)| (c.clone(), *t))
        .collect();
    let (tensors, fills) = tensor_layout(
        max_len,
        key_column,
        &features,
        &categoricals,
        &context_specs,
    );
    let per_context: usize = tensors.iter().map(TensorSpec::sample_bytes).sum();
    let per_shard = ((spec.shard_size as usize) / per_context.max(1)).max(1);
    // Each bucket's first shard index and first position in every split: shards never span
    // buckets, and a bucket's contexts follow those of the buckets before it.
    let mut starts: Vec<Vec<(usize, usize)>> = Vec::with_capacity(buckets.count());
    let mut next = vec![(0usize, 0usize); n_splits];
    for f in &fits {
        starts.push(next.clone());
        for (s, n) in next.iter_mut().enumerate() {
            let c = f.contexts[s] as usize;
            n.0 += c.div_ceil(per_shard);
            n.1 += c;
        }
    }
    drop(fits);
    timer.lap("layout");

    // The write pass: every bucket grouped again, encoded and written as its own shards.
    progress.stage("writing shards", buckets.count() as u64);
    let filled = AtomicU64::new(0);
    let written = all_ok(for_buckets(buckets.count(), at_once, progress, |b| {
        let p = shared.prepare(b, Some(max_len))?;
        let mut features = Vec::new();
        let mut categoricals = Vec::new();
        for (i, f) in fitted_columns.iter().enumerate() {
            let access = shared.access(i, &p.table);
            match f {
                FittedColumn::Numeric(result, spec_col) => {
                    let encoder = NumericEncoder::new(access, result, spec.nan);
                    encoder.check_rows(result, &p.row_tags, None)?;
                    features.push((encoder, spec_col.clone()));
                }
                FittedColumn::Category(vocabulary, spec_col) => {
                    categoricals.push((CategoryCoder::new(access, vocabulary), spec_col.clone()));
                }
            }
        }
        let mut context_encoders = Vec::new();
        for (i, (result, spec_col, is_target)) in fitted_context.iter().enumerate() {
            let encoder = NumericEncoder::new(shared.context_access(i), result, spec.nan);
            encoder.check_rows(result, &p.ctx_tags, Some(&p.ctx_rows))?;
            context_encoders.push((encoder, spec_col.clone(), *is_target));
        }
        let mut jobs = Vec::new();
        for (s, &(first_shard, first_context)) in starts[b].iter().enumerate() {
            let mut order: Vec<(u64, i64, usize)> = p
                .contexts
                .iter()
                .enumerate()
                .filter(|(_, c)| c.split as usize == s)
                .map(|(i, c)| (position_hash(c.group.key, spec.seed), c.group.key, i))
                .collect();
            order.sort_unstable();
            let members: Vec<usize> = order.into_iter().map(|o| o.2).collect();
            for (j, chunk) in members.chunks(per_shard).enumerate() {
                jobs.push(ShardJob {
                    split: s as u8,
                    index: first_shard + j,
                    first: first_context + j * per_shard,
                    members: chunk.to_vec(),
                });
            }
        }
        let writer = ShardContext {
            split_names: &splits.names,
            tensors: &tensors,
            fills: &fills,
            contexts: &p.contexts,
            perm: &p.grouped.perm,
            features: &features,
            categoricals: &categoricals,
            context_encoders: &context_encoders,
            max_len,
            filled: &filled,
        };
        let entries: Vec<ShardEntry> = all_ok(
            jobs.par_iter()
                .map(|job| writer.write(job, &staging.dir))
                .collect(),
        )?;
        let mut rows_stored = vec![0u64; n_splits];
        for c in &p.contexts {
            rows_stored[c.split as usize] += c.group.kept as u64;
        }
        Ok((entries, rows_stored, p.truncated))
    }))?;
    summary.values_filled = filled.load(Ordering::Relaxed);
    timer.lap("write");
    std::fs::remove_dir_all(&spill_dir).map_err(|e| CompileError::io(&spill_dir, e))?;

    summary.contexts = per_split.iter().sum::<u64>() as usize;
    summary.contexts_truncated = written.iter().map(|w| w.2).sum();
    let inputs = fingerprint_files(&named_inputs, &stamps)?;
    let mut builder = Manifest::builder(
        env!("CARGO_PKG_VERSION"),
        max_len,
        tensors,
        inputs,
        resolved_spec(spec, max_len),
    );
    for (s, name) in splits.names.iter().enumerate() {
        let rows_stored: u64 = written.iter().map(|w| w.1[s]).sum();
        summary.rows_stored += rows_stored;
        let mut mine: Vec<ShardEntry> = written
            .iter()
            .flat_map(|w| w.0.iter().filter(|e| e.split == *name).cloned())
            .collect();
        mine.sort_by_key(|e| e.index);
        builder = builder.split(name, rows_stored, mine);
    }
    let manifest = builder.summary(summary);
    commit_cache(staging, manifest, stats, timer)
}

/// A row column's fitted encoding.
enum FittedColumn {
    Numeric(NumericResult, ColumnSpec),
    Category(Vec<CatValue>, ColumnSpec),
}

/// Turns what the buckets found missing into the errors or counts the policies ask for.
fn check_issues(
    spec: &CompileSpec,
    fits: &[BucketFit],
    context: Option<&Keyed>,
    summary: &mut CompileSummary,
) -> Result<()> {
    let Some(ctx) = context else { return Ok(()) };
    let unmatched: usize = fits.iter().map(|f| f.issues.unmatched.0).sum();
    if unmatched > 0 {
        if spec.unmatched_rows == UnmatchedRows::Error {
            let (key, path, row) = fits
                .iter()
                .filter_map(|f| f.issues.unmatched.2.clone())
                .min_by_key(|u| u.0)
                .expect("counted above");
            return Err(CompileError::UnmatchedRows {
                path,
                row,
                key,
                context: ctx.path.clone(),
                others: unmatched - 1,
            });
        }
        summary.contexts_without_context_row = unmatched;
        summary.rows_without_context_row = fits.iter().map(|f| f.issues.unmatched.1).sum();
    }
    let empty: usize = fits.iter().map(|f| f.issues.empty.0).sum();
    summary.contexts_without_rows = empty;
    if empty > 0 {
        match spec.empty_contexts {
            EmptyContexts::Error => {
                let (row, key) = fits
                    .iter()
                    .filter_map(|f| f.issues.empty.1)
                    .min()
                    .expect("counted above");
                return Err(CompileError::EmptyContexts {
                    context: ctx.path.clone(),
                    row,
                    key,
                    others: empty - 1,
                });
            }
            EmptyContexts::Drop => {}
            EmptyContexts::Keep => summary.empty_contexts_kept = empty,
        }
    }
    Ok(())
}

fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", n.div_ceil(1 << 20))
    }
}

fn refresh_groups(contexts: &mut [Context], groups: &[Group]) {
    // Both are ascending by key; kept-empty contexts have no group and keep their own.
    let mut gi = 0;
    for c in contexts.iter_mut() {
        if c.group.len == 0 {
            continue;
        }
        while groups[gi].key != c.group.key {
            gi += 1;
        }
        c.group = groups[gi];
    }
}

/// The end of every compile: checks the manifest, writes `stats.json`, then `manifest.json` (the
/// commit point), and moves the staging directory into place.
pub(crate) fn commit_cache(
    staging: Staging,
    manifest: ManifestBuilder,
    stats: Stats,
    mut timer: Timer,
) -> Result<CompileReport> {
    let manifest = manifest.build().map_err(|problem| {
        CompileError::Internal(format!("the manifest is inconsistent: {problem}"))
    })?;
    let mut stats_json = serde_json::to_vec_pretty(&stats).expect("stats serialize");
    stats_json.push(b'\n');
    staging.write_file(dsc_format::STATS_FILE, &stats_json)?;
    staging.write_file(dsc_format::MANIFEST_FILE, &manifest.to_json())?;
    let out = staging.commit()?;
    timer.lap("commit");
    let cache_bytes = manifest.shards().iter().map(|s| s.bytes).sum();
    Ok(CompileReport {
        out,
        manifest,
        stats,
        cache_bytes,
        timings: timer.timings,
    })
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

fn column_spec(name: &str, source: ColumnSource, id: &ColumnId, encoding: Encoding) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        source,
        source_type: id.source_type.clone(),
        encoding,
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

/// The state of every input before a compile reads it.
pub(crate) fn stamp_files(named: &[(PathBuf, &str)]) -> Result<Vec<read::Stamp>> {
    named.iter().map(|(p, _)| read::Stamp::take(p)).collect()
}

/// Sizes and checksums of every input file, with its role, and one fingerprint over them.
/// `stamps` (from [`stamp_files`] before reading) must still hold after hashing: an input
/// changed mid-compile is an error, not a manifest describing other bytes than the shards hold.
pub(crate) fn fingerprint_files(
    named: &[(PathBuf, &str)],
    stamps: &[read::Stamp],
) -> Result<Inputs> {
    let files: Vec<InputFile> = named
        .par_iter()
        .map(|(path, role)| {
            let (bytes, xxh3) = dsc_format::checksum::hash_file(path)?;
            Ok(InputFile {
                path: path.display().to_string(),
                role: (*role).into(),
                bytes,
                xxh3,
            })
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    for s in stamps {
        s.check()?;
    }
    let mut h = dsc_format::checksum::Hasher::new();
    for f in &files {
        h.update(format!("{}\0{}\0{}\n", f.role, f.bytes, f.xxh3).as_bytes());
    }
    Ok(Inputs {
        fingerprint: h.hex(),
        files,
    })
}

pub(crate) fn length_stats(lengths: &mut [f64], max_len: usize) -> LengthStats {
    let n = lengths.len();
    let m = crate::stats::Moments::of(lengths);
    let truncated = lengths.iter().filter(|&&l| l > max_len as f64).count() as u64;
    let max = if n == 0 { 0 } else { m.max as u64 };
    let mut histogram = vec![Bin {
        lo: 0.0,
        hi: 1.0,
        count: 0,
    }];
    let mut lo = 1u64;
    while lo <= max {
        histogram.push(Bin {
            lo: lo as f64,
            hi: (lo * 2) as f64,
            count: 0,
        });
        lo *= 2;
    }
    for &l in lengths.iter() {
        let l = l as u64;
        let bin = if l == 0 {
            0
        } else {
            64 - l.leading_zeros() as usize
        };
        histogram[bin].count += 1;
    }
    let quantiles = crate::stats::quantiles(lengths, &QUANTILE_LEVELS);
    LengthStats {
        min: if n == 0 { 0 } else { m.min as u64 },
        max,
        mean: m.mean,
        quantiles,
        histogram,
        truncated,
        truncated_fraction: if n == 0 {
            0.0
        } else {
            truncated as f64 / n as f64
        },
    }
}

fn build_stats(
    fits: &[BucketFit],
    split_names: &[String],
    max_len: usize,
    columns: Vec<Vec<ColumnStats>>,
) -> Stats {
    let mut splits = Vec::new();
    let names = std::iter::once(dsc_format::stats::ALL_SPLITS)
        .chain(split_names.iter().map(String::as_str));
    for (i, name) in names.enumerate() {
        let mut lengths = fit::LengthCounts::new();
        for f in fits {
            for (s, counts) in f.lengths.iter().enumerate() {
                if i == 0 || s == i - 1 {
                    for (&l, &c) in counts {
                        *lengths.entry(l).or_insert(0) += c;
                    }
                }
            }
        }
        splits.push(SplitStats {
            split: name.into(),
            contexts: lengths.values().sum(),
            rows: lengths.iter().map(|(&l, &c)| l * c).sum(),
            lengths: fit::length_stats(&lengths, max_len),
            columns: columns.iter().map(|c| c[i].clone()).collect(),
        });
    }
    Stats {
        format_version: dsc_format::FORMAT_VERSION,
        splits,
    }
}

/// What fills one tensor.
#[derive(Debug, Clone, Copy)]
enum Fill {
    Key,
    Length,
    FullLength,
    Features,
    Categorical(usize),
    Targets,
    ContextFeatures,
}

fn tensor_layout(
    max_len: usize,
    key_column: ColumnSpec,
    features: &[ColumnSpec],
    categoricals: &[ColumnSpec],
    context: &[(ColumnSpec, bool)],
) -> (Vec<TensorSpec>, Vec<Fill>) {
    let derived = |name: &str| ColumnSpec {
        name: name.into(),
        source: ColumnSource::Rows,
        source_type: "derived".into(),
        encoding: Encoding::Raw,
    };
    let raw = |name: &str, dtype, role, column: ColumnSpec| TensorSpec {
        name: name.into(),
        dtype,
        role,
        sample_shape: vec![],
        columns: vec![column],
    };
    let mut tensors = vec![raw("key", Dtype::I64, TensorRole::Key, key_column)];
    let mut fills = vec![Fill::Key];
    if !features.is_empty() {
        tensors.push(TensorSpec {
            name: "x".into(),
            dtype: Dtype::F32,
            role: TensorRole::Features,
            sample_shape: vec![max_len, features.len()],
            columns: features.to_vec(),
        });
        fills.push(Fill::Features);
    }
    for (i, col) in categoricals.iter().enumerate() {
        tensors.push(TensorSpec {
            name: col.name.clone(),
            dtype: Dtype::I32,
            role: TensorRole::Categorical,
            sample_shape: vec![max_len],
            columns: vec![col.clone()],
        });
        fills.push(Fill::Categorical(i));
    }
    tensors.push(raw(
        "length",
        Dtype::I32,
        TensorRole::Length,
        derived("length"),
    ));
    fills.push(Fill::Length);
    tensors.push(raw(
        "full_length",
        Dtype::I32,
        TensorRole::FullLength,
        derived("full_length"),
    ));
    fills.push(Fill::FullLength);
    for (name, role, fill, want) in [
        ("y", TensorRole::Targets, Fill::Targets, true),
        (
            "c",
            TensorRole::ContextFeatures,
            Fill::ContextFeatures,
            false,
        ),
    ] {
        let cols: Vec<ColumnSpec> = context
            .iter()
            .filter(|c| c.1 == want)
            .map(|c| c.0.clone())
            .collect();
        if !cols.is_empty() {
            tensors.push(TensorSpec {
                name: name.into(),
                dtype: Dtype::F32,
                role,
                sample_shape: vec![cols.len()],
                columns: cols,
            });
            fills.push(fill);
        }
    }
    (tensors, fills)
}

struct ShardJob {
    split: u8,
    index: usize,
    first: usize,
    members: Vec<usize>,
}

struct ShardContext<'a> {
    split_names: &'a [String],
    tensors: &'a [TensorSpec],
    fills: &'a [Fill],
    contexts: &'a [Context],
    perm: &'a [u32],
    features: &'a [(NumericEncoder<'a>, ColumnSpec)],
    categoricals: &'a [(CategoryCoder<'a>, ColumnSpec)],
    context_encoders: &'a [(NumericEncoder<'a>, ColumnSpec, bool)],
    max_len: usize,
    filled: &'a AtomicU64,
}

/// Contexts encoded per buffer fill: bounds the writer's memory independently of shard size.
const CHUNK: usize = 256;

impl ShardContext<'_> {
    fn write(&self, job: &ShardJob, dir: &Path) -> Result<ShardEntry> {
        let split = self.split_names[job.split as usize].as_str();
        let file = shard::shard_file_name(split, job.index);
        let n = job.members.len();
        let meta = shard::ShardMeta {
            split,
            index: job.index,
            first_context: job.first,
            profile: None,
        };
        let (header, _) = shard::build_header(self.tensors, n, &meta);
        let mut out = ShardWriter::create(dir.join(&file))?;
        out.write(&header)?;
        let mut buf = Vec::new();
        let mut filled = 0u64;
        for (tensor, &fill) in self.tensors.iter().zip(self.fills) {
            let sample = tensor.sample_bytes();
            for chunk in job.members.chunks(CHUNK) {
                buf.clear();
                buf.resize(chunk.len() * sample, 0);
                for (i, &c) in chunk.iter().enumerate() {
                    let dst = &mut buf[i * sample..(i + 1) * sample];
                    filled += self.fill_one(fill, &self.contexts[c], dst)?;
                }
                out.write(&buf)?;
            }
        }
        self.filled.fetch_add(filled, Ordering::Relaxed);
        let (bytes, xxh3) = out.finish()?;
        Ok(ShardEntry {
            file,
            split: split.into(),
            index: job.index,
            contexts: n,
            first_context: job.first,
            bytes,
            xxh3,
        })
    }

    /// Writes one context's sample of one tensor into `dst` (zeroed); returns values filled.
    fn fill_one(&self, fill: Fill, c: &Context, dst: &mut [u8]) -> Result<u64> {
        let g = &c.group;
        let rows = &self.perm[g.kept_start..g.kept_start + g.kept];
        let mut filled = 0;
        match fill {
            Fill::Key => dst.copy_from_slice(&g.key.to_le_bytes()),
            Fill::Length => dst.copy_from_slice(&(g.kept as i32).to_le_bytes()),
            Fill::FullLength => dst.copy_from_slice(&(g.len as i32).to_le_bytes()),
            Fill::Features => {
                let width = self.features.len();
                for (f, (enc, _)) in self.features.iter().enumerate() {
                    for (t, &row) in rows.iter().enumerate() {
                        let (v, was_filled) = enc.encode(row as usize)?;
                        filled += u64::from(was_filled);
                        let o = (t * width + f) * 4;
                        dst[o..o + 4].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Fill::Categorical(i) => {
                let coder = &self.categoricals[i].0;
                for (t, &row) in rows.iter().enumerate() {
                    let code = coder.code(row as usize)?;
                    dst[t * 4..t * 4 + 4].copy_from_slice(&code.to_le_bytes());
                }
            }
            Fill::Targets | Fill::ContextFeatures => {
                let want = matches!(fill, Fill::Targets);
                let Some(r) = c.ctx_row else {
                    unreachable!("context tensors exist only with a context table")
                };
                let encoders = self.context_encoders.iter().filter(|e| e.2 == want);
                for (j, (enc, _, _)) in encoders.enumerate() {
                    let (v, was_filled) = enc.encode(r as usize)?;
                    filled += u64::from(was_filled);
                    dst[j * 4..j * 4 + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        debug_assert!(g.kept <= self.max_len);
        Ok(filled)
    }
}
