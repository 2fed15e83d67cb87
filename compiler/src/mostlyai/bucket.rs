//! One bucket of a profile compile: its target rows and context rows read back from the spills
//! as the engine sees them, each target row linked to its context and each context to its
//! engine partition. The tables are spilled into the same buckets by key, so a bucket holds
//! every row of its contexts; both passes (statistics, then shards) prepare a bucket the same
//! way.

use super::analyze::partition_of;
use super::spec::ProfileSpec;
use super::table::{self, Family, MTable};
use crate::column::{Column, Kind, TypeInfo};
use crate::error::{CompileError, Result};
use crate::read::{self, Inputs, Role, Want};
use crate::spill::{self, Buckets, Described, Spill, SpillPart};
use dsc_format::spec::{CompileSpec, DEFAULT_BUCKET_SIZE};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One input table of the profile: its files and every column, key first.
pub(crate) struct Side {
    pub files: Vec<PathBuf>,
    pub key: String,
    pub wants: Vec<Want>,
    pub types: Vec<TypeInfo>,
    pub offsets: Vec<u64>,
    /// The non-key columns: names, families, and whether each is an integer column.
    pub names: Vec<String>,
    pub families: Vec<Family>,
    pub integer: Vec<bool>,
    /// Decoded bytes per row, as the spill sizes buckets.
    pub width: u64,
}

impl Side {
    /// Opens the footers of `files` (every column, `key` first).
    fn open(files: Vec<PathBuf>, key: &str) -> Result<(Side, Inputs)> {
        let wants = table::wants(&files[0], key)?;
        let inputs = read::open_all(&files, &wants, read::Table::Keyed)?;
        let families = table::families(&wants, &inputs.types, &files[0])?;
        let side = Side {
            key: key.into(),
            names: wants[1..].iter().map(|w| w.name.clone()).collect(),
            integer: inputs.types[1..]
                .iter()
                .map(|t| t.kind == Kind::Int)
                .collect(),
            families,
            width: spill::row_width(&inputs.types),
            types: inputs.types.clone(),
            offsets: inputs.offsets.clone(),
            wants,
            files,
        };
        Ok((side, inputs))
    }

    pub fn rows(&self) -> u64 {
        *self.offsets.last().unwrap_or(&0)
    }

    pub fn described(&self) -> Described {
        Described {
            files: self.files.clone(),
            offsets: self.offsets.clone(),
            types: self.types.clone(),
        }
    }
}

/// Everything every stage of a profile compile reads the same way: the spec, both tables'
/// footers, the buckets, and where the validation contexts are.
pub(crate) struct Setup<'s> {
    /// The spec, recorded in the manifest as given (with what the profile resolved).
    pub spec: &'s CompileSpec,
    /// What the profile reads of it.
    pub profile: ProfileSpec,
    pub tgt: Side,
    pub ctx: Side,
    /// Every file the output depends on, with its role.
    pub named: Vec<(PathBuf, &'static str)>,
    pub buckets: Buckets,
    /// Global context-table rows of the validation contexts, ascending.
    val_rows: Vec<u64>,
}

/// The two spilled tables.
pub(crate) struct Spills {
    pub tgt: Spill,
    pub ctx: Spill,
}

/// Target rows whose key is not in the context table: how many, and the first (global row,
/// key).
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Unmatched {
    pub rows: u64,
    pub first: Option<(u64, i64)>,
}

impl Unmatched {
    pub fn add(&mut self, other: Unmatched) {
        self.rows += other.rows;
        self.first = match (self.first, other.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// One bucket, prepared.
pub(crate) struct Bucket {
    pub tgt: MTable,
    pub ctx: MTable,
    /// The engine partition of each of the bucket's contexts (its context-table rows).
    pub part_of: Vec<u32>,
    /// Target rows of context `c`: `tgt_rows[tgt_start[c]..tgt_start[c + 1]]`, input order.
    pub tgt_start: Vec<usize>,
    pub tgt_rows: Vec<u32>,
    pub unmatched: Unmatched,
}

impl Bucket {
    /// Whether context `c` is a validation context (odd partitions are `-val`).
    pub fn is_val(&self, c: usize) -> bool {
        self.part_of[c] % 2 == 1
    }

    pub fn length(&self, c: usize) -> usize {
        self.tgt_start[c + 1] - self.tgt_start[c]
    }

    /// The bucket's target rows and context rows of each of `parts` partitions, ascending.
    pub fn rows_by_part(&self, parts: usize) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
        let mut tgt = vec![Vec::new(); parts];
        let mut ctx = vec![Vec::new(); parts];
        for (c, &p) in self.part_of.iter().enumerate() {
            ctx[p as usize].push(c as u32);
            tgt[p as usize]
                .extend_from_slice(&self.tgt_rows[self.tgt_start[c]..self.tgt_start[c + 1]]);
        }
        for rows in &mut tgt {
            rows.sort_unstable();
        }
        (tgt, ctx)
    }
}

impl<'s> Setup<'s> {
    /// Checks `spec`, opens both tables' footers (returned, to be spilled: target, context),
    /// sizes the buckets and finds the validation contexts.
    pub fn new(spec: &'s CompileSpec) -> Result<(Setup<'s>, Inputs, Inputs)> {
        let profile = ProfileSpec::of(spec)?;
        let tgt_files = read::resolve(&profile.rows)?;
        let ctx_files = read::resolve(std::slice::from_ref(&profile.context))?;
        let mut named: Vec<(PathBuf, &str)> =
            tgt_files.iter().map(|p| (p.clone(), "rows")).collect();
        named.extend(ctx_files.iter().map(|p| (p.clone(), "context")));
        if let Some(v) = &profile.val_keys {
            named.push((PathBuf::from(v), "val_keys"));
        }
        let (tgt, tgt_inputs) = Side::open(tgt_files, &profile.key)?;
        let (ctx, ctx_inputs) = Side::open(ctx_files, &profile.context_key)?;
        let buckets = Buckets::for_size(
            tgt.rows() * tgt.width,
            profile.bucket_size.unwrap_or(DEFAULT_BUCKET_SIZE),
            profile.seed,
        );
        let val_rows = match &profile.val_keys {
            Some(path) => val_rows(Path::new(path), &ctx, &profile.context)?,
            None => Vec::new(),
        };
        let setup = Setup {
            spec,
            profile,
            tgt,
            ctx,
            named,
            buckets,
            val_rows,
        };
        Ok((setup, tgt_inputs, ctx_inputs))
    }

    /// Both tables' spills from their parts in `dir`.
    pub fn spills(&self, dir: &Path, tgt: Vec<SpillPart>, ctx: SpillPart) -> Spills {
        Spills {
            tgt: Spill::from_parts(
                dir,
                tgt,
                self.buckets,
                self.tgt.described(),
                self.tgt.wants.clone(),
            ),
            ctx: Spill::from_parts(
                dir,
                vec![ctx],
                self.buckets,
                self.ctx.described(),
                self.ctx.wants.clone(),
            ),
        }
    }

    /// Decoded bytes of bucket `b`'s rows of both tables.
    pub fn bucket_bytes(&self, spills: &Spills, b: usize) -> u64 {
        spills.tgt.rows(b) * self.tgt.width + spills.ctx.rows(b) * self.ctx.width
    }

    /// Reads bucket `b` back and links its rows.
    pub fn prepare(&self, spills: &Spills, b: usize) -> Result<Bucket> {
        let tgt = table::convert(spills.tgt.load(b)?)?;
        let ctx = table::convert(spills.ctx.load(b)?)?;
        let mut index: HashMap<i64, u32> = HashMap::with_capacity(ctx.rows());
        for (row, &k) in ctx.keys.iter().enumerate() {
            if let Some(&first) = index.get(&k) {
                let (path, row) = ctx.locate(row);
                let (first_path, first_row) = ctx.locate(first as usize);
                return Err(CompileError::DuplicateKey {
                    path: path.into(),
                    column: self.ctx.key.clone(),
                    key: k.to_string(),
                    first: match first_path == path {
                        true => format!("row {first_row}"),
                        false => format!("row {first_row} of {}", first_path.display()),
                    },
                    row,
                });
            }
            index.insert(k, row as u32);
        }
        let mut unmatched = Unmatched::default();
        let mut tgt_ctx = Vec::with_capacity(tgt.rows());
        for (row, k) in tgt.keys.iter().enumerate() {
            match index.get(k) {
                Some(&c) => tgt_ctx.push(c),
                None => {
                    unmatched.rows += 1;
                    unmatched.first.get_or_insert((tgt.origin[row], *k));
                    tgt_ctx.push(u32::MAX);
                }
            }
        }
        // Target rows grouped by context, in input order (a stable counting sort).
        let contexts = ctx.rows();
        let mut tgt_start = vec![0usize; contexts + 1];
        for &c in tgt_ctx.iter().filter(|&&c| c != u32::MAX) {
            tgt_start[c as usize + 1] += 1;
        }
        for i in 0..contexts {
            tgt_start[i + 1] += tgt_start[i];
        }
        let mut fill = tgt_start.clone();
        let mut tgt_rows = vec![0u32; tgt_start[contexts]];
        for (row, &c) in tgt_ctx.iter().enumerate() {
            if c != u32::MAX {
                tgt_rows[fill[c as usize]] = row as u32;
                fill[c as usize] += 1;
            }
        }
        let part_of = ctx
            .origin
            .iter()
            .map(|&r| {
                let val_before = self.val_rows.partition_point(|&v| v < r) as u64;
                let is_val = self.val_rows.get(val_before as usize) == Some(&r);
                partition_of(r, is_val, val_before, self.profile.partitions)
            })
            .collect();
        Ok(Bucket {
            tgt,
            ctx,
            part_of,
            tgt_start,
            tgt_rows,
            unmatched,
        })
    }
}

/// The global rows of the context table's validation contexts, ascending, from its key column
/// read batch by batch; a listed key that is not a context is an error naming its line.
fn val_rows(list: &Path, ctx: &Side, ctx_path: &str) -> Result<Vec<u64>> {
    // The profile's keys are integers (`table::wants`).
    let mut listed: Vec<(i64, usize)> =
        crate::split::read_key_list(list, dsc_format::keys::KeyType::Int)?
            .into_iter()
            .map(|(id, line, _)| (id, line))
            .collect();
    listed.sort_unstable();
    listed.dedup_by_key(|e| e.0);
    let mut found = vec![false; listed.len()];
    let mut rows = Vec::new();
    let key_want = [Want {
        name: ctx.key.clone(),
        role: Role::Key,
    }];
    for (path, &first) in ctx.files.iter().zip(&ctx.offsets) {
        let reader = read::open(path)?.into_wanted_reader(&key_want)?;
        let mut row = first;
        for batch in reader {
            let batch = batch.map_err(|e| CompileError::parquet(path.clone(), None, e))?;
            let mut keys = Column::new(ctx.types[0].clone(), batch.num_rows());
            keys.push_array(batch.column(0));
            for i in 0..keys.len() {
                if let Some(k) = keys.i64_at(i) {
                    if let Ok(j) = listed.binary_search_by_key(&k, |e| e.0) {
                        found[j] = true;
                        rows.push(row);
                    }
                }
                row += 1;
            }
        }
    }
    let missing = listed
        .iter()
        .zip(&found)
        .filter(|(_, &f)| !f)
        .map(|(e, _)| *e)
        .min_by_key(|e| e.1);
    if let Some((k, line)) = missing {
        return Err(CompileError::KeyList {
            path: list.into(),
            line,
            what: format!("key {k} is not in the context table {ctx_path}"),
        });
    }
    Ok(rows)
}
