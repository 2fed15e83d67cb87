"""`dsc.compile`: `dsc compile` from Python, with the CLI's options as keyword arguments. The
same options give the same cache, byte for byte: both build the same spec and run the same
Rust compiler."""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import warnings
from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    TypedDict, Union)

if TYPE_CHECKING:  # typing.Unpack is 3.11's; the package runs on 3.9 (annotations stay strings)
    from typing_extensions import Unpack

import numpy as np

from . import _dsc
from ._cache import Cache, remote_json
from ._errors import OptionsError, boolean

PathLike = Union[str, "os.PathLike[str]"]

# Each choice's names, from the Rust types that define them (the CLI and spec files use the
# same): {"truncate": ("head", "tail", "sample"), "nan": ..., "codec": ..., "stage": ...}.
_CHOICES = {what: tuple(names) for what, names in _dsc.choices()}


class CompileOptions(TypedDict, total=False):
    """The spec keywords of :func:`dsc.compile` and :func:`dsc.compile_stage`, with their types
    (``dsc compile``'s flags, ``--order-by`` as ``order_by``): what type checkers and editors
    show for ``**options``. The names are checked at run time by ``_fields``, whose parameters a
    test holds equal to these."""

    key: str
    order_by: str
    context: PathLike
    context_key: str
    targets: Union[str, Sequence[str]]
    context_features: Union[str, Sequence[str]]
    features: Union[str, Sequence[str]]
    categorical: Union[str, Sequence[str]]
    encode: Union[Mapping[str, str], Sequence[str]]
    joins: Sequence[Union[Tuple[PathLike, str], Mapping[str, str]]]
    join: PathLike
    on: str
    max_len: int
    ngram_vocab: int
    truncate: str
    nan: str
    unmatched_rows: str
    empty_contexts: str
    val_fraction: float
    split_seed: int
    split_by: str
    split_keys: Mapping[str, PathLike]
    seed: int
    shard_size: Union[int, str]
    profile: str
    val_keys: PathLike
    partitions: int
    bucket_size: Union[int, str]
    fit_from: Union[PathLike, "Cache"]


def _names(value: Union[str, Iterable[str], None], what: str) -> Optional[List[str]]:
    """A list of column names from a list or a comma-separated string (as on the CLI)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    names = list(value)
    if not all(isinstance(v, str) for v in names):
        raise OptionsError(f"{what}: expected column names, got {value!r}", option=what)
    return names


def _encode(value: Union[Mapping[str, str], Iterable[str], None]) -> Optional[Dict[str, str]]:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        value = [value]
    out = {}
    for item in value:
        col, sep, chain = str(item).partition("=")
        if not sep:
            raise OptionsError(f"encode {item!r}: expected COLUMN=CHAIN, e.g. charge=log1p,zscore",
                               option="encode")
        out[col.strip()] = chain.strip()
    return out


def _is_table(value: Any) -> bool:
    """Whether ``value`` is a table in memory rather than a path: anything that exports the
    Arrow C stream (pyarrow, polars, pandas 2.2+, DuckDB results), a pandas DataFrame, or a
    Hugging Face ``datasets.Dataset``."""
    if isinstance(value, (str, bytes, os.PathLike)):
        return False
    if hasattr(value, "__arrow_c_stream__"):
        return True
    kind = type(value)
    return (kind.__module__.startswith("pandas") and kind.__name__ == "DataFrame") or (
        kind.__module__.startswith("datasets") and hasattr(value, "with_format"))


def _stream(value: Any, role: str = "rows") -> Any:
    """The Arrow C stream (a PyCapsule) of a table in memory: its rows as the library holds
    them, without a copy where it can give them so."""
    kind = type(value)
    if kind.__module__.startswith("datasets") and hasattr(value, "with_format"):
        # A Dataset's Arrow table holds every row it was made from; its rows (after select,
        # shuffle, filter) are those the index mapping names: `[:]` in arrow format takes them.
        value = value.with_format("arrow")[:]
    elif kind.__module__.startswith("pandas") and kind.__name__ == "DataFrame":
        # Columns only, whatever the pandas version: its own export keeps a non-default index
        # as a column (`__index_level_0__`), which would change the input's fingerprint.
        import pyarrow as pa
        value = pa.Table.from_pandas(value, preserve_index=False)
    elif kind.__module__.startswith("pyarrow") and hasattr(value, "read_next_batch"):
        value = _read_checked(value, role)
    return value.__arrow_c_stream__()


def _read_checked(reader: Any, role: str) -> Any:
    """A pyarrow ``RecordBatchReader`` read whole, here in Python: an exception its source
    raises (a generator's own, ``KeyboardInterrupt``) comes out as itself, and a batch whose
    schema is not the reader's is refused, naming it (the Arrow C stream would hand its buffers
    on under the reader's types: an int64 column read as doubles' bits)."""
    import pyarrow as pa
    schema = reader.schema
    batches = []
    for i, batch in enumerate(reader):
        if not batch.schema.equals(schema):
            theirs = {f.name: f.type for f in batch.schema}
            for field in schema:
                got = theirs.get(field.name)
                if got != field.type:
                    raise OptionsError(
                        f"{role}=: batch {i + 1} of the RecordBatchReader has column "
                        f"{field.name!r} as {got if got is not None else 'absent'}, where the "
                        f"reader's schema says {field.type}; every batch must have the schema",
                        option=role)
            raise OptionsError(f"{role}=: batch {i + 1} of the RecordBatchReader has columns "
                               f"{batch.schema.names}, the reader's schema "
                               f"{schema.names}", option=role)
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=schema)


class _Tables:
    """The tables in memory among ``dsc.compile``'s arguments, each given to the spec as a
    placeholder that the extension replaces by the table's registered name."""

    def __init__(self) -> None:
        self.streams: List[Tuple[str, Any]] = []
        # The named index levels of pandas DataFrames that are not also columns, by role:
        # a DataFrame's index is not one of its columns (what a spec names).
        self.indexes: List[Tuple[str, List[str]]] = []

    def take(self, value: Any, role: str) -> Any:
        if not _is_table(value):
            return value
        kind = type(value)
        if kind.__module__.startswith("pandas") and kind.__name__ == "DataFrame":
            levels = [n for n in value.index.names if n is not None and n not in value.columns]
            if levels:
                self.indexes.append((role, [str(n) for n in levels]))
        placeholder = f"memory:{role}"
        self.streams.append((placeholder, _stream(value, role)))
        return placeholder

    def check_names(self, fields: Mapping[str, Any]) -> None:
        """Refuses a spec naming the index of a DataFrame it was given, which the compile would
        report as a missing column: says what the index is and how to keep it."""
        if not self.indexes:
            return
        named: List[Tuple[str, str]] = []
        for field in ("key", "order_by", "context_key", "split_by"):
            if isinstance(fields.get(field), str):
                named.append((field, fields[field]))
        for field in ("targets", "features", "categorical", "context_features"):
            value = fields.get(field) or []
            named.extend((field, n) for n in ([value] if isinstance(value, str) else value))
        named.extend(("encode", n) for n in (fields.get("encode") or {}))
        named.extend(("joins", j.get("on")) for j in (fields.get("joins") or [])
                     if isinstance(j, Mapping))
        for role, levels in self.indexes:
            for field, name in named:
                if name in levels:
                    raise OptionsError(
                        f"{field}: {name!r} is the index of the DataFrame given as {role}, and a "
                        "DataFrame's index is not one of its columns: pass df.reset_index() to "
                        "keep it as a column", option=field)

    def joins(self, joins: Any, join: Any) -> Tuple[Any, Any]:
        join = self.take(join, "join")
        if joins is None:
            return joins, join
        taken = []
        for i, j in enumerate(joins):
            if isinstance(j, Mapping):
                j = dict(j, file=self.take(j.get("file"), f"join{i}"))
            elif isinstance(j, (tuple, list)) and len(j) == 2:
                j = (self.take(j[0], f"join{i}"), j[1])
            taken.append(j)
        return taken, join


def _joins(
    joins: Optional[Sequence[Any]], join: Optional[PathLike], on: Optional[str]
) -> Optional[List[Dict[str, str]]]:
    if join is not None or on is not None:
        if join is None or on is None or joins is not None:
            raise OptionsError("give join= and on= together (one lookup table), or joins=[(file, on), ...]")
        joins = [(join, on)]
    if joins is None:
        return None
    out = []
    for j in joins:
        if isinstance(j, Mapping):
            file, col = j.get("file"), j.get("on")
        else:
            try:
                file, col = j
            except (TypeError, ValueError):
                raise OptionsError(f"joins: expected (file, on) pairs, got {j!r}",
                                   option="joins") from None
        if file is None or col is None:
            raise OptionsError(f"joins: expected (file, on) pairs, got {j!r}", option="joins")
        out.append({"file": os.fspath(file), "on": str(col)})
    return out


def _compress(value: Any) -> Optional[str]:
    """``compress=``: a codec's name or None."""
    if value is None or isinstance(value, str):
        return value
    raise OptionsError(f"compress={value!r}: expected a codec's name ('zstd') or None",
                       option="compress")


def _path(name: str, value: Any) -> str:
    """A file keyword: a path (str or os.PathLike), or an OptionsError naming the keyword."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise OptionsError(f"{name}={value!r:.80}: expected a path (a str or os.PathLike)"
                       + ("; a table in memory is taken as rows=, context= or join="
                          if name != "context" else
                          "; a table in memory (pyarrow, pandas, polars) is taken too, but not "
                          "an iterator of rows"), option=name)


def _int(name: str, value: Any, low: int = 0, high: int = 2**64 - 1) -> int:
    """An integer keyword in ``[low, high]``: never a bool, a float or a string, which would
    otherwise be truncated or fail in the extension as TypeError or OverflowError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise OptionsError(f"{name}={value!r}: expected an integer in [{low}, {high}]",
                           option=name)
    return int(value)


def _size(name: str, value: Any) -> int:
    """Bytes, from a whole number or a string such as ``"64MiB"``."""
    if isinstance(value, str):
        try:
            return _dsc.parse_size(value)
        except OptionsError as e:
            raise OptionsError(f"{name}={value!r}: {e}", option=name) from None
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        raise OptionsError(f"{name}={value!r}: a size is a whole number of bytes or a string "
                           "such as \"64MiB\"", option=name)
    return _int(name, value, 0, 2**63 - 1)


def _fields(
    rows: Union[PathLike, Sequence[PathLike], None] = None,
    *,
    key: Optional[str] = None,
    order_by: Optional[str] = None,
    context: Optional[PathLike] = None,
    context_key: Optional[str] = None,
    targets: Union[str, Sequence[str], None] = None,
    context_features: Union[str, Sequence[str], None] = None,
    features: Union[str, Sequence[str], None] = None,
    categorical: Union[str, Sequence[str], None] = None,
    encode: Union[Mapping[str, str], Sequence[str], None] = None,
    joins: Optional[Sequence[Union[Tuple[PathLike, str], Mapping[str, str]]]] = None,
    join: Optional[PathLike] = None,
    on: Optional[str] = None,
    max_len: Optional[int] = None,
    ngram_vocab: Optional[int] = None,
    truncate: Optional[str] = None,
    nan: Optional[str] = None,
    unmatched_rows: Optional[str] = None,
    empty_contexts: Optional[str] = None,
    val_fraction: Optional[float] = None,
    split_seed: Optional[int] = None,
    split_by: Optional[str] = None,
    split_keys: Optional[Mapping[str, PathLike]] = None,
    seed: Optional[int] = None,
    shard_size: Union[int, str, None] = None,
    profile: Optional[str] = None,
    val_keys: Optional[PathLike] = None,
    partitions: Optional[int] = None,
    bucket_size: Union[int, str, None] = None,
    fit_from: Union[PathLike, "Cache", None] = None,
    spec: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """The spec fields of ``dsc.compile``'s keyword arguments, checked."""
    fields: Dict[str, Any] = {}
    if rows is not None:
        rows_list = [rows] if isinstance(rows, (str, os.PathLike)) else rows
        if isinstance(rows_list, Iterable) and not isinstance(rows_list, (bytes, Mapping)):
            rows_list = list(rows_list)  # a generator of paths (Path.glob) as well
        if not isinstance(rows_list, list) or not all(
                isinstance(r, (str, os.PathLike)) for r in rows_list):
            raise OptionsError(
                f"rows={rows!r:.80}: expected a path, a glob, a list of them, or a table in memory "
                "(a pyarrow Table or RecordBatchReader, a pandas or polars DataFrame, a "
                "datasets.Dataset, anything with __arrow_c_stream__)", option="rows")
        fields["rows"] = [os.fspath(r) for r in rows_list]
    for name, value in (("key", key), ("order_by", order_by), ("context_key", context_key),
                        ("profile", profile)):
        if value is not None:
            fields[name] = str(value)
    if isinstance(fit_from, Cache):
        fit_from = fit_from.path
    for name, value in (("context", context), ("val_keys", val_keys), ("fit_from", fit_from)):
        if value is not None:
            fields[name] = _path(name, value)
    for name, value in (("targets", targets), ("context_features", context_features),
                        ("features", features), ("categorical", categorical)):
        names = _names(value, name)
        if names is not None:
            fields[name] = names
    enc = _encode(encode)
    if enc is not None:
        fields["encode"] = enc
    jl = _joins(joins, join, on)
    if jl is not None:
        fields["joins"] = jl
    # Checked by Rust's spec, by key (type, range, choice), as JSON holds them.
    for name, value in (("truncate", truncate), ("nan", nan), ("unmatched_rows", unmatched_rows),
                        ("empty_contexts", empty_contexts), ("max_len", max_len),
                        ("split_seed", split_seed), ("seed", seed), ("partitions", partitions),
                        ("ngram_vocab", ngram_vocab), ("val_fraction", val_fraction)):
        if value is not None:
            value = value.item() if isinstance(value, np.generic) else value
            if isinstance(value, float) and not math.isfinite(value):
                raise OptionsError(f"{name}={value!r}: not a value this option takes", option=name)
            if name in ("max_len", "split_seed", "seed", "partitions", "ngram_vocab"):
                # A count or a seed: an integer of 64 bits, said here (JSON would carry 2**64
                # as a float, and True as a number).
                value = _int(name, value)
            fields[name] = value
    # A split assignment given here replaces the spec file's, whichever kind.
    if split_by is not None or split_keys is not None:
        fields["split_by"] = None if split_by is None else str(split_by)
        fields["split_keys"] = {}
    if split_keys is not None:
        if not isinstance(split_keys, Mapping):
            raise OptionsError(
                f"split_keys={split_keys!r}: expected a dict of split name to key file, "
                "e.g. {'test': 'test_ids.txt'}", option="split_keys")
        fields["split_keys"] = {str(k): os.fspath(v) for k, v in split_keys.items()}
    if shard_size is not None:
        fields["shard_size"] = _size("shard_size", shard_size)
    if bucket_size is not None:
        fields["bucket_size"] = _size("bucket_size", bucket_size)
    if spec is None:
        if "rows" not in fields or not fields["rows"]:
            raise OptionsError("no rows files given: pass rows= (paths or globs) or a spec file")
    return fields


def compile(  # noqa: A001 (dsc.compile mirrors `dsc compile`)
    rows: Union[PathLike, Sequence[PathLike], None] = None,
    *,
    out: PathLike,
    spec: Optional[PathLike] = None,
    force: bool = False,
    max_memory: Union[int, str, None] = None,
    progress: Optional[bool] = None,
    compress: Optional[str] = None,
    compress_level: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
    storage_options: Optional[Dict[str, Any]] = None,
    **options: Unpack[CompileOptions],
) -> Cache:
    """Compiles Parquet rows into a cache at ``out`` and returns it opened (:class:`dsc.Cache`).

    ``rows`` (and ``context=``, ``join=``, the files of ``joins=``) may also be a table in memory:
    a ``pyarrow.Table`` or ``RecordBatchReader``, a pandas or polars DataFrame, a Hugging Face
    ``datasets.Dataset``, or anything exporting the Arrow C stream (``__arrow_c_stream__``). Its
    batches are read where they are, without a copy or a file; the cache is the one compiled
    from the same table written to Parquet. Its manifest names it ``memory:ROLE:XXH3``, where
    ``XXH3`` hashes the batches written as an Arrow IPC stream (the input's fingerprint).

    Every option of ``dsc compile`` is a keyword argument of the same name (``--order-by`` is
    ``order_by``); lists may be Python lists or comma-separated strings, ``encode`` a dict
    ``{"charge": "log1p,zscore"}`` (or ``["charge=log1p,zscore"]``), lookup tables
    ``join="geometry.csv", on="sensor_id"`` or ``joins=[("geometry.csv", "sensor_id"), ...]``,
    ``shard_size`` bytes or a string such as ``"64MiB"``, ``split_keys`` a dict
    ``{"test": "test_ids.txt"}``. ``spec`` reads a ``dsc.toml`` spec
    file first; the keyword arguments given override it. The cache is byte-identical to the
    CLI's for the same options. ``progress`` shows bars on stderr (default: when stderr is a
    terminal).

    ``fit_from`` (a path or a :class:`dsc.Cache`) takes that cache's fitted parameters
    (normalisation, vocabularies, string encodings, fills, ``max_len``) instead of fitting: a
    test set encoded as its training set was (refused, naming the first difference, where the
    tensors would differ).

    ``max_memory`` (bytes or ``"4GiB"``; default half of the machine's or container's) bounds the memory the
    compile uses: the input is spilled beside ``out`` in buckets and processed a few at a time,
    and the cache does not depend on it. ``bucket_size`` sets the decoded input per bucket.

    ``compress="zstd"`` stores the shards compressed for cold storage (``compress_level`` 1–22,
    default 3), as ``dsc compile --compress zstd``: :class:`dsc.Loader` reads such a cache,
    decompressing a shard into memory on first use, with the same batches.

    ``out`` may be a URL in object storage (``"s3://bucket/cache"``, ``gs://…``, ``az://…``):
    the cache is compiled under ``cache_dir`` (default ``DSC_CACHE_DIR``, else
    ``~/.cache/dsc``), then uploaded with its manifest last, so that a reader finds no cache or
    the whole one; a cache already there is refused before any work unless ``force``.
    ``storage_options`` are object_store's configuration keys (see :class:`dsc.Cache`).

    Bad input raises :class:`dsc.CompileError` carrying ``file``, ``column`` and ``row``; the
    output is then left as it was (nothing half-written). The GIL is released while compiling.
    """
    tables = _Tables()
    rows = tables.take(rows, "rows")
    if "context" in options:
        options["context"] = tables.take(options["context"], "context")
    if "joins" in options or "join" in options:
        options["joins"], options["join"] = tables.joins(options.get("joins"), options.get("join"))
    fields = _fields(rows, spec=spec, **options)
    tables.check_names(fields)
    if progress is None:
        progress = sys.stderr is not None and sys.stderr.isatty()
    _dsc.compile(
        json.dumps(fields),
        None if spec is None else os.fspath(spec),
        os.fspath(out),
        boolean("force", force),
        boolean("progress", progress),
        None if max_memory is None else _size("max_memory", max_memory),
        _compress(compress),
        None if compress_level is None else _int("compress_level", compress_level, -(2**31), 2**31 - 1),
        remote_json(cache_dir, None, storage_options),
        tables.streams,
    )
    return Cache(out, cache_dir=cache_dir, storage_options=storage_options)


def append(
    cache: Union[PathLike, Cache],
    rows: Union[PathLike, Sequence[PathLike]],
    *,
    context: Optional[PathLike] = None,
    join: Optional[PathLike] = None,
    on: Optional[str] = None,
    joins: Optional[Sequence[Union[Tuple[PathLike, str], Mapping[str, str]]]] = None,
    max_memory: Union[int, str, None] = None,
    progress: Optional[bool] = None,
    cache_dir: Optional[PathLike] = None,
    storage_options: Optional[Dict[str, Any]] = None,
    existing: str = "refuse",
) -> Cache:
    """Appends new data to ``cache`` as its next generation and returns the cache opened at it.

    The new contexts (``rows``: paths or globs, or a table in memory as :func:`dsc.compile`
    takes it; ``context``: their rows of the context table, required when the cache has one; ``join=``/``on=`` or ``joins=`` lookup tables, the cache's
    own by default) are compiled with the cache's recorded spec and its fitted parameters frozen
    (normalisation, vocabularies, string encodings, fills, ``max_len``), so their tensors read
    as the cache's; a key's split follows the cache's rule. They are written as new shards and
    committed with a new manifest that lists the last generation's shards and the new ones: no
    file of the cache changes, a loader open on an earlier generation keeps its batches, and a
    loader state resumes on the generation it read (``Loader.load_state_dict``). A key the cache
    holds, or inputs whose tensors would differ, raise :class:`dsc.CompileError` naming them,
    and nothing is committed; with ``existing="replace"`` the new data's context of a key the
    cache holds replaces the cache's: the old one is hidden from the new generation on (its
    shard unchanged, still read by earlier generations). ``dsc.open(path, generation=N)`` opens any generation; ``dsc log``
    lists them. Appends to one cache run one after the other (a second waits for the first).
    A cache in object storage (a URL) is appended to through a local folder under
    ``cache_dir`` and published there, its manifest written only if absent: of two writers
    racing for one generation one commits and the other raises :class:`dsc.CompileError`.

    The new data is measured against the parameters it is encoded with (the first generation's
    train split): per column the mean's shift in standard deviations, the ratio of standard
    deviations, the share of values outside the fitted range or vocabulary, and the lengths. A
    ``UserWarning`` names what is past its threshold (a refit is due); the whole report is the
    generation's ``generations/NNNNN/drift.json``.
    """
    path = cache.path if isinstance(cache, Cache) else os.fspath(cache)
    tables = _Tables()
    rows = tables.take(rows, "rows")
    context = tables.take(context, "context")
    joins, join = tables.joins(joins, join)
    given = [rows] if isinstance(rows, (str, os.PathLike)) else list(rows)
    if not given:
        raise OptionsError("rows=[] names no rows file: give the new data's paths or globs",
                           option="rows")
    jl = _joins(joins, join, on)
    if tables.indexes:
        # The names are the cache's spec's: read only when a DataFrame has a named index.
        recorded = Cache(path, cache_dir=cache_dir, storage_options=storage_options)
        tables.check_names(recorded.manifest["spec"])
    if progress is None:
        progress = sys.stderr is not None and sys.stderr.isatty()
    drift = json.loads(_dsc.append(
        path,
        [os.fspath(r) for r in given],
        None if context is None else os.fspath(context),
        None if jl is None else [(j["file"], j["on"]) for j in jl],
        boolean("progress", progress),
        None if max_memory is None else _size("max_memory", max_memory),
        remote_json(cache_dir, None, storage_options),
        tables.streams,
        existing,
    ))
    if drift and drift["refit_due"]:
        warnings.warn(
            "dsc.append: the new data has moved away from what the encodings were fitted on; a "
            "new compile (a refit) is due: " + "; ".join(drift["reasons"]), stacklevel=2)
    return Cache(path, cache_dir=cache_dir, storage_options=storage_options)


_STAGES = _CHOICES["stage"]


def compile_stage(
    stage: str,
    partition: Union[str, Tuple[int, int]],
    rows: Union[PathLike, Sequence[PathLike], None] = None,
    *,
    out: PathLike,
    spec: Optional[PathLike] = None,
    max_memory: Union[int, str, None] = None,
    progress: bool = False,
    **options: Unpack[CompileOptions],
) -> Dict[str, Any]:
    """Runs one stage of one partition of a compile into ``out``, as
    ``dsc compile … --partition I/N --stage STAGE`` does; returns the stage's report
    (``stage``, ``partition``, ``partitions``, ``items``, ``seconds``, and ``phases``: the
    thread-seconds of each phase of the compile, as ``[name, seconds]`` pairs in flow order).

    ``stage`` is ``"scan"`` (the partition's share of the rows files, spilled into buckets),
    ``"fit"`` (statistics of its buckets) or ``"write"`` (shards of its buckets); each stage
    must have run in every partition before the next starts, and :func:`dsc.merge` commits.
    ``partition`` is ``(i, n)`` or ``"i/n"``. The other arguments are those of
    :func:`dsc.compile` and must be the same for every task of one compile. Tasks may run on
    any machines that share ``out``'s file system (Ray tasks, Slurm job arrays, Kubernetes
    Indexed Jobs; see docs/SCALE.md); a repeated task writes the same bytes.
    """
    if stage not in _STAGES:
        raise OptionsError(f"stage={stage!r}: expected one of {_STAGES}", option="stage")
    if isinstance(partition, str):
        i_text, sep, n_text = partition.partition("/")
        try:
            if not sep:
                raise ValueError
            index, count = int(i_text), int(n_text)
        except ValueError:
            raise OptionsError(f"partition={partition!r}: expected 'I/N', e.g. '0/4'",
                               option="partition") from None
    else:
        try:
            index, count = (int(v) for v in partition)
        except (TypeError, ValueError):
            raise OptionsError(f"partition={partition!r}: expected (i, n)",
                               option="partition") from None
    if not 0 <= index < count:
        raise OptionsError(f"partition={partition!r}: need 0 <= i < n", option="partition")
    given = [rows, options.get("context"), options.get("join")]
    given += [j[0] if isinstance(j, (tuple, list)) else j.get("file") if isinstance(j, Mapping)
              else j for j in options.get("joins") or []]
    if any(_is_table(v) for v in given if v is not None):
        raise OptionsError("a table in memory is compiled in one process, by dsc.compile(); "
                           "write it to Parquet for a partitioned compile")
    fields = _fields(rows, spec=spec, **options)
    report = _dsc.compile_stage(
        json.dumps(fields),
        None if spec is None else os.fspath(spec),
        os.fspath(out),
        stage,
        index,
        count,
        None if max_memory is None else _size("max_memory", max_memory),
        boolean("progress", progress),
    )
    return json.loads(report)


def merge(out: PathLike, *, force: bool = False, progress: Optional[bool] = None,
          compress: Optional[str] = None, compress_level: Optional[int] = None) -> Cache:
    """Commits a partitioned compile into ``out`` once every partition has run every stage
    (:func:`dsc.compile_stage`), as ``dsc merge`` does, and returns the cache opened. A missing
    part, or one of another spec or of inputs changed since, raises :class:`dsc.CompileError`
    naming it; nothing is a cache until this writes the manifest. ``compress`` and
    ``compress_level`` as for :func:`dsc.compile`."""
    if progress is None:
        progress = sys.stderr is not None and sys.stderr.isatty()
    level = None if compress_level is None else _int("compress_level", compress_level, -(2**31), 2**31 - 1)
    _dsc.merge(os.fspath(out), boolean("force", force), boolean("progress", progress),
               _compress(compress), level)
    return Cache(out)
