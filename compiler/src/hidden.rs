//! The statistics of the contexts an append hides (its replaced keys), so that the new
//! generation's `stats.json` is its live contexts' (FORMAT.md §14, "Removed rows"): each
//! generation that wrote one of them is compiled again, its recorded inputs read for those keys
//! alone, with the cache's parameters; what that compile counts is taken out of the merged
//! statistics. `None` where that cannot be exact: an input gone, changed or held in memory
//! then, and the statistics say how many hidden contexts they still count.

use crate::commit::CompileOptions;
use crate::error::{CompileError, Result};
use crate::own::Own;
use crate::{NoProgress, Storage};
use dsc_format::manifest::InputFile;
use dsc_format::{Manifest, Stats};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// The statistics of the parent's contexts at `(shard, row)` of `hidden`, one part per
/// generation that wrote some, compiled in folders under `scratch` (removed after), or `None`
/// where their inputs cannot give them exactly.
pub(crate) fn stats_of(
    cache: &Path,
    parent: &Manifest,
    hidden: &[(usize, u32)],
    scratch: &Path,
) -> Result<Option<Vec<Stats>>> {
    // The hidden keys, by the generation that wrote each (each shard's keys read once).
    let mut rows: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for &(shard, row) in hidden {
        rows.entry(shard).or_default().push(row);
    }
    let mut by_generation: BTreeMap<u32, HashSet<i64>> = BTreeMap::new();
    for (shard, rows) in rows {
        let entry = &parent.shards()[shard];
        let keys = dsc_format::sample::shard_keys(cache, parent, entry)?;
        let mine = by_generation.entry(entry.written_by()).or_default();
        mine.extend(rows.into_iter().map(|r| keys[r as usize]));
    }
    let lineage = Manifest::lineage(cache, &mut dsc_format::generation::LocalFiles(cache))?;
    let mut parts: Vec<Stats> = Vec::new();
    let result = (|| {
        for (n, keys) in by_generation {
            let Some(written) = lineage.iter().find(|m| m.generation_number() == n) else {
                return Ok(None);
            };
            let out = scratch.join(n.to_string());
            let stats = match one_generation(cache, written, keys, &out) {
                Ok(Some(stats)) => stats,
                // A signal stops the append; anything else (an input gone, unreadable) only
                // means the figures cannot be taken apart.
                Err(e @ CompileError::Interrupted { .. }) => return Err(e),
                Ok(None) | Err(_) => return Ok(None),
            };
            parts.push(stats);
        }
        Ok(Some(parts))
    })();
    // Scratch only: inside the append's staging folder, which becomes the generation's.
    let _ = std::fs::remove_dir_all(scratch);
    result
}

/// The statistics of the contexts of `keys` as generation `written` compiled them: its inputs
/// compiled again for those keys, into `out`.
fn one_generation(
    cache: &Path,
    written: &Manifest,
    keys: HashSet<i64>,
    out: &Path,
) -> Result<Option<Stats>> {
    let (files, skipped): (&[InputFile], _) = match written.generation() {
        None => (&written.inputs().files, BTreeMap::new()),
        Some(g) => (&g.inputs.files, g.skipped.clone()),
    };
    if files
        .iter()
        .any(|f| f.path.starts_with(crate::MEMORY_PREFIX))
    {
        return Ok(None);
    }
    let of = |role: &str| crate::commit::paths_of(files, role);
    let mut spec = written.spec().clone();
    spec.rows = of("rows");
    spec.context = of("context").into_iter().next();
    let joins = of("join");
    if joins.len() == spec.joins.len() {
        for (j, file) in spec.joins.iter_mut().zip(joins) {
            j.file = file;
        }
    }
    spec.fit_from = Some(cache.display().to_string());
    spec.empty_contexts = dsc_format::spec::EmptyContexts::Drop;
    let wanted = keys.len();
    let mut recipe = Own::new(&spec)?.keeping(keys);
    // A compaction's files left out the rows it recorded.
    recipe.skipping(
        skipped
            .into_iter()
            .map(|(path, ids)| (path.into(), ids.into_iter().collect()))
            .collect(),
    );
    let opts = CompileOptions {
        out: out.to_path_buf(),
        force: true,
        max_memory: None,
        storage: Storage::Hot,
        progress: &NoProgress,
    };
    let report = crate::local::run(recipe, &opts)?;
    // The same inputs, and every hidden context found again: else the figures would not be
    // those of the contexts the generation holds.
    let same = |f: &InputFile| files.iter().any(|g| g.path == f.path && g.xxh3 == f.xxh3);
    let found: usize = report.manifest.splits().iter().map(|s| s.contexts).sum();
    if !report.manifest.inputs().files.iter().all(same) || found != wanted {
        return Ok(None);
    }
    Ok(Some(report.stats))
}
