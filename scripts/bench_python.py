"""dsc.Loader from Python against the Rust loader and NumPy, in one run on one cache.

    python scripts/bench_python.py CACHE [--dsc target/release/dsc] [--batch-size 256] [--json]

Measures contexts per second consumed by a Python `for batch in loader` loop (shuffled epochs,
the batch's tensors taken into Python: each byte gathered once, as in `dsc bench`), against
(a) `dsc bench`'s Rust shuffled rate on the same cache, run as part of this script, and (b)
NumPy fancy indexing of the same tensors held in RAM (every shard of the split read into memory
first, then one `array[idx]` per tensor per batch with a random permutation). With a GPU and
`--device cuda` it also times batches delivered to the device (pinned gather + non-blocking
copy, synchronised at the end of each epoch).
"""

from __future__ import annotations

import argparse
import json
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
    for fmt in ("torch", "numpy"):
        for threads in (1, 2):
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
        r[f"python_{a.device}_contexts_per_s"] = best_of(
            a.passes, lambda: loader_rate(cache, a.split, a.batch_size, a.epochs, device=a.device,
                                          num_threads=2))
    best = max(r["python_torch_1t_contexts_per_s"], r["python_torch_2t_contexts_per_s"])
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
    print(f"  dsc.Loader / NumPy indexing {r['python_over_numpy']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
