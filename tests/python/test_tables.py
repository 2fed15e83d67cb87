"""Tables in memory and list columns (issue 41, items 2 and 3): ``dsc.compile`` takes a pyarrow
Table or RecordBatchReader, a pandas or polars DataFrame or a ``datasets.Dataset`` for rows,
``context=`` and ``join=``, and writes the cache it writes for the same table as Parquet; a
table of list columns compiles to its exploded table's cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dsc
from conftest import run_dsc


def data_files(cache: Path) -> dict[str, str]:
    """Every file of a cache but its manifest (which names the inputs), by content hash."""
    return {str(p.relative_to(cache)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(cache.rglob("*")) if p.is_file() and p.name != "manifest.json"}


def assert_same_cache(a: Path, b: Path) -> None:
    fa, fb = data_files(a), data_files(b)
    assert fa.keys() == fb.keys() and len(fa) > 4, (sorted(fa), sorted(fb))
    for name in fa:
        assert fa[name] == fb[name], name


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """Customers as lists, and the same table exploded with a customer table (seeded), and the
    transactions with a merchant lookup table to join."""
    root = tmp_path_factory.mktemp("tables")
    for layout in ("lists", "exploded"):
        run_dsc("gen", "sequences", "--out", layout, "--customers", "300", "--files", "2",
                "--seed", "9", "--layout", layout, "--key-type", "string", cwd=root)
    return root


LIST_KWARGS = dict(key="customer_id", features=["amount", "items"],
                   categorical=["merchant_category"], encode={"amount": "log1p,zscore"},
                   nan="mean", targets=["lifetime_value", "churned"],
                   context_features=["tenure_years"], empty_contexts="keep", val_fraction=0.2,
                   shard_size="32KiB")


def lists_table(root: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((root / "lists/lists").glob("*.parquet")))


def test_a_pyarrow_table_of_lists_compiles_as_its_parquet_and_as_its_exploded_table(
        sample: Path, tmp_path: Path) -> None:
    table = lists_table(sample)
    assert pa.types.is_list(table.schema.field("amount").type)
    in_memory = dsc.compile(table, out=tmp_path / "memory", **LIST_KWARGS)
    pq.write_table(table, tmp_path / "lists.parquet", row_group_size=100)
    dsc.compile(str(tmp_path / "lists.parquet"), out=tmp_path / "file", **LIST_KWARGS)
    assert_same_cache(tmp_path / "memory", tmp_path / "file")
    # The list table is its exploded table with its own columns as the context table.
    dsc.compile(str(sample / "exploded/transactions"), out=tmp_path / "exploded",
                context=str(sample / "exploded/customers.parquet"), **LIST_KWARGS)
    assert_same_cache(tmp_path / "memory", tmp_path / "exploded")
    # The manifest names the table by its content: the same batches, the same name.
    (entry,) = in_memory.manifest["inputs"]["files"]
    assert entry["path"] == f"memory:rows:{entry['xxh3']}" and entry["role"] == "rows"
    assert in_memory.manifest["spec"]["rows"] == [entry["path"]]
    again = dsc.compile(table, out=tmp_path / "again", **LIST_KWARGS)
    assert again.fingerprint == in_memory.fingerprint
    # A batch reader, read as it streams, gives the same cache.
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=77))
    dsc.compile(reader, out=tmp_path / "reader", **LIST_KWARGS)
    assert_same_cache(tmp_path / "memory", tmp_path / "reader")


def test_dataframes_for_rows_context_and_join_compile_as_their_files(
        sample: Path, tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    rows = pd.concat([pd.read_parquet(p) for p in sorted((sample / "exploded/transactions").glob("*.parquet"))],
                     ignore_index=True)
    customers = pd.read_parquet(sample / "exploded/customers.parquet")
    # A lookup table joined per row on the item count.
    merchants = pd.DataFrame({"items": sorted(rows["items"].unique())})
    merchants["risk"] = [1 / (1 + i) for i in merchants["items"]]
    kwargs = dict(key="customer_id", order_by="ts", features=["amount", "risk"],
                  categorical=["channel"], nan="zero", targets=["churned"],
                  empty_contexts="drop", val_fraction=0.2, shard_size="32KiB")
    dsc.compile(rows, context=customers, join=merchants, on="items",
                out=tmp_path / "pandas", **kwargs)
    rows.to_parquet(tmp_path / "rows.parquet")
    customers.to_parquet(tmp_path / "customers.parquet")
    merchants.to_parquet(tmp_path / "merchants.parquet")
    dsc.compile(str(tmp_path / "rows.parquet"), context=str(tmp_path / "customers.parquet"),
                join=str(tmp_path / "merchants.parquet"), on="items",
                out=tmp_path / "files", **kwargs)
    assert_same_cache(tmp_path / "pandas", tmp_path / "files")
    polars = pytest.importorskip("polars")
    dsc.compile(polars.from_pandas(rows), context=polars.from_pandas(customers),
                joins=[(polars.from_pandas(merchants), "items")],
                out=tmp_path / "polars", **kwargs)
    assert_same_cache(tmp_path / "polars", tmp_path / "files")


def test_a_hugging_face_dataset_compiles_its_rows(sample: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    table = lists_table(sample)
    ds = datasets.Dataset(table)
    dsc.compile(ds, out=tmp_path / "hf", **LIST_KWARGS)
    dsc.compile(table, out=tmp_path / "table", **LIST_KWARGS)
    assert_same_cache(tmp_path / "hf", tmp_path / "table")
    # After a select, the dataset's rows are the selected ones, not its whole Arrow table.
    some = ds.select(range(0, len(ds), 2))
    dsc.compile(some, out=tmp_path / "some", **{**LIST_KWARGS, "val_fraction": 0.0})
    dsc.compile(table.take(list(range(0, len(ds), 2))), out=tmp_path / "taken",
                **{**LIST_KWARGS, "val_fraction": 0.0})
    assert_same_cache(tmp_path / "some", tmp_path / "taken")
    loader = dsc.Loader(str(tmp_path / "some"), batch_size=8)
    assert len(next(iter(loader))["key"]) == 8


def test_what_is_not_a_table_and_a_partitioned_table_are_refused(sample: Path, tmp_path: Path) -> None:
    with pytest.raises(dsc.OptionsError, match="expected a path, a glob, a list of them, or a table in memory"):
        dsc.compile({"a": [1]}, out=tmp_path / "x", key="a", features=["a"])
    with pytest.raises(dsc.OptionsError, match="a table in memory is compiled in one process"):
        dsc.compile_stage("scan", (0, 2), lists_table(sample), out=tmp_path / "p", **LIST_KWARGS)
    with pytest.raises(dsc.OptionsError, match="a table in memory is compiled in one process"):
        dsc.compile_stage("scan", (0, 2), str(sample / "lists/lists"), out=tmp_path / "p",
                          joins=[{"file": lists_table(sample), "on": "items"}], **LIST_KWARGS)
    # Paths may come from a generator (Path.glob), as before tables were taken.
    dsc.compile((sample / "lists/lists").glob("*.parquet"), out=tmp_path / "globbed", **LIST_KWARGS)
    # A table's bad data is named by its name and row, as a file's is.
    bad = pa.table({"id": [1, 1, 2], "x": [1.0, None, 2.0]})
    with pytest.raises(dsc.CompileError, match=r"memory:rows:[0-9a-f]{16}: column \"x\" row 1: null") as e:
        dsc.compile(bad, out=tmp_path / "bad", key="id", features=["x"])
    assert e.value.row == 1 and e.value.column == "x"
    assert not (tmp_path / "bad").exists()


def _events(ids, xs) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(range(len(ids)), pa.int64()),
                            pa.array(xs)], names=["id", "t", "x"])


def test_a_reader_of_batches_is_read_checked_and_its_source_errors_come_out_as_themselves(
        tmp_path: Path) -> None:
    """Issue 52 (10, 11): a batch with another schema is refused naming the batch, the column
    and both types (an int64 column was read as doubles' bits, rc 0); an exception its source
    raises, KeyboardInterrupt included, comes out as itself."""
    schema = _events([1], [1.0]).schema
    kwargs = dict(key="id", order_by="t", features=["x"], val_fraction=0.0)

    def reader(last):
        def batches():
            for i in range(3):
                yield _events([i, i], [1.0, 2.0])
            if isinstance(last, BaseException):
                raise last
            yield last
        return pa.RecordBatchReader.from_batches(schema, batches())

    with pytest.raises(dsc.OptionsError, match=r"batch 4 of the RecordBatchReader has column "
                                               r"'x' as int64, where the reader's schema says double"):
        dsc.compile(reader(_events([9, 9], [1, 2])), out=tmp_path / "typed", **kwargs)
    assert not (tmp_path / "typed").exists()
    for raised in (LookupError("the source went away"), KeyboardInterrupt()):
        with pytest.raises(type(raised)):
            dsc.compile(reader(raised), out=tmp_path / "raised", **kwargs)
        assert not (tmp_path / "raised").exists()
    # A whole reader compiles as its table.
    good = dsc.compile(reader(_events([9, 9], [3.0, 4.0])), out=tmp_path / "good", **kwargs)
    assert sorted(good.keys()) == [0, 1, 2, 9]


def test_a_dataframes_index_and_every_string_kind(tmp_path: Path) -> None:
    """Issue 52 (9, 12): a key that is a DataFrame's index is named as such, with the way to
    keep it; polars' Categorical and Enum (dictionaries of string views), large strings and
    string views are strings as any other."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"k": ["a", "b", "a", "c"], "t": [0, 1, 2, 3],
                          "cat": ["x", "y", "x", "z"], "v": [1.0, 2.0, 3.0, 4.0]})
    kwargs = dict(key="k", order_by="t", features=["v"], categorical=["cat"], val_fraction=0.0)
    with pytest.raises(dsc.OptionsError, match=r"key: 'k' is the index of the DataFrame given "
                                               r"as rows.*df.reset_index\(\)") as e:
        dsc.compile(frame.set_index("k"), out=tmp_path / "indexed", **kwargs)
    assert e.value.option == "key"
    plain = dsc.compile(frame, out=tmp_path / "plain", **kwargs)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    kinds = {
        "large": table.cast(pa.schema([("k", pa.large_string()), ("t", pa.int64()),
                                       ("cat", pa.large_string()), ("v", pa.float64())])),
        "view": table.cast(pa.schema([("k", pa.string_view()), ("t", pa.int64()),
                                      ("cat", pa.string_view()), ("v", pa.float64())])),
        "dictionary": table.set_column(
            0, "k", pc.dictionary_encode(table["k"].cast(pa.string_view()))).set_column(
            2, "cat", pc.dictionary_encode(table["cat"].cast(pa.string_view()))),
    }
    polars = pytest.importorskip("polars")
    categorical = polars.from_pandas(frame).with_columns(
        polars.col("k").cast(polars.Categorical),
        polars.col("cat").cast(polars.Enum(["x", "y", "z"])))
    for name, data in [*kinds.items(), ("polars", categorical)]:
        cache = dsc.compile(data, out=tmp_path / name, **kwargs)
        assert sorted(cache.keys()) == sorted(plain.keys()), name
        assert data_files(tmp_path / name) == data_files(tmp_path / "plain"), name
