#!/usr/bin/env python3
"""The reference PyTorch training loop on a dsc cache: copy it and change what you need.

It mirrors the Rust reference trainer (``dsc-train``, trainer/): the same tasks, networks and
flag names, and the same accounting of where a step's time goes.

    python examples/train.py --cache cache --task direction --epochs 2
    python examples/train.py --cache cache --task classification --target churned --model gru
    python examples/train.py --cache cache --task direction --out runs/a --max-steps 100
    python examples/train.py --resume runs/a/last.pt --epochs 2     # continues exactly

Tasks (what is learned from the cache's targets tensor ``y``):

- ``direction``: ``y`` holds azimuth and zenith in radians (IceCube); the network predicts a 3-D
  vector, the loss is ``1 - cos`` to the true unit vector, the metric the mean angular error in
  radians (lower is better; predicting nothing useful gives about 1.57).
- ``classification``: one integer column of ``y`` (``--target NAME``, classes ``0..K-1`` with
  ``K`` = the training split's maximum + 1); cross-entropy, metric accuracy.
- ``regression``: mean squared error on the target columns standardised with the training
  split's statistics; metric the mean absolute error in stored units.

Models: ``transformer`` (pre-norm encoder built from ``scaled_dot_product_attention`` with the
padding mask from ``length``, learned positions, masked mean pooling) and ``gru`` (read at the
last stored step of each sequence). Both embed the per-step features ``x`` with a linear
projection and add one ``nn.Embedding`` per categorical tensor (code 0, null and padding, has a
zero embedding); per-context features ``c`` join the pooled vector before the head.

Input normalisation (``--no-normalise`` switches it off). dsc stores feature columns as the
``--encode`` chain made them: a ``zscore`` or ``minmax`` column is already on a unit scale, a
``bool`` is 0/1, but an ``identity`` column is in source units (IceCube's x, y, z are metres,
about +-500, which saturate a freshly initialised network) and a ``log1p`` column is only
compressed. For those, the model subtracts a shift and divides by a scale taken from the cache's
own ``stats.json``, train split (never validation data):

- ``identity`` columns: the column's ``mean`` and ``std``.
- other chains (e.g. ``log1p``): stats.json describes the values *before* encoding, and means do
  not pass through a non-linear map, but quantiles pass through any increasing one. So the shift
  is the encoded median and the scale the encoded inter-quartile range / 1.349 (the IQR of a
  unit normal), both computed by pushing the stored quantiles through the encoding chain.

The shift and scale are buffers of the model, so they are saved in checkpoints and the trained
model carries its own preprocessing.

Packed batches (``--pack T``). Instead of padded batches of ``--batch-size`` contexts, each step
trains one pack: whole sequences laid end to end in ``T`` tokens (``dsc.Loader(pack=T)``), so
every step has the same shapes and almost no padding. The networks read the per-step tensors
as ``[T, ...]`` and keep each sequence to itself: attention runs per sequence
(``torch.nn.attention.varlen.varlen_attn`` over ``cu_seqlens`` on CUDA; elsewhere, and with
dropout, the packed tokens are scattered into a ``[S, L]`` view and attend with the same
padding mask as padded batches, which keeps memory linear in ``T``: a dense ``[T, T]`` mask
would not be); the GRU runs over the same view; pooling sums each sequence's tokens with
``index_add_`` over ``seq_idx``. The loss is the mean over the pack's sequences (masked by
``num_seqs``), so a step's weight is per context, as with padded batches; a pack holds a
varying number of contexts (about ``T`` / mean length; choose ``T`` near ``--batch-size`` x
the mean stored length to keep the steps per epoch). With ``--compile`` the step is compiled
once for the pack's static shapes (``dynamic=False``) and, on CUDA, captured as CUDA graphs
(``mode="reduce-overhead"``), beside fused AdamW.

The whole step as CUDA graphs (``--graph``, with ``--pack T`` or ``--no-trim``: one batch
shape). The loader puts every batch in the same device tensors (``dsc.Loader(static=True)``);
from a resident split ``next()`` copies only the step's index there and the step gathers the
batch itself (``gather_in_step=True``). The step (gather, forward, loss, backward, then per
optimizer step clipping, the schedule's learning rate read from a device table by a device step
counter, fused AdamW with ``capturable=True``, the running losses) has no read-back and no
branch on data, so after three eager optimizer steps it is captured, and each later step is one
index copy and one graph replay on the host (two graphs with ``--accumulate``: the micro-step
and the update). Time shares come from two CUDA events per logged window. On the CPU the same
step function runs without capture (the tests compare it with the eager loop). Off by default:
capture fixes the shapes and holds the graph's memory for the run, and refuses fp16 (its loss
scaler reads back every step) and ``--compile``; with ``--pack`` on CUDA it is the fast path
(docs/PERFORMANCE.md).

Choices made from the machine (``--device auto``, ``--amp``, ``--attention auto``, the
loader's ``trim_multiple``) are recorded in the checkpoint as chosen; ``--resume`` keeps them on
any machine, changes one only when the command line names it, and says so (``resident``, which
changes no batch, is decided again for the machine's memory and reported when it differs; a
resume cannot switch ``--graph``, whose schedule lives on the device). The summary lists them.

Data path. On CUDA the loader delivers batches on the GPU (``dsc.Loader(..., device="cuda")``):
with ``--resident auto`` (the default) a split that fits a quarter of the GPU's memory is
uploaded once and each batch gathered there by index, so nothing but a small index crosses PCIe
per step; otherwise the loader's threads gather whole batches into pinned blocks, one copy per
batch on a copy stream. On the CPU the batches are used in place. ``--trim`` (on by default)
cuts every batch to its longest stored sequence, rounded on CUDA to a few lengths (multiples
of 16, then four per doubling: ``dsc.Loader(trim_multiple=)``) so that a run sees a handful of
shapes; the summary's ``batch_lens`` lists them.

Time accounting, per logged window and for the run (``--json`` summary): ``data_wait`` is the
host time blocked in ``next(loader)`` for data (less its waits for the GPU to finish with a
buffer, which a GPU-bound run has plenty of: ``loader.device_wait_s``); on CUDA ``h2d`` and ``compute`` are device times between
events recorded around the copy and around forward/backward/update; on the CPU there is no copy
and ``compute`` is the rest of the wall time. The loss stays on the device and is read back once
per ``--log-every`` optimizer steps (and at the end of each epoch); nothing else in a training
step waits for the device (except the fp16 loss scaler, which must check for overflow).

Checkpoints. ``--out DIR`` writes ``DIR/last.pt`` at every epoch end and when ``--max-steps``
stops the run: model, optimizer, schedule, loss scaler, RNG states, position (epoch, micro-batch,
optimizer step), per-epoch history and ``loader.state_dict()``. ``--resume DIR/last.pt`` takes
the run's settings from the checkpoint (only --epochs, --max-steps, --device, --log-every,
--json, --out, --threads and a moved --cache may differ) and continues with the very batches,
in the same order, that the uninterrupted run would have seen; on the CPU (same --threads) the
weights are bit-identical to those of a run that never stopped. On CUDA some kernels (e.g. the
embedding backward) add in a varying order, so the runs agree only to rounding.

Several GPUs (``torchrun``). Started by torchrun with N processes, the script trains with
DistributedDataParallel: NCCL between GPUs (each rank on the GPU of its ``LOCAL_RANK``), gloo
between CPU processes. Each rank has its own ``dsc.Loader`` (rank and world size from the process
group), ``--batch-size`` contexts per rank (``--pack``: one pack per rank), so the global batch is
``--batch-size`` x N x ``--accumulate``; every rank takes the same number of steps and stops at
the same one. The gradients are averaged once per optimizer step (``no_sync`` in the other
micro-batches; a captured step all-reduces in every micro-batch, which sums the same). Losses,
metrics and samples/s are global: summed over the ranks where they are read back anyway (log
interval, epoch end), so no step gains a sync; validation splits the split across the ranks and
adds their sums, each context counted once. Only rank 0 prints and writes
``last.pt`` (with every rank's random state). A checkpoint of N ranks resumes on M: with the
per-rank batch that keeps the global batch where M divides it (the same contexts in every step,
the weights equal to an uninterrupted run's up to the order of float sums), else with the
per-rank batch kept and the global batch changed, said at the start. ``--compile`` compiles the
DDP model (without CUDA graphs: DDP's bucketed all-reduce splits the graph); ``--graph`` builds
DDP on a side stream and warms up 11 steps before capture, as PyTorch's CUDA graphs notes ask.

    torchrun --standalone --nproc-per-node 8 examples/train.py --cache cache --batch-size 64

At the end one JSON line summarises the run on stdout (``--json``: only that line, no other
output): per-epoch train loss and validation metric, the final train loss (last logged
window), and samples/s and the time shares over the training steps (validation excluded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dsc

# On --resume the run's settings come from the checkpoint except these, always taken from the
# command line (they do not change the arithmetic), and --epochs and --cache when given.
RESUME_FROM_COMMAND_LINE = ("max_steps", "log_every", "json", "out", "threads", "resume",
                            "keys_out")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a transformer or GRU on a dsc cache (the reference PyTorch loop).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--cache", help="the compiled cache (a folder with manifest.json, or its URL "
                   "in object storage: s3://bucket/cache; DSC_CACHE_DIR and DSC_CACHE_LIMIT set "
                   "where its shards are fetched and how many bytes are kept)")
    p.add_argument("--resume", metavar="CKPT", help="continue the run saved in this last.pt")
    p.add_argument("--task", choices=["direction", "classification", "regression"],
                   default="direction")
    p.add_argument("--target", default=None,
                   help="target column(s) of y, comma-separated [default: azimuth,zenith for "
                        "direction, the only column for classification, all for regression]")
    p.add_argument("--model", choices=["transformer", "gru"], default="transformer")
    p.add_argument("--dim", type=int, default=64, help="transformer width / GRU hidden size")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the train split [default: 1, or the resumed run's]")
    p.add_argument("--batch-size", type=int, default=128,
                   help="contexts per micro-batch on each rank: under torchrun the global batch "
                        "is this x the ranks x --accumulate")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=None,
                   help="linear warmup in optimizer steps [default: 5%% of all steps]")
    p.add_argument("--clip", type=float, default=1.0, help="global gradient norm (0: off)")
    p.add_argument("--amp", choices=["bf16", "fp16", "none"], default=None,
                   help="autocast dtype [default: bf16 on CUDA, none on CPU]")
    p.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the whole training step (the batch's gather from the "
                        "resident split, forward, loss, backward, clipping, AdamW, the LR "
                        "schedule) as CUDA graphs fed from the loader's static buffers: one "
                        "index copy and one replay per step; needs one batch shape (--pack, or "
                        "--no-trim) and bf16 or no autocast. On the CPU the same step function "
                        "runs without capture [default: off]")
    p.add_argument("--trim", action=argparse.BooleanOptionalAction, default=True,
                   help="cut each batch to its longest stored sequence")
    p.add_argument("--bucket", action="store_true",
                   help="length-bucketed batches: similar lengths train together, little padding")
    p.add_argument("--pack", type=int, default=None, metavar="T",
                   help="packed batches of T tokens (one static shape, almost no padding) "
                        "instead of --batch-size contexts")
    p.add_argument("--max-seqs", type=int, default=None, metavar="S",
                   help="the most sequences in a pack [default: from T and the lengths]")
    p.add_argument("--attention", choices=["auto", "varlen", "padded"], default=None,
                   help="attention over packed batches: varlen_attn (CUDA, bf16/fp16), or the "
                        "padded view [S, L] [default: varlen where it runs]")
    p.add_argument("--normalise", action=argparse.BooleanOptionalAction, default=True,
                   help="scale raw feature columns with the cache's train statistics")
    p.add_argument("--eval-split", default="val", help="split validated after each epoch")
    p.add_argument("--device", default=None,
                   help="auto (CUDA when present), cpu, cuda[:N] [default: auto, or the "
                        "resumed run's device]")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch's operators [default: torch's choice, one per "
                        "physical core]; fewer on a machine shared with other work")
    p.add_argument("--loader-threads", type=int, default=1, help="dsc loading threads")
    p.add_argument("--prefetch", type=int, default=4, help="batches prepared ahead")
    p.add_argument("--resident", choices=["auto", "on", "off"], default=None,
                   help="keep the splits on the device and gather batches there [default: "
                        "auto, on CUDA when a split fits a quarter of the GPU's memory]")
    p.add_argument("--log-every", type=int, default=50,
                   help="read the loss back every N optimizer steps")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop after N optimizer steps in all (the schedule still spans "
                        "--epochs) and checkpoint there")
    p.add_argument("--seed", type=int, default=0, help="weights, dropout and data order")
    p.add_argument("--out", default=None, help="folder for last.pt [default: no checkpoints]")
    p.add_argument("--json", action="store_true", help="print only the JSON summary")
    p.add_argument("--keys-out", metavar="DIR", default=None,
                   help="audit the data order: each rank appends the keys of every micro-batch "
                        "it trains to DIR/keys-rank<R>.jsonl (reads the key tensor back every "
                        "step: for checks, not for speed)")
    args = p.parse_args(argv)
    if args.cache is None and args.resume is None:
        p.error("--cache is required (unless --resume)")
    for name in ("batch_size", "accumulate", "log_every", "dim", "layers", "heads",
                 "loader_threads", "prefetch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.dropout < 1:
        p.error("--dropout must be in [0, 1)")
    # Every number that reaches torch is checked here, as dsc-train checks its own: a NaN or
    # infinite rate would train NaN weights with exit code 0, a seed past 64 bits raises
    # inside torch.
    for name, lowest, what in (("lr", None, "a positive number"),
                               ("weight_decay", 0.0, "zero or a positive number"),
                               ("clip", 0.0, "zero (off) or a positive number")):
        value = getattr(args, name)
        if not math.isfinite(value) or (value <= 0 if lowest is None else value < lowest):
            p.error(f"--{name.replace('_', '-')} {value}: must be {what}")
    if not 0 <= args.seed < 2**64:
        p.error(f"--seed {args.seed}: must be between 0 and 2**64 - 1")
    for name, highest in (("epochs", 2**62), ("max_steps", 2**62), ("pack", 2**31),
                          ("max_seqs", 2**31), ("threads", 1024), ("loader_threads", 1024),
                          ("prefetch", 1024), ("dim", 1 << 16), ("layers", 1024)):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= highest:
            p.error(f"--{name.replace('_', '-')} {value}: must be between 1 and {highest}")
    if args.warmup is not None and not 0 <= args.warmup <= 2**62:
        p.error(f"--warmup {args.warmup}: must be zero or more steps")
    if args.eval_split == "train":
        p.error("--eval-split train: the split trained on says nothing about generalisation")
    # The loader's own options (--pack against --bucket, --max-seqs without --pack, …) are
    # checked by dsc.Loader, once, and reported as flags by main().
    return args


def graph_refusal(args: argparse.Namespace) -> Optional[str]:
    """Why the run's settings cannot be captured as a graph (``--graph``), or None."""
    if not args.pack and (args.trim or args.bucket):
        return "--graph replays one batch shape: use --pack T, or --no-trim without --bucket"
    if args.compile:
        return ("--graph captures the whole step itself; --compile captures the forward only: "
                "choose one")
    if args.amp == "fp16":
        return ("--graph with --amp fp16: the loss scaler reads its overflow check back every "
                "step, which a captured step cannot; use --amp bf16")
    return None


# --------------------------------------------------------------------------------------------
# What the cache holds: inputs, normalisation, task
# --------------------------------------------------------------------------------------------

def train_column_stats(cache: dsc.Cache) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """The train split's ColumnStats keyed by (role, column name).

    stats.json lists columns in a fixed order (features, categorical, targets, context
    features: FORMAT.md section 9), so walking the schema in that order pairs them up even when
    two roles share a column name.
    """
    split = next((s for s in cache.stats["splits"] if s["split"] == "train"), None)
    if split is None:  # a cache without a train split: fall back to all contexts
        split = cache.stats["splits"][0]
    expected = [(t.role, c) for role in ("features", "categorical", "targets", "context_features")
                for t in cache.schema if t.role == role for c in t.columns]
    columns = split["columns"]
    if [c["name"] for c in columns] == [name for _, name in expected]:
        return {key: col for key, col in zip(expected, columns)}
    # An unexpected layout: match by name and source table (a context column may share its
    # name with a rows column); per-step roles read rows or join tables, the others context.
    by_table = {(col["name"], col["table"]): col for col in columns}
    out = {}
    for role, name in expected:
        tables = ("context",) if role in ("targets", "context_features") else ("rows", "join")
        col = next((by_table[(name, t)] for t in tables if (name, t) in by_table), None)
        if col is not None:
            out[(role, name)] = col
    return out


def _encode(stages: Sequence[Dict[str, Any]], v: float) -> float:
    """Applies an encoding chain to one source value (as the compiler did)."""
    for st in stages:
        op = st["op"]
        if op == "log1p":
            v = math.log1p(v)
        elif op == "zscore":
            v = (v - st["mean"]) / st["std"] if st["std"] else v - st["mean"]
        elif op == "minmax":
            span = st["max"] - st["min"]
            v = (v - st["min"]) / span if span else v - st["min"]
        elif op != "identity":
            raise ValueError(f"unknown encoding stage {op!r}")
    return v


def column_normalisation(encoding: Dict[str, Any],
                         stats: Optional[Dict[str, Any]]) -> Tuple[float, float]:
    """(shift, scale) for one stored column: identity when the encoding is already on a unit
    scale; see the module docstring for the rule."""
    if encoding.get("kind") != "numeric" or not stats or not stats.get("numeric"):
        return 0.0, 1.0
    stages = encoding.get("stages", [])
    if stages and stages[-1]["op"] in ("zscore", "minmax"):
        return 0.0, 1.0
    num = stats["numeric"]
    if all(st["op"] == "identity" for st in stages):
        shift, scale = num["mean"], num["std"]
    else:
        q = {round(x["q"], 2): x["value"] for x in num.get("quantiles", [])}
        if not all(k in q for k in (0.25, 0.5, 0.75)):
            return 0.0, 1.0
        try:
            lo, mid, hi = (_encode(stages, q[k]) for k in (0.25, 0.5, 0.75))
        except (ValueError, OverflowError):  # e.g. log1p of a value <= -1
            return 0.0, 1.0
        shift, scale = mid, (hi - lo) / 1.349
        if not scale > 0 and 0.01 in q and 0.99 in q:  # a spike at the median: use the tails
            try:
                scale = (_encode(stages, q[0.99]) - _encode(stages, q[0.01])) / 4.653
            except (ValueError, OverflowError):
                return 0.0, 1.0
    if not (math.isfinite(shift) and math.isfinite(scale) and scale > 0):
        return 0.0, 1.0
    return float(shift), float(scale)


@dataclass
class Inputs:
    """Which tensors of a batch the network reads, and their sizes."""

    x: Optional[str]                 # per-step features [B, S, F]
    features: int
    categorical: List[str]           # per-step codes [B, S] each
    vocabularies: List[int]          # codes per categorical: null, unknown, vocabulary
    context: Optional[str]           # per-context features [B, C]
    context_features: int
    x_norm: Tuple[List[float], List[float]]
    c_norm: Tuple[List[float], List[float]]
    max_len: int

    @property
    def names(self) -> List[str]:
        return [n for n in [self.x, *self.categorical, self.context, "length"] if n]


def resolve_inputs(cache: dsc.Cache, normalise: bool) -> Inputs:
    stats = train_column_stats(cache) if normalise else {}

    def norm(t: Optional[dsc.TensorInfo]) -> Tuple[List[float], List[float]]:
        if t is None:
            return [], []
        pairs = [column_normalisation(enc, stats.get((t.role, c))) if normalise else (0.0, 1.0)
                 for c, enc in zip(t.columns, t.encodings)]
        return [s for s, _ in pairs], [k for _, k in pairs]

    by_role = lambda role: [t for t in cache.schema if t.role == role]  # noqa: E731
    x = next(iter(by_role("features")), None)
    c = next(iter(by_role("context_features")), None)
    cats = by_role("categorical")
    if x is None and not cats:
        raise SystemExit(f"{cache.path}: no per-step tensor (features or categorical) to train on")
    return Inputs(
        x=x.name if x else None,
        features=x.shape[-1] if x else 0,
        categorical=[t.name for t in cats],
        # The reserved codes 0 (null / padding) and 1 (unknown) come before the vocabulary.
        vocabularies=[cache.vocab_size(t.name) for t in cats],
        context=c.name if c else None,
        context_features=c.shape[0] if c else 0,
        x_norm=norm(x),
        c_norm=norm(c),
        max_len=cache.max_len,
    )


class Task(nn.Module):
    """The loss and the validation metric on the selected columns of ``y`` (a module so that
    its index and scaling tensors follow the model to the device)."""

    def __init__(self, kind: str, columns: List[int], names: List[str], outputs: int,
                 shift: Optional[List[float]] = None, scale: Optional[List[float]] = None):
        super().__init__()
        self.kind, self.names, self.outputs = kind, names, outputs
        self.metric = {"direction": "mean_angular_error_rad", "classification": "accuracy",
                       "regression": "mae"}[kind]
        self.register_buffer("index", torch.tensor(columns, dtype=torch.long), persistent=False)
        n = len(columns)
        self.register_buffer("shift", torch.tensor(shift or [0.0] * n), persistent=False)
        self.register_buffer("scale", torch.tensor(scale or [1.0] * n), persistent=False)

    def forward(self, pred: torch.Tensor, y: torch.Tensor, metric: bool = False):
        """Per-sample loss [B] (and metric [B] when asked), in float32 whatever autocast did."""
        pred, t = pred.float(), y.index_select(1, self.index)
        if self.kind == "direction":
            az, zen = t[:, 0], t[:, 1]
            unit = torch.stack([az.cos() * zen.sin(), az.sin() * zen.sin(), zen.cos()], 1)
            cos = (F.normalize(pred, dim=1, eps=1e-6) * unit).sum(1)
            angle = cos.clamp(-1 + 1e-7, 1 - 1e-7).acos() if metric else None
            return 1 - cos, angle
        if self.kind == "classification":
            cls = t[:, 0].long()
            loss = F.cross_entropy(pred, cls, reduction="none")
            return loss, (pred.argmax(1) == cls).float() if metric else None
        z = (t - self.shift) / self.scale  # regression on standardised targets
        loss = (pred - z).square().mean(1)
        mae = ((pred * self.scale + self.shift) - t).abs().mean(1) if metric else None
        return loss, mae


def resolve_task(cache: dsc.Cache, kind: str, target: Optional[str]) -> Task:
    y = next((t for t in cache.schema if t.role == "targets"), None)
    if y is None:
        raise SystemExit(f"{cache.path}: the cache has no targets tensor y "
                         "(compile it with --targets)")
    names = list(y.columns)
    if target:
        wanted = target.split(",")
    elif kind == "direction":
        wanted = ["azimuth", "zenith"]
    elif kind == "regression" or len(names) == 1:
        wanted = names
    else:
        raise SystemExit(f"y has columns {names}; name the class column with --target")
    missing = [w for w in wanted if w not in names]
    if missing:
        raise SystemExit(f"no target column {missing[0]!r} in y (columns: {names})")
    cols = [names.index(w) for w in wanted]
    if kind == "direction":
        if len(cols) != 2:
            raise SystemExit("--task direction takes two target columns (azimuth, zenith), "
                             f"got {wanted}")
        for i in cols:
            enc = y.encodings[i]
            if enc.get("kind") != "numeric" or any(s["op"] != "identity" for s in enc["stages"]):
                raise SystemExit(f"--task direction needs {names[i]} in radians as stored; "
                                 f"compile it with --encode {names[i]}=identity")
        return Task(kind, cols, wanted, 3)
    if kind == "classification":
        if len(cols) != 1:
            raise SystemExit(f"--task classification takes one target column, got {wanted}")
        return Task(kind, cols, wanted, count_classes(cache, y.name, cols[0], wanted[0]))
    stats = train_column_stats(cache)
    norms = [column_normalisation(y.encodings[i], stats.get(("targets", names[i]))) for i in cols]
    return Task(kind, cols, wanted, len(cols), [s for s, _ in norms], [k for _, k in norms])


def count_classes(cache: dsc.Cache, y_name: str, column: int, name: str) -> int:
    """K = the training split's largest class + 1, checking every value is a class number.

    stats.json has the column's max but cannot prove every value is an integer, so this reads
    the targets of the train split once (the ``columns`` option loads ``y`` alone: fast).
    """
    # The whole split on every rank (rank=0, world_size=1): each needs the same K.
    loader = dsc.Loader(cache, split="train", batch_size=4096, shuffle=False, drop_last=False,
                        columns=[y_name], rank=0, world_size=1)
    top = -1
    for batch in loader:
        # drop_last=False completes the last batch with the epoch's first contexts: skip those.
        v = batch[y_name][: batch.valid, column]
        bad = (v < 0) | (v != v.floor()) | ~torch.isfinite(v)
        if bad.any():
            raise SystemExit(f"--task classification: target {name!r} holds "
                             f"{v[bad][0].item()}, not a class number 0, 1, 2, ...")
        top = max(top, int(v.max().item()))
    if top < 1:
        raise SystemExit(f"--task classification: {name!r} has a single class in the train split")
    return top + 1


# --------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------

def step_mask(length: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, S] True at stored steps. A context with no stored step keeps step 0 so that attention
    and pooling never see an empty set (which would give NaN)."""
    return torch.arange(steps, device=length.device) < length.clamp(min=1).unsqueeze(1)


def is_packed(batch: Dict[str, torch.Tensor]) -> bool:
    return "cu_seqlens" in batch


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


class PackedView:
    """How one packed batch's tokens (``[T, ...]``) map to its sequences: the ``[S, L]`` view
    (sequence ``seq_idx``, step ``position``) that keeps each sequence to itself.

    Scattering into the view and gathering back are one index each; the unused tail of the
    pack (``seq_idx == S``) goes to a spare row that is dropped, and comes back as zeros."""

    def __init__(self, batch: Dict[str, torch.Tensor], max_len: int, attention: str):
        self.seq = batch["seq_idx"].long()                     # [T], S for the unused tail
        self.length = batch["length"]                          # [S] (0 for unused rows)
        self.seqs, self.max_len = self.length.shape[0], max_len
        self.tokens = self.seq.shape[0]
        spare = self.seqs * max_len
        self.index = torch.where(self.seq < self.seqs, self.seq * max_len + batch["position"].long(),
                                 torch.full_like(self.seq, spare))
        self.mask = step_mask(self.length, max_len)            # [S, L]
        self.attention = attention
        if attention == "varlen":
            # varlen_attn writes only tokens inside a segment, and garbage in the tail would
            # reach the weight gradients as NaN: cover the tail with segments of at most L
            # tokens (max_seqlen stays L; the tail's values are zeros, so its outputs are finite).
            tail = batch["num_tokens"].to(torch.int32) + max_len * torch.arange(
                1, -(-self.tokens // max_len) + 1, device=self.seq.device, dtype=torch.int32)
            self.cu = torch.cat([batch["cu_seqlens"], tail.clamp(max=self.tokens)])

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """[T, ...] tokens to the [S, L, ...] view (zeros where no token is)."""
        out = x.new_zeros((self.seqs * self.max_len + 1, *x.shape[1:]))
        out = out.index_copy(0, self.index, x)
        return out[:-1].view(self.seqs, self.max_len, *x.shape[1:])

    def gather(self, v: torch.Tensor) -> torch.Tensor:
        """The [S, L, ...] view back to [T, ...] tokens (the tail gets zeros)."""
        flat = v.reshape(self.seqs * self.max_len, *v.shape[2:])
        flat = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))])
        return flat.index_select(0, self.index)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               dropout: float) -> torch.Tensor:
        """Attention of each token to the tokens of its own sequence; q, k, v [T, heads, dh]."""
        if self.attention == "varlen" and dropout == 0.0:
            from torch.nn.attention.varlen import varlen_attn
            return varlen_attn(q, k, v, self.cu, self.cu, self.max_len, self.max_len)
        # [S, heads, L, dh] with the padding mask of padded batches.
        qs, ks, vs = (self.scatter(t).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=self.mask[:, None, None, :],
                                           dropout_p=dropout)
        return self.gather(a.transpose(1, 2))

    def pool(self, h: torch.Tensor) -> torch.Tensor:
        """Mean over each sequence's tokens: [T, D] to [S, D] (float32 sums)."""
        sums = h.new_zeros((self.seqs + 1, h.shape[-1]), dtype=torch.float32)
        sums = sums.index_add(0, self.seq, h.float())[: self.seqs]
        return sums / self.length.clamp(min=1).unsqueeze(1).float()


class Embed(nn.Module):
    """Per-step inputs to [B, S, dim] (a pack's to [T, dim]): normalised features projected,
    plus one embedding per categorical tensor."""

    def __init__(self, inp: Inputs, dim: int):
        super().__init__()
        self.inp = inp
        self.proj = nn.Linear(inp.features, dim) if inp.x else None
        self.register_buffer("x_shift", torch.tensor(inp.x_norm[0]).view(1, 1, -1))
        self.register_buffer("x_scale", torch.tensor(inp.x_norm[1]).view(1, 1, -1))
        # padding_idx=0: null and padding steps contribute nothing and get no gradient.
        self.cats = nn.ModuleList(nn.Embedding(v, dim, padding_idx=0) for v in inp.vocabularies)
        for emb in self.cats:
            # nn.Embedding starts at N(0, 1): thousands of random unit vectors (one per sensor,
            # say) would drown the projected features, and rare codes never learn them away.
            # Start small, as the positions do, and let training grow what is useful.
            nn.init.normal_(emb.weight, std=0.02)
            with torch.no_grad():
                emb.weight[0].zero_()

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        h = None
        if self.proj is not None:
            # The buffers are [1, 1, F] (as checkpoints hold them); [F] fits [B, S, F] and [T, F].
            x = (batch[self.inp.x] - self.x_shift.view(-1)) / self.x_scale.view(-1)
            h = self.proj(x)
        for name, emb in zip(self.inp.categorical, self.cats):
            e = emb(batch[name])  # int32 codes index directly
            h = e if h is None else h + e
        return h


class Head(nn.Module):
    """Pooled sequence (+ normalised per-context features) to the outputs."""

    def __init__(self, inp: Inputs, dim: int, outputs: int):
        super().__init__()
        self.inp = inp
        self.register_buffer("c_shift", torch.tensor(inp.c_norm[0]).view(1, -1))
        self.register_buffer("c_scale", torch.tensor(inp.c_norm[1]).view(1, -1))
        self.net = nn.Sequential(nn.Linear(dim + inp.context_features, dim), nn.GELU(),
                                 nn.Linear(dim, outputs))

    def forward(self, pooled: torch.Tensor, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if self.inp.context:
            c = (batch[self.inp.context] - self.c_shift) / self.c_scale
            pooled = torch.cat([pooled, c.to(pooled.dtype)], 1)
        return self.net(pooled)


class Block(nn.Module):
    """Pre-norm encoder layer: h + attn(norm(h)), then h + mlp(norm(h))."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        qkv = self.qkv(self.norm1(h)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, heads, S, d/heads]
        # attn_mask [B, 1, 1, S]: every query attends to the stored steps only.
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        h = h + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, d)))
        return h + self.drop(self.mlp(self.norm2(h)))

    def forward_packed(self, h: torch.Tensor, view: PackedView) -> torch.Tensor:
        """The same layer on a pack's tokens [T, D]: every product but attention runs on the
        tokens alone, none on padding."""
        t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(t, 3, self.heads, d // self.heads).unbind(1)
        a = view.attend(q, k, v, self.dropout if self.training else 0.0)
        h = h + self.drop(self.proj(a.reshape(t, d)))
        return h + self.drop(self.mlp(self.norm2(h)))


class Transformer(nn.Module):
    def __init__(self, inp: Inputs, dim: int, layers: int, heads: int, dropout: float,
                 outputs: int, attention: str = "padded"):
        super().__init__()
        self.embed = Embed(inp, dim)
        self.positions = nn.Parameter(torch.randn(inp.max_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = Head(inp, dim, outputs)
        self.max_len, self.attention = inp.max_len, attention

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if is_packed(batch):
            return self.forward_packed(batch)
        h = self.embed(batch)
        s = h.shape[1]  # trimmed batches have S <= L
        h = h + self.positions[:s]
        mask = step_mask(batch["length"], s)
        attn_mask = mask[:, None, None, :]
        for blk in self.blocks:
            h = blk(h, attn_mask)
        h = self.norm(h)
        # Masked mean over the stored steps (float32 sums even under autocast).
        w = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * w).sum(1, dtype=torch.float32) / w.sum(1, dtype=torch.float32)
        return self.head(pooled.to(h.dtype), batch)

    def forward_packed(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """[S, outputs] for a pack: rows past ``num_seqs`` are unused (their inputs are
        zeros)."""
        view = PackedView(batch, self.max_len, self.attention)
        h = self.embed(batch) + self.positions[batch["position"].long()]
        for blk in self.blocks:
            h = blk.forward_packed(h, view)
        h = self.norm(h)
        return self.head(view.pool(h).to(h.dtype), batch)


class GRU(nn.Module):
    def __init__(self, inp: Inputs, dim: int, layers: int, dropout: float, outputs: int):
        super().__init__()
        self.embed = Embed(inp, dim)
        self.gru = nn.GRU(dim, dim, num_layers=layers, batch_first=True,
                          dropout=dropout if layers > 1 else 0.0)
        self.head = Head(inp, dim, outputs)
        self.max_len = inp.max_len

    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.embed(batch)
        if is_packed(batch):
            # The pack's sequences as a [S, L] view; the GRU reads it as it reads a padded batch.
            h = PackedView(batch, self.max_len, "padded").scatter(h)
        # The recurrence runs in float32 whatever --amp says (as in dsc-train): errors would
        # compound over up to L steps, and the GRU is a small share of the work.
        with torch.autocast(h.device.type, enabled=False):
            out, _ = self.gru(h.float())
        # A forward GRU's output at step t ignores later (padding) steps, so reading it at the
        # last stored step is exact without pack_padded_sequence, which would need the lengths
        # on the host (a device sync every step).
        last = (batch["length"].long() - 1).clamp(min=0)
        pooled = out.gather(1, last.view(-1, 1, 1).expand(-1, 1, out.shape[-1])).squeeze(1)
        return self.head(pooled, batch)


def attention_kind(args: argparse.Namespace, device: torch.device, amp: str) -> str:
    """``varlen`` or ``padded``: how packed batches attend (see the module docstring)."""
    choice = getattr(args, "attention", None) or "auto"
    runs = device.type == "cuda" and amp in ("bf16", "fp16") and varlen_available()
    if choice == "varlen" and not runs:
        raise SystemExit("--attention varlen needs CUDA, --amp bf16 or fp16 and "
                         "torch.nn.attention.varlen (PyTorch 2.9 or later)")
    if choice == "auto":
        return "varlen" if runs else "padded"
    return choice


def build_model(args: argparse.Namespace, inp: Inputs, outputs: int,
                attention: str = "padded") -> nn.Module:
    if args.model == "transformer":
        if args.dim % args.heads:
            raise SystemExit(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
        return Transformer(inp, args.dim, args.layers, args.heads, args.dropout, outputs,
                           attention)
    return GRU(inp, args.dim, args.layers, args.dropout, outputs)


# --------------------------------------------------------------------------------------------
# Optimisation
# --------------------------------------------------------------------------------------------

def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak rate before optimizer step ``step`` (0-based): linear warmup, then
    a cosine decay to a tenth of the peak (dsc-train's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, args: argparse.Namespace, device: torch.device,
                    graph: bool = False):
    # Decay matrices (linear weights, embeddings, positions), not biases and norm gains.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    if graph:
        # A captured step: the learning rate is one device tensor that both groups share and the
        # step rewrites in place; fused AdamW takes it (on the CPU too), and on CUDA keeps its
        # step counts on the device (capturable).
        lr = torch.tensor(args.lr, dtype=torch.float32, device=device)
        return torch.optim.AdamW(groups, lr=lr, fused=True, capturable=device.type == "cuda")
    # fused AdamW is one kernel per step on CUDA; the CPU keeps the default implementation.
    return torch.optim.AdamW(groups, lr=args.lr, fused=device.type == "cuda")


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

class StepTimer:
    """Where a window's time went: data wait (host), host-to-device and compute.

    On CUDA three events per micro-batch (before the copy, after it, after the step's work) are
    read only when the window closes, right after the loss read-back has drained the queue, so
    the timing adds no sync of its own.
    """

    def __init__(self, device: torch.device, per_step: bool = True):
        """``per_step`` False (a captured step, where the copy is inside the graph): two events
        per window, around all of its device work, and no h2d share."""
        self.cuda = device.type == "cuda"
        self.per_step = per_step
        self.events: List[Tuple[Any, Any, Any]] = []
        self.window: Optional[Any] = None
        self.totals = dict(wall=0.0, data_wait=0.0, h2d=0.0, compute=0.0, samples=0)
        self.reset()

    def reset(self) -> None:
        self.start_time, self.used = time.perf_counter(), 0
        self.cur = dict(data_wait=0.0, samples=0)
        if self.cuda and not self.per_step:
            self.window = torch.cuda.Event(enable_timing=True)
            self.window.record()

    def _event(self, i: int):
        if self.used == len(self.events):
            self.events.append(tuple(torch.cuda.Event(enable_timing=True) for _ in range(3)))
        return self.events[self.used][i]

    def before_copy(self) -> None:
        if self.cuda and self.per_step:
            self._event(0).record()

    def after_copy(self) -> None:
        if self.cuda and self.per_step:
            self._event(1).record()

    def step_done(self, samples: int) -> None:
        self.cur["samples"] += samples
        if self.cuda and self.per_step:
            self._event(2).record()
            self.used += 1

    def close(self) -> Dict[str, float]:
        """Ends the window: its shares, also added to the run totals."""
        h2d = compute = 0.0
        if self.window is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            compute = self.window.elapsed_time(end) / 1e3
        elif self.cuda and self.used:
            self.events[self.used - 1][2].synchronize()
            for start, copied, done in self.events[: self.used]:
                h2d += start.elapsed_time(copied) / 1e3
                compute += copied.elapsed_time(done) / 1e3
        wall = time.perf_counter() - self.start_time
        if not self.cuda:
            compute = max(0.0, wall - self.cur["data_wait"])
        w = dict(wall=wall, data_wait=self.cur["data_wait"], h2d=h2d, compute=compute,
                 samples=self.cur["samples"])
        for k, v in w.items():
            self.totals[k] += v
        self.reset()
        return shares(w)


def shares(t: Dict[str, float]) -> Dict[str, float]:
    wall = max(t["wall"], 1e-12)
    return dict(samples_per_s=t["samples"] / wall, data_wait_share=t["data_wait"] / wall,
                h2d_share=t["h2d"] / wall, compute_share=t["compute"] / wall)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# Several processes (torchrun)
# --------------------------------------------------------------------------------------------

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


def auto_device() -> str:
    """What ``--device auto`` picks on this machine. Every choice made from the machine goes
    through these functions, so that a test can stand in for another machine."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_amp(device: torch.device) -> str:
    """What ``--amp`` picks when not given: bf16 on CUDA, none elsewhere."""
    return "bf16" if device.type == "cuda" else "none"


def pick_device(name: Optional[str], resumed: bool = False) -> torch.device:
    if name in (None, "auto"):
        return torch.device(auto_device())
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        if resumed:
            raise SystemExit(f"the checkpoint's run trained on {name}, and torch sees no CUDA "
                             "device here: pass --device cpu to continue it on the CPU")
        raise SystemExit(f"--device {name}: torch sees no CUDA device")
    return device


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


def save_checkpoint(path: str, state: Dict[str, Any]) -> None:
    # Write-then-rename: a run killed while saving leaves the previous last.pt intact.
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def to_device(batch: dsc.Batch, names: List[str], device: torch.device) -> Dict[str, torch.Tensor]:
    """The tensors the step needs, as a plain dict (which torch.compile guards cheaply), copied
    without blocking on CUDA (the loader put them in pinned memory)."""
    if device.type == "cpu":
        return {n: batch[n] for n in names}
    return {n: batch[n].to(device, non_blocking=True) for n in names}


PACK_TENSORS = ["cu_seqlens", "seq_idx", "position", "num_seqs", "num_tokens"]


def placement(args: argparse.Namespace, device: torch.device) -> Dict[str, Any]:
    """Where the loader delivers batches: on the GPU (resident split or pinned blocks), or in
    place on the CPU."""
    resident = {None: None, "auto": None, "on": True, "off": False}[getattr(args, "resident", None)]
    if device.type == "cpu":
        return dict(resident=resident if resident else False)
    return dict(device=device, resident=resident)


def batching(args: argparse.Namespace) -> Dict[str, Any]:
    """The loader's keywords for padded (trimmed, bucketed) or packed batches: the shape's flags
    are all passed, so that dsc.Loader refuses those that exclude each other."""
    shape = dict(bucket=args.bucket, max_seqs=getattr(args, "max_seqs", None))
    if getattr(args, "pack", None):
        return dict(pack=args.pack, **shape)
    # The rounding of trimmed lengths is the loader's choice from the device unless the run
    # recorded one (a resume keeps the shapes it trained on).
    multiple = getattr(args, "trim_multiple", None)
    return dict(batch_size=args.batch_size, trim=args.trim, **shape,
                **({} if multiple is None else dict(trim_multiple=multiple)))


def mean_loss(task: Task, pred: torch.Tensor, b: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The mean loss over the batch's contexts: for a pack, over its ``num_seqs`` leading rows
    (the rest are unused), so that a step weighs each context as a padded batch does."""
    per = task(pred, b["y"])[0]
    if not is_packed(b):
        return per.mean()
    n = b["num_seqs"].squeeze(0)
    used = torch.arange(per.shape[0], device=per.device) < n
    return torch.where(used, per, 0.0).sum() / n.clamp(min=1)


def compiled_frames() -> int:
    """Frames torch.compile has compiled in this process (a recompile counts again)."""
    from torch._dynamo.utils import counters
    return int(counters["frames"]["ok"])


class WholeStep:
    """The training step as device work alone, for ``--graph``: the batch's gather from the
    loader's static buffers (``dsc.Loader(static=True)``), forward, loss, backward, and after
    every ``--accumulate`` micro-steps clipping, the learning rate of the schedule (from a
    device table indexed by a device step counter) and fused AdamW (``capturable``, its LR a
    device tensor), with the running losses kept on the device. Nothing in it reads back or
    branches on data, so on CUDA it is captured as CUDA graphs after ``WARMUP`` eager steps
    (which are real training steps) and each later micro-step is one replay: with
    ``--accumulate 1`` one graph; otherwise one for the micro-step and one for the update. On
    the CPU the same functions run without capture, which is how the tests check that they
    train as the eager loop does."""

    WARMUP = 3  # optimizer steps run eagerly before capture (lazy state, cuBLAS workspaces)

    def __init__(self, model: nn.Module, task: Task, optimizer: torch.optim.Optimizer,
                 loader: dsc.Loader, args: argparse.Namespace, amp_dtype: Optional[torch.dtype],
                 device: torch.device, rates: List[float], window_loss: torch.Tensor,
                 epoch_loss: torch.Tensor, done: int, distributed: bool = False):
        self.model, self.task, self.opt, self.loader = model, task, optimizer, loader
        self.accumulate, self.clip = args.accumulate, args.clip
        # No cast cache: a captured step casts the weights in every replay, as it must.
        self.autocast = lambda: torch.autocast(device.type, dtype=amp_dtype,  # noqa: E731
                                               enabled=amp_dtype is not None,
                                               cache_enabled=False)
        self.cuda = device.type == "cuda"
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.window_loss, self.epoch_loss = window_loss, epoch_loss
        # The learning rate of every optimizer step, and the steps taken: the schedule runs on
        # the device, so a captured step needs no new value from the host.
        self.rates = torch.tensor(rates, dtype=torch.float32, device=device)
        self.step = torch.full((), done, dtype=torch.long, device=device)
        self.lr = optimizer.param_groups[0]["lr"]
        # DDP inside a graph wants its buckets built first: at least 11 eager iterations
        # (PyTorch's CUDA graphs notes).
        warmup = max(self.WARMUP, 11) if distributed else self.WARMUP
        self.eager_left = warmup if self.cuda else None
        self.graphs: Optional[Tuple[Any, Optional[Any]]] = None
        self.side = torch.cuda.Stream(device) if self.cuda else None

    def micro(self) -> None:
        b = self.loader.gather()
        with self.autocast():
            pred = self.model(b)
        loss = mean_loss(self.task, pred, b) / self.accumulate
        loss.backward()
        self.window_loss += loss.detach()
        self.epoch_loss += loss.detach()

    def update(self) -> None:
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        self.lr.copy_(self.rates.index_select(0, self.step.view(1)).squeeze(0))
        self.opt.step()
        # Zeroed in place: the gradients keep their addresses, which the graph captured.
        self.opt.zero_grad(set_to_none=False)
        self.step += 1

    def __call__(self, last: bool) -> None:
        """One micro-step on the batch the loader's ``next()`` just placed; ``last``: it ends
        an optimizer step."""
        if self.graphs is not None:
            micro, update = self.graphs
            micro.replay()
            if last and update is not None:
                update.replay()
            return
        if self.eager_left is not None and self.eager_left == 0:
            # The first micro-step of an optimizer step after the warm-up: capture, then replay
            # (a capture records the work without running it).
            self.graphs = self.capture()
            self(last)
            return
        if self.cuda:
            # Warm-up on a side stream, as graph capture wants; it waits for the index copy.
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                self.micro()
                if last:
                    self.update()
            torch.cuda.current_stream().wait_stream(self.side)
        else:
            self.micro()
            if last:
                self.update()
        if last and self.eager_left is not None:
            self.eager_left -= 1

    def capture(self) -> Tuple[Any, Optional[Any]]:
        # thread_local: the loader's threads (the host path) wait for their copies' events
        # meanwhile, which a global capture would take for unsafe calls into the stream.
        try:
            micro = torch.cuda.CUDAGraph()
            with torch.cuda.graph(micro, capture_error_mode="thread_local"):
                self.micro()
                if self.accumulate == 1:
                    self.update()
            if self.accumulate == 1:
                return micro, None
            update = torch.cuda.CUDAGraph()
            with torch.cuda.graph(update, capture_error_mode="thread_local"):
                self.update()
            return micro, update
        except RuntimeError as e:
            raise SystemExit(f"capturing the training step as a CUDA graph failed ({e}); "
                             "train without --graph") from e


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, cache: dsc.Cache, args: argparse.Namespace,
             device: torch.device, names: List[str], autocast, ranks: Ranks,
             split: Optional[str] = None) -> Tuple[float, float]:
    """Mean loss and metric over the whole of `split` (default: --eval-split), each context
    counted once: the ranks read disjoint slices of it (the loader's default under
    torch.distributed) and their sums are added."""
    loader = dsc.Loader(cache, split=split or args.eval_split, shuffle=False, drop_last=False,
                        num_threads=args.loader_threads, **placement(args, device),
                        **batching(args))
    loss_sum = torch.zeros((), device=device)
    metric_sum = torch.zeros((), device=device)
    seen = 0
    model.eval()
    for batch in loader:
        # drop_last=False fills the last batch up with the split's first contexts (a packed
        # epoch repeats its first packs), so that every batch is full: count only the `valid`
        # rows, seen for the first time (a pack's leading rows are its sequences).
        rows = batch.valid
        b = to_device(batch, names, device)
        with autocast():
            pred = model(b)
        loss, metric = task(pred[:rows], b["y"][:rows], metric=True)
        loss_sum += loss.sum()
        metric_sum += metric.sum()
        seen += rows
    model.train()
    # The one read-back of validation, summed over the ranks.
    loss, metric, seen = ranks.sum([loss_sum, metric_sum, seen], device)
    return loss / max(seen, 1), metric / max(seen, 1)


def record_keys(out, batch: dsc.Batch, epoch: int, micro: int) -> None:
    """Appends the keys of a trained micro-batch (``--keys-out``): its valid rows, a pack's
    sequences."""
    keys = batch.get("key")
    if keys is None:
        raise SystemExit("--keys-out: these batches carry no key tensor (with --graph the step "
                         "gathers them itself); audit without --graph")
    rows = keys[: batch.valid].tolist()
    out.write(json.dumps(dict(epoch=epoch, micro=micro, keys=rows)) + "\n")


def train(args: argparse.Namespace) -> Dict[str, Any]:
    quiet = args.json or not first_rank()
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    regrouped: Optional[Dict[str, Any]] = None  # a resume on another number of ranks
    ckpt = None
    changed: Dict[str, Tuple[Any, Any]] = {}  # machine choices a resume changes, as asked
    if args.resume:
        # weights_only: the checkpoint holds tensors and plain Python values only.
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
        saved = dict(ckpt["args"])
        for k in RESUME_FROM_COMMAND_LINE:
            saved[k] = getattr(args, k)
        for k in ("epochs", "cache"):
            if getattr(args, k) is not None:
                saved[k] = getattr(args, k)
        if args.out is None:  # keep writing next to the checkpoint resumed from
            saved["out"] = os.path.dirname(args.resume) or "."
        # Checkpoints from before packing trained padded batches.
        for k, v in (("pack", None), ("max_seqs", None), ("attention", None), ("graph", None)):
            saved.setdefault(k, v)
        # What the run chose from its machine stays chosen, unless the command line asks for
        # another (and then the run says so below).
        for k in ("device", "amp", "attention"):
            given = getattr(args, k, None)
            if given is not None and given != saved.get(k):
                changed[k] = (saved.get(k), given)
                saved[k] = given
        if args.graph is not None and args.graph != bool(saved.get("graph")):
            # The captured step keeps its schedule on the device, the eager one in LambdaLR:
            # neither continues the other's.
            raise SystemExit(f"--resume {args.resume}: the run trained with"
                             f"{'' if saved.get('graph') else 'out'} --graph; resume it as it "
                             "was (on the CPU a captured step runs uncaptured), or start a new "
                             "run")
        # Residency changes no batch (both paths give the same bytes): it is decided again
        # for this machine's memory, unless given, and reported when it differs.
        recorded_resident = saved.get("resident")
        saved["resident"] = args.resident
        args = argparse.Namespace(**saved)
        before = saved.get("world_size", 1)
        if before != started_by_torchrun():
            regrouped = rebatch(args, before, started_by_torchrun())
    if args.epochs is None:
        args.epochs = 1

    device = pick_device(args.device, resumed=ckpt is not None and "device" not in changed)
    ranks, device = start_ranks(device, bool(args.graph))
    on_cuda = device.type == "cuda"
    # Several ranks each take the GPU of their LOCAL_RANK: the run records the kind.
    args.device = device.type if ranks.world > 1 else str(device)
    args.world_size = ranks.world
    if args.threads:
        # torch's default, one thread per physical core, is the fastest on an idle machine (the
        # loader's thread needs little CPU). On a shared one ask for fewer: torch's threads wait
        # for each other at every operator, so one that loses its core stalls them all. (Default
        # transformer, 2 cores: 0.22 s a step with 2 threads idle, but 0.7-1.5 s with 2 and
        # 0.37 s with 1 thread while a compiler ran beside it.)
        torch.set_num_threads(args.threads)
    amp = args.amp = args.amp or auto_amp(device)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[amp]
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 products on tensor cores
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    # A resumed run reads the generation of the cache it started on, whatever was appended
    # since (dsc append): its statistics (the inputs' scaling) and its order.
    read = (ckpt or {}).get("loader", {}).get("content_id")
    cache = dsc.open(args.cache, generation=read)
    if args.eval_split not in cache.splits and args.eval_split != "val":
        # `val` may be absent (a cache compiled without one is trained without validation).
        raise SystemExit(f"train.py: --eval-split {args.eval_split}: the cache has no such "
                         f"split (it has {sorted(cache.splits)})")
    task = resolve_task(cache, args.task, args.target).to(device)
    inp = resolve_inputs(cache, args.normalise)
    names = inp.names + ["y"] + (PACK_TENSORS if args.pack else [])

    # Same seed, same initial weights; the data order has its own seed inside the loader.
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    attention = args.attention = attention_kind(args, device, amp)
    args.graph = bool(args.graph)
    refusal = graph_refusal(args) if args.graph else None
    if refusal:
        raise SystemExit(refusal)
    model = build_model(args, inp, task.outputs, attention).to(device)
    net: nn.Module = model  # what the steps call: the model, or DDP around it
    ddp = None
    if ranks.world > 1:
        from torch.nn.parallel import DistributedDataParallel
        # DDP starts every rank from rank 0's weights and averages the gradients in backward.
        # No buffer broadcast: the buffers (normalisation) never change, and a broadcast in
        # every forward would make validation, whose batches are local, a collective.
        # Captured steps need DDP built on a side stream (PyTorch's CUDA graphs recipe).
        side = torch.cuda.Stream(device) if on_cuda and args.graph else None
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            ddp = DistributedDataParallel(model, device_ids=[device.index] if on_cuda else None,
                                          broadcast_buffers=False)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        net = ddp
    if args.compile and args.pack:
        # One static shape: compile it once, never for dynamic sizes, and on CUDA replay the
        # step's kernels as CUDA graphs (one launch instead of hundreds); under DDP without
        # them, as DDP's bucketed all-reduce splits the compiled graph.
        step_model = torch.compile(net, dynamic=False,
                                   mode="reduce-overhead" if on_cuda and ddp is None else None)
    else:
        step_model = torch.compile(net) if args.compile else net
    # Validation calls the model without DDP: each rank evaluates its own slice, and nothing
    # of it is synchronised but the sums at the end.
    eval_model = step_model if ddp is None else (torch.compile(model) if args.compile else model)
    if ranks.world > 1:
        # Every rank built the same weights (and DDP broadcasts rank 0's); dropout draws a
        # stream of each rank's own from here.
        torch.manual_seed(rank_seed(args.seed, ranks.rank))
    optimizer = build_optimizer(model, args, device, graph=args.graph)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    if amp == "fp16":
        # The scaler skips the update of a step whose gradients overflowed (the first ones, while
        # it finds its scale), and torch then warns that the schedule stepped alone: expected.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")

    where = placement(args, device)
    if args.graph:
        # Every batch in the loader's static buffers on the device; from a resident split
        # next() copies only the index and the captured step gathers the batch itself.
        where["device"] = device
        resident = dsc.Loader(cache, split="train", device=device, resident=where["resident"],
                              **batching(args)).resident
        where.update(static=True, gather_in_step=resident)
    loader = dsc.Loader(cache, split="train", shuffle=True, seed=args.seed, drop_last=True,
                        num_threads=args.loader_threads, prefetch=args.prefetch,
                        **where, **batching(args))
    if not args.pack:
        args.trim_multiple = loader.trim_multiple
    args.resident = "on" if loader.resident else "off"
    if ckpt is not None and recorded_resident in ("on", "off") and recorded_resident != args.resident:
        changed["resident"] = (recorded_resident, args.resident)
    # Whole optimizer steps only: leftover micro-batches of an epoch are not trained.
    micro_epoch = len(loader) // args.accumulate * args.accumulate
    if regrouped is not None:
        say(regrouped["said"])
    if micro_epoch == 0:
        unit = f"packs of {args.pack} tokens" if args.pack else f"batches of {args.batch_size}"
        raise SystemExit(f"the train split has {len(loader)} full {unit}, "
                         f"fewer than --accumulate {args.accumulate}")
    steps_epoch = micro_epoch // args.accumulate
    # The schedule spans the run's optimizer steps. A resume at another global batch spans the
    # steps taken plus those left at the new batch, with the run's warmup (set below).
    plan = dict(total=steps_epoch * args.epochs)
    plan["warmup"] = args.warmup if args.warmup is not None else plan["total"] // 20
    schedule = (None if args.graph else torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, plan["warmup"], plan["total"])))

    # `micro`: micro-batches of the epoch trained; `epoch_micro` the same since the epoch's start
    # (they differ after a resume at another global batch, which counts `micro` afresh).
    pos = dict(epoch=0, micro=0, epoch_micro=0, optimizer_steps=0, history=[])
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if schedule is not None and ckpt["schedule"]:
            schedule.load_state_dict(ckpt["schedule"])
        scaler.load_state_dict(ckpt["scaler"])
        pos = ckpt["position"]
        pos.setdefault("epoch_micro", pos["micro"])
        # The loader continues after the last batch the saved run trained on (set_epoch below is
        # then a no-op, so it keeps that position).
        loader.load_state_dict(ckpt["loader"])
        if regrouped is not None and len(set(regrouped["global_batch"])) > 1:
            # At another global batch the loader goes on from the same context, its steps
            # counted afresh in the rest of the epoch, and the schedule ends when the steps
            # left at this batch do.
            pos["micro"] = 0
            left = len(loader) // args.accumulate + steps_epoch * (args.epochs - pos["epoch"] - 1)
            plan["warmup"] = pos.get("plan", plan)["warmup"]
            plan["total"] = pos["optimizer_steps"] + left
        # Each rank its own random state where the ranks are the checkpoint's; a rank the
        # checkpoint did not have starts a stream of its own (only dropout draws from it).
        rngs = ckpt.get("rng_ranks") or [ckpt["rng"]]
        set_rng_state(rngs[ranks.rank % len(rngs)])
        if ranks.rank >= len(rngs):
            torch.manual_seed(rank_seed(args.seed, ranks.rank, pos["optimizer_steps"]))
    pos["plan"] = plan
    total_steps = plan["total"]
    # The learning rate of every optimizer step; a captured step reads it from the device.
    rates = [args.lr * lr_factor(s, plan["warmup"], total_steps) for s in range(total_steps + 1)]

    if args.graph:
        # The optimizer's groups share one device learning rate (a loaded state brings its own).
        lr = torch.tensor(rates[pos["optimizer_steps"]], dtype=torch.float32, device=device)
        for group in optimizer.param_groups:
            group["lr"] = lr

    for k, (before, now) in changed.items():
        say(f"resuming with {k} {now} (the checkpoint's run had {before}): as asked on the "
            "command line" + (", decided for this machine; the batches are the same"
                              if k == "resident" else ""))
    params = sum(p.numel() for p in model.parameters())
    say(f"{args.model} · {params:,} parameters · task {args.task} ({task.metric}) · "
        f"device {device} · amp {amp} · "
        + (f"{ranks.world} ranks x " if ranks.world > 1 else "") + f"{len(loader)} "
        + (f"packs of {args.pack} tokens ({attention} attention)" if args.pack
           else f"batches of {args.batch_size}")
        + f"/epoch · {steps_epoch} optimizer steps/epoch"
        + (" · whole step " + ("captured as CUDA graphs" if on_cuda else "uncaptured (CPU)")
           if args.graph else ""))
    ckpt_path = os.path.join(args.out, "last.pt") if args.out else None
    if ckpt_path:
        os.makedirs(args.out, exist_ok=True)

    def checkpoint() -> None:
        """Written by the first rank; every rank calls it (their random states are gathered)."""
        if not ckpt_path:
            return
        rngs = ranks.gather(rng_state())
        if ranks.main:
            save_checkpoint(ckpt_path, {
                "args": vars(args), "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict() if schedule is not None else {},
                "scaler": scaler.state_dict(), "position": pos, "rng": rngs[0],
                "rng_ranks": rngs, "loader": loader.state_dict(),
            })

    timer = StepTimer(device, per_step=not args.graph)
    logged: List[Dict[str, Any]] = []
    # Padded training batches by sequence length: the shapes the steps saw (packs have one).
    batch_lens: Dict[int, int] = {}
    stopped = args.max_steps is not None and pos["optimizer_steps"] >= args.max_steps
    # Loss sums stay on the device, each one tensor for the whole run (a captured step adds to
    # it in place); .item() on them is the only read-back in training.
    window_loss = torch.zeros((), device=device)
    epoch_loss = torch.zeros((), device=device)
    whole = (WholeStep(net, task, optimizer, loader, args, amp_dtype, device, rates,
                       window_loss, epoch_loss, pos["optimizer_steps"], ddp is not None)
             if args.graph else None)
    keys_out = None
    if args.keys_out:
        os.makedirs(args.keys_out, exist_ok=True)
        keys_out = open(os.path.join(args.keys_out, f"keys-rank{ranks.rank}.jsonl"), "a")
    start = time.perf_counter()
    model.train()

    while pos["epoch"] < args.epochs and not stopped:
        epoch = pos["epoch"]
        loader.set_epoch(epoch)
        # The epoch's micro-batches from where the loader stands (after a resume at another
        # global batch, the rest of the epoch).
        micro_epoch = len(loader) // args.accumulate * args.accumulate
        # A resumed epoch starts from the sum saved at the stop, so its mean is the whole
        # epoch's.
        window_loss.zero_()
        window_steps = 0
        epoch_loss.fill_(pos.get("epoch_loss", 0.0))
        timer.reset()
        epoch_totals = dict(timer.totals)
        batches = iter(loader)

        def close_window() -> None:
            nonlocal window_steps
            # The window's loss and samples over all ranks: one all-reduce and read-back.
            loss, samples = ranks.sum([window_loss, timer.cur["samples"]], device)
            loss /= ranks.world * max(window_steps, 1)
            timer.cur["samples"] = int(samples)
            sh = timer.close()
            # The rate of the next optimizer step, as the eager schedule reports it.
            lr = (rates[min(pos["optimizer_steps"], total_steps)] if schedule is None
                  else schedule.get_last_lr()[0])
            logged.append(dict(step=pos["optimizer_steps"], train_loss=loss, lr=lr, **sh))
            say(f"epoch {epoch} step {pos['optimizer_steps']} · loss {loss:.4f} · lr {lr:.2e} · "
                f"{sh['samples_per_s']:.0f} samples/s · "
                f"data wait {100 * sh['data_wait_share']:.1f}% · h2d {100 * sh['h2d_share']:.1f}%"
                f" · compute {100 * sh['compute_share']:.1f}%")
            window_loss.zero_()
            window_steps = 0

        while pos["micro"] < micro_epoch:
            t0, gpu0 = time.perf_counter(), loader.device_wait_s
            batch = next(batches, None)
            if batch is None:
                # An epoch resumed at another global batch may hold one step fewer than it
                # counted: every rank sees the same end.
                break
            # Time in next() less its waits for the GPU to finish with a buffer (a busy GPU
            # holding the loader back, not a data stall).
            timer.cur["data_wait"] += (time.perf_counter() - t0) - (loader.device_wait_s - gpu0)
            if not args.pack:
                batch_lens[batch.seq_len] = batch_lens.get(batch.seq_len, 0) + 1
            if keys_out is not None:
                record_keys(keys_out, batch, epoch, pos["epoch_micro"])
            pos["epoch_micro"] += 1
            if whole is not None:
                # One replay (or, before capture and on the CPU, the same step run eagerly).
                pos["micro"] += 1
                last = pos["micro"] % args.accumulate == 0
                whole(last)
                if last:
                    pos["optimizer_steps"] += 1
                    window_steps += 1
                timer.step_done(batch.seqs if args.pack else args.batch_size)
                if last:
                    if pos["optimizer_steps"] % args.log_every == 0:
                        close_window()
                    if args.max_steps is not None and pos["optimizer_steps"] >= args.max_steps:
                        stopped = True
                        break
                continue
            timer.before_copy()
            b = to_device(batch, names, device)
            timer.after_copy()

            # Under DDP the gradients are averaged once per optimizer step, in its last
            # micro-batch's backward.
            syncs = ddp is None or (pos["micro"] + 1) % args.accumulate == 0
            with contextlib.nullcontext() if syncs else ddp.no_sync():
                with autocast():
                    pred = step_model(b)
                # Dividing by --accumulate makes the summed gradients those of the mean loss.
                loss = mean_loss(task, pred, b) / args.accumulate
                scaler.scale(loss).backward()
            window_loss += loss.detach()
            epoch_loss += loss.detach()
            pos["micro"] += 1

            if pos["micro"] % args.accumulate == 0:
                if args.clip > 0:
                    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                pos["optimizer_steps"] += 1
                window_steps += 1
            # A pack's sequence count is known on the host: no read-back.
            timer.step_done(batch.seqs if args.pack else args.batch_size)

            if pos["micro"] % args.accumulate == 0:
                if pos["optimizer_steps"] % args.log_every == 0:
                    close_window()
                if args.max_steps is not None and pos["optimizer_steps"] >= args.max_steps:
                    stopped = True
                    break

        if window_steps:
            close_window()
        epoch_time = {k: timer.totals[k] - epoch_totals[k] for k in timer.totals}
        if stopped and pos["micro"] < micro_epoch:
            # Mid-epoch stop: the checkpoint's loader state resumes after the last trained batch.
            # The epoch's loss so far is the ranks' mean: every rank of a resume starts from it.
            pos["epoch_loss"] = ranks.sum([epoch_loss], device)[0] / ranks.world
            checkpoint()
            say(f"stopped after {pos['optimizer_steps']} optimizer steps"
                + (f"; resume with --resume {ckpt_path}" if ckpt_path else ""))
            break

        val_loss = val_metric = None
        if cache.splits.get(args.eval_split, 0) > 0:
            val_loss, val_metric = evaluate(eval_model, task, cache, args, device, names, autocast,
                                            ranks)
        epoch_sum = ranks.sum([epoch_loss], device)[0] / ranks.world
        report = dict(epoch=epoch, steps=steps_epoch,
                      train_loss=epoch_sum * args.accumulate / max(pos["epoch_micro"], 1),
                      val_loss=val_loss, val_metric=val_metric, **shares(epoch_time))
        if args.compile:
            # Compiled frames so far: a static-shape run adds none after its first epoch.
            report["compiled_frames"] = compiled_frames()
        pos["history"].append(report)
        val = (f"{args.eval_split} loss {val_loss:.4f} · {task.metric} {val_metric:.4f}"
               if val_loss is not None else f"no {args.eval_split} split")
        say(f"epoch {epoch} · train loss {report['train_loss']:.4f} · {val} · "
            f"{report['samples_per_s']:.0f} samples/s · data wait "
            f"{100 * report['data_wait_share']:.1f}% · {time.perf_counter() - start:.1f} s")
        pos["epoch"], pos["micro"], pos["epoch_micro"], pos["epoch_loss"] = epoch + 1, 0, 0, 0.0
        loader.set_epoch(epoch + 1)
        checkpoint()

    loader.close()
    if keys_out is not None:
        keys_out.close()
    ls = loader.stats()
    say(f"loader · {ls['batches']} batches · {ls['bytes'] / 1e6:.1f} MB · waited "
        f"{ls['wait_s']:.2f} s in next() · {ls['queue_mean']:.1f} ready ahead on average"
        + (f" · fetched {ls['shards_fetched']} shards, {ls['bytes_fetched'] / 1e6:.1f} MB"
           if ls["shards_fetched"] else ""))
    # The final model on every split but train (a held-out test split is for this only).
    evaluation = []
    if pos["epoch"] >= args.epochs:
        for split, contexts in cache.splits.items():
            if split == "train" or contexts == 0:
                continue
            loss, metric = evaluate(eval_model, task, cache, args, device, names, autocast, ranks,
                                    split)
            evaluation.append(dict(split=split, contexts=contexts, loss=loss, metric=metric))
            say(f"final model · {split} ({contexts} contexts) · loss {loss:.4f} · "
                f"{task.metric} {metric:.4f}")
    total = shares(timer.totals)
    history = pos["history"]
    return dict(
        device=str(device), world_size=ranks.world, amp=amp, task=args.task, model=args.model,
        parameters=params,
        metric=task.metric, epochs=history, steps=logged,
        optimizer_steps=pos["optimizer_steps"],
        val_metric=[h["val_metric"] for h in history],
        final_train_loss=logged[-1]["train_loss"] if logged else None,
        samples_per_s=total["samples_per_s"], data_wait_share=total["data_wait_share"],
        h2d_share=total["h2d_share"], compute_share=total["compute_share"],
        wall_s=time.perf_counter() - start, checkpoint=ckpt_path,
        eval_split=args.eval_split, evaluation=evaluation,
        batch_lens={str(k): v for k, v in sorted(batch_lens.items())},
        resident=loader.resident, loader=loader.stats(),
        # What was chosen from the machine (recorded in the checkpoint, kept on resume) and
        # what a resume changed because the command line asked.
        attention=attention, graph=args.graph, trim_multiple=getattr(args, "trim_multiple", None),
        resumed_with={k: {"checkpoint": a, "now": b} for k, (a, b) in changed.items()},
        regrouped=regrouped,
    )


# dsc.Loader keywords this script gives under flags of other names.
FLAG_OF_KEYWORD = {"num_threads": "loader_threads"}


def as_flags(message: str, flags: Iterable[str]) -> str:
    """A dsc message naming keyword arguments (``max_seqs=``, ``pack=64``) as this script's
    flags (``--max-seqs``, ``--pack 64``), for the keywords it has a flag of (``flags``: its
    options' names); others stay keywords, never a flag it does not have."""
    known = set(flags)

    def flag(m: "re.Match[str]") -> str:
        key, value = FLAG_OF_KEYWORD.get(m.group(1), m.group(1)), m.group(2)
        if key not in known:
            return m.group(0)
        return "--" + key.replace("_", "-") + (f" {value}" if value else "")
    return re.sub(r"\b([a-z][a-z0-9_]*)=([^\s,;:)]*)", flag, message)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    flags = list(vars(args))
    try:
        summary = train(args)
    except dsc.OptionsError as e:
        raise SystemExit(f"train.py: {as_flags(str(e), flags)}") from None
    except dsc.StateError as e:
        # A checkpoint's loader state the loader cannot continue here (e.g. a bucketed order
        # at another global batch).
        raise SystemExit(f"train.py: --resume: {e}") from None
    if dist.is_initialized():
        # Every rank done with the group before any leaves it: a rank that tears it down while
        # another still finishes a collective aborts that one.
        dist.barrier()
        dist.destroy_process_group()
    if first_rank():
        print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
