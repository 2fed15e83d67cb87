"""`dsc.Loader` and `dsc.IterableDataset`: the Rust loader with PyTorch's vocabulary.

Two paths bring a batch to Python:

- **host** (default): the Rust loader's own threads prepare batches ahead; a batch in cache
  order is a view of the mapped shards (no copy), any other is one gather into a buffer that
  the batch then owns. Waiting for a batch releases the GIL.
- **pinned** (``pin_memory=True`` or a CUDA ``device``): Python threads ask Rust to gather
  each batch straight into page-locked tensors from torch's caching host allocator (one copy,
  GIL released), and the consumer starts a non-blocking copy to the device.

Either way a batch owns its memory: nothing is reused while a tensor of it is alive, so a batch
stays valid for as long as you hold it.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dsc, _resident
from ._cache import Cache, PathLike
from ._errors import Error, OptionsError, StateError, WorkerError

STATE_VERSION = 1

# Trimmed lengths round up to multiples of 16 (then four sizes per doubling) when batches go to
# a GPU: L = 128 gives 8 shapes, and 16 keeps bf16 tensor-core tiles whole.
GPU_TRIM_MULTIPLE = 16

_NUMPY_DTYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


class Batch(dict):
    """One batch: a ``dict`` of tensor name to ``torch.Tensor`` (or NumPy array), plus where it
    sits in the epoch. ``.to(device)`` and ``.pin_memory()`` return a new ``Batch`` (the
    DataLoader's pin thread calls ``pin_memory`` on custom types).

    Attributes: ``epoch``, ``step`` (the batch's index in the epoch), ``seq_len`` (the length of
    the sequence axis; for a pack, its longest sequence), ``valid`` (how many leading rows are
    contexts seen for the first time this epoch: all of them, except in the last batches of a
    ``drop_last=False`` epoch, which are completed with the epoch's first contexts; evaluate on
    ``batch["y"][:batch.valid]`` to count every context once).

    A packed batch (``Loader(pack=T)``) also has ``seqs`` and ``tokens`` (the sequences and
    tokens it holds: the leading rows of its ``[S, ...]`` and ``[T, ...]`` tensors) and
    ``max_seqlen`` (its longest sequence); ``valid`` is ``seqs``, or 0 for a pack repeated to
    complete the last global step. They are ``None`` for padded batches."""

    epoch: int
    step: int
    seq_len: int
    valid: int
    seqs: Optional[int]
    tokens: Optional[int]
    max_seqlen: Optional[int]

    def __init__(self, tensors: Dict[str, Any], epoch: int = 0, step: int = 0, seq_len: int = 0,
                 valid: Optional[int] = None, pack: Optional[Tuple[int, int, int]] = None):
        super().__init__(tensors)
        self.epoch = epoch
        self.step = step
        self.seq_len = seq_len
        self.seqs, self.tokens, self.max_seqlen = pack if pack is not None else (None, None, None)
        if valid is None:
            if self.seqs is not None:
                valid = self.seqs
            else:
                first = next(iter(tensors.values()), None)
                valid = 0 if first is None else len(first)
        self.valid = valid

    @property
    def _pack(self) -> Optional[Tuple[int, int, int]]:
        return None if self.seqs is None else (self.seqs, self.tokens, self.max_seqlen)

    def _like(self, tensors: Dict[str, Any]) -> "Batch":
        return Batch(tensors, self.epoch, self.step, self.seq_len, self.valid, self._pack)

    def to(self, *args: Any, **kwargs: Any) -> "Batch":
        """``tensor.to(*args, **kwargs)`` for every tensor, e.g. ``batch.to("cuda",
        non_blocking=True)``."""
        return self._like({k: v.to(*args, **kwargs) for k, v in self.items()})

    def pin_memory(self, *args: Any) -> "Batch":
        """Every tensor in page-locked memory (a copy)."""
        return self._like({k: v.pin_memory(*args) for k, v in self.items()})

    def __reduce__(self):
        return (Batch, (dict(self), self.epoch, self.step, self.seq_len, self.valid, self._pack))


def _default_rank_world() -> Tuple[int, int]:
    """rank and world size: from torch.distributed when initialised, else RANK/WORLD_SIZE, else
    0 and 1."""
    torch = _torch()
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as e:
        raise OptionsError(f"RANK / WORLD_SIZE in the environment are not integers: {e}") from None
    return rank, world


# Integers cross into Rust as 64-bit; larger ones would fail there as OverflowError.
_INT_MAX = 2**63 - 1


def _check_int(name: str, value: Any, minimum: int, maximum: int = _INT_MAX) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or not minimum <= value <= maximum):
        raise OptionsError(f"{name}={value!r}: expected an integer in [{minimum}, {maximum}]")
    return int(value)


def _in_worker_process() -> bool:
    torch = _torch()
    if torch is None:
        return False
    try:
        return torch.utils.data.get_worker_info() is not None
    except AttributeError:
        return False


_FORK_ADVICE = (
    "dsc loads batches with threads inside the training process, never with worker processes: "
    "pass the dsc.Loader (or dsc.IterableDataset with DataLoader(..., batch_size=None, "
    "num_workers=0)) to your loop directly, and raise num_threads for more loading threads"
)


class Loader:
    """Batches of a dsc cache for one rank, in PyTorch's vocabulary.

    >>> loader = dsc.Loader("cache", split="train", batch_size=256, seed=0)  # doctest: +SKIP
    >>> for epoch in range(10):                                              # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:             # dsc.Batch: name -> torch.Tensor
    ...         ...

    The order of an epoch is a pure function of (cache, seed, epoch, split, global batch):
    the keys of every batch equal ``dsc order CACHE --keys`` with the same arguments. ``len()``
    is exact and equal on every rank. The epoch advances by itself after a full pass;
    ``set_epoch(e)`` moves to the start of epoch ``e`` (unless the loader already stands in
    epoch ``e``, e.g. right after ``load_state_dict``). A new ``iter()`` continues where the
    last one stopped.

    Args:
        cache: a cache directory or a :class:`dsc.Cache`.
        split: the split to read (``train``, ``val``, …).
        batch_size: contexts per batch on this rank [default: 256]; not used with ``pack``.
        shuffle: window-shuffle each epoch (off: compiled order, batches are zero-copy views).
        seed: the order seed; must be equal on every rank.
        epoch: the first epoch.
        drop_last: drop the last partial global batch; otherwise complete it with the epoch's
            first contexts (every rank always gets full, equal batches).
        rank, world_size: this process's slice; default from ``torch.distributed`` when it is
            initialised, else the ``RANK`` / ``WORLD_SIZE`` variables, else 0 and 1.
        num_threads: loading threads (Rust threads; 0 loads in the calling thread). On the
            host path an uncompressed split that fits a quarter of memory runs at most one
            per core: more would only take turns on the same cores.
        prefetch: batches prepared ahead per thread.
        trim: cut sequence tensors to the longest stored length in each batch.
        trim_multiple: with ``trim`` or ``bucket``, round each batch's length up the ladder of
            this multiple (m, 2m, 3m, 4m, then four sizes per doubling, at most ``L``), so that
            a run sees a handful of shapes instead of one per length: a GPU pays for each new
            shape (allocator, kernel choice, a ``torch.compile`` recompile), a CPU only for
            the padding [default: 16 with a CUDA ``device``, else 1 (exact lengths)].
            ``dsc order --bucket --trim-multiple M`` lists the shapes of an epoch.
        bucket: length-bucketed batches: inside each shuffle window, contexts of similar length
            form a (global) batch, the batches come in random order, and each is trimmed to its
            longest sequence (implies ``trim``), so little of a batch is padding. Still every
            context once per epoch, exact resume, equal batches per rank. ``dsc order --bucket``
            reports the padding efficiency and what it costs in randomness.
        pack: packed batches of this many tokens ``T`` (at least the cache's ``L``): whole
            sequences laid end to end, so that every batch has the same shapes (what
            ``torch.compile`` and CUDA graphs need) and almost no padding. Per-step tensors are
            ``[T, ...]``, per-context ones ``[S, ...]``, and each batch adds ``cu_seqlens``
            ``[S+1]`` (offsets; unused entries repeat the last), ``seq_idx`` ``[T]`` (the
            sequence of each token; ``S`` for the unused tail, which is zero), ``position``
            ``[T]`` (step within its sequence), ``num_seqs`` and ``num_tokens`` (``[1]``). One
            pack per rank per step; the packs are planned from the stored lengths inside the
            shuffled order, with exact resume. See docs/PYTHON.md, "Packed batches".
        max_seqs: ``S``, the most sequences in a pack [default: derived from ``pack`` and the
            cache's lengths so that it almost never binds].
        columns: load only these tensors (names), e.g. ``["x", "length", "y"]``.
        pin_memory: gather into page-locked memory (with CUDA torch; ignored, with a warning,
            where there is no GPU).
        device: move each batch there (``"cuda"``, ``torch.device``), copying from pinned memory
            with ``non_blocking=True``; ``None`` keeps CPU tensors.
        copy: give every tensor memory of its own: zero-copy views of the cache are copied (use
            it to modify batches in place).
        format: ``"torch"`` (default when torch is installed) or ``"numpy"``.
        window, interleave: the epoch shuffle's window and shard interleave (see FORMAT.md).
        resident: keep the split on the device: its tensors are uploaded once (in compiled
            order) and every batch is gathered there by index, in the same order and with
            the same bytes, trimming, bucketing and packing as the host path; only a small
            index per step crosses to the device. ``None`` (default): on when ``device`` is a
            GPU and the split fits ``resident_budget``; ``True``: always (with no ``device``,
            in CPU memory), an error if it does not fit; ``False``: never.
        resident_budget: the most bytes a resident split may take on the device (an int or a
            size such as ``"8GiB"``) [default: a quarter of the device's memory].
    """

    def __init__(
        self,
        cache: Union[PathLike, Cache],
        split: str = "train",
        batch_size: Optional[int] = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        drop_last: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        num_threads: int = 1,
        prefetch: int = 4,
        trim: bool = False,
        trim_multiple: Optional[int] = None,
        columns: Optional[Sequence[str]] = None,
        pin_memory: bool = False,
        device: Any = None,
        copy: bool = False,
        format: Optional[str] = None,  # noqa: A002 (the natural keyword)
        window: int = 4096,
        interleave: int = 8,
        bucket: bool = False,
        pack: Optional[int] = None,
        max_seqs: Optional[int] = None,
        resident: Optional[bool] = None,
        resident_budget: Union[int, str, None] = None,
    ) -> None:
        self.cache = cache if isinstance(cache, Cache) else Cache(cache)
        self.split = str(split)
        self.pack = None if pack is None else _check_int("pack", pack, 1)
        self.max_seqs = None if max_seqs is None else _check_int("max_seqs", max_seqs, 1)
        if self.pack is None and self.max_seqs is not None:
            raise OptionsError("max_seqs= sizes packed batches: pass pack= too")
        if self.pack is not None and batch_size is not None:
            raise OptionsError(
                "batch_size= and pack= exclude each other: a packed batch holds as many "
                f"sequences as fit {self.pack} tokens (max_seqs= bounds them)"
            )
        self.batch_size = _check_int("batch_size", 256 if batch_size is None else batch_size, 1)
        self.shuffle = bool(shuffle)
        self.seed = _check_int("seed", seed, 0, 2**64 - 1)
        self.drop_last = bool(drop_last)
        if (rank is None) != (world_size is None):
            default_rank, default_world = _default_rank_world()
            rank = default_rank if rank is None else rank
            world_size = default_world if world_size is None else world_size
        elif rank is None:
            rank, world_size = _default_rank_world()
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise OptionsError(f"rank={self.rank} with world_size={self.world_size}: need rank < world_size")
        self.num_threads = _check_int("num_threads", num_threads, 0, 1024)
        self.prefetch = _check_int("prefetch", prefetch, 1, 65536)
        self.bucket = bool(bucket)
        self.trim = bool(trim) or self.bucket
        if self.pack is not None and (self.bucket or bool(trim)):
            raise OptionsError(
                f"pack= with {'bucket' if self.bucket else 'trim'}=True: a packed batch holds no "
                "padding to bucket or trim"
            )
        self.window = _check_int("window", window, 1)
        self.interleave = _check_int("interleave", interleave, 1)
        self.copy = bool(copy)
        torch = _torch()
        if format is None:
            format = "torch" if torch is not None else "numpy"
        if format not in ("torch", "numpy"):
            raise OptionsError(f"format={format!r}: expected 'torch' or 'numpy'")
        if format == "torch" and torch is None:
            raise OptionsError("format='torch' needs PyTorch (pip install torch); or use format='numpy'")
        self.format = format
        if self.split not in self.cache.splits:
            raise OptionsError(
                f"{self.cache.path}: no split {self.split!r} (splits: {list(self.cache.splits)})"
            )
        names = [t.name for t in self.cache.schema]
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
            if not columns:
                raise OptionsError("columns=[] loads nothing: name at least one tensor, or pass None for all")
            unknown = [c for c in columns if c not in names]
            if unknown:
                raise OptionsError(f"{self.cache.path}: no tensor {unknown[0]!r} (tensors: {names})")
        self.columns: List[str] = [n for n in names if columns is None or n in columns]
        self.device = None
        self.pin_memory = bool(pin_memory)
        if device is not None:
            if format != "torch":
                raise OptionsError("device= needs format='torch'")
            self.device = torch.device(device)
            if self.device.type == "cuda":
                if not torch.cuda.is_available():
                    raise OptionsError(f"device={device!r}, but torch sees no CUDA device")
                self.pin_memory = True
        if self.pin_memory:
            if format != "torch":
                raise OptionsError("pin_memory=True needs format='torch'")
            if not torch.cuda.is_available():
                warnings.warn(
                    "dsc.Loader: pin_memory=True but no GPU is available; loading into ordinary memory",
                    stacklevel=2,
                )
                self.pin_memory = False
        on_gpu = self.device is not None and self.device.type == "cuda"
        self.trim_multiple = _check_int(
            "trim_multiple", (GPU_TRIM_MULTIPLE if on_gpu else 1) if trim_multiple is None
            else trim_multiple, 1, 65536)
        self._resident_device = self._resident_choice(resident, resident_budget)
        self._resident_split: Optional[_resident.ResidentSplit] = None
        self._epoch = _check_int("epoch", epoch, 0)
        self._step = 0  # batches of the current epoch consumed on this rank
        self._pid = os.getpid()
        # The running iterator, weakly: an iterator keeps its loader alive, not the other way
        # round, so that neither forms a cycle that only the garbage collector could free.
        self._active: Optional["weakref.ref[_Epoch]"] = None
        self._planned: Optional[Tuple[int, int]] = None  # (epoch, its steps)
        self._steps()  # checks the options against the cache now, not at the first batch
        self._contexts = self.cache.splits[self.split]
        # Gather into torch-allocated (pinned) buffers from Python threads; the tests also run
        # this path without pinning on machines without a GPU.
        self._fill_path = self.pin_memory
        # To a GPU: a ring of pinned blocks, one copy per batch (tests set a _HostCopy).
        self._staged: Any = None
        if self.device is not None and self.device.type == "cuda" and self._resident_device is None:
            self._staged = _CudaCopy(torch, self.device)

    def _resident_choice(self, resident: Optional[bool], budget: Union[int, str, None]):
        """The device the split is kept on (``resident=``), or None for the host path."""
        if resident is not None and not isinstance(resident, bool):
            raise OptionsError(f"resident={resident!r}: expected True, False or None")
        if budget is not None and not isinstance(budget, (str, int)) or isinstance(budget, bool):
            raise OptionsError(f"resident_budget={budget!r}: expected bytes or a size like '8GiB'")
        if resident is False:
            return None
        if self.format != "torch":
            if resident:
                raise OptionsError("resident=True needs format='torch'")
            return None
        torch = _torch()
        device = self.device if self.device is not None else torch.device("cpu")
        if resident is None and device.type != "cuda":
            return None
        if budget is None:
            limit = _resident.default_budget(torch, device)
        elif isinstance(budget, str):
            limit = _dsc.parse_size(budget)
        else:
            limit = _check_int("resident_budget", budget, 0)
        need = _resident.split_bytes(self)
        if need > limit:
            if resident:
                raise OptionsError(
                    f"resident=True: split {self.split!r} of {self.cache.path} takes {need:,} "
                    f"bytes on {device}, more than resident_budget={limit:,}; raise the "
                    "budget, load fewer columns=, or leave the split on the host (resident=False)"
                )
            return None
        return device

    @property
    def resident(self) -> bool:
        """Whether batches are gathered from a copy of the split on the device (``resident=``)."""
        return self._resident_device is not None

    def _resident(self) -> _resident.ResidentSplit:
        """The split on its device, uploaded at the first iteration and kept for later epochs."""
        if self._resident_split is None:
            # The split in cache order, zero-copy views where the shards allow.
            contexts = self.cache.splits[self.split]
            reader = Loader(self.cache, self.split,
                            batch_size=max(1, min(_resident.UPLOAD_PIECE, contexts)),
                            shuffle=False, drop_last=False, rank=0, world_size=1,
                            columns=self.columns, num_threads=1)
            self._resident_split = _resident.ResidentSplit(self, reader, _torch(),
                                                           self._resident_device)
        return self._resident_split

    # -- PyTorch's vocabulary --------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch on this rank (equal on every rank). The same every epoch, except
        packed batches with ``drop_last=False``, whose last step depends on the epoch's plan."""
        return self._steps()

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Moves to the start of ``epoch``; a no-op when the loader already stands in ``epoch``
        (so that ``set_epoch`` after ``load_state_dict`` keeps the resumed position)."""
        epoch = _check_int("epoch", epoch, 0)
        if epoch != self._epoch:
            self._close_active()
            self._epoch, self._step = epoch, 0

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands, as a small JSON-able dict: the batches consumed so far
        (``samples``, counted over all ranks: contexts, or packs), the epoch, the order's
        parameters and the cache's ``content_id``. Save it with the model; :meth:`load_state_dict`
        continues the same order exactly, also on another number of ranks with the same global
        batch. The order's fields and position come from the Rust loader's state."""
        state = json.loads(self.cache._handle.state(self._options(0), self._step))
        return {
            "version": STATE_VERSION,
            "content_id": self.cache.content_id,
            **state,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`state_dict`), before or between iterations.
        A state from another cache, split, seed, order or global batch is a
        :class:`dsc.StateError`."""
        if not isinstance(state, dict):
            raise StateError(f"a loader state is a dict from Loader.state_dict(), got {type(state).__name__}")
        # States written before `content_id` carry the cache's content hash as `fingerprint`.
        identity = "content_id" if "content_id" in state else "fingerprint"
        missing = [k for k in ("version", identity, "split", "epoch", "samples", "seed",
                               "shuffle", "drop_last", "window", "interleave", "global_batch")
                   if k not in state]
        if missing:
            raise StateError(f"not a dsc loader state: it lacks {missing}")
        if state["version"] != STATE_VERSION:
            raise StateError(f"loader state version {state['version']!r}; this dsc reads {STATE_VERSION}")
        ours = (self.cache.content_id if identity == "content_id"
                else self.cache._legacy_content_hash())
        if state[identity] != ours:
            raise StateError(
                f"the state is for another cache ({identity} {state[identity]}, "
                f"{self.cache.path} has {ours})"
            )
        try:
            text = json.dumps(state)
        except (TypeError, ValueError) as e:
            raise StateError(f"not a dsc loader state: {e}") from None
        epoch, step = self.cache._handle.resume(self._options(0), text)
        self._close_active()
        self._epoch, self._step = epoch, step

    def __iter__(self) -> Iterator[Batch]:
        if os.getpid() != self._pid or _in_worker_process():
            raise WorkerError(
                f"dsc.Loader was made in process {self._pid} and used in process {os.getpid()} "
                f"(a DataLoader worker or a fork). {_FORK_ADVICE}"
            )
        active = self._active() if self._active is not None else None
        if (active is not None and active.handle is not None
                and active.thread != threading.get_ident()):
            # Two threads each taking "the rest of the epoch" would both read it, or end each
            # other's iterator: refused rather than given a meaning no one expects.
            raise WorkerError(
                f"this dsc.Loader is being iterated in thread {active.thread}: one iterator at a "
                "time. Give each thread its own dsc.Loader (rank= and world_size= split the "
                "data between them), hand batches to other threads through a queue, or call "
                "loader.close() to end the running iterator first"
            )
        self._close_active()
        if self._resident_device is not None:
            epoch: _Epoch = _ResidentEpoch(self)
        elif self._staged is not None:
            epoch = _StagedEpoch(self, self._staged)
        elif self._fill_path:
            epoch = _PinnedEpoch(self)
        else:
            epoch = _Epoch(self)
        self._active = weakref.ref(epoch)
        return epoch

    def close(self) -> None:
        """Stops the loading threads now (they also stop when the loader is garbage)."""
        self._close_active()

    def __del__(self) -> None:
        try:
            self._close_active()
        except BaseException:  # noqa: BLE001 (interpreter shutdown, a forked child)
            pass

    def __reduce__(self):
        raise WorkerError(f"a dsc.Loader cannot be pickled (sent to another process). {_FORK_ADVICE}")

    def __repr__(self) -> str:
        return (
            f"dsc.Loader({self.cache.path!r}, split={self.split!r}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self._epoch}, rank={self.rank}, "
            f"world_size={self.world_size}, bucket={self.bucket}, pack={self.pack}, "
            f"steps={len(self)})"
        )

    # -- internals -------------------------------------------------------------------------

    def _close_active(self) -> None:
        epoch = self._active() if self._active is not None else None
        if epoch is not None:
            epoch.close()
        self._active = None

    def _options(self, threads: int) -> str:
        """The Rust loader's options (JSON) for the current epoch."""
        order: Dict[str, Any] = dict(
            split=self.split, seed=self.seed, shuffle=self.shuffle, window=self.window,
            interleave=self.interleave, drop_last=self.drop_last, bucket=self.bucket,
        )
        if self.pack is not None:
            order["pack"] = {"tokens": self.pack, "max_seqs": self.max_seqs}
        return json.dumps(dict(
            order=order, batch_size=self.batch_size, epoch=self._epoch, rank=self.rank,
            world_size=self.world_size, prefetch=self.prefetch, threads=threads, trim=self.trim,
            trim_multiple=self.trim_multiple, columns=self.columns,
        ))

    def _steps(self) -> int:
        """Steps of the current epoch (planned once per epoch: packs depend on it)."""
        if self._planned is None or self._planned[0] != self._epoch:
            self._planned = (self._epoch, self.cache._handle.plan(self._options(0))[0])
        return self._planned[1]

    def _handle(self, threads: int):
        # Writable (private) zero-copy views only for torch tensors that stay views.
        return self.cache._handle.loader(
            self._options(threads), self._step, self.format == "torch" and not self.copy,
        )

    def _consumed(self, epoch: "_Epoch") -> None:
        """One more batch handed to the caller by ``epoch`` (the active iterator)."""
        if self._active is not None and epoch is self._active():
            self._step += 1

    def _valid(self, step: int, pack: Optional[Tuple[int, int, int, bool]] = None) -> int:
        """Rows of this rank's batch ``step`` before the epoch wraps around (ranks take
        consecutive slices of each global batch); a pack's sequences, none if it repeats."""
        if pack is not None:
            seqs, _, _, repeated = pack
            return 0 if repeated else seqs
        start = step * self.batch_size * self.world_size + self.rank * self.batch_size
        return max(0, min(self.batch_size, self._contexts - start))

    def _finished(self, epoch: "_Epoch") -> None:
        if self._active is not None and epoch is self._active():
            self._epoch, self._step = self._epoch + 1, 0
            self._active = None


class _Tensor:
    """One tensor of an epoch's batches, worked out once per epoch, so that a batch costs one
    array and one tensor over each buffer (what Python spends per batch bounds the loader's
    rate on many cores: issue 28, item 3)."""

    __slots__ = ("name", "dtype", "before", "after", "whole", "make")

    def __init__(self, loader: Loader, name: str, dtype: str, whole: Sequence[int],
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


class _Epoch:
    """An iterator over the rest of the loader's current epoch (host path). It holds its
    loader (``next(iter(dsc.Loader(...)))`` works); the loader refers to it weakly."""

    def __init__(self, loader: Loader, threads: Optional[int] = None) -> None:
        """``threads``: the Rust loader's own threads (default: the loader's ``num_threads``)."""
        self.loader = loader
        self.pid = loader._pid
        self.epoch = loader._epoch
        self.thread = threading.get_ident()
        self._busy = threading.Lock()
        self.handle = loader._handle(loader.num_threads if threads is None else threads)
        self.layout = [_Tensor(loader, *t) for t in self.handle.tensors()]

    def __iter__(self) -> "_Epoch":
        return self

    def _owner(self) -> Optional[Loader]:
        if os.getpid() != self.pid:
            raise WorkerError(
                f"a dsc.Loader iterator made in process {self.pid} was used in process "
                f"{os.getpid()} (a fork). {_FORK_ADVICE}"
            )
        return self.loader

    def _next_item(self):
        return self.handle.next()

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

    def _next_locked(self, loader: Loader) -> Batch:
        if self.handle is None:
            raise StopIteration
        try:
            item = self._next_item()
        except BaseException:
            # The position stays at the failed batch: a new iter() retries from there.
            self.close()
            raise
        if item is None:
            self.close()
            loader._finished(self)
            raise StopIteration
        batch = self._batch(loader, item)
        loader._consumed(self)
        return batch

    def _batch(self, loader: Loader, item) -> Batch:
        step, (seq_len, pack), buffers = item
        batch = Batch(
            {t.name: t.make(buf) for t, buf in zip(self.layout, buffers)},
            self.epoch, step, seq_len, loader._valid(step, pack), pack and pack[:3],
        )
        if loader.device is not None:
            # Not pinned memory: a non-blocking copy could still be reading the buffer when
            # its tensor is freed and the buffer reused.
            batch = batch.to(loader.device)
        return batch

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


class _ThreadedEpoch(_Epoch):
    """An epoch whose batches ``max(1, num_threads)`` Python threads prepare, thread ``k`` every
    ``num_threads``-th step from the first (the gathers run in Rust with the GIL released); the
    consumer takes the steps in order from the threads' queues."""

    def __init__(self, loader: Loader, name: str, target: Any, args: Any) -> None:
        """``target(*args(k), queues, stop, k, first, total)`` runs thread ``k``."""
        super().__init__(loader, threads=0)  # the Python threads below fill the batches
        self.first = self.handle.position()
        self.total = self.handle.steps()
        self.next_step = self.first
        self.stop = threading.Event()
        threads = max(1, loader.num_threads)
        self.queues: List[queue.Queue] = [queue.Queue(maxsize=loader.prefetch) for _ in range(threads)]
        self.threads = [
            threading.Thread(
                target=target, daemon=True, name=f"dsc-{name}-{k}",
                args=(*args(k), self.queues, self.stop, k, self.first, self.total),
            )
            for k in range(threads)
        ]
        # Dropped without close(): the producers stop on their own.
        self._finalizer = weakref.finalize(self, self.stop.set)
        for t in self.threads:
            t.start()

    def _next_item(self):
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

    def close(self) -> None:
        self.stop.set()
        for t in getattr(self, "threads", []):
            if t is not threading.current_thread():
                t.join()
        super().close()


class _PinnedEpoch(_ThreadedEpoch):
    """The pinned path: the threads fill each step into fresh page-locked tensors (from torch's
    caching host allocator, which reuses a block only after the tensors over it are freed and
    the copies from it have finished), which the batch then owns."""

    def __init__(self, loader: Loader) -> None:
        super().__init__(loader, "pin", _produce,
                         lambda k: (self.handle, self.handle.batch_bytes(), loader.pin_memory))

    def _batch(self, loader: Loader, item) -> Batch:
        step, (seq_len, pack), bufs = item
        torch = _torch()
        tensors = {}
        for layout, buf in zip(self.layout, bufs):
            shape = layout.shape(seq_len)
            count = int(np.prod(shape))
            t = buf.view(getattr(torch, layout.dtype))[:count].view(shape)
            if loader.device is not None:
                t = t.to(loader.device, non_blocking=loader.pin_memory)
            tensors[layout.name] = t
        self.handle.advance(1)
        self.next_step += 1
        return Batch(tensors, self.epoch, step, seq_len, loader._valid(step, pack),
                     pack and pack[:3])


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
            if copied is not None:
                copied.synchronize()  # the block's last copy to the device has run
            info, ranges = handle.fill_block(step, block.numpy())
            wait(queues[k], (step, info, ranges, block), put=True)
    except BaseException as e:  # noqa: BLE001 (handed to the consumer, raised there)
        wait(queues[k], e, put=True)


class _StagedEpoch(_ThreadedEpoch):
    """The path to a GPU: the threads gather whole batches into a fixed ring of page-locked
    blocks, ``prefetch + 1`` per thread, one contiguous block per batch with every tensor cut
    to the batch; the consumer copies each block to the device in one transfer on a copy stream
    and views the tensors there. A block is refilled only after its copy has run (an event,
    waited for by its producer), so the batch a consumer holds is never overwritten, and
    nothing is allocated per batch on the host."""

    def __init__(self, loader: Loader, copy: Any) -> None:
        torch = _torch()
        self.copy = copy
        pin = isinstance(copy, _CudaCopy)
        self.free: List[queue.Queue] = []
        for _ in range(max(1, loader.num_threads)):
            blocks: queue.Queue = queue.Queue()
            self.free.append(blocks)

        def args(k: int) -> tuple:
            if self.free[k].empty():
                size = max(8, self.handle.block_bytes())
                for _ in range(loader.prefetch + 1):
                    self.free[k].put((torch.empty(size, dtype=torch.uint8, pin_memory=pin), None))
            return self.handle, self.free[k]

        super().__init__(loader, "stage", _stage, args)

    def _batch(self, loader: Loader, item) -> Batch:
        step, (seq_len, pack), ranges, block = item
        torch = _torch()
        end = max((o + n for o, n in ranges), default=0)
        on_device, copied = self.copy(block[:end])
        k = (step - self.first) % len(self.queues)
        self.free[k].put((block, copied))
        tensors = {}
        for layout, (offset, n) in zip(self.layout, ranges):
            tensors[layout.name] = (on_device[offset:offset + n]
                                    .view(getattr(torch, layout.dtype))
                                    .view(layout.shape(seq_len)))
        self.handle.advance(1)
        self.next_step += 1
        return Batch(tensors, self.epoch, step, seq_len, loader._valid(step, pack),
                     pack and pack[:3])


class _ResidentEpoch(_Epoch):
    """The resident path: the consumer thread asks Rust for each step's index (positions, and
    a pack's own tensors; no shard is read), copies it to the device in one transfer and
    gathers the batch there from the resident split. No loading threads: the device does the
    gather, asynchronously, in the order the steps are taken."""

    def __init__(self, loader: Loader) -> None:
        super().__init__(loader, threads=0)
        self.split = loader._resident()
        self.first = self.handle.position()
        self.total = self.handle.steps()
        self.next_step = self.first
        self.rows = self.handle.index_rows()
        sizes = self.handle.batch_bytes()
        own = sizes[-5:] if loader.pack is not None else []
        self.ring = _resident.IndexRing(_torch(), self.split.device, [self.rows * 8] + own)
        self.sequence = {n: loader.cache.tensor(n).is_sequence for n in loader.columns}

    def _next_item(self):
        if self.next_step >= self.total:
            return None
        step = self.next_step
        info, block = self.ring.fill(step, lambda views: self.handle.fill_index(step, views))
        return step, info, block

    def _batch(self, loader: Loader, item) -> Batch:
        step, (seq_len, pack), block = item
        tensors = _resident.gather(_torch(), self.split, self.layout, self.ring, block,
                                   self.rows, seq_len, pack, loader.cache.max_len, self.sequence)
        self.handle.advance(1)
        self.next_step += 1
        return Batch(tensors, self.epoch, step, seq_len, loader._valid(step, pack),
                     pack and pack[:3])


class IterableDataset:
    """A ``torch.utils.data.IterableDataset`` over a :class:`dsc.Loader`, for code that wants a
    ``DataLoader``: use ``DataLoader(ds, batch_size=None, num_workers=0)`` (dsc batches and
    loads with threads itself). Same order, resume (``state_dict``) and rank behaviour as the
    loader; worker processes get a clear :class:`dsc.WorkerError`.

    Takes the :class:`dsc.Loader` arguments.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        torch = _torch()
        if torch is not None and not issubclass(cls, torch.utils.data.IterableDataset):
            # Become a real torch IterableDataset when torch is there, without importing torch
            # at `import dsc` time.
            cls = _torch_iterable_dataset(torch)
        return object.__new__(cls)

    def __init__(self, cache: Union[PathLike, Cache], *args: Any, **kwargs: Any) -> None:
        self.loader = Loader(cache, *args, **kwargs)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def __reduce__(self):
        raise WorkerError(
            "a dsc.IterableDataset cannot be sent to DataLoader worker processes (num_workers > 0). "
            + _FORK_ADVICE
        )


_TORCH_DATASET: Optional[type] = None


def _torch_iterable_dataset(torch) -> type:
    global _TORCH_DATASET
    if _TORCH_DATASET is None:
        _TORCH_DATASET = type(
            "IterableDataset", (IterableDataset, torch.utils.data.IterableDataset),
            {"__module__": __name__, "__doc__": IterableDataset.__doc__},
        )
    return _TORCH_DATASET
