//! `dsc append` and `dsc log`: a cache's generations, made and listed.

use crate::args::{AppendArgs, CompactArgs, GcArgs, GenerationWriteArgs, LogArgs, TagArgs};
use crate::output::{outln, thousands};
use anyhow::bail;
use dsc_compiler::{AppendInputs, CompileOptions, TerminalBars};
use dsc_format::spec::{parse_size, JoinSpec};
use dsc_format::Manifest;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What `dsc append --json` prints.
#[derive(Serialize)]
struct Appended {
    cache: std::path::PathBuf,
    generation: u32,
    content_id: String,
    parent: String,
    seconds: f64,
    /// Contexts added per split.
    added: Vec<(String, usize)>,
    /// Contexts of earlier generations hidden per split: those whose keys it replaced.
    removed: Vec<(String, usize)>,
    /// Contexts per split in the new generation.
    splits: Vec<(String, usize)>,
    bytes_added: u64,
    /// Seconds per stage of the compile, in order.
    timings: Vec<(String, f64)>,
    /// The new data against the parameters it was encoded with.
    drift: Option<dsc_compiler::Drift>,
}

pub fn compact(a: CompactArgs) -> anyhow::Result<u8> {
    let (r, report) = write_generation(&a.cache, &a.write, |cache, opts| {
        Ok(dsc_compiler::compact(cache, opts)?)
    })?;
    if a.write.json {
        crate::output::print_json(&r)?;
        return Ok(0);
    }
    let m = &report.manifest;
    outln!(
        "{}: generation {} ({}) in {:.2} s: {} contexts rewritten in {} shards ({})",
        a.cache.display(),
        r.generation,
        r.content_id,
        r.seconds,
        thousands(m.summary().contexts as u64),
        m.shards().len(),
        crate::output::bytes(r.bytes_added)
    );
    Ok(0)
}

pub fn append(a: AppendArgs) -> anyhow::Result<u8> {
    let inputs = append_inputs(&a)?;
    let (r, _) = write_generation(&a.cache, &a.write, |cache, opts| {
        Ok(dsc_compiler::append(cache, &inputs, opts)?)
    })?;
    if a.write.json {
        crate::output::print_json(&r)?;
        return Ok(0);
    }
    let list = |v: &[(String, usize)]| {
        v.iter()
            .map(|(n, c)| format!("{n} {}", thousands(*c as u64)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!(
        "{}: generation {} ({}) in {:.2} s: added {}{}; now {}",
        a.cache.display(),
        r.generation,
        r.content_id,
        r.seconds,
        list(&r.added),
        match r.removed.iter().any(|(_, n)| *n > 0) {
            true => format!(" (replacing {})", list(&r.removed)),
            false => String::new(),
        },
        list(&r.splits)
    );
    if let Some(d) = &r.drift {
        print_drift(d)?;
    }
    Ok(0)
}

/// The new data an append's flags give; every other spec flag given must say what the cache's
/// spec says, else it is refused, naming the flag and the cache's value.
fn append_inputs(a: &AppendArgs) -> anyhow::Result<AppendInputs> {
    let given = crate::compile_cmd::given(&a.keys)?;
    if a.keys.rows.is_empty() {
        bail!("no rows files given: pass the new data's Parquet paths or globs after the cache");
    }
    let (cache, _) = dsc_loader::read_meta(&a.cache, &dsc_loader::RemoteOptions::from_env()?)?;
    let recorded = dsc_format::spelling::fields(cache.spec());
    for (key, value) in &given {
        if ["rows", "context", "joins"].contains(&key.as_str()) {
            continue;
        }
        let theirs = recorded.get(key).unwrap_or(&serde_json::Value::Null);
        if theirs != value {
            let flag = format!("--{}", key.replace('_', "-"));
            bail!(
                "{flag} {value}: the cache has {key} = {theirs}; an append takes the cache's \
                 spec and fitted parameters (compile a new cache to change them)"
            );
        }
    }
    let joins = given
        .get("joins")
        .map(|j| serde_json::from_value::<Vec<JoinSpec>>(j.clone()))
        .transpose()?;
    Ok(AppendInputs {
        rows: a.keys.rows.clone(),
        context: given
            .get("context")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        joins,
        existing: a.existing,
    })
}

/// Runs `work` (an append or a compaction of `cache`) with the flags' memory and progress
/// bars, and what it committed, as reported.
fn write_generation(
    cache: &Path,
    w: &GenerationWriteArgs,
    work: impl FnOnce(&Path, &CompileOptions) -> anyhow::Result<dsc_compiler::CompileReport>,
) -> anyhow::Result<(Appended, dsc_compiler::CompileReport)> {
    let max_memory = w
        .max_memory
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| anyhow::anyhow!("--max-memory {s:?}: {e}")))
        .transpose()?;
    let bars = TerminalBars::new(w.quiet || w.json).with_interrupt(dsc_compiler::stop_on_signals());
    let start = Instant::now();
    // A cache in object storage is appended to through a local folder of its own.
    let url = cache.to_string_lossy();
    let out = match dsc_loader::is_remote(&url) {
        true => dsc_loader::RemoteOptions::from_env()?
            .append_folder(&url)
            .map_err(|e| anyhow::anyhow!("the local folder of an append to {url}: {e}"))?,
        false => cache.into(),
    };
    let opts = CompileOptions {
        out,
        force: false,
        max_memory,
        storage: dsc_compiler::Storage::Hot,
        progress: &bars,
    };
    let report = work(cache, &opts)?;
    let m = &report.manifest;
    let g = m.generation().expect("a later generation");
    let per_split = |mine: &dyn Fn(&dsc_format::ShardEntry) -> bool| -> Vec<(String, usize)> {
        m.splits()
            .iter()
            .map(|s| {
                let n = m.shards_of(&s.name).filter(|e| mine(e)).map(|e| e.contexts);
                (s.name.clone(), n.sum())
            })
            .collect()
    };
    let r = Appended {
        cache: cache.into(),
        generation: g.number,
        content_id: m.content_id(),
        parent: g.parent.clone(),
        seconds: start.elapsed().as_secs_f64(),
        added: per_split(&|e| e.generation == Some(g.number)),
        removed: removed_of(m),
        splits: m
            .splits()
            .iter()
            .map(|s| (s.name.clone(), s.contexts))
            .collect(),
        bytes_added: report.cache_bytes,
        timings: report.timings.clone(),
        drift: report.drift.clone(),
    };
    Ok((r, report))
}

/// Contexts of earlier generations that generation `m` hides, per split (0 where none).
fn removed_of(m: &Manifest) -> Vec<(String, usize)> {
    let g = m.generation();
    m.splits()
        .iter()
        .map(|s| {
            let n = g.and_then(|g| g.removed.get(&s.name)).copied();
            (s.name.clone(), n.unwrap_or(0))
        })
        .collect()
}

/// The drift report as a table: each column's figures against the fitted train split.
fn print_drift(d: &dsc_compiler::Drift) -> anyhow::Result<()> {
    let f = |v: Option<f64>, fmt: &dyn Fn(f64) -> String| v.map_or("-".into(), fmt);
    outln!("the new data against the fitted parameters (the first generation's train split):");
    outln!(
        "  {:<20} {:>10} {:>11} {:>9} {:>13} {:>13}",
        "column",
        "values",
        "mean shift",
        "std x",
        "out of range",
        "not in vocab"
    );
    for c in &d.columns {
        outln!(
            "  {:<20} {:>10} {:>11} {:>9} {:>13} {:>13}",
            c.column,
            thousands(c.values),
            f(c.mean_shift_sd, &|s| format!("{s:+.2} sd")),
            f(c.std_ratio, &|r| format!("{r:.2}")),
            f(c.outside_range, &|o| format!("{:.2}%", o * 100.0)),
            f(c.unknown, &|u| format!("{:.2}%", u * 100.0))
        );
    }
    let l = &d.lengths;
    outln!(
        "  lengths: mean {:.1} (fitted {:.1}), {:.1}% cut to max_len (fitted {:.1}%)",
        l.mean,
        l.fitted_mean,
        l.truncated * 100.0,
        l.fitted_truncated * 100.0
    );
    if d.refit_due {
        eprintln!(
            "dsc: warning: the new data has moved away from what the encodings were fitted on; \
             a new compile (a refit) is due:"
        );
        for r in &d.reasons {
            eprintln!("  {r}");
        }
    }
    Ok(())
}

/// One line of `dsc log`.
#[derive(Serialize)]
struct Entry {
    generation: u32,
    content_id: String,
    kind: String,
    /// When its manifest was committed (the file's modification time), RFC 3339 UTC.
    committed_at: Option<String>,
    /// Contexts per split in this generation (those its readers see), of those added by it,
    /// and of earlier generations' contexts it hides (their keys replaced).
    splits: Vec<(String, usize)>,
    added: Vec<(String, usize)>,
    removed: Vec<(String, usize)>,
    /// The input files its own compile read.
    inputs: Vec<String>,
}

pub fn log(a: LogArgs) -> anyhow::Result<u8> {
    let lineage = Manifest::lineage(&a.cache, &mut dsc_format::generation::LocalFiles(&a.cache))?;
    let entries: Vec<Entry> = lineage
        .iter()
        .map(|m| {
            let n = m.generation_number();
            let split_counts = |mine: &dyn Fn(&dsc_format::ShardEntry) -> bool| {
                m.splits()
                    .iter()
                    .map(|s| {
                        let c = m.shards_of(&s.name).filter(|e| mine(e)).map(|e| e.contexts);
                        (s.name.clone(), c.sum())
                    })
                    .collect()
            };
            let inputs = match m.generation() {
                Some(g) => &g.inputs,
                None => m.inputs(),
            };
            Entry {
                generation: n,
                content_id: m.content_id(),
                kind: m.generation().map_or("compile".into(), |g| g.kind.clone()),
                committed_at: std::fs::metadata(a.cache.join(m.manifest_file()))
                    .and_then(|f| f.modified())
                    .ok()
                    .map(crate::inspect_cmd::rfc3339),
                splits: m
                    .splits()
                    .iter()
                    .map(|s| (s.name.clone(), s.contexts))
                    .collect(),
                added: split_counts(&|e| e.written_by() == n),
                removed: removed_of(m),
                inputs: inputs.files.iter().map(|f| f.path.clone()).collect(),
            }
        })
        .collect();
    if a.json {
        crate::output::print_json(&entries)?;
        return Ok(0);
    }
    for e in &entries {
        let counts = |v: &[(String, usize)]| {
            v.iter()
                .map(|(n, c)| format!("{n} {}", thousands(*c as u64)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        outln!(
            "generation {}  {}  {}  {}",
            e.generation,
            e.content_id,
            e.kind,
            e.committed_at.as_deref().unwrap_or("-")
        );
        outln!("    contexts: {}", counts(&e.splits));
        if e.generation > 1 {
            outln!("    added:    {}", counts(&e.added));
        }
        if e.removed.iter().any(|(_, n)| *n > 0) {
            outln!("    replaced: {}", counts(&e.removed));
        }
        outln!("    inputs:   {}", e.inputs.join(" "));
    }
    Ok(0)
}

pub fn tag(a: TagArgs) -> anyhow::Result<u8> {
    let at = a.generation.clone().unwrap_or_default();
    let n = dsc_compiler::tag(&a.cache, &a.name, &at, a.force)?;
    outln!("{}: {} names generation {n}", a.cache.display(), a.name);
    Ok(0)
}

pub fn gc(a: GcArgs) -> anyhow::Result<u8> {
    let since = match a.keep_days {
        Some(d) if !(d.is_finite() && d >= 0.0) => {
            bail!("--keep-days {d}: a number of days, 0 or more")
        }
        Some(d) => std::time::SystemTime::now()
            .checked_sub(std::time::Duration::from_secs_f64(d * 86_400.0)),
        None => None,
    };
    let keep = dsc_compiler::Keep {
        last: a.keep_last,
        since,
    };
    let r = dsc_compiler::gc(&a.cache, &keep, a.dry_run)?;
    if a.json {
        crate::output::print_json(&r)?;
        return Ok(0);
    }
    let verb = if a.dry_run { "would remove" } else { "removed" };
    outln!(
        "{}: kept generations {:?}; {verb} generations {:?} and {} files ({})",
        a.cache.display(),
        r.kept,
        r.removed,
        r.files.len(),
        crate::output::bytes(r.bytes)
    );
    Ok(0)
}
