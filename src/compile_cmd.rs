//! `dsc compile`: flags and spec file → `CompileSpec` → `dsc_compiler::compile` → report.

use crate::args::{CompileArgs, MergeArgs, RemoveReplacedArgs, SpecArgs, StatusArgs};
use crate::output::outln;
use crate::output::{bytes, peak_rss_mib, thousands};
use anyhow::{bail, Context as _};
use dsc_compiler::partition::{self, Partition, Stage};
use dsc_compiler::{CompileOptions, CompileSpec, TerminalBars};
use dsc_format::choice::Choice as _;
use dsc_format::spec::{parse_size, JoinSpec};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The spec from `--spec` (if any) with every given flag laid over it
/// ([`CompileSpec::with_overrides`]: the rule Python's `dsc.compile` follows too), and the keys
/// whose values came from the spec file (those no flag gave).
pub fn resolve_spec(a: &CompileArgs) -> anyhow::Result<(CompileSpec, Map<String, Value>)> {
    let base = match &a.spec {
        Some(path) => {
            let text = crate::side_file::read_text(path, "spec file")?;
            // Parsed as a spec first, so a bad key or value is named with its line; the
            // file's errors name its keys as it spells them, not as flags.
            let file: CompileSpec = toml::from_str(&text).map_err(|e| {
                anyhow::anyhow!(
                    "{}: invalid spec file: {}",
                    path.display(),
                    as_spec_keys(&e.to_string())
                )
            })?;
            if !file.val_fraction.is_finite() {
                bail!(
                    "{}: invalid spec file: \"val_fraction\" = {}: must be a number from 0 to 1",
                    path.display(),
                    file.val_fraction
                );
            }
            dsc_format::spelling::fields(&file)
        }
        None => Map::new(),
    };
    let given = given(&a.keys)?;
    let rows = |m: &Map<String, Value>| m.get("rows").and_then(Value::as_array).map(Vec::len);
    if rows(&given).or(rows(&base)).unwrap_or(0) == 0 {
        bail!("no rows files given: pass Parquet paths or globs, or list them in the spec file (rows = [...])");
    }
    // The file's keys (set to other than their defaults) that no flag gave.
    let defaults = dsc_format::spelling::fields(&CompileSpec::new(vec![], ""));
    let from_file: Map<String, Value> = base
        .iter()
        .filter(|(k, v)| !given.contains_key(*k) && defaults.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let spec = CompileSpec::with_overrides(base, given).context("invalid spec")?;
    Ok((spec, from_file))
}

/// A message spelled for a spec file: its `` `key` ``s as the file writes them, in quotes,
/// where the command line's spelling would turn them into flags.
fn as_spec_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '`' => {
                out.push('"');
                quoted = !quoted;
            }
            c => out.push(c),
        }
    }
    out
}

/// `e`, a compile's error, naming the spec file `file` and its key where the option at fault
/// has the value the file gave it (`from_file`): a spec file's user fixes the file, not a flag.
fn from_spec_file(
    e: anyhow::Error,
    file: Option<&Path>,
    from_file: &Map<String, Value>,
) -> anyhow::Error {
    let Some(file) = file else {
        return e;
    };
    let option = e
        .downcast_ref::<dsc_format::spelling::OptionError>()
        .or_else(|| match e.downcast_ref::<dsc_compiler::CompileError>() {
            Some(dsc_compiler::CompileError::Spec(o)) => Some(o),
            _ => None,
        });
    match option.and_then(|o| from_file.get(o.key).map(|v| (o, v))) {
        Some((o, value)) => anyhow::anyhow!(
            "{}: \"{}\" = {value}: {}",
            file.display(),
            o.key,
            as_spec_keys(&o.problem)
        ),
        None => e,
    }
}

/// The spec keys the flags give, as a spec file would hold them ([`SpecArgs`]'s serialisation;
/// the size flags name themselves in their error).
pub(crate) fn given(a: &SpecArgs) -> anyhow::Result<Map<String, Value>> {
    // Every flag that can fail to serialise names itself in its error.
    let mut out = match serde_json::to_value(a) {
        Ok(Value::Object(map)) => map,
        Ok(_) => unreachable!("the spec flags serialise to a table"),
        Err(e) => bail!("{e}"),
    };
    if a.joins.len() != a.join_on.len() {
        bail!(
            "{} --join file(s) but {} --on column(s): give one --on per --join",
            a.joins.len(),
            a.join_on.len()
        );
    }
    if !a.joins.is_empty() {
        let joins: Vec<JoinSpec> = a
            .joins
            .iter()
            .zip(&a.join_on)
            .map(|(file, on)| JoinSpec {
                file: file.clone(),
                on: on.clone(),
            })
            .collect();
        out.insert("joins".into(), json!(joins));
    }
    Ok(out)
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
    /// Thread-seconds per phase, summed over the threads that ran it.
    phases: Vec<(String, f64)>,
    /// The threads the compile ran on.
    threads: usize,
    peak_rss_mib: Option<f64>,
    inputs_fingerprint: String,
}

pub fn run(a: CompileArgs) -> anyhow::Result<u8> {
    let (spec, from_file) = resolve_spec(&a)?;
    let file = a.spec.clone();
    run_spec(a, spec).map_err(|e| from_spec_file(e, file.as_deref(), &from_file))
}

fn run_spec(a: CompileArgs, spec: CompileSpec) -> anyhow::Result<u8> {
    if a.print_spec {
        use std::io::Write as _;
        write!(std::io::stdout(), "{}", toml::to_string(&spec)?)?;
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
    let upload = crate::upload::to(&out, a.force, &a.remote)?;
    if let (Some(p), Some(stage)) = (&a.partition, a.stage) {
        if upload.is_some() {
            bail!(
                "--out {}: a partitioned compile writes its parts to shared storage (a file \
                 system every partition sees); compile to a folder there, then dsc compress \
                 it --out the URL (or upload the merged cache)",
                out.display()
            );
        }
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
    let mut report = dsc_compiler::compile(
        &spec,
        &CompileOptions {
            out: upload.as_ref().map_or(out, |u| u.local()),
            force: a.force,
            max_memory,
            storage: a.storage.storage(),
            progress: &bars,
        },
    )?;
    if let Some(upload) = &upload {
        crate::upload::send(upload, &bars)?;
        report.out = PathBuf::from(upload.url());
    }
    remove_in_background(report.replaced.take());
    print_report(&report, start.elapsed().as_secs_f64(), a.json, a.timings)
}

/// Hands the cache a `--force` compile replaced to a `dsc` process of its own, which removes it
/// while this one returns: the file system frees an old cache's files one at a time (0.13 s of
/// a 1.5 s compile of the README's data, seconds for a large cache), and nobody needs to wait
/// for that. The folder's lock goes with it as the remover's standard input, so that no other
/// compile into the same output removes it meanwhile. Where no process starts, or this process
/// is not the `dsc` binary (the Python package's console script runs this command line inside
/// the interpreter, which cannot be started as a remover), it is removed here.
fn remove_in_background(replaced: Option<dsc_compiler::Replaced>) {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let Some(replaced) = replaced else { return };
    let exe = match std::env::current_exe() {
        Ok(exe) if crate::is_own_binary() => exe,
        _ => return, // dropped: removed here
    };
    let (folder, lock) = replaced.hand_over();
    let stdin = lock.map_or_else(Stdio::null, Stdio::from);
    let started = Command::new(exe)
        .arg("remove-replaced")
        .arg(&folder)
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C at the terminal after this compile has returned is
        // not meant for it.
        .process_group(0)
        .spawn();
    if started.is_err() {
        dsc_compiler::remove_leftover(&folder);
    }
}

/// `dsc remove-replaced FOLDER` (hidden): what [`remove_in_background`] starts.
pub fn remove_replaced(a: RemoveReplacedArgs) -> anyhow::Result<u8> {
    // Only ever a replaced cache's leftover name: a hidden command that deletes folders must
    // not delete anything else, whoever calls it.
    let name = a.folder.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !dsc_compiler::is_replaced_name(name) {
        bail!(
            "{}: not a replaced cache's folder (.NAME.PID-N.{})",
            a.folder.display(),
            dsc_format::REPLACED_SUFFIX
        );
    }
    dsc_format::failpoint::at("remove-replaced");
    dsc_compiler::remove_leftover(&a.folder);
    Ok(0)
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
    let mut report = partition::merge(&a.out, a.force, a.storage.storage(), &bars)?;
    remove_in_background(report.replaced.take());
    print_report(&report, start.elapsed().as_secs_f64(), a.json, false)
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
    timings: bool,
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
        phases: report.phases.clone(),
        threads: rayon::current_num_threads(),
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
    let records = m.is_records();
    outln!(
        "compiled {} {} ({}) from {} rows in {:.2} s ({} rows/s)",
        thousands(r.contexts as u64),
        if records { "records" } else { "contexts" },
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
    if records {
        outln!("{} values filled by --nan", thousands(s.values_filled));
    } else {
        outln!(
            "L = {}: {} contexts truncated, {} values filled by --nan",
            r.max_len,
            thousands(s.contexts_truncated as u64),
            thousands(s.values_filled)
        );
    }
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
    if timings {
        print_timings(&r)?;
    }
    Ok(0)
}

/// `--timings`: the stages' wall time, then the phases' thread-seconds with their shares.
fn print_timings(r: &Report) -> anyhow::Result<()> {
    outln!(
        "\nwhere the time went ({:.2} s on {} threads):",
        r.seconds,
        r.threads
    );
    outln!("  {:<12} {:>8}", "stage", "wall s");
    for (name, s) in &r.timings {
        outln!("  {name:<12} {s:>8.3}");
    }
    let total: f64 = r.phases.iter().map(|(_, s)| s).sum();
    outln!("  {:<12} {:>8} {:>7}", "phase", "thread-s", "share");
    for (name, s) in r.phases.iter().filter(|(_, s)| *s > 0.0) {
        let share = 100.0 * s / total.max(1e-12);
        outln!("  {name:<12} {s:>8.3} {share:>6.1}%");
    }
    outln!("  {:<12} {total:>8.3}", "sum");
    Ok(())
}
