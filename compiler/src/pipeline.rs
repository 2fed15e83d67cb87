//! The compile, stage by stage: plan → read → group → join contexts → split → statistics and
//! encodings → shuffle → shards → stats.json → manifest.json → commit.

use crate::column::Values;
use crate::encode::{self, Access, CategoryCoder, NumericEncoder, DROPPED, TRAIN};
use crate::error::{CompileError, Result};
use crate::group::{self, Group};
use crate::lookup::{self, Keyed};
use crate::plan::{self, Source};
use crate::read::{self, Role, Want};
use crate::split;
use crate::write::{ShardWriter, Staging};
use crate::Progress;
use dsc_format::manifest::{CompileSummary, InputFile, Inputs};
use dsc_format::rng::{stream, Xoshiro256};
use dsc_format::spec::{CompileSpec, EmptyContexts, UnmatchedRows};
use dsc_format::stats::{Bin, ColumnStats, LengthStats, SplitStats, QUANTILE_LEVELS};
use dsc_format::{
    shard, ColumnSource, ColumnSpec, Dtype, Encoding, Manifest, ManifestBuilder, ShardEntry, Stage,
    Stats, TensorRole, TensorSpec,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Where and how to write.
pub struct CompileOptions<'a> {
    /// The cache directory to create.
    pub out: PathBuf,
    /// Replace `out` if it exists and is not empty.
    pub force: bool,
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

/// A per-row column after its statistics pass.
enum Fitted<'a> {
    Categorical(Vec<ColumnStats>, CategoryCoder<'a>, ColumnSpec),
    Numeric(Vec<ColumnStats>, NumericEncoder<'a>, ColumnSpec),
}

/// One stored context.
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

fn run(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let progress = opts.progress;
    let mut timer = Timer::start();
    let plan = plan::plan(spec)?;
    if opts.force {
        refuse_inputs_inside(&opts.out, spec, &plan.rows_files)?;
    }
    let staging = Staging::create(&opts.out, opts.force)?;
    let named_inputs = input_files(spec, &plan.rows_files);
    let stamps = stamp_files(&named_inputs)?;

    progress.stage("reading", plan.rows_files.len() as u64);
    let rows = read::read_rows(&plan.rows_files, plan.rows_wants.clone())?;
    let key_col = &rows.columns[0];
    if let Some(valid) = &key_col.valid {
        if let Some(row) = valid.iter().position(|v| !v) {
            let (path, row) = rows.locate(row);
            return Err(CompileError::NullKey {
                path: path.into(),
                column: spec.key.clone(),
                row,
            });
        }
    }
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
    progress.advance(plan.rows_files.len() as u64);
    timer.lap("read");

    progress.stage("grouping", 0);
    let Values::Int(keys) = &key_col.values else {
        unreachable!("the key is an integer column; checked when opened")
    };
    let order = spec.order_by.as_deref().and_then(|o| rows.column(o));
    let mut grouped = group::group(keys, order);
    let mut summary = CompileSummary {
        rows_read: rows.rows() as u64,
        ..Default::default()
    };
    let mut contexts = match_contexts(spec, &rows, &grouped, context.as_ref(), &mut summary)?;
    let max_len = plan.max_len_given.unwrap_or_else(|| {
        contexts
            .iter()
            .map(|c| c.group.len)
            .max()
            .unwrap_or(1)
            .clamp(1, plan::MAX_LEN)
    });
    // Sampling is seeded by the split seed, not the shuffle seed, so that a reshuffle stores
    // exactly the same rows.
    group::truncate(&mut grouped, max_len, spec.truncate, spec.split_seed);
    // `truncate` rewrote the groups in `grouped`; refresh the copies held by contexts.
    refresh_groups(&mut contexts, &grouped.groups);
    summary.contexts_truncated = contexts.iter().filter(|c| c.group.len > max_len).count();
    let members: Vec<split::Member> = contexts
        .iter()
        .map(|c| split::Member {
            key: c.group.key,
            ctx_row: c.ctx_row,
        })
        .collect();
    let splits = split::assign(spec, &members, context.as_ref())?;
    for (c, &s) in contexts.iter_mut().zip(&splits.of) {
        c.split = s;
    }
    let n_splits = splits.names.len();
    let mut row_tags = vec![DROPPED; rows.rows()];
    for c in &contexts {
        for &r in &grouped.perm[c.group.start..c.group.start + c.group.len] {
            row_tags[r as usize] = c.split;
        }
    }
    let ctx_tags: Vec<u8> = match &context {
        None => Vec::new(),
        Some(k) => {
            let mut tags = vec![DROPPED; k.table.rows()];
            for c in &contexts {
                if let Some(r) = c.ctx_row {
                    tags[r as usize] = c.split;
                }
            }
            tags
        }
    };
    timer.lap("group");

    progress.stage(
        "statistics",
        (plan.row_columns.len() + spec.targets.len() + spec.context_features.len()) as u64,
    );
    let mut column_stats: Vec<Vec<ColumnStats>> = Vec::new();
    let mut features: Vec<(NumericEncoder, ColumnSpec)> = Vec::new();
    let mut categoricals: Vec<(CategoryCoder, ColumnSpec)> = Vec::new();
    // Columns are independent: fit them in parallel, then take results (and the first error)
    // in column order so the outcome does not depend on scheduling.
    let fitted: Vec<Result<Fitted>> = plan
        .row_columns
        .par_iter()
        .map(|rc| {
            let (column, join, source) = match rc.source {
                Source::Rows => (
                    rows.column(&rc.name).expect("read"),
                    None,
                    ColumnSource::Rows,
                ),
                Source::Join(j) => {
                    let keyed = &joins[j];
                    let on = rows.column(&keyed.key).expect("join column read");
                    (
                        keyed.column(&rc.name).expect("read"),
                        Some((on, keyed)),
                        ColumnSource::Join {
                            file: keyed.path.display().to_string(),
                            on: keyed.key.clone(),
                        },
                    )
                }
            };
            let access = Access {
                name: &rc.name,
                table: &rows,
                column,
                join,
            };
            let result = if rc.categorical {
                let (stats, encoding, coder) =
                    encode::categorical_column(access, &row_tags, n_splits)?;
                let spec_col = column_spec(&rc.name, source, column, encoding);
                Fitted::Categorical(stats, coder, spec_col)
            } else {
                let chain = chain_of(spec, &rc.name)?;
                let fitted = encode::numeric_column(&access, &row_tags, n_splits, &chain)?;
                let encoder = NumericEncoder::new(access, &fitted, spec.nan);
                encoder.check_rows(&fitted, &row_tags)?;
                let spec_col = column_spec(&rc.name, source, column, encoder.encoding());
                Fitted::Numeric(fitted.stats, encoder, spec_col)
            };
            progress.advance(1);
            Ok(result)
        })
        .collect();
    for f in fitted {
        match f? {
            Fitted::Categorical(stats, coder, spec_col) => {
                column_stats.push(stats);
                categoricals.push((coder, spec_col));
            }
            Fitted::Numeric(stats, encoder, spec_col) => {
                column_stats.push(stats);
                features.push((encoder, spec_col));
            }
        }
    }
    let mut context_encoders: Vec<(NumericEncoder, ColumnSpec, bool)> = Vec::new();
    if let Some(k) = &context {
        let names = spec
            .targets
            .iter()
            .map(|n| (n, true))
            .chain(spec.context_features.iter().map(|n| (n, false)));
        for (name, is_target) in names {
            let column = k.column(name).expect("read");
            let access = Access {
                name,
                table: &k.table,
                column,
                join: None,
            };
            let chain = chain_of(spec, name)?;
            let fitted = encode::numeric_column(&access, &ctx_tags, n_splits, &chain)?;
            let encoder = NumericEncoder::new(access, &fitted, spec.nan);
            encoder.check_rows(&fitted, &ctx_tags)?;
            let mut stats = fitted.stats.clone();
            stats.iter_mut().for_each(|s| s.table = "context".into());
            column_stats.push(stats);
            let spec_col = column_spec(name, ColumnSource::Context, column, encoder.encoding());
            context_encoders.push((encoder, spec_col, is_target));
            progress.advance(1);
        }
    }
    let stats = build_stats(&contexts, &splits.names, max_len, column_stats);
    timer.lap("statistics");

    let key_column = column_spec(&spec.key, ColumnSource::Rows, key_col, Encoding::Raw);
    let (tensors, fills) = tensor_layout(
        max_len,
        key_column,
        &features,
        &categoricals,
        &context_encoders,
    );
    let per_context: usize = tensors.iter().map(TensorSpec::sample_bytes).sum();
    let per_shard = ((spec.shard_size as usize) / per_context.max(1)).max(1);
    let mut jobs: Vec<ShardJob> = Vec::new();
    for split in 0..n_splits as u8 {
        let mut order: Vec<usize> = (0..contexts.len())
            .filter(|&i| contexts[i].split == split)
            .collect();
        Xoshiro256::for_stream(spec.seed, stream::COMPILE_SHUFFLE + 16 * u64::from(split))
            .shuffle(&mut order);
        for (index, members) in order.chunks(per_shard).enumerate() {
            jobs.push(ShardJob {
                split,
                index,
                first: index * per_shard,
                members: members.to_vec(),
            });
        }
    }
    timer.lap("shuffle");

    progress.stage("writing shards", jobs.len() as u64);
    let filled = AtomicU64::new(0);
    let writer = ShardContext {
        split_names: &splits.names,
        tensors: &tensors,
        fills: &fills,
        contexts: &contexts,
        perm: &grouped.perm,
        features: &features,
        categoricals: &categoricals,
        context_encoders: &context_encoders,
        max_len,
        filled: &filled,
    };
    let shards: Vec<ShardEntry> = jobs
        .par_iter()
        .map(|job| {
            let entry = writer.write(job, &staging.dir);
            progress.advance(1);
            entry
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    summary.values_filled = filled.load(Ordering::Relaxed);
    timer.lap("write");

    summary.contexts = contexts.len();
    let inputs = fingerprint_files(&named_inputs, &stamps)?;
    let mut builder = Manifest::builder(
        env!("CARGO_PKG_VERSION"),
        max_len,
        tensors,
        inputs,
        resolved_spec(spec, max_len),
    );
    for (s, name) in splits.names.iter().enumerate() {
        let s = s as u8;
        let rows_stored: u64 = contexts
            .iter()
            .filter(|c| c.split == s)
            .map(|c| c.group.kept as u64)
            .sum();
        summary.rows_stored += rows_stored;
        let mine = shards
            .iter()
            .filter(|e| e.split == *name)
            .cloned()
            .collect();
        builder = builder.split(name, rows_stored, mine);
    }
    let manifest = builder.summary(summary);
    commit_cache(staging, manifest, stats, timer)
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

fn match_contexts(
    spec: &CompileSpec,
    rows: &read::RowsTable,
    grouped: &group::Groups,
    context: Option<&Keyed>,
    summary: &mut CompileSummary,
) -> Result<Vec<Context>> {
    let Some(ctx) = context else {
        return Ok(grouped
            .groups
            .iter()
            .map(|&group| Context {
                group,
                ctx_row: None,
                split: TRAIN,
            })
            .collect());
    };
    let mut contexts = Vec::with_capacity(grouped.groups.len());
    let mut seen = vec![false; ctx.table.rows()];
    let mut unmatched: Vec<&Group> = Vec::new();
    for g in &grouped.groups {
        match ctx.index.get(g.key) {
            Some(r) => {
                seen[r as usize] = true;
                contexts.push(Context {
                    group: *g,
                    ctx_row: Some(r),
                    split: TRAIN,
                });
            }
            None => unmatched.push(g),
        }
    }
    if let Some(first) = unmatched.first() {
        if spec.unmatched_rows == UnmatchedRows::Error {
            let (path, row) = rows.locate(grouped.perm[first.start] as usize);
            return Err(CompileError::UnmatchedRows {
                path: path.into(),
                row,
                key: first.key,
                context: ctx.path.clone(),
                others: unmatched.len() - 1,
            });
        }
        summary.contexts_without_context_row = unmatched.len();
        summary.rows_without_context_row = unmatched.iter().map(|g| g.len as u64).sum();
    }
    let Values::Int(ctx_keys) = &ctx.table.columns[0].values else {
        unreachable!("context keys are integers")
    };
    let empty: Vec<usize> = (0..seen.len()).filter(|&r| !seen[r]).collect();
    summary.contexts_without_rows = empty.len();
    if let Some(&first) = empty.first() {
        match spec.empty_contexts {
            EmptyContexts::Error => {
                return Err(CompileError::EmptyContexts {
                    context: ctx.path.clone(),
                    row: first as u64,
                    key: ctx_keys[first],
                    others: empty.len() - 1,
                })
            }
            EmptyContexts::Drop => {}
            EmptyContexts::Keep => {
                summary.empty_contexts_kept = empty.len();
                for r in empty {
                    contexts.push(Context {
                        group: Group {
                            key: ctx_keys[r],
                            start: 0,
                            len: 0,
                            kept_start: 0,
                            kept: 0,
                        },
                        ctx_row: Some(r as u32),
                        split: TRAIN,
                    });
                }
                contexts.sort_by_key(|c| c.group.key);
            }
        }
    }
    Ok(contexts)
}

fn chain_of(spec: &CompileSpec, name: &str) -> Result<Vec<Stage>> {
    match spec.encode.get(name) {
        Some(chain) => plan::parse_chain(name, chain),
        None => Ok(vec![Stage::Identity]),
    }
}

fn column_spec(
    name: &str,
    source: ColumnSource,
    column: &crate::column::Column,
    encoding: Encoding,
) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        source,
        source_type: column.info.name.clone(),
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
    contexts: &[Context],
    split_names: &[String],
    max_len: usize,
    columns: Vec<Vec<ColumnStats>>,
) -> Stats {
    let mut splits = Vec::new();
    let names = std::iter::once(dsc_format::stats::ALL_SPLITS)
        .chain(split_names.iter().map(String::as_str));
    for (i, name) in names.enumerate() {
        let mut lengths: Vec<f64> = contexts
            .iter()
            .filter(|c| i == 0 || c.split as usize == i - 1)
            .map(|c| c.group.len as f64)
            .collect();
        let rows = lengths.iter().sum::<f64>() as u64;
        splits.push(SplitStats {
            split: name.into(),
            contexts: lengths.len() as u64,
            rows,
            lengths: length_stats(&mut lengths, max_len),
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
    features: &[(NumericEncoder, ColumnSpec)],
    categoricals: &[(CategoryCoder, ColumnSpec)],
    context: &[(NumericEncoder, ColumnSpec, bool)],
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
            columns: features.iter().map(|f| f.1.clone()).collect(),
        });
        fills.push(Fill::Features);
    }
    for (i, (_, col)) in categoricals.iter().enumerate() {
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
            .filter(|c| c.2 == want)
            .map(|c| c.1.clone())
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
