//! CUDA where tch does not reach: loading `libtorch_cuda` and CUDA events.
//!
//! rustc links with `--as-needed`, and nothing in the binary refers to a symbol of
//! `libtorch_cuda.so`, so the linker drops it and libtorch never registers its CUDA backend:
//! `Cuda::is_available()` says false on a GPU machine. Loading the library ourselves before the
//! first tch call registers it; where it is absent or cannot load (a CPU-only libtorch, or no
//! CUDA runtime), training runs on the CPU. With `feed.rs` (the producer's view of the pinned
//! slots), [`crate::graph`] and [`crate::nvml`] it is one of the four modules with `unsafe`.
//!
//! Events come from the CUDA runtime that `libtorch_cuda` itself loaded (tch has no event API).
//! They are recorded on the legacy default stream, the stream every libtorch op of this program
//! runs on, so they mark points in the same queue as the training step. The trainer uses them to
//! know when a pinned host buffer's copy has finished (so the loader may refill it) and to time
//! copies and compute on the device without stopping the host.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Host waits on CUDA events so far ([`Event::synchronize`]): with the read-backs, every time
/// the host stops for the device (the summary reports both).
static EVENT_WAITS: AtomicU64 = AtomicU64::new(0);

/// Host waits on CUDA events so far.
pub fn event_waits() -> u64 {
    EVENT_WAITS.load(Ordering::Relaxed)
}

/// Outcome of trying to load libtorch's CUDA backend.
#[derive(Debug, Clone)]
pub enum CudaLoad {
    /// `libtorch_cuda.so` is loaded; CUDA is usable if a device is present.
    Loaded,
    /// Not loaded, with the loader's reason (CPU-only libtorch, missing CUDA libraries).
    Unavailable(String),
}

/// Loads `libtorch_cuda.so` (found through the binary's run path or `LD_LIBRARY_PATH`) with
/// global symbols. Call before any tch function; later calls return the first outcome.
pub fn load_torch_cuda() -> CudaLoad {
    static ONCE: OnceLock<CudaLoad> = OnceLock::new();
    ONCE.get_or_init(
        || match dlopen("libtorch_cuda.so", libc::RTLD_NOW | libc::RTLD_GLOBAL) {
            Ok(_) => CudaLoad::Loaded,
            Err(e) => CudaLoad::Unavailable(e.to_string()),
        },
    )
    .clone()
}

/// The outcome of [`load_torch_cuda`] in words: `loaded` or `unavailable: <reason>`.
pub fn backend_status() -> String {
    match load_torch_cuda() {
        CudaLoad::Loaded => "loaded".into(),
        CudaLoad::Unavailable(e) => format!("unavailable: {e}"),
    }
}

/// What failed in the CUDA runtime: a library that would not load, a function the loaded
/// runtime lacks, or a call that returned an error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `dlopen` refused a library, with the dynamic loader's reason.
    #[error("{0}")]
    Load(String),
    /// No CUDA runtime is mapped into the process (libtorch's CUDA backend is not loaded).
    #[error("no CUDA runtime (libcudart) is loaded")]
    NoRuntime,
    /// The loaded runtime lacks a function this program calls.
    #[error("the CUDA runtime has no {0}")]
    Missing(String),
    /// A runtime call returned an error.
    #[error("{call}: {message}")]
    Call {
        /// The runtime function.
        call: &'static str,
        /// The runtime's description of the error code.
        message: String,
    },
}

pub(crate) fn dlopen(name: &str, flags: c_int) -> Result<*mut c_void, CudaError> {
    let c = CString::new(name).expect("library names have no NUL");
    // SAFETY: `c` is a valid NUL-terminated string; dlopen has no other preconditions. Loading
    // runs the library's static constructors, which is the point (backend registration).
    let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
        // on this thread; it is copied at once.
        let msg = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                format!("cannot load {name}")
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        return Err(CudaError::Load(msg));
    }
    Ok(handle)
}

/// A CUDA runtime return code (`cudaError_t`; 0 is success).
type Code = c_int;
type RawEvent = *mut c_void;
/// The legacy default stream (`cudaStream_t` 0), which libtorch uses unless told otherwise.
const DEFAULT_STREAM: *mut c_void = std::ptr::null_mut();
const EVENT_DEFAULT: u32 = 0;

type SetDeviceFn = unsafe extern "C" fn(c_int) -> Code;
type CreateFn = unsafe extern "C" fn(*mut RawEvent, u32) -> Code;
type RecordFn = unsafe extern "C" fn(RawEvent, *mut c_void) -> Code;
type EventFn = unsafe extern "C" fn(RawEvent) -> Code;
type ElapsedFn = unsafe extern "C" fn(*mut f32, RawEvent, RawEvent) -> Code;
type ErrorStringFn = unsafe extern "C" fn(Code) -> *const c_char;
type PciBusIdFn = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Code;
type MemInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> Code;

struct Runtime {
    set_device: SetDeviceFn,
    create: CreateFn,
    record: RecordFn,
    synchronize: EventFn,
    elapsed: ElapsedFn,
    destroy: EventFn,
    error_string: ErrorStringFn,
    pci_bus_id: PciBusIdFn,
    mem_info: MemInfoFn,
}

// SAFETY: the struct holds only function pointers into a library that stays loaded for the life
// of the process (it is never dlclosed); the CUDA runtime API is thread-safe.
unsafe impl Send for Runtime {}
// SAFETY: as above.
unsafe impl Sync for Runtime {}

fn runtime() -> Result<&'static Runtime, CudaError> {
    static RT: OnceLock<Result<Runtime, CudaError>> = OnceLock::new();
    RT.get_or_init(find_runtime).as_ref().map_err(Clone::clone)
}

fn find_runtime() -> Result<Runtime, CudaError> {
    // The runtime libtorch_cuda depends on is already mapped; RTLD_NOLOAD finds that copy
    // instead of loading a second, different one.
    let names = [
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so.11.0",
        "libcudart.so",
    ];
    let handle = names
        .iter()
        .find_map(|n| dlopen(n, libc::RTLD_NOW | libc::RTLD_NOLOAD).ok())
        .ok_or(CudaError::NoRuntime)?;
    let sym = |name: &str| -> Result<*mut c_void, CudaError> {
        let c = CString::new(name).expect("symbol names have no NUL");
        // SAFETY: `handle` came from a successful dlopen and `c` is NUL-terminated.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(CudaError::Missing(name.into()))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol is the CUDA runtime function of that name, whose C signature is the
    // one given by the field's type (cuda_runtime_api.h).
    unsafe {
        Ok(Runtime {
            set_device: std::mem::transmute::<*mut c_void, SetDeviceFn>(sym("cudaSetDevice")?),
            create: std::mem::transmute::<*mut c_void, CreateFn>(sym("cudaEventCreateWithFlags")?),
            record: std::mem::transmute::<*mut c_void, RecordFn>(sym("cudaEventRecord")?),
            synchronize: std::mem::transmute::<*mut c_void, EventFn>(sym("cudaEventSynchronize")?),
            elapsed: std::mem::transmute::<*mut c_void, ElapsedFn>(sym("cudaEventElapsedTime")?),
            destroy: std::mem::transmute::<*mut c_void, EventFn>(sym("cudaEventDestroy")?),
            error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(sym(
                "cudaGetErrorString",
            )?),
            pci_bus_id: std::mem::transmute::<*mut c_void, PciBusIdFn>(sym(
                "cudaDeviceGetPCIBusId",
            )?),
            mem_info: std::mem::transmute::<*mut c_void, MemInfoFn>(sym("cudaMemGetInfo")?),
        })
    }
}

fn check(rt: &Runtime, code: Code, call: &'static str) -> Result<(), CudaError> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: cudaGetErrorString returns a static NUL-terminated string for any code.
    let msg = unsafe { CStr::from_ptr((rt.error_string)(code)) };
    Err(CudaError::Call {
        call,
        message: msg.to_string_lossy().into_owned(),
    })
}

/// Makes `index` the calling thread's CUDA device (events are created on it).
pub fn set_device(index: usize) -> Result<(), CudaError> {
    let rt = runtime()?;
    // SAFETY: plain runtime call with an integer argument.
    let code = unsafe { (rt.set_device)(index as c_int) };
    check(rt, code, "cudaSetDevice")
}

/// The PCI bus id of CUDA device `index` (`0000:3b:00.0`), which names the same GPU to NVML
/// whatever `CUDA_VISIBLE_DEVICES` renumbers.
pub fn pci_bus_id(index: usize) -> Result<String, CudaError> {
    let rt = runtime()?;
    let mut buf = [0 as c_char; 64];
    // SAFETY: `buf` is writable for the length given; the runtime writes a NUL-terminated id.
    let code = unsafe { (rt.pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, index as c_int) };
    check(rt, code, "cudaDeviceGetPCIBusId")?;
    // SAFETY: on success `buf` holds a NUL-terminated string (zero-filled beyond it).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// The calling thread's current device's total memory in bytes ([`set_device`]).
pub fn memory_total() -> Result<usize, CudaError> {
    let rt = runtime()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out-pointers.
    let code = unsafe { (rt.mem_info)(&mut free, &mut total) };
    check(rt, code, "cudaMemGetInfo")?;
    Ok(total)
}

/// A CUDA event with timing, recorded on the default stream.
#[derive(Debug)]
pub struct Event {
    raw: RawEvent,
}

// SAFETY: a CUDA event handle may be used from any thread of the process.
unsafe impl Send for Event {}

impl Event {
    /// Creates an event on the current device.
    pub fn new() -> Result<Event, CudaError> {
        let rt = runtime()?;
        let mut raw: RawEvent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        let code = unsafe { (rt.create)(&mut raw, EVENT_DEFAULT) };
        check(rt, code, "cudaEventCreate")?;
        Ok(Event { raw })
    }

    /// Marks the current end of the default stream's queue.
    pub fn record(&self) -> Result<(), CudaError> {
        let rt = runtime()?;
        // SAFETY: `self.raw` is a live event created by this runtime.
        let code = unsafe { (rt.record)(self.raw, DEFAULT_STREAM) };
        check(rt, code, "cudaEventRecord")
    }

    /// Blocks the host until the work queued before the last `record` has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        EVENT_WAITS.fetch_add(1, Ordering::Relaxed);
        let rt = runtime()?;
        // SAFETY: as in `record`.
        let code = unsafe { (rt.synchronize)(self.raw) };
        check(rt, code, "cudaEventSynchronize")
    }

    /// Device milliseconds from `start` to `self`; both must be complete.
    pub fn since(&self, start: &Event) -> Result<f64, CudaError> {
        let rt = runtime()?;
        let mut ms = 0f32;
        // SAFETY: both events are live and `ms` is a valid out-pointer.
        let code = unsafe { (rt.elapsed)(&mut ms, start.raw, self.raw) };
        check(rt, code, "cudaEventElapsedTime")?;
        Ok(f64::from(ms))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(rt) = runtime() {
            // SAFETY: the event is live and dropped once; an error here cannot be acted on.
            unsafe { (rt.destroy)(self.raw) };
        }
    }
}
