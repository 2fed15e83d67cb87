//! Encoding contexts into the engine's sub-column codes, written as safetensors shards: one
//! `[n, L + 1]` tensor per target sub-column (positional ones first), one `[n]` tensor per
//! context sub-column, plus `key` and `length`.

use super::analyze::ColStats;
use super::table::{Data, MTable};
use super::{categorical, datetime, numeric};
use crate::error::Result;
use crate::runs::Pool;
use crate::shards::ShardFile;
use dsc_format::manifest::{ShardEntry, TensorSpec};
use dsc_format::rng::mix64;
use std::path::Path;

/// The engine switches positional columns from one code to decimal digits at this length.
const POSITIONAL_DIGIT_THRESHOLD: usize = 100;

/// How one column turns a row into its sub-column codes.
pub(crate) enum ColEncoder<'a> {
    Num {
        enc: numeric::Encoder,
        vals: &'a [f64],
        ints: Option<&'a [i64]>,
        /// Per partition, the non-null values a null row draws its imputed value from.
        donors: Option<&'a [Pool<'a>]>,
    },
    Cat {
        enc: categorical::Encoder,
        codes: &'a [u32],
    },
    Time {
        enc: datetime::Encoder,
        us: &'a [Option<i64>],
        donors: Option<&'a [Pool<'a>]>,
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
    /// The index of the donor drawn for global row `row`: a pure function of (seed, column,
    /// row), so the draw depends on neither thread count nor order. Uniform over the donors
    /// (multiply-shift).
    fn pick(self, row: u64, donors: u64) -> u64 {
        let h = mix64(
            mix64(self.seed ^ mix64(dsc_format::rng::stream::MOSTLYAI_IMPUTE))
                ^ mix64(self.column)
                ^ row,
        );
        ((u128::from(h) * u128::from(donors)) >> 64) as u64
    }

    /// The donor value (8 bytes) for `row` from `pools[part]`, if the partition has any.
    fn draw(self, pools: Option<&[Pool]>, part: u32, row: u64) -> Result<Option<[u8; 8]>> {
        let Some(pool) = pools.map(|p| &p[part as usize]) else {
            return Ok(None);
        };
        if pool.len() == 0 {
            return Ok(None);
        }
        pool.bytes_at(self.pick(row, pool.len())).map(Some)
    }
}

impl<'a> ColEncoder<'a> {
    /// The encoder of column `c` of a bucket. `donors`: the column's donor pools per partition
    /// (where it imputes); `int64`: pandas keeps the column int64 (an integer column without
    /// nulls anywhere), so its exact integers are encoded.
    pub fn new(
        table: &'a MTable,
        c: usize,
        stats: &ColStats,
        donors: Option<&'a [Pool<'a>]>,
        int64: bool,
    ) -> Self {
        match (&table.cols[c].data, stats) {
            (_, ColStats::Empty(_)) => ColEncoder::Skip,
            (Data::Num { vals, ints }, ColStats::Numeric(s)) => {
                let ints = ints.as_deref().filter(|_| int64);
                ColEncoder::Num {
                    enc: numeric::Encoder::new(s, vals, ints),
                    vals,
                    ints,
                    donors: donors.filter(|_| stats.imputes()),
                }
            }
            (Data::Cat { codes, dict }, ColStats::Categorical(s)) => ColEncoder::Cat {
                enc: s.encoder(dict),
                codes,
            },
            (Data::Time { us }, ColStats::Datetime(s)) => ColEncoder::Time {
                enc: s.encoder(),
                us,
                donors: donors.filter(|_| stats.imputes()),
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
    /// rows of a shard are scattered over the bucket, and gathering them first lets the CPU
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

    /// Codes of the `k`-th gathered value (global row `row`, in partition `part`) into
    /// `out[..width]`.
    #[inline]
    fn encode(
        &self,
        g: &Gathered,
        k: usize,
        row: u64,
        part: u32,
        key: DrawKey,
        out: &mut [i32],
    ) -> Result<()> {
        match (self, g) {
            (ColEncoder::Num { enc, donors, .. }, Gathered::Num { x, int }) => {
                let x = x[k];
                let imputed = if x.is_nan() {
                    key.draw(*donors, part, row)?.map(f64::from_le_bytes)
                } else {
                    None
                };
                enc.encode(x, int.as_ref().map(|iv| iv[k]), imputed, out);
            }
            (ColEncoder::Cat { enc, .. }, Gathered::Cat(codes)) => out[0] = enc.encode(codes[k]),
            (ColEncoder::Time { enc, donors, .. }, Gathered::Time(v)) => {
                let v = v[k];
                let imputed = if v.is_none() {
                    key.draw(*donors, part, row)?.map(i64::from_le_bytes)
                } else {
                    None
                };
                enc.encode(v, imputed, out);
            }
            _ => {}
        }
        Ok(())
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

/// Everything a bucket's shards need.
pub(crate) struct ShardInput<'a> {
    pub tensors: &'a [TensorSpec],
    pub max_len: usize,
    /// The bucket's contexts (its rows of the context table): keys, global rows, partitions.
    pub ctx_keys: &'a [i64],
    pub ctx_origin: &'a [u64],
    pub part_of: &'a [u32],
    /// Target rows of context `c`: `tgt_rows[tgt_start[c]..tgt_start[c + 1]]`, input order.
    pub tgt_start: &'a [usize],
    pub tgt_rows: &'a [u32],
    /// Global row of each of the bucket's target rows.
    pub tgt_origin: &'a [u64],
    pub tgt_cols: &'a [ColEncoder<'a>],
    pub ctx_cols: &'a [ColEncoder<'a>],
    pub seed: u64,
}

impl ShardInput<'_> {
    fn events(&self, c: u32) -> &[u32] {
        let c = c as usize;
        let rows = &self.tgt_rows[self.tgt_start[c]..self.tgt_start[c + 1]];
        &rows[..rows.len().min(self.max_len)]
    }

    /// Writes the tensors of the contexts `members` (the bucket's context rows, in stored
    /// order) to `out`, in the tensors' order: `key`, `length`, the context sub-columns, the
    /// positional ones, the target ones. One column's sub-columns are held at a time, so a
    /// shard's writer holds a fraction of the shard.
    fn write_tensors(&self, members: &[u32], out: &mut ShardFile) -> Result<()> {
        let n = members.len();
        let steps = self.max_len + 1;
        let mut bytes: Vec<u8> = members
            .iter()
            .flat_map(|&c| self.ctx_keys[c as usize].to_le_bytes())
            .collect();
        out.write(&bytes)?;
        bytes.clear();
        bytes.extend(
            members
                .iter()
                .flat_map(|&c| (self.events(c).len() as i32).to_le_bytes()),
        );
        out.write(&bytes)?;
        let mut emit = |bufs: Vec<Vec<i32>>| -> Result<()> {
            for b in bufs {
                bytes.clear();
                bytes.extend(b.iter().flat_map(|x| x.to_le_bytes()));
                out.write(&bytes)?;
            }
            Ok(())
        };
        for (j, col) in self.ctx_cols.iter().enumerate() {
            let w = col.width();
            let mut bufs = vec![vec![0i32; n]; w];
            let mut tmp = vec![0i32; w];
            let dk = DrawKey {
                seed: self.seed,
                column: (1 << 32) | j as u64,
            };
            let g = col.gather(members);
            for (i, &c) in members.iter().enumerate() {
                let (row, part) = (self.ctx_origin[c as usize], self.part_of[c as usize]);
                col.encode(&g, i, row, part, dk, &mut tmp)?;
                for (b, &v) in bufs.iter_mut().zip(&tmp) {
                    b[i] = v;
                }
            }
            emit(bufs)?;
        }
        emit(self.positional(members))?;
        // The stored events of every member, in shard order: what the target columns gather.
        let events: Vec<u32> = members
            .iter()
            .flat_map(|&c| self.events(c).iter().copied())
            .collect();
        for (j, col) in self.tgt_cols.iter().enumerate() {
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
                    let global = self.tgt_origin[row as usize];
                    col.encode(&g, k, global, part, dk, &mut tmp)?;
                    for (b, &v) in bufs.iter_mut().zip(&tmp) {
                        b[i * steps + t] = v;
                    }
                    k += 1;
                }
            }
            emit(bufs)?;
        }
        Ok(())
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

    /// Writes one shard of `members`.
    pub fn write(
        &self,
        dir: &Path,
        split: &str,
        index: usize,
        first: usize,
        members: &[u32],
    ) -> Result<ShardEntry> {
        let mut out = ShardFile::create(
            dir,
            self.tensors,
            split,
            index,
            first,
            members.len(),
            Some(super::PROFILE),
        )?;
        self.write_tensors(members, &mut out)?;
        out.finish()
    }
}
