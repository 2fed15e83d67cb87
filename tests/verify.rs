//! `dsc verify` and `dsc inspect` on good and damaged caches.

use crate::util::*;
use std::io::{Seek, SeekFrom, Write};

fn first_shard(dir: &Dir) -> std::path::PathBuf {
    dir.join("cache/shards/train-00000.safetensors")
}

#[test]
fn a_fresh_cache_verifies() {
    let dir = small_icecube_cache();
    let out = dsc(dir.path(), &["verify", "cache"]).ok();
    assert!(out.starts_with("ok:"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["verify", "cache", "--quick", "--json"]).ok())
            .unwrap();
    assert_eq!(json["ok"], true);
}

#[test]
fn a_flipped_byte_fails_the_checksum() {
    let dir = small_icecube_cache();
    let path = first_shard(&dir);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let err = dsc(dir.path(), &["verify", "cache"]).fails(1);
    assert!(
        err.contains("train-00000.safetensors: checksum mismatch"),
        "{err}"
    );
    // --quick reads headers only and cannot see it.
    dsc(dir.path(), &["verify", "cache", "--quick"]).ok();
}

#[test]
fn a_truncated_shard_is_named() {
    let dir = small_icecube_cache();
    let path = first_shard(&dir);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 10).unwrap();
    let err = dsc(dir.path(), &["verify", "cache", "--quick"]).fails(1);
    assert!(
        err.contains(&format!(
            "train-00000.safetensors: size is {} bytes, the manifest says {len}",
            len - 10
        )),
        "{err}"
    );
}

#[test]
fn a_missing_shard_is_named() {
    let dir = small_icecube_cache();
    std::fs::remove_file(first_shard(&dir)).unwrap();
    let err = dsc(dir.path(), &["verify", "cache"]).fails(1);
    assert!(
        err.contains("train-00000.safetensors") && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn an_edited_manifest_is_caught() {
    let dir = small_icecube_cache();
    let path = dir.join("cache/manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = m["shards"][0]["contexts"].as_u64().unwrap();
    m["shards"][0]["contexts"] = (n + 1).into();
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    let err = dsc(dir.path(), &["verify", "cache"]).fails(2);
    assert!(
        err.contains("manifest.json: invalid manifest") && err.contains("context"),
        "{err}"
    );
}

#[test]
fn nonzero_padding_is_caught_even_with_a_matching_checksum() {
    let dir = small_icecube_cache();
    // Write a 1 into the last byte of x (always padding: some context is shorter than L), then
    // repair the checksum in the manifest so that only the value check can notice.
    let path = first_shard(&dir);
    let layout = dsc_format::shard::read_layout(&path).unwrap();
    let x = layout.tensor("x").unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(x.end - 1)).unwrap();
    f.write_all(&[1]).unwrap();
    drop(f);
    repair_checksum(&dir);
    let err = dsc(dir.path(), &["verify", "cache"]).fails(1);
    assert!(
        err.contains("tensor x") && err.contains("padding is not zero"),
        "{err}"
    );
}

#[test]
fn inspect_shows_splits_tensors_and_stats() {
    let dir = small_icecube_cache();
    let out = dsc(dir.path(), &["inspect", "cache"]).ok();
    for needle in [
        "splits train",
        "padding efficiency",
        "x ",
        "[n, 128, 6]",
        "charge (log1p)",
        "sequence lengths",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    assert!(
        out.lines().all(|l| l.chars().count() <= 100),
        "fits 100 columns:\n{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&dsc(dir.path(), &["inspect", "cache", "--json"]).ok()).unwrap();
    let m = manifest(&dir.join("cache"));
    assert_eq!(json["contexts"], m["summary"]["contexts"]);
    assert_eq!(
        json["shards"].as_u64().unwrap() as usize,
        m["shards"].as_array().unwrap().len()
    );
    let eff = json["padding_efficiency"].as_f64().unwrap();
    assert!(eff > 0.0 && eff < 1.0, "{eff}");
    let names: Vec<&str> = json["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "x",
            "y",
            "z",
            "time",
            "charge",
            "auxiliary",
            "sensor_id",
            "azimuth",
            "zenith"
        ]
    );
}

#[test]
fn a_directory_without_manifest_is_not_a_cache() {
    let dir = Dir::new();
    std::fs::create_dir_all(dir.join("half/shards")).unwrap();
    let err = dsc(dir.path(), &["inspect", "half"]).fails(2);
    assert!(err.contains("not a dsc cache (no manifest.json"), "{err}");
}

/// Writes the first shard's current checksum into the manifest, as a forger would.
fn repair_checksum(dir: &Dir) {
    let path = first_shard(dir);
    let (_, hash) = dsc_format::checksum::hash_file(&path).unwrap();
    let mpath = dir.join("cache/manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    m["shards"][0]["xxh3"] = hash.into();
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
}

/// Overwrites bytes of `tensor` in the first shard at element `elem` (of its flattened data)
/// and repairs the shard's checksum in the manifest, so that only the value checks can notice:
/// content no compile could have written, with every checksum right.
fn forge(dir: &Dir, tensor: &str, elem: usize, bytes: &[u8]) {
    let path = first_shard(dir);
    let layout = dsc_format::shard::read_layout(&path).unwrap();
    let t = layout.tensor(tensor).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(t.start + (elem * bytes.len()) as u64))
        .unwrap();
    f.write_all(bytes).unwrap();
    drop(f);
    repair_checksum(dir);
}

/// `dsc verify` (full) fails with exit 1 naming each needle; `--quick` stays cheap and passes.
fn verify_finds(dir: &Dir, needles: &[&str]) {
    let err = dsc(dir.path(), &["verify", "cache"]).fails(1);
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
    dsc(dir.path(), &["verify", "cache", "--quick"]).ok();
}

#[test]
fn impossible_content_with_right_checksums_is_caught() {
    // A category code past the vocabulary: an embedding lookup would crash or read garbage.
    let dir = small_icecube_cache();
    forge(&dir, "sensor_id", 0, &1_000_000i32.to_le_bytes());
    verify_finds(
        &dir,
        &[
            "train-00000",
            "tensor sensor_id, sample 0",
            "code 1000000",
            "outside the vocabulary",
        ],
    );
    // NaN where no NaN policy stores one.
    let dir = small_icecube_cache();
    forge(&dir, "x", 0, &f32::NAN.to_le_bytes());
    verify_finds(&dir, &["tensor x, sample 0", "NaN in column \"x\""]);
    // A bool that is neither 0 nor 1 (auxiliary is the sixth feature).
    let dir = small_icecube_cache();
    forge(&dir, "x", 5, &0.5f32.to_le_bytes());
    verify_finds(
        &dir,
        &["tensor x, sample 0", "0.5 in bool column \"auxiliary\""],
    );
    // A negative length.
    let dir = small_icecube_cache();
    forge(&dir, "length", 3, &(-1i32).to_le_bytes());
    verify_finds(&dir, &["tensor length, sample 3", "length -1 is outside"]);
    // A stored length above the sequence's full length.
    let dir = small_icecube_cache();
    forge(&dir, "full_length", 2, &0i32.to_le_bytes());
    verify_finds(
        &dir,
        &["tensor full_length, sample 2", "below the stored length"],
    );
    // One key stored twice.
    let dir = small_icecube_cache();
    let layout = dsc_format::shard::read_layout(&first_shard(&dir)).unwrap();
    let k = layout.tensor("key").unwrap();
    let bytes = std::fs::read(first_shard(&dir)).unwrap();
    let first_key: [u8; 8] = bytes[k.start as usize..k.start as usize + 8]
        .try_into()
        .unwrap();
    forge(&dir, "key", 1, &first_key);
    verify_finds(
        &dir,
        &["tensor key, sample 1", "is stored twice: also sample 0"],
    );
}

#[test]
fn a_character_after_a_strings_padding_is_caught() {
    // Codes, then zeros to the width: a code after a zero would decode with a character lost.
    let dir = Dir::new();
    dsc(
        dir.path(),
        &["gen", "microbiome", "--out", "microbes", "--records", "20"],
    )
    .ok();
    dsc(
        dir.path(),
        &[
            "compile",
            "microbes/asvs.parquet",
            "--key",
            "sample_id",
            "--encode",
            "asv=chars:160",
            "--out",
            "cache",
            "--quiet",
        ],
    )
    .ok();
    // Each 150-base ASV is padded to 160 within its step, and the next step's codes follow:
    // the padding is each row's own, not the sample's.
    dsc(dir.path(), &["verify", "cache"]).ok();
    forge(&dir, "asv", 1, &0i32.to_le_bytes());
    verify_finds(
        &dir,
        &[
            "tensor asv, sample 0",
            "at value 2 follows the string's padding",
        ],
    );
}

#[test]
fn statistics_that_do_not_describe_the_cache_are_caught() {
    let dir = small_icecube_cache();
    let spath = dir.join("cache/stats.json");
    let mut stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spath).unwrap()).unwrap();
    let splits = stats["splits"].as_array_mut().unwrap();
    splits.retain(|s| s["split"] != "val");
    std::fs::write(&spath, serde_json::to_vec(&stats).unwrap()).unwrap();
    // A cheap check: --quick makes it too.
    for quick in [
        &["verify", "cache"][..],
        &["verify", "cache", "--quick"][..],
    ] {
        let err = dsc(dir.path(), quick).fails(1);
        assert!(
            err.contains("stats.json") && err.contains("no statistics for split \"val\""),
            "{quick:?}: {err}"
        );
    }
}

#[test]
fn shards_swapped_between_places_are_caught_by_their_headers() {
    // Two shards of equal size trade places: sizes and tensor shapes still match the manifest,
    // so only the header's own `__metadata__` can tell (before, `verify --quick` and the
    // loader accepted the reordered cache).
    let dir = small_icecube_cache();
    let (a, b) = (
        dir.join("cache/shards/train-00000.safetensors"),
        dir.join("cache/shards/train-00001.safetensors"),
    );
    assert_eq!(
        std::fs::metadata(&a).unwrap().len(),
        std::fs::metadata(&b).unwrap().len()
    );
    let tmp = dir.join("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    let err = dsc(dir.path(), &["verify", "cache", "--quick"]).fails(1);
    assert!(err.contains("train-00000.safetensors"), "{err}");
    assert!(
        err.contains(r#"__metadata__ "shard" is "1", the manifest's entry for this file says "0""#),
        "{err}"
    );
    let err = dsc(dir.path(), &["bench", "cache", "--batch-size", "8"]).fails(2);
    assert!(err.contains("__metadata__"), "{err}");
}

/// A cache written by dsc 0.1 before format version 2 (`tests/fixtures/cache-v1`, compiled from
/// `dsc gen icecube --files 2 --events-per-file 20 --seed 3`): version 2 changed how the compiler
/// orders contexts and merges statistics, not what a reader sees, so it still verifies, inspects
/// and loads.
#[test]
fn a_version_1_cache_is_still_read() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let out = dsc(&fixture, &["verify", "cache-v1"]).ok();
    assert!(out.starts_with("ok: 2 shards"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&dsc(&fixture, &["inspect", "cache-v1", "--json"]).ok()).unwrap();
    assert_eq!(json["format_version"], 1, "{json}");
    let bench = dsc(
        &fixture,
        &["bench", "cache-v1", "--batch-size", "4", "--json"],
    )
    .ok();
    let bench: serde_json::Value = serde_json::from_str(&bench).unwrap();
    assert_eq!(bench["contexts"], 32, "{bench}");
}
