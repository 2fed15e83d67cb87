//! `dsc compile`: flags and spec file → `CompileSpec` → `dsc_compiler::compile` → report.

use crate::args::{CompileArgs, MergeArgs, StatusArgs};
use crate::output::outln;
use crate::output::{bytes, peak_rss_mib, thousands};
use anyhow::{bail, Context as _};
use dsc_compiler::partition::{self, Partition, Stage};
use dsc_compiler::{CompileOptions, CompileSpec, TerminalBars};
use dsc_format::choice::Choice as _;
use dsc_format::spec::{parse_size, JoinSpec};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// The spec from `--spec` (if any) with every given flag applied on top.
pub fn resolve_spec(a: &CompileArgs) -> anyhow::Result<CompileSpec> {
    let mut spec = match &a.spec {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read spec file {}", path.display()))?;
            toml::from_str::<CompileSpec>(&text)
                .with_context(|| format!("{}: invalid spec", path.display()))?
        }
        None => {
            let Some(key) = &a.key else {
                bail!("--key is required (or give a spec file with --spec)");
            };
            CompileSpec::new(Vec::new(), key.clone())
        }
    };
    if !a.rows.is_empty() {
        spec.rows = a.rows.clone();
    }
    if spec.rows.is_empty() {
        bail!("no rows files given: pass Parquet paths or globs, or `rows` in the spec file");
    }
    if let Some(k) = &a.key {
        spec.key = k.clone();
    }
    macro_rules! set {
        ($field:ident) => {
            if a.$field.is_some() {
                spec.$field = a.$field.clone();
            }
        };
    }
    set!(order_by);
    set!(context);
    set!(context_key);
    set!(max_len);
    let lists = [
        (&a.features, &mut spec.features),
        (&a.categorical, &mut spec.categorical),
        (&a.targets, &mut spec.targets),
        (&a.context_features, &mut spec.context_features),
    ];
    for (flag, field) in lists {
        if !flag.is_empty() {
            field.clone_from(flag);
        }
    }
    for e in &a.encode {
        let Some((col, chain)) = e.split_once('=') else {
            bail!("--encode {e:?}: expected COLUMN=CHAIN, e.g. charge=log1p,zscore");
        };
        spec.encode
            .insert(col.trim().to_string(), chain.trim().to_string());
    }
    if a.joins.len() != a.join_on.len() {
        bail!(
            "{} --join file(s) but {} --on column(s): give one --on per --join",
            a.joins.len(),
            a.join_on.len()
        );
    }
    if !a.joins.is_empty() {
        spec.joins = a
            .joins
            .iter()
            .zip(&a.join_on)
            .map(|(file, on)| JoinSpec {
                file: file.clone(),
                on: on.clone(),
            })
            .collect();
    }
    if let Some(t) = a.truncate {
        spec.truncate = t;
    }
    if let Some(n) = a.nan {
        spec.nan = n;
    }
    if let Some(u) = a.unmatched_rows {
        spec.unmatched_rows = u;
    }
    if let Some(e) = a.empty_contexts {
        spec.empty_contexts = e;
    }
    if let Some(v) = a.val_fraction {
        spec.val_fraction = v;
    }
    // A split assignment given on the command line replaces the spec file's, whichever kind.
    if a.split_by.is_some() || !a.split_keys.is_empty() {
        spec.split_by = a.split_by.clone();
        spec.split_keys.clear();
    }
    for given in &a.split_keys {
        let Some((name, file)) = given.split_once('=') else {
            bail!("--split-keys {given:?}: expected NAME=FILE, e.g. test=test_ids.txt");
        };
        let earlier = spec
            .split_keys
            .insert(name.trim().to_string(), file.trim().to_string());
        if let Some(earlier) = earlier {
            bail!("--split-keys names split {name:?} twice ({earlier} and {file}); list its keys in one file");
        }
    }
    if a.profile.is_some() {
        spec.profile.clone_from(&a.profile);
    }
    if let Some(v) = &a.val_keys {
        spec.val_keys = Some(v.display().to_string());
    }
    if a.partitions.is_some() {
        spec.partitions = a.partitions;
    }
    if let Some(v) = a.split_seed {
        spec.split_seed = v;
    }
    if let Some(v) = a.seed {
        spec.seed = v;
    }
    if let Some(s) = &a.shard_size {
        spec.shard_size = parse_size(s).map_err(|e| anyhow::anyhow!("--shard-size {s:?}: {e}"))?;
    }
    if let Some(s) = &a.bucket_size {
        spec.bucket_size =
            Some(parse_size(s).map_err(|e| anyhow::anyhow!("--bucket-size {s:?}: {e}"))?);
    }
    Ok(spec)
}

#[derive(Serialize)]
struct SplitReport {
    name: String,
    contexts: usize,
    shards: usize,
    rows_stored: u64,
}

#[derive(Serialize)]
struct Report {
    out: PathBuf,
    seconds: f64,
    rows_read: u64,
    rows_per_s: f64,
    contexts: usize,
    splits: Vec<SplitReport>,
    shards: usize,
    cache_bytes: u64,
    max_len: usize,
    summary: dsc_format::manifest::CompileSummary,
    timings: Vec<(String, f64)>,
    peak_rss_mib: Option<f64>,
    inputs_fingerprint: String,
}

pub fn run(a: CompileArgs) -> anyhow::Result<u8> {
    let spec = resolve_spec(&a)?;
    if a.print_spec {
        print!("{}", toml::to_string(&spec)?);
        return Ok(0);
    }
    let Some(out) = a.out.clone() else {
        bail!("--out is required: the cache directory to create");
    };
    // Ctrl-C, SIGTERM: the compile stops, removes its staging folder and says so.
    let bars = TerminalBars::new(a.quiet || a.json).with_interrupt(dsc_compiler::stop_on_signals());
    let start = Instant::now();
    let max_memory = a
        .max_memory
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| anyhow::anyhow!("--max-memory {s:?}: {e}")))
        .transpose()?;
    if let (Some(p), Some(stage)) = (&a.partition, a.stage) {
        let partition = parse_partition(p)?;
        let r = partition::run_stage(&spec, &out, max_memory, partition, stage, &bars)?;
        if a.json {
            crate::output::print_json(&r)?;
        } else {
            outln!(
                "{} {}/{}: {} {} in {:.2} s{}",
                r.stage.name(),
                r.partition,
                r.partitions,
                r.items,
                if r.stage == Stage::Scan {
                    "rows files"
                } else {
                    "buckets"
                },
                r.seconds,
                match r.stage {
                    Stage::Write => format!(
                        "; when every partition is written: dsc merge {}",
                        out.display()
                    ),
                    _ => String::new(),
                }
            );
        }
        return Ok(0);
    }
    let report = dsc_compiler::compile(
        &spec,
        &CompileOptions {
            out,
            force: a.force,
            max_memory,
            storage: a.storage.storage(),
            progress: &bars,
        },
    )?;
    print_report(&report, start.elapsed().as_secs_f64(), a.json)
}

/// `I/N`, `auto` or `auto/N`.
fn parse_partition(text: &str) -> anyhow::Result<Partition> {
    let parsed = match text.strip_prefix("auto") {
        Some(rest) => {
            let count =
                match rest.strip_prefix('/') {
                    Some(n) => Some(n.parse::<usize>().map_err(|_| {
                        anyhow::anyhow!("--partition {text:?}: {n:?} is not a count")
                    })?),
                    None if rest.is_empty() => None,
                    None => bail!("--partition {text:?}: expected auto or auto/N"),
                };
            Partition::from_env(count, |k| std::env::var(k).ok())
        }
        None => Partition::parse(text),
    };
    parsed.map_err(|e| anyhow::anyhow!("--partition {text:?}: {e}"))
}

/// `dsc merge`.
pub fn merge(a: MergeArgs) -> anyhow::Result<u8> {
    // Ctrl-C, SIGTERM: the compile stops, removes its staging folder and says so.
    let bars = TerminalBars::new(a.quiet || a.json).with_interrupt(dsc_compiler::stop_on_signals());
    let start = Instant::now();
    let report = partition::merge(&a.out, a.force, a.storage.storage(), &bars)?;
    print_report(&report, start.elapsed().as_secs_f64(), a.json)
}

/// `dsc status`.
pub fn status(a: StatusArgs) -> anyhow::Result<u8> {
    let s = partition::status(&a.out)?;
    if a.json {
        crate::output::print_json(&s)?;
        return Ok(0);
    }
    match s.partitions {
        None if s.committed => outln!(
            "{}: a cache; no partitioned compile under way",
            s.out.display()
        ),
        None => outln!(
            "{}: no cache and no partitioned compile under way",
            s.out.display()
        ),
        Some(n) => {
            outln!(
                "{}: partitioned compile in {n} partitions{}",
                s.out.display(),
                if s.committed {
                    " (a committed cache is there too)"
                } else {
                    ""
                }
            );
            for (stage, done) in &s.done {
                let missing: Vec<String> = (0..n)
                    .filter(|i| !done.contains(i))
                    .map(|i| i.to_string())
                    .collect();
                outln!(
                    "  {:<5} {}/{} done{}",
                    stage.name(),
                    done.len(),
                    n,
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!(" (missing: {})", missing.join(", "))
                    }
                );
            }
            let all = s.done.iter().all(|(_, d)| d.len() == n);
            if all {
                outln!("  ready: dsc merge {}", s.out.display());
            }
        }
    }
    Ok(0)
}

fn print_report(
    report: &dsc_compiler::CompileReport,
    seconds: f64,
    json: bool,
) -> anyhow::Result<u8> {
    let m = &report.manifest;
    let r = Report {
        out: report.out.clone(),
        seconds,
        rows_read: m.summary().rows_read,
        rows_per_s: m.summary().rows_read as f64 / seconds.max(1e-9),
        contexts: m.summary().contexts,
        splits: m
            .splits()
            .iter()
            .map(|s| SplitReport {
                name: s.name.clone(),
                contexts: s.contexts,
                shards: s.shards,
                rows_stored: s.rows_stored,
            })
            .collect(),
        shards: m.shards().len(),
        cache_bytes: report.cache_bytes,
        max_len: m.max_len(),
        summary: m.summary().clone(),
        timings: report.timings.clone(),
        peak_rss_mib: peak_rss_mib(),
        inputs_fingerprint: m.inputs().fingerprint.clone(),
    };
    if json {
        crate::output::print_json(&r)?;
        return Ok(0);
    }
    let splits: Vec<String> = r
        .splits
        .iter()
        .map(|s| format!("{} {}", s.name, thousands(s.contexts as u64)))
        .collect();
    outln!(
        "compiled {} contexts ({}) from {} rows in {:.2} s ({} rows/s)",
        thousands(r.contexts as u64),
        splits.join(", "),
        thousands(r.rows_read),
        seconds,
        thousands(r.rows_per_s as u64)
    );
    outln!(
        "wrote {} in {} shards to {}",
        bytes(r.cache_bytes),
        r.shards,
        r.out.display()
    );
    let s = &r.summary;
    outln!(
        "L = {}: {} contexts truncated, {} values filled by --nan",
        r.max_len,
        thousands(s.contexts_truncated as u64),
        thousands(s.values_filled)
    );
    if s.contexts_without_context_row + s.contexts_without_rows > 0 {
        outln!(
            "dropped {} contexts without a context row ({} rows); {} contexts without rows ({} kept empty)",
            thousands(s.contexts_without_context_row as u64),
            thousands(s.rows_without_context_row),
            thousands(s.contexts_without_rows as u64),
            thousands(s.empty_contexts_kept as u64)
        );
    }
    if let Some(mib) = r.peak_rss_mib {
        outln!("peak memory {mib:.0} MiB");
    }
    Ok(0)
}
