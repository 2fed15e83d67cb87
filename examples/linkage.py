#!/usr/bin/env python3
"""Record linkage on Bloom filters: recover the character 2-grams of a person's first name from
the Bloom filter of their record, against predicting the most frequent 2-grams for everyone.

    dsc gen linkage --out people --records 4000
    dsc compile people/records.parquet --features yob --encode bloom=bits \\
        --encode first_name=ngrams:2 --val-fraction 0.25 --out people-cache
    python examples/linkage.py --cache people-cache

Compiled without ``--key``, the records are a table: each row one sample, keyed by its row
number, with no step axis. The cache holds each record's filter as its bits (``--encode
bloom=bits``: u8 ``[n, 256]``) and its first name as the multi-hot vector of its 2-grams over
the train split's 2-grams (``--encode first_name=ngrams:2``: u8 ``[n, V]``); ``Cache.decode``
turns either back into strings and sets. (A cache compiled with ``--key uid`` holds the same
as sequences of one step, ``[n, 1, 256]``; the script reads either.) An MLP reads the bits and predicts each 2-gram's presence
(binary cross-entropy); the score is the micro-averaged F1 of the predicted sets on held-out
records. The baseline predicts, for every record, the train split's most frequent 2-grams (as
many as a name has on average). At the end one JSON line summarises the run.
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
    p.add_argument("--bits", default="bloom", help="the bits tensor (input)")
    p.add_argument("--grams", default="first_name", help="the n-gram tensor (target)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print only the summary line")
    return p.parse_args(argv)


def f1(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Micro-averaged F1 of 0/1 predictions against 0/1 truth."""
    tp = (pred * true).sum().item()
    return 2 * tp / max(pred.sum().item() + true.sum().item(), 1.0)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    cache = dsc.open(args.cache)
    bits = cache.tensor(args.bits).shape[-1]
    grams = cache.tensor(args.grams).shape[-1]
    columns = [args.bits, args.grams]
    train = dsc.Loader(cache, split="train", batch_size=args.batch_size, seed=args.seed,
                       columns=columns)
    val = dsc.Loader(cache, split="val", batch_size=1024, shuffle=False, drop_last=False,
                     columns=columns)

    def one(t):
        # A table of records has no step axis; records keyed by uid are sequences of one step.
        return t if cache.is_records else t[:, 0]

    def xy(batch):
        return one(batch[args.bits]).float(), one(batch[args.grams]).float()

    # The baseline: the train split's most frequent grams, as many as a name has on average.
    counts, names = torch.zeros(grams), 0
    for batch in dsc.Loader(cache, split="train", batch_size=1024, shuffle=False,
                            drop_last=False, columns=columns):
        counts += xy(batch)[1][:batch.valid].sum(0)
        names += batch.valid
    per_name = max(1, round(counts.sum().item() / names))
    baseline = torch.zeros(grams)
    baseline[counts.topk(per_name).indices] = 1

    model = nn.Sequential(nn.Linear(bits, args.hidden), nn.ReLU(), nn.Linear(args.hidden, grams))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    start = time.perf_counter()
    history = []
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        total, steps = 0.0, 0
        for batch in train:
            x, y = xy(batch)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item()
            steps += 1
        model.eval()
        with torch.no_grad():
            pred, true = [], []
            for batch in val:
                x, y = xy(batch)
                # The last batch is completed with the split's first records: count each once.
                pred.append((model(x) > 0).float()[:batch.valid])
                true.append(y[:batch.valid])
        model.train()
        pred, true = torch.cat(pred), torch.cat(true)
        score = f1(pred, true)
        history.append({"epoch": epoch, "train_loss": total / max(steps, 1), "val_f1": score})
        say(f"epoch {epoch}: train loss {history[-1]['train_loss']:.4f}, val F1 {score:.3f}")
    base = f1(baseline.expand_as(true), true)
    # One record decoded back, to show what the tensors hold.
    first = next(iter(dsc.Loader(cache, split="val", batch_size=1, shuffle=False,
                                 columns=columns)))
    predicted = (model(xy(first)[0]) > 0).to(torch.uint8)
    if not cache.is_records:
        predicted = predicted.unsqueeze(1)
    example = {
        "bits": str(one(cache.decode(args.bits, first[args.bits]))[0])[:32] + "...",
        "grams": sorted(one(cache.decode(args.grams, first[args.grams]))[0]),
        "predicted": sorted(one(cache.decode(args.grams, predicted))[0]),
    }
    summary = dict(cache=args.cache, records_val=len(true), grams=grams, per_name=per_name,
                   val_f1=score, baseline_f1=base, epochs=history, example=example,
                   seconds=time.perf_counter() - start)
    say(f"validation: F1 {score:.3f} of the recovered 2-grams against {base:.3f} for the "
        f"{per_name} most frequent; e.g. {example['grams']} -> {example['predicted']}")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
