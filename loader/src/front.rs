//! Where loaders are made: the same calls on one cache and on a mix of caches, each a front
//! over the same functions of the caches read (`&[Cache]`), so that a loader of one cache is a
//! loader of a mix of one.

use crate::cache::Cache;
use crate::error::LoadError;
use crate::loader::Loader;
use crate::mix::Mix;
use crate::options::{LoaderOptions, Start, State};
use crate::prepare::{prepare, Planned};
use crate::stats::LoaderStats;

impl Cache {
    /// What this cache's compressed shards have cost its loaders so far (reads, stored bytes
    /// fetched, hits, evictions; the other fields of [`LoaderStats`] are zero).
    pub fn shard_stats(&self) -> LoaderStats {
        self.inner.resident.counters.snapshot()
    }

    /// A loader for one epoch of one split.
    pub fn loader(&self, opts: LoaderOptions) -> Result<Loader, LoadError> {
        Loader::new(std::slice::from_ref(self), opts, 0)
    }

    /// A loader that starts at step `step` of its epoch (as [`Cache::loader_from_state`] does
    /// for a state `step` global batches into the epoch).
    pub fn loader_at(&self, opts: LoaderOptions, step: usize) -> Result<Loader, LoadError> {
        Loader::new(std::slice::from_ref(self), opts, step)
    }

    /// The epoch a loader with `opts` would run, planned without starting one: the options
    /// checked, the order made and cut into steps (for packed batches, a pass over the
    /// epoch's order). Ask it for its steps and layout; start its loader with
    /// [`Planned::loader_at`], which plans nothing again.
    pub fn plan(&self, opts: &LoaderOptions) -> Result<Planned, LoadError> {
        prepare(std::slice::from_ref(self), opts)
    }

    /// A loader that continues exactly where `state` was taken: the state's order (seed,
    /// shuffle, window, bucketing, packing, …) and epoch replace those of `opts`. The options
    /// must name the same split and give the same global batch (`batch_size * world_size`, or
    /// `world_size` packs); `rank` and `world_size` may differ, so a run can resume on another
    /// number of GPUs. To refuse a state whose order differs from the options instead, check it
    /// first with [`State::check`].
    pub fn loader_from_state(
        &self,
        opts: LoaderOptions,
        state: &State,
    ) -> Result<Loader, LoadError> {
        from_state(std::slice::from_ref(self), opts, state)
    }
}

/// [`Cache::loader_from_state`] of one cache or a mix's sources.
pub(crate) fn from_state(
    sources: &[Cache],
    mut opts: LoaderOptions,
    state: &State,
) -> Result<Loader, LoadError> {
    if let Some(id) = &state.content_id {
        let here = crate::cache::content_of(sources.iter().map(Cache::manifest));
        let stored: Vec<String> = sources.iter().map(|c| c.manifest().stored_id()).collect();
        if *id != here && *id != stored.join("+") {
            return Err(LoadError::State {
                field: "content_id".into(),
                problem: format!(
                    "the state was taken over data with content id {id}, these caches hold \
                     {here}: open the generation it read (`--generation {id}`, \
                     `generation=\"{id}\"`), which a resume of the CLI, dsc.Loader and the \
                     trainers does by itself"
                ),
            });
        }
    }
    let start = state.start(&opts)?;
    // The state's order, but for a schedule the options amend.
    let asked = opts.order.stages();
    let amended = !asked.is_empty() && asked != state.order.stages();
    let mut order = state.order.clone();
    if amended {
        order.weights = std::mem::take(&mut opts.order.weights);
        order.schedule = std::mem::take(&mut opts.order.schedule);
    }
    opts.order = order;
    opts.epoch = state.epoch;
    if amended {
        check_amendment(sources, &opts, state)?;
    }
    opts.skip = start.skip;
    Loader::new(sources, opts, start.step)
}

/// Refuses `opts`' schedule where it differs from `state`'s before the position the state was
/// taken at ([`crate::mix::check_amendment`]): that position is found in the epoch `opts`
/// plan (a state of packs counts packs).
fn check_amendment(
    sources: &[Cache],
    opts: &LoaderOptions,
    state: &State,
) -> Result<(), LoadError> {
    let from_start = LoaderOptions {
        epoch: state.epoch,
        skip: 0,
        ..opts.clone()
    };
    let planned = prepare(sources, &from_start)?;
    let Some((order, _, g)) = planned.epoch.mix_position(state.epoch, state.samples) else {
        return Ok(());
    };
    crate::mix::check_amendment(
        &state.order.stages(),
        &opts.order.stages(),
        g,
        &order.lens(),
    )
}

impl Mix {
    /// A loader for one epoch of the mix ([`crate::order::MixOrder`]: what an epoch is).
    pub fn loader(&self, opts: LoaderOptions) -> Result<Loader, LoadError> {
        Loader::new(self.sources(), opts, 0)
    }

    /// A loader that starts at step `step` of its epoch.
    pub fn loader_at(&self, opts: LoaderOptions, step: usize) -> Result<Loader, LoadError> {
        Loader::new(self.sources(), opts, step)
    }

    /// The epoch a loader with `opts` would run, planned ([`Cache::plan`]).
    pub fn plan(&self, opts: &LoaderOptions) -> Result<Planned, LoadError> {
        prepare(self.sources(), opts)
    }

    /// Checks that `state` resumes a loader of this mix with `opts`: [`State::check`], but for
    /// the schedule (or weights), which may differ from the state's in the stages that start
    /// after the position the state was taken at (they apply from the next block of
    /// positions); a stage that differs before it is refused, by its index. Returns where to
    /// start.
    pub fn check_state(&self, opts: &LoaderOptions, state: &State) -> Result<Start, LoadError> {
        let start = state.check_unweighted(opts)?;
        if opts.order.stages() != state.order.stages() {
            check_amendment(self.sources(), opts, state)?;
        }
        Ok(start)
    }

    /// A loader that continues exactly where `state` was taken ([`Cache::loader_from_state`]);
    /// a schedule in `opts` amends the state's past its position ([`Mix::check_state`]).
    pub fn loader_from_state(
        &self,
        opts: LoaderOptions,
        state: &State,
    ) -> Result<Loader, LoadError> {
        from_state(self.sources(), opts, state)
    }
}

impl Planned {
    /// The loader of this epoch, starting at step `step`.
    pub fn loader_at(self, step: usize) -> Result<Loader, LoadError> {
        Loader::start(self, step)
    }

    /// This plan for a loader of `opts`, when they ask for the same epoch (they may differ in
    /// the loader's threads and prefetch, which do not change a batch, and are checked here);
    /// `None` otherwise.
    pub fn for_options(mut self, opts: &LoaderOptions) -> Result<Option<Planned>, LoadError> {
        let same = LoaderOptions {
            threads: self.opts.threads,
            prefetch: self.opts.prefetch,
            ..opts.clone()
        };
        if same != self.opts {
            return Ok(None);
        }
        opts.check()?;
        self.opts = opts.clone();
        Ok(Some(self))
    }
}
