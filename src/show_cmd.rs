//! `dsc show`: one context as a table, in source units.

use crate::args::ShowArgs;
use crate::output::outln;
use anyhow::{bail, Context as _};
use dsc_format::sample::{decode, find_key, read_context, read_context_in, RawContext};
use dsc_format::Manifest;
use serde_json::Value;
use std::path::Path;

/// Where the context is read from: a local cache, or one in object storage, whose key tensors
/// are read by ranged requests and whose one shard holding the context is fetched (into the
/// cache's local folder, kept for the next run as a loader's are).
enum Source {
    Local(Box<Manifest>),
    Remote(dsc_loader::Cache),
}

impl Source {
    fn open(a: &ShowArgs) -> anyhow::Result<Source> {
        if dsc_loader::is_remote(&a.cache.to_string_lossy()) {
            let cache = dsc_loader::Cache::open_with(&a.cache, &a.remote.options_at(&a.at)?)?;
            return Ok(Source::Remote(cache));
        }
        Ok(Source::Local(Box::new(Manifest::read_at(
            &a.cache,
            &a.at.at(),
        )?)))
    }

    fn manifest(&self) -> &Manifest {
        match self {
            Source::Local(m) => m,
            Source::Remote(cache) => cache.manifest(),
        }
    }

    /// The split position of the context with `key`.
    fn find_key(&self, dir: &Path, split: &str, key: i64) -> anyhow::Result<Option<usize>> {
        Ok(match self {
            Source::Local(manifest) => find_key(dir, manifest, split, key)?,
            Source::Remote(cache) => cache.find_key(split, key)?,
        })
    }

    /// Context `index` of `split` (`None` past its end).
    fn read(&self, dir: &Path, split: &str, index: usize) -> anyhow::Result<Option<RawContext>> {
        let manifest = self.manifest();
        let Source::Remote(cache) = self else {
            return Ok(read_context(dir, manifest, split, index)?);
        };
        let Some((shard, entry)) = manifest
            .shards_of(split)
            .enumerate()
            .find(|(_, s)| (s.first_context..s.first_context + s.contexts).contains(&index))
        else {
            return Ok(None);
        };
        // Fetched (and, when compressed, decompressed) once, and read from memory.
        let bytes = cache.shard_bytes(split, shard)?;
        let path = dir.join(&entry.file);
        Ok(read_context_in(
            manifest, entry, &bytes, &path, split, index,
        )?)
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), crate::output::num),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn run(a: ShowArgs) -> anyhow::Result<u8> {
    let source = Source::open(&a)?;
    let manifest = source.manifest();
    let Some(split) = manifest.split(&a.split) else {
        let names: Vec<&str> = manifest.splits().iter().map(|s| s.name.as_str()).collect();
        bail!(
            "{}: no split {:?} (splits: {names:?})",
            a.cache.display(),
            a.split
        );
    };
    let key_type = dsc_format::keys::key_type(manifest);
    let index = match (a.index, &a.key) {
        (Some(i), _) => {
            // Positions count every stored context, hidden ones too (FORMAT.md §14, "Removed rows").
            let stored = split.contexts + split.removed;
            if i >= stored {
                bail!(
                    "--index {i}: split {:?} holds {stored} contexts (0..{stored})",
                    a.split,
                );
            }
            let hidden = manifest
                .shards_of(&a.split)
                .find(|s| (s.first_context..s.first_context + s.contexts).contains(&i))
                .is_some_and(|s| s.is_hidden(i - s.first_context));
            if hidden {
                bail!(
                    "--index {i}: this generation ({}) hides that context of split {:?}: an \
                     append replaced its key; give --key to see the context that replaced it, \
                     or --generation to read an earlier generation",
                    manifest.generation_number(),
                    a.split
                );
            }
            i
        }
        (None, Some(k)) => {
            let id = key_type
                .id_of(k)
                .map_err(|problem| anyhow::anyhow!("--key {k:?}: {problem}"))?;
            source
                .find_key(&a.cache, &a.split, id)?
                .with_context(|| format!("no context with key {k} in split {:?}", a.split))?
        }
        (None, None) => bail!("give --index or --key"),
    };
    let raw = source
        .read(&a.cache, &a.split, index)?
        .context("context out of range")?;
    let mut d = decode(manifest, &raw, a.raw);
    if key_type.is_hashed() {
        // The key tensor holds the key's id; the key is the one asked for, or its table's.
        let text = match (&a.key, &source) {
            (Some(k), _) => Some(key_type.canonical(k).map_err(anyhow::Error::msg)?),
            (None, Source::Local(m)) => {
                let entry = m
                    .shards_of(&a.split)
                    .find(|s| (s.first_context..s.first_context + s.contexts).contains(&index))
                    .context("context out of range")?;
                dsc_format::keys::key_text_at(&a.cache, entry, index)?
            }
            (None, Source::Remote(_)) => None,
        };
        if let Some(text) = text {
            d.key = Value::String(text);
        }
    }
    if a.json {
        crate::output::print_json(&d)?;
        return Ok(0);
    }
    let records = manifest.is_records();
    outln!(
        "{} {}  split {}  index {}{}{}",
        if records { "row" } else { "key" },
        match &d.key {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        d.split,
        d.index,
        if records {
            String::new()
        } else {
            format!("  length {} of {}", d.length, d.full_length)
        },
        if a.raw { "  (raw stored values)" } else { "" }
    );
    // A record's values are all per sample: no table of steps.
    let title = if records { "record" } else { "context" };
    for (title, map) in [("targets", &d.targets), (title, &d.context)] {
        if !map.is_empty() {
            let parts: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k} = {}", cell(v)))
                .collect();
            outln!("{title}: {}", parts.join(", "));
        }
    }
    if records {
        return Ok(0);
    }
    // One row per step, one column per source column, cut to 100 columns.
    let names: Vec<&String> = d.columns.keys().collect();
    let width = ((100 - 6) / names.len().max(1)).clamp(6, 14);
    let fit = |s: &str| -> String {
        let s: String = s.chars().take(width - 1).collect();
        format!("{s:>w$}", w = width)
    };
    let mut header = format!("{:>5} ", "step");
    for n in &names {
        header.push_str(&fit(n));
    }
    let cut = |s: String| -> String { s.trim_end().chars().take(100).collect() };
    outln!("{}", crate::output::bold(&cut(header)));
    for step in 0..d.length {
        let mut line = format!("{step:>5} ");
        for n in &names {
            line.push_str(&fit(&cell(&d.columns[*n][step])));
        }
        outln!("{}", cut(line));
    }
    Ok(0)
}
