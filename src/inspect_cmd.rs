//! `dsc inspect`: one screen about a cache, or the same as JSON.

use crate::args::InspectArgs;
use crate::output::{bold, bytes, num, thousands};
use anyhow::Context as _;
use dsc_format::{Encoding, Manifest, Stage, Stats};
use serde::Serialize;

/// The `--json` document; its fields are documented in docs/FORMAT.md.
#[derive(Serialize)]
struct Inspect {
    cache: std::path::PathBuf,
    format_version: u32,
    dsc_version: String,
    inputs_fingerprint: String,
    input_files: usize,
    input_bytes: u64,
    max_len: usize,
    contexts: usize,
    shards: usize,
    bytes: u64,
    padding_efficiency: f64,
    splits: Vec<SplitRow>,
    tensors: Vec<TensorRow>,
    columns: Vec<ColumnRow>,
    lengths: dsc_format::stats::LengthStats,
}

#[derive(Serialize)]
struct SplitRow {
    name: String,
    contexts: usize,
    rows_stored: u64,
    shards: usize,
    bytes: u64,
}

#[derive(Serialize)]
struct TensorRow {
    name: String,
    dtype: String,
    shape: Vec<String>,
    columns: Vec<String>,
    encodings: Vec<String>,
}

#[derive(Serialize)]
struct ColumnRow {
    name: String,
    table: String,
    source_type: String,
    count: u64,
    nulls: u64,
    nan_inf: u64,
    min: Option<f64>,
    mean: Option<f64>,
    std: Option<f64>,
    median: Option<f64>,
    max: Option<f64>,
    distinct: Option<u64>,
}

fn encoding_text(e: &Encoding) -> String {
    match e {
        Encoding::Numeric { stages, fill } => {
            let chain: Vec<&str> = stages.iter().map(Stage::name).collect();
            let mut s = chain.join(",");
            if let Some(f) = fill {
                s.push_str(&format!(" (bad→{})", num(*f)));
            }
            s
        }
        Encoding::Bool => "bool 0/1".into(),
        Encoding::Category { vocabulary } => format!("category ({} values)", vocabulary.len()),
        Encoding::Raw => "raw".into(),
    }
}

fn build(cache: &std::path::Path, m: &Manifest, stats: &Stats) -> anyhow::Result<Inspect> {
    let all = stats
        .split("all")
        .context("stats.json has no \"all\" split")?;
    let stored: u64 = m.splits.iter().map(|s| s.rows_stored).sum();
    let slots = (m.summary.contexts * m.max_len) as f64;
    let splits = m
        .splits
        .iter()
        .map(|s| SplitRow {
            name: s.name.clone(),
            contexts: s.contexts,
            rows_stored: s.rows_stored,
            shards: s.shards,
            bytes: m.shards_of(&s.name).map(|e| e.bytes).sum(),
        })
        .collect();
    let tensors = m
        .tensors
        .iter()
        .map(|t| {
            let mut shape = vec!["n".to_string()];
            shape.extend(t.sample_shape.iter().map(ToString::to_string));
            TensorRow {
                name: t.name.clone(),
                dtype: t.dtype.as_str().into(),
                shape,
                columns: t.columns.iter().map(|c| c.name.clone()).collect(),
                encodings: t
                    .columns
                    .iter()
                    .map(|c| encoding_text(&c.encoding))
                    .collect(),
            }
        })
        .collect();
    let columns = all
        .columns
        .iter()
        .map(|c| {
            let n = c.numeric.as_ref();
            ColumnRow {
                name: c.name.clone(),
                table: c.table.clone(),
                source_type: c.source_type.clone(),
                count: c.count,
                nulls: c.nulls,
                nan_inf: c.nan + c.inf,
                min: n.map(|n| n.min),
                mean: n.map(|n| n.mean),
                std: n.map(|n| n.std),
                median: n.and_then(|n| n.quantiles.iter().find(|q| q.q == 0.5).map(|q| q.value)),
                max: n.map(|n| n.max),
                distinct: c.distinct,
            }
        })
        .collect();
    Ok(Inspect {
        cache: cache.into(),
        format_version: m.format_version,
        dsc_version: m.dsc_version.clone(),
        inputs_fingerprint: m.inputs.fingerprint.clone(),
        input_files: m.inputs.files.len(),
        input_bytes: m.inputs.files.iter().map(|f| f.bytes).sum(),
        max_len: m.max_len,
        contexts: m.summary.contexts,
        shards: m.shards.len(),
        bytes: m.shards.iter().map(|s| s.bytes).sum(),
        padding_efficiency: if slots > 0.0 {
            stored as f64 / slots
        } else {
            0.0
        },
        splits,
        tensors,
        columns,
        lengths: all.lengths.clone(),
    })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), num)
}

fn print_human(i: &Inspect) {
    println!(
        "{} {}  format v{}, written by dsc {}, inputs {} ({} files, {})",
        bold("cache"),
        i.cache.display(),
        i.format_version,
        i.dsc_version,
        i.inputs_fingerprint,
        i.input_files,
        bytes(i.input_bytes)
    );
    let splits: Vec<String> = i
        .splits
        .iter()
        .map(|s| {
            format!(
                "{} {} ({} shards, {})",
                s.name,
                thousands(s.contexts as u64),
                s.shards,
                bytes(s.bytes)
            )
        })
        .collect();
    println!("{} {}", bold("splits"), splits.join("; "));
    println!(
        "{} {} contexts, {} shards, {}, L = {}, padding efficiency {:.1}%",
        bold("total"),
        thousands(i.contexts as u64),
        i.shards,
        bytes(i.bytes),
        i.max_len,
        100.0 * i.padding_efficiency
    );
    println!();
    println!(
        "{}",
        bold(&format!(
            "{:<14} {:<5} {:<14} {}",
            "tensor", "dtype", "shape", "columns (encoding)"
        ))
    );
    for t in &i.tensors {
        let cols: Vec<String> = t
            .columns
            .iter()
            .zip(&t.encodings)
            .map(|(c, e)| {
                if e == "raw" {
                    c.clone()
                } else {
                    format!("{c} ({e})")
                }
            })
            .collect();
        let shape = format!("[{}]", t.shape.join(", "));
        // Wrap the column list at 100 columns, continuing under its first entry.
        let mut line = format!("{:<14} {:<5} {:<14} ", t.name, t.dtype, shape);
        let indent = line.chars().count();
        let mut first = true;
        for c in cols {
            let piece = if first { c } else { format!(", {c}") };
            if !first && line.chars().count() + piece.chars().count() > 100 {
                println!("{},", line.trim_end_matches(' '));
                line = format!("{}{}", " ".repeat(indent), piece.trim_start_matches(", "));
            } else {
                line.push_str(&piece);
            }
            first = false;
        }
        println!("{line}");
    }
    println!();
    println!(
        "{}",
        bold(&format!(
            "{:<16} {:<7} {:>11} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "column", "table", "count", "nulls", "min", "mean", "std", "median", "max"
        ))
    );
    for c in &i.columns {
        let (mean, std) = match c.distinct {
            Some(d) if c.mean.is_none() => (format!("{d} values"), "-".into()),
            _ => (opt(c.mean), opt(c.std)),
        };
        println!(
            "{:<16} {:<7} {:>11} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
            c.name.chars().take(16).collect::<String>(),
            c.table,
            thousands(c.count),
            thousands(c.nulls + c.nan_inf),
            opt(c.min),
            mean,
            std,
            opt(c.median),
            opt(c.max)
        );
    }
    println!();
    let l = &i.lengths;
    let q = |level: f64| {
        l.quantiles
            .iter()
            .find(|q| q.q == level)
            .map_or("-".into(), |q| num(q.value))
    };
    println!(
        "{} min {} p50 {} p95 {} p99 {} max {}; {} truncated to L ({:.1}%)",
        bold("sequence lengths"),
        l.min,
        q(0.5),
        q(0.95),
        q(0.99),
        l.max,
        thousands(l.truncated),
        100.0 * l.truncated_fraction
    );
    let peak = l
        .histogram
        .iter()
        .map(|b| b.count)
        .max()
        .unwrap_or(1)
        .max(1);
    for b in &l.histogram {
        let width = (50.0 * b.count as f64 / peak as f64).round() as usize;
        let bar: String = "█".repeat(width);
        println!(
            "  {:>6}–{:<6} {:>9} {bar}",
            num(b.lo),
            num(b.hi),
            thousands(b.count)
        );
    }
}

pub fn run(a: InspectArgs) -> anyhow::Result<u8> {
    let manifest = Manifest::read(&a.cache)?;
    let stats_path = a.cache.join(dsc_format::STATS_FILE);
    let stats: Stats = serde_json::from_slice(
        &std::fs::read(&stats_path)
            .with_context(|| format!("cannot read {}", stats_path.display()))?,
    )
    .with_context(|| format!("{}: invalid statistics", stats_path.display()))?;
    let inspect = build(&a.cache, &manifest, &stats)?;
    if a.json {
        crate::output::print_json(&inspect)?;
    } else {
        print_human(&inspect);
    }
    Ok(0)
}
