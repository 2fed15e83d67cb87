//! What the shape of the input costs the compile, each case against its baseline in one run:
//!
//! - keys: the same customers' transactions with int64, string and UUID keys (÷ int64);
//! - layout: one row per customer with its transactions as list columns, against the same
//!   table exploded to one row per transaction with a customer table beside it (÷ exploded);
//! - memory: the exploded and the list table handed over in memory (as `dsc.compile(table)`
//!   does: the batches registered, no file), against the exploded table from Parquet.
//!
//! Each case is compiled in alternation with the others, `DSC_BENCH_REPEATS` times; rows/s
//! counts transactions (list elements) for every case.
//!
//! cargo bench -p dsc-compiler --bench inputs
//! DSC_BENCH_CUSTOMERS=5000 DSC_BENCH_REPEATS=3 cargo bench -p dsc-compiler --bench inputs  # quick
//! DSC_BENCH_CASES=3,6 cargo bench -p dsc-compiler --bench inputs    # some cases (and their bases)

use arrow_array::RecordBatchReader;
use dsc_compiler::{compile, CompileOptions, CompileSpec, MemoryInput, NoProgress, Storage};
use dsc_gen::sequences::{generate, KeyStyle, Layout, SequencesOptions};
use std::path::Path;
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The customer compile of the tests (`tests/util`'s `sequences_args`) on `rows`, with the
/// customer table `context` (a list table is its own).
fn spec(rows: &Path, context: Option<&Path>) -> CompileSpec {
    let mut spec = CompileSpec::new(vec![rows.display().to_string()], "customer_id");
    spec.order_by = Some("ts".into());
    spec.context = context.map(|c| c.display().to_string());
    spec.targets = vec!["lifetime_value".into()];
    spec.features = vec!["amount".into(), "items".into()];
    spec.categorical = vec!["merchant_category".into()];
    spec.encode.insert("amount".into(), "log1p,zscore".into());
    spec.nan = dsc_format::spec::NanPolicy::Mean;
    spec.empty_contexts = dsc_format::spec::EmptyContexts::Keep;
    spec.val_fraction = 0.1;
    spec
}

/// One input to compile: its name, how it is generated, its rows and context table.
struct Case {
    name: &'static str,
    keys: KeyStyle,
    layout: Layout,
    /// Read into memory and registered (`MemoryInput`), not read from its files.
    memory: bool,
    /// The case this one is compared with.
    base: usize,
}

/// The Parquet files in `dir`, sorted (a compile's order).
fn files_in(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
}

/// Every batch of `files`, in order, as a table in memory.
fn in_memory(files: Vec<std::path::PathBuf>, role: &str) -> MemoryInput {
    let mut schema = None;
    let mut batches = Vec::new();
    for f in files {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&f).expect("open"),
        )
        .expect("parquet")
        .build()
        .expect("reader");
        schema = Some(reader.schema());
        batches.extend(reader.map(|b| b.expect("batch")));
    }
    MemoryInput::register(role, schema.expect("a file"), batches).expect("register")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let customers = env_usize("DSC_BENCH_CUSTOMERS", 50_000);
    let repeats = env_usize("DSC_BENCH_REPEATS", 5);
    let tmp = tempfile::tempdir().expect("tempdir");
    let case = |name, keys, layout, memory, base| Case {
        name,
        keys,
        layout,
        memory,
        base,
    };
    let cases = [
        case("int64 keys", KeyStyle::Int, Layout::Scattered, false, 0),
        case("string keys", KeyStyle::Text, Layout::Scattered, false, 0),
        case("uuid keys", KeyStyle::Uuid, Layout::Scattered, false, 0),
        case("exploded", KeyStyle::Int, Layout::Exploded, false, 3),
        case("lists", KeyStyle::Int, Layout::Lists, false, 3),
        case("exploded, memory", KeyStyle::Int, Layout::Exploded, true, 3),
        case("lists, memory", KeyStyle::Int, Layout::Lists, true, 3),
    ];
    let mut rows = 0;
    let mut inputs = Vec::new();
    let mut held = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("data-{i}"));
        let summary = generate(
            &dir,
            &SequencesOptions {
                customers,
                files: 8,
                seed: 7,
                keys: case.keys,
                layout: case.layout,
            },
        )
        .expect("generate");
        rows = summary.rows;
        let (rows_dir, context) = match case.layout {
            Layout::Lists => (dir.join("lists"), None),
            _ => (
                dir.join("transactions"),
                Some(dir.join("customers.parquet")),
            ),
        };
        if case.memory {
            let table = in_memory(files_in(&rows_dir), "rows");
            let mut spec = spec(Path::new(table.name()), None);
            held.push(table);
            if let Some(c) = context {
                let ctx = in_memory(vec![c], "context");
                spec.context = Some(ctx.name().to_string());
                held.push(ctx);
            }
            inputs.push(spec);
        } else {
            inputs.push(spec(&rows_dir, context.as_deref()));
        }
    }
    // DSC_BENCH_CASES=3,6: time those cases and their baselines only.
    let chosen: Option<Vec<usize>> = std::env::var("DSC_BENCH_CASES")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect());
    let timed = |i: usize| {
        chosen
            .as_ref()
            .is_none_or(|c| c.contains(&i) || c.iter().any(|&j| cases[j].base == i))
    };
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    // Alternating, so that a slower stretch of a shared machine falls on every case alike.
    for _ in 0..repeats {
        for (i, spec) in inputs.iter().enumerate().filter(|(i, _)| timed(*i)) {
            let opts = CompileOptions {
                out: tmp.path().join(format!("cache-{i}")),
                force: true,
                max_memory: None,
                storage: Storage::Hot,
                progress: &NoProgress,
            };
            let t = Instant::now();
            compile(spec, &opts).expect("compile");
            seconds[i].push(t.elapsed().as_secs_f64());
        }
    }
    println!(
        "{customers} customers, {rows} transactions, {} threads, median of {repeats}",
        rayon::current_num_threads()
    );
    // Each ratio is the median over repeats of (case ÷ base) within one repeat: paired, so that
    // a slow stretch of the machine weighs on both sides of a ratio alike.
    let medians: Vec<f64> = seconds
        .iter()
        .map(|s| {
            if s.is_empty() {
                f64::NAN
            } else {
                median(s.clone())
            }
        })
        .collect();
    println!(
        "{:<18} {:>9} {:>12} {:>20}",
        "input", "seconds", "rows/s", "÷ baseline (min-max)"
    );
    for (i, case) in cases
        .iter()
        .enumerate()
        .filter(|(i, _)| !medians[*i].is_nan())
    {
        let ratios: Vec<f64> = seconds[i]
            .iter()
            .zip(&seconds[case.base])
            .map(|(a, b)| a / b)
            .collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        println!(
            "{:<18} {:>9.3} {:>12.0} {:>8.2} ({lo:.2}-{hi:.2}) of {}",
            case.name,
            medians[i],
            rows as f64 / medians[i],
            median(ratios),
            cases[case.base].name
        );
    }
}
