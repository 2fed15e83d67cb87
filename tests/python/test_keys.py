"""Keys as users keep them: string, UUID and uint64 keys compile, batches carry int64 ids, and
the cache gives every key back (``Cache.keys``, ``original_keys``, ``key_id``, ``find``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import dsc
from conftest import run_dsc

KWARGS = dict(key="customer_id", order_by="ts", context="customers.parquet",
              targets=["lifetime_value"], features=["amount", "items"], nan="mean",
              empty_contexts="keep", val_fraction=0.2, shard_size="64KiB")


@pytest.fixture(scope="module", params=["string", "uuid", "uint64", "int"])
def keyed(request, tmp_path_factory) -> tuple[str, Path, dsc.Cache]:
    """The same 400 customers with keys of one type, compiled."""
    style = request.param
    root = tmp_path_factory.mktemp(f"keys-{style}")
    run_dsc("gen", "sequences", "--out", ".", "--customers", "400", "--files", "2", "--seed", "5",
            "--key-type", style, cwd=root)
    cache = dsc.compile(str(root / "transactions"), out=root / "cache",
                        **{**KWARGS, "context": str(root / "customers.parquet")})
    return style, root, cache


def the_keys(style: str, root: Path) -> list:
    """The customers' keys as pyarrow reads them, spelled as dsc gives them back."""
    col = pq.read_table(root / "customers.parquet").column("customer_id").to_pylist()
    if style == "uuid":
        return [str(uuid.UUID(bytes=b)) for b in col]
    return col


def test_every_key_comes_back_as_the_data_held_it(keyed) -> None:
    style, root, cache = keyed
    assert cache.key_type == style
    keys = cache.keys("train") + cache.keys("val")
    # Every customer is a context (empty ones kept), each once, under its own key.
    assert sorted(keys, key=str) == sorted(the_keys(style, root), key=str)
    # Positions are the split's compiled order: the key tensor's ids at the same places.
    ids = cache._handle.key_ids("val")
    assert cache.original_keys(np.asarray(ids)) == cache.keys("val")
    assert [cache.key_id(k) for k in cache.keys("val")] == ids


def test_a_batchs_key_tensor_maps_back_and_finds_its_context(keyed) -> None:
    style, root, cache = keyed
    loader = dsc.Loader(cache, batch_size=16, split="train", seed=3)
    batch = next(iter(loader))
    assert str(batch["key"].dtype) == "torch.int64"
    originals = cache.original_keys(batch["key"])
    assert len(originals) == 16 and len(set(map(str, originals))) == 16
    for k in originals[:4]:
        at = cache.find(k, split="train")
        assert at is not None and cache.keys("train")[at] == k
    if style == "uuid":
        # A uuid.UUID, and a UUID without dashes, name the same key.
        u = uuid.UUID(originals[0])
        assert cache.key_id(u) == cache.key_id(u.hex.upper()) == cache.key_id(originals[0])
    if style == "string":
        assert cache.find("no such customer") is None
    if style in ("int", "uint64"):
        with pytest.raises(ValueError, match="not an? (integer|uint64) key"):
            cache.key_id("C-1")


def test_an_unknown_id_and_split_are_named(keyed) -> None:
    style, _, cache = keyed
    with pytest.raises(dsc.OptionsError, match="no split 'nope'"):
        cache.keys("nope")
    if style in ("string", "uuid"):
        with pytest.raises(KeyError, match="no context has key id 12345"):
            cache.original_keys([12345])
