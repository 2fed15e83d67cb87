//! Shared helpers of the end-to-end tests: a fresh directory per test, the real `dsc` binary,
//! sample data from the generators, and an independent reader of the shards (the `safetensors`
//! crate) and of the source Parquet (the `parquet` crate).

#![allow(dead_code)]

mod allocations;
pub use allocations::large_allocations_on_this_thread;
mod s3;
pub use s3::{python, S3Server};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

/// A test's own directory, removed when the test ends.
pub struct Dir {
    pub tmp: tempfile::TempDir,
}

impl Dir {
    pub fn new() -> Dir {
        Dir {
            tmp: tempfile::Builder::new()
                .prefix("dsc-e2e-")
                .tempdir()
                .expect("tempdir"),
        }
    }
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }
}

/// The result of running the binary, with everything needed to understand a failure.
pub struct Run {
    pub cmd: String,
    /// Where it ran.
    pub cwd: PathBuf,
    pub out: Output,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    pub fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
    fn describe(&self) -> String {
        // Where it ran and what was there: a failing compile is often a missing or stray file.
        let listing: Vec<String> = std::fs::read_dir(&self.cwd)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        format!(
            "command: {}\nin: {} (holding {:?})\nexit: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.cmd,
            self.cwd.display(),
            listing,
            self.out.status,
            self.stdout(),
            self.stderr()
        )
    }
    /// Asserts success and returns stdout.
    pub fn ok(&self) -> String {
        assert!(
            self.out.status.success(),
            "expected success\n{}",
            self.describe()
        );
        self.stdout()
    }
    /// Asserts failure with `code` and returns stderr.
    pub fn fails(&self, code: i32) -> String {
        assert_eq!(
            self.code(),
            code,
            "expected exit {code}\n{}",
            self.describe()
        );
        self.stderr()
    }
}

/// A batch as its sequence length and its tensors' names and bytes.
pub type Copied = (usize, Vec<(String, Vec<u8>)>);

/// Every batch of one epoch of `cache` with `o`, copied out.
pub fn epoch_of(cache: &dsc_loader::Cache, o: dsc_loader::LoaderOptions) -> Vec<Copied> {
    cache
        .loader(o)
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            let tensors = b
                .tensors()
                .iter()
                .map(|t| (t.name().to_string(), t.bytes().to_vec()))
                .collect();
            (b.seq_len, tensors)
        })
        .collect()
}

/// Runs `dsc` with `args` in `cwd`.
pub fn dsc(cwd: &Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run dsc");
    Run {
        cmd: format!("dsc {}", args.join(" ")),
        cwd: cwd.to_path_buf(),
        out,
    }
}

/// The caches that forced compiles into `dir/name` replaced and that are still beside it
/// (`.NAME.PID-N.dsc-old`, each removed by a process of its own after its compile returned).
pub fn replaced_left(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!(".{name}.");
    let mut left: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read_dir")
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().into_owned();
            let unique = n.strip_prefix(&prefix)?.strip_suffix(".dsc-old")?;
            unique
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'-')
                .then(|| dir.join(&n))
        })
        .collect();
    left.sort();
    left
}

/// Waits (a minute at most) until the caches replaced beside `dir/name` are removed.
pub fn wait_replaced_removed(dir: &Path, name: &str) {
    let start = std::time::Instant::now();
    while !replaced_left(dir, name).is_empty() {
        assert!(
            start.elapsed().as_secs() < 60,
            "still there after a minute: {:?}",
            replaced_left(dir, name)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Generates IceCube-like data under `dir/data`.
pub fn gen_icecube(dir: &Dir, files: usize, events: usize) {
    let (files, events) = (files.to_string(), events.to_string());
    dsc(
        dir.path(),
        &[
            "gen",
            "icecube",
            "--out",
            "data",
            "--files",
            &files,
            "--events-per-file",
            &events,
            "--seed",
            "7",
        ],
    )
    .ok();
}

/// A small IceCube-like cache at `dir/cache` (2 files of 150 events, 256 KiB shards): the
/// README's compile command on `gen_icecube` data.
pub fn small_icecube_cache() -> Dir {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 150);
    dsc(
        dir.path(),
        &icecube_args("cache", &["--shard-size", "256KiB"]),
    )
    .ok();
    dir
}

/// Generates the customer/transaction data under `dir/seq`.
/// A hot cache of many small shards (more than the loader keeps decompressed at once) and the
/// same cache compressed by `dsc compile --compress zstd`, in `dir/hot` and `dir/cold`.
pub fn hot_and_cold_caches(dir: &Dir) -> (PathBuf, PathBuf) {
    gen_icecube(dir, 2, 300);
    dsc(dir.path(), &icecube_args("hot", &["--shard-size", "48KiB"])).ok();
    dsc(
        dir.path(),
        &icecube_args("cold", &["--shard-size", "48KiB", "--compress", "zstd"]),
    )
    .ok();
    (dir.join("hot"), dir.join("cold"))
}

pub fn gen_sequences(dir: &Dir, customers: usize, files: usize) {
    let (customers, files) = (customers.to_string(), files.to_string());
    dsc(
        dir.path(),
        &[
            "gen",
            "sequences",
            "--out",
            "seq",
            "--customers",
            &customers,
            "--files",
            &files,
            "--seed",
            "3",
        ],
    )
    .ok();
}

/// `dsc gen sequences` into `out`: `customers` over 3 files with `seed`, and `extra` flags
/// (`--key-type`, `--layout`).
pub fn gen_sequences_as(dir: &Dir, out: &str, (customers, seed): (usize, u64), extra: &[&str]) {
    let (customers, seed) = (customers.to_string(), seed.to_string());
    let mut args = vec![
        "gen",
        "sequences",
        "--out",
        out,
        "--customers",
        &customers,
        "--files",
        "3",
        "--seed",
        &seed,
    ];
    args.extend_from_slice(extra);
    dsc(dir.path(), &args).ok();
}

/// The README's compile command on `data/`, writing to `out`, plus `extra` flags.
/// The customer-transactions compile (keys scattered over every file, a context table, a
/// log1p-zscore chain, a categorical, dropped empty contexts) on `gen_sequences` data.
pub fn sequences_args(out: &str) -> Vec<String> {
    [
        "compile",
        "seq/transactions",
        "--key",
        "customer_id",
        "--order-by",
        "ts",
        "--context",
        "seq/customers.parquet",
        "--targets",
        "lifetime_value",
        "--features",
        "amount,items",
        "--categorical",
        "merchant_category",
        "--encode",
        "amount=log1p,zscore",
        "--nan",
        "mean",
        "--empty-contexts",
        "drop",
        "--val-fraction",
        "0.3",
        "--shard-size",
        "64KiB",
        "--out",
        out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn icecube_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "compile",
        "data/train/batch_*.parquet",
        "--key",
        "event_id",
        "--order-by",
        "time",
        "--context",
        "data/train_meta.parquet",
        "--targets",
        "azimuth,zenith",
        "--join",
        "data/sensor_geometry.csv",
        "--on",
        "sensor_id",
        "--features",
        "x,y,z,time,charge,auxiliary",
        "--categorical",
        "sensor_id",
        "--encode",
        "time=zscore",
        "--encode",
        "charge=log1p",
        "--max-len",
        "128",
        "--val-fraction",
        "0.1",
        "--seed",
        "42",
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    args
}

/// Every file under `dir` with its bytes, by relative path.
pub fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(dir)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    out
}

/// A tensor read back with the `safetensors` crate.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl Tensor {
    pub fn f32s(&self) -> Vec<f32> {
        assert_eq!(self.dtype, "F32");
        self.bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    pub fn i32s(&self) -> Vec<i32> {
        assert_eq!(self.dtype, "I32");
        self.bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    pub fn i64s(&self) -> Vec<i64> {
        assert_eq!(self.dtype, "I64");
        self.bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// All tensors of one shard file.
pub fn read_shard(path: &Path) -> BTreeMap<String, Tensor> {
    let bytes = std::fs::read(path).expect("read shard");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a valid safetensors file");
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                Tensor {
                    dtype: format!("{:?}", view.dtype()),
                    shape: view.shape().to_vec(),
                    bytes: view.data().to_vec(),
                },
            )
        })
        .collect()
}

/// The manifest as JSON.
pub fn manifest(cache: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).expect("manifest"))
        .expect("json")
}

/// One decoded context: per tensor, its sample as f64 values.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub split: String,
    pub tensors: BTreeMap<String, Vec<f64>>,
}

/// Every context of a cache by key, decoded with the `safetensors` crate, plus the key order of
/// each split.
pub fn read_cache(cache: &Path) -> (BTreeMap<i64, Sample>, BTreeMap<String, Vec<i64>>) {
    read_cache_as(cache, &manifest(cache))
}

/// [`read_cache`] of the shards manifest `m` lists (a generation's).
pub fn read_cache_as(
    cache: &Path,
    m: &serde_json::Value,
) -> (BTreeMap<i64, Sample>, BTreeMap<String, Vec<i64>>) {
    let mut samples = BTreeMap::new();
    let mut order: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for shard in m["shards"].as_array().unwrap() {
        let split = shard["split"].as_str().unwrap().to_string();
        let tensors = read_shard(&cache.join(shard["file"].as_str().unwrap()));
        let keys = tensors["key"].i64s();
        assert_eq!(keys.len() as u64, shard["contexts"].as_u64().unwrap());
        let decoded: BTreeMap<&String, Vec<f64>> = tensors
            .iter()
            .map(|(name, t)| {
                let values: Vec<f64> = match t.dtype.as_str() {
                    "F32" => t.f32s().into_iter().map(f64::from).collect(),
                    "U8" => t.bytes.iter().map(|&b| f64::from(b)).collect(),
                    "I32" => t.i32s().into_iter().map(f64::from).collect(),
                    "I64" => t.i64s().into_iter().map(|v| v as f64).collect(),
                    other => panic!("unexpected dtype {other}"),
                };
                (name, values)
            })
            .collect();
        // Rows a later generation hides (their keys replaced) are not the generation's.
        let hidden: Vec<u64> = shard["removed"].as_array().map_or(Vec::new(), |r| {
            r.iter().map(|v| v.as_u64().unwrap()).collect()
        });
        for (i, &k) in keys.iter().enumerate() {
            if hidden.contains(&(i as u64)) {
                continue;
            }
            let mut per = BTreeMap::new();
            for (name, t) in &tensors {
                let n: usize = t.shape[1..].iter().product();
                per.insert(name.clone(), decoded[name][i * n..(i + 1) * n].to_vec());
            }
            let sample = Sample {
                split: split.clone(),
                tensors: per,
            };
            assert!(samples.insert(k, sample).is_none(), "key {k} stored twice");
            order.entry(split.clone()).or_default().push(k);
        }
    }
    (samples, order)
}

/// The files of folder `folder` of `dir`, as paths relative to `dir`, sorted.
pub fn files_in(dir: &Dir, folder: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir.join(folder))
        .unwrap()
        .map(|e| format!("{folder}/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    files.sort();
    files
}

/// A Parquet file read with the `parquet` crate, column by column.
pub struct Table {
    pub batches: Vec<RecordBatch>,
}

impl Table {
    pub fn read(path: &Path) -> Table {
        let file = std::fs::File::open(path).expect("open parquet");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet")
            .build()
            .expect("reader");
        Table {
            batches: reader.map(|b| b.expect("batch")).collect(),
        }
    }
    fn arrays(&self, name: &str) -> Vec<ArrayRef> {
        self.batches
            .iter()
            .map(|b| {
                b.column_by_name(name)
                    .unwrap_or_else(|| panic!("no column {name}"))
                    .clone()
            })
            .collect()
    }
    /// Any numeric, boolean or timestamp column as optional f64 (timestamps in seconds).
    pub fn f64s(&self, name: &str) -> Vec<Option<f64>> {
        use arrow_schema::DataType as T;
        let mut out = Vec::new();
        for a in self.arrays(name) {
            for i in 0..a.len() {
                if a.is_null(i) {
                    out.push(None);
                    continue;
                }
                let v = match a.data_type() {
                    T::Float64 => a.as_primitive::<Float64Type>().value(i),
                    T::Float32 => f64::from(a.as_primitive::<Float32Type>().value(i)),
                    T::Int64 => a.as_primitive::<Int64Type>().value(i) as f64,
                    T::Int32 => f64::from(a.as_primitive::<Int32Type>().value(i)),
                    T::Int16 => f64::from(a.as_primitive::<Int16Type>().value(i)),
                    T::Boolean => f64::from(u8::from(a.as_boolean().value(i))),
                    T::Timestamp(_, _) => {
                        a.as_primitive::<TimestampMicrosecondType>().value(i) as f64 * 1e-6
                    }
                    other => panic!("column {name}: unexpected type {other:?}"),
                };
                out.push(Some(v));
            }
        }
        out
    }
    /// An integer column without nulls.
    pub fn i64s(&self, name: &str) -> Vec<i64> {
        self.f64s(name)
            .into_iter()
            .map(|v| v.expect("no nulls") as i64)
            .collect()
    }
    /// Raw Int64 or timestamp ticks.
    pub fn ticks(&self, name: &str) -> Vec<Option<i64>> {
        let mut out = Vec::new();
        for a in self.arrays(name) {
            match a.data_type() {
                arrow_schema::DataType::Int64 => out.extend(a.as_primitive::<Int64Type>().iter()),
                arrow_schema::DataType::Timestamp(_, _) => {
                    out.extend(a.as_primitive::<TimestampMicrosecondType>().iter())
                }
                other => panic!("column {name}: unexpected type {other:?}"),
            }
        }
        out
    }
    pub fn strings(&self, name: &str) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for a in self.arrays(name) {
            out.extend(a.as_string::<i32>().iter().map(|s| s.map(str::to_string)));
        }
        out
    }
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Writes a Parquet file with the given columns (for crafting bad inputs).
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    write_batches(path, &[batch]);
}

fn write_batches(path: &Path, batches: &[RecordBatch]) {
    let file = std::fs::File::create(path).expect("create");
    let mut w =
        parquet::arrow::ArrowWriter::try_new(file, batches[0].schema(), None).expect("writer");
    for b in batches {
        w.write(b).expect("write");
    }
    w.close().expect("close");
}

/// Rewrites a Parquet file with one column replaced (or added) by `f(batch index, batch)`.
pub fn replace_column(path: &Path, name: &str, f: impl Fn(usize, &RecordBatch) -> ArrayRef) {
    let table = Table::read(path);
    let mut out = Vec::new();
    for (i, batch) in table.batches.iter().enumerate() {
        let new = f(i, batch);
        let schema = batch.schema();
        let mut cols: Vec<(String, ArrayRef)> = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, c)| (f.name().clone(), c.clone()))
            .collect();
        match cols.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = new,
            None => cols.push((name.to_string(), new)),
        }
        out.push(RecordBatch::try_from_iter(cols).expect("batch"));
    }
    write_batches(path, &out);
}

/// Rewrites a Parquet file keeping only the rows where `keep(row)` holds.
pub fn filter_rows(path: &Path, keep: impl Fn(usize) -> bool) {
    let table = Table::read(path);
    let mut mask = Vec::new();
    for i in 0..table.rows() {
        mask.push(keep(i));
    }
    let mut offset = 0;
    let mut out = Vec::new();
    for batch in &table.batches {
        let m = arrow_array::BooleanArray::from(mask[offset..offset + batch.num_rows()].to_vec());
        offset += batch.num_rows();
        out.push(arrow_select_filter(batch, &m));
    }
    write_batches(path, &out);
}

fn arrow_select_filter(batch: &RecordBatch, mask: &arrow_array::BooleanArray) -> RecordBatch {
    let keep: Vec<u32> = (0..mask.len())
        .filter(|&i| mask.value(i))
        .map(|i| i as u32)
        .collect();
    let idx = arrow_array::UInt32Array::from(keep);
    let cols: Vec<ArrayRef> = batch.columns().iter().map(|c| take(c, &idx)).collect();
    RecordBatch::try_new(batch.schema(), cols).expect("filtered batch")
}

fn take(col: &ArrayRef, idx: &arrow_array::UInt32Array) -> ArrayRef {
    let data = col.to_data();
    let mut mutable = arrow_data::transform::MutableArrayData::new(vec![&data], false, idx.len());
    for i in idx.values() {
        mutable
            .try_extend(0, *i as usize, *i as usize + 1)
            .expect("in bounds");
    }
    arrow_array::make_array(mutable.freeze())
}

pub fn arc<A: Array + 'static>(a: A) -> ArrayRef {
    Arc::new(a)
}
