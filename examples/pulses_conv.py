#!/usr/bin/env python3
"""A model of your own in a loop of your own, at captured speed: a 1-D convolutional network over
IceCube-like pulses, trained with ``dsc.CapturedStep`` (the whole step as CUDA graphs on a GPU;
the same step uncaptured on the CPU) to predict the neutrino's direction.

    dsc gen icecube --out data --files 8 --events-per-file 2000
    dsc compile "data/train/batch_*.parquet" --key event_id --order-by time \\
        --context data/train_meta.parquet --targets azimuth,zenith \\
        --join data/sensor_geometry.csv --on sensor_id \\
        --features x,y,z,time,charge,auxiliary --categorical sensor_id \\
        --encode time=zscore --encode charge=log1p --max-len 128 --val-fraction 0.1 --out cache
    python examples/pulses_conv.py --cache cache --epochs 4

The pulses of an event, in time order, are a sequence of 6 features and a sensor: the network
embeds each pulse, runs dilated convolutions along time (the padding beyond ``length`` masked
to zero before each one), and pools the sequence with a masked mean and max. The loss is
``1 - cos`` between the predicted and the true direction; the metric the mean angular error in
radians, against the error of always predicting the training split's mean direction.

Everything dsc-specific is four lines: the static loader, ``dsc.CapturedStep``, the call after
each ``next()`` and ``step.loss()``. At the end one JSON line summarises the run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Dict, Optional, Sequence

import torch
from torch import nn

import dsc


def direction(y: torch.Tensor) -> torch.Tensor:
    """Unit vectors from ``[..., (azimuth, zenith)]`` in radians."""
    az, zen = y[..., 0], y[..., 1]
    return torch.stack([zen.sin() * az.cos(), zen.sin() * az.sin(), zen.cos()], -1)


class PulseConv(nn.Module):
    def __init__(self, sensors: int, dim: int, layers: int) -> None:
        super().__init__()
        self.pulse = nn.Linear(6, dim)
        self.sensor = nn.Embedding(sensors, dim)
        self.convs = nn.ModuleList(
            nn.Conv1d(dim, dim, kernel_size=3, padding=2 ** i, dilation=2 ** i)
            for i in range(layers))
        self.head = nn.Sequential(nn.Linear(2 * dim, dim), nn.GELU(), nn.Linear(dim, 3))
        # Metres (about +-500) to a unit scale; time and charge are stored encoded already.
        self.register_buffer("scale", torch.tensor([2e-3, 2e-3, 2e-3, 1.0, 1.0, 1.0]))

    def forward(self, b: Dict[str, torch.Tensor]) -> torch.Tensor:
        x = b["x"]
        keep = (torch.arange(x.shape[1], device=x.device) < b["length"][:, None])[:, None]
        h = (self.pulse(x * self.scale) + self.sensor(b["sensor_id"].long())).transpose(1, 2)
        for conv in self.convs:
            h = h + torch.relu(conv(h * keep))  # [B, dim, L]
        n = b["length"].clamp(min=1)[:, None].to(h.dtype)
        mean = (h * keep).sum(-1) / n
        top = torch.where(keep, h, torch.finfo(h.dtype).min).amax(-1)
        return self.head(torch.cat([mean, top], -1))


def loss_fn(model: nn.Module, b: Dict[str, torch.Tensor]) -> torch.Tensor:
    cos = nn.functional.cosine_similarity(model(b).float(), direction(b["y"]), dim=-1)
    return (1 - cos).mean()


@torch.no_grad()
def evaluate(model: nn.Module, cache: dsc.Cache, device: str) -> Dict[str, float]:
    """Mean angular error on the validation split, the model's and the mean direction's."""
    sums = dict(model=0.0, baseline=0.0)
    train = torch.cat([b["y"][: b.valid] for b in dsc.Loader(
        cache, split="train", batch_size=1024, shuffle=False, drop_last=False, columns=["y"])])
    mean_dir = nn.functional.normalize(direction(train).mean(0), dim=0)
    seen = 0
    model.eval()
    for b in dsc.Loader(cache, split="val", batch_size=256, shuffle=False, drop_last=False,
                        trim=False, device=device):
        rows = b.valid
        truth = direction(b["y"][:rows])
        pred = nn.functional.normalize(model(b)[:rows].float(), dim=-1)
        sums["model"] += float(torch.acos((pred * truth).sum(-1).clamp(-1, 1)).sum())
        sums["baseline"] += float(torch.acos((truth @ mean_dir.to(truth)).clamp(-1, 1)).sum())
        seen += rows
    model.train()
    return {k: v / max(seen, 1) for k, v in sums.items()}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", required=True, help="an IceCube-like cache (see above)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    cache = dsc.open(args.cache)
    loader = dsc.Loader(cache, batch_size=args.batch_size, seed=args.seed, device=args.device,
                        static=True, trim=False)
    model = PulseConv(cache.vocab_size("sensor_id"), args.dim, args.layers).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps = args.epochs * len(loader)
    step = dsc.CapturedStep(
        model, loss_fn, opt, loader, clip=1.0, steps=steps,
        schedule=lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / steps)),
        autocast=torch.bfloat16 if args.device.startswith("cuda") else None)
    start, history = time.perf_counter(), []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            step()
        history.append(dict(epoch=epoch, train_loss=step.loss(), **evaluate(model, cache,
                                                                            args.device)))
        print(f"epoch {epoch} · loss {history[-1]['train_loss']:.4f} · val angular error "
              f"{history[-1]['model']:.3f} rad (mean direction {history[-1]['baseline']:.3f})",
              flush=True)
    summary = dict(epochs=history, captured=step.captured, optimizer_steps=step.optimizer_steps,
                   samples_per_s=step.optimizer_steps * args.batch_size
                   / (time.perf_counter() - start))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
