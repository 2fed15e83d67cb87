"""Static batches (``dsc.Loader(static=True)``, used by ``_loader`` and ``_epochs``, which it
never imports): every batch of a loader lands in one set of tensors on its device, allocated
once, so that a captured CUDA graph (which replays on the same addresses every time) can read
them.

- **Resident split**: the buffers are one fixed device index block (the step's positions, a
  pack's token rows and its own five tensors, whose views are the pack's tensors in the batch)
  and one output tensor per stored tensor. Per step the host writes the index into a pinned
  block and copies it into the fixed one (one copy, on the consumer's stream); the gather
  (:meth:`StaticBatch.gather`) is one ``index_select`` per stored tensor into its output:
  capturable, so that it can run inside the caller's graph.
- **Host path**: one device block that every batch's block is copied into, each tensor a view
  of it at the offset the loader gives it (``LoaderHandle.fill_block``); the gather is a no-op.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from . import _resident
from ._errors import Error


def block_ranges(sizes: Sequence[int], align: int) -> List[tuple]:
    """``(offset, bytes)`` of each tensor of a whole batch in a block (``fill_block``'s
    layout: one after another, each at a multiple of ``align``)."""
    ranges, end = [], 0
    for n in sizes:
        start = -(-end // align) * align
        ranges.append((start, n))
        end = start + n
    return ranges


class StaticBatch:
    """A loader's static buffers on ``device``.

    ``layout``: the loader's ``_Tensor`` list (stored tensors, then the shape's own);
    ``sizes``: each one's bytes in a whole batch; ``index``: for a resident split, the parts of
    its batch index (``_resident.IndexLayout``), else None."""

    def __init__(self, torch: Any, device: Any, layout: List[Any], sizes: List[int],
                 align: int, index: Optional[Any]) -> None:
        self.torch, self.device = torch, device
        self.names = [t.name for t in layout]
        self.resident = index is not None
        self.tensors: Dict[str, Any] = {}
        if self.resident:
            self.stored = [t for t in layout if t.name not in index.own]
            self.block = torch.empty(max(8, sum(index.sizes)), dtype=torch.uint8, device=device)
            # Before the first step the positions point at the split's first context (a
            # gather run early reads real rows, never memory past the split).
            self.block.zero_()
            for t in self.stored:
                self.tensors[t.name] = torch.empty(t.whole, dtype=getattr(torch, t.dtype),
                                                   device=device)
            self.parts = index.views(torch, self.block)
            self.tensors.update(self.parts[2])
        else:
            self.ranges = block_ranges(sizes, align)
            end = self.ranges[-1][0] + self.ranges[-1][1] if self.ranges else 0
            self.block = torch.zeros(max(8, end), dtype=torch.uint8, device=device)
            for t, (offset, n) in zip(layout, self.ranges):
                self.tensors[t.name] = (self.block[offset:offset + n]
                                        .view(getattr(torch, t.dtype)).view(t.whole))

    def batch(self) -> Dict[str, Any]:
        """The buffers in the loader's tensor order."""
        return {n: self.tensors[n] for n in self.names}

    def gather(self, split: Any, max_len: int) -> None:
        """Fills the stored tensors from the resident ``split`` by the index now in the fixed
        block: tensor operations only, capturable."""
        if not self.resident:
            return
        _resident.gather(self.torch, split, self.stored, self.parts, max_len, max_len,
                         out=self.tensors)

    def load(self, on_device: Any, ranges: List[tuple]) -> None:
        """Host path: copies a batch's device block (tensors at ``ranges``) into the fixed one,
        on the current stream."""
        if [tuple(r) for r in ranges] != self.ranges:
            raise Error(f"a static batch changed its layout ({ranges} after {self.ranges}): "
                        "static buffers need one shape for every batch")
        end = self.ranges[-1][0] + self.ranges[-1][1]
        self.block[:end].copy_(on_device[:end])

    def load_tensors(self, tensors: Dict[str, Any]) -> None:
        """Host path on the CPU: copies a batch's tensors into the fixed ones."""
        for name, t in tensors.items():
            self.tensors[name].copy_(t)
