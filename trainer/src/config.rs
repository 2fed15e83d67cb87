//! The run configuration: everything that defines a run's arithmetic. Saved in checkpoints, so
//! that `--resume` needs nothing else. The binary's `args` builds it from the command line; a
//! program using the library builds it directly.

use crate::error::TrainError;
pub use crate::model::Amp;
use crate::model::{GruConfig, ModelConfig, TransformerConfig};
use dsc_format::spelling::OptionError;
use dsc_format::{Manifest, TensorRole};
use dsc_loader::{Batches, LoaderOptions, OrderSpec, MAX_TRIM_MULTIPLE};
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
    /// The train mix's weights, one per cache (`--weights`; empty: the caches' sizes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<f64>,
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
    /// Contexts per micro-batch.
    pub batch_size: usize,
    /// The mix's positions per epoch (`--mix-samples`; `None`: the caches' contexts together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_samples: Option<usize>,
    /// What a batch is, train and evaluation: padded contexts, length-bucketed ones, packs or
    /// windows of long series. Written as checkpoints always have (`bucket`, `pack`,
    /// `max_seqs`, `series`); checkpoints from before an option existed trained without it.
    #[serde(flatten, with = "batches_fields")]
    pub batches: Batches,
    /// Trimmed batch lengths round up the ladder of this multiple (`None`:
    /// [`defaults::GPU_TRIM_MULTIPLE`] on CUDA, exact on the CPU). Shapes only: the order and
    /// the values are the same whatever it is, so a run may resume with another.
    #[serde(default)]
    pub trim_multiple: Option<usize>,
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

    /// The loader options of this run over `split`: the train split shuffled in whole
    /// batches; any other in cache order, every context once (the last batch completed).
    pub fn loader_options(
        &self,
        manifest: &Manifest,
        split: &str,
        epoch: u64,
        trim_multiple: usize,
    ) -> LoaderOptions {
        let train = split == "train";
        LoaderOptions {
            order: OrderSpec {
                split: split.into(),
                seed: self.seed,
                shuffle: train,
                drop_last: train,
                batches: self.batches.clone(),
                // Evaluation reads each cache's split once (weights by size, one pass).
                weights: if train {
                    self.weights.clone()
                } else {
                    Vec::new()
                },
                mix_samples: if train { self.mix_samples } else { None },
                ..Default::default()
            },
            batch_size: self.batch_size,
            epoch,
            threads: 0,
            // A window is as long as it is; a pack has no padding; a captured step replays one
            // shape.
            trim: (self.batches.is_padded() && !(self.graph && train)).then_some(trim_multiple),
            // Packs have no layout for engine sub-columns (which the networks do not read).
            columns: match self.batches {
                Batches::Packed(_) => manifest
                    .tensors()
                    .iter()
                    .filter(|t| t.role != TensorRole::SubColumn)
                    .map(|t| t.name.clone())
                    .collect(),
                _ => Vec::new(),
            },
            ..Default::default()
        }
    }

    /// The defaults of `dsc-train` for a cache and task.
    pub fn new(cache: impl Into<PathBuf>, task: Task) -> RunConfig {
        RunConfig {
            cache: cache.into(),
            mix: Vec::new(),
            weights: Vec::new(),
            generation: None,
            task,
            target: Vec::new(),
            model: ModelKind::Transformer,
            dim: defaults::DIM,
            layers: defaults::LAYERS,
            heads: defaults::HEADS,
            dropout: 0.0,
            epochs: 1,
            batch_size: defaults::BATCH_SIZE,
            mix_samples: None,
            batches: Batches::Padded,
            trim_multiple: None,
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
        macro_rules! ensure {
            ($ok:expr, $key:literal, $($problem:tt)+) => {
                let ok: bool = $ok;
                if !ok {
                    return Err(OptionError::new($key, format!($($problem)+)));
                }
            };
        }
        ensure!(self.batch_size > 0, "batch_size", "must be at least 1");
        ensure!(self.accumulate > 0, "accumulate", "must be at least 1");
        let pack = self.batches.pack();
        ensure!(
            pack.is_none_or(|p| p.tokens > 0),
            "pack",
            "must be at least 1"
        );
        ensure!(
            pack.is_none_or(|p| p.max_seqs != Some(0)),
            "max_seqs",
            "must be at least 1"
        );
        ensure!(
            self.trim_multiple
                .is_none_or(|m| (1..=MAX_TRIM_MULTIPLE).contains(&m)),
            "trim_multiple",
            "must be between 1 and {MAX_TRIM_MULTIPLE}"
        );
        ensure!(
            // Runs of series windows recorded a multiple they never used: not refused, so
            // that their checkpoints resume.
            self.trim_multiple.is_none() || self.batches.pack().is_none(),
            "trim_multiple",
            "rounds trimmed lengths; packed batches (`pack`) have one shape already"
        );
        if self.graph {
            // The loader's one rule for a step that replays one shape (`dsc.Loader(static=True)`
            // and examples/train.py ask it too); a recorded trim multiple means trimmed batches.
            self.batches.static_shape(self.trim_multiple.is_some())?;
        }
        ensure!(
            self.weights.is_empty() || self.weights.len() == self.mix.len() + 1,
            "weights",
            "gives {} weights for {} caches: one per `cache`, in their order",
            self.weights.len(),
            self.mix.len() + 1
        );
        ensure!(
            self.mix.is_empty() || self.resident != Some(true),
            "resident",
            "keeps one cache's split on the device; a mix is gathered on the host"
        );
        ensure!(
            (self.task == Task::Forecast) == self.batches.windows().is_some_and(|s| s.horizon > 0),
            "task",
            "`forecast` learns the steps after each series window: it takes `series_window` and \
             `horizon`, and they take it"
        );
        ensure!(
            self.batches.windows().is_none() || self.resident != Some(true),
            "resident",
            "keeps whole contexts on the device; series windows are cut on the host"
        );
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

/// [`RunConfig::batches`] as checkpoints write it: the shape by its old keys, so that every
/// checkpoint written before the shape was one type still reads, and one that names two
/// shapes is refused by key.
mod batches_fields {
    use dsc_loader::{Batches, Pack, SeriesWindows};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Fields {
        #[serde(default)]
        bucket: bool,
        #[serde(default)]
        pack: Option<usize>,
        #[serde(default)]
        max_seqs: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        series: Option<SeriesWindows>,
    }

    pub fn serialize<S: Serializer>(b: &Batches, s: S) -> Result<S::Ok, S::Error> {
        let pack = b.pack();
        Fields {
            bucket: b.is_bucketed(),
            pack: pack.map(|p| p.tokens),
            max_seqs: pack.and_then(|p| p.max_seqs),
            series: b.windows().cloned(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Batches, D::Error> {
        let f = Fields::deserialize(d)?;
        if f.pack.is_none() && f.max_seqs.is_some() {
            return Err(serde::de::Error::custom(
                "`max_seqs` sizes packed batches: give `pack` too",
            ));
        }
        let pack = f.pack.map(|tokens| Pack {
            tokens,
            max_seqs: f.max_seqs,
        });
        Batches::from_options(f.bucket, pack, f.series).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint names its shape by the keys it always had: each reads back as one shape,
    /// one that names two is refused, and the keys written are the old ones.
    #[test]
    fn checkpoints_keep_their_shape_keys() {
        let mut json = serde_json::to_value(RunConfig::new("cache", Task::Regression)).unwrap();
        assert_eq!(
            (json["bucket"].clone(), json["pack"].clone()),
            (false.into(), serde_json::Value::Null)
        );
        let read = |json: &serde_json::Value| serde_json::from_value::<RunConfig>(json.clone());
        json["pack"] = 4096.into();
        json["max_seqs"] = 40.into();
        assert_eq!(
            read(&json).unwrap().batches,
            Batches::Packed(dsc_loader::Pack {
                tokens: 4096,
                max_seqs: Some(40)
            })
        );
        json["bucket"] = true.into();
        let err = read(&json).unwrap_err().to_string();
        assert!(err.contains("`bucket` and `pack`"), "{err}");
        // Runs of series windows recorded a trim multiple they never used; their checkpoints
        // resume. Packs refuse one.
        let mut windows = RunConfig::new("cache", Task::Forecast);
        windows.batches = Batches::Windows(dsc_loader::SeriesWindows {
            len: 8,
            stride: 8,
            horizon: 2,
            horizon_columns: Vec::new(),
            pad: false,
        });
        windows.trim_multiple = Some(16);
        windows.validate().unwrap();
        windows.batches = Batches::Packed(dsc_loader::Pack::tokens(4096));
        windows.task = Task::Regression;
        assert_eq!(windows.validate().unwrap_err().key, "trim_multiple");
        // Checkpoints from before the shapes existed: padded.
        let obj = json.as_object_mut().unwrap();
        for key in ["bucket", "pack", "max_seqs"] {
            obj.remove(key);
        }
        assert_eq!(read(&json).unwrap().batches, Batches::Padded);
    }
}
