//! Statistics and encodings fitted bucket by bucket and merged exactly: counts and vocabularies
//! add up, moments merge in bucket order (bucket boundaries depend on the input only), and
//! quantiles and histograms are read from every bucket's sorted values by exact rank queries.
//! So the result is the same whatever the memory budget, the thread count or who computed
//! which bucket.

use crate::bucket::{ColumnId, Issues, Shared};
use crate::encode::{self, Access, CatValue, Gathered, NumericEncoder, NumericResult};
use crate::error::{CompileError, Result};
use crate::frozen::{Frozen, Reference};
use crate::phases::Phase;
use crate::plan::Step;
use crate::rules::Rules;
use crate::runs::{Run, RunsFile, Sorted, ValueRuns};
use crate::stats::Moments;
use crate::text::{merge_text, text_partial, text_stats, TextPartial};
use crate::Progress;
use dsc_format::manifest::CompileSummary;
use dsc_format::spec::{EmptyContexts, UnmatchedRows};
use dsc_format::spelling::OptionError;
use dsc_format::stats::{Bin, ColumnStats, LengthStats, VocabEntry};
use dsc_format::stats::{SplitStats, Stats};
use dsc_format::Stage;
use dsc_format::{ColumnSource, ColumnSpec, Encoding};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

impl ColumnId {
    pub(crate) fn empty_stats(&self, counts: [u64; 3], count: u64) -> ColumnStats {
        ColumnStats {
            name: self.name.clone(),
            table: self.table.into(),
            source_type: self.source_type.clone(),
            count,
            nulls: counts[0],
            nan: counts[1],
            inf: counts[2],
            numeric: None,
            distinct: None,
            vocabulary: None,
        }
    }
}

/// One numeric column of one bucket: per split the bad-value counts, the moments and the run
/// of sorted values; and the moments of train after the chain's unfitted prefix.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NumericPartial {
    counts: Vec<[u64; 3]>,
    moments: Vec<Moments>,
    runs: Vec<Run>,
    prefix: Moments,
}

/// The stages of `chain` before its first fitted step (they need no statistics), and checks
/// that no non-linear step follows a fitted one (whose input statistics would need a second
/// pass). Empty when no step is fitted: then no moments are taken through them (a column
/// encoded by `log1p` alone would map every value twice, once for moments nothing reads).
pub(crate) fn unfitted_prefix(column: &str, chain: &[Step]) -> Result<Vec<Stage>> {
    let Some(first) = chain.iter().position(|s| s.is_fitted()) else {
        return Ok(Vec::new());
    };
    if let Some(s) = chain[first..].iter().find(|s| **s == Step::Log1p) {
        return Err(OptionError::new(
            "encode",
            format!(
                "{column}: {} after a fitted stage (zscore, minmax) cannot be fitted in one \
                 pass; put it first in the chain",
                s.name()
            ),
        )
        .into());
    }
    Ok(chain[..first]
        .iter()
        .filter_map(|s| s.unfitted_stage())
        .collect())
}

/// Per split, the counts of the rows read by each index a bucket's columns are read by (a
/// join's key column and index, or a boolean), counted once for all the columns read by it.
pub(crate) type IndexCounts = Vec<Counted>;

/// One index's counts ([`IndexCounts`]).
pub(crate) struct Counted {
    /// What the rows are read by ([`encode::Numbers::index_id`]).
    id: (usize, usize),
    /// Per split, how many rows read each indexed value.
    counts: Vec<Vec<u64>>,
    /// For a join: each joined row's key.
    keys: Option<Vec<i64>>,
}

/// A numeric column of one bucket summarised: its partial statistics; its sorted values go to
/// `runs`. A column of the rows read by a small index (joined, boolean) is summarised from how
/// many rows read each indexed value (`counted`, shared by the columns of one join), without a
/// value per row; any other is gathered value by value.
pub(crate) fn numeric_partial(
    access: &Access,
    tags: &[u8],
    rows: Option<&[u32]>,
    splits: usize,
    prefix: &[Stage],
    runs: &ValueRuns,
    counted: &mut IndexCounts,
) -> Result<NumericPartial> {
    let numbers = access.numbers();
    if let (None, Some(id), Some(values)) = (rows, numbers.index_id(), numbers.joined_values()) {
        if values.len() <= 1 << 16 {
            let known = counted.iter().position(|c| c.id == id);
            let at = match known {
                Some(at) => Some(at),
                None => encode::count_by_index(&numbers, tags, splits, values.len())?.map(|c| {
                    counted.push(Counted {
                        id,
                        counts: c,
                        keys: numbers.index_keys(),
                    });
                    counted.len() - 1
                }),
            };
            if let Some(at) = at {
                return counted_partial(values, &counted[at].counts, prefix, runs);
            }
        }
    }
    let mut g: Gathered = encode::gather(access, tags, rows, splits)?;
    let train = &g.values[..g.bounds[1]];
    // Without a prefix, those of train (split 0), computed below.
    let identity = prefix.iter().all(|s| *s == Stage::Identity);
    let prefix_moments = (!identity).then(|| {
        let mapped: Vec<f64> = train
            .iter()
            .map(|&x| prefix.iter().fold(x, |v, s| s.apply(v)))
            .filter(|v| v.is_finite())
            .collect();
        Moments::of(&mapped)
    });
    let counts = std::mem::take(&mut g.counts);
    let mut moments = Vec::with_capacity(splits);
    let mut split_runs = Vec::with_capacity(splits);
    let joined = g.joined.take();
    for (s, values) in g.split_values().into_iter().enumerate() {
        moments.push(Moments::of(values));
        split_runs.push(match &joined {
            Some((table, counts)) => runs.append_counted(table, &counts[s])?,
            None => runs.append_values(values)?,
        });
    }
    let prefix_moments = prefix_moments.unwrap_or(moments[0]);
    Ok(NumericPartial {
        counts,
        moments,
        runs: split_runs,
        prefix: prefix_moments,
    })
}

/// [`numeric_partial`] of a column whose rows read `values` by index, `counts[s][r]` rows of
/// split `s` reading `values[r]`.
fn counted_partial(
    values: &[Option<f64>],
    counts: &[Vec<u64>],
    prefix: &[Stage],
    runs: &ValueRuns,
) -> Result<NumericPartial> {
    let mut bad = Vec::with_capacity(counts.len());
    let mut moments = Vec::with_capacity(counts.len());
    let mut split_runs = Vec::with_capacity(counts.len());
    for split in counts {
        let mut b = [0u64; 3];
        // Only finite values are ranked and averaged; the others are counted by kind.
        let finite: Vec<u64> = values
            .iter()
            .zip(split)
            .map(|(x, &c)| match x {
                Some(x) if x.is_finite() => c,
                None => {
                    b[0] += c;
                    0
                }
                Some(x) if x.is_nan() => {
                    b[1] += c;
                    0
                }
                Some(_) => {
                    b[2] += c;
                    0
                }
            })
            .collect();
        let pairs = values
            .iter()
            .zip(&finite)
            .filter_map(|(x, &c)| Some((x.filter(|x| x.is_finite())?, c)));
        moments.push(Moments::of_counted(pairs));
        split_runs.push(runs.append_counted(values, &finite)?);
        bad.push(b);
    }
    let identity = prefix.iter().all(|s| *s == Stage::Identity);
    let prefix_moments = if identity {
        moments[0]
    } else {
        let mapped: Vec<(f64, u64)> = values
            .iter()
            .zip(&counts[0])
            .filter_map(|(x, &c)| {
                let x = x.filter(|x| x.is_finite())?;
                let v = prefix.iter().fold(x, |v, s| s.apply(v));
                v.is_finite().then_some((v, c))
            })
            .collect();
        Moments::of_counted(mapped.into_iter())
    };
    Ok(NumericPartial {
        counts: bad,
        moments,
        runs: split_runs,
        prefix: prefix_moments,
    })
}

/// The moments of a fitted stage's output, from those of its input (fitted stages are
/// increasing affine maps).
fn through(m: Moments, stage: &Stage) -> Moments {
    let (shift, scale) = match *stage {
        Stage::Zscore { mean, std } => (mean, std),
        Stage::Minmax { min, max } => (min, max - min),
        Stage::Identity | Stage::Log1p => return m,
    };
    Moments {
        n: m.n,
        mean: (m.mean - shift) / scale,
        m2: m.m2 / (scale * scale),
        min: (m.min - shift) / scale,
        max: (m.max - shift) / scale,
    }
}

/// Fits each fitted step of `chain` on train: the first on the moments of the unfitted prefix's
/// output, each later one on those moments carried through the steps fitted before it.
fn fit_chain(chain: &[Step], prefix: Moments) -> Vec<Stage> {
    let mut m = prefix;
    chain
        .iter()
        .map(|&step| {
            let fitted = match step {
                Step::Zscore => {
                    let std = m.std();
                    Stage::Zscore {
                        mean: m.mean,
                        std: if std > 0.0 && std.is_finite() {
                            std
                        } else {
                            1.0
                        },
                    }
                }
                Step::Minmax => {
                    let (min, max) = if m.n == 0 { (0.0, 1.0) } else { (m.min, m.max) };
                    Stage::Minmax {
                        min,
                        max: if max > min { max } else { min + 1.0 },
                    }
                }
                Step::Identity => Stage::Identity,
                Step::Log1p => Stage::Log1p,
            };
            if step.is_fitted() {
                m = through(m, &fitted);
            }
            fitted
        })
        .collect()
}

/// Merges one numeric column's partials (in bucket order) into its statistics and encoding.
pub(crate) fn merge_numeric(
    id: &ColumnId,
    parts: &[&NumericPartial],
    splits: usize,
    chain: &[Step],
    files: &[RunsFile],
    reference: Option<&Reference>,
) -> Result<NumericResult> {
    let merge = |f: &dyn Fn(&NumericPartial) -> Moments| {
        parts
            .iter()
            .fold(Moments::default(), |acc, p| acc.merge(&f(p)))
    };
    let moments: Vec<Moments> = (0..splits).map(|s| merge(&|p| p.moments[s])).collect();
    let prefix = merge(&|p| p.prefix);
    let stages = fit_chain(chain, prefix);
    let counts: Vec<[u64; 3]> = (0..splits)
        .map(|s| {
            parts.iter().fold([0u64; 3], |mut acc, p| {
                acc.iter_mut().zip(&p.counts[s]).for_each(|(a, b)| *a += b);
                acc
            })
        })
        .collect();
    // `all` merges the splits in split order, as each split merged its buckets.
    let all_m = moments[1..].iter().fold(moments[0], |a, b| a.merge(b));
    let mut all_counts = [0u64; 3];
    for c in &counts {
        all_counts.iter_mut().zip(c).for_each(|(t, x)| *t += x);
    }
    let all_runs = Sorted::new(files, parts.iter().flat_map(|p| p.runs.iter().copied()))?;
    // In an append, histograms are binned on the parent's edges, so that they add up.
    let rebin = |stats: &mut ColumnStats, runs: &Sorted, i: usize| -> Result<()> {
        let edges = reference
            .and_then(|r| r.edges.get(i))
            .and_then(Option::as_ref);
        if let (Some(n), Some(edges)) = (stats.numeric.as_mut(), edges) {
            n.histogram = runs.histogram_at(edges)?;
        }
        Ok(())
    };
    let mut all = id.empty_stats(all_counts, all_runs.n);
    all.numeric = all_runs.numeric(&all_m)?;
    rebin(&mut all, &all_runs, 0)?;
    let outside = match reference.and_then(|r| r.range) {
        Some((lo, hi)) if all_runs.n > 0 => Some(all_runs.count_lt(lo)? + all_runs.count_gt(hi)?),
        _ => None,
    };
    let mut out = vec![all];
    for s in 0..splits {
        let runs = Sorted::new(files, parts.iter().map(|p| p.runs[s]))?;
        let mut st = id.empty_stats(counts[s], runs.n);
        st.numeric = runs.numeric(&moments[s])?;
        rebin(&mut st, &runs, s + 1)?;
        out.push(st);
    }
    for s in &out {
        let finite = s.numeric.as_ref().is_none_or(|n| {
            [n.min, n.max, n.mean, n.std].iter().all(|v| v.is_finite())
                && n.histogram
                    .iter()
                    .all(|b| b.lo.is_finite() && b.hi.is_finite())
        });
        if !finite {
            let (lo, hi) = s.numeric.as_ref().map_or((0.0, 0.0), |n| (n.min, n.max));
            return Err(CompileError::Overflow {
                column: id.name.clone(),
                min: lo,
                max: hi,
            });
        }
    }
    let has_bad = encode::out_of_f32(&out, &stages) || counts.iter().flatten().any(|&c| c > 0);
    Ok(NumericResult {
        has_bad,
        stats: out,
        stages,
        train_mean: moments[0].mean,
        fill: None,
        outside,
    })
}

/// One categorical column of some buckets: per split the count of each value (ascending by
/// value), and the nulls. Counts add, so partials of any buckets merge in any order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CategoryPartial {
    counts: Vec<Vec<(CatValue, u64)>>,
    nulls: Vec<u64>,
}

impl CategoryPartial {
    /// Adds `other` to `self`.
    fn add(&mut self, other: CategoryPartial) {
        if self.counts.is_empty() {
            *self = other;
            return;
        }
        for (s, theirs) in other.counts.into_iter().enumerate() {
            let mut m: BTreeMap<CatValue, u64> =
                std::mem::take(&mut self.counts[s]).into_iter().collect();
            for (k, c) in theirs {
                *m.entry(k).or_insert(0) += c;
            }
            self.counts[s] = m.into_iter().collect();
            self.nulls[s] += other.nulls[s];
        }
    }
}

/// The partial of a categorical column that is the key of a join whose rows were counted
/// (`sensor_id`, read for `x`, `y` and `z`): each split's counts of each key are those of its
/// joined row, with no value read per row. `None` for any other column.
fn counted_categories(access: &Access, counted: &IndexCounts) -> Option<CategoryPartial> {
    let plain_ints = access.join.is_none()
        && access.column.valid.is_none()
        && access.column.info.kind == crate::column::Kind::Int;
    let (true, crate::column::Values::Int(v)) = (plain_ints, &access.column.values) else {
        return None;
    };
    let c = counted.iter().find(|c| c.id.0 == v.as_ptr() as usize)?;
    let keys = c.keys.as_ref()?;
    let counts = c
        .counts
        .iter()
        .map(|split| {
            let mut pairs: Vec<(CatValue, u64)> = keys
                .iter()
                .zip(split)
                .filter(|(_, &n)| n > 0)
                .map(|(&k, &n)| (CatValue::Int(k), n))
                .collect();
            pairs.sort_unstable();
            pairs
        })
        .collect();
    Some(CategoryPartial {
        counts,
        nulls: vec![0; c.counts.len()],
    })
}

pub(crate) fn category_partial(
    access: &Access,
    tags: &[u8],
    splits: usize,
) -> Result<CategoryPartial> {
    let (counts, nulls) = encode::count_categories(access, tags, splits)?;
    let counts = counts
        .into_iter()
        .map(|m| {
            let sorted: BTreeMap<CatValue, u64> = m
                .into_iter()
                .map(|(k, c)| (CatValue::of(access.column, k), c))
                .collect();
            sorted.into_iter().collect()
        })
        .collect();
    Ok(CategoryPartial { counts, nulls })
}

/// Merges one categorical column's partials into its statistics (`all`, then each split) and
/// its vocabulary (train values ascending).
pub(crate) fn merge_categories(
    id: &ColumnId,
    part: &CategoryPartial,
    splits: usize,
) -> (Vec<ColumnStats>, Vec<CatValue>) {
    let mut counts: Vec<BTreeMap<CatValue, u64>> = vec![BTreeMap::new(); splits];
    let mut nulls = vec![0u64; splits];
    for (s, split) in part.counts.iter().enumerate() {
        nulls[s] = part.nulls[s];
        counts[s] = split.iter().cloned().collect();
    }
    let vocabulary: Vec<CatValue> = counts[0].keys().cloned().collect();
    let mut all: BTreeMap<CatValue, u64> = BTreeMap::new();
    for split in &counts {
        for (k, c) in split {
            *all.entry(k.clone()).or_insert(0) += c;
        }
    }
    let build = |m: &BTreeMap<CatValue, u64>, nulls: u64| {
        let mut entries: Vec<(&CatValue, u64)> = m.iter().map(|(k, c)| (k, *c)).collect();
        entries.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut s = id.empty_stats([nulls, 0, 0], entries.iter().map(|e| e.1).sum());
        s.distinct = Some(entries.len() as u64);
        s.vocabulary = Some(
            entries
                .into_iter()
                .map(|(k, count)| VocabEntry {
                    value: k.json(id.kind),
                    count,
                })
                .collect(),
        );
        s
    };
    let mut stats = vec![build(&all, nulls.iter().sum())];
    stats.extend(counts.iter().zip(&nulls).map(|(m, &n)| build(m, n)));
    (stats, vocabulary)
}

/// Context lengths of one split as a count per length: exact, and mergeable by addition.
pub(crate) type LengthCounts = BTreeMap<u64, u64>;

/// The counts of `lengths`.
/// Statistics of context lengths from their counts (`truncated`: longer than `max_len`).
pub(crate) fn length_stats(counts: &LengthCounts, max_len: usize) -> LengthStats {
    let n: u64 = counts.values().sum();
    let sum: u128 = counts
        .iter()
        .map(|(&l, &c)| u128::from(l) * u128::from(c))
        .sum();
    let min = counts.keys().next().copied().unwrap_or(0);
    let max = counts.keys().next_back().copied().unwrap_or(0);
    let kth = |k: u64| {
        let mut seen = 0;
        for (&l, &c) in counts {
            seen += c;
            if seen > k {
                return Ok(l as f64);
            }
        }
        Ok(max as f64)
    };
    let quantiles = crate::stats::linear_quantiles(n, kth).expect("counting never fails");
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
    for (&l, &c) in counts {
        let bin = if l == 0 {
            0
        } else {
            64 - l.leading_zeros() as usize
        };
        histogram[bin].count += c;
    }
    let truncated: u64 = counts.range(max_len as u64 + 1..).map(|(_, &c)| c).sum();
    LengthStats {
        min,
        max,
        mean: if n == 0 { 0.0 } else { (sum as f64) / n as f64 },
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

/// What the statistics pass learns from one bucket: what must merge in bucket order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BucketFit {
    /// Contexts per split.
    pub contexts: Vec<u64>,
    /// The longest context (rows before truncation).
    pub longest: usize,
    /// Per row column: numeric partials (`None` for categorical columns).
    columns: Vec<Option<NumericPartial>>,
    context_columns: Vec<NumericPartial>,
    pub issues: Issues,
}

/// The statistics of a range of buckets: per bucket what merges in order, summed what adds up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FitPart {
    pub buckets: Vec<BucketFit>,
    /// Per row column: categorical partials (`None` for numeric columns).
    categories: Vec<Option<CategoryPartial>>,
    /// Per string column encoded to a fixed width: its partial.
    #[serde(default)]
    texts: Vec<TextPartial>,
    /// Context lengths per split.
    lengths: Vec<LengthCounts>,
}

/// Runs `f` on every bucket of `range`, at most `at_once` of them in memory together: as many
/// workers, each taking the next bucket as soon as it has finished one. (In chunks of
/// `at_once`, each chunk waited for its slowest bucket, and every core but one idled at each
/// chunk's end.) Results in bucket order, and the first error in bucket order: buckets are
/// taken in order, so every bucket before a failed one has run.
pub(crate) fn for_buckets<T: Send>(
    range: Range<usize>,
    at_once: usize,
    progress: &dyn Progress,
    f: impl Fn(usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let n = range.len();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done: Vec<Mutex<Option<Result<T>>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let work = || {
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            let r = crate::progress::check(progress).and_then(|()| f(range.start + i));
            progress.advance(1);
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            *done[i].lock().expect("no panics while held") = Some(r);
        }
    };
    rayon::scope(|s| {
        for _ in 0..at_once.clamp(1, n.max(1)) {
            s.spawn(|_| work());
        }
    });
    let mut out = Vec::with_capacity(n);
    for slot in done {
        let r = slot.into_inner().expect("no panics while held");
        out.push(r.expect("every bucket before a failed one has run")?);
    }
    Ok(out)
}

/// The statistics pass over the buckets of `range`: each grouped and its columns summarised;
/// sorted values go to `runs`.
pub(crate) fn fit_buckets(
    shared: &Shared,
    range: Range<usize>,
    at_once: usize,
    runs: &ValueRuns,
    progress: &dyn Progress,
) -> Result<FitPart> {
    let n_splits = shared.splits.names.len();
    let rules = shared.rules;
    let summed = Mutex::new((
        vec![None::<CategoryPartial>; shared.columns.len()],
        vec![LengthCounts::new(); n_splits],
        vec![TextPartial::default(); shared.texts.len()],
    ));
    let buckets = for_buckets(range, at_once, progress, |b| {
        let p = shared.prepare(b, rules.max_len)?;
        let start = std::time::Instant::now();
        let mut contexts = vec![0u64; n_splits];
        let mut lengths = vec![LengthCounts::new(); n_splits];
        let mut longest = 0;
        for c in &p.contexts {
            contexts[c.split as usize] += 1;
            *lengths[c.split as usize]
                .entry(c.group.len as u64)
                .or_insert(0) += 1;
            longest = longest.max(c.group.len);
        }
        let mut columns = Vec::with_capacity(shared.columns.len());
        let mut categories = Vec::with_capacity(shared.columns.len());
        let mut counted = IndexCounts::new();
        for (i, rc) in shared.columns.iter().enumerate() {
            let access = shared.access(i, &p.table);
            if rc.categorical {
                columns.push(None);
                let partial = match counted_categories(&access, &counted) {
                    Some(p) => p,
                    None => category_partial(&access, &p.row_tags, n_splits)?,
                };
                categories.push(Some(partial));
            } else {
                let prefix = unfitted_prefix(rc.name, rc.chain)?;
                columns.push(Some(numeric_partial(
                    &access,
                    &p.row_tags,
                    None,
                    n_splits,
                    &prefix,
                    runs,
                    &mut counted,
                )?));
                categories.push(None);
            }
        }
        let mut context_columns = Vec::with_capacity(shared.context_columns.len());
        for (i, (name, _, chain)) in shared.context_columns.iter().enumerate() {
            let ctx = p
                .ctx
                .as_ref()
                .expect("context columns need a context table");
            let access = shared.context_access(i, ctx);
            let prefix = unfitted_prefix(name, chain)?;
            context_columns.push(numeric_partial(
                &access,
                &p.ctx_tags,
                Some(&p.ctx_rows),
                n_splits,
                &prefix,
                runs,
                &mut counted,
            )?);
        }
        let mut texts = Vec::with_capacity(shared.texts.len());
        for (i, t) in shared.texts.iter().enumerate() {
            let access = shared.text_access(i, &p.table, p.ctx.as_ref());
            texts.push(if t.context {
                text_partial(
                    &access,
                    &p.ctx_tags,
                    Some(&p.ctx_rows),
                    n_splits,
                    t.encoding,
                )?
            } else {
                text_partial(&access, &p.row_tags, None, n_splits, t.encoding)?
            });
        }
        // What adds up is summed as buckets finish, so that it is held once, not per bucket.
        let mut sums = summed.lock().expect("no panics while held");
        for (sum, part) in sums.2.iter_mut().zip(texts) {
            sum.add(part);
        }
        for (sum, part) in sums.0.iter_mut().zip(categories) {
            if let Some(part) = part {
                sum.get_or_insert_with(CategoryPartial::default).add(part);
            }
        }
        for (sum, part) in sums.1.iter_mut().zip(lengths) {
            for (l, c) in part {
                *sum.entry(l).or_insert(0) += c;
            }
        }
        drop(sums);
        shared.phases.add(Phase::Statistics, start.elapsed());
        Ok(BucketFit {
            contexts,
            longest,
            columns,
            context_columns,
            issues: p.issues,
        })
    })?;
    let (categories, lengths, texts) = summed.into_inner().expect("no panics while held");
    Ok(FitPart {
        buckets,
        categories,
        texts,
        lengths,
    })
}

/// A row column's fitted encoding.
pub(crate) enum FittedColumn {
    Numeric(NumericResult, ColumnSpec),
    Category(Vec<CatValue>, ColumnSpec),
}

/// Every bucket's statistics merged: the encodings, `stats.json`, `L`, and what the shards pass
/// needs to place each bucket's contexts.
pub(crate) struct Merged {
    pub columns: Vec<FittedColumn>,
    /// Targets and context features: result, manifest column, is a target.
    pub context: Vec<(NumericResult, ColumnSpec, bool)>,
    /// String columns encoded to a fixed width: manifest column, of the context table.
    pub texts: Vec<(ColumnSpec, bool)>,
    pub stats: Stats,
    pub max_len: usize,
    /// Contexts per bucket per split.
    pub bucket_contexts: Vec<Vec<u64>>,
    /// The summary's counts known before writing.
    pub summary: CompileSummary,
}

/// Merges the statistics of every bucket (`parts` in bucket order) and fits the encodings on
/// train.
pub(crate) fn merge(
    shared: &Shared,
    parts: &[FitPart],
    files: &[RunsFile],
    rows_read: u64,
    frozen: Option<&Frozen>,
) -> Result<Merged> {
    let rules = shared.rules;
    let n_splits = shared.splits.names.len();
    let buckets: Vec<&BucketFit> = parts.iter().flat_map(|p| &p.buckets).collect();
    let mut summary = CompileSummary {
        rows_read,
        ..Default::default()
    };
    check_issues(&rules, &buckets, shared, &mut summary)?;
    let per_split: Vec<u64> = (0..n_splits)
        .map(|s| buckets.iter().map(|f| f.contexts[s]).sum())
        .collect();
    let found: std::collections::HashSet<i64> = buckets
        .iter()
        .flat_map(|f| f.issues.found.iter().copied())
        .collect();
    shared
        .splits
        .check(&per_split, &found, per_split.iter().sum(), frozen.is_some())?;
    summary.contexts = per_split.iter().sum::<u64>() as usize;
    let longest = buckets.iter().map(|f| f.longest).max().unwrap_or(0);
    // Steps past the longest stored sequence would hold padding only: `--max-len` caps L, it
    // never stretches it (`--max-len 100000` on short sequences wrote 1.1 GiB of zeros).
    let max_len = match frozen {
        // The other cache's L, longer or shorter than this data's longest: its tensors' shape.
        Some(f) => f.max_len(),
        None => rules
            .max_len
            .map_or(longest, |m| m.min(longest))
            .clamp(1, crate::plan::MAX_LEN),
    };
    if let Some(f) = frozen {
        f.check_policy(rules.nan)?;
    }

    // Each numeric column's merge (rank queries over every bucket's runs) is its own: they run
    // side by side, and are taken in column order below, so the first error is the same.
    let merge_one = |i: usize, id: &ColumnId, chain: &[Step], row_column: bool| {
        let numeric: Vec<&NumericPartial> = buckets
            .iter()
            .map(|f| {
                if row_column {
                    f.columns[i].as_ref().expect("a numeric column")
                } else {
                    &f.context_columns[i]
                }
            })
            .collect();
        let reference = frozen.map(|f| f.reference(id, &shared.splits.names));
        merge_numeric(id, &numeric, n_splits, chain, files, reference.as_ref())
    };
    let (mut row_numeric, mut context_numeric) = {
        use rayon::prelude::*;
        let rows: Vec<Option<Result<NumericResult>>> = (0..shared.columns.len())
            .into_par_iter()
            .map(|i| {
                let rc = &shared.columns[i];
                (!rc.categorical).then(|| merge_one(i, &shared.column_id(i), rc.chain, true))
            })
            .collect();
        let context: Vec<Result<NumericResult>> = (0..shared.context_columns.len())
            .into_par_iter()
            .map(|i| {
                let chain = shared.context_columns[i].2;
                merge_one(i, &shared.context_column_id(i), chain, false)
            })
            .collect();
        (rows.into_iter(), context.into_iter())
    };

    let mut column_stats: Vec<Vec<ColumnStats>> = Vec::new();
    let mut columns = Vec::new();
    for (i, rc) in shared.columns.iter().enumerate() {
        let merged_numeric = row_numeric.next().expect("one per column");
        let id = shared.column_id(i);
        let source = match rc.join {
            None => ColumnSource::Rows,
            Some(keyed) => ColumnSource::Join {
                file: keyed.path.display().to_string(),
                on: keyed.key.clone(),
            },
        };
        if rc.categorical {
            let mut sum = CategoryPartial::default();
            for p in parts {
                if let Some(c) = &p.categories[i] {
                    sum.add(c.clone());
                }
            }
            if sum.counts.is_empty() {
                sum.counts = vec![Vec::new(); n_splits];
                sum.nulls = vec![0; n_splits];
            }
            let (stats, mut vocabulary) = merge_categories(&id, &sum, n_splits);
            if let Some(f) = frozen {
                vocabulary = f.vocabulary(&id)?;
            }
            let encoding = Encoding::Category {
                vocabulary: vocabulary.iter().map(|v| v.json(id.kind)).collect(),
            };
            column_stats.push(stats);
            columns.push(FittedColumn::Category(
                vocabulary,
                column_spec(rc.name, source, &id, encoding),
            ));
        } else {
            let mut result = merged_numeric.expect("merged: a numeric column")?;
            if let Some(f) = frozen {
                f.numeric(&id, &mut result)?;
            }
            let encoding = NumericEncoder::encoding_of(id.kind, &result, rules.nan);
            column_stats.push(result.stats.clone());
            columns.push(FittedColumn::Numeric(
                result,
                column_spec(rc.name, source, &id, encoding),
            ));
        }
    }
    let mut context = Vec::new();
    for (i, (name, is_target, _)) in shared.context_columns.iter().enumerate() {
        let id = shared.context_column_id(i);
        let mut result = context_numeric.next().expect("one per context column")?;
        if let Some(f) = frozen {
            f.numeric(&id, &mut result)?;
        }
        let encoding = NumericEncoder::encoding_of(id.kind, &result, rules.nan);
        column_stats.push(result.stats.clone());
        context.push((
            result,
            column_spec(name, ColumnSource::Context, &id, encoding),
            *is_target,
        ));
    }
    let mut texts = Vec::new();
    for (i, t) in shared.texts.iter().enumerate() {
        let id = shared.text_id(i);
        let mut sum = TextPartial::default();
        for p in parts {
            if let Some(part) = p.texts.get(i) {
                sum.add(part.clone());
            }
        }
        sum.ensure_splits(n_splits);
        let cap = rules
            .ngram_vocab
            .unwrap_or(crate::text::DEFAULT_NGRAM_VOCAB);
        let (encoding, stats) = match frozen {
            // The statistics only: what would be fitted is the other cache's.
            Some(f) => (f.text(&id)?, text_stats(&id, &sum, t.encoding)),
            None => merge_text(&id, t.name, &sum, t.encoding, cap)?,
        };
        column_stats.push(stats);
        let source = match (t.context, t.join) {
            (true, _) => ColumnSource::Context,
            (false, None) => ColumnSource::Rows,
            (false, Some(keyed)) => ColumnSource::Join {
                file: keyed.path.display().to_string(),
                on: keyed.key.clone(),
            },
        };
        texts.push((column_spec(t.name, source, &id, encoding), t.context));
    }
    let mut lengths = vec![LengthCounts::new(); n_splits];
    for p in parts {
        for (sum, part) in lengths.iter_mut().zip(&p.lengths) {
            for (&l, &c) in part {
                *sum.entry(l).or_insert(0) += c;
            }
        }
    }
    let stats = build_stats(&lengths, &shared.splits.names, max_len, column_stats);
    Ok(Merged {
        columns,
        context,
        texts,
        stats,
        max_len,
        bucket_contexts: buckets.iter().map(|f| f.contexts.clone()).collect(),
        summary,
    })
}

pub(crate) fn column_spec(
    name: &str,
    source: ColumnSource,
    id: &ColumnId,
    encoding: Encoding,
) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        source,
        source_type: id.source_type.clone(),
        encoding,
    }
}

/// Turns what the buckets found missing into the errors or counts the policies ask for.
fn check_issues(
    rules: &Rules,
    buckets: &[&BucketFit],
    shared: &Shared,
    summary: &mut CompileSummary,
) -> Result<()> {
    let Some(ctx) = shared.context else {
        return Ok(());
    };
    let unmatched: usize = buckets.iter().map(|f| f.issues.unmatched.0).sum();
    if unmatched > 0 {
        if rules.unmatched_rows == UnmatchedRows::Error {
            let (_, key, path, row) = buckets
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
        summary.rows_without_context_row = buckets.iter().map(|f| f.issues.unmatched.1).sum();
    }
    let empty: usize = buckets.iter().map(|f| f.issues.empty.0).sum();
    summary.contexts_without_rows = empty;
    if empty > 0 {
        match rules.empty_contexts {
            EmptyContexts::Error => {
                let (_, path, row, key) = buckets
                    .iter()
                    .filter_map(|f| f.issues.empty.1.clone())
                    .min()
                    .expect("counted above");
                return Err(CompileError::EmptyContexts {
                    context: path,
                    row,
                    key,
                    without: if ctx.lists {
                        "holds only empty lists"
                    } else {
                        "has no rows in the rows files"
                    },
                    others: empty - 1,
                });
            }
            EmptyContexts::Drop => {}
            EmptyContexts::Keep => summary.empty_contexts_kept = empty,
        }
    }
    Ok(())
}

fn build_stats(
    lengths: &[LengthCounts],
    split_names: &[String],
    max_len: usize,
    columns: Vec<Vec<ColumnStats>>,
) -> Stats {
    let mut splits = Vec::new();
    let names = std::iter::once(dsc_format::stats::ALL_SPLITS)
        .chain(split_names.iter().map(String::as_str));
    for (i, name) in names.enumerate() {
        let mut counts = LengthCounts::new();
        for (s, split) in lengths.iter().enumerate() {
            if i == 0 || s == i - 1 {
                for (&l, &c) in split {
                    *counts.entry(l).or_insert(0) += c;
                }
            }
        }
        splits.push(SplitStats {
            split: name.into(),
            contexts: counts.values().sum(),
            rows: counts.iter().map(|(&l, &c)| l * c).sum(),
            lengths: length_stats(&counts, max_len),
            columns: columns.iter().map(|c| c[i].clone()).collect(),
        });
    }
    Stats {
        format_version: dsc_format::FORMAT_VERSION,
        splits,
        quantiles_of: None,
        includes_hidden: Default::default(),
    }
}
