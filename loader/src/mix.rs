//! Several caches read as one: their contexts drawn in the proportions of fixed or scheduled
//! weights, in an order that is a pure function of (seed, epoch, weights or schedule)
//! ([`crate::order::MixOrder`]); the checks of a schedule and of its amendment at a resume.

use crate::cache::Cache;
use crate::error::LoadError;
use crate::options::LoaderOptions;
use crate::options::OrderSpec;
use crate::order::{EpochOrder, MixOrder, Order, Params, Schedule, SplitContexts, Stage};
use dsc_format::spelling::OptionError;
use dsc_format::{Encoding, TensorRole, TensorSpec};
use std::sync::Arc;

/// Caches whose batches are drawn together: the same tensors (name, dtype, role, columns, and
/// each column's encoding with its fitted parameters and vocabularies) in every cache, of any
/// `L` (batches are padded to the longest).
///
/// ```
/// use dsc_loader::{Cache, LoaderOptions, Mix, OrderSpec};
/// # let dir = tempfile::tempdir()?;
/// # for (name, seed) in [("a", 1), ("b", 2)] {
/// #     let sample = dsc_gen::icecube::IcecubeOptions {
/// #         files: 1, events_per_file: 400, seed, ..Default::default()
/// #     };
/// #     dsc_gen::icecube::generate(&dir.path().join(name), &sample)?;
/// #     let rows = dir.path().join(name).join("train/batch_*.parquet");
/// #     let mut spec = dsc_compiler::CompileSpec::new(vec![rows.display().to_string()], "event_id");
/// #     spec.features = vec!["time".into(), "charge".into()];
/// #     spec.max_len = Some(32 * seed as usize);
/// #     dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
/// #         out: dir.path().join(format!("{name}-cache")), force: false, max_memory: None,
/// #         storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
/// #     })?;
/// # }
/// # let (path_a, path_b) = (dir.path().join("a-cache"), dir.path().join("b-cache"));
/// let mix = Mix::new(vec![Cache::open(path_a)?, Cache::open(path_b)?])?;
/// let opts = LoaderOptions {
///     order: OrderSpec { weights: vec![0.7, 0.3], ..Default::default() },
///     batch_size: 100,
///     ..Default::default()
/// };
/// let mut loader = mix.loader(opts.clone())?;
/// let batch = loader.next().ok_or("no batch")??;
/// assert_eq!(batch.tensor("x").ok_or("no x")?.shape(), [100, 64, 2]); // the longer L
/// let state = loader.state();                 // the weights are part of the order
/// let rest = mix.loader_from_state(opts, &state)?;
/// assert_eq!(rest.next_step(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Mix {
    sources: Vec<Cache>,
}

impl Mix {
    /// The mix of `caches`, in this order (the order of `weights`). Refuses caches whose
    /// tensors differ, naming the tensor and how.
    pub fn new(caches: Vec<Cache>) -> Result<Mix, LoadError> {
        let Some(first) = caches.first() else {
            return Err(crate::error::Misuse::EmptyMix.into());
        };
        for other in &caches[1..] {
            if let Some((tensor, problem)) = mismatch(first.tensors(), other.tensors()) {
                return Err(LoadError::Mismatch {
                    dir: other.dir().to_path_buf(),
                    first: first.dir().to_path_buf(),
                    tensor,
                    problem,
                });
            }
        }
        Ok(Mix { sources: caches })
    }

    /// The caches mixed, in order.
    pub fn sources(&self) -> &[Cache] {
        &self.sources
    }

    /// The stored lengths of split `split` of every source, one source after another: a
    /// sample's `position` indexes it.
    pub fn lengths(&self, split: &str) -> Result<std::sync::Arc<[u32]>, LoadError> {
        crate::cache::lengths_of(&self.sources, split)
    }
}

/// The first tensor in which `other` differs from `first` beyond the length of its step axis,
/// and how.
/// Whether a stored value of a column means the same in two caches: the same encoding, its
/// fitted parameters and vocabularies included. A numeric column's `fill` (what a bad value was
/// stored as: zero, or the cache's own train mean with `nan: mean`) may differ: it imputes
/// values that were not there, in the same units as the rest.
fn same_meaning(a: &Encoding, b: &Encoding) -> bool {
    match (a, b) {
        (Encoding::Numeric { stages: sa, .. }, Encoding::Numeric { stages: sb, .. }) => sa == sb,
        _ => a == b,
    }
}

fn mismatch(first: &[TensorSpec], other: &[TensorSpec]) -> Option<(String, String)> {
    let names = |t: &[TensorSpec]| t.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    for a in first {
        let Some(b) = other.iter().find(|b| b.name == a.name) else {
            return Some((a.name.clone(), "is missing".into()));
        };
        if a.dtype != b.dtype {
            return Some((
                a.name.clone(),
                format!("is {} here, {} there", b.dtype.as_str(), a.dtype.as_str()),
            ));
        }
        if a.role != b.role {
            return Some((
                a.name.clone(),
                format!("is {:?} here, {:?} there", b.role, a.role),
            ));
        }
        // The step axis of a sequence tensor may differ: batches are padded to the longest.
        let skip = usize::from(matches!(
            a.role,
            TensorRole::Features | TensorRole::Categorical | TensorRole::Encoded
        ));
        if a.sample_shape.len() != b.sample_shape.len()
            || a.sample_shape[skip..] != b.sample_shape[skip..]
        {
            return Some((
                a.name.clone(),
                format!(
                    "has samples of shape {:?} here, {:?} there",
                    b.sample_shape, a.sample_shape
                ),
            ));
        }
        let columns = |t: &TensorSpec| t.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        if columns(a) != columns(b) {
            return Some((
                a.name.clone(),
                format!(
                    "holds columns {:?} here, {:?} there",
                    columns(b),
                    columns(a)
                ),
            ));
        }
        for (ca, cb) in a.columns.iter().zip(&b.columns) {
            if same_meaning(&ca.encoding, &cb.encoding) {
                continue;
            }
            if let (Encoding::Category { vocabulary: va }, Encoding::Category { vocabulary: vb }) =
                (&ca.encoding, &cb.encoding)
            {
                return Some((
                    a.name.clone(),
                    format!(
                        "codes column {:?} over another vocabulary ({} values here, {} \
                         there): its codes would mean different values",
                        ca.name,
                        vb.len(),
                        va.len()
                    ),
                ));
            }
            // A stored number means what its encoding makes of the source value: raw ticks
            // beside z-scores, or z-scores about two different means, would be one column of
            // values that mean different things. Re-expressing one cache's values in the
            // other's encoding would not give the bytes a compile with it gives (f32 rounding),
            // so a mix takes only equal encodings.
            return Some((
                a.name.clone(),
                format!(
                    "encodes column {:?} as {} here and as {} there: its values would mean \
                     different things in one batch. Compile the caches with the same encoding \
                     and fitted parameters: a fitted stage (zscore, minmax) is fitted on each \
                     cache's own train split, so encode without one (log1p, or none; the \
                     trainers normalise) or compile the caches' inputs together",
                    ca.name,
                    cb.encoding.describe(),
                    ca.encoding.describe()
                ),
            ));
        }
    }
    if first.len() != other.len() {
        let extra = names(other)
            .into_iter()
            .find(|n| !first.iter().any(|t| &t.name == n))
            .unwrap_or_default();
        return Some((extra, "is not in the first cache".into()));
    }
    // Same tensors, another order: batches follow the first cache's order, fine.
    None
}

/// The most positions an epoch of a mix may have: its blocks and draws are counted in `usize`
/// and `u64` arithmetic that must not wrap (2^64 - 1 positions panicked there).
const MAX_MIX_SAMPLES: usize = 1 << 48;

/// A mix's weights of sources of `lens` contexts: `given` (relative, one positive number per
/// source) or, when none are, the sources' sizes.
fn weights_of(given: &[f64], lens: &[usize]) -> Result<Vec<f64>, LoadError> {
    let bad = |problem: String| Err(OptionError::new("weights", problem).into());
    let weights: Vec<f64> = if given.is_empty() {
        lens.iter().map(|&n| n as f64).collect()
    } else {
        given.to_vec()
    };
    if weights.len() != lens.len() {
        return bad(format!(
            "gives {} weights for {} caches: one positive number per cache, in their order",
            weights.len(),
            lens.len()
        ));
    }
    if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w > 0.0)) {
        return bad(format!(
            "{w} is not a weight: one positive number per cache"
        ));
    }
    Ok(relative(weights))
}

/// Weights are relative: when their sum overflows (1e308 each), they are scaled by the largest
/// first, else each became 0 of an infinite sum. Other weights are used as given, so that every
/// existing mix keeps its order to the bit.
fn relative(weights: Vec<f64>) -> Vec<f64> {
    if weights.iter().sum::<f64>().is_finite() {
        return weights;
    }
    let largest = weights.iter().copied().fold(0.0, f64::max);
    weights.iter().map(|w| w / largest).collect()
}

/// Refuses a mix's options on one cache (of `sources` caches), whatever the shape, a single
/// weight included: every front end refuses them alike (Python refused `weights=[1.0]` where
/// `--weights 1` was taken).
pub(crate) fn refuse_mix_options(sources: usize, opts: &LoaderOptions) -> Result<(), LoadError> {
    let o = &opts.order;
    let given = !o.weights.is_empty() || !o.schedule.is_empty() || o.mix_samples.is_some();
    if sources == 1 && given {
        let key = if o.mix_samples.is_some() {
            "mix_samples"
        } else if !o.schedule.is_empty() {
            "schedule"
        } else {
            "weights"
        };
        let problem = "is for a mix: pass two or more caches (one was given)";
        return Err(OptionError::new(key, problem).into());
    }
    Ok(())
}

/// The epoch's order of one split's contexts (`one`: its contexts per shard) that `opts` ask
/// for.
pub(crate) fn epoch_order(one: &Arc<SplitContexts>, opts: &LoaderOptions) -> EpochOrder {
    let o = &opts.order;
    EpochOrder::over(
        one.clone(),
        o.shuffle,
        o.seed,
        opts.epoch,
        o.window,
        o.interleave,
    )
}

/// The epoch's order of whole contexts over `sizes` (each source's contexts per shard): one
/// split's, or a mix's drawn as its weights or schedule have it.
pub(crate) fn order(
    sources: &[Cache],
    sizes: &[Arc<SplitContexts>],
    opts: &LoaderOptions,
) -> Result<Order, LoadError> {
    let o = &opts.order;
    let bad = |key, problem: String| Err(OptionError::new(key, problem).into());
    if let [one] = sizes {
        return Ok(Order::One(epoch_order(one, opts)));
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
    let schedule = schedule_of(sources, o, &lens, samples)?;
    let params = Params {
        shuffle: o.shuffle,
        seed: o.seed,
        window: o.window,
        interleave: o.interleave,
    };
    Ok(Order::Mix(MixOrder::scheduled(
        sizes,
        Arc::new(schedule),
        params,
        opts.epoch,
    )))
}

/// The most stages a schedule may have.
pub const MAX_STAGES: usize = 4096;

/// The schedule of the mix `o` asks for over sources of `lens` contexts, `samples` positions
/// per epoch: fixed weights (given, or the sources' sizes) as they have always been drawn, or
/// its stages, each checked and named by its index when refused.
fn schedule_of(
    sources: &[Cache],
    o: &OrderSpec,
    lens: &[usize],
    samples: usize,
) -> Result<Schedule, LoadError> {
    let block = o.window.max(1);
    let bad = |problem: String| Err(OptionError::new("schedule", problem).into());
    if o.schedule.is_empty() {
        let weights = weights_of(&o.weights, lens)?;
        let sum: f64 = weights.iter().sum();
        if let Some(s) = weights
            .iter()
            .position(|&w| under_a_position(w, sum, block))
        {
            return Err(OptionError::new(
                "weights",
                format!(
                    "{:e} of cache {} is under one position in a window of {block}: raise it \
                     or the `window`",
                    o.weights.get(s).copied().unwrap_or(weights[s]),
                    sources[s].dir().display()
                ),
            )
            .into());
        }
        let normal = weights.iter().map(|w| w / sum).collect();
        return Ok(Schedule::fixed(normal, samples as u64, block as u64));
    }
    if !o.weights.is_empty() {
        return Err(OptionError::new(
            "weights",
            "and `schedule` exclude each other: `weights` is the schedule of one stage from 0",
        )
        .into());
    }
    if o.schedule.len() > MAX_STAGES {
        return bad(format!(
            "has {} stages: at most {MAX_STAGES}",
            o.schedule.len()
        ));
    }
    let stages = (0..o.schedule.len())
        .map(|i| checked_stage(sources, &o.schedule, i, block))
        .collect::<Result<Vec<Stage>, LoadError>>()?;
    let schedule = Schedule::new(&stages, samples as u64, block as u64);
    // Weights take effect at block starts: a stage whose span holds none is never drawn.
    for (i, pair) in stages.windows(2).enumerate() {
        let starts = schedule.effective(pair[0].at);
        if starts >= pair[1].at {
            return bad(format!(
                "stage {i} spans positions {}..{}, which hold no start of a window of {block} \
                 positions (epochs of {samples}): its weights would never be drawn. Weights \
                 take effect at the first window that starts at or after their stage: space \
                 the stages a window apart, or lower the `window`",
                pair[0].at, pair[1].at
            ));
        }
    }
    Ok(schedule)
}

/// Whether weight `w` of weights summing to `sum` draws from a cache (it is positive) but less
/// than one position of a block of `block`: refused, as its blocks could take a seat back.
fn under_a_position(w: f64, sum: f64, block: usize) -> bool {
    w > 0.0 && w / sum * (block as f64) < 1.0
}

/// Stage `i` of `schedule` over `sources`, checked (its start, its weights, each drawn cache at
/// least one position of a block of `block`), its weights scaled when their sum overflows.
fn checked_stage(
    sources: &[Cache],
    schedule: &[Stage],
    i: usize,
    block: usize,
) -> Result<Stage, LoadError> {
    let bad = |problem: String| Err(OptionError::new("schedule", problem).into());
    let stage = &schedule[i];
    if i == 0 && stage.at != 0 {
        return bad(format!(
            "stage 0 starts at {}: the first stage starts at position 0",
            stage.at
        ));
    }
    if i == 0 && stage.linear {
        return bad(
            "stage 0 is linear: a linear stage moves from the previous stage's weights, and the \
             first has none"
                .into(),
        );
    }
    if let Some(prev) = i.checked_sub(1).map(|p| &schedule[p]) {
        if stage.at <= prev.at {
            return bad(format!(
                "stage {i} starts at {}, not after stage {} ({}): stages start at increasing \
                 positions",
                stage.at,
                i - 1,
                prev.at
            ));
        }
    }
    if stage.weights.len() != sources.len() {
        return bad(format!(
            "stage {i} gives {} weights for {} caches: one per cache, in their order",
            stage.weights.len(),
            sources.len()
        ));
    }
    if let Some(w) = stage
        .weights
        .iter()
        .find(|w| !(w.is_finite() && **w >= 0.0))
    {
        return bad(format!(
            "stage {i}: {w} is not a weight: one number of at least 0 per cache"
        ));
    }
    if stage.weights.iter().all(|&w| w == 0.0) {
        return bad(format!(
            "stage {i} weighs every cache 0: a stage draws from one cache at least"
        ));
    }
    let weights = relative(stage.weights.clone());
    let sum: f64 = weights.iter().sum();
    if let Some(s) = weights
        .iter()
        .position(|&w| under_a_position(w, sum, block))
    {
        return bad(format!(
            "stage {i}: {:e} of cache {} is under one position in a window of {block}: raise \
             it, make it 0 (the cache left out) or raise the `window`",
            stage.weights[s],
            sources[s].dir().display()
        ));
    }
    Ok(Stage {
        weights,
        ..stage.clone()
    })
}

/// Refuses a schedule `new` that differs from `old` (the state's) before global position `g`
/// of the run (where the state was taken), naming the first stage that differs: the stages
/// that start at or before `g`, and a linear stage that ramps through it, must be the same;
/// those after may change, and apply from the first block that starts after `g`. `sizes`: the
/// weights of a mix that gives none.
pub(crate) fn check_amendment(
    old: &[Stage],
    new: &[Stage],
    g: u64,
    sizes: &[usize],
) -> Result<(), LoadError> {
    let or_sizes = |s: &[Stage]| match s.is_empty() {
        true => vec![Stage {
            at: 0,
            weights: sizes.iter().map(|&n| n as f64).collect(),
            linear: false,
        }],
        false => s.to_vec(),
    };
    let in_force = |s: &[Stage]| {
        let mut kept: Vec<Stage> = s.iter().take_while(|x| x.at <= g).cloned().collect();
        kept.extend(s.iter().find(|x| x.at > g).filter(|x| x.linear).cloned());
        kept
    };
    let (was, now) = (in_force(&or_sizes(old)), in_force(&or_sizes(new)));
    if was == now {
        return Ok(());
    }
    let i = was
        .iter()
        .zip(&now)
        .position(|(a, b)| a != b)
        .unwrap_or(was.len().min(now.len()));
    let show = |s: Option<&Stage>, given: &[Stage]| match s {
        None => "none".to_string(),
        Some(_) if given.is_empty() => "the caches' sizes as weights".to_string(),
        Some(s) => serde_json::to_string(s).expect("a stage serialises"),
    };
    // A linear stage after the position ramps from the stage before it: from before it.
    let ramp = [&was, &now]
        .iter()
        .any(|s| s.get(i).is_some_and(|s| s.linear && s.at > g));
    let why = match ramp {
        true => format!(
            "Stage {i} is linear and after the position, but its ramp starts at stage {}'s, \
             before it: to move the weights from here, first add a stage after the position \
             with the weights in force, then the linear one",
            i.saturating_sub(1)
        ),
        false => "A resume may change the stages that start after that position only (they \
                  apply from the next window of positions)"
            .to_string(),
    };
    Err(LoadError::State {
        field: "schedule".into(),
        problem: format!(
            "stage {i} differs before the position the state was taken at ({g}): the state ran \
             {}, the options give {}. {why}",
            show(was.get(i), old),
            show(now.get(i), new)
        ),
    })
}
