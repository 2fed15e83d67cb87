//! What a loader builds its batches from, planned once per epoch: the options checked, each
//! source's split, and the room of the batch shape ([`crate::shape`]) that makes the epoch's
//! order and cuts it into steps.

use crate::cache::Cache;
use crate::epoch::Epoch;
use crate::error::LoadError;
use crate::gather::{Reader, Source};
use crate::options::LoaderOptions;
use crate::order::{Order, SplitContexts};
use crate::shape::{self, memory_limit, Planning};
use crate::stats::Counters;
use dsc_format::TensorRole;
use std::sync::Arc;

/// Mapped bytes of a split up to which its pages are kept resident: a quarter of the memory
/// this process may use (the machine's, or its cgroup's limit when lower). Releasing pages
/// behind the reader (`MADV_DONTNEED`) bounds the resident set, but costs a page-table
/// teardown, a TLB shootdown and a fault for every page on every epoch: measured on the 344 MB
/// loader benchmark cache, keeping it resident and hinting each tensor of a shard once raises
/// the shuffled rate about 1.7x (docs/PERFORMANCE.md). The pages are clean page-cache pages
/// either way, which the kernel can reclaim under pressure; only the reported RSS differs.
fn resident_budget() -> usize {
    memory_limit() / 4
}

/// One epoch of a loader of `opts` over `sources` (one cache, or a mix's), planned: the
/// options checked against the caches, the order made and cut into steps. Its threads are
/// [`Planned::threads`].
#[derive(Debug)]
pub struct Planned {
    pub(crate) epoch: Epoch,
    pub(crate) opts: LoaderOptions,
}

impl Planned {
    /// Steps (batches per rank) of the epoch.
    pub fn steps(&self) -> usize {
        self.epoch.steps()
    }

    /// The tensors of every batch, whole (untrimmed): the stored tensors asked for, in
    /// manifest order, then the shape's own (a pack's five, a series window's).
    pub fn layout(&self) -> &[crate::TensorLayout] {
        &self.epoch.layout
    }

    /// Where a mix's run stands on its weights at `step` of this epoch ([`crate::Loader::
    /// mix_progress`]); `None` for one cache.
    pub fn mix_progress(&self, step: usize) -> Option<crate::order::Progress> {
        self.epoch.mix_progress(&self.opts, step)
    }

    /// The parts of a batch's index ([`crate::Loader::index_layout`]).
    pub fn index_layout(&self) -> Option<crate::IndexLayout> {
        self.epoch.index_layout()
    }

    /// The loader threads to run: those asked for, at most one per core when the split is hot
    /// and kept resident (the gather never waits on a read: [`LoaderOptions::threads`]).
    pub(crate) fn threads(&self) -> usize {
        let reader = &self.epoch.reader;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        match reader.keep_resident && !reader.cold {
            true => self.opts.threads.min(cores),
            false => self.opts.threads,
        }
    }
}

/// The sources of `opts` over `caches`: each cache's split and the tensors loaded from it.
fn sources(caches: &[Cache], opts: &LoaderOptions) -> Result<Vec<Source>, LoadError> {
    let first = &caches[0].inner;
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
    let mut sources = Vec::with_capacity(caches.len());
    for cache in caches {
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
        sources.push(Source {
            max_len: inner.manifest.max_len(),
            cache: inner,
            split_index,
            slots,
            length_index,
            cold,
        });
    }
    Ok(sources)
}

/// The epoch of `opts` over `caches` (one cache, or a mix's sources), planned once.
pub(crate) fn prepare(caches: &[Cache], opts: &LoaderOptions) -> Result<Planned, LoadError> {
    opts.check()?;
    let sources = sources(caches, opts)?;
    let sizes: Vec<Arc<SplitContexts>> = sources
        .iter()
        .map(|s| {
            Arc::new(SplitContexts::of_entries(
                s.shards().iter().map(|s| &s.entry),
            ))
        })
        .collect();
    let planning = Planning {
        caches,
        sources: &sources,
        sizes: &sizes,
        opts,
    };
    let cut = shape::plan(&planning)?;
    let cold = sources.iter().any(|s| s.cold);
    if cold {
        // The shards of the window being read and of the next one stay decompressed.
        let reach = match &cut.order {
            Order::One(o) => o.shards_in_reach(),
            Order::Mix(m) => m.shards_in_reach(),
            Order::Series(s) => s.windows_order().shards_in_reach(),
        };
        for s in &sources {
            s.cache.resident.at_least(reach);
        }
    }
    let split_bytes: u64 = sources
        .iter()
        .flat_map(|s| s.shards().iter().map(|s| s.entry.bytes))
        .sum();
    #[cfg(feature = "remote")]
    let plans = {
        // The next epoch's order too, so that the fetcher keeps what it starts with.
        let next = LoaderOptions {
            epoch: opts.epoch + 1,
            skip: 0,
            ..opts.clone()
        };
        let next = shape::order(&planning, &next).ok();
        let from = cut.shape.first_position(0, opts.rank) / cut.order.window().max(1);
        crate::fetch_plan::plans(&sources, &cut.order, next.as_ref(), from)?
    };
    let first = &caches[0].inner;
    let reader = Reader {
        #[cfg(feature = "remote")]
        plans,
        stopped: std::sync::atomic::AtomicBool::new(false),
        loaded: sources[0].slots.len(),
        sources,
        max_len: cut.max_len,
        keep_resident: split_bytes <= resident_budget() as u64,
        cold,
    };
    let epoch = Epoch {
        reader,
        order: cut.order,
        shape: cut.shape,
        rank: opts.rank,
        layout: cut.layout,
        pool: first.pool.for_this_process(),
        counters: Counters::default(),
    };
    Ok(Planned {
        epoch,
        opts: opts.clone(),
    })
}
