//! Every read of a device value by the host goes through here. On CUDA each read waits for the
//! queue to drain, so the training loop reads only once per `--log-every` steps; the counters
//! let tests and the summary prove it (and a test checks that no other module reads values).

use std::sync::atomic::{AtomicU64, Ordering};
use tch::{Device, Kind, Tensor};

static TRAINING: AtomicU64 = AtomicU64::new(0);
static OTHER: AtomicU64 = AtomicU64::new(0);

/// Why a value is read back, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Inside the training loop (the logged loss).
    Training,
    /// Validation results, checkpoints, diagnostics: outside the steps.
    Other,
}

/// Reads a small tensor (e.g. a few stacked scalars) back as f64s, in one transfer.
pub fn values(t: &Tensor, why: Purpose) -> Vec<f64> {
    count(why);
    let host = t
        .to_kind(Kind::Double)
        .to_device(Device::Cpu)
        .flatten(0, -1);
    Vec::<f64>::try_from(&host).expect("a double tensor converts")
}

/// Copies a tensor's bytes to the host (checkpoints), in one transfer.
pub fn bytes(t: &Tensor) -> Vec<u8> {
    count(Purpose::Other);
    let host = t.to_device(Device::Cpu).contiguous();
    let mut out = vec![0u8; host.numel() * host.kind().elt_size_in_bytes()];
    host.copy_data_u8(&mut out, host.numel());
    out
}

fn count(why: Purpose) {
    let c = match why {
        Purpose::Training => &TRAINING,
        Purpose::Other => &OTHER,
    };
    c.fetch_add(1, Ordering::Relaxed);
}

/// Reads inside the training loop so far.
pub fn training_reads() -> u64 {
    TRAINING.load(Ordering::Relaxed)
}

/// Other reads so far.
pub fn other_reads() -> u64 {
    OTHER.load(Ordering::Relaxed)
}
