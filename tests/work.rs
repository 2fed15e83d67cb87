//! A partitioned compile's work folder under attack (issue 27): every work file a later stage
//! reads is checked, side files are held to what the scan read, a retried stage never mixes
//! the files of two attempts, and each problem is named with the command that fixes it.

use crate::util::*;
use std::path::{Path, PathBuf};

const N: usize = 2;

/// The README compile into `out` in small shards and buckets (the bucket size shapes shard
/// boundaries, so every step of one test uses one size).
fn args(out: &str) -> Vec<&str> {
    args_in(out, "16KiB")
}

fn args_in<'a>(out: &'a str, bucket: &'a str) -> Vec<&'a str> {
    icecube_args(
        out,
        &["--shard-size", "64KiB", "--bucket-size", bucket, "-q"],
    )
}

/// Runs `stage` of partition `i` of `N`, with `extra` flags.
fn stage(dir: &Path, stage: &str, i: usize, extra: &[&str]) -> Run {
    stage_in(dir, "16KiB", stage, i, extra)
}

fn stage_in(dir: &Path, bucket: &str, stage: &str, i: usize, extra: &[&str]) -> Run {
    let p = format!("{i}/{N}");
    let mut a = args_in("cache", bucket);
    a.extend_from_slice(&["--partition", &p, "--stage", stage]);
    a.extend_from_slice(extra);
    dsc(dir, &a)
}

fn all(dir: &Path, name: &str) {
    for i in 0..N {
        stage(dir, name, i, &[]).ok();
    }
}

fn work(dir: &Dir) -> PathBuf {
    dir.join(".cache.dsc-work")
}

/// Files under `dir` whose path relative to it ends with `suffix`, sorted.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = tree(dir)
        .into_keys()
        .filter(|k| k.ends_with(suffix))
        .map(|k| dir.join(k))
        .collect();
    out.sort();
    out
}

/// Changes one byte in the middle of `path`, keeping its size and modification time.
fn flip(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    rewrite_keeping_mtime(path, &bytes);
}

/// Rewrites `path` with `bytes`, its modification time kept (what size-and-time checks miss).
fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    std::fs::write(path, bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
}

/// A part file with one digit of its JSON changed: still JSON, with another number.
fn change_a_digit(path: &Path) {
    let mut text = std::fs::read(path).unwrap();
    let at = text.len() / 2
        + text[text.len() / 2..]
            .iter()
            .position(|b| (b'1'..=b'8').contains(b))
            .expect("a digit in the second half");
    text[at] += 1;
    rewrite_keeping_mtime(path, &text);
}

fn plain(dir: &Dir) {
    dsc(dir.path(), &args("plain")).ok();
}

fn assert_same_cache(dir: &Dir, a: &str, b: &str) {
    let (ta, tb) = (tree(&dir.join(a)), tree(&dir.join(b)));
    assert_eq!(ta, tb, "{a} and {b} differ");
}

#[test]
fn a_changed_byte_in_any_work_file_is_named_with_what_to_rerun() {
    // Each case: the stages run so far, the file changed, the command that must refuse it and
    // what its error must say.
    type Case = (
        &'static str,
        fn(&Dir) -> PathBuf,
        &'static str,
        &'static [&'static str],
    );
    let cases: Vec<Case> = vec![
        (
            "scan",
            |d| files_ending(&work(d).join("scan"), ".spill")[0].clone(),
            "fit",
            &["spill", "checksum", "--stage scan"],
        ),
        (
            "fit",
            |d| files_ending(&work(d).join("fit"), ".spill")[0].clone(),
            "write",
            &["values", "checksum", "--stage fit"],
        ),
        (
            "write",
            |d| files_ending(&work(d).join("shards"), ".safetensors")[0].clone(),
            "merge",
            &["shards/", "checksum", "--stage write"],
        ),
        (
            "write",
            |d| work(d).join("write-1-of-2.json"),
            "merge",
            &[
                "write-1-of-2.json",
                "checksum",
                "--partition 1/2 --stage write",
            ],
        ),
        (
            "scan",
            |d| work(d).join("scan-0-of-2.json"),
            "fit",
            &[
                "scan-0-of-2.json",
                "checksum",
                "--partition 0/2 --stage scan",
            ],
        ),
    ];
    for (done, target, then, needles) in cases {
        let dir = Dir::new();
        gen_icecube(&dir, 2, 100);
        for s in ["scan", "fit", "write"] {
            all(dir.path(), s);
            if s == done {
                break;
            }
        }
        let path = target(&dir);
        if path.extension().is_some_and(|e| e == "json") {
            change_a_digit(&path);
        } else {
            flip(&path);
        }
        let err = if then == "merge" {
            dsc(dir.path(), &["merge", "cache"]).fails(2)
        } else {
            // The changed byte lies in some partition's share: that one must refuse.
            let errs: Vec<String> = (0..N)
                .map(|i| stage(dir.path(), then, i, &[]))
                .filter(|r| r.code() != 0)
                .map(|r| r.fails(2))
                .collect();
            assert!(
                !errs.is_empty(),
                "{done} then {then}: every partition passed"
            );
            errs.join("\n")
        };
        for n in needles {
            assert!(
                err.contains(n),
                "{done} then {then}: missing {n:?} in {err}"
            );
        }
        assert!(!dir.join("cache").exists());
    }
}

#[test]
fn a_corrupt_plan_is_an_error_for_status_and_every_stage() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 60);
    stage(dir.path(), "scan", 0, &[]).ok();
    let plan = work(&dir).join("plan.json");
    change_a_digit(&plan);
    let err = dsc(dir.path(), &["status", "cache"]).fails(2);
    assert!(
        err.contains("plan.json") && err.contains("checksum"),
        "{err}"
    );
    let err = stage(dir.path(), "scan", 1, &[]).fails(2);
    assert!(err.contains("plan.json"), "{err}");
}

#[test]
fn a_side_file_changed_after_the_scan_is_refused_whatever_its_size_and_time() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 80);
    all(dir.path(), "scan");
    // One coordinate of the joined geometry, another digit: the same size, the same mtime.
    let csv = dir.join("data/sensor_geometry.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    let changed = text.replacen("0.19,", "0.18,", 1);
    assert_ne!(text, changed);
    rewrite_keeping_mtime(&csv, changed.as_bytes());
    let err = stage(dir.path(), "fit", 0, &[]).fails(2);
    assert!(
        err.contains("sensor_geometry.csv") && err.contains("changed since the scan"),
        "{err}"
    );
    // Put back, the stages continue and the cache is the plain compile's.
    rewrite_keeping_mtime(&csv, text.as_bytes());
    all(dir.path(), "fit");
    all(dir.path(), "write");
    dsc(dir.path(), &["merge", "cache", "-q"]).ok();
    plain(&dir);
    assert_same_cache(&dir, "cache", "plain");
}

#[test]
fn a_retried_scan_killed_before_its_part_never_mixes_two_attempts() {
    // Issue 27: a scan retried with another --max-memory and killed between its spill renames
    // and its part rename left the first attempt's part over the second attempt's spill files:
    // `dsc status` said the scan was done, then fit panicked or aborted on a huge allocation.
    let dir = Dir::new();
    // Rows files larger than a tight budget's read share (1 MiB), so that the two attempts
    // cut them into other spill files.
    gen_icecube(&dir, 2, 1500);
    let bucket = "1MiB";
    let all = |dir: &Path, name: &str| {
        for i in 0..N {
            stage_in(dir, bucket, name, i, &[]).ok();
        }
    };
    all(dir.path(), "scan");
    // The second attempt, run to the end in a copy of the work folder; its spill files (and
    // not its part) then copied back: what a kill right before the part's rename leaves.
    let copy = dir.join("retry");
    copy_tree(&work(&dir), &copy.join(".cache.dsc-work"));
    // The same inputs (same paths, sizes and times), or the copy's plan would differ.
    std::os::unix::fs::symlink(dir.join("data"), copy.join("data")).unwrap();
    stage_in(&copy, bucket, "scan", 1, &["--max-memory", "2MiB"]).ok();
    for f in files_ending(&copy.join(".cache.dsc-work/scan"), ".spill") {
        let name = f.file_name().unwrap();
        std::fs::copy(&f, work(&dir).join("scan").join(name)).unwrap();
    }
    all(dir.path(), "fit");
    all(dir.path(), "write");
    dsc(dir.path(), &["merge", "cache", "-q"]).ok();
    dsc(dir.path(), &args_in("plain", bucket)).ok();
    assert_same_cache(&dir, "cache", "plain");
}

#[test]
fn a_stage_that_fails_on_a_full_disk_leaves_no_temporary_files() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 80);
    all(dir.path(), "scan");
    let p = format!("0/{N}");
    let mut a = args("cache");
    a.extend_from_slice(&["--partition", &p, "--stage", "fit"]);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
    cmd.args(&a).current_dir(dir.path());
    // SAFETY: between fork and exec only setrlimit, which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let rl = libc::rlimit {
                rlim_cur: 2 << 10,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = files_ending(&work(&dir), ".tmp");
    assert!(left.is_empty(), "{left:?}");
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, bytes) in tree(from) {
        let p = to.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

#[test]
fn a_missing_work_file_is_named_with_the_command_that_remakes_it() {
    // Issue 27: a missing spill file was named without the command that would make it.
    let dir = Dir::new();
    gen_icecube(&dir, 2, 100);
    all(dir.path(), "scan");
    for f in files_ending(&work(&dir).join("scan"), ".spill") {
        std::fs::remove_file(f).unwrap();
    }
    let err = stage(dir.path(), "fit", 0, &[]).fails(2);
    assert!(
        err.contains(".spill") && err.contains("--stage scan"),
        "{err}"
    );
    all(dir.path(), "scan");
    all(dir.path(), "fit");
    for f in files_ending(&work(&dir).join("fit"), ".spill") {
        std::fs::remove_file(f).unwrap();
    }
    let err = stage(dir.path(), "write", 0, &[]).fails(2);
    assert!(
        err.contains("values") && err.contains("--stage fit"),
        "{err}"
    );
}
