// The rule of every C entry point of dsc-train's shims: no C++ exception unwinds into Rust.
// `guarded(f)` runs `f`, returns 0, or 1 with the exception's message kept in the calling
// shim's thread-local `last_error` (read back through its `*_last_error` function).

#pragma once

#include <exception>
#include <string>

namespace dsc_shim {

template <class F>
int guarded(std::string& last_error, F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "an unknown C++ exception";
  }
  return 1;
}

}  // namespace dsc_shim
