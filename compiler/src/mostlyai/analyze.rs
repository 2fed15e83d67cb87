//! The engine's partitioning, per-partition statistics and their reduction into
//! `tgt-stats.json` / `ctx-stats.json`.

use super::table::{Data, MTable};
use super::{categorical, datetime, numeric};
use rayon::prelude::*;
use serde_json::{Map, Value};

/// One stats partition (`part.{i:06d}-trn` or `-val`): its contexts (context-table rows, in
/// table order) and target rows (in input order).
#[derive(Debug, Default)]
pub(crate) struct Partition {
    pub ctx_rows: Vec<u32>,
    pub tgt_rows: Vec<u32>,
}

/// The partitions in the engine's reduction order (sorted file names: trn 0, val 0, trn 1, ...).
/// Partition `i` holds training contexts `[i::n]` and validation contexts `[i::n]`.
pub(crate) fn partition(is_val: &[bool], tgt_ctx: &[u32], n: usize) -> (Vec<Partition>, Vec<u32>) {
    let mut parts: Vec<Partition> = (0..2 * n).map(|_| Partition::default()).collect();
    let mut part_of = vec![0u32; is_val.len()];
    let (mut trn_seen, mut val_seen) = (0usize, 0usize);
    for (row, &val) in is_val.iter().enumerate() {
        let p = if val {
            val_seen += 1;
            2 * ((val_seen - 1) % n) + 1
        } else {
            trn_seen += 1;
            2 * ((trn_seen - 1) % n)
        };
        part_of[row] = p as u32;
        parts[p].ctx_rows.push(row as u32);
    }
    for (row, &c) in tgt_ctx.iter().enumerate() {
        parts[part_of[c as usize] as usize]
            .tgt_rows
            .push(row as u32);
    }
    (parts, part_of)
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

enum Partial {
    Numeric(Option<numeric::Partial>),
    Categorical(Option<categorical::Partial>),
    Datetime(Option<datetime::Partial>),
}

/// `cardinalities` as the engine writes it: sub-column name to number of codes.
pub(crate) fn cardinalities_json(cards: Vec<(String, usize)>) -> Value {
    Value::Object(
        cards
            .into_iter()
            .map(|(k, v)| (k, Value::from(v)))
            .collect(),
    )
}

/// The partitions' partial statistics of one family that are present (a partition without
/// rows of the column has none).
fn present<'p, T>(mine: &'p [Partial], pick: impl Fn(&'p Partial) -> Option<&'p T>) -> Vec<&'p T> {
    mine.iter().filter_map(pick).collect()
}

/// Analyses and reduces every column of `table` over `parts`, in parallel over (column,
/// partition); the result does not depend on the thread count.
pub(crate) fn column_stats(table: &MTable, parts: &[Partition], tgt: bool) -> Vec<ColStats> {
    fn rows_of(p: &Partition, tgt: bool) -> &[u32] {
        if tgt {
            &p.tgt_rows
        } else {
            &p.ctx_rows
        }
    }
    let jobs: Vec<(usize, usize)> = (0..table.cols.len())
        .flat_map(|c| (0..parts.len()).map(move |p| (c, p)))
        .collect();
    let partials: Vec<Partial> = jobs
        .par_iter()
        .map(|&(c, p)| {
            let rows = rows_of(&parts[p], tgt);
            match &table.cols[c].data {
                Data::Num { vals, ints } => {
                    Partial::Numeric(numeric::analyze(vals, ints.as_deref(), rows))
                }
                Data::Cat { codes, dict } => {
                    Partial::Categorical(categorical::analyze(codes, dict.len(), rows))
                }
                Data::Time { us } => Partial::Datetime(datetime::analyze(us, rows)),
            }
        })
        .collect();
    let np = parts.len();
    (0..table.cols.len())
        .into_par_iter()
        .map(|c| {
            let mine = &partials[c * np..(c + 1) * np];
            match &table.cols[c].data {
                Data::Num { .. } => {
                    let ps = present(mine, |p| match p {
                        Partial::Numeric(Some(x)) => Some(x),
                        _ => None,
                    });
                    if ps.is_empty() {
                        ColStats::Empty("TABULAR_NUMERIC_AUTO")
                    } else {
                        ColStats::Numeric(numeric::reduce(&ps))
                    }
                }
                Data::Cat { dict, .. } => {
                    let ps = present(mine, |p| match p {
                        Partial::Categorical(Some(x)) => Some(x),
                        _ => None,
                    });
                    if ps.is_empty() {
                        ColStats::Empty("TABULAR_CATEGORICAL")
                    } else {
                        ColStats::Categorical(categorical::reduce(&ps, dict))
                    }
                }
                Data::Time { .. } => {
                    let ps = present(mine, |p| match p {
                        Partial::Datetime(Some(x)) => Some(x),
                        _ => None,
                    });
                    if ps.is_empty() {
                        ColStats::Empty("TABULAR_DATETIME")
                    } else {
                        ColStats::Datetime(datetime::reduce(&ps))
                    }
                }
            }
        })
        .collect()
}

/// The engine's `seq_len` summary: events per context over every partition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqLen {
    pub min: usize,
    pub max: usize,
    pub median: usize,
}

pub(crate) fn seq_len(lengths: &[usize]) -> SeqLen {
    let mut v = lengths.to_vec();
    v.sort_unstable();
    if v.is_empty() {
        return SeqLen {
            min: 0,
            max: 0,
            median: 0,
        };
    }
    let n = v.len();
    // np.median averages the two middle values; int() truncates.
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        ((v[n / 2 - 1] + v[n / 2]) as f64 / 2.0) as usize
    };
    SeqLen {
        min: v[0],
        max: v[n - 1],
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
    table: &MTable,
    stats: &[ColStats],
    processor: &str,
) -> Vec<Vec<(String, usize)>> {
    let names: Vec<&str> = table.cols.iter().map(|c| c.name.as_str()).collect();
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
fn columns_json(table: &MTable, stats: &[ColStats], processor: &str) -> Value {
    let names: Vec<&str> = table.cols.iter().map(|c| c.name.as_str()).collect();
    let mut cols = Map::new();
    for ((col, s), (t, c)) in table.cols.iter().zip(stats).zip(argn_ids(&names)) {
        let mut m = match s {
            ColStats::Numeric(s) => s.to_json(),
            ColStats::Categorical(s) => s.to_json(),
            ColStats::Datetime(s) => s.to_json(),
            ColStats::Empty(kind) => {
                let mut m = Map::new();
                m.insert("encoding_type".into(), (*kind).into());
                cols.insert(col.name.clone(), Value::Object(m));
                continue;
            }
        };
        m.insert("argn_processor".into(), processor.into());
        m.insert("argn_table".into(), t.into());
        m.insert("argn_column".into(), c.into());
        cols.insert(col.name.clone(), Value::Object(m));
    }
    Value::Object(cols)
}

/// `tgt-stats.json` as the engine writes it (value protection off).
pub(crate) fn tgt_stats_json(
    table: &MTable,
    stats: &[ColStats],
    trn: usize,
    val: usize,
    seq: SeqLen,
    key: &str,
) -> Value {
    let mut m = Map::new();
    m.insert("columns".into(), columns_json(table, stats, "tgt"));
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
pub(crate) fn ctx_stats_json(table: &MTable, stats: &[ColStats], key: &str) -> Value {
    let mut m = Map::new();
    m.insert("columns".into(), columns_json(table, stats, "ctxflt"));
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
