#!/usr/bin/env bash
# The main job on built-in sample data, on a fresh machine: build dsc, generate IceCube-like
# events, compile them into a cache, inspect and verify it, stream it through the loader, and
# train the reference model on it for two epochs (dsc-train; PyTorch 2.11.0 is installed into
# .venv for its libtorch), then install the Python package and train the Python reference script
# (examples/train.py), whose validation error falls well below 1 rad in two epochs.
# Everything lands in ./demo.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "python environment for libtorch (.venv, torch 2.11.0)"
scripts/venv.sh
export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"

step "build (release)"
cargo build --release --locked --bin dsc
cargo build --release --locked -p dsc-train
dsc=target/release/dsc

rm -rf demo
step "generate sample data: 8 files x 2000 events"
$dsc gen icecube --out demo/data --files 8 --events-per-file 2000 --seed 7

step "compile"
$dsc compile 'demo/data/train/batch_*.parquet' \
    --key event_id --order-by time \
    --context demo/data/train_meta.parquet --targets azimuth,zenith \
    --join demo/data/sensor_geometry.csv --on sensor_id \
    --features x,y,z,time,charge,auxiliary --categorical sensor_id \
    --encode time=zscore --encode charge=log1p \
    --max-len 128 --val-fraction 0.1 --seed 42 --out demo/cache

step "inspect"
$dsc inspect demo/cache

step "verify"
$dsc verify demo/cache

step "load: shuffle quality of epoch 0, then loader throughput"
$dsc order demo/cache --epoch 0 --batch-size 256

step "packed batches: the same epoch as packs of 32,768 tokens (one static shape), token efficiency beside padded and bucketed batches"
$dsc order demo/cache --epoch 0 --batch-size 256 --pack 32768
$dsc bench demo/cache

step "train: two epochs of a small transformer, direction task (CUDA when present); the validation error (rad) falls from 1.57"
target/release/dsc-train --cache demo/cache --task direction --epochs 2 --batch-size 128 --dim 64 \
    --log-every 20 --out demo/run

step "python: install the package (pip install ./python) and train with examples/train.py (2 epochs, CPU)"
.venv/bin/pip install --quiet --disable-pip-version-check ./python
.venv/bin/python examples/train.py --cache demo/cache --task direction --epochs 2 --batch-size 128 \
    --out demo/run-py
