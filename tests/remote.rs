//! Caches in object storage, against a real S3 server on localhost (moto): uploaded with the
//! manifest last, read with the local cache's batches in every order, fetched into a bounded
//! folder in the loader's order with each shard fetched once per epoch, checked on arrival.

use crate::util::*;
use dsc_loader::{Cache, LoaderOptions, Mix, OrderSpec, RemoteOptions, Stage};
use std::path::Path;

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
        generation: Default::default(),
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
                window: 48,
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
                epoch_of(&remote, o.clone()),
                epoch_of(&here, o),
                "{name} epoch {e}"
            );
        }
        // Each shard once per epoch; near an epoch's end the next epoch's first shards are
        // fetched ahead (at most what the limit holds: the last epoch's are never read).
        let smallest = *sizes.iter().min().unwrap();
        let before = remote.shard_stats();
        assert!(
            before.shards_fetched <= epochs * train + limit / smallest,
            "{name}: {} fetches in {epochs} epochs of {train} shards ({before:?})",
            before.shards_fetched
        );
        assert!(before.shards_fetched >= epochs * train - limit / smallest);
        assert!(before.fetch_evictions > 0, "{name}: {before:?}");
        let kept: u64 = std::fs::read_dir(remote_folder(&dir.join(&format!("fetched-{name}")), 0))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(kept <= limit, "{name}: {kept} bytes kept, limit {limit}");
    }
}

/// The shards of the `k`-th folder of fetched shards under `dir` (the first process's is `ID`,
/// a second's at once `ID.2`).
fn remote_folder(dir: &Path, k: usize) -> std::path::PathBuf {
    let mut folders: Vec<_> = std::fs::read_dir(dir.join("remote"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    folders.sort();
    folders[k].join("shards")
}

/// A hot cache of small shards in bucket `caches` at `name`: (its local copy, its URL).
fn uploaded(dir: &Dir, server: &S3Server, name: &str) -> (std::path::PathBuf, String) {
    let cache = dir.join(name);
    if !cache.exists() {
        gen_icecube(dir, 2, 200);
        dsc(dir.path(), &icecube_args(name, &["--shard-size", "48KiB"])).ok();
    }
    let url = format!("{}/{name}", server.bucket("caches"));
    upload(server, &cache, &url);
    (cache, url)
}

#[test]
fn an_object_unlike_its_manifest_is_refused_on_arrival_and_nothing_of_it_is_kept() {
    let dir = Dir::new();
    let server = S3Server::start();
    let (local, url) = uploaded(&dir, &server, "cache");
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    let first = manifest(&local)["shards"][0]["file"]
        .as_str()
        .unwrap()
        .to_string();
    let good = std::fs::read(local.join(&first)).unwrap();
    let fetched = dir.join("fetched");
    // The same size, one byte changed (a shard of another compile, say): the checksum; a
    // shorter object: its size.
    let mut changed = good.clone();
    *changed.last_mut().unwrap() ^= 1;
    for (bad, says) in [
        (changed, "xxh3"),
        (good[..good.len() - 8].to_vec(), "bytes"),
    ] {
        remote.put(&first, bad).unwrap();
        // The open reads every shard's header: a short object may fail there already.
        let opts = remote_options(&server, &fetched, None);
        let (e, folder) = match Cache::open_remote(&url, &opts) {
            Err(e) => (e, remote_folder(&fetched, 0)),
            Ok(cache) => {
                let e = cache
                    .loader(LoaderOptions {
                        order: OrderSpec {
                            shuffle: false,
                            ..Default::default()
                        },
                        batch_size: 1,
                        ..Default::default()
                    })
                    .unwrap()
                    .find_map(Result::err)
                    .expect("the changed shard fails");
                (e, cache.fetch_folder().unwrap().join("shards"))
            }
        };
        let text = e.to_string();
        assert!(
            text.contains(&format!("{url}/{first}"))
                && text.contains(says)
                && text.matches(&url).count() == 1,
            "{text}"
        );
        // (Other shards' downloads may be under way: only the refused one's is looked for.)
        let refused = first.trim_start_matches("shards/");
        let leftovers: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(refused))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
    // Put right, the same open cache reads it: a failed fetch is tried again when asked.
    remote.put(&first, good).unwrap();
    let cache = Cache::open_remote(&url, &remote_options(&server, &fetched, None)).unwrap();
    let here = Cache::open(&local).unwrap();
    let o = LoaderOptions {
        batch_size: 4,
        ..Default::default()
    };
    assert_eq!(epoch_of(&cache, o.clone()), epoch_of(&here, o));
}

#[test]
fn fetched_shards_serve_the_next_run_and_a_second_reader_takes_a_folder_of_its_own() {
    let dir = Dir::new();
    let server = S3Server::start();
    let (local, url) = uploaded(&dir, &server, "cache");
    let fetched = dir.join("fetched");
    let opts = remote_options(&server, &fetched, None);
    let o = LoaderOptions {
        batch_size: 4,
        ..Default::default()
    };
    let want = epoch_of(&Cache::open(&local).unwrap(), o.clone());
    {
        let cache = Cache::open_remote(&url, &opts).unwrap();
        assert_eq!(epoch_of(&cache, o.clone()), want);
        // A second reader of the same cache at once (another rank on this machine).
        let second = Cache::open_remote(&url, &opts).unwrap();
        assert_ne!(second.fetch_folder(), cache.fetch_folder());
        assert_eq!(epoch_of(&second, o.clone()), want);
    }
    // A download cut short by a killed run: removed at the next open, never read.
    let folder = remote_folder(&fetched, 0);
    std::fs::write(
        folder.join(".train-00000.safetensors.partial-99999"),
        b"half",
    )
    .unwrap();
    let cache = Cache::open_remote(&url, &opts).unwrap();
    assert!(!folder
        .join(".train-00000.safetensors.partial-99999")
        .exists());
    assert_eq!(epoch_of(&cache, o.clone()), want);
    let stats = cache.shard_stats();
    assert_eq!(stats.shards_fetched, 0, "kept from the last run: {stats:?}");
    assert!(stats.fetch_hits > 0);
    drop(cache);
    // A kept copy written over (same size): hashed at the next open, not served (every later
    // run served it), fetched again.
    let kept = folder.join("train-00000.safetensors");
    let mut bytes = std::fs::read(&kept).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&kept, bytes).unwrap();
    let cache = Cache::open_remote(&url, &opts).unwrap();
    assert_eq!(epoch_of(&cache, o.clone()), want);
    let stats = cache.shard_stats();
    assert_eq!(stats.shards_fetched, 1, "{stats:?}");
    drop(cache);
    // Issue 39, class E: the same edit with the modification time put back (what `touch -r`,
    // `rsync -t` or a restore does) was served by every later run: the stamp checked size,
    // mtime and inode only. The status-change time moves with any write and with the restore.
    let before = std::fs::metadata(&kept).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&kept).unwrap();
    bytes[at] ^= 0xff;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&kept)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(&bytes)?;
            f.set_times(std::fs::FileTimes::new().set_modified(before))
        })
        .unwrap();
    assert_eq!(
        std::fs::metadata(&kept).unwrap().modified().unwrap(),
        before
    );
    let cache = Cache::open_remote(&url, &opts).unwrap();
    assert_eq!(epoch_of(&cache, o), want);
    let stats = cache.shard_stats();
    assert_eq!(stats.shards_fetched, 1, "served an edited copy: {stats:?}");
}

#[test]
fn a_limit_below_the_largest_shard_and_an_unknown_store_option_are_refused_by_name() {
    let dir = Dir::new();
    let server = S3Server::start();
    let (local, url) = uploaded(&dir, &server, "cache");
    let largest = stored_bytes(&local).into_iter().max().unwrap();
    let e = Cache::open_remote(
        &url,
        &remote_options(&server, &dir.join("f"), Some(largest - 1)),
    )
    .unwrap_err();
    assert!(
        matches!(&e, dsc_loader::LoadError::Options(o) if o.key == "cache_limit"),
        "{e}"
    );
    // One shard fits, but a loader whose two shuffle windows read more does not.
    let cache = Cache::open_remote(
        &url,
        &remote_options(&server, &dir.join("f"), Some(largest)),
    )
    .unwrap();
    let e = cache.loader(LoaderOptions::default()).unwrap_err();
    assert!(
        matches!(&e, dsc_loader::LoadError::Options(o) if o.key == "cache_limit"
            && o.problem.contains("two shuffle windows")),
        "{e}"
    );
    let mut opts = remote_options(&server, &dir.join("f"), None);
    opts.store.push(("aws_endpoint_urk".into(), "x".into()));
    let e = Cache::open_remote(&url, &opts).unwrap_err().to_string();
    assert!(e.contains("\"aws_endpoint_urk\""), "{e}");
    let e = Cache::open_remote(
        &format!("{url}-missing"),
        &remote_options(&server, &dir.join("f"), None),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(&format!("{url}-missing")), "{e}");
}

#[test]
fn an_upload_publishes_the_manifest_last_and_a_replace_removes_it_first() {
    let dir = Dir::new();
    let server = S3Server::start();
    let (local, url) = uploaded(&dir, &server, "cache");
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    // Replace it by a cache of fewer shards: no manifest while the files go up, the old
    // shards the new cache lacks removed after it.
    dsc(
        dir.path(),
        &icecube_args("fewer", &["--shard-size", "256KiB"]),
    )
    .ok();
    let e = dsc_store::upload_cache(&dir.join("fewer"), &remote, false, |_, _| {}).unwrap_err();
    assert!(matches!(e, dsc_store::StoreError::Exists { .. }), "{e}");
    let mut calls = 0;
    let sent = dsc_store::upload_cache(&dir.join("fewer"), &remote, true, |done, total| {
        calls += 1;
        let published = remote.exists("manifest.json").unwrap();
        assert_eq!(published, done == total, "{done} of {total}");
    })
    .unwrap();
    assert!(calls > 2 && sent.removed > 0, "{sent:?}");
    let names: Vec<String> = remote.list().unwrap().into_iter().map(|(n, _)| n).collect();
    let mut want: Vec<String> = tree(&dir.join("fewer")).into_keys().collect();
    want.sort();
    assert_eq!(names, want);
    assert!(local.exists());
}

#[test]
fn an_interrupted_uploads_objects_are_told_not_removed_and_its_staging_folder_goes() {
    let dir = Dir::new();
    let server = S3Server::start();
    let (_, url) = uploaded(&dir, &server, "cache");
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    // What a killed upload leaves: its files, no manifest. Another upload there is no replace
    // (nothing to replace), so it removes nothing (a concurrent upload's files could be among
    // them), and counts what is not its own.
    remote.delete("manifest.json").unwrap();
    dsc(
        dir.path(),
        &icecube_args("fewer", &["--shard-size", "256KiB"]),
    )
    .ok();
    let sent = dsc_store::upload_cache(&dir.join("fewer"), &remote, false, |_, _| {}).unwrap();
    let own = tree(&dir.join("fewer")).len();
    let there = remote.list().unwrap().len();
    assert!(
        sent.stray > 0 && sent.stray == there - own,
        "{sent:?}, {there} objects"
    );
    assert_eq!(sent.removed, 0);
    // The command line says so on stderr (its --json stays one object), and removes the
    // staging folder of an upload whose process is gone.
    let stale = dir.join("dsc-cache/upload/999999999/cache/shards");
    std::fs::create_dir_all(&stale).unwrap();
    remote.delete("manifest.json").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(icecube_args(&url, &["--shard-size", "256KiB", "--json"]))
        .current_dir(dir.path())
        .envs(server.env())
        .env("DSC_CACHE_DIR", dir.join("dsc-cache"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
    assert!(
        err.contains(&format!("note: {} objects under {url}", sent.stray))
            && err.contains("--force removes them"),
        "{err}"
    );
    assert!(!dir.join("dsc-cache/upload/999999999").exists());
    // A replace removes them.
    let sent = dsc_store::upload_cache(&dir.join("fewer"), &remote, true, |_, _| {}).unwrap();
    assert_eq!((sent.stray, remote.list().unwrap().len()), (0, own));
}

#[test]
fn the_cli_compiles_to_a_url_refuses_to_overwrite_it_and_verify_names_a_damaged_shard() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 2, 200);
    let url = format!("{}/cli", server.bucket("caches"));
    let env = server.env();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(args)
            .current_dir(dir.path())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("DSC_CACHE_DIR", dir.join("dsc-cache"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let compile = icecube_args(&url, &["--shard-size", "48KiB", "--quiet"]);
    let (code, _, err) = run(&compile);
    assert_eq!(code, 0, "{err}");
    assert!(
        !dir.join("dsc-cache/upload").exists()
            || std::fs::read_dir(dir.join("dsc-cache/upload"))
                .unwrap()
                .count()
                == 0,
        "the staging folder is removed"
    );
    let (code, _, err) = run(&compile);
    assert_eq!(code, 2);
    assert!(err.contains(&url) && err.contains("--force"), "{err}");
    let (code, out, err) = run(&["verify", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok:"), "{out}");
    show_and_report_read_it_as_the_local_cache(&dir, &url, &run);
    // A shard replaced by other bytes: verify names it and its checksum, exit 1.
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    let (name, _) = remote
        .list()
        .unwrap()
        .into_iter()
        .find(|(n, _)| n.starts_with("shards/"))
        .unwrap();
    let mut bytes = remote.get(&name).unwrap();
    // In the header: an open of the cache would fail; verify reports it as the shard's problem.
    bytes[100] ^= 0xff;
    remote.put(&name, bytes).unwrap();
    // Fetched afresh: another folder.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(["verify", &url, "--cache-dir"])
        .arg(dir.join("fresh"))
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&name) && err.contains("checksum"), "{err}");
}

/// A run of the CLI: exit code, stdout, stderr.
type Run<'a> = dyn Fn(&[&str]) -> (i32, String, String) + 'a;

/// `dsc show` and `dsc report` on the cache at `url` print what they print for the same cache
/// compiled locally; show --index fetches only the shard that holds the context.
fn show_and_report_read_it_as_the_local_cache(dir: &Dir, url: &str, run: &Run) {
    let (code, _, err) = run(&icecube_args(
        "local",
        &["--shard-size", "48KiB", "--quiet"],
    ));
    assert_eq!(code, 0, "{err}");
    let manifest = dsc_format::Manifest::read(&dir.join("local")).unwrap();
    assert!(manifest.shards_of("train").count() > 2);
    let last = manifest.shards_of("train").last().unwrap();
    let last_name = Path::new(&last.file).file_name().unwrap().to_string_lossy();
    let index = (last.first_context + last.contexts - 1).to_string();
    let (code, want, err) = run(&["show", "local", "--index", &index, "--json"]);
    assert_eq!(code, 0, "{err}");
    let key = serde_json::from_str::<serde_json::Value>(&want).unwrap()["key"].to_string();
    let (code, want_text, err) = run(&["show", "local", "--key", &key]);
    assert_eq!(code, 0, "{err}");
    // Hot and compressed (a copy compressed to another URL), each into a folder of its own:
    // --index and --key give the local output, and only the shard that holds the context is
    // fetched (the keys are read by ranged requests).
    let cold = format!("{url}-zstd");
    let (code, _, err) = run(&["compress", "local", "--out", &cold, "--quiet"]);
    assert_eq!(code, 0, "{err}");
    for (remote, folder) in [(url, "show-hot"), (cold.as_str(), "show-cold")] {
        let folder = dir.join(folder);
        let folder = folder.to_str().unwrap();
        let show = |args: &[&str]| {
            let mut all = vec!["show", remote];
            all.extend(args);
            all.extend(["--cache-dir", folder]);
            run(&all)
        };
        let (code, got, err) = show(&["--index", &index, "--json"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(got, want);
        let (code, got, err) = show(&["--key", &key]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(got, want_text);
        let (code, _, err) = show(&["--key", "-12345"]);
        assert_eq!(code, 2);
        assert!(err.contains("no context with key -12345"), "{err}");
        let fetched: Vec<String> = walk(Path::new(folder))
            .into_iter()
            .filter(|p| p.parent().unwrap().ends_with("shards"))
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(fetched.len(), 1, "{remote}: {fetched:?}");
        assert!(fetched[0].starts_with(&*last_name), "{fetched:?}");
    }
    for (cache, out) in [("local", "local.html"), (url, "remote.html")] {
        let (code, _, err) = run(&["report", cache, "-o", out]);
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(
        std::fs::read(dir.join("remote.html")).unwrap(),
        std::fs::read(dir.join("local.html")).unwrap()
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_url_of_no_store_dsc_reads_is_refused_not_taken_for_a_folder() {
    // Taken as paths, these became local folders named `ftp:` and `file:`.
    let dir = Dir::new();
    gen_icecube(&dir, 1, 50);
    for url in ["ftp://bucket/x", "file:///tmp/x"] {
        let err = dsc(dir.path(), &icecube_args(url, &["--quiet"])).fails(2);
        assert!(
            err.contains(url) && err.contains("not an object storage URL dsc reads"),
            "{err}"
        );
        for command in ["inspect", "verify", "show", "order"] {
            let mut args = vec![command, url];
            if command == "show" {
                args.extend(["--index", "0"]);
            }
            let err = dsc(dir.path(), &args).fails(2);
            assert!(
                err.contains("not an object storage URL dsc reads"),
                "{command}: {err}"
            );
        }
    }
    for local in ["ftp:", "file:"] {
        assert!(!dir.join(local).exists(), "{local} was written");
    }
    // Issue 39, class F: `dsc compress s3://…` said "No such file or directory" (and made a
    // local `s3:` folder for its lock).
    for command in ["compress", "decompress"] {
        let err = dsc(dir.path(), &[command, "s3://bucket/cache"]).fails(2);
        assert!(
            err.contains("s3://bucket/cache: a URL") && err.contains("local copy"),
            "{command}: {err}"
        );
    }
    assert!(!dir.join("s3:").exists(), "s3: was written");
}

#[test]
fn a_bucket_that_does_not_exist_is_named_before_any_work() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 1, 50);
    let url = "s3://no-such-bucket/cache";
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(args)
            .current_dir(dir.path())
            .envs(server.env())
            .env("DSC_CACHE_DIR", dir.join("dsc-cache"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Refused before the compile (it compiled, then failed on its first upload).
    let (code, err) = run(&icecube_args(url, &["--quiet"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{url}: the bucket does not exist")),
        "{err}"
    );
    assert!(
        !dir.join("dsc-cache/upload").exists() || walk(&dir.join("dsc-cache/upload")).is_empty()
    );
    // Readers say so too, not "not a dsc cache".
    for args in [
        &["inspect", url][..],
        &["verify", url][..],
        &["show", url, "--index", "0"][..],
    ] {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("the bucket does not exist"), "{args:?}: {err}");
    }
    // An empty prefix of a bucket that exists is not a cache.
    let empty = format!("{}/nothing-here", server.bucket("caches"));
    let (code, err) = run(&["inspect", &empty]);
    assert_eq!(code, 2);
    assert!(err.contains("not a dsc cache"), "{err}");
}

/// Issue 39, class C: a signal during an upload stops it before the manifest is published. The
/// store's side, deterministic: a stop asked for after the first file.
#[test]
fn an_upload_stopped_by_a_signal_never_publishes_its_manifest() {
    let dir = Dir::new();
    let server = S3Server::start();
    let (local, url) = uploaded(&dir, &server, "cache");
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    let asked = std::cell::Cell::new(false);
    let e = dsc_store::upload_cache_until(&local, &remote, true, |_, _| asked.set(true), &|| {
        asked.get().then_some(libc::SIGINT)
    })
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            dsc_store::StoreError::Interrupted {
                signal: 2,
                replaced: true,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("before the manifest was published") && msg.contains("had been removed"),
        "{msg}"
    );
    assert!(!remote.exists("manifest.json").unwrap(), "published anyway");
}

/// Issue 39, class C: SIGINT or SIGTERM during `dsc compile --out URL`'s upload was ignored
/// (the upload went on, the manifest was published, exit 0). Now it stops: exit 128 + the
/// signal, a message, no manifest at the URL, no staging folder left.
#[test]
fn a_signal_during_a_compiles_upload_stops_it_unpublished() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 4, 2000);
    for (signal, n) in [(libc::SIGINT, 1), (libc::SIGTERM, 2)] {
        let url = format!("{}/signalled-{n}", server.bucket("caches"));
        let cache_dir = dir.join("dsc-cache");
        // Small shards: many objects, so that the upload outlasts the signal's way there.
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(icecube_args(&url, &["--shard-size", "16KiB"]))
            .current_dir(dir.path())
            .envs(server.env())
            .env("DSC_CACHE_DIR", &cache_dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The compile has committed its staged cache (in its folder `<pid>-<nonce>`): the
        // upload is under way.
        let own = format!("{}-", child.id());
        let staged_in = |uploads: &Path| -> Option<std::path::PathBuf> {
            std::fs::read_dir(uploads)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&own))
                        && p.join("cache/manifest.json").exists()
                })
                .map(|p| p.join("cache/manifest.json"))
        };
        let start = std::time::Instant::now();
        let staged = loop {
            if let Some(staged) = staged_in(&cache_dir.join("upload")) {
                break staged;
            }
            assert!(start.elapsed().as_secs() < 60, "no staged cache");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        // SAFETY: signals a child process this test started and still owns.
        unsafe { libc::kill(child.id() as i32, signal) };
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + signal), "{err}");
        assert!(err.contains("before the manifest was published"), "{err}");
        let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
        assert!(!remote.exists("manifest.json").unwrap(), "published anyway");
        assert!(!staged.parent().unwrap().exists(), "staging left");
    }
}

/// Issue 39, class D: a killed compile's staging folder was kept by the next upload when its
/// process id was still seen in `/proc` (a zombie not yet reaped, a reused id). A folder is now
/// reclaimed when no process holds its lock, whatever its name.
#[test]
fn a_killed_uploads_staging_folder_is_reclaimed_even_if_its_pid_lives_on() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 2, 200);
    // A live process whose id names a staging folder it never held: what a reused id (or a
    // zombie) looks like to the next upload.
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let stale = dir.join(&format!("dsc-cache/upload/{}/cache/shards", other.id()));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("x.safetensors"), vec![0u8; 1 << 20]).unwrap();
    let url = format!("{}/reclaimed", server.bucket("caches"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(icecube_args(&url, &["--shard-size", "256KiB"]))
        .current_dir(dir.path())
        .envs(server.env())
        .env("DSC_CACHE_DIR", dir.join("dsc-cache"))
        .output()
        .unwrap();
    let _ = other.kill();
    let _ = other.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stale.parent().unwrap().parent().unwrap().exists(), "kept");
    // The upload's own folder and lock went too, and the reclaimed folder's lock: no name is
    // used twice (a pid and a nonce), so nothing is left for a later process.
    let left: Vec<String> = std::fs::read_dir(dir.join("dsc-cache/upload"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Issue 41, item 4: rows (a glob over a prefix), the context table and a CSV join given as
/// URLs compile to the cache of the same files on disk, in one process and as partitions; an
/// object that is not there is named by its URL.
#[test]
fn inputs_in_object_storage_compile_to_the_cache_of_the_same_files_on_disk() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 3, 200);
    let bucket = server.bucket("inputs");
    let store = dsc_store::Remote::open_with(&bucket, &server.options()).unwrap();
    for (name, bytes) in tree(&dir.join("data")) {
        store.put(&format!("data/{name}"), bytes).unwrap();
    }
    let env = server.env();
    let run = |args: &[String]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(args)
            .current_dir(dir.path())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let args = |out: &str, urls: bool, extra: &[&str]| -> Vec<String> {
        icecube_args(
            out,
            &["--shard-size", "48KiB", "--bucket-size", "64KiB", "-q"],
        )
        .into_iter()
        .chain(extra.iter().copied())
        .map(|a| match a.strip_prefix("data/") {
            Some(rest) if urls => format!("{bucket}/data/{rest}"),
            _ => a.to_string(),
        })
        .collect()
    };
    let ok = |a: Vec<String>| {
        let (code, err) = run(&a);
        assert_eq!(code, 0, "dsc {}: {err}", a.join(" "));
    };
    ok(args("local", false, &[]));
    ok(args("remote", true, &[]));
    let data = |cache: &str| -> std::collections::BTreeMap<String, Vec<u8>> {
        tree(&dir.join(cache))
            .into_iter()
            .filter(|(name, _)| name != "manifest.json")
            .collect()
    };
    let (local, remote) = (data("local"), data("remote"));
    assert!(local.len() > 4);
    assert!(local == remote, "the caches differ");
    // The manifest names the objects by URL; their size and version stand for their bytes.
    let m = manifest(&dir.join("remote"));
    let inputs = m["inputs"]["files"].as_array().unwrap();
    assert_eq!(
        inputs.len(),
        5,
        "three rows files, the context and the join: {inputs:?}"
    );
    assert!(inputs
        .iter()
        .all(|f| f["path"].as_str().unwrap().starts_with(&bucket)));
    // Partitions, each scanning its own rows objects, give the remote compile's bytes.
    for stage in ["scan", "fit", "write"] {
        for p in ["0/2", "1/2"] {
            ok(args("parted", true, &["--partition", p, "--stage", stage]));
        }
    }
    ok(vec!["merge".into(), "parted".into(), "-q".into()]);
    assert_eq!(tree(&dir.join("parted")), tree(&dir.join("remote")));
    // An object that is not there, and a glob that matches none, are named.
    let mut missing = args("x", true, &[]);
    let at = missing.iter().position(|a| a == "--context").unwrap() + 1;
    missing[at] = format!("{bucket}/data/nope.parquet");
    let (code, err) = run(&missing);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("{bucket}/data/nope.parquet")),
        "{err}"
    );
    let mut none = args("x", true, &[]);
    none[1] = format!("{bucket}/data/train/*.csv");
    let (code, err) = run(&none);
    assert_eq!(code, 2);
    assert!(err.contains("train/*.csv"), "{err}");
    // A key file in object storage, as rows are (issue 52 C14: "No such file or directory").
    let ids: Vec<i64> = Table::read(&dir.join("data/train_meta.parquet")).i64s("event_id");
    let listed: Vec<String> = ids.iter().step_by(7).map(i64::to_string).collect();
    store
        .put(
            "keys/test.txt",
            format!("{}\n", listed.join("\n")).into_bytes(),
        )
        .unwrap();
    let split_keys = format!("test={bucket}/keys/test.txt");
    ok(args(
        "keyed",
        true,
        &["--split-keys", &split_keys, "--empty-contexts", "drop"],
    ));
    let keyed = manifest(&dir.join("keyed"));
    let test = keyed["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "test")
        .map(|s| s["contexts"].as_u64().unwrap());
    assert!(test.is_some_and(|n| n > 0), "{keyed}");
    // A spec file in object storage too: the same cache as its flags.
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(args("unused", true, &["--print-spec"]))
        .current_dir(dir.path())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    assert!(printed.status.success());
    store.put("spec/dsc.toml", printed.stdout).unwrap();
    ok(vec![
        "compile".into(),
        "--spec".into(),
        format!("{bucket}/spec/dsc.toml"),
        "--out".into(),
        "from-spec".into(),
        "-q".into(),
    ]);
    assert!(
        data("from-spec") == data("remote"),
        "the spec file's cache differs"
    );
    // Rows named by an object that is not there: "no such object", not a pattern (issue 52
    // C13: ".../nope.parquet/*.parquet: the pattern matched nothing" before).
    let mut absent = args("x", true, &[]);
    absent[1] = format!("{bucket}/data/train/nope.parquet");
    let (code, err) = run(&absent);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!(
            "{bucket}/data/train/nope.parquet: no such object (nor a folder of .parquet objects)"
        )),
        "{err}"
    );
    // No credentials at all: said so, with where the client looked.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(["inspect", "s3://dsc-no-such-bucket/cache"])
        .env_clear()
        .env("HOME", dir.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no credentials found (looked in AWS_ACCESS_KEY_ID"),
        "{err}"
    );
}

/// Issue 52 A3: names reach the store as given, in the cache's URL and in every input's: a
/// cache at `caché ~%` is published under that name (not `cach%C3%A9…`), and inputs whose names
/// hold `é`, `~`, `%`, `#` or `?` are found, one by one and by a glob.
#[test]
fn object_names_reach_the_store_as_given() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 2, 100);
    let bucket = server.bucket("names");
    let store = dsc_store::Remote::open_with(&bucket, &server.options()).unwrap();
    let odd = "in/dé ~%#?";
    for (name, bytes) in tree(&dir.join("data")) {
        store.put(&format!("{odd}/{name}"), bytes).unwrap();
    }
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(
        listed.contains(&format!("{odd}/train/batch_1.parquet")),
        "{listed:?}"
    );
    let env = server.env();
    let run = |args: &[String]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(args)
            .current_dir(dir.path())
            .env("DSC_CACHE_DIR", dir.join("dsc-cache"))
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dsc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let at = |rest: &str| format!("{bucket}/{odd}/{rest}");
    for (rows, out) in [
        (at("train/batch_1.parquet"), "caché ~%"),
        (at("train/*.parquet"), "glob"),
    ] {
        let mut args: Vec<String> = icecube_args("OUT", &["-q", "--empty-contexts", "drop"])
            .into_iter()
            .map(String::from)
            .collect();
        args[1] = rows;
        for a in args.iter_mut() {
            if let Some(rest) = a.strip_prefix("data/") {
                *a = at(rest);
            }
        }
        let o = args.iter().position(|a| a == "OUT").unwrap();
        args[o] = format!("{bucket}/{out}");
        run(&args);
    }
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(
        listed.contains(&"caché ~%/manifest.json".to_string()),
        "{listed:?}"
    );
    assert!(
        !listed
            .iter()
            .any(|n| n.contains("%C3%A9") || n.contains("%25")),
        "{listed:?}"
    );
    run(&["verify".into(), format!("{bucket}/caché ~%")]);
}

/// Issue 52 C22: a read command stopped by a signal mid-download says what it was fetching,
/// exits 128 + the signal, and leaves no partial file in the fetch folder.
#[test]
fn a_read_stopped_mid_download_says_what_it_was_fetching() {
    let dir = Dir::new();
    let server = S3Server::start();
    gen_icecube(&dir, 2, 200);
    dsc(
        dir.path(),
        &icecube_args("cache", &["--shard-size", "256KiB"]),
    )
    .ok();
    let url = format!("{}/stopped", server.bucket("caches"));
    upload(&server, &dir.join("cache"), &url);
    let flag = dir.join("go");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(["verify", &url])
        .current_dir(dir.path())
        .envs(server.env())
        .env("DSC_CACHE_DIR", dir.join("dsc-cache"))
        .env("DSC_PAUSE", format!("fetch:chunk:{}", flag.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let paused = dir.join("go.paused");
    let start = std::time::Instant::now();
    while !paused.exists() && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        paused.exists(),
        "the download never reached its first chunk"
    );
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(std::time::Duration::from_millis(100));
    std::fs::write(&flag, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("stopped by signal 2 while fetching it; nothing of it was kept")
            && err.contains(&url),
        "{err}"
    );
    let partial: Vec<_> = walk(&dir.join("dsc-cache"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".partial-"))
        .collect();
    assert!(partial.is_empty(), "{partial:?}");
}

/// A scheduled mix of two caches in object storage yields the local mix's batches, and the
/// fetch plan follows the scheduled order: a cache the schedule retires is fetched no more.
#[test]
fn a_scheduled_mix_of_remote_caches_fetches_what_its_schedule_draws() {
    let dir = Dir::new();
    let (hot, _) = hot_and_cold_caches(&dir);
    // The same events in other shards: other data to the mix (another content id).
    dsc(
        dir.path(),
        &icecube_args("reseeded", &["--shard-size", "32KiB"]),
    )
    .ok();
    let other = dir.join("reseeded");
    let server = S3Server::start();
    let bucket = server.bucket("caches");
    let mut remote = Vec::new();
    for (local, name) in [(&hot, "hot"), (&other, "reseeded")] {
        let url = format!("{bucket}/{name}");
        upload(&server, local, &url);
        let folder = dir.join(&format!("fetched-{name}"));
        // Half the cache: shards are evicted and fetched again in each epoch that
        // reads them, so that what an epoch fetches is what its order draws.
        let limit = stored_bytes(local).iter().sum::<u64>() / 2;
        remote.push(
            Cache::open_remote(&url, &remote_options(&server, &folder, Some(limit))).unwrap(),
        );
    }
    let local = Mix::new(vec![
        Cache::open(&hot).unwrap(),
        Cache::open(&other).unwrap(),
    ])
    .unwrap();
    let far = Mix::new(remote.clone()).unwrap();
    let per_epoch = local
        .loader(LoaderOptions::default())
        .unwrap()
        .order()
        .len() as u64;
    // Both in the first epoch; the first cache retired from the second on.
    let stage = |at, weights: [f64; 2]| Stage {
        at,
        weights: weights.to_vec(),
        linear: false,
    };
    let o = |epoch| LoaderOptions {
        epoch,
        batch_size: 8,
        order: OrderSpec {
            window: 48,
            schedule: vec![stage(0, [1.0, 1.0]), stage(per_epoch, [0.0, 1.0])],
            ..Default::default()
        },
        ..Default::default()
    };
    let mixed = |mix: &Mix, epoch| -> Vec<Vec<i64>> {
        mix.loader(o(epoch))
            .unwrap()
            .map(|b| b.unwrap().keys())
            .collect()
    };
    assert_eq!(mixed(&far, 0), mixed(&local, 0));
    let fetched = |r: &Cache| r.shard_stats().shards_fetched;
    let first = [fetched(&remote[0]), fetched(&remote[1])];
    assert!(first[0] > 0 && first[1] > 0);
    for epoch in 1..3 {
        assert_eq!(mixed(&far, epoch), mixed(&local, epoch), "epoch {epoch}");
    }
    assert_eq!(
        fetched(&remote[0]),
        first[0],
        "a retired cache is fetched no more"
    );
    // The other cache, under the same limit, fetched its shards again in each later epoch.
    assert!(
        fetched(&remote[1]) >= first[1] * 2,
        "{} after epoch 0, {} after epoch 2",
        first[1],
        fetched(&remote[1])
    );
}
