//! Numeric columns (`TABULAR_NUMERIC_AUTO`): per-partition statistics, their reduction into
//! discrete / digit / binned, and the per-value codes.

use super::digits::{self, Digits, MAX_DECIMAL};
use super::pyfmt::float_repr;
use super::quantiles::{closest_observation_index, find_distinct_bins, linspace01};
use crate::runs::Run;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The engine's thresholds.
const DISCRETE_MAX_VALUES: usize = 100;
const DIGIT_MAX_DIGITS: usize = 3;
const BINNED_MAX_BINS: usize = 100;
const BINNED_MAX_QUANTILES: usize = 1001;
const DEFAULT_MIN_DECIMAL: i32 = -8;

/// One partition's statistics of a numeric column (`analyze_numeric`), reduced to what the
/// reduction reads when value protection is off.
#[derive(Debug, Clone)]
pub(crate) struct Partial {
    /// Non-null rows.
    values: u64,
    has_nan: bool,
    has_neg: bool,
    /// Lowest digit position analysed (`E18..E{low}`).
    low: i32,
    /// Per position `E18..E{low}`: min and max digit over non-null rows (0 when none).
    min_d: Vec<u8>,
    max_d: Vec<u8>,
    min: Option<f64>,
    max: Option<f64>,
    /// The JSON keys of `cnt_values`, ascending; `None` when 100 or more distinct values.
    cnt_keys: Option<Vec<String>>,
    quantiles: Vec<f64>,
}

/// Distinct values a [`Piece`] lists before it gives up (far above the 100 a discrete
/// column may have, so that giving up always means "not discrete").
const PIECE_DISTINCT: usize = 128;

/// One bucket's rows of a numeric column in one partition: what merges exactly across buckets
/// into the partition's [`Partial`]. Its sorted non-null values go to a values file (`run`):
/// the partition's quantiles are rank queries over its pieces' runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Piece {
    pub rows: u64,
    /// Non-null rows.
    pub values: u64,
    has_neg: bool,
    low: i32,
    /// Digit ranges over the non-null values, positions `E18..E{low}` (empty without values).
    min_d: Vec<u8>,
    max_d: Vec<u8>,
    /// Bits of the smallest and largest value (total order: `-0.0` below `0.0`).
    min: Option<u64>,
    max: Option<u64>,
    /// The distinct values as doubles (their bits, ascending), and for an integer column as
    /// integers (ascending); `None` past [`PIECE_DISTINCT`]. Both are kept because integers
    /// past 2^53 that differ can be the same double, which is what pandas counts once an
    /// integer column has a null.
    distinct: Option<Vec<i64>>,
    distinct_ints: Option<Vec<i64>>,
    /// Where the sorted non-null values lie: one run per bucket, in bucket order.
    pub runs: Vec<Run>,
}

impl Piece {
    /// Adds `o`, the piece of the same column and partition in a later bucket.
    pub fn merge(&mut self, o: Piece) {
        if o.values > 0 {
            if self.values == 0 {
                (self.min_d, self.max_d) = (o.min_d, o.max_d);
            } else {
                // Positions below a piece's window are 0 in all its values.
                let width = (MAX_DECIMAL - self.low.min(o.low) + 1) as usize;
                let at = |d: &[u8], i: usize| d.get(i).copied().unwrap_or(0);
                self.min_d = (0..width)
                    .map(|i| at(&self.min_d, i).min(at(&o.min_d, i)))
                    .collect();
                self.max_d = (0..width)
                    .map(|i| at(&self.max_d, i).max(at(&o.max_d, i)))
                    .collect();
            }
        }
        self.low = self.low.min(o.low);
        self.rows += o.rows;
        self.values += o.values;
        self.has_neg |= o.has_neg;
        let pick = |a: Option<u64>, b: Option<u64>, lower: bool| match (a, b) {
            (Some(x), Some(y)) => {
                let less = f64::from_bits(y).total_cmp(&f64::from_bits(x)).is_lt();
                Some(if less == lower { y } else { x })
            }
            (x, y) => x.or(y),
        };
        self.min = pick(self.min, o.min, true);
        self.max = pick(self.max, o.max, false);
        let union = |a: Option<Vec<i64>>, b: Option<Vec<i64>>| match (a, b) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                a.sort_unstable();
                a.dedup();
                (a.len() <= PIECE_DISTINCT).then_some(a)
            }
            _ => None,
        };
        self.distinct = union(self.distinct.take(), o.distinct);
        self.distinct_ints = union(self.distinct_ints.take(), o.distinct_ints);
        self.runs.extend(o.runs);
    }
}

/// The piece of `rows` (ascending) of a column, and its sorted non-null values (for `run`).
/// `ints`: the column's exact integers (an integer column), nulls marked NaN in `vals`.
pub(crate) fn piece(vals: &[f64], ints: Option<&[i64]>, rows: &[u32]) -> (Piece, Vec<f64>) {
    let mut sorted: Vec<f64> = rows
        .iter()
        .map(|&r| vals[r as usize])
        .filter(|x| !x.is_nan())
        .collect();
    crate::runs::sort_total(&mut sorted);
    // Digits depend on the value only: split each distinct value once (the values are sorted
    // for the quantiles anyway; a column typically repeats its values many times).
    let mut split: Vec<Digits> = Vec::new();
    let mut bits: Vec<i64> = Vec::new();
    for &x in &sorted {
        if bits.last() != Some(&(x.to_bits() as i64)) {
            split.push(digits::split(x));
            bits.push(x.to_bits() as i64);
        }
    }
    let max_scale = split.iter().map(|d| d.scale).max().unwrap_or(0);
    let low = DEFAULT_MIN_DECIMAL.min(-(max_scale.min(digits::MAX_SCALE) as i32));
    let width = if split.is_empty() {
        0
    } else {
        (MAX_DECIMAL - low + 1) as usize
    };
    let mut min_d = vec![9u8; width];
    let mut max_d = vec![0u8; width];
    let mut has_neg = false;
    for d in &split {
        has_neg |= d.neg;
        // `all[i]` is position E(18 - i), as are min_d/max_d.
        let mut all = [0u8; 39];
        d.write_all(&mut all);
        for i in 0..width {
            min_d[i] = min_d[i].min(all[i]);
            max_d[i] = max_d[i].max(all[i]);
        }
    }
    let distinct_ints = ints.map(|ints| {
        let mut v: Vec<i64> = rows
            .iter()
            .filter(|&&r| !vals[r as usize].is_nan())
            .map(|&r| ints[r as usize])
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    });
    let piece = Piece {
        rows: rows.len() as u64,
        values: sorted.len() as u64,
        has_neg,
        low,
        min_d,
        max_d,
        min: sorted.first().map(|x| x.to_bits()),
        max: sorted.last().map(|x| x.to_bits()),
        distinct: (bits.len() <= PIECE_DISTINCT).then_some(bits),
        distinct_ints: distinct_ints.filter(|v| v.len() <= PIECE_DISTINCT),
        runs: Vec::new(),
    };
    (piece, sorted)
}

/// `analyze_numeric` of one partition from its piece, merged over every bucket (`None` when
/// it has no rows), without its quantiles: only a binned column needs them
/// ([`Partial::add_quantiles`]). `int_keys`: see [`distinct_keys`].
pub(crate) fn partial(p: &Piece, int_keys: Option<bool>) -> Option<Partial> {
    if p.rows == 0 {
        return None;
    }
    let width = (MAX_DECIMAL - p.low + 1) as usize;
    let (min_d, max_d) = if p.values == 0 {
        (vec![0u8; width], vec![0u8; width])
    } else {
        let at = |d: &[u8], i: usize| d.get(i).copied().unwrap_or(0);
        (
            (0..width).map(|i| at(&p.min_d, i)).collect(),
            (0..width).map(|i| at(&p.max_d, i)).collect(),
        )
    };
    Some(Partial {
        values: p.values,
        has_nan: p.values < p.rows,
        has_neg: p.has_neg,
        low: p.low,
        min_d,
        max_d,
        min: p.min.map(f64::from_bits),
        max: p.max.map(f64::from_bits),
        cnt_keys: distinct_keys(p, int_keys),
        quantiles: Vec::new(),
    })
}

/// The partition's value keys, ascending, when it has fewer than 100 distinct values.
/// `int_keys`: `Some(true)` the integers of an int64 column; otherwise the doubles (of a float
/// column, or of an integer column that pandas made float64 because it has nulls).
fn distinct_keys(p: &Piece, int_keys: Option<bool>) -> Option<Vec<String>> {
    if int_keys == Some(true) {
        let all = p.distinct_ints.as_ref()?;
        return (all.len() < DISCRETE_MAX_VALUES).then(|| all.iter().map(i64::to_string).collect());
    }
    let mut v: Vec<f64> = p
        .distinct
        .as_ref()?
        .iter()
        .map(|&b| f64::from_bits(b as u64))
        .collect();
    // Ascending bits are not ascending doubles (negatives): the total order, then `==`
    // (which keeps `-0.0` before `0.0`, as numpy's sorted unique values do).
    crate::runs::sort_total(&mut v);
    v.dedup_by(|a, b| a == b);
    (v.len() < DISCRETE_MAX_VALUES).then(|| v.iter().map(|&x| float_repr(x)).collect())
}

impl Partial {
    /// The partition's 1001 quantiles (numpy's `closest_observation`), `at(ranks)` giving its
    /// non-null values at those ranks (ascending, from 0).
    pub fn add_quantiles(
        &mut self,
        at: impl FnOnce(&[u64]) -> crate::error::Result<Vec<f64>>,
    ) -> crate::error::Result<()> {
        if self.values > 0 {
            let ranks: Vec<u64> = linspace01(BINNED_MAX_QUANTILES)
                .into_iter()
                .map(|q| closest_observation_index(self.values as usize, q) as u64)
                .collect();
            self.quantiles = at(&ranks)?;
        }
        Ok(())
    }
}

/// `cardinalities` as the engine writes it: sub-column name to number of codes.
pub(crate) fn cardinalities_json(cards: Vec<(String, usize)>) -> serde_json::Value {
    serde_json::Value::Object(
        cards
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::from(v)))
            .collect(),
    )
}

/// `analyze_numeric` on the rows `rows` of a column held in memory (`None` for an empty
/// partition): one piece, its quantiles read from its sorted values.
#[cfg(test)]
pub(crate) fn analyze(vals: &[f64], ints: Option<&[i64]>, rows: &[u32]) -> Option<Partial> {
    let (p, sorted) = piece(vals, ints, rows);
    let mut partial = partial(&p, ints.map(|_| true))?;
    partial
        .add_quantiles(|ranks| Ok(ranks.iter().map(|&k| sorted[k as usize]).collect()))
        .expect("in-memory quantiles never fail");
    Some(partial)
}

/// The resolved encoding of a numeric column (`analyze_reduce_numeric`, value protection off).
#[derive(Debug, Clone)]
pub(crate) enum Stats {
    Discrete {
        /// Every code's key in code order (`_RARE_`, `<<NULL>>`, values).
        codes: Vec<String>,
        min_decimal: i32,
    },
    Digit {
        has_nan: bool,
        has_neg: bool,
        /// Positions `E18..E{low}` of `min_d`/`max_d`.
        low: i32,
        min_d: Vec<u8>,
        max_d: Vec<u8>,
        max_decimal: i32,
        min_decimal: i32,
        min: Option<f64>,
        max: Option<f64>,
    },
    Binned {
        codes: Vec<&'static str>,
        min_decimal: i32,
        bins: Vec<f64>,
    },
}

/// `analyze_reduce_numeric` over the non-empty partitions, in file order.
pub(crate) fn reduce(parts: &[&Partial]) -> Stats {
    reduce_as(parts, false)
}

/// [`reduce`], or with `binned` the engine's path for a column forced to
/// `TABULAR_NUMERIC_BINNED` (no auto heuristic).
pub(crate) fn reduce_as(parts: &[&Partial], binned: bool) -> Stats {
    let has_nan = parts.iter().any(|p| p.has_nan);
    let has_neg = parts.iter().any(|p| p.has_neg);
    // The union of digit positions, missing ones counting as 0 (2.7.3).
    let low = parts
        .iter()
        .map(|p| p.low)
        .min()
        .expect("at least one partition");
    let width = (MAX_DECIMAL - low + 1) as usize;
    let (mut min_d, mut max_d) = (vec![u8::MAX; width], vec![0u8; width]);
    for p in parts {
        for i in 0..width {
            let (lo, hi) = if i < p.min_d.len() {
                (p.min_d[i], p.max_d[i])
            } else {
                (0, 0)
            };
            min_d[i] = min_d[i].min(lo);
            max_d[i] = max_d[i].max(hi);
        }
    }
    let position = |i: usize| MAX_DECIMAL - i as i32;
    let non_zero: Vec<i32> = (0..width).filter(|&i| max_d[i] > 0).map(position).collect();
    let min_decimal = non_zero.iter().copied().min().unwrap_or(0);
    let min = parts.iter().filter_map(|p| p.min).reduce(f64::min);
    let max = parts.iter().filter_map(|p| p.max).reduce(f64::max);
    let mut max_decimal = match (min, max) {
        (Some(a), Some(b)) => {
            let max_abs = a.abs().max(b.abs());
            if max_abs >= 10.0 {
                max_abs.log10().floor() as i32
            } else {
                0
            }
        }
        _ => 0,
    };
    max_decimal = max_decimal.max(min_decimal).min(MAX_DECIMAL);

    // Discrete needs every partition's value keys; an empty key set counts as missing.
    let has_cnt_values = !binned
        && parts
            .iter()
            .all(|p| p.cnt_keys.as_ref().is_some_and(|k| !k.is_empty()));
    if has_cnt_values {
        let mut seen = std::collections::HashSet::new();
        let mut categories: Vec<String> = Vec::new();
        for p in parts {
            for k in p.cnt_keys.as_ref().expect("checked") {
                if seen.insert(k.clone()) {
                    categories.push(k.clone());
                }
            }
        }
        if min_decimal >= 0 {
            // The engine cuts each key at its first "." ("18.0" -> "18"); keys that collapse
            // stay listed twice, and the later one's code wins in the JSON object.
            for c in &mut categories {
                if let Some(dot) = c.find('.') {
                    c.truncate(dot);
                }
            }
        }
        let mut codes = vec!["_RARE_".to_string()];
        if has_nan {
            codes.push("<<NULL>>".into());
        }
        codes.extend(categories);
        return Stats::Discrete { codes, min_decimal };
    }
    if !binned && non_zero.len() <= DIGIT_MAX_DIGITS {
        return Stats::Digit {
            has_nan,
            has_neg,
            low,
            min_d,
            max_d,
            max_decimal,
            min_decimal,
            min,
            max,
        };
    }
    let (bins, min_decimal) = match (min, max) {
        (Some(lo), Some(hi)) => {
            let clipped: Vec<f64> = parts
                .iter()
                .flat_map(|p| p.quantiles.iter())
                .map(|&q| q.clamp(lo, hi))
                .collect();
            (
                find_distinct_bins(&clipped, BINNED_MAX_BINS, 1000).0,
                min_decimal,
            )
        }
        _ => (vec![0.0], 0),
    };
    let mut codes = vec!["<<UNK>>"];
    if has_nan {
        codes.push("<<NULL>>");
    }
    if min.is_some() {
        codes.push("<<MIN>>");
    }
    if max.is_some() {
        codes.push("<<MAX>>");
    }
    Stats::Binned {
        codes,
        min_decimal,
        bins,
    }
}

fn opt_f64(x: Option<f64>) -> Value {
    x.map_or(Value::Null, Value::from)
}

impl Stats {
    /// The engine's encoding-type name.
    pub fn encoding_type(&self) -> &'static str {
        match self {
            Stats::Discrete { .. } => "TABULAR_NUMERIC_DISCRETE",
            Stats::Digit { .. } => "TABULAR_NUMERIC_DIGIT",
            Stats::Binned { .. } => "TABULAR_NUMERIC_BINNED",
        }
    }

    /// Sub-column names and cardinalities, in the engine's order.
    pub fn cardinalities(&self) -> Vec<(String, usize)> {
        match self {
            Stats::Discrete { codes, .. } => vec![("cat".into(), code_map(codes).len())],
            Stats::Digit {
                has_nan,
                has_neg,
                low,
                min_d,
                max_d,
                max_decimal,
                min_decimal,
                ..
            } => {
                let mut c = Vec::new();
                if *has_nan {
                    c.push(("nan".into(), 2));
                }
                if *has_neg {
                    c.push(("neg".into(), 2));
                }
                for d in (*min_decimal..=*max_decimal).rev() {
                    let i = (MAX_DECIMAL - d) as usize;
                    debug_assert!(d >= *low);
                    c.push((format!("E{d}"), (max_d[i] + 1 - min_d[i]) as usize));
                }
                c
            }
            Stats::Binned { codes, bins, .. } => {
                vec![("bin".into(), codes.len() + bins.len() - 1)]
            }
        }
    }

    /// The column's entry in the stats JSON (before the `argn_*` keys).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("encoding_type".into(), self.encoding_type().into());
        m.insert(
            "cardinalities".into(),
            cardinalities_json(self.cardinalities()),
        );
        match self {
            Stats::Discrete { codes, min_decimal } => {
                let map: Map<String, Value> = code_map(codes)
                    .into_iter()
                    .map(|(k, v)| (k, Value::from(v)))
                    .collect();
                m.insert("codes".into(), Value::Object(map));
                m.insert("min_decimal".into(), (*min_decimal).into());
            }
            Stats::Digit {
                has_nan,
                has_neg,
                low,
                min_d,
                max_d,
                max_decimal,
                min_decimal,
                min,
                max,
            } => {
                let digits = |v: &[u8]| -> Value {
                    let map: Map<String, Value> = (*low..=MAX_DECIMAL)
                        .rev()
                        .zip(v)
                        .map(|(d, &x)| (format!("E{d}"), Value::from(x)))
                        .collect();
                    Value::Object(map)
                };
                m.insert("has_nan".into(), (*has_nan).into());
                m.insert("has_neg".into(), (*has_neg).into());
                m.insert("min_digits".into(), digits(min_d));
                m.insert("max_digits".into(), digits(max_d));
                m.insert("max_decimal".into(), (*max_decimal).into());
                m.insert("min_decimal".into(), (*min_decimal).into());
                m.insert("min".into(), opt_f64(*min));
                m.insert("max".into(), opt_f64(*max));
            }
            Stats::Binned {
                codes,
                min_decimal,
                bins,
            } => {
                let map: Map<String, Value> = codes
                    .iter()
                    .enumerate()
                    .map(|(i, k)| ((*k).to_string(), Value::from(i)))
                    .collect();
                m.insert("codes".into(), Value::Object(map));
                m.insert("min_decimal".into(), (*min_decimal).into());
                m.insert("bins".into(), json!(bins));
            }
        }
        m
    }

    /// Whether null rows get a random (imputed) value before encoding.
    pub fn imputes(&self) -> bool {
        matches!(self, Stats::Digit { has_nan: true, .. })
    }
}

/// `{categories[i]: i}` as Python builds it: a repeated key keeps its first position and takes
/// the last index.
fn code_map(codes: &[String]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    let mut at = std::collections::HashMap::new();
    for (i, c) in codes.iter().enumerate() {
        match at.get(c) {
            Some(&j) => out[j] = (c.clone(), i),
            None => {
                at.insert(c.clone(), out.len());
                out.push((c.clone(), i));
            }
        }
    }
    out
}

/// Per-value encoder built from resolved stats.
#[derive(Debug)]
pub(crate) enum Encoder {
    Discrete {
        lookup: std::collections::HashMap<String, i32>,
        null: i32,
        /// Code of each distinct value, by its integer (integer columns) or its f64 bits.
        cache: std::collections::HashMap<u64, i32>,
    },
    Digit {
        has_nan: bool,
        has_neg: bool,
        round: bool,
        /// Per emitted position (high to low): position, min digit, max code.
        positions: Vec<(i32, u8, u8)>,
    },
    Binned {
        /// Inner edges (`bins[1..len-1]`); a value's bin is the count of edges `<= x`.
        edges: Vec<f64>,
        offset: i32,
        null: i32,
        first: f64,
        last: f64,
        min_code: Option<i32>,
        max_code: Option<i32>,
    },
}

impl Encoder {
    pub fn new(stats: &Stats, vals: &[f64], ints: Option<&[i64]>) -> Encoder {
        match stats {
            Stats::Discrete { codes, min_decimal } => {
                let lookup: std::collections::HashMap<String, i32> = code_map(codes)
                    .into_iter()
                    .map(|(k, v)| (k, v as i32))
                    .collect();
                let null = lookup.get("<<NULL>>").copied().unwrap_or(0);
                let int_keys = *min_decimal >= 0;
                // Precompute the code of every distinct value (a discrete column has few).
                let mut cache = std::collections::HashMap::new();
                for (i, &x) in vals.iter().enumerate() {
                    if x.is_nan() {
                        continue;
                    }
                    let key = match ints {
                        Some(iv) => iv[i] as u64,
                        None => x.to_bits(),
                    };
                    if cache.contains_key(&key) {
                        continue;
                    }
                    let text = match (ints, int_keys) {
                        (Some(iv), _) => iv[i].to_string(),
                        (None, true) => {
                            let r = x.round_ties_even();
                            if r.abs() < 9.223_372_036_854_776e18 {
                                (r as i64).to_string()
                            } else {
                                float_repr(r)
                            }
                        }
                        (None, false) => float_repr(x),
                    };
                    cache.insert(key, lookup.get(&text).copied().unwrap_or(0));
                }
                Encoder::Discrete {
                    lookup,
                    null,
                    cache,
                }
            }
            Stats::Digit {
                has_nan,
                has_neg,
                min_d,
                max_d,
                max_decimal,
                min_decimal,
                ..
            } => Encoder::Digit {
                has_nan: *has_nan,
                has_neg: *has_neg,
                round: *min_decimal >= 0,
                positions: (*min_decimal..=*max_decimal)
                    .rev()
                    .map(|d| {
                        let i = (MAX_DECIMAL - d) as usize;
                        (d, min_d[i], max_d[i] - min_d[i])
                    })
                    .collect(),
            },
            Stats::Binned { codes, bins, .. } => {
                let pos = |t: &str| codes.iter().position(|c| *c == t).map(|p| p as i32);
                Encoder::Binned {
                    edges: if bins.len() > 2 {
                        bins[1..bins.len() - 1].to_vec()
                    } else {
                        Vec::new()
                    },
                    offset: codes.len() as i32,
                    null: pos("<<NULL>>").unwrap_or(0),
                    first: bins[0],
                    last: bins[bins.len() - 1],
                    min_code: pos("<<MIN>>"),
                    max_code: pos("<<MAX>>"),
                }
            }
        }
    }

    /// Sub-columns this encoder writes.
    pub fn width(&self) -> usize {
        match self {
            Encoder::Discrete { .. } | Encoder::Binned { .. } => 1,
            Encoder::Digit {
                has_nan,
                has_neg,
                positions,
                ..
            } => usize::from(*has_nan) + usize::from(*has_neg) + positions.len(),
        }
    }

    /// Codes of value `x` (row `row`; `imputed` replaces a null for digit columns) into `out`.
    #[inline]
    /// Codes of value `x` (`int`: the exact integer where the column is int64) into `out`;
    /// `imputed` replaces a null in the digit split.
    pub fn encode(&self, x: f64, int: Option<i64>, imputed: Option<f64>, out: &mut [i32]) {
        match self {
            Encoder::Discrete {
                lookup,
                null,
                cache,
            } => {
                out[0] = if x.is_nan() {
                    *null
                } else {
                    let key = match int {
                        Some(i) => i as u64,
                        None => x.to_bits(),
                    };
                    match cache.get(&key) {
                        Some(&c) => c,
                        None => lookup.get(&float_repr(x)).copied().unwrap_or(0),
                    }
                };
            }
            Encoder::Digit {
                has_nan,
                has_neg,
                round,
                positions,
            } => {
                let is_nan = x.is_nan();
                let v = if is_nan { imputed.unwrap_or(x) } else { x };
                let v = if *round { v.round_ties_even() } else { v };
                let d = digits::split(v);
                let mut k = 0;
                if *has_nan {
                    out[k] = i32::from(is_nan);
                    k += 1;
                }
                if *has_neg {
                    out[k] = i32::from(d.neg);
                    k += 1;
                }
                for &(p, lo, span) in positions {
                    let digit = d.at(p);
                    out[k] = i32::from(digit.saturating_sub(lo).min(span));
                    k += 1;
                }
            }
            Encoder::Binned {
                edges,
                offset,
                null,
                first,
                last,
                min_code,
                max_code,
            } => {
                out[0] = if x.is_nan() {
                    *null
                } else if max_code.is_some() && x == *last {
                    max_code.expect("checked")
                } else if min_code.is_some() && x == *first {
                    min_code.expect("checked")
                } else {
                    offset + edges.partition_point(|&e| e <= x) as i32
                };
            }
        }
    }
}

#[cfg(test)]
mod piece_tests {
    use super::*;

    /// An integer column with a null is float64 for pandas: integers past 2^53 that round to
    /// the same double are one value, so 200 of them just above 2^60 are still discrete, in one
    /// piece or merged from many.
    #[test]
    fn integers_equal_as_doubles_count_once_when_the_column_has_nulls() {
        let ints: Vec<i64> = (0..200).map(|k| (1i64 << 60) + k).chain([0]).collect();
        let mut vals: Vec<f64> = ints.iter().map(|&i| i as f64).collect();
        *vals.last_mut().unwrap() = f64::NAN;
        let rows: Vec<u32> = (0..ints.len() as u32).collect();
        let as_doubles = partial(&piece(&vals, None, &rows).0, None).unwrap();
        // Doubles are 256 apart there: 2^60 and 2^60 + 256.
        assert_eq!(as_doubles.cnt_keys.as_ref().map(Vec::len), Some(2));
        let whole = partial(&piece(&vals, Some(&ints), &rows).0, Some(false)).unwrap();
        assert_eq!(whole.cnt_keys, as_doubles.cnt_keys);
        let mut merged = piece(&vals, Some(&ints), &rows[..50]).0;
        for chunk in rows[50..].chunks(50) {
            merged.merge(piece(&vals, Some(&ints), chunk).0);
        }
        assert_eq!(
            partial(&merged, Some(false)).unwrap().cnt_keys,
            as_doubles.cnt_keys
        );
        // Without nulls the column stays int64 and its 200 integers are not discrete.
        let rows = &rows[..200];
        let exact = partial(&piece(&vals, Some(&ints), rows).0, Some(true)).unwrap();
        assert_eq!(exact.cnt_keys, None);
    }
}
