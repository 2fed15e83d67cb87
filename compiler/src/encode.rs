//! Per-column value access (through joins), statistics, and the encoders that turn source
//! values into stored numbers.

use crate::column::{Column, Kind, Values};
use crate::error::{CompileError, Result};
use crate::lookup::{KeyIndex, Keyed};
use crate::read::RowsTable;
use dsc_format::manifest::{CODE_FIRST, CODE_NULL, CODE_UNKNOWN};
use dsc_format::spec::NanPolicy;
use dsc_format::stats::ColumnStats;
use dsc_format::{Encoding, Stage};
use rayon::prelude::*;
use std::collections::HashMap;

/// Split tags per row or per context row: the split's position in the cache (`train` is 0), or
/// [`DROPPED`] for a row no context stores.
pub(crate) const TRAIN: u8 = 0;
pub(crate) const DROPPED: u8 = u8::MAX;

/// Reads one column for rows of a table, directly or through a join on an integer column.
#[derive(Clone, Copy)]
pub(crate) struct Access<'a> {
    pub name: &'a str,
    pub table: &'a RowsTable,
    pub column: &'a Column,
    pub join: Option<(&'a Column, &'a Keyed)>,
}

impl<'a> Access<'a> {
    /// The row of `self.column` that holds row `row`'s value; `None` when the join key is null.
    #[inline]
    pub fn source_row(&self, row: usize) -> Result<Option<usize>> {
        match self.join {
            None => Ok(Some(row)),
            Some((on, keyed)) => {
                let Some(k) = on.i64_at(row) else {
                    return Ok(None);
                };
                match keyed.index.get(k) {
                    Some(r) => Ok(Some(r as usize)),
                    None => {
                        let (path, row) = self.table.locate(row);
                        Err(CompileError::MissingJoinKey {
                            path: path.into(),
                            row,
                            column: keyed.key.clone(),
                            value: k.to_string(),
                            join: keyed.path.clone(),
                        })
                    }
                }
            }
        }
    }

    #[inline]
    pub fn f64_at(&self, row: usize) -> Result<Option<f64>> {
        Ok(self.source_row(row)?.and_then(|r| self.column.f64_at(r)))
    }

    /// A reader of this column's numbers by row for passes over every row: the values of
    /// `f64_at`, without its checks per value where the column allows.
    pub fn numbers(&self) -> Numbers<'a> {
        if let Some((on, keyed)) = self.join {
            // A join table no longer than the rows read through it (a pass reads it per
            // bucket).
            let small = self.column.len() <= self.table.rows();
            if let (Values::Int(keys), None, KeyIndex::Dense { min, rows }, true) =
                (&on.values, &on.valid, &keyed.index, small)
            {
                // Each joined row's value, read once: rows then cost an index.
                let values = (0..self.column.len())
                    .map(|r| self.column.f64_at(r))
                    .collect();
                return Numbers::Joined {
                    keys,
                    min: *min,
                    slots: rows,
                    values,
                    access: *self,
                };
            }
            return Numbers::Any(*self);
        }
        match (&self.column.values, &self.column.valid) {
            (Values::F64(v), None) => Numbers::F64(v),
            (Values::Int(v), None) if self.column.info.kind != Kind::Time => Numbers::Int(v),
            (Values::Bool(v), None) => Numbers::Bool(v),
            _ => Numbers::Any(*self),
        }
    }
}

/// A numeric column read row by row (see [`Access::numbers`]).
pub(crate) enum Numbers<'a> {
    /// Floats, no row null.
    F64(&'a [f64]),
    /// Integers (not times, which are scaled), no row null.
    Int(&'a [i64]),
    /// Booleans (1 and 0), no row null.
    Bool(&'a [bool]),
    /// Joined through a dense index on a key column with no nulls: each joined row's value.
    Joined {
        keys: &'a [i64],
        min: i64,
        slots: &'a [u32],
        values: Vec<Option<f64>>,
        /// For a key the join table lacks: the error names the row.
        access: Access<'a>,
    },
    Any(Access<'a>),
}

impl Numbers<'_> {
    /// [`Access::f64_at`] of `row`.
    #[inline]
    pub fn get(&self, row: usize) -> Result<Option<f64>> {
        self.get_joined(row).map(|(x, _)| x)
    }

    /// For a joined table read by index: every joined row's value (what `get` returns for a
    /// row joined to it); for booleans their two values, read by the boolean. The statistics
    /// count such values per index instead of sorting them.
    pub fn joined_values(&self) -> Option<&[Option<f64>]> {
        const BOOLS: [Option<f64>; 2] = [Some(0.0), Some(1.0)];
        match self {
            Numbers::Joined { values, .. } => Some(values),
            Numbers::Bool(_) => Some(&BOOLS),
            _ => None,
        }
    }

    /// [`Numbers::get`], with the index it was read by where the values are read by index
    /// ([`Numbers::joined_values`]).
    #[inline]
    pub fn get_joined(&self, row: usize) -> Result<(Option<f64>, Option<usize>)> {
        struct One(usize);
        impl RowReader for One {
            type Out = Result<(Option<f64>, Option<usize>)>;
            fn read(
                self,
                get: impl Fn(usize) -> Result<(Option<f64>, Option<usize>)>,
            ) -> Self::Out {
                get(self.0)
            }
        }
        self.read_with(One(row))
    }

    /// Hands `reader` this column's reader of a row: its value, and the index it was read by
    /// where values are read by index. One reader per kind, so that a loop over rows inside
    /// `reader` is compiled for each kind, with no match per row.
    #[inline(always)]
    pub fn read_with<R: RowReader>(&self, reader: R) -> R::Out {
        match self {
            Numbers::F64(v) => reader.read(|row| Ok((Some(v[row]), None))),
            Numbers::Int(v) => reader.read(|row| Ok((Some(v[row] as f64), None))),
            Numbers::Bool(v) => reader.read(|row| {
                let b = usize::from(v[row]);
                Ok((Some(b as f64), Some(b)))
            }),
            Numbers::Joined {
                keys,
                min,
                slots,
                values,
                access,
            } => reader.read(|row| joined_at(keys, *min, slots, values, access, row)),
            Numbers::Any(access) => reader.read(|row| Ok((access.f64_at(row)?, None))),
        }
    }

    /// What the rows are read by when their values are read by index: the join's key column
    /// and index (shared by every column joined through them), or a boolean column.
    pub fn index_id(&self) -> Option<(usize, usize)> {
        match self {
            Numbers::Joined { keys, slots, .. } => {
                Some((keys.as_ptr() as usize, slots.as_ptr() as usize))
            }
            Numbers::Bool(v) => Some((v.as_ptr() as usize, 0)),
            _ => None,
        }
    }

    /// For a join read by index: the key of each joined row (what a categorical column that is
    /// the join's key holds on the rows joined to it).
    pub fn index_keys(&self) -> Option<Vec<i64>> {
        let Numbers::Joined {
            min, slots, values, ..
        } = self
        else {
            return None;
        };
        let mut keys = vec![0; values.len()];
        for (i, &r) in slots.iter().enumerate() {
            if let Some(k) = keys.get_mut(r as usize) {
                *k = min + i as i64;
            }
        }
        Some(keys)
    }
}

/// Per split, how many of the rows tagged `tags` (rows of the table itself) read each value of
/// `numbers`' index ([`Numbers::joined_values`], `len` of them): all that the statistics of a
/// column read by index need, whatever its values. `None` where some row is not read by index
/// (a key outside the dense index): then its values are gathered one by one. The first error in
/// row order (a key the join table lacks), whatever the threads.
pub(crate) fn count_by_index(
    numbers: &Numbers,
    tags: &[u8],
    splits: usize,
    len: usize,
) -> Result<Option<Vec<Vec<u64>>>> {
    let parts: Vec<Option<Vec<Vec<u64>>>> = tags
        .par_chunks(1 << 16)
        .enumerate()
        .map(|(c, chunk)| {
            let mut counts = vec![vec![0u64; len]; splits];
            let all = numbers.read_with(Count {
                tags: chunk,
                base: c << 16,
                counts: &mut counts,
            })?;
            Ok(all.then_some(counts))
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let mut total = vec![vec![0u64; len]; splits];
    for part in parts {
        let Some(part) = part else { return Ok(None) };
        for (sum, counts) in total.iter_mut().zip(part) {
            sum.iter_mut().zip(counts).for_each(|(s, c)| *s += c);
        }
    }
    Ok(Some(total))
}

/// One chunk of [`count_by_index`]'s rows (`tags`, from row `base`): `false` where a row was
/// not read by index.
struct Count<'c> {
    tags: &'c [u8],
    base: usize,
    counts: &'c mut [Vec<u64>],
}

impl RowReader for Count<'_> {
    type Out = Result<bool>;

    #[inline(always)]
    fn read(self, get: impl Fn(usize) -> Result<(Option<f64>, Option<usize>)>) -> Result<bool> {
        for (i, &tag) in self.tags.iter().enumerate() {
            if tag == DROPPED {
                continue;
            }
            match get(self.base + i)?.1 {
                Some(r) => self.counts[tag as usize][r] += 1,
                None => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// What reads a numeric column's rows through [`Numbers::read_with`].
pub(crate) trait RowReader {
    type Out;
    fn read(self, get: impl Fn(usize) -> Result<(Option<f64>, Option<usize>)>) -> Self::Out;
}

/// The joined row that row `row` reads through a dense index (`slots`, by key from `min`), where
/// its key is in the index.
#[inline(always)]
fn joined_row(keys: &[i64], min: i64, slots: &[u32], row: usize) -> Option<usize> {
    let i = usize::try_from(keys[row].checked_sub(min)?).ok()?;
    slots.get(i).map(|&r| r as usize)
}

/// [`Numbers::get_joined`] of a joined column: through the index when the key is in it, else
/// by the lookup (which names a key the table lacks).
#[inline(always)]
fn joined_at(
    keys: &[i64],
    min: i64,
    slots: &[u32],
    values: &[Option<f64>],
    access: &Access,
    row: usize,
) -> Result<(Option<f64>, Option<usize>)> {
    match joined_row(keys, min, slots, row) {
        Some(r) if r < values.len() => Ok((values[r], Some(r))),
        _ => Ok((access.f64_at(row)?, None)),
    }
}

/// Finite values of a numeric column gathered by split, plus bad-value counts.
pub(crate) struct Gathered {
    /// The values of split 0 (train), then of split 1, …
    pub values: Vec<f64>,
    /// Where each split's values start in `values`, and the end: `splits + 1` offsets.
    pub bounds: Vec<usize>,
    /// Per split: null, NaN and inf counts.
    pub counts: Vec<[u64; 3]>,
    /// Where the values came through a join read by index: each joined row's value, and per
    /// split how many of the values are that row's (what sorts them without comparing).
    pub joined: Option<JoinedCounts>,
}

/// Each joined row's value, and per split how often each joined row's value was gathered.
pub(crate) type JoinedCounts = (Vec<Option<f64>>, Vec<Vec<u64>>);

impl Gathered {
    /// The values of each split, as disjoint mutable slices.
    pub fn split_values(&mut self) -> Vec<&mut [f64]> {
        let mut rest = self.values.as_mut_slice();
        let mut out = Vec::with_capacity(self.bounds.len() - 1);
        for w in self.bounds.windows(2) {
            let (mine, tail) = rest.split_at_mut(w[1] - w[0]);
            out.push(mine);
            rest = tail;
        }
        out
    }
}

/// What one chunk of rows gathers: per split its finite values, its null, NaN and infinite
/// counts, and its finite values per joined row.
type Part = (Vec<Vec<f64>>, Vec<[u64; 3]>, Vec<Vec<u64>>);

/// `tags[i]` holds the split (`0..splits`) or [`DROPPED`] of row `rows[i]` (of row `i` when
/// `rows` is `None`).
pub(crate) fn gather(
    access: &Access,
    tags: &[u8],
    rows: Option<&[u32]>,
    splits: usize,
) -> Result<Gathered> {
    // Chunks are collected in order and the first error taken, so the row an error names
    // does not depend on the thread count (here and in every parallel loop of the compiler).
    let numbers = access.numbers();
    // Counted per joined row when the join table is small beside a chunk of rows.
    let joined = match numbers.joined_values() {
        Some(table) if table.len() <= 1 << 16 => table.len(),
        _ => 0,
    };
    let parts: Vec<Part> = tags
        .par_chunks(1 << 16)
        .enumerate()
        .map(|(c, chunk)| {
            let base = c << 16;
            let mut part: Part = (
                vec![Vec::new(); splits],
                vec![[0; 3]; splits],
                vec![vec![0; joined]; splits],
            );
            numbers.read_with(Chunk {
                tags: chunk,
                base,
                rows,
                part: &mut part,
            })?;
            Ok(part)
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let total: usize = parts.iter().flat_map(|p| p.0.iter().map(Vec::len)).sum();
    let mut values = Vec::with_capacity(total);
    let mut bounds = vec![0];
    let mut counts = vec![[0u64; 3]; splits];
    let mut by_joined = vec![vec![0u64; joined]; splits];
    for (s, split_counts) in counts.iter_mut().enumerate() {
        for p in &parts {
            values.extend_from_slice(&p.0[s]);
            for (total, part) in split_counts.iter_mut().zip(&p.1[s]) {
                *total += part;
            }
            for (total, part) in by_joined[s].iter_mut().zip(&p.2[s]) {
                *total += part;
            }
        }
        bounds.push(values.len());
    }
    // Every finite value came through the index: each split's values are its joined rows'
    // values, each as often as counted.
    let all_joined = joined > 0 && by_joined.iter().flatten().sum::<u64>() == values.len() as u64;
    let joined = all_joined.then(|| {
        let table = numbers.joined_values().expect("joined").to_vec();
        (table, by_joined)
    });
    Ok(Gathered {
        values,
        bounds,
        counts,
        joined,
    })
}

/// One chunk of [`gather`]'s rows (`tags`, from row `base`), gathered into `part`.
struct Chunk<'c> {
    tags: &'c [u8],
    base: usize,
    rows: Option<&'c [u32]>,
    part: &'c mut Part,
}

impl RowReader for Chunk<'_> {
    type Out = Result<()>;

    #[inline(always)]
    fn read(self, get: impl Fn(usize) -> Result<(Option<f64>, Option<usize>)>) -> Result<()> {
        let part = self.part;
        for (i, &tag) in self.tags.iter().enumerate() {
            if tag == DROPPED {
                continue;
            }
            let s = tag as usize;
            let row = self
                .rows
                .map_or(self.base + i, |r| r[self.base + i] as usize);
            match get(row)? {
                (Some(x), r) if x.is_finite() => {
                    part.0[s].push(x);
                    // Counted where the table is small enough to count by (`joined`).
                    if let Some(count) = r.and_then(|r| part.2[s].get_mut(r)) {
                        *count += 1;
                    }
                }
                (None, _) => part.1[s][0] += 1,
                (Some(x), _) if x.is_nan() => part.1[s][1] += 1,
                (Some(_), _) => part.1[s][2] += 1,
            }
        }
        Ok(())
    }
}

/// Statistics of a numeric column for `all` and each split, and the fitted encoding stages.
pub(crate) struct NumericResult {
    /// Whether some stored row holds null, NaN or inf.
    pub has_bad: bool,
    /// `all`, then each split in order.
    pub stats: Vec<ColumnStats>,
    pub stages: Vec<Stage>,
    /// Raw train mean, for `nan = mean`.
    pub train_mean: f64,
    /// The fill taken from another cache (`fit_from`) instead of the one the policy derives.
    pub fill: Option<Option<f64>>,
    /// With another cache's parameters: the finite values outside the range they were fitted
    /// on (that cache's train minimum and maximum), for the drift report.
    pub outside: Option<u64>,
}

/// Whether some value of a column with statistics `stats` (`all` first) leaves f32 once
/// encoded by `stages`. Stages are monotonic, so the encoded range is that of the encoded
/// extremes: if either end leaves f32, some rows cannot be stored and must be looked for.
pub(crate) fn out_of_f32(
    stats: &[dsc_format::stats::ColumnStats],
    stages: &[dsc_format::Stage],
) -> bool {
    stats
        .first()
        .and_then(|s| s.numeric.as_ref())
        .is_some_and(|n| {
            [n.min, n.max]
                .iter()
                .any(|&x| !(stages.iter().fold(x, |v, s| s.apply(v)) as f32).is_finite())
        })
}

/// A value of a categorical column, comparable across kinds of column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum CatKey {
    Int(i64),
    /// A code into the column's sorted dictionary (so its order is the strings' order).
    Str(u32),
}

pub(crate) fn cat_key(col: &Column, row: usize) -> Option<CatKey> {
    if !col.is_valid(row) {
        return None;
    }
    Some(match &col.values {
        Values::Int(v) => CatKey::Int(v[row]),
        Values::Bool(v) => CatKey::Int(i64::from(v[row])),
        Values::Str { codes, .. } => CatKey::Str(codes[row]),
        Values::F64(_) | Values::F32(_) => {
            unreachable!("floats are not categorical; checked when opened")
        }
        Values::Plain { .. } => unreachable!("plain strings are keys, never categorical"),
    })
}

/// Maps a categorical column's values to codes.
pub(crate) struct CategoryCoder<'a> {
    pub access: Access<'a>,
    codes: HashMap<CatKey, i32>,
    /// Dense code table for string dictionaries.
    dense: Option<Vec<i32>>,
    /// For integers over a compact range: the smallest and the code of each value from it.
    ints: Option<(i64, Vec<i32>)>,
}

impl CategoryCoder<'_> {
    #[inline]
    pub fn code(&self, row: usize) -> Result<i32> {
        let Some(r) = self.access.source_row(row)? else {
            return Ok(CODE_NULL);
        };
        Ok(match cat_key(self.access.column, r) {
            None => CODE_NULL,
            Some(CatKey::Str(c)) if self.dense.is_some() => {
                self.dense.as_ref().expect("checked")[c as usize]
            }
            // Every value of the column lies in the table's range (it was sized from them).
            Some(CatKey::Int(x)) if self.ints.is_some() => {
                let (lo, table) = self.ints.as_ref().expect("checked");
                table[(x - lo) as usize]
            }
            Some(k) => self.codes.get(&k).copied().unwrap_or(CODE_UNKNOWN),
        })
    }

    /// Asks the processor to bring `row`'s value into the cache ahead of its use.
    #[inline(always)]
    pub fn prefetch(&self, row: usize) {
        match (&self.access.column.values, self.access.join) {
            (Values::Int(v), None) => prefetch(v, row),
            (Values::Str { codes, .. }, None) => prefetch(codes, row),
            _ => {}
        }
    }

    /// [`Self::code`] of each of `rows`, handed to `put` with its index in `rows`. A column
    /// read directly, with no nulls, whose values index a table (compact integers, a string
    /// dictionary) is coded by that table with its kind matched once per call, not once per row.
    pub fn code_rows(&self, rows: &[u32], mut put: impl FnMut(usize, i32)) -> Result<()> {
        let column = self.access.column;
        match (&column.values, &column.valid, self.access.join) {
            (Values::Int(v), None, None) if self.ints.is_some() => {
                let (lo, table) = self.ints.as_ref().expect("checked");
                for (t, &row) in rows.iter().enumerate() {
                    let slot = usize::try_from(v[row as usize].wrapping_sub(*lo) as u64).ok();
                    let code = slot.and_then(|i| table.get(i)).copied();
                    put(t, code.unwrap_or(CODE_UNKNOWN));
                }
            }
            (Values::Str { codes, .. }, None, None) if self.dense.is_some() => {
                let dense = self.dense.as_ref().expect("checked");
                for (t, &row) in rows.iter().enumerate() {
                    put(t, dense[codes[row as usize] as usize]);
                }
            }
            _ => {
                for (t, &row) in rows.iter().enumerate() {
                    put(t, self.code(row as usize)?);
                }
            }
        }
        Ok(())
    }
}

/// A hint that `slice[i]` is read soon: the shards pass visits contexts in their shuffled
/// order, each at a place of the bucket's columns the hardware cannot guess, so the first rows
/// of each column would otherwise wait for memory once per context.
#[inline(always)]
pub(crate) fn prefetch<T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = slice.get(i) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that reads nothing and cannot fault; the address is that
        // of an element in bounds.
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>((x as *const T).cast::<i8>())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, i);
}

/// Where a categorical value lands in a dense count table, when its values are compact.
fn dense_slots(col: &Column) -> Option<(i64, usize)> {
    match &col.values {
        Values::Str { dict, .. } => Some((0, dict.len().max(1))),
        Values::Plain { .. } => unreachable!("plain strings are keys, never categorical"),
        Values::Bool(_) => Some((0, 2)),
        Values::Int(v) => {
            let (lo, hi) = v
                .iter()
                .fold((i64::MAX, i64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let span = (hi as i128 - lo as i128 + 1).max(1);
            (span <= 1 << 22).then_some((lo.min(hi), span as usize))
        }
        Values::F64(_) | Values::F32(_) => None,
    }
}

pub(crate) type Counts = Vec<HashMap<CatKey, u64>>;

/// Counts each value per split, in parallel over fixed chunks of rows (dense tables when the
/// values are compact); returns the counts and the nulls per split.
pub(crate) fn count_categories(
    access: &Access,
    tags: &[u8],
    splits: usize,
) -> Result<(Counts, Vec<u64>)> {
    let dense = dense_slots(access.column);
    let slot_key = |slot: usize| match &access.column.values {
        Values::Str { .. } => CatKey::Str(slot as u32),
        _ => CatKey::Int(dense.expect("dense").0 + slot as i64),
    };
    let slot_of = |k: CatKey| match k {
        CatKey::Str(c) => c as usize,
        CatKey::Int(v) => (v - dense.expect("dense").0) as usize,
    };
    let size = dense.map_or(0, |d| d.1);
    let parts: Vec<(Vec<u64>, Counts, Vec<u64>)> = tags
        .par_chunks(1 << 16)
        .enumerate()
        .map(|(c, chunk)| {
            let mut table = vec![0u64; splits * size];
            let mut maps: Counts = vec![HashMap::new(); splits];
            let mut nulls = vec![0u64; splits];
            for (i, &tag) in chunk.iter().enumerate() {
                if tag == DROPPED {
                    continue;
                }
                let key = access
                    .source_row((c << 16) + i)?
                    .and_then(|r| cat_key(access.column, r));
                let s = tag as usize;
                match key {
                    None => nulls[s] += 1,
                    Some(k) if size > 0 => table[s * size + slot_of(k)] += 1,
                    Some(k) => *maps[s].entry(k).or_insert(0) += 1,
                }
            }
            Ok((table, maps, nulls))
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let mut counts: Counts = vec![HashMap::new(); splits];
    let mut nulls = vec![0u64; splits];
    let mut table = vec![0u64; splits * size];
    for (t, maps, n) in parts {
        table.iter_mut().zip(&t).for_each(|(a, b)| *a += b);
        for s in 0..splits {
            nulls[s] += n[s];
            for (k, c) in &maps[s] {
                *counts[s].entry(*k).or_insert(0) += c;
            }
        }
    }
    for (s, split) in counts.iter_mut().enumerate() {
        for slot in 0..size {
            let c = table[s * size + slot];
            if c > 0 {
                split.insert(slot_key(slot), c);
            }
        }
    }
    Ok((counts, nulls))
}

impl<'a> CategoryCoder<'a> {
    /// The coder of one table's column for a vocabulary fitted on the whole input (train
    /// values ascending: code [`CODE_FIRST`] + position).
    pub fn new(access: Access<'a>, vocabulary: &[CatValue]) -> CategoryCoder<'a> {
        let code_of = |v: &CatValue| {
            vocabulary
                .binary_search(v)
                .map_or(CODE_UNKNOWN, |i| CODE_FIRST + i as i32)
        };
        match &access.column.values {
            Values::Str { dict, .. } => {
                let dense = dict
                    .iter()
                    .map(|s| code_of(&CatValue::Str(s.clone())))
                    .collect();
                CategoryCoder {
                    access,
                    codes: HashMap::new(),
                    dense: Some(dense),
                    ints: None,
                }
            }
            _ => {
                let codes: HashMap<CatKey, i32> = vocabulary
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| match v {
                        CatValue::Int(x) => Some((CatKey::Int(*x), CODE_FIRST + i as i32)),
                        CatValue::Str(_) => None,
                    })
                    .collect();
                // Integers over a compact range (sensor ids, small codes): a table indexed by
                // value, instead of hashing every row's value.
                let ints = dense_slots(access.column).map(|(lo, span)| {
                    let mut table = vec![CODE_UNKNOWN; span];
                    for (k, &code) in &codes {
                        if let CatKey::Int(x) = k {
                            if let Some(slot) =
                                x.checked_sub(lo).and_then(|d| usize::try_from(d).ok())
                            {
                                if slot < span {
                                    table[slot] = code;
                                }
                            }
                        }
                    }
                    (lo, table)
                });
                CategoryCoder {
                    access,
                    codes,
                    dense: None,
                    ints,
                }
            }
        }
    }
}

/// A categorical value independent of any one table's string dictionary: what vocabularies
/// are merged and sorted by.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub(crate) enum CatValue {
    Int(i64),
    Str(String),
}

impl CatValue {
    pub fn of(col: &Column, key: CatKey) -> CatValue {
        match (key, &col.values) {
            (CatKey::Str(c), Values::Str { dict, .. }) => CatValue::Str(dict[c as usize].clone()),
            (CatKey::Int(v), _) => CatValue::Int(v),
            (CatKey::Str(_), _) => unreachable!("string keys come from string columns"),
        }
    }

    /// The value as the manifest and stats.json show it.
    pub fn json(&self, kind: Kind) -> serde_json::Value {
        match self {
            CatValue::Str(s) => s.clone().into(),
            CatValue::Int(v) if kind == Kind::Bool => (*v != 0).into(),
            CatValue::Int(v) => (*v).into(),
        }
    }
}

/// Turns a numeric column's values into stored f32s.
pub(crate) struct NumericEncoder<'a> {
    pub access: Access<'a>,
    /// The column's values, read without checks per value where it allows.
    numbers: Numbers<'a>,
    pub stages: Vec<Stage>,
    pub fill: Option<f64>,
    /// For a joined table read by index: each joined row's stored value, where it has one
    /// without the NaN policy (a joined row is encoded once, not once per row joined to it).
    joined: Option<Vec<Option<f32>>>,
}

thread_local! {
    /// Each encoding thread's last results of `log1p`.
    static LOG1P: std::cell::RefCell<Memo> = std::cell::RefCell::new(Memo::new());
}

/// The last results of a costly function (`log1p`) by the bits of its input, in a small
/// direct-mapped table. Event data repeats its values (the README's charge, in steps of its
/// sensor's resolution, holds about a thousand distinct ones), and a lookup costs a fraction of
/// the call it saves: the encode phase's `log1p` was 0.1 of its 0.55 thread-s. The function
/// computes every value it returns, so the bits are its own.
struct Memo {
    slots: Vec<(u64, f64)>,
}

impl Memo {
    const BITS: u32 = 12;

    fn new() -> Memo {
        // No finite input has the bits of the empty slot's key (a NaN), and only finite inputs
        // are looked up.
        Memo {
            slots: vec![(u64::MAX, 0.0); 1 << Self::BITS],
        }
    }

    #[inline(always)]
    fn get(&mut self, x: f64, f: impl FnOnce(f64) -> f64) -> f64 {
        let key = x.to_bits();
        let slot = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - Self::BITS)) as usize;
        let slot = &mut self.slots[slot];
        if slot.0 != key {
            *slot = (key, f(x));
        }
        slot.1
    }
}

/// The f32 stored for `x` through `chain`, when `x` and its encoding are finite in f32: what
/// [`NumericEncoder::encode`] stores without the NaN policy.
#[inline(always)]
fn stored(x: f64, chain: impl FnOnce(f64) -> f64) -> Option<f32> {
    if !x.is_finite() {
        return None;
    }
    let v = chain(x);
    (v.is_finite() && (v as f32).is_finite()).then_some(v as f32)
}

impl NumericEncoder<'_> {
    pub fn new<'a>(
        access: Access<'a>,
        fitted: &NumericResult,
        policy: NanPolicy,
    ) -> NumericEncoder<'a> {
        let numbers = access.numbers();
        let stages = fitted.stages.clone();
        let joined = match &numbers {
            Numbers::Joined { values, .. } => Some(
                values
                    .iter()
                    .map(|v| {
                        v.and_then(|x| stored(x, |x| stages.iter().fold(x, |v, s| s.apply(v))))
                    })
                    .collect(),
            ),
            _ => None,
        };
        NumericEncoder {
            access,
            numbers,
            stages,
            fill: Self::fill_of(fitted, policy),
            joined,
        }
    }

    /// The value the NaN policy stores for a value that cannot be encoded.
    fn fill_of(fitted: &NumericResult, policy: NanPolicy) -> Option<f64> {
        if let Some(fill) = fitted.fill {
            return fill;
        }
        match policy {
            NanPolicy::Error => None,
            NanPolicy::Zero => Some(0.0),
            NanPolicy::Mean => {
                let v = fitted
                    .stages
                    .iter()
                    .fold(fitted.train_mean, |x, s| s.apply(x));
                Some(if v.is_finite() { v } else { 0.0 })
            }
        }
    }

    /// The manifest encoding of a column of `kind` fitted as `fitted`.
    pub fn encoding_of(kind: Kind, fitted: &NumericResult, policy: NanPolicy) -> Encoding {
        if kind == Kind::Bool && fitted.stages.iter().all(|s| *s == Stage::Identity) {
            return Encoding::Bool;
        }
        Encoding::Numeric {
            stages: fitted.stages.clone(),
            fill: Self::fill_of(fitted, policy),
        }
    }

    /// Under `nan = error`, fails on the first row in file order whose value cannot be stored,
    /// so that the error names the same row whatever the shuffle or thread count. Only columns
    /// that can fail are scanned: those with null, NaN or inf, or whose smallest or largest
    /// value leaves f32 once encoded (`has_bad`). Every stage is increasing, so when both
    /// extremes encode to finite f32 values (`log1p` of a minimum above -1 included), so does
    /// every value between them.
    pub fn check_rows(
        &self,
        fitted: &NumericResult,
        tags: &[u8],
        rows: Option<&[u32]>,
    ) -> Result<()> {
        if self.fill.is_some() || !fitted.has_bad {
            return Ok(());
        }
        let chunks: Vec<Result<()>> = tags
            .par_chunks(1 << 16)
            .enumerate()
            .map(|(c, chunk)| {
                for (i, &tag) in chunk.iter().enumerate() {
                    if tag != DROPPED {
                        let i = (c << 16) + i;
                        self.encode(rows.map_or(i, |r| r[i] as usize))?;
                    }
                }
                Ok(())
            })
            .collect();
        chunks.into_iter().collect()
    }

    /// The stored value of `row`, and whether it was filled by the NaN policy.
    #[inline]
    pub fn encode(&self, row: usize) -> Result<(f32, bool)> {
        let raw = self.numbers.get(row)?;
        if let Some(x) = raw.filter(|x| x.is_finite()) {
            let v = self.stages.iter().fold(x, |v, s| s.apply(v));
            if v.is_finite() && (v as f32).is_finite() {
                return Ok((v as f32, false));
            }
        }
        self.not_encodable(row, raw)
    }

    /// [`Self::encode`] of each of `rows`, handed to `put` with its index in `rows`; returns how
    /// many the NaN policy filled. The column's kind and its chain are matched once per call,
    /// not once per value; a value the fast paths cannot store goes through `encode`.
    pub fn encode_rows(&self, rows: &[u32], mut put: impl FnMut(usize, f32)) -> Result<u64> {
        let put = &mut put;
        match (&self.numbers, &self.joined) {
            (
                Numbers::Joined {
                    keys, min, slots, ..
                },
                Some(encoded),
            ) => self.each(rows, put, |row| {
                *encoded.get(joined_row(keys, *min, slots, row)?)?
            }),
            (Numbers::F64(v), _) => self.chained(rows, put, |row| v[row]),
            (Numbers::Int(v), _) => self.chained(rows, put, |row| v[row] as f64),
            (Numbers::Bool(v), _) => self.chained(rows, put, |row| f64::from(u8::from(v[row]))),
            _ => self.each(rows, put, |_| None),
        }
    }

    /// For a column read through a join by index: what identifies that index (shared by every
    /// column joined through the same key and table), for [`Self::encode_joined_rows`].
    pub fn joined_index(&self) -> Option<(usize, usize)> {
        self.joined.as_ref().and(self.numbers.index_id())
    }

    /// `encode_rows` of several columns joined through one index ([`Self::joined_index`]):
    /// each row's joined row is found once, not once per column. `put(t, j, v)` receives
    /// column `j`'s value of `rows[t]`.
    pub fn encode_joined_rows(
        encoders: &[&NumericEncoder],
        rows: &[u32],
        mut put: impl FnMut(usize, usize, f32),
    ) -> Result<u64> {
        let Some(Numbers::Joined {
            keys, min, slots, ..
        }) = encoders.first().map(|e| &e.numbers)
        else {
            unreachable!("only columns joined by index are encoded together")
        };
        let encoded: Vec<&[Option<f32>]> = encoders
            .iter()
            .map(|e| e.joined.as_deref().expect("joined by index"))
            .collect();
        let mut filled = 0;
        for (t, &row) in rows.iter().enumerate() {
            let row = row as usize;
            let slot = joined_row(keys, *min, slots, row);
            for (j, (enc, values)) in encoders.iter().zip(&encoded).enumerate() {
                let v = match slot.and_then(|s| *values.get(s)?) {
                    Some(v) => v,
                    None => {
                        let (v, was_filled) = enc.encode(row)?;
                        filled += u64::from(was_filled);
                        v
                    }
                };
                put(t, j, v);
            }
        }
        Ok(filled)
    }

    /// Asks the processor to bring `row`'s value into the cache ahead of its use.
    #[inline(always)]
    pub fn prefetch(&self, row: usize) {
        match &self.numbers {
            Numbers::F64(v) => prefetch(v, row),
            Numbers::Int(v) | Numbers::Joined { keys: v, .. } => prefetch(v, row),
            Numbers::Bool(v) => prefetch(v, row),
            Numbers::Any(_) => {}
        }
    }

    /// `encode_rows` of a column read by `x(row)`, its chain matched once.
    #[inline(always)]
    fn chained(
        &self,
        rows: &[u32],
        put: &mut impl FnMut(usize, f32),
        x: impl Fn(usize) -> f64,
    ) -> Result<u64> {
        match *self.stages.as_slice() {
            [] | [Stage::Identity] => self.each(rows, put, |row| stored(x(row), |x| x)),
            [Stage::Zscore { mean, std }] => {
                self.each(rows, put, |row| stored(x(row), |x| (x - mean) / std))
            }
            [Stage::Log1p] => LOG1P.with_borrow_mut(|memo| {
                self.each(rows, put, |row| stored(x(row), |x| memo.get(x, f64::ln_1p)))
            }),
            _ => self.each(rows, put, |row| {
                stored(x(row), |x| self.stages.iter().fold(x, |v, s| s.apply(v)))
            }),
        }
    }

    /// `encode_rows` with one fast path, monomorphised: `fast(row)` is the stored value when it
    /// can tell it without the NaN policy, else `encode` decides.
    #[inline(always)]
    fn each(
        &self,
        rows: &[u32],
        put: &mut impl FnMut(usize, f32),
        mut fast: impl FnMut(usize) -> Option<f32>,
    ) -> Result<u64> {
        let mut filled = 0;
        for (t, &row) in rows.iter().enumerate() {
            let row = row as usize;
            let v = match fast(row) {
                Some(v) => v,
                None => {
                    let (v, was_filled) = self.encode(row)?;
                    filled += u64::from(was_filled);
                    v
                }
            };
            put(t, v);
        }
        Ok(filled)
    }

    /// A value `encode` cannot store (`raw` at `row`): the NaN policy's fill, or the error that
    /// names it. Apart from the loop over values, which stays small.
    #[cold]
    #[inline(never)]
    fn not_encodable(&self, row: usize, raw: Option<f64>) -> Result<(f32, bool)> {
        if let Some(fill) = self.fill {
            return Ok((fill as f32, true));
        }
        let what = match raw {
            None => "null".to_string(),
            Some(x) if !x.is_finite() => format!("{x}"),
            Some(x) => {
                let v = self.stages.iter().fold(x, |v, s| s.apply(v));
                let chain: Vec<&str> = self.stages.iter().map(Stage::name).collect();
                let chain = chain.join(",");
                if v.is_finite() {
                    // Finite in f64, beyond what the f32 tensor can hold.
                    format!(
                        "{x:e} is {v:e} after the encoding {chain}, beyond the f32 range of the \
                         tensor (±3.4e38); encode the column on a smaller scale (e.g. log1p or \
                         zscore) or correct the value"
                    )
                } else {
                    format!("{x} encodes to {v} under {chain}")
                }
            }
        };
        let (path, file_row) = self.access.table.locate(row);
        let column = match self.access.join {
            Some((_, keyed)) => format!(
                "{} (joined from {})",
                self.access.name,
                keyed.path.display()
            ),
            None => self.access.name.to_string(),
        };
        Err(CompileError::BadValue {
            path: path.into(),
            column,
            row: file_row,
            what,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo answers what the function returns, to the bit, on first sight and on repeats,
    /// where values share slots (far more values than slots), and for `-0.0` beside `0.0`.
    #[test]
    fn the_memo_returns_the_functions_bits() {
        let mut rng = dsc_format::rng::Xoshiro256::seed_from(3);
        let mut memo = Memo::new();
        let values: Vec<f64> = (0..40_000)
            .map(|i| match i % 5 {
                0 => -0.0,
                1 => 0.0,
                2 => 0.025 * rng.below(2000) as f64,
                _ => rng.unit_f64() * 1e6,
            })
            .collect();
        for _ in 0..2 {
            for &x in &values {
                assert_eq!(
                    memo.get(x, f64::ln_1p).to_bits(),
                    x.ln_1p().to_bits(),
                    "{x}"
                );
            }
        }
    }
}
