"""Partitioned compiles from Python: dsc.compile_stage and dsc.merge, run as Ray tasks by
examples/ray_compile.py on a local Ray cluster, give the cache a plain dsc.compile gives, byte
for byte; a bounded memory budget changes nothing either."""

from __future__ import annotations

import importlib.util
import json
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
    with pytest.raises(dsc.OptionsError, match='max_memory="1.0 MiB" is too small'):
        dsc.compile(ROWS, out=in_workdir / "tiny", max_memory=1 << 20, **dict(OPTIONS, bucket_size="64MiB"))
    assert not (in_workdir / "tiny").exists()


def test_stage_errors_name_the_partition_and_the_option(in_workdir: Path):
    out = str(in_workdir / "cache")
    report = dsc.compile_stage("scan", (1, 2), ROWS, out=out, **OPTIONS)
    assert report["stage"] == "scan" and report["partition"] == 1 and report["partitions"] == 2
    # The scan's own phases: it decoded and spilled rows, and encoded nothing.
    phases = dict(report["phases"])
    assert phases["decode"] > 0 and phases["spill"] > 0 and phases["encode"] == 0, phases
    with pytest.raises(dsc.CompileError, match="partition 0/2 has not finished the scan stage") as e:
        dsc.compile_stage("fit", "0/2", ROWS, out=out, **OPTIONS)
    # What to rerun, in dsc.compile_stage's own words: never the command line's flags.
    assert 'partition="0/2" stage="scan"' in str(e.value) and "--" not in str(e.value)
    with pytest.raises(dsc.CompileError, match="has not finished the scan stage"):
        dsc.merge(out)
    with pytest.raises(dsc.OptionsError, match="stage='sort'"):
        dsc.compile_stage("sort", (0, 2), ROWS, out=out, **OPTIONS)
    with pytest.raises(dsc.OptionsError, match="need 0 <= i < n"):
        dsc.compile_stage("scan", (2, 2), ROWS, out=out, **OPTIONS)
    assert not os.path.exists(out)


def test_the_mostlyai_profile_compiles_bounded_and_partitioned(tmp_path: Path):
    """--profile mostlyai from Python: in a tight budget and as partitions, the same cache as a
    plain compile, whose statistics are mostlyai-engine's own (tests/vectors/mostlyai)."""
    vectors = REPO / "tests/vectors/mostlyai/seq_extra"
    parts = json.loads((vectors / "p2/partitions.json").read_text())
    val_keys = tmp_path / "val-keys.txt"
    val_keys.write_text("".join(f"{k}\n" for name, part in parts.items() if name.endswith("-val")
                                for k in part["context_ids"]))
    rows = str(vectors / "data/tgt.parquet")
    options = dict(key="id", context=str(vectors / "data/ctx.parquet"), profile="mostlyai",
                   partitions=2, val_keys=str(val_keys), bucket_size="8KiB", seed=3)
    dsc.compile(rows, out=tmp_path / "plain", **options)
    dsc.compile(rows, out=tmp_path / "tight", max_memory="1MiB", **options)
    out = str(tmp_path / "parts")
    for stage in ("scan", "fit", "write"):
        for i in (1, 0):
            dsc.compile_stage(stage, (i, 2), rows, out=out, **options)
    dsc.merge(out)
    want = files(tmp_path / "plain")
    assert len([k for k in want if k.startswith("shards/")]) > 8
    assert files(tmp_path / "tight") == want
    assert files(tmp_path / "parts") == want
    for name in ("tgt-stats.json", "ctx-stats.json"):
        assert json.loads(want[name]) == json.loads((vectors / "p2" / name).read_text()), name
