"""The compile against the floor and against a user's own prep, on the same files, paired.

Three passes over the README's IceCube-like data (`dsc gen icecube`), in turn, `--repeat` times:

- **pyarrow read**: the five input columns of every rows file, read with pyarrow's threads:
  what the bytes cost to decode, the floor of any prep.
- **NumPy prep**: what a user writes without dsc (one process, NumPy): read each file, find
  each event's pulses (files hold whole events, ordered by time, as the generator writes them),
  join the sensor geometry, log1p the charge, standardise the time, pad every event to
  `--max-len` steps in one memory-mapped float32 array with its lengths and targets. It does less
  than `dsc compile`: no statistics beyond mean and std, no shuffle, no validation split, no
  checksums, no commit.
- **dsc compile**: the README's compile (`--json`), with its stage and phase timings.

Prints one JSON object: each pass's median seconds and the paired ratios (compile ÷ pyarrow
read, NumPy prep ÷ compile: above 1.0 the compile is the faster), and the compile's median
phases. The commands are in docs/PERFORMANCE.md ("The compile's own speed").

    python scripts/bench_compile.py --dsc target/release/dsc --work /tmp/cb --repeat 5
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

COLUMNS = ["event_id", "sensor_id", "time", "charge", "auxiliary"]


def generate(dsc: str, data: Path, files: int, events: int) -> None:
    if (data / "train_meta.parquet").exists():
        return
    subprocess.run([dsc, "gen", "icecube", "--out", str(data), "--files", str(files),
                    "--events-per-file", str(events), "--seed", "7"], check=True,
                   stdout=subprocess.DEVNULL)


def rows_files(data: Path) -> list[str]:
    return sorted(glob.glob(str(data / "train" / "batch_*.parquet")))


def pyarrow_read(data: Path) -> float:
    start = time.perf_counter()
    rows = 0
    for f in rows_files(data):
        rows += pq.read_table(f, columns=COLUMNS, use_threads=True).num_rows
    assert rows > 0
    return time.perf_counter() - start


def numpy_prep(data: Path, out: Path, max_len: int) -> float:
    """A user's own prep: padded [events, max_len, 6] float32 features in one memmap."""
    start = time.perf_counter()
    geometry = pacsv.read_csv(data / "sensor_geometry.csv")
    xyz = np.stack([geometry[c].to_numpy() for c in ("x", "y", "z")], axis=1).astype(np.float32)
    meta = pq.read_table(data / "train_meta.parquet", columns=["event_id", "azimuth", "zenith"])
    files = rows_files(data)
    tables = [pq.read_table(f, columns=COLUMNS) for f in files]
    # Standardising the time needs its mean and std over everything first.
    times = np.concatenate([t["time"].to_numpy() for t in tables]).astype(np.float64)
    mean, std = times.mean(), times.std()
    events = sum(len(np.unique(t["event_id"].to_numpy())) for t in tables)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    x = np.lib.format.open_memmap(out / "x.npy", mode="w+", dtype=np.float32,
                                  shape=(events, max_len, 6))
    lengths = np.zeros(events, dtype=np.int32)
    keys = np.zeros(events, dtype=np.int64)
    at = 0
    for t in tables:
        event = t["event_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, event[1:] != event[:-1]])
        ends = np.r_[starts[1:], len(event)]
        sensor = t["sensor_id"].to_numpy().astype(np.int64)
        feats = np.empty((len(event), 6), dtype=np.float32)
        feats[:, :3] = xyz[sensor]
        feats[:, 3] = (t["time"].to_numpy() - mean) / std
        feats[:, 4] = np.log1p(t["charge"].to_numpy())
        feats[:, 5] = t["auxiliary"].to_numpy()
        for s, e in zip(starts, ends):
            n = min(e - s, max_len)
            x[at, :n] = feats[s:s + n]
            lengths[at] = n
            keys[at] = event[s]
            at += 1
    index = {k: i for i, k in enumerate(meta["event_id"].to_numpy())}
    rows = np.fromiter((index[k] for k in keys), dtype=np.int64, count=len(keys))
    y = np.stack([meta[c].to_numpy()[rows] for c in ("azimuth", "zenith")], axis=1)
    np.save(out / "lengths.npy", lengths)
    np.save(out / "y.npy", y.astype(np.float32))
    x.flush()
    del x
    return time.perf_counter() - start


def compile_(dsc: str, data: Path, out: Path, max_len: int) -> dict:
    """The README's compile, its `--json` report with the wall time seen from here."""
    cmd = [dsc, "compile", str(data / "train" / "batch_*.parquet"),
           "--key", "event_id", "--order-by", "time",
           "--context", str(data / "train_meta.parquet"), "--targets", "azimuth,zenith",
           "--join", str(data / "sensor_geometry.csv"), "--on", "sensor_id",
           "--features", "x,y,z,time,charge,auxiliary", "--categorical", "sensor_id",
           "--encode", "time=zscore", "--encode", "charge=log1p",
           "--max-len", str(max_len), "--val-fraction", "0.1", "--seed", "42",
           "--out", str(out), "--force", "--json"]
    start = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    report = json.loads(done.stdout)
    report["wall"] = wall
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsc", default="target/release/dsc")
    ap.add_argument("--work", type=Path, default=Path("/tmp/dsc-bench-compile"))
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--events-per-file", type=int, default=2000)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dsc-before", help="another dsc binary (an earlier build) to pair with "
                    "--dsc: adds compile_before and compile_over_before")
    args = ap.parse_args()
    data = args.work / "data"
    generate(args.dsc, data, args.files, args.events_per_file)
    runs = {"pyarrow_read": [], "numpy_prep": [], "compile": []}
    if args.dsc_before:
        runs["compile_before"] = []
    phases = []
    # One warm-up of each (the page cache, the interpreter's imports), then paired repeats.
    pyarrow_read(data)
    numpy_prep(data, args.work / "numpy", args.max_len)
    compile_(args.dsc, data, args.work / "cache", args.max_len)
    for _ in range(args.repeat):
        runs["pyarrow_read"].append(pyarrow_read(data))
        runs["numpy_prep"].append(numpy_prep(data, args.work / "numpy", args.max_len))
        report = compile_(args.dsc, data, args.work / "cache", args.max_len)
        runs["compile"].append(report["wall"])
        phases.append(dict(report["phases"]))
        if args.dsc_before:
            before = compile_(args.dsc_before, data, args.work / "cache-before", args.max_len)
            runs["compile_before"].append(before["wall"])
    paired = lambda a, b: statistics.median(x / y for x, y in zip(runs[a], runs[b]))  # noqa: E731
    out = {
        "files": args.files,
        "events": args.files * args.events_per_file,
        "rows": report["rows_read"],
        "threads": report["threads"],
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "seconds": {k: statistics.median(v) for k, v in runs.items()},
        "compile_over_pyarrow_read": paired("compile", "pyarrow_read"),
        "numpy_prep_over_compile": paired("numpy_prep", "compile"),
        **({"compile_over_before": paired("compile", "compile_before")}
           if args.dsc_before else {}),
        "compile_phases": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
        "compile_timings": dict(report["timings"]),
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
