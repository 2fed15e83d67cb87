#!/usr/bin/env python3
"""Microbiome samples: tell a sample's body site from its DNA sequence variants, each read as
characters, against always predicting the most frequent site.

    dsc gen microbiome --out microbes --records 600
    dsc compile microbes/asvs.parquet --key sample_id --features count --encode count=log1p \\
        --encode asv=chars:150 --context microbes/samples.parquet --targets site \\
        --val-fraction 0.25 --out microbes-cache
    python examples/dna.py --cache microbes-cache

A sample is a context, its amplicon sequence variants (ASVs) the rows: ``--encode
asv=chars:150`` stores each ASV's bases as i32 codes over the train split's characters
(``[n, L, 150]``, 0 for padding and 1 for a base the train split never showed), beside its
read count (``x``, log1p). The network embeds the bases, reads each ASV with a small 1-D
convolution (max over positions), weighs the ASVs by their counts, averages them over the
sample's stored ASVs (``length``) and classifies the site (``y``). At the end one JSON line
summarises the run: the validation accuracy of the network and of the majority baseline.
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
    p.add_argument("--cache", required=True)
    p.add_argument("--sequences", default="asv", help="the chars tensor of the sequences")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print only the summary line")
    return p.parse_args(argv)


class SiteNet(nn.Module):
    """Bases → embedding → conv → max over positions per ASV → count-weighted mean over the
    sample's ASVs → site logits."""

    def __init__(self, codes: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(codes, dim, padding_idx=0)
        self.conv = nn.Conv1d(dim, dim, kernel_size=9, padding=4)
        self.head = nn.Linear(dim, classes)

    def forward(self, codes: torch.Tensor, count: torch.Tensor, length: torch.Tensor):
        b, l, w = codes.shape
        h = self.embed(codes.long().view(b * l, w)).transpose(1, 2)   # [B*L, D, W]
        h = torch.relu(self.conv(h)).amax(2).view(b, l, -1)           # [B, L, D]
        mask = (torch.arange(l)[None, :] < length[:, None]).float()
        weight = mask * (1.0 + count)                                  # count is log1p
        pooled = (h * weight[..., None]).sum(1) / weight.sum(1, keepdim=True).clamp_min(1e-6)
        return self.head(pooled)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    cache = dsc.open(args.cache)
    info = cache.tensor(args.sequences)
    codes = len(info.encodings[0]["vocabulary"]) + 2           # 0 padding, 1 unknown
    columns = [args.sequences, "x", "length", "y"]
    train = dsc.Loader(cache, split="train", batch_size=args.batch_size, seed=args.seed,
                       columns=columns, trim=True)
    val = dsc.Loader(cache, split="val", batch_size=256, shuffle=False, drop_last=False,
                     columns=columns, trim=True)
    sites = torch.cat([b["y"][:b.valid, 0] for b in dsc.Loader(
        cache, split="train", batch_size=1024, shuffle=False, drop_last=False,
        columns=["y"])]).long()
    classes = int(sites.max()) + 1
    majority = int(sites.bincount().argmax())
    model = SiteNet(codes, args.dim, classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr,
                                                total_steps=args.epochs * len(train))
    start = time.perf_counter()
    history = []

    def forward(batch):
        return model(batch[args.sequences], batch["x"][..., 0], batch["length"])

    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        total, steps = 0.0, 0
        for batch in train:
            loss = nn.functional.cross_entropy(forward(batch), batch["y"][:, 0].long())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
            steps += 1
        model.eval()
        hits = base = n = 0
        with torch.no_grad():
            for batch in val:
                # The last batch is completed with the split's first samples: count each once.
                truth = batch["y"][:batch.valid, 0].long()
                hits += (forward(batch).argmax(1)[:batch.valid] == truth).sum().item()
                base += (truth == majority).sum().item()
                n += len(truth)
        model.train()
        history.append({"epoch": epoch, "train_loss": total / max(steps, 1),
                        "val_accuracy": hits / n})
        say(f"epoch {epoch}: train loss {history[-1]['train_loss']:.4f}, val accuracy "
            f"{hits / n:.3f} (majority {base / n:.3f})")
    summary = dict(cache=args.cache, samples_val=n, classes=classes, val_accuracy=hits / n,
                   majority_accuracy=base / n, epochs=history,
                   seconds=time.perf_counter() - start)
    say(f"validation: accuracy {hits / n:.3f} against {base / n:.3f} for the majority site")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
