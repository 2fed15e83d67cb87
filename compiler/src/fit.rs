//! Statistics and encodings fitted bucket by bucket and merged exactly: counts and vocabularies
//! add up, moments merge in bucket order (bucket boundaries depend on the input only), and
//! quantiles and histograms are read from every bucket's sorted values by exact rank queries.
//! So the result is the same whatever the memory budget, the thread count or who computed
//! which bucket.

use crate::column::Kind;
use crate::encode::{self, Access, CatValue, Gathered, NumericResult};
use crate::error::{CompileError, Result};
use crate::stats::Moments;
use dsc_format::stats::QUANTILE_LEVELS;
use dsc_format::stats::{Bin, ColumnStats, LengthStats, NumericStats, Quantile, VocabEntry};
use dsc_format::Stage;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What a statistic is about, for `stats.json`.
#[derive(Debug, Clone)]
pub(crate) struct ColumnId {
    pub name: String,
    pub table: &'static str,
    pub source_type: String,
    pub kind: Kind,
}

impl ColumnId {
    pub fn of(access: &Access) -> ColumnId {
        ColumnId {
            name: access.name.into(),
            table: access.table_name(),
            source_type: access.column.info.name.clone(),
            kind: access.column.info.kind,
        }
    }

    fn empty_stats(&self, counts: [u64; 3], count: u64) -> ColumnStats {
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

/// Sorted runs of finite values, one per (column, split, bucket), in one spill file.
pub(crate) struct ValueRuns {
    path: PathBuf,
    out: Mutex<(File, u64)>,
}

/// Where one run lies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    offset: u64,
    len: u64,
}

impl ValueRuns {
    pub fn create(path: PathBuf) -> Result<ValueRuns> {
        let file = File::create(&path).map_err(|e| CompileError::io(&path, e))?;
        Ok(ValueRuns {
            path,
            out: Mutex::new((file, 0)),
        })
    }

    /// Appends sorted values; returns where they lie.
    pub fn append(&self, values: &[f64]) -> Result<Run> {
        let mut bytes = Vec::with_capacity(values.len() * 8);
        values
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
        let mut out = self.out.lock().expect("no writer panics");
        out.0
            .write_all(&bytes)
            .map_err(|e| CompileError::io(&self.path, e))?;
        let run = Run {
            offset: out.1,
            len: values.len() as u64,
        };
        out.1 += bytes.len() as u64;
        Ok(run)
    }

    /// Maps the runs written so far for reading (`None` when there are none).
    #[allow(unsafe_code)]
    pub fn map(&self) -> Result<Option<memmap2::Mmap>> {
        let out = self.out.lock().expect("no writer panics");
        out.0
            .sync_data()
            .map_err(|e| CompileError::io(&self.path, e))?;
        if out.1 == 0 {
            return Ok(None);
        }
        let file = File::open(&self.path).map_err(|e| CompileError::io(&self.path, e))?;
        // SAFETY: the file is private to this compile (inside its staging directory) and no
        // longer written.
        unsafe { memmap2::Mmap::map(&file) }
            .map(Some)
            .map_err(|e| CompileError::io(&self.path, e))
    }
}

/// One numeric column of one bucket: per split the bad-value counts, the moments and the run
/// of sorted values; and the moments of train after the chain's unfitted prefix.
#[derive(Debug, Clone)]
pub(crate) struct NumericPartial {
    counts: Vec<[u64; 3]>,
    moments: Vec<Moments>,
    runs: Vec<Run>,
    prefix: Moments,
}

/// The stages of `chain` before its first fitted one (they need no statistics), and checks that
/// no non-linear stage follows a fitted one (whose input statistics would need a second pass).
pub(crate) fn unfitted_prefix<'c>(column: &str, chain: &'c [Stage]) -> Result<&'c [Stage]> {
    let fitted = |s: &Stage| matches!(s, Stage::Zscore { .. } | Stage::Minmax { .. });
    let first = chain.iter().position(fitted).unwrap_or(chain.len());
    if let Some(s) = chain[first..].iter().find(|s| **s == Stage::Log1p) {
        return Err(CompileError::Spec(format!(
            "column {column:?}: {} after a fitted stage (zscore, minmax) cannot be fitted in \
             one pass; put it first in the chain",
            s.name()
        )));
    }
    Ok(&chain[..first])
}

/// Gathers a numeric column of one bucket and records its partial statistics; its sorted values
/// go to `runs`.
pub(crate) fn numeric_partial(
    access: &Access,
    tags: &[u8],
    rows: Option<&[u32]>,
    splits: usize,
    prefix: &[Stage],
    runs: &ValueRuns,
) -> Result<NumericPartial> {
    let mut g: Gathered = encode::gather(access, tags, rows, splits)?;
    let train = &g.values[..g.bounds[1]];
    let prefix_moments = if prefix.iter().all(|s| *s == Stage::Identity) {
        Moments::of(train)
    } else {
        let mapped: Vec<f64> = train
            .iter()
            .map(|&x| prefix.iter().fold(x, |v, s| s.apply(v)))
            .filter(|v| v.is_finite())
            .collect();
        Moments::of(&mapped)
    };
    let counts = std::mem::take(&mut g.counts);
    let mut moments = Vec::with_capacity(splits);
    let mut split_runs = Vec::with_capacity(splits);
    for values in g.split_values() {
        moments.push(Moments::of(values));
        values.sort_unstable_by(f64::total_cmp);
        split_runs.push(runs.append(values)?);
    }
    Ok(NumericPartial {
        counts,
        moments,
        runs: split_runs,
        prefix: prefix_moments,
    })
}

/// Order-preserving map of finite doubles onto integers, for rank queries by bisection.
fn ord_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

fn from_ord_key(k: u64) -> f64 {
    if k >> 63 == 1 {
        f64::from_bits(k & !(1 << 63))
    } else {
        f64::from_bits(!k)
    }
}

/// Sorted runs of one statistic, read in place.
struct Sorted<'m> {
    runs: Vec<&'m [u8]>,
    n: u64,
}

impl<'m> Sorted<'m> {
    fn new(map: &'m [u8], runs: impl Iterator<Item = Run>) -> Sorted<'m> {
        let runs: Vec<&[u8]> = runs
            .filter(|r| r.len > 0)
            .map(|r| &map[r.offset as usize..(r.offset + r.len * 8) as usize])
            .collect();
        let n = runs.iter().map(|r| r.len() as u64 / 8).sum();
        Sorted { runs, n }
    }

    fn at(run: &[u8], i: usize) -> f64 {
        f64::from_le_bytes(run[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    /// Values whose order key is at most `t`.
    fn count_le(&self, t: u64) -> u64 {
        self.runs
            .iter()
            .map(|run| {
                let (mut lo, mut hi) = (0usize, run.len() / 8);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if ord_key(Self::at(run, mid)) <= t {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                lo as u64
            })
            .sum()
    }

    /// Values strictly below `x`.
    fn count_lt(&self, x: f64) -> u64 {
        match ord_key(x).checked_sub(1) {
            Some(t) => self.count_le(t),
            None => 0,
        }
    }

    /// The `k`-th smallest value (from 0).
    fn kth(&self, k: u64) -> f64 {
        let (mut lo, mut hi) = (0u64, u64::MAX);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.count_le(mid) > k {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        from_ord_key(lo)
    }

    /// Quantiles by numpy's default linear rule, as [`crate::stats::quantiles`].
    fn quantiles(&self) -> Vec<Quantile> {
        let n = self.n;
        QUANTILE_LEVELS
            .iter()
            .map(|&q| {
                let h = (n - 1) as f64 * q;
                let k = (h.floor() as u64).min(n - 1);
                let frac = h - k as f64;
                let lo = self.kth(k);
                let value = if frac > 0.0 && k + 1 < n {
                    lo + frac * (self.kth(k + 1) - lo)
                } else {
                    lo
                };
                Quantile { q, value }
            })
            .collect()
    }

    /// 20 equal-width bins over `[min, max]`, each counting the values from its lower edge up
    /// to (the last bin: including) its upper edge.
    fn histogram(&self, min: f64, max: f64) -> Vec<Bin> {
        const BINS: usize = 20;
        let width = (max - min) / BINS as f64;
        let edge = |i: usize| {
            if i == BINS {
                max
            } else {
                min + width * i as f64
            }
        };
        let below: Vec<u64> = (0..=BINS)
            .map(|i| {
                if i == BINS {
                    self.n
                } else if i == 0 || width <= 0.0 {
                    0
                } else {
                    self.count_lt(edge(i))
                }
            })
            .collect();
        (0..BINS)
            .map(|i| Bin {
                lo: edge(i),
                hi: edge(i + 1),
                count: below[i + 1] - below[i],
            })
            .collect()
    }

    fn numeric(&self, m: &Moments) -> Option<NumericStats> {
        (self.n > 0).then(|| NumericStats {
            min: m.min,
            max: m.max,
            mean: m.mean,
            std: m.std(),
            quantiles: self.quantiles(),
            histogram: self.histogram(m.min, m.max),
        })
    }
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

/// Fits each fitted stage of `chain` on train: the first on the moments of the unfitted prefix's
/// output, each later one on those moments carried through the stages fitted before it.
fn fit_chain(chain: &[Stage], prefix: Moments) -> Vec<Stage> {
    let mut m = prefix;
    chain
        .iter()
        .map(|stage| {
            let fitted = match stage {
                Stage::Zscore { .. } => {
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
                Stage::Minmax { .. } => {
                    let (min, max) = if m.n == 0 { (0.0, 1.0) } else { (m.min, m.max) };
                    Stage::Minmax {
                        min,
                        max: if max > min { max } else { min + 1.0 },
                    }
                }
                other => other.clone(),
            };
            if matches!(fitted, Stage::Zscore { .. } | Stage::Minmax { .. }) {
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
    chain: &[Stage],
    map: &[u8],
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
    let all_runs = Sorted::new(map, parts.iter().flat_map(|p| p.runs.iter().copied()));
    let mut all = id.empty_stats(all_counts, all_runs.n);
    all.numeric = all_runs.numeric(&all_m);
    let mut out = vec![all];
    for s in 0..splits {
        let runs = Sorted::new(map, parts.iter().map(|p| p.runs[s]));
        let mut st = id.empty_stats(counts[s], runs.n);
        st.numeric = runs.numeric(&moments[s]);
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
            return Err(CompileError::Spec(format!(
                "column {:?}: values from {lo:e} to {hi:e} overflow its statistics; rescale the column",
                id.name
            )));
        }
    }
    // Stages are monotonic, so the encoded range is that of the encoded extremes: if either
    // end leaves f32, some rows cannot be stored and must be looked for.
    let out_of_f32 = out[0].numeric.as_ref().is_some_and(|n| {
        [n.min, n.max]
            .iter()
            .any(|&x| !(stages.iter().fold(x, |v, s| s.apply(v)) as f32).is_finite())
    });
    let has_bad = out_of_f32 || counts.iter().flatten().any(|&c| c > 0);
    Ok(NumericResult {
        has_bad,
        stats: out,
        stages,
        train_mean: moments[0].mean,
    })
}

/// One categorical column of one bucket: per split the count of each value, and the nulls.
#[derive(Debug, Clone)]
pub(crate) struct CategoryPartial {
    counts: Vec<HashMap<CatValue, u64>>,
    nulls: Vec<u64>,
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
            m.into_iter()
                .map(|(k, c)| (CatValue::of(access.column, k), c))
                .collect()
        })
        .collect();
    Ok(CategoryPartial { counts, nulls })
}

/// Merges one categorical column's partials into its statistics (`all`, then each split) and
/// its vocabulary (train values ascending).
pub(crate) fn merge_categories(
    id: &ColumnId,
    parts: &[&CategoryPartial],
    splits: usize,
) -> (Vec<ColumnStats>, Vec<CatValue>) {
    let mut counts: Vec<BTreeMap<CatValue, u64>> = vec![BTreeMap::new(); splits];
    let mut nulls = vec![0u64; splits];
    for p in parts {
        for s in 0..splits {
            nulls[s] += p.nulls[s];
            for (k, c) in &p.counts[s] {
                *counts[s].entry(k.clone()).or_insert(0) += c;
            }
        }
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
                return l as f64;
            }
        }
        max as f64
    };
    let quantiles = if n == 0 {
        Vec::new()
    } else {
        QUANTILE_LEVELS
            .iter()
            .map(|&q| {
                let h = (n - 1) as f64 * q;
                let k = (h.floor() as u64).min(n - 1);
                let frac = h - k as f64;
                let lo = kth(k);
                let value = if frac > 0.0 && k + 1 < n {
                    lo + frac * (kth(k + 1) - lo)
                } else {
                    lo
                };
                Quantile { q, value }
            })
            .collect()
    };
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

/// Where the sorted values of a compile are spilled.
pub(crate) fn runs_path(dir: &Path) -> PathBuf {
    dir.join("values.spill")
}
