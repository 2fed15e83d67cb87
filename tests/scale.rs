//! Compiles at any scale: bounded memory, partitioned stages and `dsc merge` give the cache a
//! plain compile gives, byte for byte, for contiguous keys (IceCube batches) and for keys
//! scattered across files (customer transactions).

use crate::util::*;
use std::path::Path;

fn ice_args(out: &str) -> Vec<String> {
    icecube_args(out, &["--shard-size", "256KiB"])
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn run(dir: &Path, args: &[String], extra: &[&str]) -> Run {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(extra);
    dsc(dir, &all)
}

/// Runs every stage of a compile in `n` partitions (partitions of a stage in a scrambled order,
/// as a scheduler might), then `dsc merge`.
fn partitioned(dir: &Path, args: &[String], out: &str, n: usize, extra: &[&str]) {
    for stage in ["scan", "fit", "write"] {
        for i in (0..n).rev() {
            let p = format!("{i}/{n}");
            let mut e = extra.to_vec();
            e.extend_from_slice(&["--partition", &p, "--stage", stage, "-q"]);
            run(dir, args, &e).ok();
        }
    }
    dsc(dir, &["merge", out, "-q"]).ok();
    assert!(!dir.join(format!(".{out}.dsc-work")).exists(), "work left");
}

fn assert_same(dir: &Dir, a: &str, b: &str) {
    let (ta, tb) = (tree(&dir.join(a)), tree(&dir.join(b)));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "{a} and {b} hold other files"
    );
    for (name, bytes) in &ta {
        assert!(tb[name] == *bytes, "{a}/{name} and {b}/{name} differ");
    }
}

#[test]
fn one_cache_whatever_the_budget_the_threads_and_the_partitions() {
    let dir = Dir::new();
    gen_icecube(&dir, 4, 80);
    gen_sequences(&dir, 400, 4);
    // Small buckets, so that every way of computing has many buckets to split and merge.
    let bucket = ["--bucket-size", "16KiB"];
    for (name, args) in [
        ("ice", ice_args as fn(&str) -> Vec<String>),
        ("seq", sequences_args),
    ] {
        let plain = format!("{name}-plain");
        run(dir.path(), &args(&plain), &bucket).ok();
        let manifest = manifest(&dir.join(&plain));
        assert!(
            manifest["shards"].as_array().unwrap().len() > 8,
            "{name}: few buckets"
        );
        assert_eq!(manifest["format_version"], 2);

        let tight = format!("{name}-tight");
        let mut extra = bucket.to_vec();
        extra.extend_from_slice(&["--max-memory", "8MiB"]);
        let tight_args = args(&tight);
        let mut one = vec!["--threads", "1"];
        one.extend(tight_args.iter().map(String::as_str));
        one.extend_from_slice(&extra);
        dsc(dir.path(), &one).ok();
        assert_same(&dir, &plain, &tight);

        for n in [2, 3] {
            let out = format!("{name}-p{n}");
            partitioned(dir.path(), &args(&out), &out, n, &bucket);
            assert_same(&dir, &plain, &out);
        }
        // More partitions than rows files and than some stages have work for.
        let out = format!("{name}-p7");
        partitioned(dir.path(), &args(&out), &out, 7, &bucket);
        assert_same(&dir, &plain, &out);
    }
}

/// Every fifth customer of `gen_sequences` data, as a validation key list.
fn write_val_keys(dir: &Dir) -> String {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    let file = std::fs::File::open(dir.join("seq/customers.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut keys = String::new();
    let mut i = 0;
    for batch in reader {
        let batch = batch.unwrap();
        let ids = batch.column_by_name("customer_id").unwrap();
        for k in ids.as_primitive::<Int64Type>().values() {
            if i % 5 == 0 {
                keys.push_str(&format!("{k}\n"));
            }
            i += 1;
        }
    }
    std::fs::write(dir.join("val-keys.txt"), keys).unwrap();
    "val-keys.txt".into()
}

#[test]
fn the_mostlyai_profile_gives_one_cache_whatever_the_budget_and_the_partitions() {
    let dir = Dir::new();
    gen_sequences(&dir, 400, 4);
    let val = write_val_keys(&dir);
    let args = |out: &str| -> Vec<String> {
        [
            "compile",
            "seq/transactions",
            "--key",
            "customer_id",
            "--context",
            "seq/customers.parquet",
            "--profile",
            "mostlyai",
            "--partitions",
            "2",
            "--val-keys",
            &val,
            "--seed",
            "5",
            "--bucket-size",
            "16KiB",
            "--out",
            out,
        ]
        .map(String::from)
        .to_vec()
    };
    run(dir.path(), &args("plain"), &["-q"]).ok();
    let m = manifest(&dir.join("plain"));
    assert!(m["shards"].as_array().unwrap().len() > 8, "few buckets");
    assert!(dir.join("plain/tgt-stats.json").is_file());
    let mut tight = vec!["--threads", "1"];
    let tight_args = args("tight");
    tight.extend(tight_args.iter().map(String::as_str));
    tight.extend_from_slice(&["--max-memory", "2MiB", "-q"]);
    dsc(dir.path(), &tight).ok();
    assert_same(&dir, "plain", "tight");
    for n in [2, 3] {
        let out = format!("p{n}");
        partitioned(dir.path(), &args(&out), &out, n, &[]);
        assert_same(&dir, "plain", &out);
    }
}

#[test]
fn the_default_bucket_size_gives_the_same_cache_in_one_or_many_partitions() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 60);
    run(dir.path(), &ice_args("plain"), &[]).ok();
    partitioned(dir.path(), &ice_args("parts"), "parts", 3, &[]);
    assert_same(&dir, "plain", "parts");
}

#[test]
fn partition_auto_reads_slurm_and_kubernetes_environments() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 60);
    run(dir.path(), &ice_args("plain"), &["--bucket-size", "16KiB"]).ok();
    let stage = |out: &str, stage: &str, partition: &str, env: &[(&str, String)]| {
        let mut args = ice_args(out);
        args.extend(
            [
                "--bucket-size",
                "16KiB",
                "--partition",
                partition,
                "--stage",
                stage,
                "-q",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
            .args(&args)
            .current_dir(dir.path())
            .env_remove("SLURM_ARRAY_TASK_ID")
            .env_remove("JOB_COMPLETION_INDEX")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A Slurm job array numbered from 1 (`--array=1-2`).
    for s in ["scan", "fit", "write"] {
        for id in [1, 2] {
            stage(
                "slurm",
                s,
                "auto",
                &[
                    ("SLURM_ARRAY_TASK_ID", id.to_string()),
                    ("SLURM_ARRAY_TASK_MIN", "1".into()),
                    ("SLURM_ARRAY_TASK_COUNT", "2".into()),
                ],
            );
        }
    }
    dsc(dir.path(), &["merge", "slurm"]).ok();
    assert_same(&dir, "plain", "slurm");
    // A Kubernetes Indexed Job of 3 completions.
    for s in ["scan", "fit", "write"] {
        for i in 0..3 {
            stage(
                "k8s",
                s,
                "auto/3",
                &[("JOB_COMPLETION_INDEX", i.to_string())],
            );
        }
    }
    dsc(dir.path(), &["merge", "k8s"]).ok();
    assert_same(&dir, "plain", "k8s");
    // Without either, `auto` says what it needs.
    let mut args = ice_args("none");
    args.extend(["--partition", "auto", "--stage", "scan"].map(String::from));
    let err = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(&args)
        .current_dir(dir.path())
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&err.stderr);
    assert_eq!(err.status.code(), Some(2), "{text}");
    assert!(
        text.contains("SLURM_ARRAY_TASK_ID") && text.contains("JOB_COMPLETION_INDEX"),
        "{text}"
    );
}

#[test]
fn missing_foreign_and_repeated_partitions() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 60);
    let args = ice_args("cache");
    let stage = |s: &str, p: &str| {
        run(
            dir.path(),
            &args,
            &[
                "--bucket-size",
                "16KiB",
                "--partition",
                p,
                "--stage",
                s,
                "-q",
            ],
        )
    };
    stage("scan", "1/2").ok();
    // A stage before its predecessor finished everywhere names the partition and what to run.
    let err = stage("fit", "0/2").fails(2);
    assert!(
        err.contains("partition 0/2 has not finished the scan stage")
            && err.contains("--partition 0/2 --stage scan"),
        "{err}"
    );
    let err = dsc(dir.path(), &["merge", "cache"]).fails(2);
    assert!(err.contains("has not finished the scan stage"), "{err}");
    assert!(!dir.join("cache").exists());
    // Another spec into the same output is refused, and so is another partition count.
    let err = run(
        dir.path(),
        &icecube_args("cache", &["--shard-size", "64KiB"])
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        &[
            "--bucket-size",
            "16KiB",
            "--partition",
            "0/2",
            "--stage",
            "scan",
        ],
    )
    .fails(2);
    assert!(
        err.contains("holds the work of another compile (another spec)"),
        "{err}"
    );
    let err = stage("scan", "0/3").fails(2);
    assert!(err.contains("2 partitions, not 3"), "{err}");
    // Repeated (retried, or started twice at once) tasks give the same cache.
    stage("scan", "0/2").ok();
    stage("scan", "0/2").ok();
    let status = dsc(dir.path(), &["status", "cache", "--json"]).ok();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["partitions"], 2, "{status}");
    assert_eq!(status["done"][0][1], serde_json::json!([0, 1]), "{status}");
    for p in ["0/2", "1/2"] {
        stage("fit", p).ok();
    }
    let twice: Vec<_> = (0..2)
        .map(|_| {
            let mut all = args.clone();
            all.extend(
                [
                    "--bucket-size",
                    "16KiB",
                    "--partition",
                    "0/2",
                    "--stage",
                    "write",
                    "-q",
                ]
                .map(String::from),
            );
            std::process::Command::new(env!("CARGO_BIN_EXE_dsc"))
                .args(&all)
                .current_dir(dir.path())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in twice {
        assert!(child.wait().unwrap().success());
    }
    stage("write", "1/2").ok();
    stage("write", "1/2").ok();
    // A merge that fails leaves every part in place: it runs again once the cause is gone.
    std::fs::create_dir(dir.join("cache")).unwrap();
    std::fs::write(dir.join("cache/notes.txt"), "mine").unwrap();
    let err = dsc(dir.path(), &["merge", "cache"]).fails(2);
    assert!(err.contains("already exists and is not empty"), "{err}");
    assert!(dir.join("cache/notes.txt").exists());
    dsc(dir.path(), &["merge", "cache", "--force"]).ok();
    dsc(dir.path(), &["verify", "cache"]).ok();
    run(dir.path(), &ice_args("plain"), &["--bucket-size", "16KiB"]).ok();
    assert_same(&dir, "plain", "cache");
    let status = dsc(dir.path(), &["status", "cache"]).ok();
    assert!(
        status.contains("a cache; no partitioned compile under way"),
        "{status}"
    );
}

#[test]
fn a_budget_too_small_for_one_bucket_says_so_and_leaves_nothing() {
    let dir = Dir::new();
    gen_icecube(&dir, 2, 200);
    let err = run(dir.path(), &ice_args("cache"), &["--max-memory", "1MiB"]).fails(2);
    assert!(
        err.contains("--max-memory 1.0 MiB is too small")
            && err.contains("needs about")
            && err.contains("--bucket-size"),
        "{err}"
    );
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("cache"))
        .collect();
    assert!(
        left.iter().all(|n| n.ends_with("dsc-lock")),
        "left behind: {left:?}"
    );
    // A smaller bucket fits the same budget.
    run(
        dir.path(),
        &ice_args("cache"),
        &["--max-memory", "1MiB", "--bucket-size", "32KiB"],
    )
    .ok();
}

/// The spec of the IceCube compile in `dir/dsc.toml` (with small buckets), and the plain cache
/// compiled from it.
fn spec_and_plain(dir: &Dir) {
    let mut args = ice_args("unused");
    args.extend(["--bucket-size", "16KiB", "--print-spec"].map(String::from));
    let spec = run(dir.path(), &args, &[]).ok();
    std::fs::write(dir.join("dsc.toml"), spec).unwrap();
    dsc(
        dir.path(),
        &["compile", "--spec", "dsc.toml", "--out", "plain"],
    )
    .ok();
}

#[test]
fn the_slurm_example_compiles_the_same_cache() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 60);
    spec_and_plain(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/slurm/compile.sbatch");
    // What Slurm does for `sbatch --array=0-1 compile.sbatch STAGE`, stage after stage.
    for stage in ["scan", "fit", "write"] {
        for id in 0..2 {
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg(stage)
                .current_dir(dir.path())
                .env("DSC_BIN", env!("CARGO_BIN_EXE_dsc"))
                .env("DSC_SPEC", "dsc.toml")
                .env("DSC_OUT", "slurm")
                .env("SLURM_ARRAY_TASK_ID", id.to_string())
                .env("SLURM_ARRAY_TASK_MIN", "0")
                .env("SLURM_ARRAY_TASK_COUNT", "2")
                .env("SLURM_CPUS_PER_TASK", "1")
                .env("SLURM_MEM_PER_NODE", "512")
                .env_remove("JOB_COMPLETION_INDEX")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{stage} {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    dsc(dir.path(), &["merge", "slurm"]).ok();
    assert_same(&dir, "plain", "slurm");
}

#[test]
fn the_kubernetes_example_compiles_the_same_cache() {
    let dir = Dir::new();
    gen_icecube(&dir, 3, 60);
    spec_and_plain(&dir);
    let yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/k8s/compile-job.yaml"),
    )
    .unwrap();
    // Each Job's container command, run as its pods would: `completions` times, with
    // JOB_COMPLETION_INDEX set, in the order of the documents (scan, fit, write, merge).
    let mut jobs = 0;
    for doc in yaml.split("\n---\n") {
        let command = doc
            .lines()
            .find_map(|l| l.trim().strip_prefix("command: "))
            .expect("every Job has a command");
        let command: Vec<String> = serde_json::from_str(command).unwrap();
        let completions: Option<usize> = doc
            .lines()
            .find_map(|l| l.trim().strip_prefix("completions: "))
            .map(|n| n.parse().unwrap());
        let work = format!("{}/", dir.path().display());
        let args: Vec<String> = command[1..]
            .iter()
            .map(|a| a.replace("/work/", &work))
            .collect();
        assert_eq!(command[0], "dsc");
        let indices: Vec<Option<usize>> = match completions {
            Some(n) => (0..n).map(Some).collect(),
            None => vec![None],
        };
        for index in indices {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dsc"));
            cmd.args(&args)
                .current_dir(dir.path())
                .env_remove("SLURM_ARRAY_TASK_ID")
                .env_remove("JOB_COMPLETION_INDEX");
            if let Some(i) = index {
                cmd.env("JOB_COMPLETION_INDEX", i.to_string());
            }
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{args:?} {index:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        jobs += 1;
    }
    assert_eq!(jobs, 4);
    assert_same(&dir, "plain", "cache");
}

#[test]
fn a_budget_is_printed_as_given_not_rounded_up() {
    // Issue 27: `--max-memory 1` (one byte) was printed as "1 MiB".
    let dir = Dir::new();
    gen_icecube(&dir, 2, 50);
    let err = run(dir.path(), &ice_args("cache"), &["--max-memory", "1"]).fails(2);
    assert!(err.contains("--max-memory 1 B is too small"), "{err}");
}
