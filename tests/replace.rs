//! A cache replaced (`dsc compile --force`) while readers open it: every reader sees one
//! version whole, or an error; never the shards of two.

use crate::util::*;
use dsc_loader::{Cache, LoaderOptions, OrderSpec};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Every context of the train split read in cache order: key -> the bytes of all its tensors.
fn contexts(cache: &Cache) -> Result<BTreeMap<i64, Vec<u8>>, String> {
    let opts = LoaderOptions {
        order: OrderSpec {
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 64,
        threads: 0,
        ..Default::default()
    };
    let mut out = BTreeMap::new();
    let mut seen = 0usize;
    for batch in cache.loader(opts).map_err(|e| e.to_string())? {
        let batch = batch.map_err(|e| e.to_string())?;
        let valid = batch
            .size
            .min(cache.manifest().split("train").unwrap().contexts - seen);
        for (i, key) in batch.keys().into_iter().take(valid).enumerate() {
            let mut row = Vec::new();
            for t in batch.tensors() {
                let n = t.bytes().len() / t.shape()[0];
                row.extend_from_slice(&t.bytes()[i * n..(i + 1) * n]);
            }
            if out.insert(key, row).is_some() {
                return Err(format!("key {key} twice in one epoch"));
            }
        }
        seen += valid;
    }
    Ok(out)
}

fn compile(dir: &Path, out: &str, seed: &str, force: bool) {
    let mut args: Vec<&str> = icecube_args(out, &["--shard-size", "24KiB", "--quiet"])
        .into_iter()
        .map(|a| if a == "42" { seed } else { a })
        .collect();
    if force {
        args.push("--force");
    }
    dsc(dir, &args).ok();
}

#[test]
fn a_reader_sees_one_cache_whole_while_it_is_replaced() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 200);
    // The same inputs under two seeds: the same contexts in shards of the same sizes and
    // headers, placed differently. Shards of the two mixed would pass every size and header
    // check; the epoch would then hold some contexts twice and miss others.
    compile(dir.path(), "a", "1", false);
    compile(dir.path(), "b", "2", false);
    let (a, b) = (manifest(&dir.join("a")), manifest(&dir.join("b")));
    let sizes = |m: &serde_json::Value| -> Vec<u64> {
        m["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["bytes"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        sizes(&a),
        sizes(&b),
        "the dangerous case: equal shard sizes"
    );
    assert!(sizes(&a).len() > 4, "several shards");
    let want = contexts(&Cache::open(dir.join("a")).unwrap()).unwrap();
    assert_eq!(
        want,
        contexts(&Cache::open(dir.join("b")).unwrap()).unwrap()
    );
    compile(dir.path(), "cache", "1", false);

    let (opens, refused, wrong) = open_while(&dir, &want, || {
        for round in 0..16 {
            let seed = if round % 2 == 0 { "2" } else { "1" };
            compile(dir.path(), "cache", seed, true);
        }
    });
    assert!(opens > 20, "{opens} opens");
    assert!(
        wrong.is_empty(),
        "{} of {opens} opens read a mixed cache: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
    // An error is allowed by the promise, but a replace should rarely cost one.
    assert!(
        refused.len() * 10 <= opens,
        "{} of {opens} opens refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );
}

#[test]
fn a_reader_opens_a_cache_being_compressed_and_decompressed() {
    // Issue 27: a loader opened during `dsc compress` failed with a bare "No such file or
    // directory".
    let dir = Dir::new();
    gen_icecube(&dir, 2, 150);
    compile(dir.path(), "cache", "1", false);
    let want = contexts(&Cache::open(dir.join("cache")).unwrap()).unwrap();
    let (opens, refused, wrong) = open_while(&dir, &want, || {
        for round in 0..8 {
            let verb = if round % 2 == 0 {
                "compress"
            } else {
                "decompress"
            };
            dsc(dir.path(), &[verb, "cache", "-q"]).ok();
        }
    });
    let failed: Vec<String> = refused.into_iter().chain(wrong).collect();
    assert!(opens > 10, "{opens} opens");
    assert!(
        failed.is_empty(),
        "{} of {opens} opens failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// Opens `dir/cache` and reads its train split again and again while `work` (in another thread)
/// changes it, until `work` ends; returns the opens, the errors, and the reads that were not
/// `want`.
fn open_while(
    dir: &Dir,
    want: &BTreeMap<i64, Vec<u8>>,
    work: impl FnOnce() + Send,
) -> (usize, Vec<String>, Vec<String>) {
    let stop = AtomicBool::new(false);
    let (mut opens, mut refused, mut wrong) = (0usize, Vec::new(), Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            work();
            stop.store(true, Ordering::Relaxed);
        });
        while !stop.load(Ordering::Relaxed) {
            opens += 1;
            match Cache::open(dir.join("cache")) {
                Err(e) => refused.push(e.to_string()),
                Ok(cache) => match contexts(&cache) {
                    Ok(got) if got == *want => {}
                    Ok(got) => {
                        wrong.push(format!("{} contexts, not the {}", got.len(), want.len()))
                    }
                    Err(e) => wrong.push(e),
                },
            }
        }
    });
    (opens, refused, wrong)
}
