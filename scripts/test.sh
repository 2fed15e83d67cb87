#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: formatting, lints, unit, end-to-end and
# Python-interop tests. Installs what it needs itself: a project-local .venv with numpy and
# safetensors (the independent reader the interop test uses) and Debian's chromium (the real
# browser that renders `dsc report` in its test).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

log "python environment (.venv: numpy, safetensors)"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import numpy, safetensors" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check numpy safetensors
fi
export DSC_PYTHON="$PWD/.venv/bin/python"

log "chromium (renders dsc report in the browser test)"
if [ -z "${DSC_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "cargo test (unit, doc and end-to-end tests)"
cargo test --workspace --locked
