//! Which split each context belongs to: an explicit split the user already has (a column of the
//! context table, or files listing keys), then the seeded hash of the key carving `val` out of
//! `train` where `--val-fraction` asks for it. Encodings and statistics are fitted on `train`,
//! so every cache has one; the other splits are stored after it, in name order.

use crate::column::Values;
use crate::error::{CompileError, Result};
use crate::lookup::Keyed;
use dsc_format::rng::split_unit;
use dsc_format::CompileSpec;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// The split every statistic and encoding is fitted on.
pub(crate) const TRAIN: &str = "train";
/// The split `--val-fraction` carves out of `train`.
pub(crate) const VAL: &str = "val";
/// Split tags are bytes and one value marks dropped rows.
const MAX_SPLITS: usize = u8::MAX as usize;

/// The splits of a compile: their names in storage order (`train` first) and each context's
/// position in that list.
#[derive(Debug)]
pub(crate) struct Assignment {
    pub names: Vec<String>,
    pub of: Vec<u8>,
}

/// One context as the split assignment sees it.
pub(crate) struct Member {
    pub key: i64,
    /// Its row in the context table, where it has one.
    pub ctx_row: Option<u32>,
}

/// Assigns every context of `members` (ascending by key) to a split.
pub(crate) fn assign(
    spec: &CompileSpec,
    members: &[Member],
    context: Option<&Keyed>,
) -> Result<Assignment> {
    // Names borrowed from the spec, the context table or the constants: one per context, none
    // allocated.
    let mut explicit: Vec<&str> = match (&spec.split_by, spec.split_keys.is_empty()) {
        (Some(_), false) => {
            return Err(CompileError::Spec(
                "--split-by and --split-keys both assign splits: give one of them".into(),
            ))
        }
        (Some(column), true) => by_column(column, members, context)?,
        (None, false) => by_key_files(spec, members)?,
        (None, true) => vec![TRAIN; members.len()],
    };
    if spec.val_fraction > 0.0 {
        for (name, m) in explicit.iter_mut().zip(members) {
            if *name == TRAIN && split_unit(m.key, spec.split_seed) < spec.val_fraction {
                *name = VAL;
            }
        }
    }
    let mut others: BTreeSet<&str> = explicit.iter().copied().collect();
    if !others.remove(TRAIN) {
        let why = if spec.split_by.is_some() || !spec.split_keys.is_empty() {
            format!("the splits assigned are {others:?}")
        } else if members.is_empty() {
            "no context is left to store".to_string()
        } else {
            format!(
                "--val-fraction {} put every context in val",
                spec.val_fraction
            )
        };
        return Err(CompileError::Spec(format!(
            "no context is in the split {TRAIN:?}, which dsc fits encodings and statistics on: {why}"
        )));
    }
    // The hash split's `val` exists whenever asked for, even if no key fell into it.
    if spec.val_fraction > 0.0 {
        others.insert(VAL);
    }
    let names: Vec<String> = std::iter::once(TRAIN)
        .chain(others)
        .map(String::from)
        .collect();
    if names.len() > MAX_SPLITS {
        return Err(CompileError::Spec(format!(
            "{} splits; dsc stores at most {MAX_SPLITS}",
            names.len()
        )));
    }
    let position: HashMap<&str, u8> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u8))
        .collect();
    let of = explicit.iter().map(|n| position[n]).collect();
    Ok(Assignment { names, of })
}

/// A split name must name files and not be `all`: the reason it cannot, in a message.
fn check_name(name: &str) -> std::result::Result<(), String> {
    match dsc_format::manifest::split_name_problem(name) {
        Some(problem) => Err(format!("split name {name:?} {problem}")),
        None => Ok(()),
    }
}

fn by_column<'a>(
    column: &str,
    members: &[Member],
    context: Option<&'a Keyed>,
) -> Result<Vec<&'a str>> {
    let ctx = context.ok_or_else(|| {
        CompileError::Spec("--split-by reads a column of the context table: give --context".into())
    })?;
    let col = ctx
        .column(column)
        .expect("the split column is read with the context");
    let Values::Str { codes, dict, .. } = &col.values else {
        unreachable!("the split column is read as strings")
    };
    let null = |row: u32| col.valid.as_ref().is_some_and(|v| !v[row as usize]);
    members
        .iter()
        .map(|m| {
            let Some(row) = m.ctx_row else {
                return Err(CompileError::Spec(format!(
                    "key {}: no row in the context table {}, so no split (--split-by {column})",
                    m.key,
                    ctx.path.display()
                )));
            };
            let (path, file_row) = ctx.table.locate(row as usize);
            let bad = |what: String| CompileError::BadValue {
                path: path.into(),
                column: column.into(),
                row: file_row,
                what: format!("key {}: {what}", m.key),
            };
            if null(row) {
                return Err(bad("the split is null; every context needs one".into()));
            }
            let name = dict[codes[row as usize] as usize].as_str();
            check_name(name).map_err(bad)?;
            Ok(name)
        })
        .collect()
}

fn by_key_files<'a>(spec: &'a CompileSpec, members: &[Member]) -> Result<Vec<&'a str>> {
    let mut names = vec![TRAIN; members.len()];
    // Where each listed key was listed, to name both places of a key listed twice.
    let mut listed: HashMap<i64, (&str, usize)> = HashMap::new();
    for (name, file) in &spec.split_keys {
        let path = Path::new(file);
        check_name(name).map_err(|reason| CompileError::Spec(format!("--split-keys: {reason}")))?;
        for (key, line) in read_key_list(path)? {
            if let Some(&(other, other_line)) = listed.get(&key) {
                let reason = if other == name {
                    format!("line {line}: key {key} is listed twice (also line {other_line})")
                } else {
                    format!(
                        "line {line}: key {key} is also listed for split {other:?} \
                         ({} line {other_line}); a context is in one split",
                        spec.split_keys[other]
                    )
                };
                return Err(CompileError::BadCsv {
                    path: path.into(),
                    reason,
                });
            }
            // Members are ascending by key.
            let Ok(i) = members.binary_search_by_key(&key, |m| m.key) else {
                return Err(CompileError::BadCsv {
                    path: path.into(),
                    reason: format!(
                        "line {line}: key {key} (split {name:?}) is not a context of the data"
                    ),
                });
            };
            listed.insert(key, (name, line));
            names[i] = name;
        }
    }
    Ok(names)
}

/// Reads a file of integer keys, one per line (blank lines and `#` comments skipped): each key
/// with its line number.
pub(crate) fn read_key_list(path: &Path) -> Result<Vec<(i64, usize)>> {
    let text = std::fs::read_to_string(path).map_err(|e| CompileError::io(path, e))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let k: i64 = t.parse().map_err(|_| CompileError::BadCsv {
            path: path.into(),
            reason: format!(
                "line {}: {t:?} is not an integer key (the file lists one key per line)",
                i + 1
            ),
        })?;
        keys.push((k, i + 1));
    }
    Ok(keys)
}
