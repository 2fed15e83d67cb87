#!/usr/bin/env bash
# Builds the wheel that `pip install` takes without a Rust toolchain: one abi3 wheel for every
# CPython >= 3.9 on Linux x86_64 (glibc >= 2.28), with the `dsc` command line as its console
# script (the Rust CLI linked into the extension, not a second binary).
#
#   scripts/wheel.sh [OUT]        # default target/wheels; prints the wheel's path last
#
# maturin links with zig (both from PyPI, pinned below) for glibc 2.28's symbols, so the wheel
# is manylinux_2_28 whatever glibc this machine has; maturin checks the policy itself (the
# build fails if the extension needs more than manylinux_2_28 allows) and strips the
# extension. Another platform: run the same maturin line there (`--target` and a matching
# `--compatibility`, or `--zig` for a cross build; see docs/PYTHON.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-target/wheels}" && cd "${1:-target/wheels}" && pwd)
python=${DSC_PYTHON:-python3}
if [ -x .venv/bin/python ] && [ -z "${DSC_PYTHON:-}" ]; then
    python=.venv/bin/python
fi
if ! "$python" -c "import maturin, ziglang" 2>/dev/null; then
    "$python" -m pip install --quiet --disable-pip-version-check "maturin==1.16.0" "ziglang==0.17.1"
fi
# maturin finds zig as `python3 -m ziglang` on the PATH: this interpreter's.
export PATH="$(cd "$(dirname "$python")" && pwd):$PATH"
"$python" -m maturin build --release --locked --strip --zig --compatibility manylinux_2_28 \
    -m python/Cargo.toml --out "$out" >&2
wheel=$(ls -t "$out"/dsc_compiler-*-cp39-abi3-manylinux_2_28_x86_64.whl | head -1)
echo "$wheel"
