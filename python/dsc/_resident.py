"""Splits resident on the device (used by ``_loader``, which it never imports): a split's tensors are uploaded once, in compiled order, and
every batch is gathered there by index, so that no batch crosses PCIe.

The Rust loader still decides every batch: for each step it writes the compiled-order positions
of the batch's contexts (and for a pack its own five tensors) into a small pinned block, from
the stored lengths alone (``LoaderHandle.fill_index``). One copy of that block per step goes to
the device; the batch is then a few ``index_select`` calls there. Order, trimming, bucketing,
packing and resume are the host path's, byte for byte (tests compare every batch), and the same
code runs with a CPU "device", which is how the tests run it without a GPU.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from ._errors import OptionsError

# Index blocks in flight: a block is refilled only after its copy to the device has finished,
# which its event says; four steps back, that wait is never felt.
RING = 4

# Contexts per piece when uploading a split (views of the shards in cache order, copied to the
# device piece by piece so that the host never holds a second copy).
UPLOAD_PIECE = 8192


def split_bytes(loader: Any) -> int:
    """Bytes the loader's tensors of its split take on the device."""
    per_context = sum(
        int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
        for t in loader.cache.schema if t.name in loader.columns
    )
    return per_context * loader.cache.splits[loader.split]


def default_budget(torch: Any, device: Any) -> int:
    """A quarter of the device's memory (of physical memory for the CPU): what a split may take
    before it stays on the host. The model, its activations and the optimizer need the rest."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory // 4
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


class ResidentSplit:
    """The loader's tensors of its split on ``device``, in compiled order: ``[contexts, ...]``
    each, copied there from ``reader``'s batches (the split in cache order, every context once:
    ``batch.valid`` leading rows each)."""

    def __init__(self, loader: Any, reader: Iterable[Any], torch: Any,
                 device: Any) -> None:
        cache, split = loader.cache, loader.split
        contexts = cache.splits[split]
        self.device = device
        self.tensors: Dict[str, Any] = {}
        for name in loader.columns:
            info = cache.tensor(name)
            self.tensors[name] = torch.empty((contexts, *info.shape),
                                             dtype=getattr(torch, info.dtype), device=device)
        at = 0
        for batch in reader:
            n = batch.valid
            for name, t in batch.items():
                self.tensors[name][at:at + n].copy_(t[:n])
            at += n
        if at != contexts:
            raise OptionsError(f"{cache.path}: read {at} of the {contexts} contexts of "
                               f"{split!r} while uploading it")


class IndexRing:
    """``RING`` host blocks for batch indices (pinned for a GPU), each copied to the device in
    one transfer and refilled only once that copy is done."""

    def __init__(self, torch: Any, device: Any, sizes: List[int]) -> None:
        self.torch, self.device = torch, device
        self.sizes = sizes
        self.offsets = list(np.cumsum([0] + sizes[:-1]))
        self.cuda = device.type == "cuda"
        total = max(8, sum(sizes))
        self.blocks = [torch.empty(total, dtype=torch.uint8, pin_memory=self.cuda)
                       for _ in range(RING)]
        self.views = [[b.numpy()[o:o + n] for o, n in zip(self.offsets, sizes)]
                      for b in self.blocks]
        self.copied: List[Optional[Any]] = [None] * RING

    def fill(self, step: int, write) -> tuple:
        """Writes step ``step``'s index with ``write(views)`` into the next block; returns what
        ``write`` returned and the block on the device (a copy of its own on the CPU)."""
        k = step % RING
        if self.copied[k] is not None:
            self.copied[k].synchronize()
        info = write(self.views[k])
        block = self.blocks[k]
        if self.cuda:
            on_device = block.to(self.device, non_blocking=True)
            event = self.torch.cuda.Event()
            event.record()
            self.copied[k] = event
        else:
            on_device = block.clone()
        return info, on_device

    def part(self, block: Any, i: int, dtype: Any, shape: List[int]) -> Any:
        """Part ``i`` of a device block as a tensor of ``dtype`` and ``shape``."""
        o, n = self.offsets[i], self.sizes[i]
        return block[o:o + n].view(dtype).view(shape)


def gather(torch: Any, split: ResidentSplit, layout: List[Any], ring: IndexRing, block: Any,
           rows: int, seq_len: int, pack: Optional[tuple], max_len: int,
           sequence: Dict[str, bool]) -> Dict[str, Any]:
    """One batch from the resident split: the host path's tensors, gathered on the device.

    ``layout``: the epoch's tensors (``_Tensor``); ``block``: the step's index on the device
    (positions, then a pack's own tensors); ``sequence``: which tensors have a step axis."""
    positions = ring.part(block, 0, torch.int64, [rows])
    out: Dict[str, Any] = {}
    if pack is None:
        for t in layout:
            res = split.tensors[t.name]
            if sequence[t.name] and seq_len < max_len:
                res = res.narrow(1, 0, seq_len)
            out[t.name] = res.index_select(0, positions)
        return out
    seqs, tokens = pack[0], pack[1]
    own = layout[-5:]
    for i, t in enumerate(own):
        out[t.name] = ring.part(block, 1 + i, torch.int32, list(t.whole))
    seq_idx, step_in_seq = out["seq_idx"], out["position"]
    # Each token's row in the flattened [contexts * L, ...] tensors: its sequence's position
    # times L plus its step; the unused tail (sequence S) is zeroed below.
    owner = seq_idx.clamp(max=rows - 1).long()
    token_rows = positions.index_select(0, owner) * max_len + step_in_seq.long()
    for t in layout[:-5]:
        res = split.tensors[t.name]
        if sequence[t.name]:
            flat = res.view(-1, *res.shape[2:])
            batch = flat.index_select(0, token_rows)
            batch[tokens:] = 0
        else:
            batch = res.index_select(0, positions)
            batch[seqs:] = 0
        out[t.name] = batch
    return {t.name: out[t.name] for t in layout}
