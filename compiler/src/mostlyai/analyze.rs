//! The engine's partitioning, per-partition statistics and their reduction into
//! `tgt-stats.json` / `ctx-stats.json`. A partition's statistics are merged from its pieces
//! in every bucket, exactly: they never depend on how the rows were bucketed.

use super::table::{Data, Family, MTable};
use super::{categorical, datetime, numeric};
use crate::error::Result;
use crate::runs::{ranks_by_merge, Run, RunsFile, ValueRuns};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The engine partition (`part.{i:06d}-trn` / `-val`, in reduction order: trn 0, val 0,
/// trn 1, …) of a context: training contexts `[i::n]` and validation contexts `[i::n]` in
/// context-table order. `val_before`: validation contexts before it in the table.
pub(crate) fn partition_of(ctx_row: u64, is_val: bool, val_before: u64, n: usize) -> u32 {
    let ordinal = if is_val {
        val_before
    } else {
        ctx_row - val_before
    };
    (2 * (ordinal % n as u64) + u64::from(is_val)) as u32
}

/// A column's reduced statistics.
#[derive(Debug, Clone)]
pub(crate) enum ColStats {
    Numeric(numeric::Stats),
    Categorical(categorical::Stats),
    Datetime(datetime::Stats),
    /// Every partition was empty: the engine writes `{"encoding_type": ...}` and encodes nothing.
    Empty(&'static str),
}

impl ColStats {
    pub fn cardinalities(&self) -> Vec<(String, usize)> {
        match self {
            ColStats::Numeric(s) => s.cardinalities(),
            ColStats::Categorical(s) => vec![("cat".into(), s.codes.len())],
            ColStats::Datetime(s) => s.cardinalities(),
            ColStats::Empty(_) => Vec::new(),
        }
    }
    /// Whether null rows are encoded from a random draw.
    pub fn imputes(&self) -> bool {
        match self {
            ColStats::Numeric(s) => s.imputes(),
            ColStats::Datetime(s) => s.imputes(),
            _ => false,
        }
    }
}

/// One bucket's rows of a column in one partition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Piece {
    Num(numeric::Piece),
    Cat(categorical::Piece),
    Time(datetime::Piece),
}

impl Piece {
    /// Where its non-null values lie (numeric and datetime columns), bucket by bucket.
    pub fn runs(&self) -> &[Run] {
        match self {
            Piece::Num(p) => &p.runs,
            Piece::Time(p) => &p.runs,
            Piece::Cat(_) => &[],
        }
    }

    /// Adds `o`, the piece of the same column and partition in a later bucket.
    pub fn merge(&mut self, o: Piece) {
        match (self, o) {
            (Piece::Num(a), Piece::Num(b)) => a.merge(b),
            (Piece::Cat(a), Piece::Cat(b)) => a.merge(b),
            (Piece::Time(a), Piece::Time(b)) => a.merge(b),
            _ => unreachable!("pieces follow the column's family"),
        }
    }

    /// Rows without a value.
    fn nulls(&self) -> u64 {
        match self {
            Piece::Num(p) => p.rows - p.values,
            Piece::Time(p) => p.rows - p.values,
            Piece::Cat(_) => 0,
        }
    }
}

/// Every column's pieces in one bucket, `[column][partition]`: `rows_of[p]` are the bucket's
/// rows in partition `p`, ascending. Sorted values go to `runs` (quantiles, donors).
pub(crate) fn pieces(
    table: &MTable,
    rows_of: &[Vec<u32>],
    runs: &ValueRuns,
) -> Result<Vec<Vec<Piece>>> {
    table
        .cols
        .par_iter()
        .map(|col| {
            rows_of
                .iter()
                .map(|rows| {
                    Ok(match &col.data {
                        Data::Num { vals, ints } => {
                            let (mut p, sorted) = numeric::piece(vals, ints.as_deref(), rows);
                            if !sorted.is_empty() {
                                p.runs.push(runs.append(&sorted)?);
                            }
                            Piece::Num(p)
                        }
                        Data::Cat { codes, dict } => {
                            Piece::Cat(categorical::piece(codes, dict, rows))
                        }
                        Data::Time { us } => {
                            let (mut p, vals) = datetime::piece(us, rows);
                            if !vals.is_empty() {
                                p.runs.push(runs.append_i64(&vals)?);
                            }
                            Piece::Time(p)
                        }
                    })
                })
                .collect()
        })
        .collect()
}

/// The piece of a partition without rows in this bucket.
pub(crate) fn empty_piece(family: Family) -> Piece {
    match family {
        Family::Num => Piece::Num(numeric::piece(&[], None, &[]).0),
        Family::Cat => Piece::Cat(categorical::piece(&[], &[], &[])),
        Family::Time => Piece::Time(datetime::piece(&[], &[]).0),
    }
}

/// Whether a column has a null anywhere, from every bucket's pieces of it.
pub(crate) fn has_nulls<'p>(pieces: impl Iterator<Item = &'p Piece>) -> bool {
    pieces.into_iter().any(|p| p.nulls() > 0)
}

/// Reduces one column over its partitions: `parts[p]` is partition `p`'s piece, merged over
/// every bucket; `files` the values files its runs lie in. `int_keys`: for an integer column,
/// whether pandas keeps it int64 (no nulls anywhere).
pub(crate) fn reduce(
    family: Family,
    parts: &[&Piece],
    files: &[RunsFile],
    int_keys: Option<bool>,
) -> Result<ColStats> {
    Ok(match family {
        Family::Num => {
            let with_rows: Vec<&numeric::Piece> = parts
                .iter()
                .map(|p| match p {
                    Piece::Num(x) => x,
                    _ => unreachable!("pieces follow the column's family"),
                })
                .filter(|p| p.rows > 0)
                .collect();
            let mut partials: Vec<numeric::Partial> = with_rows
                .iter()
                .filter_map(|p| numeric::partial(p, int_keys))
                .collect();
            if partials.is_empty() {
                return Ok(ColStats::Empty("TABULAR_NUMERIC_AUTO"));
            }
            let mut stats = numeric::reduce(&partials.iter().collect::<Vec<_>>());
            if matches!(stats, numeric::Stats::Binned { .. }) {
                // Only bins read the quantiles, 1001 ranks per partition: one merge of its
                // sorted runs.
                for (partial, piece) in partials.iter_mut().zip(&with_rows) {
                    partial.add_quantiles(|ranks| ranks_by_merge(files, &piece.runs, ranks))?;
                }
                stats = numeric::reduce(&partials.iter().collect::<Vec<_>>());
            }
            ColStats::Numeric(stats)
        }
        Family::Cat => {
            let partials: Vec<categorical::Partial> = parts
                .iter()
                .filter_map(|p| match p {
                    Piece::Cat(x) => categorical::partial(x),
                    _ => unreachable!("pieces follow the column's family"),
                })
                .collect();
            if partials.is_empty() {
                ColStats::Empty("TABULAR_CATEGORICAL")
            } else {
                ColStats::Categorical(categorical::reduce(&partials.iter().collect::<Vec<_>>()))
            }
        }
        Family::Time => {
            let partials: Vec<datetime::Partial> = parts
                .iter()
                .filter_map(|p| match p {
                    Piece::Time(x) => datetime::partial(x),
                    _ => unreachable!("pieces follow the column's family"),
                })
                .collect();
            if partials.is_empty() {
                ColStats::Empty("TABULAR_DATETIME")
            } else {
                ColStats::Datetime(datetime::reduce(&partials.iter().collect::<Vec<_>>()))
            }
        }
    })
}

/// The engine's `seq_len` summary: events per context over every partition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqLen {
    pub min: usize,
    pub max: usize,
    pub median: usize,
}

/// `seq_len` from the count of contexts of each length.
pub(crate) fn seq_len(counts: &std::collections::BTreeMap<u64, u64>) -> SeqLen {
    let n: u64 = counts.values().sum();
    if n == 0 {
        return SeqLen {
            min: 0,
            max: 0,
            median: 0,
        };
    }
    let kth = |k: u64| {
        let mut seen = 0;
        for (&l, &c) in counts {
            seen += c;
            if seen > k {
                return l as usize;
            }
        }
        unreachable!("k < n")
    };
    // np.median averages the two middle values; int() truncates.
    let median = if n % 2 == 1 {
        kth(n / 2)
    } else {
        ((kth(n / 2 - 1) + kth(n / 2)) as f64 / 2.0) as usize
    };
    SeqLen {
        min: kth(0),
        max: kth(n - 1),
        median,
    }
}

/// The `argn_table` / `argn_column` identifiers: tables are the parts of column names before
/// `::`, numbered in first-seen order; columns are numbered by position.
fn argn_ids(names: &[&str]) -> Vec<(String, String)> {
    let mut tables: Vec<&str> = Vec::new();
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let table = n.split("::").next().unwrap_or(n);
            let t = match tables.iter().position(|x| *x == table) {
                Some(t) => t,
                None => {
                    tables.push(table);
                    tables.len() - 1
                }
            };
            (format!("t{t}"), format!("c{i}"))
        })
        .collect()
}

/// The engine's sub-column names of every column (`tgt:t0/c0__E1`), per column.
pub(crate) fn sub_column_names(
    names: &[String],
    stats: &[ColStats],
    processor: &str,
) -> Vec<Vec<(String, usize)>> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    argn_ids(&names)
        .into_iter()
        .zip(stats)
        .map(|((t, c), s)| {
            s.cardinalities()
                .into_iter()
                .map(|(sub, card)| (format!("{processor}:{t}/{c}__{sub}"), card))
                .collect()
        })
        .collect()
}

/// The `columns` object of a stats file.
fn columns_json(names: &[String], stats: &[ColStats], processor: &str) -> Value {
    let ids = argn_ids(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let mut cols = Map::new();
    for ((name, s), (t, c)) in names.iter().zip(stats).zip(ids) {
        let mut m = match s {
            ColStats::Numeric(s) => s.to_json(),
            ColStats::Categorical(s) => s.to_json(),
            ColStats::Datetime(s) => s.to_json(),
            ColStats::Empty(kind) => {
                let mut m = Map::new();
                m.insert("encoding_type".into(), (*kind).into());
                cols.insert(name.clone(), Value::Object(m));
                continue;
            }
        };
        m.insert("argn_processor".into(), processor.into());
        m.insert("argn_table".into(), t.into());
        m.insert("argn_column".into(), c.into());
        cols.insert(name.clone(), Value::Object(m));
    }
    Value::Object(cols)
}

/// `tgt-stats.json` as the engine writes it (value protection off).
pub(crate) fn tgt_stats_json(
    names: &[String],
    stats: &[ColStats],
    trn: usize,
    val: usize,
    seq: SeqLen,
    key: &str,
) -> Value {
    let mut m = Map::new();
    m.insert("columns".into(), columns_json(names, stats, "tgt"));
    m.insert("no_of_training_records".into(), trn.into());
    m.insert("no_of_validation_records".into(), val.into());
    let mut s = Map::new();
    s.insert("min".into(), seq.min.into());
    s.insert("max".into(), seq.max.into());
    s.insert("median".into(), seq.median.into());
    s.insert("value_protection".into(), false.into());
    m.insert("seq_len".into(), Value::Object(s));
    m.insert(
        "is_sequential".into(),
        (seq.min != 1 || seq.max != 1).into(),
    );
    let mut keys = Map::new();
    keys.insert("context_key".into(), key.into());
    m.insert("keys".into(), Value::Object(keys));
    m.insert("value_protection_epsilon_spent".into(), Value::Null);
    Value::Object(m)
}

/// `ctx-stats.json` as the engine writes it.
pub(crate) fn ctx_stats_json(names: &[String], stats: &[ColStats], key: &str) -> Value {
    let mut m = Map::new();
    m.insert("columns".into(), columns_json(names, stats, "ctxflt"));
    let mut keys = Map::new();
    keys.insert("primary_key".into(), key.into());
    m.insert("keys".into(), Value::Object(keys));
    m.insert("value_protection_epsilon_spent".into(), Value::Null);
    Value::Object(m)
}

/// The engine's JSON layout: `json.dump(indent=4, ensure_ascii=False)`.
pub(crate) fn to_engine_json(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    serde::Serialize::serialize(v, &mut ser).expect("JSON serializes");
    out
}
