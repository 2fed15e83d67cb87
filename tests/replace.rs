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

/// `dsc` with `args` in `dir` and one more environment variable (a failpoint or a pause).
fn dsc_with(dir: &Path, (key, value): (&str, &str), args: &[&str]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(args)
        .current_dir(dir)
        .env(key, value)
        .output()
        .expect("run dsc");
    assert!(
        out.status.success(),
        "dsc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's compile into `out` under `seed`, replacing what is there.
fn seeded<'a>(out: &'a str, seed: &'a str) -> Vec<&'a str> {
    icecube_args(out, &["--quiet", "--force"])
        .into_iter()
        .map(|a| if a == "42" { seed } else { a })
        .collect()
}

#[test]
fn a_forced_compile_returns_while_a_process_of_its_own_removes_the_replaced_cache() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 150);
    dsc(dir.path(), &seeded("cache", "1")).ok();
    let old = std::fs::read(dir.join("cache/manifest.json")).unwrap();
    // The remover pauses before it removes anything: the compile has returned by then.
    let go = dir.join("go");
    let pause = format!("remove-replaced:{}", go.display());
    dsc_with(dir.path(), ("DSC_PAUSE", &pause), &seeded("cache", "2"));
    let paused = dir.join("go.paused");
    let start = std::time::Instant::now();
    while !paused.exists() {
        assert!(start.elapsed().as_secs() < 60, "the remover never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    dsc(dir.path(), &["verify", "cache"]).ok();
    let new = std::fs::read(dir.join("cache/manifest.json")).unwrap();
    assert!(new != old, "the new cache is in place");
    let left = replaced_left(dir.path(), "cache");
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        std::fs::read(left[0].join("manifest.json")).unwrap() == old,
        "the old cache, whole, under a name of its own"
    );
    let err = dsc(dir.path(), &["verify", left[0].to_str().unwrap()]).fails(2);
    assert!(err.contains("not a cache"), "{err}");

    // A compile into the same output meanwhile neither waits for the remover nor takes its
    // folder from it.
    dsc(dir.path(), &seeded("cache", "1")).ok();
    assert!(std::fs::read(dir.join("cache/manifest.json")).unwrap() == old);
    assert!(left[0].exists(), "the paused remover's folder is its own");

    std::fs::write(&go, b"").unwrap();
    wait_replaced_removed(dir.path(), "cache");
    dsc(dir.path(), &["verify", "cache"]).ok();
}

#[test]
fn a_replaced_cache_whose_remover_died_is_removed_by_the_next_compile() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 150);
    dsc(dir.path(), &seeded("cache", "1")).ok();
    // The remover dies at once, as if killed: its folder stays, whole and no longer locked.
    dsc_with(
        dir.path(),
        ("DSC_FAILPOINT", "remove-replaced"),
        &seeded("cache", "2"),
    );
    let left = replaced_left(dir.path(), "cache");
    assert_eq!(left.len(), 1, "{left:?}");
    let start = std::time::Instant::now();
    loop {
        let folder = std::fs::File::open(&left[0]).unwrap();
        if folder.try_lock().is_ok() {
            break; // its remover is gone
        }
        assert!(start.elapsed().as_secs() < 60, "the remover never ended");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(left[0].join("manifest.json").exists(), "nothing removed");
    // Another output's leftover, whose name begins with this output's, is not this one's.
    let other = dir.join(".cache.v2.1-0.dsc-old");
    std::fs::create_dir_all(&other).unwrap();

    dsc(dir.path(), &seeded("cache", "1")).ok();
    assert!(!left[0].exists(), "removed before the compile started");
    assert!(other.exists());
    wait_replaced_removed(dir.path(), "cache");
    dsc(dir.path(), &["verify", "cache"]).ok();
}
