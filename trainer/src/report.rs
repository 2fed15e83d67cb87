//! The `--json` summary and its parts.

use crate::timing::Shares;
use serde::{Deserialize, Serialize};

/// One finished epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochReport {
    /// Epoch number (0-based).
    pub epoch: u64,
    /// Optimizer steps in the epoch.
    pub steps: u64,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// Loss on the evaluation split (`--eval-split`), if the cache has it.
    pub val_loss: Option<f64>,
    /// The task's metric on the evaluation split.
    pub val_metric: Option<f64>,
    /// Contexts trained per second of wall time.
    pub samples_per_s: f64,
    /// Share of the wall time the step waited for the loader.
    pub data_wait_share: f64,
    /// Share of the wall time the host-to-device copies took (device time; 0 on the CPU).
    pub h2d_share: f64,
    /// Share of the wall time from a step's copy to its end (the trainer's own split, not GPU busy).
    pub compute_share: f64,
}

/// The final model on one split.
#[derive(Debug, Clone, Serialize)]
pub struct SplitEvaluation {
    /// The split's name.
    pub split: String,
    /// Contexts evaluated (each once).
    pub contexts: usize,
    /// Mean loss over them.
    pub loss: f64,
    /// The task's metric over them.
    pub metric: f64,
}

/// One logged window of training (every `--log-every` optimizer steps).
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// Optimizer steps done at the end of the window.
    pub step: u64,
    /// Mean training loss over the window.
    pub train_loss: f64,
    /// Learning rate of the window's last step.
    pub lr: f64,
    /// Contexts trained per second of wall time.
    pub samples_per_s: f64,
    /// Share of the wall time the step waited for the loader.
    pub data_wait_share: f64,
    /// Share of the wall time the host-to-device copies took.
    pub h2d_share: f64,
    /// Share of the wall time from a step's copy to its end.
    pub compute_share: f64,
}

impl StepReport {
    /// A report of the window ending at optimizer step `step`.
    pub fn new(step: u64, train_loss: f64, lr: f64, s: Shares) -> StepReport {
        StepReport {
            step,
            train_loss,
            lr,
            samples_per_s: s.samples_per_s,
            data_wait_share: s.data_wait_share,
            h2d_share: s.h2d_share,
            compute_share: s.compute_share,
        }
    }
}

/// Host reads of device values, by purpose.
#[derive(Debug, Clone, Serialize)]
pub struct Readbacks {
    /// Inside training steps: one per logged window.
    pub training: u64,
    /// Validation, checkpoints, diagnostics.
    pub other: u64,
    /// Host waits on CUDA events: one per step for the copy that frees a ring slot, one per
    /// logged window for its timing events; none on the CPU.
    pub event_waits: u64,
}

/// The final summary of `dsc-train` (training, or `--overfit-batch`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `train` or `overfit_batch`.
    pub mode: &'static str,
    /// The device trained on (`cpu (N threads)`, `cuda:0`).
    pub device: String,
    /// Whether libtorch's CUDA backend (`libtorch_cuda.so`) was loaded at start.
    pub cuda_backend: String,
    /// Mixed precision used: `none`, `bf16` or `fp16`.
    pub amp: String,
    /// Whether training batches were gathered on the device from the resident train split.
    pub resident: bool,
    /// How training steps were launched: `eager`, `graph` (captured as CUDA graphs and
    /// replayed, `--graph`) or `uncaptured` (`--graph` where capture was unavailable: the same
    /// step from fixed buffers).
    pub step: &'static str,
    /// Why `--graph` ran uncaptured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_unavailable: Option<String>,
    /// The task (`regression`, `classification`, `direction`).
    pub task: String,
    /// The network (`transformer`, `gru`).
    pub model: String,
    /// Trainable parameters.
    pub parameters: i64,
    /// The task's metric (e.g. `mean_angular_error`).
    pub metric: String,
    /// Each finished epoch.
    pub epochs: Vec<EpochReport>,
    /// Each logged window.
    pub steps: Vec<StepReport>,
    /// Optimizer steps taken in all.
    pub optimizer_steps: u64,
    /// Shares over the whole run: the trainer's own split of its wall time (CUDA events), not
    /// how busy the GPU was: see `gpu_busy_nvml`.
    pub total: Shares,
    /// The share of the training time a kernel ran on the GPU, as NVML (`nvidia-smi`) measures
    /// it, sampled every 100 ms; absent without a GPU or without the driver's NVML library.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_busy_nvml: Option<f64>,
    /// Every time the host stopped for the device.
    pub readbacks: Readbacks,
    /// `--overfit-batch`: whether the loss fell by over 90%.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overfit_passed: Option<bool>,
    /// The checkpoint written (`OUT/last.ckpt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The split behind each epoch's `val_loss` and `val_metric`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_split: Option<String>,
    /// The final model on every split but train (after the last epoch).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evaluation: Vec<SplitEvaluation>,
    /// Padded training batches by sequence length (packs have one shape): the batch shapes the
    /// steps saw, each a new allocation and kernel choice on a GPU (`--trim-multiple`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub batch_lens: std::collections::BTreeMap<usize, u64>,
    /// What the training loader handed over in all (batches, contexts, bytes), how often the
    /// step found no batch ready (`waits`, `wait_s`), how many were ready ahead of it
    /// (`queued / batches`), and what a compressed cache read (`shard_reads`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loader: Option<dsc_loader::LoaderStats>,
    /// With a mix: where the run stands on its weights at the end (the schedule's stage in
    /// force, its weights, each cache's draws and realised share of the stage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<dsc_loader::Progress>,
}

/// `--find-batch-size`: one size tried.
#[derive(Debug, Clone, Serialize)]
pub struct BatchTrial {
    /// Contexts per batch tried.
    pub batch_size: usize,
    /// Whether a step of it ran within the device's memory.
    pub fits: bool,
    /// Its contexts per second, when it fit.
    pub samples_per_s: Option<f64>,
    /// Why it did not fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `--find-batch-size` summary.
#[derive(Debug, Clone, Serialize)]
pub struct BatchSizeReport {
    /// `find_batch_size`.
    pub mode: &'static str,
    /// The device tried on.
    pub device: String,
    /// The largest batch size that fit.
    pub largest: Option<usize>,
    /// Each size tried, in order.
    pub trials: Vec<BatchTrial>,
}

/// A mix's weights or shares as the trainer prints them: three decimals, space-separated.
pub fn shares_text(shares: &[f64]) -> String {
    shares
        .iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}
