"""`dsc.Loader` and `dsc.IterableDataset`: the Rust loader with PyTorch's vocabulary. What
is asked (options, rank, device, resume) is checked here; the iterators that deliver an
epoch's batches are in `_epochs`."""

from __future__ import annotations

import json
import os
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dsc, _resident, _static
from ._batch import FORK_ADVICE, Batch, _torch
from ._cache import Cache, PathLike, shared
from ._epochs import (_CudaCopy, _Epoch, _Fresh, _HostSource, _PinnedSource, _ResidentSource,
                      _StagedSource, _Static)
from ._errors import CacheError, OptionsError, StateError, WorkerError, boolean

STATE_VERSION = 1

# Trimmed lengths round up the loader's ladder of 16 when batches go to a GPU (L = 128 gives 8
# shapes, and bf16 tensor-core tiles stay whole): the default dsc-train takes on CUDA too.
GPU_TRIM_MULTIPLE = _dsc.GPU_TRIM_MULTIPLE


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
        raise OptionsError(f"{name}={value!r}: expected an integer in [{minimum}, {maximum}]",
                           option=name)
    return int(value)


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: NumPy scalars and arrays as Python numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _rust_options(keywords: Dict[str, Any], default_trim_multiple: int) -> Dict[str, Any]:
    """The loader options ``keywords`` ask for, checked by the Rust loader: a refusal is an
    :class:`OptionsError` naming the keyword. Keywords left out (None) take Rust's defaults."""
    given = {k: _plain(v) for k, v in keywords.items() if v is not None}
    for key, value in given.items():
        try:
            json.dumps(value, allow_nan=False)
            if any(isinstance(v, int) and not -2**63 <= v < 2**64
                   for v in (value if isinstance(value, list) else [value])):
                raise ValueError("out of range")
        except (TypeError, ValueError):
            raise OptionsError(f"{_KEYWORD.get(key, key)}={keywords[key]!r}: not a value this "
                               "option takes (no infinity, NaN or integer past 64 bits)",
                               option=_KEYWORD.get(key, key)) from None
    try:
        return json.loads(_dsc.loader_options(json.dumps(given), default_trim_multiple))
    except OptionsError as e:
        keyword = _KEYWORD.get(e.option or "")
        if keyword is None:
            raise
        raise OptionsError(str(e).replace(f"{e.option}=", f"{keyword}=", 1),
                           option=keyword, raw=e._raw) from None


def _rust_keywords(kw: Dict[str, Any]) -> Dict[str, Any]:
    """The keywords of the Rust loader's options as given, with what only Python can tell: a
    keyword left out (None) from one given empty, and the ranks torch.distributed knows. Every
    other rule is the Rust loader's."""
    if (kw["rank"] is None) != (kw["world_size"] is None):
        default_rank, default_world = _default_rank_world()
        kw["rank"] = default_rank if kw["rank"] is None else kw["rank"]
        kw["world_size"] = default_world if kw["world_size"] is None else kw["world_size"]
    elif kw["rank"] is None:
        kw["rank"], kw["world_size"] = _default_rank_world()
    if kw["pack"] is not None and kw["batch_size"] is not None:
        raise OptionsError(
            "batch_size= and pack= exclude each other: a packed batch holds as many "
            f"sequences as fit {kw['pack']} tokens (max_seqs= bounds them)",
            option="batch_size",
        )
    columns = kw["columns"]
    if columns is not None:
        kw["columns"] = columns = [columns] if isinstance(columns, str) else list(columns)
        if not columns:
            raise OptionsError("columns=[] loads nothing: name at least one tensor, or pass "
                               "None for all", option="columns")
    horizon_columns = kw["horizon_columns"]
    if horizon_columns is not None:
        if not isinstance(horizon_columns, (str, list, tuple)):
            raise OptionsError(f"horizon_columns={horizon_columns!r}: expected a column name "
                               "or a list of them", option="horizon_columns")
        kw["horizon_columns"] = horizon_columns = (
            [horizon_columns] if isinstance(horizon_columns, str) else list(horizon_columns))
        if not horizon_columns:
            raise OptionsError("horizon_columns=[] names no column: name the columns of x the "
                               "horizon takes, or pass None for all of them",
                               option="horizon_columns")
    if kw["weights"] is not None:
        # Weights of one cache are refused by the Rust loader, as on every front end.
        try:
            kw["weights"] = list(kw["weights"])
        except TypeError:
            raise OptionsError(f"weights={kw['weights']!r}: expected one positive number per "
                               "cache", option="weights") from None
    if kw["schedule"] is not None:
        kw["schedule"] = _stages(kw["schedule"])
    return kw


def _stages(schedule: Any) -> List[Dict[str, Any]]:
    """A schedule's stages as the Rust loader reads them: ``(at, weights)``,
    ``(at, weights, "linear")`` or dicts with those keys (a trainer's may give ``step``)."""
    def bad(problem: str) -> OptionsError:
        return OptionsError(f"schedule={schedule!r}: {problem}", option="schedule")
    if isinstance(schedule, (str, bytes, dict)):
        raise bad("expected a list of stages, each (at, weights) or (at, weights, \"linear\")")
    try:
        stages = list(schedule)
    except TypeError:
        raise bad("expected a list of stages") from None
    out = []
    for i, stage in enumerate(stages):
        if isinstance(stage, dict):
            out.append({k: (list(v) if k == "weights" and not isinstance(v, str) else v)
                        for k, v in stage.items()})
            continue
        if not isinstance(stage, (tuple, list)) or len(stage) not in (2, 3):
            raise bad(f"stage {i} is {stage!r}: expected (at, weights) or (at, weights, \"linear\")")
        if len(stage) == 3 and stage[2] != "linear":
            raise bad(f"stage {i} ends with {stage[2]!r}: the third item, when given, is \"linear\"")
        try:
            weights = list(stage[1])
        except TypeError:
            raise bad(f"stage {i}'s weights {stage[1]!r}: expected one number per cache") from None
        at = _plain(stage[0])
        # A position computed in floating point (0.5 * n) that is a whole number.
        if isinstance(at, float) and at.is_integer():
            at = int(at)
        out.append({"at": at, "weights": weights, "linear": len(stage) == 3})
    return out


# Keywords whose Rust key is spelled otherwise in PyTorch's vocabulary.
_KEYWORD = {"threads": "num_threads"}


def _in_worker_process() -> bool:
    torch = _torch()
    if torch is None:
        return False
    try:
        return torch.utils.data.get_worker_info() is not None
    except AttributeError:
        return False


class Loader:
    """Batches of a dsc cache for one rank, in PyTorch's vocabulary.

    >>> loader = dsc.Loader("cache", split="train", batch_size=256, seed=0)
    >>> for epoch in range(10):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:             # dsc.Batch: name -> torch.Tensor
    ...         x, length = batch["x"], batch["length"]   # your step here
    >>> loader.epoch
    10

    The order of an epoch is a pure function of (cache, seed, epoch, split, global batch):
    the keys of every batch equal ``dsc order CACHE --keys`` with the same arguments. ``len()``
    is exact and equal on every rank. The epoch advances by itself after a full pass;
    ``set_epoch(e)`` moves to the start of epoch ``e`` (unless the loader already stands in
    epoch ``e``, e.g. right after ``load_state_dict``). A new ``iter()`` continues where the
    last one stopped.

    Args:
        cache: a cache directory or a :class:`dsc.Cache`; a list of them: their mix, each
            batch drawn from all of them in the proportions of ``weights`` (see
            docs/PYTHON.md, "Mixing caches").
        weights: a mix's weights, one per cache (normalised) [default: the caches' sizes, as
            if they were one]. Every window of ``window`` positions holds each cache within one
            position of its weight.
        mix_samples: positions in an epoch of a mix [default: the caches' contexts together];
            a cache that runs out continues with its own next epoch, reshuffled.
        schedule: a mix's weights along the run, instead of ``weights``: a list of stages
            ``(at, [w, ...])``, each from sample position ``at`` of the run (epoch x positions
            per epoch + position; the first at 0) on; ``(at, [w, ...], "linear")`` moves there
            from the previous stage's weights. Weight 0 leaves a cache out (a cache that enters
            or retires). Exact: each cache's samples are its own epochs' permutations, one
            after another, whatever the stages; ``load_state_dict`` may change the stages that
            start after the state's position (see docs/PYTHON.md, "Mixture schedules").
        split: the split to read (``train``, ``val``, …) [default: train].
        batch_size: contexts per batch on this rank [default: 256]; not used with ``pack``.
        shuffle: window-shuffle each epoch (off: compiled order, batches are zero-copy views)
            [default: True].
        seed: the order seed; must be equal on every rank [default: 0].
        epoch: the first epoch [default: 0].
        drop_last: drop the last partial global batch; otherwise complete it with the epoch's
            first contexts (every rank always gets full, equal batches) [default: True].
        rank, world_size: this process's slice; default from ``torch.distributed`` when it is
            initialised, else the ``RANK`` / ``WORLD_SIZE`` variables, else 0 and 1.
        num_threads: loading threads (Rust threads; 0 loads in the calling thread). On the
            host path an uncompressed split that fits a quarter of memory runs at most one
            per core: more would only take turns on the same cores [default: 1].
        prefetch: batches prepared ahead per thread [default: 4].
        trim: cut sequence tensors to the longest stored length in each batch
            [default: False].
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
            reports the padding efficiency and what it costs in randomness [default: False].
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
        window: contexts permuted together in a shuffled epoch (see FORMAT.md)
            [default: 4096].
        interleave: shards read side by side, each window mixing this many [default: 8].
        resident: keep the split on the device: its tensors are uploaded once (in compiled
            order) and every batch is gathered there by index, in the same order and with
            the same bytes, trimming, bucketing and packing as the host path; only a small
            index per step crosses to the device. ``None`` (default): on when ``device`` is a
            GPU and the split fits ``resident_budget``; ``True``: always (with no ``device``,
            in CPU memory), an error if it does not fit; ``False``: never.
        resident_budget: the most bytes a resident split may take on the device (an int or a
            size such as ``"8GiB"``) [default: a quarter of the device's memory].
        series_window: windows of long series: each sample is this many consecutive stored
            steps ``W`` of one context, starting at a multiple of ``stride`` (default ``W``, no
            overlap); per-step tensors are ``[B, W, ...]``, ``length`` the window's real steps,
            and each batch adds ``start`` (the window's first step). The epoch shuffles windows
            across all contexts, every window once, with exact resume and rank slices; nothing
            is duplicated on disk. Compile with ``max_len`` as long as the longest series. See
            docs/PYTHON.md, "Windows of long series".
        horizon: the next ``horizon`` steps after each window of the ``horizon_columns`` as the
            target ``y_next`` ``[B, H, K]``, with ``horizon_length`` (its real steps)
            [default: 0].
        horizon_columns: the columns of ``x`` the horizon takes [default: all of them].
        pad_windows: keep windows that run past the end of their series, zero-padded
            (otherwise only whole windows with their whole horizon) [default: False].
        static: every batch lands in the same tensors on ``device`` (:attr:`static_batch`),
            allocated once: what a captured CUDA graph needs, since it replays on the same
            addresses every step. A batch is valid until the next one is asked for. For a
            resident split each ``next()`` copies only the step's index to the device (on the
            current stream) and gathers the batch into the buffers; on the host path it copies
            the batch's block into them. Padded (untrimmed) and packed batches. See
            docs/PYTHON.md, "Static batches and captured steps".
        gather_in_step: with ``static`` and a resident split, ``next()`` copies only the index
            and your step calls :meth:`gather` (capturable: tensor operations, no host sync, no
            allocation), so that the gather runs inside your graph: one index copy and one
            graph replay per step.
        cache_dir, cache_limit, storage_options: for a cache given as a URL in object storage
            (``"s3://bucket/cache"``): the local folder its shards are fetched into ahead of
            use, in this loader's order; the bytes kept there at most (the shard needed furthest
            ahead goes first); object_store's configuration keys. See :class:`dsc.Cache` and
            docs/PYTHON.md, "Caches in object storage".
        generation: the generation of the caches to read, opened by path (a number, a content
            id or a tag; ``dsc log`` lists them) [default: the last one].
        follow: move to the last generation of the caches (``dsc.append`` adds them) at each
            new epoch (``set_epoch``), never inside one; recorded in :meth:`state_dict`, whose
            ``content_id`` names the generation read, so a resume continues the same batches
            and then follows.
    """

    #: The tensors a packed batch (``pack=``) adds after the stored ones, named as in Rust.
    PACK_TENSORS: Tuple[str, ...] = tuple(_dsc.PACK_TENSORS)

    def __init__(
        self,
        cache: Union[PathLike, Cache, Sequence[Union[PathLike, Cache]]],
        split: Optional[str] = None,
        batch_size: Optional[int] = None,
        *,
        shuffle: Optional[bool] = None,
        seed: Optional[int] = None,
        epoch: Optional[int] = None,
        drop_last: Optional[bool] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        num_threads: Optional[int] = None,
        prefetch: Optional[int] = None,
        trim: Optional[bool] = None,
        trim_multiple: Optional[int] = None,
        columns: Optional[Sequence[str]] = None,
        pin_memory: bool = False,
        device: Any = None,
        copy: bool = False,
        format: Optional[str] = None,  # noqa: A002 (the natural keyword)
        window: Optional[int] = None,
        interleave: Optional[int] = None,
        bucket: Optional[bool] = None,
        pack: Optional[int] = None,
        max_seqs: Optional[int] = None,
        resident: Optional[bool] = None,
        resident_budget: Union[int, str, None] = None,
        weights: Optional[Sequence[float]] = None,
        mix_samples: Optional[int] = None,
        schedule: Optional[Sequence[Any]] = None,
        cache_dir: Optional[PathLike] = None,
        cache_limit: Union[int, str, None] = None,
        storage_options: Optional[Dict[str, Any]] = None,
        series_window: Optional[int] = None,
        stride: Optional[int] = None,
        horizon: Optional[int] = None,
        horizon_columns: Optional[Sequence[str]] = None,
        pad_windows: Optional[bool] = None,
        static: bool = False,
        gather_in_step: bool = False,
        generation: Union[int, str, None] = None,
        follow: bool = False,
    ) -> None:
        # What made this loader, so that a state of another generation of its caches can make
        # it again over that generation (load_state_dict).
        self._made_with = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        # Flags are checked before anything is opened: a wrong one is named whatever else is.
        shuffle, drop_last, bucket, trim, pad_windows = (
            None if v is None else boolean(k, v)
            for k, v in (("shuffle", shuffle), ("drop_last", drop_last), ("bucket", bucket),
                         ("trim", trim), ("pad_windows", pad_windows)))
        pin_memory, copy = boolean("pin_memory", pin_memory), boolean("copy", copy)
        static, gather_in_step = boolean("static", static), boolean("gather_in_step", gather_in_step)
        self.follow = boolean("follow", follow)
        self._open(cache, dict(cache_dir=cache_dir, cache_limit=cache_limit,
                               storage_options=storage_options, generation=generation))
        self._deliver_to(format, device, pin_memory, copy)
        on_gpu = self.device is not None and self.device.type == "cuda"
        default_multiple = GPU_TRIM_MULTIPLE if on_gpu else 1
        self._opts = _rust_options(
            _rust_keywords(dict(
                split=None if split is None else str(split), seed=seed, window=window,
                interleave=interleave, shuffle=shuffle, drop_last=drop_last, bucket=bucket,
                pack=pack, max_seqs=max_seqs, series_window=series_window, stride=stride,
                horizon=horizon, horizon_columns=horizon_columns, pad_windows=pad_windows,
                trim=trim, trim_multiple=trim_multiple, weights=weights,
                mix_samples=mix_samples, schedule=schedule, batch_size=batch_size, epoch=epoch, rank=rank,
                world_size=world_size, threads=num_threads, prefetch=prefetch, columns=columns,
            )),
            default_multiple,
        )
        self._read_back(json.loads(_dsc.loader_keys(json.dumps(self._opts))),
                        default_multiple if trim_multiple is None else trim_multiple)
        self._epoch: int = self._opts["epoch"]
        self._step = 0  # batches of the current epoch consumed on this rank
        # Units of the epoch skipped before step 0: a state from another global batch resumes
        # at its position, not at a whole step of this one (0 otherwise).
        self._skip = 0
        self._planned: Optional[Tuple[int, int]] = None  # (epoch, its steps)
        # The options against the cache now (an unknown split or tensor, a pack shorter than
        # L), before anything below reads the split, and not at the first batch.
        self._steps()
        self._resident_device = self._resident_choice(resident, resident_budget)
        self._resident_split: Optional[_resident.ResidentSplit] = None
        self._static_wanted = self._static_choice(static, gather_in_step)
        self.gather_in_step = bool(gather_in_step)
        # The static buffers, made with the first epoch (or `static_batch`) and kept after it.
        self._static: Optional[_static.StaticBatch] = None
        self._counts: Dict[str, Any] = dict(batches=0, contexts=0, bytes=0, wait_s=0.0,
                                            device_wait_s=0.0, upload_steps=0, queued=0)
        self._pid = os.getpid()
        # The running iterator, weakly: an iterator keeps its loader alive, not the other way
        # round, so that neither forms a cycle that only the garbage collector could free.
        self._active: Optional["weakref.ref[_Epoch]"] = None
        self._contexts = self._sources.positions(self._options(0))
        # Gather into torch-allocated (pinned) buffers from Python threads; the tests also run
        # this path without pinning on machines without a GPU.
        self._fill_path = self.pin_memory
        # To a GPU: a ring of pinned blocks, one copy per batch (tests set a _HostCopy).
        self._staged: Any = None
        if on_gpu and self._resident_device is None:
            self._staged = _CudaCopy(_torch(), self.device)

    def _open(self, cache: Any, remote: Dict[str, Any]) -> None:
        """Opens the caches given (one, or a list to mix) with ``remote``'s options."""
        given = list(cache) if isinstance(cache, (list, tuple)) else [cache]
        if not given:
            raise OptionsError("cache=[] names no cache: give a cache, or a list of them to mix",
                               option="cache")
        if remote["generation"] is not None and any(isinstance(c, Cache) for c in given):
            raise OptionsError("generation= opens a cache by its path: a dsc.Cache given is "
                               "already open at its generation (dsc.open(path, generation=...))",
                               option="generation")
        self.caches: List[Cache] = [c if isinstance(c, Cache) else shared(c, **remote)
                                    for c in given]
        self.cache = self.caches[0]
        self._sources = (_dsc.CacheHandle.mix([c._handle for c in self.caches])
                         if len(self.caches) > 1 else self.cache._handle)

    def _deliver_to(self, format: Optional[str], device: Any, pin_memory: bool,  # noqa: A002
                    copy: bool) -> None:
        """Python's own options of where batches go: the array kind, the device, pinning."""
        self.copy = copy
        torch = _torch()
        if format is None:
            format = "torch" if torch is not None else "numpy"
        if format not in ("torch", "numpy"):
            raise OptionsError(f"format={format!r}: expected 'torch' or 'numpy'", option="format")
        if format == "torch" and torch is None:
            raise OptionsError("format='torch' needs PyTorch (pip install torch); or use "
                               "format='numpy'", option="format")
        self.format = format
        self.device = None
        self.pin_memory = pin_memory
        if device is not None:
            if format != "torch":
                raise OptionsError("device= needs format='torch'", option="device")
            try:
                self.device = torch.device(device)
            except (RuntimeError, TypeError, ValueError) as e:
                raise OptionsError(f"device={device!r}: not a device torch knows ({e}); e.g. "
                                   "'cpu', 'cuda', 'cuda:1'", option="device") from None
            if self.device.type == "cuda":
                if not torch.cuda.is_available():
                    raise OptionsError(f"device={device!r}, but torch sees no CUDA device",
                                       option="device")
                self.pin_memory = True
        if self.pin_memory:
            if format != "torch":
                raise OptionsError("pin_memory=True needs format='torch'", option="pin_memory")
            if not torch.cuda.is_available():
                warnings.warn(
                    "dsc.Loader: pin_memory=True but no GPU is available; loading into "
                    "ordinary memory", stacklevel=3,
                )
                self.pin_memory = False

    def _read_back(self, keys: Dict[str, Any], untrimmed_multiple: int) -> None:
        """The options Rust resolved, as attributes by the keywords that give them (Rust's
        keys, ``threads`` as ``num_threads``): not in the resume state's spelling."""
        for key, value in keys.items():
            if key not in ("epoch", "columns", "trim_multiple"):
                setattr(self, _KEYWORD.get(key, key), value)
        # The multiple a trimmed batch rounds to; the one it would round to when untrimmed.
        self.trim_multiple: int = keys["trim_multiple"] if self.trim else untrimmed_multiple
        names = [t.name for t in self.cache.schema]
        columns = keys["columns"] or None
        self.columns: List[str] = [n for n in names if columns is None or n in columns]

    def _resident_choice(self, resident: Optional[bool], budget: Union[int, str, None]):
        """The device the split is kept on (``resident=``), or None for the host path."""
        if resident is not None and not isinstance(resident, bool):
            raise OptionsError(f"resident={resident!r}: expected True, False or None",
                               option="resident")
        if budget is not None and not isinstance(budget, (str, int)) or isinstance(budget, bool):
            raise OptionsError(f"resident_budget={budget!r}: expected bytes or a size like '8GiB'",
                               option="resident_budget")
        if resident is False:
            return None
        if self.series_window is not None:
            if resident:
                raise OptionsError("resident=True gathers whole contexts by index; series windows "
                                   "are cut from the shards on the host (leave resident= unset)",
                                   option="resident")
            return None
        if len(self.caches) > 1:
            if resident:
                raise OptionsError("resident=True keeps one cache's split on the device; a mix "
                                   "is gathered on the host (leave resident= unset)",
                                   option="resident")
            return None
        if self.format != "torch":
            if resident:
                raise OptionsError("resident=True needs format='torch'", option="resident")
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
                    "budget, load fewer columns=, or leave the split on the host (resident=False)", option="resident")
            return None
        return device

    def _static_choice(self, static: Any, gather_in_step: Any) -> bool:
        """Whether batches land in static buffers (``static=``): refused where a batch's
        shapes change from step to step, or where there is no device to hold them."""
        for name, value in (("static", static), ("gather_in_step", gather_in_step)):
            if not isinstance(value, (bool, np.bool_)):
                raise OptionsError(f"{name}={value!r}: expected True or False", option=name)
        if not static:
            if gather_in_step:
                raise OptionsError("gather_in_step=True defers the gather of static batches: "
                                   "pass static=True too", option="gather_in_step")
            return False
        if self.device is None:
            raise OptionsError("static=True puts every batch in the same tensors on a device: "
                               "pass device= ('cuda', or 'cpu' for CPU tensors)", option="static")
        # The loader's one rule for static shapes (dsc-train --graph asks it too).
        _dsc.static_shape(json.dumps(self._opts))
        if self.series_window is not None:
            raise OptionsError("static=True is for padded and packed batches; series windows "
                               "are delivered as new tensors each step", option="static")
        if gather_in_step and self._resident_device is None:
            raise OptionsError(
                "gather_in_step=True leaves the gather from a resident split to your step; this "
                "loader's split is not resident (each next() copies the whole batch): pass "
                "resident=True, or leave gather_in_step unset", option="gather_in_step")
        return True

    @staticmethod
    def defaults() -> Dict[str, Any]:
        """The Rust loader's default of every keyword that is its option, by keyword
        (``{"batch_size": 256, "shuffle": True, "num_threads": 1, ...}``): what a keyword left
        out (None) takes, for a script whose flags mirror the loader's."""
        rust = json.loads(_dsc.LOADER_DEFAULTS)
        return {_KEYWORD.get(k, k): v for k, v in rust.items()}

    @property
    def static(self) -> bool:
        """Whether every batch lands in the same tensors (``static=``)."""
        return self._static_wanted

    @property
    def static_batch(self) -> Batch:
        """The tensors every batch lands in (``static=True``), by name, on the loader's device:
        the same tensors for the loader's whole life, overwritten by each ``next()`` (and by
        :meth:`gather`). Read them before asking for the next batch, or copy what you keep.
        Available before the first batch, so that a CUDA graph can be captured on them."""
        if not self._static_wanted:
            raise OptionsError("static_batch needs dsc.Loader(static=True)", option="static")
        if self._static is None:
            source = (_ResidentSource(self) if self._resident_device is not None
                      else _HostSource(self, threads=0))
            self._static_buffers(source)
            source.close()
        if self._resident_device is not None:
            # A gather before the first next() (a graph captured on these buffers) reads the
            # split's rows: it is uploaded now.
            self._resident(background=False)
        return Batch(self._static.batch())

    def gather(self) -> Dict[str, Any]:
        """Fills :attr:`static_batch` with the current step's batch and returns it: for a
        resident split, one ``index_select`` per stored tensor from the split on the device by
        the index the last ``next()`` copied there (tensor operations only: no host sync, no
        allocation, so that it can run inside a captured CUDA graph); on the host path, where
        ``next()`` already copied the batch, nothing. Call it in your step with
        ``gather_in_step=True``; without it ``next()`` has called it already."""
        static = self.static_batch
        self._static.gather(self._resident_split, self.cache.max_len)
        return dict(static)

    def _source(self) -> Any:
        """Where this loader's batches come from: the resident split, pinned blocks staged to
        a GPU, pinned tensors, or the host (the Rust loader's threads)."""
        if self._resident_device is not None:
            return _ResidentSource(self)
        if self._staged is not None:
            return _StagedSource(self, self._staged)
        if self._fill_path:
            return _PinnedSource(self)
        return _HostSource(self)

    def _new_epoch(self) -> _Epoch:
        """The rest of the current epoch, from this loader's source into fresh tensors or its
        static buffers: the two choices, made here once."""
        return _Epoch(self, self._source(), _Static if self._static_wanted else _Fresh)

    def _static_buffers(self, epoch: Any) -> _static.StaticBatch:
        """The static buffers, made the first time from ``epoch``'s layout (a source's)."""
        if self._static is None:
            torch = _torch()
            device = self._resident_device or self.device
            index = (_resident.IndexLayout(epoch.handle)
                     if self._resident_device is not None else None)
            self._static = _static.StaticBatch(
                torch, device, epoch.layout, epoch.handle.batch_bytes(), _dsc.BLOCK_ALIGN,
                index)
        return self._static

    @property
    def resident(self) -> bool:
        """Whether batches are gathered from a copy of the split on the device (``resident=``)."""
        return self._resident_device is not None

    def _resident(self, background: bool = False) -> _resident.ResidentSplit:
        """The split on its device, uploaded at the first iteration (in a thread, with
        ``background``; otherwise done on return) and kept for later epochs."""
        if self._resident_split is None:
            # The split in cache order, read by Rust (zero-copy views where the shards allow).
            reader = _resident.split_pieces(_torch(), self.cache, self.split, self.columns)
            self._resident_split = _resident.ResidentSplit(self, reader, _torch(),
                                                           self._resident_device, background)
        elif not background:
            self._resident_split.wait()
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
            if self.follow:
                self._move_to_last(epoch)
            self._epoch, self._step, self._skip = epoch, 0, 0
            self._planned = None

    def _move_to_last(self, epoch: int) -> None:
        """With ``follow``: makes this loader again over the last generation of its caches, if
        one was appended since, at the start of ``epoch`` (an epoch boundary: the order of an
        epoch is always one generation's)."""
        last = [c.reopen() for c in self.caches]
        if [c.content_id for c in last] == [c.content_id for c in self.caches]:
            return
        made = dict(self._made_with)
        made["cache"] = last if len(last) > 1 else last[0]
        made["generation"] = None
        made["epoch"] = epoch
        made["follow"] = True
        self.__init__(**made)

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands, as a small JSON-able dict: the batches consumed so far
        (``samples``, counted over all ranks: contexts, or packs), the epoch, the order's
        parameters and the cache's ``content_id``. Save it with the model; :meth:`load_state_dict`
        continues the same order exactly, also on another number of ranks or at another batch size
        (from the same position of the same global order; a bucketed order resumes at its own
        global batch only). The order's fields and position come from the Rust loader's state."""
        state = json.loads(self._sources.state(self._options(0), self._step))
        return {
            "version": STATE_VERSION,
            "content_id": self._content_id(),
            **state,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "follow": self.follow,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`state_dict`), before or between iterations.
        A state from another cache, split, seed or order (or a bucketed one at another global
        batch) is a :class:`dsc.StateError`."""
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
        if identity == "content_id" and state["content_id"] != self._content_id():
            self._open_generation_of(str(state["content_id"]))
        ours = (self._content_id() if identity == "content_id"
                else self.cache._legacy_content_hash())
        # A compressed cache's states recorded its id over the stored (.zst) names before the id
        # left storage out: `dsc compress` keeps a cache's identity now.
        stored = "+".join(c._handle.stored_id() for c in self.caches)
        if state[identity] != ours and not (identity == "content_id" and state[identity] == stored):
            raise StateError(
                f"the state is for another cache ({identity} {state[identity]}, "
                f"{self.cache.path} has {ours})"
            )
        try:
            text = json.dumps(state)
        except (TypeError, ValueError) as e:
            raise StateError(f"not a dsc loader state: {e}") from None
        epoch, step, skip = self._sources.resume(self._options(0), text)
        self._close_active()
        self._epoch, self._step, self._skip = epoch, step, skip
        self._planned = None
        # A run that followed the cache's generations goes on following them.
        if "follow" in state:
            self.follow = self._made_with["follow"] = bool(state["follow"])

    def __iter__(self) -> Iterator[Batch]:
        if os.getpid() != self._pid or _in_worker_process():
            raise WorkerError(
                f"dsc.Loader was made in process {self._pid} and used in process {os.getpid()} "
                f"(a DataLoader worker or a fork). {FORK_ADVICE}"
            )
        # An epoch that starts (after the last one ended, or set_epoch) may read a newer
        # generation; one under way never changes.
        if self.follow and self._step == 0 and self._skip == 0 and self._active is None:
            self._move_to_last(self._epoch)
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
        epoch = self._new_epoch()
        self._active = weakref.ref(epoch)
        return epoch

    def stats(self) -> Dict[str, Any]:
        """What this loader has handed over since it was made, every epoch together:

        - ``batches``, ``contexts`` (a pack's sequences) and ``bytes`` (of the batches'
          tensors);
        - ``wait_s``: seconds spent inside ``next()`` waiting for a batch to be ready (the data
          stall; a loader that keeps up shows next to none);
        - ``device_wait_s``: seconds ``next()`` spent waiting for the device to finish with a
          buffer (on a GPU: the copy of a few steps back still queued behind your work). That
          is a busy GPU holding the loader back, not a data stall, so it is not in ``wait_s``;
          :attr:`device_wait_s` reads it without the rest of the stats;
        - ``upload_steps``, ``upload_s``: with a resident split, the batches served from the
          host path while the split was uploading (in the background, so that the first step
          does not wait for it; the same batches either way), and the upload's seconds;
        - ``queue_mean``: the batches ready ahead of the consumer when it asked, on average (near
          0 for a starved consumer, near ``prefetch`` per thread for one that is the bottleneck);
        - ``shard_reads``, ``stored_bytes_read``, ``shard_hits``, ``shard_evictions``: what the
          cache's compressed shards cost (every loader of the open cache; 0 for a hot cache,
          which the page cache serves);
        - ``shards_fetched``, ``bytes_fetched``, ``fetch_hits``, ``fetch_waits``,
          ``fetch_wait_s``, ``fetch_evictions``: for a cache in object storage, its downloads,
          the shards found already fetched, the waits for a download (by the loading threads)
          and the shards removed to stay within ``cache_limit`` (every loader of the open cache);
        - ``mix`` (a mix only): where the run stands on its weights at the next step:
          ``stage`` (the schedule's stage in force, 0 for fixed weights), ``at`` (its first
          position), ``weights`` (in force now: a linear stage's current step), ``position``
          (the run's sample position), and each cache's ``drawn`` samples and ``realised``
          share of the stage so far.
        """
        s = dict(self._counts)
        s["queue_mean"] = s.pop("queued") / max(1, s["batches"])
        split = self._resident_split
        s["upload_s"] = split.seconds if split is not None and split.ready() else None
        shards = json.loads(self._sources.shard_stats())
        for name in ("shard_reads", "stored_bytes_read", "shard_hits", "shard_evictions",
                     "shards_fetched", "bytes_fetched", "fetch_hits", "fetch_waits",
                     "fetch_wait_s", "fetch_evictions"):
            s[name] = shards[name]
        if len(self.caches) > 1:
            progress = self._sources.mix_progress(self._options(0), self._step)
            s["mix"] = None if progress is None else json.loads(progress)
        return s

    @property
    def device_wait_s(self) -> float:
        """Seconds ``next()`` has waited for the device so far (``stats()["device_wait_s"]``),
        cheap enough to read every step: subtract it from the time around ``next()`` to get
        the data wait alone."""
        return self._counts["device_wait_s"]

    def close(self) -> None:
        """Stops the loading threads now (they also stop when the loader is garbage)."""
        self._close_active()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        """``with dsc.Loader(...) as loader:`` stops the loading threads when the block ends."""
        self.close()

    def __del__(self) -> None:
        try:
            self._close_active()
        except BaseException:  # noqa: BLE001 (interpreter shutdown, a forked child)
            pass

    def __reduce__(self):
        raise WorkerError(f"a dsc.Loader cannot be pickled (sent to another process). {FORK_ADVICE}")

    def __repr__(self) -> str:
        # A loader whose __init__ raised is still shown by tracebacks and debuggers, which call
        # repr on it: that must say what it is, not raise a second error over the first.
        if "_staged" not in self.__dict__:
            caches = self.__dict__.get("caches")
            where = ("" if not caches else
                     f" of {[c.path for c in caches] if len(caches) > 1 else caches[0].path!r}")
            return f"<dsc.Loader{where}, not built: its options were refused>"
        caches = ([c.path for c in self.caches] if len(self.caches) > 1 else self.cache.path)
        mix = (f", weights={self.weights}, mix_samples={self.mix_samples}"
               if len(self.caches) > 1 else "")
        series = ""
        if self.series_window is not None:
            series = f", series_window={self.series_window}, stride={self.stride}"
            if self.horizon:
                series += (f", horizon={self.horizon}, "
                           f"horizon_columns={self.horizon_columns or None}")
            if self.pad_windows:
                series += ", pad_windows=True"
        return (
            f"dsc.Loader({caches!r}{mix}, split={self.split!r}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self._epoch}, rank={self.rank}, "
            f"world_size={self.world_size}, bucket={self.bucket}, pack={self.pack}{series}"
            f"{', static=True' if self._static_wanted else ''}"
            f"{', gather_in_step=True' if self.gather_in_step else ''}, "
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
        return json.dumps(dict(self._opts, epoch=self._epoch, skip=self._skip, threads=threads))

    def _steps(self) -> int:
        """Steps of the current epoch (planned once per epoch: packs depend on it)."""
        if self._planned is None or self._planned[0] != self._epoch:
            self._planned = (self._epoch, self._sources.plan(self._options(0))[0])
        return self._planned[1]

    def _handle(self, threads: int):
        # Writable (private) zero-copy views only for torch tensors that stay views.
        return self._sources.loader(
            self._options(threads), self._step, self.format == "torch" and not self.copy,
        )

    def _open_generation_of(self, content_id: str) -> None:
        """Makes this loader again over the generations of its caches that a state read (its
        ``content_id``, a mix's joined by ``+``), when they hold them: a resume reads the data
        the state was taken over, whatever was appended since. Left as it is otherwise (the
        state is then refused as another cache's)."""
        ids = content_id.split("+")
        if len(ids) != len(self.caches):
            return
        try:
            caches = [c if c.content_id == i else c.reopen(i) for c, i in zip(self.caches, ids)]
        except CacheError:
            return
        self._close_active()
        made = dict(self._made_with)
        made["cache"] = caches if len(caches) > 1 else caches[0]
        made["generation"] = None
        self.__init__(**made)

    def _content_id(self) -> str:
        """The identity of the data read: the cache's ``content_id``, a mix's joined by ``+``."""
        return "+".join(c.content_id for c in self.caches)

    def _record(self, batch: Batch, waited: float, queued: int, device: float = 0.0) -> None:
        """Counts a batch handed to the caller (:meth:`Loader.stats`)."""
        c = self._counts
        c["device_wait_s"] += device
        c["batches"] += 1
        rows = next(iter(batch.values())).shape[0] if batch else 0
        c["contexts"] += batch.seqs if batch.seqs is not None else rows
        c["bytes"] += sum(t.nbytes for t in batch.values())
        c["wait_s"] += waited
        c["queued"] += queued

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
        start = self._skip + step * self.batch_size * self.world_size + self.rank * self.batch_size
        return max(0, min(self.batch_size, self._contexts - start))

    def _finished(self, epoch: "_Epoch") -> None:
        if self._active is not None and epoch is self._active():
            self._epoch, self._step, self._skip = self._epoch + 1, 0, 0
            self._active = None


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
            + FORK_ADVICE
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
