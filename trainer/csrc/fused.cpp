// libtorch's fused AdamW (`at::_fused_adamw_`, the kernel behind `torch.optim.AdamW(fused=True)`),
// which tch 0.24 does not bind: one multi-tensor kernel per group of parameters instead of the
// twenty whole-buffer operations of dsc-train's own update. It runs on CUDA and on the CPU.
//
// The entry point is C, takes tch's tensor handles (`at::Tensor*`), catches every C++ exception
// and returns nonzero with the message kept for `dsc_fused_last_error` (an exception must not
// unwind into Rust). Built by build.rs against the headers of the libtorch that tch links,
// wherever they are found; without them dsc-train keeps its own update.

#include <ATen/Tensor.h>
#include <ATen/ops/_fused_adamw.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "guard.h"

namespace {

thread_local std::string last_error;

std::vector<at::Tensor> list(at::Tensor* const* handles, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(*handles[i]);
  return out;
}

}  // namespace

extern "C" {

const char* dsc_fused_last_error() { return last_error.c_str(); }

// One AdamW update of `n` parameters (their gradients and both moments, each a list of `n`
// tensors) at learning rate `lr` (a 0-d float tensor on their device), the step count `steps`
// (0-d float, already counting this update) shared by all, and decoupled weight decay `wd`.
// `found_inf` (nullable, 0-d float): 1 skips the update (an fp16 overflow).
int dsc_fused_adamw(at::Tensor* const* params, at::Tensor* const* grads,
                    at::Tensor* const* exp_avgs, at::Tensor* const* exp_avg_sqs, int64_t n,
                    const at::Tensor* steps, const at::Tensor* lr, double beta1, double beta2,
                    double wd, double eps, const at::Tensor* found_inf) {
  return dsc_shim::guarded(last_error, [&] {
    std::vector<at::Tensor> state_steps(static_cast<size_t>(n), *steps);
    std::optional<at::Tensor> inf;
    if (found_inf != nullptr) inf = *found_inf;
    at::_fused_adamw_(list(params, n), list(grads, n), list(exp_avgs, n), list(exp_avg_sqs, n),
                      {}, state_steps, *lr, beta1, beta2, wd, eps, /*amsgrad=*/false,
                      /*maximize=*/false, std::nullopt, inf);
  });
}

}  // extern "C"
