//! `dsc inspect`: one screen about a cache, or the same as JSON.

use crate::args::InspectArgs;
use crate::output::outln;
use crate::output::{bold, bytes, num, thousands};
use anyhow::Context as _;
use dsc_format::{Encoding, Manifest, Stage, Stats};
use serde::Serialize;

/// The `--json` document; its fields are documented in docs/FORMAT.md.
#[derive(Serialize)]
struct Inspect {
    cache: std::path::PathBuf,
    /// When manifest.json was written (its modification time, RFC 3339 UTC); the manifest
    /// itself holds no time so that equal compiles give byte-identical caches.
    compiled_at: Option<String>,
    /// The generation shown (1 for a cache never appended to) and its content id.
    generation: u32,
    content_id: String,
    spec: dsc_format::CompileSpec,
    format_version: u32,
    dsc_version: String,
    inputs_fingerprint: String,
    input_files: usize,
    input_bytes: u64,
    max_len: usize,
    /// Contexts its readers see, all splits together.
    contexts: usize,
    /// Contexts its shards store that this generation hides (their keys replaced).
    hidden: usize,
    shards: usize,
    bytes: u64,
    /// The codec of compressed shards (`zstd`), or null for a hot cache.
    compression: Option<dsc_format::Codec>,
    /// Bytes of the shard files on disk (`bytes` when hot).
    stored_bytes: u64,
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
        Encoding::Bits { width } => format!("bits ({width} per row)"),
        Encoding::Chars { width, vocabulary } => {
            format!("chars:{width} ({} characters)", vocabulary.len())
        }
        Encoding::Ngrams { n, vocabulary } => {
            format!("ngrams:{n} ({} grams)", vocabulary.len())
        }
        Encoding::SubColumn {
            sub_column,
            cardinality,
            stats,
        } => format!("{sub_column} ({cardinality} codes, {stats})"),
    }
}

fn build(cache: &std::path::Path, m: &Manifest, stats: &Stats) -> anyhow::Result<Inspect> {
    let all = stats
        .split("all")
        .context("stats.json has no \"all\" split")?;
    let stored: u64 = m.splits().iter().map(|s| s.rows_stored).sum();
    let slots = (m.summary().contexts * m.max_len()) as f64;
    let splits = m
        .splits()
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
        .tensors()
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
        compiled_at: std::fs::metadata(cache.join(m.manifest_file()))
            .and_then(|m| m.modified())
            .ok()
            .map(rfc3339),
        generation: m.generation_number(),
        content_id: m.content_id(),
        spec: m.spec().clone(),
        format_version: m.format_version(),
        dsc_version: m.dsc_version().to_string(),
        inputs_fingerprint: m.inputs().fingerprint.clone(),
        input_files: m.inputs().files.len(),
        input_bytes: m.inputs().files.iter().map(|f| f.bytes).sum(),
        max_len: m.max_len(),
        contexts: m.splits().iter().map(|s| s.contexts).sum(),
        hidden: m.splits().iter().map(|s| s.removed).sum(),
        shards: m.shards().len(),
        bytes: m.shards().iter().map(|s| s.bytes).sum(),
        compression: m
            .shards()
            .iter()
            .find_map(|s| s.compressed.as_ref().map(|c| c.codec)),
        stored_bytes: m.shards().iter().map(|s| s.stored_bytes()).sum(),
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

/// A system time as `YYYY-MM-DDTHH:MM:SSZ` (UTC), without a date library.
pub(crate) fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The largest bin count (at least 1), the 100% of a terminal histogram.
fn peak_count(bins: &[dsc_format::stats::Bin]) -> u64 {
    bins.iter().map(|b| b.count).max().unwrap_or(1).max(1)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), num)
}

fn print_human(i: &Inspect) -> anyhow::Result<()> {
    outln!(
        "{} {}  format v{}, written by dsc {}{}",
        bold("cache"),
        i.cache.display(),
        i.format_version,
        i.dsc_version,
        i.compiled_at
            .as_deref()
            .map(|t| format!(" at {t}"))
            .unwrap_or_default()
    );
    if i.generation > 1 {
        outln!(
            "{} {} ({}): the compiled cache and what was appended since (dsc log)",
            bold("generation"),
            i.generation,
            i.content_id
        );
    }
    if i.hidden > 0 {
        outln!(
            "{} {} stored contexts whose keys an append replaced; readers see the new ones",
            bold("hidden"),
            thousands(i.hidden as u64)
        );
    }
    let s = &i.spec;
    let rows = s.rows.join(" ");
    let rows: String = if rows.chars().count() > 36 {
        format!("{}…", rows.chars().take(35).collect::<String>())
    } else {
        rows
    };
    outln!(
        "{} {} ({} files, {}), fingerprint {}",
        bold("from"),
        rows,
        i.input_files,
        bytes(i.input_bytes),
        i.inputs_fingerprint
    );
    outln!(
        "{} key {}{}, seed {}, split seed {}, val fraction {}",
        bold("spec"),
        if s.key.is_empty() {
            "(none: a table of records, keyed by row number)"
        } else {
            &s.key
        },
        s.order_by
            .as_deref()
            .map(|o| format!(" ordered by {o}"))
            .unwrap_or_default(),
        s.seed,
        s.split_seed,
        s.val_fraction
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
    outln!("{} {}", bold("splits"), splits.join("; "));
    outln!(
        "{} {} contexts, {} shards, {}, L = {}, padding efficiency {:.1}%",
        bold("total"),
        thousands(i.contexts as u64),
        i.shards,
        bytes(i.bytes),
        i.max_len,
        100.0 * i.padding_efficiency
    );
    if let Some(codec) = i.compression {
        outln!(
            "{} {:?} shards, {} on disk ({:.3} of the safetensors bytes); `dsc decompress` \
             makes it hot (mapped)",
            bold("stored"),
            codec,
            bytes(i.stored_bytes),
            i.stored_bytes as f64 / i.bytes.max(1) as f64
        );
    }
    outln!();
    outln!(
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
                outln!("{},", line.trim_end_matches(' '));
                line = format!("{}{}", " ".repeat(indent), piece.trim_start_matches(", "));
            } else {
                line.push_str(&piece);
            }
            first = false;
        }
        outln!("{line}");
    }
    outln!();
    outln!(
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
        outln!(
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
    if i.spec.key.is_empty() {
        return Ok(()); // a table of records: every sample is one row
    }
    outln!();
    let l = &i.lengths;
    let q = |level: f64| {
        l.quantiles
            .iter()
            .find(|q| q.q == level)
            .map_or("-".into(), |q| num(q.value))
    };
    outln!(
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
    let peak = peak_count(&l.histogram);
    for b in &l.histogram {
        let width = (50.0 * b.count as f64 / peak as f64).round() as usize;
        let bar: String = "█".repeat(width);
        outln!(
            "  {:>6}–{:<6} {:>9} {bar}",
            num(b.lo),
            num(b.hi),
            thousands(b.count)
        );
    }
    Ok(())
}

fn print_shards(m: &Manifest) -> anyhow::Result<()> {
    outln!(
        "{}",
        bold(&format!(
            "{:<34} {:<6} {:>10} {:>12} {:>12}  {}",
            "file", "split", "contexts", "first", "bytes", "xxh3"
        ))
    );
    for s in m.shards() {
        outln!(
            "{:<34} {:<6} {:>10} {:>12} {:>12}  {}",
            s.file,
            s.split,
            thousands(s.contexts as u64),
            thousands(s.first_context as u64),
            bytes(s.bytes),
            s.xxh3
        );
    }
    Ok(())
}

/// One column in every split: counts, quantiles, histogram, vocabulary.
#[derive(Serialize)]
struct ColumnDetail<'a> {
    name: &'a str,
    encoding: Option<&'a Encoding>,
    splits: Vec<(&'a str, &'a dsc_format::stats::ColumnStats)>,
}

fn column_detail<'a>(
    m: &'a Manifest,
    stats: &'a Stats,
    name: &'a str,
) -> anyhow::Result<ColumnDetail<'a>> {
    let splits: Vec<_> = stats
        .splits
        .iter()
        .filter_map(|s| s.column(name).map(|c| (s.split.as_str(), c)))
        .collect();
    if splits.is_empty() {
        let names: Vec<&str> = stats
            .split("all")
            .map(|s| s.columns.iter().map(|c| c.name.as_str()).collect())
            .unwrap_or_default();
        anyhow::bail!("no column {name:?} in the cache (columns: {names:?})");
    }
    let encoding = m
        .tensors()
        .iter()
        .flat_map(|t| &t.columns)
        .find(|c| c.name == name && c.encoding != Encoding::Raw)
        .map(|c| &c.encoding);
    Ok(ColumnDetail {
        name,
        encoding,
        splits,
    })
}

fn print_column(d: &ColumnDetail, top: usize) -> anyhow::Result<()> {
    let (_, all) = d.splits[0];
    outln!(
        "{} {} ({} table, {}), encoding {}",
        bold("column"),
        d.name,
        all.table,
        all.source_type,
        d.encoding.map_or("-".into(), encoding_text)
    );
    outln!(
        "{}",
        bold(&format!(
            "{:<6} {:>11} {:>8} {:>6} {:>6}   {}",
            "split", "count", "nulls", "nan", "inf", "quantiles 0 1 5 25 50 75 95 99 100 %"
        ))
    );
    for (split, c) in &d.splits {
        let q = c.numeric.as_ref().map_or("-".into(), |n| {
            n.quantiles
                .iter()
                .map(|q| num(q.value))
                .collect::<Vec<_>>()
                .join(" ")
        });
        let line = format!(
            "{split:<6} {:>11} {:>8} {:>6} {:>6}   {q}",
            thousands(c.count),
            thousands(c.nulls),
            thousands(c.nan),
            thousands(c.inf)
        );
        outln!("{}", line.chars().take(100).collect::<String>());
    }
    if let Some(n) = &all.numeric {
        outln!(
            "mean {}  std {}  min {}  max {}",
            num(n.mean),
            num(n.std),
            num(n.min),
            num(n.max)
        );
        let peak = peak_count(&n.histogram);
        for b in &n.histogram {
            let bar = "█".repeat((50.0 * b.count as f64 / peak as f64).round() as usize);
            let line = format!(
                "  {:>10} – {:<10} {:>11} {bar}",
                num(b.lo),
                num(b.hi),
                thousands(b.count)
            );
            outln!("{}", line.trim_end());
        }
    }
    if let Some(vocab) = &all.vocabulary {
        outln!(
            "{} distinct values; top {}:",
            vocab.len(),
            top.min(vocab.len())
        );
        let total: u64 = vocab.iter().map(|v| v.count).sum::<u64>().max(1);
        for v in vocab.iter().take(top) {
            let value = match &v.value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            outln!(
                "  {:<30} {:>11} {:>6.2}%",
                value.chars().take(30).collect::<String>(),
                thousands(v.count),
                100.0 * v.count as f64 / total as f64
            );
        }
    }
    Ok(())
}

pub fn run(a: InspectArgs) -> anyhow::Result<u8> {
    let (manifest, stats) = dsc_loader::read_meta(&a.cache, &a.remote.options_at(&a.at)?)?;
    if let Some(name) = &a.column {
        let detail = column_detail(&manifest, &stats, name)?;
        if a.json {
            crate::output::print_json(&detail)?;
        } else {
            print_column(&detail, a.top)?;
        }
        return Ok(0);
    }
    if a.shards {
        if a.json {
            crate::output::print_json(&manifest.shards())?;
        } else {
            print_shards(&manifest)?;
        }
        return Ok(0);
    }
    let inspect = build(&a.cache, &manifest, &stats)?;
    if a.json {
        crate::output::print_json(&inspect)?;
    } else {
        print_human(&inspect)?;
    }
    Ok(0)
}
