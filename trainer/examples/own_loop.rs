//! The dsc loader in one's own tch loop, through the `dsc_train` library: its ring of pinned
//! host buffers filled by a producer thread (one copy from page cache), non-blocking copies to
//! the device, CUDA events saying when a buffer may be refilled. The model is one's own: here a
//! linear regression on the mean of each sequence's standardised features.
//!
//! cargo run --release -p dsc-train --example own_loop -- demo/cache
use dsc_train::cuda::{self, Event};
use dsc_train::feed::{Feed, Fill, HostRing};
use dsc_train::model::Standardise;
use dsc_train::normalise::{self, Scaling};
use std::collections::VecDeque;
use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};

fn main() -> anyhow::Result<()> {
    // Before any tch call, so that a CUDA libtorch can see the GPU.
    cuda::load_torch_cuda();
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "demo/cache".into());
    let device = Device::cuda_if_available();
    let cache = dsc_loader::Cache::open(&dir)?;
    let opts = dsc_loader::LoaderOptions {
        batch_size: 128,
        threads: 0, // the feed's thread fills the buffers
        trim: None,
        ..Default::default()
    };
    let tensor = |name: &str| {
        let i = cache.tensors().iter().position(|t| t.name == name);
        i.ok_or_else(|| anyhow::anyhow!("{dir}: no tensor {name:?}"))
    };
    let (x, len, y) = (tensor("x")?, tensor("length")?, tensor("y")?);
    let features = cache.tensors()[x].sample_shape[1] as i64;
    // Standardise raw columns with the cache's train statistics (as dsc-train does).
    let train = normalise::train_stats(&cache)?;
    let scaling = Scaling::from_stats(&cache.tensors()[x], &train);
    let vs = nn::VarStore::new(device);
    let standardise = Standardise::new(vs.root() / "x_norm", &scaling);
    let net = nn::linear(vs.root() / "head", features, 2, Default::default());
    let mut opt = nn::AdamW::default().build(&vs, 1e-3)?;

    const SLOTS: usize = 3;
    let loader = cache.loader(opts)?;
    // One buffer per tensor of the loader's batches, shaped as a whole batch.
    let ring = HostRing::new(loader.layout(), SLOTS, device.is_cuda().then_some(device))?;
    let events: Vec<Event> = if device.is_cuda() {
        (0..SLOTS)
            .map(|_| Event::new())
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?
    } else {
        Vec::new()
    };
    let feed = Feed::start(loader, &ring, Fill::Batch);
    let mut queued = VecDeque::new();
    let mut running = Tensor::zeros([], (Kind::Float, device));
    let max_len = cache.manifest().max_len() as i64;
    let mut step = 0;
    while let Some(filled) = feed.next()? {
        let host = ring.slot(filled.slot);
        // Queued behind nothing on the host: the copies and the step run in the device's order.
        let to_device = |t: &Tensor| t.to_device_(device, Kind::Float, true, false);
        let (xs, lens, ys) = (
            to_device(&host[x]),
            to_device(&host[len]),
            to_device(&host[y]),
        );
        if device.is_cuda() {
            // Marks the end of this slot's copies in the device's queue.
            events[filled.slot].record().map_err(anyhow::Error::msg)?;
            queued.push_back(filled.slot);
        }
        let lens = lens.clamp_min(1.0);
        let mask = Tensor::arange(max_len, (Kind::Float, device))
            .unsqueeze(0)
            .lt_tensor(&lens.unsqueeze(1));
        let xs = standardise.forward(&xs);
        let pooled =
            (xs * mask.unsqueeze(-1)).sum_dim_intlist(1, false, Kind::Float) / lens.unsqueeze(1);
        let loss = pooled.apply(&net).mse_loss(&ys, tch::Reduction::Mean);
        opt.backward_step(&loss);
        running += loss.detach();
        // A slot goes back to the producer once nothing reads it: on the CPU after the step, on
        // CUDA once its copies have run (keeping one batch's copies in flight).
        if device.is_cuda() {
            while queued.len() > 1 {
                let slot = queued.pop_front().expect("non-empty");
                events[slot].synchronize().map_err(anyhow::Error::msg)?;
                feed.release(slot);
            }
        } else {
            feed.release(filled.slot);
        }
        step += 1;
        if step % 20 == 0 {
            // The only host read: once per 20 steps, not once per step.
            println!("step {step}: loss {:.4}", f64::try_from(&running)? / 20.0);
            running = running.zero_();
        }
    }
    Ok(())
}
