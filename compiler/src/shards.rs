//! The shards: the tensors every shard holds, and one bucket's contexts encoded and written as
//! its own shards (shards never span buckets, so a bucket's writer owns its files).

use crate::bucket::ColumnId;
use crate::bucket::{Context, Shared};
use crate::column::{Column, Kind};
use crate::encode::{CategoryCoder, NumericEncoder};
use crate::error::Result;
use crate::fit::{self, FittedColumn, Merged};
use crate::phases::{Phase, Phases, Split};
use crate::text::TextCoder;
use crate::write::ShardWriter;
use crate::Progress;
use dsc_format::rng::position_hash;
use dsc_format::{
    shard, ColumnSource, ColumnSpec, Dtype, Encoding, KeyTableEntry, ShardEntry, TensorRole,
    TensorSpec,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where every bucket's contexts go: the tensors, and each bucket's first shard index and first
/// position in every split (a bucket's contexts follow those of the buckets before it).
pub(crate) struct Layout {
    pub tensors: Vec<TensorSpec>,
    fills: Vec<Fill>,
    pub numbering: Numbering,
}

/// How each bucket's contexts of each split are cut into shards: a bucket's contexts follow
/// those of the buckets before it, and its shards are numbered after theirs (shards never span
/// buckets, so a bucket's writer owns its files).
pub(crate) struct Numbering {
    per_shard: usize,
    /// Per bucket, per split: its first shard index and first position.
    starts: Vec<Vec<(usize, usize)>>,
}

impl Numbering {
    /// `bucket_contexts[b][s]`: bucket `b`'s contexts in split `s`.
    pub fn new(bucket_contexts: &[Vec<u64>], per_shard: usize) -> Numbering {
        let splits = bucket_contexts.first().map_or(0, Vec::len);
        let mut starts = Vec::with_capacity(bucket_contexts.len());
        let mut next = vec![(0usize, 0usize); splits];
        for contexts in bucket_contexts {
            starts.push(next.clone());
            for (n, &c) in next.iter_mut().zip(contexts) {
                n.0 += (c as usize).div_ceil(per_shard);
                n.1 += c as usize;
            }
        }
        Numbering { per_shard, starts }
    }

    /// Contexts per shard for `shard_size` bytes and `tensors`.
    pub fn per_shard(tensors: &[TensorSpec], shard_size: u64) -> usize {
        let per_context: usize = tensors.iter().map(TensorSpec::sample_bytes).sum();
        ((shard_size as usize) / per_context.max(1)).max(1)
    }

    /// Bucket `b`'s shards of split `s`, its `members` in stored order: each shard's index,
    /// first position in the split, and members.
    pub fn shards<'m, T>(
        &self,
        b: usize,
        s: usize,
        members: &'m [T],
    ) -> impl Iterator<Item = (usize, usize, &'m [T])> + 'm {
        let (first_shard, first_context) = self.starts[b][s];
        let per_shard = self.per_shard;
        members
            .chunks(per_shard)
            .enumerate()
            .map(move |(j, chunk)| (first_shard + j, first_context + j * per_shard, chunk))
    }

    /// Numbers every split's shards and positions after `after[s]` (shards, contexts) of an
    /// earlier generation: an append's shards continue its parent's splits.
    pub fn continue_after(&mut self, after: &[(usize, usize)]) {
        for bucket in &mut self.starts {
            for (start, &(shards, contexts)) in bucket.iter_mut().zip(after) {
                start.0 += shards;
                start.1 += contexts;
            }
        }
    }

    pub fn splits(&self, b: usize) -> usize {
        self.starts[b].len()
    }
}

/// One shard file being written: its header, then each tensor's bytes in the tensors' order
/// (the one writer of shard files, for dsc's own compile and for profiles).
pub(crate) struct ShardFile {
    out: ShardWriter,
    entry: ShardEntry,
}

impl ShardFile {
    pub fn create(
        dir: &Path,
        tensors: &[TensorSpec],
        split: &str,
        index: usize,
        first_context: usize,
        contexts: usize,
        profile: Option<&'static str>,
    ) -> Result<ShardFile> {
        let file = shard::shard_file_name(split, index);
        let meta = shard::ShardMeta {
            split,
            index,
            first_context,
            profile,
        };
        let (header, _) = shard::build_header(tensors, contexts, &meta);
        let mut out = ShardWriter::create(dir.join(&file))?;
        out.write(&header)?;
        Ok(ShardFile {
            out,
            entry: ShardEntry {
                file,
                split: split.into(),
                index,
                contexts,
                first_context,
                bytes: 0,
                xxh3: String::new(),
                compressed: None,
                keys: None,
                generation: None,
                removed: Vec::new(),
            },
        })
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write(bytes)
    }

    pub fn finish(self) -> Result<ShardEntry> {
        self.finish_timed().map(|(entry, _)| entry)
    }

    /// [`ShardFile::finish`], with the time spent hashing and writing.
    pub fn finish_timed(self) -> Result<(ShardEntry, Split)> {
        let (bytes, xxh3, times) = self.out.finish_timed()?;
        let entry = ShardEntry {
            bytes,
            xxh3,
            ..self.entry
        };
        Ok((entry, times))
    }
}

impl Layout {
    /// The tensors of `merged`'s columns: sequences padded to its `max_len`, or with
    /// `records` (whether each row column is a target) a table of records without a step axis.
    pub fn new(
        key: &ColumnId,
        merged: &Merged,
        records: Option<&[bool]>,
        shard_size: u64,
    ) -> Layout {
        let key_column = fit::column_spec(&key.name, ColumnSource::Rows, key, Encoding::Raw);
        let numeric = |want_target: bool| -> Vec<ColumnSpec> {
            merged
                .columns
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match f {
                    FittedColumn::Numeric(_, c) if records.is_some_and(|t| t[i]) == want_target => {
                        Some(c.clone())
                    }
                    _ => None,
                })
                .collect()
        };
        let features = numeric(false);
        let categoricals: Vec<ColumnSpec> = merged
            .columns
            .iter()
            .filter_map(|f| match f {
                FittedColumn::Category(_, c) => Some(c.clone()),
                FittedColumn::Numeric(..) => None,
            })
            .collect();
        let context: Vec<(ColumnSpec, bool)> = merged
            .context
            .iter()
            .map(|(_, c, t)| (c.clone(), *t))
            .collect();
        let (tensors, fills) = match records {
            Some(_) => record_layout(
                key_column,
                &features,
                &numeric(true),
                &categoricals,
                &merged.texts,
            ),
            None => tensor_layout(
                merged.max_len,
                key_column,
                &features,
                &categoricals,
                &context,
                &merged.texts,
            ),
        };
        let per_shard = Numbering::per_shard(&tensors, shard_size);
        Layout {
            numbering: Numbering::new(&merged.bucket_contexts, per_shard),
            tensors,
            fills,
        }
    }
}

/// What the shards pass wrote for a range of buckets.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WritePart {
    pub entries: Vec<ShardEntry>,
    /// Rows stored per split.
    pub rows_stored: Vec<u64>,
    /// Contexts cut to `max_len`.
    pub truncated: usize,
    /// Values filled by the NaN policy.
    pub filled: u64,
}

/// The shards pass over the buckets of `range`: each grouped again, encoded with the merged
/// encodings and written as its own shards into `dir`.
pub(crate) fn write_buckets(
    shared: &Shared,
    merged: &Merged,
    layout: &Layout,
    range: Range<usize>,
    at_once: usize,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<WritePart> {
    let rules = shared.rules;
    let n_splits = shared.splits.names.len();
    let filled = AtomicU64::new(0);
    let parts = fit::for_buckets(range, at_once, progress, |b| {
        let p = shared.prepare(b, Some(merged.max_len))?;
        let mut features = Vec::new();
        let mut categoricals = Vec::new();
        for (i, f) in merged.columns.iter().enumerate() {
            let access = shared.access(i, &p.table);
            match f {
                FittedColumn::Numeric(result, spec_col) => {
                    let encoder = NumericEncoder::new(access, result, rules.nan);
                    encoder.check_rows(result, &p.row_tags, None)?;
                    features.push((encoder, spec_col.clone()));
                }
                FittedColumn::Category(vocabulary, spec_col) => {
                    categoricals.push((CategoryCoder::new(access, vocabulary), spec_col.clone()));
                }
            }
        }
        let texts: Vec<TextCoder> = merged
            .texts
            .iter()
            .enumerate()
            .map(|(i, (col, _))| {
                TextCoder::new(
                    shared.text_access(i, &p.table, p.ctx.as_ref()),
                    &col.encoding,
                )
            })
            .collect();
        let mut context_encoders = Vec::new();
        for (i, (result, spec_col, is_target)) in merged.context.iter().enumerate() {
            let ctx = p
                .ctx
                .as_ref()
                .expect("context columns need a context table");
            let encoder = NumericEncoder::new(shared.context_access(i, ctx), result, rules.nan);
            encoder.check_rows(result, &p.ctx_tags, Some(&p.ctx_rows))?;
            context_encoders.push((encoder, spec_col.clone(), *is_target));
        }
        let shuffle = Instant::now();
        let mut jobs = Vec::new();
        for s in 0..layout.numbering.splits(b) {
            // The split's stored order: ascending position hash, ties by key.
            let mut order: Vec<(u64, i64, usize)> = p
                .contexts
                .iter()
                .enumerate()
                .filter(|(_, c)| c.split as usize == s)
                .map(|(i, c)| (position_hash(c.group.key, rules.seed), c.group.key, i))
                .collect();
            order.sort_unstable();
            let members: Vec<usize> = order.into_iter().map(|o| o.2).collect();
            for (index, first, chunk) in layout.numbering.shards(b, s, &members) {
                jobs.push(ShardJob {
                    split: s as u8,
                    index,
                    first,
                    members: chunk.to_vec(),
                });
            }
        }
        shared.phases.add(Phase::Shuffle, shuffle.elapsed());
        let writer = ShardContext {
            phases: shared.phases,
            split_names: &shared.splits.names,
            tensors: &layout.tensors,
            fills: &layout.fills,
            contexts: &p.contexts,
            perm: &p.grouped.perm,
            features: &features,
            categoricals: &categoricals,
            context_encoders: &context_encoders,
            texts: &texts,
            max_len: merged.max_len,
            filled: &filled,
            keys: (p.table.columns[0].info.kind == Kind::Str).then(|| KeyTexts {
                rows: &p.table.columns[0],
                context: p.ctx.as_ref().map(|k| &k.table.columns[0]),
            }),
        };
        let entries = jobs
            .par_iter()
            .map(|job| writer.write(job, dir))
            .collect::<Vec<Result<_>>>()
            .into_iter()
            .collect::<Result<Vec<ShardEntry>>>()?;
        let mut rows_stored = vec![0u64; n_splits];
        for c in &p.contexts {
            rows_stored[c.split as usize] += c.group.kept as u64;
        }
        Ok((entries, rows_stored, p.truncated))
    })?;
    let mut out = WritePart {
        entries: Vec::new(),
        rows_stored: vec![0; n_splits],
        truncated: 0,
        filled: filled.load(Ordering::Relaxed),
    };
    for (entries, rows, truncated) in parts {
        out.entries.extend(entries);
        out.rows_stored
            .iter_mut()
            .zip(rows)
            .for_each(|(a, b)| *a += b);
        out.truncated += truncated;
    }
    Ok(out)
}

/// What fills one tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fill {
    Key,
    Length,
    FullLength,
    /// The numeric row columns `first..first + count`, in that order on the last axis (the
    /// features `x`, or a table of records' targets `y`, which follow them).
    Numeric {
        first: usize,
        count: usize,
    },
    Categorical(usize),
    Targets,
    ContextFeatures,
    /// String column `i` of the rows table (or a join), `row` bytes per step.
    Text {
        i: usize,
        row: usize,
    },
    /// String column `i` of the context table.
    ContextText(usize),
}

/// A string column's tensor: `[L, W]` per step, `[W]` per context (`steps` None).
fn text_tensor(col: &ColumnSpec, steps: Option<usize>) -> TensorSpec {
    let width = col.encoding.width().expect("a string encoding");
    let dtype = col.encoding.dtype().expect("a string encoding");
    TensorSpec {
        name: col.name.clone(),
        dtype,
        role: match steps {
            Some(_) => TensorRole::Encoded,
            None => TensorRole::ContextEncoded,
        },
        sample_shape: match steps {
            Some(l) => vec![l, width],
            None => vec![width],
        },
        columns: vec![col.clone()],
    }
}

/// A column dsc makes (lengths), not read.
fn derived(name: &str) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        source: ColumnSource::Rows,
        source_type: "derived".into(),
        encoding: Encoding::Raw,
    }
}

/// A tensor of one value per context.
fn scalar(name: &str, dtype: Dtype, role: TensorRole, column: ColumnSpec) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype,
        role,
        sample_shape: vec![],
        columns: vec![column],
    }
}

/// A table of records' tensors: each row one sample, with no step axis (`x [F]`, a code per
/// categorical column, `[W]` per string column, `y [T]`), and `length` (always 1), which every
/// cache has.
fn record_layout(
    key_column: ColumnSpec,
    features: &[ColumnSpec],
    targets: &[ColumnSpec],
    categoricals: &[ColumnSpec],
    texts: &[(ColumnSpec, bool)],
) -> (Vec<TensorSpec>, Vec<Fill>) {
    let mut tensors = vec![scalar("key", Dtype::I64, TensorRole::Key, key_column)];
    let mut fills = vec![Fill::Key];
    let vector = |name: &str, role, columns: &[ColumnSpec]| TensorSpec {
        name: name.into(),
        dtype: Dtype::F32,
        role,
        sample_shape: vec![columns.len()],
        columns: columns.to_vec(),
    };
    if !features.is_empty() {
        tensors.push(vector("x", TensorRole::ContextFeatures, features));
        fills.push(Fill::Numeric {
            first: 0,
            count: features.len(),
        });
    }
    for (i, col) in categoricals.iter().enumerate() {
        tensors.push(scalar(
            &col.name,
            Dtype::I32,
            TensorRole::ContextCategorical,
            col.clone(),
        ));
        fills.push(Fill::Categorical(i));
    }
    for (i, (col, _)) in texts.iter().enumerate() {
        let t = text_tensor(col, None);
        fills.push(Fill::Text {
            i,
            row: t.sample_bytes(),
        });
        tensors.push(t);
    }
    tensors.push(scalar(
        "length",
        Dtype::I32,
        TensorRole::Length,
        derived("length"),
    ));
    fills.push(Fill::Length);
    if !targets.is_empty() {
        tensors.push(vector("y", TensorRole::Targets, targets));
        fills.push(Fill::Numeric {
            first: features.len(),
            count: targets.len(),
        });
    }
    (tensors, fills)
}

fn tensor_layout(
    max_len: usize,
    key_column: ColumnSpec,
    features: &[ColumnSpec],
    categoricals: &[ColumnSpec],
    context: &[(ColumnSpec, bool)],
    texts: &[(ColumnSpec, bool)],
) -> (Vec<TensorSpec>, Vec<Fill>) {
    let mut tensors = vec![scalar("key", Dtype::I64, TensorRole::Key, key_column)];
    let mut fills = vec![Fill::Key];
    if !features.is_empty() {
        tensors.push(TensorSpec {
            name: "x".into(),
            dtype: Dtype::F32,
            role: TensorRole::Features,
            sample_shape: vec![max_len, features.len()],
            columns: features.to_vec(),
        });
        fills.push(Fill::Numeric {
            first: 0,
            count: features.len(),
        });
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
    for (i, (col, of_context)) in texts.iter().enumerate() {
        if !of_context {
            let t = text_tensor(col, Some(max_len));
            let row = t.sample_bytes() / max_len.max(1);
            tensors.push(t);
            fills.push(Fill::Text { i, row });
        }
    }
    tensors.push(scalar(
        "length",
        Dtype::I32,
        TensorRole::Length,
        derived("length"),
    ));
    fills.push(Fill::Length);
    tensors.push(scalar(
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
    for (i, (col, of_context)) in texts.iter().enumerate() {
        if *of_context {
            tensors.push(text_tensor(col, None));
            fills.push(Fill::ContextText(i));
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
    phases: &'a Phases,
    split_names: &'a [String],
    tensors: &'a [TensorSpec],
    fills: &'a [Fill],
    contexts: &'a [Context],
    perm: &'a [u32],
    features: &'a [(NumericEncoder<'a>, ColumnSpec)],
    categoricals: &'a [(CategoryCoder<'a>, ColumnSpec)],
    context_encoders: &'a [(NumericEncoder<'a>, ColumnSpec, bool)],
    texts: &'a [TextCoder<'a>],
    max_len: usize,
    filled: &'a AtomicU64,
    /// Where the keys are hashed to ids (strings, binary): the keys, for the key tables.
    keys: Option<KeyTexts<'a>>,
}

/// A bucket's string keys: each context's from its first row, or from its context-table row
/// when it has no rows.
struct KeyTexts<'a> {
    rows: &'a Column,
    context: Option<&'a Column>,
}

impl KeyTexts<'_> {
    fn of(&self, c: &Context, perm: &[u32]) -> &str {
        let text = match (c.group.len, self.context, c.ctx_row) {
            (0, Some(context), Some(r)) => context.str_at(r as usize),
            _ => self.rows.str_at(perm[c.group.start] as usize),
        };
        text.expect("keys are never null (refused when read)")
    }
}

/// Contexts encoded per buffer fill: bounds the writer's memory independently of shard size.
const CHUNK: usize = 256;

impl ShardContext<'_> {
    fn write(&self, job: &ShardJob, dir: &Path) -> Result<ShardEntry> {
        let split = self.split_names[job.split as usize].as_str();
        let n = job.members.len();
        let mut out = ShardFile::create(dir, self.tensors, split, job.index, job.first, n, None)?;
        let mut buf = Vec::new();
        let mut filled = 0u64;
        let mut encoding = Duration::ZERO;
        for (tensor, &fill) in self.tensors.iter().zip(self.fills) {
            let sample = tensor.sample_bytes();
            for chunk in job.members.chunks(CHUNK) {
                let start = Instant::now();
                buf.clear();
                buf.resize(chunk.len() * sample, 0);
                for (i, &c) in chunk.iter().enumerate() {
                    if let Some(&next) = chunk.get(i + 1) {
                        self.prefetch(fill, &self.contexts[next]);
                    }
                    if let Some(&after) = chunk.get(i + 2) {
                        crate::encode::prefetch(self.perm, self.contexts[after].group.kept_start);
                    }
                    let dst = &mut buf[i * sample..(i + 1) * sample];
                    filled += self.fill_one(fill, &self.contexts[c], dst)?;
                }
                encoding += start.elapsed();
                out.write(&buf)?;
            }
        }
        self.filled.fetch_add(filled, Ordering::Relaxed);
        let (mut entry, times) = out.finish_timed()?;
        self.phases.add(Phase::Encode, encoding);
        self.phases.add_written(times);
        if let Some(keys) = &self.keys {
            entry.keys = Some(self.write_keys(keys, job, split, dir)?);
        }
        Ok(entry)
    }

    /// Writes the key table of `job`'s shard: its contexts' ids and keys, in shard order.
    fn write_keys(
        &self,
        keys: &KeyTexts,
        job: &ShardJob,
        split: &str,
        dir: &Path,
    ) -> Result<KeyTableEntry> {
        let contexts = job.members.iter().map(|&c| &self.contexts[c]);
        let ids: Vec<i64> = contexts.clone().map(|c| c.group.key).collect();
        let texts: Vec<&str> = contexts.map(|c| keys.of(c, self.perm)).collect();
        let meta = shard::ShardMeta {
            split,
            index: job.index,
            first_context: job.first,
            profile: None,
        };
        let file = dsc_format::keys::key_table_file_name(split, job.index);
        let mut out = ShardWriter::create(dir.join(&file))?;
        out.write(&dsc_format::keys::key_table_bytes(&ids, &texts, &meta))?;
        let (bytes, xxh3, times) = out.finish_timed()?;
        self.phases.add_written(times);
        Ok(KeyTableEntry { file, bytes, xxh3 })
    }

    /// Asks the processor for the first rows `fill` reads of context `c` (see
    /// [`crate::encode::prefetch`]), one context ahead of its encoding.
    #[inline]
    fn prefetch(&self, fill: Fill, c: &Context) {
        let g = &c.group;
        let Some(&row) = self.perm.get(g.kept_start).filter(|_| g.kept > 0) else {
            return;
        };
        let row = row as usize;
        match fill {
            Fill::Numeric { first, count } => self.features[first..first + count]
                .iter()
                .for_each(|(enc, _)| enc.prefetch(row)),
            Fill::Categorical(i) => self.categoricals[i].0.prefetch(row),
            _ => {}
        }
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
            Fill::Numeric { first, count } => {
                let width = count;
                let features = &self.features[first..first + count];
                let mut f = 0;
                while f < count {
                    // Columns joined through one index side by side are encoded together.
                    let index = features[f].0.joined_index();
                    let together = match index {
                        Some(_) => features[f..]
                            .iter()
                            .take_while(|(e, _)| e.joined_index() == index)
                            .count(),
                        None => 1,
                    };
                    if together > 1 {
                        let encoders: Vec<&NumericEncoder> =
                            features[f..f + together].iter().map(|(e, _)| e).collect();
                        filled +=
                            NumericEncoder::encode_joined_rows(&encoders, rows, |t, j, v| {
                                let o = (t * width + f + j) * 4;
                                dst[o..o + 4].copy_from_slice(&v.to_le_bytes());
                            })?;
                    } else {
                        filled += features[f].0.encode_rows(rows, |t, v| {
                            let o = (t * width + f) * 4;
                            dst[o..o + 4].copy_from_slice(&v.to_le_bytes());
                        })?;
                    }
                    f += together;
                }
            }
            Fill::Categorical(i) => {
                self.categoricals[i].0.code_rows(rows, |t, code| {
                    dst[t * 4..t * 4 + 4].copy_from_slice(&code.to_le_bytes());
                })?;
            }
            Fill::Text { i, row } => {
                for (t, &r) in rows.iter().enumerate() {
                    self.texts[i].write(r as usize, &mut dst[t * row..(t + 1) * row])?;
                }
            }
            Fill::ContextText(i) => {
                if let Some(r) = c.ctx_row {
                    self.texts[i].write(r as usize, dst)?;
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
