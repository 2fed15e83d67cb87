"""Splits resident on the device (used by ``_loader``, which it never imports): a split's
tensors are uploaded once, in compiled order (in the background, while the host path serves the
first steps), and every batch is gathered there by index, so that no batch crosses PCIe.

The Rust loader still decides every batch: for each step it writes the compiled-order positions
of the batch's contexts (for a pack, also each token's row and the pack's own five tensors) into
a small pinned block, from the stored lengths alone (``LoaderHandle.fill_rows``). One copy of
that block per step goes to the device; the batch is then one ``index_select`` per stored
tensor there. Order, trimming, bucketing, packing and resume are the host path's, byte for byte
(tests compare every batch), and the same code runs with a CPU "device", which is how the tests
run it without a GPU.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional

import numpy as np

from ._errors import Error, OptionsError

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


# Tests hold a background upload here (an Event, set to let it go) to see the batches that the
# host path serves meanwhile.
UPLOAD_GATE: Optional[threading.Event] = None


def split_pieces(torch: Any, cache: Any, split: str, columns: List[str]) -> Iterator[tuple]:
    """``split`` of ``cache`` in cache order, ``UPLOAD_PIECE`` contexts at a time, as ``(rows,
    {name: tensor})`` (the tensors ``columns``; ``rows`` leading rows of each are the split's,
    every context once): read through the extension (``CacheHandle.split_reader``) as the
    loader reads, one thread, unshuffled. The reader is opened here, so that a refusal is
    raised to the caller, not in the upload's thread."""
    contexts = cache.splits[split]
    piece = max(1, min(UPLOAD_PIECE, contexts))
    handle = cache._handle.split_reader(split, list(columns), piece)
    names = [t[0] for t in handle.tensors()]

    def pieces() -> Iterator[tuple]:
        at = 0
        try:
            while at < contexts:
                item = handle.next()
                if item is None:
                    return
                n = min(piece, contexts - at)
                yield n, {name: torch.from_numpy(np.asarray(b))
                          for name, b in zip(names, item[2])}
                at += n
        finally:
            handle.close()

    return pieces()


class ResidentSplit:
    """The loader's tensors of its split on ``device``, in compiled order, each followed by one
    row of zeros: ``[contexts + 1, ...]``, copied there from ``reader``'s pieces (:func:`split_pieces`:
    the split in cache order, every context once). The zero row is what a
    pack's unused rows and tokens read (``LoaderHandle.fill_rows`` points them there), so that
    every tensor of a batch is one gather by row: nothing to zero afterwards, and no length
    known only on the host, which a captured CUDA graph could not take.

    ``background``: the upload runs in a thread, on a stream of its own on a GPU, while the
    loader serves the first steps from the host path (:meth:`ready` says when to switch), so
    that the first step does not wait for the whole split; otherwise it is done on return."""

    def __init__(self, loader: Any, reader: Iterable[tuple], torch: Any,
                 device: Any, background: bool = False) -> None:
        cache, split = loader.cache, loader.split
        self.contexts = cache.splits[split]
        # A generation that hides contexts (their keys replaced) is read without them, but the
        # index addresses rows by compiled position, hidden ones counted: each row is moved to
        # its position after the upload, and the zero row follows every stored context.
        self.live = cache._live_positions(split)
        contexts = self.contexts if self.live is None else \
            sum(s["contexts"] for s in cache.manifest["shards"] if s["split"] == split)
        self.where = f"{cache.path}: split {split!r}"
        self.device = device
        self.tensors: Dict[str, Any] = {}
        self.flat: Dict[str, Any] = {}
        self.sequence: Dict[str, bool] = {}  # which tensors have a step axis
        # Allocated here, on the consumer's stream, so that the allocator ties them to it.
        for name in loader.columns:
            info = cache.tensor(name)
            t = torch.empty((contexts + 1, *info.shape), dtype=getattr(torch, info.dtype),
                            device=device)
            t[contexts].zero_()
            self.tensors[name] = t
            self.sequence[name] = info.is_sequence
            # Per-step tensors as rows of steps, [(contexts + 1) * L, ...]: a pack's tokens.
            self.flat[name] = t.view(-1, *info.shape[1:]) if info.is_sequence else t
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        self.seconds = 0.0
        if device.type == "cuda":
            # The zero rows are written before any gather reads them, whatever stream reads.
            torch.cuda.current_stream(device).synchronize()
        if background:
            threading.Thread(target=self._upload, args=(torch, reader), daemon=True,
                             name="dsc-resident-upload").start()
        else:
            self._upload(torch, reader)
            self.wait()

    def _upload(self, torch: Any, reader: Iterable[Any]) -> None:
        began = time.perf_counter()
        try:
            if UPLOAD_GATE is not None:
                UPLOAD_GATE.wait()
            if self.device.type == "cuda":
                stream = torch.cuda.Stream(self.device)
                with torch.cuda.stream(stream):
                    at = _upload(torch, self.device, reader, self.tensors)
                stream.synchronize()
            else:
                at = _upload(torch, self.device, reader, self.tensors)
            if at != self.contexts:
                raise OptionsError(f"{self.where}: read {at} of its {self.contexts} contexts "
                                   "while uploading it")
            if self.live is not None:
                _to_positions(torch, self.device, self.tensors, self.live)
        except BaseException as e:  # noqa: BLE001 (raised in the consumer's thread)
            self._error = e
        finally:
            self.seconds = time.perf_counter() - began
            self._done.set()

    def ready(self) -> bool:
        """Whether the upload has finished (an upload that failed raises its error here)."""
        if not self._done.is_set():
            return False
        if self._error is not None:
            raise self._error
        return True

    def wait(self) -> None:
        """Until the upload has finished."""
        self._done.wait()
        self.ready()


def _to_positions(torch: Any, device: Any, tensors: Dict[str, Any], live: List[int]) -> None:
    """Moves the leading ``len(live)`` rows of ``tensors`` (the live contexts, uploaded one
    after another) to their compiled positions ``live``. Positions only grow past their row
    (``live[i] >= i``), so moving the rows from the last down overwrites only rows already
    moved; a block at a time keeps the copy small."""
    index = torch.tensor(live, dtype=torch.int64, device=device)
    block = 1 << 16
    for t in tensors.values():
        for a in reversed(range(0, len(live), block)):
            b = min(a + block, len(live))
            t.index_copy_(0, index[a:b], t[a:b].clone())
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _upload(torch: Any, device: Any, reader: Iterable[tuple], tensors: Dict[str, Any]) -> int:
    """Copies ``reader``'s pieces (:func:`split_pieces`) into the leading rows of ``tensors``; returns the rows
    copied. To a GPU each piece passes through one of two page-locked staging blocks, so that
    the copy is a DMA at the link's speed (a copy from pageable memory is staged by the driver
    in small pieces and blocks the host) and the host fills one block while the other is
    copied."""
    at = 0
    if device.type != "cuda":
        for n, batch in reader:
            for name, t in batch.items():
                tensors[name][at:at + n].copy_(t[:n])
            at += n
        return at
    staging: List[Dict[str, Any]] = [{}, {}]
    copied: List[Optional[Any]] = [None, None]
    for i, (n, batch) in enumerate(reader):
        k = i % 2
        if copied[k] is not None:
            copied[k].synchronize()  # the block's last copy has run: it may be refilled
        for name, t in batch.items():
            block = staging[k].get(name)
            if block is None or block.shape[0] < n:
                block = staging[k][name] = torch.empty(
                    (max(n, UPLOAD_PIECE), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
            block[:n].copy_(t[:n])
            tensors[name][at:at + n].copy_(block[:n], non_blocking=True)
        copied[k] = torch.cuda.Event()
        copied[k].record()
        at += n
    for event in copied:
        if event is not None:
            event.synchronize()
    return at


class BlockRing:
    """``RING`` host blocks (pinned for a GPU) for what a step sends to the device, each copied
    there in one transfer and refilled only once that copy is done: batch indices, or, while a
    split uploads, whole batches. ``fixed``: a device block of the same size that every copy
    lands in (static batches), instead of a new one per step."""

    def __init__(self, torch: Any, device: Any, sizes: List[int],
                 fixed: Optional[Any] = None) -> None:
        self.torch, self.device = torch, device
        self.sizes = sizes
        self.offsets = [int(o) for o in np.cumsum([0] + sizes[:-1])]
        self.cuda = device.type == "cuda"
        total = max(8, sum(sizes))
        self.blocks = [torch.empty(total, dtype=torch.uint8, pin_memory=self.cuda)
                       for _ in range(RING)]
        self.views = [[b.numpy()[o:o + n] for o, n in zip(self.offsets, sizes)]
                      for b in self.blocks]
        self.copied: List[Optional[Any]] = [None] * RING
        self.fixed = fixed


    def fill(self, step: int, write) -> tuple:
        """Writes step ``step``'s index with ``write(views)`` into the next block; returns what
        ``write`` returned, the block on the device (a copy of its own on the CPU; the fixed
        block, if there is one) and the seconds spent waiting for the block's last copy."""
        k = step % RING
        waited = 0.0
        if self.copied[k] is not None:
            began = time.perf_counter()
            self.copied[k].synchronize()
            waited = time.perf_counter() - began
        info = write(self.views[k])
        block = self.blocks[k]
        if self.fixed is not None:
            on_device = self.fixed
            on_device.copy_(block, non_blocking=self.cuda)
        elif self.cuda:
            on_device = block.to(self.device, non_blocking=True)
        else:
            on_device = block.clone()
        if self.cuda:
            event = self.torch.cuda.Event()
            event.record()
            self.copied[k] = event
        return info, on_device, waited


def block_tensors(torch: Any, layout: List[Any], block: Any, ranges: List[tuple],
                  seq_len: int) -> Dict[str, Any]:
    """A batch's tensors as views of its block (``LoaderHandle.fill_block``'s ``ranges``)."""
    return {t.name: block[offset:offset + n].view(getattr(torch, t.dtype)).view(t.shape(seq_len))
            for t, (offset, n) in zip(layout, ranges)}


class IndexLayout:
    """The parts of a loader's batch index as Rust names them (``LoaderHandle.index_layout``,
    the order ``fill_rows`` writes them): positions ``[rows]``, a pack's token rows ``[T]``
    (an empty part for padded batches), then the tensors of the shape's own that the index
    carries whole (a pack's five), each ``(name, dtype, shape)``."""

    def __init__(self, handle: Any) -> None:
        parts = handle.index_layout()
        if parts is None:
            raise Error("series windows are not indexed: a resident split serves whole "
                        "contexts or packs")
        self.parts = [(name, dtype, list(shape)) for name, dtype, shape, _ in parts]
        self.sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                      for _, dtype, shape in self.parts]
        self.own = {name for name, _, _ in self.parts[2:]}

    def views(self, torch: Any, block: Any) -> tuple:
        """The parts of a device index ``block``: positions, the token rows (None for padded
        batches) and the shape's own tensors by name."""
        offsets = [int(o) for o in np.cumsum([0] + self.sizes[:-1])]
        views = [block[o:o + n].view(getattr(torch, dtype)).view(shape)
                 for o, n, (_, dtype, shape) in zip(offsets, self.sizes, self.parts)]
        token_rows = views[1] if self.sizes[1] else None
        return views[0], token_rows, {name: v for (name, _, _), v in
                                      zip(self.parts[2:], views[2:])}


def gather(torch: Any, split: ResidentSplit, stored: List[Any], parts: tuple, seq_len: int,
           max_len: int, out: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One batch's stored tensors from the resident split, by the index ``parts``
    (:meth:`IndexLayout.views`): one ``index_select`` by row per tensor, a pack's per-step tensors by
    token row; the host path's bytes. ``stored``: their ``_Tensor``s. With ``out`` (static batches), each lands in its tensor there, and the
    whole gather is tensor operations with no host sync and no allocation: capturable."""
    positions, token_rows, _ = parts
    sequence = split.sequence
    result: Dict[str, Any] = {}
    for t in stored:
        if token_rows is not None and sequence[t.name]:
            source, index = split.flat[t.name], token_rows
        else:
            source, index = split.tensors[t.name], positions
            if sequence[t.name] and seq_len < max_len:
                source = source.narrow(1, 0, seq_len)
        if out is None:
            result[t.name] = source.index_select(0, index)
        else:
            result[t.name] = torch.index_select(source, 0, index, out=out[t.name])
    return result
