//! Encoding contexts into the engine's sub-column codes, written as safetensors shards: one
//! `[n, L + 1]` tensor per target sub-column (positional ones first), one `[n]` tensor per
//! context sub-column, plus `key` and `length`.

use super::analyze::ColStats;
use super::table::{Data, MTable};
use super::{categorical, datetime, numeric};
use crate::error::Result;
use crate::write::ShardWriter;
use dsc_format::manifest::{ShardEntry, TensorSpec};
use dsc_format::rng::mix64;
use rayon::prelude::*;
use std::path::Path;

/// The engine switches positional columns from one code to decimal digits at this length.
const POSITIONAL_DIGIT_THRESHOLD: usize = 100;

/// How one column turns a row into its sub-column codes.
pub(crate) enum ColEncoder<'a> {
    Num {
        enc: numeric::Encoder,
        vals: &'a [f64],
        ints: Option<&'a [i64]>,
        /// Per partition, the non-null rows a null row draws its imputed value from.
        donors: Option<Vec<Vec<u32>>>,
    },
    Cat {
        enc: categorical::Encoder,
        codes: &'a [u32],
    },
    Time {
        enc: datetime::Encoder,
        us: &'a [Option<i64>],
        donors: Option<Vec<Vec<u32>>>,
    },
    /// A column the engine does not encode (all partitions empty).
    Skip,
}

/// Seed material of one column's imputation draws.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DrawKey {
    pub seed: u64,
    /// Distinguishes target (0) and context (1) columns and the column index.
    pub column: u64,
}

impl DrawKey {
    /// The index of the donor drawn for `row`: a pure function of (seed, column, row), so the
    /// draw does not depend on thread count or order. Uniform over the donors (multiply-shift).
    fn pick(self, row: u32, donors: usize) -> usize {
        let h = mix64(
            mix64(self.seed ^ mix64(dsc_format::rng::stream::MOSTLYAI_IMPUTE))
                ^ mix64(self.column)
                ^ u64::from(row),
        );
        ((u128::from(h) * donors as u128) >> 64) as usize
    }
}

fn donors_of(parts_rows: &[&[u32]], is_null: impl Fn(u32) -> bool) -> Vec<Vec<u32>> {
    parts_rows
        .iter()
        .map(|rows| rows.iter().copied().filter(|&r| !is_null(r)).collect())
        .collect()
}

impl<'a> ColEncoder<'a> {
    /// The encoder of column `c`; `parts_rows[p]` are the column's rows in partition `p`.
    pub fn new(table: &'a MTable, c: usize, stats: &ColStats, parts_rows: &[&[u32]]) -> Self {
        let imputes = stats.imputes();
        match (&table.cols[c].data, stats) {
            (_, ColStats::Empty(_)) => ColEncoder::Skip,
            (Data::Num { vals, ints }, ColStats::Numeric(s)) => ColEncoder::Num {
                enc: numeric::Encoder::new(s, vals, ints.as_deref()),
                vals,
                ints: ints.as_deref(),
                donors: imputes.then(|| donors_of(parts_rows, |r| vals[r as usize].is_nan())),
            },
            (Data::Cat { codes, dict }, ColStats::Categorical(s)) => ColEncoder::Cat {
                enc: s.encoder(dict),
                codes,
            },
            (Data::Time { us }, ColStats::Datetime(s)) => ColEncoder::Time {
                enc: s.encoder(),
                us,
                donors: imputes.then(|| donors_of(parts_rows, |r| us[r as usize].is_none())),
            },
            _ => unreachable!("statistics follow the column's family"),
        }
    }

    pub fn width(&self) -> usize {
        match self {
            ColEncoder::Num { enc, .. } => enc.width(),
            ColEncoder::Cat { .. } => 1,
            ColEncoder::Time { enc, .. } => enc.width(),
            ColEncoder::Skip => 0,
        }
    }

    /// The column's values at `rows`, in that order. A tight loop of independent loads: the
    /// rows of a shard are scattered over the input, and gathering them first lets the CPU
    /// overlap the cache misses that would otherwise stall each encode.
    fn gather(&self, rows: &[u32]) -> Gathered {
        match self {
            ColEncoder::Num { vals, ints, .. } => Gathered::Num {
                x: rows.iter().map(|&r| vals[r as usize]).collect(),
                int: ints.map(|iv| rows.iter().map(|&r| iv[r as usize]).collect()),
            },
            ColEncoder::Cat { codes, .. } => {
                Gathered::Cat(rows.iter().map(|&r| codes[r as usize]).collect())
            }
            ColEncoder::Time { us, .. } => {
                Gathered::Time(rows.iter().map(|&r| us[r as usize]).collect())
            }
            ColEncoder::Skip => Gathered::Skip,
        }
    }

    /// Codes of the `k`-th gathered value (input row `row`, in partition `part`) into
    /// `out[..width]`.
    #[inline]
    fn encode(&self, g: &Gathered, k: usize, row: u32, part: u32, key: DrawKey, out: &mut [i32]) {
        let draw = |donors: &Option<Vec<Vec<u32>>>| -> Option<u32> {
            let d = &donors.as_ref()?[part as usize];
            (!d.is_empty()).then(|| d[key.pick(row, d.len())])
        };
        match (self, g) {
            (
                ColEncoder::Num {
                    enc, vals, donors, ..
                },
                Gathered::Num { x, int },
            ) => {
                let x = x[k];
                let imputed = if x.is_nan() {
                    draw(donors).map(|r| vals[r as usize])
                } else {
                    None
                };
                enc.encode(x, int.as_ref().map(|iv| iv[k]), imputed, out);
            }
            (ColEncoder::Cat { enc, .. }, Gathered::Cat(codes)) => out[0] = enc.encode(codes[k]),
            (ColEncoder::Time { enc, us, donors }, Gathered::Time(v)) => {
                let v = v[k];
                let imputed = if v.is_none() {
                    draw(donors).and_then(|r| us[r as usize])
                } else {
                    None
                };
                enc.encode(v, imputed, out);
            }
            _ => {}
        }
    }
}

/// One column's values in shard order (see [`ColEncoder::gather`]).
enum Gathered {
    Num { x: Vec<f64>, int: Option<Vec<i64>> },
    Cat(Vec<u32>),
    Time(Vec<Option<i64>>),
    Skip,
}

/// The engine's positional sub-columns for sequences up to `max_len`: names and cardinalities.
pub(crate) fn positional_columns(max_len: usize) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for what in ["sidx", "slen", "ridx"] {
        if max_len < POSITIONAL_DIGIT_THRESHOLD {
            out.push((format!("tgt:/__{what}_cat"), max_len + 1));
        } else {
            let digits = max_len.to_string();
            let n = digits.len();
            for (i, ch) in digits.bytes().enumerate() {
                let card = if i == 0 {
                    usize::from(ch - b'0') + 1
                } else {
                    10
                };
                out.push((format!("tgt:/__{what}_E{}", n - 1 - i), card));
            }
        }
    }
    out
}

/// Everything a shard needs.
pub(crate) struct ShardInput<'a> {
    pub tensors: &'a [TensorSpec],
    pub max_len: usize,
    pub ctx_keys: &'a [i64],
    /// Target rows of context `c`: `tgt_rows[tgt_start[c]..tgt_start[c + 1]]`, input order.
    pub tgt_start: &'a [usize],
    pub tgt_rows: &'a [u32],
    /// Partition of each context-table row.
    pub part_of: &'a [u32],
    pub tgt_cols: &'a [ColEncoder<'a>],
    pub ctx_cols: &'a [ColEncoder<'a>],
    pub seed: u64,
}

/// A tensor's buffer.
enum Buf {
    I64(Vec<i64>),
    I32(Vec<i32>),
}

impl ShardInput<'_> {
    fn events(&self, c: u32) -> &[u32] {
        let c = c as usize;
        let rows = &self.tgt_rows[self.tgt_start[c]..self.tgt_start[c + 1]];
        &rows[..rows.len().min(self.max_len)]
    }

    /// Fills every tensor for the contexts `members` (context-table rows, in stored order).
    fn fill(&self, members: &[u32]) -> Vec<Buf> {
        let n = members.len();
        let steps = self.max_len + 1;
        let key = Buf::I64(members.iter().map(|&c| self.ctx_keys[c as usize]).collect());
        let length = Buf::I32(
            members
                .iter()
                .map(|&c| self.events(c).len() as i32)
                .collect(),
        );
        // Jobs: context columns, positional columns, target columns; each fills its own
        // tensors, in parallel.
        enum Job {
            Ctx(usize),
            Positional,
            Tgt(usize),
        }
        // The stored events of every member, in shard order: what the target jobs gather.
        let events: Vec<u32> = members
            .iter()
            .flat_map(|&c| self.events(c).iter().copied())
            .collect();
        let mut jobs: Vec<Job> = (0..self.ctx_cols.len()).map(Job::Ctx).collect();
        jobs.push(Job::Positional);
        jobs.extend((0..self.tgt_cols.len()).map(Job::Tgt));
        let filled: Vec<Vec<Vec<i32>>> = jobs
            .par_iter()
            .map(|job| match *job {
                Job::Ctx(j) => {
                    let col = &self.ctx_cols[j];
                    let w = col.width();
                    let mut bufs = vec![vec![0i32; n]; w];
                    let mut tmp = vec![0i32; w];
                    let dk = DrawKey {
                        seed: self.seed,
                        column: (1 << 32) | j as u64,
                    };
                    let g = col.gather(members);
                    for (i, &c) in members.iter().enumerate() {
                        col.encode(&g, i, c, self.part_of[c as usize], dk, &mut tmp);
                        for (b, &v) in bufs.iter_mut().zip(&tmp) {
                            b[i] = v;
                        }
                    }
                    bufs
                }
                Job::Positional => self.positional(members),
                Job::Tgt(j) => {
                    let col = &self.tgt_cols[j];
                    let w = col.width();
                    let mut bufs = vec![vec![0i32; n * steps]; w];
                    let mut tmp = vec![0i32; w];
                    let dk = DrawKey {
                        seed: self.seed,
                        column: j as u64,
                    };
                    let g = col.gather(&events);
                    let mut k = 0;
                    for (i, &c) in members.iter().enumerate() {
                        let part = self.part_of[c as usize];
                        for (t, &row) in self.events(c).iter().enumerate() {
                            col.encode(&g, k, row, part, dk, &mut tmp);
                            for (b, &v) in bufs.iter_mut().zip(&tmp) {
                                b[i * steps + t] = v;
                            }
                            k += 1;
                        }
                    }
                    bufs
                }
            })
            .collect();
        let mut out = vec![key, length];
        // Context sub-columns come first in the tensor list, then positional, then target:
        // the order of `jobs`.
        out.extend(filled.into_iter().flatten().map(Buf::I32));
        out
    }

    /// `sidx`, `slen`, `ridx` over the stored steps and the padding step: at step `t` of a
    /// context with `len` events, `t`, `len`, `len - t` (all 0 for an empty context).
    fn positional(&self, members: &[u32]) -> Vec<Vec<i32>> {
        let steps = self.max_len + 1;
        let n = members.len();
        let digits = if self.max_len < POSITIONAL_DIGIT_THRESHOLD {
            None
        } else {
            Some(self.max_len.to_string().len())
        };
        let per = digits.unwrap_or(1);
        let mut bufs = vec![vec![0i32; n * steps]; 3 * per];
        for (i, &c) in members.iter().enumerate() {
            let len = self.events(c).len();
            for t in 0..=len {
                for (k, v) in [t, len, len - t].into_iter().enumerate() {
                    match digits {
                        None => bufs[k][i * steps + t] = v as i32,
                        Some(nd) => {
                            let mut x = v;
                            for e in 0..nd {
                                bufs[k * nd + nd - 1 - e][i * steps + t] = (x % 10) as i32;
                                x /= 10;
                            }
                        }
                    }
                }
            }
        }
        bufs
    }

    /// Writes one shard of `members` as `file` in `dir`.
    pub fn write(
        &self,
        dir: &Path,
        file: &str,
        split: &str,
        index: usize,
        first: usize,
        members: &[u32],
    ) -> Result<ShardEntry> {
        let meta = dsc_format::shard::ShardMeta {
            split,
            index,
            first_context: first,
            profile: Some("mostlyai"),
        };
        let (header, _) = dsc_format::shard::build_header(self.tensors, members.len(), &meta);
        let bufs = self.fill(members);
        debug_assert_eq!(bufs.len(), self.tensors.len());
        let mut out = ShardWriter::create(dir.join(file))?;
        out.write(&header)?;
        let mut bytes = Vec::new();
        for b in &bufs {
            match b {
                Buf::I64(v) => {
                    bytes.resize(v.len() * 8, 0);
                    for (dst, x) in bytes.chunks_exact_mut(8).zip(v) {
                        dst.copy_from_slice(&x.to_le_bytes());
                    }
                }
                Buf::I32(v) => {
                    bytes.resize(v.len() * 4, 0);
                    for (dst, x) in bytes.chunks_exact_mut(4).zip(v) {
                        dst.copy_from_slice(&x.to_le_bytes());
                    }
                }
            }
            out.write(&bytes)?;
        }
        let (bytes, xxh3) = out.finish()?;
        Ok(ShardEntry {
            file: file.into(),
            split: split.into(),
            index,
            contexts: members.len(),
            first_context: first,
            bytes,
            xxh3,
        })
    }
}
