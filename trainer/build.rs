//! Records where libtorch lives as the binary's run path, so `dsc-train` starts without
//! `LD_LIBRARY_PATH` (which still takes precedence, e.g. to use another machine's PyTorch).
//! The directory is found the way torch-sys finds it: `LIBTORCH_LIB`, `LIBTORCH`, or the
//! `torch` package of the active Python with `LIBTORCH_USE_PYTORCH=1`.
//!
//! It compiles `csrc/fused.cpp` (libtorch's fused AdamW) against that libtorch's headers, and
//! `csrc/graph.cpp` (CUDA graphs, a side stream, non-blocking copies: what tch
//! does not bind) against that libtorch's headers when its CUDA build and the CUDA runtime
//! headers are there, and sets `cfg(dsc_cuda_graphs)`; otherwise `--graph` runs uncaptured.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for var in [
        "LIBTORCH",
        "LIBTORCH_LIB",
        "LIBTORCH_USE_PYTORCH",
        "VIRTUAL_ENV",
        "LIBTORCH_CXX11_ABI",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(dsc_cuda_graphs)");
    println!("cargo::rustc-check-cfg=cfg(dsc_fused_adamw)");
    println!("cargo:rerun-if-changed=csrc/fused.cpp");
    println!("cargo:rerun-if-changed=csrc/guard.h");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=DSC_TRAIN_NO_GRAPHS");
    println!("cargo:rerun-if-changed=csrc/graph.cpp");
    if let Some(dir) = libtorch_lib_dir() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        build_fused_shim(&dir);
        build_graph_shim(&dir);
    }
}

/// Compiles the fused AdamW shim (`csrc/fused.cpp`: ATen's `_fused_adamw_`, CPU and CUDA)
/// wherever libtorch's headers are found, and sets `cfg(dsc_fused_adamw)`; without it the
/// optimizer keeps its own whole-buffer update.
fn build_fused_shim(lib: &Path) {
    let Some(root) = lib.parent() else { return };
    let include = root.join("include");
    if !include.join("ATen/ops/_fused_adamw.h").is_file() {
        println!(
            "cargo:warning=dsc-train without fused AdamW: no ATen headers under {}",
            include.display()
        );
        return;
    }
    shim("fused", &include, &[]);
    link(lib, &["torch_cpu", "c10"]);
    println!("cargo:rustc-cfg=dsc_fused_adamw");
}

/// Compiles the CUDA graph shim where libtorch has a CUDA build and the CUDA runtime headers
/// are found; says why not (a cargo warning) where it does not.
fn build_graph_shim(lib: &Path) {
    // A way to build without it (headers that do not match the libtorch run with).
    if std::env::var_os("DSC_TRAIN_NO_GRAPHS").is_some() {
        println!("cargo:warning=dsc-train without CUDA graphs: DSC_TRAIN_NO_GRAPHS is set");
        return;
    }
    let Some(root) = lib.parent() else { return };
    let include = root.join("include");
    if !include.join("ATen/cuda/CUDAGraph.h").is_file() || !lib.join("libtorch_cuda.so").is_file() {
        println!(
            "cargo:warning=dsc-train without CUDA graphs: {} is not a CUDA build of libtorch",
            root.display()
        );
        return;
    }
    let (Some(runtime), Some(crt)) = (
        cuda_include(root, "cuda_runtime_api.h"),
        cuda_include(root, "crt/host_config.h"),
    ) else {
        println!(
            "cargo:warning=dsc-train without CUDA graphs: no CUDA runtime headers \
             (cuda_runtime_api.h, crt/host_config.h; set CUDA_HOME)"
        );
        return;
    };
    shim("graph", &include, &[runtime, crt]);
    link(lib, &["torch_cuda", "c10_cuda", "torch_cpu", "c10"]);
    println!("cargo:rustc-cfg=dsc_cuda_graphs");
}

/// Compiles `csrc/NAME.cpp` into the static library `dsc_NAME_shim`, against libtorch's
/// headers under `include` (and `more` folders), with the C++ ABI libtorch was built with.
fn shim(name: &str, include: &Path, more: &[PathBuf]) {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file(format!("csrc/{name}.cpp"))
        .include(include)
        .include(include.join("torch/csrc/api/include"));
    for dir in more {
        build.include(dir);
    }
    build
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", cxx11_abi().as_str())
        .warnings(false)
        .compile(&format!("dsc_{name}_shim"));
}

/// Links the shim just compiled against these libtorch libraries in `lib`.
fn link(lib: &Path, libraries: &[&str]) {
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in libraries {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
}

/// The first folder with CUDA header `header`: `CUDA_HOME`, the PyPI wheels beside `torch` (the
/// runtime's `nvidia/*/include` has the API; the compiler's own `crt/` headers, which
/// `cuda_runtime.h` includes, come with Triton, a dependency of the wheel), or the usual system
/// place.
fn cuda_include(torch_root: &Path, header: &str) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("CUDA_HOME")
        .map(|h| PathBuf::from(h).join("include"))
        .into_iter()
        .collect();
    if let Some(site) = torch_root.parent() {
        for pkg in [
            "nvidia/cu13",
            "nvidia/cuda_runtime",
            "triton/backends/nvidia",
        ] {
            candidates.push(site.join(pkg).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.into_iter().find(|d| d.join(header).is_file())
}

/// The C++ string ABI libtorch was built with (`LIBTORCH_CXX11_ABI`, else PyTorch's own flag,
/// else the new ABI, as torch-sys decides).
fn cxx11_abi() -> String {
    if let Ok(v) = std::env::var("LIBTORCH_CXX11_ABI") {
        return v;
    }
    let asked = Command::new(python())
        .args([
            "-c",
            "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))",
        ])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| s == "0" || s == "1");
    asked.unwrap_or_else(|| "1".into())
}

fn python() -> &'static str {
    if std::env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    }
}

fn libtorch_lib_dir() -> Option<PathBuf> {
    if let Some(lib) = std::env::var_os("LIBTORCH_LIB") {
        return Some(PathBuf::from(lib));
    }
    if let Some(root) = std::env::var_os("LIBTORCH") {
        return Some(PathBuf::from(root).join("lib"));
    }
    std::env::var_os("LIBTORCH_USE_PYTORCH")?;
    let out = Command::new(python())
        .args([
            "-c",
            "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let dir = dir.trim();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}
