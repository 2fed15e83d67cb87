//! The dsc loader in one's own tch loop: pinned buffers filled in place, non-blocking copies.
//!
//! cargo run -p dsc-train --example own_loop -- demo/cache
use dsc_loader::{Cache, LoaderOptions};
use tch::{nn, nn::OptimizerConfig, Device, Kind, Tensor};

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "demo/cache".into());
    let device = Device::cuda_if_available();
    let cache = Cache::open(&dir)?;
    let opts = LoaderOptions {
        batch_size: 128,
        threads: 0,
        trim: false,
        ..Default::default()
    };
    let (b, max_len) = (opts.batch_size as i64, cache.manifest().max_len as i64);
    // One host buffer per manifest tensor, allocated once; pinned so copies can be asynchronous.
    let host: Vec<Tensor> = cache
        .tensors()
        .iter()
        .map(|t| {
            let kind = match t.dtype {
                dsc_loader::Dtype::F32 => Kind::Float,
                dsc_loader::Dtype::I32 => Kind::Int,
                dsc_loader::Dtype::I64 => Kind::Int64,
            };
            let mut shape = vec![b];
            shape.extend(t.sample_shape.iter().map(|&d| d as i64));
            let t = Tensor::zeros(shape.as_slice(), (kind, Device::Cpu));
            if device.is_cuda() {
                t.pin_memory(device)
            } else {
                t
            }
        })
        .collect();
    let index = |name: &str| {
        cache
            .tensors()
            .iter()
            .position(|t| t.name == name)
            .expect(name)
    };
    let (x, len, y) = (index("x"), index("length"), index("y"));
    let features = cache.tensors()[x].sample_shape[1] as i64;

    let vs = nn::VarStore::new(device);
    let net = nn::linear(vs.root() / "head", features, 2, Default::default());
    let mut opt = nn::AdamW::default().build(&vs, 1e-3)?;
    let mut loader = cache.loader(opts)?;
    let mut running = Tensor::zeros([], (Kind::Float, device));
    for step in 0.. {
        // The loader writes each tensor straight into our buffers: one copy from page cache.
        let mut bufs: Vec<&mut [u8]> = host
            .iter()
            .map(|t| {
                let n = t.numel() * t.kind().elt_size_in_bytes();
                // SAFETY: `t` is a contiguous CPU tensor of `n` bytes that nothing else uses
                // while the slice lives.
                unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut u8, n) }
            })
            .collect();
        if loader.next_into(&mut bufs)?.is_none() {
            break;
        }
        drop(bufs);
        // Non-blocking copies; the step queues behind them on the same stream. (Before refilling
        // a buffer whose copy may still be queued, wait for it: dsc-train uses CUDA events.)
        let xs = host[x].to_device_(device, Kind::Float, true, false);
        let lens = host[len]
            .to_device_(device, Kind::Float, true, false)
            .clamp_min(1.0);
        let ys = host[y].to_device_(device, Kind::Float, true, false);
        let mask = Tensor::arange(max_len, (Kind::Float, device))
            .unsqueeze(0)
            .lt_tensor(&lens.unsqueeze(1));
        let pooled =
            (xs * mask.unsqueeze(-1)).sum_dim_intlist(1, false, Kind::Float) / lens.unsqueeze(1);
        let loss = pooled.apply(&net).mse_loss(&ys, tch::Reduction::Mean);
        opt.backward_step(&loss);
        running += loss.detach();
        if (step + 1) % 20 == 0 {
            // The only host read: once per 20 steps, not once per step.
            println!(
                "step {}: loss {:.4}",
                step + 1,
                f64::try_from(&running)? / 20.0
            );
            running = running.zero_();
        }
    }
    Ok(())
}
