"""dsc.Loader from Python against the Rust loader and NumPy, in one run on one cache.

    python scripts/bench_python.py CACHE [--dsc target/release/dsc] [--batch-size 256] [--json]

Measures contexts per second consumed by a Python `for batch in loader` loop (shuffled epochs,
the batch's tensors taken into Python: each byte gathered once, as in `dsc bench`), against
(a) `dsc bench`'s Rust shuffled rate on the same cache, run as part of this script, and (b)
NumPy fancy indexing of the same tensors held in RAM (every shard of the split read into memory
first, then one `array[idx]` per tensor per batch with a random permutation). With a GPU and
`--device cuda` it also times batches delivered to the device: the host path (a ring of pinned
blocks, one copy per batch on a copy stream) on 2 to 16 threads, the resident split (gathered
on the GPU), and pinned batch-sized copies in the same process (the PCIe rate), synchronised at
the end of each epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import dsc


def best_of(passes: int, fn) -> float:
    """The highest rate of `passes` runs of `fn` (which returns a rate): the least disturbed
    figure on a shared machine."""
    return max(fn() for _ in range(passes))


def loader_rate(cache: dsc.Cache, split: str, batch: int, epochs: int, **kwargs) -> float:
    loader = dsc.Loader(cache, split=split, batch_size=batch, seed=0, **kwargs)
    list(zip(range(2), loader))  # warm: threads started, first window mapped
    loader.set_epoch(1)
    start = time.perf_counter()
    n = 0
    for _ in range(epochs):
        for b in loader:
            n += len(b["key"])
    if kwargs.get("device") is not None:
        import torch

        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def consumer_cost(cache: dsc.Cache, split: str, batch: int, fmt: str, batches: int = 150) -> float:
    """Microseconds the consumer spends per batch when every batch is ready: the loader's
    queues are filled first (threads keep gathering ahead, `prefetch` per thread), then
    `batches` of them are taken. What Python adds per batch, which bounds the loader's rate
    once its threads are faster than the consumer (issue 28, item 3)."""
    per_thread = batches // 2 + 8
    loader = dsc.Loader(cache, split=split, batch_size=batch, seed=0, num_threads=2,
                        prefetch=per_thread, format=fmt)
    steps = len(loader)
    if steps < 2 * per_thread:
        raise SystemExit(f"{cache.path}: {steps} batches of {batch} in {split!r}; the consumer "
                         f"cost needs {2 * per_thread}: use a smaller --batch-size")
    it = iter(loader)
    next(it)
    time.sleep(1.0)  # both queues fill (a batch of 64 gathers in well under 1 ms)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    cost = (time.perf_counter() - start) / batches * 1e6
    loader.close()
    return cost


def pinned_copy_rate(cache: dsc.Cache, split: str, batch: int, device: str,
                     copies: int = 2000) -> float:
    """Contexts per second that copies of one batch's bytes (every tensor, untrimmed) from
    pinned memory to `device` move, one non-blocking copy per batch: the PCIe rate in this
    process for the host path's transfers."""
    import torch

    loader = dsc.Loader(cache, split=split, batch_size=batch, seed=0, resident=False)
    nbytes = sum(int(np.prod((batch, *t.shape))) * np.dtype(t.dtype).itemsize
                 for t in cache.schema if t.name in loader.columns)
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for _ in range(50):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(copies):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return copies * batch / (time.perf_counter() - start)


def numpy_rate(cache: dsc.Cache, split: str, batch: int, epochs: int) -> float:
    from safetensors.numpy import load_file

    shards = [s for s in cache.manifest["shards"] if s["split"] == split]
    if any("compressed" in s for s in shards):
        raise SystemExit(f"{cache.path}: compressed shards; the NumPy baseline reads safetensors "
                         f"files: run it on a hot cache (dsc decompress {cache.path})")
    parts = [load_file(str(Path(cache.path) / s["file"])) for s in shards]
    arrays = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    total = len(arrays["key"])
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    n = 0
    for _ in range(epochs):
        perm = rng.permutation(total)
        for i in range(0, total - batch + 1, batch):
            idx = perm[i:i + batch]
            out = {name: a[idx] for name, a in arrays.items()}
            n += len(out["key"])
    return n / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache")
    ap.add_argument("--dsc", default="target/release/dsc", help="the dsc binary for `dsc bench`")
    ap.add_argument("--split", default="train")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per timed pass")
    ap.add_argument("--passes", type=int, default=3, help="timed passes; the best is reported")
    ap.add_argument("--device", default=None, help="also time delivery to this device (cuda)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    cache = dsc.open(a.cache)
    rust = json.loads(subprocess.run(
        [a.dsc, "bench", a.cache, "--split", a.split, "--batch-size", str(a.batch_size), "--json"],
        check=True, capture_output=True, text=True).stdout)
    r = {
        "cache": a.cache,
        "contexts": cache.splits[a.split],
        "batch_size": a.batch_size,
        "rust_shuffled_contexts_per_s": rust["contexts_per_s_shuffled"],
        "rust_sequential_contexts_per_s": rust["contexts_per_s_sequential"],
    }
    # 1, 2 and every core: `dsc bench` runs one loader thread per core.
    counts = sorted({1, 2, os.cpu_count() or 1})
    for fmt in ("torch", "numpy"):
        for threads in counts:
            r[f"python_{fmt}_{threads}t_contexts_per_s"] = best_of(
                a.passes, lambda: loader_rate(cache, a.split, a.batch_size, a.epochs,
                                              format=fmt, num_threads=threads))
    for fmt in ("torch", "numpy"):
        r[f"python_{fmt}_consumer_us_per_batch"] = min(
            consumer_cost(cache, a.split, 64, fmt) for _ in range(a.passes))
    r["python_cache_order_contexts_per_s"] = best_of(
        a.passes, lambda: loader_rate(cache, a.split, a.batch_size, a.epochs, shuffle=False))
    r["numpy_fancy_index_contexts_per_s"] = best_of(
        a.passes, lambda: numpy_rate(cache, a.split, a.batch_size, a.epochs))
    if a.device:
        # Host path to the device (pinned blocks, one copy per batch) at several thread counts,
        # the resident split (gathered on the device), and pinned batch-sized copies in this
        # process: the PCIe rate the host path is measured against (issue 28, item 4).
        for threads in (2, 4, 8, 16):
            r[f"python_{a.device}_{threads}t_contexts_per_s"] = best_of(
                a.passes, lambda: loader_rate(cache, a.split, a.batch_size, a.epochs,
                                              device=a.device, num_threads=threads,
                                              resident=False))
        r[f"python_{a.device}_resident_contexts_per_s"] = best_of(
            a.passes, lambda: loader_rate(cache, a.split, a.batch_size, a.epochs,
                                          device=a.device, resident=True))
        r["pinned_copy_contexts_per_s"] = pinned_copy_rate(cache, a.split, a.batch_size, a.device)
        best = max(r[f"python_{a.device}_{t}t_contexts_per_s"] for t in (2, 4, 8, 16))
        r["host_path_over_pinned_copy"] = best / r["pinned_copy_contexts_per_s"]
    best = max(r[f"python_torch_{t}t_contexts_per_s"] for t in counts)
    r["python_over_rust"] = best / r["rust_shuffled_contexts_per_s"]
    r["python_over_numpy"] = best / r["numpy_fancy_index_contexts_per_s"]
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"cache {a.cache}: {r['contexts']:,} {a.split} contexts, batch {a.batch_size}")
    for k, v in r.items():
        if k.endswith("_per_s"):
            print(f"  {k[:-len('_contexts_per_s')]:<28} {v / 1e6:8.3f} M contexts/s")
    for fmt in ("torch", "numpy"):
        print(f"  {fmt} consumer, batch 64     {r[f'python_{fmt}_consumer_us_per_batch']:8.1f} us/batch")
    print(f"  dsc.Loader / Rust shuffled  {r['python_over_rust']:8.2f}")
    if "host_path_over_pinned_copy" in r:
        print(f"  to {a.device} / pinned copies {r['host_path_over_pinned_copy']:8.2f}")
    print(f"  dsc.Loader / NumPy indexing {r['python_over_numpy']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
