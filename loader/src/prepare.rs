//! What a loader builds its batches from: the options checked, each source's split, the
//! epoch's order (one cache's, a mix's, or windows'), and the room of the batch shape
//! ([`crate::shape`]) that cuts it into steps, lays out and gathers each batch.

use crate::cache::Cache;
use crate::error::LoadError;
use crate::gather::packed;
use crate::gather::padded;
use crate::gather::windows::{self, SeriesPlan};
use crate::gather::{self, Gather, Source};
use crate::options::LoaderOptions;
use crate::order::{EpochOrder, MixOrder, Order, Sample, SplitContexts};
use crate::stats::Counters;
use dsc_format::spec::format_size;
use dsc_format::spelling::OptionError;
use dsc_format::{TensorRole, TensorSpec};
use std::sync::Arc;

/// Mapped bytes of a split up to which its pages are kept resident: a quarter of the memory
/// this process may use (the machine's, or its cgroup's limit when lower). Releasing pages
/// behind the reader (`MADV_DONTNEED`) bounds the resident set, but costs a page-table
/// teardown, a TLB shootdown and a fault for every page on every epoch: measured on the 344 MB
/// loader benchmark cache, keeping it resident and hinting each tensor of a shard once raises
/// the shuffled rate about 1.7x (docs/PERFORMANCE.md). The pages are clean page-cache pages either way, which the
/// kernel can reclaim under pressure; only the reported RSS differs.
fn resident_budget() -> usize {
    memory_limit() / 4
}

/// The memory this process may use (the machine's, or its container's limit when lower).
fn memory_limit() -> usize {
    usize::try_from(dsc_format::system::memory_limit()).unwrap_or(usize::MAX)
}

/// The most positions an epoch of a mix may have: its blocks and draws are counted in `usize`
/// and `u64` arithmetic that must not wrap (2^64 - 1 positions panicked there).
const MAX_MIX_SAMPLES: usize = 1 << 48;

/// The epoch's order over `sizes` (each source's contexts per shard): one split's, or a mix's.
fn order_of(
    sources: &[Cache],
    sizes: &[Arc<SplitContexts>],
    opts: &LoaderOptions,
) -> Result<Order, LoadError> {
    let o = &opts.order;
    let bad = |key, problem: String| Err(OptionError::new(key, problem).into());
    // A mix's options on one cache, whatever the shape, a single weight included: every front
    // end refuses them alike (Python refused `weights=[1.0]` where `--weights 1` was taken).
    if let [_] = sizes {
        if !o.weights.is_empty() || o.mix_samples.is_some() {
            let key = if o.mix_samples.is_some() {
                "mix_samples"
            } else {
                "weights"
            };
            return bad(
                key,
                "is for a mix: pass two or more caches (one was given)".into(),
            );
        }
    }
    if let Some(windows) = o.batches.windows() {
        return windows::order(sources, sizes, opts, windows);
    }
    if let [one] = sizes {
        let mut order = EpochOrder::over(
            one.clone(),
            o.shuffle,
            o.seed,
            opts.epoch,
            o.window,
            o.interleave,
        );
        if o.batches.is_bucketed() {
            order = order.bucketed(sources[0].lengths(&o.split)?, opts.global_batch()?);
        }
        return Ok(Order::One(order));
    }
    if o.batches.is_bucketed() {
        return bad(
            "bucket",
            "cannot be used with a mix: buckets are cut from one cache's windows; use `trim` \
             (or `pack`) to cut padding"
                .into(),
        );
    }
    let lens: Vec<usize> = sizes.iter().map(|s| s.len()).collect();
    if let Some(s) = lens.iter().position(|&n| n == 0) {
        return Err(OptionError::new(
            "split",
            format!(
                "{:?} of {} holds no contexts: a mix draws from every source",
                o.split,
                sources[s].dir().display()
            ),
        )
        .into());
    }
    let weights: Vec<f64> = if o.weights.is_empty() {
        lens.iter().map(|&n| n as f64).collect()
    } else {
        o.weights.clone()
    };
    if weights.len() != sizes.len() {
        return bad(
            "weights",
            format!(
                "gives {} weights for {} caches: one positive number per cache, in their order",
                weights.len(),
                sizes.len()
            ),
        );
    }
    if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w > 0.0)) {
        return bad(
            "weights",
            format!("{w} is not a weight: one positive number per cache"),
        );
    }
    // Weights are relative: when their sum overflows (1e308 each), they are scaled by the
    // largest first, else each became 0 of an infinite sum. Other weights are used as given,
    // so that every existing mix keeps its order to the bit.
    let weights: Vec<f64> = if weights.iter().sum::<f64>().is_finite() {
        weights
    } else {
        let largest = weights.iter().copied().fold(0.0, f64::max);
        weights.iter().map(|w| w / largest).collect()
    };
    let block = o.window.max(1);
    let sum: f64 = weights.iter().sum();
    if let Some(s) = weights.iter().position(|w| w / sum * (block as f64) < 1.0) {
        return bad(
            "weights",
            format!(
                "{:e} of cache {} is under one position in a window of {block}: raise it or \
                 the `window`",
                o.weights.get(s).copied().unwrap_or(weights[s]),
                sources[s].dir().display()
            ),
        );
    }
    // The same data twice would deliver each of its contexts twice per epoch.
    for (b, cache) in sources.iter().enumerate() {
        if let Some(a) = sources[..b]
            .iter()
            .position(|c| c.manifest().content_id() == cache.manifest().content_id())
        {
            return bad(
                "weights",
                format!(
                    "caches {} and {} hold the same data (one content id): a mix would deliver \
                     each of its contexts twice per epoch; weigh one cache instead",
                    sources[a].dir().display(),
                    cache.dir().display()
                ),
            );
        }
    }
    let samples = o.mix_samples.unwrap_or(lens.iter().sum());
    if samples > MAX_MIX_SAMPLES {
        return bad(
            "mix_samples",
            format!("{samples}: at most 2^48 positions per epoch"),
        );
    }
    // Each source's draws before this epoch are counted from the epoch's positions.
    if (samples as u64)
        .checked_mul(opts.epoch.saturating_add(1))
        .is_none()
    {
        return bad(
            "epoch",
            format!(
                "{} of {samples} positions each: past 2^64 positions of the mix",
                opts.epoch
            ),
        );
    }
    Ok(Order::Mix(MixOrder::new(
        sizes,
        &weights,
        samples,
        o.shuffle,
        o.seed,
        opts.epoch,
        o.window,
        o.interleave,
    )))
}

/// Everything a loader of `opts` over `sources` (one cache, or a mix's) builds batches from,
/// after checking the options against the caches, and how many threads it runs.
pub(crate) fn prepare(
    sources: &[Cache],
    opts: &LoaderOptions,
) -> Result<(Gather, usize), LoadError> {
    opts.check()?;
    let first = &sources[0].inner;
    let split_name = &opts.order.split;
    let all = first.manifest.tensors();
    if let Some(unknown) = opts
        .columns
        .iter()
        .find(|c| !all.iter().any(|t| &t.name == *c))
    {
        return Err(LoadError::NoTensor {
            dir: first.dir.clone(),
            tensor: unknown.clone(),
            tensors: all.iter().map(|t| t.name.clone()).collect(),
        });
    }
    let names: Vec<&str> = all
        .iter()
        .filter(|t| opts.columns.is_empty() || opts.columns.contains(&t.name))
        .map(|t| t.name.as_str())
        .collect();
    let mut gathered = Vec::with_capacity(sources.len());
    for cache in sources {
        let inner = cache.inner.clone();
        let Some(split_index) = inner.splits.iter().position(|(n, _)| n == split_name) else {
            return Err(inner.no_split(split_name));
        };
        let tensors = inner.manifest.tensors();
        let index = |name: &str| tensors.iter().position(|t| t.name == name);
        let slots = names
            .iter()
            .map(|n| index(n).expect("a mix's caches hold the same tensors"))
            .collect();
        let length_index = tensors
            .iter()
            .position(|t| t.role == TensorRole::Length)
            .expect("validated manifest has length");
        let cold = inner.splits[split_index]
            .1
            .iter()
            .any(|s| !s.body.is_mapped());
        gathered.push(Source {
            max_len: inner.manifest.max_len(),
            cache: inner,
            split_index,
            slots,
            length_index,
            cold,
        });
    }
    let series = match opts.order.batches.windows() {
        Some(windows) => Some(SeriesPlan::new(first, windows)?),
        None => None,
    };
    // The step axis of a batch: a window's, or the longest source's L.
    let max_len = match &series {
        Some(plan) => plan.windows.len,
        None => gathered.iter().map(|s| s.max_len).max().unwrap_or(0),
    };
    let widest = sources
        .iter()
        .max_by_key(|c| c.manifest().max_len())
        .expect("at least one source");
    let loaded: Vec<&TensorSpec> = gathered[0]
        .slots
        .iter()
        .map(|&i| &first.manifest.tensors()[i])
        .collect();
    let pack = packed::size(sources, max_len, opts, &loaded)?;
    let per_context = widest.manifest().bytes_per_context();
    // A batch is allocated whole (its tensors, and its list of samples): refuse sizes this
    // machine cannot hold before multiplying them into an overflow or an allocation that
    // aborts the process.
    // A window's target steps, y_next [H, K] f32, come on top of its stored tensors.
    let horizon_bytes = series.as_ref().map_or(0, |p| {
        p.windows
            .horizon
            .saturating_mul(p.columns.len())
            .saturating_mul(4)
    });
    // The bytes of a pack's per-sequence rows alone (`max_seqs` of them): 0 when not packed.
    let mut seq_bytes = Some(0usize);
    let batch_bytes = match pack {
        None => (per_context + std::mem::size_of::<Sample>())
            .checked_add(horizon_bytes)
            .and_then(|row| row.checked_mul(opts.batch_size)),
        Some(size) => {
            let (all, seqs) = packed::batch_bytes(&loaded, first.manifest.max_len(), size);
            seq_bytes = seqs;
            all
        }
    };
    if batch_bytes.is_none_or(|b| b > memory_limit() / 2) {
        let (key, size) = match opts.order.batches.pack() {
            // A `max_seqs` given that alone is too much is named, not `pack`.
            Some(p) if p.max_seqs.is_some() && seq_bytes.is_none_or(|b| b > memory_limit() / 2) => {
                ("max_seqs", p.max_seqs.expect("given"))
            }
            Some(p) => ("pack", p.tokens),
            None => ("batch_size", opts.batch_size),
        };
        return Err(OptionError::new(
            key,
            format!(
                "{size}: one batch of this cache ({per_context} bytes per context) needs {}, \
                 more than half of this machine's memory ({}); use a smaller batch",
                batch_bytes.map_or("more than 16 EiB".into(), |b| format_size(b as u64)),
                format_size(memory_limit() as u64)
            ),
        )
        .into());
    }
    let sizes: Vec<Arc<SplitContexts>> = gathered
        .iter()
        .map(|s| {
            Arc::new(SplitContexts::of_entries(
                s.shards().iter().map(|s| &s.entry),
            ))
        })
        .collect();
    let cold = gathered.iter().any(|s| s.cold);
    let split_bytes: u64 = gathered
        .iter()
        .flat_map(|s| s.shards().iter().map(|s| s.entry.bytes))
        .sum();
    let order = order_of(sources, &sizes, opts)?;
    if cold {
        // The shards of the window being read and of the next one stay decompressed.
        let reach = match &order {
            Order::One(o) => o.shards_in_reach(),
            Order::Mix(m) => m.shards_in_reach(),
            Order::Series(s) => s.windows_order().shards_in_reach(),
        };
        for s in &gathered {
            s.cache.resident.at_least(reach);
        }
    }
    let batching = match pack {
        None => padded::batching(order.len(), opts),
        Some(size) => packed::batching(sources, &order, max_len, size, opts)?,
    };
    let keep_resident = split_bytes <= resident_budget() as u64;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = if keep_resident && !cold {
        // Hot and resident: the gather never waits on a read (LoaderOptions::threads).
        opts.threads.min(cores)
    } else {
        opts.threads
    };
    let mut layout = gather::layout(
        first.manifest.tensors(),
        &gathered[0].slots,
        opts.batch_size,
        pack,
    );
    // A mix's batches are as long as its longest source; a series window's, as the window.
    for (t, &slot) in layout.iter_mut().zip(&gathered[0].slots) {
        if pack.is_none() && gather::is_sequence(&first.manifest.tensors()[slot]) {
            t.shape[1] = max_len;
        }
    }
    if let Some(plan) = &series {
        layout.extend(plan.layout(opts.batch_size));
    }
    #[cfg(feature = "remote")]
    let plans = {
        // The next epoch's order too, so that the fetcher keeps what it starts with.
        let next = LoaderOptions {
            epoch: opts.epoch + 1,
            skip: 0,
            ..opts.clone()
        };
        let next = order_of(sources, &sizes, &next).ok();
        let from = batching.first_position(0, opts.rank) / order.window().max(1);
        crate::fetch_plan::plans(&gathered, &order, next.as_ref(), from)?
    };
    let gather = Gather {
        #[cfg(feature = "remote")]
        plans,
        stopped: std::sync::atomic::AtomicBool::new(false),
        pool: first.pool.for_this_process(),
        loaded: gathered[0].slots.len(),
        sources: gathered,
        order,
        batching,
        rank: opts.rank,
        layout,
        max_len,
        keep_resident,
        cold,
        series,
        counters: Counters::default(),
    };
    Ok((gather, threads))
}
