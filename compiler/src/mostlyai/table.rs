//! A table as the engine sees it after `pd.read_parquet`: the key plus every other column, each
//! resolved to the engine's default encoding family (numeric, categorical, datetime).

use crate::column::{Kind, TypeInfo, Values};
use crate::error::{CompileError, Result};
use crate::read::{self, Role, RowsTable, Want};
use std::path::{Path, PathBuf};

/// One non-key column.
#[derive(Debug)]
pub(crate) struct MCol {
    pub data: Data,
}

/// Column values by family.
#[derive(Debug)]
pub(crate) enum Data {
    /// Numbers; NaN marks null. `ints` holds the exact integers of an integer column (the
    /// values at null rows are meaningless). pandas keeps an integer column without nulls
    /// int64 and makes one with nulls float64: only the whole table decides which.
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

/// One bucket of a table (its rows in input order).
#[derive(Debug)]
pub(crate) struct MTable {
    pub keys: Vec<i64>,
    pub cols: Vec<MCol>,
    files: Vec<PathBuf>,
    offsets: Vec<u64>,
    /// Each row's global row in the table, ascending.
    pub origin: Vec<u64>,
}

impl MTable {
    /// The file and in-file row of a row of this bucket, for errors.
    pub fn locate(&self, row: usize) -> (&Path, u64) {
        let row = self.origin[row];
        let file = self.offsets.partition_point(|&o| o <= row) - 1;
        (&self.files[file], row - self.offsets[file])
    }
    pub fn rows(&self) -> usize {
        self.keys.len()
    }
}

/// A column's encoding family, decided by its type alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Num,
    Cat,
    Time,
}

/// The family of every non-key column (`types` after the key's), refusing date columns.
pub(crate) fn families(wants: &[Want], types: &[TypeInfo], first: &Path) -> Result<Vec<Family>> {
    wants
        .iter()
        .zip(types)
        .skip(1)
        .map(|(want, t)| match t.kind {
            Kind::Int | Kind::F64 | Kind::F32 => Ok(Family::Num),
            Kind::Bool | Kind::Str => Ok(Family::Cat),
            Kind::Time if t.name.starts_with("Date") => Err(CompileError::Incompatible {
                path: first.into(),
                column: want.name.clone(),
                row: 0,
                what: format!(
                    "a {} column: pandas reads dates as Python objects and the engine encodes \
                     them as categorical strings; the mostlyai profile accepts timestamps (cast \
                     the column to timestamp[us])",
                    t.name
                ),
            }),
            Kind::Time => Ok(Family::Time),
        })
        .collect()
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

/// Every column of the table in `first`, `key` first: the engine reads them all.
pub(crate) fn wants(first: &Path, key: &str) -> Result<Vec<Want>> {
    let opened = read::open(first)?;
    if let Ok(field) = opened.schema.field_with_name(key) {
        let kind = crate::column::classify(field.data_type()).map(|t| t.kind);
        if kind != Some(Kind::Int) || field.data_type() == &arrow_schema::DataType::UInt64 {
            return Err(CompileError::WrongType {
                path: first.into(),
                column: key.into(),
                role: "the key of a mostlyai profile",
                expected: "an integer type (int8..int64, uint8..uint32), as the engine's keys",
                found: crate::column::type_name(field.data_type()),
                advice: "; map the keys to integers first (pandas.factorize), or compile \
                         without the profile, which takes string keys",
            });
        }
    }
    let mut wants = vec![Want {
        name: key.to_string(),
        role: Role::Key,
    }];
    for f in opened.schema.fields() {
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
    Ok(wants)
}

/// One bucket of a table as the engine sees it.
pub(crate) fn convert(mut t: RowsTable) -> Result<MTable> {
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
        let data = match (&col.values, col.info.kind) {
            (Values::Int(v), Kind::Int) => {
                let vals: Vec<f64> = (0..n)
                    .map(|i| if valid(i) { v[i] as f64 } else { f64::NAN })
                    .collect();
                Data::Num {
                    vals,
                    ints: Some(v.clone()),
                }
            }
            (Values::Int(v), Kind::Time) => {
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
        cols.push(MCol { data });
    }
    Ok(MTable {
        keys,
        cols,
        files: t.files,
        offsets: t.offsets,
        origin: t.origin.expect("a bucket locates its rows"),
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
