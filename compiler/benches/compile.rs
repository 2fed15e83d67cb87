//! Compile throughput next to the floor of merely decoding the same Parquet columns, measured
//! in one run on the same files, plus the compile's peak memory next to the cache size.
//!
//! cargo bench -p dsc-compiler --bench compile            # 8 files, ~10M pulses
//! DSC_BENCH_EVENTS_PER_FILE=2000 cargo bench -p dsc-compiler --bench compile   # quick
//!
//! Peak memory is the process's `VmHWM`, reset through `/proc/self/clear_refs` before each
//! measured step so that generating the data does not count.

use dsc_compiler::{compile, decode_parquet, CompileOptions, CompileSpec, NoProgress};
use dsc_format::spec::JoinSpec;
use dsc_gen::icecube::{generate, IcecubeOptions};
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let files = env_usize("DSC_BENCH_FILES", 8);
    let events = env_usize("DSC_BENCH_EVENTS_PER_FILE", 17_000);
    let repeats = env_usize("DSC_BENCH_REPEATS", 3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let summary = generate(
        &data,
        &IcecubeOptions {
            files,
            events_per_file: events,
            seed: 7,
            ..Default::default()
        },
    )
    .expect("generate");
    let rows_files: Vec<_> = summary.files[..files].to_vec();
    let columns: Vec<String> = ["event_id", "sensor_id", "time", "charge", "auxiliary"]
        .map(String::from)
        .to_vec();

    let mut spec = CompileSpec::new(
        vec![format!("{}/train/batch_*.parquet", data.display())],
        "event_id",
    );
    spec.order_by = Some("time".into());
    spec.context = Some(format!("{}/train_meta.parquet", data.display()));
    spec.targets = vec!["azimuth".into(), "zenith".into()];
    spec.joins = vec![JoinSpec {
        file: format!("{}/sensor_geometry.csv", data.display()),
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

    let threads = rayon::current_num_threads();
    println!(
        "compile benchmark: {} rows in {files} files, {threads} threads, best of {repeats}",
        summary.rows
    );
    let mut decode_s = f64::INFINITY;
    let mut decode_peak = 0.0f64;
    for _ in 0..repeats {
        reset_peak();
        let t = Instant::now();
        let rows = decode_parquet(&rows_files, &columns).expect("decode");
        decode_s = decode_s.min(t.elapsed().as_secs_f64());
        decode_peak = decode_peak.max(peak_mib());
        assert_eq!(rows, summary.rows);
    }
    let mut compile_s = f64::INFINITY;
    let mut compile_peak = 0.0f64;
    let mut cache_bytes = 0;
    let mut timings = Vec::new();
    for i in 0..repeats {
        let out = tmp.path().join(format!("cache{i}"));
        reset_peak();
        let t = Instant::now();
        let report = compile(
            &spec,
            &CompileOptions {
                out: out.clone(),
                force: false,
                max_memory: None,
                storage: Default::default(),
                progress: &NoProgress,
            },
        )
        .expect("compile");
        let s = t.elapsed().as_secs_f64();
        compile_peak = compile_peak.max(peak_mib());
        if s < compile_s {
            compile_s = s;
            timings = report.timings.clone();
        }
        cache_bytes = report.cache_bytes;
        std::fs::remove_dir_all(&out).expect("cleanup");
    }
    let rows = summary.rows as f64;
    let cache_mib = cache_bytes as f64 / (1 << 20) as f64;
    println!("{:<28} {:>10} {:>14}", "step", "seconds", "rows/s");
    println!(
        "{:<28} {:>10.3} {:>14.0}",
        "decode Parquet only",
        decode_s,
        rows / decode_s
    );
    println!(
        "{:<28} {:>10.3} {:>14.0}",
        "dsc compile",
        compile_s,
        rows / compile_s
    );
    println!("compile / decode time ratio: {:.2}x", compile_s / decode_s);
    let stages: Vec<String> = timings
        .iter()
        .map(|(name, s)| format!("{name} {s:.3}"))
        .collect();
    println!("compile stages (s): {}", stages.join(", "));
    println!(
        "cache {cache_mib:.0} MiB; peak RSS: compile {compile_peak:.0} MiB ({:.2}x the cache), decode {decode_peak:.0} MiB",
        compile_peak / cache_mib
    );
}
