"""torch.optim.AdamW over the steps dsc-train's AdamW took (trainer/tests/adamw_parity.rs).

Reads DIR/steps.safetensors (initial parameters `init.<name>`, the gradient of each step
`grad.<k>.<name>`) and DIR/steps.json (hyper-parameters), applies the same steps with PyTorch's
own pieces: parameter groups (weight decay on matrices only), torch.nn.utils.clip_grad_norm_,
torch.optim.AdamW, and the warmup + cosine schedule built from torch's LinearLR,
CosineAnnealingLR and SequentialLR. Writes DIR/torch.safetensors (final parameters) and prints
the learning rate of each step as JSON.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR


def main(out: Path) -> None:
    cfg = json.loads((out / "steps.json").read_text())
    tensors = load_file(str(out / "steps.safetensors"))
    names = cfg["names"]
    params = {n: torch.nn.Parameter(tensors[f"init.{n}"].clone()) for n in names}
    groups = [
        {"params": [params[n] for n in names if params[n].ndim >= 2],
         "weight_decay": cfg["weight_decay"]},
        {"params": [params[n] for n in names if params[n].ndim < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8, foreach=False)
    warmup, total = cfg["warmup"], cfg["total"]
    sched = SequentialLR(opt, [
        LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup - 1),
        CosineAnnealingLR(opt, T_max=total - warmup, eta_min=0.1 * cfg["lr"]),
    ], milestones=[warmup])
    lrs = []
    for k in range(cfg["steps"]):
        for n in names:
            params[n].grad = tensors[f"grad.{k}.{n}"].clone()
        if cfg["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["clip"])
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    save_file({n: p.detach().contiguous() for n, p in params.items()},
              str(out / "torch.safetensors"))
    print(json.dumps({"lrs": lrs}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
