//! A table as the engine sees it after `pd.read_parquet`: the key plus every other column, each
//! resolved to the engine's default encoding family (numeric, categorical, datetime).

use crate::column::{Kind, Values};
use crate::error::{CompileError, Result};
use crate::read::{self, Role, RowsTable, Want};
use std::path::{Path, PathBuf};

/// One non-key column.
#[derive(Debug)]
pub(crate) struct MCol {
    pub name: String,
    /// Arrow type name, for the manifest.
    pub source_type: String,
    pub data: Data,
}

/// Column values by family.
#[derive(Debug)]
pub(crate) enum Data {
    /// Numbers; NaN marks null. `ints` holds the exact integers of an integer column without
    /// nulls (pandas keeps it int64; with nulls pandas makes it float64).
    Num {
        vals: Vec<f64>,
        ints: Option<Vec<i64>>,
    },
    /// Strings (already in the engine's escaped form); `None` is null.
    Cat { codes: Vec<u32>, dict: Vec<String> },
    /// Microseconds since the epoch; `None` is null.
    Time { us: Vec<Option<i64>> },
}

/// Code of a null categorical value.
pub(crate) const CAT_NULL: u32 = u32::MAX;

/// A loaded table.
#[derive(Debug)]
pub(crate) struct MTable {
    pub keys: Vec<i64>,
    pub cols: Vec<MCol>,
    files: Vec<PathBuf>,
    offsets: Vec<u64>,
}

impl MTable {
    /// The file and in-file row of a global row, for errors.
    pub fn locate(&self, row: usize) -> (&Path, u64) {
        let row = row as u64;
        let file = self.offsets.partition_point(|&o| o <= row) - 1;
        (&self.files[file], row - self.offsets[file])
    }
    pub fn rows(&self) -> usize {
        self.keys.len()
    }
}

/// The engine's escaping of categorical values: a leading `\x01` is doubled, and the reserved
/// tokens `_RARE_` and `<<NULL>>` get a `\x01` prefix.
pub(crate) fn escape(s: &str) -> String {
    if let Some(rest) = s.strip_prefix('\x01') {
        format!("\x01\x01{rest}")
    } else if s == "_RARE_" || s == "<<NULL>>" {
        format!("\x01{s}")
    } else {
        s.to_string()
    }
}

/// Reads `files` (all columns), with `key` as the key column.
pub(crate) fn load(files: &[PathBuf], key: &str) -> Result<MTable> {
    let first = read::open(&files[0])?;
    let mut wants = vec![Want {
        name: key.to_string(),
        role: Role::Key,
    }];
    for f in first.schema.fields() {
        if f.name() == key {
            continue;
        }
        let role = match crate::column::classify(f.data_type()).map(|t| t.kind) {
            Some(Kind::Str) => Role::Categorical,
            _ => Role::Numeric,
        };
        wants.push(Want {
            name: f.name().clone(),
            role,
        });
    }
    drop(first);
    let table = read::read_rows(files, wants)?;
    convert(table)
}

fn convert(mut t: RowsTable) -> Result<MTable> {
    let mut columns = std::mem::take(&mut t.columns).into_iter();
    let key_col = columns.next().expect("the key is the first want");
    let mut keys = Vec::with_capacity(t.rows());
    for row in 0..t.rows() {
        match key_col.i64_at(row) {
            Some(k) => keys.push(k),
            None => {
                let (path, row) = t.locate(row);
                return Err(CompileError::NullKey {
                    path: path.into(),
                    column: t.wants[0].name.clone(),
                    row,
                });
            }
        }
    }
    let mut cols = Vec::new();
    for (col, want) in columns.zip(&t.wants[1..]) {
        let n = col.len();
        let valid = |i: usize| col.valid.as_ref().is_none_or(|v| v[i]);
        let source_type = col.info.name.clone();
        let data = match (&col.values, col.info.kind) {
            (Values::Int(v), Kind::Int) => {
                let vals: Vec<f64> = (0..n)
                    .map(|i| if valid(i) { v[i] as f64 } else { f64::NAN })
                    .collect();
                let ints = col.valid.is_none().then(|| v.clone());
                Data::Num { vals, ints }
            }
            (Values::Int(v), Kind::Time) => {
                if source_type.starts_with("Date") {
                    return Err(unsupported(
                        &t,
                        &want.name,
                        0,
                        format!(
                            "a {source_type} column: pandas reads dates as Python objects and the \
                             engine encodes them as categorical strings; the mostlyai profile \
                             accepts timestamps (cast the column to timestamp[us])"
                        ),
                    ));
                }
                let per_us = col.info.scale * 1e6;
                let mut us = Vec::with_capacity(n);
                for (i, &x) in v.iter().enumerate().take(n) {
                    if !valid(i) {
                        us.push(None);
                    } else if per_us >= 1.0 {
                        // Seconds or milliseconds far from 1970 overflow microseconds in i64.
                        let Some(x) = x.checked_mul(per_us.round() as i64) else {
                            return Err(unsupported(
                                &t,
                                &want.name,
                                i,
                                format!("timestamp {x} is out of the microsecond range"),
                            ));
                        };
                        us.push(Some(x));
                    } else {
                        // Nanoseconds: numpy's cast to datetime64[us] floors.
                        us.push(Some(x.div_euclid((1.0 / per_us).round() as i64)));
                    }
                }
                Data::Time { us }
            }
            (Values::F64(v), _) => Data::Num {
                vals: (0..n)
                    .map(|i| if valid(i) { v[i] } else { f64::NAN })
                    .collect(),
                ints: None,
            },
            (Values::F32(v), _) => Data::Num {
                vals: (0..n)
                    .map(|i| if valid(i) { f64::from(v[i]) } else { f64::NAN })
                    .collect(),
                ints: None,
            },
            (Values::Bool(v), _) => Data::Cat {
                codes: (0..n)
                    .map(|i| if valid(i) { u32::from(v[i]) } else { CAT_NULL })
                    .collect(),
                dict: vec!["False".into(), "True".into()],
            },
            (Values::Str { codes, dict, .. }, _) => Data::Cat {
                codes: (0..n)
                    .map(|i| if valid(i) { codes[i] } else { CAT_NULL })
                    .collect(),
                dict: dict.iter().map(|s| escape(s)).collect(),
            },
            _ => unreachable!("classify pairs kinds and value vectors"),
        };
        if let Data::Num { vals, .. } = &data {
            if let Some(row) = vals.iter().position(|x| x.is_infinite()) {
                return Err(unsupported(
                    &t,
                    &want.name,
                    row,
                    format!(
                        "{} is infinite; mostlyai-engine cannot encode infinities (it raises \
                         ValueError), so the mostlyai profile refuses them: replace them with \
                         null or a finite value",
                        vals[row]
                    ),
                ));
            }
        }
        cols.push(MCol {
            name: want.name.clone(),
            source_type,
            data,
        });
    }
    Ok(MTable {
        keys,
        cols,
        files: t.files.clone(),
        offsets: t.offsets.clone(),
    })
}

fn unsupported(t: &RowsTable, column: &str, row: usize, what: String) -> CompileError {
    let (path, row) = t.locate(row);
    CompileError::Incompatible {
        path: path.into(),
        column: column.into(),
        row,
        what,
    }
}
