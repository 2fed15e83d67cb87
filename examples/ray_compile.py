"""Compile a dataset in partitions as Ray tasks: every stage (scan, fit, write) runs as N tasks,
one stage after the other, then one merge. The cache is byte-identical to `dsc compile` in one
process; the tasks need only a file system shared with the driver (the output's folder).

    python examples/ray_compile.py --spec dsc.toml --out cache --partitions 8
    python examples/ray_compile.py --spec dsc.toml --out cache --address auto   # a running cluster

The spec file holds the compile's options (`dsc compile ... --print-spec > dsc.toml`); keyword
arguments of `compile_with_ray` are those of `dsc.compile`. See docs/SCALE.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict

import ray

import dsc


@ray.remote(num_cpus=1)
def _stage(stage: str, index: int, count: int, options: Dict[str, Any]) -> Dict[str, Any]:
    # Each task runs dsc's own stage in its worker process; dsc releases the GIL while it works.
    return dsc.compile_stage(stage, (index, count), **options)


def compile_with_ray(partitions: int, *, out: str, max_memory: Any = None,
                     **options: Any) -> dsc.Cache:
    """Runs the scan, fit and write stages as `partitions` Ray tasks each, then merges.

    A failed task fails the stage (ray.get raises); rerunning the whole function is safe, as a
    repeated task writes the same bytes and every finished part is simply written again."""
    options = dict(options, out=out, max_memory=max_memory)
    for stage in ("scan", "fit", "write"):
        started = time.perf_counter()
        reports = ray.get([_stage.remote(stage, i, partitions, options)
                           for i in range(partitions)])
        items = sum(r["items"] for r in reports)
        print(f"{stage}: {partitions} tasks, {items} "
              f"{'files' if stage == 'scan' else 'buckets'} in "
              f"{time.perf_counter() - started:.2f} s", flush=True)
    return dsc.merge(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="spec file (dsc compile --print-spec)")
    p.add_argument("--out", required=True, help="the cache to write")
    p.add_argument("--partitions", type=int, default=4, help="tasks per stage")
    p.add_argument("--max-memory", default=None, help="per task, e.g. 4GiB")
    p.add_argument("--address", default=None,
                   help="a Ray cluster to join ('auto' finds a running one); default: start a local one")
    a = p.parse_args()
    ray.init(address=a.address)
    try:
        cache = compile_with_ray(a.partitions, out=a.out, spec=a.spec, max_memory=a.max_memory)
        print(f"{cache.path}: {cache.splits}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
