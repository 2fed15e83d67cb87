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
    let (_, hash) = dsc_format::checksum::hash_file(&path).unwrap();
    let mpath = dir.join("cache/manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    m["shards"][0]["xxh3"] = hash.into();
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
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
