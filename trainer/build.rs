//! Records where libtorch lives as the binary's run path, so `dsc-train` starts without
//! `LD_LIBRARY_PATH` (which still takes precedence, e.g. to use another machine's PyTorch).
//! The directory is found the way torch-sys finds it: `LIBTORCH_LIB`, `LIBTORCH`, or the
//! `torch` package of the active Python with `LIBTORCH_USE_PYTORCH=1`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    for var in [
        "LIBTORCH",
        "LIBTORCH_LIB",
        "LIBTORCH_USE_PYTORCH",
        "VIRTUAL_ENV",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Some(dir) = libtorch_lib_dir() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
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
    let python = if std::env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    };
    let out = Command::new(python)
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
