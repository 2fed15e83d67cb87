// What dsc-train needs of libtorch's CUDA side that tch 0.24 does not bind: CUDA graphs
// (`at::cuda::CUDAGraph`), a side stream to warm up and capture on, and a non-blocking copy into
// an existing tensor. Every entry point is C, catches every C++ exception and returns nonzero
// with the message kept for `dsc_cuda_last_error` (an exception must not unwind into Rust).
//
// Built by build.rs against the headers of the libtorch that tch links, only where the CUDA
// runtime headers are found beside it (the PyPI wheel's `nvidia/cu13/include`); without them
// dsc-train is built without capture and its `--graph` runs the same step uncaptured.

#include <ATen/Tensor.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>

#include <string>

#include "guard.h"

namespace {

thread_local std::string last_error;

template <class F>
int guarded(F f) {
  return dsc_shim::guarded(last_error, f);
}

// Makes `waiter` wait for the work queued so far on `queued`. Through c10's device-generic
// event, so that the shim calls the CUDA runtime only through libtorch (which loads it) and
// links no runtime of its own.
void order(const c10::cuda::CUDAStream& queued, const c10::cuda::CUDAStream& waiter) {
  c10::Event e(c10::DeviceType::CUDA);
  e.record(queued.unwrap());
  e.block(waiter.unwrap());
}

}  // namespace

// A stream of libtorch's pool beside the one the program runs on: PyTorch captures on a
// non-default stream, and warms up on the same one so that per-stream state (cuBLAS workspaces)
// exists before capture.
struct dsc_side_stream {
  c10::cuda::CUDAStream side;
  c10::cuda::CUDAStream outer;
};

extern "C" {

const char* dsc_cuda_last_error() { return last_error.c_str(); }

int dsc_side_stream_new(int device, dsc_side_stream** out) {
  return guarded([&] {
    auto side = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    *out = new dsc_side_stream{side, side};
  });
}

// Makes the side stream current after the work queued so far on the current stream.
int dsc_side_stream_enter(dsc_side_stream* s) {
  return guarded([&] {
    s->outer = c10::cuda::getCurrentCUDAStream(s->side.device_index());
    order(s->outer, s->side);
    c10::cuda::setCurrentCUDAStream(s->side);
  });
}

// Returns to the stream current before `enter`; what follows there waits for the side's work.
int dsc_side_stream_exit(dsc_side_stream* s) {
  return guarded([&] {
    order(s->side, s->outer);
    c10::cuda::setCurrentCUDAStream(s->outer);
  });
}

void dsc_side_stream_free(dsc_side_stream* s) { delete s; }

int dsc_graph_new(at::cuda::CUDAGraph** out) {
  return guarded([&] { *out = new at::cuda::CUDAGraph(); });
}

// Starts capturing the current stream (which must not be the default one) into `g`, with a
// memory pool of its own that keeps every tensor the captured work allocates.
int dsc_graph_begin(at::cuda::CUDAGraph* g) {
  return guarded([&] { g->capture_begin(); });
}

int dsc_graph_end(at::cuda::CUDAGraph* g) {
  return guarded([&] { g->capture_end(); });
}

// Launches the captured work on the current stream.
int dsc_graph_replay(at::cuda::CUDAGraph* g) {
  return guarded([&] { g->replay(); });
}

void dsc_graph_free(at::cuda::CUDAGraph* g) { delete g; }

// `dst.copy_(src, non_blocking=true)`: from pinned host memory, a copy queued on the current
// stream that the host does not wait for (tch's `copy_` blocks).
int dsc_copy_async(at::Tensor* dst, const at::Tensor* src) {
  return guarded([&] { dst->copy_(*src, true); });
}

}  // extern "C"
