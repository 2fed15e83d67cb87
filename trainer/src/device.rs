//! Choosing the device a run uses, and naming it in reports.

use crate::cuda::CudaLoad;
use crate::error::Result;
use dsc_format::spelling::OptionError;
use tch::Device;

/// Resolves `auto` (CUDA when present), `cpu`, `cuda`/`gpu` or `cuda:N`; `cuda` says why a CUDA
/// device is unusable when one was asked for.
pub fn choose(want: &str, cuda: &CudaLoad) -> Result<Device> {
    let bad = |problem: String| Err(OptionError::new("device", problem).into());
    let why = || match cuda {
        CudaLoad::Loaded => "libtorch's CUDA backend is loaded but sees no device".to_string(),
        CudaLoad::Unavailable(e) => format!("libtorch_cuda could not be loaded: {e}"),
    };
    match want {
        "auto" => Ok(Device::cuda_if_available()),
        "cpu" => Ok(Device::Cpu),
        "cuda" | "gpu" => {
            if !tch::Cuda::is_available() {
                return bad(format!("cuda: {}", why()));
            }
            Ok(Device::Cuda(0))
        }
        other => {
            let Some(i) = other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                return bad(format!("{other:?}: expected auto, cpu, cuda or cuda:N"));
            };
            let n = tch::Cuda::device_count() as usize;
            if i >= n {
                return bad(format!(
                    "{other}: {n} CUDA device(s) visible; {}",
                    if n == 0 { why() } else { String::new() }
                ));
            }
            Ok(Device::Cuda(i))
        }
    }
}

/// `cpu (N threads)` or `cuda:N`.
pub fn describe(d: Device) -> String {
    match d {
        Device::Cpu => format!("cpu ({} threads)", tch::get_num_threads()),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}"),
    }
}

/// `cpu` or `cuda:N`: the name a run records ([`crate::machine`]) and `choose` takes back.
pub fn name(d: Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}
