//! `dsc verify`: check a cache; exit 1 naming every problem.

use crate::args::VerifyArgs;
use crate::output::outln;
use dsc_format::verify::{verify, verify_parts, Depth};
use serde::Serialize;

#[derive(Serialize)]
struct Report {
    cache: std::path::PathBuf,
    ok: bool,
    depth: &'static str,
    shards_checked: usize,
    bytes_read: u64,
    problems: Vec<String>,
}

pub fn run(a: VerifyArgs) -> anyhow::Result<u8> {
    let depth = if a.quick { Depth::Quick } else { Depth::Full };
    let report = if dsc_loader::is_remote(&a.cache.to_string_lossy()) {
        verify_remote(&a, depth)?
    } else {
        verify(&a.cache, &a.at.at(), depth, |_, _| {})?
    };
    let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    let ok = problems.is_empty();
    if a.json {
        crate::output::print_json(&Report {
            cache: a.cache.clone(),
            ok,
            depth: if a.quick { "quick" } else { "full" },
            shards_checked: report.shards_checked,
            bytes_read: report.bytes_read,
            problems: problems.clone(),
        })?;
    } else if ok {
        outln!(
            "ok: {} shards, {} checked{}",
            report.shards_checked,
            crate::output::bytes(report.bytes_read),
            if a.quick {
                " (quick: sizes and headers only)"
            } else {
                ""
            }
        );
    } else {
        for p in &problems {
            eprintln!("dsc: {p}");
        }
        eprintln!(
            "dsc: {} problem(s) in {}",
            problems.len(),
            a.cache.display()
        );
    }
    Ok(if ok { 0 } else { crate::EXIT_PROBLEMS })
}

/// A cache in object storage, checked as a local one: each shard fetched in turn into the
/// local folder (checked against the manifest's size and xxh3 on arrival: a damaged or replaced
/// object is reported as that shard's problem), then read and checked there.
fn verify_remote(a: &VerifyArgs, depth: Depth) -> anyhow::Result<dsc_format::verify::Report> {
    let url = a.cache.to_string_lossy();
    let opts = a.remote.options_at(&a.at)?;
    let (manifest, mut files) = dsc_loader::fetch_shards(&url, &opts)?;
    let stats_file = manifest.stats_file();
    let stats = dsc_store::Remote::open_with(&url, &opts.store)
        .and_then(|r| r.get(&stats_file))
        .map_err(|e| fetch_problem(&a.cache.join(&stats_file), e.into()))
        .and_then(|bytes| dsc_format::Stats::from_json(&bytes, &a.cache.join(&stats_file)));
    let store = dsc_store::Remote::open_with(&url, &opts.store)?;
    let tables: std::collections::HashSet<&str> = manifest
        .shards()
        .iter()
        .filter_map(|s| s.keys.as_ref().map(|k| k.file.as_str()))
        .collect();
    // The fetched copy of a shard is held until the next shard is asked for; a shard's key
    // table, asked for after it, is read whole into a file of its own beside the fetch folder
    // (removed when the next one is asked for) and checked there.
    let mut held = None;
    let mut table: Option<KeyTableCopy> = None;
    // A signal stops the whole check (not a problem of each shard left): what it was fetching.
    let mut stopped: Option<(String, i32)> = None;
    let mut stop = |e: dsc_loader::LoadError| {
        if let dsc_loader::LoadError::Store(dsc_store::StoreError::Stopped { url, signal }) = &e {
            stopped.get_or_insert((url.clone(), *signal));
        }
        e
    };
    let report = verify_parts(
        &a.cache,
        &manifest,
        stats,
        depth,
        |entry| {
            let object = a.cache.join(&entry.file);
            if tables.contains(entry.file.as_str()) {
                table = None;
                let copy = KeyTableCopy::fetch(&store, entry, &opts.dir)
                    .map_err(|e| fetch_problem(&object, stop(e)))?;
                let path = copy.0.clone();
                table = Some(copy);
                return Ok(path);
            }
            held = None;
            match files.next() {
                Some(Ok(file)) => {
                    let path = file.path.clone();
                    held = Some(file);
                    Ok(path)
                }
                Some(Err(e)) => Err(fetch_problem(&object, stop(e))),
                None => Err(dsc_format::FormatError::io(
                    &object,
                    std::io::Error::other("the fetch ended before this shard"),
                )),
            }
        },
        |_, _| {},
    );
    match stopped {
        Some((url, signal)) => Err(dsc_store::StoreError::Stopped { url, signal }.into()),
        None => Ok(report),
    }
}

/// A key table of a cache in object storage, read into a local file for `dsc verify` (whose
/// checks read files) and removed when dropped.
struct KeyTableCopy(std::path::PathBuf);

impl KeyTableCopy {
    /// The key table `entry` describes (its file, size and xxh3), fetched by the store's
    /// checked download (a damaged object is refused on arrival, named by its URL).
    fn fetch(
        store: &dsc_store::Remote,
        entry: &dsc_format::ShardEntry,
        folder: &std::path::Path,
    ) -> Result<KeyTableCopy, dsc_loader::LoadError> {
        std::fs::create_dir_all(folder).map_err(|e| dsc_format::FormatError::io(folder, e))?;
        let path = folder.join(format!(".verify-{}.keys.safetensors", std::process::id()));
        let expected = dsc_store::Expected {
            bytes: entry.bytes,
            xxh3: &entry.xxh3,
        };
        store.download(&entry.file, &path, expected)?;
        Ok(KeyTableCopy(path))
    }
}

impl Drop for KeyTableCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A shard (or `stats.json`) that could not be fetched, as the problem `dsc verify` reports
/// for it: a checksum that differs as such, anything else as a failed read of the object.
fn fetch_problem(object: &std::path::Path, e: dsc_loader::LoadError) -> dsc_format::FormatError {
    use dsc_store::StoreError;
    match e {
        dsc_loader::LoadError::Format(f) => f,
        dsc_loader::LoadError::Store(StoreError::Checksum {
            expected, found, ..
        }) => dsc_format::FormatError::Checksum {
            shard: object.into(),
            expected,
            found,
        },
        dsc_loader::LoadError::Store(StoreError::Store { source, .. }) => {
            dsc_format::FormatError::io(object, std::io::Error::other(source))
        }
        other => dsc_format::FormatError::io(object, std::io::Error::other(other.to_string())),
    }
}
