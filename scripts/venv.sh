#!/usr/bin/env bash
# Creates the project-local Python environment .venv once: numpy, safetensors (used by the
# interop test) and pytest, maturin (builds the wheel), moto (an S3 server for the object
# storage tests), aeon and pyarrow (examples/uea.py: public data sets and the 1-NN DTW
# baseline), polars and Hugging Face datasets (tables in memory for dsc.compile), Ray
# (examples/ray_compile.py: a partitioned compile on a local Ray cluster), and
# PyTorch 2.11.0, whose libtorch tch 0.24 links for dsc-train. The PyPI wheel
# is the CUDA build: it runs on CPU-only machines too, and uses a GPU where there is one.
# To build dsc-train against it:
#   export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
# (or point LIBTORCH at a libtorch of your own instead).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import numpy, safetensors, pytest" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir numpy safetensors pytest
fi
# maturin builds the wheel scripts/test.sh installs (without pip's build isolation, which would
# fetch it again for every build).
if ! .venv/bin/python -c "import maturin" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "maturin==1.16.0"
fi
if ! .venv/bin/python -c "import aeon, pyarrow" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "aeon==1.6.0" pyarrow
fi
# moto's S3 server: the object storage the remote-cache tests (Rust and pytest) start on
# localhost, a real S3-protocol peer for dsc's own client.
if ! .venv/bin/python -c "import moto.server, flask" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "moto[server]==5.2.5"
fi
# The tables a PyTorch user holds in memory, for dsc.compile(table) (tests/python/test_tables.py):
# polars DataFrames and Hugging Face datasets (pandas and pyarrow come with aeon above).
if ! .venv/bin/python -c "import polars, datasets" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "polars==2.1.0" "datasets==5.2.0"
fi
if ! .venv/bin/python -c "import ray" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir "ray==2.60.0"
fi
if [ "$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" != "2.11.0" ]; then
    echo "installing torch 2.11.0 into .venv (about 4 GB with its CUDA libraries)"
    .venv/bin/pip install --quiet --disable-pip-version-check --no-cache-dir torch==2.11.0
fi
