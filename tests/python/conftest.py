"""Shared fixtures: the dsc binary, and small IceCube-like caches generated with it (seeded)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dsc_bin() -> str:
    """The CLI under test: DSC_BIN, else the newest of target/{debug,release}/dsc."""
    if os.environ.get("DSC_BIN"):
        return os.environ["DSC_BIN"]
    found = [p for p in (REPO / "target/debug/dsc", REPO / "target/release/dsc") if p.exists()]
    if not found:
        pytest.fail("no dsc binary: run `cargo build --bin dsc` or set DSC_BIN")
    return str(max(found, key=lambda p: p.stat().st_mtime))


def run_dsc(*args: str, cwd: Path | None = None) -> str:
    out = subprocess.run([dsc_bin(), *args], capture_output=True, text=True, cwd=cwd)
    assert out.returncode == 0, f"dsc {' '.join(args)} failed:\n{out.stderr}"
    return out.stdout


# The README's compile, as CLI flags and as dsc.compile keyword arguments.
COMPILE_FLAGS = [
    "--key", "event_id", "--order-by", "time",
    "--context", "data/train_meta.parquet", "--targets", "azimuth,zenith",
    "--join", "data/sensor_geometry.csv", "--on", "sensor_id",
    "--features", "x,y,z,time,charge,auxiliary", "--categorical", "sensor_id",
    "--encode", "time=zscore", "--encode", "charge=log1p",
    "--max-len", "64", "--val-fraction", "0.1", "--seed", "42",
]
COMPILE_KWARGS = dict(
    key="event_id", order_by="time",
    context="data/train_meta.parquet", targets=["azimuth", "zenith"],
    join="data/sensor_geometry.csv", on="sensor_id",
    features="x,y,z,time,charge,auxiliary", categorical=["sensor_id"],
    encode={"time": "zscore", "charge": "log1p"},
    max_len=64, val_fraction=0.1, seed=42,
)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """Generated IceCube-like data (4 files x 400 events) and its cache, compiled by the CLI
    with small shards so that epochs span several shards and windows."""
    root = tmp_path_factory.mktemp("icecube")
    run_dsc("gen", "icecube", "--out", "data", "--files", "4", "--events-per-file", "400",
            "--seed", "7", cwd=root)
    run_dsc("compile", "data/train/batch_*.parquet", *COMPILE_FLAGS, "--shard-size", "256KiB",
            "--out", "cache", cwd=root)
    return root


@pytest.fixture(scope="session")
def cache_dir(workdir: Path) -> Path:
    return workdir / "cache"


@pytest.fixture
def private_cache(cache_dir: Path, tmp_path: Path) -> Path:
    """A copy of the cache that a test may damage."""
    dst = tmp_path / "cache"
    shutil.copytree(cache_dir, dst)
    return dst


def compile_churn(tmp: Path, customers: int) -> Path:
    """Customers' transactions (`dsc gen sequences`, seed 3) compiled with the boolean target
    `churned` (churned customers stop buying early, so the last transactions' timestamps
    predict it), `lifetime_value`, and the per-context features `age` and `tenure_years`:
    the cache the training-script tests learn on. Returns the cache's folder."""
    data, cache = tmp / "data", tmp / "cache"
    run_dsc("gen", "sequences", "--out", str(data), "--customers", str(customers), "--files",
            "2", "--seed", "3")
    run_dsc("compile", str(data / "transactions"), "--key", "customer_id", "--order-by", "ts",
            "--context", str(data / "customers.parquet"), "--targets", "churned,lifetime_value",
            "--context-features", "age,tenure_years", "--features", "amount,items,is_refund,ts",
            "--categorical", "merchant_category,channel", "--encode", "amount=log1p",
            "--nan", "zero", "--empty-contexts", "keep", "--max-len", "32", "--truncate", "tail",
            "--val-fraction", "0.2", "--seed", "1", "--out", str(cache), "--quiet")
    return cache


def order_keys(cache: Path, *args: str) -> list[list[int]]:
    """`dsc order CACHE --keys --json ...`: the keys of every batch the Rust loader yields."""
    return json.loads(run_dsc("order", str(cache), "--keys", "--json", *args))
