"""`dsc.open`: a cache's manifest, schema and statistics as Python objects, and the inverse of
its encodings (`Cache.decode`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dsc
from ._errors import OptionsError

PathLike = Union[str, "os.PathLike[str]"]

# Seconds per tick of each Arrow time type: the compiler stores times in seconds.
_SECONDS_PER_TICK = {
    "Timestamp(Second)": 1.0,
    "Timestamp(Millisecond)": 1e-3,
    "Date64": 1e-3,
    "Timestamp(Microsecond)": 1e-6,
    "Timestamp(Nanosecond)": 1e-9,
    "Date32": 86_400.0,
}

# Safetensors dtype names to NumPy's.
_DTYPES = {"F32": "float32", "U8": "uint8", "I32": "int32", "I64": "int64"}

# Reserved category codes (FORMAT.md): 0 null (and padding), 1 a value not in the vocabulary.
CODE_NULL = 0
CODE_UNKNOWN = 1
CODE_FIRST = 2


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of every batch: ``shape`` is one sample's (a batch adds the leading ``n``)."""

    name: str
    dtype: str
    role: str
    shape: Tuple[int, ...]
    columns: Tuple[str, ...]
    encodings: Tuple[Dict[str, Any], ...]

    @property
    def is_sequence(self) -> bool:
        """True for ``[n, L, ...]`` tensors (features, categorical codes, strings encoded per
        step), which ``trim`` cuts."""
        return self.role in ("features", "categorical", "encoded")


def cache_path(path: Any) -> str:
    """``path`` as text, or :class:`dsc.OptionsError` naming what was given instead (a bare
    ``TypeError`` from ``os.fspath`` before)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise OptionsError(f"cache={path!r}: expected a cache's path or URL, or a dsc.Cache (or "
                           f"a list of them to mix), not a {type(path).__name__}",
                           option="cache")
    return os.fsdecode(os.fspath(path))


def _reopen(path: str, args: Dict[str, Any]) -> "Cache":
    """A pickled :class:`Cache`, opened again where it is unpickled."""
    return Cache(path, **args)


def remote_json(cache_dir: Optional[PathLike], cache_limit: Union[int, str, None],
                storage_options: Optional[Dict[str, Any]],
                generation: Union[int, str, None] = None) -> Optional[str]:
    """The options of opening a cache as the extension takes them (None: the environment's,
    the last generation): its generation, and for a cache in object storage its folder, limit
    and store's keys."""
    if cache_dir is None and cache_limit is None and storage_options is None and generation is None:
        return None
    if isinstance(generation, bool) or not isinstance(generation, (int, str, type(None))):
        raise OptionsError(f"generation={generation!r}: expected a number, a content id or a tag",
                           option="generation")
    if isinstance(cache_limit, bool) or not isinstance(cache_limit, (int, str, type(None))):
        raise OptionsError(f"cache_limit={cache_limit!r}: expected bytes or a size like '20GiB'",
                           option="cache_limit")
    if isinstance(cache_limit, str):
        cache_limit = _dsc.parse_size(cache_limit)
    if isinstance(cache_limit, int) and not 0 < cache_limit < 2**64:
        raise OptionsError(f"cache_limit={cache_limit!r}: must be positive and below 2**64 bytes",
                           option="cache_limit")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise OptionsError(f"storage_options={storage_options!r}: expected a dict of object_store "
                           "keys such as {'aws_endpoint': ..., 'aws_region': ...}",
                           option="storage_options")
    return json.dumps({
        "cache_dir": None if cache_dir is None else os.fspath(cache_dir),
        "cache_limit": cache_limit,
        "storage_options": {str(k): str(v) for k, v in (storage_options or {}).items()},
        "generation": generation,
    })


class Cache:
    """An open, validated cache (``dsc.open(path)``). Cheap to share between loaders.

    ``path`` is a cache directory, or the URL of a cache in object storage (``s3://bucket/c``,
    ``gs://…``, ``az://…``, ``https://…``): then ``cache_dir`` is the local folder its shards
    are fetched into ahead of use (default ``DSC_CACHE_DIR``, else ``~/.cache/dsc``),
    ``cache_limit`` the bytes kept there at most (an int or ``"20GiB"``; default
    ``DSC_CACHE_LIMIT``, else no limit), and ``storage_options`` object_store's configuration
    keys (``{"aws_endpoint": "http://localhost:9000", "aws_region": "us-east-1"}``), which win
    over the environment (``AWS_*``, ``~/.aws/credentials``, ``GOOGLE_*``, ``AZURE_*``).
    """

    def __init__(self, path: PathLike, *, cache_dir: Optional[PathLike] = None,
                 cache_limit: Union[int, str, None] = None,
                 storage_options: Optional[Dict[str, Any]] = None,
                 generation: Union[int, str, None] = None) -> None:
        self.path = cache_path(path)
        # Kept to reopen the cache where it is unpickled (a DataLoader worker, another process):
        # the same generation, whatever was appended since.
        self._open_args = dict(cache_dir=cache_dir, cache_limit=cache_limit,
                               storage_options=storage_options, generation=generation)
        self._handle = _dsc.CacheHandle(self.path, remote_json(cache_dir, cache_limit,
                                                               storage_options, generation))
        self.manifest: Dict[str, Any] = json.loads(self._handle.manifest_json())
        self._stats: Optional[Dict[str, Any]] = None
        self._key_of: Optional[Dict[int, str]] = None
        self.schema: List[TensorInfo] = [
            TensorInfo(
                name=t["name"],
                dtype=_DTYPES[t["dtype"]],
                role=t["role"],
                shape=tuple(t["sample_shape"]),
                columns=tuple(c["name"] for c in t["columns"]),
                encodings=tuple(c["encoding"] for c in t["columns"]),
            )
            for t in self.manifest["tensors"]
        ]

    def __repr__(self) -> str:
        splits = ", ".join(f"{s['name']}={s['contexts']}" for s in self.manifest["splits"])
        shape = "records" if self.is_records else f"L={self.max_len}"
        return f"dsc.Cache({self.path!r}: {splits}; {shape})"

    @property
    def stats(self) -> Dict[str, Any]:
        """``stats.json``: per split, per column count, nulls, min, max, mean, std, quantiles,
        vocabularies; the sequence-length histogram."""
        if self._stats is None:
            self._stats = json.loads(self._handle.stats_json())
        return self._stats

    @property
    def fetch_folder(self) -> Optional[str]:
        """For a cache in object storage, the local folder its shards are fetched into (None for
        a local cache)."""
        folder = self._handle.fetch_folder()
        return None if folder is None else os.fspath(folder)

    @property
    def generation(self) -> int:
        """The generation open: 1 for a compiled cache, one more for each ``dsc.append``
        (``dsc.open(path, generation=N)`` opens another; the last one by default)."""
        return int((self.manifest.get("generation") or {}).get("number", 1))

    def reopen(self, generation: Union[int, str, None] = None) -> "Cache":
        """The same cache at ``generation`` (a number, a content id or a tag; None: the last
        one now), with the same options: how a reader moves on to appended data, by choice."""
        return Cache(self.path, **{**self._open_args, "generation": generation})

    @property
    def splits(self) -> Dict[str, int]:
        """Contexts per split."""
        return {s["name"]: s["contexts"] for s in self.manifest["splits"]}

    @property
    def max_len(self) -> int:
        """The padded sequence length ``L`` (1 for a table of records)."""
        return int(self.manifest["max_len"])

    @property
    def is_records(self) -> bool:
        """True for a table of records (compiled without ``key``): each sample is one row,
        keyed by its row number, and no tensor has a step axis (``x`` is ``[n, F]``)."""
        return not self.manifest["spec"].get("key")

    @functools.cached_property
    def content_id(self) -> str:
        """The identity of the cache's data: a hash over every shard's file name and checksum,
        in order. Equal ids mean the same bytes in the same shards, so the same loader order;
        a recompile with another seed or shard size changes it. Resume states record it (the
        Rust loader's and dsc-train's checkpoints use the same id)."""
        return self._handle.content_id()

    @property
    def fingerprint(self) -> str:
        """The inputs' fingerprint (``manifest.json``'s ``inputs.fingerprint``, what ``dsc
        inspect`` prints): equal fingerprints mean the same input files, whatever the compile
        made of them. For the identity of the cache's own bytes, see :attr:`content_id`."""
        return str(self.manifest["inputs"]["fingerprint"])

    def _legacy_content_hash(self) -> str:
        """The content hash resume states recorded as ``fingerprint`` before ``content_id``
        (dsc 0.1 states): read so that those states still resume."""
        h = hashlib.sha256()
        for shard in self.manifest["shards"]:
            h.update(f"{shard['file']}:{shard['xxh3']};".encode())
        return h.hexdigest()[:16]

    def __reduce__(self):
        # Pickled as what opens it (its path and options): the open shards and fetcher stay
        # in this process, and the receiving one maps its own.
        return (_reopen, (self.path, self._open_args))

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name``; :class:`dsc.OptionsError` names the ones there are."""
        for t in self.schema:
            if t.name == name:
                return t
        raise OptionsError(
            f"{self.path}: no tensor {name!r} (tensors: {[t.name for t in self.schema]})"
        )

    def vocab_size(self, name: str) -> int:
        """The number of codes of categorical tensor ``name`` (the reserved null and unknown
        codes included): the ``num_embeddings`` of an ``nn.Embedding`` over it."""
        info = self.tensor(name)
        enc = info.encodings[0] if len(info.encodings) == 1 else {}
        if enc.get("kind") == "category":
            return len(enc["vocabulary"]) + CODE_FIRST
        if enc.get("kind") == "sub_column":
            return int(enc["cardinality"])
        raise OptionsError(f"tensor {name!r} holds no category codes (role {info.role})")

    def column_stats(self, column: str, split: str = "train", table: Optional[str] = None) -> Dict[str, Any]:
        """``stats.json``'s entry for source column ``column`` of ``split`` (source units,
        before encoding): count, nulls, ``numeric`` (min, max, mean, std, quantiles) or the
        vocabulary. ``table`` (``rows``, ``join``, ``context``) picks one where two tables
        have a column of that name."""
        for s in self.stats["splits"]:
            if s["split"] != split:
                continue
            found = [c for c in s["columns"] if c["name"] == column and table in (None, c.get("table"))]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise OptionsError(
                    f"column {column!r} is in tables {[c.get('table') for c in found]}: pass table="
                )
            raise OptionsError(f"no statistics for column {column!r} in split {split!r}")
        names = [s["split"] for s in self.stats["splits"]]
        raise OptionsError(f"{self.path}: no statistics for split {split!r} (splits: {names})")

    def steps(self, split: str, batch_size: int, world_size: int = 1, drop_last: bool = True) -> int:
        """Batches per rank in one epoch of ``split`` (padded batches; a packed loader's
        ``len()`` gives its own)."""
        for name, value in (("batch_size", batch_size), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
                raise OptionsError(f"{name}={value!r}: expected a positive integer", option=name)
        options = dict(order=dict(split=split, drop_last=bool(drop_last), shuffle=False),
                       batch_size=batch_size, world_size=world_size, threads=0)
        return self._handle.plan(json.dumps(options))[0]

    def decode(self, name: str, values: Any, column: Optional[str] = None) -> np.ndarray:
        """Back to source units: inverts the encodings of tensor ``name`` on ``values`` (a NumPy
        array or torch tensor holding that tensor or a batch of it, e.g. ``batch["x"]``).

        Numeric columns come back as float64 (times in the source's ticks), booleans as bool,
        category codes as an object array of vocabulary values (``None`` for null or padding,
        ``"<unknown>"`` for values not seen in the train split). For a tensor of several columns
        (``x``, ``y``, ``c``) the last axis is the column; pass ``column`` to decode values of
        one column alone.
        """
        info = self.tensor(name)
        array = _to_numpy(values)
        if column is not None:
            if column not in info.columns:
                raise OptionsError(
                    f"tensor {name!r} has no column {column!r} (columns: {list(info.columns)})"
                )
            i = info.columns.index(column)
            return _decode_column(info.encodings[i], self._source_type(name, i), array)
        if len(info.columns) == 1 and not (
            info.role in ("features", "targets", "context_features")
        ):
            # (A string column encoded to a fixed width keeps its row's values on the last
            # axis: decoded row by row.)
            return _decode_column(info.encodings[0], self._source_type(name, 0), array)
        if array.shape[-1:] != (len(info.columns),):
            raise OptionsError(
                f"tensor {name!r} has {len(info.columns)} columns on its last axis; "
                f"got shape {tuple(array.shape)}"
            )
        parts = [
            _decode_column(enc, self._source_type(name, i), array[..., i])
            for i, enc in enumerate(info.encodings)
        ]
        if all(p.dtype != object for p in parts):
            return np.stack([p.astype(np.float64) for p in parts], axis=-1)
        return np.stack(parts, axis=-1)

    @property
    def key_type(self) -> str:
        """How the data held its keys: ``"int"`` (any signed integer, or unsigned below 64
        bits), ``"uint64"``, ``"string"``, ``"uuid"`` (16-byte binary) or ``"binary"``. The
        ``key`` tensor holds int64 ids: the keys themselves for ``int``, their bits for
        ``uint64``, a 64-bit hash of the key otherwise (``keys()`` and ``original_keys()`` give
        the keys back)."""
        source = self._source_type("key", 0)
        if source == "UInt64":
            return "uint64"
        if source == "Utf8":
            return "string"
        if source == "FixedSizeBinary(16)":
            return "uuid"
        if source == "Binary" or source.startswith("FixedSizeBinary("):
            return "binary"
        return "int"

    def keys(self, split: str = "train") -> List[Any]:
        """Every key of ``split`` as the data held it, in the split's compiled order: ints for
        integer keys (uint64 included), strings for string keys, UUIDs spelled
        ``xxxxxxxx-xxxx-…`` and other binary keys as hex. Position ``i`` is the context at
        position ``i`` of an unshuffled epoch. The contexts a generation hides (an append with
        ``existing="replace"`` replaced their keys) are left out: every key once."""
        self._split_named(split)
        table = self._handle.key_table(split)
        keys: List[Any]
        if table is not None:
            keys = list(table[1])
        else:
            ids = self._handle.key_ids(split)
            if self.key_type == "uint64":
                keys = [int(i) & 0xFFFF_FFFF_FFFF_FFFF for i in ids]
            else:
                keys = list(ids)
        live = self._live_positions(split)
        return keys if live is None else [keys[p] for p in live]

    def _live_positions(self, split: str) -> Optional[List[int]]:
        """The compiled positions of the contexts of ``split`` that this generation's readers
        see, in order, when it hides some (an append replaced their keys); None when it hides
        none. Positions count every stored context, hidden ones too (FORMAT.md §14, "Removed rows")."""
        shards = [s for s in self.manifest["shards"] if s["split"] == split]
        if not any(s.get("removed") for s in shards):
            return None
        out: List[int] = []
        for s in shards:
            gone = set(s.get("removed", ()))
            first = s["first_context"]
            out.extend(first + r for r in range(s["contexts"]) if r not in gone)
        return out

    def original_keys(self, ids: Any) -> List[Any]:
        """The keys as the data held them of ``ids``, values of the ``key`` tensor (a batch's
        ``batch["key"]``, a NumPy array or a list), in their order. String and binary keys are
        read from the cache's key tables (all splits, once); an id the cache does not hold
        raises ``KeyError``."""
        flat = _to_numpy(ids).astype(np.int64, copy=False).reshape(-1).tolist()
        kind = self.key_type
        if kind == "int":
            return flat
        if kind == "uint64":
            return [i & 0xFFFF_FFFF_FFFF_FFFF for i in flat]
        if self._key_of is None:
            key_of: Dict[int, str] = {}
            for split in self.splits:
                table = self._handle.key_table(split)
                key_of.update(zip(table[0], table[1]))
            self._key_of = key_of
        missing = [i for i in flat if i not in self._key_of]
        if missing:
            raise KeyError(f"{self.path}: no context has key id {missing[0]}")
        return [self._key_of[i] for i in flat]

    def key_id(self, key: Any) -> int:
        """The id the ``key`` tensor holds for ``key`` as the data holds it (an int, a string,
        a UUID as text or ``uuid.UUID``, bytes): what to compare ``batch["key"]`` with."""
        if isinstance(key, (bytes, bytearray)):
            key = bytes(key).hex()
        if isinstance(key, bool):
            raise ValueError(f"{key!r} is not a key")
        return self._handle.key_id(str(key))

    def find(self, key: Any, split: str = "train") -> Optional[int]:
        """The position in ``split``'s compiled order of the context with key ``key`` (as the
        data holds it), or None when the split has none. Reads the split's key tensor, shard by
        shard, until found."""
        self._split_named(split)
        return self._handle.find_id(split, self.key_id(key))

    def _split_named(self, split: str) -> None:
        if split not in self.splits:
            raise OptionsError(f"{self.path}: no split {split!r} (splits: {list(self.splits)})")

    def _source_type(self, name: str, i: int) -> str:
        for t in self.manifest["tensors"]:
            if t["name"] == name:
                return t["columns"][i]["source_type"]
        return ""


def _to_numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor
        values = values.detach().cpu()
        if str(values.dtype) == "torch.bfloat16":
            values = values.float()
        return values.numpy()
    return np.asarray(values)


def _decode_column(encoding: Dict[str, Any], source_type: str, stored: np.ndarray) -> np.ndarray:
    kind = encoding["kind"]
    if kind == "numeric":
        x = stored.astype(np.float64)
        for stage in reversed(encoding["stages"]):
            op = stage["op"]
            if op == "log1p":
                x = np.expm1(x)
            elif op == "zscore":
                x = x * stage["std"] + stage["mean"]
            elif op == "minmax":
                x = x * (stage["max"] - stage["min"]) + stage["min"]
            elif op != "identity":
                raise OptionsError(f"unknown encoding stage {op!r} (a newer dsc wrote this cache?)")
        return x / _SECONDS_PER_TICK.get(source_type, 1.0)
    if kind == "bool":
        return stored != 0
    if kind == "category":
        vocabulary: Sequence[Any] = encoding["vocabulary"]
        lookup = np.empty(len(vocabulary) + CODE_FIRST, dtype=object)
        lookup[CODE_NULL] = None
        lookup[CODE_UNKNOWN] = "<unknown>"
        lookup[CODE_FIRST:] = list(vocabulary) if vocabulary else []
        codes = stored.astype(np.int64)
        out = np.full(codes.shape, "<unknown>", dtype=object)
        ok = (codes >= 0) & (codes < len(lookup))
        out[ok] = lookup[codes[ok]]
        return out
    if kind in ("bits", "chars", "ngrams"):
        return _decode_strings(encoding, stored)
    # raw (keys, lengths) and engine sub-column codes are stored as they are.
    return stored


def _decode_strings(encoding: Dict[str, Any], stored: np.ndarray) -> np.ndarray:
    """A string column encoded to a fixed width, back to its strings: every row (the last axis
    holds a row's values) as the string of ``0`` and ``1`` (bits), the string with padding
    dropped (chars; ``\ufffd`` for a character outside the vocabulary) or the set of its
    n-grams (ngrams) in an object array of the leading shape."""
    kind = encoding["kind"]
    rows = stored.reshape(-1, stored.shape[-1]) if stored.ndim else stored.reshape(1, -1)
    out = np.empty(rows.shape[0], dtype=object)
    if kind == "bits":
        for i, row in enumerate(rows):
            out[i] = "".join("1" if v else "0" for v in row)
    elif kind == "chars":
        chars = ["", "\ufffd"] + [c for c in encoding["vocabulary"]]
        for i, row in enumerate(rows):
            out[i] = "".join(chars[c] if 0 <= c < len(chars) else "\ufffd"
                             for c in row.astype(np.int64) if c != CODE_NULL)
    else:
        grams = encoding["vocabulary"]
        for i, row in enumerate(rows):
            out[i] = {grams[j] for j in np.flatnonzero(row)}
    return out.reshape(stored.shape[:-1])


# The caches in object storage open in this process, by URL and options.
_REMOTE: "weakref.WeakValueDictionary[Tuple[str, Optional[str]], Cache]" = \
    weakref.WeakValueDictionary()


def shared(path: PathLike, *, cache_dir: Optional[PathLike] = None,
           cache_limit: Union[int, str, None] = None,
           storage_options: Optional[Dict[str, Any]] = None,
           generation: Union[int, str, None] = None) -> Cache:
    """The cache at ``path``, opened: a URL in object storage already open in this process with
    the same options gives the same :class:`Cache` (one fetcher and one folder, so that a train
    and a validation loader of one remote cache share their downloads); a local directory is
    opened anew (cheap)."""
    path = cache_path(path)
    if "://" not in path:
        return Cache(path, cache_dir=cache_dir, cache_limit=cache_limit,
                     storage_options=storage_options, generation=generation)
    key = (path, remote_json(cache_dir, cache_limit, storage_options, generation))
    cache = _REMOTE.get(key)
    if cache is None:
        cache = Cache(path, cache_dir=cache_dir, cache_limit=cache_limit,
                      storage_options=storage_options, generation=generation)
        _REMOTE[key] = cache
    return cache


def open(path: PathLike, *, cache_dir: Optional[PathLike] = None,  # noqa: A001 (dsc.open)
         cache_limit: Union[int, str, None] = None,
         storage_options: Optional[Dict[str, Any]] = None,
         generation: Union[int, str, None] = None) -> Cache:
    """Opens the cache in ``path``: reads and validates the manifest and every shard's size
    and header (O(shards)); raises :class:`dsc.CacheError` naming the file when it cannot.

    ``path`` may be the URL of a cache in object storage (``s3://bucket/cache``): its shards
    are fetched into ``cache_dir`` as loaders need them, ahead of use in their order, with at
    most ``cache_limit`` bytes kept (see :class:`dsc.Cache`). A URL already open in this
    process with the same options gives the same cache (its fetched shards shared).

    ``generation`` opens one generation of a cache that grew by ``dsc.append`` (its number,
    content id or tag; ``dsc log`` lists them): the last one by default."""
    return shared(path, cache_dir=cache_dir, cache_limit=cache_limit,
                  storage_options=storage_options, generation=generation)
