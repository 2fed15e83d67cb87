//! Datetime columns (`TABULAR_DATETIME`): year, month, day, hour, minute, second and three
//! millisecond digits, each encoded as `part - min`.

use super::pyfmt::{civil_from_days, TimeSpelling};
use crate::runs::Run;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub(crate) const PARTS: [&str; 9] = [
    "year", "month", "day", "hour", "minute", "second", "ms_E2", "ms_E1", "ms_E0",
];

/// The nine parts of a timestamp in microseconds.
pub(crate) fn parts(us: i64) -> [i64; 9] {
    let days = us.div_euclid(86_400_000_000);
    let rest = us.rem_euclid(86_400_000_000);
    let (y, m, d) = civil_from_days(days);
    let secs = rest / 1_000_000;
    let micro = rest % 1_000_000;
    [
        y,
        i64::from(m),
        i64::from(d),
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        micro / 100_000 % 10,
        micro / 10_000 % 10,
        micro / 1_000 % 10,
    ]
}

/// The engine's `ANALYZE_MIN_MAX_TOP_N`: `min`/`max` strings are spelled at the resolution of
/// the 1000 smallest / largest values of a partition.
const TOP_N: usize = 1000;

/// One bucket's rows of a datetime column in one partition: what merges exactly across buckets
/// into the partition's [`Partial`] (the `TOP_N` smallest and largest values decide the
/// spelling). Its non-null values go to a values file (`run`), as imputation donors.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Piece {
    pub rows: u64,
    /// Non-null rows.
    pub values: u64,
    min_values: [i64; 9],
    max_values: [i64; 9],
    /// Up to `TOP_N` smallest values, ascending, and up to `TOP_N` largest.
    head: Vec<i64>,
    tail: Vec<i64>,
    /// Where the non-null values lie: one run per bucket, in bucket order.
    pub runs: Vec<Run>,
}

impl Piece {
    /// Adds `o`, the piece of the same column and partition in a later bucket.
    pub fn merge(&mut self, o: Piece) {
        if o.values > 0 {
            for i in 0..9 {
                self.min_values[i] = self.min_values[i].min(o.min_values[i]);
                self.max_values[i] = self.max_values[i].max(o.max_values[i]);
            }
        }
        self.rows += o.rows;
        self.values += o.values;
        // Each keeps its own TOP_N extremes, so together they hold those of both.
        self.head.extend(o.head);
        self.head.sort_unstable();
        self.head.truncate(TOP_N);
        self.tail.extend(o.tail);
        self.tail.sort_unstable();
        let cut = self.tail.len() - self.tail.len().min(TOP_N);
        self.tail.drain(..cut);
        self.runs.extend(o.runs);
    }
}

/// The piece of `rows` of a column, and its non-null values, ascending (for `run`).
pub(crate) fn piece(us: &[Option<i64>], rows: &[u32]) -> (Piece, Vec<i64>) {
    let mut vals: Vec<i64> = rows.iter().filter_map(|&r| us[r as usize]).collect();
    vals.sort_unstable();
    let mut min_values = [i64::MAX; 9];
    let mut max_values = [i64::MIN; 9];
    for &v in &vals {
        let p = parts(v);
        for i in 0..9 {
            min_values[i] = min_values[i].min(p[i]);
            max_values[i] = max_values[i].max(p[i]);
        }
    }
    let piece = Piece {
        rows: rows.len() as u64,
        values: vals.len() as u64,
        min_values,
        max_values,
        head: vals[..vals.len().min(TOP_N)].to_vec(),
        tail: vals[vals.len() - vals.len().min(TOP_N)..].to_vec(),
        runs: Vec::new(),
    };
    (piece, vals)
}

#[derive(Debug, Clone)]
pub(crate) struct Partial {
    has_nan: bool,
    min_values: [i64; 9],
    max_values: [i64; 9],
    min: Option<String>,
    max: Option<String>,
}

/// `analyze_datetime` of one partition from its piece, merged over every bucket (`None` when
/// it has no rows).
pub(crate) fn partial(p: &Piece) -> Option<Partial> {
    if p.rows == 0 {
        return None;
    }
    let has_nan = p.values < p.rows;
    if p.values == 0 {
        // The engine's defaults for a partition without values (they enter the reduction).
        let mut v = [0i64; 9];
        v[0] = 2022;
        v[1] = 1;
        v[2] = 1;
        return Some(Partial {
            has_nan,
            min_values: v,
            max_values: v,
            min: None,
            max: None,
        });
    }
    let spell = |slice: &[i64]| {
        slice
            .iter()
            .map(|&v| TimeSpelling::of(v))
            .max()
            .expect("non-empty")
    };
    Some(Partial {
        has_nan,
        min_values: p.min_values,
        max_values: p.max_values,
        min: Some(spell(&p.head).format(p.head[0])),
        max: Some(spell(&p.tail).format(p.tail[p.tail.len() - 1])),
    })
}

#[derive(Debug, Clone)]
pub(crate) struct Stats {
    has_nan: bool,
    has_time: bool,
    has_ms: bool,
    min_values: [i64; 9],
    max_values: [i64; 9],
    min: Option<String>,
    max: Option<String>,
}

pub(crate) fn reduce(parts: &[&Partial]) -> Stats {
    let has_nan = parts.iter().any(|p| p.has_nan);
    let mut min_values = [i64::MAX; 9];
    let mut max_values = [i64::MIN; 9];
    for p in parts {
        for i in 0..9 {
            min_values[i] = min_values[i].min(p.min_values[i]);
            max_values[i] = max_values[i].max(p.max_values[i]);
        }
    }
    let has_time = max_values[3] > 0 || max_values[4] > 0 || max_values[5] > 0;
    let has_ms = has_time && (max_values[6] > 0 || max_values[7] > 0 || max_values[8] > 0);
    // The engine sorts the partitions' strings, not the timestamps.
    let min = parts.iter().filter_map(|p| p.min.clone()).min();
    let max = parts.iter().filter_map(|p| p.max.clone()).max();
    Stats {
        has_nan,
        has_time,
        has_ms,
        min_values,
        max_values,
        min,
        max,
    }
}

impl Stats {
    /// Indices into [`PARTS`] of the encoded parts, in order.
    fn kept(&self) -> Vec<usize> {
        let mut k = vec![0, 1, 2];
        if self.has_time {
            k.extend([3, 4, 5]);
        }
        if self.has_ms {
            k.extend([6, 7, 8]);
        }
        k
    }

    pub fn cardinalities(&self) -> Vec<(String, usize)> {
        let mut c = Vec::new();
        if self.has_nan {
            c.push(("nan".to_string(), 2));
        }
        for i in self.kept() {
            c.push((
                PARTS[i].to_string(),
                (self.max_values[i] + 1 - self.min_values[i]) as usize,
            ));
        }
        c
    }

    pub fn imputes(&self) -> bool {
        self.has_nan
    }

    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("value_protection".into(), false.into());
        m.insert("encoding_type".into(), "TABULAR_DATETIME".into());
        m.insert(
            "cardinalities".into(),
            super::numeric::cardinalities_json(self.cardinalities()),
        );
        m.insert("has_nan".into(), self.has_nan.into());
        m.insert("has_time".into(), self.has_time.into());
        m.insert("has_ms".into(), self.has_ms.into());
        let obj = |v: &[i64; 9]| -> Value {
            Value::Object(
                PARTS
                    .iter()
                    .zip(v)
                    .map(|(k, &x)| ((*k).to_string(), Value::from(x)))
                    .collect(),
            )
        };
        m.insert("min_values".into(), obj(&self.min_values));
        m.insert("max_values".into(), obj(&self.max_values));
        m.insert(
            "min".into(),
            self.min.clone().map_or(Value::Null, Value::from),
        );
        m.insert(
            "max".into(),
            self.max.clone().map_or(Value::Null, Value::from),
        );
        m
    }

    pub fn encoder(&self) -> Encoder {
        Encoder {
            has_nan: self.has_nan,
            kept: self
                .kept()
                .into_iter()
                .map(|i| {
                    (
                        i,
                        self.min_values[i],
                        self.max_values[i] - self.min_values[i],
                    )
                })
                .collect(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Encoder {
    has_nan: bool,
    kept: Vec<(usize, i64, i64)>,
}

impl Encoder {
    pub fn width(&self) -> usize {
        usize::from(self.has_nan) + self.kept.len()
    }

    /// Codes of `value` (`imputed` replaces a null) into `out`. A null that cannot be imputed
    /// (no value in its partition) encodes as zeros.
    #[inline]
    pub fn encode(&self, value: Option<i64>, imputed: Option<i64>, out: &mut [i32]) {
        let mut k = 0;
        if self.has_nan {
            out[0] = i32::from(value.is_none());
            k = 1;
        }
        match value.or(imputed) {
            Some(us) => {
                let p = parts(us);
                for &(i, lo, span) in &self.kept {
                    out[k] = (p[i] - lo).clamp(0, span) as i32;
                    k += 1;
                }
            }
            None => out[k..].fill(0),
        }
    }
}
