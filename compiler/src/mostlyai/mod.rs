//! `--profile mostlyai`: mostlyai-engine 2.7.3's preprocessing of a context table and a
//! sequential target table (`split` -> `analyze` -> `encode`), reproduced exactly and written
//! as a dsc cache: the engine's `tgt-stats.json` and `ctx-stats.json`, and shards of its
//! sub-column codes. What is identical and what differs: `docs/COMPAT-mostlyai.md`.
//!
//! It runs dsc's bucketed passes over both tables: spill (`crate::spill`) → per bucket:
//! link rows to contexts and engine partitions (`bucket`), one piece per column and partition
//! (`analyze`), folded in bucket order → the engine's reduction → per bucket: encode and write
//! its shards (`encode`, `crate::shards`) → `crate::commit` commits. [`Profile`] supplies these
//! steps as a `crate::recipe::Recipe` to the drivers (`crate::local`, `crate::partition`).

pub(crate) mod analyze;
pub(crate) mod bucket;
mod categorical;
mod datetime;
pub mod digits;
mod encode;
mod numeric;
pub(crate) mod pyfmt;
pub mod quantiles;
mod spec;
mod table;

use crate::budget;
use crate::commit::{self, CompileReport, Timer};
use crate::error::{CompileError, Result};
use crate::fit::{self, LengthCounts};
use crate::lookup::ContextPart;
use crate::phases::Phases;
use crate::read::Inputs as ReadInputs;
use crate::recipe::Recipe;
use crate::runs::{Pool, Run, RunsFile, ValueRuns};
use crate::shards::{Numbering, WritePart};
use crate::spill::{self, SpillPart, SpillTo};
use crate::write::Staging;
use crate::Progress;
use analyze::{ColStats, Piece};
use bucket::{Setup, Side, Spills, Unmatched};
use dsc_format::manifest::{
    ColumnSource, ColumnSpec, CompileSummary, Dtype, Encoding, Inputs, Manifest, ShardEntry,
    TensorRole, TensorSpec,
};
use dsc_format::rng::position_hash;
use dsc_format::spec::CompileSpec;
use dsc_format::spelling::OptionError;
use dsc_format::stats::{SplitStats, Stats};
use encode::{ColEncoder, ShardInput};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::Path;
use table::MTable;

/// The profile name.
pub const PROFILE: &str = "mostlyai";
/// The engine's statistics files in the cache.
pub const TGT_STATS_FILE: &str = "tgt-stats.json";
/// See [`TGT_STATS_FILE`].
pub const CTX_STATS_FILE: &str = "ctx-stats.json";

const SPLITS: [&str; 2] = ["train", "val"];

/// What the statistics pass found in a range of buckets: each column's piece per engine
/// partition, merged over the buckets in bucket order (so its size does not grow with them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FitPart {
    /// `[column][partition]`.
    tgt: Vec<Vec<Piece>>,
    ctx: Vec<Vec<Piece>>,
    /// Contexts of each length, per split (train, val).
    lengths: [LengthCounts; 2],
    /// Each bucket's contexts per split, in bucket order (where its shards start).
    bucket_contexts: Vec<[u64; 2]>,
    unmatched: Unmatched,
}

impl FitPart {
    /// Adds `o`, the part of later buckets.
    fn merge(&mut self, o: FitPart) {
        for (mine, theirs) in [(&mut self.tgt, o.tgt), (&mut self.ctx, o.ctx)] {
            for (a, b) in mine.iter_mut().zip(theirs) {
                for (pa, pb) in a.iter_mut().zip(b) {
                    pa.merge(pb);
                }
            }
        }
        for (all, mine) in self.lengths.iter_mut().zip(o.lengths) {
            for (l, n) in mine {
                *all.entry(l).or_insert(0) += n;
            }
        }
        self.bucket_contexts.extend(o.bucket_contexts);
        self.unmatched.add(o.unmatched);
    }
}

/// A partition task with no buckets: every piece empty.
fn empty_pieces(side: &Side, parts: usize) -> Vec<Vec<Piece>> {
    side.families
        .iter()
        .map(|&f| (0..parts).map(|_| analyze::empty_piece(f)).collect())
        .collect()
}

/// One table's reduced statistics, and what encoding needs besides them.
struct Reduction {
    stats: Vec<ColStats>,
    /// Per column: pandas keeps it int64 (an integer column without nulls).
    int64: Vec<bool>,
    /// Per column, per partition: the runs of its non-null values, in bucket order (the
    /// imputation donors).
    donors: Vec<Vec<Vec<Run>>>,
}

/// Every bucket's statistics merged, the engine's reduction, and the layout they decide.
pub(crate) struct Reduced {
    tgt: Reduction,
    ctx: Reduction,
    tgt_json: Vec<u8>,
    ctx_json: Vec<u8>,
    max_len: usize,
    tensors: Vec<TensorSpec>,
    /// The splits that have contexts (0 train, 1 val), in order.
    splits: Vec<usize>,
    numbering: Numbering,
    /// Contexts of each length, per split.
    lengths: [LengthCounts; 2],
}

/// Reduces one table's columns from their merged pieces, `[column][partition]`.
fn reduce_side(side: &Side, pieces: &[Vec<Piece>], files: &[RunsFile]) -> Result<Reduction> {
    let columns: Vec<(ColStats, bool, Vec<Vec<Run>>)> = (0..side.names.len())
        .into_par_iter()
        .map(|c| {
            let by_part: Vec<&Piece> = pieces[c].iter().collect();
            let int64 = side.integer[c] && !analyze::has_nulls(by_part.iter().copied());
            let int_keys = side.integer[c].then_some(int64);
            let stats = analyze::reduce(side.families[c], &by_part, files, int_keys)?;
            let donors = by_part.iter().map(|p| p.runs().to_vec()).collect();
            Ok((stats, int64, donors))
        })
        .collect::<Result<_>>()?;
    let mut out = Reduction {
        stats: Vec::new(),
        int64: Vec::new(),
        donors: Vec::new(),
    };
    for (s, i, d) in columns {
        out.stats.push(s);
        out.int64.push(i);
        out.donors.push(d);
    }
    Ok(out)
}

fn all_lengths(per_split: &[LengthCounts; 2]) -> LengthCounts {
    let mut all = per_split[0].clone();
    for (&l, &n) in &per_split[1] {
        *all.entry(l).or_insert(0) += n;
    }
    all
}

/// One bucket's encoders of one table's columns.
fn encoders<'a>(
    table: &'a MTable,
    r: &Reduction,
    pools: &'a [Vec<Pool<'a>>],
) -> Vec<ColEncoder<'a>> {
    (0..r.stats.len())
        .map(|c| ColEncoder::new(table, c, &r.stats[c], Some(&pools[c][..]), r.int64[c]))
        .collect()
}

/// One table's donor pools, per column and partition.
fn pools<'f>(r: &Reduction, files: &'f [RunsFile]) -> Vec<Vec<Pool<'f>>> {
    r.donors
        .iter()
        .map(|parts| {
            parts
                .iter()
                .map(|runs| Pool::new(files, runs.iter().copied()))
                .collect()
        })
        .collect()
}

/// The profile's compile of a spec: both tables' footers open, the buckets sized and the
/// validation contexts found.
pub(crate) struct Profile<'s> {
    setup: Setup<'s>,
    /// The opened target and context files, until the scans read them.
    tgt_in: Option<ReadInputs>,
    ctx_in: Option<ReadInputs>,
    rows_files: usize,
    context_files: usize,
    /// Where this compile's time goes (the reads; the rest is the profile's own).
    phases: Phases,
}

impl<'s> Profile<'s> {
    /// Checks `spec` and opens both tables.
    pub fn new(spec: &'s CompileSpec) -> Result<Profile<'s>> {
        let (setup, tgt_in, ctx_in) = Setup::new(spec)?;
        Ok(Profile {
            setup,
            rows_files: tgt_in.opened.len(),
            context_files: ctx_in.opened.len(),
            tgt_in: Some(tgt_in),
            ctx_in: Some(ctx_in),
            phases: Phases::default(),
        })
    }
}

impl<'s> Recipe for Profile<'s> {
    type Spilled = Spills;
    type FitPart = FitPart;
    type Fitted = Reduced;

    fn inputs(&self) -> &[(std::path::PathBuf, &'static str)] {
        &self.setup.named
    }

    fn phases(&self) -> &Phases {
        &self.phases
    }

    fn rows_files(&self) -> usize {
        self.rows_files
    }

    fn files_to_read(&self) -> usize {
        self.rows_files + self.context_files
    }

    fn buckets(&self) -> crate::spill::Buckets {
        self.setup.buckets
    }

    fn has_context(&self) -> bool {
        true
    }

    fn decoded_bytes(&self) -> u64 {
        let (tgt, ctx) = (&self.setup.tgt, &self.setup.ctx);
        tgt.rows() * tgt.width + ctx.rows() * ctx.width
    }

    fn scan(
        &mut self,
        files: Range<usize>,
        to: SpillTo,
        progress: &dyn Progress,
    ) -> Result<SpillPart> {
        let inputs = self.tgt_in.take().expect("a recipe is scanned once");
        let whole = spill::KeyFilter::default();
        let wants = &self.setup.tgt.wants;
        spill::spill_rows(inputs, files, wants, to, &whole, progress, &self.phases)
    }

    fn scan_context(
        &mut self,
        to: SpillTo,
        progress: &dyn Progress,
    ) -> Result<Option<ContextPart>> {
        let inputs = self.ctx_in.take().expect("a recipe is scanned once");
        let all = 0..self.context_files;
        let whole = spill::KeyFilter::default();
        let wants = &self.setup.ctx.wants;
        let spill = spill::spill_rows(inputs, all, wants, to, &whole, progress, &self.phases)?;
        Ok(Some(ContextPart::of_spill(spill, self.setup.ctx.rows())))
    }

    fn spilled(
        &mut self,
        dir: &Path,
        rows: Vec<SpillPart>,
        context: Option<ContextPart>,
    ) -> Result<Spills> {
        let context = context.expect("the drivers hand the profile its context table");
        Ok(self.setup.spills(dir, rows, context.into_spill()))
    }

    fn at_once(&self, spills: &Spills, budget: u64) -> Result<usize> {
        let setup = &self.setup;
        let (largest, bytes) = (0..setup.buckets.count())
            .map(|b| {
                (
                    spills.tgt.rows(b) + spills.ctx.rows(b),
                    setup.bucket_bytes(spills, b),
                )
            })
            .max_by_key(|x| x.1)
            .unwrap_or((0, 0));
        budget::at_once(largest, bytes, budget)
    }

    /// The statistics pass over the buckets of `range`: each prepared and summarised per column
    /// and engine partition, folded in bucket order; sorted values go to `runs`.
    fn fit(
        &self,
        spills: &Spills,
        range: Range<usize>,
        at_once: usize,
        runs: &ValueRuns,
        progress: &dyn Progress,
    ) -> Result<FitPart> {
        let setup = &self.setup;
        let parts = 2 * setup.profile.partitions;
        let fit_one = |b: usize| -> Result<FitPart> {
            let bucket = setup.prepare(spills, b)?;
            let (tgt_rows, ctx_rows) = bucket.rows_by_part(parts);
            let (tgt, ctx) = rayon::join(
                || analyze::pieces(&bucket.tgt, &tgt_rows, runs),
                || analyze::pieces(&bucket.ctx, &ctx_rows, runs),
            );
            let mut lengths = [LengthCounts::new(), LengthCounts::new()];
            let mut contexts = [0u64; 2];
            for c in 0..bucket.ctx.rows() {
                let split = usize::from(bucket.is_val(c));
                *lengths[split].entry(bucket.length(c) as u64).or_insert(0) += 1;
                contexts[split] += 1;
            }
            Ok(FitPart {
                tgt: tgt?,
                ctx: ctx?,
                lengths,
                bucket_contexts: vec![contexts],
                unmatched: bucket.unmatched,
            })
        };
        // A few buckets at a time, each folded in as soon as its turn comes.
        let mut all: Option<FitPart> = None;
        let step = at_once.max(1);
        for start in range.clone().step_by(step) {
            let end = (start + step).min(range.end);
            for part in fit::for_buckets(start..end, at_once, progress, fit_one)? {
                match &mut all {
                    None => all = Some(part),
                    Some(a) => a.merge(part),
                }
            }
        }
        Ok(all.unwrap_or_else(|| FitPart {
            tgt: empty_pieces(&setup.tgt, parts),
            ctx: empty_pieces(&setup.ctx, parts),
            lengths: Default::default(),
            bucket_contexts: Vec::new(),
            unmatched: Unmatched::default(),
        }))
    }

    /// Merges every fit part (in partition order: every bucket once, in bucket order) into the
    /// engine's statistics and the cache's layout; `files` are the values files, in order.
    fn reduce(&self, _: &Spills, fits: Vec<FitPart>, files: &[RunsFile]) -> Result<Reduced> {
        let setup = &self.setup;
        let mut fits = fits.into_iter();
        let mut fit = fits.next().expect("at least one fit part");
        for f in fits {
            fit.merge(f);
        }
        let unmatched = fit.unmatched;
        if let Some((row, key)) = unmatched.first {
            let t = &setup.tgt;
            let file = t.offsets.partition_point(|&o| o <= row) - 1;
            return Err(CompileError::UnmatchedRows {
                path: t.files[file].clone(),
                key: key.to_string(),
                row: row - t.offsets[file],
                context: setup.profile.context.clone().into(),
                others: (unmatched.rows - 1) as usize,
            });
        }
        let (tgt, ctx) = rayon::join(
            || reduce_side(&setup.tgt, &fit.tgt, files),
            || reduce_side(&setup.ctx, &fit.ctx, files),
        );
        let (tgt, ctx) = (tgt?, ctx?);
        let lengths = fit.lengths;
        let seq = analyze::seq_len(&all_lengths(&lengths));
        if seq.min == 1 && seq.max == 1 {
            return Err(OptionError::new(
                "profile",
                "mostlyai does not cover flat data, and every context has exactly one target row \
                 (the engine treats that as non-sequential)",
            )
            .into());
        }
        let contexts = |s: usize| lengths[s].values().sum::<u64>() as usize;
        let tgt_json = analyze::tgt_stats_json(
            &setup.tgt.names,
            &tgt.stats,
            contexts(0),
            contexts(1),
            seq,
            &setup.profile.key,
        );
        let ctx_json =
            analyze::ctx_stats_json(&setup.ctx.names, &ctx.stats, &setup.profile.context_key);
        let max_len = seq.max;
        let tensors = tensor_list(setup, &tgt.stats, &ctx.stats, max_len);
        let splits: Vec<usize> = (0..SPLITS.len()).filter(|&s| contexts(s) > 0).collect();
        let bucket_contexts: Vec<Vec<u64>> = fit
            .bucket_contexts
            .iter()
            .map(|c| splits.iter().map(|&s| c[s]).collect())
            .collect();
        let numbering = Numbering::new(
            &bucket_contexts,
            Numbering::per_shard(&tensors, setup.profile.shard_size),
        );
        Ok(Reduced {
            tgt,
            ctx,
            tgt_json: analyze::to_engine_json(&tgt_json),
            ctx_json: analyze::to_engine_json(&ctx_json),
            max_len,
            tensors,
            splits,
            numbering,
            lengths,
        })
    }

    /// The shards pass over the buckets of `range`: each prepared again, encoded with the reduced
    /// statistics and written as its own shards into `dir`. Each split is stored ascending by
    /// `(position_hash(key, seed), key)`, as dsc's own compile stores it.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        spills: &Spills,
        reduced: &Reduced,
        files: &[RunsFile],
        range: Range<usize>,
        at_once: usize,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<WritePart> {
        let setup = &self.setup;
        let seed = setup.profile.seed;
        let (tgt_pools, ctx_pools) = (pools(&reduced.tgt, files), pools(&reduced.ctx, files));
        let done = fit::for_buckets(range, at_once, progress, |b| {
            let bucket = setup.prepare(spills, b)?;
            let tgt_cols = encoders(&bucket.tgt, &reduced.tgt, &tgt_pools);
            let ctx_cols = encoders(&bucket.ctx, &reduced.ctx, &ctx_pools);
            let input = ShardInput {
                tensors: &reduced.tensors,
                max_len: reduced.max_len,
                ctx_keys: &bucket.ctx.keys,
                ctx_origin: &bucket.ctx.origin,
                part_of: &bucket.part_of,
                tgt_start: &bucket.tgt_start,
                tgt_rows: &bucket.tgt_rows,
                tgt_origin: &bucket.tgt.origin,
                tgt_cols: &tgt_cols,
                ctx_cols: &ctx_cols,
                seed,
            };
            let mut jobs = Vec::new();
            let mut rows_stored = vec![0u64; reduced.splits.len()];
            for (s, &split) in reduced.splits.iter().enumerate() {
                let mut order: Vec<(u64, i64, u32)> = (0..bucket.ctx.rows())
                    .filter(|&c| usize::from(bucket.is_val(c)) == split)
                    .map(|c| {
                        let key = bucket.ctx.keys[c];
                        rows_stored[s] += bucket.length(c) as u64;
                        (position_hash(key, seed), key, c as u32)
                    })
                    .collect();
                order.sort_unstable();
                let members: Vec<u32> = order.into_iter().map(|o| o.2).collect();
                for (index, first, chunk) in reduced.numbering.shards(b, s, &members) {
                    jobs.push((SPLITS[split], index, first, chunk.to_vec()));
                }
            }
            let entries = jobs
                .par_iter()
                .map(|(split, index, first, members)| {
                    input.write(dir, split, *index, *first, members)
                })
                .collect::<Result<Vec<ShardEntry>>>()?;
            Ok((entries, rows_stored))
        })?;
        let mut out = WritePart {
            entries: Vec::new(),
            rows_stored: vec![0; reduced.splits.len()],
            truncated: 0,
            filled: 0,
        };
        for (entries, rows) in done {
            out.entries.extend(entries);
            out.rows_stored
                .iter_mut()
                .zip(rows)
                .for_each(|(a, b)| *a += b);
        }
        Ok(out)
    }

    /// Writes the engine's statistics files, `stats.json` and the manifest from what the shards
    /// passes wrote, and commits the cache.
    fn finish(
        &self,
        reduced: Reduced,
        written: Vec<WritePart>,
        inputs: Inputs,
        staging: Staging,
        timer: Timer,
        progress: &dyn Progress,
    ) -> Result<CompileReport> {
        let setup = &self.setup;
        let spec = setup.spec;
        staging.write_file(TGT_STATS_FILE, &reduced.tgt_json)?;
        staging.write_file(CTX_STATS_FILE, &reduced.ctx_json)?;
        let mut resolved = spec.clone();
        resolved.context_key = Some(setup.profile.context_key.clone());
        resolved.partitions = Some(setup.profile.partitions);
        let max_len = reduced.max_len;
        let mut manifest = Manifest::builder(
            env!("CARGO_PKG_VERSION"),
            max_len,
            reduced.tensors,
            inputs,
            resolved,
        );
        let mut split_stats = Vec::new();
        for (s, &split) in reduced.splits.iter().enumerate() {
            let name = SPLITS[split];
            let rows: u64 = written.iter().map(|w| w.rows_stored[s]).sum();
            let mut mine: Vec<ShardEntry> = written
                .iter()
                .flat_map(|w| w.entries.iter().filter(|e| e.split == name).cloned())
                .collect();
            mine.sort_by_key(|e| e.index);
            manifest = manifest.split(name, rows, mine);
            let lens = &reduced.lengths[split];
            split_stats.push(SplitStats {
                split: name.into(),
                contexts: lens.values().sum(),
                rows,
                lengths: fit::length_stats(lens, max_len),
                columns: Vec::new(),
            });
        }
        let all = all_lengths(&reduced.lengths);
        let contexts: u64 = all.values().sum();
        let without_rows = all.get(&0).copied().unwrap_or(0) as usize;
        let rows = setup.tgt.rows();
        let manifest = manifest.summary(CompileSummary {
            rows_read: rows,
            rows_stored: rows,
            contexts: contexts as usize,
            contexts_without_rows: without_rows,
            empty_contexts_kept: without_rows,
            ..CompileSummary::default()
        });
        // dsc's own stats.json: lengths per split, with the "all" entry readers expect first.
        split_stats.insert(
            0,
            SplitStats {
                split: dsc_format::stats::ALL_SPLITS.into(),
                contexts,
                rows,
                lengths: fit::length_stats(&all, max_len),
                columns: Vec::new(),
            },
        );
        let stats = Stats {
            format_version: dsc_format::FORMAT_VERSION,
            splits: split_stats,
            quantiles_of: None,
            includes_hidden: Default::default(),
        };
        commit::commit_cache(staging, manifest, stats, timer, progress)
    }
}

/// `key`, `length`, the context sub-columns, the positional and target sub-columns.
fn tensor_list(
    setup: &Setup,
    tgt_stats: &[ColStats],
    ctx_stats: &[ColStats],
    max_len: usize,
) -> Vec<TensorSpec> {
    let (tgt, ctx, key) = (&setup.tgt, &setup.ctx, &setup.profile.key);
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
    let ctx_names = analyze::sub_column_names(&ctx.names, ctx_stats, "ctxflt");
    for ((col, t), subs) in ctx.names.iter().zip(&ctx.types[1..]).zip(ctx_names) {
        for (name, card) in subs {
            out.push(sub(&name, card, col, &t.name, true));
        }
    }
    for (name, card) in encode::positional_columns(max_len) {
        out.push(sub(&name, card, "(position)", "derived", false));
    }
    let tgt_names = analyze::sub_column_names(&tgt.names, tgt_stats, "tgt");
    for ((col, t), subs) in tgt.names.iter().zip(&tgt.types[1..]).zip(tgt_names) {
        for (name, card) in subs {
            out.push(sub(&name, card, col, &t.name, false));
        }
    }
    out
}
#[cfg(test)]
mod vector_tests;
