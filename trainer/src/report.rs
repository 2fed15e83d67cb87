//! The `--json` summary and its parts.

use crate::timing::Shares;
use serde::{Deserialize, Serialize};

/// One finished epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochReport {
    pub epoch: u64,
    pub steps: u64,
    pub train_loss: f64,
    pub val_loss: Option<f64>,
    pub val_metric: Option<f64>,
    pub samples_per_s: f64,
    pub data_wait_share: f64,
    pub h2d_share: f64,
    pub compute_share: f64,
}

/// The final model on one split.
#[derive(Debug, Clone, Serialize)]
pub struct SplitEvaluation {
    pub split: String,
    pub contexts: usize,
    pub loss: f64,
    pub metric: f64,
}

/// One logged window of training (every `--log-every` optimizer steps).
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// Optimizer steps done at the end of the window.
    pub step: u64,
    pub train_loss: f64,
    pub lr: f64,
    pub samples_per_s: f64,
    pub data_wait_share: f64,
    pub h2d_share: f64,
    pub compute_share: f64,
}

impl StepReport {
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
    pub mode: &'static str,
    pub device: String,
    /// Whether libtorch's CUDA backend (`libtorch_cuda.so`) was loaded at start.
    pub cuda_backend: String,
    pub amp: String,
    /// Whether training batches were gathered on the device from the resident train split.
    pub resident: bool,
    pub task: String,
    pub model: String,
    pub parameters: i64,
    pub metric: String,
    pub epochs: Vec<EpochReport>,
    pub steps: Vec<StepReport>,
    pub optimizer_steps: u64,
    /// Shares over the whole run: the trainer's own split of its wall time (CUDA events), not
    /// how busy the GPU was: see `gpu_busy_nvml`.
    pub total: Shares,
    /// The share of the training time a kernel ran on the GPU, as NVML (`nvidia-smi`) measures
    /// it, sampled every 100 ms; absent without a GPU or without the driver's NVML library.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_busy_nvml: Option<f64>,
    pub readbacks: Readbacks,
    /// `--overfit-batch`: whether the loss fell by over 90%.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overfit_passed: Option<bool>,
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
}

/// `--find-batch-size`: one size tried.
#[derive(Debug, Clone, Serialize)]
pub struct BatchTrial {
    pub batch_size: usize,
    pub fits: bool,
    pub samples_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `--find-batch-size` summary.
#[derive(Debug, Clone, Serialize)]
pub struct BatchSizeReport {
    pub mode: &'static str,
    pub device: String,
    pub largest: Option<usize>,
    pub trials: Vec<BatchTrial>,
}
