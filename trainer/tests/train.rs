//! End-to-end tests of `dsc-train` on the CPU: data generated and compiled by dsc's own crates
//! (seeded), the binary run as a user runs it.

mod common;
#[allow(dead_code)]
#[path = "../../tests/util/s3.rs"]
mod s3;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_dsc-train");

/// Caches shared by the tests: generated and compiled once per test binary.
struct Fixture {
    _dir: tempfile::TempDir,
    /// The generated IceCube-like data and its cache.
    ice: PathBuf,
    icecube: PathBuf,
    sequences: PathBuf,
    /// Two caches of disjoint events of `ice` (its two files), L = 48 and 32, no categorical
    /// column (each file's sensors would give it a vocabulary of its own): for mixing.
    mix: [PathBuf; 2],
}

/// The fixture's compile of the IceCube-like data in `ice`.
fn icecube_spec(ice: &Path) -> Value {
    serde_json::json!({
        "rows": [ice.join("train/batch_*.parquet").display().to_string()],
        "key": "event_id",
        "order_by": "time",
        "context": ice.join("train_meta.parquet").display().to_string(),
        "targets": ["azimuth", "zenith"],
        "joins": [{"file": ice.join("sensor_geometry.csv").display().to_string(), "on": "sensor_id"}],
        "features": ["x", "y", "z", "time", "charge", "auxiliary"],
        "categorical": ["sensor_id"],
        // The README's encodings: x, y, z stay in metres (the trainer normalises them).
        "encode": {"time": "zscore", "charge": "log1p"},
        "max_len": 48,
        "val_fraction": 0.2,
        "seed": 5,
    })
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        let opts = dsc_gen::icecube::IcecubeOptions {
            files: 2,
            events_per_file: 3000,
            seed: 11,
            median_pulses: 24.0,
            ..Default::default()
        };
        dsc_gen::icecube::generate(&root.join("ice"), &opts).expect("generate icecube");
        let ice = root.join("ice");
        let icecube = root.join("ice-cache");
        compile(icecube_spec(&ice), &icecube);
        let mix = [(1, 48), (2, 32)].map(|(file, max_len)| {
            let mut spec = icecube_spec(&ice);
            spec["rows"] = serde_json::json!([ice
                .join(format!("train/batch_{file}.parquet"))
                .display()
                .to_string()]);
            spec["categorical"] = serde_json::json!([]);
            // A z-score is fitted on each cache's own train split: caches compiled apart mix
            // only with unfitted encodings (issue 39, class A).
            spec["encode"] = serde_json::json!({"charge": "log1p"});
            spec["max_len"] = max_len.into();
            spec["empty_contexts"] = "drop".into();
            let out = root.join(format!("ice-mix-{file}"));
            compile(spec, &out);
            out
        });

        let seq = root.join("seq");
        let sopts = dsc_gen::sequences::SequencesOptions {
            customers: 1500,
            files: 1,
            seed: 3,
            ..Default::default()
        };
        dsc_gen::sequences::generate(&seq, &sopts).expect("generate sequences");
        let spec = serde_json::json!({
            "rows": [seq.join("transactions/part-*.parquet").display().to_string()],
            "key": "customer_id",
            "order_by": "ts",
            "context": seq.join("customers.parquet").display().to_string(),
            "targets": ["churned"],
            "context_features": ["tenure_years"],
            "features": ["amount", "items", "is_refund", "ts"],
            "categorical": ["merchant_category", "channel"],
            "encode": {"amount": "minmax", "ts": "zscore", "items": "zscore"},
            "nan": "zero",
            "empty_contexts": "keep",
            "max_len": 32,
            // The latest transactions: recency is what predicts churn.
            "truncate": "tail",
            "val_fraction": 0.2,
            "seed": 5,
        });
        let sequences = root.join("seq-cache");
        compile(spec, &sequences);
        Fixture {
            _dir: dir,
            ice,
            icecube,
            sequences,
            mix,
        }
    })
}

fn compile(spec: Value, out: &Path) {
    let spec: dsc_compiler::CompileSpec = serde_json::from_value(spec).expect("spec");
    let opts = dsc_compiler::CompileOptions {
        out: out.to_path_buf(),
        force: false,
        max_memory: None,
        storage: Default::default(),
        progress: &dsc_compiler::NoProgress,
    };
    dsc_compiler::compile(&spec, &opts).expect("compile");
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "dsc-train failed:\n{}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("--json output is not JSON ({e}):\n{}", self.stdout))
    }
}

fn train(args: &[&str]) -> Run {
    train_with(args, Vec::new())
}

/// [`train`] with more environment variables.
fn train_with(args: &[&str], env: Vec<(String, String)>) -> Run {
    let out = Command::new(BIN)
        .args(args)
        // One libtorch thread per run: libtest runs a test per core, and two runs of two
        // spinning OpenMP threads each on two cores took 1.7x the time (211 s against 121 s).
        .env("OMP_NUM_THREADS", "1")
        .envs(env)
        .output()
        .expect("run dsc-train");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The small model every CPU test uses.
const SMALL: [&str; 8] = [
    "--dim",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--torch-threads",
    "1",
];

/// Runs the small model on `cache` with `flags` (whitespace-separated) and `--json`, writing into
/// a fresh folder; returns the summary and the folder.
fn small_run(cache: &Path, flags: &str) -> (Value, tempfile::TempDir) {
    json_run(cache, &format!("{flags} {}", SMALL.join(" ")))
}

/// [`small_run`] on a mix of `caches`, in this order.
fn small_run_on(caches: &[&str], flags: &str) -> (Value, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let outp = path(out.path());
    let mut args: Vec<&str> = Vec::new();
    for c in caches {
        args.extend(["--cache", c]);
    }
    args.extend(["--out", &outp, "--json"]);
    args.extend(flags.split_whitespace());
    args.extend(SMALL);
    (train(&args).json(), out)
}

/// Runs dsc-train on `cache` with `flags` only (defaults otherwise) and `--json`.
fn json_run(cache: &Path, flags: &str) -> (Value, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let (cache, outp) = (path(cache), path(out.path()));
    let mut args: Vec<&str> = vec!["--cache", &cache, "--out", &outp, "--json"];
    args.extend(flags.split_whitespace());
    (train(&args).json(), out)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn a_short_run_learns_the_direction_and_reports_every_field() {
    // The default network and learning rate, a smaller batch for the small data.
    let (s, out) = json_run(
        &fixture().icecube,
        "--task direction --epochs 4 --batch-size 64 --dim 64 --log-every 10",
    );
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 4);
    for e in epochs {
        for k in [
            "train_loss",
            "val_loss",
            "val_metric",
            "samples_per_s",
            "data_wait_share",
            "h2d_share",
            "compute_share",
        ] {
            assert!(f(&e[k]).is_finite(), "{k} in {e}");
        }
        let shares = f(&e["data_wait_share"]) + f(&e["h2d_share"]) + f(&e["compute_share"]);
        assert!(
            (shares - 1.0).abs() < 0.05,
            "shares of a CPU step add up to the step: {e}"
        );
    }
    let first = f(&epochs[0]["val_loss"]);
    let last = f(&epochs[3]["val_loss"]);
    assert!(last < first * 0.5, "validation loss {first} -> {last}");
    // A model that learned nothing points at random: a mean angular error of pi/2. This one
    // reached 0.34 rad when written (a plain PyTorch loop of the same size: about the same).
    assert!(f(&epochs[3]["val_metric"]) < 0.6, "{}", epochs[3]);
    assert!(s["device"].as_str().unwrap().starts_with("cpu"));
    // The loader's telemetry (issue 30, item 4): every micro-batch trained was handed over, full
    // (drop_last), from a hot cache that reads no compressed shard.
    let l = &s["loader"];
    let steps = s["optimizer_steps"].as_u64().unwrap();
    assert_eq!(l["batches"].as_u64(), Some(steps), "{l}");
    assert_eq!(l["contexts"].as_u64(), Some(steps * 64), "{l}");
    assert!(
        l["bytes"].as_u64().unwrap() > 0 && f(&l["wait_s"]) >= 0.0,
        "{l}"
    );
    assert!(l["waits"].as_u64().unwrap() <= steps, "{l}");
    assert_eq!(l["shard_reads"].as_u64(), Some(0), "{l}");
    // With PyTorch's CUDA wheel (the test script's .venv) libtorch_cuda.so is there and must be
    // loaded even on a machine without a GPU: `--as-needed` linking would have dropped it.
    let venv_cuda = std::env::var_os("VIRTUAL_ENV").and_then(|v| {
        let lib = Path::new(&v).join("lib");
        std::fs::read_dir(&lib).ok()?.flatten().find_map(|py| {
            let so = py.path().join("site-packages/torch/lib/libtorch_cuda.so");
            so.exists().then_some(so)
        })
    });
    if venv_cuda.is_some() {
        assert_eq!(s["cuda_backend"], "loaded", "{}", s["cuda_backend"]);
    } else {
        assert!(s["cuda_backend"].is_string());
    }
    assert!(out.path().join("last.ckpt").is_file());
    assert!(out.path().join("model.safetensors").is_file());
    assert!(out.path().join("summary.json").is_file());

    // The inputs were scaled from stats.json's train split, and the weights file says how:
    // x, y, z (metres, identity) by mean and std, charge (log1p) by its encoded median, time
    // (zscore) and auxiliary (bool) as stored.
    let w: std::collections::HashMap<String, Vec<f32>> =
        weights(&out.path().join("model.safetensors"))
            .into_iter()
            .collect();
    let col = |name: &str| split_column(&fixture().icecube, "train", name);
    let median = |name: &str| {
        let c = col(name);
        let q = c["numeric"]["quantiles"].as_array().unwrap();
        f(&q.iter().find(|q| f(&q["q"]) == 0.5).unwrap()["value"])
    };
    let (shift, scale) = (&w["x_norm.shift"], &w["x_norm.scale"]);
    for (i, name) in ["x", "y", "z"].into_iter().enumerate() {
        let c = col(name);
        let n = &c["numeric"];
        assert!(
            (f64::from(shift[i]) - f(&n["mean"])).abs() < 1e-3,
            "{name}: {shift:?}"
        );
        assert!(
            (f64::from(scale[i]) - f(&n["std"])).abs() < 1e-3,
            "{name}: {scale:?}"
        );
    }
    assert_eq!((shift[3], scale[3]), (0.0, 1.0), "time is z-scored already");
    assert!((f64::from(shift[4]) - median("charge").ln_1p()).abs() < 1e-5);
    assert!(scale[4] > 0.0 && scale[4] != 1.0);
    assert_eq!((shift[5], scale[5]), (0.0, 1.0), "auxiliary is a bool");
}

/// The statistics of column `name` in `split` of a cache's stats.json.
fn split_column(cache: &Path, split: &str, name: &str) -> Value {
    let stats: Value =
        serde_json::from_slice(&std::fs::read(cache.join("stats.json")).unwrap()).unwrap();
    let split = stats["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["split"] == split)
        .unwrap();
    split["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no column {name} in stats.json"))
        .clone()
}

#[test]
fn regression_learns_zenith_in_stored_units() {
    // Predicting the train mean gives a mean absolute error of about 0.84 std (zenith of
    // directions uniform on the sphere); this run reached 0.32 std when written.
    let (s, out) = json_run(
        &fixture().icecube,
        "--task regression --target zenith --epochs 4 --batch-size 64 --dim 64",
    );
    assert_eq!(s["metric"], "mae");
    let zenith = split_column(&fixture().icecube, "train", "zenith");
    let std = f(&zenith["numeric"]["std"]);
    let mae = f(&s["epochs"][3]["val_metric"]);
    assert!(mae < 0.6 * std, "val MAE {mae} rad, zenith std {std}");
    // The target scaling travels with the weights.
    let w: std::collections::HashMap<String, Vec<f32>> =
        weights(&out.path().join("model.safetensors"))
            .into_iter()
            .collect();
    assert!((f64::from(w["y_norm.scale"][0]) - std).abs() < 1e-4);
}

/// Reads every f32 tensor of a safetensors file, by name.
fn weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    common::f32_tensors(path)
}

/// The runs written into `a` and `b` ended with the same weights (to 1e-6).
fn assert_same_weights(a: &Path, b: &Path) {
    let wa = weights(&a.join("model.safetensors"));
    let wb = weights(&b.join("model.safetensors"));
    assert_eq!(wa.len(), wb.len());
    assert!(!wa.is_empty());
    for ((na, va), (nb, vb)) in wa.iter().zip(&wb) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            assert!((x - y).abs() <= 1e-6, "{na}: {x} vs {y}");
        }
    }
}

#[test]
fn a_mix_of_two_caches_learns_and_resumes_exactly() {
    let fx = fixture();
    let (a, b) = (path(&fx.mix[0]), path(&fx.mix[1]));
    let (straight, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (path(straight.path()), path(split.path()));
    let common = [
        "--cache",
        &a,
        "--cache",
        &b,
        "--weights",
        "0.7,0.3",
        "--task",
        "direction",
        "--epochs",
        "3",
        "--batch-size",
        "32",
        "--lr",
        "2e-3",
        "--json",
    ];
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = common.to_vec();
        args.extend(SMALL);
        args.extend(extra);
        train(&args).json()
    };
    let full = run(&["--out", &sa]);
    let epochs = full["epochs"].as_array().unwrap();
    // Evaluated on both caches' validation splits, each context once.
    let (first, last) = (f(&epochs[0]["val_loss"]), f(&epochs[2]["val_loss"]));
    assert!(last < first, "validation loss {first} -> {last}");
    assert!(f(&epochs[2]["val_metric"]) < 1.2, "{}", epochs[2]);
    let steps = full["optimizer_steps"].as_u64().unwrap();
    assert_eq!(full["loader"]["contexts"].as_u64(), Some(steps * 32));
    let stop = (steps / 2).to_string();
    run(&["--out", &sb, "--max-steps", &stop]);
    let ckpt = path(&split.path().join("last.ckpt"));
    let rest = train(&["--resume", &ckpt, "--json", "--torch-threads", "1"]).json();
    assert_eq!(rest["optimizer_steps"].as_u64().unwrap(), steps);
    assert_same_weights(straight.path(), split.path());
    // Mismatched caches and weights are refused before training.
    let ice = path(&fx.icecube);
    let refused = train(&["--cache", &a, "--cache", &ice, "--task", "direction"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("cannot be mixed"),
        "{}",
        refused.stderr
    );
    // Packed, the first cache the shorter (L = 32 then 48): positions run to the longest L
    // (dsc-train indexed past its position table, exit 101, before issue 39's class B).
    let t = pack_tokens(&fx.mix[1], 32).to_string();
    let packed = small_run_on(
        &[&b, &a],
        &format!("--task direction --pack {t} --max-steps 6"),
    );
    assert_eq!(packed.0["optimizer_steps"], 6);
    let refused = train(&["--cache", &a, "--cache", &b, "--weights", "1,2,3"]);
    assert!(
        refused.stderr.contains("--weights gives 3 weights"),
        "{}",
        refused.stderr
    );
}

/// A mix whose second cache enters by schedule (stages by optimizer step: out for the first
/// epoch, moved in linearly over the second, even from the third) trains the same weights
/// straight or stopped and resumed, logs its stages, reports the stage it ends in, and a resume
/// may amend the stages after its position but not one before.
#[test]
fn a_scheduled_mix_resumes_exactly_and_is_amended_at_a_checkpoint() {
    let fx = fixture();
    let (a, b) = (path(&fx.mix[0]), path(&fx.mix[1]));
    let dir = tempfile::tempdir().unwrap();
    let written = std::cell::Cell::new(0);
    let schedule = |stages: &str| {
        written.set(written.get() + 1);
        let file = dir.path().join(format!("s{}.json", written.get()));
        std::fs::write(&file, stages).unwrap();
        path(&file)
    };
    let probe = small_run_on(&[&a, &b], "--task direction --epochs 1 --batch-size 32").0;
    let per_epoch = probe["optimizer_steps"].as_u64().unwrap();
    let (e1, e2) = (per_epoch, 2 * per_epoch);
    let entering = schedule(&format!(
        r#"[{{"step": 0, "weights": [1, 0]}}, {{"step": {e1}, "weights": [1, 0]}},
            {{"step": {e2}, "weights": [0.5, 0.5], "linear": true}}]"#
    ));
    let (straight, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let run = |out: &tempfile::TempDir, extra: &[&str]| {
        let outp = path(out.path());
        let mut args = vec![
            "--cache",
            &a,
            "--cache",
            &b,
            "--schedule",
            &entering,
            "--task",
            "direction",
            "--epochs",
            "3",
            "--batch-size",
            "32",
            "--out",
            &outp,
        ];
        args.extend(SMALL);
        args.extend(extra);
        train(&args)
    };
    let full = run(&straight, &[]);
    // Logged as they change (the summary's line has no "at sample"): each stage as it starts
    // (stage 1 with the ramp's first step towards stage 2).
    let logged = |stderr: &str, stage: usize| {
        stderr
            .lines()
            .filter(|l| {
                l.starts_with(&format!("mix: stage {stage} (")) && l.contains(") at sample ")
            })
            .count()
    };
    for stage in 0..3 {
        assert!(
            logged(&full.stderr, stage) >= 1,
            "stage {stage}: {}",
            full.stderr
        );
    }
    let summary: Value =
        serde_json::from_slice(&std::fs::read(straight.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["mix"]["stage"], 2, "{}", summary["mix"]);
    let realised = summary["mix"]["realised"][1].as_f64().unwrap();
    assert!((realised - 0.5).abs() < 0.02, "{}", summary["mix"]);
    let stop = (per_epoch + per_epoch / 2).to_string();
    run(&split, &["--max-steps", &stop]);
    let ckpt = path(&split.path().join("last.ckpt"));
    let rest = train(&["--resume", &ckpt, "--torch-threads", "1"]);
    assert_eq!(rest.code, 0, "{}", rest.stderr);
    assert_same_weights(straight.path(), split.path());
    // Amended at the checkpoint: the ramp's end may not move, a later stage may come.
    let amended = tempfile::tempdir().unwrap();
    run(&amended, &["--max-steps", &stop]);
    let ckpt = path(&amended.path().join("last.ckpt"));
    let moved = schedule(&format!(
        r#"[{{"step": 0, "weights": [1, 0]}}, {{"step": {e1}, "weights": [1, 0]}},
            {{"step": {}, "weights": [0.5, 0.5], "linear": true}}]"#,
        e2 + 1
    ));
    let refused = train(&[
        "--resume",
        &ckpt,
        "--schedule",
        &moved,
        "--torch-threads",
        "1",
    ]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("stage 2 differs before"),
        "{}",
        refused.stderr
    );
    let later = schedule(&format!(
        r#"[{{"step": 0, "weights": [1, 0]}}, {{"step": {e1}, "weights": [1, 0]}},
            {{"step": {e2}, "weights": [0.5, 0.5], "linear": true}},
            {{"step": {}, "weights": [0, 1]}}]"#,
        e2 + per_epoch / 2
    ));
    let taken = train(&[
        "--resume",
        &ckpt,
        "--schedule",
        &later,
        "--epochs",
        "4",
        "--torch-threads",
        "1",
    ]);
    assert_eq!(taken.code, 0, "{}", taken.stderr);
    assert!(logged(&taken.stderr, 3) >= 1, "{}", taken.stderr);
}

#[test]
fn a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one() {
    let fx = fixture();
    let cache = path(&fx.icecube);
    let (straight, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (path(straight.path()), path(split.path()));
    // Dropout, accumulation and a mid-epoch stop: each would break exactness if its state were
    // not saved (RNG, partial accumulation, loader position).
    let common = [
        "--cache",
        &cache,
        "--task",
        "direction",
        "--epochs",
        "2",
        "--batch-size",
        "32",
        "--accumulate",
        "2",
        "--dropout",
        "0.1",
        "--lr",
        "2e-3",
        "--log-every",
        "7",
        "--json",
    ];
    let mut args: Vec<&str> = common.to_vec();
    args.extend(SMALL);
    args.extend(["--out", &a]);
    let full = train(&args).json();
    let total = full["optimizer_steps"].as_u64().unwrap();
    let per_epoch = full["epochs"][0]["steps"].as_u64().unwrap();
    let stop = (per_epoch + per_epoch / 2).to_string();

    let mut args: Vec<&str> = common.to_vec();
    args.extend(SMALL);
    args.extend(["--out", &b, "--max-steps", &stop]);
    let first = train(&args).json();
    assert_eq!(first["optimizer_steps"].as_u64().unwrap().to_string(), stop);
    let ckpt = path(&split.path().join("last.ckpt"));
    // Without --out, a resumed run writes into its checkpoint's folder.
    let rest = train(&["--resume", &ckpt, "--json", "--torch-threads", "1"]).json();
    assert_eq!(rest["optimizer_steps"].as_u64().unwrap(), total);
    assert_eq!(
        rest["epochs"].as_array().unwrap().len(),
        2,
        "history survives the restart"
    );

    assert_same_weights(straight.path(), split.path());
    // The same validation numbers, too.
    let (va, vb) = (
        &full["epochs"][1]["val_loss"],
        &rest["epochs"][1]["val_loss"],
    );
    assert!((f(va) - f(vb)).abs() < 1e-6, "{va} vs {vb}");
}

/// The device, precision and trim multiple a run chose from its machine are in its checkpoint,
/// and a resume keeps them: a run recorded on CUDA is not silently continued on the CPU (or a
/// CPU run on CUDA in bf16, as a GPU machine did before), and one moved by --device says so.
#[test]
fn a_resume_keeps_the_device_and_precision_its_run_chose() {
    let fx = fixture();
    let (_, out) = small_run(
        &fx.icecube,
        "--task direction --batch-size 32 --max-steps 2",
    );
    let ckpt = out.path().join("last.ckpt");
    let bytes = std::fs::read(&ckpt).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let position: Value =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["dsc_train"]).unwrap();
    let config = &position["config"];
    let device = if tch::Cuda::is_available() {
        "cuda:0"
    } else {
        "cpu"
    };
    assert_eq!(config["device"], device, "{config}");
    let (amp, multiple) = if device == "cpu" {
        ("none", 1)
    } else {
        ("bf16", 16)
    };
    assert_eq!(
        (config["amp"].as_str(), config["trim_multiple"].as_u64()),
        (Some(amp), Some(multiple))
    );
    if tch::Cuda::is_available() {
        return; // the rest needs a machine without CUDA
    }
    // As a GPU machine would have recorded it.
    let moved = out.path().join("cuda.ckpt");
    edit_config(&ckpt, &moved, "device", "cuda:0".into());
    let refused = train(&["--resume", &path(&moved), "--max-steps", "3", "--json"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("trained on cuda:0") && refused.stderr.contains("--device cpu"),
        "{}",
        refused.stderr
    );
    let asked = train(&[
        "--resume",
        &path(&moved),
        "--max-steps",
        "3",
        "--json",
        "--device",
        "cpu",
    ]);
    assert_eq!(asked.code, 0, "{}", asked.stderr);
    assert!(
        asked
            .stderr
            .contains("resuming with device cpu (the checkpoint's run had cuda:0)"),
        "{}",
        asked.stderr
    );
    assert_eq!(asked.json()["amp"], "none");
}

#[test]
fn one_batch_is_overfit_by_over_ninety_percent_with_the_defaults() {
    let out = tempfile::tempdir().unwrap();
    let (cache, outp) = (path(&fixture().icecube), path(out.path()));
    let run = train(&[
        "--cache",
        &cache,
        "--out",
        &outp,
        "--json",
        "--task",
        "direction",
        "--overfit-batch",
    ]);
    let s = run.json();
    assert_eq!(s["overfit_passed"], Value::Bool(true), "{s}");
    let steps = s["steps"].as_array().unwrap();
    let logged: Vec<u64> = steps
        .iter()
        .map(|st| st["step"].as_u64().unwrap())
        .collect();
    // Step 1, then every 50th (--log-every), stopping at the first window that passes.
    assert_eq!(logged[0], 1);
    assert!(logged[1..].iter().all(|&n| n % 50 == 0), "{logged:?}");
    assert_eq!(s["optimizer_steps"].as_u64(), logged.last().copied());
    let (a, b) = (
        f(&steps[0]["train_loss"]),
        f(&steps[steps.len() - 1]["train_loss"]),
    );
    assert!(b < 0.1 * a, "{a} -> {b}");
    assert!(run.stderr.contains("PASS"), "{}", run.stderr);
}

#[test]
fn a_gru_learns_the_direction_too() {
    let (s, _out) = json_run(
        &fixture().icecube,
        "--task direction --model gru --dim 64 --epochs 4 --batch-size 64 --lr 3e-3",
    );
    let e = &s["epochs"][3];
    assert!(f(&e["val_metric"]) < 0.8, "{e}");
}

#[test]
fn without_normalisation_raw_metres_stall_the_network() {
    // The control for the test above: the same run on the stored values. If this learned as
    // well, the cache would not need the trainer's scaling and the tests above would prove less.
    let (s, _out) = json_run(
        &fixture().icecube,
        "--task direction --model gru --dim 64 --epochs 4 --batch-size 64 --lr 3e-3 \
         --no-normalise",
    );
    let e = &s["epochs"][3];
    assert!(f(&e["val_metric"]) > 1.0, "{e}");
}

#[test]
fn training_reads_a_value_back_once_per_logged_window_only() {
    let (s, _out) = small_run(
        &fixture().icecube,
        "--task direction --batch-size 32 --max-steps 23 --log-every 5",
    );
    assert_eq!(s["optimizer_steps"], 23);
    assert_eq!(s["readbacks"]["training"], 23 / 5, "{}", s["readbacks"]);
    // The CPU has no events: nothing else stops the host (on CUDA: a slot's copy per step and
    // the timing of each logged window, see `Readbacks::event_waits`).
    assert_eq!(s["readbacks"]["event_waits"], 0, "{}", s["readbacks"]);
    assert_eq!(s["steps"].as_array().unwrap().len(), 23 / 5);
}

/// Host reads of device values hide in many spellings; only `readback.rs` may use them, so that
/// its counters (checked above) see every one.
#[test]
fn no_module_but_readback_reads_device_values() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let forbidden = [
        "double_value(",
        "int64_value(",
        "f64::try_from(",
        "f32::try_from(",
        "i64::try_from(",
        "Vec::<f32>::try_from",
        "Vec::<f64>::try_from",
        "Vec::<i64>::try_from",
        "Vec::try_from(",
        "copy_data(",
        "copy_data_u8(",
        "to_device(Device::Cpu)",
        ".item(",
        "is_nonzero(",
        "equal(",
        "allclose(",
    ];
    let mut files = Vec::new();
    let mut dirs = vec![src];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().unwrap() != "readback.rs" {
                files.push(p);
            }
        }
    }
    let mut checked = 0;
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for f in forbidden {
            assert!(
                !code.contains(f),
                "{} reads a device value with {f}",
                p.display()
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 18,
        "scanned the trainer's modules, model/ included"
    );
}

#[test]
fn a_gru_classifies_churn_on_the_sequence_data() {
    let (s, _out) = small_run(
        &fixture().sequences,
        "--task classification --model gru --epochs 4 --batch-size 64 --lr 3e-3",
    );
    assert_eq!(s["model"], "gru");
    assert_eq!(s["metric"], "accuracy");
    // Chance is always answering the validation split's majority class.
    let churned = split_column(&fixture().sequences, "val", "churned");
    let rate = f(&churned["numeric"]["mean"]);
    let chance = rate.max(1.0 - rate);
    let acc = f(&s["epochs"][3]["val_metric"]);
    assert!(acc > chance + 0.08, "accuracy {acc}, chance {chance}");
}

#[test]
fn regression_with_fp16_loss_scaling_runs_on_the_cpu() {
    let (s, _out) = small_run(
        &fixture().icecube,
        "--task regression --target zenith --amp fp16 --batch-size 64 --max-steps 10 \
         --log-every 5",
    );
    assert_eq!(s["amp"], "fp16");
    assert!(s["steps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|st| f(&st["train_loss"]).is_finite()));
}

#[test]
fn find_batch_size_reports_each_size_tried() {
    let (s, _out) = small_run(
        &fixture().icecube,
        "--task direction --find-batch-size --max-batch-size 64",
    );
    let sizes: Vec<u64> = s["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![16, 32, 64]);
    assert_eq!(s["largest"], 64);
    assert!(s["trials"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| f(&t["samples_per_s"]) > 0.0));
}

#[test]
fn bad_input_is_named_in_the_error() {
    let fx = fixture();
    let r = train(&["--cache", "/nonexistent/cache", "--task", "direction"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("/nonexistent/cache"), "{}", r.stderr);

    let seq = path(&fx.sequences);
    let r = train(&["--cache", &seq, "--task", "direction"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("azimuth"), "{}", r.stderr);

    let ice = path(&fx.icecube);
    let r = train(&[
        "--cache",
        &ice,
        "--task",
        "regression",
        "--target",
        "energy",
    ]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("energy") && r.stderr.contains("zenith"),
        "{}",
        r.stderr
    );

    let r = train(&[
        "--cache",
        &ice,
        "--task",
        "classification",
        "--target",
        "zenith",
    ]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("not a class number"), "{}", r.stderr);

    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("last.ckpt");
    std::fs::write(&bogus, b"not a checkpoint").unwrap();
    let r = train(&["--resume", &path(&bogus)]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("last.ckpt"), "{}", r.stderr);

    let r = train(&["--cache", &ice, "--device", "cuda:7"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("cuda:7"), "{}", r.stderr);

    // Issue 52 C19: one rule for every front end: no batch ahead, and weights of one cache,
    // are refused (0 was taken as 1, and one weight trained).
    for flags in [&["--host-buffers", "0"][..], &["--weights", "1"]] {
        let mut args = vec!["--cache", &ice, "--task", "direction", "--max-steps", "1"];
        args.extend_from_slice(flags);
        let r = train(&args);
        assert_eq!(r.code, 2, "{flags:?}: {}", r.stderr);
        assert!(r.stderr.contains(flags[0]), "{}", r.stderr);
    }
    // Issue 54 (3): one meaning per name: the host buffers' old flag says their new one.
    let r = train(&["--cache", &ice, "--task", "direction", "--prefetch", "4"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--host-buffers 4") && r.stderr.contains("per loader thread"),
        "{}",
        r.stderr
    );
    // Issue 52 B5: libtorch's thread count is checked before it reaches libtorch (a panic
    // inside tch before).
    for n in ["0", "-3", "5000"] {
        let r = train(&["--cache", &ice, &format!("--torch-threads={n}")]);
        assert_eq!(r.code, 2, "--torch-threads {n}: {}", r.stderr);
        assert!(
            r.stderr.contains("--torch-threads") && !r.stderr.contains("panicked"),
            "{}",
            r.stderr
        );
    }
    // Issue 54 (3): `threads` means the loader's; libtorch's old flag names the new one.
    let r = train(&["--cache", &ice, "--task", "direction", "--threads", "2"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--torch-threads 2"), "{}", r.stderr);

    // A table of records has no steps for the reference sequence networks: said, not crashed.
    let records = dir.path().join("records");
    compile(
        serde_json::json!({
            "rows": [fx.ice.join("train_meta.parquet").display().to_string()],
            "features": ["azimuth"],
            "targets": ["zenith"],
        }),
        &records,
    );
    let r = train(&[
        "--cache",
        &path(&records),
        "--task",
        "regression",
        "--target",
        "zenith",
    ]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("table of records"), "{}", r.stderr);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).unwrap();
        }
    }
}

#[test]
fn resuming_on_a_changed_cache_is_refused() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    copy_dir(&fx.icecube, &cache);
    let (s, out) = small_run(&cache, "--task direction --batch-size 32 --max-steps 2");
    assert_eq!(s["optimizer_steps"], 2);
    // The same path now holds a cache compiled from other inputs.
    std::fs::remove_dir_all(&cache).unwrap();
    copy_dir(&fx.sequences, &cache);
    let ckpt = path(&out.path().join("last.ckpt"));
    let r = train(&["--resume", &ckpt]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("fingerprint"), "{}", r.stderr);
}

#[test]
fn a_held_out_test_split_is_evaluated_at_the_end_and_can_be_the_eval_split() {
    let fx = fixture();
    // Every fifth train key of the fixture's cache becomes the "official" test set.
    let cache = dsc_loader::Cache::open(&fx.icecube).unwrap();
    let opts = dsc_loader::LoaderOptions {
        order: dsc_loader::OrderSpec {
            shuffle: false,
            drop_last: false,
            ..Default::default()
        },
        batch_size: 100,
        ..Default::default()
    };
    let mut keys: Vec<i64> = Vec::new();
    for b in cache.loader(opts).unwrap() {
        keys.extend(b.unwrap().keys());
    }
    keys.sort_unstable();
    keys.dedup();
    let test: Vec<i64> = keys.iter().copied().step_by(5).collect();
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("test_ids.txt");
    let text: String = test.iter().map(|k| format!("{k}\n")).collect();
    std::fs::write(&ids, text).unwrap();
    let mut spec = icecube_spec(&fx.ice);
    spec["split_keys"] = serde_json::json!({"test": path(&ids)});
    let with_test = dir.path().join("cache");
    compile(spec, &with_test);

    let (j, _out) = small_run(
        &with_test,
        "--task direction --epochs 1 --batch-size 64 --eval-split test",
    );
    assert_eq!(j["eval_split"], "test");
    let evaluation = j["evaluation"].as_array().unwrap();
    let names: Vec<&str> = evaluation
        .iter()
        .map(|e| e["split"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["test", "val"]);
    assert_eq!(evaluation[0]["contexts"], test.len());
    // The epoch's number is the final model on the test split: the same weights, the same data.
    let epoch = f(&j["epochs"][0]["val_metric"]);
    assert!((epoch - f(&evaluation[0]["metric"])).abs() < 1e-6, "{j}");
    let m = dsc_loader::Manifest::read(&with_test).unwrap();
    assert_eq!(evaluation[1]["contexts"], m.split("val").unwrap().contexts);
    assert!(f(&evaluation[1]["metric"]).is_finite());

    let out = tempfile::tempdir().unwrap();
    let (c, o) = (path(&with_test), path(out.path()));
    let run = train(&["--cache", &c, "--out", &o, "--eval-split", "holdout"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("--eval-split holdout")
            && run.stderr.contains(r#"["train", "test", "val"]"#),
        "{}",
        run.stderr
    );
}

/// Tokens for packs of about `batch` contexts of `cache`'s train split: its mean stored length
/// times `batch` (at least the cache's L), so that an epoch has about the padded run's steps.
fn pack_tokens(cache: &Path, batch: usize) -> usize {
    let c = dsc_loader::Cache::open(cache).unwrap();
    let lengths = c.lengths("train").unwrap();
    let mean = lengths.iter().map(|&l| f64::from(l)).sum::<f64>() / lengths.len() as f64;
    ((batch as f64 * mean).round() as usize).max(c.manifest().max_len())
}

#[test]
fn packed_batches_learn_as_well_as_padded_ones() {
    let fx = fixture();
    // The transformer on directions: the validation error after the same epochs within 1.1x.
    let t = pack_tokens(&fx.icecube, 32);
    let (padded, _a) = small_run(&fx.icecube, "--task direction --epochs 3 --batch-size 32");
    let (packed, _b) = small_run(
        &fx.icecube,
        &format!("--task direction --epochs 3 --pack {t}"),
    );
    let err = |s: &Value| f(&s["epochs"][2]["val_metric"]);
    assert!(
        err(&packed) <= 1.1 * err(&padded),
        "packed {} vs padded {}",
        err(&packed),
        err(&padded)
    );
    assert!(err(&packed) < 1.2, "learns (nothing useful: about 1.57)");
    let steps = |s: &Value| f(&s["optimizer_steps"]);
    assert!((steps(&packed) - steps(&padded)).abs() <= 0.1 * steps(&padded));
    // The GRU over packed sequences: churn, cross-entropy within 1.1x, accuracy above chance.
    let t = pack_tokens(&fx.sequences, 64);
    let flags = "--task classification --model gru --epochs 4 --lr 3e-3";
    let (padded, _c) = small_run(&fx.sequences, &format!("{flags} --batch-size 64"));
    let (packed, _d) = small_run(&fx.sequences, &format!("{flags} --pack {t}"));
    let loss = |s: &Value| f(&s["epochs"][3]["val_loss"]);
    assert!(
        loss(&packed) <= 1.1 * loss(&padded),
        "packed {} vs padded {}",
        loss(&packed),
        loss(&padded)
    );
    let rate = f(&split_column(&fx.sequences, "val", "churned")["numeric"]["mean"]);
    let acc = f(&packed["epochs"][3]["val_metric"]);
    assert!(acc > rate.max(1.0 - rate) + 0.08, "accuracy {acc}");
}

#[test]
fn a_packed_run_resumes_with_the_weights_of_an_uninterrupted_one() {
    let fx = fixture();
    let (cache, t) = (path(&fx.icecube), pack_tokens(&fx.icecube, 32).to_string());
    let (straight, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (path(straight.path()), path(split.path()));
    let common = [
        "--cache",
        &cache,
        "--task",
        "direction",
        "--epochs",
        "2",
        "--pack",
        &t,
        "--log-every",
        "5",
        "--json",
    ];
    let run = |out: &str, extra: &[&str]| {
        let mut args: Vec<&str> = common.to_vec();
        args.extend(SMALL);
        args.extend(["--out", out]);
        args.extend(extra);
        train(&args).json()
    };
    let full = run(&a, &[]);
    let per_epoch = full["epochs"][0]["steps"].as_u64().unwrap();
    let stop = (per_epoch / 2).to_string();
    run(&b, &["--max-steps", &stop]);
    let ckpt = path(&split.path().join("last.ckpt"));
    let rest = train(&["--resume", &ckpt, "--json", "--torch-threads", "1"]).json();
    assert_eq!(rest["optimizer_steps"], full["optimizer_steps"]);
    assert_same_weights(straight.path(), split.path());
}

#[test]
fn resuming_on_a_cache_recompiled_with_another_seed_is_refused() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    copy_dir(&fx.icecube, &cache);
    let (_, out) = small_run(&cache, "--task direction --batch-size 32 --max-steps 2");
    // The same inputs compiled again with another shuffle seed: the inputs' fingerprint is the
    // same, the order the saved position counts in is not.
    std::fs::remove_dir_all(&cache).unwrap();
    let mut spec = icecube_spec(&fx.ice);
    spec["seed"] = 6.into();
    compile(spec, &cache);
    let ckpt = path(&out.path().join("last.ckpt"));
    let r = train(&["--resume", &ckpt]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("other shards") && r.stderr.contains("--seed"),
        "{}",
        r.stderr
    );
}

/// Issue 39, class F: a checkpoint's cache compressed in place (`dsc compress`) holds the same
/// shards: the resume was refused as if the cache had been recompiled with another seed. It
/// continues now, to the weights of a run on the hot cache throughout.
#[test]
fn a_run_resumes_on_its_cache_compressed_in_place() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    copy_dir(&fx.icecube, &cache);
    let flags = "--task direction --batch-size 32 --epochs 1 --log-every 2";
    let (full, straight) = small_run(&fx.icecube, flags);
    let stop = (full["optimizer_steps"].as_u64().unwrap() / 2).to_string();
    let (_, split) = small_run(&cache, &format!("{flags} --max-steps {stop}"));
    dsc_compiler::restore(
        &cache,
        dsc_compiler::Storage::Zstd { level: 3 },
        &dsc_compiler::NoProgress,
    )
    .unwrap();
    let ckpt = path(&split.path().join("last.ckpt"));
    let rest = train(&["--resume", &ckpt, "--json", "--torch-threads", "1"]).json();
    assert_eq!(rest["optimizer_steps"], full["optimizer_steps"]);
    assert_same_weights(straight.path(), split.path());
}

/// Issue 51: a checkpoint records the content id of the generation it read, and a resume
/// opens that generation after appends: the weights of the run that saw no append.
#[test]
fn a_run_resumes_on_its_generation_after_an_append() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    copy_dir(&fx.mix[0], &cache);
    let flags = "--task direction --batch-size 32 --epochs 1 --log-every 2";
    let (full, straight) = small_run(&fx.mix[0], flags);
    let stop = (full["optimizer_steps"].as_u64().unwrap() / 2).to_string();
    let (_, split) = small_run(&cache, &format!("{flags} --max-steps {stop}"));
    let new = dsc_compiler::AppendInputs {
        rows: vec![fx.ice.join("train/batch_2.parquet").display().to_string()],
        context: Some(fx.ice.join("train_meta.parquet").display().to_string()),
        joins: None,
        ..Default::default()
    };
    let opts = dsc_compiler::CompileOptions {
        out: cache.clone(),
        force: false,
        max_memory: None,
        storage: Default::default(),
        progress: &dsc_compiler::NoProgress,
    };
    dsc_compiler::append(&cache, &new, &opts).expect("append");
    let ckpt = path(&split.path().join("last.ckpt"));
    let rest = train(&["--resume", &ckpt, "--json", "--torch-threads", "1"]).json();
    assert_eq!(rest["optimizer_steps"], full["optimizer_steps"]);
    assert_same_weights(straight.path(), split.path());
    // A new run reads the last generation, twice the contexts; or the first, when asked.
    let (grown, _) = small_run(&cache, flags);
    let steps = |v: &Value| v["epochs"][0]["steps"].as_u64().unwrap();
    assert!(
        steps(&grown) > steps(&full) * 3 / 2,
        "{} vs {}",
        steps(&grown),
        steps(&full)
    );
    let (first, _) = small_run(&cache, &format!("{flags} --generation 1"));
    assert_eq!(steps(&first), steps(&full));
    // The same file again, replacing the keys it holds: the contexts it added are hidden and
    // stored anew. A resident split puts each live context at its stored position, so that it
    // trains to the weights of the host path.
    let again = dsc_compiler::AppendInputs {
        existing: dsc_compiler::Existing::Replace,
        ..new
    };
    dsc_compiler::append(&cache, &again, &opts).expect("append replacing");
    let (host, host_out) = small_run(&cache, &format!("{flags} --resident off"));
    let (on, on_out) = small_run(&cache, &format!("{flags} --resident on"));
    assert_eq!(steps(&host), steps(&grown));
    assert_eq!(on["resident"], true);
    assert_same_weights(host_out.path(), on_out.path());
}

/// Runs dsc-train with `args`, killed after `limit`: `None` when it had to be killed.
fn train_within(args: &[&str], limit: std::time::Duration) -> Option<Run> {
    let mut child = Command::new(BIN)
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run dsc-train");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    Some(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A copy of checkpoint `from` at `to` whose saved run configuration has `field` set to
/// `value` (a checkpoint is a file anyone can edit).
fn edit_config(from: &Path, to: &Path, field: &str, value: Value) {
    let bytes = std::fs::read(from).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = meta.metadata().clone().unwrap();
    let mut position: Value = serde_json::from_str(&meta["dsc_train"]).unwrap();
    position["config"][field] = value;
    meta.insert("dsc_train".into(), position.to_string());
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    safetensors::serialize_to_file(tensors, Some(meta), to).unwrap();
}

#[test]
fn a_checkpoint_with_hostile_numbers_is_refused_not_a_panic_or_a_hang() {
    let fx = fixture();
    let (_, out) = small_run(
        &fx.icecube,
        "--task direction --batch-size 32 --max-steps 1",
    );
    let ckpt = out.path().join("last.ckpt");
    let hostile: Vec<(&str, Value)> = vec![
        ("heads", 0.into()),
        ("heads", 3.into()),
        ("accumulate", 0.into()),
        ("log_every", 0.into()),
        ("checkpoint_every", 0.into()),
        ("dim", 1_000_000_000i64.into()),
        ("dim", (-16).into()),
        ("layers", 1_000_000.into()),
        ("batch_size", (1u64 << 40).into()),
        ("prefetch", 1_000_000_000_000u64.into()),
        ("dropout", 5.0.into()),
        ("lr", (-1.0).into()),
        ("pack", 0.into()),
        ("epochs", u64::MAX.into()),
    ];
    for (field, value) in hostile {
        let edited = out.path().join(format!("{field}.ckpt"));
        edit_config(&ckpt, &edited, field, value.clone());
        let limit = std::time::Duration::from_secs(60);
        let r = train_within(&["--resume", &path(&edited), "--json"], limit)
            .unwrap_or_else(|| panic!("{field} = {value}: still running after a minute"));
        assert_eq!(
            r.code, 2,
            "{field} = {value}: exit {}\n{}",
            r.code, r.stderr
        );
        assert!(
            !r.stderr.contains("panicked"),
            "{field} = {value}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains(&edited.display().to_string()) || r.stderr.contains("--batch-size"),
            "{field} = {value}: {}",
            r.stderr
        );
    }
}

#[test]
fn resuming_with_max_steps_already_reached_trains_nothing_more() {
    // Issue 27: a resume with --max-steps at or below the steps taken trained one more step.
    let fx = fixture();
    let (_, out) = small_run(
        &fx.icecube,
        "--task direction --batch-size 32 --max-steps 3",
    );
    let ckpt = path(&out.path().join("last.ckpt"));
    let r = train(&["--resume", &ckpt, "--max-steps", "3", "--json"]).json();
    assert_eq!(r["optimizer_steps"], 3, "{r}");
}

/// Bucketed batches on a GPU must not see a new shape every step (issue 28, item 2): with
/// `--trim-multiple` each batch's length climbs a ladder of a few sizes, the summary lists the
/// lengths the steps saw, and the padding added changes no arithmetic (masked steps).
#[test]
fn trim_multiple_gives_a_run_a_handful_of_batch_shapes() {
    let cache = &fixture().icecube;
    let flags = "--task direction --batch-size 32 --max-steps 30 --log-every 10 --bucket";
    let (exact, _o1) = small_run(cache, flags);
    let (rounded, _o2) = small_run(cache, &format!("{flags} --trim-multiple 16"));
    let lens = |s: &Value| -> Vec<u64> {
        let m = s["batch_lens"]
            .as_object()
            .expect("batch_lens in the summary");
        assert_eq!(
            m.values().map(|n| n.as_u64().unwrap()).sum::<u64>(),
            30,
            "{m:?}"
        );
        m.keys().map(|k| k.parse().unwrap()).collect()
    };
    // L = 48: the ladder of 16 is 16, 32, 48.
    let rounded_lens = lens(&rounded);
    assert!(
        rounded_lens.iter().all(|l| [16, 32, 48].contains(l)),
        "{rounded_lens:?}"
    );
    assert!(
        lens(&exact).len() > rounded_lens.len(),
        "{:?}",
        lens(&exact)
    );
    for (a, b) in exact["steps"]
        .as_array()
        .unwrap()
        .iter()
        .zip(rounded["steps"].as_array().unwrap())
    {
        let (a, b) = (f(&a["train_loss"]), f(&b["train_loss"]));
        assert!(
            (a - b).abs() <= 1e-3 * a.abs().max(1.0),
            "padding changed the loss: {a} vs {b}"
        );
    }
    // A packed run has one shape: the flag is refused there.
    let out = tempfile::tempdir().unwrap();
    let r = train(&[
        "--cache",
        &path(cache),
        "--out",
        &path(out.path()),
        "--task",
        "direction",
        "--pack",
        "512",
        "--trim-multiple",
        "16",
    ]);
    assert!(
        r.code != 0 && r.stderr.contains("--trim-multiple"),
        "{}",
        r.stderr
    );
}

/// `--resident on` (the train split on the device, each batch gathered there by index, what a
/// GPU run does by default) trains on the batches of the host path: the same weights, for
/// bucketed (rounded) and packed batches, here with the CPU as the device (issue 28, item 5).
#[test]
fn a_resident_split_trains_the_weights_of_the_host_path() {
    let cache = &fixture().icecube;
    for flags in [
        "--task direction --batch-size 32 --max-steps 12 --bucket --trim-multiple 8",
        "--task direction --pack 512 --max-steps 12",
    ] {
        let (host, host_out) = small_run(cache, &format!("{flags} --resident off"));
        let (kept, kept_out) = small_run(cache, &format!("{flags} --resident on"));
        assert_eq!(
            (host["resident"].as_bool(), kept["resident"].as_bool()),
            (Some(false), Some(true))
        );
        assert_eq!(host["optimizer_steps"], kept["optimizer_steps"]);
        assert_eq!(host["batch_lens"], kept["batch_lens"], "{flags}");
        assert_same_weights(host_out.path(), kept_out.path());
    }
}

/// Issue 38, item 3: `--graph` (fixed device buffers, the learning rate a device tensor, each
/// batch gathered from the resident split by one fixed index block; captured as CUDA graphs on
/// a GPU) runs the eager step's arithmetic: on the CPU, where the same step runs uncaptured, it
/// ends with the eager run's weights, padded (untrimmed) and packed, from the host path and
/// from a resident split, with accumulation; the summary says it was not captured, and why.
#[test]
fn a_captured_step_trains_the_weights_of_the_eager_one() {
    let cache = &fixture().icecube;
    for flags in [
        "--task direction --batch-size 32 --max-steps 12",
        "--task direction --batch-size 16 --accumulate 2 --max-steps 6 --resident on",
        "--task direction --pack 512 --max-steps 12 --resident on",
        "--task direction --pack 512 --accumulate 3 --max-steps 4",
    ] {
        let flags = format!("{flags} --log-every 2");
        let (eager, eager_out) = small_run(cache, &flags);
        let (graph, graph_out) = small_run(cache, &format!("{flags} --graph"));
        assert_eq!(eager["step"], "eager", "{flags}");
        assert_eq!(graph["step"], "uncaptured", "{flags}");
        let why = graph["graph_unavailable"].as_str().unwrap_or_default();
        assert!(why.contains("CUDA"), "{flags}: {why}");
        assert_eq!(eager["resident"], graph["resident"], "{flags}");
        assert_eq!(eager["optimizer_steps"], graph["optimizer_steps"]);
        let loss = |s: &Value| f(&s["steps"][1]["train_loss"]);
        assert!(
            (loss(&eager) - loss(&graph)).abs() <= 1e-5 * loss(&eager),
            "{flags}: {} vs {}",
            loss(&eager),
            loss(&graph)
        );
        assert_same_weights(eager_out.path(), graph_out.path());
    }
    // One shape a step: what would make several is refused by name.
    for (flags, named) in [
        ("--graph --bucket", "--bucket"),
        ("--graph --trim-multiple 8", "--trim-multiple"),
    ] {
        let out = tempfile::tempdir().unwrap();
        let (c, o) = (path(cache), path(out.path()));
        let mut args = vec!["--cache", &c, "--out", &o, "--task", "direction"];
        args.extend(flags.split_whitespace());
        let r = train(&args);
        assert!(
            r.code != 0 && r.stderr.contains(named),
            "{flags}: {}",
            r.stderr
        );
    }
}

/// Issue 29, item 4: the library validates its configuration in `Session::new`, before it
/// touches the cache, and names the option by its key (the binary spells it as a flag).
#[test]
fn a_session_refuses_a_bad_configuration_by_its_key() {
    let mut cfg = dsc_train::RunConfig::new("/no/such/cache", dsc_train::Task::Regression);
    cfg.accumulate = 0;
    match dsc_train::Session::new(cfg, tch::Device::Cpu, 2) {
        Err(dsc_train::TrainError::Config(e)) => {
            assert_eq!(
                (e.key, e.problem.as_str()),
                ("accumulate", "must be at least 1")
            );
        }
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("a session with accumulate = 0 started"),
    }
}

#[test]
fn a_run_on_a_cache_in_object_storage_trains_the_weights_of_the_local_one() {
    let fx = fixture();
    let server = s3::S3Server::start();
    let url = format!("{}/ice", server.bucket("caches"));
    let remote = dsc_store::Remote::open_with(&url, &server.options()).unwrap();
    dsc_store::upload_cache(&fx.icecube, &remote, false, |_, _| {}).unwrap();
    let (here, there, fetched) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let run = |cache: &str, out: &Path, extra: &[&str]| {
        let mut args = vec![
            "--cache",
            cache,
            "--task",
            "direction",
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--max-steps",
            "40",
            "--json",
        ];
        args.extend(SMALL);
        let out = path(out);
        args.extend(["--out", &out]);
        args.extend(extra);
        train_with(&args, server.env()).json()
    };
    let local = run(&path(&fx.icecube), here.path(), &[]);
    let dir = path(fetched.path());
    let summary = run(
        &url,
        there.path(),
        &["--cache-dir", &dir, "--cache-limit", "64MiB"],
    );
    assert_same_weights(here.path(), there.path());
    let losses = |v: &Value| -> Vec<Value> {
        v["epochs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["val_loss"].clone())
            .collect()
    };
    assert_eq!(losses(&local), losses(&summary));
    let loader = &summary["loader"];
    assert!(
        loader["shards_fetched"].as_u64().unwrap() > 0
            && loader["bytes_fetched"].as_u64().unwrap() > 0,
        "{loader}"
    );
    assert!(fetched.path().join("remote").is_dir());
}

/// Long series (40 of 300 to 1,000 steps) compiled whole, z-scored: for forecasting.
fn series_cache(root: &Path) -> PathBuf {
    let opts = dsc_gen::series::SeriesOptions {
        series: 40,
        min_len: 300,
        max_len: 1000,
        seed: 3,
    };
    dsc_gen::series::generate(&root.join("sensors"), &opts).expect("generate series");
    let out = root.join("sensors-cache");
    compile(
        serde_json::json!({
            "rows": [root.join("sensors/readings.parquet").display().to_string()],
            "key": "series_id",
            "order_by": "t",
            "features": ["value", "load", "temp"],
            "encode": {"value": "zscore", "load": "zscore", "temp": "zscore"},
            "max_len": 1000,
            "val_fraction": 0.25,
        }),
        &out,
    );
    out
}

/// The mean absolute error of repeating each window's last `value` over the next `horizon`
/// steps, over the validation windows dsc-train evaluates (stored units).
fn last_value_error(cache: &Path, window: usize, stride: usize, horizon: usize) -> f64 {
    let cache = dsc_loader::Cache::open(cache).unwrap();
    let opts = dsc_loader::LoaderOptions {
        order: dsc_loader::OrderSpec {
            split: "val".into(),
            shuffle: false,
            drop_last: false,
            batches: dsc_loader::Batches::Windows(dsc_loader::SeriesWindows {
                len: window,
                stride,
                horizon,
                horizon_columns: vec!["value".into()],
                pad: false,
            }),
            ..Default::default()
        },
        batch_size: 1,
        ..Default::default()
    };
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (mut sum, mut n) = (0.0f64, 0usize);
    for b in cache.loader(opts).unwrap() {
        let b = b.unwrap();
        let x = f32s(b.tensor("x").unwrap().bytes());
        let last = x[(window - 1) * 3];
        for y in f32s(b.tensor("y_next").unwrap().bytes()) {
            sum += f64::from((y - last).abs());
            n += 1;
        }
    }
    sum / n as f64
}

#[test]
fn forecasting_on_series_windows_beats_repeating_the_last_value() {
    let dir = tempfile::tempdir().unwrap();
    let cache = series_cache(dir.path());
    let out = tempfile::tempdir().unwrap();
    let (c, o) = (path(&cache), path(out.path()));
    let run = train(&[
        "--cache",
        &c,
        "--out",
        &o,
        "--json",
        "--task",
        "forecast",
        "--model",
        "gru",
        "--series-window",
        "48",
        "--stride",
        "2",
        "--horizon",
        "4",
        "--horizon-columns",
        "value",
        "--epochs",
        "3",
        "--dim",
        "64",
        "--layers",
        "1",
        "--lr",
        "3e-3",
        "--torch-threads",
        "2",
    ])
    .json();
    let baseline = last_value_error(&cache, 48, 2, 4);
    let mae = f(&run["epochs"][2]["val_metric"]);
    assert!(
        mae < 0.85 * baseline,
        "forecast mae {mae} against last value {baseline}"
    );
    // Evaluation reads every validation window, not as many as there are series.
    let windows = run["evaluation"][0]["contexts"].as_u64().unwrap();
    assert!(windows > 1000, "{windows} windows evaluated");
    // Refused, exit 2: a forecast with `extra` flags.
    let refused = |extra: &[&str]| {
        let mut args = vec!["--cache", &c, "--out", &o, "--task", "forecast"];
        args.extend(extra);
        let r = train(&args);
        assert_eq!(r.code, 2, "{}", r.stderr);
        r.stderr
    };
    // The task needs its windows and horizon, and they need it.
    let err = refused(&[]);
    assert!(err.contains("--task"), "{err}");
    // A horizon past the stored steps is refused before the task sizes its targets from it
    // (it allocated [H, K] scalings first, and aborted on 2^62).
    for horizon in ["100000", "4611686018427387904"] {
        let err = refused(&["--series-window", "48", "--horizon", horizon]);
        assert!(
            err.contains("--horizon") && err.contains("(at most "),
            "{err}"
        );
    }
    // Issue 39, class F: fewer windows than one batch blamed --accumulate, never given.
    let err = refused(&[
        "--series-window",
        "48",
        "--horizon",
        "4",
        "--batch-size",
        "1000000",
    ]);
    assert!(
        err.contains("--batch-size 1000000")
            && err.contains("windows")
            && !err.contains("--accumulate"),
        "{err}"
    );
}
