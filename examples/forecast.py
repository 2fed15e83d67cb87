#!/usr/bin/env python3
"""Forecasting on windows of long series: a GRU reads ``W`` steps of a series and predicts the next
``H`` steps of one column, trained on windows the loader cuts from every series
(``dsc.Loader(series_window=W, stride=S, horizon=H)``), against repeating the last value.

    dsc gen series --out sensors --series 200 --steps 500:3000
    dsc compile sensors/readings.parquet --key series_id --order-by t \\
        --features value,load,temp --encode value=zscore --encode load=zscore \\
        --encode temp=zscore --max-len 3000 --val-fraction 0.2 --out sensors-cache
    python examples/forecast.py --cache sensors-cache --window 48 --horizon 4

The cache holds each series whole (``--max-len`` as long as the longest series: padding costs
``L - length`` steps of zeros per series, nothing per window); nothing is copied per window, a
window is a slice of its series read at gather time. Every window of the training series comes
once per epoch, shuffled across series (the usual windowed shuffle, over windows); the
validation series are held out whole (the split is by series), and read with windows that do
not overlap. The inputs are stored z-scored (``--encode ...=zscore``), so the network needs no
normalisation of its own; errors are reported in the target's source units.

At the end one JSON line summarises the run: the validation mean absolute error of the network
and of the last-value baseline, and their ratio (below 1: the network beats the baseline).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, Optional, Sequence

import torch
from torch import nn

import dsc


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", required=True, help="a cache of long series (or its URL)")
    p.add_argument("--window", type=int, default=48, help="input steps per window, W")
    p.add_argument("--stride", type=int, default=2, help="steps between training windows, S")
    p.add_argument("--horizon", type=int, default=1, help="steps to predict, H")
    p.add_argument("--target", default="value", help="the column of x to predict")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=None, help="torch threads")
    p.add_argument("--json", action="store_true", help="print only the summary line")
    return p.parse_args(argv)


class Forecaster(nn.Module):
    """A GRU over the window's steps; the last hidden state predicts the next ``H`` values."""

    def __init__(self, features: int, hidden: int, horizon: int) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def target_scale(cache: dsc.Cache, column: str) -> float:
    """Source units per stored unit of ``x``'s column (its z-score's std; 1 when stored raw)."""
    x = cache.tensor("x")
    stages = x.encodings[x.columns.index(column)].get("stages", [])
    scale = 1.0
    for st in stages:
        if st["op"] == "zscore":
            scale *= st["std"]
        elif st["op"] == "minmax":
            scale *= st["max"] - st["min"]
    return scale


def evaluate(model: nn.Module, loader: dsc.Loader, column: int) -> Dict[str, float]:
    """Mean absolute error (stored units) of the model and of repeating the last value."""
    model.eval()
    err = base = 0.0
    n = 0
    with torch.no_grad():
        for batch in loader:
            # The last batch is completed with the split's first windows: count each once.
            x, y = batch["x"][:batch.valid], batch["y_next"][:batch.valid, :, 0]
            err += (model(x) - y).abs().sum().item()
            base += (x[:, -1:, column] - y).abs().sum().item()
            n += y.numel()
    model.train()
    return {"model": err / max(n, 1), "baseline": base / max(n, 1), "targets": n}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    cache = dsc.open(args.cache)
    columns = list(cache.tensor("x").columns)
    column = columns.index(args.target)
    windows = dict(series_window=args.window, horizon=args.horizon,
                   horizon_columns=[args.target], columns=["x", "length"])
    train = dsc.Loader(cache, split="train", batch_size=args.batch_size, seed=args.seed,
                       stride=args.stride, **windows)
    val = dsc.Loader(cache, split="val", batch_size=1024, shuffle=False, drop_last=False,
                     stride=args.window, **windows)
    model = Forecaster(len(columns), args.hidden, args.horizon)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr,
                                                total_steps=args.epochs * len(train))
    start = time.perf_counter()
    history = []
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        total, steps = torch.zeros(()), 0
        for batch in train:
            pred = model(batch["x"])
            loss = (pred - batch["y_next"][:, :, 0]).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.detach()
            steps += 1
        mae = evaluate(model, val, column)
        history.append({"epoch": epoch, "train_mse": float(total) / max(steps, 1),
                        "val_mae": mae["model"]})
        say(f"epoch {epoch}: train mse {history[-1]['train_mse']:.4f}, val mae "
            f"{mae['model']:.4f} (last value {mae['baseline']:.4f}) stored units")
    scale = target_scale(cache, args.target)
    summary = dict(
        cache=args.cache, window=args.window, stride=args.stride, horizon=args.horizon,
        target=args.target, train_windows=len(train) * args.batch_size,
        val_windows=mae["targets"] // args.horizon, epochs=history,
        val_mae=mae["model"] * scale, baseline_mae=mae["baseline"] * scale,
        mae_over_baseline=mae["model"] / mae["baseline"],
        seconds=time.perf_counter() - start, loader=train.stats(),
    )
    say(f"validation: mean absolute error {summary['val_mae']:.4f} against "
        f"{summary['baseline_mae']:.4f} for the last value ({args.target}, source units): "
        f"{summary['mae_over_baseline']:.2f} of the baseline")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
