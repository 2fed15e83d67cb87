//! Reading Parquet inputs: resolve patterns, open every file (footer only) to check its schema,
//! then read the needed columns of all files in parallel.

use crate::column::{classify, type_name, Column, Kind, TypeInfo};
use crate::error::{CompileError, Result};
use arrow_schema::{DataType, Schema};
use dsc_format::spelling::OptionError;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};

/// What a column is needed as; decides which types are acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Key,
    /// The context table's key: a string (or binary) key where the rows key is one (`text`),
    /// an integer otherwise, so that both tables' keys give the same ids.
    ContextKey {
        text: bool,
    },
    OrderBy,
    Numeric,
    Categorical,
    JoinOn,
    Split,
    /// A string column encoded to a fixed width (`bits`, `chars:W`, `ngrams:N`).
    Text,
    /// The key of a table of records (no `key` given): each row's number across the rows files,
    /// made by the reader, not read.
    RowNumber,
}

impl Role {
    fn accepts(self, t: &TypeInfo) -> bool {
        // uint64 is read as its bits in an i64: right for identity (keys, joins), wrong for
        // anything that compares or computes with its values.
        let (kind, uint64) = (t.kind, t.name == "UInt64");
        match self {
            Role::Key => matches!(kind, Kind::Int | Kind::Str),
            Role::ContextKey { text } => kind == if text { Kind::Str } else { Kind::Int },
            Role::JoinOn | Role::RowNumber => kind == Kind::Int,
            Role::OrderBy => !matches!(kind, Kind::Str | Kind::Bool) && !uint64,
            Role::Numeric => kind != Kind::Str && !uint64,
            Role::Categorical => matches!(kind, Kind::Int | Kind::Str | Kind::Bool) && !uint64,
            Role::Split | Role::Text => kind == Kind::Str,
        }
    }
    /// Whether the column holds a value per step, so that the rows table may hold it as a list.
    fn per_step(self) -> bool {
        matches!(
            self,
            Role::OrderBy | Role::Numeric | Role::Categorical | Role::JoinOn | Role::Text
        )
    }

    fn describe(self) -> (&'static str, &'static str) {
        match self {
            Role::Key => (
                "the key",
                "an integer, string or binary type (int8..uint64, string, fixed_size_binary)",
            ),
            Role::ContextKey { text: true } => (
                "the context key",
                "a string or binary type, as the rows' key is",
            ),
            Role::ContextKey { text: false } => (
                "the context key",
                "an integer type (int8..uint64), as the rows' key is",
            ),
            Role::RowNumber => ("the row number", "made by the reader"),
            Role::JoinOn => ("a join column", "an integer type (int8..uint64)"),
            Role::OrderBy => ("the order-by column", "a number, timestamp or date"),
            Role::Numeric => (
                "a numeric feature or target",
                "a number, boolean, timestamp or date (use `categorical` for strings)",
            ),
            Role::Categorical => ("a categorical column", "an integer, string or boolean"),
            Role::Split => (
                "the split column (`split_by`)",
                "strings naming splits (train, val, test, ...)",
            ),
            Role::Text => (
                "a string column encoded as bits, chars or ngrams",
                "strings",
            ),
        }
    }
}

/// How a file is read: as the rows table, whose per-step columns may be lists (a whole
/// sequence in one row, exploded by `crate::lists`), or as a keyed table (context, join),
/// whose every column is one value per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Rows,
    Keyed,
}

/// A requested column: name and role.
#[derive(Debug, Clone)]
pub(crate) struct Want {
    pub name: String,
    pub role: Role,
}

/// Expands each pattern (a path or a glob) into files, sorted within a pattern, each file once.
pub(crate) fn resolve(patterns: &[String]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for pattern in patterns {
        if crate::memory::is_memory(Path::new(pattern)) {
            crate::memory::get(Path::new(pattern))?;
            files.push(PathBuf::from(pattern));
            continue;
        }
        if crate::remote::is_url(Path::new(pattern)) {
            files.extend(crate::remote::resolve(pattern)?);
            continue;
        }
        let is_glob = pattern.contains(['*', '?', '[']);
        if !is_glob {
            let path = PathBuf::from(pattern);
            if !path.exists() {
                return Err(CompileError::io(
                    path,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
                ));
            }
            if path.is_dir() {
                let mut inside: Vec<PathBuf> = std::fs::read_dir(&path)
                    .map_err(|e| CompileError::io(&path, e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                    .collect();
                if inside.is_empty() {
                    return Err(CompileError::NoMatch {
                        pattern: format!("{pattern}/*.parquet"),
                    });
                }
                inside.sort();
                files.extend(inside);
            } else {
                files.push(path);
            }
            continue;
        }
        let mut matched: Vec<PathBuf> = glob::glob(pattern)
            .map_err(|e| {
                OptionError::new("rows", format!("has a bad glob pattern {pattern:?}: {e}"))
            })?
            .filter_map(std::result::Result::ok)
            .filter(|p| p.is_file())
            .collect();
        if matched.is_empty() {
            return Err(CompileError::NoMatch {
                pattern: pattern.clone(),
            });
        }
        matched.sort();
        files.extend(matched);
    }
    // One file reached twice (`a.parquet` and `./a.parquet`, a symlink, overlapping globs) is
    // read once, at its first place: identity is the file, not its spelling.
    let mut seen = std::collections::HashSet::new();
    let mut unique = Vec::with_capacity(files.len());
    for f in files {
        let id = if crate::memory::is_memory(&f) || crate::remote::is_url(&f) {
            FileId::Named(f.clone())
        } else {
            let m = std::fs::metadata(&f).map_err(|e| CompileError::io(&f, e))?;
            file_identity(&f, &m)?
        };
        if seen.insert(id) {
            unique.push(f);
        }
    }
    Ok(unique)
}

/// What makes two paths the same file: device and inode where the platform has them, else the
/// canonical path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileId {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg_attr(unix, allow(dead_code))]
    Path(PathBuf),
    /// An input known by its name: a table in memory (whose name holds its content hash), or
    /// an object by its URL.
    Named(PathBuf),
}

/// The identity of the file at `path`, whose metadata `m` the caller has read.
fn file_identity(path: &Path, m: &std::fs::Metadata) -> Result<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let _ = path;
        Ok(FileId::Inode(m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        let p = path.canonicalize().map_err(|e| CompileError::io(path, e))?;
        Ok(FileId::Path(p))
    }
}

/// A Parquet file whose footer has been read, or a table in memory (`crate::memory`).
pub(crate) struct Opened {
    pub path: PathBuf,
    pub rows: u64,
    pub schema: std::sync::Arc<Schema>,
    source: Source,
}

/// A Parquet file's bytes: on disk, or an object in storage read by ranged requests.
pub(crate) enum InputFile {
    Local(File),
    Remote(crate::remote::RemoteFile),
}

impl parquet::file::reader::Length for InputFile {
    fn len(&self) -> u64 {
        match self {
            InputFile::Local(f) => f.len(),
            InputFile::Remote(r) => r.len(),
        }
    }
}

impl parquet::file::reader::ChunkReader for InputFile {
    type T = Box<dyn std::io::Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            InputFile::Local(f) => Ok(Box::new(f.get_read(start)?)),
            InputFile::Remote(r) => Ok(r.reader(start)?),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        match self {
            InputFile::Local(f) => f.get_bytes(start, length),
            InputFile::Remote(r) => Ok(r.read(start, length)?),
        }
    }
}

/// Where an opened input's batches come from.
enum Source {
    Parquet(Box<ParquetRecordBatchReaderBuilder<InputFile>>),
    /// The batches `batches` of a table in memory (its row groups).
    Memory {
        table: std::sync::Arc<crate::memory::MemoryTable>,
        batches: std::ops::Range<usize>,
    },
}

/// The batches of an opened input's wanted columns, in order.
pub(crate) enum Batches {
    Parquet(parquet::arrow::arrow_reader::ParquetRecordBatchReader),
    Memory {
        table: std::sync::Arc<crate::memory::MemoryTable>,
        batches: std::ops::Range<usize>,
        columns: Vec<usize>,
    },
}

impl Iterator for Batches {
    type Item = std::result::Result<arrow_array::RecordBatch, arrow_schema::ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Batches::Parquet(r) => r.next(),
            Batches::Memory {
                table,
                batches,
                columns,
            } => batches.next().map(|i| table.batches[i].project(columns)),
        }
    }
}

/// Opens a Parquet file and reads its footer, or finds the table in memory `path` names.
pub(crate) fn open(path: &Path) -> Result<Opened> {
    if crate::memory::is_memory(path) {
        let table = crate::memory::get(path)?;
        return Ok(Opened {
            path: path.into(),
            rows: table.rows,
            schema: table.schema.clone(),
            source: Source::Memory {
                batches: 0..table.batches.len(),
                table,
            },
        });
    }
    let file = if crate::remote::is_url(path) {
        InputFile::Remote(crate::remote::RemoteFile::open(path)?)
    } else {
        InputFile::Local(File::open(path).map_err(|e| CompileError::io(path, e))?)
    };
    let len = parquet::file::reader::Length::len(&file);
    if len == 0 {
        return Err(CompileError::BadParquet {
            path: path.into(),
            reason: "the file is empty (0 bytes)".into(),
            source: None,
        });
    }
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| CompileError::parquet(path, None, e))?;
    let rows = builder.metadata().file_metadata().num_rows().max(0) as u64;
    let schema = builder.schema().clone();
    Ok(Opened {
        path: path.into(),
        rows,
        schema,
        source: Source::Parquet(Box::new(builder)),
    })
}

/// The type of the row numbers that key a table of records.
pub(crate) fn row_number_type() -> TypeInfo {
    TypeInfo {
        kind: Kind::Int,
        scale: 1.0,
        name: "row number".into(),
        shown: "row number".into(),
        list: false,
        plain: false,
    }
}

/// Refuses a wanted column whose name appears more than once among `names` (Arrow and CSV
/// readers would silently take the first).
pub(crate) fn check_unique<'a>(
    path: &Path,
    names: impl Iterator<Item = &'a str> + Clone,
    wants: &[Want],
) -> Result<()> {
    for w in wants.iter().filter(|w| w.role != Role::RowNumber) {
        let positions: Vec<usize> = names
            .clone()
            .enumerate()
            .filter(|(_, n)| *n == w.name)
            .map(|(i, _)| i)
            .collect();
        if positions.len() > 1 {
            return Err(CompileError::DuplicateColumn {
                path: path.into(),
                column: w.name.clone(),
                role: w.role.describe().0.into(),
                positions,
            });
        }
    }
    Ok(())
}

/// Checks that `opened` has every wanted column, once, with an acceptable type; returns their
/// types in `wants` order.
pub(crate) fn check_columns(
    opened: &Opened,
    wants: &[Want],
    table: Table,
) -> Result<Vec<TypeInfo>> {
    let names = opened.schema.fields().iter().map(|f| f.name().as_str());
    check_unique(&opened.path, names, wants)?;
    wants
        .iter()
        .map(|w| {
            if w.role == Role::RowNumber {
                return Ok(row_number_type());
            }
            let field = opened.schema.field_with_name(&w.name).map_err(|_| {
                CompileError::MissingColumn {
                    path: opened.path.clone(),
                    column: w.name.clone(),
                    role: w.role.describe().0.into(),
                    available: column_list(&opened.schema),
                }
            })?;
            let wrong = |found: String| CompileError::WrongType {
                path: opened.path.clone(),
                column: w.name.clone(),
                role: w.role.describe().0,
                expected: w.role.describe().1,
                found,
                advice: advice(w.role, field.data_type()),
            };
            let info =
                classify(field.data_type()).ok_or_else(|| wrong(type_name(field.data_type())))?;
            if !w.role.accepts(&info) {
                return Err(wrong(info.shown));
            }
            if info.list && !(table == Table::Rows && w.role.per_step()) {
                return Err(CompileError::WrongType {
                    path: opened.path.clone(),
                    column: w.name.clone(),
                    role: w.role.describe().0,
                    expected: "one value per row",
                    found: info.shown,
                    advice: list_advice(w.role, table),
                });
            }
            Ok(info)
        })
        .collect()
}

/// What to do with a column of type `dt` that cannot serve `role`: the usual fixes of data as
/// it arrives (a sequence in one row, string join keys, uint64 values).
fn advice(role: Role, dt: &DataType) -> &'static str {
    match dt {
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::ListView(_) => {
            "; a list column holds a whole sequence in one row: explode it to one row per step \
             with its key repeated (pyarrow.compute.list_flatten with list_parent_indices, or \
             pandas.DataFrame.explode)"
        }
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Dictionary(..)
        | DataType::Binary
        | DataType::FixedSizeBinary(_)
            if role == Role::JoinOn =>
        {
            "; a join matches integers: map the join keys to integers in both tables first \
             (pandas.factorize)"
        }
        DataType::UInt64 if role != Role::JoinOn => {
            "; uint64 is read as its 64 bits, which only a key or join column may be: cast it \
             to int64 or double first"
        }
        _ => "",
    }
}

/// What to do with a list column where one value per row is wanted.
fn list_advice(role: Role, table: Table) -> &'static str {
    match (table, role) {
        (Table::Rows, _) => {
            "; a row of a list table is one context, so its key is one value (the lists hold the \
             steps)"
        }
        (Table::Keyed, Role::Numeric | Role::Text) => {
            "; targets and context features are one value per context: a list column is a \
             per-step column (`features`, `categorical`) of the rows table"
        }
        (Table::Keyed, _) => {
            "; a context or join table holds one value per key: keep sequences in the rows \
             table"
        }
    }
}

/// The file's column names, for error messages.
pub(crate) fn column_list(schema: &Schema) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    format!("columns {names:?}")
}

/// Reads the wanted columns of one opened file.
pub(crate) fn read_columns(
    opened: Opened,
    wants: &[Want],
    types: &[TypeInfo],
) -> Result<Vec<Column>> {
    let (path, rows) = (opened.path.clone(), opened.rows);
    let reader = opened.into_wanted_reader(wants)?;
    let mut columns: Vec<Column> = types
        .iter()
        .map(|t| Column::new(t.clone(), rows as usize))
        .collect();
    for batch in reader {
        let batch = batch.map_err(|e| {
            let at = format!("after row {}", columns.first().map_or(0, Column::len));
            CompileError::parquet(path.clone(), Some(at), e)
        })?;
        for (col, want) in columns.iter_mut().zip(wants) {
            let array = batch
                .column_by_name(&want.name)
                .expect("projected column is present");
            col.push_array(array);
        }
    }
    let read = columns.first().map_or(0, Column::len) as u64;
    if read != rows {
        return Err(CompileError::BadParquet {
            path,
            reason: format!("the footer promises {rows} rows, {read} could be read"),
            source: None,
        });
    }
    Ok(columns)
}

/// All rows files read into columns, concatenated in file order.
pub(crate) struct RowsTable {
    pub files: Vec<PathBuf>,
    /// `offsets[i]` is the first global row of file `i`; one extra entry holds the total.
    pub offsets: Vec<u64>,
    pub columns: Vec<Column>,
    pub wants: Vec<Want>,
    /// For a table holding some rows of the input (one bucket): each row's global row, in
    /// ascending order; `None` when the table holds every row.
    pub origin: Option<Vec<u64>>,
    /// Low bits of a global row that number a list's elements (an exploded list table,
    /// `crate::lists`); 0 otherwise. `global >> element_bits` is the row in the files.
    pub element_bits: u32,
}

impl RowsTable {
    /// The file and the row within it of a row of this table, for error messages.
    pub fn locate(&self, row: usize) -> (&Path, u64) {
        let row = self.origin.as_ref().map_or(row as u64, |o| o[row]) >> self.element_bits;
        let file = self.offsets.partition_point(|&o| o <= row) - 1;
        (&self.files[file], row - self.offsets[file])
    }

    /// The input-wide position of a row of this table: orders rows as the files hold them.
    pub fn global_row(&self, row: usize) -> u64 {
        self.origin.as_ref().map_or(row as u64, |o| o[row])
    }

    pub fn rows(&self) -> usize {
        match &self.origin {
            Some(o) => o.len(),
            None => *self.offsets.last().unwrap_or(&0) as usize,
        }
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.wants
            .iter()
            .position(|w| w.name == name)
            .map(|i| &self.columns[i])
    }
}

/// Every input file opened (footer only) and checked: each holds rows and the wanted columns,
/// all with the types of the first file.
pub(crate) struct Inputs {
    pub opened: Vec<Opened>,
    pub types: Vec<TypeInfo>,
    /// `offsets[i]` is the first global row of file `i`; one extra entry holds the total.
    pub offsets: Vec<u64>,
}

/// Marks the key (the first of `types`) to be held as plain strings when it is a string and
/// `plain` (it serves no role that needs a dictionary): every reader of one table must agree,
/// as the spill is written and read back with these types.
pub(crate) fn plain_key(types: &mut [TypeInfo], plain: bool) {
    if let Some(key) = types.first_mut() {
        key.plain = plain && key.kind == Kind::Str;
    }
}

/// Opens every file and checks the wanted columns and that all files agree on their types.
pub(crate) fn open_all(files: &[PathBuf], wants: &[Want], table: Table) -> Result<Inputs> {
    let opened: Vec<Opened> = files
        .par_iter()
        .map(|p| open(p))
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let mut first_types: Option<(PathBuf, Vec<TypeInfo>)> = None;
    for o in &opened {
        if o.rows == 0 {
            return Err(CompileError::EmptyFile {
                path: o.path.clone(),
            });
        }
        let types = check_columns(o, wants, table)?;
        match &first_types {
            None => first_types = Some((o.path.clone(), types)),
            Some((first, expected)) => {
                for ((want, e), t) in wants.iter().zip(expected).zip(&types) {
                    if e.kind != t.kind || e.name != t.name {
                        return Err(CompileError::SchemaMismatch {
                            path: o.path.clone(),
                            first: first.clone(),
                            column: want.name.clone(),
                            expected: e.shown.clone(),
                            found: t.shown.clone(),
                        });
                    }
                }
            }
        }
    }
    let types = first_types.map(|(_, t)| t).unwrap_or_default();
    let mut offsets = vec![0u64];
    for o in &opened {
        offsets.push(offsets.last().expect("starts non-empty") + o.rows);
    }
    Ok(Inputs {
        opened,
        types,
        offsets,
    })
}

/// Opens every file, checks the wanted columns and that all files agree on their types, then
/// reads them in parallel and concatenates in file order.
pub(crate) fn read_rows(files: &[PathBuf], wants: Vec<Want>) -> Result<RowsTable> {
    let Inputs {
        opened,
        types,
        offsets,
    } = open_all(files, &wants, Table::Keyed)?;
    let total = *offsets.last().expect("non-empty") as usize;
    if total > u32::MAX as usize {
        return Err(CompileError::TooManyRows {
            rows: total as u64,
            max: u32::MAX.into(),
        });
    }
    let per_file: Vec<Vec<Column>> = opened
        .into_par_iter()
        .map(|o| read_columns(o, &wants, &types))
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let mut columns: Vec<Column> = types
        .iter()
        .map(|t| Column::new(t.clone(), total))
        .collect();
    for file_columns in per_file {
        for (all, part) in columns.iter_mut().zip(file_columns) {
            all.append(part);
        }
    }
    columns.iter_mut().for_each(Column::finish);
    Ok(RowsTable {
        files: files.to_vec(),
        offsets,
        columns,
        wants,
        origin: None,
        element_bits: 0,
    })
}

/// The distinct non-null values of a string column of a Parquet file, read batch by batch.
pub(crate) fn distinct_strings(path: &Path, column: &str) -> Result<Vec<String>> {
    let opened = open(path)?;
    let index = opened
        .schema
        .index_of(column)
        .expect("the split column was checked when the table was opened");
    let info = crate::column::classify(opened.schema.field(index).data_type())
        .expect("checked when opened");
    let mut seen = std::collections::BTreeSet::new();
    for batch in opened.into_reader(&[index])? {
        let batch = batch.map_err(|e| CompileError::parquet(path, None, e))?;
        let mut col = Column::new(info.clone(), batch.num_rows());
        col.push_array(batch.column(0));
        if let crate::column::Values::Str { dict, .. } = col.values {
            seen.extend(dict);
        }
    }
    Ok(seen.into_iter().collect())
}

impl Opened {
    /// Rows of each row group (of a table in memory, each batch), in order.
    pub(crate) fn row_group_rows(&self) -> Vec<u64> {
        match &self.source {
            Source::Parquet(builder) => builder
                .metadata()
                .row_groups()
                .iter()
                .map(|g| g.num_rows().max(0) as u64)
                .collect(),
            Source::Memory { table, batches } => table.batches[batches.clone()]
                .iter()
                .map(|b| b.num_rows() as u64)
                .collect(),
        }
    }

    /// How many values the leaves of top-level column `column` hold, from the footer alone: for
    /// a list column, its elements plus one per null or empty list. `None` for a table in
    /// memory, which has no footer (and whose lists are counted without decoding).
    pub(crate) fn leaf_values(&self, column: usize) -> Option<u64> {
        let Source::Parquet(builder) = &self.source else {
            return None;
        };
        let meta = builder.metadata();
        let schema = meta.file_metadata().schema_descr();
        let leaves: Vec<usize> = (0..schema.num_columns())
            .filter(|&l| schema.get_column_root_idx(l) == column)
            .collect();
        let per_group = |g: &parquet::file::metadata::RowGroupMetaData| {
            leaves
                .iter()
                .map(|&l| g.column(l).num_values().max(0) as u64)
                .max()
                .unwrap_or(0)
        };
        Some(meta.row_groups().iter().map(per_group).sum())
    }

    /// The same file restricted to the row groups `groups` (ascending, contiguous): what one of
    /// several readers of a large file reads.
    pub(crate) fn row_groups(self, groups: std::ops::Range<usize>) -> Opened {
        let all = self.row_group_rows();
        let rows = all[groups.clone()].iter().sum();
        let source = match self.source {
            Source::Parquet(builder) => {
                Source::Parquet(Box::new(builder.with_row_groups(groups.collect())))
            }
            Source::Memory { table, batches } => Source::Memory {
                table,
                batches: batches.start + groups.start..batches.start + groups.end,
            },
        };
        Opened {
            rows,
            source,
            ..self
        }
    }

    /// A reader over the wanted columns (checked by [`check_columns`]).
    pub(crate) fn into_wanted_reader(self, wants: &[Want]) -> Result<Batches> {
        let indices: Vec<usize> = wants
            .iter()
            .filter(|w| w.role != Role::RowNumber)
            .map(|w| {
                self.schema
                    .index_of(&w.name)
                    .expect("checked by check_columns")
            })
            .collect();
        self.into_reader(&indices)
    }

    /// A reader over the top-level columns at `indices`, for bare decoding.
    pub(crate) fn into_reader(self, indices: &[usize]) -> Result<Batches> {
        match self.source {
            Source::Parquet(builder) => {
                let mask = ProjectionMask::roots(builder.parquet_schema(), indices.iter().copied());
                builder
                    .with_projection(mask)
                    .with_batch_size(64 * 1024)
                    .build()
                    .map(Batches::Parquet)
                    .map_err(|e| CompileError::parquet(self.path.clone(), None, e))
            }
            Source::Memory { table, batches } => {
                // Parquet's projection keeps the file's column order, whatever order the
                // indices come in: so does this one.
                let mut columns = indices.to_vec();
                columns.sort_unstable();
                columns.dedup();
                Ok(Batches::Memory {
                    table,
                    batches,
                    columns,
                })
            }
        }
    }
}

/// What an input file was when the compile started: checked again once it has been read and
/// hashed, so that a file rewritten mid-compile is an error rather than a cache whose manifest
/// describes other bytes than its shards hold.
#[derive(Debug, Clone)]
pub(crate) struct Stamp {
    path: PathBuf,
    len: u64,
    modified: Option<std::time::SystemTime>,
    /// An object's version in its store (entity tag or last-modified time).
    version: Option<String>,
    id: FileId,
}

impl Stamp {
    pub fn take(path: &Path) -> Result<Stamp> {
        if crate::memory::is_memory(path) {
            // A table in memory is named by its content: it cannot change under the name.
            let table = crate::memory::get(path)?;
            return Ok(Stamp {
                path: path.into(),
                len: table.bytes,
                modified: None,
                version: None,
                id: FileId::Named(path.into()),
            });
        }
        if crate::remote::is_url(path) {
            let (len, version) = crate::remote::head(path)?;
            return Ok(Stamp {
                path: path.into(),
                len,
                modified: None,
                version: Some(version),
                id: FileId::Named(path.into()),
            });
        }
        let m = std::fs::metadata(path).map_err(|e| CompileError::io(path, e))?;
        Ok(Stamp {
            path: path.into(),
            len: m.len(),
            modified: m.modified().ok(),
            version: None,
            id: file_identity(path, &m)?,
        })
    }

    /// Errs when the file is no longer what it was.
    pub fn check(&self) -> Result<()> {
        let now = Stamp::take(&self.path).map_err(|_| CompileError::InputChanged {
            path: self.path.clone(),
            what: "it was removed or cannot be read any more".into(),
        })?;
        let what = if now.id != self.id {
            Some("it was replaced by another file".to_string())
        } else if now.len != self.len {
            Some(format!("{} bytes at the start, {} now", self.len, now.len))
        } else if now.modified != self.modified || now.version != self.version {
            Some("modified since the start".to_string())
        } else {
            None
        };
        match what {
            Some(what) => Err(CompileError::InputChanged {
                path: self.path.clone(),
                what,
            }),
            None => Ok(()),
        }
    }
}

/// Decodes the named columns of Parquet files and discards them: the floor a compile is
/// measured against. Returns the rows decoded.
pub fn decode_parquet(files: &[PathBuf], columns: &[String]) -> Result<u64> {
    let rows: Vec<u64> = files
        .par_iter()
        .map(|path| {
            let opened = open(path)?;
            let indices: Vec<usize> = columns
                .iter()
                .map(|c| {
                    opened
                        .schema
                        .index_of(c)
                        .map_err(|_| CompileError::MissingColumn {
                            path: path.clone(),
                            column: c.clone(),
                            role: "a decoded column".into(),
                            available: column_list(&opened.schema),
                        })
                })
                .collect::<Vec<Result<_>>>()
                .into_iter()
                .collect::<Result<_>>()?;
            let mut n = 0u64;
            for batch in opened.into_reader(&indices)? {
                n += batch
                    .map_err(|e| CompileError::parquet(path.clone(), None, e))?
                    .num_rows() as u64;
            }
            Ok(n)
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    Ok(rows.iter().sum())
}

/// Tables made in tests.
#[cfg(test)]
pub(crate) mod test_tables {
    use super::{Role, RowsTable, Want};
    use crate::column::Column;
    use arrow_array::{ArrayRef, StringArray};
    use std::sync::Arc;

    /// A table of one file `file` holding the string key column `k`, its keys held `plain` or
    /// in a dictionary.
    pub(crate) fn string_keys(file: &str, keys: &[&str], plain: bool) -> RowsTable {
        let mut info = crate::column::classify(&arrow_schema::DataType::Utf8).expect("a string");
        info.plain = plain;
        let mut col = Column::new(info, keys.len());
        let array: ArrayRef = Arc::new(StringArray::from(keys.to_vec()));
        col.push_array(&array);
        RowsTable {
            files: vec![file.into()],
            offsets: vec![0, keys.len() as u64],
            columns: vec![col],
            wants: vec![Want {
                name: "k".into(),
                role: Role::Key,
            }],
            origin: None,
            element_bits: 0,
        }
    }
}
