//! `dsc order`: the loader's order for an epoch, as keys, a quality report or a resume state.

use crate::args::OrderArgs;
use crate::output::{bold, bytes, outln};
use anyhow::Context as _;
use dsc_loader::order::{Padding, Quality};
use dsc_loader::{Cache, Loader, LoaderOptions, OrderSpec, State};
use serde::Serialize;

#[derive(Serialize)]
struct Report {
    split: String,
    epoch: u64,
    seed: u64,
    shuffle: bool,
    bucket: bool,
    batch_size: usize,
    world_size: usize,
    batches_per_rank: usize,
    contexts: usize,
    #[serde(flatten)]
    figures: Figures,
    window_bytes: u64,
    /// With --bucket: the same epoch without bucketing, for comparison.
    #[serde(skip_serializing_if = "Option::is_none")]
    unbucketed: Option<Figures>,
}

/// Shuffle quality and padding of one epoch order.
#[derive(Serialize)]
struct Figures {
    #[serde(flatten)]
    quality: Quality,
    #[serde(flatten)]
    padding: Padding,
}

fn figures(loader: &Loader) -> anyhow::Result<Figures> {
    let o = loader.options();
    Ok(Figures {
        quality: loader.order().quality(o.batch_size * o.world_size),
        padding: loader.padding()?,
    })
}

pub fn run(a: OrderArgs) -> anyhow::Result<u8> {
    let cache = Cache::open(&a.cache)?;
    let opts = LoaderOptions {
        order: OrderSpec {
            split: a.split.clone(),
            shuffle: !a.no_shuffle,
            seed: a.seed,
            drop_last: !a.keep_last,
            window: a.window,
            interleave: a.interleave,
            bucket: a.bucket,
            ..Default::default()
        },
        batch_size: a.batch_size,
        epoch: a.epoch,
        rank: a.rank,
        world_size: a.world_size,
        threads: 0,
        ..Default::default()
    };
    let mut loader = match &a.from_state {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let state: State = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a loader state", path.display()))?;
            anyhow::ensure!(
                !a.bucket || state.order.bucket,
                "--bucket with --from-state {}: that state is of an unbucketed order (drop \
                 --bucket; the state's order continues)",
                path.display()
            );
            cache.loader_from_state(opts, &state)?
        }
        None => cache.loader(opts)?,
    };
    if let Some(n) = a.state_after {
        for _ in 0..n {
            if loader.next().transpose()?.is_none() {
                break;
            }
        }
        crate::output::print_json(&loader.state())?;
        return Ok(0);
    }
    if a.keys {
        let mut all = Vec::new();
        for batch in &mut loader {
            let keys = batch?.keys();
            if a.json {
                all.push(keys);
            } else {
                let line: Vec<String> = keys.iter().map(ToString::to_string).collect();
                outln!("{}", line.join(" "));
            }
        }
        if a.json {
            crate::output::print_json(&all)?;
        }
        return Ok(0);
    }
    let order = loader.order();
    let unbucketed = if order.is_bucketed() {
        let plain = cache.loader(LoaderOptions {
            order: OrderSpec {
                bucket: false,
                ..loader.options().clone().order
            },
            ..loader.options().clone()
        })?;
        Some(figures(&plain)?)
    } else {
        None
    };
    let figures = figures(&loader)?;
    let per_context = cache.manifest().bytes_per_context() as u64;
    let report = Report {
        split: a.split.clone(),
        epoch: loader.options().epoch,
        seed: loader.options().order.seed,
        shuffle: loader.options().order.shuffle,
        bucket: order.is_bucketed(),
        batch_size: a.batch_size,
        world_size: a.world_size,
        batches_per_rank: loader.steps(),
        contexts: order.len(),
        // The window being read, the one before (released when the next begins) and the one
        // read ahead.
        window_bytes: 3 * figures.quality.window.min(order.len()) as u64 * per_context,
        figures,
        unbucketed,
    };
    if a.json {
        crate::output::print_json(&report)?;
        return Ok(0);
    }
    outln!(
        "{} split {} epoch {} seed {}{}: {} contexts, {} batches per rank ({} x {} ranks)",
        bold("order"),
        report.split,
        report.epoch,
        report.seed,
        if report.shuffle { "" } else { " (cache order)" },
        report.contexts,
        report.batches_per_rank,
        report.batch_size,
        report.world_size
    );
    print_figures(&report.figures, if report.bucket { "bucketed" } else { "" })?;
    if let Some(plain) = &report.unbucketed {
        print_figures(plain, "plain")?;
    }
    outln!(
        "window {} contexts: about {} resident while reading",
        report.figures.quality.window,
        bytes(report.window_bytes)
    );
    Ok(0)
}

fn print_figures(f: &Figures, label: &str) -> anyhow::Result<()> {
    let (q, p) = (&f.quality, &f.padding);
    let label = if label.is_empty() {
        String::new()
    } else {
        format!("{label}: ")
    };
    outln!(
        "{label}distinct shards per global batch {:.2} (of {} shards)",
        q.distinct_shards_per_batch,
        q.shards
    );
    outln!(
        "{label}neighbour-distance entropy {:.3} bits; a uniform shuffle gives {:.3} ({:.1}%)",
        q.neighbour_entropy,
        q.uniform_entropy,
        if q.uniform_entropy > 0.0 {
            100.0 * q.neighbour_entropy / q.uniform_entropy
        } else {
            0.0
        }
    );
    outln!(
        "{label}padding efficiency {:.3} trimmed, {:.3} untrimmed; mean batch length {:.1}",
        p.padding_efficiency,
        p.padding_efficiency_untrimmed,
        p.mean_batch_len
    );
    outln!(
        "{label}length spread in a batch {:.3} of the split's (random batches: about 1)",
        p.length_spread_in_batch
    );
    Ok(())
}
