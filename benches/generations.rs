//! What data that keeps arriving costs (issue 51), each figure a ratio within one run:
//!
//! - append: adding the eighth of eight IceCube-like files to a cache of the other seven
//!   (`dsc append`), against compiling all eight (`dsc compile`): the aim is at most 0.2;
//! - read: an epoch of the loader (shuffled, batches of 256) over a lineage of eight
//!   generations (one compile, seven appends), against the same contexts compiled as one
//!   cache (`--fit-from`): the aim is 1.0;
//! - replace: appending the eighth file again over itself (`--existing replace`: each of its
//!   keys replaced, the old contexts hidden, their statistics read back from the file and taken
//!   out), against the append that added it; and an epoch of that generation (an eighth of its
//!   stored contexts hidden) against its compaction.
//!
//! Cases alternate within each repeat and each ratio is the median of the per-repeat ratios,
//! so that a slow stretch of a shared machine weighs on both sides alike.
//!
//! cargo bench --bench generations
//! DSC_BENCH_EVENTS=1000 DSC_BENCH_REPEATS=3 cargo bench --bench generations   # quick

use dsc_compiler::{
    append, compact, compile, AppendInputs, CompileOptions, CompileSpec, Existing, NoProgress,
};
use dsc_loader::{Cache, LoaderOptions};
use std::path::Path;
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The README's compile of `rows` (and the context table every event is in).
fn spec(data: &Path, rows: Vec<String>) -> CompileSpec {
    let mut spec = CompileSpec::new(rows, "event_id");
    spec.order_by = Some("time".into());
    spec.context = Some(data.join("train_meta.parquet").display().to_string());
    spec.targets = vec!["azimuth".into(), "zenith".into()];
    spec.joins = vec![dsc_format::spec::JoinSpec {
        file: data.join("sensor_geometry.csv").display().to_string(),
        on: "sensor_id".into(),
    }];
    spec.features = ["x", "y", "z", "time", "charge", "auxiliary"]
        .map(String::from)
        .to_vec();
    spec.categorical = vec!["sensor_id".into()];
    spec.encode.insert("time".into(), "zscore".into());
    spec.encode.insert("charge".into(), "log1p".into());
    spec.max_len = Some(128);
    spec.val_fraction = 0.1;
    spec.seed = 42;
    spec.empty_contexts = dsc_format::spec::EmptyContexts::Drop;
    spec
}

fn options(out: &Path) -> CompileOptions<'static> {
    CompileOptions {
        out: out.to_path_buf(),
        force: true,
        max_memory: None,
        storage: Default::default(),
        progress: &NoProgress,
    }
}

fn batch(data: &Path, i: usize) -> String {
    data.join(format!("train/batch_{i}.parquet"))
        .display()
        .to_string()
}

fn add(cache: &Path, data: &Path, i: usize) -> f64 {
    add_as(cache, data, i, Existing::Refuse)
}

/// Seconds to append file `i` to `cache`, keys the cache holds treated as `existing` says.
fn add_as(cache: &Path, data: &Path, i: usize, existing: Existing) -> f64 {
    let t = Instant::now();
    let new = AppendInputs {
        rows: vec![batch(data, i)],
        context: Some(data.join("train_meta.parquet").display().to_string()),
        joins: None,
        existing,
    };
    append(cache, &new, &options(cache)).expect("append");
    t.elapsed().as_secs_f64()
}

/// Seconds for one shuffled epoch of the train split, every batch's bytes read.
fn epoch(cache: &Cache, epoch: u64) -> (f64, u64) {
    let opts = LoaderOptions {
        batch_size: 256,
        epoch,
        ..Default::default()
    };
    let t = Instant::now();
    let mut sum = 0u64;
    for b in cache.loader(opts).expect("loader") {
        let b = b.expect("batch");
        for t in b.tensors() {
            sum = sum.wrapping_add(t.bytes().iter().step_by(64).map(|&x| u64::from(x)).sum());
        }
    }
    (t.elapsed().as_secs_f64(), sum)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn show(name: &str, ratios: &[f64]) {
    let lo = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "{name:<44} {:>6.3} ({lo:.3}-{hi:.3})",
        median(ratios.to_vec())
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let events = env_usize("DSC_BENCH_EVENTS", 4000);
    let repeats = env_usize("DSC_BENCH_REPEATS", 5);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let opts = dsc_gen::icecube::IcecubeOptions {
        files: 8,
        events_per_file: events,
        seed: 7,
        ..Default::default()
    };
    let summary = dsc_gen::icecube::generate(&data, &opts).expect("generate");
    let all: Vec<String> = (1..=8).map(|i| batch(&data, i)).collect();
    let (whole, grown) = (tmp.path().join("whole"), tmp.path().join("grown"));

    // Appending the last eighth, against compiling everything.
    let mut append_ratios = Vec::new();
    let (mut compile_s, mut append_s) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = Instant::now();
        compile(&spec(&data, all.clone()), &options(&whole)).expect("compile");
        let c = t.elapsed().as_secs_f64();
        compile(&spec(&data, all[..7].to_vec()), &options(&grown)).expect("compile");
        let a = add(&grown, &data, 8);
        compile_s.push(c);
        append_s.push(a);
        append_ratios.push(a / c);
    }

    // A lineage of eight generations, against one cache of the same contexts.
    let lineage = tmp.path().join("lineage");
    compile(&spec(&data, vec![batch(&data, 1)]), &options(&lineage)).expect("compile");
    for i in 2..=8 {
        add(&lineage, &data, i);
    }
    let mut one = spec(&data, all.clone());
    one.fit_from = Some(lineage.display().to_string());
    let flat = tmp.path().join("flat");
    compile(&one, &options(&flat)).expect("compile");
    let (l, f) = (Cache::open(&lineage).unwrap(), Cache::open(&flat).unwrap());
    assert_eq!(l.manifest().generation_number(), 8);
    let (mut read_ratios, mut lineage_s) = (Vec::new(), Vec::new());
    for r in 0..repeats as u64 {
        let (a, _) = epoch(&l, r);
        let (b, _) = epoch(&f, r);
        lineage_s.push(a);
        read_ratios.push(a / b);
    }
    // Replacing the eighth file's keys with the same file, against appending it; then an
    // epoch of that generation (an eighth of its stored contexts hidden) against its
    // compaction.
    let mut replace_ratios = Vec::new();
    for _ in 0..repeats {
        compile(&spec(&data, all[..7].to_vec()), &options(&grown)).expect("compile");
        let a = add(&grown, &data, 8);
        let r = add_as(&grown, &data, 8, Existing::Replace);
        replace_ratios.push(r / a);
    }
    let hiding = Cache::open(&grown).unwrap();
    assert_eq!(hiding.manifest().generation_number(), 3);
    compact(&grown, &options(&grown)).expect("compact");
    let compacted = Cache::open(&grown).unwrap();
    let mut hidden_ratios = Vec::new();
    for r in 0..repeats as u64 {
        let (a, _) = epoch(&hiding, r);
        let (b, _) = epoch(&compacted, r);
        hidden_ratios.push(a / b);
    }
    let contexts = l.manifest().summary().contexts;
    println!(
        "{} events ({} pulses) in 8 files, {} threads, median of {repeats} (min-max)",
        summary.contexts,
        summary.rows,
        rayon::current_num_threads()
    );
    println!(
        "compile of all 8 files {:.2} s, append of the 8th {:.2} s; an epoch of the lineage \
         {:.3} s ({:.0} contexts/s)",
        median(compile_s),
        median(append_s),
        median(lineage_s.clone()),
        contexts as f64 * 0.9 / median(lineage_s)
    );
    show("append 1/8 ÷ compile all (aim ≤ 0.2)", &append_ratios);
    show("epoch of 8 generations ÷ one cache (aim 1.0)", &read_ratios);
    show("replace 1/8 ÷ append 1/8", &replace_ratios);
    show("epoch hiding 1/8 ÷ its compaction", &hidden_ratios);
}
