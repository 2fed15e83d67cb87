//! What a loader is asked for, and where it stands.
//!
//! [`OrderSpec`] holds every option that decides which contexts an epoch's batches hold and in
//! which order (the split, the seed, the shuffle window, bucketing, packing, …). A resume state
//! ([`State`]) is that spec plus a position, so an option added to the order is kept by every
//! checkpoint without further code: [`LoaderOptions`] contains the spec, [`State`] contains it,
//! and [`State::new`] is the one place a state is made.

use crate::error::LoadError;
use crate::order::{SeriesWindows, Stage, DEFAULT_INTERLEAVE, DEFAULT_WINDOW};
use dsc_format::spelling::OptionError;
use serde::{Deserialize, Serialize};

/// Everything that decides an epoch's batches apart from the epoch number and the global
/// batch: what a resume state keeps. Every field has a documented default.
///
/// Unknown fields are ignored when read: a [`State`] holds these fields flattened beside its
/// own, and a caller may keep more keys in the same JSON object (Python adds its own). The
/// JSON is flat, as states have always been written: the shape by its three keys (`bucket`,
/// `pack`, `series`, [`shape_keys`]), so that a state that names two shapes is refused when
/// read and nothing past this point can hold one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderSpec {
    /// Split to read [default: `train`].
    pub split: String,
    /// Seed of the epoch order [default: 0].
    pub seed: u64,
    /// Shuffle the epoch (window shuffle) [default: true].
    pub shuffle: bool,
    /// Contexts permuted together in a shuffled epoch; resident memory is about
    /// `3 * window * bytes per context` (the window read, the one before, the one ahead)
    /// [default: 4096].
    pub window: usize,
    /// Shards read side by side, so that each window mixes this many shards [default: 8].
    pub interleave: usize,
    /// Drop the last partial global batch; otherwise complete it by repeating the epoch's first
    /// contexts (with packs: its first packs) [default: true].
    pub drop_last: bool,
    /// What a batch is: padded contexts, length-bucketed ones, packs or series windows
    /// [default: padded]. States from before a shape existed read as without it.
    #[serde(flatten, with = "shape_keys")]
    pub batches: Batches,
    /// A mix's weights, one per source ([`crate::Mix`]): each block of `window` positions
    /// holds each source in these proportions (normalised). Empty: each source in proportion
    /// to its size, as if the splits were one [default: empty].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<f64>,
    /// A mix's schedule: weights that change along the run, stage by stage
    /// ([`crate::order::Stage`], docs/FORMAT.md §8.6). Not with `weights`, which is the
    /// schedule of one stage. A resume may amend it past the position it was taken at
    /// ([`crate::Mix::check_state`]) [default: empty].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<Stage>,
    /// Positions in an epoch of a mix; sources that run out continue with their next epoch
    /// [default: none, as many as the sources hold together].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_samples: Option<usize>,
}

impl Default for OrderSpec {
    fn default() -> Self {
        OrderSpec {
            split: "train".into(),
            seed: 0,
            shuffle: true,
            window: DEFAULT_WINDOW,
            interleave: DEFAULT_INTERLEAVE,
            drop_last: true,
            batches: Batches::Padded,
            weights: Vec::new(),
            schedule: Vec::new(),
            mix_samples: None,
        }
    }
}

impl OrderSpec {
    /// The stages of a mix's weights: its schedule, `weights` as the one stage from 0, or none
    /// (the caches' sizes).
    pub fn stages(&self) -> Vec<Stage> {
        if !self.schedule.is_empty() {
            return self.schedule.clone();
        }
        if self.weights.is_empty() {
            return Vec::new();
        }
        vec![Stage {
            at: 0,
            weights: self.weights.clone(),
            linear: false,
        }]
    }

    /// This order without its mix's weights and schedule: what a resume that may amend the
    /// schedule compares.
    fn unweighted(&self) -> OrderSpec {
        OrderSpec {
            weights: Vec::new(),
            schedule: Vec::new(),
            ..self.clone()
        }
    }
}

/// The shape of an epoch's batches: one of four, so that shapes that exclude each other cannot
/// be asked for together. Each cuts the same shuffled order its own way; the order (and so a
/// resume state) records which.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Batches {
    /// `batch_size` whole contexts per rank and step, padded to the cache's `L` (or, with
    /// [`LoaderOptions::trim`], cut to the batch's longest sequence).
    #[default]
    Padded,
    /// Length-bucketed: inside each window, contexts of similar stored length form a global
    /// batch, the batches come in random order, and each is trimmed to its longest sequence
    /// (rounded up the ladder of [`LoaderOptions::trim`], exact when `None`). The window is
    /// rounded up to a multiple of the global batch. Still one pass over every context, exact
    /// resume and equal batches per rank. Not with a mix (buckets are cut from one cache's
    /// windows).
    Bucketed,
    /// Packed batches: whole sequences laid end to end in a fixed budget of tokens, so that
    /// every batch has the same shapes and almost no padding (see [`crate::pack`]). A batch is
    /// one pack per rank; `batch_size` is not used.
    Packed(Pack),
    /// Windows cut from long series: a sample is `len` consecutive stored steps of one context,
    /// starting at a multiple of `stride`, with the next `horizon` steps of chosen columns as
    /// its target ([`SeriesWindows`]); the epoch shuffles windows across all contexts as it
    /// shuffles contexts. Not with a mix.
    Windows(SeriesWindows),
}

impl Batches {
    /// The pack size, for packed batches.
    pub fn pack(&self) -> Option<Pack> {
        match self {
            Batches::Packed(p) => Some(*p),
            _ => None,
        }
    }

    /// The windows, for series windows.
    pub fn windows(&self) -> Option<&SeriesWindows> {
        match self {
            Batches::Windows(w) => Some(w),
            _ => None,
        }
    }

    /// Whether batches are length-bucketed.
    pub fn is_bucketed(&self) -> bool {
        matches!(self, Batches::Bucketed)
    }

    /// Whether a batch holds whole contexts with a padded step axis: the shapes that
    /// [`LoaderOptions::trim`] cuts.
    pub fn is_padded(&self) -> bool {
        matches!(self, Batches::Padded | Batches::Bucketed)
    }

    /// Refuses to trim batches without padding: packs and series windows.
    pub fn check_trim(&self) -> Result<(), OptionError> {
        let problem = match self {
            Batches::Padded | Batches::Bucketed => return Ok(()),
            Batches::Packed(_) => {
                "has no meaning for packed batches (`pack`): a pack holds no padding to cut"
            }
            Batches::Windows(_) => {
                "cannot be used with series windows (`series_window`): every window is as long \
                 already"
            }
        };
        Err(OptionError::new("trim", problem))
    }

    /// Refuses shapes that change from batch to batch for a step that replays one: static
    /// buffers and CUDA graphs (`dsc.Loader(static=True)`, `dsc-train --graph`,
    /// `examples/train.py --graph`, each asking this one rule). Bucketed batches have a shape
    /// per bucket, and padded ones `trimmed` a shape per length; packs, series windows and
    /// untrimmed padded batches have one.
    pub fn static_shape(&self, trimmed: bool) -> Result<(), OptionError> {
        const REPLAYS: &str = "and a captured step (static buffers, CUDA graphs) replays one";
        match self {
            Batches::Bucketed => Err(OptionError::given(
                "bucket",
                true,
                format!(
                    "makes a batch shape per bucket, {REPLAYS}: use `pack` for one shape \
                     without padding"
                ),
            )),
            Batches::Padded if trimmed => Err(OptionError::given(
                "trim",
                true,
                format!(
                    "cuts each batch to its longest sequence, a shape per length, {REPLAYS}: \
                     leave it off (batches padded to the cache's length), or use `pack` for \
                     one shape without padding"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The option that asks for this shape, by key (`None` for the default, padded).
    pub fn key(&self) -> Option<&'static str> {
        match self {
            Batches::Padded => None,
            Batches::Bucketed => Some("bucket"),
            Batches::Packed(_) => Some("pack"),
            Batches::Windows(_) => Some("series_window"),
        }
    }

    /// The shape asked for by its three options, or the first two that exclude each other,
    /// by key.
    pub fn from_options(
        bucket: bool,
        pack: Option<Pack>,
        series: Option<SeriesWindows>,
    ) -> Result<Batches, OptionError> {
        let windows = "cannot be used with series windows (`series_window`)";
        match (bucket, pack, series) {
            (false, None, None) => Ok(Batches::Padded),
            (true, None, None) => Ok(Batches::Bucketed),
            (false, Some(p), None) => Ok(Batches::Packed(p)),
            (false, None, Some(w)) => Ok(Batches::Windows(w)),
            (true, Some(_), _) => Err(OptionError::new(
                "bucket",
                "and `pack` exclude each other: a pack has no padding for bucketing to save",
            )),
            (true, None, Some(_)) => Err(OptionError::new(
                "bucket",
                format!("{windows}: every window has the same length already"),
            )),
            (false, Some(_), Some(_)) => Err(OptionError::new(
                "pack",
                format!("{windows}: a window is its own fixed length"),
            )),
        }
    }
}

/// [`Batches`] as states have always written it: `bucket`, and `pack` or `series` when given.
mod shape_keys {
    use super::{Batches, Pack};
    use crate::order::SeriesWindows;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Keys {
        /// Absent in states from before bucketing: false.
        #[serde(default)]
        bucket: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pack: Option<Pack>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        series: Option<SeriesWindows>,
    }

    pub fn serialize<S: Serializer>(b: &Batches, s: S) -> Result<S::Ok, S::Error> {
        Keys {
            bucket: b.is_bucketed(),
            pack: b.pack(),
            series: b.windows().cloned(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Batches, D::Error> {
        let k = Keys::deserialize(d)?;
        Batches::from_options(k.bucket, k.pack, k.series).map_err(serde::de::Error::custom)
    }
}

/// The size of a packed batch.
///
/// Packed batches (docs/GUIDE.md, "Packed batches"):
///
/// ```
/// # use dsc_loader::{Batches, Cache, LoaderOptions, OrderSpec, Pack};
/// # let dir = tempfile::tempdir()?;
/// # std::env::set_current_dir(dir.path())?;
/// # let sample = dsc_gen::icecube::IcecubeOptions {
/// #     files: 2, events_per_file: 300, seed: 7, ..Default::default()
/// # };
/// # dsc_gen::icecube::generate(std::path::Path::new("data"), &sample)?;
/// # let mut spec = dsc_compiler::CompileSpec::new(vec!["data/train/batch_*.parquet".into()], "event_id");
/// # spec.features = vec!["time".into(), "charge".into()];
/// # spec.max_len = Some(64);
/// # dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
/// #     out: "cache".into(), force: false, max_memory: None,
/// #     storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
/// # })?;
/// # let cache = Cache::open("cache")?;
/// # let packed = OrderSpec { batches: Batches::Packed(Pack::tokens(32_768)), ..Default::default() };
/// # let all = cache.loader(LoaderOptions { order: packed, ..Default::default() })?.count();
/// # fn i32s(b: &[u8]) -> impl Iterator<Item = i32> + '_ {
/// #     b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
/// # }
/// let opts = LoaderOptions {
///     order: OrderSpec { batches: Batches::Packed(Pack::tokens(32_768)), ..Default::default() },
///     ..Default::default()
/// };
/// let mut loader = cache.loader(opts.clone())?;
/// for batch in (&mut loader).take(2) {
///     let batch = batch?;
///     let pack = batch.pack.expect("packed");     // seqs, tokens, max_seqlen, repeated
///     let x = batch.tensor("x").ok_or("no x")?;   // f32 [T, F]
///     let cu: Vec<i32> = i32s(batch.tensor("cu_seqlens").ok_or("no cu")?.bytes()).collect();
///     // sequence i: rows cu[i]..cu[i + 1] of x, row i of every per-context tensor
/// }
/// let state = loader.state();                     // the pack size is part of the order
/// let rest = cache.loader_from_state(opts, &state)?.count();
/// # assert_eq!(all.min(2) + rest, all); // the state continues with the packs not yet taken
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pack {
    /// Tokens (stored steps) per pack, `T`: the length of every per-step tensor. At least the
    /// cache's `L`, so that any sequence fits.
    pub tokens: usize,
    /// Sequences per pack at most, `S`: the length of every per-context tensor. `None` derives
    /// it from `tokens` and the cache's stored lengths ([`crate::pack::default_max_seqs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seqs: Option<usize>,
}

impl Pack {
    /// Packs of `tokens` tokens, the sequence count derived from the lengths.
    pub fn tokens(tokens: usize) -> Pack {
        Pack {
            tokens,
            max_seqs: None,
        }
    }
}

/// What to load. Every field has a documented default (`LoaderOptions::default()`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderOptions {
    /// The order of the epochs: split, seed, shuffle, bucketing, packing, …
    pub order: OrderSpec,
    /// Contexts per batch per rank [default: 256]; not used with packs ([`Batches::Packed`]).
    pub batch_size: usize,
    /// Epoch number: each epoch has its own order [default: 0].
    pub epoch: u64,
    /// Units of the epoch (contexts, or packs) consumed before this loader's first step: its
    /// step 0 starts there [default: 0]. [`crate::Cache::loader_from_state`] sets it to resume
    /// at another global batch; with the same global batch a resume starts at a whole step.
    pub skip: usize,
    /// This process's rank [default: 0].
    pub rank: usize,
    /// Number of ranks [default: 1].
    pub world_size: usize,
    /// Batches prepared ahead per thread [default: 4].
    pub prefetch: usize,
    /// Background threads preparing batches; 0 prepares them in the caller's thread
    /// [default: 1]. An uncompressed split kept resident (one that fits a quarter of memory) runs
    /// at most one thread per core the process may use: its gather never waits on the disk,
    /// so further threads only take turns on the same cores (3 threads on 2 cores gathered
    /// a fifth slower than 2). [`crate::Loader::threads`] says how many run.
    pub threads: usize,
    /// Cut each padded batch's sequence tensors to its longest stored sequence, rounded up the
    /// ladder of this multiple ([`crate::order::trimmed_len`]: 1, 2, 3, 4 times it, then four
    /// sizes per doubling, never past `L`), so that a run sees a handful of shapes instead of
    /// one per length; `Some(1)` cuts to exact lengths [default: none, padded to `L`]. A GPU
    /// pays for every new shape (allocator blocks, kernel choices, a recompile under
    /// `torch.compile`); a CPU pays only for the padding. Length-bucketed batches are always
    /// cut (exactly when `None`); packs and series windows have no padding to cut. The layout
    /// of a batch, not its contexts: a resume state does not keep it, so a run may resume with
    /// another.
    pub trim: Option<usize>,
    /// The tensors to load, by name, in manifest order whatever the order given; empty loads
    /// every tensor [default: empty]. Leaving out tensors the model does not read saves their
    /// gather.
    pub columns: Vec<String>,
}

/// Contexts per batch per rank unless asked otherwise ([`LoaderOptions::batch_size`]).
pub const DEFAULT_BATCH_SIZE: usize = 256;

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            order: OrderSpec::default(),
            batch_size: DEFAULT_BATCH_SIZE,
            epoch: 0,
            skip: 0,
            rank: 0,
            world_size: 1,
            prefetch: 4,
            threads: 1,
            trim: None,
            columns: Vec::new(),
        }
    }
}

/// The most a trimmed length may be rounded by ([`LoaderOptions::trim`]).
pub const MAX_TRIM_MULTIPLE: usize = 1 << 16;

/// Refuses a trim multiple outside `1..=MAX_TRIM_MULTIPLE`, by its key.
pub(crate) fn check_trim_multiple(m: usize) -> Result<(), OptionError> {
    if (1..=MAX_TRIM_MULTIPLE).contains(&m) {
        return Ok(());
    }
    Err(OptionError::given(
        "trim_multiple",
        m,
        format!("is not between 1 (exact lengths) and {MAX_TRIM_MULTIPLE}"),
    ))
}

/// The trim multiple the front ends default to when batches go to a GPU (`dsc.Loader` with a
/// CUDA device, `dsc-train` on CUDA): trimmed lengths round up the ladder of 16
/// ([`crate::order::trimmed_len`]), so L = 128 gives 8 shapes instead of up to 128, each reused
/// step after step (a GPU pays for every new shape: allocator blocks, kernel choice), and bf16
/// tensor-core tiles stay whole. On the CPU every length is its own (1).
pub const GPU_TRIM_MULTIPLE: usize = 16;

/// The most loader threads a loader accepts ([`LoaderOptions::threads`]): with
/// [`MAX_PREFETCH`], far beyond any use, and small enough that the thread and buffer counts
/// never overflow.
pub const MAX_THREADS: usize = 1024;
/// The most batches a loader thread may gather ahead ([`LoaderOptions::prefetch`]).
pub const MAX_PREFETCH: usize = 1 << 16;

impl LoaderOptions {
    /// Checks what can be checked without a cache, naming the option at fault: every front
    /// end's refusals come from here (and from the checks against the caches when a loader is
    /// made).
    pub fn check(&self) -> Result<(), LoadError> {
        let opts = self;
        let bad = |key, value: usize, problem: String| {
            Err(OptionError::given(key, value, problem).into())
        };
        // The next epoch is planned ahead (a remote cache's fetcher), and a mix counts positions
        // across epochs: 2^63 epochs leave room for both.
        if opts.epoch >= 1 << 63 {
            return Err(OptionError::given("epoch", opts.epoch, "is past 2^63 - 1").into());
        }
        for (key, value) in [
            ("batch_size", opts.batch_size),
            ("world_size", opts.world_size),
            ("prefetch", opts.prefetch),
            ("window", opts.order.window),
            ("interleave", opts.order.interleave),
        ] {
            if value == 0 {
                return bad(key, value, "must be at least 1".into());
            }
        }
        if opts.rank >= opts.world_size {
            return bad(
                "rank",
                opts.rank,
                format!(
                    "must be below `world_size={}` (ranks count from 0)",
                    opts.world_size
                ),
            );
        }
        if let Some(m) = opts.trim {
            check_trim_multiple(m)?;
            opts.order.batches.check_trim()?;
        }
        if opts.threads > MAX_THREADS {
            return bad("threads", opts.threads, format!("is over {MAX_THREADS}"));
        }
        if opts.prefetch > MAX_PREFETCH {
            return bad(
                "prefetch",
                opts.prefetch,
                format!("is over {MAX_PREFETCH} batches ahead"),
            );
        }
        opts.global_batch()?;
        Ok(())
    }

    /// Units (contexts, or packs) per global step, or an error where that
    /// product overflows.
    pub fn global_batch(&self) -> Result<usize, LoadError> {
        global_batch(&self.order, self.batch_size, self.world_size)
    }
}

/// Units per global step of `order` at `batch_size` x `world_size`.
fn global_batch(
    order: &OrderSpec,
    batch_size: usize,
    world_size: usize,
) -> Result<usize, LoadError> {
    if order.batches.pack().is_some() {
        return Ok(world_size);
    }
    batch_size.checked_mul(world_size).ok_or_else(|| {
        LoadError::Options(OptionError::new(
            "batch_size",
            format!("{batch_size} x `world_size={world_size}`: the global batch overflows"),
        ))
    })
}

/// Where a loader stands: its order and a position in it, enough to continue exactly, on any
/// number of ranks with the same global batch. The JSON is flat: the order's fields beside
/// `epoch`, `samples` and `global_batch`.
///
/// Resuming mid-epoch (the program of docs/GUIDE.md, "Rust"): half an epoch, the state, then
/// the rest from the state, twice.
///
/// ```
/// use dsc_loader::{Batch, Cache, LoaderOptions, State};
///
/// fn accumulate(batch: &Batch, sum: &mut [f64], steps: &mut usize) {
///     let x = batch.tensor("x").expect("x");                       // f32 [n, l, F], little-endian
///     let lengths = batch.tensor("length").expect("length").bytes(); // i32 [n]
///     let (l, f) = (x.shape()[1], x.shape()[2]);
///     for i in 0..batch.size {
///         let len = i32::from_le_bytes(lengths[i * 4..i * 4 + 4].try_into().expect("i32")) as usize;
///         for t in 0..len {
///             for (k, s) in sum.iter_mut().enumerate() {
///                 let o = ((i * l + t) * f + k) * 4;
///                 *s += f64::from(f32::from_le_bytes(x.bytes()[o..o + 4].try_into().expect("f32")));
///             }
///         }
///         *steps += len;
///     }
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # std::env::set_current_dir(dir.path())?;
/// # let sample = dsc_gen::icecube::IcecubeOptions {
/// #     files: 2, events_per_file: 300, seed: 7, ..Default::default()
/// # };
/// # dsc_gen::icecube::generate(std::path::Path::new("data"), &sample)?;
/// # let mut spec = dsc_compiler::CompileSpec::new(vec!["data/train/batch_*.parquet".into()], "event_id");
/// # spec.features = vec!["time".into(), "charge".into()];
/// # spec.max_len = Some(64);
/// # dsc_compiler::compile(&spec, &dsc_compiler::CompileOptions {
/// #     out: "cache".into(), force: false, max_memory: None,
/// #     storage: dsc_compiler::Storage::Hot, progress: &dsc_compiler::NoProgress,
/// # })?;
///     let cache = Cache::open("cache")?;     // O(shards): validates sizes and headers, then maps
///     let features = cache.manifest().tensor("x").ok_or("no x")?.sample_shape[1];
///     for epoch in 0..2 {
///         let opts = LoaderOptions { batch_size: 128, epoch, trim: Some(1), ..Default::default() };
///         let (mut sum, mut steps) = (vec![0f64; features], 0usize);
///         let mut loader = cache.loader(opts.clone())?;
///         let half = loader.steps() / 2;
///         for batch in (&mut loader).take(half) {
///             accumulate(&batch?, &mut sum, &mut steps);
///         }
///         let state: State = loader.state();  // store it in the checkpoint (serde)
///         drop(loader);
///         for batch in cache.loader_from_state(opts, &state)? {  // exact continuation
///             accumulate(&batch?, &mut sum, &mut steps);
///         }
///         println!("epoch {epoch}: {steps} steps read");
///     }
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The order.
    #[serde(flatten)]
    pub order: OrderSpec,
    /// The epoch.
    pub epoch: u64,
    /// Units of the epoch consumed by all ranks together, a multiple of `global_batch`:
    /// contexts, or packs for a packed order.
    pub samples: usize,
    /// Units per global step: `batch_size * world_size`, or `world_size` packs.
    pub global_batch: usize,
    /// The content id of the data the state was taken over (`Manifest::content_id`, a mix's
    /// joined by `+`): a cache's generation, which a resume opens whatever was appended since.
    /// Absent in states written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_id: Option<String>,
}

impl State {
    /// The state of a loader with `opts` after `step` batches of its epoch.
    pub fn new(opts: &LoaderOptions, step: usize) -> Result<State, LoadError> {
        let global = opts.global_batch()?;
        Ok(State {
            order: opts.order.clone(),
            epoch: opts.epoch,
            samples: opts.skip.saturating_add(step.saturating_mul(global)),
            global_batch: global,
            content_id: None,
        })
    }

    /// Checks that this state resumes a loader with `opts` as they are: the same order in every
    /// field. Returns where to start ([`State::start`]).
    pub fn check(&self, opts: &LoaderOptions) -> Result<Start, LoadError> {
        if self.order != opts.order {
            let field = differing_field(&self.order, &opts.order);
            let problem = format!(
                "the state has {field}={}, the options {field}={}",
                field_value(&self.order, &field),
                field_value(&opts.order, &field)
            );
            return Err(LoadError::State { field, problem });
        }
        self.start(opts)
    }

    /// [`State::check`], but for the mix's weights and schedule, which a resume may amend past
    /// the state's position: [`crate::Mix::check_state`] checks them against the caches.
    pub fn check_unweighted(&self, opts: &LoaderOptions) -> Result<Start, LoadError> {
        let state = State {
            order: self.order.unweighted(),
            ..self.clone()
        };
        let opts = LoaderOptions {
            order: opts.order.unweighted(),
            ..opts.clone()
        };
        state.check(&opts)
    }

    /// Where a loader with `opts` continues this state: the same split (the rest of the order
    /// comes from the state). At the state's global batch, at a whole step; at another one
    /// (more or fewer ranks, another batch size), at the same position of the same global
    /// order, the units consumed skipped: nothing repeated, nothing left out. A bucketed order
    /// is cut into global batches of its own size, so it resumes at that size only.
    pub fn start(&self, opts: &LoaderOptions) -> Result<Start, LoadError> {
        if opts.order.split != self.order.split {
            return Err(LoadError::State {
                field: "split".into(),
                problem: format!(
                    "the state is for split {:?}, the options ask for {:?}",
                    self.order.split, opts.order.split
                ),
            });
        }
        // A state is taken at a whole step of its own global batch.
        if !self.samples.is_multiple_of(self.global_batch.max(1)) {
            return Err(LoadError::State {
                field: "samples".into(),
                problem: format!(
                    "epoch {} / samples {} do not fit: not a whole number of global batches of \
                     {}",
                    self.epoch, self.samples, self.global_batch
                ),
            });
        }
        let global = global_batch(&self.order, opts.batch_size, opts.world_size)?;
        if global != self.global_batch && self.order.batches.is_bucketed() {
            return Err(LoadError::State {
                field: "global_batch".into(),
                problem: format!(
                    "the state's global batch is {}, the options give {global} ({} x {} ranks): \
                     a bucketed order is cut into global batches of its own size, so it \
                     resumes at that size only; keep batch_size x world_size at {}",
                    self.global_batch, opts.batch_size, opts.world_size, self.global_batch
                ),
            });
        }
        if global != self.global_batch {
            return Ok(Start {
                step: 0,
                skip: self.samples,
            });
        }
        Ok(Start {
            step: self.samples / global.max(1),
            skip: 0,
        })
    }
}

/// Where a resumed loader starts: at `step` of the epoch cut from `skip` units in
/// ([`LoaderOptions::skip`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// The first step.
    pub step: usize,
    /// Units of the epoch skipped before step 0.
    pub skip: usize,
}

/// The name of the first field in which `a` and `b` differ (they differ).
fn differing_field(a: &OrderSpec, b: &OrderSpec) -> String {
    let (a, b) = (
        dsc_format::spelling::fields(a),
        dsc_format::spelling::fields(b),
    );
    a.iter()
        .chain(b.iter())
        .map(|(k, _)| k)
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
        .unwrap_or_else(|| "order".into())
}

fn field_value(order: &OrderSpec, field: &str) -> String {
    dsc_format::spelling::fields(order)
        .get(field)
        .map_or_else(|| "none".into(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one rule every front end asks before it captures a step.
    #[test]
    fn a_static_shape_is_a_pack_a_window_or_an_untrimmed_padded_batch() {
        assert!(Batches::Padded.static_shape(false).is_ok());
        assert!(Batches::Packed(Pack::tokens(4096))
            .static_shape(true)
            .is_ok());
        assert_eq!(Batches::Padded.static_shape(true).unwrap_err().key, "trim");
        let bucketed = Batches::Bucketed.static_shape(false).unwrap_err();
        assert_eq!(bucketed.key, "bucket");
        assert!(bucketed.problem.contains("`pack`"), "{bucketed}");
    }

    #[test]
    fn a_state_is_flat_json_and_reads_states_from_before_bucketing_and_packing() {
        let opts = LoaderOptions {
            order: OrderSpec {
                seed: 5,
                ..OrderSpec::default()
            },
            batch_size: 4,
            world_size: 2,
            ..LoaderOptions::default()
        };
        let state = State::new(&opts, 3).unwrap();
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json["seed"], 5);
        assert_eq!(json["samples"], 24);
        assert_eq!(json["global_batch"], 8);
        assert!(
            json.get("pack").is_none(),
            "unpacked orders keep the old JSON"
        );
        let mut old = json.as_object().unwrap().clone();
        old.remove("bucket");
        let read: State = serde_json::from_value(old.into()).unwrap();
        assert_eq!(read, state);
        assert_eq!(read.check(&opts).unwrap(), Start { step: 3, skip: 0 });
    }

    #[test]
    fn check_names_the_first_field_that_differs() {
        let opts = LoaderOptions::default();
        let state = State::new(&opts, 0).unwrap();
        let other = LoaderOptions {
            order: OrderSpec {
                batches: Batches::Packed(Pack::tokens(4096)),
                ..OrderSpec::default()
            },
            ..LoaderOptions::default()
        };
        let err = state.check(&other).unwrap_err().to_string();
        assert!(err.contains("pack=none") && err.contains("4096"), "{err}");
        // Another global batch is no other order: the state continues there, at its position.
        let other = LoaderOptions {
            batch_size: 128,
            ..LoaderOptions::default()
        };
        assert_eq!(state.check(&other).unwrap(), Start { step: 0, skip: 0 });
    }

    #[test]
    fn a_packed_order_steps_one_pack_per_rank() {
        let opts = LoaderOptions {
            order: OrderSpec {
                batches: Batches::Packed(Pack::tokens(1024)),
                ..OrderSpec::default()
            },
            world_size: 3,
            ..LoaderOptions::default()
        };
        assert_eq!(opts.global_batch().unwrap(), 3);
        assert_eq!(State::new(&opts, 7).unwrap().samples, 21);
    }
}
