#!/usr/bin/env python3
"""Side-by-side learning benchmark: dsc-train against a plain PyTorch loop on the same cache.

Both train the same network (transformer or GRU of the same size, the same initialisation
rules), with the same hyper-parameters (AdamW with decay on matrices, global-norm clipping,
linear warmup over 5% of the steps then a cosine decay to a tenth of the peak, batch size,
each its own seeded shuffle), on the same cache, and both scale the inputs with the cache's
train statistics. They report the validation metric after each epoch and training samples/s
(training steps only, validation excluded).

The plain loop uses no dsc code to read data: it loads every shard of the cache with
``safetensors.torch.load_file`` into memory, shuffles with ``torch.randperm`` each epoch and cuts
each batch to its longest sequence, the way a user without dsc's loader would. Its network,
loss and optimizer come from ``examples/train.py`` (plain ``torch.nn`` modules), so the two
Python-side programs cannot drift apart. ``--with-example`` also runs ``examples/train.py``
itself (dsc's Python loader). ``--bucket`` also runs ``dsc-train --bucket`` (length-bucketed
batches) and compares its error and speed with plain ``dsc-train``.

    .venv/bin/python scripts/bench_learning.py --cache demo/cache --epochs 3 --with-example

Prints one JSON object; the table in docs/PERFORMANCE.md ("Learning") comes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import reference as example  # noqa: E402  (the reference networks, loss and optimizer)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="demo/cache")
    p.add_argument("--task", default="direction", choices=["direction", "classification"])
    p.add_argument("--target", default=None)
    p.add_argument("--model", default="transformer", choices=["transformer", "gru"])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=None, help="torch threads for both")
    p.add_argument("--dsc-train", default=str(ROOT / "target/release/dsc-train"))
    p.add_argument("--with-example", action="store_true",
                   help="also run examples/train.py (dsc's Python loader)")
    p.add_argument("--bucket", action="store_true",
                   help="also run dsc-train --bucket and compare it with dsc-train")
    p.add_argument("--speed-repeats", type=int, default=3,
                   help="extra one-epoch runs of each program, alternating, for the speed "
                        "medians (a shared machine's noise is larger than the difference)")
    return p.parse_args()


# --------------------------------------------------------------------------------------------
# The plain PyTorch loop
# --------------------------------------------------------------------------------------------

def read_split(cache: Path, manifest: dict, split: str) -> dict:
    """Every tensor of a split, all shards concatenated, via safetensors alone."""
    if any("compressed" in s for s in manifest["shards"]):
        sys.exit(f"{cache}: compressed shards; the plain loop reads safetensors files: "
                 f"run it on a hot cache (dsc decompress {cache})")
    parts = [load_file(str(cache / s["file"])) for s in manifest["shards"] if s["split"] == split]
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


def plain_inputs(manifest: dict, stats: dict) -> example.Inputs:
    """The networks' view of the cache, from manifest.json and stats.json."""
    train = next((s for s in stats["splits"] if s["split"] == "train"), stats["splits"][0])
    by_table = {(c["name"], c["table"]): c for c in train["columns"]}

    def norm(t):
        if t is None:
            return [], []
        pairs = [example.column_normalisation(c["encoding"], by_table.get((c["name"], c["source"]["table"])))
                 for c in t["columns"]]
        return [s for s, _ in pairs], [k for _, k in pairs]

    role = lambda r: [t for t in manifest["tensors"] if t["role"] == r]  # noqa: E731
    x = next(iter(role("features")), None)
    c = next(iter(role("context_features")), None)
    cats = role("categorical")
    return example.Inputs(
        x=x["name"] if x else None, features=x["sample_shape"][-1] if x else 0,
        categorical=[t["name"] for t in cats],
        vocabularies=[len(t["columns"][0]["encoding"]["vocabulary"]) + 2 for t in cats],
        context=c["name"] if c else None, context_features=c["sample_shape"][0] if c else 0,
        x_norm=norm(x), c_norm=norm(c), max_len=manifest["max_len"])


def plain_task(manifest: dict, kind: str, target) -> example.Task:
    y = next(t for t in manifest["tensors"] if t["role"] == "targets")
    names = [c["name"] for c in y["columns"]]
    wanted = target.split(",") if target else (["azimuth", "zenith"] if kind == "direction"
                                               else names)
    cols = [names.index(w) for w in wanted]
    if kind == "direction":
        return example.Task(kind, cols, wanted, 3)
    return example.Task(kind, cols, wanted, None)  # classification: outputs set by the caller


def plain_loop(args: argparse.Namespace) -> dict:
    cache = Path(args.cache)
    manifest = json.loads((cache / "manifest.json").read_text())
    stats = json.loads((cache / "stats.json").read_text())
    torch.manual_seed(args.seed)
    train, val = read_split(cache, manifest, "train"), read_split(cache, manifest, "val")
    inp = plain_inputs(manifest, stats)
    task = plain_task(manifest, args.task, args.target)
    if args.task == "classification":
        task.outputs = int(train["y"][:, task.index].max().item()) + 1
    ns = SimpleNamespace(model=args.model, dim=args.dim, layers=args.layers, heads=args.heads,
                         dropout=0.0, lr=args.lr, weight_decay=args.weight_decay)
    model = example.build_model(ns, inp, task.outputs)
    opt = example.build_optimizer(model, ns, torch.device("cpu"))
    names = [n for n in [inp.x, *inp.categorical, inp.context, "length", "y"] if n]
    seq = {n for n in [inp.x, *inp.categorical]}
    n_train = train["length"].shape[0]
    steps_epoch = n_train // args.batch_size
    total = steps_epoch * args.epochs
    warmup = total // 20

    def batch_of(split: dict, idx: torch.Tensor) -> dict:
        s = max(1, int(split["length"][idx].max()))
        return {n: (split[n][idx, :s] if n in seq else split[n][idx]) for n in names}

    epochs, step = [], 0
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(n_train)
        t0 = time.perf_counter()
        loss_sum = torch.zeros(())
        for b in range(steps_epoch):
            batch = batch_of(train, order[b * args.batch_size:(b + 1) * args.batch_size])
            for g in opt.param_groups:
                g["lr"] = args.lr * example.lr_factor(step, warmup, total)
            loss, _ = task(model(batch), batch["y"])
            loss = loss.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            loss_sum += loss.detach()
            step += 1
        train_s = time.perf_counter() - t0
        model.eval()
        n_val, metric_sum = val["length"].shape[0], 0.0
        with torch.no_grad():
            for b in range(0, n_val, args.batch_size):
                batch = batch_of(val, torch.arange(b, min(n_val, b + args.batch_size)))
                _, m = task(model(batch), batch["y"], metric=True)
                metric_sum += float(m.sum())
        epochs.append({"epoch": epoch, "train_loss": float(loss_sum) / steps_epoch,
                       "val_metric": metric_sum / n_val,
                       "samples_per_s": steps_epoch * args.batch_size / train_s})
    return {"epochs": epochs}


# --------------------------------------------------------------------------------------------
# dsc-train and examples/train.py
# --------------------------------------------------------------------------------------------

def common_flags(args: argparse.Namespace) -> list:
    flags = ["--cache", args.cache, "--task", args.task, "--model", args.model,
             "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
             "--dim", str(args.dim), "--layers", str(args.layers), "--heads", str(args.heads),
             "--lr", str(args.lr), "--weight-decay", str(args.weight_decay),
             "--clip", str(args.clip), "--seed", str(args.seed), "--json", "--device", "cpu"]
    if args.target:
        flags += ["--target", args.target]
    if args.torch_threads:
        flags += ["--torch-threads", str(args.torch_threads)]
    return flags


def run_json(cmd: list) -> dict:
    """The JSON summary a --json run prints on stdout."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def per_epoch(summary: dict) -> list:
    return [{"epoch": e["epoch"], "train_loss": e["train_loss"], "val_metric": e["val_metric"],
             "samples_per_s": e["samples_per_s"]} for e in summary["epochs"]]


def main() -> None:
    args = parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    results = {"cache": args.cache, "settings": {k: v for k, v in vars(args).items()
                                                 if k not in ("dsc_train", "with_example", "bucket")},
               "torch_threads": torch.get_num_threads()}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_learning_{os.getpid()}"
    results["dsc_train"] = per_epoch(run_json(
        [args.dsc_train, *common_flags(args), "--out", str(tmp / "dsc-train")]))
    bucketed = [args.dsc_train, *common_flags(args), "--bucket"]
    if args.bucket:
        results["dsc_train_bucketed"] = per_epoch(run_json(
            [*bucketed, "--out", str(tmp / "dsc-train-bucketed")]))
    results["plain_torch"] = plain_loop(args)["epochs"]
    if args.with_example:
        results["examples_train_py"] = per_epoch(run_json(
            [sys.executable, str(ROOT / "examples/train.py"), *common_flags(args)]))
    # Speed: every training epoch of every run counts; the programs alternate so that a slow
    # spell of the machine hits both.
    speeds = {k: [e["samples_per_s"] for e in results[k]]
              for k in ("dsc_train", "plain_torch", "dsc_train_bucketed") if k in results}
    one = argparse.Namespace(**{**vars(args), "epochs": 1})
    for _ in range(args.speed_repeats):
        speeds["dsc_train"] += [e["samples_per_s"] for e in per_epoch(run_json(
            [args.dsc_train, *common_flags(one), "--out", str(tmp / "dsc-train-speed")]))]
        speeds["plain_torch"] += [e["samples_per_s"] for e in plain_loop(one)["epochs"]]
        if args.bucket:
            speeds["dsc_train_bucketed"] += [e["samples_per_s"] for e in per_epoch(run_json(
                [args.dsc_train, *common_flags(one), "--bucket",
                 "--out", str(tmp / "dsc-train-bucketed-speed")]))]
    median = {k: statistics.median(v) for k, v in speeds.items()}
    results["samples_per_s"] = {k: {"median": median[k], "all": v} for k, v in speeds.items()}
    results["dsc_train_over_plain"] = {
        "val_metric_by_epoch": [a["val_metric"] / b["val_metric"] for a, b in
                                zip(results["dsc_train"], results["plain_torch"])],
        "samples_per_s_median": median["dsc_train"] / median["plain_torch"],
    }
    if args.bucket:
        results["bucketed_over_dsc_train"] = {
            "val_metric_by_epoch": [a["val_metric"] / b["val_metric"] for a, b in
                                    zip(results["dsc_train_bucketed"], results["dsc_train"])],
            "samples_per_s_median": median["dsc_train_bucketed"] / median["dsc_train"],
        }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
