"""torchrun for a training script: this process's place among the ranks, the process group
(NCCL between GPUs, gloo between CPU processes), each rank's own random stream, sums over the
ranks read back once, and how a checkpoint's global batch is kept when it resumes on another
number of ranks. Used by examples/train.py; copy it into a loop of your own.
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


@dataclass
class Ranks:
    """This process's place among the training processes: one per GPU (or CPU process) under
    ``torchrun``, from its RANK and WORLD_SIZE variables, else the only one. Every
    rank runs the same steps on its own slice of each global batch (``dsc.Loader`` takes rank and
    world size from the process group) and DistributedDataParallel averages the gradients in
    backward. What the run reports is global: losses, metrics and sample counts are summed over
    the ranks where they are read back anyway (log interval, epoch end, validation), so a step
    gains no host sync."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """The rank that prints and writes checkpoints."""
        return self.rank == 0

    def sum(self, values: Sequence[Any], device: torch.device) -> List[float]:
        """``values`` (device scalars or numbers) summed over the ranks and read back: one
        all-reduce and one read-back for all of them."""
        t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).reshape(())
                         for v in values])
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Every rank's ``obj`` in rank order, on the main rank (None on the others)."""
        if self.world == 1:
            return [obj]
        out: Optional[List[Any]] = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out


def started_by_torchrun() -> int:
    """The number of processes torchrun started (1 when run directly)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def first_rank() -> bool:
    """Whether this process prints: the only one, or torchrun's rank 0 (known before the
    process group is joined)."""
    return started_by_torchrun() <= 1 or int(os.environ.get("RANK", "0")) == 0


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of rank ``rank``'s own random stream (dropout), from ``step`` on."""
    return seed * 1_000_003 + rank * 7919 + step


def start_ranks(device: torch.device, graph: bool) -> Tuple[Ranks, torch.device]:
    """Joins torchrun's process group when it started several processes: NCCL between GPUs,
    each rank on the GPU of its LOCAL_RANK; gloo between CPU processes."""
    world = started_by_torchrun()
    if world <= 1:
        return Ranks(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        if graph:
            # PyTorch's recipe for DDP inside CUDA graphs: NCCL's asynchronous error handling
            # watches work a graph replays outside its view.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return Ranks(rank, world), device


def rebatch(args: argparse.Namespace, before: int, world: int) -> Dict[str, Any]:
    """A run saved by ``before`` ranks, resumed on ``world``: the per-rank batch that keeps its
    global batch (the same contexts in every optimizer step) where ``world`` divides it; else
    the per-rank batch is kept and the global batch changes, the loader continuing from the
    same context of the same global order. Returns what the summary reports as ``regrouped``:
    the ranks, the global batch before and now (contexts, or packs), and what was said."""
    was = f"resuming on {world} rank{'s' * (world > 1)} (the checkpoint's run had {before})"
    if args.pack:
        acc = args.accumulate
        said = (f"{was}: one pack per rank per micro-batch, so an optimizer step trains "
                f"{world * acc} packs instead of {before * acc}")
        return dict(ranks=[before, world], global_batch=[before, world], said=said)
    # An optimizer step trains batch x ranks x accumulate contexts: that is the global batch
    # a resume keeps, counting accumulation.
    acc = args.accumulate
    micro = args.batch_size * before
    step = micro * acc
    if args.bucket:
        # A bucketed order is cut at the loader's global batch (one micro-batch of every rank):
        # it resumes at that batch only.
        if micro % world:
            raise SystemExit(f"{was}: a length-bucketed order (--bucket) resumes at its own "
                             f"global batch only, {micro} contexts, which {world} ranks cannot "
                             f"split equally: resume on a number of ranks that divides {micro}")
        args.batch_size = micro // world
        said = (f"{was}: --batch-size {args.batch_size} per rank keeps the global batch of "
                f"{step}")
        return dict(ranks=[before, world], global_batch=[step, step], said=said)
    if step % (world * acc) == 0:
        args.batch_size = step // (world * acc)
        said = (f"{was}: --batch-size {args.batch_size} per rank keeps the global batch of "
                f"{step}")
        return dict(ranks=[before, world], global_batch=[step, step], said=said)
    if step % world == 0:
        # The step's contexts split over the ranks, not over their micro-batches as they were:
        # as few fewer micro-batches as splits them.
        per = step // world
        acc = max(d for d in range(1, acc + 1) if per % d == 0)
        args.batch_size, args.accumulate = per // acc, acc
        said = (f"{was}: --batch-size {args.batch_size} and --accumulate {acc} per rank keep "
                f"the global batch of {step}")
        return dict(ranks=[before, world], global_batch=[step, step], said=said)
    now = args.batch_size * world * acc
    said = (f"{was}: the global batch of {step} does not split into {world} equal batches, so "
            f"each rank keeps --batch-size {args.batch_size}"
            + (f" and --accumulate {acc}" if acc > 1 else "")
            + f" and the global batch becomes {now}; the data continues from the same context")
    return dict(ranks=[before, world], global_batch=[step, now], said=said)


def rng_state() -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
