//! Categorical columns (`TABULAR_CATEGORICAL`): strings, booleans (`False`/`True`), in the
//! engine's escaped form. With value protection off the codes are `_RARE_`, `<<NULL>>` when any
//! partition has a null, then every value in code-point order.

use super::table::CAT_NULL;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// One bucket's rows of a column in one partition: how many, whether one is null, and which
/// values occur. Merges exactly: a partition's [`Partial`] is the union of its buckets' pieces.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Piece {
    rows: u64,
    has_nan: bool,
    present: BTreeSet<String>,
}

pub(crate) fn piece(codes: &[u32], dict: &[String], rows: &[u32]) -> Piece {
    let mut seen = vec![false; dict.len()];
    let mut has_nan = false;
    for &r in rows {
        match codes[r as usize] {
            CAT_NULL => has_nan = true,
            c => seen[c as usize] = true,
        }
    }
    Piece {
        rows: rows.len() as u64,
        has_nan,
        present: dict
            .iter()
            .zip(seen)
            .filter(|&(_, here)| here)
            .map(|(v, _)| v.clone())
            .collect(),
    }
}

impl Piece {
    /// Adds `o`, the piece of the same column and partition in a later bucket.
    pub fn merge(&mut self, o: Piece) {
        self.rows += o.rows;
        self.has_nan |= o.has_nan;
        self.present.extend(o.present);
    }
}

/// One partition: whether it has a null, and which values occur.
#[derive(Debug, Clone)]
pub(crate) struct Partial {
    has_nan: bool,
    present: BTreeSet<String>,
}

/// The partition's statistics from its piece, merged over every bucket (`None` without rows).
pub(crate) fn partial(p: &Piece) -> Option<Partial> {
    (p.rows > 0).then(|| Partial {
        has_nan: p.has_nan,
        present: p.present.clone(),
    })
}

/// The reduced codes: `codes[i]` is the key of code `i`.
#[derive(Debug, Clone)]
pub(crate) struct Stats {
    pub codes: Vec<String>,
}

pub(crate) fn reduce(parts: &[&Partial]) -> Stats {
    let values: BTreeSet<&str> = parts
        .iter()
        .flat_map(|p| p.present.iter().map(String::as_str))
        .collect();
    let mut codes = vec!["_RARE_".to_string()];
    if parts.iter().any(|p| p.has_nan) {
        codes.push("<<NULL>>".into());
    }
    codes.extend(values.into_iter().map(str::to_string));
    Stats { codes }
}

impl Stats {
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("value_protection".into(), false.into());
        m.insert("encoding_type".into(), "TABULAR_CATEGORICAL".into());
        m.insert("no_of_rare_categories".into(), 0.into());
        let codes: Map<String, Value> = self
            .codes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), Value::from(i)))
            .collect();
        m.insert("codes".into(), Value::Object(codes));
        let mut card = Map::new();
        card.insert("cat".into(), self.codes.len().into());
        m.insert("cardinalities".into(), Value::Object(card));
        m
    }

    /// Code of every dictionary entry, and of null.
    pub fn encoder(&self, dict: &[String]) -> Encoder {
        let at: std::collections::HashMap<&str, i32> = self
            .codes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_str(), i as i32))
            .collect();
        Encoder {
            by_dict: dict
                .iter()
                .map(|s| at.get(s.as_str()).copied().unwrap_or(0))
                .collect(),
            null: at.get("<<NULL>>").copied().unwrap_or(0),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Encoder {
    by_dict: Vec<i32>,
    null: i32,
}

impl Encoder {
    #[inline]
    pub fn encode(&self, code: u32) -> i32 {
        if code == CAT_NULL {
            self.null
        } else {
            self.by_dict[code as usize]
        }
    }
}
