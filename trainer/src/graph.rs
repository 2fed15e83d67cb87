//! CUDA graphs for the whole training step: capture once, replay every step.
//!
//! A small network's step is a few hundred kernels of a few microseconds each; launched one by
//! one from the host, the launches and not the GPU set its pace (docs/PERFORMANCE.md). Captured
//! as a CUDA graph, the same kernels replay with one launch. tch binds no graph API, so
//! `csrc/graph.cpp` (built by build.rs against libtorch's own headers, `cfg(dsc_cuda_graphs)`)
//! wraps `at::cuda::CUDAGraph`, a side stream to warm up and capture on (capture is refused on
//! the default stream) and a non-blocking copy into a fixed tensor. Where it was not built, or
//! the device is the CPU, [`unavailable`] says why and the step runs uncaptured.
//!
//! A replay reuses the device addresses of its capture: every tensor the step reads from
//! outside (the batch, the learning rate) must be written in place before each replay, and
//! every tensor it makes lives in the graph's private memory pool. [`crate::step`] keeps to
//! that. With [`crate::cuda`], [`crate::feed`] and [`crate::nvml`], one of the four modules with
//! `unsafe`.

use crate::error::{Result, TrainError};
use tch::{Device, Tensor};

/// Why steps on `device` cannot be captured, or `None` when they can.
pub fn unavailable(device: Device) -> Option<String> {
    match device {
        Device::Cuda(_) if cfg!(dsc_cuda_graphs) => None,
        Device::Cuda(_) => Some(
            "this dsc-train was built without CUDA graphs (no CUDA build of libtorch or no CUDA \
             runtime headers beside it when it was compiled)"
                .into(),
        ),
        _ => Some("CUDA graphs need a CUDA device".into()),
    }
}

#[cfg(dsc_cuda_graphs)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn dsc_cuda_last_error() -> *const c_char;
        pub fn dsc_side_stream_new(device: c_int, out: *mut *mut c_void) -> c_int;
        pub fn dsc_side_stream_enter(s: *mut c_void) -> c_int;
        pub fn dsc_side_stream_exit(s: *mut c_void) -> c_int;
        pub fn dsc_side_stream_free(s: *mut c_void);
        pub fn dsc_graph_new(out: *mut *mut c_void) -> c_int;
        pub fn dsc_graph_begin(g: *mut c_void) -> c_int;
        pub fn dsc_graph_end(g: *mut c_void) -> c_int;
        pub fn dsc_graph_replay(g: *mut c_void) -> c_int;
        pub fn dsc_graph_free(g: *mut c_void);
        pub fn dsc_copy_async(dst: *mut c_void, src: *const c_void) -> c_int;
    }
}

/// The shim's outcome as a result: its message on failure.
#[cfg(dsc_cuda_graphs)]
fn check(code: std::ffi::c_int, what: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: the shim keeps the last message in a thread-local string, NUL-terminated and
    // valid until its next failure on this thread; it is copied at once.
    let msg = unsafe { std::ffi::CStr::from_ptr(ffi::dsc_cuda_last_error()) };
    Err(TrainError::Graph(format!(
        "{what}: {}",
        msg.to_string_lossy()
    )))
}

#[cfg(not(dsc_cuda_graphs))]
fn missing<T>() -> Result<T> {
    Err(TrainError::Graph(
        unavailable(Device::Cuda(0)).expect("built without graphs"),
    ))
}

/// `dst.copy_(src)` queued on the current stream without waiting for it (`src` pinned on the
/// host, `dst` on the device); on the CPU, a plain copy. Shapes and dtypes must agree.
pub fn copy_async(dst: &mut Tensor, src: &Tensor) -> Result<()> {
    if !dst.device().is_cuda() {
        dst.f_copy_(src).map_err(|source| TrainError::Torch {
            what: "copying a batch into its fixed buffers".into(),
            source,
        })?;
        return Ok(());
    }
    #[cfg(dsc_cuda_graphs)]
    {
        // SAFETY: both pointers are live tch tensors (borrowed for the call); the shim only
        // calls `copy_` on them and catches every exception.
        let code = unsafe { ffi::dsc_copy_async(dst.as_mut_ptr().cast(), src.as_ptr().cast()) };
        check(code, "copying a batch into its fixed device buffers")
    }
    #[cfg(not(dsc_cuda_graphs))]
    {
        dst.f_copy_(src).map_err(|source| TrainError::Torch {
            what: "copying a batch into its fixed buffers".into(),
            source,
        })?;
        Ok(())
    }
}

/// A stream of libtorch's pool that work can be moved onto for a while ([`SideStream::run`]).
#[derive(Debug)]
pub struct SideStream {
    #[cfg(dsc_cuda_graphs)]
    raw: *mut std::ffi::c_void,
}

impl SideStream {
    /// A side stream on CUDA device `index`.
    pub fn new(index: usize) -> Result<SideStream> {
        #[cfg(dsc_cuda_graphs)]
        {
            let mut raw = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; on success it holds a new stream handle.
            let code = unsafe { ffi::dsc_side_stream_new(index as std::ffi::c_int, &mut raw) };
            check(code, "taking a stream from libtorch's pool")?;
            Ok(SideStream { raw })
        }
        #[cfg(not(dsc_cuda_graphs))]
        {
            let _ = index;
            missing()
        }
    }

    /// Runs `f` with this stream current: it starts after the work queued so far on the current
    /// stream, and the current stream's later work waits for it.
    pub fn run<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        #[cfg(dsc_cuda_graphs)]
        {
            // SAFETY: `raw` is a live side stream of this struct.
            let entered = unsafe { ffi::dsc_side_stream_enter(self.raw) };
            check(entered, "entering the side stream")?;
            let out = f();
            // SAFETY: as above; exiting restores the stream current before `enter`.
            let exited = unsafe { ffi::dsc_side_stream_exit(self.raw) };
            let left = check(exited, "leaving the side stream");
            let out = out?;
            left?;
            Ok(out)
        }
        #[cfg(not(dsc_cuda_graphs))]
        {
            let _ = f;
            missing()
        }
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        #[cfg(dsc_cuda_graphs)]
        // SAFETY: the handle is live and freed once (libtorch's pool keeps the stream itself).
        unsafe {
            ffi::dsc_side_stream_free(self.raw)
        };
    }
}

/// One captured piece of work, replayed on the current stream.
#[derive(Debug)]
pub struct Graph {
    #[cfg(dsc_cuda_graphs)]
    raw: *mut std::ffi::c_void,
}

impl Graph {
    /// Captures what `f` queues on the device, on `side`, without running it: run it with
    /// [`Graph::replay`]. Every tensor `f` allocates is kept by the graph for its replays.
    pub fn capture(side: &SideStream, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        #[cfg(dsc_cuda_graphs)]
        {
            let mut raw = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer.
            let made = unsafe { ffi::dsc_graph_new(&mut raw) };
            check(made, "making a CUDA graph")?;
            let graph = Graph { raw };
            side.run(|| {
                // SAFETY: `raw` is live; the side stream is current, as capture requires.
                let began = unsafe { ffi::dsc_graph_begin(graph.raw) };
                check(began, "starting a capture")?;
                let captured = f();
                // SAFETY: as above; the capture is ended whether `f` failed or not.
                let end = unsafe { ffi::dsc_graph_end(graph.raw) };
                let ended = check(end, "ending the capture");
                captured?;
                ended
            })?;
            Ok(graph)
        }
        #[cfg(not(dsc_cuda_graphs))]
        {
            let _ = (side, f);
            missing()
        }
    }

    /// Queues the captured work on the current stream.
    pub fn replay(&self) -> Result<()> {
        #[cfg(dsc_cuda_graphs)]
        {
            // SAFETY: `raw` is a live, captured graph.
            let replayed = unsafe { ffi::dsc_graph_replay(self.raw) };
            check(replayed, "replaying the step")
        }
        #[cfg(not(dsc_cuda_graphs))]
        missing()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        #[cfg(dsc_cuda_graphs)]
        // SAFETY: the graph is live and freed once; its pool returns to libtorch's allocator.
        unsafe {
            ffi::dsc_graph_free(self.raw)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_says_why_it_runs_uncaptured() {
        let why = unavailable(Device::Cpu).expect("no graphs on the CPU");
        assert!(why.contains("CUDA device"), "{why}");
    }

    #[test]
    fn a_fixed_buffer_takes_a_batch_in_place() {
        let mut dst = Tensor::zeros([2, 3], (tch::Kind::Float, Device::Cpu));
        let before = dst.data_ptr();
        let src = Tensor::arange(6, (tch::Kind::Float, Device::Cpu)).view([2, 3]);
        copy_async(&mut dst, &src).unwrap();
        assert_eq!(
            dst.data_ptr(),
            before,
            "the copy must land in the same memory"
        );
        assert_eq!(
            Vec::<f32>::try_from(dst.view([-1])).unwrap(),
            [0., 1., 2., 3., 4., 5.]
        );
    }
}
