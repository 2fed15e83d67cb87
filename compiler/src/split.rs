//! Which split each context belongs to: an explicit split the user already has (a column of the
//! context table, or files listing keys), then the seeded hash of the key carving `val` out of
//! `train` where `--val-fraction` asks for it. Encodings and statistics are fitted on `train`,
//! so every cache has one; the other splits are stored after it, in name order.

use crate::column::Values;
use crate::error::{CompileError, Result};
use crate::lookup::{ContextSide, Keyed};
use crate::rules::SplitRules;
use dsc_format::keys::KeyType;
use dsc_format::rng::split_unit;
use dsc_format::spelling::OptionError;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

/// The split every statistic and encoding is fitted on.
pub(crate) const TRAIN: &str = "train";
/// The split `--val-fraction` carves out of `train`.
pub(crate) const VAL: &str = "val";
/// Split tags are bytes and one value marks dropped rows.
const MAX_SPLITS: usize = u8::MAX as usize;

/// The splits of a compile, decided before any row is grouped so that every bucket of the
/// input agrees on them: their names in storage order (`train` first) and the rule that puts a
/// context in one.
pub(crate) struct Splits<'a> {
    pub names: Vec<String>,
    rule: Rule<'a>,
    val_fraction: f64,
    split_seed: u64,
    /// Where `train` and `val` are in `names`.
    train: u8,
    val: Option<u8>,
}

enum Rule<'a> {
    /// Every context is in train (before `--val-fraction`).
    Train,
    /// A string column of the context table; each valid name's split.
    Column {
        name: &'a str,
        split_of: HashMap<String, u8>,
    },
    /// Keys listed in files, by id: split, file, line and the key as written.
    Keys(HashMap<i64, Listed<'a>>),
}

/// Where a key file lists a key: split, file, line, and the key as the line writes it.
type Listed<'a> = (u8, &'a str, usize, String);

/// Decides the splits of `spec`: reads key files (and checks them), or the split column's values.
/// `key_type` turns a key file's lines into key ids.
pub(crate) fn plan<'a>(
    spec: &SplitRules<'a>,
    key_type: KeyType,
    context: Option<&ContextSide>,
) -> Result<Splits<'a>> {
    let mut others: BTreeSet<String> = BTreeSet::new();
    let rule = match (spec.split_by, spec.split_keys.is_empty()) {
        (Some(_), false) => {
            return Err(OptionError::new(
                "split_by",
                "and `split_keys` both assign splits: give one of them",
            )
            .into())
        }
        (Some(column), true) => {
            let ctx = context.ok_or_else(|| {
                OptionError::new(
                    "split_by",
                    "reads a column of the context table: give `context`",
                )
            })?;
            others.extend(
                ctx.split_values
                    .iter()
                    .filter(|n| check_name(n).is_ok())
                    .cloned(),
            );
            Rule::Column {
                name: column,
                split_of: HashMap::new(),
            }
        }
        (None, false) => {
            for name in spec.split_keys.keys() {
                check_name(name)
                    .map_err(|reason| OptionError::new("split_keys", format!("name {reason}")))?;
                others.insert(name.clone());
            }
            Rule::Keys(HashMap::new())
        }
        (None, true) => Rule::Train,
    };
    others.insert(TRAIN.into());
    if spec.val_fraction > 0.0 {
        others.insert(VAL.into());
    }
    others.remove(TRAIN);
    let names: Vec<String> = std::iter::once(TRAIN.to_string()).chain(others).collect();
    if names.len() > MAX_SPLITS {
        return Err(OptionError::new(
            "split_keys",
            format!(
                "and `split_by` give {} splits; dsc stores at most {MAX_SPLITS}",
                names.len()
            ),
        )
        .into());
    }
    let position = |n: &str| names.iter().position(|x| x == n).map(|p| p as u8);
    let rule = match rule {
        Rule::Column { name, .. } => {
            let split_of = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u8))
                .collect();
            Rule::Column { name, split_of }
        }
        Rule::Keys(_) => Rule::Keys(read_key_files(spec, key_type, &position)?),
        Rule::Train => Rule::Train,
    };
    Ok(Splits {
        train: 0,
        val: (spec.val_fraction > 0.0).then(|| position(VAL)).flatten(),
        names,
        rule,
        val_fraction: spec.val_fraction,
        split_seed: spec.split_seed,
    })
}

fn read_key_files<'a>(
    spec: &SplitRules<'a>,
    key_type: KeyType,
    position: &dyn Fn(&str) -> Option<u8>,
) -> Result<HashMap<i64, Listed<'a>>> {
    let mut listed: HashMap<i64, Listed<'a>> = HashMap::new();
    for (name, file) in spec.split_keys {
        let path = Path::new(file);
        let split = position(name).expect("every key file names a split");
        for (id, line, key) in read_key_list(path, key_type)? {
            if let Some((other, other_file, other_line, other_key)) = listed.get(&id) {
                let (other, other_file, other_line) = (*other, *other_file, *other_line);
                if *other_key != key {
                    return Err(CompileError::KeyCollision {
                        path: path.into(),
                        column: format!("key file line {line}"),
                        first: other_key.clone(),
                        second: key,
                    });
                }
                let reason = if other == split {
                    format!("key {key} is listed twice (also line {other_line})")
                } else {
                    let other_name = spec
                        .split_keys
                        .iter()
                        .find(|(_, f)| f.as_str() == other_file)
                        .map_or("?", |(n, _)| n.as_str());
                    format!(
                        "key {key} is also listed for split {other_name:?} ({other_file} line \
                         {other_line}); a context is in one split"
                    )
                };
                return Err(CompileError::KeyList {
                    path: path.into(),
                    line,
                    what: reason,
                });
            }
            listed.insert(id, (split, file.as_str(), line, key));
        }
    }
    Ok(listed)
}

impl Splits<'_> {
    /// The split of the context of id `key` (`shown`: the key as its user knows it, for
    /// messages), with its row in (its bucket of) the context table.
    pub fn of(
        &self,
        key: i64,
        shown: &dyn Fn() -> String,
        ctx: Option<(&Keyed, Option<u32>)>,
    ) -> Result<u8> {
        let s = match &self.rule {
            Rule::Train => self.train,
            Rule::Keys(listed) => listed.get(&key).map_or(self.train, |l| l.0),
            Rule::Column {
                name: column,
                split_of,
            } => {
                let (ctx, ctx_row) = ctx.expect("--split-by needs the context table");
                let col = ctx.column(column).expect("read");
                let Values::Str { codes, dict, .. } = &col.values else {
                    unreachable!("the split column is read as strings")
                };
                let Some(row) = ctx_row else {
                    return Err(CompileError::NoSplit {
                        context: ctx.path.clone(),
                        key: shown(),
                        column: column.to_string(),
                    });
                };
                let (path, file_row) = ctx.table.locate(row as usize);
                let bad = |what: String| CompileError::BadSplit {
                    path: path.into(),
                    column: column.to_string(),
                    row: file_row,
                    what: format!("key {}: {what}", shown()),
                };
                if !col.is_valid(row as usize) {
                    return Err(bad("the split is null; every context needs one".into()));
                }
                let name = &dict[codes[row as usize] as usize];
                match split_of.get(name) {
                    Some(&s) => s,
                    None => return Err(bad(check_name(name).expect_err("refused"))),
                }
            }
        };
        Ok(match self.val {
            Some(val)
                if s == self.train && split_unit(key, self.split_seed) < self.val_fraction =>
            {
                val
            }
            _ => s,
        })
    }

    /// Keys listed in key files, to check that each is a context of the data.
    pub fn is_listed(&self, key: i64) -> bool {
        matches!(&self.rule, Rule::Keys(l) if l.contains_key(&key))
    }

    /// Checks what only the whole input shows: `train` holds contexts, and every listed key was
    /// found (`found`: the listed keys that are contexts).
    /// `frozen`: the encodings come from another cache, so train may be empty and a key file
    /// may list keys of that cache's data rather than of this input.
    pub fn check(
        &self,
        contexts: &[u64],
        found: &HashSet<i64>,
        total: u64,
        frozen: bool,
    ) -> Result<()> {
        if frozen {
            return Ok(());
        }
        if let Rule::Keys(listed) = &self.rule {
            let mut missing: Vec<(&str, usize, &str, u8)> = listed
                .iter()
                .filter(|(k, _)| !found.contains(k))
                .map(|(_, (s, file, line, key))| (*file, *line, key.as_str(), *s))
                .collect();
            missing.sort_unstable();
            if let Some(&(file, line, key, s)) = missing.first() {
                return Err(CompileError::KeyList {
                    path: file.into(),
                    line,
                    what: format!(
                        "key {key} (split {:?}) is not a context of the data",
                        self.names[s as usize]
                    ),
                });
            }
        }
        if contexts[self.train as usize] == 0 {
            let present: Vec<&str> = self
                .names
                .iter()
                .zip(contexts)
                .filter(|(_, &c)| c > 0)
                .map(|(n, _)| n.as_str())
                .collect();
            let why = if !matches!(self.rule, Rule::Train) {
                format!("the splits assigned are {present:?}")
            } else if total == 0 {
                "no context is left to store".to_string()
            } else {
                format!(
                    "`val_fraction={}` put every context in val",
                    self.val_fraction
                )
            };
            return Err(CompileError::NoTrain { why });
        }
        Ok(())
    }
}

/// A split name must name files and not be `all`: the reason it cannot, in a message.
fn check_name(name: &str) -> std::result::Result<(), String> {
    match dsc_format::manifest::split_name_problem(name) {
        Some(problem) => Err(format!("split name {name:?} {problem}")),
        None if name.len() > dsc_format::manifest::MAX_SPLIT_NAME => Err(format!(
            "split name {name:?} is longer than {} characters (it becomes part of the shard \
             file names, which file systems limit)",
            dsc_format::manifest::MAX_SPLIT_NAME
        )),
        None => Ok(()),
    }
}

/// Reads a file of keys, written as `key_type`'s keys are (integers, strings, UUIDs, hex for
/// binary): each key's id, line number and text. Two spellings, so that every key can be
/// listed:
///
/// - **lines** (any file name but `.jsonl`/`.json`): one key per line, the line exactly as the
///   key column holds it. Nothing is trimmed from a string key and `#` is a character like
///   any other (no comments), so `" lead"` and `#x` are keys; a `\r` before the line's `\n`
///   is its line ending. Integer, UUID and binary keys may stand between spaces, and blank
///   lines are skipped: none of their keys is blank. An empty line of string keys is refused,
///   naming it: it would be the empty string, which only JSON lines spell unambiguously.
/// - **JSON lines** (`.jsonl`, `.json`): each line one JSON string or integer, so a key with
///   leading spaces, a line break or no characters at all is `"…"` there; blank lines are
///   skipped.
///
/// A file that lists no key is refused: a split asked for would be empty.
pub(crate) fn read_key_list(path: &Path, key_type: KeyType) -> Result<Vec<(i64, usize, String)>> {
    // A key file takes a URL wherever rows do.
    let text = match crate::remote::is_url(path) {
        true => String::from_utf8(crate::remote::get(path)?).map_err(|e| {
            CompileError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
            )
        })?,
        false => std::fs::read_to_string(path).map_err(|e| CompileError::io(path, e))?,
    };
    let json = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("jsonl" | "json")
    );
    let mut keys = Vec::new();
    // `split('\n')` rather than `lines()`: a `\r` ending a line is removed explicitly, and
    // only the empty piece after the file's last line ending is no line.
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    for (i, line) in lines.into_iter().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let bad = |problem: String| CompileError::KeyList {
            path: path.into(),
            line: i + 1,
            what: problem,
        };
        let written = if json {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::String(s)) => s,
                Ok(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                _ => {
                    return Err(bad(format!(
                        "{line:?} is not a JSON string or integer; a .jsonl key file lists one \
                         key per line as JSON (\"C-17\", 42)"
                    )))
                }
            }
        } else if key_type == KeyType::Text {
            if line.is_empty() {
                return Err(bad(
                    "an empty line: in a key file of string keys each line is a key as the \
                     column holds it, and the empty string is listed as \"\" in a JSON lines \
                     file (.jsonl)"
                        .into(),
                ));
            }
            line.to_string()
        } else {
            if line.trim().is_empty() {
                continue;
            }
            line.trim().to_string()
        };
        let spelling = if json {
            "a .jsonl key file lists one key per line as JSON"
        } else {
            "the file lists one key per line, as the key column holds it"
        };
        let key = key_type
            .canonical(&written)
            .map_err(|p| bad(format!("{p}; {spelling}")))?;
        let id = key_type
            .id_of(&key)
            .map_err(|p| bad(format!("{p}; {spelling}")))?;
        keys.push((id, i + 1, key));
    }
    if keys.is_empty() {
        return Err(CompileError::KeyList {
            path: path.into(),
            line: 0,
            what: "lists no key, so the split it names would be empty; list one key per line"
                .into(),
        });
    }
    Ok(keys)
}
