//! Command-line flags, and the run configuration they resolve to (saved in checkpoints so that
//! `--resume` needs nothing else).

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The reference training loop on a dsc cache.
///
/// Streams the cache's `train` split through the dsc loader into pinned host buffers, copies
/// each batch to the device without blocking, and trains a transformer or GRU over the padded
/// sequences. Reports where each step's time goes (waiting for data, host-to-device copy,
/// compute), so a starved GPU shows at once.
///
/// Examples:
///   dsc-train --cache cache --task direction --model transformer --epochs 3 \
///       --batch-size 256 --lr 3e-4 --device auto --amp bf16 --out runs/first
///   dsc-train --resume runs/first/last.ckpt
///   dsc-train --cache cache --task direction --overfit-batch
///   dsc-train --cache cache --task direction --find-batch-size --json
#[derive(Debug, Parser)]
#[command(
    name = "dsc-train",
    version,
    max_term_width = 100,
    verbatim_doc_comment
)]
pub struct Cli {
    /// The compiled cache (a folder with manifest.json).
    #[arg(long, required_unless_present = "resume")]
    pub cache: Option<PathBuf>,

    /// Continue the run saved in this checkpoint exactly (other flags are taken from it, except
    /// --epochs, --max-steps, --device, --json and --out).
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,

    /// What to learn from the cache's `y` tensor.
    #[arg(long, value_enum, default_value_t = Task::Regression)]
    pub task: Task,

    /// Target column(s) of `y`, comma-separated [default: all for regression; the only one
    /// for classification; azimuth,zenith for direction].
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,

    /// Network over the sequence.
    #[arg(long, value_enum, default_value_t = ModelKind::Transformer)]
    pub model: ModelKind,

    /// Width of the model (transformer d_model, GRU hidden size).
    #[arg(long, default_value_t = 128)]
    pub dim: i64,

    /// Transformer encoder layers / GRU layers.
    #[arg(long, default_value_t = 2)]
    pub layers: i64,

    /// Attention heads (transformer).
    #[arg(long, default_value_t = 4)]
    pub heads: i64,

    /// Dropout probability inside the network.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,

    /// Passes over the training split [default: 1].
    #[arg(long)]
    pub epochs: Option<u64>,

    /// Contexts per micro-batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,

    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,

    /// Peak learning rate of AdamW.
    #[arg(long, default_value_t = 3e-4)]
    pub lr: f64,

    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,

    /// Linear warmup, in optimizer steps [default: 5% of all steps].
    #[arg(long)]
    pub warmup: Option<u64>,

    /// Clip the global gradient norm to this value (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,

    /// `auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,

    /// Mixed precision: bf16 or fp16 (with dynamic loss scaling) matrix products [default:
    /// bf16 on CUDA, none on CPU].
    #[arg(long, value_enum)]
    pub amp: Option<Amp>,

    /// Read the loss back from the device every N steps (the only host sync in training).
    #[arg(long, default_value_t = 50)]
    pub log_every: u64,

    /// Also checkpoint every N optimizer steps (always at each epoch end).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,

    /// Stop after this many optimizer steps in all (the schedule still spans --epochs); the
    /// checkpoint written then resumes the run.
    #[arg(long)]
    pub max_steps: Option<u64>,

    /// Batches prepared ahead of the step that uses them.
    #[arg(long, default_value_t = 3)]
    pub prefetch: usize,

    /// CPU threads for libtorch's operators [default: libtorch's choice].
    #[arg(long)]
    pub threads: Option<i32>,

    /// Seed of weights, dropout and the data order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Folder for checkpoints and the summary [default: runs/latest; with --resume, the
    /// checkpoint's folder].
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Train on one batch only; the loss must fall by over 90% (exit 1 otherwise).
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// Mean squared error on the target columns.
    Regression,
    /// Cross-entropy on one integer target column (classes 0..K-1).
    Classification,
    /// IceCube: azimuth/zenith as a unit vector, cosine loss, mean angular error in radians.
    Direction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Transformer,
    Gru,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amp {
    /// Full f32.
    None,
    /// bfloat16 products, f32 weights and reductions.
    Bf16,
    /// float16 products with dynamic loss scaling.
    Fp16,
}

/// Everything that defines a run's arithmetic; stored in checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub cache: PathBuf,
    pub task: Task,
    pub target: Vec<String>,
    pub model: ModelKind,
    pub dim: i64,
    pub layers: i64,
    pub heads: i64,
    pub dropout: f64,
    pub epochs: u64,
    pub batch_size: usize,
    pub accumulate: usize,
    pub lr: f64,
    pub weight_decay: f64,
    pub warmup: Option<u64>,
    pub clip: f64,
    pub amp: Option<Amp>,
    pub log_every: u64,
    pub checkpoint_every: Option<u64>,
    pub prefetch: usize,
    pub seed: u64,
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
}

impl RunConfig {
    pub fn from_cli(cli: &Cli) -> anyhow::Result<RunConfig> {
        let cache = cli
            .cache
            .clone()
            .expect("clap requires --cache without --resume");
        anyhow::ensure!(cli.batch_size > 0, "--batch-size must be at least 1");
        anyhow::ensure!(cli.accumulate > 0, "--accumulate must be at least 1");
        anyhow::ensure!(cli.log_every > 0, "--log-every must be at least 1");
        let epochs = cli.epochs.unwrap_or(1);
        anyhow::ensure!(epochs > 0, "--epochs must be at least 1");
        anyhow::ensure!(
            cli.dim > 0 && cli.layers > 0 && cli.heads > 0,
            "--dim, --layers and --heads must be positive"
        );
        anyhow::ensure!(
            cli.model != ModelKind::Transformer || cli.dim % cli.heads == 0,
            "--dim {} is not a multiple of --heads {}",
            cli.dim,
            cli.heads
        );
        anyhow::ensure!(
            (0.0..1.0).contains(&cli.dropout),
            "--dropout must be in [0, 1)"
        );
        anyhow::ensure!(cli.lr > 0.0 && cli.lr.is_finite(), "--lr must be positive");
        Ok(RunConfig {
            cache,
            task: cli.task,
            target: cli.target.clone(),
            model: cli.model,
            dim: cli.dim,
            layers: cli.layers,
            heads: cli.heads,
            dropout: cli.dropout,
            epochs,
            batch_size: cli.batch_size,
            accumulate: cli.accumulate,
            lr: cli.lr,
            weight_decay: cli.weight_decay,
            warmup: cli.warmup,
            clip: cli.clip,
            amp: cli.amp,
            log_every: cli.log_every,
            checkpoint_every: cli.checkpoint_every,
            prefetch: cli.prefetch.max(1),
            seed: cli.seed,
        })
    }
}
