//! Command-line flags, resolved to the library's [`RunConfig`]. The only module that knows clap.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use dsc_format::choice::Choice;
use dsc_format::spelling::OptionError;
use dsc_loader::args::{BatchArgs, MixArgs, ShapeArgs};
use dsc_train::config::{defaults, Amp, ModelKind, RunConfig, Task};
use std::path::PathBuf;

/// The reference training loop on a dsc cache.
///
/// Streams the cache's `train` split through the dsc loader into pinned host buffers, copies
/// each batch to the device without blocking, and trains a transformer or GRU over the padded
/// sequences. Reports where each step's time goes (waiting for data, host-to-device copy,
/// compute), so a starved GPU shows at once. With --pack, attention and pooling stay inside
/// each sequence of a pack, and the loss is the mean over its sequences.
///
/// One device per run: on a machine with several GPUs, --device cuda:N picks one (a sweep runs
/// one dsc-train per GPU). tch 0.24 binds no collective (no NCCL, no c10d process group), so
/// there is no data-parallel mode: training on several GPUs is examples/train.py under torchrun
/// (the same tasks, networks and flags, with DistributedDataParallel; docs/PYTHON.md,
/// "Distributed training with torchrun").
///
/// The model's inputs are scaled with the cache's own train statistics (stats.json): columns
/// stored in source units (`identity`, `log1p`) are standardised, `zscore`/`minmax` columns are
/// used as stored. --no-normalise feeds the stored values as they are.
///
/// Examples:
///   dsc-train --cache cache --task direction --epochs 3 --out runs/first
///   dsc-train --resume runs/first/last.ckpt
///   dsc-train --cache cache --task direction --overfit-batch
///   dsc-train --cache cache --task classification --target churned --model gru
///   dsc-train --cache cache --task direction --device cuda --amp bf16 --json
///   dsc-train --cache cache --task direction --pack 16384
///   dsc-train --cache sensors --task forecast --model gru --series-window 48 --stride 2 \
///       --horizon 4 --horizon-columns value
///   dsc-train --cache cache --task direction --find-batch-size --json
#[derive(Debug, Parser)]
#[command(
    name = "dsc-train",
    version,
    max_term_width = 100,
    verbatim_doc_comment
)]
pub struct Cli {
    /// The compiled cache (a folder with manifest.json, or its URL in object storage:
    /// s3://bucket/cache, gs://…, az://…, https://…). Repeat it to train on a mix of caches
    /// with the same tensors (inputs scaled with the first's statistics).
    #[arg(long, required_unless_present = "resume", value_name = "CACHE")]
    pub cache: Vec<PathBuf>,

    /// The generation of the cache to train on (a number, a content id or a tag; `dsc log`
    /// lists them) [default: the last one]. A resumed run reads the generation it started on.
    #[arg(long, value_name = "N|ID|TAG", conflicts_with = "resume")]
    pub generation: Option<String>,

    /// For a cache in object storage: the local folder its shards are fetched into ahead of
    /// use, in the loader's order [env: DSC_CACHE_DIR; default: ~/.cache/dsc].
    #[arg(long, value_name = "DIR", help_heading = "Object storage")]
    pub cache_dir: Option<PathBuf>,

    /// Bytes of fetched shards kept at most (e.g. 20GiB): the shard needed furthest ahead is
    /// removed first [env: DSC_CACHE_LIMIT; default: no limit].
    #[arg(long, value_name = "SIZE", help_heading = "Object storage")]
    pub cache_limit: Option<String>,

    /// Continue the run saved in this checkpoint exactly (every other flag, --no-normalise
    /// included, is taken from it, except --epochs, --max-steps, --torch-threads, --json and --out;
    /// the device and precision the run chose are kept unless --device or --amp names
    /// another, which the run then reports).
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,

    /// What to learn from the cache's `y` tensor: `regression` (mean squared error on the
    /// target columns standardised with the train statistics; metric: mean absolute error in
    /// stored units), `classification` (cross-entropy on one integer column, classes
    /// 0..K-1), `direction` (IceCube azimuth/zenith as a unit vector, cosine loss, mean angular
    /// error in radians); or from the steps after each series window: `forecast` (with
    /// --series-window and --horizon; mean squared error on the next --horizon steps of
    /// --horizon-columns of x, standardised as the inputs; metric: mean absolute error in
    /// stored units).
    #[arg(long, default_value = "regression", value_parser = choice::<Task>())]
    pub task: Task,

    /// Target column(s) of `y`, comma-separated [default: all for regression; the only one
    /// for classification; azimuth,zenith for direction].
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,

    /// Network over the sequence: a pre-norm `transformer` encoder with masked mean pooling, or
    /// a `gru` read at the last stored step.
    #[arg(long, default_value = "transformer", value_parser = choice::<ModelKind>())]
    pub model: ModelKind,

    /// Width of the model (transformer d_model, GRU hidden size).
    #[arg(long, default_value_t = defaults::DIM)]
    pub dim: i64,

    /// Transformer encoder layers / GRU layers.
    #[arg(long, default_value_t = defaults::LAYERS)]
    pub layers: i64,

    /// Attention heads (transformer).
    #[arg(long, default_value_t = defaults::HEADS)]
    pub heads: i64,

    /// Dropout probability inside the network.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,

    /// Passes over the training split [default: 1].
    #[arg(long)]
    pub epochs: Option<u64>,

    #[command(flatten)]
    pub batch: BatchArgs,

    #[command(flatten)]
    pub shape: ShapeArgs,

    #[command(flatten)]
    pub mix_args: MixArgs,

    /// Keep the train split on the device and gather each batch there by index (only a
    /// small index per step crosses to the GPU): `auto` on CUDA when the split's tensors fit
    /// a quarter of the GPU's memory, `on` always (an error if it does not fit), `off` never.
    /// The batches are the same either way.
    #[arg(long, value_enum, default_value_t = Resident::Auto)]
    pub resident: Resident,

    /// Capture the whole training step (gather, forward, loss, backward, clipping, AdamW) as
    /// CUDA graphs after three eager steps and replay them: one launch per step instead of
    /// hundreds, for small networks whose steps the host's launches hold back. Batches arrive
    /// in fixed device buffers, padded ones untrimmed. Without CUDA the same step runs
    /// uncaptured; the summary says which (`step`). The arithmetic is the eager step's: a
    /// resume keeps the run's choice, and --graph or --no-graph with --resume changes it
    /// [default: on CUDA wherever the batch shape is static (packs, series windows, padded
    /// batches then untrimmed); eager on the CPU and with --bucket, --trim or --trim-multiple].
    #[arg(long, conflicts_with_all = ["bucket", "trim_multiple", "trim", "no_graph"])]
    pub graph: bool,

    /// Run the step eagerly on CUDA too, on trimmed padded batches.
    #[arg(long)]
    pub no_graph: bool,

    /// Cut each padded batch to its longest sequence (rounded up the ladder of
    /// --trim-multiple): shapes that change, so an eager step [default: on the CPU; on CUDA,
    /// untrimmed batches for a captured step].
    #[arg(long)]
    pub trim: bool,

    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,

    /// Peak learning rate of AdamW.
    #[arg(long, default_value_t = defaults::LR)]
    pub lr: f64,

    /// AdamW decoupled weight decay (matrices only: not biases or norm gains).
    #[arg(long, default_value_t = defaults::WEIGHT_DECAY)]
    pub weight_decay: f64,

    /// Linear warmup, in optimizer steps, before the cosine decay to a tenth of --lr [default:
    /// 5% of all steps].
    #[arg(long)]
    pub warmup: Option<u64>,

    /// Clip the global gradient norm to this value (0: off).
    #[arg(long, default_value_t = defaults::CLIP)]
    pub clip: f64,

    /// Feed the stored values as they are, without scaling them by the cache's statistics.
    #[arg(long)]
    pub no_normalise: bool,

    /// The split evaluated after each epoch (for choosing a model); every other split but
    /// train is evaluated once at the end, e.g. an official test split (dsc compile
    /// --split-by/--split-keys).
    #[arg(long, value_name = "NAME", default_value = defaults::EVAL_SPLIT)]
    pub eval_split: String,

    /// `auto` (CUDA when present), `cpu`, `cuda` or `cuda:N` [default: auto; with --resume,
    /// the device the run chose, recorded in its checkpoint].
    #[arg(long)]
    pub device: Option<String>,

    /// Mixed precision of the matrix products: `bf16`, `fp16` (with dynamic loss scaling) or
    /// `none` [default: bf16 on CUDA, none on CPU; with --resume, the run's, recorded in its
    /// checkpoint: a resume that names another says so].
    #[arg(long, value_parser = choice::<Amp>())]
    pub amp: Option<Amp>,

    /// Read the loss back from the device every N steps (the only host sync in training).
    #[arg(long, default_value_t = defaults::LOG_EVERY)]
    pub log_every: u64,

    /// Also checkpoint every N optimizer steps (always at each epoch end).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,

    /// Stop after this many optimizer steps in all (the schedule still spans --epochs); the
    /// checkpoint written then resumes the run.
    #[arg(long)]
    pub max_steps: Option<u64>,

    /// Pinned host buffers the feed's thread fills ahead of the step, each a whole batch (not
    /// the loader's `prefetch`, batches queued per loader thread).
    #[arg(long, value_name = "N", default_value_t = defaults::HOST_BUFFERS)]
    pub host_buffers: usize,

    /// The old spelling of --host-buffers, refused: `prefetch` means batches per loader
    /// thread everywhere else.
    #[arg(long, hide = true, value_name = "N")]
    pub prefetch: Option<String>,

    /// CPU threads for libtorch's operators, 1 to 1024 [default: libtorch's choice].
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub torch_threads: Option<i32>,

    /// The old spelling of --torch-threads, refused: a bare `threads` means the loader's
    /// threads (or dsc's own workers) everywhere else.
    #[arg(long, hide = true, value_name = "N")]
    pub threads: Option<String>,

    /// Seed of weights, dropout and the data order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Folder for checkpoints and the summary [default: runs/latest; with --resume, the
    /// checkpoint's folder].
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Train on one batch only, at a constant --lr; the loss must fall by over 90% (exit 1
    /// otherwise). A network and data that cannot do this cannot learn the task either.
    #[arg(long, conflicts_with = "find_batch_size")]
    pub overfit_batch: bool,

    /// Steps of --overfit-batch.
    #[arg(long, default_value_t = 300)]
    pub overfit_steps: u64,

    /// Find the largest batch size that fits (doubling until out of memory or --max-batch-size),
    /// with samples/s at each size tried.
    #[arg(long)]
    pub find_batch_size: bool,

    /// Upper bound of --find-batch-size.
    #[arg(long, default_value_t = 8192)]
    pub max_batch_size: usize,

    /// Print a machine-readable summary on stdout (human output goes to stderr).
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// dsc-train's loader flags read as `dsc order`'s: the same declarations, flattened
    /// (`--seed` seeds the weights and dropout too).
    #[test]
    fn the_loader_flags_read_as_in_dsc() {
        let own = [("dsc-train", "seed")];
        let other = dsc_loader::args::flags_with_other_help(&Cli::command(), &own);
        assert!(
            other.is_empty(),
            "flags that restate a loader flag: {other:?}"
        );
    }
}

/// A parser that lists a [`Choice`]'s names in `--help` and errors, parsed by the type.
fn choice<T: Choice + Clone + Send + Sync>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::NAMES).map(|s| T::parse_name(&s).expect("one of T::NAMES"))
}

/// `--resident`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Resident {
    Auto,
    On,
    Off,
}

impl Cli {
    /// The output folder: `--out`, else the resumed checkpoint's folder, else `runs/latest`.
    pub fn out_dir(&self) -> PathBuf {
        match (&self.out, &self.resume) {
            (Some(o), _) => o.clone(),
            (None, Some(ckpt)) => ckpt
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), PathBuf::from),
            (None, None) => PathBuf::from("runs/latest"),
        }
    }

    /// Refuses a flag that was renamed, naming the new one (one meaning per name across the
    /// front ends).
    pub fn refuse_old_spellings(&self) -> Result<(), OptionError> {
        if let Some(n) = &self.threads {
            return Err(OptionError::new(
                "threads",
                format!(
                    "{n}: libtorch's threads are --torch-threads {n} now; a bare `threads` \
                     means the loader's threads (dsc.Loader's num_threads, --loader-threads) or \
                     dsc's own workers"
                ),
            ));
        }
        if let Some(n) = &self.prefetch {
            return Err(OptionError::new(
                "prefetch",
                format!(
                    "{n}: dsc-train's pinned host buffers are --host-buffers {n} now; \
                     `prefetch` means batches queued per loader thread in every other front end"
                ),
            ));
        }
        Ok(())
    }

    /// Whether the command line decides `--graph` (given, refused, or ruled out by a shape
    /// that changes from batch to batch); `None` leaves it to the machine
    /// ([`crate::machine::settle`]).
    pub fn graph_asked(&self) -> Option<bool> {
        if self.graph {
            Some(true)
        } else if self.no_graph
            || self.trim
            || self.shape.bucket
            || self.shape.trim_multiple.is_some()
        {
            Some(false)
        } else {
            None
        }
    }

    /// The run configuration the flags describe.
    pub fn run_config(&self) -> anyhow::Result<RunConfig> {
        let (cache, mix) = self
            .cache
            .split_first()
            .expect("clap requires --cache without --resume");
        let cfg = RunConfig {
            cache: cache.clone(),
            mix: mix.to_vec(),
            generation: self.generation.clone(),
            task: self.task,
            target: self.target.clone(),
            model: self.model,
            dim: self.dim,
            layers: self.layers,
            heads: self.heads,
            dropout: self.dropout,
            epochs: self.epochs.unwrap_or(1),
            // The loader's keys as given: the run trims as the machine settles it.
            shape: ShapeArgs {
                trim: false,
                ..self.shape.clone()
            },
            mixing: self.mix_args.clone(),
            batch: self.batch.clone(),
            resident: match self.resident {
                Resident::Auto => None,
                Resident::On => Some(true),
                Resident::Off => Some(false),
            },
            graph: self.graph,
            accumulate: self.accumulate,
            lr: self.lr,
            weight_decay: self.weight_decay,
            warmup: self.warmup,
            clip: self.clip,
            amp: self.amp,
            device: None,
            log_every: self.log_every,
            checkpoint_every: self.checkpoint_every,
            // 0 is refused by the config's check, as every front end refuses it.
            host_buffers: self.host_buffers,
            seed: self.seed,
            normalise: !self.no_normalise,
            scale_targets: true,
            eval_split: self.eval_split.clone(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
