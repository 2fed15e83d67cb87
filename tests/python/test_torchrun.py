"""examples/train.py under torchrun: DistributedDataParallel over gloo processes on the CPU.

The runs share one small churn cache (785 train and 215 val contexts, neither a multiple of any
global batch used) and one global batch of 30 contexts: 2 ranks x 15, or 1 x 30. What is
checked:

- every rank trains the same steps, and together they train every context of the epoch's full
  global batches once, in the one-process order;
- the 2-rank run and the 1-process run at the same global batch follow the same loss curve and
  reach the same weights, up to float rounding (TOLERANCE says how far);
- a checkpoint resumes on another number of ranks (2 -> 1, 1 -> 2: the same weights as the run
  that never stopped; 2 -> 4: a global batch 4 ranks cannot split, continued at 4 x 15 from the
  same context, every context still once);
- validation splits the val split across the ranks and counts each context once: the same
  metric as one process;
- nothing hangs at the end of an epoch or of validation (every launch has a timeout).

About 40 s on two cores: each launch starts torch in every process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

torch = pytest.importorskip("torch")
dsc = pytest.importorskip("dsc")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from conftest import COMPILE_FLAGS, REPO, compile_churn, run_dsc  # noqa: E402 (after the importorskips)

SCRIPT = REPO / "examples" / "train.py"

# A GRU of 16: a run of 26 steps takes a second. One torch thread per process: two processes
# on two cores, and one thread's sums are the same in every run.
BASE = ["--task", "classification", "--target", "churned", "--model", "gru", "--dim", "16",
        "--layers", "1", "--torch-threads", "1", "--device", "cpu", "--log-every", "1",
        "--epochs", "1", "--seed", "5"]
GLOBAL = 30
STOP = 10  # optimizer steps before the runs that are resumed stop

# How far two runs at the same global batch may differ. DDP averages per-rank mean gradients
# (15 contexts each) where one process takes the mean of 30: the same value summed in another
# order, about 1e-7 apart relative in float32. AdamW divides by the root of the second moment,
# which can magnify a rounding difference in a near-zero gradient, and 26 steps compound it;
# measured: at most 3e-8 apart in any weight and 1e-7 in any step's loss (2026-11-27). The
# bounds (|a - b| <= 1e-5 + 1e-4 |b|) leave more than two orders of magnitude above that, and
# stay far below what training on one other batch moves a weight (AdamW: about the learning
# rate, 1e-3, per step).
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The churn cache (conftest.compile_churn) of 1,000 customers."""
    return compile_churn(tmp_path_factory.mktemp("churn"), 1000)


@pytest.fixture(scope="module")
def script():
    """examples/train.py as a module: one-process runs skip the interpreter and torch start."""
    spec = importlib.util.spec_from_file_location("dsc_torchrun_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)
    sys.modules.pop(spec.name, None)


def environment(**more: str) -> Dict[str, str]:
    """This environment (the launched processes import dsc as this one does: the installed
    wheel, or the PYTHONPATH a developer set), with ``more``."""
    return {**os.environ, **more}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: List[str], cwd: Path | None = None, env: Dict[str, str] | None = None):
    """Runs a launch to its end: a non-zero exit or a hang (240 s) fails the test."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env or environment(),
                          cwd=cwd, timeout=240)
    assert done.returncode == 0, f"{shlex.join(cmd)}\n{done.stderr[-4000:]}"
    return done


def torchrun(ranks: int, *args: str) -> Dict:
    """``torchrun --standalone --nproc-per-node N examples/train.py ARGS --json``: rank 0's
    summary; the launch fails the test on a non-zero exit or a hang."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(ranks), str(SCRIPT), *args, "--json"]
    done = launch(cmd)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"one summary, from rank 0 only: {done.stdout[-2000:]}"
    summary = json.loads(lines[0])
    summary["stderr"] = done.stderr
    return summary


def keys_by_step(folder: Path) -> List[List[int]]:
    """The keys each micro-batch trained over all ranks, in step order (rank order within a
    step). Each rank's file lists its micro-batches by (epoch, micro): a run resumed on other
    ranks goes on in the files of its ranks."""
    steps: Dict[tuple, List[int]] = {}
    for path in sorted(folder.glob("keys-rank*.jsonl"), key=lambda p: int(p.stem[9:])):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            steps.setdefault((row["epoch"], row["micro"]), []).extend(row["keys"])
    return [steps[k] for k in sorted(steps)]


def weights(ckpt: Path) -> Dict[str, "torch.Tensor"]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["model"]


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], **TOLERANCE, msg=lambda m: f"{name}: {m}")


def one_order(cache: Path) -> List[List[int]]:
    """The train split's global batches of GLOBAL contexts, as one process reads them."""
    loader = dsc.Loader(cache, batch_size=GLOBAL, seed=5, rank=0, world_size=1)
    return [b["key"].tolist() for b in loader]


@pytest.fixture(scope="module")
def runs(cache: Path, script, tmp_path_factory) -> Dict[str, Dict]:
    """Every run the tests compare, each made once."""
    tmp = tmp_path_factory.mktemp("runs")
    out: Dict[str, Dict] = {}

    def local(name: str, *args: str) -> Dict:
        return script.main([*args, "--keys-out", str(tmp / name), "--json"])

    # Uninterrupted: 2 ranks x 15, and 1 process x 30.
    out["two"] = torchrun(2, "--cache", str(cache), *BASE, "--batch-size", "15",
                          "--out", str(tmp / "two"), "--keys-out", str(tmp / "two"))
    out["one"] = local("one", "--cache", str(cache), *BASE, "--batch-size", str(GLOBAL),
                       "--out", str(tmp / "one"))
    # 2 ranks stopped, then resumed on 1 and (another copy) on 4.
    torchrun(2, "--cache", str(cache), *BASE, "--batch-size", "15", "--max-steps", str(STOP),
             "--out", str(tmp / "stop2"), "--keys-out", str(tmp / "two-then-one"))
    ckpt = tmp / "stop2" / "last.pt"
    # The resume on 1 writes over its checkpoint and keys: the resume on 4 starts from copies.
    shutil.copytree(tmp / "stop2", tmp / "stop2-copy")
    shutil.copytree(tmp / "two-then-one", tmp / "two-then-four")
    out["two-then-one"] = local("two-then-one", "--resume", str(ckpt), "--torch-threads", "1")
    out["two-then-four"] = torchrun(4, "--resume", str(tmp / "stop2-copy" / "last.pt"),
                                    "--torch-threads", "1", "--log-every", "1",
                                    "--keys-out", str(tmp / "two-then-four"))
    # 1 process stopped, then resumed on 2 ranks.
    local("one-then-two", "--cache", str(cache), *BASE, "--batch-size", str(GLOBAL),
          "--max-steps", str(STOP), "--out", str(tmp / "stop1"))
    out["one-then-two"] = torchrun(2, "--resume", str(tmp / "stop1" / "last.pt"), "--torch-threads",
                                   "1", "--keys-out", str(tmp / "one-then-two"))
    out["tmp"] = {"path": tmp}
    return out


def test_two_ranks_train_every_context_once_in_the_one_process_order(runs, cache) -> None:
    tmp = runs["tmp"]["path"]
    two = runs["two"]
    assert two["world_size"] == 2 and two["optimizer_steps"] == 785 // GLOBAL
    steps = keys_by_step(tmp / "two")
    assert all(len(s) == GLOBAL for s in steps)
    flat = [k for s in steps for k in s]
    assert len(flat) == len(set(flat)) == 785 // GLOBAL * GLOBAL
    # Rank 0 takes the first half of each global batch, rank 1 the second: together the batches
    # one process reads at the global batch.
    assert steps == one_order(cache)[: len(steps)]
    assert keys_by_step(tmp / "one") == steps


def test_a_resume_at_another_accumulation_trains_every_context_once(cache, script,
                                                                     tmp_path) -> None:
    """One process at --batch-size 15 --accumulate 2, stopped, then resumed on 2 ranks, where
    --batch-size 15 --accumulate 1 per rank keeps the optimizer step's 30 contexts but not a
    micro-batch's global batch (15 → 30): the loader counts the rest of the epoch afresh. It
    skipped 6 of the 26 optimizer steps before (the micro count was kept), found by a review."""
    keys = tmp_path / "keys"
    script.main(["--cache", str(cache), *BASE, "--batch-size", "15", "--accumulate", "2",
                 "--max-steps", str(STOP), "--out", str(tmp_path / "stop"),
                 "--keys-out", str(keys), "--json"])
    resumed = torchrun(2, "--resume", str(tmp_path / "stop" / "last.pt"), "--torch-threads",
                       "1", "--keys-out", str(keys))
    assert resumed["world_size"] == 2 and resumed["optimizer_steps"] == 785 // GLOBAL
    flat = [k for s in keys_by_step(keys) for k in s]
    assert len(flat) == len(set(flat)) == 785 // GLOBAL * GLOBAL


def test_two_ranks_and_one_process_at_the_same_global_batch_learn_the_same(runs) -> None:
    tmp = runs["tmp"]["path"]
    two, one = runs["two"], runs["one"]
    curve = lambda s: [w["train_loss"] for w in s["steps"]]  # noqa: E731
    assert len(curve(two)) == len(curve(one)) == 785 // GLOBAL
    torch.testing.assert_close(torch.tensor(curve(two)), torch.tensor(curve(one)), **TOLERANCE)
    assert_same_weights(tmp / "two" / "last.pt", tmp / "one" / "last.pt")
    # It learns: the last steps' loss is below the first steps'.
    assert sum(curve(two)[-5:]) < sum(curve(two)[:5])
    # Validation on 2 ranks counts each of the 215 val contexts once: one process's metric.
    for key in ("val_loss", "val_metric"):
        assert two["epochs"][0][key] == pytest.approx(one["epochs"][0][key], rel=1e-4)
    assert two["samples_per_s"] > 0


def test_a_two_rank_checkpoint_resumes_on_one_process_as_if_never_stopped(runs) -> None:
    tmp = runs["tmp"]["path"]
    resumed = runs["two-then-one"]
    assert resumed["world_size"] == 1 and resumed["optimizer_steps"] == 785 // GLOBAL
    # The same contexts in every optimizer step, before and after the stop.
    assert keys_by_step(tmp / "two-then-one")[:STOP] == keys_by_step(tmp / "two")[:STOP]
    one_rank = json.loads((tmp / "two-then-one" / "keys-rank0.jsonl").read_text()
                          .splitlines()[-1])["keys"]
    assert len(one_rank) == GLOBAL
    # The weights of the run that never stopped.
    assert_same_weights(tmp / "stop2" / "last.pt", tmp / "two" / "last.pt")


def test_a_one_process_checkpoint_resumes_on_two_ranks_as_if_never_stopped(runs) -> None:
    tmp = runs["tmp"]["path"]
    resumed = runs["one-then-two"]
    assert resumed["world_size"] == 2 and resumed["optimizer_steps"] == 785 // GLOBAL
    assert resumed["regrouped"]["global_batch"] == [30, 30]
    assert "--batch-size 15 per rank keeps the global batch of 30" in resumed["regrouped"]["said"]
    # 10 steps of one process, then 16 of two ranks (rank 0 and 1 in turn): those of the run
    # that never stopped.
    assert keys_by_step(tmp / "one-then-two") == keys_by_step(tmp / "one")
    assert_same_weights(tmp / "stop1" / "last.pt", tmp / "one" / "last.pt")


def test_a_resume_that_changes_the_global_batch_says_so_and_trains_every_context_once(
        runs, cache) -> None:
    tmp = runs["tmp"]["path"]
    resumed = runs["two-then-four"]
    assert resumed["world_size"] == 4
    assert resumed["regrouped"] == dict(ranks=[2, 4], global_batch=[30, 60],
                                        said=resumed["regrouped"]["said"])
    assert "the global batch of 30 does not split into 4 equal batches" in \
        resumed["regrouped"]["said"]
    steps = keys_by_step(tmp / "two-then-four")
    # 10 steps of 2 x 15 (copied from the stopped run), then steps of 4 x 15 from context 300.
    before, after = steps[:STOP], steps[STOP:]
    assert all(len(s) == GLOBAL for s in before) and all(len(s) == 60 for s in after)
    order = [k for b in one_order(cache) for k in b]
    flat = [k for s in steps for k in s]
    assert len(flat) == len(set(flat)), "no context twice"
    assert flat == order[: len(flat)] and len(flat) == STOP * GLOBAL + (785 - 300) // 60 * 60
    # The schedule spans the steps taken and those left at the new batch: it still decays at
    # every step to its floor at the last (not cut short by the old batch's step count).
    rates = [w["lr"] for w in resumed["steps"]]
    assert len(rates) == len(after) and all(a > b for a, b in zip(rates, rates[1:])), rates
    assert rates[-1] == pytest.approx(1e-4)


def test_a_bucketed_run_resumes_only_where_its_global_batch_splits(script) -> None:
    import argparse
    run = argparse.Namespace(pack=None, batch_size=15, bucket=True, accumulate=1)
    with pytest.raises(SystemExit, match="resume on a number of ranks that divides 30"):
        script.rebatch(run, 2, 4)
    assert script.rebatch(run, 2, 3)["global_batch"] == [30, 30] and run.batch_size == 10


def test_a_resume_on_other_ranks_counts_accumulation(script) -> None:
    """Issue 52 (15): with --accumulate 3 a 2 -> 3 rank resume said the global batch of 16
    becomes 24, where the optimizer step's is 48 and 3 ranks split it."""
    import argparse

    def run(accumulate):
        return argparse.Namespace(pack=None, batch_size=8, bucket=False, accumulate=accumulate)

    kept = run(3)
    regrouped = script.rebatch(kept, 2, 3)
    assert regrouped["global_batch"] == [48, 48]
    assert (kept.batch_size, kept.accumulate) == (8, 2)
    assert "--batch-size 8 and --accumulate 2 per rank keep the global batch of 48" in \
        regrouped["said"]
    split = run(3)
    assert script.rebatch(split, 2, 4)["global_batch"] == [48, 48]
    assert (split.batch_size, split.accumulate) == (4, 3)
    changed = run(3)
    regrouped = script.rebatch(changed, 2, 5)
    assert regrouped["global_batch"] == [48, 120]
    assert "the global batch of 48 does not split into 5" in regrouped["said"]


def test_the_torchrun_lines_of_python_md_train_and_resume_on_another_rank_count(
        tmp_path: Path) -> None:
    """docs/PYTHON.md's torchrun lines, as written, on the demo cache they name (smaller)."""
    text = (REPO / "docs" / "PYTHON.md").read_text()
    section = text[text.index("### Distributed training with torchrun"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = [shlex.split(ln) for ln in block.splitlines() if ln.startswith("torchrun ")]
    assert len(lines) == 2
    run_dsc("gen", "icecube", "--out", "data", "--files", "2", "--events-per-file", "300",
            "--seed", "7", cwd=tmp_path)
    run_dsc("compile", "data/train/batch_*.parquet", *COMPILE_FLAGS, "--out", "demo/cache",
            "--quiet", cwd=tmp_path)
    said = []
    for words in lines:
        # torchrun from this Python; the script from this checkout.
        cmd = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
        cmd = [str(SCRIPT) if w == "examples/train.py" else w for w in cmd]
        done = launch(cmd + ["--torch-threads", "1"], cwd=tmp_path)
        said.append(done.stderr)
        summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert "2 ranks x" in said[0]
    assert ("resuming on 1 rank (the checkpoint's run had 2): --batch-size 128 per rank keeps "
            "the global batch of 128") in said[1]
    assert summary["world_size"] == 1 and len(summary["epochs"]) == 2
    assert summary["regrouped"]["global_batch"] == [128, 128]


def test_the_slurm_training_job_starts_torchrun_as_slurm_runs_it(cache: Path,
                                                                  tmp_path: Path) -> None:
    """examples/slurm/train.sbatch as Slurm runs it on a one-node allocation: srun starts the
    script's command once per node (here: this machine), scontrol names the nodes. Stand-ins for
    both; torchrun meets at the first node's c10d rendezvous and trains with gloo. The run takes
    the fast path of a GPU, packs and the whole step (--graph, uncaptured on the CPU), so that
    DDP is tried there too."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"srun": 'exec "$@"', "scontrol": 'echo localhost'}.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    torchrun_bin = bin_dir / "torchrun"
    torchrun_bin.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    torchrun_bin.chmod(torchrun_bin.stat().st_mode | stat.S_IEXEC)
    env = environment(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                      SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1", SLURM_JOB_ID="7",
                      SLURM_GPUS_ON_NODE="2", DSC_TRAIN=str(SCRIPT),
                      DSC_PORT=str(free_port()))
    done = launch(["bash", str(REPO / "examples" / "slurm" / "train.sbatch"), "--cache",
                   str(cache), *BASE, "--pack", "400", "--graph", "--max-steps", "3", "--json"],
                  cwd=tmp_path, env=env)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["optimizer_steps"] == 3 and summary["graph"]
    assert all(math.isfinite(w["train_loss"]) for w in summary["steps"])

