//! Compressed (zstd) caches: the same batches as the hot cache in every order, conversions that
//! round-trip byte for byte and leave nothing wrong behind, damage named.

use crate::util::*;
use dsc_loader::{Batches, Cache, LoaderOptions, OrderSpec};
use std::path::Path;

fn batches(cache: &Path, o: LoaderOptions) -> Vec<Copied> {
    epoch_of(&Cache::open(cache).unwrap(), o)
}

#[test]
fn a_compressed_cache_yields_the_hot_caches_batches() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let m = manifest(&cold);
    let shards = m["shards"].as_array().unwrap();
    let train = shards.iter().filter(|s| s["split"] == "train").count();
    assert!(
        train > 16,
        "more shards ({train}) than stay decompressed (16)"
    );
    assert!(shards.iter().all(
        |s| s["file"].as_str().unwrap().ends_with(".safetensors.zst")
            && s["compressed"]["codec"] == "zstd"
    ));
    let base = LoaderOptions {
        order: OrderSpec {
            window: 64,
            interleave: 3,
            ..Default::default()
        },
        batch_size: 8,
        ..Default::default()
    };
    for o in [
        base.clone(),
        LoaderOptions {
            order: OrderSpec {
                shuffle: false,
                drop_last: false,
                ..base.clone().order
            },
            ..base.clone()
        },
        LoaderOptions {
            order: OrderSpec {
                batches: Batches::Bucketed,
                ..base.clone().order
            },
            epoch: 2,
            ..base.clone()
        },
        LoaderOptions {
            threads: 3,
            prefetch: 1,
            rank: 1,
            world_size: 2,
            ..base.clone()
        },
        LoaderOptions {
            order: OrderSpec {
                split: "val".into(),
                ..base.clone().order
            },
            trim: Some(1),
            ..base.clone()
        },
    ] {
        let want = batches(&hot, o.clone());
        assert!(!want.is_empty());
        assert_eq!(batches(&cold, o.clone()), want, "{o:?}");
    }
    // Resume mid-epoch on the compressed cache continues the hot cache's order.
    let cache = Cache::open(&cold).unwrap();
    let mut first = cache.loader(base.clone()).unwrap();
    for _ in 0..7 {
        first.next().unwrap().unwrap();
    }
    let state = first.state();
    let rest: Vec<Vec<i64>> = cache
        .loader_from_state(base.clone(), &state)
        .unwrap()
        .map(|b| b.unwrap().keys())
        .collect();
    let all: Vec<Vec<i64>> = batches(&hot, base.clone())
        .into_iter()
        .map(|(_, t)| {
            let key = &t.iter().find(|(n, _)| n == "key").unwrap().1;
            key.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(rest, all[7..]);
    // Caller buffers (the pinned path) get the same bytes too.
    let mut loader = cache
        .loader(LoaderOptions {
            threads: 0,
            ..base.clone()
        })
        .unwrap();
    let mut bufs: Vec<Vec<u8>> = loader.batch_bytes().iter().map(|&n| vec![0; n]).collect();
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    loader.next_into(&mut slices).unwrap().unwrap();
    assert_eq!(bufs[0], batches(&hot, base)[0].1[0].1);
    // The text tools read it as they read the hot cache.
    for args in [
        &["show", "CACHE", "--index", "5", "--json"][..],
        &["show", "CACHE", "--key", "KEY", "--split", "val"][..],
        &["order", "CACHE", "--batch-size", "16", "--bucket", "--json"][..],
        &["inspect", "CACHE", "--json"][..],
    ] {
        let key = Cache::open(&hot)
            .unwrap()
            .loader(LoaderOptions {
                order: OrderSpec {
                    split: "val".into(),
                    shuffle: false,
                    ..Default::default()
                },
                batch_size: 1,
                ..Default::default()
            })
            .unwrap()
            .nth(3)
            .unwrap()
            .unwrap()
            .keys()[0]
            .to_string();
        let run = |c: &str| {
            let args: Vec<&str> = args
                .iter()
                .map(|a| match *a {
                    "CACHE" => c,
                    "KEY" => key.as_str(),
                    a => a,
                })
                .collect();
            dsc(dir.path(), &args).ok()
        };
        let (h, c) = (run("hot"), run("cold"));
        if args[0] == "inspect" {
            // The same report, but for where it was read from, when, and how it is stored.
            let strip = |s: &str| {
                let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
                let o = v.as_object_mut().unwrap();
                for k in ["cache", "compiled_at", "compression", "stored_bytes"] {
                    o.remove(k);
                }
                v
            };
            assert_eq!(strip(&h), strip(&c));
            let v: serde_json::Value = serde_json::from_str(&c).unwrap();
            assert_eq!(v["compression"], "zstd");
            assert!(v["stored_bytes"].as_u64().unwrap() * 2 < v["bytes"].as_u64().unwrap());
        } else {
            assert_eq!(h, c, "{args:?}");
        }
    }
    dsc(dir.path(), &["verify", "cold"]).ok();
    dsc(dir.path(), &["verify", "cold", "--quick"]).ok();
}

#[test]
fn compress_and_decompress_round_trip_byte_for_byte() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let original = tree(&hot);
    let out = dsc(dir.path(), &["compress", "hot", "--json"]).ok();
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["bytes_after"].as_u64().unwrap() * 2 < r["bytes_before"].as_u64().unwrap());
    assert_eq!(r["shards_converted"], r["shards"]);
    // The compile's own compression and `dsc compress` give the same files.
    assert_eq!(tree(&hot), tree(&cold));
    // Compressing again at the same level changes nothing.
    let compress = |level: &str| -> serde_json::Value {
        let out = dsc(dir.path(), &["compress", "hot", "--level", level, "--json"]).ok();
        serde_json::from_str(&out).unwrap()
    };
    assert_eq!(compress("3")["shards_converted"], 0);
    // Another level rewrites every shard (the manifest records each shard's level), smaller
    // at a higher level; its loader yields the same batches, and going back to level 3 gives
    // the compile's files again.
    let at_12 = compress("12");
    assert_eq!(at_12["shards_converted"], at_12["shards"]);
    assert!(at_12["bytes_after"].as_u64() < at_12["bytes_before"].as_u64());
    assert!(manifest(&hot)["shards"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["compressed"]["level"] == 12));
    let plain = LoaderOptions {
        batch_size: 8,
        ..Default::default()
    };
    assert_eq!(batches(&hot, plain.clone()), batches(&cold, plain));
    assert_eq!(compress("12")["shards_converted"], 0);
    compress("3");
    assert_eq!(tree(&hot), tree(&cold));
    // Decompressing gives the compiled cache back.
    dsc(dir.path(), &["decompress", "hot"]).ok();
    assert_eq!(tree(&hot), original);
    // Nothing is left beside the cache but its lock file.
    let beside: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(beside.iter().all(|n| n.ends_with("dsc-lock")), "{beside:?}");
}

/// Flips one byte in the middle of a file.
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn damaged_shards_are_named_and_conversions_leave_the_cache_as_it_was() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let shard = |c: &Path, k: usize| c.join(manifest(c)["shards"][k]["file"].as_str().unwrap());
    // A damaged compressed shard: verify names it; the loader's batch that needs it fails
    // naming it (no panic, no wrong bytes); decompress refuses and changes nothing.
    let bad = shard(&cold, 2);
    damage(&bad);
    let name = bad.file_name().unwrap().to_string_lossy().into_owned();
    let err = dsc(dir.path(), &["verify", "cold"]).fails(1);
    assert!(err.contains(&name) && err.contains("checksum"), "{err}");
    let cache = Cache::open(&cold).unwrap();
    let errors: Vec<String> = cache
        .loader(LoaderOptions {
            order: OrderSpec {
                shuffle: false,
                ..Default::default()
            },
            batch_size: 4,
            ..Default::default()
        })
        .unwrap()
        .filter_map(|b| b.err().map(|e| e.to_string()))
        .collect();
    assert!(
        !errors.is_empty() && errors.iter().all(|e| e.contains(&name)),
        "{errors:?}"
    );
    let before = tree(&cold);
    let err = dsc(dir.path(), &["decompress", "cold"]).fails(2);
    assert!(err.contains(&name), "{err}");
    assert_eq!(tree(&cold), before, "a failed conversion changes nothing");
    // A compressed shard cut short is refused when the cache is opened.
    let short = shard(&cold, 0);
    let bytes = std::fs::read(&short).unwrap();
    std::fs::write(&short, &bytes[..bytes.len() - 10]).unwrap();
    let err = Cache::open(&cold).unwrap_err().to_string();
    assert!(err.contains("size"), "{err}");
    // A damaged hot shard is not compressed under a fresh checksum.
    let bad = shard(&hot, 1);
    damage(&bad);
    let before = tree(&hot);
    let err = dsc(dir.path(), &["compress", "hot"]).fails(2);
    assert!(
        err.contains(bad.file_name().unwrap().to_str().unwrap()) && err.contains("checksum"),
        "{err}"
    );
    assert_eq!(tree(&hot), before);
}

#[test]
fn a_bad_level_or_codec_is_refused_before_anything_is_written() {
    let dir = Dir::new();
    gen_icecube(&dir, 1, 50);
    let err = dsc(
        dir.path(),
        &icecube_args("c", &["--compress", "zstd", "--compress-level", "99"]),
    )
    .fails(2);
    assert!(
        err.contains("--compress-level 99: use 1 (fastest) to 22"),
        "{err}"
    );
    let err = dsc(
        dir.path(),
        &icecube_args("c", &["--compress", "zstd", "--compress-level", "0"]),
    )
    .fails(2);
    assert!(err.contains("use 1 (fastest)"), "{err}");
    assert!(!dir.join("c").exists());
    let err = dsc(dir.path(), &icecube_args("c", &["--compress", "lz4"])).fails(2);
    assert!(err.contains("zstd"), "{err}");
}
