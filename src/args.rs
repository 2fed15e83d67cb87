//! Command-line flags. Each flag's first doc line is its `-h` text; the rest shows in `--help`.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use dsc_compiler::partition::Stage;
use dsc_format::choice::Choice;
use dsc_format::spec::{EmptyContexts, NanPolicy, Truncate, UnmatchedRows};
use std::path::PathBuf;

/// dsc, the dataset compiler: Parquet event and sequence data to pre-shuffled, padded
/// safetensors shards that training reads at memory speed.
///
/// A typical session:
///
///   dsc gen icecube --out data
///   dsc compile 'data/train/batch_*.parquet' --key event_id --order-by time \
///       --context data/train_meta.parquet --targets azimuth,zenith \
///       --join data/sensor_geometry.csv --on sensor_id \
///       --features x,y,z,time,charge,auxiliary --categorical sensor_id \
///       --encode time=zscore --encode charge=log1p --max-len 128 --val-fraction 0.1 --out cache
///   dsc inspect cache
///   dsc verify cache
///
/// Exit codes: 0 success, 1 `verify` found problems, 2 error.
#[derive(Debug, Parser)]
#[command(name = "dsc", version, max_term_width = 100, verbatim_doc_comment)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Worker threads (default: one per core). The output does not depend on it.
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    // Each subcommand's help is the doc comment of its arguments struct.
    Gen(GenArgs),
    Compile(Box<CompileArgs>),
    Inspect(InspectArgs),
    Verify(VerifyArgs),
    Show(ShowArgs),
    Report(ReportArgs),
    Order(OrderArgs),
    Bench(BenchArgs),
    DigitSplit(DigitSplitArgs),
    Merge(MergeArgs),
    Compress(CompressArgs),
    Decompress(DecompressArgs),
    Status(StatusArgs),
    Append(Box<AppendArgs>),
    Compact(CompactArgs),
    Log(LogArgs),
    Tag(TagArgs),
    Gc(GcArgs),
    /// What `dsc compile --force` starts to remove the cache it replaced, after it has returned.
    #[command(hide = true)]
    RemoveReplaced(RemoveReplacedArgs),
}

/// Removes a replaced cache (`.NAME.PID-N.dsc-old`), holding its lock as standard input.
#[derive(Debug, Args)]
pub struct RemoveReplacedArgs {
    pub folder: PathBuf,
}

/// Name a generation of a cache, so that readers open it by that name (`--generation NAME`,
/// `generation="NAME"`) and `dsc gc` keeps it.
///
/// Example:
///   dsc tag cache paper-2026 3
///   dsc inspect cache --generation paper-2026
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct TagArgs {
    /// The cache directory.
    pub cache: PathBuf,
    /// The name: a lower-case letter, then letters, digits, '-', '_', '.'.
    pub name: String,
    /// The generation to name: a number, a content id or another tag [default: the last].
    #[arg(value_parser = generation_ref)]
    pub generation: Option<dsc_format::GenerationRef>,
    /// Move the tag if it names another generation.
    #[arg(long)]
    pub force: bool,
}

/// Remove the generations a cache no longer keeps, and the files only they held: the shards a
/// compaction rewrote, what killed appends left. Kept: generation 1 (its manifest.json makes
/// the folder a cache), the last --keep-last, the tagged ones, those committed since
/// --keep-since. A reader with a removed generation open keeps reading it; new readers cannot.
///
/// Example:
///   dsc compact cache && dsc gc cache --dry-run
///   dsc gc cache --keep-last 3
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GcArgs {
    /// The cache directory.
    pub cache: PathBuf,
    /// Keep the last N generations.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub keep_last: u32,
    /// Keep the generations committed in the last DAYS days (e.g. 7, 0.5).
    #[arg(long, value_name = "DAYS")]
    pub keep_days: Option<f64>,
    /// Say what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Rewrite a cache's live contexts as one new generation: one compile of every generation's
/// inputs with the first generation's fitted parameters, so its shards are byte for byte those
/// of `dsc compile ALL_INPUTS --fit-from CACHE` with the cache's spec and seed, in one global
/// shuffle again. The new generation lists only its own shards; earlier generations stay
/// readable (a state resumes on the one it read). The inputs must still be where they were,
/// unchanged (their checksums are compared).
///
/// Example:
///   dsc compact cache
///   dsc log cache
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CompactArgs {
    /// The cache to compact (a local directory).
    pub cache: PathBuf,
    #[command(flatten)]
    pub write: GenerationWriteArgs,
}

/// Append new data to a cache as its next generation: the new contexts are compiled with the
/// cache's recorded spec and its fitted parameters frozen (normalisation, vocabularies, string
/// encodings, fills, max_len), written as new shards, and committed with a new manifest listing
/// the last generation's shards and the new ones. No existing file changes: readers of an
/// earlier generation keep reading it, and a loader state resumes on the generation it read.
///
/// A key already in the cache is refused (naming the key, its shard and generation), and so
/// are inputs whose tensors would differ (another column type, a join on another column).
/// A key's split follows the cache's rule, so it never changes between generations. An append
/// waits while another one commits, then appends on top of it.
///
/// Example:
///   dsc append cache 'tx/2026-12-01.parquet' --context customers-2026-12-01.parquet
///   dsc log cache
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct AppendArgs {
    /// The cache to append to (a local directory).
    #[arg(value_name = "CACHE")]
    pub cache: PathBuf,
    /// The new data: its rows files (ROWS, as `dsc compile` takes them), --context (the new
    /// contexts' table, required when the cache has one) and --join/--on (by default the
    /// cache's own lookup tables are read again). Any other flag of `dsc compile` must say
    /// what the cache's spec says, or the append is refused naming it: an append takes the
    /// cache's spec and fitted parameters.
    #[command(flatten)]
    pub keys: SpecArgs,
    /// What to do with a key the cache already holds: `refuse` (an append adds new keys only;
    /// the error names the key and the shard holding it) or `replace` (its new whole context
    /// replaces the cache's: the old one is hidden from this generation on, its shard kept
    /// unchanged for readers of earlier generations).
    #[arg(long, value_name = "refuse|replace", default_value = "refuse")]
    pub existing: dsc_compiler::Existing,
    #[command(flatten)]
    pub write: GenerationWriteArgs,
}

/// How a new generation is written and reported (`dsc append`, `dsc compact`).
#[derive(Debug, Args)]
pub struct GenerationWriteArgs {
    /// Memory the compile may use (e.g. 4GiB) [default: half of the machine's].
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Print a JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// List a cache's generations: number, content id, contexts added per split, inputs, and when
/// each was committed. `--generation N` (or a content id) on any reader opens one of them.
///
/// Example:
///   dsc log cache
///   dsc log cache --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct LogArgs {
    /// The cache directory.
    pub cache: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Commit a partitioned compile: once every partition has run every stage (scan, fit, write),
/// check every part, write stats.json and manifest.json (the commit point) and move the cache
/// into place. Parts that are missing, or from another spec or changed inputs, are named.
///
/// Example:
///   dsc compile … --partition 0/2 --stage scan --out cache   # and 1/2; then fit, then write
///   dsc merge cache
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct MergeArgs {
    /// The output of the partitioned compile (its work folder lies beside it).
    pub out: PathBuf,
    /// Replace OUT if it holds a cache.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub storage: StorageArgs,
    /// Print a JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// How the shards are stored (`--compress`).
#[derive(Debug, Args)]
pub struct StorageArgs {
    /// Store the shards compressed, for cold storage: zstd (one frame per shard, typically a
    /// fifth of the hot size on padded caches). The loader (Rust and Python), verify, inspect
    /// and show read it, decompressing a shard into memory on first use; batches are the same
    /// bytes in the same order. `dsc decompress` turns it back into a hot (mapped) cache.
    #[arg(long, value_parser = choice::<dsc_format::Codec>(), value_name = "CODEC", help_heading = "Output")]
    pub compress: Option<dsc_format::Codec>,
    /// zstd level, 1 (fastest) to 22 (smallest) [default: 3].
    #[arg(
        long,
        value_name = "N",
        requires = "compress",
        help_heading = "Output",
        allow_negative_numbers = true
    )]
    pub compress_level: Option<i32>,
}

/// Where a cache in object storage (`s3://bucket/cache`, `gs://…`, `az://…`, `https://…`) is
/// fetched to. Credentials and endpoints come as for the AWS CLI and object_store: `AWS_*`
/// variables (`AWS_ENDPOINT_URL` for an S3-compatible server), `~/.aws/credentials` and
/// `~/.aws/config` (`AWS_PROFILE`), `GOOGLE_*`, `AZURE_*`.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// For a cache in object storage: the local folder its shards are fetched into, one
    /// subfolder per cache, kept for the next run [env: DSC_CACHE_DIR; default:
    /// ~/.cache/dsc].
    #[arg(long, value_name = "DIR", help_heading = "Object storage")]
    pub cache_dir: Option<PathBuf>,
    /// Bytes of fetched shards kept at most (e.g. 20GiB; at least the largest shard). The
    /// shard removed to make room is the one needed furthest ahead in the loader's order
    /// [env: DSC_CACHE_LIMIT; default: no limit].
    #[arg(long, value_name = "SIZE", value_parser = size, help_heading = "Object storage")]
    pub cache_limit: Option<u64>,
}

/// Which generation of a cache a reader opens (`--generation`).
#[derive(Debug, Args)]
pub struct GenerationArgs {
    /// The generation to read: its number (1 is the compiled cache), its content id or a tag
    /// (`dsc log` lists them) [default: the last one].
    #[arg(long, value_name = "N|ID|TAG", value_parser = generation_ref, help_heading = "Generations")]
    pub generation: Option<dsc_format::GenerationRef>,
}

impl GenerationArgs {
    /// The generation asked for, the last one by default.
    pub fn at(&self) -> dsc_format::GenerationRef {
        self.generation.clone().unwrap_or_default()
    }
}

fn generation_ref(s: &str) -> Result<dsc_format::GenerationRef, String> {
    s.parse()
}

impl RemoteArgs {
    /// [`RemoteArgs::options`] opening generation `at`.
    pub fn options_at(&self, at: &GenerationArgs) -> anyhow::Result<dsc_loader::RemoteOptions> {
        let mut o = self.options()?;
        o.generation = at.at();
        Ok(o)
    }

    /// The environment's options, with these flags over them.
    pub fn options(&self) -> anyhow::Result<dsc_loader::RemoteOptions> {
        let mut o = dsc_loader::RemoteOptions::from_env()?;
        if let Some(dir) = &self.cache_dir {
            o.dir = dir.clone();
        }
        if self.cache_limit.is_some() {
            o.limit = self.cache_limit;
        }
        Ok(o)
    }
}

/// A size with an optional unit (`512MiB`, `20GiB`, `4000000`).
fn size(s: &str) -> Result<u64, String> {
    dsc_format::spec::parse_size(s)
}

/// A clap parser for a [`Choice`]: its names are the possible values (listed in `--help` and in
/// the error for another), each spelled once, by the type.
fn choice<T: Choice + Clone + Send + Sync>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::NAMES).map(|s| T::parse_name(&s).expect("one of T::NAMES"))
}

impl StorageArgs {
    pub fn storage(&self) -> dsc_compiler::Storage {
        match self.compress {
            None => dsc_compiler::Storage::Hot,
            Some(dsc_format::Codec::Zstd) => dsc_compiler::Storage::Zstd {
                level: self
                    .compress_level
                    .unwrap_or(dsc_format::stored::DEFAULT_ZSTD_LEVEL),
            },
        }
    }
}

/// Compress a cache's shards for cold storage (zstd), in place and atomically.
///
/// Every shard becomes one zstd frame (`shards/NAME.safetensors.zst`) with its own checksum in
/// the manifest; the safetensors bytes inside are unchanged, so loaders, `verify`, `inspect`
/// and `show` give the same results, and `dsc decompress` gives back the hot cache byte for
/// byte. Each shard is checked against the manifest while it is read: a damaged shard stops the
/// conversion with the cache untouched. The converted cache is written beside CACHE and
/// replaces it in one step (room for it is needed until then).
///
/// Example:
///   dsc compress cache                  (zstd level 3)
///   dsc compress cache --level 19 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CompressArgs {
    /// The cache directory.
    pub cache: PathBuf,
    /// zstd level, 1 (fastest) to 22 (smallest). Shards already compressed at this level are
    /// kept; shards at another level are rewritten at this one.
    #[arg(long, default_value_t = dsc_format::stored::DEFAULT_ZSTD_LEVEL,
          allow_negative_numbers = true)]
    pub level: i32,
    /// Print a JSON report (shards, shards_converted, bytes_before, bytes_after, bytes_hot,
    /// seconds).
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Write the compressed cache to this URL in object storage (s3://bucket/cache, gs://…,
    /// az://…) instead, leaving CACHE as it is: compressed under --cache-dir, then uploaded
    /// with its manifest last.
    #[arg(long, value_name = "URL")]
    pub out: Option<PathBuf>,
    /// With --out: replace a cache already at the URL.
    #[arg(long, requires = "out")]
    pub force: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Decompress a compressed cache back into a hot (memory-mapped) one, in place and atomically.
///
/// The result is byte for byte the cache that was compressed. Each shard's checksums (of the
/// compressed file and of what it decompresses to) are checked on the way.
///
/// Example:
///   dsc decompress cache
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DecompressArgs {
    /// The cache directory.
    pub cache: PathBuf,
    /// Print a JSON report (as for `dsc compress`).
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Show which stages and partitions of a partitioned compile into OUT are done.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The output of the partitioned compile.
    pub out: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Dataset {
    /// IceCube "Neutrinos in Deep Ice" layout: train/batch_N.parquet (one row per pulse),
    /// train_meta.parquet (per-event targets), sensor_geometry.csv.
    Icecube,
    /// Customers and transactions: customers.parquet (context table) and
    /// transactions/part-NNN.parquet with each customer's rows scattered across files.
    Sequences,
    /// Long sensor series for forecasting on windows: readings.parquet (one row per series and
    /// step: series_id, t, value, load, temp) and sensors.parquet (series_id, kind).
    Series,
    /// Records encoded as Bloom filters for record linkage: records.parquet (uid, first_name,
    /// last_name, yob, bloom: 256 bits of the names' 2-grams as a string of 0 and 1).
    Linkage,
    /// Microbiome samples: asvs.parquet (one row per sequence variant of a sample: sample_id,
    /// asv, a DNA string of 150 bases, count) and samples.parquet (sample_id, site, site_name).
    Microbiome,
}

/// How `dsc gen sequences` lays out its transactions.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GenLayout {
    /// One row per transaction, scattered over the files.
    Scattered,
    /// One row per customer, transactions as list columns.
    Lists,
    /// The lists exploded, row for row.
    Exploded,
}

impl From<GenLayout> for dsc_gen::sequences::Layout {
    fn from(l: GenLayout) -> Self {
        use dsc_gen::sequences::Layout;
        match l {
            GenLayout::Scattered => Layout::Scattered,
            GenLayout::Lists => Layout::Lists,
            GenLayout::Exploded => Layout::Exploded,
        }
    }
}

/// How `dsc gen sequences` stores its keys.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GenKeyType {
    /// int64.
    Int,
    /// string: C-00101234.
    String,
    /// fixed_size_binary[16]: a UUID.
    Uuid,
    /// uint64, past 2^63.
    Uint64,
}

impl From<GenKeyType> for dsc_gen::sequences::KeyStyle {
    fn from(k: GenKeyType) -> Self {
        use dsc_gen::sequences::KeyStyle;
        match k {
            GenKeyType::Int => KeyStyle::Int,
            GenKeyType::String => KeyStyle::Text,
            GenKeyType::Uuid => KeyStyle::Uuid,
            GenKeyType::Uint64 => KeyStyle::UInt64,
        }
    }
}

/// Write a seeded sample data set (IceCube-like events or customer transactions).
///
/// The same seed writes byte-identical files.
///
/// Example:
///   dsc gen icecube --out data --files 8 --events-per-file 2000 --seed 7
///   dsc gen sequences --out seq --customers 10000 --files 4
///   dsc gen sequences --out tx --key-type string --layout lists
///   dsc gen series --out sensors --series 200 --steps 500:3000
///   dsc gen linkage --out people --records 4000
///   dsc gen microbiome --out microbes --records 600
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GenArgs {
    /// Which data set.
    #[arg(value_enum)]
    pub dataset: Dataset,
    /// Output folder (created).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of rows files.
    #[arg(long, default_value_t = 8)]
    pub files: usize,
    /// IceCube: events per batch file.
    #[arg(long, default_value_t = 2000)]
    pub events_per_file: usize,
    /// Sequences: number of customers.
    #[arg(long, default_value_t = 2000)]
    pub customers: usize,
    /// Sequences: how customer_id is stored: int (int64), string (C-00101234), uuid
    /// (fixed_size_binary[16]) or uint64 (past 2^63). The same customers in every style.
    #[arg(long, value_enum, default_value = "int", value_name = "TYPE")]
    pub key_type: GenKeyType,
    /// Sequences: scattered (transactions/ and customers.parquet, a customer's rows in every
    /// file), lists (lists/: one row per customer, its transactions as list columns) or
    /// exploded (the lists exploded to transactions/ row for row, with customers.parquet).
    #[arg(long, value_enum, default_value = "scattered", value_name = "LAYOUT")]
    pub layout: GenLayout,
    /// Series: number of series.
    #[arg(long, default_value_t = 200)]
    pub series: usize,
    /// Linkage: number of records; microbiome: number of samples.
    #[arg(long, value_name = "N")]
    pub records: Option<usize>,
    /// Series: the shortest and longest series, in steps (MIN:MAX).
    #[arg(long, default_value = "500:3000", value_name = "MIN:MAX")]
    pub steps: String,
    /// Seed: the same seed writes byte-identical files.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The spec keys of `dsc compile`, one flag each: serialised, the keys given, as a spec file
/// holds them, which `CompileSpec::with_overrides` lays over the spec file (the rule Python's
/// `dsc.compile` follows too). A new spec key is a field here with its `serde` attribute.
#[derive(Debug, Args, serde::Serialize)]
pub struct SpecArgs {
    /// Rows files: Parquet paths, folders or quoted globs ('data/*.parquet').
    #[arg(value_name = "ROWS")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<String>,

    /// Column naming each row's context (event, customer, …): integers of any width, strings or
    /// UUIDs (fixed_size_binary[16]); strings are stored as 64-bit ids with the keys in a table
    /// beside each shard (docs/FORMAT.md §4.3). Without it the rows are
    /// a table of records: each row its own sample, keyed by its row number, stored as [n, F]
    /// features, [n] codes and [n, W] strings with no step axis (--targets then names the
    /// rows' own target columns).
    #[arg(long, value_name = "COL", help_heading = "Grouping")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Column ordering the rows of a context (number, timestamp or date); file order if absent.
    #[arg(long, value_name = "COL", help_heading = "Grouping")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_by: Option<String>,
    /// Longest padded sequence: longer ones are cut to L rows (--truncate); the cache pads to the
    /// longest stored sequence when that is shorter [default: the longest sequence].
    #[arg(long, value_name = "L", help_heading = "Grouping")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// Which rows of a longer sequence are kept [default: head].
    #[arg(long, value_parser = choice::<Truncate>(), help_heading = "Grouping")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncate: Option<Truncate>,

    /// Per-row numeric features stored in x [n, L, F], comma-separated, in order.
    #[arg(
        long,
        value_name = "COLS",
        value_delimiter = ',',
        help_heading = "Columns"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Per-row categorical columns, each stored as i32 codes [n, L] named after the column.
    #[arg(
        long,
        value_name = "COLS",
        value_delimiter = ',',
        help_heading = "Columns"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub categorical: Vec<String>,
    /// Encoding of a numeric column: identity, zscore, minmax, log1p, or a chain
    /// (log1p,zscore). Repeat per column. Parameters are fitted on the train split. A string
    /// column of the rows (or the context) table listed here alone becomes a tensor of its own,
    /// named after it, one fixed-width row per step ([n, L, W]; of the context table [n, W]):
    /// `bits` (a string of 0 and 1 as that many u8, W from the data), `chars:W` (characters
    /// as i32 codes over the train split's characters, 0 padding, 1 unknown), `ngrams:N` (the
    /// set of character N-grams, N at most 16, as a multi-hot u8 vector over the train split's
    /// most frequent, at most --ngram-vocab). One encoding per column.
    #[arg(long, value_name = "COL=CHAIN", help_heading = "Columns")]
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "pairs::encode"
    )]
    pub encode: Vec<String>,
    /// N-grams kept at most by `--encode COL=ngrams:N`: the train split's most frequent (rows
    /// holding each), ties in ascending order [default: 4096].
    #[arg(long, value_name = "V", help_heading = "Columns")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngram_vocab: Option<usize>,
    /// Per-row lookup table (CSV or Parquet) joined on --on; repeat with one --on each.
    #[arg(long = "join", value_name = "FILE", help_heading = "Columns")]
    #[serde(skip)]
    pub joins: Vec<String>,
    /// The column a --join table is joined on (same position as its --join).
    #[arg(long = "on", value_name = "COL", help_heading = "Columns")]
    #[serde(skip)]
    pub join_on: Vec<String>,

    /// Context table (Parquet, one row per context): targets and per-context features.
    #[arg(long, value_name = "FILE", help_heading = "Context table")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The context table's key column [default: --key].
    #[arg(long, value_name = "COL", help_heading = "Context table")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_key: Option<String>,
    /// Context columns stored as targets y [n, T], comma-separated, in order (without --key:
    /// the rows' own columns).
    #[arg(
        long,
        value_name = "COLS",
        value_delimiter = ',',
        help_heading = "Context table"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// Context columns stored as per-context features c [n, C].
    #[arg(
        long,
        value_name = "COLS",
        value_delimiter = ',',
        help_heading = "Context table"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub context_features: Vec<String>,
    /// Rows whose key has no context row: stop with an error, or drop them [default: error].
    #[arg(long, value_parser = choice::<UnmatchedRows>(), help_heading = "Context table")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmatched_rows: Option<UnmatchedRows>,
    /// Context rows with no rows: error, drop, or keep as empty sequences [default: error].
    #[arg(long, value_parser = choice::<EmptyContexts>(), help_heading = "Context table")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_contexts: Option<EmptyContexts>,

    /// Fraction of contexts in the validation split, chosen by a hash of the key [default: 0].
    /// With --split-by or --split-keys, carved out of the contexts they put in `train`.
    #[arg(long, value_name = "F", help_heading = "Splits and shuffle")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_fraction: Option<f64>,
    /// Take each context's split from this column of the context table (strings such as
    /// train, val, test; a data set's official split). Statistics and encodings are fitted on
    /// `train`, which must exist; every other split is stored beside it.
    #[arg(long, value_name = "COLUMN", help_heading = "Splits and shuffle")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_by: Option<String>,
    /// Put the keys listed in FILE (one per line, as the key column holds them) in split NAME; repeatable; unlisted
    /// keys are `train`. E.g. --split-keys test=test_ids.txt
    #[arg(long, value_name = "NAME=FILE", help_heading = "Splits and shuffle")]
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "pairs::split_keys"
    )]
    pub split_keys: Vec<String>,
    /// Seed of the split hash; independent of --seed, so reshuffles keep the same split.
    #[arg(long, value_name = "N", help_heading = "Splits and shuffle")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_seed: Option<u64>,
    /// Seed of the global shuffle (xoshiro256**, stable across releases) [default: 0].
    #[arg(long, value_name = "N", help_heading = "Splits and shuffle")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,

    /// Reproduce another tool's preprocessing instead of dsc's encodings: `mostlyai` =
    /// mostlyai-engine 2.7.3's statistics and sequential encoding of every column of the rows
    /// table and the --context table (docs/COMPAT-mostlyai.md).
    #[arg(long, value_name = "NAME", help_heading = "Profiles")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// With --profile mostlyai: file with the validation keys, one per line (the rest train).
    #[arg(long, value_name = "FILE", help_heading = "Profiles")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "pairs::path"
    )]
    pub val_keys: Option<PathBuf>,
    /// With --profile mostlyai: the engine's partition count (its statistics depend on it)
    /// [default: 1].
    #[arg(long, value_name = "N", help_heading = "Profiles")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<usize>,

    /// Take the fitted parameters of this cache (z-score and min-max parameters, vocabularies,
    /// string encodings, NaN fills, max_len) instead of fitting them: a test set encoded as its
    /// training set was. The compile is refused where its tensors would differ from that
    /// cache's (another column, type or encoding), naming the first difference.
    #[arg(long, value_name = "CACHE", help_heading = "Values")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "pairs::path"
    )]
    pub fit_from: Option<PathBuf>,

    /// Null/NaN/inf in a numeric column: error (naming file, column, row), zero, or the
    /// train mean [default: error].
    #[arg(long, value_parser = choice::<NanPolicy>(), help_heading = "Values")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nan: Option<NanPolicy>,

    /// Target shard size: bytes or with a unit (64MiB, 1GiB) [default: 256MiB].
    #[arg(long, value_name = "SIZE", help_heading = "Output")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "pairs::shard_size"
    )]
    pub shard_size: Option<String>,
    /// Decoded input per bucket [default: 32MiB]: shards never span two buckets, so this shapes
    /// shard boundaries (never the order or the values). One bucket must fit in --max-memory.
    #[arg(long, value_name = "SIZE", help_heading = "Output")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "pairs::bucket_size"
    )]
    pub bucket_size: Option<String>,
}

/// Compile Parquet rows into a cache of safetensors shards.
///
/// Rows are grouped into one sequence per --key value, ordered by --order-by, truncated to
/// --max-len and padded; per-row lookup tables (--join) and a per-context table (--context) are
/// joined; contexts are split into train/val by a hash of the key and shuffled by --seed.
/// Statistics go to stats.json, encodings and everything needed to invert them to
/// manifest.json, which is written last: a directory without it is not a cache.
///
/// Every flag can also come from a spec file (--spec dsc.toml, keys as in --print-spec);
/// flags given on the command line override it.
///
/// Example:
///   dsc compile 'data/train/batch_*.parquet' --key event_id --order-by time \
///       --context data/train_meta.parquet --targets azimuth,zenith \
///       --join data/sensor_geometry.csv --on sensor_id \
///       --features x,y,z,time,charge,auxiliary --categorical sensor_id \
///       --encode time=zscore --encode charge=log1p --max-len 128 --val-fraction 0.1 \
///       --seed 42 --out cache
///
/// A table of records (no --key: every row one sample, no step axis):
///   dsc compile data/records.parquet --features age,income --categorical region \
///       --encode bloomfilter=bits --targets churned --val-fraction 0.1 --out cache
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CompileArgs {
    /// Read the spec from a TOML file; command-line flags override its values.
    #[arg(long, value_name = "FILE", help_heading = "Spec")]
    pub spec: Option<PathBuf>,
    /// Print the resolved spec as TOML and exit without compiling.
    #[arg(long, help_heading = "Spec")]
    pub print_spec: bool,

    #[command(flatten)]
    pub keys: SpecArgs,

    /// Cache directory to create, or a URL in object storage (s3://bucket/cache, gs://…,
    /// az://…): the cache is compiled under --cache-dir, then uploaded with its manifest last,
    /// so that a reader finds no cache or the whole one.
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub out: Option<PathBuf>,
    /// Replace --out if it exists and is not empty (at a URL: a cache there).
    ///
    /// The new cache takes the old one's place in one atomic rename; the old one is then
    /// removed by a dsc process of its own, after this command has returned.
    #[arg(long, help_heading = "Output")]
    pub force: bool,
    /// Memory the compile may use, e.g. 4GiB [default: half of the machine's, or of the
    /// container's limit]. The input is
    /// spilled beside --out in buckets and processed a few buckets at a time; the cache is
    /// byte-identical whatever the budget.
    #[arg(long, value_name = "SIZE", help_heading = "Output")]
    pub max_memory: Option<String>,
    #[command(flatten)]
    pub storage: StorageArgs,
    /// Print a JSON report instead of text.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
    /// Also print where the time went: each stage's wall seconds, then each phase's
    /// thread-seconds (footers, decode, spill, load, grouping, ordering, join, statistics,
    /// encode, shuffle, write, checksums, commit) summed over the threads that ran it, with its
    /// share. `--json` always carries both (`timings`, `phases`).
    #[arg(long, help_heading = "Output")]
    pub timings: bool,
    /// No progress bars.
    #[arg(long, short, help_heading = "Output")]
    pub quiet: bool,
    /// Run one stage of one partition of this compile (with --stage): `I/N`, or `auto` (`auto/N`)
    /// to take I (and N) from a Slurm job array or a Kubernetes Indexed Job. Stages run in order,
    /// each across all partitions, on machines sharing --out's file system; `dsc merge OUT`
    /// commits. The cache is byte-identical to a compile in one process. See docs/SCALE.md.
    #[arg(
        long,
        value_name = "I/N",
        help_heading = "Partitions",
        requires = "stage"
    )]
    pub partition: Option<String>,
    /// The stage this partition runs: `scan` (read its share of the rows files into buckets),
    /// `fit` (statistics of its buckets, after every scan), `write` (shards of its buckets,
    /// after every fit).
    #[arg(long, value_parser = choice::<Stage>(), help_heading = "Partitions", requires = "partition")]
    pub stage: Option<Stage>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Summarize a cache: splits, shards, tensors, column statistics, lengths.
///
/// One screen: format and dsc version, the inputs' fingerprint, contexts and bytes per split,
/// padding efficiency (stored steps / padded steps), every tensor with its columns and
/// encodings, per-column statistics and the sequence-length histogram.
///
/// Example:
///   dsc inspect cache
///   dsc inspect cache --column charge
///   dsc inspect cache --shards
///   dsc inspect cache --json | jq .padding_efficiency
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct InspectArgs {
    /// The cache directory, or its URL in object storage (s3://bucket/cache, gs://…, az://…,
    /// https://…).
    pub cache: PathBuf,
    /// Show one column in depth: quantiles per split, histogram, top vocabulary values.
    #[arg(long, value_name = "NAME")]
    pub column: Option<String>,
    /// List every shard: split, contexts, bytes, checksum.
    #[arg(long)]
    pub shards: bool,
    /// Vocabulary values shown with --column.
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub top: usize,
    /// Print JSON (see docs/FORMAT.md, "inspect --json").
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub at: GenerationArgs,
}

/// Show one context, decoded back to source units.
///
/// Each stored value goes back through the inverse of its encoding: z-scores and min-max values
/// to numbers, log1p through exp − 1, timestamps to the source's ticks, category codes to their
/// values (null for the null code, "<unknown>" for values outside the train vocabulary).
/// Values are exact to f32 precision. --raw shows the stored numbers instead.
///
/// Example:
///   dsc show cache --split train --index 0
///   dsc show cache --split val --key 4217 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ShowArgs {
    /// The cache directory, or its URL in object storage (only the shard that holds the
    /// context is fetched; with --key, the split's shards in order until one holds it).
    pub cache: PathBuf,
    /// The split.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Position in the split's compiled order (0-based).
    #[arg(long, conflicts_with = "key", required_unless_present = "key")]
    pub index: Option<usize>,
    /// The context's key as the data holds it: an integer, a string, or a UUID (with or
    /// without dashes).
    #[arg(long, allow_hyphen_values = true)]
    pub key: Option<String>,
    /// Stored (encoded) numbers and codes instead of source values.
    #[arg(long)]
    pub raw: bool,
    /// Print JSON: {"key", "split", "length", "columns": {NAME: [values…]}, "targets": {…}, …}.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub at: GenerationArgs,
}

/// Write a self-contained HTML report with plots of a cache.
///
/// One page, no network: sequence-length histogram, a histogram per numeric column, shard
/// sizes and split sizes, drawn as inline SVG.
///
/// Example:
///   dsc report cache -o report.html
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ReportArgs {
    /// The cache directory, or its URL in object storage (only its manifest and statistics
    /// are read).
    pub cache: PathBuf,
    /// The HTML file to write.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub at: GenerationArgs,
}

/// Print the order the loader yields: keys per batch, a shuffle-quality report, or a state.
///
/// The order of an epoch is a pure function of the cache, --seed, --epoch and --window:
/// shards are permuted per epoch and contexts inside windows of --window contexts. Ranks take
/// disjoint slices of one global order, so for a fixed global batch (batch size x world size)
/// the order does not depend on the number of ranks.
///
/// With --pack T, batches are packs: whole sequences laid end to end in T tokens (at most
/// --max-seqs sequences), one pack per rank and step, cut from the same shuffled order; the
/// report gives the token efficiency of the packs beside the padding efficiency of padded and
/// length-bucketed batches of --batch-size over the same epoch.
///
/// With several caches, the order of their mix: every window of --window positions holds each
/// cache in the proportions of --weights (default: their sizes); an epoch is --mix-samples
/// positions (default: the caches' contexts together), and a cache that runs out continues
/// with its own next epoch. The report gives each cache's realised share.
///
/// Example:
///   dsc order cache --epoch 3 --batch-size 256              (quality report)
///   dsc order cache --epoch 3 --batch-size 64 --keys | head
///   dsc order cache --pack 32768 --json                     (token efficiency of packs)
///   dsc order cache --bucket --trim-multiple 32              (the batch shapes on a GPU)
///   dsc order cache --batch-size 64 --state-after 100 > state.json
///   dsc order cache --batch-size 32 --world-size 2 --rank 1 --from-state state.json --keys
///   dsc order web-cache books-cache --weights 0.7,0.3 --json  (a mix's realised shares)
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct OrderArgs {
    /// The cache directory (or its URL in object storage: s3://…, gs://…, az://…, https://…);
    /// several: their mix.
    #[arg(required = true, value_name = "CACHE")]
    pub caches: Vec<PathBuf>,
    #[command(flatten)]
    pub epoch: dsc_loader::args::EpochArgs,
    #[command(flatten)]
    pub batch: dsc_loader::args::BatchArgs,
    #[command(flatten)]
    pub rank: dsc_loader::args::RankArgs,
    #[command(flatten)]
    pub mix: dsc_loader::args::MixArgs,
    #[command(flatten)]
    pub shape: dsc_loader::args::ShapeArgs,
    /// Print the keys of each batch, one batch per line.
    #[arg(long, conflicts_with = "state_after")]
    pub keys: bool,
    /// Print the resume state after N batches (JSON), to feed back with --from-state.
    #[arg(long, value_name = "N")]
    pub state_after: Option<usize>,
    /// Start where a saved state left off (its epoch, seed and position win over the flags).
    #[arg(long, value_name = "FILE")]
    pub from_state: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub at: GenerationArgs,
}

/// Measure the loader on a cache: cache-order and shuffled epochs against memcpy.
///
/// In one run: open time; an epoch in cache order (zero-copy views, every byte read); shuffled
/// epochs with 1 and N threads (one gather copy per byte); memcpy of the same bytes; and the
/// peak resident memory while loading. Each figure is the fastest of --repeat epochs, and ratios
/// are within the run, so machine noise mostly cancels. With --bucket, also a shuffled epoch of
/// length-bucketed, trimmed batches; with --pack T, a shuffled epoch of packed batches of T
/// tokens. The shuffled passes take the order's flags (--seed, --window, …); the cache-order
/// pass reads the same split unshuffled. A compressed cache also reports its decompression
/// speed.
///
/// Example:
///   dsc bench cache
///   dsc bench cache --batch-size 512 --json
///   dsc bench cache --bucket --pack 32768 --repeat 5
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// The cache directory, or its URL in object storage (s3://bucket/cache, gs://…, az://…,
    /// https://…): its shards are fetched as the loader reads them.
    pub cache: PathBuf,
    #[command(flatten)]
    pub epoch: dsc_loader::args::EpochArgs,
    #[command(flatten)]
    pub batch: dsc_loader::args::BatchArgs,
    /// Loader threads for the multi-threaded run [default: all cores; an uncompressed split
    /// that fits a quarter of memory runs at most one per core].
    #[arg(long)]
    pub loader_threads: Option<usize>,
    /// Load only these tensors, comma-separated (e.g. x,length,y) [default: all]; memcpy then
    /// counts their bytes only.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub columns: Vec<String>,
    /// Each pass (and memcpy) is the fastest of N epochs: short passes on a shared machine
    /// vary by tens of percent from run to run. (A compressed cache's decompression is timed
    /// once, on the first memcpy pass.)
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub repeat: usize,
    /// Also time a shuffled epoch with length-bucketed, trimmed batches (`dsc order --bucket`)
    /// and report its contexts/s and padding efficiency next to the plain one.
    #[arg(long)]
    pub bucket: bool,
    /// Also time a shuffled epoch of packed batches of T tokens (`dsc order --pack`) and report
    /// its contexts/s and token efficiency next to the plain one.
    #[arg(long, value_name = "T")]
    pub pack: Option<usize>,
    /// Also time a shuffled epoch of the mix of the cache with these caches (repeat it for
    /// more), drawn by --weights (or their sizes) and, with --schedule, by the schedule: the
    /// cost of a mix and of a schedule in one run.
    #[arg(long = "mix", value_name = "CACHE")]
    pub mix_with: Vec<PathBuf>,
    #[command(flatten)]
    pub mix: dsc_loader::args::MixArgs,
    /// Print JSON (fields: contexts_per_s_shuffled, gbps_shuffled, gbps_sequential, gbps_memcpy
    /// (1 thread), gbps_memcpy_threads (as many threads as the loader ran),
    /// shuffled_over_memcpy_threads, shuffled_1_thread_over_memcpy, open_ms, peak_rss_mib, …;
    /// with --bucket also
    /// contexts_per_s_bucketed, gbps_bucketed, bucketed_over_shuffled,
    /// padding_efficiency_bucketed, padding_efficiency_shuffled; with --pack also
    /// contexts_per_s_packed, gbps_packed, packed_over_shuffled, token_efficiency_packed; with
    /// --mix also contexts_per_s_mixed, and with --schedule contexts_per_s_scheduled and
    /// scheduled_over_mixed; docs/PERFORMANCE.md lists all).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub at: GenerationArgs,
}

/// mostlyai-engine's digit split (`split_sub_columns_digit`) of raw float64 values, timed.
///
/// Reads IN (little-endian f64, 8 bytes per value), splits every value into the engine's `nan`,
/// `neg` and digit sub-columns E18..E-20 (exactly as mostlyai-engine 2.7.3 does), and writes them
/// to --out as bytes, 41 per value. Prints the split time (file I/O excluded).
///
/// Example:
///   dsc digit-split values.f64 --out digits.u8 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DigitSplitArgs {
    /// Raw little-endian float64 values.
    pub input: PathBuf,
    /// Where to write the digits (41 bytes per value: nan, neg, E18..E-20); omit to only time.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print JSON (fields: values, seconds).
    #[arg(long)]
    pub json: bool,
}

/// Check a cache against its manifest: sizes, headers, checksums, and every stored value.
///
/// Reads every shard: size, safetensors header, xxh3 checksum, then the values the format
/// allows: lengths within 0..=L and at most the full length, zero padding, category codes within
/// the vocabulary, no NaN or infinity, bools of 0 or 1, every key once across all shards; and
/// stats.json describing the manifest's splits. Each problem names shard, tensor and sample.
/// Exits 0 when sound, 1 naming each problem, 2 when the cache cannot be read at all.
///
/// Example:
///   dsc verify cache
///   dsc verify cache --quick     (sizes, headers and the statistics' splits only)
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct VerifyArgs {
    /// The cache directory, or its URL in object storage (s3://bucket/cache, gs://…, az://…,
    /// https://…): each shard is fetched (and checked on arrival) in turn.
    pub cache: PathBuf,
    /// Check sizes and headers only (reads a few KiB per shard).
    #[arg(long)]
    pub quick: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub at: GenerationArgs,
}

/// The flags of `dsc compile` whose spelling is not the spec file's, serialised as the spec
/// holds them: `COL=CHAIN` and `NAME=FILE` pairs as tables (each name once), sizes with a unit
/// as bytes. The error names the flag and the value.
mod pairs {
    use serde::ser::{Error, SerializeMap};
    use serde::Serializer;

    fn table<S: Serializer>(
        given: &[String],
        s: S,
        (flag, what): (&str, &str),
        example: &str,
        twice: &str,
    ) -> Result<S::Ok, S::Error> {
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for g in given {
            let Some((name, value)) = g.split_once('=') else {
                return Err(S::Error::custom(format!(
                    "{flag} {g:?}: expected {example}"
                )));
            };
            let (name, value) = (name.trim(), value.trim());
            if let Some((_, earlier)) = seen.iter().find(|(n, _)| *n == name) {
                return Err(S::Error::custom(format!(
                    "{flag} names {what} {name:?} twice ({earlier} and {value}): {twice}"
                )));
            }
            seen.push((name, value));
        }
        let mut map = s.serialize_map(Some(seen.len()))?;
        for (name, value) in seen {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }

    pub fn encode<S: Serializer>(given: &[String], s: S) -> Result<S::Ok, S::Error> {
        table(
            given,
            s,
            ("--encode", "column"),
            "COLUMN=CHAIN, e.g. charge=log1p,zscore",
            "one encoding per column",
        )
    }

    pub fn split_keys<S: Serializer>(given: &[String], s: S) -> Result<S::Ok, S::Error> {
        table(
            given,
            s,
            ("--split-keys", "split"),
            "NAME=FILE, e.g. test=test_ids.txt",
            "list a split's keys in one file",
        )
    }

    fn size<S: Serializer>(flag: &str, given: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        let text = given.as_deref().unwrap_or_default();
        match dsc_format::spec::parse_size(text) {
            Ok(bytes) => s.serialize_u64(bytes),
            Err(e) => Err(S::Error::custom(format!("{flag} {text:?}: {e}"))),
        }
    }

    pub fn shard_size<S: Serializer>(given: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        size("--shard-size", given, s)
    }

    pub fn bucket_size<S: Serializer>(given: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        size("--bucket-size", given, s)
    }

    /// A path as the spec holds it: text, as the command line gave it (a path that is not
    /// UTF-8 keeps a replacement character, and the compile names the file it cannot open).
    pub fn path<S: Serializer>(
        given: &Option<std::path::PathBuf>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let path = given.as_deref().unwrap_or_else(|| std::path::Path::new(""));
        s.serialize_str(&path.display().to_string())
    }
}

/// For a flag a command does not take but `dsc order` does (a loader option: `dsc bench
/// --world-size 2`), what to say instead of clap's tip (to pass it as a value after `--`): that
/// it is `dsc order`'s, and exactly which loader flags this command takes. `args`: the command
/// line, without the program's name.
pub fn loader_flag_elsewhere(e: &clap::Error, args: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::{Args as _, CommandFactory};
    use dsc_loader::args as loader;
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(given)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = given
        .split('=')
        .next()
        .unwrap_or(given)
        .trim_start_matches('-');
    let longs = |c: &clap::Command| -> Vec<String> {
        c.get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect()
    };
    // The loader's options, as every front end of the loader spells them.
    let mut options = clap::Command::new("loader");
    options = loader::EpochArgs::augment_args(options);
    options = loader::BatchArgs::augment_args(options);
    options = loader::RankArgs::augment_args(options);
    options = loader::MixArgs::augment_args(options);
    options = loader::ShapeArgs::augment_args(options);
    let options = longs(&options);
    if !options.iter().any(|l| l == flag) {
        return None;
    }
    let cli = Cli::command();
    let command = args
        .iter()
        .filter_map(|a| a.to_str())
        .find(|w| cli.find_subcommand(w).is_some())?;
    if command == "order" {
        return None;
    }
    let mine: Vec<String> = longs(cli.find_subcommand(command)?)
        .into_iter()
        .filter(|l| options.contains(l))
        .map(|l| format!("--{l}"))
        .collect();
    Some(format!(
        "dsc {command} takes no --{flag}: it is a loader option of `dsc order` (the order and \
         batches a loader delivers). Of the loader's options, dsc {command} takes {}",
        mine.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent() {
        Cli::command().debug_assert();
    }

    /// A loader flag has one help text in every command that has it: the commands flatten the
    /// loader's groups, and a command's own flag of the same name is listed here with why.
    #[test]
    fn a_loader_flag_reads_the_same_in_every_command() {
        // `dsc bench --bucket/--pack` also time a bucketed or packed epoch next to the plain one;
        // `--seed` of `compile` (and of `append`, which must give the cache's) seeds the cache's
        // global shuffle, of `gen` the generated data.
        let own = [
            ("bench", "bucket"),
            ("bench", "pack"),
            ("compile", "seed"),
            ("append", "seed"),
            ("gen", "seed"),
        ];
        let other = dsc_loader::args::flags_with_other_help(&Cli::command(), &own);
        assert!(
            other.is_empty(),
            "flags that restate a loader flag: {other:?}"
        );
    }

    /// Every spec key has its flag (`--join FILE --on COL` together give `joins`), and every
    /// flag of the spec half is a key: a key added to the spec without a flag fails here.
    #[test]
    fn the_spec_flags_are_the_spec_keys() {
        let cmd = SpecArgs::augment_args(clap::Command::new("t"));
        let mut flags: Vec<String> = cmd
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .filter(|id| id != "join_on")
            .collect();
        let mut keys: Vec<String> = dsc_format::spec::SPEC_KEYS
            .iter()
            .map(|k| k.to_string())
            .collect();
        flags.sort();
        keys.sort();
        assert_eq!(flags, keys);
    }

    #[test]
    fn lists_split_on_commas() {
        let cli = Cli::parse_from([
            "dsc",
            "compile",
            "a.parquet",
            "--features",
            "x,y",
            "--encode",
            "x=log1p,zscore",
        ]);
        let Command::Compile(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.keys.features, ["x", "y"]);
        assert_eq!(a.keys.encode, ["x=log1p,zscore"]);
    }
}
