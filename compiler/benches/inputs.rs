//! What the shape of the input costs the compile: the same customers' transactions with int64,
//! string and UUID keys, each compiled from the same machine state in alternation, reported as
//! rows/s and as the ratio to the int64 keys measured in the same run.
//!
//! cargo bench -p dsc-compiler --bench inputs
//! DSC_BENCH_CUSTOMERS=5000 DSC_BENCH_REPEATS=3 cargo bench -p dsc-compiler --bench inputs  # quick

use dsc_compiler::{compile, CompileOptions, CompileSpec, NoProgress, Storage};
use dsc_gen::sequences::{generate, KeyStyle, SequencesOptions};
use std::path::Path;
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The customer compile of the tests (`tests/util`'s `sequences_args`) on the data in `data`.
fn spec(data: &Path) -> CompileSpec {
    let mut spec = CompileSpec::new(
        vec![data.join("transactions").display().to_string()],
        "customer_id",
    );
    spec.order_by = Some("ts".into());
    spec.context = Some(data.join("customers.parquet").display().to_string());
    spec.targets = vec!["lifetime_value".into()];
    spec.features = vec!["amount".into(), "items".into()];
    spec.categorical = vec!["merchant_category".into()];
    spec.encode.insert("amount".into(), "log1p,zscore".into());
    spec.nan = dsc_format::spec::NanPolicy::Mean;
    spec.empty_contexts = dsc_format::spec::EmptyContexts::Keep;
    spec.val_fraction = 0.1;
    spec
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
    let styles = [
        ("int64", KeyStyle::Int),
        ("string", KeyStyle::Text),
        ("uuid", KeyStyle::Uuid),
    ];
    let mut rows = 0;
    for (name, keys) in styles {
        let summary = generate(
            &tmp.path().join(name),
            &SequencesOptions {
                customers,
                files: 8,
                seed: 7,
                keys,
            },
        )
        .expect("generate");
        rows = summary.rows;
    }
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); styles.len()];
    // Alternating, so that a slower stretch of a shared machine falls on every style alike.
    for _ in 0..repeats {
        for (i, (name, _)) in styles.iter().enumerate() {
            let data = tmp.path().join(name);
            let opts = CompileOptions {
                out: tmp.path().join(format!("cache-{name}")),
                force: true,
                max_memory: None,
                storage: Storage::Hot,
                progress: &NoProgress,
            };
            let t = Instant::now();
            compile(&spec(&data), &opts).expect("compile");
            seconds[i].push(t.elapsed().as_secs_f64());
        }
    }
    println!(
        "{customers} customers, {rows} rows, {} threads, median of {repeats}",
        rayon::current_num_threads()
    );
    let base = median(seconds[0].clone());
    println!(
        "{:<8} {:>9} {:>12} {:>10}",
        "keys", "seconds", "rows/s", "÷ int64"
    );
    for ((name, _), s) in styles.iter().zip(seconds) {
        let m = median(s);
        println!(
            "{name:<8} {m:>9.3} {:>12.0} {:>10.2}",
            rows as f64 / m,
            m / base
        );
    }
}
