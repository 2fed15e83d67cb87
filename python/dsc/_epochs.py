"""The iterators behind `dsc.Loader`: one epoch each, composed of two choices made once by
the loader (``Loader._new_epoch``): where batches come from, and where they go.

Where they come from (a source):

- **host** (`_HostSource`, the default): the Rust loader's own threads prepare batches ahead;
  a batch in cache order is a view of the mapped shards (no copy), any other is one gather into
  a buffer that the batch then owns. Waiting for a batch releases the GIL.
- **pinned** (`_PinnedSource`, ``pin_memory=True`` without a device): Python threads gather
  each batch straight into fresh page-locked tensors from torch's caching host allocator.
- **staged, to a GPU** (`_StagedSource`): Python threads gather whole batches into a fixed ring
  of pinned blocks, one copy per batch on a copy stream.
- **resident** (`_ResidentSource`): the split lives on the device; each batch is gathered there
  by index.

Where they go (a sink): fresh tensors that the batch owns (`_Fresh`: nothing is reused while a
tensor of it is alive, so a batch stays valid for as long as you hold it), or the loader's
static buffers (`_Static`, ``static=True``: the same tensors every step, for a captured step).

The epoch reads its loader's settings and calls back its bookkeeping (`_consumed`,
`_finished`, `_valid`) without importing the loader's module.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _resident
from ._batch import FORK_ADVICE, Batch, _torch
from ._errors import Error, WorkerError


class _Tensor:
    """One tensor of an epoch's batches, worked out once per epoch, so that a batch costs one
    array and one tensor over each buffer (what Python spends per batch bounds the loader's
    rate on many cores: issue 28, item 3)."""

    __slots__ = ("name", "dtype", "before", "after", "whole", "make")

    def __init__(self, loader: Any, name: str, dtype: str, whole: Sequence[int],
                 axis: Optional[int]) -> None:
        self.name, self.dtype = name, dtype
        self.whole = tuple(whole)
        # The shape around the trimmed axis (None: the shape is always `whole`).
        self.before = None if axis is None else self.whole[:axis]
        self.after = None if axis is None else self.whole[axis + 1:]
        # The buffer exports its typed, shaped array: `numpy.asarray` takes it in one call.
        asarray = np.asarray
        if loader.format == "numpy":
            if loader.copy:
                def make(buffer: Any):
                    return asarray(buffer).copy() if buffer.zero_copy else asarray(buffer)
            else:
                make = asarray
        else:
            from_numpy = _torch().from_numpy
            if loader.copy:
                def make(buffer: Any):
                    # A view of the loader's read-only mapping (with copy=True no private map
                    # is made): one copy, which the tensor then owns.
                    array = asarray(buffer)
                    return from_numpy(array.copy() if buffer.zero_copy else array)
            else:
                def make(buffer: Any):
                    return from_numpy(asarray(buffer))
        self.make = make

    def shape(self, seq_len: int) -> Tuple[int, ...]:
        return self.whole if self.before is None else self.before + (seq_len,) + self.after


class _Fresh:
    """The sink of a batch in tensors of its own."""

    fixed_block = None

    def __init__(self, loader: Any, source: Any) -> None:
        pass

    def tensors(self, tensors: Dict[str, Any]) -> Dict[str, Any]:
        return tensors

    def block(self, torch: Any, layout: List[Any], on_device: Any, ranges: List[tuple],
              seq_len: int) -> Dict[str, Any]:
        """A batch's tensors as views of its device block (``ranges``: ``fill_block``'s)."""
        return _resident.block_tensors(torch, layout, on_device, ranges, seq_len)


class _Static:
    """The sink of every batch in the loader's static buffers (``static=True``): the same
    tensors every step, so that a captured step replays on them."""

    def __init__(self, loader: Any, source: Any) -> None:
        self.loader = loader
        self.static = loader._static_buffers(source)
        # A resident split's index lands in the buffers' own block.
        self.fixed_block = self.static.block if self.static.resident else None

    def tensors(self, tensors: Dict[str, Any]) -> Dict[str, Any]:
        """Copies a batch's tensors in, by tensor (the paths that make a new batch each step)."""
        self.static.load_tensors(tensors)
        return self.static.batch()

    def block(self, torch: Any, layout: List[Any], on_device: Any, ranges: List[tuple],
              seq_len: int) -> Dict[str, Any]:
        """One copy of a batch's device block on the consumer's stream into the fixed one."""
        self.static.load(on_device, ranges)
        return self.static.batch()

    def gathered(self, split: Any, max_len: int) -> Dict[str, Any]:
        """A resident batch whose index is in the fixed block: gathered now, or by the caller's
        step (``gather_in_step``)."""
        if not self.loader.gather_in_step:
            self.static.gather(split, max_len)
        return self.static.batch()


class _Epoch:
    """An iterator over the rest of the loader's current epoch, from ``source`` into a sink of
    kind ``sink`` (`_Fresh`, `_Static`). It holds its loader (``next(iter(dsc.Loader(...)))`` works); the
    loader refers to it weakly."""

    def __init__(self, loader: Any, source: Any, sink: Any) -> None:
        self.loader = loader
        self.pid = loader._pid
        self.epoch = loader._epoch
        self.thread = threading.get_ident()
        self._busy = threading.Lock()
        self.source = source
        try:
            self.sink = sink(loader, source)
            source.start(self.sink)
        except BaseException:
            source.close()  # its threads stop, its Rust loader closes
            raise

    @property
    def handle(self) -> Any:
        """The Rust loader of the epoch (None once closed)."""
        return self.source.handle

    def __iter__(self) -> "_Epoch":
        return self

    def _owner(self) -> Any:
        if os.getpid() != self.pid:
            raise WorkerError(
                f"a dsc.Loader iterator made in process {self.pid} was used in process "
                f"{os.getpid()} (a fork). {FORK_ADVICE}"
            )
        return self.loader

    def __next__(self) -> Batch:
        loader = self._owner()
        if not self._busy.acquire(blocking=False):
            raise WorkerError(
                "two threads called next() on one dsc.Loader iterator at once: each batch goes "
                "to one caller. Take batches in one thread (and hand them on through a queue), "
                "or give each thread its own dsc.Loader"
            )
        try:
            return self._next_locked(loader)
        finally:
            self._busy.release()

    def _next_locked(self, loader: Any) -> Batch:
        source = self.source
        if source.handle is None:
            raise StopIteration
        queued = source.queued()
        asked = time.perf_counter()
        try:
            item = source.next_item()
        except BaseException:
            # The position stays at the failed batch: a new iter() retries from there.
            self.close()
            raise
        if item is None:
            self.close()
            loader._finished(self)
            raise StopIteration
        waited = time.perf_counter() - asked
        step, seq_len, pack, tensors = source.deliver(item, self.sink)
        batch = Batch(tensors, self.epoch, step, seq_len, loader._valid(step, pack),
                      pack and pack[:3])
        device, source.device_wait = min(source.device_wait, waited), 0.0
        loader._consumed(self)
        loader._record(batch, waited - device, queued, device)
        return batch

    def close(self) -> None:
        self.source.close()


class _HostSource:
    """Batches from the Rust loader's own threads (``threads``: how many; the loader's
    ``num_threads`` by default), moved to the loader's device if it has one."""

    def __init__(self, loader: Any, threads: Optional[int] = None) -> None:
        self.loader = loader
        self.handle = loader._handle(loader.num_threads if threads is None else threads)
        self.layout = [_Tensor(loader, *t) for t in self.handle.tensors()]
        # Seconds the current next() spent waiting for the device to finish with a buffer (a
        # copy still queued behind the consumer's work): back-pressure from a busy GPU, which
        # is not a data stall and is counted apart (Loader.stats: device_wait_s).
        self.device_wait = 0.0

    def start(self, sink: Any) -> None:
        """Starts delivering into ``sink`` (its threads, its rings)."""

    def next_item(self):
        return self.handle.next()

    def queued(self) -> int:
        """Batches prepared ahead of the consumer now."""
        return self.handle.queued()

    def deliver(self, item: Any, sink: Any) -> tuple:
        """``(step, seq_len, pack, tensors)`` of ``item``, its tensors put where ``sink`` keeps
        them."""
        step, (seq_len, pack), buffers = item
        tensors = {t.name: t.make(buf) for t, buf in zip(self.layout, buffers)}
        if self.loader.device is not None:
            # Not pinned memory: a non-blocking copy could still be reading the buffer when
            # its tensor is freed and the buffer reused.
            tensors = dict(Batch(tensors).to(self.loader.device))
        return step, seq_len, pack, sink.tensors(tensors)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def _produce(handle, sizes: List[int], pin: bool, queues: List[queue.Queue],
             stop: threading.Event, k: int, first: int, total: int) -> None:
    """A pinned-path producer: fills every ``len(queues)``-th step from ``first + k`` into fresh
    (pinned) torch buffers. It holds no reference to its epoch, so an abandoned epoch is
    collected, and its finaliser sets ``stop``."""
    torch = _torch()
    threads = len(queues)

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                queues[k].put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    try:
        for step in range(first + k, total, threads):
            if stop.is_set():
                return
            bufs = [torch.empty(max(n, 8), dtype=torch.uint8, pin_memory=pin) for n in sizes]
            info = handle.fill(step, [b.numpy()[:n] for b, n in zip(bufs, sizes)])
            put((step, info, bufs))
    except BaseException as e:  # noqa: BLE001 (handed to the consumer, raised there)
        put(e)


class _ThreadedSource(_HostSource):
    """Batches that ``max(1, num_threads)`` Python threads prepare, thread ``k`` every
    ``num_threads``-th step from the first (the gathers run in Rust with the GIL released); the
    consumer takes the steps in order from the threads' queues."""

    def __init__(self, loader: Any, name: str, target: Any) -> None:
        """``target(*self.args(k), queues, stop, k, first, total)`` runs thread ``k``."""
        super().__init__(loader, threads=0)  # the Python threads below fill the batches
        self.name, self.target = name, target
        self.first = self.handle.position()
        self.total = self.handle.steps()
        self.next_step = self.first
        self.stop = threading.Event()
        threads = max(1, loader.num_threads)
        self.queues: List[queue.Queue] = [queue.Queue(maxsize=loader.prefetch)
                                          for _ in range(threads)]
        self.threads: List[threading.Thread] = []
        # Dropped without close(): the producers stop on their own.
        self._finalizer = weakref.finalize(self, self.stop.set)

    def args(self, k: int) -> tuple:
        """Thread ``k``'s own arguments, before the queues."""
        raise NotImplementedError

    def start(self, sink: Any) -> None:
        self.threads = [
            threading.Thread(
                target=self.target, daemon=True, name=f"dsc-{self.name}-{k}",
                args=(*self.args(k), self.queues, self.stop, k, self.first, self.total),
            )
            for k in range(len(self.queues))
        ]
        for t in self.threads:
            t.start()

    def queued(self) -> int:
        return sum(q.qsize() for q in self.queues)

    def next_item(self):
        if self.next_step >= self.total:
            return None
        k = (self.next_step - self.first) % len(self.queues)
        while True:
            if self.stop.is_set():  # closed from another thread
                raise StopIteration
            try:
                item = self.queues[k].get(timeout=0.1)
                break
            except queue.Empty:
                continue
        if isinstance(item, BaseException):
            if isinstance(item, Error):
                raise item
            raise Error(f"loading batch {self.next_step} failed: {item}") from item
        return item

    def taken(self) -> None:
        """One more step handed over."""
        self.handle.advance(1)
        self.next_step += 1

    def close(self) -> None:
        self.stop.set()
        # A producer waiting for a shard's download gives up (raising into its own loop), so
        # that joining it does not wait for the download (Ctrl-C, a break out of the loop).
        # Closed twice (a failed batch closes it, then the loader does): the handle is gone.
        if self.handle is not None:
            self.handle.interrupt()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join()
        super().close()


class _PinnedSource(_ThreadedSource):
    """The pinned path: the threads fill each step into fresh page-locked tensors (from torch's
    caching host allocator, which reuses a block only after the tensors over it are freed and
    the copies from it have finished), which the batch then owns."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader, "pin", _produce)

    def args(self, k: int) -> tuple:
        return self.handle, self.handle.batch_bytes(), self.loader.pin_memory

    def deliver(self, item: Any, sink: Any) -> tuple:
        step, (seq_len, pack), bufs = item
        torch = _torch()
        device = self.loader.device
        tensors = {}
        for layout, buf in zip(self.layout, bufs):
            shape = layout.shape(seq_len)
            count = int(np.prod(shape))
            t = buf.view(getattr(torch, layout.dtype))[:count].view(shape)
            if device is not None:
                t = t.to(device, non_blocking=self.loader.pin_memory)
            tensors[layout.name] = t
        self.taken()
        return step, seq_len, pack, sink.tensors(tensors)


class _CudaCopy:
    """Copies a batch's block to the GPU on a stream of its own, so that copies overlap the
    consumer's work; the consumer's stream waits for each copy by event, never the host."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device
        self.stream = torch.cuda.Stream(device)

    def __call__(self, view: Any) -> Tuple[Any, Any]:
        torch = self.torch
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            on_device = view.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        consumer.wait_event(done)
        # Memory allocated on the copy stream and used on the consumer's: the allocator must
        # not hand it out again before the consumer's work on it has run.
        on_device.record_stream(consumer)
        return on_device, done


class _HostCopy:
    """The staged path with a CPU "device" (the tests' stand-in for a GPU): the block is
    copied, and free again at once."""

    def __call__(self, view: Any) -> Tuple[Any, Any]:
        return view.clone(), None


def _stage(handle, free: queue.Queue, queues: List[queue.Queue], stop: threading.Event, k: int,
           first: int, total: int) -> None:
    """A staged-path producer: fills every ``len(queues)``-th step from ``first + k`` into one of
    its own blocks, once the last copy from that block has finished. It holds no reference to
    its epoch, so an abandoned epoch is collected, and its finaliser sets ``stop``."""
    threads = len(queues)

    def wait(q: queue.Queue, item: Any = None, put: bool = False) -> Any:
        while not stop.is_set():
            try:
                if put:
                    q.put(item, timeout=0.1)
                    return None
                return q.get(timeout=0.1)
            except (queue.Full, queue.Empty):
                continue
        return None

    try:
        for step in range(first + k, total, threads):
            taken = wait(free)
            if taken is None:
                return
            block, copied = taken
            waited = 0.0
            if copied is not None:
                began = time.perf_counter()
                copied.synchronize()  # the block's last copy to the device has run
                waited = time.perf_counter() - began
            info, ranges = handle.fill_block(step, block.numpy())
            wait(queues[k], (step, info, ranges, block, waited), put=True)
    except BaseException as e:  # noqa: BLE001 (handed to the consumer, raised there)
        wait(queues[k], e, put=True)


class _StagedSource(_ThreadedSource):
    """The path to a GPU: the threads gather whole batches into a fixed ring of page-locked
    blocks, ``prefetch + 1`` per thread, one contiguous block per batch with every tensor cut
    to the batch; the consumer copies each block to the device in one transfer on a copy stream
    and views the tensors there. A block is refilled only after its copy has run (an event,
    waited for by its producer), so the batch a consumer holds is never overwritten, and
    nothing is allocated per batch on the host."""

    def __init__(self, loader: Any, copy: Any) -> None:
        super().__init__(loader, "stage", _stage)
        self.copy = copy
        self.free: List[queue.Queue] = [queue.Queue() for _ in self.queues]

    def args(self, k: int) -> tuple:
        # Called once per thread, once the handle exists: thread k's own blocks.
        torch = _torch()
        size = max(8, self.handle.block_bytes())
        pin = isinstance(self.copy, _CudaCopy)
        for _ in range(self.loader.prefetch + 1):
            self.free[k].put((torch.empty(size, dtype=torch.uint8, pin_memory=pin), None))
        return self.handle, self.free[k]

    def deliver(self, item: Any, sink: Any) -> tuple:
        step, (seq_len, pack), ranges, block, device_wait = item
        # A producer that waited for the device made this batch late by that much at most.
        self.device_wait = device_wait
        end = max((o + n for o, n in ranges), default=0)
        on_device, copied = self.copy(block[:end])
        k = (step - self.first) % len(self.queues)
        self.free[k].put((block, copied))
        tensors = sink.block(_torch(), self.layout, on_device, ranges, seq_len)
        self.taken()
        return step, seq_len, pack, tensors


class _ResidentSource(_HostSource):
    """The resident path: the consumer thread asks Rust for each step's index (positions, and
    for a pack its token rows and own tensors; no shard is read), copies it to the device in
    one transfer and gathers the batch there from the resident split: one ``index_select`` per
    stored tensor. No loading threads: the device does the gather, asynchronously, in the
    order the steps are taken. Into static buffers the index lands in their fixed block and the
    gather in their fixed tensors (or, with ``gather_in_step``, in the caller's step:
    ``loader.gather()``)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader, threads=0)
        self.first = self.handle.position()
        self.total = self.handle.steps()
        self.next_step = self.first
        self.index = _resident.IndexLayout(self.handle)
        self.stored = [t for t in self.layout if t.name not in self.index.own]
        self.split: Any = None
        self.blocks: Optional[_resident.BlockRing] = None

    def start(self, sink: Any) -> None:
        # Static buffers are gathered from the split from the first step; otherwise the first
        # steps come from the host path while the split uploads (one block per step, gathered
        # in this thread, one copy).
        static = isinstance(sink, _Static)
        self.split = self.loader._resident(background=not static)
        self.uploaded = self.split.ready()
        self.ring = _resident.BlockRing(_torch(), self.split.device, self.index.sizes,
                                        fixed=sink.fixed_block)

    def queued(self) -> int:
        return 0  # each index is written when asked for

    def next_item(self):
        if self.next_step >= self.total:
            return None
        step = self.next_step
        if not self.uploaded and not self.split.ready():
            if self.blocks is None:
                self.blocks = _resident.BlockRing(_torch(), self.split.device,
                                                  [self.handle.block_bytes()])
            (info, ranges), block, self.device_wait = self.blocks.fill(
                step, lambda views: self.handle.fill_block(step, views[0]))
            return step, info, (block, ranges)
        self.uploaded = True
        info, block, self.device_wait = self.ring.fill(
            step, lambda views: self.handle.fill_rows(step, views))
        return step, info, block

    def deliver(self, item: Any, sink: Any) -> tuple:
        step, (seq_len, pack), block = item
        torch = _torch()
        max_len = self.loader.cache.max_len
        if isinstance(block, tuple):  # from the host path, while the split uploads
            tensors = _resident.block_tensors(torch, self.layout, block[0], block[1], seq_len)
            self.loader._counts["upload_steps"] += 1
        elif isinstance(sink, _Static):
            tensors = sink.gathered(self.split, max_len)
        else:
            parts = self.index.views(torch, block)
            tensors = _resident.gather(torch, self.split, self.stored, parts, seq_len, max_len)
            tensors.update(parts[2])
            tensors = {t.name: tensors[t.name] for t in self.layout}
        self.handle.advance(1)
        self.next_step += 1
        return step, seq_len, pack, tensors
