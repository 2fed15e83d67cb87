//! What one optimizer update costs: dsc-train's AdamW through libtorch's fused kernel against
//! its whole-buffer update, on the parameters of the dim-128, 2-layer transformer of
//! docs/PERFORMANCE.md (clipping on, no fp16 scaler), each timed over the same updates after a
//! warm-up. On the CPU the figure is the update's own time; on a GPU (`--device cuda`) it is
//! the host's launch time per update plus the device time, synchronised at the end.
//!
//! cargo run --release -p dsc-train --example adamw_update [-- --device cuda --updates 500]
use dsc_train::optim::AdamW;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// The transformer's parameter shapes (dsc-train --dim 128 --layers 2 on the IceCube cache).
fn shapes(dim: i64, layers: usize) -> Vec<(String, Vec<i64>)> {
    let mut out = vec![
        ("embed.x.w".to_string(), vec![dim, 6]),
        ("embed.x.b".into(), vec![dim]),
        ("embed.sensor".into(), vec![5162, dim]),
        ("embed.position".into(), vec![129, dim]),
        ("head.w".into(), vec![3, dim]),
        ("head.b".into(), vec![3]),
    ];
    for l in 0..layers {
        for (name, shape) in [
            ("qkv.w", vec![3 * dim, dim]),
            ("qkv.b", vec![3 * dim]),
            ("out.w", vec![dim, dim]),
            ("out.b", vec![dim]),
            ("ln1.w", vec![dim]),
            ("ln1.b", vec![dim]),
            ("ln2.w", vec![dim]),
            ("ln2.b", vec![dim]),
            ("ff1.w", vec![4 * dim, dim]),
            ("ff1.b", vec![4 * dim]),
            ("ff2.w", vec![dim, 4 * dim]),
            ("ff2.b", vec![dim]),
        ] {
            out.push((format!("layer{l}.{name}"), shape));
        }
    }
    out
}

/// Seconds per update of `updates`, after 20 warm-up updates.
fn time(fused: bool, device: Device, updates: usize) -> (f64, f64) {
    tch::manual_seed(0);
    let params: Vec<(String, Tensor)> = shapes(128, 2)
        .into_iter()
        .map(|(n, s)| {
            (
                n,
                Tensor::randn(s, (Kind::Float, device)).set_requires_grad(true),
            )
        })
        .collect();
    let loss = params
        .iter()
        .map(|(_, p)| p.square().sum(Kind::Float))
        .fold(Tensor::zeros([], (Kind::Float, device)), |a, b| a + b);
    loss.backward();
    let named = params.iter().map(|(n, p)| (n.clone(), p.shallow_clone()));
    let mut opt = AdamW::new(named.collect(), 0.01, device);
    if !fused {
        opt = opt.unfused();
    }
    for _ in 0..20 {
        opt.step(1e-3, 1.0, None);
    }
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    sync();
    let start = Instant::now();
    for _ in 0..updates {
        opt.step(1e-3, 1.0, None);
    }
    let host = start.elapsed().as_secs_f64() / updates as f64;
    sync();
    let total = start.elapsed().as_secs_f64() / updates as f64;
    (host, total)
}

fn main() {
    dsc_train::cuda::load_torch_cuda();
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let device = match flag("--device").as_deref() {
        Some("cuda") => Device::Cuda(0),
        _ => Device::Cpu,
    };
    let updates: usize = flag("--updates").map_or(200, |u| u.parse().expect("--updates N"));
    let params: i64 = shapes(128, 2)
        .iter()
        .map(|(_, s)| s.iter().product::<i64>())
        .sum();
    println!("{params} parameters on {device:?}, {updates} updates each, clip 1.0");
    let mut rows = Vec::new();
    for fused in [false, true, false, true] {
        if fused && !AdamW::new(Vec::new(), 0.0, device).is_fused() {
            println!("this build has no fused AdamW shim");
            return;
        }
        let (host, total) = time(fused, device, updates);
        println!(
            "{:8} host {:8.1} us/update · with the device {:8.1} us/update",
            if fused { "fused" } else { "unfused" },
            1e6 * host,
            1e6 * total
        );
        rows.push((fused, total));
    }
    let mean = |f: bool| {
        let t: Vec<f64> = rows.iter().filter(|r| r.0 == f).map(|r| r.1).collect();
        t.iter().sum::<f64>() / t.len() as f64
    };
    println!(
        "fused ÷ unfused time per update: {:.2}",
        mean(true) / mean(false)
    );
}
