//! `dsc compress` and `dsc decompress`: a cache's shards stored for cold storage, or hot.

use crate::args::{CompressArgs, DecompressArgs};
use crate::output::{bold, bytes, outln};
use dsc_compiler::{restore, Storage, StorageReport, TerminalBars};
use std::path::Path;

/// `dsc compress` and `dsc decompress` rewrite a local cache's shards: a URL there is refused by
/// name (it was taken for a folder and failed with "No such file or directory").
fn local_only(cache: &Path, command: &str) -> anyhow::Result<()> {
    let text = cache.to_string_lossy();
    if dsc_store::is_remote(&text) {
        anyhow::bail!(
            "{text}: a URL; dsc {command} rewrites the shards of a local cache. {command} a \
             local copy (dsc compress CACHE --out URL uploads one compressed)"
        );
    }
    Ok(())
}

pub fn compress(a: CompressArgs) -> anyhow::Result<u8> {
    local_only(&a.cache, "compress")?;
    let storage = Storage::Zstd { level: a.level };
    let Some(out) = &a.out else {
        return run(&a.cache, storage, a.json, a.quiet, "compressed");
    };
    let Some(upload) = crate::upload::to(out, a.force, &a.remote)? else {
        anyhow::bail!(
            "--out {}: not a URL in object storage (s3://, gs://, az://); to compress a local \
             cache, dsc compress it in place",
            out.display()
        );
    };
    let bars = TerminalBars::new(a.quiet || a.json).with_interrupt(dsc_compiler::stop_on_signals());
    let r = dsc_compiler::export(&a.cache, &upload.local(), storage, &bars)?;
    let sent = crate::upload::send(&upload, &bars)?;
    if a.json {
        #[derive(serde::Serialize)]
        struct Uploaded<'a> {
            #[serde(flatten)]
            report: &'a StorageReport,
            url: &'a str,
            files_uploaded: usize,
            bytes_uploaded: u64,
            objects_removed: usize,
        }
        crate::output::print_json(&Uploaded {
            report: &r,
            url: upload.url(),
            files_uploaded: sent.files,
            bytes_uploaded: sent.bytes,
            objects_removed: sent.removed,
        })?;
        return Ok(0);
    }
    outln!(
        "{} {} to {}: {} files, {} uploaded ({:.3} of hot)",
        bold("compressed"),
        a.cache.display(),
        upload.url(),
        sent.files,
        bytes(sent.bytes),
        r.bytes_after as f64 / r.bytes_hot.max(1) as f64
    );
    Ok(0)
}

pub fn decompress(a: DecompressArgs) -> anyhow::Result<u8> {
    local_only(&a.cache, "decompress")?;
    run(&a.cache, Storage::Hot, a.json, a.quiet, "decompressed")
}

fn run(cache: &Path, storage: Storage, json: bool, quiet: bool, done: &str) -> anyhow::Result<u8> {
    // Ctrl-C, SIGTERM: the compile stops, removes its staging folder and says so.
    let bars = TerminalBars::new(quiet || json).with_interrupt(dsc_compiler::stop_on_signals());
    let r: StorageReport = restore(cache, storage, &bars)?;
    if json {
        crate::output::print_json(&r)?;
        return Ok(0);
    }
    let ratio = |b: u64| b as f64 / r.bytes_hot.max(1) as f64;
    outln!(
        "{} {}: {} of {} shards in {:.2} s ({:.0} MB/s of safetensors bytes)",
        bold(done),
        cache.display(),
        r.shards_converted,
        r.shards,
        r.seconds,
        r.bytes_hot as f64 / 1e6 / r.seconds.max(1e-9)
    );
    outln!(
        "shards: {} before ({:.3} of hot), {} now ({:.3} of hot)",
        bytes(r.bytes_before),
        ratio(r.bytes_before),
        bytes(r.bytes_after),
        ratio(r.bytes_after)
    );
    Ok(0)
}
