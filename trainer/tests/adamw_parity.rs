//! dsc-train's AdamW, schedule and clipping against PyTorch's own: the same parameters and
//! gradients through `dsc_train::optim` here and through `torch.optim.AdamW`,
//! `clip_grad_norm_` and torch's LR schedulers in the project's `.venv` (tests/py/adamw_steps.py).

mod common;

use dsc_train::optim::{learning_rate, AdamW};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// The Python with torch and safetensors: `DSC_PYTHON`, else the workspace's `.venv`.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("DSC_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python environment: run scripts/test.sh (it creates .venv with torch) or set DSC_PYTHON"
    );
    venv
}

fn host(t: &Tensor) -> Vec<f32> {
    Vec::try_from(&t.flatten(0, -1)).expect("f32 tensor")
}

fn save(path: &Path, tensors: &[(String, Tensor)]) {
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, t)| {
            let bytes = host(t).iter().flat_map(|v| v.to_le_bytes()).collect();
            (
                n.clone(),
                bytes,
                t.size().iter().map(|&d| d as usize).collect(),
            )
        })
        .collect();
    let views = data.iter().map(|(n, b, s)| {
        (
            n.clone(),
            TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn load(path: &Path) -> HashMap<String, Vec<f32>> {
    common::f32_tensors(path).into_iter().collect()
}

#[test]
fn adamw_with_decay_clipping_and_the_schedule_matches_torch_optim_adamw() {
    const STEPS: i64 = 24;
    const WARMUP: u64 = 4;
    const PEAK: f64 = 1e-2;
    const WEIGHT_DECAY: f64 = 0.1;
    const CLIP: f64 = 1.0;
    tch::manual_seed(17);
    // A matrix, a vector (no decay), an embedding-like table; values of the sizes a network has.
    let shapes: [(&str, &[i64]); 3] = [("a.weight", &[8, 5]), ("a.bias", &[8]), ("emb", &[6, 4])];
    let params: Vec<(String, Tensor)> = shapes
        .iter()
        .map(|(n, s)| {
            let t = (Tensor::randn(*s, (Kind::Float, Device::Cpu)) * 0.5).set_requires_grad(true);
            (n.to_string(), t)
        })
        .collect();
    let mut saved: Vec<(String, Tensor)> = params
        .iter()
        .map(|(n, t)| (format!("init.{n}"), t.detach().copy()))
        .collect();
    // Gradients exist once a backward pass has written them; each step overwrites them.
    let touch: Vec<Tensor> = params.iter().map(|(_, p)| p.sum(Kind::Float)).collect();
    Tensor::stack(&touch, 0).sum(Kind::Float).backward();
    let shared = params
        .iter()
        .map(|(n, p)| (n.clone(), p.shallow_clone()))
        .collect();
    let mut opt = AdamW::new(shared, WEIGHT_DECAY, Device::Cpu);
    let mut lrs = Vec::new();
    let mut clipped = 0;
    for k in 0..STEPS {
        // Gradients whose global norm sometimes exceeds the clip and sometimes not, and one
        // parameter whose gradient shrinks (Adam's second moment then dominates).
        let scale = if k % 3 == 0 { 2.0 } else { 0.1 };
        let mut norm_sq = 0.0;
        for (i, (n, p)) in params.iter().enumerate() {
            let g = Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * scale
                / (1.0 + (k * i as i64) as f64);
            norm_sq += f64::try_from(g.square().sum(Kind::Double)).unwrap();
            p.grad().copy_(&g);
            saved.push((format!("grad.{k}.{n}"), g));
        }
        clipped += usize::from(norm_sq.sqrt() > CLIP);
        let lr = learning_rate(PEAK, k as u64, WARMUP, STEPS as u64);
        opt.step(lr, CLIP, None);
        lrs.push(lr);
    }
    assert!(
        clipped > 3 && clipped < STEPS as usize - 3,
        "{clipped} clipped steps"
    );

    let dir = tempfile::tempdir().unwrap();
    save(&dir.path().join("steps.safetensors"), &saved);
    let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
    let cfg = serde_json::json!({
        "names": names, "steps": STEPS, "lr": PEAK, "weight_decay": WEIGHT_DECAY,
        "clip": CLIP, "warmup": WARMUP, "total": STEPS,
    });
    std::fs::write(dir.path().join("steps.json"), cfg.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/adamw_steps.py");
    let out = std::process::Command::new(python())
        .arg(&script)
        .arg(dir.path())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // The schedule: torch's LinearLR + CosineAnnealingLR give the same rate at every step.
    let torch_lrs: Vec<f64> = py["lrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(torch_lrs.len(), lrs.len());
    for (k, (a, b)) in lrs.iter().zip(&torch_lrs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * PEAK.max(1.0),
            "step {k}: lr {a} vs torch {b}"
        );
    }

    // The parameters. Each step moves a weight by at most about lr (Adam normalises the
    // gradient), computed in f32 by both in a different order: per step the two differ by a few
    // f32 roundings of values below 1, ~1e-7, so after 24 steps by well under 2e-6. A real
    // difference (no bias correction, decay on biases, clipping off, another beta) moves weights
    // by ~1e-3 here: checked below, against how far the weights travelled.
    const TOL: f32 = 2e-6;
    let theirs = load(&dir.path().join("torch.safetensors"));
    let init = load(&dir.path().join("steps.safetensors"));
    let mut worst = 0f32;
    for (n, p) in &params {
        let ours = host(p);
        let t = &theirs[n];
        let start = &init[&format!("init.{n}")];
        let travelled = ours
            .iter()
            .zip(start)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(travelled > 0.02, "{n} moved only {travelled}");
        for (i, (a, b)) in ours.iter().zip(t).enumerate() {
            assert!((a - b).abs() <= TOL, "{n}[{i}]: dsc {a} vs torch {b}");
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("largest difference from torch.optim.AdamW: {worst:e}");
}
