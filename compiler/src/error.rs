//! Errors of a compile. Every variant says where the problem is: file, column, row (0-based
//! within the file) or context key, and what was expected and found.

use dsc_format::spec::format_size;
use dsc_format::spelling::OptionError;
use std::path::PathBuf;

/// Why a compile stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A rows pattern matched nothing.
    #[error("{pattern}: no such file (the pattern matched nothing)")]
    NoMatch {
        /// The path or glob as given.
        pattern: String,
    },
    /// A file is not readable Parquet (wrong format, truncated, corrupt).
    #[error("{path}: not a readable Parquet file: {reason}")]
    BadParquet {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the decoder's reason and where it stopped.
        reason: String,
        /// The decoder's error, where it raised one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A CSV file could not be parsed.
    #[error("{path}: {reason}")]
    BadCsv {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        reason: String,
    },
    /// A file of keys (`split_keys`, `val_keys`) lists a key it cannot: not an integer, listed
    /// twice, or not a context of the data; or lists none (line 0: the whole file).
    #[error("{}", key_list_message(path, *line, what))]
    KeyList {
        /// The key file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// What is wrong, with the key.
        what: String,
    },
    /// A file holds no rows.
    #[error("{path}: the file holds no rows")]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// A required column is absent.
    #[error("{path}: no column {column:?} ({role}); the file has {available}")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column.
        column: String,
        /// What it was needed as.
        role: String,
        /// The file's columns.
        available: String,
    },
    /// A needed column's name appears more than once in a file's header.
    #[error(
        "{path}: column {column:?} ({role}) appears {} times, at positions {positions:?}; dsc \
         cannot tell which is meant: rename or drop the others",
        positions.len()
    )]
    DuplicateColumn {
        /// The file.
        path: PathBuf,
        /// The column.
        column: String,
        /// What it was needed as.
        role: String,
        /// Its 0-based positions in the header.
        positions: Vec<usize>,
    },
    /// A column has a type that cannot serve its role.
    #[error("{path}: column {column:?} is {found}, but as {role} it must be {expected}{advice}")]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The column.
        column: String,
        /// What it is needed as.
        role: &'static str,
        /// Acceptable types.
        expected: &'static str,
        /// The column's type.
        found: String,
        /// What to do instead, from `; ` (empty when the type has no usual fix).
        advice: &'static str,
    },
    /// Two rows files disagree on a column's type.
    #[error("{path}: column {column:?} is {found}, but it is {expected} in {first}")]
    SchemaMismatch {
        /// The file that disagrees.
        path: PathBuf,
        /// The first file read.
        first: PathBuf,
        /// The column.
        column: String,
        /// Its type in the first file.
        expected: String,
        /// Its type here.
        found: String,
    },
    /// A key is null.
    #[error("{path}: column {column:?} is null at row {row}; every row needs a key")]
    NullKey {
        /// The file.
        path: PathBuf,
        /// The key column.
        column: String,
        /// Row within the file.
        row: u64,
    },
    /// An input in object storage could not be read (its message names the URL).
    #[error("{0}")]
    Store(Box<dsc_store::StoreError>),
    /// A row of a list table whose lists cannot be exploded.
    #[error("{path}: row {row}: {what}")]
    ListRow {
        /// The file.
        path: PathBuf,
        /// Row within the file.
        row: u64,
        /// What is wrong.
        what: String,
    },
    /// Two distinct string or binary keys of one input share a 64-bit id.
    #[error(
        "{path}: keys {first:?} and {second:?} of column {column:?} have the same 64-bit id \
         (the xxh3 hash dsc stores for string and binary keys, FORMAT.md §4.3); two distinct keys \
         meet this about once in 2^64 pairs, and dsc will not merge them: change one of the two \
         keys (append a character, say)"
    )]
    KeyCollision {
        /// The file holding the second key.
        path: PathBuf,
        /// The key column.
        column: String,
        /// One key.
        first: String,
        /// The other.
        second: String,
    },
    /// The context table holds a key twice.
    #[error("{path}: key {key} appears twice in column {column:?} ({first} and row {row})")]
    DuplicateKey {
        /// The file of the repeating row.
        path: PathBuf,
        /// The key column.
        column: String,
        /// The key.
        key: String,
        /// The first row: `row 3`, or `row 3 of FILE` where it is in another file than the
        /// repeat.
        first: String,
        /// The repeating row.
        row: u64,
    },
    /// Rows whose key the context table lacks, under `unmatched_rows = "error"`.
    #[error("{path}: key {key} (row {row}) has no row in the context table {context}, nor do {others} other keys; pass `unmatched_rows=drop` to leave them out")]
    UnmatchedRows {
        /// The rows file of the first such row.
        path: PathBuf,
        /// Its row.
        row: u64,
        /// The key, as its user knows it.
        key: String,
        /// The context table.
        context: PathBuf,
        /// How many other keys are affected.
        others: usize,
    },
    /// Context keys without rows, under `empty_contexts = "error"`.
    #[error("{context}: key {key} (row {row}) {without}, nor do {others} other keys; pass `empty_contexts=drop` or `empty_contexts=keep`")]
    EmptyContexts {
        /// The context table's file holding the key.
        context: PathBuf,
        /// Its row.
        row: u64,
        /// The key, as its user knows it.
        key: String,
        /// What it lacks: rows, or (a list table's row) elements.
        without: &'static str,
        /// How many other keys are affected.
        others: usize,
    },
    /// A lookup table lacks a value that a row joins on.
    #[error("{path}: {column} = {value} at row {row} has no entry in {join}")]
    MissingJoinKey {
        /// The rows file.
        path: PathBuf,
        /// Row within it.
        row: u64,
        /// The join column.
        column: String,
        /// The value.
        value: String,
        /// The lookup file.
        join: PathBuf,
    },
    /// A context's split cannot be taken from the split column (null, or a name that cannot
    /// name a split).
    #[error("{path}: column {column:?} row {row}: {what}")]
    BadSplit {
        /// The context table.
        path: PathBuf,
        /// The split column.
        column: String,
        /// Row within the file.
        row: u64,
        /// What is wrong, with the key.
        what: String,
    },
    /// A null, NaN or infinite value under `nan = "error"`.
    #[error("{path}: column {column:?} row {row}: {what}; choose `nan=zero` or `nan=mean` to replace such values")]
    BadValue {
        /// The file holding the value.
        path: PathBuf,
        /// The column.
        column: String,
        /// Row within the file.
        row: u64,
        /// What the value is (`null`, `NaN`, `inf`, or an encoding that produced one).
        what: String,
    },
    /// A string that its `bits` encoding cannot store (another character, another width).
    #[error("{path}: column {column:?} row {row}: {what}")]
    BadText {
        /// The file holding the value.
        path: PathBuf,
        /// The column.
        column: String,
        /// Row within the file.
        row: u64,
        /// What is wrong.
        what: String,
    },
    /// A value or column the mostlyai-engine compatible profile cannot reproduce.
    #[error("{path}: column {column:?} row {row}: {what}")]
    Incompatible {
        /// The file.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row within the file.
        row: u64,
        /// What is wrong and what to do.
        what: String,
    },
    /// The spec is invalid: the key it is about, and what is wrong.
    #[error(transparent)]
    Spec(#[from] OptionError),
    /// An append holds a context the cache already has.
    #[error(
        "key {key} is already in the cache: {file} (generation {generation}) holds it; an \
         append adds new contexts only (give --existing replace to replace the cache's \
         contexts of the keys it holds again), and nothing was committed"
    )]
    KeyInCache {
        /// The key as the key column holds it.
        key: String,
        /// The shard of the cache holding it.
        file: String,
        /// The generation that wrote that shard.
        generation: u32,
    },
    /// Another writer committed the generation an append was writing.
    #[error(
        "{path}: generation {number} was committed by another writer while this append ran; \
         nothing of this append was committed: run it again to append on top of it"
    )]
    GenerationTaken {
        /// The cache.
        path: PathBuf,
        /// The generation.
        number: u32,
    },
    /// The output directory exists and is not empty.
    #[error("{path}: already exists and is not empty; pass `force` to replace it")]
    OutputExists {
        /// The output directory.
        path: PathBuf,
    },
    /// An input file changed between the start of the compile and its end.
    #[error(
        "{path}: the file changed while it was being compiled ({what}); nothing was written: \
         compile again once it is complete"
    )]
    InputChanged {
        /// The file.
        path: PathBuf,
        /// What changed (size, modification time, identity).
        what: String,
    },
    /// Another process holds the output's lock.
    #[error(
        "{path}: another dsc ({holder}) is writing this cache; wait for it to finish, or \
         choose another `out`"
    )]
    OutputLocked {
        /// The output directory.
        path: PathBuf,
        /// Who holds the lock, as it wrote itself into the lock file (`pid 1234`).
        holder: String,
    },
    /// The output's folder (or the cache being replaced) refuses writes: permissions, a
    /// read-only mount, an immutable attribute. Nothing was changed.
    #[error(
        "{path}: cannot {action} ({source}); the folder holding `out` must be writable by this \
         user, and a replaced cache movable; nothing was changed"
    )]
    OutputNotWritable {
        /// What refused the write.
        path: PathBuf,
        /// What dsc was doing.
        action: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The memory budget cannot hold one bucket.
    #[error(
        "`max_memory={}` is too small: one bucket of this input holds {rows} rows and needs \
         about {} in memory; give at least that, or a smaller `bucket_size`",
        format_size(*budget), format_size(*needed)
    )]
    Budget {
        /// The budget, in bytes.
        budget: u64,
        /// Rows of the largest bucket.
        rows: u64,
        /// Bytes it needs in memory.
        needed: u64,
    },
    /// An input larger than this version handles.
    #[error("{rows} rows in one table; this version handles at most {max}")]
    TooManyRows {
        /// Rows in the table.
        rows: u64,
        /// The most it handles.
        max: u64,
    },
    /// A numeric column whose values overflow its statistics (sums of squares beyond f64).
    #[error(
        "column {column:?}: values from {min:e} to {max:e} overflow its statistics; rescale the \
         column"
    )]
    Overflow {
        /// The column.
        column: String,
        /// Its smallest value.
        min: f64,
        /// Its largest value.
        max: f64,
    },
    /// No context is in the split `train`, which every encoding and statistic is fitted on.
    #[error(
        "no context is in the split \"train\", which dsc fits encodings and statistics on: {why}"
    )]
    NoTrain {
        /// Why: the splits the contexts went to, or that none is left.
        why: String,
    },
    /// A context with rows but no row in the context table, whose split comes from a column of
    /// that table.
    #[error(
        "{}: key {key} has no row in it, so no split (`split_by={column}`)",
        context.display()
    )]
    NoSplit {
        /// The context table.
        context: PathBuf,
        /// The key, as its user knows it.
        key: String,
        /// The split column.
        column: String,
    },
    /// A partitioned compile's parts do not fit together: one is missing, or belongs to another
    /// compile. Names the part and what to run.
    #[error("{}: {what}", path.display())]
    Partition {
        /// The part, or the work folder.
        path: PathBuf,
        /// What is wrong and what to do.
        what: String,
    },
    /// A file the compile wrote for itself (a spill, a values file, a work shard or part)
    /// no longer holds what was written: its checksum does not match.
    #[error("{}: {what}", path.display())]
    CorruptWork {
        /// The file.
        path: PathBuf,
        /// What does not match, and what to run.
        what: String,
    },
    /// A signal (SIGINT, SIGTERM) or Ctrl-C asked the compile to stop; it removed what it had
    /// written and committed nothing.
    #[error("interrupted ({}): the compile stopped and removed what it had written; nothing was committed", signal_name(*.signal))]
    Interrupted {
        /// The signal number.
        signal: i32,
    },
    /// A bug in dsc: what it assembled breaks a rule of its own format. Nothing was written.
    #[error("internal error, please report it: {0}")]
    Internal(String),
    /// Writing the cache failed.
    #[error(transparent)]
    Format(#[from] dsc_format::FormatError),
}

impl CompileError {
    /// The Parquet decoder's error `e` on `path`, `at` a place in it where known.
    pub(crate) fn parquet(
        path: impl Into<PathBuf>,
        at: Option<String>,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        CompileError::BadParquet {
            path: path.into(),
            reason: match at {
                Some(at) => format!("{at}: {e}"),
                None => e.to_string(),
            },
            source: Some(Box::new(e)),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        // A write past the file-size limit fails with EFBIG once SIGXFSZ is ignored (the CLI
        // ignores it: the signal's default would kill the process without a word).
        let source = if source.raw_os_error() == Some(libc::EFBIG) {
            std::io::Error::new(
                source.kind(),
                format!(
                    "{source}: the process's file-size limit (`ulimit -f`) stopped the write; \
                     raise it (the largest files a compile writes are its shards, `shard_size`, \
                     and spill files of about `bucket_size`)"
                ),
            )
        } else {
            source
        };
        CompileError::Io {
            path: path.into(),
            source,
        }
    }
}

/// `Result` with [`CompileError`].
pub type Result<T, E = CompileError> = std::result::Result<T, E>;

/// `SIGINT` and the like for the signals a compile stops on.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        other => format!("signal {other}"),
    }
}

/// A key file's problem, at its line (0: the whole file).
fn key_list_message(path: &std::path::Path, line: usize, what: &str) -> String {
    match line {
        0 => format!("{}: {what}", path.display()),
        n => format!("{}: line {n}: {what}", path.display()),
    }
}
