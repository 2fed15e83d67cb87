"""Two processes with torch.distributed (gloo): dsc.Loader takes rank and world size from the
process group and gives each rank a disjoint slice of equal length."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

WORKER = r"""
import json, sys
import torch.distributed as dist
import dsc
dist.init_process_group("gloo")
loader = dsc.Loader(sys.argv[1], batch_size=24, seed=3)
keys = [b["key"].tolist() for b in loader]
print(json.dumps({"rank": dist.get_rank(), "world": loader.world_size, "len": len(loader),
                  "loader_rank": loader.rank, "keys": keys}))
dist.barrier()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_get_disjoint_equal_slices(cache_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    procs = []
    for rank in range(2):
        # The env:// rendezvous; RANK and WORLD_SIZE also reach the loader only through the
        # process group (the loader reads torch.distributed first).
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(cache_dir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    results.sort(key=lambda r: r["rank"])
    a, b = results
    assert (a["loader_rank"], b["loader_rank"], a["world"], b["world"]) == (0, 1, 2, 2)
    assert a["len"] == b["len"] == len(a["keys"]) == len(b["keys"]) > 0
    flat_a = {k for batch in a["keys"] for k in batch}
    flat_b = {k for batch in b["keys"] for k in batch}
    assert not flat_a & flat_b
    assert len(flat_a) == len(flat_b) == 24 * a["len"]
    # Together they are the one-rank order with the global batch, batch by batch.
    import dsc

    single = [bt["key"].tolist() for bt in dsc.Loader(cache_dir, batch_size=48, seed=3, rank=0, world_size=1)]
    assert [x + y for x, y in zip(a["keys"], b["keys"])] == single
