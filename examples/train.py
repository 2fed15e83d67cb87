#!/usr/bin/env python3
"""The reference PyTorch training loop on a dsc cache: copy it and change what you need.

It mirrors the Rust reference trainer (``dsc-train``, trainer/): the same tasks, networks and
flag names (``examples/reference.py`` holds the tasks, networks and input normalisation), and
the same accounting of where a step's time goes.

    python examples/train.py --cache cache --task direction --epochs 2
    python examples/train.py --cache cache --task classification --target churned --model gru
    python examples/train.py --cache cache --task direction --out runs/a --max-steps 100
    python examples/train.py --resume runs/a/last.pt --epochs 2     # continues exactly
    torchrun --standalone --nproc-per-node 8 examples/train.py --cache cache --batch-size 64

The step. On CUDA the whole step is captured as CUDA graphs by default (``dsc.CapturedStep``:
the gather from the loader's static buffers, forward, loss, backward, clipping, the schedule's
rate from a device table, fused AdamW) wherever the batch shape is static: packs (``--pack T``)
and padded batches, untrimmed in a captured run. ``--no-graph`` (or ``--trim``, ``--bucket``,
``--compile``, ``--amp fp16``) trains eagerly, as the CPU does by default, on trimmed batches;
``--graph`` on the CPU runs the captured step's functions uncaptured.

Choices made from the machine (the device, ``--amp``, ``--attention``, ``--graph``, ``--trim``,
the loader's ``trim_multiple``) are printed, in the summary and in the checkpoint: ``--resume``
keeps them on any machine, changes one only when the command line names it, and says so
(``resident``, which changes no batch, is decided again for the machine's memory; a resume
cannot switch ``--graph``, whose schedule lives on the device).

On CUDA the loader delivers batches on the GPU (``--resident auto``: a split that fits a quarter
of its memory is uploaded once and gathered by index). Time shares per logged window and run:
``data_wait`` (host blocked in ``next()`` for data), on CUDA ``h2d`` and ``compute`` (device
times between events); the loss is read back once per ``--log-every`` optimizer steps.

``--out DIR`` writes ``DIR/last.pt`` at every epoch end and when ``--max-steps`` stops the run;
``--resume DIR/last.pt`` continues with the very batches the uninterrupted run would have seen
(only --epochs, --max-steps, --device, --log-every, --json, --out, --torch-threads and a moved
--cache may differ); on the CPU (same --torch-threads) the weights are a never-stopped run's.
Under torchrun each rank trains ``--batch-size`` contexts (or one pack) with DDP; losses and
metrics are summed over the ranks where they are read back anyway; a checkpoint of N ranks
resumes on M, keeping the global batch where M divides it.

At the end one JSON line summarises the run on stdout (``--json``: only that line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

import dsc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import (first_rank, rank_seed, rebatch, rng_state, set_rng_state,  # noqa: E402
                   start_ranks, started_by_torchrun)
from reference import (PACK_TENSORS, attention_kind, build_model,  # noqa: E402
                       build_optimizer, lr_factor, mean_loss, resolve_inputs, resolve_task)
from timing import StepTimer, shares  # noqa: E402

# On --resume the run's settings come from the checkpoint except these, always taken from the
# command line (they do not change the arithmetic), and --epochs and --cache when given.
# The loader's defaults, for the flags that are its options (one source: the Rust loader).
LOADER = dsc.Loader.defaults()

RESUME_FROM_COMMAND_LINE = ("max_steps", "log_every", "json", "out", "torch_threads", "resume",
                            "keys_out")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a transformer or GRU on a dsc cache (the "
                                "reference PyTorch loop).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cache", help="the compiled cache (a folder with manifest.json, or its URL "
                   "in object storage: s3://bucket/cache; DSC_CACHE_DIR and DSC_CACHE_LIMIT set "
                   "where its shards are fetched and how many bytes are kept)")
    p.add_argument("--mix", metavar="CACHE", action="append", default=None,
                   help="another cache to train on with --cache, drawn together (repeat it for "
                        "more; they need the same tensors); evaluation reads --cache's splits")
    p.add_argument("--weights", default=None, metavar="W,W,..",
                   help="the mix's weights, one per cache (--cache first) [default: their sizes]")
    p.add_argument("--schedule", default=None, metavar="FILE",
                   help="the mix's weights along the run: a JSON list of stages {\"at\": sample "
                        "or \"step\": optimizer step, \"weights\": [...], \"linear\": bool}; "
                        "with --resume, the stages after the saved position may change")
    p.add_argument("--resume", metavar="CKPT", help="continue the run saved in this last.pt")
    p.add_argument("--task", choices=["direction", "classification", "regression"],
                   default="direction")
    p.add_argument("--target", default=None,
                   help="target column(s) of y, comma-separated [default: azimuth,zenith for "
                        "direction, the only column for classification, all for regression]")
    p.add_argument("--model", choices=["transformer", "gru"], default="transformer")
    p.add_argument("--dim", type=int, default=128, help="transformer width / GRU hidden size")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the train split [default: 1, or the resumed run's]")
    p.add_argument("--batch-size", type=int, default=LOADER["batch_size"],
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
                   help="capture the whole training step as CUDA graphs (dsc.CapturedStep): one "
                        "index copy and one replay per step; needs one batch shape (--pack, or "
                        "padded batches untrimmed) and bf16 or no autocast. On the CPU the same "
                        "step runs uncaptured [default: on CUDA wherever the shape allows]")
    p.add_argument("--trim", action=argparse.BooleanOptionalAction, default=None,
                   help="cut each batch to its longest stored sequence [default: on, but off "
                        "in a captured step]")
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
    p.add_argument("--torch-threads", type=int, default=None,
                   help="CPU threads for torch's operators [default: torch's choice, one per "
                        "physical core]; fewer on a machine shared with other work")
    p.add_argument("--threads", default=None, help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--loader-threads", type=int, default=LOADER["num_threads"],
                   help="dsc loading threads")
    p.add_argument("--prefetch", type=int, default=LOADER["prefetch"],
                   help="batches prepared ahead per loading thread")
    p.add_argument("--resident", choices=["auto", "on", "off"], default=None,
                   help="keep the splits on the device and gather batches there [default: "
                        "auto, on CUDA when a split fits a quarter of the GPU's memory]")
    p.add_argument("--log-every", type=int, default=50,
                   help="read the loss back every N optimizer steps")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop after N optimizer steps in all (the schedule still spans "
                        "--epochs) and checkpoint there")
    p.add_argument("--seed", type=int, default=LOADER["seed"],
                   help="weights, dropout and data order")
    p.add_argument("--out", default=None, help="folder for last.pt [default: no checkpoints]")
    p.add_argument("--json", action="store_true", help="print only the JSON summary")
    p.add_argument("--keys-out", metavar="DIR", default=None,
                   help="audit the data order: each rank appends the keys of every micro-batch "
                        "it trains to DIR/keys-rank<R>.jsonl (reads the key tensor back every "
                        "step: for checks, not for speed)")
    args = p.parse_args(argv)
    if args.cache is None and args.resume is None:
        p.error("--cache is required (unless --resume)")
    if (args.weights is not None or args.schedule is not None) and not args.mix and not args.resume:
        p.error("--weights and --schedule weigh a mix: name its other caches with --mix")
    if args.weights is not None:
        try:
            args.weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            p.error(f"--weights {args.weights}: expected numbers separated by commas")
    if args.schedule is not None:
        try:
            with open(args.schedule) as f:
                args.schedule = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"--schedule {args.schedule}: {e}")
    if args.threads is not None:
        p.error(f"--threads {args.threads}: torch's threads are --torch-threads "
                f"{args.threads} now; a bare threads means the loader's (--loader-threads)")
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
                          ("max_seqs", 2**31), ("torch_threads", 1024), ("loader_threads", 1024),
                          ("prefetch", 1024), ("dim", 1 << 16), ("layers", 1024),
                          ("heads", 1024), ("batch_size", 2**31), ("accumulate", 2**31),
                          ("log_every", 2**62)):
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
    """Why the run's settings cannot be captured as a graph (``--graph``), or None; a batch
    shape that changes is the loader's to refuse (``dsc.Loader(static=True)``)."""
    if args.compile:
        return ("--graph captures the whole step itself; --compile captures the forward only: "
                "choose one")
    if args.amp == "fp16":
        return ("--graph with --amp fp16: the loss scaler reads its overflow check back every "
                "step, which a captured step cannot; use --amp bf16")
    return None


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


def mixing(args: argparse.Namespace, world: int) -> Dict[str, Any]:
    """The loader's keywords of a mix: its weights, or its schedule with stages given by
    optimizer step placed at their sample (batch size x ranks x --accumulate a step)."""
    if not getattr(args, "mix", None):
        return {}
    schedule = getattr(args, "schedule", None)
    if schedule is None:
        return dict(weights=getattr(args, "weights", None))
    per_step = args.batch_size * world * args.accumulate
    stages = []
    for stage in schedule:
        stage = dict(stage)
        if "step" in stage and not getattr(args, "pack", None):
            stage["at"] = stage.pop("step") * per_step
        stages.append(stage)
    # The checkpoint records the stages at their samples: a resume at another global batch
    # keeps them where the run drew them.
    args.schedule = stages
    return dict(schedule=stages, weights=getattr(args, "weights", None))


def compiled_frames() -> int:
    """Frames torch.compile has compiled in this process (a recompile counts again)."""
    from torch._dynamo.utils import counters
    return int(counters["frames"]["ok"])


def record_keys(out, batch: dsc.Batch, epoch: int, micro: int) -> None:
    """Appends a trained micro-batch's keys (``--keys-out``): its valid rows, a pack's seqs."""
    keys = batch.get("key")
    if keys is None:
        raise SystemExit("--keys-out: these batches carry no key tensor; load it (columns=)")
    rows = keys[: batch.valid].tolist()
    out.write(json.dumps(dict(epoch=epoch, micro=micro, keys=rows)) + "\n")


def resume_settings(args: argparse.Namespace):
    """The run a checkpoint saved, continued: its settings (the command line's only where
    RESUME_FROM_COMMAND_LINE says, or for the machine choices it names), the checkpoint, the
    choices a resume changes as asked, and the regrouping onto another number of ranks."""
    # weights_only: the checkpoint holds tensors and plain Python values only.
    ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
    saved = dict(ckpt["args"])
    for k in RESUME_FROM_COMMAND_LINE:
        saved[k] = getattr(args, k)
    # A schedule given again amends the run's: the loader refuses stages that would change
    # what was trained.
    for k in ("epochs", "cache", "schedule"):
        if getattr(args, k) is not None:
            saved[k] = getattr(args, k)
    for k in ("mix", "weights", "schedule"):
        saved.setdefault(k, None)
    if args.schedule is not None:
        if not saved["mix"]:
            raise SystemExit("train.py: --schedule weighs a mix, and the run resumed trains on "
                             "one cache (--cache without --mix)")
        saved["weights"] = None  # the schedule replaces the run's fixed weights
    if args.out is None:  # keep writing next to the checkpoint resumed from
        saved["out"] = os.path.dirname(args.resume) or "."
    # Checkpoints from before an option existed trained without it (and eagerly, trimmed).
    for k, v in (("pack", None), ("max_seqs", None), ("attention", None), ("graph", False)):
        saved.setdefault(k, v)
    saved["graph"] = bool(saved["graph"])
    changed: Dict[str, Tuple[Any, Any]] = {}
    # What the run chose from its machine stays chosen, unless the command line asks for
    # another (and then the run says so).
    for k in ("device", "amp", "attention"):
        given = getattr(args, k, None)
        if given is not None and given != saved.get(k):
            changed[k] = (saved.get(k), given)
            saved[k] = given
    if args.graph is not None and args.graph != saved["graph"]:
        # The captured step keeps its schedule on the device, the eager one in LambdaLR:
        # neither continues the other's.
        raise SystemExit(f"--resume {args.resume}: the run trained with"
                         f"{'' if saved['graph'] else 'out'} --graph; resume it as it was (on "
                         "the CPU a captured step runs uncaptured), or start a new run")
    # Residency changes no batch (both paths give the same bytes): it is decided again for
    # this machine's memory, unless given, and reported when it differs.
    saved["recorded_resident"], saved["resident"] = saved.get("resident"), args.resident
    args = argparse.Namespace(**saved)
    before, now = saved.get("world_size", 1), started_by_torchrun()
    if before == now:
        return args, ckpt, changed, None
    micro_before, regrouped = args.batch_size * before, rebatch(args, before, now)
    # The loader counts its epoch afresh wherever a micro-batch's global batch changes (also
    # when the optimizer step's is kept, at another --accumulate).
    regrouped["micro_regrouped"] = (len(set(regrouped["global_batch"])) > 1 or args.pack
                                    or args.batch_size * now != micro_before)
    return args, ckpt, changed, regrouped


def auto_graph(device: torch.device) -> bool:
    """Whether ``--graph`` left unset captures the step on this machine: on CUDA."""
    return device.type == "cuda"


def settle_shape(args: argparse.Namespace, device: torch.device) -> Optional[str]:
    """Chooses, for a new run, what the command line left open: a captured step wherever the
    batch shape can be static (on CUDA, ``auto_graph``), and then untrimmed padded batches;
    else trimmed ones. Returns why ``--graph`` left unset does not capture here, if it does
    not."""
    why = None
    if args.graph is None:
        blockers = [(args.bucket, "--bucket changes the batch shape"),
                    (args.trim and not args.pack, "--trim changes the batch shape"),
                    (args.compile, "--compile captures the forward itself"),
                    (args.amp == "fp16", "fp16's loss scaler reads back every step")]
        why = next((w for blocked, w in blockers if blocked), None)
        if not auto_graph(device):
            why = f"{device.type} runs the step eagerly"
        args.graph = why is None
    if args.trim is None:
        args.trim = not args.graph
    refusal = graph_refusal(args) if args.graph else None
    if refusal:
        raise SystemExit(refusal)
    return why


def captured_step(run: "Run") -> dsc.CapturedStep:
    """The whole micro-step as dsc.CapturedStep: the schedule as a device table, fused AdamW
    with a device learning rate, the running loss on the device."""
    task, plan, args = run.task, run.plan, run.args
    for group in run.optimizer.param_groups:
        group["initial_lr"] = args.lr  # the schedule's factors scale the peak rate
    step = dsc.CapturedStep(
        run.net, lambda net, b: mean_loss(task, net(b), b), run.optimizer, run.loader,
        accumulate=args.accumulate, clip=args.clip, steps=plan["total"] + 1,
        schedule=lambda s: lr_factor(s, plan["warmup"], plan["total"]),
        autocast=run.amp_dtype)
    step.load_state_dict(dict(optimizer_steps=run.pos["optimizer_steps"]))
    return step


class Run:
    """One training run: the network, its optimizer and loader, the position in the data, and
    the epoch loop with its accounting."""

    def __init__(self, args: argparse.Namespace, ckpt: Optional[Dict[str, Any]],
                 changed: Dict[str, Tuple[Any, Any]], regrouped: Optional[Dict[str, Any]],
                 say) -> None:
        self.args, self.ckpt, self.changed, self.regrouped = args, ckpt, changed, regrouped
        self.micro_regrouped = bool(regrouped and regrouped.pop("micro_regrouped"))
        self.say = say
        device = pick_device(args.device, resumed=ckpt is not None and "device" not in changed)
        self.ranks, device = start_ranks(device, auto_graph(device) if args.graph is None
                                         else bool(args.graph))
        self.device, self.on_cuda = device, device.type == "cuda"
        # Several ranks each take the GPU of their LOCAL_RANK: the run records the kind.
        args.device = device.type if self.ranks.world > 1 else str(device)
        args.world_size = self.ranks.world
        if args.torch_threads:  # fewer than torch's one per core on a shared machine
            torch.set_num_threads(args.torch_threads)
        amp = args.amp = args.amp or auto_amp(device)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[amp]
        self.graph_why = settle_shape(args, device) if ckpt is None else None
        # float32 products on tensor cores
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.on_cuda
        # A resumed run reads the generation of the cache it started on, whatever was appended
        # since (dsc append): its statistics (the inputs' scaling) and its order.
        read = (ckpt or {}).get("loader", {}).get("content_id")
        ids = read.split("+") if read else []
        mixed = args.mix or []
        at = (lambda i: ids[i]) if len(ids) == 1 + len(mixed) else (lambda i: None)
        self.cache = dsc.open(args.cache, generation=at(0))
        self.mixed = [dsc.open(c, generation=at(1 + i)) for i, c in enumerate(mixed)]
        if args.eval_split not in self.cache.splits and args.eval_split != "val":
            # `val` may be absent (a cache compiled without one is trained without validation).
            raise SystemExit(f"train.py: --eval-split {args.eval_split}: the cache has no such "
                             f"split (it has {sorted(self.cache.splits)})")
        self.task = resolve_task(self.cache, args.task, args.target).to(device)
        inp = resolve_inputs(self.cache, args.normalise)
        # A mix's batches are padded to its longest L.
        inp.max_len = max(c.max_len for c in [self.cache, *self.mixed])
        self.names = inp.names + ["y"] + (PACK_TENSORS if args.pack else [])
        # Same seed, same initial weights; the data order has its own seed inside the loader.
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        args.attention = attention_kind(args, device, amp)
        self.network(build_model(args, inp, self.task.outputs, args.attention).to(device))
        self.make_loader()
        self.position()
        self.step = captured_step(self) if args.graph else None

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype,
                              enabled=self.amp_dtype is not None)

    def network(self, model: nn.Module) -> None:
        args, device = self.args, self.device
        self.model = self.net = model  # net: what the steps call, the model or DDP around it
        self.ddp = None
        if self.ranks.world > 1:
            from torch.nn.parallel import DistributedDataParallel
            # DDP starts every rank from rank 0's weights and averages the gradients in
            # backward. No buffer broadcast: the buffers (normalisation) never change, and a
            # broadcast in every forward would make validation a collective. Captured steps
            # need DDP built on a side stream (PyTorch's CUDA graphs recipe).
            side = torch.cuda.Stream(device) if self.on_cuda and args.graph else None
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                self.ddp = DistributedDataParallel(
                    model, device_ids=[device.index] if self.on_cuda else None,
                    broadcast_buffers=False)
            if side is not None:
                torch.cuda.current_stream().wait_stream(side)
            self.net = self.ddp
            # Every rank built the same weights; dropout draws a stream of each rank's own.
            torch.manual_seed(rank_seed(args.seed, self.ranks.rank))
        # One static shape (packs) compiles once, and on CUDA replays the step's kernels as
        # CUDA graphs; not under DDP, whose bucketed all-reduce splits the compiled graph.
        mode = "reduce-overhead" if args.pack and self.on_cuda and self.ddp is None else None
        self.step_model = (torch.compile(self.net, dynamic=False if args.pack else None,
                                         mode=mode) if args.compile else self.net)
        # Validation calls the model without DDP: each rank evaluates its own slice.
        self.eval_model = (self.step_model if self.ddp is None
                           else torch.compile(model) if args.compile else model)
        self.optimizer = build_optimizer(model, args, device, graph=args.graph)
        self.scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
        if args.amp == "fp16":
            # The scaler skips the update of a step whose gradients overflowed, and torch then
            # warns that the schedule stepped alone: expected.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step")

    def make_loader(self) -> None:
        args, device = self.args, self.device
        where = placement(args, device)
        if self.mixed:
            # A mix is gathered on the host.
            where["resident"] = None if where.get("resident") is None else False
        if args.graph:
            # Every batch in the loader's static buffers on the device; from a resident split
            # next() copies only the index and the captured step gathers the batch itself.
            where["device"] = device
            resident = not self.mixed and dsc.Loader(
                self.cache, split="train", device=device, resident=where["resident"],
                **batching(args)).resident
            where.update(static=True, gather_in_step=resident)
        self.loader = dsc.Loader([self.cache, *self.mixed] if self.mixed else self.cache,
                                 split="train", shuffle=True, seed=args.seed,
                                 drop_last=True, num_threads=args.loader_threads,
                                 prefetch=args.prefetch, **where, **batching(args),
                                 **mixing(args, self.ranks.world))
        self.mix_seen = None
        if not args.pack:
            args.trim_multiple = self.loader.trim_multiple
        args.resident = "on" if self.loader.resident else "off"
        recorded = getattr(args, "recorded_resident", None)
        if recorded in ("on", "off") and recorded != args.resident:
            self.changed["resident"] = (recorded, args.resident)

    def position(self) -> None:
        """Where the run stands (a new run: at the start), and the schedule it follows."""
        args, ckpt = self.args, self.ckpt
        # Whole optimizer steps only: leftover micro-batches of an epoch are not trained.
        micro_epoch = len(self.loader) // args.accumulate * args.accumulate
        if micro_epoch == 0:
            unit = f"packs of {args.pack} tokens" if args.pack else f"batches of {args.batch_size}"
            raise SystemExit(f"the train split has {len(self.loader)} full {unit}, "
                             f"fewer than --accumulate {args.accumulate}")
        self.steps_epoch = micro_epoch // args.accumulate
        # The schedule spans the run's optimizer steps. A resume at another global batch spans
        # the steps taken plus those left at the new batch, with the run's warmup.
        plan = self.plan = dict(total=self.steps_epoch * args.epochs)
        plan["warmup"] = args.warmup if args.warmup is not None else plan["total"] // 20
        self.schedule = (None if args.graph else torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, plan["warmup"], plan["total"])))
        # `micro`: micro-batches of the epoch trained; `epoch_micro` the same since the epoch's
        # start (they differ after a resume at another global batch, which counts `micro`
        # afresh).
        self.pos = dict(epoch=0, micro=0, epoch_micro=0, optimizer_steps=0, history=[])
        if ckpt is not None:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            if self.schedule is not None and ckpt["schedule"]:
                self.schedule.load_state_dict(ckpt["schedule"])
            self.scaler.load_state_dict(ckpt["scaler"])
            pos = self.pos = ckpt["position"]
            pos.setdefault("epoch_micro", pos["micro"])
            # The loader continues after the last batch the saved run trained on.
            self.loader.load_state_dict(ckpt["loader"])
            if self.micro_regrouped:
                # At another global batch the loader goes on from the same context, its steps
                # counted afresh, and the schedule ends when the steps left at this batch do.
                pos["micro"] = 0
                left = (len(self.loader) // args.accumulate
                        + self.steps_epoch * (args.epochs - pos["epoch"] - 1))
                plan["warmup"] = pos.get("plan", plan)["warmup"]
                plan["total"] = pos["optimizer_steps"] + left
            # Each rank its own random state where the ranks are the checkpoint's; a rank the
            # checkpoint did not have starts a stream of its own (only dropout draws from it).
            rngs = ckpt.get("rng_ranks") or [ckpt["rng"]]
            set_rng_state(rngs[self.ranks.rank % len(rngs)])
            if self.ranks.rank >= len(rngs):
                torch.manual_seed(rank_seed(args.seed, self.ranks.rank, pos["optimizer_steps"]))
        self.pos["plan"] = plan

    def eager_micro(self, batch: dsc.Batch) -> None:
        """One micro-step, eager: copy, forward, loss, backward and, at the end of an optimizer
        step, clipping, the (fp16-scaled) update and the schedule."""
        args, pos = self.args, self.pos
        self.timer.before_copy()
        b = to_device(batch, self.names, self.device)
        self.timer.after_copy()
        # Under DDP the gradients are averaged once per optimizer step, in its last
        # micro-batch's backward.
        last = (pos["micro"] + 1) % args.accumulate == 0
        with contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync():
            with self.autocast():
                pred = self.step_model(b)
            # Dividing by --accumulate makes the summed gradients those of the mean loss.
            loss = mean_loss(self.task, pred, b)
            self.scaler.scale(loss / args.accumulate).backward()
        self.window_loss += loss.detach()
        if last:
            if args.clip > 0:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.schedule.step()

    def close_window(self) -> None:
        """Reads the window's loss and samples back (summed over the ranks: one all-reduce)
        and logs them with its time shares."""
        pos = self.pos
        mean = self.step.loss() if self.step is not None else self.window_loss / self.window_micro
        loss, samples = self.ranks.sum([mean, self.timer.cur["samples"]], self.device)
        loss /= self.ranks.world
        self.epoch_loss += loss * self.window_micro
        self.timer.cur["samples"] = int(samples)
        sh = self.timer.close()
        # The rate of the next optimizer step.
        lr = (self.step.lr()[0] if self.step is not None else self.schedule.get_last_lr()[0])
        self.logged.append(dict(step=pos["optimizer_steps"], train_loss=loss, lr=lr, **sh))
        self.say(f"epoch {pos['epoch']} step {pos['optimizer_steps']} · loss {loss:.4f} · lr "
                 f"{lr:.2e} · {sh['samples_per_s']:.0f} samples/s · data wait "
                 f"{100 * sh['data_wait_share']:.1f}% · h2d {100 * sh['h2d_share']:.1f}% · "
                 f"compute {100 * sh['compute_share']:.1f}%")
        self.window_loss.zero_()
        self.window_micro = 0
        self.log_mix()

    def log_mix(self) -> None:
        """Says where a mix stands when its weights change (a stage, or a linear step)."""
        if not self.mixed:
            return
        now = self.loader.stats()["mix"]
        seen = self.mix_seen
        if seen is None or (seen["stage"], seen["weights"]) != (now["stage"], now["weights"]):
            weights = " ".join(f"{w:.3f}" for w in now["weights"])
            self.say(f"mix · stage {now['stage']} (from sample {now['at']}) at sample "
                     f"{now['position']} · weights {weights}")
        self.mix_seen = now

    def checkpoint(self) -> None:
        """Written by the first rank; every rank calls it (their random states are gathered)."""
        if not self.args.out:
            return
        rngs = self.ranks.gather(rng_state())
        if self.ranks.main:
            os.makedirs(self.args.out, exist_ok=True)
            save_checkpoint(os.path.join(self.args.out, "last.pt"), {
                "args": {k: v for k, v in vars(self.args).items() if k != "recorded_resident"},
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict() if self.schedule is not None else {},
                "scaler": self.scaler.state_dict(), "position": self.pos, "rng": rngs[0],
                "rng_ranks": rngs, "loader": self.loader.state_dict()})

    def train_epoch(self) -> bool:
        """Trains the rest of the current epoch; returns whether --max-steps stopped it."""
        args, pos, timer, loader = self.args, self.pos, self.timer, self.loader
        loader.set_epoch(pos["epoch"])
        # The epoch's micro-batches from where the loader stands (a regrouped resume: the rest).
        micro_epoch = len(loader) // args.accumulate * args.accumulate
        # A resumed epoch starts from the sum saved at the stop: its mean is the whole epoch's.
        # (Checkpoints from before kept the sum divided by --accumulate.)
        self.epoch_loss = pos.get("epoch_loss_sum", pos.get("epoch_loss", 0.0) * args.accumulate)
        timer.reset()
        totals = dict(timer.totals)
        batches = iter(loader)
        stopped = False
        while pos["micro"] < micro_epoch and not stopped:
            t0, gpu0 = time.perf_counter(), loader.device_wait_s
            batch = next(batches, None)
            if batch is None:  # a regrouped epoch may hold a step fewer than counted
                break
            # Time in next() less its waits for the GPU to free a buffer (not a data stall).
            timer.cur["data_wait"] += (time.perf_counter() - t0) - (loader.device_wait_s - gpu0)
            if not args.pack:
                self.batch_lens[batch.seq_len] = self.batch_lens.get(batch.seq_len, 0) + 1
            if self.step is not None:
                self.step()  # one replay (before capture and on the CPU: the same step, eager)
            else:
                self.eager_micro(batch)
            if self.keys_out is not None:
                # After the step: a captured step gathers its batch (gather_in_step) itself.
                record_keys(self.keys_out, batch, pos["epoch"], pos["epoch_micro"])
            pos["epoch_micro"] += 1
            pos["micro"] += 1
            self.window_micro += 1
            # A pack's sequence count is known on the host: no read-back.
            timer.step_done(batch.seqs if args.pack else args.batch_size)
            if pos["micro"] % args.accumulate == 0:
                pos["optimizer_steps"] += 1
                if pos["optimizer_steps"] % args.log_every == 0:
                    self.close_window()
                stopped = args.max_steps is not None and pos["optimizer_steps"] >= args.max_steps
        if self.window_micro:
            self.close_window()
        self.epoch_time = {k: timer.totals[k] - totals[k] for k in timer.totals}
        if stopped and pos["micro"] < micro_epoch:
            # Mid-epoch stop: the checkpoint's loader state resumes after the last trained
            # batch, and every rank of a resume starts from the epoch's loss so far.
            pos["epoch_loss_sum"] = self.epoch_loss
            self.checkpoint()
            self.say(f"stopped after {pos['optimizer_steps']} optimizer steps"
                     + (f"; resume with --resume {args.out}/last.pt" if args.out else ""))
            return True
        self.end_epoch()
        return stopped

    def end_epoch(self) -> None:
        """Validation, the epoch's report and the checkpoint."""
        args, pos = self.args, self.pos
        val_loss = val_metric = None
        if self.cache.splits.get(args.eval_split, 0) > 0:
            val_loss, val_metric = self.evaluate()
        report = dict(epoch=pos["epoch"], steps=self.steps_epoch,
                      train_loss=self.epoch_loss / max(pos["epoch_micro"], 1),
                      val_loss=val_loss, val_metric=val_metric, **shares(self.epoch_time))
        if args.compile:
            # Compiled frames so far: a static-shape run adds none after its first epoch.
            report["compiled_frames"] = compiled_frames()
        pos["history"].append(report)
        val = (f"{args.eval_split} loss {val_loss:.4f} · {self.task.metric} {val_metric:.4f}"
               if val_loss is not None else f"no {args.eval_split} split")
        self.say(f"epoch {pos['epoch']} · train loss {report['train_loss']:.4f} · {val} · "
                 f"{report['samples_per_s']:.0f} samples/s · data wait "
                 f"{100 * report['data_wait_share']:.1f}% · "
                 f"{time.perf_counter() - self.start:.1f} s")
        pos["epoch"], pos["micro"], pos["epoch_micro"], pos["epoch_loss_sum"] = (
            pos["epoch"] + 1, 0, 0, 0.0)
        pos.pop("epoch_loss", None)
        self.loader.set_epoch(pos["epoch"])
        self.checkpoint()

    @torch.no_grad()
    def evaluate(self, split: Optional[str] = None) -> Tuple[float, float]:
        """Mean loss and metric over the whole of `split` (default: --eval-split), each context
        counted once: the ranks read disjoint slices of it (the loader's default under
        torch.distributed) and their sums are added."""
        args, device, model = self.args, self.device, self.eval_model
        loader = dsc.Loader(self.cache, split=split or args.eval_split, shuffle=False,
                            drop_last=False, num_threads=args.loader_threads,
                            **placement(args, device), **batching(args))
        loss_sum, metric_sum, seen = (torch.zeros((), device=device),
                                      torch.zeros((), device=device), 0)
        model.eval()
        for batch in loader:
            # drop_last=False fills the last batch up with the split's first contexts (a packed
            # epoch repeats its first packs), so that every batch is full: count only the
            # `valid` rows, seen for the first time (a pack's leading rows are its sequences).
            rows = batch.valid
            b = to_device(batch, self.names, device)
            with self.autocast():
                pred = model(b)
            loss, metric = self.task(pred[:rows], b["y"][:rows], metric=True)
            loss_sum += loss.sum()
            metric_sum += metric.sum()
            seen += rows
        model.train()
        # The one read-back of validation, summed over the ranks.
        loss, metric, seen = self.ranks.sum([loss_sum, metric_sum, seen], device)
        return loss / max(seen, 1), metric / max(seen, 1)

    def train(self) -> Dict[str, Any]:
        args, pos = self.args, self.pos
        for k, (before, now) in self.changed.items():
            self.say(f"resuming with {k} {now} (the checkpoint's run had {before}): as asked on "
                     "the command line" + (", decided for this machine; the batches are the "
                                           "same" if k == "resident" else ""))
        params = sum(p.numel() for p in self.model.parameters())
        self.say(f"{args.model} · {params:,} parameters · task {args.task} ({self.task.metric}) "
                 f"· device {self.device} · amp {args.amp} · "
                 + (f"{self.ranks.world} ranks x " if self.ranks.world > 1 else "")
                 + f"{len(self.loader)} "
                 + (f"packs of {args.pack} tokens ({args.attention} attention)" if args.pack
                    else f"batches of {args.batch_size}" + ("" if args.trim else ", untrimmed"))
                 + f"/epoch · {self.steps_epoch} optimizer steps/epoch · whole step "
                 + ("captured as CUDA graphs" if args.graph and self.on_cuda else
                    "uncaptured (CPU)" if args.graph else
                    "eager" + (f" ({self.graph_why})" if self.graph_why else "")))
        self.timer = StepTimer(self.device, per_step=not args.graph)
        self.logged: List[Dict[str, Any]] = []
        # Padded training batches by sequence length: the shapes the steps saw.
        self.batch_lens: Dict[int, int] = {}
        # The eager loss stays on the device, one tensor for the run; .item() on it (and the
        # captured step's loss()) at the log interval is the only read-back in training.
        self.window_loss, self.window_micro = torch.zeros((), device=self.device), 0
        self.keys_out = None
        if args.keys_out:
            os.makedirs(args.keys_out, exist_ok=True)
            self.keys_out = open(os.path.join(args.keys_out,
                                              f"keys-rank{self.ranks.rank}.jsonl"), "a")
        self.start = time.perf_counter()
        self.model.train()
        stopped = args.max_steps is not None and pos["optimizer_steps"] >= args.max_steps
        while pos["epoch"] < args.epochs and not stopped:
            stopped = self.train_epoch()
        self.loader.close()
        if self.keys_out is not None:
            self.keys_out.close()
        return self.summary(params)

    def summary(self, params: int) -> Dict[str, Any]:
        args, pos = self.args, self.pos
        ls = self.loader.stats()
        if ls.get("mix"):
            m = ls["mix"]
            self.say(f"mix · stage {m['stage']} (from sample {m['at']}) · weights "
                     + " ".join(f"{w:.3f}" for w in m["weights"]) + " · realised in the stage "
                     + " ".join(f"{r:.3f}" for r in m["realised"]))
        self.say(f"loader · {ls['batches']} batches · {ls['bytes'] / 1e6:.1f} MB · waited "
                 f"{ls['wait_s']:.2f} s in next() · {ls['queue_mean']:.1f} ready ahead on average"
                 + (f" · fetched {ls['shards_fetched']} shards, "
                    f"{ls['bytes_fetched'] / 1e6:.1f} MB" if ls["shards_fetched"] else ""))
        # The final model on every split but train (a held-out test split is for this only).
        evaluation = []
        if pos["epoch"] >= args.epochs:
            for split, contexts in self.cache.splits.items():
                if split == "train" or contexts == 0:
                    continue
                loss, metric = self.evaluate(split)
                evaluation.append(dict(split=split, contexts=contexts, loss=loss, metric=metric))
                self.say(f"final model · {split} ({contexts} contexts) · loss {loss:.4f} · "
                         f"{self.task.metric} {metric:.4f}")
        total, history = shares(self.timer.totals), pos["history"]
        return dict(
            device=str(self.device), world_size=self.ranks.world, amp=args.amp, task=args.task,
            model=args.model, parameters=params, metric=self.task.metric, epochs=history,
            steps=self.logged, optimizer_steps=pos["optimizer_steps"],
            val_metric=[h["val_metric"] for h in history],
            final_train_loss=self.logged[-1]["train_loss"] if self.logged else None,
            wall_s=time.perf_counter() - self.start, **total,
            checkpoint=os.path.join(args.out, "last.pt") if args.out else None,
            eval_split=args.eval_split, evaluation=evaluation,
            batch_lens={str(k): v for k, v in sorted(self.batch_lens.items())},
            resident=self.loader.resident, loader=ls,
            # What was chosen from the machine (recorded in the checkpoint, kept on resume)
            # and what a resume changed because the command line asked.
            attention=args.attention, graph=args.graph, trim=args.trim,
            captured=self.step is not None and self.step.captured,
            trim_multiple=getattr(args, "trim_multiple", None),
            resumed_with={k: {"checkpoint": a, "now": b} for k, (a, b) in self.changed.items()},
            regrouped=self.regrouped)


def train(args: argparse.Namespace) -> Dict[str, Any]:
    quiet = args.json or not first_rank()
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    ckpt, changed, regrouped = None, {}, None
    if args.resume:
        args, ckpt, changed, regrouped = resume_settings(args)
    if args.epochs is None:
        args.epochs = 1
    if regrouped is not None:
        say(regrouped["said"])
    return Run(args, ckpt, changed, regrouped, say).train()


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    try:
        summary = train(args)
    except dsc.OptionsError as e:
        # The loader's own message, its options spelled as flags: this script's loader flags
        # are the loader's keys.
        raise SystemExit(f"train.py: {e.flags()}") from None
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
    if main()["world_size"] > 1:
        # A DistributedDataParallel model keeps its gloo group, and the group's worker threads,
        # alive until the process ends, whatever destroy_process_group did. A worker still
        # freeing the last collective's tensors takes the GIL to do so, and a thread that asks
        # for it while the interpreter finalises is ended inside that C++ destructor: the rank
        # aborts ("terminate called without an active exception", SIGABRT) after a run that
        # succeeded, about one 4-rank launch in 25 on two busy cores. Everything is written and
        # closed by now, so the rank leaves without finalising.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
