//! `dsc compress` and `dsc decompress`: a cache's shards stored for cold storage, or hot.

use crate::args::{CompressArgs, DecompressArgs};
use crate::output::{bold, bytes, outln};
use dsc_compiler::{restore, Storage, StorageReport, TerminalBars};
use std::path::Path;

pub fn compress(a: CompressArgs) -> anyhow::Result<u8> {
    let storage = Storage::Zstd { level: a.level };
    run(&a.cache, storage, a.json, a.quiet, "compressed")
}

pub fn decompress(a: DecompressArgs) -> anyhow::Result<u8> {
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
