"""Partitioned compiles from Python: dsc.compile_stage and dsc.merge, run as Ray tasks by
examples/ray_compile.py on a local Ray cluster, give the cache a plain dsc.compile gives, byte
for byte; a bounded memory budget changes nothing either."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import ray

import dsc

from conftest import COMPILE_KWARGS, REPO

ROWS = "data/train/batch_*.parquet"
OPTIONS = dict(COMPILE_KWARGS, shard_size="256KiB", bucket_size="16KiB")


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def ray_example():
    spec = importlib.util.spec_from_file_location("ray_compile", REPO / "examples/ray_compile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def in_workdir(workdir: Path, tmp_path: Path, monkeypatch):
    """Runs in the generated data's folder; outputs go to tmp_path."""
    monkeypatch.chdir(workdir)
    return tmp_path


def test_ray_tasks_compile_the_same_cache(in_workdir: Path):
    plain = in_workdir / "plain"
    dsc.compile(ROWS, out=plain, **OPTIONS)
    example = ray_example()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cache = example.compile_with_ray(3, rows=ROWS, out=str(in_workdir / "ray"), **OPTIONS)
    finally:
        ray.shutdown()
    assert isinstance(cache, dsc.Cache)
    got, want = files(in_workdir / "ray"), files(plain)
    assert got.keys() == want.keys()
    assert len([k for k in want if k.startswith("shards/")]) > 4
    for name in want:
        assert got[name] == want[name], name
    assert not (in_workdir / ".ray.dsc-work").exists()


def test_a_memory_budget_changes_nothing(in_workdir: Path):
    dsc.compile(ROWS, out=in_workdir / "plain", **OPTIONS)
    dsc.compile(ROWS, out=in_workdir / "tight", max_memory="8MiB", **OPTIONS)
    assert files(in_workdir / "plain") == files(in_workdir / "tight")
    with pytest.raises(dsc.OptionsError, match="--max-memory 1 MiB is too small"):
        dsc.compile(ROWS, out=in_workdir / "tiny", max_memory=1 << 20, **dict(OPTIONS, bucket_size="64MiB"))
    assert not (in_workdir / "tiny").exists()


def test_stage_errors_name_the_partition_and_the_option(in_workdir: Path):
    out = str(in_workdir / "cache")
    report = dsc.compile_stage("scan", (1, 2), ROWS, out=out, **OPTIONS)
    assert report["stage"] == "scan" and report["partition"] == 1 and report["partitions"] == 2
    with pytest.raises(dsc.CompileError, match="partition 0/2 has not finished the scan stage"):
        dsc.compile_stage("fit", "0/2", ROWS, out=out, **OPTIONS)
    with pytest.raises(dsc.CompileError, match="has not finished the scan stage"):
        dsc.merge(out)
    with pytest.raises(dsc.OptionsError, match="stage='sort'"):
        dsc.compile_stage("sort", (0, 2), ROWS, out=out, **OPTIONS)
    with pytest.raises(dsc.OptionsError, match="need 0 <= i < n"):
        dsc.compile_stage("scan", (2, 2), ROWS, out=out, **OPTIONS)
    assert not os.path.exists(out)
