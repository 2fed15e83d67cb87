//! An append's end: the new shards checked against the cache (no key twice), renamed into
//! their generation's folder, the statistics of the whole generation merged from the parent's
//! and the new data's, and the next generation's manifest committed (FORMAT.md §14).

use crate::commit::{combined_fingerprint, CompileReport, Timer};
use crate::error::{CompileError, Result};
use crate::write::Staging;
use crate::Progress;
use dsc_format::manifest::{
    generation_folder, generation_manifest_name, CompileSummary, Generation, Inputs,
};
use dsc_format::stats::{Bin, ColumnStats, LengthStats, NumericStats, SplitStats, VocabEntry};
use dsc_format::{Manifest, ShardEntry};
use dsc_format::{SplitInfo, Stats, TensorSpec};
use std::collections::HashMap;
use std::path::PathBuf;

/// The name of the new data's own statistics, kept in the generation's folder beside the
/// statistics of the whole generation: what the append's drift report compared.
pub const ADDED_STATS_FILE: &str = "added-stats.json";

/// The drift report of an append ([`crate::Drift`]), kept in its generation's folder.
pub const DRIFT_FILE: &str = "drift.json";

/// What an append's compile wrote: its tensors, per split its rows and shards, its inputs,
/// counts and statistics.
pub(crate) struct Added {
    pub tensors: Vec<TensorSpec>,
    pub splits: Vec<(String, u64, Vec<ShardEntry>)>,
    pub inputs: Inputs,
    pub summary: CompileSummary,
    pub stats: Stats,
    /// The parent generation's statistics (read once, with its fitted parameters).
    pub parent_stats: Stats,
    /// An append's drift report (none for a compaction).
    pub drift: Option<crate::Drift>,
}

/// The statistics of the parent's contexts at `(shard, row)` compiled again from their inputs
/// in a scratch folder, one part per generation, or `None` where they cannot be exactly.
pub(crate) type HiddenStats = fn(
    &std::path::Path,
    &Manifest,
    &[(usize, u32)],
    &std::path::Path,
) -> Result<Option<Vec<Stats>>>;

/// What an append builds on: the cache's last generation, locked for the whole append.
pub(crate) struct Base {
    pub cache: PathBuf,
    pub parent: Manifest,
    /// Taken by [`Recipe::staging`], which holds it until the commit.
    pub lock: Option<crate::write::OutputLock>,
    /// A compaction: the compile rewrote every live context, so the generation lists its new
    /// shards only, numbered from 0, with the compile's own statistics.
    pub compact: bool,
    /// A key the cache holds is replaced (its old context hidden), not refused.
    pub replace: bool,
    /// A compaction's rows files with the keys whose rows they leave out: those a later
    /// generation replaced.
    pub skip: crate::spill::SkipKeys,
    /// A compaction's inputs as the last generation that read each recorded it (path to
    /// xxh3): a file that changed since would compile other contexts than the cache holds.
    pub expected: HashMap<String, String>,
    /// How an append reads back the statistics of the contexts it hides
    /// (`crate::hidden::stats_of`): given by the append, as this module runs inside the
    /// compile that function runs again.
    pub hidden_stats: Option<HiddenStats>,
    /// A cache in object storage: `cache` is then a local mirror of its manifests and
    /// statistics, its shards are read from the store, and the generation is published there.
    pub remote: Option<dsc_store::Remote>,
}

/// Commits `added` as the generation after `base.parent`: the parent's shards and the new
/// ones (an append), or the new ones alone (a compaction).
pub(crate) fn commit_append(
    base: &Base,
    staging: Staging,
    added: Added,
    mut timer: Timer,
    progress: &dyn Progress,
) -> Result<CompileReport> {
    let parent = &base.parent;
    let number = parent.generation_number() + 1;
    if added.tensors != parent.tensors() {
        return Err(CompileError::Internal(
            "an append's tensors differ from its cache's after taking its encodings".into(),
        ));
    }
    crate::write::failpoint("append:shards-written");
    if let Some(f) = added
        .inputs
        .files
        .iter()
        .find(|f| base.expected.get(&f.path).is_some_and(|was| *was != f.xxh3))
    {
        return Err(dsc_format::spelling::OptionError::new(
            "rows",
            format!(
                "{} changed since the cache read it (xxh3 {} then, {} now): a compaction \
                 compiles the inputs as they were; nothing was committed",
                f.path, base.expected[&f.path], f.xxh3
            ),
        )
        .into());
    }
    // The parent's shards, each with the rows this generation hides (the contexts whose keys
    // it replaces) added to those already hidden.
    let mut parents: Vec<ShardEntry> = parent.shards().to_vec();
    let mut removed: std::collections::BTreeMap<String, usize> = Default::default();
    let mut replaced: Vec<(usize, u32)> = Vec::new();
    if !base.compact {
        replaced = known_keys(base, &staging, &added)?;
        for &(shard, row) in &replaced {
            parents[shard].removed.push(row);
            *removed.entry(parents[shard].split.clone()).or_default() += 1;
        }
        for e in &mut parents {
            e.removed.sort_unstable();
        }
    }
    // What the generation keeps of its parent: everything for an append, nothing for a
    // compaction (which rewrote it).
    let kept = |split: &str| -> Vec<ShardEntry> {
        match base.compact {
            true => Vec::new(),
            false => parents
                .iter()
                .filter(|e| e.split == split)
                .cloned()
                .collect(),
        }
    };
    let mut shards: Vec<ShardEntry> = Vec::new();
    let mut splits: Vec<SplitInfo> = Vec::new();
    let mut names: Vec<&str> = parent.splits().iter().map(|s| s.name.as_str()).collect();
    for (name, _, _) in &added.splits {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    // `train` first, then the others by name (FORMAT.md §3).
    names.sort_by_key(|n| (*n != "train", *n));
    let folder = generation_folder(number, &folder_id(&parent.content_id(), &added));
    let mut new_bytes = 0;
    for name in names {
        let old = parent.split(name).filter(|_| !base.compact);
        let new = added.splits.iter().find(|(n, _, _)| n == name);
        let mut mine: Vec<ShardEntry> = kept(name);
        for e in new.map_or(&[][..], |(_, _, e)| e) {
            let mut e = e.clone();
            e.generation = Some(number);
            e.file = format!("{folder}/{}", e.file);
            if let Some(keys) = &mut e.keys {
                keys.file = format!("{folder}/{}", keys.file);
            }
            new_bytes += e.stored_bytes();
            mine.push(e);
        }
        splits.push(SplitInfo {
            name: name.into(),
            contexts: mine.iter().map(|s| s.live_contexts()).sum(),
            removed: mine.iter().map(|s| s.removed.len()).sum(),
            rows_stored: old.map_or(0, |s| s.rows_stored) + new.map_or(0, |n| n.1),
            shards: mine.len(),
        });
        shards.extend(mine);
    }
    let mut files = match base.compact {
        true => Vec::new(),
        false => parent.inputs().files.clone(),
    };
    files.extend(added.inputs.files.iter().cloned());
    let inputs = Inputs {
        fingerprint: combined_fingerprint(&files),
        files,
    };
    let generation = Generation {
        number,
        parent: parent.content_id(),
        kind: if base.compact { "compact" } else { "append" }.into(),
        folder: folder.clone(),
        inputs: added.inputs,
        summary: added.summary.clone(),
        removed,
        skipped: base
            .skip
            .iter()
            .filter(|(_, keys)| !keys.is_empty())
            .map(|(path, keys)| {
                let mut ids: Vec<i64> = keys.iter().copied().collect();
                ids.sort_unstable();
                (path.display().to_string(), ids)
            })
            .collect(),
    };
    let summary = match base.compact {
        true => added.summary.clone(),
        false => {
            let mut s = add_summaries(parent.summary(), &added.summary);
            // The contexts it hides are no longer the generation's.
            s.contexts -= generation.removed.values().sum::<usize>().min(s.contexts);
            s
        }
    };
    let manifest = parent
        .clone()
        .next_generation(generation, splits, shards, inputs, summary)
        .map_err(|p| CompileError::Internal(format!("the generation is inconsistent: {p}")))?;
    let stats = match base.compact {
        // Every live context went through this compile: its statistics are exact, quantiles
        // included.
        true => added.stats.clone(),
        false => {
            let merged = merge_stats(
                &added.parent_stats,
                &added.stats,
                parent.generation_number(),
            );
            // The contexts it hides are taken out of the figures where their own statistics
            // can be had exactly (their inputs, read again for those keys); else the figures
            // keep counting them, and say how many.
            let hidden = match (replaced.is_empty(), &base.remote, base.hidden_stats) {
                (false, None, Some(read_back)) => {
                    read_back(&base.cache, parent, &replaced, &staging.dir.join(".hidden"))?
                }
                _ => None,
            };
            match hidden {
                Some(parts) => parts.iter().fold(merged, |s, h| subtract_stats(&s, h)),
                None => {
                    let mut kept = merged;
                    let g = manifest.generation().expect("a later generation");
                    for (split, n) in &g.removed {
                        for key in [split.as_str(), dsc_format::ALL_SPLITS] {
                            *kept.includes_hidden.entry(key.to_string()).or_default() += *n as u64;
                        }
                    }
                    kept
                }
            }
        }
    };
    let json = |s: &Stats| {
        let mut out = serde_json::to_vec_pretty(s).expect("stats serialize");
        out.push(b'\n');
        out
    };
    staging.write_file(dsc_format::STATS_FILE, &json(&stats))?;
    if let Some(d) = &added.drift {
        staging.write_file(ADDED_STATS_FILE, &json(&added.stats))?;
        let mut drift = serde_json::to_vec_pretty(d).expect("drift serializes");
        drift.push(b'\n');
        staging.write_file(DRIFT_FILE, &drift)?;
    }
    crate::write::failpoint("append:stats-written");
    crate::progress::check(progress)?;
    let name = generation_manifest_name(number);
    match &base.remote {
        None => {
            staging.commit_generation(
                &base.cache,
                number,
                (&folder, &name),
                &manifest.to_json(),
            )?;
        }
        Some(store) => publish(store, &staging, (&folder, &name), &manifest, number)?,
    }
    timer.lap("commit");
    Ok(CompileReport {
        out: base.cache.clone(),
        manifest,
        stats,
        cache_bytes: new_bytes,
        timings: timer.timings,
        phases: Vec::new(),
        drift: added.drift,
        replaced: None,
    })
}

/// Publishes a generation in object storage: every file of the staging folder uploaded under
/// the generation's folder (a name no other writer's bytes share), then its manifest written
/// only if absent (a conditional put): of two writers of one generation, one commits and the
/// other is refused, its folder left for `dsc gc`.
fn publish(
    store: &dsc_store::Remote,
    staging: &Staging,
    (folder, manifest_name): (&str, &str),
    manifest: &Manifest,
    number: u32,
) -> Result<()> {
    let store_err = |e| CompileError::Store(Box::new(e));
    for file in crate::retain::walk(&staging.dir)? {
        let rel = file
            .strip_prefix(&staging.dir)
            .expect("inside the staging folder")
            .to_string_lossy()
            .replace('\\', "/");
        let bytes = std::fs::read(&file).map_err(|e| CompileError::io(&file, e))?;
        store
            .put(&format!("{folder}/{rel}"), bytes)
            .map_err(store_err)?;
    }
    crate::write::failpoint("append:uploaded");
    if !store
        .put_new(manifest_name, manifest.to_json())
        .map_err(store_err)?
    {
        return Err(CompileError::GenerationTaken {
            path: PathBuf::from(store.url()),
            number,
        });
    }
    Ok(())
}

/// The id in a generation's folder name: a hash of its parent and of the shards it adds, so
/// that two writers of the same generation number write the same files only when they write
/// the same bytes.
fn folder_id(parent: &str, added: &Added) -> String {
    let mut h = dsc_format::checksum::Hasher::new();
    h.update(parent.as_bytes());
    for e in added.splits.iter().flat_map(|(_, _, e)| e) {
        h.update(format!("\n{}\0{}\0{}", e.split, e.index, e.xxh3).as_bytes());
    }
    h.hex()
}

/// The contexts of the parent whose keys the new shards hold again, as (the parent's shard,
/// its row): refused unless the append replaces them, naming the first such key in the new
/// shards' order, the shard holding it and its generation. A context the parent already hides
/// is not a key of the cache.
fn known_keys(base: &Base, staging: &Staging, added: &Added) -> Result<Vec<(usize, u32)>> {
    let parent = &base.parent;
    let mut known: HashMap<i64, (usize, u32)> = HashMap::new();
    for (i, entry) in parent.shards().iter().enumerate() {
        let keys = match &base.remote {
            None => dsc_format::sample::shard_keys(&base.cache, parent, entry)?,
            Some(store) => remote_keys(store, parent, entry)?,
        };
        for (row, key) in keys.into_iter().enumerate() {
            if !entry.is_hidden(row) {
                known.insert(key, (i, row as u32));
            }
        }
    }
    let mut replaced = Vec::new();
    for entry in added.splits.iter().flat_map(|(_, _, e)| e) {
        let keys = dsc_format::sample::shard_keys(&staging.dir, parent, entry)?;
        for (pos, id) in keys.iter().enumerate() {
            let Some(&(old, row)) = known.get(id) else {
                continue;
            };
            if base.replace {
                replaced.push((old, row));
                continue;
            }
            let key_type = dsc_format::keys::key_type(parent);
            let text = match key_type.integer_of(*id) {
                Some(t) => t,
                None => {
                    dsc_format::keys::key_text_at(&staging.dir, entry, entry.first_context + pos)?
                        .map_or(format!("id {id}"), |t| format!("{t:?}"))
                }
            };
            let holder = &parent.shards()[old];
            return Err(CompileError::KeyInCache {
                key: text,
                file: holder.file.clone(),
                generation: holder.written_by(),
            });
        }
    }
    Ok(replaced)
}

/// The key ids of shard `entry` in object storage: its header and `key` tensor (the first of
/// every shard), read by ranged requests.
fn remote_keys(
    store: &dsc_store::Remote,
    parent: &Manifest,
    entry: &ShardEntry,
) -> Result<Vec<i64>> {
    let path = PathBuf::from(store.url_of(&entry.file));
    let len = entry.stored_bytes();
    let layout =
        dsc_format::stored::read_layout_from(entry, store.reader(&entry.file, len), len, &path)?;
    layout.check(parent, entry, &path)?;
    let extent = layout.tensor("key").expect("checked against the manifest");
    let prefix = dsc_format::stored::read_prefix_from(
        entry,
        store.reader(&entry.file, len),
        &path,
        extent.end as usize,
    )?;
    Ok(prefix[extent.start as usize..]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

fn add_summaries(a: &CompileSummary, b: &CompileSummary) -> CompileSummary {
    CompileSummary {
        rows_read: a.rows_read + b.rows_read,
        rows_stored: a.rows_stored + b.rows_stored,
        contexts: a.contexts + b.contexts,
        contexts_truncated: a.contexts_truncated + b.contexts_truncated,
        contexts_without_context_row: a.contexts_without_context_row
            + b.contexts_without_context_row,
        rows_without_context_row: a.rows_without_context_row + b.rows_without_context_row,
        contexts_without_rows: a.contexts_without_rows + b.contexts_without_rows,
        empty_contexts_kept: a.empty_contexts_kept + b.empty_contexts_kept,
        values_filled: a.values_filled + b.values_filled,
    }
}

/// The statistics of a generation: its parent's `old` (of generation `parent`) and the new
/// data's `new`, merged where statistics merge exactly (counts, moments by Chan's formula,
/// extremes, histograms, vocabularies); quantiles stay those of the oldest generation that had
/// values, named by `quantiles_of`.
pub(crate) fn merge_stats(old: &Stats, new: &Stats, parent: u32) -> Stats {
    let mut splits: Vec<SplitStats> = old.splits.clone();
    for n in &new.splits {
        match splits.iter_mut().find(|s| s.split == n.split) {
            Some(s) => *s = merge_split(s, n),
            None => splits.push(n.clone()),
        }
    }
    Stats {
        format_version: old.format_version,
        splits,
        quantiles_of: Some(old.quantiles_of.unwrap_or(parent)),
        includes_hidden: old.includes_hidden.clone(),
    }
}

fn merge_split(a: &SplitStats, b: &SplitStats) -> SplitStats {
    let mut columns = a.columns.clone();
    for c in &b.columns {
        match columns
            .iter_mut()
            .find(|x| x.name == c.name && x.table == c.table)
        {
            Some(x) => *x = merge_column(x, c),
            None => columns.push(c.clone()),
        }
    }
    SplitStats {
        split: a.split.clone(),
        contexts: a.contexts + b.contexts,
        rows: a.rows + b.rows,
        lengths: merge_lengths(&a.lengths, a.contexts, &b.lengths, b.contexts),
        columns,
    }
}

fn merge_lengths(a: &LengthStats, na: u64, b: &LengthStats, nb: u64) -> LengthStats {
    if nb == 0 {
        return a.clone();
    }
    if na == 0 {
        return b.clone();
    }
    let n = na + nb;
    let mut histogram: Vec<Bin> = if a.histogram.len() >= b.histogram.len() {
        a.histogram.clone()
    } else {
        b.histogram.clone()
    };
    for (i, bin) in histogram.iter_mut().enumerate() {
        bin.count =
            a.histogram.get(i).map_or(0, |x| x.count) + b.histogram.get(i).map_or(0, |x| x.count);
    }
    let truncated = a.truncated + b.truncated;
    LengthStats {
        min: a.min.min(b.min),
        max: a.max.max(b.max),
        mean: (a.mean * na as f64 + b.mean * nb as f64) / n as f64,
        quantiles: a.quantiles.clone(),
        histogram,
        truncated,
        truncated_fraction: truncated as f64 / n as f64,
    }
}

fn merge_column(a: &ColumnStats, b: &ColumnStats) -> ColumnStats {
    let numeric = match (&a.numeric, &b.numeric) {
        (Some(x), Some(y)) => Some(merge_numeric(x, a.count, y, b.count)),
        (x, y) => x.clone().or_else(|| y.clone()),
    };
    let vocabulary = match (&a.vocabulary, &b.vocabulary) {
        (Some(x), Some(y)) => Some(merge_vocabulary(x, y)),
        (x, y) => x.clone().or_else(|| y.clone()),
    };
    ColumnStats {
        name: a.name.clone(),
        table: a.table.clone(),
        source_type: a.source_type.clone(),
        count: a.count + b.count,
        nulls: a.nulls + b.nulls,
        nan: a.nan + b.nan,
        inf: a.inf + b.inf,
        numeric,
        distinct: vocabulary.as_ref().map(|v| v.len() as u64).or(a.distinct),
        vocabulary,
    }
}

/// Two columns' moments merged as FORMAT.md §9.2 merges buckets (Chan et al.), from the
/// population standard deviations the files keep.
fn merge_numeric(a: &NumericStats, na: u64, b: &NumericStats, nb: u64) -> NumericStats {
    let (fa, fb) = (na as f64, nb as f64);
    let n = fa + fb;
    let d = b.mean - a.mean;
    let mean = a.mean + (d * fb) / n;
    let m2 = a.std * a.std * fa + b.std * b.std * fb + d * d * ((fa * fb) / n);
    NumericStats {
        min: a.min.min(b.min),
        max: a.max.max(b.max),
        mean,
        std: (m2 / n).sqrt(),
        quantiles: a.quantiles.clone(),
        histogram: merge_bins(&a.histogram, &b.histogram),
    }
}

/// Two histograms on the same edges (an append bins its data on its parent's) added bin by
/// bin; the first one's otherwise.
fn merge_bins(a: &[Bin], b: &[Bin]) -> Vec<Bin> {
    combine_bins(a, b, |x, y| x + y)
}

/// `a`'s and `b`'s counts combined by `op` bin by bin, where both have the same edges; `a`
/// otherwise.
fn combine_bins(a: &[Bin], b: &[Bin], op: fn(u64, u64) -> u64) -> Vec<Bin> {
    let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x.lo, x.hi) == (y.lo, y.hi));
    if !same {
        return a.to_vec();
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| Bin {
            count: op(x.count, y.count),
            ..*x
        })
        .collect()
}

/// `all` less `part`, the statistics of contexts `all` counts (those a generation hides): exact
/// for counts, moments (Chan's merge solved for the rest), histograms, length histograms and
/// vocabularies. Extremes and quantiles stay `all`'s: nothing tells what the rest's are, so
/// they bound it (FORMAT.md §14, "Removed rows").
pub(crate) fn subtract_stats(all: &Stats, part: &Stats) -> Stats {
    let splits = all
        .splits
        .iter()
        .map(|a| match part.splits.iter().find(|p| p.split == a.split) {
            Some(p) => subtract_split(a, p),
            None => a.clone(),
        })
        .collect();
    Stats {
        splits,
        ..all.clone()
    }
}

fn subtract_split(a: &SplitStats, b: &SplitStats) -> SplitStats {
    let columns = a
        .columns
        .iter()
        .map(|c| {
            match b
                .columns
                .iter()
                .find(|x| x.name == c.name && x.table == c.table)
            {
                Some(x) => subtract_column(c, x),
                None => c.clone(),
            }
        })
        .collect();
    SplitStats {
        split: a.split.clone(),
        contexts: a.contexts.saturating_sub(b.contexts),
        rows: a.rows.saturating_sub(b.rows),
        lengths: subtract_lengths(&a.lengths, a.contexts, &b.lengths, b.contexts),
        columns,
    }
}

fn subtract_lengths(a: &LengthStats, na: u64, b: &LengthStats, nb: u64) -> LengthStats {
    let n = na.saturating_sub(nb);
    if nb == 0 || n == 0 {
        return a.clone();
    }
    let truncated = a.truncated.saturating_sub(b.truncated);
    // Power-of-two bins up to the longest context's: those past the longest one left, empty
    // now, go.
    // Bins from 0 on, as many as each side's longest context needs: taken apart by index.
    let mut histogram = a.histogram.clone();
    for (bin, taken) in histogram.iter_mut().zip(&b.histogram) {
        bin.count = bin.count.saturating_sub(taken.count);
    }
    while histogram.last().is_some_and(|bin| bin.count == 0) {
        histogram.pop();
    }
    LengthStats {
        mean: (a.mean * na as f64 - b.mean * nb as f64) / n as f64,
        histogram,
        truncated,
        truncated_fraction: truncated as f64 / n as f64,
        ..a.clone()
    }
}

fn subtract_column(a: &ColumnStats, b: &ColumnStats) -> ColumnStats {
    let numeric = match (&a.numeric, &b.numeric) {
        (Some(x), Some(y)) => Some(subtract_numeric(x, a.count, y, b.count)),
        (x, _) => x.clone(),
    };
    let vocabulary = match (&a.vocabulary, &b.vocabulary) {
        (Some(x), Some(y)) => Some(subtract_vocabulary(x, y)),
        (x, _) => x.clone(),
    };
    ColumnStats {
        count: a.count.saturating_sub(b.count),
        nulls: a.nulls.saturating_sub(b.nulls),
        nan: a.nan.saturating_sub(b.nan),
        inf: a.inf.saturating_sub(b.inf),
        numeric,
        distinct: vocabulary.as_ref().map(|v| v.len() as u64).or(a.distinct),
        vocabulary,
        ..a.clone()
    }
}

/// The moments of `a`'s values less `b`'s: the mean and population deviation of the rest, by
/// [`merge_numeric`]'s formula solved for one side.
fn subtract_numeric(a: &NumericStats, na: u64, b: &NumericStats, nb: u64) -> NumericStats {
    let n = na.saturating_sub(nb);
    if nb == 0 || n == 0 {
        return a.clone();
    }
    let (fa, fb, f) = (na as f64, nb as f64, n as f64);
    let mean = (a.mean * fa - b.mean * fb) / f;
    let d = b.mean - mean;
    let m2 = a.std * a.std * fa - b.std * b.std * fb - d * d * ((f * fb) / fa);
    NumericStats {
        mean,
        std: (m2.max(0.0) / f).sqrt(),
        histogram: subtract_bins(&a.histogram, &b.histogram),
        ..a.clone()
    }
}

/// [`merge_bins`] undone: `b`'s counts taken from `a`'s, bin by bin, on the same edges.
fn subtract_bins(a: &[Bin], b: &[Bin]) -> Vec<Bin> {
    combine_bins(a, b, u64::saturating_sub)
}

/// [`merge_vocabulary`] undone: `b`'s counts taken from `a`'s, values left with none removed,
/// in §5.3's order.
fn subtract_vocabulary(a: &[VocabEntry], b: &[VocabEntry]) -> Vec<VocabEntry> {
    let taken: HashMap<String, u64> = b.iter().map(|e| (e.value.to_string(), e.count)).collect();
    let mut out: Vec<VocabEntry> = a
        .iter()
        .map(|e| VocabEntry {
            count: e
                .count
                .saturating_sub(taken.get(&e.value.to_string()).copied().unwrap_or(0)),
            ..e.clone()
        })
        .filter(|e| e.count > 0)
        .collect();
    out.sort_by(|x, y| {
        y.count
            .cmp(&x.count)
            .then_with(|| order_values(&x.value, &y.value))
    });
    out
}

/// Counts per value added, most frequent first, ties by ascending value (§5.3's order).
fn merge_vocabulary(a: &[VocabEntry], b: &[VocabEntry]) -> Vec<VocabEntry> {
    let mut merged: Vec<VocabEntry> = a.to_vec();
    // By the value's JSON text: vocabularies of thousands of values meet in linear time.
    let mut at: HashMap<String, usize> = merged
        .iter()
        .enumerate()
        .map(|(i, e)| (e.value.to_string(), i))
        .collect();
    for e in b {
        match at.get(&e.value.to_string()) {
            Some(&i) => merged[i].count += e.count,
            None => {
                at.insert(e.value.to_string(), merged.len());
                merged.push(e.clone());
            }
        }
    }
    merged.sort_by(|x, y| {
        y.count
            .cmp(&x.count)
            .then_with(|| order_values(&x.value, &y.value))
    });
    merged
}

fn order_values(a: &serde_json::Value, b: &serde_json::Value) -> std::cmp::Ordering {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => x
                .as_f64()
                .partial_cmp(&y.as_f64())
                .unwrap_or(std::cmp::Ordering::Equal),
        },
        (String(x), String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Bool(x), Bool(y)) => x.cmp(y),
        _ => std::cmp::Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(values: &[f64]) -> NumericStats {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        NumericStats {
            min: values.iter().cloned().fold(f64::INFINITY, f64::min),
            max: values.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            mean,
            std: var.sqrt(),
            quantiles: Vec::new(),
            histogram: Vec::new(),
        }
    }

    #[test]
    fn moments_merge_to_those_of_all_values() {
        let (a, b) = ([1.0, 2.0, 3.5, 10.0], [-4.0, 0.5, 7.0]);
        let all: Vec<f64> = a.iter().chain(&b).copied().collect();
        let merged = merge_numeric(&numeric(&a), 4, &numeric(&b), 3);
        let whole = numeric(&all);
        assert!((merged.mean - whole.mean).abs() < 1e-12);
        assert!((merged.std - whole.std).abs() < 1e-12);
        assert_eq!((merged.min, merged.max), (whole.min, whole.max));
    }

    #[test]
    fn taking_a_part_out_gives_the_moments_and_counts_of_the_rest() {
        let (a, b) = ([1.0, 2.0, 3.5, 10.0], [-4.0, 0.5, 7.0]);
        let all: Vec<f64> = a.iter().chain(&b).copied().collect();
        let rest = subtract_numeric(&numeric(&all), 7, &numeric(&b), 3);
        let want = numeric(&a);
        assert!((rest.mean - want.mean).abs() < 1e-12);
        assert!((rest.std - want.std).abs() < 1e-12);
        let e = |v: serde_json::Value, count| VocabEntry { value: v, count };
        let merged = merge_vocabulary(&[e(3.into(), 5), e(1.into(), 2)], &[e(1.into(), 3)]);
        assert_eq!(
            subtract_vocabulary(&merged, &[e(3.into(), 5)]),
            vec![e(1.into(), 5)],
            "a value left with no count goes"
        );
    }

    #[test]
    fn vocabularies_add_their_counts_in_the_format_order() {
        let e = |v: serde_json::Value, count| VocabEntry { value: v, count };
        let a = [e(3.into(), 5), e(1.into(), 2)];
        let b = [e(1.into(), 3), e(7.into(), 5)];
        let m = merge_vocabulary(&a, &b);
        let got: Vec<(i64, u64)> = m
            .iter()
            .map(|x| (x.value.as_i64().unwrap(), x.count))
            .collect();
        assert_eq!(got, [(1, 5), (3, 5), (7, 5)]);
    }
}
