//! Keyed tables: the context table (one row per context) and per-row lookup tables joined on a
//! column (CSV or Parquet).

use crate::column::{Column, Kind, TypeInfo, Values};
use crate::error::{CompileError, Result};
use crate::phases::Phases;
use crate::read::{self, Role, RowsTable, Table, Want};
use crate::rules::ContextRules;
use crate::spill::{self, Buckets, Described, Spill, SpillPart, SpillTo};
use crate::NoProgress;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Maps integer keys to row numbers: a dense table when the keys are compact (sensor ids), a
/// hash map otherwise.
#[derive(Debug)]
pub(crate) enum KeyIndex {
    Dense { min: i64, rows: Vec<u32> },
    Hash(HashMap<i64, u32>),
}

const ABSENT: u32 = u32::MAX;

impl KeyIndex {
    /// Indexes the column `column` of `table` (which must not contain nulls), failing on a
    /// repeated key with both rows as their files number them.
    pub fn build(table: &RowsTable, column: &str) -> Result<KeyIndex> {
        let key = table.column(column).expect("the key is wanted");
        Self::of_ids(table, column, &key.key_ids())
    }

    /// [`KeyIndex::build`] over the key column's ids `keys`.
    fn of_ids(table: &RowsTable, column: &str, keys: &[i64]) -> Result<KeyIndex> {
        let key = table.column(column).expect("the key is wanted");
        let duplicate = |k: i64, first: u32, row: usize| {
            let (path, at) = table.locate(row);
            match (key.str_at(first as usize), key.str_at(row)) {
                (Some(a), Some(b)) if a != b => CompileError::KeyCollision {
                    path: path.into(),
                    column: column.into(),
                    first: a.into(),
                    second: b.into(),
                },
                (text, _) => {
                    let (first_path, first_row) = table.locate(first as usize);
                    CompileError::DuplicateKey {
                        path: path.into(),
                        column: column.into(),
                        key: text.map_or_else(|| k.to_string(), |t| format!("{t:?}")),
                        first: if first_path == path {
                            format!("row {first_row}")
                        } else {
                            format!("row {first_row} of {}", first_path.display())
                        },
                        row: at,
                    }
                }
            }
        };
        let (min, max) = keys
            .iter()
            .fold((i64::MAX, i64::MIN), |(lo, hi), &k| (lo.min(k), hi.max(k)));
        let span = (max as i128 - min as i128 + 1).max(0) as u128;
        if !keys.is_empty() && span <= (keys.len() as u128) * 4 + 1024 {
            let mut rows = vec![ABSENT; span as usize];
            for (row, &k) in keys.iter().enumerate() {
                let slot = &mut rows[(k - min) as usize];
                if *slot != ABSENT {
                    return Err(duplicate(k, *slot, row));
                }
                *slot = row as u32;
            }
            return Ok(KeyIndex::Dense { min, rows });
        }
        let mut map = HashMap::with_capacity(keys.len());
        for (row, &k) in keys.iter().enumerate() {
            if let Some(&first) = map.get(&k) {
                return Err(duplicate(k, first, row));
            }
            map.insert(k, row as u32);
        }
        Ok(KeyIndex::Hash(map))
    }

    #[inline]
    pub fn get(&self, key: i64) -> Option<u32> {
        match self {
            KeyIndex::Dense { min, rows } => {
                let i = key.checked_sub(*min)?;
                let r = *rows.get(usize::try_from(i).ok()?)?;
                (r != ABSENT).then_some(r)
            }
            KeyIndex::Hash(map) => map.get(&key).copied(),
        }
    }
}

/// A table indexed by its key column.
pub(crate) struct Keyed {
    pub path: PathBuf,
    pub key: String,
    pub table: RowsTable,
    pub index: KeyIndex,
}

impl Keyed {
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.table.column(name)
    }
}

fn check_no_null_keys(table: &RowsTable, key: &str) -> Result<()> {
    let col = table.column(key).expect("key is wanted first");
    if let Some(valid) = &col.valid {
        if let Some(row) = valid.iter().position(|v| !v) {
            let (path, row) = table.locate(row);
            return Err(CompileError::NullKey {
                path: path.into(),
                column: key.into(),
                row,
            });
        }
    }
    Ok(())
}

/// Reads a keyed table from Parquet or CSV: `key` plus the `wants`.
pub(crate) fn read_keyed(path: &Path, key: &str, role: Role, wants: &[Want]) -> Result<Keyed> {
    let mut all = vec![Want {
        name: key.into(),
        role,
    }];
    all.extend(wants.iter().filter(|w| w.name != key).cloned());
    let is_csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let table = if is_csv {
        read_csv(path, all)?
    } else {
        read::read_rows(&[path.to_path_buf()], all)?
    };
    check_no_null_keys(&table, key)?;
    let index = KeyIndex::build(&table, key)?;
    Ok(Keyed {
        path: path.into(),
        key: key.into(),
        table,
        index,
    })
}

fn is_csv(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// The context table, spilled into the compile's buckets: a bucket reads its own contexts only,
/// so a context table of any size costs one bucket's share of memory.
pub(crate) struct ContextSide {
    pub path: PathBuf,
    /// Read from a list table's own rows (its rows are the contexts whose lists are the steps).
    pub lists: bool,
    pub key: String,
    spill: Spill,
    /// The distinct non-null values of the split column (`split_by`), ascending.
    pub split_values: Vec<String>,
}

/// What spilling the context table wrote: enough for any later stage (or another machine) to
/// read it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContextPart {
    spill: SpillPart,
    rows: u64,
    split_values: Vec<String>,
}

/// The columns read from the context table: the key first (as `key_role`, which names the rows
/// key's kind), then targets, context features and the split column.
pub(crate) fn context_wants(rules: &ContextRules, texts: &[String], key_role: Role) -> Vec<Want> {
    let key = rules.key;
    let mut wants = vec![Want {
        name: key.into(),
        role: key_role,
    }];
    for n in rules.targets.iter().chain(rules.features) {
        if n != key {
            wants.push(Want {
                name: n.clone(),
                role: Role::Numeric,
            });
        }
    }
    wants.extend(texts.iter().filter(|n| *n != key).map(|n| Want {
        name: n.clone(),
        role: Role::Text,
    }));
    wants.extend(rules.split_by.iter().filter(|n| **n != key).map(|n| Want {
        name: n.to_string(),
        role: Role::Split,
    }));
    wants
}

impl ContextPart {
    /// A context table spilled as `spill` (`rows` rows, no split column).
    pub fn of_spill(spill: SpillPart, rows: u64) -> ContextPart {
        ContextPart {
            spill,
            rows,
            split_values: Vec::new(),
        }
    }

    pub fn into_spill(self) -> SpillPart {
        self.spill
    }
}

/// Reads the context table in `files` (one CSV or Parquet file, or a list table's rows files)
/// and spills it into `buckets` in `dir`.
pub(crate) fn spill_context(
    (files, plain_key): (&[PathBuf], bool),
    wants: &[Want],
    split_by: Option<&str>,
    buckets: Buckets,
    budget: usize,
    (dir, name): (&Path, &str),
    phases: &Phases,
) -> Result<ContextPart> {
    let mut split_values = std::collections::BTreeSet::new();
    let (spill, rows) = if let [path] = files.iter().filter(|p| is_csv(p)).collect::<Vec<_>>()[..] {
        let table = read_csv(path, wants.to_vec())?;
        check_no_null_keys(&table, &wants[0].name)?;
        if let Some(col) = split_by.and_then(|s| table.column(s)) {
            if let Values::Str { dict, .. } = &col.values {
                split_values.extend(dict.iter().cloned());
            }
        }
        let rows = table.rows() as u64;
        (spill::spill_table(&table, buckets, dir, name)?, rows)
    } else {
        let mut inputs = read::open_all(files, wants, Table::Keyed)?;
        read::plain_key(&mut inputs.types, plain_key);
        let rows = *inputs.offsets.last().expect("one file");
        let to = SpillTo {
            dir,
            name,
            buckets,
            budget,
            in_memory: false,
        };
        let none = spill::KeyFilter::default();
        let part = spill::spill_rows(
            inputs,
            0..files.len(),
            wants,
            to,
            &none,
            &NoProgress,
            phases,
        )?;
        if let Some(column) = split_by {
            for path in files {
                split_values.extend(read::distinct_strings(path, column)?);
            }
        }
        (part, rows)
    };
    Ok(ContextPart {
        spill,
        rows,
        split_values: split_values.into_iter().collect(),
    })
}

impl ContextSide {
    /// The context table in `files` (named in messages by the first), spilled as `part` in
    /// `dir`.
    pub fn new(
        (files, lists, plain_key): (&[PathBuf], bool, bool),
        key: &str,
        wants: Vec<Want>,
        part: ContextPart,
        buckets: Buckets,
        dir: &Path,
    ) -> Result<ContextSide> {
        let (types, offsets) = match files {
            [path] if is_csv(path) => (
                wants.iter().map(|w| csv_type(w.role)).collect(),
                vec![0, part.rows],
            ),
            _ => {
                let mut inputs = read::open_all(files, &wants, Table::Keyed)?;
                read::plain_key(&mut inputs.types, plain_key);
                (inputs.types, inputs.offsets)
            }
        };
        let described = Described {
            files: files.to_vec(),
            offsets,
            types,
        };
        Ok(ContextSide {
            path: files[0].clone(),
            lists,
            key: key.into(),
            spill: Spill::from_parts(dir, vec![part.spill], buckets, described, wants),
            split_values: part.split_values,
        })
    }

    /// Bucket `b`'s context rows, indexed by key.
    pub fn load(&self, b: usize) -> Result<Keyed> {
        let table = self.spill.load(b)?;
        let index = KeyIndex::build(&table, &self.key)?;
        Ok(Keyed {
            path: self.path.clone(),
            key: self.key.clone(),
            table,
            index,
        })
    }

    /// The type of a column read from the context table.
    pub fn type_of(&self, name: &str) -> &TypeInfo {
        self.spill.type_of(name)
    }
}

/// The type a CSV column is read as, by its role.
fn csv_type(role: Role) -> TypeInfo {
    let info = |kind, name: &str, shown: &str| TypeInfo {
        kind,
        scale: 1.0,
        name: name.into(),
        shown: shown.into(),
        list: false,
        plain: false,
    };
    match role {
        Role::ContextKey { text: true } => info(Kind::Str, "Utf8", "string"),
        Role::Key | Role::ContextKey { .. } | Role::JoinOn => info(Kind::Int, "Int64", "int64"),
        Role::Categorical | Role::Split => info(Kind::Str, "Utf8", "string"),
        _ => info(Kind::F64, "Float64", "double"),
    }
}

/// Column names of a Parquet or CSV file, for resolving which table holds a column.
pub(crate) fn column_names(path: &Path) -> Result<Vec<String>> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
    {
        let mut reader = csv_reader(path)?;
        let headers = reader.headers().map_err(|e| csv_err(path, e))?;
        return Ok(headers.iter().map(str::to_string).collect());
    }
    let opened = read::open(path)?;
    Ok(opened
        .schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// A CSV reader of the file at `path`, or of the object at a URL (fetched whole: a lookup
/// table).
fn csv_reader(path: &Path) -> Result<csv::Reader<Box<dyn std::io::Read>>> {
    let source: Box<dyn std::io::Read> = if crate::remote::is_url(path) {
        Box::new(std::io::Cursor::new(crate::remote::get(path)?))
    } else {
        Box::new(std::fs::File::open(path).map_err(|e| CompileError::io(path, e))?)
    };
    Ok(csv::Reader::from_reader(source))
}

fn csv_err(path: &Path, e: csv::Error) -> CompileError {
    let reason = e.to_string();
    match e.into_kind() {
        csv::ErrorKind::Io(source) => CompileError::io(path, source),
        _ => CompileError::BadCsv {
            path: path.into(),
            reason,
        },
    }
}

/// Reads a CSV lookup table: integer key and join columns, numeric columns as Float64,
/// categorical columns as strings. Empty fields are null.
fn read_csv(path: &Path, wants: Vec<Want>) -> Result<RowsTable> {
    let mut reader = csv_reader(path)?;
    let headers = reader.headers().map_err(|e| csv_err(path, e))?.clone();
    read::check_unique(path, headers.iter(), &wants)?;
    let positions: Vec<usize> = wants
        .iter()
        .map(|w| {
            headers
                .iter()
                .position(|h| h == w.name)
                .ok_or_else(|| CompileError::MissingColumn {
                    path: path.into(),
                    column: w.name.clone(),
                    role: "a joined column".into(),
                    available: format!("columns {:?}", headers.iter().collect::<Vec<_>>()),
                })
        })
        .collect::<Result<_>>()?;
    let mut columns: Vec<Column> = wants
        .iter()
        .map(|w| Column::new(csv_type(w.role), 0))
        .collect();
    let mut ints: Vec<Vec<Option<i64>>> = vec![Vec::new(); wants.len()];
    let mut floats: Vec<Vec<Option<f64>>> = vec![Vec::new(); wants.len()];
    let mut strings: Vec<Vec<Option<String>>> = vec![Vec::new(); wants.len()];
    for (line, record) in reader.records().enumerate() {
        let record = record.map_err(|e| csv_err(path, e))?;
        for (i, (w, &pos)) in wants.iter().zip(&positions).enumerate() {
            let field = record.get(pos).unwrap_or("").trim();
            let bad = |expected: &str| CompileError::BadCsv {
                path: path.into(),
                reason: format!(
                    "line {}: column {:?} holds {field:?}, expected {expected}",
                    line + 2,
                    w.name
                ),
            };
            match columns[i].info.kind {
                Kind::Int => ints[i].push(if field.is_empty() {
                    None
                } else {
                    // A uint64 key past 2^63 is its bits, as the rows' uint64 keys are.
                    let int = field.parse::<i64>().ok();
                    let bits = || field.parse::<u64>().ok().map(|k| k as i64);
                    Some(int.or_else(bits).ok_or_else(|| bad("an integer"))?)
                }),
                Kind::Str => strings[i].push((!field.is_empty()).then(|| field.to_string())),
                _ => floats[i].push(if field.is_empty() {
                    None
                } else {
                    Some(field.parse().map_err(|_| bad("a number"))?)
                }),
            }
        }
    }
    let rows = ints
        .iter()
        .map(Vec::len)
        .chain(floats.iter().map(Vec::len))
        .chain(strings.iter().map(Vec::len))
        .max()
        .unwrap_or(0);
    if rows == 0 {
        return Err(CompileError::EmptyFile { path: path.into() });
    }
    for (i, col) in columns.iter_mut().enumerate() {
        let array: arrow_array::ArrayRef = match col.info.kind {
            Kind::Int => {
                std::sync::Arc::new(arrow_array::Int64Array::from(std::mem::take(&mut ints[i])))
            }
            Kind::Str => std::sync::Arc::new(arrow_array::StringArray::from(std::mem::take(
                &mut strings[i],
            ))),
            _ => std::sync::Arc::new(arrow_array::Float64Array::from(std::mem::take(
                &mut floats[i],
            ))),
        };
        col.push_array(&array);
        col.finish();
    }
    Ok(RowsTable {
        files: vec![path.into()],
        offsets: vec![0, rows as u64],
        columns,
        wants,
        origin: None,
        element_bits: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::test_tables;

    /// Two keys with one id (a hash collision, forced here by giving both the same id) are
    /// named as a collision, and one key twice as a repeated key.
    #[test]
    fn equal_ids_of_distinct_keys_are_a_collision_and_of_one_key_a_repeat() {
        let table = test_tables::string_keys("ctx.parquet", &["alpha", "beta", "alpha"], false);
        let err = KeyIndex::of_ids(&table, "k", &[7, 7, 9])
            .unwrap_err()
            .to_string();
        assert!(err.contains("keys \"alpha\" and \"beta\""), "{err}");
        assert!(err.contains("same 64-bit id"), "{err}");
        let err = KeyIndex::of_ids(&table, "k", &[7, 8, 7])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key \"alpha\" appears twice") && err.contains("row 0 and row 2"),
            "{err}"
        );
        assert!(KeyIndex::of_ids(&table, "k", &[7, 8, 9]).is_ok());
    }
}
