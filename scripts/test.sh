#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: formatting, lints, unit, end-to-end,
# Python-interop and trainer tests, then the Python package's tests (pytest), with the package
# installed from the wheel this script builds (and that wheel tried in fresh environments of
# the oldest and newest CPython the machine has). Installs what it needs itself: a project-local .venv with
# numpy and safetensors (the independent reader the interop test uses) and PyTorch 2.11.0 (the
# libtorch that tch 0.24 links for dsc-train), Ray (a partitioned compile on a local Ray cluster),
# Debian's chromium (the real browser that renders `dsc report` in its test) and Debian's
# slurm-wlm (a partitioned compile on a real single-node Slurm).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase says when it starts (seconds since this script did), so that a slow CI run shows
# which phase grew.
log() { printf '\n== %s  [%d s]\n' "$*" "$SECONDS"; }
# A whole run needs about 9 GB of disk at its peak, while PyTorch installs (the .venv ends at
# 5.7 GB with its CUDA libraries, target/ at 1.7 GB); saying what is free up front makes
# "No space left on device" easy to read.
log "disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free here"
# One build from scratch gains nothing from incremental compilation, whose caches would take
# another GB of target/.
export CARGO_INCREMENTAL=0

# Debian packages the tests need and the machine lacks: chromium (renders `dsc report` in the
# browser test) and slurm-wlm (a partitioned compile on a real single-node Slurm). Installed in
# the background, one apt-get for both, while the venv and the build take the CPU: a download
# is mostly waiting. Waited for before the Slurm test.
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
packages=()
if [ -z "${DSC_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then packages+=(chromium); fi
if ! command -v slurmctld >/dev/null 2>&1; then packages+=(slurmd slurmctld slurm-client munge); fi
apt_log=$(mktemp)
apt_pid=""
if [ "${#packages[@]}" -gt 0 ]; then
    log "installing ${packages[*]} in the background"
    ( as_root apt-get update -qq \
        && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" ) \
        >"$apt_log" 2>&1 &
    apt_pid=$!
fi

log "python environment (.venv: numpy, safetensors, maturin, torch 2.11.0)"
scripts/venv.sh
export DSC_PYTHON="$PWD/.venv/bin/python"
# tch builds against the venv's PyTorch (see scripts/venv.sh).
export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"

log "cargo fmt --check"
cargo fmt --all -- --check

# Clippy's lints and the test build in one compile. `cargo clippy` is `cargo check` with
# clippy-driver wrapping rustc for the workspace's own crates; wrapping the test build the same
# way lints every target while compiling it, instead of type-checking the whole dependency graph
# a second time (300 s of a 2-core run). The wrapper stays set for the wheel and the test run,
# so that both reuse what this build compiled (and the extension is linted too). CLIPPY_ARGS is
# how cargo-clippy hands clippy-driver its `-- -D warnings`; the canary below fails the run if
# clippy-driver ever stops reading it, rather than letting warnings pass.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver)
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
log "clippy canary (a lint must fail the build)"
canary=target/clippy-canary
mkdir -p "$canary/src"
printf '[package]\nname = "canary"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n' \
    >"$canary/Cargo.toml"
printf 'pub fn len(v: &Vec<u8>) -> usize {\n    v.len()\n}\n' >"$canary/src/lib.rs"
if cargo build --quiet --manifest-path "$canary/Cargo.toml" 2>"$canary/out.txt" \
    || ! grep -q "ptr_arg" "$canary/out.txt"; then
    cat "$canary/out.txt" >&2
    echo "clippy-driver did not deny a lint: the lints below would not be checked" >&2
    exit 1
fi

log "cargo test: build, linted by clippy (all targets, warnings are errors)"
cargo test --workspace --all-targets --locked --no-run

# The wheel users install (scripts/wheel.sh makes the release one), built here with the test
# build's profile, features and wrapper so that it reuses every crate that build compiled: only
# pyo3, the extension and the final link are new. The release wheel would be a second compile
# of the whole graph, at opt-level 3.
log "wheel (maturin, the test build's dev profile) installed into .venv"
rm -rf target/wheels/test
mkdir -p target/wheels
.venv/bin/python -m maturin build --profile dev --locked -m python/Cargo.toml \
    --out target/wheels/test 2>&1 | tee target/wheels/test.log | { grep -v '^ *Compiling ' || true; }
# What it compiled beyond the test build: pyo3, the extension and the CLI it links when the
# features match (python/Cargo.toml), much of the graph when they drift.
echo "the wheel build compiled: $(grep -o 'Compiling [^ ]*' target/wheels/test.log \
    | cut -d' ' -f2 | tr '\n' ' ')"
wheel=$(ls target/wheels/test/dsc_compiler-*.whl)
.venv/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
.venv/bin/python -c "import dsc; print('dsc', dsc.__version__, 'from', dsc.__file__)"
.venv/bin/dsc --version

if [ -n "$apt_pid" ]; then
    log "waiting for the background install of ${packages[*]}"
    if ! wait "$apt_pid"; then
        cat "$apt_log" >&2
        echo "installing ${packages[*]} failed" >&2
        exit 1
    fi
fi

# The Slurm test runs beside the cargo tests: it mostly waits for Slurm to schedule its job
# arrays, and no cargo test times anything. Its output is shown when both are done.
log "a partitioned compile on a real single-node Slurm (Debian's slurm-wlm), in the background"
slurm_log=$(mktemp)
scripts/slurm-test.sh "$PWD/target/debug/dsc" >"$slurm_log" 2>&1 &
slurm_pid=$!

log "cargo test: run (unit, doc and end-to-end tests)"
cargo test --workspace --locked

log "the Slurm test's output"
slurm_rc=0
wait "$slurm_pid" || slurm_rc=$?
cat "$slurm_log"
if [ "$slurm_rc" -ne 0 ]; then
    echo "scripts/slurm-test.sh failed (exit $slurm_rc)" >&2
    exit 1
fi

log "pytest (tests/python: the Python loader, compile, distributed, example script, the wheel in fresh environments)"
# The CLI under test is the one cargo test just built, the package the wheel just installed.
# pytest exits 5 when it collected no test: that is a failure here, never a pass.
export DSC_BIN="$PWD/target/debug/dsc" DSC_WHEEL="$PWD/$wheel"
set +e
.venv/bin/python -m pytest tests/python -q -p no:cacheprovider --durations=25
rc=$?
set -e
log "done: pytest exit $rc"
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
