"""What a user does first after `pip install dsc-compiler`, run by the Python of a fresh virtual
environment that has only the wheel (and NumPy, its one dependency): the `dsc` console script
generates and compiles sample data, Python opens the cache and loads an epoch, `dsc.compile`
makes the same cache, and torch takes batches where it is installed.

    python smoke.py WORK EXPECTED_VERSION_LINE

Prints one JSON line of what it checked; exits non-zero at the first thing that is wrong.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import dsc


def cli(*args: str) -> str:
    exe = Path(sys.executable).parent / "dsc"
    done = subprocess.run([str(exe), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"dsc {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def main() -> None:
    work, expected_version = Path(sys.argv[1]), sys.argv[2]
    checked = {"python": sys.version.split()[0], "numpy": np.__version__,
               "dsc": dsc.__version__, "from": str(Path(dsc.__file__).parent)}
    version = cli("--version").strip()
    assert version == expected_version, (version, expected_version)
    checked["cli_version"] = version
    # The same CLI through `python -m dsc`.
    module = subprocess.run([sys.executable, "-m", "dsc", "--version"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert module == expected_version, module

    data = work / "data"
    cli("gen", "icecube", "--out", str(data), "--files", "2", "--events-per-file", "400",
        "--seed", "3")
    options = dict(key="event_id", order_by="time", context=str(data / "train_meta.parquet"),
                   targets="azimuth,zenith", join=str(data / "sensor_geometry.csv"),
                   on="sensor_id", features="x,y,z,time,charge,auxiliary",
                   categorical="sensor_id", max_len=64, val_fraction=0.2, seed=1)
    flags = []
    for k, v in options.items():
        flags += [f"--{k.replace('_', '-')}", str(v)]
    rows = str(data / "train" / "batch_*.parquet")
    cli("compile", rows, *flags, "--out", str(work / "cli-cache"), "--quiet")

    cache = dsc.open(work / "cli-cache")
    seen = []
    for batch in dsc.Loader(cache, batch_size=32, format="numpy", seed=0, drop_last=False):
        assert isinstance(batch["x"], np.ndarray), type(batch["x"])
        seen.extend(batch["key"][:batch.valid].tolist())
    assert len(seen) == len(set(seen)) == cache.splits["train"], (len(seen), cache.splits)
    checked["train_contexts_loaded"] = len(seen)

    again = dsc.compile(rows, out=work / "py-cache", progress=False, **options)
    assert again.content_id == cache.content_id, "dsc.compile and the CLI made different caches"
    checked["same_cache_from_python_and_cli"] = True

    try:
        import torch
    except ImportError:
        checked["torch"] = None
    else:
        batch = next(iter(dsc.Loader(cache, batch_size=32, seed=0)))
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].dtype == torch.float32
        checked["torch"] = torch.__version__
    print(json.dumps(checked))


if __name__ == "__main__":
    main()
