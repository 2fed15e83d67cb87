//! The two ends of every compile, whichever recipe (dsc's own, the mostlyai profile) and driver
//! (one process, partitions and a merge): what it promises before reading (options, the inputs'
//! stamps), and how it commits (the inputs' checksums and fingerprint, `stats.json`,
//! `manifest.json` last, one rename) and reports.

use crate::error::{CompileError, Result};
use crate::read;
use crate::write::Staging;
use crate::Progress;
use dsc_format::manifest::{InputFile, Inputs};
use dsc_format::{Manifest, ManifestBuilder, Stats};
use rayon::prelude::*;
use std::path::PathBuf;
use std::time::Instant;

/// Where and how to write.
pub struct CompileOptions<'a> {
    /// The cache directory to create.
    pub out: PathBuf,
    /// Replace `out` if it exists and is not empty.
    pub force: bool,
    /// Memory the compile may use (bytes); `None`: half of the machine's. The cache does not
    /// depend on it.
    pub max_memory: Option<u64>,
    /// How the shards are stored: hot, or compressed for cold storage (`--compress`). The
    /// shards' content does not depend on it.
    pub storage: crate::Storage,
    /// Progress receiver.
    pub progress: &'a dyn Progress,
}

impl std::fmt::Debug for CompileOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileOptions")
            .field("out", &self.out)
            .field("force", &self.force)
            .finish_non_exhaustive()
    }
}

/// What a compile produced.
#[derive(Debug)]
pub struct CompileReport {
    /// The cache directory.
    pub out: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its statistics.
    pub stats: Stats,
    /// Bytes of all shards.
    pub cache_bytes: u64,
    /// Seconds spent per stage, in order.
    pub timings: Vec<(String, f64)>,
    /// Thread-seconds spent per phase, summed over the threads that ran it, in the order the
    /// data flows (every phase, zero where it did not run).
    pub phases: Vec<(String, f64)>,
    /// The cache this compile replaced (`force`), under a leftover name: removed when the report
    /// is dropped, unless taken and handed to a remover of its own (the CLI's, which does not
    /// keep the user waiting for it).
    pub replaced: Option<crate::Replaced>,
    /// For an append: its new data against the parameters it was encoded with.
    pub drift: Option<crate::Drift>,
}

/// Wall time per compile stage, for the report.
pub(crate) struct Timer {
    last: Instant,
    pub(crate) timings: Vec<(String, f64)>,
}

impl Timer {
    pub(crate) fn start() -> Timer {
        Timer {
            last: Instant::now(),
            timings: Vec::new(),
        }
    }

    pub(crate) fn lap(&mut self, name: &str) {
        let now = Instant::now();
        self.timings
            .push((name.into(), (now - self.last).as_secs_f64()));
        self.last = now;
    }
}

/// The end of every compile: checks the manifest, writes `stats.json`, then `manifest.json` (the
/// commit point), and moves the staging directory into place.
pub(crate) fn commit_cache(
    staging: Staging,
    manifest: ManifestBuilder,
    stats: Stats,
    mut timer: Timer,
    progress: &dyn Progress,
) -> Result<CompileReport> {
    let manifest = manifest.build().map_err(|problem| {
        CompileError::Internal(format!("the manifest is inconsistent: {problem}"))
    })?;
    let manifest = crate::storage::store_staged(&staging, manifest, staging.storage, progress)?;
    if staging.storage != crate::Storage::Hot {
        timer.lap("compress");
    }
    let mut stats_json = serde_json::to_vec_pretty(&stats).expect("stats serialize");
    stats_json.push(b'\n');
    staging.write_file(dsc_format::STATS_FILE, &stats_json)?;
    staging.write_file(dsc_format::MANIFEST_FILE, &manifest.to_json())?;
    // The last moment a stop request can keep the cache from being committed.
    crate::progress::check(progress)?;
    let (out, replaced) = staging.commit()?;
    timer.lap("commit");
    let cache_bytes = manifest.shards().iter().map(|s| s.stored_bytes()).sum();
    Ok(CompileReport {
        out,
        manifest,
        stats,
        cache_bytes,
        timings: timer.timings,
        phases: Vec::new(),
        drift: None,
        replaced,
    })
}

/// The state of every input before a compile reads it.
pub(crate) fn stamp_files(named: &[(PathBuf, &str)]) -> Result<Vec<read::Stamp>> {
    named.iter().map(|(p, _)| read::Stamp::take(p)).collect()
}

/// Sizes and checksums of every input file, with its role, and one fingerprint over them.
/// `stamps` (from [`stamp_files`] before reading) must still hold after hashing: an input
/// changed mid-compile is an error, not a manifest describing other bytes than the shards hold.
pub(crate) fn fingerprint_files(
    named: &[(PathBuf, &str)],
    stamps: &[read::Stamp],
) -> Result<Inputs> {
    let files = hash_files(named)?;
    for s in stamps {
        s.check()?;
    }
    Ok(Inputs {
        fingerprint: combined_fingerprint(&files),
        files,
    })
}

/// Size and checksum of each file, with its role.
pub(crate) fn hash_files(named: &[(PathBuf, &str)]) -> Result<Vec<InputFile>> {
    named
        .par_iter()
        .map(|(path, role)| {
            let (bytes, xxh3) = if crate::memory::is_memory(path) {
                let table = crate::memory::get(path)?;
                (table.bytes, table.xxh3.clone())
            } else if crate::remote::is_url(path) {
                // An object is not read whole: its version stands for its bytes.
                let (size, version) = crate::remote::head(path)?;
                let id = format!("{size}\0{version}");
                (size, dsc_format::checksum::xxh3_hex(id.as_bytes()))
            } else {
                dsc_format::checksum::hash_file(path)?
            };
            Ok(InputFile {
                path: path.display().to_string(),
                role: (*role).into(),
                bytes,
                xxh3,
            })
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect()
}

/// One fingerprint over every input's role, size and checksum, in order.
pub(crate) fn combined_fingerprint(files: &[InputFile]) -> String {
    let mut h = dsc_format::checksum::Hasher::new();
    for f in files {
        h.update(format!("{}\0{}\0{}\n", f.role, f.bytes, f.xxh3).as_bytes());
    }
    h.hex()
}

/// The paths of `files` used as `role` (`rows`, `context`, `join`), each once, in the order
/// they first come: what a compile of those inputs again reads (a compaction, an append's
/// statistics of what it hides).
pub(crate) fn paths_of(files: &[InputFile], role: &str) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for f in files.iter().filter(|f| f.role == role) {
        if !paths.contains(&f.path) {
            paths.push(f.path.clone());
        }
    }
    paths
}
