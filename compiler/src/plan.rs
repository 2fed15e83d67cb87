//! Checking a spec and deciding where each column comes from, before any data is read.

use crate::error::{CompileError, Result};
use crate::lookup;
use crate::read::{self, Role, Want};
use dsc_format::spec::CompileSpec;
use dsc_format::spelling::OptionError;
use dsc_format::Stage;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Where a per-row column lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Rows,
    /// Index into `Plan::joins`.
    Join(usize),
}

/// A per-row column to store.
#[derive(Debug, Clone)]
pub(crate) struct RowColumn {
    pub name: String,
    pub source: Source,
    pub categorical: bool,
    /// A target of a table of records (stored in `y`, after the features).
    pub target: bool,
    /// Its encoding chain, parsed once here (empty for a categorical column).
    pub chain: Vec<Step>,
}

/// A column of the context table to store: a target or a context feature.
#[derive(Debug, Clone)]
pub(crate) struct ContextColumn {
    pub name: String,
    pub target: bool,
    pub chain: Vec<Step>,
}

/// Where a string column encoded to a fixed width lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextSource {
    Rows,
    /// Index into `Plan::joins`.
    Join(usize),
    Context,
}

/// A string column encoded to a fixed width per row, stored as its own tensor.
#[derive(Debug, Clone)]
pub(crate) struct TextColumn {
    pub name: String,
    pub source: TextSource,
    pub encoding: TextEncoding,
}

/// The resolved inputs of a compile.
#[derive(Debug)]
pub(crate) struct Plan {
    pub rows_files: Vec<PathBuf>,
    /// Features, then a table of records' targets, then categorical columns.
    pub row_columns: Vec<RowColumn>,
    /// Join files with the wanted columns of each.
    pub joins: Vec<(PathBuf, String, Vec<Want>)>,
    /// Rows-table columns to read, key first.
    pub rows_wants: Vec<Want>,
    /// Targets, then context features.
    pub context_columns: Vec<ContextColumn>,
    /// String columns encoded to a fixed width: the rows table's (and joins') first, then the
    /// context table's.
    pub text_columns: Vec<TextColumn>,
    /// A table of records (no `key`): every row its own context, stored without a step axis.
    pub records: bool,
    /// Where the context table is read from: `context`, or, for a rows table whose sequences
    /// are list columns and no `context`, the rows files themselves (each row one context, its
    /// own columns the targets and context features); `None` without a context table.
    pub context_files: Option<Vec<PathBuf>>,
}

/// The longest sequence a cache may pad to: lengths are stored as i32, and one padded context
/// must stay far below any shard size.
pub(crate) const MAX_LEN: usize = 1 << 24;

/// One step of an encoding chain as the spec names it, before any statistic is known: the
/// fitted steps carry no parameters until `fit` turns the chain into the manifest's [`Stage`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Identity,
    Log1p,
    Zscore,
    Minmax,
}

impl Step {
    /// Whether the step is fitted on the train split's statistics.
    pub fn is_fitted(self) -> bool {
        matches!(self, Step::Zscore | Step::Minmax)
    }

    /// The stage of a step that needs no statistics; `None` for a fitted one.
    pub fn unfitted_stage(self) -> Option<Stage> {
        match self {
            Step::Identity => Some(Stage::Identity),
            Step::Log1p => Some(Stage::Log1p),
            Step::Zscore | Step::Minmax => None,
        }
    }

    /// Its name in a chain.
    pub fn name(self) -> &'static str {
        match self {
            Step::Identity => "identity",
            Step::Log1p => "log1p",
            Step::Zscore => "zscore",
            Step::Minmax => "minmax",
        }
    }
}

/// The longest n-gram: grams longer than a word are shared by too few rows to be worth a
/// vocabulary slot, and each distinct string's grams are held while it is counted (up to `N`
/// characters per position: `ngrams:30000` of three 60,000-character strings held 5.9 GB).
/// The vocabulary's count of distinct grams itself is not bounded by `max_memory`.
pub(crate) const MAX_GRAM: usize = 16;

/// A string column's fixed-width encoding, as the spec names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextEncoding {
    Bits,
    Chars(usize),
    Ngrams(usize),
}

impl TextEncoding {
    /// The encoding `value` of `column` names, if it is one of these (`None`: a numeric chain).
    pub fn parse(column: &str, value: &str) -> Result<Option<TextEncoding>> {
        let v = value.trim();
        let width = |w: &str, what: &str, most: usize| -> Result<usize> {
            match w.parse::<usize>() {
                Ok(n) if (1..=most).contains(&n) && w.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
                _ => Err(OptionError::new(
                    "encode",
                    format!(
                        "{column}={value}: {what} must be a whole number from 1 to {most}, got \
                         {w:?}"
                    ),
                )
                .into()),
            }
        };
        Ok(Some(match v {
            "bits" => TextEncoding::Bits,
            "chars" | "ngrams" => {
                return Err(OptionError::new(
                    "encode",
                    format!(
                        "{column}={value}: give the {}: {v}:{}",
                        if v == "chars" { "width" } else { "gram length" },
                        if v == "chars" { "W" } else { "N" }
                    ),
                )
                .into())
            }
            _ => match (v.strip_prefix("chars:"), v.strip_prefix("ngrams:")) {
                (Some(w), _) => TextEncoding::Chars(width(w, "the width", 1 << 16)?),
                (_, Some(n)) => TextEncoding::Ngrams(width(n, "the gram length", MAX_GRAM)?),
                _ => return Ok(None),
            },
        }))
    }
}

/// Parses an encoding chain such as `log1p,zscore` into its steps.
pub(crate) fn parse_chain(column: &str, chain: &str) -> Result<Vec<Step>> {
    chain
        .split(',')
        .map(|s| match s.trim() {
            "identity" => Ok(Step::Identity),
            "log1p" => Ok(Step::Log1p),
            "zscore" => Ok(Step::Zscore),
            "minmax" => Ok(Step::Minmax),
            other => Err(OptionError::new(
                "encode",
                format!(
                    "{column}={chain}: the encoding {other:?} is unknown (identity, zscore, \
                     minmax, log1p, or a chain such as log1p,zscore)"
                ),
            )
            .into()),
        })
        .collect()
}

fn check_unique(key: &'static str, names: &[String]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(OptionError::new(key, format!("lists column {n:?} twice")).into());
        }
    }
    Ok(())
}

/// The smallest `bucket_size`: a bucket is the unit the input is spilled and processed in,
/// and at one byte the compile split a small input into 2^20 buckets and ran for minutes at
/// gigabytes of memory (the same input compiles in 0.4 s by default).
pub(crate) const MIN_BUCKET_SIZE: u64 = 4 << 10;

/// Refuses a bucket size below [`MIN_BUCKET_SIZE`].
pub(crate) fn check_bucket_size(spec: &CompileSpec) -> Result<()> {
    match spec.bucket_size {
        Some(b) if b < MIN_BUCKET_SIZE => Err(OptionError::new(
            "bucket_size",
            format!(
                "{b} bytes: at least 4KiB (a bucket is the unit the input is spilled and \
                 processed in; the default is 32MiB)"
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// Validates the spec and resolves every column to its table: the options checked against each
/// other, the encodings parsed, the tables opened, then the row columns, the string columns
/// and the rows table's reads, each by its own function.
pub(crate) fn plan(spec: &CompileSpec) -> Result<Plan> {
    let records = check(spec)?;
    let (encodings, texts) = encodings(spec)?;
    let rows_files = read::resolve(&spec.rows)?;
    let first = read::open(&rows_files[0])?;
    let tables = Tables {
        rows_names: first
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
        join_names: join_names(spec)?,
        rows_files: &rows_files,
        first: &first,
    };
    // Each chain parsed once, in `encodings`; a column without one is stored as it is.
    let chain_of = |name: &str| {
        encodings
            .get(name)
            .cloned()
            .unwrap_or_else(|| vec![Step::Identity])
    };
    let mut joins: Vec<(PathBuf, String, Vec<Want>)> = spec
        .joins
        .iter()
        .zip(&tables.join_names)
        .map(|(j, (p, _))| (p.clone(), j.on.clone(), Vec::new()))
        .collect();
    let lists = has_lists(spec, &first);
    if records && lists {
        return Err(OptionError::new(
            "key",
            "is needed: the rows hold their sequences as list columns, one row per sequence; \
             give `key`, the column naming each row's context",
        )
        .into());
    }
    let context_files = context_files(spec, records, lists, &rows_files)?;
    let row_columns = row_columns(spec, records, &tables, &chain_of, &mut joins)?;
    let text_columns = text_columns(spec, texts, &tables, lists, &mut joins)?;
    let rows_wants = rows_wants(spec, records, &row_columns, &text_columns, &first)?;
    Ok(Plan {
        rows_files,
        row_columns,
        joins,
        rows_wants,
        context_columns: spec
            .targets
            .iter()
            .filter(|_| !records)
            .map(|n| (n, true))
            .chain(spec.context_features.iter().map(|n| (n, false)))
            .map(|(name, target)| ContextColumn {
                name: name.clone(),
                target,
                chain: chain_of(name),
            })
            .collect(),
        text_columns,
        records,
        context_files,
    })
}

/// Where the context table is read from ([`Plan::context_files`]); refuses targets, context
/// features and a split column without one.
fn context_files(
    spec: &CompileSpec,
    records: bool,
    lists: bool,
    rows_files: &[PathBuf],
) -> Result<Option<Vec<PathBuf>>> {
    if let Some(c) = &spec.context {
        return Ok(Some(vec![PathBuf::from(c)]));
    }
    if lists {
        return Ok(Some(rows_files.to_vec()));
    }
    let per_context = !(spec.targets.is_empty() && spec.context_features.is_empty());
    if !records && per_context {
        let key = if spec.targets.is_empty() {
            "context_features"
        } else {
            "targets"
        };
        return Err(OptionError::new(
            key,
            "needs a context table (`context`): targets and context features are per context, \
             read from a table with one row per key (or the row itself, where the sequences \
             are list columns); to store a table's own columns as targets, compile it without \
             `key` (each row a sample)",
        )
        .into());
    }
    if spec.split_by.is_some() {
        return Err(OptionError::new(
            "split_by",
            "reads a column of the context table: give `context`",
        )
        .into());
    }
    Ok(None)
}

/// Whether the rows table holds its sequences as list columns: a column the spec names is a
/// list in `first` (a target named that is a list is then refused as one, not as a column of a
/// missing context table).
fn has_lists(spec: &CompileSpec, first: &read::Opened) -> bool {
    let named = spec
        .features
        .iter()
        .chain(&spec.categorical)
        .chain(spec.order_by.iter())
        .chain(spec.joins.iter().map(|j| &j.on))
        .chain(spec.encode.keys())
        .chain(&spec.targets)
        .chain(&spec.context_features);
    named
        .filter_map(|name| first.schema.field_with_name(name).ok())
        .any(|f| crate::column::classify(f.data_type()).is_some_and(|t| t.list))
}

/// The rows table and the join tables as the columns are resolved against them.
struct Tables<'a> {
    rows_files: &'a [PathBuf],
    /// The first rows file, whose schema every rows file shares.
    first: &'a read::Opened,
    rows_names: BTreeSet<String>,
    /// Each join file with its column names.
    join_names: Vec<(PathBuf, Vec<String>)>,
}

/// The spec's options checked against each other, before any file is opened; whether the rows
/// are a table of records (no `key`).
fn check(spec: &CompileSpec) -> Result<bool> {
    if spec.rows.is_empty() {
        return Err(OptionError::new("rows", "names no files").into());
    }
    if spec.ngram_vocab == Some(0) {
        return Err(OptionError::new(
            "ngram_vocab",
            "0 keeps no gram: give at least 1 (the default keeps 4096)",
        )
        .into());
    }
    if spec.max_len == Some(0) {
        return Err(OptionError::new("max_len", "must be at least 1").into());
    }
    if spec.max_len.is_some_and(|l| l > MAX_LEN) {
        return Err(OptionError::new(
            "max_len",
            format!(
                "{} is above the largest supported length {MAX_LEN}",
                spec.max_len.unwrap_or_default()
            ),
        )
        .into());
    }
    if !(0.0..1.0).contains(&spec.val_fraction) {
        return Err(OptionError::new(
            "val_fraction",
            format!("must be in [0, 1), got {}", spec.val_fraction),
        )
        .into());
    }
    if spec.shard_size == 0 {
        return Err(OptionError::new("shard_size", "must be positive").into());
    }
    check_bucket_size(spec)?;
    let records = spec.key.is_empty();
    if records {
        check_records(spec)?;
    }
    check_unique("features", &spec.features)?;
    check_unique("categorical", &spec.categorical)?;
    check_unique("targets", &spec.targets)?;
    check_unique("context_features", &spec.context_features)?;
    if let Some(column) = &spec.split_by {
        if column == spec.context_key() {
            return Err(OptionError::new(
                "split_by",
                format!("{column}: the split column cannot be the key; name each context's split in a column of its own"),
            )
            .into());
        }
        if spec.targets.contains(column) || spec.context_features.contains(column) {
            return Err(OptionError::new(
                "split_by",
                format!("{column}: the split column cannot also be a target or context feature"),
            )
            .into());
        }
    }
    if let Some(both) = spec.features.iter().find(|f| spec.categorical.contains(f)) {
        return Err(OptionError::new(
            "categorical",
            format!("and `features` both list column {both:?}"),
        )
        .into());
    }
    for name in &spec.categorical {
        if ["key", "x", "length", "full_length", "y", "c"].contains(&name.as_str()) {
            return Err(OptionError::new(
                "categorical",
                format!(
                    "column {name:?} would be stored as tensor {name:?}, a name dsc reserves \
                     (key, x, length, full_length, y, c); rename the column"
                ),
            )
            .into());
        }
    }
    Ok(records)
}

/// Each numeric column's encoding chain, and each string column encoded to a fixed width.
type Encodings = (BTreeMap<String, Vec<Step>>, Vec<(String, TextEncoding)>);

/// Each numeric column's encoding chain, parsed once, and the string columns encoded to a
/// fixed width; refuses a spec with nothing to store.
fn encodings(spec: &CompileSpec) -> Result<Encodings> {
    let mut encodings = BTreeMap::new();
    let mut texts: Vec<(String, TextEncoding)> = Vec::new();
    for (column, chain) in &spec.encode {
        if let Some(text) = TextEncoding::parse(column, chain)? {
            check_text_column(spec, column, chain)?;
            texts.push((column.clone(), text));
            continue;
        }
        let numeric = spec.features.contains(column)
            || spec.targets.contains(column)
            || spec.context_features.contains(column);
        if !numeric {
            return Err(OptionError::new(
                "encode",
                format!(
                    "{column}={chain}: {column:?} is not a feature, target or context feature{}",
                    if spec.categorical.contains(column) {
                        " (categorical columns are always coded)"
                    } else {
                        ""
                    }
                ),
            )
            .into());
        }
        encodings.insert(column.clone(), parse_chain(column, chain)?);
    }
    // A string column encoded to its own tensor is something to store too (a Bloom filter and
    // a label, a DNA string per step); checked once the encodings are parsed, so that a
    // misspelt one is reported as itself.
    if spec.features.is_empty() && spec.categorical.is_empty() && texts.is_empty() {
        return Err(OptionError::new(
            "features",
            "and `categorical` are both empty and `encode` encodes no string column: nothing \
             to store; give any of them",
        )
        .into());
    }
    Ok((encodings, texts))
}

/// Each join file with its column names, its join column checked.
fn join_names(spec: &CompileSpec) -> Result<Vec<(PathBuf, Vec<String>)>> {
    let mut join_names = Vec::new();
    for j in &spec.joins {
        let path = PathBuf::from(&j.file);
        let names = lookup::column_names(&path)?;
        if !names.contains(&j.on) {
            return Err(CompileError::MissingColumn {
                path,
                column: j.on.clone(),
                role: "the join column".into(),
                available: format!("columns {names:?}"),
            });
        }
        join_names.push((path, names));
    }
    Ok(join_names)
}

/// The per-row columns to store (features, a table of records' targets, categorical columns),
/// each found in the rows table or in exactly one join, whose wants it adds to.
fn row_columns(
    spec: &CompileSpec,
    records: bool,
    t: &Tables<'_>,
    chain_of: &dyn Fn(&str) -> Vec<Step>,
    joins: &mut [(PathBuf, String, Vec<Want>)],
) -> Result<Vec<RowColumn>> {
    let mut row_columns = Vec::new();
    // A table of records reads its targets from its own rows (there is no context table).
    let row_targets = if records { &spec.targets[..] } else { &[] };
    let requested = spec
        .features
        .iter()
        .map(|f| (f, false, false))
        .chain(row_targets.iter().map(|t| (t, false, true)))
        .chain(spec.categorical.iter().map(|c| (c, true, false)));
    for (name, categorical, target) in requested {
        let in_rows = t.rows_names.contains(name);
        let in_join: Vec<usize> = t
            .join_names
            .iter()
            .enumerate()
            .filter(|(i, (_, names))| names.contains(name) && spec.joins[*i].on != *name)
            .map(|(i, _)| i)
            .collect();
        let source = match (in_rows, in_join.as_slice()) {
            (true, []) => Source::Rows,
            (false, [j]) => Source::Join(*j),
            (false, []) => {
                return Err(CompileError::MissingColumn {
                    path: t.rows_files[0].clone(),
                    column: name.clone(),
                    role: if categorical {
                        "a categorical column"
                    } else if target {
                        "a target"
                    } else {
                        "a feature"
                    }
                    .into(),
                    available: format!(
                        "{}{}",
                        read::column_list(&t.first.schema),
                        if spec.joins.is_empty() {
                            String::new()
                        } else {
                            " and no join file has it either".into()
                        }
                    ),
                })
            }
            (_, _) => {
                return Err(OptionError::new(
                    "joins",
                    format!(
                        "give column {name:?} more than once (the rows files and join files); \
                         rename it in one"
                    ),
                )
                .into())
            }
        };
        let role = if categorical {
            Role::Categorical
        } else {
            Role::Numeric
        };
        if let Source::Join(j) = source {
            joins[j].2.push(Want {
                name: name.clone(),
                role,
            });
        }
        row_columns.push(RowColumn {
            name: name.clone(),
            source,
            categorical,
            target,
            chain: if categorical {
                Vec::new()
            } else {
                chain_of(name)
            },
        });
    }
    Ok(row_columns)
}

/// The string columns encoded to a fixed width, each from the rows table, a join, or else the
/// context table: the rows' first, the context table's after (the tensor order).
fn text_columns(
    spec: &CompileSpec,
    texts: Vec<(String, TextEncoding)>,
    t: &Tables<'_>,
    lists: bool,
    joins: &mut [(PathBuf, String, Vec<Want>)],
) -> Result<Vec<TextColumn>> {
    // In a list table without `context`, a string that is one value per row is its context's.
    let is_list = |name: &str| {
        t.first
            .schema
            .field_with_name(name)
            .ok()
            .and_then(|f| crate::column::classify(f.data_type()))
            .is_some_and(|t| t.list)
    };
    // A string column comes from the rows table, or a join, or else the context table.
    let mut text_columns = Vec::new();
    for (name, encoding) in texts {
        let in_join = t
            .join_names
            .iter()
            .position(|(_, names)| names.contains(&name));
        let source = if t.rows_names.contains(&name)
            && !(lists && spec.context.is_none() && !is_list(&name))
        {
            TextSource::Rows
        } else if lists && spec.context.is_none() && t.rows_names.contains(&name) {
            TextSource::Context
        } else if let Some(j) = in_join {
            joins[j].2.push(Want {
                name: name.clone(),
                role: Role::Text,
            });
            TextSource::Join(j)
        } else if spec.context.is_some() {
            TextSource::Context
        } else {
            return Err(CompileError::MissingColumn {
                path: t.rows_files[0].clone(),
                column: name,
                role: "a string column to encode".into(),
                available: read::column_list(&t.first.schema),
            });
        };
        text_columns.push(TextColumn {
            name,
            source,
            encoding,
        });
    }
    // The rows' string columns first, the context table's after (the tensor order).
    text_columns.sort_by_key(|t| t.source == TextSource::Context);
    Ok(text_columns)
}

/// The rows table's columns to read, key first, each type checked against every role it
/// serves.
fn rows_wants(
    spec: &CompileSpec,
    records: bool,
    row_columns: &[RowColumn],
    text_columns: &[TextColumn],
    first: &read::Opened,
) -> Result<Vec<Want>> {
    // A table of records is keyed by row numbers the reader makes (named "": no column).
    let mut rows_wants = vec![Want {
        name: spec.key.clone(),
        role: if records { Role::RowNumber } else { Role::Key },
    }];
    // A column may serve several roles (order-by and categorical, key and feature): read it
    // once, but check its type against every role it serves.
    let mut every_role: Vec<Want> = rows_wants.clone();
    let mut add = |name: &str, role: Role| {
        every_role.push(Want {
            name: name.into(),
            role,
        });
        if !rows_wants.iter().any(|w| w.name == name) {
            rows_wants.push(Want {
                name: name.into(),
                role,
            });
        }
    };
    if let Some(order) = &spec.order_by {
        add(order, Role::OrderBy);
    }
    for j in &spec.joins {
        add(&j.on, Role::JoinOn);
    }
    for c in row_columns {
        if c.source == Source::Rows {
            add(
                &c.name,
                if c.categorical {
                    Role::Categorical
                } else {
                    Role::Numeric
                },
            );
        }
    }
    for t in text_columns {
        if t.source == TextSource::Rows {
            add(&t.name, Role::Text);
        }
    }
    read::check_columns(first, &every_role, read::Table::Rows)?;
    Ok(rows_wants)
}

/// Refuses what a table of records (no `key`) cannot have: every row is its own context, so
/// there is nothing to order, pad, cut or join a context table on.
fn check_records(spec: &CompileSpec) -> Result<()> {
    let refuse = |key: &'static str, why: &str| -> Result<()> {
        Err(OptionError::new(
            key,
            format!(
                "{why}: without `key` every row is its own context (a table of records); give `key` to group rows into sequences"
            ),
        )
        .into())
    };
    if spec.order_by.is_some() {
        return refuse("order_by", "orders rows within a context");
    }
    if spec.context.is_some() || spec.context_key.is_some() {
        return refuse(
            if spec.context.is_some() {
                "context"
            } else {
                "context_key"
            },
            "joins a context table on the key",
        );
    }
    if !spec.context_features.is_empty() {
        return refuse(
            "context_features",
            "are read from a context table (list a record's columns in `features`)",
        );
    }
    if spec.split_by.is_some() {
        return refuse(
            "split_by",
            "reads a column of the context table (use `split_keys` with row numbers, or `val_fraction`)",
        );
    }
    if spec.max_len.is_some_and(|l| l != 1) {
        return refuse("max_len", "pads sequences");
    }
    if spec.truncate != dsc_format::spec::Truncate::Head {
        return refuse("truncate", "cuts sequences");
    }
    // A target that is also an input would be learnt by copying it.
    if let Some(both) = spec
        .targets
        .iter()
        .find(|t| spec.features.contains(t) || spec.categorical.contains(t))
    {
        return Err(OptionError::new(
            "targets",
            format!("and the inputs (`features` or `categorical`) both list column {both:?}"),
        )
        .into());
    }
    Ok(())
}

/// Refuses a string encoding of a column that has another role, or whose tensor would take a
/// reserved name.
fn check_text_column(spec: &CompileSpec, column: &str, value: &str) -> Result<()> {
    let roles = [
        ("features", &spec.features),
        ("categorical", &spec.categorical),
        ("targets", &spec.targets),
        ("context_features", &spec.context_features),
    ];
    if let Some((key, _)) = roles
        .iter()
        .find(|(_, names)| names.iter().any(|n| n == column))
    {
        return Err(OptionError::new(
            "encode",
            format!(
                "{column}={value}: {column:?} is also listed in `{key}`; a string column encoded \
                 to a fixed width is its own tensor: list it in `encode` only"
            ),
        )
        .into());
    }
    let reserved = ["key", "x", "length", "full_length", "y", "c"];
    let why = if column == spec.key {
        "is the key column".to_string()
    } else if spec.order_by.as_deref() == Some(column) {
        "is the order-by column".to_string()
    } else if reserved.contains(&column) {
        format!(
            "would be stored as tensor {column:?}, a name dsc reserves (key, x, length, \
             full_length, y, c); rename the column"
        )
    } else {
        return Ok(());
    };
    Err(OptionError::new("encode", format!("{column}={value}: {column:?} {why}")).into())
}
