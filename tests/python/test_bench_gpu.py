"""scripts/bench_gpu.py runs every feed, and reports what it measures (on the CPU here: the
figures mean nothing without a GPU, but the script must not rot between the sessions that have
one)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import REPO  # noqa: E402


def test_every_feed_trains_and_is_reported(cache_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "scripts" / "bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    try:
        spec.loader.exec_module(bench)
        runs = bench.main(["--cache", str(cache_dir), "--device", "cpu", "--steps", "3",
                           "--warmup", "1", "--workers", "2", "--dim", "16", "--layers", "1",
                           "--heads", "2", "--batch-size", "32", "--modes", "feed,eager,whole",
                           "--json"])
    finally:
        sys.modules.pop(spec.name, None)
    feed = [r for r in runs if r["mode"] == "feed"]
    assert [r["feed"] for r in feed] == [f"{s}_{v}" for s in ("padded", "packed")
                                         for v in ("iterator", "static", "static_in_step")]
    for r in feed:
        assert 0 < r["ops_per_step"] < 40 and r["host_us_per_step"] > 0, r
    runs = [r for r in runs if r["mode"] != "feed"]
    assert [(r["mode"], r["feed"]) for r in runs] == [
        ("eager", f) for f in ("resident", "padded", "padded_host", "trimmed", "bucketed",
                               "packed", "dataloader")
    ] + [("whole", f) for f in ("padded", "padded_host", "packed", "packed_host")]
    for r in runs:
        assert r["samples_per_s"] > 0 and 0 <= r["data_wait_share"] < 1, r
        assert r["gpu_busy"] is None, "no NVML on a CPU run"
        assert 0 < r["host_us_per_step"] <= r["step_us"], r
    packed = next(r for r in runs if r["feed"] == "packed")
    assert packed["pack_tokens"] >= 64 and packed["attention"] == "padded"
