"""The training step on a GPU, fed by each way of getting data there: how many samples a second
it trains and how busy the GPU is (NVML), eager and graph-captured.

    python scripts/bench_gpu.py --cache CACHE [--batch-size 256] [--pack 16384] [--json]

One model and step for every feed: the transformer of examples/train.py (``--dim 128
--layers 2 --heads 4`` by default), the direction loss, fused AdamW, bf16 autocast. Feeds:

- ``resident``: the whole train split already on the GPU as padded tensors; each step takes a
  random batch of ``--batch-size`` by index (no loader, no copy): the ceiling of the step.
- ``padded``, ``trimmed``, ``bucketed``: ``dsc.Loader(device=...)`` with padded batches of
  ``--batch-size`` (untrimmed; cut to the batch's longest, rounded to a few lengths; length-
  bucketed and rounded). On CUDA the loader keeps a split that fits a quarter of the GPU's
  memory resident and gathers each batch there (``resident=None``, its default).
- ``padded_host``: the same padded batches through the host path (``resident=False``): the
  loader's threads gather into pinned blocks, one copy per batch.
- ``packed``: ``dsc.Loader(pack=T, device=...)``; ``T`` defaults to ``--batch-size`` times the
  split's mean stored length, so that a step trains about as many contexts as a padded one.
- ``dataloader``: a plain ``torch.utils.data.DataLoader`` over the same split held in memory
  (``--workers`` worker processes, shuffled, pinned), padded batches of ``--batch-size``.

Modes (``--modes``): ``feed``, the resident feed alone (no model), padded and packed, as the
plain iterator, with static buffers and with the gather left to the step: the tensor
operations it issues per step (counted by torch.profiler; on a GPU each is a launch or a view)
and the host's microseconds per step; ``eager``; ``graphs``, the forward compiled for CUDA graphs
(``torch.compile(mode="reduce-overhead")``) where the feed's shapes are static (resident,
padded, packed, dataloader), with the loss, backward and optimizer launched op by op around it
(trimmed and bucketed batches change shape nearly every step, which graphs cannot replay: their
compiled figure is left out, it measures recompiles); and ``whole``, the whole training step
captured as CUDA graphs (examples/train.py's ``--graph`` step: the batch's gather from the
loader's static buffers, forward, loss, backward, clipping, AdamW with its learning rate on the
device) for the static dsc feeds (padded, padded_host, packed, packed_host: ``dsc.Loader(static=
True)``, resident with the gather inside the graph, or the host path copying each batch into the
buffers), so that the host issues one index (or batch) copy and one replay per step. On the CPU
the whole step runs uncaptured. Reported per run: samples/s (contexts trained), the data wait
(time blocked in ``next()`` for data, as a share of the wall time; the loader's waits for the
GPU to finish with a buffer, ``Loader.device_wait_s``, are a GPU-bound run's, not a stall), the host's microseconds per step (the
time the host spent issuing a step: ``next()`` and the step's launches, before the final
synchronisation; a GPU-bound run's host waits in the launch queue are counted), and GPU busy:
the mean
of NVML's utilisation (``nvmlDeviceGetUtilizationRates``, the share of time any kernel ran)
sampled every 50 ms in a thread, read through the driver's own library (libnvidia-ml) so that
no Python package is needed; ``null`` where there is no NVIDIA driver. Samples/s counts
contexts, whatever their length: a packed step trains ``batch.seqs`` of them.

On a machine without CUDA the script runs on the CPU (``--device cpu``), which only checks that
it works: the figures mean nothing there.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

import dsc
from dsc._resident import split_bytes

ROOT = Path(__file__).resolve().parents[1]


def load_train_module():
    """examples/train.py, whose model, task and normalisation this benchmark trains."""
    spec = importlib.util.spec_from_file_location("dsc_example_train", ROOT / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class GpuBusy:
    """NVML utilisation of one GPU, sampled in a thread while a run is timed."""

    def __init__(self, index: Optional[int], period: float = 0.05):
        """``index`` None: no GPU to watch."""
        self.period, self.samples = period, []
        self._lib = self._handle = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if index is None:
            return
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return
            self._lib, self._handle = lib, handle
        except OSError:
            pass

    @property
    def available(self) -> bool:
        return self._lib is not None

    def _read(self) -> Optional[int]:
        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        u = Utilization()
        if self._lib.nvmlDeviceGetUtilizationRates(self._handle, ctypes.byref(u)) != 0:
            return None
        return int(u.gpu)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            v = self._read()
            if v is not None:
                self.samples.append(v)

    def start(self) -> None:
        if not self.available:
            return
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> Optional[float]:
        """Mean utilisation (0..1) since start, or None without NVML."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        return sum(self.samples) / len(self.samples) / 100 if self.samples else None


def split_arrays(cache: dsc.Cache, names: List[str]) -> Dict[str, np.ndarray]:
    """The train split's tensors, padded, in memory (cache order)."""
    loader = dsc.Loader(cache, batch_size=4096, shuffle=False, drop_last=False, columns=names,
                        format="numpy")
    parts: Dict[str, List[np.ndarray]] = {n: [] for n in names}
    for b in loader:
        for n in names:
            parts[n].append(np.array(b[n][: b.valid]))
    return {n: np.concatenate(v) for n, v in parts.items()}


class SplitDataset(torch.utils.data.Dataset):
    """One context per item, from arrays in memory: what a plain PyTorch pipeline does."""

    def __init__(self, arrays: Dict[str, np.ndarray]):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {n: torch.from_numpy(np.asarray(a[i])) for n, a in self.arrays.items()}


def mean_length(cache: dsc.Cache) -> float:
    n = total = 0
    for b in dsc.Loader(cache, batch_size=4096, shuffle=False, drop_last=False,
                        columns=["length"], format="numpy"):
        lengths = b["length"][: b.valid]
        n, total = n + len(lengths), total + int(lengths.sum())
    return total / max(n, 1)


def device_wait(start) -> float:
    """The seconds a dsc feed's loader has waited for the device so far (0 for other feeds)."""
    loader = getattr(start, "loader", None)
    return loader.device_wait_s if loader is not None else 0.0


class DscFeed:
    """A ``dsc.Loader`` as a feed: one loader for the whole run (static buffers are the
    loader's, and a graph captured on them replays for every epoch), and a fresh iterator of
    (batch dict on the device, contexts in it) per epoch."""

    def __init__(self, make, names: List[str]):
        self.make, self.names, self.loader = make, names, None

    def __call__(self, epoch: int):
        if self.loader is None:
            self.loader = self.make()
        self.loader.set_epoch(epoch)
        for b in self.loader:
            yield {n: b[n] for n in self.names}, (b.seqs or len(b["key"]))


def feeds(args, cache: dsc.Cache, names: List[str], device: torch.device, pack: int,
          static: bool = False):
    """Each feed as (name, static shapes?, a function returning a fresh iterator of
    (batch dict on the device, contexts in it)). ``static``: the dsc feeds whose shapes allow
    it, with static buffers, for the whole-step mode."""
    on_cuda = device.type == "cuda"
    arrays = None

    def dsc_feed(**kwargs):
        if static:
            kwargs = dict(kwargs, static=True, device=device,
                          resident=kwargs.get("resident", None if on_cuda else True))
            kwargs["gather_in_step"] = kwargs["resident"] is not False
        else:
            kwargs = dict(kwargs, device=device if on_cuda else None)

        def make():
            return dsc.Loader(cache, seed=0, num_threads=args.loader_threads, **kwargs)
        return DscFeed(make, names + extra(kwargs))

    def extra(kwargs) -> List[str]:
        return list(TRAIN.PACK_TENSORS) if "pack" in kwargs else []

    def resident(epoch: int):
        nonlocal arrays
        if arrays is None:
            arrays = split_arrays(cache, names)
        gpu = getattr(resident, "gpu", None)
        if gpu is None:
            gpu = resident.gpu = {n: torch.from_numpy(a).to(device) for n, a in arrays.items()}
        total = len(gpu["y"])
        order = torch.randperm(total, generator=torch.Generator().manual_seed(epoch), device="cpu")
        order = order.to(device)
        for s in range(total // args.batch_size):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            yield {n: t.index_select(0, idx) for n, t in gpu.items()}, args.batch_size

    def dataloader(epoch: int):
        nonlocal arrays
        if arrays is None:
            arrays = split_arrays(cache, names)
        dl = torch.utils.data.DataLoader(
            SplitDataset(arrays), batch_size=args.batch_size, shuffle=True, drop_last=True,
            num_workers=args.workers, pin_memory=on_cuda, persistent_workers=False,
            generator=torch.Generator().manual_seed(epoch))
        for b in dl:
            yield {n: t.to(device, non_blocking=True) for n, t in b.items()}, args.batch_size

    if static:
        return [
            ("padded", True, dsc_feed(batch_size=args.batch_size)),
            ("padded_host", True, dsc_feed(batch_size=args.batch_size, resident=False)),
            ("packed", True, dsc_feed(pack=pack)),
            ("packed_host", True, dsc_feed(pack=pack, resident=False)),
        ]
    return [
        ("resident", True, resident),
        ("padded", True, dsc_feed(batch_size=args.batch_size)),
        ("padded_host", True, dsc_feed(batch_size=args.batch_size, resident=False)),
        ("trimmed", False, dsc_feed(batch_size=args.batch_size, trim=True)),
        ("bucketed", False, dsc_feed(batch_size=args.batch_size, bucket=True)),
        ("packed", True, dsc_feed(pack=pack)),
        ("dataloader", True, dataloader),
    ]


def run(args, name: str, start, step, device: torch.device, busy: GpuBusy) -> Dict[str, Any]:
    """Warm-up steps, then ``--steps`` timed steps: samples/s, data wait, GPU busy."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    epoch, batches = 0, start(0)

    def next_batch():
        nonlocal epoch, batches
        while True:
            try:
                return next(batches)
            except StopIteration:
                epoch += 1
                batches = start(epoch)

    for _ in range(args.warmup):
        step(*next_batch())
    sync()
    busy.start()
    wait = 0.0
    samples = 0
    begin = time.perf_counter()
    for _ in range(args.steps):
        t0, gpu0 = time.perf_counter(), device_wait(start)
        batch, n = next_batch()
        # Not counted: next() waiting for the GPU to finish with a buffer (a GPU-bound run).
        wait += (time.perf_counter() - t0) - (device_wait(start) - gpu0)
        step(batch, n)
        samples += n
    issued = time.perf_counter() - begin
    sync()
    wall = time.perf_counter() - begin
    gpu = busy.stop()
    return dict(feed=name, samples_per_s=samples / wall, data_wait_share=wait / wall,
                gpu_busy=gpu, steps=args.steps, wall_s=wall,
                host_us_per_step=1e6 * issued / args.steps,
                step_us=1e6 * wall / args.steps)


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--pack", type=int, default=None, help="tokens a pack [default: "
                   "batch size x mean stored length]")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=300, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=30, help="steps before timing (compiles too)")
    p.add_argument("--loader-threads", type=int, default=4)
    p.add_argument("--workers", type=int, default=8, help="DataLoader worker processes")
    p.add_argument("--feeds",
                   default="resident,padded,padded_host,trimmed,bucketed,packed,packed_host,"
                           "dataloader")
    p.add_argument("--modes", default="feed,eager,graphs,whole")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", action="store_true", help="print one JSON list of the runs")
    args = p.parse_args(argv)

    global TRAIN
    TRAIN = load_train_module()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    cache = dsc.open(args.cache)
    pack = args.pack or max(cache.max_len, round(args.batch_size * mean_length(cache)))
    targs = TRAIN.parse_args(["--cache", args.cache, "--dim", str(args.dim), "--layers",
                              str(args.layers), "--heads", str(args.heads), "--device",
                              args.device])
    amp = "bf16" if on_cuda else "none"
    task = TRAIN.resolve_task(cache, "direction", None).to(device)
    inp = TRAIN.resolve_inputs(cache, True)
    names = inp.names + ["y", "key"]
    busy = GpuBusy((device.index or 0) if on_cuda else None)
    results = []
    wanted = args.feeds.split(",")
    for mode in args.modes.split(","):
        if mode == "feed":
            for r in feed_costs(args, cache, device, pack):
                results.append(r)
                if not args.json:
                    print(f"feed   {r['feed']:21} {r['ops_per_step']:5.1f} tensor ops/step · "
                          f"host {r['host_us_per_step']:,.0f} us/step · first batch "
                          f"{r['first_batch_s']:.3f} s · upload {r['upload_gib']:.2f} GiB in "
                          f"{r['upload_s']:.2f} s", flush=True)
            continue
        whole = mode == "whole"
        for name, static, start in feeds(args, cache, names, device, pack, static=whole):
            if name not in wanted or (mode == "graphs" and not static):
                continue
            torch.manual_seed(0)
            attention = TRAIN.attention_kind(targs, device, amp)
            model = TRAIN.build_model(targs, inp, task.outputs, attention).to(device)
            if whole:
                step = whole_step(start, model, task, targs, device, args.warmup + args.steps)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=on_cuda)
                forward = model
                if mode == "graphs":
                    forward = torch.compile(model, dynamic=False,
                                            mode="reduce-overhead" if on_cuda else None)

                def step(batch, n, forward=forward, opt=opt):
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_cuda):
                        pred = forward(batch)
                    loss = TRAIN.mean_loss(task, pred, batch)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

            r = run(args, name, start, step, device, busy)
            r.update(mode=mode, batch_size=args.batch_size, pack_tokens=pack if name == "packed" else None,
                     model=f"transformer dim {args.dim} x {args.layers}", device=str(device),
                     gpu=torch.cuda.get_device_name(device) if on_cuda else None,
                     attention=attention if name == "packed" else "padded")
            results.append(r)
            if not args.json:
                gpu = "n/a" if r["gpu_busy"] is None else f"{100 * r['gpu_busy']:.0f}%"
                print(f"{mode:6} {name:11} {r['samples_per_s']:>10,.0f} samples/s · data wait "
                      f"{100 * r['data_wait_share']:.2f}% · host {r['host_us_per_step']:,.0f} "
                      f"us/step of {r['step_us']:,.0f} · GPU busy {gpu}", flush=True)
    if args.json:
        print(json.dumps(results))
    return results


def feed_costs(args, cache: dsc.Cache, device: torch.device, pack: int) -> List[Dict[str, Any]]:
    """The resident feed alone (mode ``feed``), padded and packed, as a plain iterator, with
    static buffers, and with the gather left to the step: per ``next()`` (and ``gather()``), the
    top-level tensor operations it issues (torch.profiler; each one a launch on a GPU, or a
    view) and the host's microseconds; and how long the first batch took (``first_batch_s``:
    the split's upload for static buffers, which gather from it from the first step; a plain
    iterator serves the host path while the split uploads in the background) and the upload
    (``upload_s`` for ``upload_gib``)."""
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for shape, kw in (("padded", dict(batch_size=args.batch_size)), ("packed", dict(pack=pack))):
        for variant, extra in (("iterator", {}), ("static", dict(static=True)),
                               ("static_in_step", dict(static=True, gather_in_step=True))):
            loader = dsc.Loader(cache, seed=0, device=device, resident=True, **kw, **extra)
            left = len(loader) - 1
            sync()
            begin = time.perf_counter()
            batches = iter(loader)  # the split's upload

            def one():
                next(batches)
                if loader.gather_in_step:
                    loader.gather()

            one()  # and the static buffers
            sync()
            first = time.perf_counter() - begin
            loader._resident_split.wait()  # a plain iterator serves the host path meanwhile
            left -= 1
            one()
            profiled = max(1, min(20, left // 4))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(profiled):
                    one()
            ops = [e for e in prof.events() if e.name.startswith("aten::")
                   and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))]
            timed = max(1, min(args.steps, left - profiled))
            sync()
            begin = time.perf_counter()
            for _ in range(timed):
                one()
            host = time.perf_counter() - begin
            sync()
            out.append(dict(mode="feed", feed=f"{shape}_{variant}",
                            ops_per_step=len(ops) / profiled, host_us_per_step=1e6 * host / timed,
                            steps=timed, device=str(device),
                            first_batch_s=first, upload_s=loader.stats()["upload_s"],
                            upload_gib=split_bytes(loader) / 2**30,
                            batch_size=args.batch_size if shape == "padded" else None,
                            pack_tokens=pack if shape == "packed" else None))
            loader.close()
    return out


def whole_step(feed: DscFeed, model, task, targs, device: torch.device, steps: int):
    """examples/train.py's captured step (``--graph``: dsc.CapturedStep) over ``feed``'s static
    loader: fused AdamW at a constant learning rate of 1e-3 (the other modes' optimizer), no
    clipping."""
    on_cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    if feed.loader is None:
        feed.loader = feed.make()
    run = dsc.CapturedStep(model, lambda m, b: TRAIN.mean_loss(task, m(b), b), opt, feed.loader,
                           autocast=torch.bfloat16 if on_cuda else None)

    def step(batch, n):
        run()
    return step


TRAIN: Any = None

if __name__ == "__main__":
    main()
