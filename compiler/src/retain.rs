//! Which generations a cache keeps: names given to generations (`dsc tag`), and the removal
//! of the generations, shards and leftovers no kept generation needs (`dsc gc`). Both take the
//! cache's lock, so they never interleave with an append.

use crate::error::{CompileError, Result};
use crate::write::OutputLock;
use dsc_format::generation::{tag_file_name, tag_name_problem, LocalFiles};
use dsc_format::manifest::generation_manifest_name;
use dsc_format::spelling::OptionError;
use dsc_format::{GenerationRef, Manifest, GENERATIONS_DIR};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Names generation `at` of the cache at `cache` `name` (`generations/tags/NAME`), so that
/// readers open it by that name and `gc` keeps it. An existing tag moves only with `force`.
/// Returns the generation's number.
pub fn tag(cache: &Path, name: &str, at: &GenerationRef, force: bool) -> Result<u32> {
    if let Some(problem) = tag_name_problem(name) {
        return Err(OptionError::new("tag", format!("{name:?}: {problem}")).into());
    }
    let _lock = OutputLock::wait(cache, |_| {})?;
    let number = Manifest::read_at(cache, at)?.generation_number();
    let path = cache.join(tag_file_name(name));
    if !force && path.exists() {
        let was = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(OptionError::new(
            "tag",
            format!(
                "{name:?} already names generation {}; give --force to move it",
                was.trim()
            ),
        )
        .into());
    }
    let dir = path.parent().expect("a tag is inside generations/tags");
    std::fs::create_dir_all(dir).map_err(|e| CompileError::io(dir, e))?;
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, format!("{number}\n")).map_err(|e| CompileError::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| CompileError::io(&path, e))?;
    Ok(number)
}

/// What `gc` keeps: the last `last` generations, the tagged ones, those committed at or after
/// `since`. Generation 1 always stays: its `manifest.json` is what makes the folder a cache.
#[derive(Debug, Clone, Default)]
pub struct Keep {
    /// The last this many generations (at least 1: the last one is always kept).
    pub last: u32,
    /// Generations committed at or after this time.
    pub since: Option<SystemTime>,
}

/// What `gc` removed, or would remove with `dry_run`.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    /// The generations kept.
    pub kept: Vec<u32>,
    /// The generations whose manifests were removed.
    pub removed: Vec<u32>,
    /// Files and folders removed (relative to the cache): shards no kept generation lists,
    /// what killed appends left.
    pub files: Vec<String>,
    /// Bytes they held.
    pub bytes: u64,
}

/// Removes from the cache at `cache` the generations `keep` does not keep, and every file
/// under `generations/` that no kept generation lists (the shards only they held, what killed
/// appends left). A reader that has a removed generation open keeps reading it (its files are
/// unlinked, not changed); a new reader cannot open it. With `dry_run`, only says.
pub fn gc(cache: &Path, keep: &Keep, dry_run: bool) -> Result<GcReport> {
    let _lock = OutputLock::wait(cache, |_| {})?;
    let lineage = Manifest::lineage(cache, &mut LocalFiles(cache))?;
    let last = lineage.last().map_or(1, Manifest::generation_number);
    let tagged = tagged(cache)?;
    let committed = |n: u32| {
        let name = match n {
            1 => dsc_format::MANIFEST_FILE.to_string(),
            n => generation_manifest_name(n),
        };
        std::fs::metadata(cache.join(name))
            .and_then(|m| m.modified())
            .ok()
    };
    let kept: Vec<&Manifest> = lineage
        .iter()
        .filter(|m| {
            let n = m.generation_number();
            n == 1
                || n + keep.last.max(1) > last
                || tagged.contains(&n)
                || keep
                    .since
                    .is_some_and(|t| committed(n).is_some_and(|c| c >= t))
        })
        .collect();
    let listed: BTreeSet<String> = kept
        .iter()
        .flat_map(|m| m.shards())
        .flat_map(|s| std::iter::once(s.file.clone()).chain(s.keys.iter().map(|k| k.file.clone())))
        .collect();
    let kept_numbers: BTreeSet<u32> = kept.iter().map(|m| m.generation_number()).collect();
    let kept_folders: BTreeSet<&str> = kept
        .iter()
        .filter_map(|m| m.generation().map(|g| g.folder.as_str()))
        .collect();
    let mut report = GcReport {
        kept: kept_numbers.iter().copied().collect(),
        removed: Vec::new(),
        files: Vec::new(),
        bytes: 0,
    };
    let mut doomed: Vec<PathBuf> = Vec::new();
    for m in &lineage {
        let n = m.generation_number();
        if !kept_numbers.contains(&n) {
            report.removed.push(n);
            doomed.push(cache.join(generation_manifest_name(n)));
        }
    }
    // Under generations/: a shard stays while a kept generation lists it (an append's shards
    // are listed by every generation after it), a generation's other files while it is kept;
    // anything else there (what killed appends left) is garbage.
    let root = cache.join(GENERATIONS_DIR);
    let mut emptied: Vec<PathBuf> = Vec::new();
    for entry in read_dir(&root)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == "tags" || (name.ends_with(".json") && !name.starts_with('.')) {
            continue;
        }
        let folder = format!("{GENERATIONS_DIR}/{name}");
        let numbered = dsc_format::manifest::generation_of(&name)
            .is_some_and(|n| dsc_format::manifest::is_generation_folder(&folder, n));
        if !numbered || !path.is_dir() {
            doomed.push(path);
            continue;
        }
        // A kept generation's own folder keeps its statistics too.
        let own = kept_folders.contains(folder.as_str());
        let files = walk(&path)?;
        let mut left = files.len();
        for f in files {
            let rel = f
                .strip_prefix(cache)
                .expect("inside the cache")
                .to_string_lossy()
                .into_owned();
            let is_shard = rel.contains(&format!("/{}/", dsc_format::SHARDS_DIR));
            let needed = match is_shard {
                true => listed.contains(&rel),
                false => own,
            };
            if !needed {
                doomed.push(f);
                left -= 1;
            }
        }
        if left == 0 {
            emptied.push(path);
        }
    }
    for path in doomed {
        let rel = path
            .strip_prefix(cache)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        report.bytes += size(&path);
        report.files.push(rel);
        if !dry_run {
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(|e| CompileError::io(&path, e))?;
        }
    }
    if !dry_run {
        for dir in emptied {
            std::fs::remove_dir_all(&dir).map_err(|e| CompileError::io(&dir, e))?;
        }
    }
    Ok(report)
}

/// The generations tags name.
fn tagged(cache: &Path) -> Result<BTreeSet<u32>> {
    let dir = cache.join(GENERATIONS_DIR).join("tags");
    let mut out = BTreeSet::new();
    for entry in read_dir(&dir)? {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if let Ok(n) = text.trim().parse() {
            out.insert(n);
        }
    }
    Ok(out)
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(CompileError::io(dir, e)),
    }
}

/// Every file under `dir`.
pub(crate) fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in read_dir(dir)? {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

/// Bytes of a file, or of every file under a folder.
fn size(path: &Path) -> u64 {
    if path.is_dir() {
        walk(path).unwrap_or_default().iter().map(|f| size(f)).sum()
    } else {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }
}
