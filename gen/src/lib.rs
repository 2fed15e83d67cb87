//! Seeded generators of sample input data: Parquet files shaped like the data sets dsc is built
//! for, so that tests, benchmarks and the user guide need no download.
//!
//! - [`icecube`]: the layout of the Kaggle IceCube "Neutrinos in Deep Ice" data (one row per
//!   sensor pulse, contiguous per event, a metadata table with the targets, the sensor geometry).
//! - [`sequences`]: customer transactions whose rows are scattered across files, with a context
//!   table per customer.
//!
//! Every value is drawn from [`dsc_format::rng::Xoshiro256`], never from `rand`, so the same
//! options give the same bytes in every release (on one platform: `ln`, `exp` and the
//! trigonometric functions come from its maths library, which may round the last bit differently
//! elsewhere). Each file is written under a temporary name in its final folder and renamed when
//! complete: an interrupted run never leaves a half-written file that a later compile could
//! mistake for input. Files of an earlier run into the same folder are overwritten, not removed:
//! use a fresh folder when the number of files shrinks.
//!
//! ```
//! use dsc_gen::icecube::{generate, IcecubeOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let opts = IcecubeOptions { files: 2, events_per_file: 100, seed: 7, ..Default::default() };
//! let written = generate(dir.path(), &opts)?;
//! assert_eq!(written.contexts, 200);
//! assert!(dir.path().join("train/batch_1.parquet").is_file());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod icecube;
pub mod linkage;
pub mod microbiome;
pub mod sequences;
pub mod series;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, Schema};
use dsc_format::rng::Xoshiro256;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

/// A failure to write generated data; every variant names the file concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenError {
    /// Creating, writing or renaming a file or folder failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The Parquet writer failed.
    #[error("{path}: cannot write Parquet: {source}")]
    Parquet {
        /// The Parquet file.
        path: PathBuf,
        /// The writer's error.
        source: ParquetError,
    },
    /// The CSV writer failed.
    #[error("{path}: cannot write CSV: {source}")]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// The writer's error.
        source: csv::Error,
    },
    /// A record batch could not be assembled (a bug in the generator, reported rather than
    /// panicking).
    #[error("{path}: cannot build a record batch: {source}")]
    Arrow {
        /// The file the batch was for.
        path: PathBuf,
        /// Arrow's error.
        source: ArrowError,
    },
    /// The options cannot produce a data set (for example zero files).
    #[error("invalid generator options: {reason}")]
    InvalidOptions {
        /// What is wrong.
        reason: String,
    },
}

/// What a generator wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenSummary {
    /// Every file written, in a fixed order: the rows files first, then the context table and any
    /// side files.
    pub files: Vec<PathBuf>,
    /// Rows written to the rows table (pulses, transactions).
    pub rows: u64,
    /// Contexts described (events, customers), including those without rows.
    pub contexts: u64,
}

/// The seeded generator behind all sample data: [`Xoshiro256`] plus the few distributions the
/// generators need, each built only from its uniform draws so results do not depend on any
/// external crate's sampling code.
#[derive(Debug, Clone)]
pub struct Rng {
    inner: Xoshiro256,
    // Box–Muller yields normals in pairs; keeping the second halves the cost of `normal`.
    spare_normal: Option<f64>,
}

impl Rng {
    /// The generator for one purpose (`stream`) of one user seed.
    pub fn new(seed: u64, stream: u64) -> Self {
        Rng {
            inner: Xoshiro256::for_stream(seed, stream),
            spare_normal: None,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// A uniform integer in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.inner.below(bound)
    }

    /// A uniform `f64` in `[0, 1)`.
    pub fn unit_f64(&mut self) -> f64 {
        self.inner.unit_f64()
    }

    /// A uniform `f64` in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit_f64()
    }

    /// `true` with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.unit_f64() < p
    }

    /// A standard normal draw (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.unit_f64();
        let u2 = self.unit_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        self.spare_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// A log-normal draw with the given median (`exp(mu)`) and `sigma` of the logarithm.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// An exponential draw with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit_f64()).ln()
    }

    /// Fisher–Yates shuffle of `items`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        self.inner.shuffle(items);
    }
}

/// Writer properties shared by all generated Parquet files: Snappy like most real exports, and
/// row groups small enough that larger files have several, so readers are exercised on both.
fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build()
}

/// Rows per Parquet row group in generated files.
const ROW_GROUP_ROWS: usize = 131_072;

/// A schema from `(name, type, nullable)` triples.
fn schema(fields: &[(&str, arrow_schema::DataType, bool)]) -> Arc<Schema> {
    let fields: Vec<_> = fields
        .iter()
        .map(|(n, t, null)| arrow_schema::Field::new(*n, t.clone(), *null))
        .collect();
    Arc::new(Schema::new(fields))
}

impl GenError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GenError + '_ {
        |source| GenError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn parquet(path: &Path) -> impl FnOnce(ParquetError) -> GenError + '_ {
        |source| GenError::Parquet {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Creates `dir` and its parents.
fn create_dir(dir: &Path) -> Result<(), GenError> {
    std::fs::create_dir_all(dir).map_err(GenError::io(dir))
}

/// A file being written under a temporary name beside its destination; removed on drop unless
/// committed, so an error or a panic leaves nothing behind.
#[derive(Debug)]
struct TempFile {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl TempFile {
    fn create(target: &Path) -> Result<(Self, File), GenError> {
        let name = target.file_name().unwrap_or_default().to_string_lossy();
        // A leading dot keeps the partial file out of `*.parquet` globs; the pid keeps two
        // concurrent runs on one folder from writing the same temporary file.
        let tmp = target.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let file = File::create(&tmp).map_err(GenError::io(&tmp))?;
        let target = target.to_path_buf();
        Ok((
            TempFile {
                tmp,
                target,
                committed: false,
            },
            file,
        ))
    }

    fn commit(mut self, file: File) -> Result<(), GenError> {
        // Flush to disk before the rename, or a crash could leave the final name on an empty
        // file.
        file.sync_all().map_err(GenError::io(&self.target))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.target).map_err(GenError::io(&self.target))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A Parquet file written batch by batch and published atomically by [`ParquetSink::finish`].
#[derive(Debug)]
struct ParquetSink {
    temp: TempFile,
    writer: ArrowWriter<File>,
    schema: Arc<Schema>,
}

impl ParquetSink {
    fn create(path: &Path, schema: Arc<Schema>) -> Result<Self, GenError> {
        let (temp, file) = TempFile::create(path)?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(writer_properties()))
            .map_err(GenError::parquet(path))?;
        Ok(ParquetSink {
            temp,
            writer,
            schema,
        })
    }

    /// Appends one batch built from `columns`, in schema order.
    fn write(&mut self, columns: Vec<arrow_array::ArrayRef>) -> Result<(), GenError> {
        let path = &self.temp.target;
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(|source| {
            GenError::Arrow {
                path: path.clone(),
                source,
            }
        })?;
        self.writer.write(&batch).map_err(GenError::parquet(path))
    }

    fn finish(self) -> Result<PathBuf, GenError> {
        let path = self.temp.target.clone();
        let file = self.writer.into_inner().map_err(GenError::parquet(&path))?;
        self.temp.commit(file)?;
        Ok(path)
    }
}

/// Writes `bytes` to `path` atomically.
fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), GenError> {
    use std::io::Write;
    let (temp, mut file) = TempFile::create(path)?;
    file.write_all(bytes).map_err(GenError::io(path))?;
    temp.commit(file)
}

/// Reading generated files back, for the generators' tests.
#[cfg(test)]
mod test_support {
    use std::path::{Path, PathBuf};

    use arrow_array::cast::AsArray;
    use arrow_array::types::ArrowPrimitiveType;
    use arrow_array::{Array, RecordBatch};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::{GenError, GenSummary};

    /// All batches of one Parquet file, read back column by column.
    pub struct Table(pub Vec<RecordBatch>);

    impl Table {
        pub fn read(path: &Path) -> Table {
            let file = std::fs::File::open(path).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
            Table(reader.build().unwrap().map(Result::unwrap).collect())
        }
        pub fn dtype(&self, name: &str) -> arrow_schema::DataType {
            self.0[0]
                .schema()
                .field_with_name(name)
                .unwrap()
                .data_type()
                .clone()
        }
        pub fn rows(&self) -> usize {
            self.0.iter().map(RecordBatch::num_rows).sum()
        }
        fn map<T>(&self, name: &str, f: impl Fn(&dyn Array, usize) -> T) -> Vec<T> {
            let column = |b: &RecordBatch| {
                let a = b[name].as_ref();
                (0..a.len()).map(|i| f(a, i)).collect::<Vec<_>>()
            };
            self.0.iter().flat_map(column).collect()
        }
        pub fn opt<T: ArrowPrimitiveType>(&self, name: &str) -> Vec<Option<T::Native>> {
            self.map(name, |a, i| {
                a.is_valid(i).then(|| a.as_primitive::<T>().value(i))
            })
        }
        /// A column that must have no nulls.
        pub fn col<T: ArrowPrimitiveType>(&self, name: &str) -> Vec<T::Native> {
            self.opt::<T>(name)
                .into_iter()
                .map(Option::unwrap)
                .collect()
        }
        pub fn i64s(&self, name: &str) -> Vec<i64> {
            self.col::<arrow_array::types::Int64Type>(name)
        }
        pub fn f64s(&self, name: &str) -> Vec<f64> {
            self.col::<arrow_array::types::Float64Type>(name)
        }
        pub fn strs(&self, name: &str) -> Vec<Option<String>> {
            self.map(name, |a, i| {
                a.is_valid(i).then(|| a.as_string::<i32>().value(i).into())
            })
        }
        pub fn bools(&self, name: &str) -> Vec<bool> {
            self.map(name, |a, i| a.as_boolean().value(i))
        }
    }

    /// Runs `gen` in a fresh folder on `threads` threads and returns every file it wrote, relative
    /// to the folder, with its bytes, after checking that it left nothing else there.
    pub fn run<F>(threads: usize, gen: F) -> Vec<(PathBuf, Vec<u8>)>
    where
        F: FnOnce(&Path) -> Result<GenSummary, GenError> + Send,
    {
        fn count(dir: &Path) -> usize {
            let entries = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
            entries
                .map(|p| if p.is_dir() { count(&p) } else { 1 })
                .sum()
        }
        let dir = tempfile::tempdir().unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let summary = pool.install(|| gen(dir.path())).unwrap();
        assert_eq!(
            count(dir.path()),
            summary.files.len(),
            "no temporary files remain"
        );
        let rel = |f: &PathBuf| f.strip_prefix(dir.path()).unwrap().to_path_buf();
        summary
            .files
            .iter()
            .map(|f| (rel(f), std::fs::read(f).unwrap()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_are_seeded_and_plausible() {
        let draw = |seed| {
            let mut rng = Rng::new(seed, 7);
            (0..20_000).map(|_| rng.normal()).collect::<Vec<_>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1));
        assert_ne!(a, draw(2));
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );

        let mut rng = Rng::new(3, 0);
        let mut logn: Vec<f64> = (0..20_001).map(|_| rng.lognormal(50.0, 0.9)).collect();
        logn.sort_by(f64::total_cmp);
        assert!((45.0..55.0).contains(&logn[10_000]), "{}", logn[10_000]);
        let hits = (0..20_000).filter(|_| rng.bernoulli(0.2)).count();
        assert!((3_700..4_300).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| (-2.0..3.0).contains(&rng.uniform(-2.0, 3.0))));
    }

    #[test]
    fn failed_write_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.parquet");
        {
            let (_guard, _file) = TempFile::create(&target).unwrap();
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        write_bytes(&target, b"ok").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"ok");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
