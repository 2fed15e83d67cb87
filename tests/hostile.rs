//! Faults found by attacking dsc as a hostile user would (issue 12), each reproduced first.

use crate::util::*;
use arrow_array::{ArrayRef, Float64Array};
use std::sync::Arc;

/// The README compile into `out` with another shuffle seed, replacing what is there.
fn forced_with_seed<'a>(out: &'a str, seed: &'a str) -> Vec<&'a str> {
    let mut args = icecube_args(out, &["--force"]);
    let i = args.iter().position(|a| *a == "--seed").expect("--seed");
    args[i + 1] = seed;
    args
}

/// Runs the test `name` of this binary again in a child process with `env` set: the child does
/// what would kill or limit the test process itself (a fault, a resource limit).
fn rerun_as_child(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn data() -> Dir {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 60);
    dir
}

/// What a cache holds, independent of how its inputs were spelled: per split the contexts and
/// stored rows, and every shard's checksum.
fn content(cache: &std::path::Path) -> Vec<String> {
    let m = manifest(cache);
    let mut out: Vec<String> = m["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{} {} {}", s["name"], s["contexts"], s["rows_stored"]))
        .collect();
    out.extend(
        m["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["xxh3"].to_string()),
    );
    out
}

#[test]
fn one_file_named_twice_is_read_once() {
    let dir = data();
    dsc(dir.path(), &icecube_args("once", &[])).ok();
    // The same files again under other spellings: a second path, a `./` path, a symlink.
    std::os::unix::fs::symlink(
        dir.join("data/train/batch_1.parquet"),
        dir.join("data/link.parquet"),
    )
    .unwrap();
    let mut args = icecube_args("twice", &[]);
    args.splice(
        2..2,
        [
            "data/train/batch_1.parquet",
            "./data/train/batch_2.parquet",
            "data/link.parquet",
        ],
    );
    dsc(dir.path(), &args).ok();
    assert_eq!(content(&dir.join("once")), content(&dir.join("twice")));
}

#[test]
fn a_needed_column_named_twice_in_one_file_is_refused() {
    let dir = data();
    let path = dir.join("data/train/batch_2.parquet");
    let table = Table::read(&path);
    // The first record batch is enough: the header is refused before any row is read.
    let batch = &table.batches[0];
    let schema = batch.schema();
    let mut cols: Vec<(&str, ArrayRef)> = schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| (f.name().as_str(), c.clone()))
        .collect();
    // A second `charge` with other values: which one would the cache hold?
    let other: ArrayRef = Arc::new(Float64Array::from(vec![7.0; batch.num_rows()]));
    cols.push(("charge", other));
    write_parquet(&path, cols);
    let err = dsc(dir.path(), &icecube_args("cache", &[])).fails(2);
    assert_eq!(err.trim().lines().count(), 1, "one line:\n{err}");
    for needle in ["batch_2.parquet", "\"charge\"", "appears 2 times", "rename"] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    assert!(!dir.join("cache").exists());
}

#[test]
fn absurd_batch_sizes_are_refused_before_anything_is_allocated() {
    let dir = data();
    dsc(dir.path(), &icecube_args("cache", &[])).ok();
    // Once aborted the process on a 2.4 TB allocation (the batch's sample list).
    let err = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--batch-size",
            "100000000000",
            "--keep-last",
            "--keys",
        ],
    )
    .fails(2);
    assert_eq!(err.trim().lines().count(), 1, "one line:\n{err}");
    for needle in [
        "--batch-size 100000000000",
        "more than half of this machine's memory",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    // Issue 39, class F: a huge --max-seqs was blamed on --pack.
    let err = dsc(
        dir.path(),
        &[
            "order",
            "cache",
            "--pack",
            "4096",
            "--max-seqs",
            "100000000000000",
        ],
    )
    .fails(2);
    assert!(
        err.contains("--max-seqs 100000000000000") && !err.contains("--pack 4096"),
        "{err}"
    );
    // batch x world wraps a usize: alone, and checked against a saved state before the state's
    // numbers are used.
    let overflow = [
        "order",
        "cache",
        "--batch-size",
        "4611686018427387904",
        "--world-size",
        "4",
    ];
    let err = dsc(dir.path(), &overflow).fails(2);
    assert!(err.contains("the global batch overflows"), "{err}");
    let state = dsc(
        dir.path(),
        &["order", "cache", "--batch-size", "8", "--state-after", "2"],
    )
    .ok();
    std::fs::write(dir.join("state.json"), state).unwrap();
    let err = dsc(
        dir.path(),
        &[&overflow[..], &["--from-state", "state.json"]].concat(),
    )
    .fails(2);
    assert!(err.contains("the global batch overflows"), "{err}");
}

#[test]
fn help_examples_keep_their_lines() {
    let dir = Dir::new();
    let commands = [
        "gen", "compile", "inspect", "verify", "show", "report", "order", "bench",
    ];
    let mut pages = vec![("dsc --help".to_string(), dsc(dir.path(), &["--help"]).ok())];
    for c in commands {
        pages.push((
            format!("dsc {c} --help"),
            dsc(dir.path(), &[c, "--help"]).ok(),
        ));
    }
    for (cmd, text) in &pages {
        for line in text.lines() {
            // A shell continuation in the middle of a line: clap reflowed an example.
            assert!(
                !line.trim_end().trim_end_matches('\\').contains(" \\ "),
                "{cmd}: an example was reflowed into one line:\n{line}"
            );
        }
    }
    let top = &pages[0].1;
    assert!(
        top.lines().any(|l| l.trim() == "dsc inspect cache"),
        "the typical session keeps one command per line:\n{top}"
    );
}

#[test]
fn a_compile_into_an_output_another_process_is_writing_stops_and_names_it() {
    let dir = data();
    // Another writer holds the output's lock (as a running compile does).
    let lock_path = dir.join(".cache.dsc-lock");
    let mut holder = std::fs::File::create(&lock_path).unwrap();
    holder.lock().unwrap();
    use std::io::Write as _;
    write!(holder, "pid 424242").unwrap();
    // Its staging directory must survive the second compile.
    std::fs::create_dir_all(dir.join(".cache.dsc-partial/shards")).unwrap();
    let err = dsc(dir.path(), &icecube_args("cache", &["--force"])).fails(2);
    assert_eq!(err.trim().lines().count(), 1, "one line:\n{err}");
    for needle in ["cache", "another dsc (pid 424242) is writing this cache"] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    assert!(dir.join(".cache.dsc-partial/shards").is_dir());
    assert!(!dir.join("cache").exists());
    // Released (the holder exits): the compile runs.
    drop(holder);
    dsc(dir.path(), &icecube_args("cache", &[])).ok();
    dsc(dir.path(), &["verify", "cache"]).ok();
}

#[test]
fn concurrent_compiles_into_one_output_never_leave_a_wrong_cache() {
    let dir = data();
    let bin = env!("CARGO_BIN_EXE_dsc");
    // Started together, as the reproduction did (its second compile deleted the first's
    // staging directory and both wrote into the new one).
    let children: Vec<_> = ["1", "2", "3"]
        .iter()
        .map(|seed| {
            std::process::Command::new(bin)
                .args(forced_with_seed("cache", seed))
                .current_dir(dir.path())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ok = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => ok += 1,
            // The holder names its pid once it has written it; a loser that looks in between
            // says "a process that just started" (seen in CI): both name another dsc.
            Some(2) => assert!(
                err.contains("another dsc (pid")
                    || err.contains("another dsc (a process that just started)"),
                "{err}"
            ),
            other => panic!("exit {other:?}: {err}"),
        }
    }
    assert!(ok >= 1);
    // Whichever won, the cache is whole: every checksum, every key once.
    dsc(dir.path(), &["verify", "cache"]).ok();
    assert!(!dir.join(".cache.dsc-partial").exists());
}

#[test]
fn a_staging_directory_is_not_a_cache() {
    let dir = data();
    dsc(dir.path(), &icecube_args("cache", &[])).ok();
    // A compile killed right after writing its staging manifest leaves exactly this.
    let staging = dir.join(".cache.dsc-partial");
    copy_tree(&dir.join("cache"), &staging);
    for cmd in [
        vec!["verify", ".cache.dsc-partial"],
        vec!["inspect", ".cache.dsc-partial"],
    ] {
        let err = dsc(dir.path(), &cmd).fails(2);
        assert!(
            err.contains("the staging directory of an unfinished or killed dsc compile"),
            "{cmd:?}: {err}"
        );
    }
}

#[test]
fn a_forced_compile_replaces_the_cache_without_a_moment_where_it_is_missing() {
    let dir = data();
    dsc(dir.path(), &icecube_args("cache", &[])).ok();
    let manifest = dir.join("cache/manifest.json");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, manifest) = (stop.clone(), manifest.clone());
        std::thread::spawn(move || {
            let mut missing = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                missing += u64::from(!manifest.exists());
            }
            missing
        })
    };
    // One compile thread leaves the other core to the watcher; before the fix it saw the gap
    // between moving the old cache aside and moving the new one in.
    for seed in 1..=12 {
        let seed = seed.to_string();
        let mut args = forced_with_seed("cache", &seed);
        args.extend(["--threads", "1"]);
        dsc(dir.path(), &args).ok();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        watcher.join().unwrap(),
        0,
        "cache/ was missing while being replaced"
    );
    dsc(dir.path(), &["verify", "cache"]).ok();
    wait_replaced_removed(dir.path(), "cache");
    assert!(!dir.join(".cache.dsc-old").exists());
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Appends a byte to `file` when the compile reaches `stage`: an input rewritten mid-compile.
struct ChangeAt {
    stage: &'static str,
    file: std::path::PathBuf,
}

impl dsc_compiler::Progress for ChangeAt {
    fn stage(&self, name: &str, _total: u64) {
        if name == self.stage {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.file)
                .unwrap();
            f.write_all(b"\0").unwrap();
        }
    }
}

/// A compile spec of `data()`'s files: two features and the direction targets.
fn small_spec(dir: &Dir) -> serde_json::Value {
    serde_json::json!({
        "rows": [dir.join("data/train/batch_*.parquet").display().to_string()],
        "key": "event_id",
        "order_by": "time",
        "context": dir.join("data/train_meta.parquet").display().to_string(),
        "targets": ["azimuth", "zenith"],
        "features": ["time", "charge"],
    })
}

#[test]
fn an_input_changed_during_the_compile_stops_it_and_nothing_is_committed() {
    let dir = data();
    let mut spec = small_spec(&dir);
    spec["max_len"] = 64.into();
    let spec: dsc_compiler::CompileSpec = serde_json::from_value(spec).unwrap();
    // Read already, then rewritten before the shards are written (a writer still appending).
    let changed = dir.join("data/train/batch_2.parquet");
    let progress = ChangeAt {
        stage: "writing shards",
        file: changed.clone(),
    };
    let opts = dsc_compiler::CompileOptions {
        out: dir.join("cache"),
        force: false,
        max_memory: None,
        storage: Default::default(),
        progress: &progress,
    };
    let err = dsc_compiler::compile(&spec, &opts).unwrap_err().to_string();
    for needle in [
        "batch_2.parquet",
        "changed while it was being compiled",
        "bytes at the start",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    assert!(!dir.join("cache").exists());
    assert!(!dir.join(".cache.dsc-partial").exists());
}

/// In the child: opens `cache`, truncates its first shard under the open map, reads it.
const SIGBUS_CHILD: &str = "DSC_TEST_SIGBUS_CHILD";

#[test]
fn a_shard_truncated_under_the_reader_is_named_and_the_cli_exit_code_returned() {
    if let Some(cache) = std::env::var_os(SIGBUS_CHILD) {
        // The child: what `dsc bench` does while another process cuts a shard short.
        dsc_loader::sigbus::exit_with(2);
        let cache = dsc_loader::Cache::open(&cache).unwrap();
        let shard = cache.dir().join(&cache.manifest().shards()[0].file);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(64)
            .unwrap();
        for batch in cache
            .loader(dsc_loader::LoaderOptions {
                batch_size: 16,
                threads: 0,
                ..Default::default()
            })
            .unwrap()
        {
            let _ = batch;
        }
        panic!("read a truncated shard without a fault");
    }
    let dir = data();
    dsc(dir.path(), &icecube_args("cache", &[])).ok();
    let out = rerun_as_child(
        "hostile::a_shard_truncated_under_the_reader_is_named_and_the_cli_exit_code_returned",
        &[(SIGBUS_CHILD, dir.join("cache").as_ref())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {err}", out.status);
    assert!(
        err.contains("shards/train-00000.safetensors: the shard changed under the reader"),
        "{err}"
    );
}

const MAPS_CHILD: &str = "DSC_TEST_MAPS_CHILD";

#[test]
fn a_cache_the_kernel_cannot_map_says_why_and_what_to_do() {
    if let Some(cache) = std::env::var_os(MAPS_CHILD) {
        // The child: an address-space limit just above what it uses, so that mapping the
        // cache's shards fails as it does past `vm.max_map_count`.
        let used: u64 = std::fs::read_to_string("/proc/self/statm")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 4096;
        let limit = libc::rlimit {
            rlim_cur: used + (12 << 20),
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit with a valid struct; this child process exits right after.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
        let err = dsc_loader::Cache::open(&cache).unwrap_err().to_string();
        eprintln!("{err}");
        std::process::exit(3);
    }
    let dir = data();
    // About 21 MiB in shards of 4 MiB: more than the child's 12 MiB of slack.
    gen_icecube(&dir, 2, 3000);
    dsc(
        dir.path(),
        &icecube_args("cache", &["--shard-size", "4MiB"]),
    )
    .ok();
    let out = rerun_as_child(
        "hostile::a_cache_the_kernel_cannot_map_says_why_and_what_to_do",
        &[(MAPS_CHILD, dir.join("cache").as_ref())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    for needle in [
        "cannot map",
        "the kernel refused another memory map",
        "vm.max_map_count",
        "larger `shard_size`", // the library's spelling: this reader is Rust, not the CLI
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
}

const FSIZE_CHILD: &str = "DSC_TEST_FSIZE_CHILD";

#[test]
fn a_compile_that_runs_out_of_space_at_any_stage_fails_cleanly() {
    if let Ok(limit) = std::env::var(FSIZE_CHILD) {
        // The child: every file it writes may grow to `limit` bytes, no further (as a full
        // disk, for each file); the write then fails with EFBIG instead of a signal.
        let limit: u64 = limit.parse().unwrap();
        let rl = libc::rlimit {
            rlim_cur: limit,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: ignoring SIGXFSZ and setting a resource limit, in this child only.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rl), 0);
        }
        // Padded to 2048 steps, the one shard per split is far larger than any spill file,
        // so that some limit lets the spill through and stops the shard writer.
        // A budget below the input, so that the rows are spilled to files, not kept in memory.
        let mut args = icecube_args(
            "cache",
            &[
                "--shard-size",
                "1GiB",
                "--max-memory",
                "1MiB",
                "--bucket-size",
                "256KiB",
            ],
        );
        let l = args.iter().position(|a| *a == "--max-len").unwrap();
        args[l + 1] = "2048";
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(&args)
            .current_dir(std::env::var("DSC_TEST_DIR").unwrap())
            .output()
            .unwrap();
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(out.status.code().unwrap_or(99));
    }
    let dir = data();
    let mut failed_on = std::collections::BTreeSet::new();
    for limit in [512u64, 24 << 10, 1 << 20, 2 << 20, 256 << 20] {
        let out = rerun_as_child(
            "hostile::a_compile_that_runs_out_of_space_at_any_stage_fails_cleanly",
            &[
                (FSIZE_CHILD, limit.to_string().as_ref()),
                ("DSC_TEST_DIR", dir.path().as_ref()),
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                dsc(dir.path(), &["verify", "cache"]).ok();
                std::fs::remove_dir_all(dir.join("cache")).unwrap();
            }
            Some(2) => {
                let line = err
                    .lines()
                    .find(|l| l.starts_with("dsc: "))
                    .unwrap_or_else(|| panic!("limit {limit}: no error line in {err}"));
                assert!(line.contains("File too large"), "limit {limit}: {line}");
                let file = ["spill/", "shards/", "stats.json", "manifest.json"]
                    .into_iter()
                    .find(|f| line.contains(f))
                    .unwrap_or_else(|| panic!("limit {limit}: which file? {line}"));
                failed_on.insert(file);
                assert!(
                    !dir.join("cache").exists(),
                    "limit {limit}: a cache appeared"
                );
                assert!(
                    !dir.join(".cache.dsc-partial").exists(),
                    "limit {limit}: the staging directory was left"
                );
            }
            other => panic!("limit {limit}: exit {other:?}: {err}"),
        }
    }
    // The spill writer (the input, bucketed beside the output) and the shard writer were each
    // hit by one of the limits. The small-file writer (stats.json, manifest.json) writes less
    // than any spill file, so a per-file limit cannot stop it alone any more.
    assert!(
        failed_on.contains("spill/") && failed_on.contains("shards/"),
        "{failed_on:?}"
    );
}

/// Makes a directory refuse writes for the life of the guard: `chmod a-w` for a user, the
/// immutable attribute for root (which permissions do not stop).
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn new(path: std::path::PathBuf) -> ReadOnly {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let ok = if root {
            std::process::Command::new("chattr")
                .arg("+i")
                .arg(&path)
                .status()
                .is_ok_and(|s| s.success())
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o555)).is_ok()
        };
        assert!(ok, "cannot make {} read-only", path.display());
        ReadOnly(path)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
    }
}

fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_read_only_output_fails_with_a_message_and_changes_nothing() {
    let dir = data();
    std::fs::create_dir(dir.join("ro")).unwrap();
    dsc(dir.path(), &icecube_args("ro/cache", &[])).ok();
    let before = content(&dir.join("ro/cache"));
    let files = listing(&dir.join("ro"));

    {
        let _ro = ReadOnly::new(dir.join("ro"));
        // A new cache in a folder that refuses writes, and a forced replacement of the cache in it.
        for args in [
            icecube_args("ro/new", &[]),
            forced_with_seed("ro/cache", "7"),
        ] {
            let err = dsc(dir.path(), &args).fails(2);
            assert!(err.contains("must be writable"), "{err}");
            assert!(err.contains("nothing was changed"), "{err}");
            assert_eq!(listing(&dir.join("ro")), files);
        }
    }
    // The folder is writable but the cache itself cannot be moved (only the immutable attribute
    // does that, and only root may set it): the replacement stops at the last step and the old
    // cache is still the cache.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let _ro = ReadOnly::new(dir.join("ro/cache"));
        let err = dsc(dir.path(), &forced_with_seed("ro/cache", "7")).fails(2);
        assert!(err.contains("cannot replace the cache"), "{err}");
        assert_eq!(listing(&dir.join("ro")), files);
    }
    dsc(dir.path(), &["verify", "ro/cache"]).ok();
    assert_eq!(content(&dir.join("ro/cache")), before);
}

#[test]
fn a_bucket_size_too_small_to_mean_anything_is_refused_at_once() {
    // Issue 27: `--bucket-size 1` with a `--max-memory` split the input into 2^20 buckets and
    // ran on for minutes at gigabytes of memory.
    let dir = data();
    for size in ["0", "1", "4095"] {
        let err = dsc(
            dir.path(),
            &icecube_args("cache", &["--bucket-size", size, "--max-memory", "64MiB"]),
        )
        .fails(2);
        assert!(
            err.contains("--bucket-size") && err.contains("4KiB"),
            "{err}"
        );
    }
    assert!(!dir.join("cache").exists());
    dsc(
        dir.path(),
        &icecube_args("cache", &["--bucket-size", "4KiB", "--max-memory", "64MiB"]),
    )
    .ok();
}

/// Starts the README compile into `cache` in `dir` as a child, waits until its staging folder
/// exists (the compile is under way), sends `signal`, and returns its exit code and stderr.
fn signal_a_compile(dir: &Dir, signal: i32) -> (i32, String) {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(icecube_args(
            "cache",
            &["--max-memory", "64MiB", "--bucket-size", "64KiB"],
        ))
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let staging = dir.join(".cache.dsc-partial");
    let start = std::time::Instant::now();
    while !staging.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no staging folder"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: signals a child process this test started and still owns.
    unsafe { libc::kill(child.id() as i32, signal) };
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_compile_stopped_by_a_signal_says_so_and_leaves_nothing() {
    // Issue 27: SIGINT (and SIGTERM) left `.cache.dsc-partial` behind, without a word.
    let dir = Dir::new();
    gen_icecube(&dir, 4, 3000);
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let (code, err) = signal_a_compile(&dir, signal);
        assert_eq!(code, 128 + signal, "{name}: {err}");
        assert!(
            err.contains(&format!("interrupted ({name})")) && err.contains("nothing was committed"),
            "{err}"
        );
        let left: Vec<String> = listing(dir.path())
            .into_iter()
            .filter(|n| n.contains("cache") && !n.ends_with("dsc-lock"))
            .collect();
        assert!(left.is_empty(), "{name} left {left:?}");
    }
}

#[test]
fn a_compile_past_the_file_size_limit_says_so_and_leaves_nothing() {
    // Issue 27: under `ulimit -f`, SIGXFSZ killed the compile without a message and left its
    // staging folder (the full-disk test above ignores SIGXFSZ itself, so it never saw this).
    let dir = data();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
    cmd.args(icecube_args("cache", &[])).current_dir(dir.path());
    // SAFETY: between fork and exec only setrlimit and signal, both async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let rl = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("file-size limit"), "{err}");
    // The lock file stays by design (see "Concurrent writers" in docs/RELIABILITY.md).
    assert_eq!(listing(dir.path()), [".cache.dsc-lock", "data"], "{err}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// Any numbers in a compile spec (as a spec file, `dsc.compile` or a program may give
    /// them) give a cache or an error: never a panic, an abort or a run that goes on for
    /// minutes (issue 27, item 3). Each case runs under a time limit in a thread.
    #[test]
    fn any_numbers_in_a_compile_spec_give_a_cache_or_an_error(
        max_len in proptest::prop_oneof![0u64..300, proptest::strategy::Just(u64::MAX)],
        shard_size in proptest::prop_oneof![0u64..5000, 4096u64..(1 << 30), proptest::strategy::Just(u64::MAX)],
        bucket_size in proptest::option::of(proptest::prop_oneof![0u64..10_000, proptest::strategy::Just(u64::MAX)]),
        val_fraction in proptest::prop_oneof![-1.0f64..2.0, proptest::strategy::Just(f64::NAN)],
        seed in proptest::prelude::any::<u64>(),
        split_seed in proptest::prelude::any::<u64>(),
        max_memory in proptest::option::of(proptest::prop_oneof![0u64..(1 << 20), proptest::strategy::Just(u64::MAX)]),
    ) {
        static DATA: std::sync::OnceLock<Dir> = std::sync::OnceLock::new();
        let dir = DATA.get_or_init(data);
        let mut spec = small_spec(dir);
        spec["max_len"] = max_len.into();
        spec["shard_size"] = shard_size.into();
        spec["seed"] = seed.into();
        spec["split_seed"] = split_seed.into();
        if let Some(b) = bucket_size {
            spec["bucket_size"] = b.into();
        }
        if val_fraction.is_finite() {
            spec["val_fraction"] = val_fraction.into();
        }
        let Ok(spec) = serde_json::from_value::<dsc_compiler::CompileSpec>(spec) else {
            return Ok(()); // refused by the parser: an error, which is allowed
        };
        let out = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let target = out.path().join("cache");
        std::thread::spawn(move || {
            let opts = dsc_compiler::CompileOptions {
                out: target,
                force: false,
                max_memory,
                storage: Default::default(),
                progress: &dsc_compiler::NoProgress,
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dsc_compiler::compile(&spec, &opts)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }));
            let _ = tx.send(r.map_err(|_| "panicked"));
        });
        let r = rx.recv_timeout(std::time::Duration::from_secs(60));
        proptest::prop_assert!(r.is_ok(), "still compiling after a minute");
        proptest::prop_assert!(r.unwrap().is_ok(), "the compile panicked");
    }
}
