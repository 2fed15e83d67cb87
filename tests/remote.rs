//! Caches in object storage, against a real S3 server on localhost (moto): uploaded with the
//! manifest last, read with the local cache's batches in every order, fetched into a bounded
//! folder in the loader's order with each shard fetched once per epoch, checked on arrival.

use crate::util::*;
use dsc_loader::{Cache, LoaderOptions, OrderSpec, RemoteOptions};
use std::path::Path;

/// A batch as its sequence length and its tensors' names and bytes.
type Copied = (usize, Vec<(String, Vec<u8>)>);

fn epoch(cache: &Cache, o: LoaderOptions) -> Vec<Copied> {
    cache
        .loader(o)
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            let tensors = b
                .tensors()
                .iter()
                .map(|t| (t.name().to_string(), t.bytes().to_vec()))
                .collect();
            (b.seq_len, tensors)
        })
        .collect()
}

fn upload(server: &S3Server, local: &Path, url: &str) {
    let remote = dsc_store::Remote::open_with(url, &server.options()).unwrap();
    dsc_store::upload_cache(local, &remote, false, |_, _| {}).unwrap();
}

fn remote_options(server: &S3Server, dir: &Path, limit: Option<u64>) -> RemoteOptions {
    RemoteOptions {
        dir: dir.into(),
        limit,
        fetch_threads: 2,
        store: server.options(),
    }
}

fn stored_bytes(cache: &Path) -> Vec<u64> {
    manifest(cache)["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["compressed"]["bytes"]
                .as_u64()
                .unwrap_or_else(|| s["bytes"].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn a_remote_cache_yields_the_local_caches_batches_fetching_each_shard_once_per_epoch() {
    let dir = Dir::new();
    let (hot, cold) = hot_and_cold_caches(&dir);
    let server = S3Server::start();
    let bucket = server.bucket("caches");
    for (local, name) in [(&hot, "hot"), (&cold, "cold")] {
        let url = format!("{bucket}/{name}");
        upload(&server, local, &url);
        let sizes = stored_bytes(local);
        let total: u64 = sizes.iter().sum();
        let limit = total / 4;
        let remote = Cache::open_remote(
            &url,
            &remote_options(&server, &dir.join(&format!("fetched-{name}")), Some(limit)),
        )
        .unwrap();
        let here = Cache::open(local).unwrap();
        let base = LoaderOptions {
            order: OrderSpec {
                window: 64,
                interleave: 2,
                ..Default::default()
            },
            batch_size: 8,
            ..Default::default()
        };
        let train = manifest(local)["splits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "train")
            .unwrap()["shards"]
            .as_u64()
            .unwrap();
        let epochs = 3;
        for e in 0..epochs {
            let o = LoaderOptions {
                epoch: e,
                ..base.clone()
            };
            assert_eq!(
                epoch(&remote, o.clone()),
                epoch(&here, o),
                "{name} epoch {e}"
            );
        }
        // Each shard once per epoch; near an epoch's end the next epoch's first shards are
        // fetched ahead (at most what the limit holds: the last epoch's are never read).
        let smallest = *sizes.iter().min().unwrap();
        let before = remote.shard_stats();
        assert!(
            before.shards_fetched <= epochs as u64 * train + limit / smallest,
            "{name}: {} fetches in {epochs} epochs of {train} shards ({before:?})",
            before.shards_fetched
        );
        assert!(before.shards_fetched >= epochs as u64 * train - limit / smallest);
        assert!(before.fetch_evictions > 0, "{name}: {before:?}");
        let kept: u64 = std::fs::read_dir(remote_folder(&dir.join(&format!("fetched-{name}"))))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(kept <= limit, "{name}: {kept} bytes kept, limit {limit}");
    }
}

/// The one folder of fetched shards under `dir`.
fn remote_folder(dir: &Path) -> std::path::PathBuf {
    let mut folders: Vec<_> = std::fs::read_dir(dir.join("remote"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    folders.pop().unwrap().join("shards")
}
