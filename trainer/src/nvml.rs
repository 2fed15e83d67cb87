//! GPU busy as NVML measures it: the share of time a kernel was running on the device, sampled
//! while the run trains. It is the figure `nvidia-smi` shows, and the one that says whether the
//! GPU idles; the trainer's own split (data wait, copy, compute from CUDA events) cannot, since
//! "compute" there is the span from a step's copy to its end, gaps between kernels included.
//!
//! `libnvidia-ml.so.1` comes with the NVIDIA driver, not with CUDA or libtorch: it is loaded at
//! run time, and where it is absent (every CPU machine) there is simply no figure.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

type NvmlReturn = c_int;
type RawDevice = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ByBusIdFn = unsafe extern "C" fn(*const c_char, *mut RawDevice) -> NvmlReturn;
type UtilizationFn = unsafe extern "C" fn(RawDevice, *mut Utilization) -> NvmlReturn;

/// How often the utilisation is read; NVML itself averages over its own sample period
/// (1/6 s to 1 s, by GPU).
const EVERY: Duration = Duration::from_millis(100);

/// A thread reading the GPU's utilisation until [`Busy::finish`].
#[derive(Debug)]
pub struct Busy {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Option<f64>>,
}

/// Starts sampling the GPU with PCI bus id `bus_id` ([`crate::cuda::pci_bus_id`]); `None`
/// where NVML is absent or does not know the device.
pub fn sample(bus_id: &str) -> Option<Busy> {
    let read = Reader::open(bus_id)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("dsc-nvml".into())
        .spawn(move || {
            let (mut sum, mut n) = (0u64, 0u64);
            while !flag.load(Ordering::Relaxed) {
                if let Some(pct) = read.gpu_percent() {
                    sum += u64::from(pct);
                    n += 1;
                }
                std::thread::sleep(EVERY);
            }
            (n > 0).then(|| sum as f64 / n as f64 / 100.0)
        })
        .ok()?;
    Some(Busy { stop, thread })
}

impl Busy {
    /// Stops sampling; the mean share of time the GPU was busy (0 to 1), if any sample came.
    pub fn finish(self) -> Option<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok().flatten()
    }
}

struct Reader {
    device: RawDevice,
    utilization: UtilizationFn,
}

// SAFETY: an NVML device handle may be used from any thread (NVML is thread-safe), and the
// function pointer is into a library never unloaded.
unsafe impl Send for Reader {}

impl Reader {
    fn open(bus_id: &str) -> Option<Reader> {
        let lib =
            crate::cuda::dlopen("libnvidia-ml.so.1", libc::RTLD_NOW | libc::RTLD_LOCAL).ok()?;
        let sym = |name: &str| -> Option<*mut c_void> {
            let c = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: `lib` came from a successful dlopen and `c` is NUL-terminated.
            let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each symbol is the NVML function of that name, whose C signature is the one
        // given by the target type (nvml.h); `nvmlInit_v2` may be called any number of times.
        unsafe {
            let init = std::mem::transmute::<*mut c_void, InitFn>(sym("nvmlInit_v2")?);
            let by_bus = std::mem::transmute::<*mut c_void, ByBusIdFn>(sym(
                "nvmlDeviceGetHandleByPciBusId_v2",
            )?);
            let utilization = std::mem::transmute::<*mut c_void, UtilizationFn>(sym(
                "nvmlDeviceGetUtilizationRates",
            )?);
            if init() != 0 {
                return None;
            }
            let id = CString::new(bus_id).ok()?;
            let mut device: RawDevice = std::ptr::null_mut();
            if by_bus(id.as_ptr(), &mut device) != 0 {
                return None;
            }
            Some(Reader {
                device,
                utilization,
            })
        }
    }

    fn gpu_percent(&self) -> Option<u32> {
        let mut u = Utilization::default();
        // SAFETY: `device` is a handle NVML gave; `u` is a valid out-pointer.
        let rc = unsafe { (self.utilization)(self.device, &mut u) };
        (rc == 0).then_some(u.gpu)
    }
}

#[cfg(test)]
mod tests {
    /// Where there is no NVML (CPU machines, CI) there is no figure and no error; where there is
    /// one, an unknown bus id gives none either.
    #[test]
    fn an_absent_library_or_device_gives_no_figure() {
        assert!(super::sample("0000:ff:1f.7").is_none());
    }
}
