//! Two epochs over a cache, as training code would run them: per-epoch order, a mid-epoch
//! checkpoint of the loader state, and an exact resume that finishes the epoch.
//!
//! cargo run --release -p dsc-loader --example epochs -- demo/cache

use dsc_loader::{Batch, Cache, LoaderOptions, State};

/// Adds the stored (non-padding) steps of `x` to per-feature sums: a stand-in for a training
/// step that reads the batch.
fn accumulate(batch: &Batch, sum: &mut [f64], steps: &mut usize) {
    let x = batch.tensor("x").expect("x");
    let lengths = batch.tensor("length").expect("length").bytes();
    let (l, f) = (x.shape()[1], x.shape()[2]);
    for i in 0..batch.size {
        let len = i32::from_le_bytes(lengths[i * 4..i * 4 + 4].try_into().expect("i32")) as usize;
        for t in 0..len {
            for (k, s) in sum.iter_mut().enumerate() {
                let o = ((i * l + t) * f + k) * 4;
                *s += f64::from(f32::from_le_bytes(
                    x.bytes()[o..o + 4].try_into().expect("f32"),
                ));
            }
        }
        *steps += len;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: epochs CACHE")?;
    let cache = Cache::open(&dir)?;
    let features = cache
        .manifest()
        .tensor("x")
        .ok_or("the cache has no x tensor")?
        .sample_shape[1];
    for epoch in 0..2 {
        let opts = LoaderOptions {
            batch_size: 128,
            epoch,
            trim: Some(1),
            ..Default::default()
        };
        let (mut sum, mut steps) = (vec![0f64; features], 0usize);
        let mut loader = cache.loader(opts.clone())?;
        let half = loader.steps() / 2;
        for batch in (&mut loader).take(half) {
            accumulate(&batch?, &mut sum, &mut steps);
        }
        // A checkpoint stores this state (it is serde); the run stops here.
        let state: State = loader.state();
        drop(loader);
        // Later, perhaps on another number of ranks: continue exactly where it stopped.
        for batch in cache.loader_from_state(opts, &state)? {
            accumulate(&batch?, &mut sum, &mut steps);
        }
        let means: Vec<String> = sum
            .iter()
            .map(|s| format!("{:.3}", s / steps.max(1) as f64))
            .collect();
        println!(
            "epoch {epoch}: checkpoint after {} contexts; mean of the encoded features over the epoch: {}",
            state.samples,
            means.join(" ")
        );
    }
    Ok(())
}
