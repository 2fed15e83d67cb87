//! `--profile mostlyai`: mostlyai-engine 2.7.3's preprocessing of a context table and a
//! sequential target table (`split` -> `analyze` -> `encode`), reproduced exactly and written
//! as a dsc cache: the engine's `tgt-stats.json` and `ctx-stats.json`, and shards of its
//! sub-column codes. What is identical and what differs: `docs/COMPAT-mostlyai.md`.

pub(crate) mod analyze;
mod categorical;
mod datetime;
pub mod digits;
mod encode;
mod numeric;
pub(crate) mod pyfmt;
pub mod quantiles;
mod table;

use crate::cache::{CompileOptions, CompileReport};
use crate::error::{CompileError, Result};
use crate::write::Staging;
use analyze::{ColStats, Partition};
use dsc_format::manifest::{
    ColumnSource, ColumnSpec, CompileSummary, Dtype, Encoding, Manifest, ShardEntry, TensorRole,
    TensorSpec,
};
use dsc_format::rng::{stream, Xoshiro256};
use dsc_format::spec::CompileSpec;
use dsc_format::stats::{SplitStats, Stats};
use encode::{ColEncoder, ShardInput};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The profile name.
pub const PROFILE: &str = "mostlyai";
/// The engine's statistics files in the cache.
pub const TGT_STATS_FILE: &str = "tgt-stats.json";
/// See [`TGT_STATS_FILE`].
pub const CTX_STATS_FILE: &str = "ctx-stats.json";

const SPLITS: [&str; 2] = ["train", "val"];

/// The context table and partition count of a spec, refusing what the profile does not use.
fn check_spec(spec: &CompileSpec) -> Result<(&String, usize)> {
    let ctx_path = spec.context.as_ref().ok_or_else(|| {
        CompileError::Spec("--profile mostlyai needs a context table (--context FILE)".into())
    })?;
    let partitions = spec.partitions.unwrap_or(1);
    if partitions == 0 {
        return Err(CompileError::Spec("--partitions must be at least 1".into()));
    }
    let ignored = [
        ("--features", !spec.features.is_empty()),
        ("--categorical", !spec.categorical.is_empty()),
        ("--targets", !spec.targets.is_empty()),
        ("--context-features", !spec.context_features.is_empty()),
        ("--join", !spec.joins.is_empty()),
        ("--order-by", spec.order_by.is_some()),
        ("--max-len", spec.max_len.is_some()),
        ("--encode", !spec.encode.is_empty()),
        ("--truncate", spec.truncate != Default::default()),
        ("--val-fraction (give --val-keys)", spec.val_fraction != 0.0),
        ("--split-seed (give --val-keys)", spec.split_seed != 0),
        ("--split-by (give --val-keys)", spec.split_by.is_some()),
        (
            "--split-keys (give --val-keys)",
            !spec.split_keys.is_empty(),
        ),
        ("--nan", spec.nan != Default::default()),
        (
            "--unmatched-rows",
            spec.unmatched_rows != Default::default(),
        ),
        (
            "--empty-contexts",
            spec.empty_contexts != Default::default(),
        ),
    ];
    if let Some((flag, _)) = ignored.iter().find(|(_, set)| *set) {
        return Err(CompileError::Spec(format!(
            "{flag} does not apply to --profile mostlyai: the profile encodes every column of \
             both tables as the engine does, in input order, up to the longest sequence"
        )));
    }
    Ok((ctx_path, partitions))
}

/// The context-table row of each context key (keys must be unique), and of each target row
/// (every target row must name a context: the engine raises otherwise).
fn link_keys(
    tgt: &table::MTable,
    ctx: &table::MTable,
    spec: &CompileSpec,
    ctx_path: &str,
) -> Result<(HashMap<i64, u32>, Vec<u32>)> {
    let mut ctx_index: HashMap<i64, u32> = HashMap::with_capacity(ctx.rows());
    for (row, &k) in ctx.keys.iter().enumerate() {
        if let Some(&first) = ctx_index.get(&k) {
            let (path, row) = ctx.locate(row);
            return Err(CompileError::DuplicateKey {
                path: path.into(),
                column: spec.context_key().into(),
                key: k.to_string(),
                first_row: ctx.locate(first as usize).1,
                row,
            });
        }
        ctx_index.insert(k, row as u32);
    }
    let mut tgt_ctx = Vec::with_capacity(tgt.rows());
    let mut unmatched = None;
    for (row, k) in tgt.keys.iter().enumerate() {
        match ctx_index.get(k) {
            Some(&c) => tgt_ctx.push(c),
            None => {
                let e = unmatched.get_or_insert((row, *k, 0usize));
                e.2 += 1;
            }
        }
    }
    if let Some((row, key, count)) = unmatched {
        let (path, row) = tgt.locate(row);
        return Err(CompileError::UnmatchedRows {
            path: path.into(),
            key,
            row,
            context: ctx_path.into(),
            others: count - 1,
        });
    }
    Ok((ctx_index, tgt_ctx))
}

/// Which context-table rows are validation contexts (`--val-keys`; none without it).
fn val_assignment(
    spec: &CompileSpec,
    ctx_index: &HashMap<i64, u32>,
    contexts: usize,
    ctx_path: &str,
) -> Result<Vec<bool>> {
    let mut is_val = vec![false; contexts];
    if let Some(path) = &spec.val_keys {
        for (k, line) in crate::split::read_key_list(Path::new(path))? {
            match ctx_index.get(&k) {
                Some(&c) => is_val[c as usize] = true,
                None => {
                    return Err(CompileError::BadCsv {
                        path: path.into(),
                        reason: format!(
                            "line {line}: key {k} is not in the context table {ctx_path}"
                        ),
                    })
                }
            }
        }
    }
    Ok(is_val)
}

/// Target rows grouped by context, in input order (a stable counting sort): the rows of
/// context `c` are `rows[start[c]..start[c + 1]]`.
fn group_by_context(tgt_ctx: &[u32], contexts: usize) -> (Vec<usize>, Vec<u32>) {
    let mut tgt_start = vec![0usize; contexts + 1];
    for &c in tgt_ctx {
        tgt_start[c as usize + 1] += 1;
    }
    for i in 0..contexts {
        tgt_start[i + 1] += tgt_start[i];
    }
    let mut fill = tgt_start.clone();
    let mut tgt_rows = vec![0u32; tgt_ctx.len()];
    for (row, &c) in tgt_ctx.iter().enumerate() {
        tgt_rows[fill[c as usize]] = row as u32;
        fill[c as usize] += 1;
    }
    (tgt_start, tgt_rows)
}

/// One split as written: its name, the source rows it stores and its shards in order.
type WrittenSplit = (&'static str, u64, Vec<ShardEntry>);

/// Shuffles each split's contexts with the compile shuffle and writes them as shards, in
/// parallel (writing one shard overlaps filling the next).
fn write_splits(
    input: &ShardInput,
    staging: &Staging,
    opts: &CompileOptions,
    is_val: &[bool],
    lengths: &[usize],
    per_shard: usize,
) -> Result<(Vec<WrittenSplit>, Vec<SplitStats>)> {
    let mut written_splits = Vec::new();
    let mut split_stats = Vec::new();
    for (s, name) in SPLITS.iter().enumerate() {
        let mut order: Vec<u32> = (0..is_val.len() as u32)
            .filter(|&c| is_val[c as usize] == (s == 1))
            .collect();
        if order.is_empty() {
            continue;
        }
        Xoshiro256::for_stream(input.seed, stream::COMPILE_SHUFFLE + 16 * s as u64)
            .shuffle(&mut order);
        let chunks: Vec<&[u32]> = order.chunks(per_shard).collect();
        let written: Vec<Result<ShardEntry>> = chunks
            .par_iter()
            .enumerate()
            .map(|(index, members)| {
                let file = dsc_format::shard::shard_file_name(name, index);
                let entry =
                    input.write(&staging.dir, &file, name, index, index * per_shard, members);
                opts.progress.advance(members.len() as u64);
                entry
            })
            .collect();
        let shards = written.into_iter().collect::<Result<Vec<ShardEntry>>>()?;
        let rows: u64 = order.iter().map(|&c| lengths[c as usize] as u64).sum();
        written_splits.push((*name, rows, shards));
        let lens = crate::fit::length_counts(order.iter().map(|&c| lengths[c as usize] as u64));
        split_stats.push(SplitStats {
            split: (*name).into(),
            contexts: order.len() as u64,
            rows,
            lengths: crate::fit::length_stats(&lens, input.max_len),
            columns: Vec::new(),
        });
    }
    Ok((written_splits, split_stats))
}

/// Runs the profile.
pub(crate) fn compile(spec: &CompileSpec, opts: &CompileOptions) -> Result<CompileReport> {
    let mut timer = crate::cache::Timer::start();
    let (ctx_path, partitions) = check_spec(spec)?;
    let tgt_files = crate::read::resolve(&spec.rows)?;
    let ctx_files = crate::read::resolve(std::slice::from_ref(ctx_path))?;
    let staging = Staging::create(&opts.out, opts.force)?;
    // Every file the output depends on: the resolved tables and the validation keys.
    let mut named: Vec<(PathBuf, &str)> = tgt_files.iter().map(|p| (p.clone(), "rows")).collect();
    named.extend(ctx_files.iter().map(|p| (p.clone(), "context")));
    if let Some(v) = &spec.val_keys {
        named.push((PathBuf::from(v), "val_keys"));
    }
    let stamps = crate::cache::stamp_files(&named)?;
    opts.progress.stage("reading", 2);
    let (tgt, ctx) = rayon::join(
        || table::load(&tgt_files, &spec.key),
        || table::load(&ctx_files, spec.context_key()),
    );
    let (tgt, ctx) = (tgt?, ctx?);
    timer.lap("read");

    let (ctx_index, tgt_ctx) = link_keys(&tgt, &ctx, spec, ctx_path)?;

    let is_val = val_assignment(spec, &ctx_index, ctx.rows(), ctx_path)?;
    let (parts, part_of) = analyze::partition(&is_val, &tgt_ctx, partitions);
    timer.lap("partition");

    opts.progress.stage("statistics", 2);
    let (tgt_stats, ctx_stats) = rayon::join(
        || analyze::column_stats(&tgt, &parts, true),
        || analyze::column_stats(&ctx, &parts, false),
    );
    let mut lengths = vec![0usize; ctx.rows()];
    for &c in &tgt_ctx {
        lengths[c as usize] += 1;
    }
    let seq = analyze::seq_len(&lengths);
    if seq.min == 1 && seq.max == 1 {
        return Err(CompileError::Spec(
            "every context has exactly one target row: the engine treats that as flat \
             (non-sequential) data, which --profile mostlyai does not cover"
                .into(),
        ));
    }
    let n_val = is_val.iter().filter(|&&v| v).count();
    let n_trn = ctx.rows() - n_val;
    let tgt_json = analyze::tgt_stats_json(&tgt, &tgt_stats, n_trn, n_val, seq, &spec.key);
    let ctx_json = analyze::ctx_stats_json(&ctx, &ctx_stats, spec.context_key());
    staging.write_file(TGT_STATS_FILE, &analyze::to_engine_json(&tgt_json))?;
    staging.write_file(CTX_STATS_FILE, &analyze::to_engine_json(&ctx_json))?;
    timer.lap("statistics");

    // Encoders and the tensor list.
    let max_len = seq.max;
    let tgt_refs: Vec<&[u32]> = parts
        .iter()
        .map(|p: &Partition| p.tgt_rows.as_slice())
        .collect();
    let ctx_refs: Vec<&[u32]> = parts
        .iter()
        .map(|p: &Partition| p.ctx_rows.as_slice())
        .collect();
    let tgt_enc: Vec<ColEncoder> = (0..tgt.cols.len())
        .map(|c| ColEncoder::new(&tgt, c, &tgt_stats[c], &tgt_refs))
        .collect();
    let ctx_enc: Vec<ColEncoder> = (0..ctx.cols.len())
        .map(|c| ColEncoder::new(&ctx, c, &ctx_stats[c], &ctx_refs))
        .collect();
    let tensors = tensor_list(&tgt, &tgt_stats, &ctx, &ctx_stats, max_len, &spec.key);

    let (tgt_start, tgt_rows) = group_by_context(&tgt_ctx, ctx.rows());

    let input = ShardInput {
        tensors: &tensors,
        max_len,
        ctx_keys: &ctx.keys,
        tgt_start: &tgt_start,
        tgt_rows: &tgt_rows,
        part_of: &part_of,
        tgt_cols: &tgt_enc,
        ctx_cols: &ctx_enc,
        seed: spec.seed,
    };
    let bytes_per_context: usize = tensors.iter().map(TensorSpec::sample_bytes).sum();
    let per_shard = ((spec.shard_size as usize) / bytes_per_context.max(1)).max(1);
    opts.progress.stage("encoding", ctx.rows() as u64);
    let (written, mut split_stats) =
        write_splits(&input, &staging, opts, &is_val, &lengths, per_shard)?;
    timer.lap("encode");

    let mut resolved = spec.clone();
    resolved.context_key = Some(spec.context_key().to_string());
    resolved.partitions = Some(partitions);
    let inputs = crate::cache::fingerprint_files(&named, &stamps)?;
    let mut manifest = Manifest::builder(
        env!("CARGO_PKG_VERSION"),
        max_len,
        tensors,
        inputs,
        resolved,
    );
    for (name, rows, shards) in written {
        manifest = manifest.split(name, rows, shards);
    }
    let manifest = manifest.summary(CompileSummary {
        rows_read: tgt.rows() as u64,
        rows_stored: tgt.rows() as u64,
        contexts: ctx.rows(),
        contexts_without_rows: lengths.iter().filter(|&&l| l == 0).count(),
        empty_contexts_kept: lengths.iter().filter(|&&l| l == 0).count(),
        ..CompileSummary::default()
    });
    // dsc's own stats.json: lengths per split, with the "all" entry readers expect first.
    let all_lengths = crate::fit::length_counts(lengths.iter().map(|&l| l as u64));
    split_stats.insert(
        0,
        SplitStats {
            split: dsc_format::stats::ALL_SPLITS.into(),
            contexts: ctx.rows() as u64,
            rows: tgt.rows() as u64,
            lengths: crate::fit::length_stats(&all_lengths, max_len),
            columns: Vec::new(),
        },
    );
    let stats = Stats {
        format_version: dsc_format::FORMAT_VERSION,
        splits: split_stats,
    };
    crate::cache::commit_cache(staging, manifest, stats, timer)
}

/// `key`, `length`, the context sub-columns, the positional and target sub-columns.
fn tensor_list(
    tgt: &table::MTable,
    tgt_stats: &[ColStats],
    ctx: &table::MTable,
    ctx_stats: &[ColStats],
    max_len: usize,
    key: &str,
) -> Vec<TensorSpec> {
    let derived = |name: &str, source: ColumnSource, ty: &str| ColumnSpec {
        name: name.into(),
        source,
        source_type: ty.into(),
        encoding: Encoding::Raw,
    };
    let mut out = vec![
        TensorSpec {
            name: "key".into(),
            dtype: Dtype::I64,
            role: TensorRole::Key,
            sample_shape: vec![],
            columns: vec![derived(key, ColumnSource::Context, "Int64")],
        },
        TensorSpec {
            name: "length".into(),
            dtype: Dtype::I32,
            role: TensorRole::Length,
            sample_shape: vec![],
            columns: vec![derived("length", ColumnSource::Rows, "derived")],
        },
    ];
    // One code tensor of a sub-column: `[n]` per context, `[n, max_len + 1]` per target step.
    let sub = |name: &str, card: usize, col: &str, ty: &str, context: bool| TensorSpec {
        name: name.into(),
        dtype: Dtype::I32,
        role: if context {
            TensorRole::ContextSubColumn
        } else {
            TensorRole::SubColumn
        },
        sample_shape: if context { vec![] } else { vec![max_len + 1] },
        columns: vec![ColumnSpec {
            name: col.into(),
            source: if context {
                ColumnSource::Context
            } else {
                ColumnSource::Rows
            },
            source_type: ty.into(),
            encoding: Encoding::SubColumn {
                sub_column: name.into(),
                cardinality: card,
                stats: if context {
                    CTX_STATS_FILE
                } else {
                    TGT_STATS_FILE
                }
                .into(),
            },
        }],
    };
    let ctx_names = analyze::sub_column_names(ctx, ctx_stats, "ctxflt");
    for (col, subs) in ctx.cols.iter().zip(ctx_names) {
        for (name, card) in subs {
            out.push(sub(&name, card, &col.name, &col.source_type, true));
        }
    }
    for (name, card) in encode::positional_columns(max_len) {
        out.push(sub(&name, card, "(position)", "derived", false));
    }
    let tgt_names = analyze::sub_column_names(tgt, tgt_stats, "tgt");
    for (col, subs) in tgt.cols.iter().zip(tgt_names) {
        for (name, card) in subs {
            out.push(sub(&name, card, &col.name, &col.source_type, false));
        }
    }
    out
}
#[cfg(test)]
mod vector_tests;
