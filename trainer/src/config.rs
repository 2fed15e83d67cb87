//! The run configuration: everything that defines a run's arithmetic. Saved in checkpoints, so
//! that `--resume` needs nothing else. The binary's `args` builds it from the command line; a
//! program using the library builds it directly.

use crate::error::TrainError;
pub use crate::model::Amp;
use crate::model::{GruConfig, ModelConfig, TransformerConfig};
use dsc_format::spelling::OptionError;
use dsc_format::{Manifest, TensorRole};
use dsc_loader::args::{BatchArgs, EpochArgs, LoaderArgs, MixArgs, RankArgs, ShapeArgs};
use dsc_loader::{Batches, LoadError, LoaderOptions};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The widest network, the most layers and the most host buffers a run accepts.
pub const MAX_DIM: i64 = 1 << 16;
/// See [`MAX_DIM`].
pub const MAX_LAYERS: i64 = 1024;
/// The most pinned host buffers `--host-buffers` may ask for: each holds a whole batch, filled by
/// the feed's thread, so this is not the loader's queue of [`dsc_loader::MAX_PREFETCH`]
/// batches per thread (which a run does not start: its loader fills in the caller's thread).
pub const MAX_HOST_BUFFERS: usize = 1024;

/// `dsc-train`'s defaults: a small network that learns on the CPU in minutes and keeps a GPU
/// busy at batch 256.
pub mod defaults {
    /// Model width (transformer `d_model`, GRU hidden size).
    pub const DIM: i64 = 128;
    /// Layers of the network.
    pub const LAYERS: i64 = 2;
    /// Attention heads.
    pub const HEADS: i64 = 4;
    /// Contexts per micro-batch: the loader's batch size ([`dsc_loader::DEFAULT_BATCH_SIZE`]).
    pub const BATCH_SIZE: usize = dsc_loader::DEFAULT_BATCH_SIZE;
    /// Peak learning rate.
    pub const LR: f64 = 1e-3;
    /// AdamW decoupled weight decay (matrices only).
    pub const WEIGHT_DECAY: f64 = 0.01;
    /// Global gradient-norm clip (0: off).
    pub const CLIP: f64 = 1.0;
    /// Optimizer steps between loss read-backs.
    pub const LOG_EVERY: u64 = 50;
    /// Host buffers the loader fills ahead (ring slots).
    pub const HOST_BUFFERS: usize = 3;
    /// Trimmed lengths on CUDA round up the loader's ladder ([`dsc_loader::GPU_TRIM_MULTIPLE`],
    /// the same default `dsc.Loader` takes on a GPU).
    pub const GPU_TRIM_MULTIPLE: usize = dsc_loader::GPU_TRIM_MULTIPLE;
    /// The split evaluated after each epoch.
    pub const EVAL_SPLIT: &str = "val";

    pub(crate) fn eval_split() -> String {
        EVAL_SPLIT.into()
    }
}

/// What is learned from the cache's `y` tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// Mean squared error on the target columns, standardised with the train statistics.
    Regression,
    /// Cross-entropy on one integer target column (classes 0..K-1).
    Classification,
    /// IceCube: azimuth/zenith as a unit vector, cosine loss, mean angular error in radians.
    Direction,
    /// Windows of long series: the next `horizon` steps of chosen columns of `x` (`y_next`),
    /// mean squared error on them standardised as the inputs are; metric the mean absolute
    /// error in stored units.
    Forecast,
}

dsc_format::choice!(Task, "task", {
    Regression => "regression",
    Classification => "classification",
    Direction => "direction",
    Forecast => "forecast",
});
dsc_format::choice!(ModelKind, "model", { Transformer => "transformer", Gru => "gru" });

/// The network over the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// A pre-norm transformer encoder with masked mean pooling.
    Transformer,
    /// A GRU read at each sequence's last stored step.
    Gru,
}

/// Everything that defines a run's arithmetic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// The cache directory (a mix's first).
    pub cache: PathBuf,
    /// Further caches whose train splits are mixed with `cache`'s (`--cache a --cache b`):
    /// the same tensors, any `L` (batches are padded to the longest). Inputs are scaled with
    /// the first cache's statistics; evaluation reads every cache's split once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mix: Vec<PathBuf>,
    /// The generation of the caches read (`--generation`: a number, content id or tag, one
    /// for every cache or one per cache joined by `+`); `None`: the last one. A resume sets it
    /// to the content ids its checkpoint read, whatever was appended since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    /// What is learned from `y`.
    pub task: Task,
    /// Target columns of `y`; empty: the task's default.
    pub target: Vec<String>,
    /// The network over the sequence.
    pub model: ModelKind,
    /// Model width.
    pub dim: i64,
    /// Layers.
    pub layers: i64,
    /// Attention heads (transformer).
    pub heads: i64,
    /// Dropout probability.
    pub dropout: f64,
    /// Passes over the training split.
    pub epochs: u64,
    /// The loader's keys as the command line gives them (`dsc_loader::args`), so that a
    /// checkpoint spells them as `dsc-train` and every front end does: what a batch is
    /// (`bucket`, `pack`, `max_seqs`, `series_window`, `stride`, `horizon`,
    /// `horizon_columns`, `pad_windows`; `trim` and `trim_multiple` as the machine settled
    /// them for the train batches, [`crate::machine`]). Checkpoints written before read too
    /// (their windows as one `series` object).
    #[serde(flatten, with = "shape_keys")]
    pub shape: ShapeArgs,
    /// The train mix (`weights`, one per cache, none for the caches' sizes; `mix_samples`,
    /// the mix's positions per epoch, none for the caches' contexts together).
    #[serde(flatten)]
    pub mixing: MixArgs,
    /// Contexts per micro-batch (`batch_size`).
    #[serde(flatten)]
    pub batch: BatchArgs,
    /// Keep the train split on the device and gather each batch there (`None`: on CUDA when
    /// it fits a quarter of the GPU's memory). Where the batches are made, not what they are:
    /// a run may resume with another setting.
    #[serde(default)]
    pub resident: Option<bool>,
    /// Capture the training step as CUDA graphs and replay them (`--graph`): batches arrive in
    /// fixed device buffers, untrimmed. The same arithmetic as the eager step, so a run may
    /// resume with either; uncaptured where capture is unavailable ([`crate::graph`]).
    #[serde(default)]
    pub graph: bool,
    /// Micro-batches per optimizer step.
    pub accumulate: usize,
    /// Peak learning rate (warmup, then cosine decay to a tenth).
    pub lr: f64,
    /// AdamW decoupled weight decay (matrices only).
    pub weight_decay: f64,
    /// Warmup in optimizer steps; `None`: 5% of all steps.
    pub warmup: Option<u64>,
    /// Global gradient-norm clip (0: off).
    pub clip: f64,
    /// `None`: bf16 on CUDA, none on the CPU (chosen when the run starts and recorded:
    /// [`crate::machine`]).
    pub amp: Option<Amp>,
    /// The device the run chose (`cpu`, `cuda:N`), recorded when it starts so that a resume
    /// keeps it unless asked for another ([`crate::machine`]); `None` before that, and in
    /// checkpoints written before it was recorded.
    #[serde(default)]
    pub device: Option<String>,
    /// Optimizer steps between loss read-backs (and log lines).
    pub log_every: u64,
    /// Optimizer steps between mid-epoch checkpoints (`None`: at epoch ends only).
    pub checkpoint_every: Option<u64>,
    /// Pinned host buffers the feed fills ahead (`--host-buffers`; checkpoints before the
    /// rename spelled it `prefetch`).
    #[serde(alias = "prefetch")]
    pub host_buffers: usize,
    /// Seed of the weights, dropout and data order.
    pub seed: u64,
    /// Scale the model's inputs with the cache's train statistics (`normalise`). Checkpoints
    /// written before the option existed trained without it, so a missing field reads `false`.
    #[serde(default)]
    pub normalise: bool,
    /// Regression: the loss is on targets standardised with the train statistics (the metric
    /// stays in stored units). Always on for new runs; `false` for checkpoints from before.
    #[serde(default)]
    pub scale_targets: bool,
    /// The split whose loss and metric are reported after each epoch (model selection); every
    /// other non-train split is evaluated once at the end. Checkpoints from before the option
    /// existed evaluated `val`.
    #[serde(default = "defaults::eval_split")]
    pub eval_split: String,
}

/// Refuses `$key` with a problem unless `$ok`.
macro_rules! ensure {
    ($ok:expr, $key:literal, $($problem:tt)+) => {
        let ok: bool = $ok;
        if !ok {
            return Err(OptionError::new($key, format!($($problem)+)));
        }
    };
}

impl RunConfig {
    /// The options that open cache `i` of the run (0: `cache`, then `mix`): the environment's
    /// object storage settings and the run's generation of that cache.
    pub fn open_options(&self, i: usize) -> Result<dsc_loader::RemoteOptions, TrainError> {
        let mut opts = dsc_loader::RemoteOptions::from_env()?;
        if let Some(g) = &self.generation {
            let parts: Vec<&str> = g.split('+').collect();
            let part = match parts.len() {
                1 => parts[0],
                n if n == 1 + self.mix.len() => parts[i],
                n => {
                    return Err(TrainError::Config(OptionError::new(
                        "generation",
                        format!("{n} generations given for {} caches", 1 + self.mix.len()),
                    )))
                }
            };
            opts.generation = part
                .parse()
                .map_err(|e: String| TrainError::Config(OptionError::new("generation", e)))?;
        }
        Ok(opts)
    }

    /// The shape of the run's batches (checked by [`RunConfig::validate`]).
    pub fn batches(&self) -> Batches {
        self.shape.batches().unwrap_or_default()
    }

    /// The loader's keys of this run over `split` at `epoch`: the train split shuffled in whole
    /// batches, mixed as asked; any other in cache order, every context once (the last batch
    /// completed), each cache's split read once. Padded batches are trimmed up the ladder of
    /// `trim_multiple`, but for a captured step's train batches (one shape).
    fn loader_args(
        &self,
        split: &str,
        epoch: u64,
        trim_multiple: usize,
    ) -> Result<LoaderArgs, OptionError> {
        let train = split == "train";
        let mut shape = self.shape.clone();
        let padded = self.batches().is_padded();
        shape.trim = padded && !(self.graph && train);
        shape.trim_multiple = padded.then_some(trim_multiple);
        Ok(LoaderArgs {
            epoch: EpochArgs {
                split: split.into(),
                seed: self.seed,
                shuffle: train,
                drop_last: train,
                ..Default::default()
            },
            shape,
            // Evaluation reads each cache's split once (weights by size, one pass).
            mix: if train {
                self.mix_in_samples()?
            } else {
                MixArgs::default()
            },
            batch: self.batch.clone(),
            rank: RankArgs {
                epoch,
                ..Default::default()
            },
            threads: 0,
            ..Default::default()
        })
    }

    /// The train mix, a schedule's stages given by optimizer step at their sample position
    /// (`batch_size` x `accumulate` samples a step; a packed step has no fixed number, and
    /// such a stage is refused).
    fn mix_in_samples(&self) -> Result<MixArgs, OptionError> {
        let per_step = (self.batch.batch_size as u64).checked_mul(self.accumulate as u64);
        let per_step = match self.shape.pack {
            Some(_) => None,
            None => Some(per_step.unwrap_or(u64::MAX)),
        };
        self.mixing.in_samples(per_step)
    }

    /// The loader options of this run over `split` ([`RunConfig::loader_args`]), resolved and
    /// checked by the loader.
    pub fn loader_options(
        &self,
        manifest: &Manifest,
        split: &str,
        epoch: u64,
        trim_multiple: usize,
    ) -> Result<LoaderOptions, LoadError> {
        let mut args = self.loader_args(split, epoch, trim_multiple)?;
        // Packs have no layout for engine sub-columns (which the networks do not read).
        if args.shape.pack.is_some() {
            args.columns = manifest
                .tensors()
                .iter()
                .filter(|t| t.role != TensorRole::SubColumn)
                .map(|t| t.name.clone())
                .collect();
        }
        args.options(trim_multiple)
    }

    /// The defaults of `dsc-train` for a cache and task.
    pub fn new(cache: impl Into<PathBuf>, task: Task) -> RunConfig {
        RunConfig {
            cache: cache.into(),
            mix: Vec::new(),
            generation: None,
            task,
            target: Vec::new(),
            model: ModelKind::Transformer,
            dim: defaults::DIM,
            layers: defaults::LAYERS,
            heads: defaults::HEADS,
            dropout: 0.0,
            epochs: 1,
            shape: ShapeArgs::default(),
            mixing: MixArgs::default(),
            batch: BatchArgs {
                batch_size: defaults::BATCH_SIZE,
            },
            resident: None,
            graph: false,
            accumulate: 1,
            lr: defaults::LR,
            weight_decay: defaults::WEIGHT_DECAY,
            warmup: None,
            clip: defaults::CLIP,
            amp: None,
            device: None,
            log_every: defaults::LOG_EVERY,
            checkpoint_every: None,
            host_buffers: defaults::HOST_BUFFERS,
            seed: 0,
            normalise: true,
            scale_targets: true,
            eval_split: defaults::eval_split(),
        }
    }

    /// Refuses values no run can use, naming the option by its key (`dsc-train` spells it as
    /// its flag).
    pub fn validate(&self) -> Result<(), OptionError> {
        // The loader's half: its keys, checked by the loader as every front end's are (the
        // shape as given, then the options of the train batches).
        self.shape.batches()?;
        let loader = |e: LoadError| match e {
            LoadError::Options(e) => e,
            e => OptionError::new("options", e.to_string()),
        };
        self.loader_args("train", 0, self.shape.trim_multiple.unwrap_or(1))?
            .options(1)
            .map_err(loader)?;
        if self.graph {
            // The loader's one rule for a step that replays one shape (`dsc.Loader(static=True)`
            // and examples/train.py ask it too); a recorded trim multiple means trimmed batches
            // (checkpoints from before `trim` was recorded).
            self.batches()
                .static_shape(self.shape.trim || self.shape.trim_multiple.is_some())?;
        }
        ensure!(self.accumulate > 0, "accumulate", "must be at least 1");
        // How many caches a run reads is the trainer's to know before any is opened.
        ensure!(
            self.mixing
                .weights
                .as_ref()
                .is_none_or(|w| w.len() == self.mix.len() + 1),
            "weights",
            "gives {} weights for {} caches: one per `cache`, in their order",
            self.mixing.weights.as_ref().map_or(0, Vec::len),
            self.mix.len() + 1
        );
        ensure!(
            self.mix.is_empty() || self.resident != Some(true),
            "resident",
            "keeps one cache's split on the device; a mix is gathered on the host"
        );
        ensure!(
            (self.task == Task::Forecast)
                == self.batches().windows().is_some_and(|s| s.horizon > 0),
            "task",
            "`forecast` learns the steps after each series window: it takes `series_window` and \
             `horizon`, and they take it"
        );
        ensure!(
            self.batches().windows().is_none() || self.resident != Some(true),
            "resident",
            "keeps whole contexts on the device; series windows are cut on the host"
        );
        self.check_network()
    }

    /// The network's and the optimizer's rules ([`RunConfig::validate`]).
    fn check_network(&self) -> Result<(), OptionError> {
        ensure!(self.log_every > 0, "log_every", "must be at least 1");
        ensure!(self.epochs > 0, "epochs", "must be at least 1");
        ensure!(self.dim > 0, "dim", "must be positive");
        ensure!(self.layers > 0, "layers", "must be positive");
        ensure!(self.heads > 0, "heads", "must be positive");
        // Far beyond any use, and small enough that nothing below overflows or runs for hours
        // before failing (a checkpoint's config is read back through here too).
        ensure!(
            self.dim <= MAX_DIM,
            "dim",
            "{}: at most {MAX_DIM}",
            self.dim
        );
        ensure!(
            self.layers <= MAX_LAYERS,
            "layers",
            "{}: at most {MAX_LAYERS}",
            self.layers
        );
        ensure!(
            self.heads <= self.dim,
            "heads",
            "{}: at most as many as `dim={}`",
            self.heads,
            self.dim
        );
        ensure!(
            (1..=MAX_HOST_BUFFERS).contains(&self.host_buffers),
            "host_buffers",
            "{} must be between 1 and {MAX_HOST_BUFFERS}",
            self.host_buffers
        );
        ensure!(
            self.checkpoint_every != Some(0),
            "checkpoint_every",
            "must be at least 1"
        );
        ensure!(
            self.epochs < u64::MAX / 2,
            "epochs",
            "{}: too large to count",
            self.epochs
        );
        ensure!(
            self.warmup.is_none_or(|w| w < u64::MAX / 2),
            "warmup",
            "{:?}: too large to count",
            self.warmup
        );
        // Weights, gradients and two AdamW moments of f32: refuse a network that cannot fit
        // before libtorch tries to allocate it.
        let (d, l) = (self.dim as f64, self.layers as f64);
        let bytes = 16.0 * (12.0 * d * d + 13.0 * d) * l;
        let limit = dsc_format::system::memory_limit() as f64 / 2.0;
        ensure!(
            bytes <= limit,
            "dim",
            "{} x `layers={}`: the network's weights and optimizer state need about {:.0} GiB, \
             more than half of this machine's memory ({:.0} GiB)",
            self.dim,
            self.layers,
            bytes / f64::from(1u32 << 30),
            limit / f64::from(1u32 << 30)
        );
        ensure!(
            self.model != ModelKind::Transformer || self.dim % self.heads == 0,
            "dim",
            "{} is not a multiple of `heads={}`",
            self.dim,
            self.heads
        );
        ensure!(
            (0.0..1.0).contains(&self.dropout),
            "dropout",
            "must be in [0, 1)"
        );
        ensure!(
            self.lr > 0.0 && self.lr.is_finite(),
            "lr",
            "must be positive"
        );
        ensure!(
            self.weight_decay >= 0.0 && self.weight_decay.is_finite(),
            "weight_decay",
            "must be zero or positive"
        );
        ensure!(
            self.clip >= 0.0 && self.clip.is_finite(),
            "clip",
            "must be zero (off) or positive"
        );
        Ok(())
    }

    /// The network's own configuration.
    pub fn model_config(&self) -> ModelConfig {
        match self.model {
            ModelKind::Transformer => ModelConfig::Transformer(TransformerConfig {
                dim: self.dim,
                layers: self.layers,
                heads: self.heads,
                dropout: self.dropout,
            }),
            ModelKind::Gru => ModelConfig::Gru(GruConfig {
                dim: self.dim,
                layers: self.layers,
                dropout: self.dropout,
            }),
        }
    }
}

/// [`RunConfig::shape`] as checkpoints write it: the loader's keys, as the command line spells
/// them. Checkpoints written before read too: their windows were one `series` object, and runs
/// of windows recorded a trim multiple they never used (left out here, as the loader refuses
/// one for windows).
mod shape_keys {
    use dsc_loader::args::ShapeArgs;
    use dsc_loader::SeriesWindows;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    struct Saved {
        #[serde(flatten)]
        args: ShapeArgs,
        #[serde(default)]
        series: Option<SeriesWindows>,
    }

    pub fn serialize<S: Serializer>(args: &ShapeArgs, s: S) -> Result<S::Ok, S::Error> {
        args.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ShapeArgs, D::Error> {
        let Saved { mut args, series } = Saved::deserialize(d)?;
        if let Some(w) = series {
            args.series_window = Some(w.len);
            args.stride = Some(w.stride);
            args.horizon = w.horizon;
            args.horizon_columns = w.horizon_columns;
            args.pad_windows = w.pad;
        }
        if args.series_window.is_some() {
            args.trim_multiple = None;
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint spells the loader's keys as the command line does (`pack`, `max_seqs`,
    /// `series_window`, `weights`, `batch_size`, ...); one that names two shapes is refused by
    /// key; checkpoints written before read as they trained: their windows as one `series`
    /// object (and a trim multiple they never used), no shape keys at all as padded batches.
    #[test]
    fn checkpoints_spell_the_loader_keys_and_old_ones_still_read() {
        let mut json = serde_json::to_value(RunConfig::new("cache", Task::Regression)).unwrap();
        for key in [
            "bucket",
            "pack",
            "max_seqs",
            "series_window",
            "batch_size",
            "weights",
        ] {
            assert!(json.as_object().unwrap().contains_key(key), "{key}: {json}");
        }
        let read = |json: &serde_json::Value| serde_json::from_value::<RunConfig>(json.clone());
        json["pack"] = 4096.into();
        json["max_seqs"] = 40.into();
        let packed = read(&json).unwrap();
        assert_eq!(
            packed.batches(),
            Batches::Packed(dsc_loader::Pack {
                tokens: 4096,
                max_seqs: Some(40)
            })
        );
        packed.validate().unwrap();
        json["bucket"] = true.into();
        let err = read(&json).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains("`bucket` and `pack`"), "{err}");
        // The count of weights is checked before any cache is opened.
        let mut mixed = RunConfig::new("a", Task::Regression);
        mixed.mix = vec!["b".into()];
        mixed.mixing.weights = Some(vec![1.0, 2.0, 3.0]);
        assert_eq!(mixed.validate().unwrap_err().key, "weights");
        mixed.mixing.weights = Some(vec![1.0, 2.0]);
        mixed.validate().unwrap();
        // A captured step refuses a recorded trim multiple (trimmed batches).
        let mut captured = RunConfig::new("cache", Task::Regression);
        captured.graph = true;
        captured.validate().unwrap();
        captured.shape.trim_multiple = Some(16);
        assert_eq!(captured.validate().unwrap_err().key, "trim");
        // Packs refuse a trim multiple.
        let mut packs = RunConfig::new("cache", Task::Regression);
        packs.shape.pack = Some(4096);
        packs.shape.trim_multiple = Some(16);
        assert_eq!(packs.validate().unwrap_err().key, "trim_multiple");
        // Runs of series windows wrote them as one object, with a trim multiple they never
        // used; their checkpoints resume.
        let mut old = serde_json::to_value(RunConfig::new("cache", Task::Forecast)).unwrap();
        let obj = old.as_object_mut().unwrap();
        for key in [
            "series_window",
            "stride",
            "horizon",
            "horizon_columns",
            "pad_windows",
        ] {
            obj.remove(key);
        }
        obj.insert(
            "series".into(),
            serde_json::json!({"len": 8, "stride": 4, "horizon": 2, "horizon_columns": ["v"],
                               "pad": true}),
        );
        obj.insert("trim_multiple".into(), 16.into());
        let windows = read(&old).unwrap();
        windows.validate().unwrap();
        assert_eq!(
            windows.batches(),
            Batches::Windows(dsc_loader::SeriesWindows {
                len: 8,
                stride: 4,
                horizon: 2,
                horizon_columns: vec!["v".into()],
                pad: true,
            })
        );
        let again = serde_json::to_value(&windows).unwrap();
        assert_eq!(
            (again["series_window"].clone(), again["stride"].clone()),
            (8.into(), 4.into())
        );
        assert!(
            again.get("series").is_none(),
            "written as the command line spells it"
        );
        // Checkpoints from before the shapes existed: padded.
        let obj = json.as_object_mut().unwrap();
        for key in ["bucket", "pack", "max_seqs", "series_window", "trim"] {
            obj.remove(key);
        }
        assert_eq!(read(&json).unwrap().batches(), Batches::Padded);
    }
}
