//! `dsc append`: new contexts compiled with a cache's recorded spec and its fitted parameters
//! frozen, written as new shards, and committed as the cache's next generation. No file of
//! the cache changes; readers of earlier generations keep reading exactly them.

use crate::commit::{CompileOptions, CompileReport};
use crate::error::Result;
use crate::lineage::Base;
use crate::own::Own;
use crate::write::OutputLock;
use dsc_format::spec::JoinSpec;
use dsc_format::spelling::OptionError;
use dsc_format::Manifest;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// An append's buckets are this fraction of its spec's bucket size.
const APPEND_BUCKETS: u64 = 8;

/// The inputs of an append: what a compile takes as rows, context table and joins. Everything
/// else is the cache's recorded spec.
#[derive(Debug, Clone, Default)]
pub struct AppendInputs {
    /// Rows files: paths, folders or globs (as `dsc compile` takes them).
    pub rows: Vec<String>,
    /// The new contexts' rows of the context table, when the cache was compiled with one.
    pub context: Option<String>,
    /// Lookup tables; the cache's own when `None`.
    pub joins: Option<Vec<JoinSpec>>,
    /// What to do with a key the cache already holds.
    pub existing: Existing,
}

/// What an append does with a key the cache already holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Existing {
    /// Refuse the append, naming the key, the shard holding it and its generation.
    #[default]
    Refuse,
    /// Store the new whole context and hide the old one: the new generation's manifest lists
    /// the old context's row among its shard's removed rows (FORMAT.md §14, "Removed rows").
    Replace,
}

impl std::str::FromStr for Existing {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Existing, String> {
        match s {
            "refuse" => Ok(Existing::Refuse),
            "replace" => Ok(Existing::Replace),
            other => Err(format!(
                "{other:?} is not a choice: `refuse` (the default: an append adds new keys only) \
                 or `replace` (a new context replaces the cache's context of its key)"
            )),
        }
    }
}

/// Appends `new` to the cache at `cache` as its next generation: written inside a local
/// cache; for a cache in object storage (a URL), compiled in the local folder `opts.out` (a
/// mirror of its manifests and statistics, emptied first) and published in the store, its
/// manifest written only if absent (a writer that lost the race is refused). Waits while another writer holds the cache, then
/// appends on top of the last generation. Refused, with nothing changed: a key the cache
/// already holds, inputs whose tensors would differ from the cache's, and a cache this build
/// cannot append to (a table of records, a profile's, one in object storage).
pub fn append(cache: &Path, new: &AppendInputs, opts: &CompileOptions) -> Result<CompileReport> {
    let result = run(cache, new, opts);
    opts.progress.finish();
    result
}

fn run(cache: &Path, new: &AppendInputs, opts: &CompileOptions) -> Result<CompileReport> {
    // A cache in object storage is appended to through a local mirror of its manifests and
    // statistics, in `opts.out`: its shards stay in the store.
    let (local, remote) = match crate::remote::is_url(cache) {
        true => {
            let store = crate::remote::cache_store(cache)?;
            (opts.out.clone(), Some(store))
        }
        false => (cache.to_path_buf(), None),
    };
    let lock = OutputLock::wait(&local, |_| {})?;
    if let Some(store) = &remote {
        mirror(store, &local)?;
    }
    let cache = local.as_path();
    let parent = Manifest::read(cache)?;
    let recorded = parent.spec();
    if parent.is_records() {
        return Err(refuse(
            "rows",
            "a table of records is keyed by row numbers, which an append would repeat".into(),
        ));
    }
    if recorded.profile.is_some() {
        return Err(refuse(
            "profile",
            "a profile's cache cannot be appended to".into(),
        ));
    }
    let mut spec = recorded.clone();
    spec.rows = new.rows.clone();
    match (&recorded.context, &new.context) {
        (Some(c), None) => {
            return Err(refuse(
                "context",
                format!(
                "the cache was compiled with a context table ({c}): give the new contexts' table"
            ),
            ))
        }
        (None, Some(_)) => {
            return Err(refuse(
                "context",
                "the cache was compiled without a context table".into(),
            ))
        }
        _ => spec.context = new.context.clone(),
    }
    if let Some(joins) = &new.joins {
        let on = |j: &[JoinSpec]| j.iter().map(|j| j.on.clone()).collect::<Vec<_>>();
        if on(joins) != on(&recorded.joins) {
            return Err(refuse(
                "joins",
                format!(
                    "the cache joins on {:?}, the append on {:?}",
                    on(&recorded.joins),
                    on(joins)
                ),
            ));
        }
        spec.joins = joins.clone();
    }
    // An append is a fraction of the data its spec's buckets were sized for, and a compile's
    // threads share out buckets: smaller ones keep every core busy. A fixed fraction, so that
    // the shards depend on the inputs alone (buckets shape shard boundaries, never values).
    let bucket = recorded
        .bucket_size
        .unwrap_or(dsc_format::spec::DEFAULT_BUCKET_SIZE);
    spec.bucket_size = Some((bucket / APPEND_BUCKETS).max(1 << 20));
    let base = Base {
        cache: cache.into(),
        parent,
        lock: Some(lock),
        compact: false,
        replace: new.existing == Existing::Replace,
        skip: Default::default(),
        expected: Default::default(),
        hidden_stats: Some(crate::hidden::stats_of),
        remote,
    };
    next_generation(spec, base, opts)
}

/// Copies what an append reads of the cache in `store` into the local folder `to` (emptied
/// first): the first generation's manifest and statistics, and the last generation's, under
/// their names. The shards stay in the store.
fn mirror(store: &dsc_store::Remote, to: &Path) -> Result<()> {
    let store_err = |e| crate::CompileError::Store(Box::new(e));
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| crate::CompileError::io(to, e))?;
    }
    let url = PathBuf::from(store.url());
    let last = Manifest::open_generation(&url, &Default::default(), &mut store.clone())?;
    let mut names = vec![
        dsc_format::MANIFEST_FILE.to_string(),
        dsc_format::STATS_FILE.to_string(),
    ];
    if last.generation_number() > 1 {
        names.push(last.manifest_file());
        names.push(last.stats_file());
    }
    for name in names {
        let bytes = store.get(&name).map_err(store_err)?;
        let path = to.join(&name);
        let dir = path.parent().expect("inside the mirror");
        std::fs::create_dir_all(dir).map_err(|e| crate::CompileError::io(dir, e))?;
        std::fs::write(&path, bytes).map_err(|e| crate::CompileError::io(&path, e))?;
    }
    Ok(())
}

/// Compiles `spec` (the cache's, with the generation's inputs) with the cache's parameters as
/// the generation after `base.parent`.
fn next_generation(
    mut spec: dsc_format::CompileSpec,
    base: Base,
    opts: &CompileOptions,
) -> Result<CompileReport> {
    // A context table that grows holds the earlier generations' contexts too: its keys
    // without new rows are not contexts of this generation (new ones without rows are left
    // out as well, and an append's key check refuses any the cache has).
    if spec.empty_contexts == dsc_format::spec::EmptyContexts::Error {
        spec.empty_contexts = dsc_format::spec::EmptyContexts::Drop;
    }
    spec.fit_from = Some(base.cache.display().to_string());
    let recipe = Own::new(&spec)?.append_to(base);
    crate::local::run(recipe, opts)
}

/// Rewrites the live contexts of the cache at `cache` as its next generation, one compile of
/// every generation's inputs with the first generation's fitted parameters: its shards are
/// byte for byte those of `dsc compile ALL_INPUTS --fit-from CACHE` with the cache's spec,
/// numbered from 0 in its own folder, and it lists no earlier shard (`opts.out` is ignored).
/// Rows of keys that a later generation replaced are left out of the files read before it.
/// The inputs must still be where and as they were (their checksums are compared); inputs
/// that cannot be read again (tables in memory) and generations that read different context
/// tables are refused.
pub fn compact(cache: &Path, opts: &CompileOptions) -> Result<CompileReport> {
    let result = run_compact(cache, opts);
    opts.progress.finish();
    result
}

fn run_compact(cache: &Path, opts: &CompileOptions) -> Result<CompileReport> {
    if crate::remote::is_url(cache) {
        return Err(refuse(
            "cache",
            "compacting a cache in object storage is not supported yet: compact a local copy"
                .into(),
        ));
    }
    let lock = OutputLock::wait(cache, |_| {})?;
    let lineage = Manifest::lineage(cache, &mut dsc_format::generation::LocalFiles(cache))?;
    let parent = lineage
        .last()
        .expect("a cache has its first generation")
        .clone();
    let recorded = parent.spec().clone();
    if recorded.profile.is_some() || parent.is_records() {
        return Err(refuse(
            "rows",
            "only caches that can be appended to are compacted".into(),
        ));
    }
    // Every generation's inputs, in the order they came: a compaction's are the whole list.
    // Each rows file is read by the last generation that read it: its rows of keys a later
    // generation replaced are left out (a compaction's own left-out keys carry over).
    let mut files: Vec<dsc_format::manifest::InputFile> = Vec::new();
    let mut read_by: HashMap<String, u32> = HashMap::new();
    let mut carried: HashMap<String, HashSet<i64>> = HashMap::new();
    let mut expected: HashMap<String, String> = HashMap::new();
    for m in &lineage {
        let n = m.generation_number();
        let theirs = match m.generation() {
            None => &m.inputs().files,
            Some(g) if g.kind == "compact" => {
                files.clear();
                read_by.clear();
                expected.clear();
                carried = g
                    .skipped
                    .iter()
                    .map(|(path, ids)| (path.clone(), ids.iter().copied().collect()))
                    .collect();
                &g.inputs.files
            }
            Some(g) => &g.inputs.files,
        };
        files.extend(theirs.iter().cloned());
        for f in theirs.iter() {
            expected.insert(f.path.clone(), f.xxh3.clone());
        }
        for f in theirs.iter().filter(|f| f.role == "rows") {
            read_by.insert(f.path.clone(), n);
        }
    }
    let skip = replaced_rows(cache, &parent, &read_by, carried)?;
    if let Some(f) = files
        .iter()
        .find(|f| f.path.starts_with(crate::MEMORY_PREFIX))
    {
        return Err(refuse(
            "rows",
            format!(
                "{} was a table in memory, which a compaction cannot read again",
                f.path
            ),
        ));
    }
    let of = |role: &str| crate::commit::paths_of(&files, role);
    let contexts = of("context");
    if contexts.len() > 1 {
        return Err(refuse(
            "context",
            format!(
                "the generations read different context tables ({}): a compaction compiles \
                 one table holding every context",
                contexts.join(", ")
            ),
        ));
    }
    let mut spec = recorded.clone();
    spec.rows = of("rows");
    spec.context = contexts.into_iter().next();
    let base = Base {
        cache: cache.into(),
        parent,
        lock: Some(lock),
        compact: true,
        replace: false,
        skip,
        expected,
        hidden_stats: None,
        remote: None,
    };
    next_generation(spec, base, opts)
}

/// Per rows file (read last by generation `read_by[path]`), the key ids whose rows a
/// compaction leaves out: those of contexts a later generation added (it replaced them), and
/// those `carried` from the compaction that read the file before. Empty for a lineage that
/// never replaced a key, whose compaction reads its files whole.
fn replaced_rows(
    cache: &Path,
    last: &Manifest,
    read_by: &HashMap<String, u32>,
    carried: HashMap<String, HashSet<i64>>,
) -> Result<crate::spill::SkipKeys> {
    let mut skip: crate::spill::SkipKeys = carried
        .into_iter()
        .map(|(path, ids)| (PathBuf::from(path), ids))
        .collect();
    if last.splits().iter().all(|s| s.removed == 0) {
        return Ok(skip);
    }
    // The keys each generation added, hidden ones included.
    let mut added: HashMap<u32, HashSet<i64>> = HashMap::new();
    for entry in last.shards() {
        let keys = dsc_format::sample::shard_keys(cache, last, entry)?;
        added.entry(entry.written_by()).or_default().extend(keys);
    }
    for (path, &n) in read_by {
        let later = added.iter().filter(|(&g, _)| g > n).flat_map(|(_, k)| k);
        skip.entry(PathBuf::from(path)).or_default().extend(later);
    }
    skip.retain(|_, ids| !ids.is_empty());
    Ok(skip)
}

fn refuse(key: &'static str, problem: String) -> crate::CompileError {
    OptionError::new(key, problem).into()
}
