"""Data that keeps arriving, from Python: ``dsc.append`` commits a cache's next generation,
``dsc.open(..., generation=)`` reads any of them, and a loader state resumes on the generation
it read, with the uninterrupted batches, whatever was appended since."""

from __future__ import annotations

import itertools
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import dsc
from conftest import COMPILE_KWARGS, run_dsc


@pytest.fixture
def growing(workdir: Path, tmp_path: Path) -> Path:
    """A cache of the first IceCube batch file, in a folder of this test's own (the session's
    data; `train_meta` holds every event, so contexts without rows are dropped)."""
    out = tmp_path / "daily"
    kwargs = dict(COMPILE_KWARGS, empty_contexts="drop")
    kwargs["context"] = str(workdir / kwargs["context"])
    kwargs["join"] = str(workdir / kwargs["join"])
    dsc.compile(str(workdir / "data/train/batch_1.parquet"), out=out, shard_size="96KiB", **kwargs)
    return out


def append(cache: Path, workdir: Path, n: int) -> dsc.Cache:
    return dsc.append(cache, workdir / f"data/train/batch_{n}.parquet",
                      context=workdir / "data/train_meta.parquet")


def keys(loader: dsc.Loader, steps: int | None = None) -> list[list[int]]:
    """The keys of each batch: of the whole epoch, or of its first `steps` batches."""
    return [np.asarray(b["key"]).tolist() for b in itertools.islice(loader, steps)]


def test_append_commits_a_generation_every_reader_can_open(growing: Path, workdir: Path) -> None:
    first = dsc.open(growing)
    assert first.generation == 1
    grown = append(growing, workdir, 2)
    assert grown.generation == 2
    assert sum(grown.splits.values()) == 800
    assert grown.manifest["generation"]["parent"] == first.content_id
    # The fitted encodings are the first generation's: the new data reads as the old did.
    assert grown.manifest["tensors"] == first.manifest["tensors"]
    again = dsc.open(growing, generation=1)
    assert again.content_id == first.content_id and again.splits == first.splits
    assert dsc.open(growing, generation=grown.content_id).generation == 2
    # Pickled (a DataLoader worker, another process): the same generation comes back.
    assert pickle.loads(pickle.dumps(again)).content_id == first.content_id
    assert first.reopen().generation == 2
    with pytest.raises(dsc.CacheError, match="no generation 3"):
        dsc.open(growing, generation=3)
    # A key the cache holds is refused, naming it, and nothing is committed.
    with pytest.raises(dsc.CompileError, match="already in the cache"):
        append(growing, workdir, 2)
    assert dsc.open(growing).generation == 2


def test_a_state_resumes_its_generation_after_appends(growing: Path, workdir: Path) -> None:
    options = dict(split="train", batch_size=16, seed=3, format="numpy")
    uninterrupted = keys(dsc.Loader(growing, **options))
    loader = dsc.Loader(growing, **options)
    keys(loader, steps=5)
    state = loader.state_dict()
    append(growing, workdir, 2)
    append(growing, workdir, 3)
    # A new loader opens the last generation; the state brings it back to the one it read.
    resumed = dsc.Loader(growing, **options)
    assert resumed.cache.generation == 3
    resumed.load_state_dict(state)
    assert resumed.cache.generation == 1
    assert keys(resumed) == uninterrupted[5:]
    # Moving on to the new data is the user's choice: the last generation, from epoch 0.
    latest = dsc.Loader(growing, **options)
    assert len(keys(latest)) > len(uninterrupted)
    # A state of data no generation holds is refused as another cache's.
    with pytest.raises(dsc.StateError, match="another cache"):
        latest.load_state_dict({**state, "content_id": "00000000deadbeef"})


def test_the_cli_and_python_append_alike(growing: Path, workdir: Path, tmp_path: Path) -> None:
    twin = tmp_path / "twin"
    shutil.copytree(growing, twin)
    append(growing, workdir, 2)
    run_dsc("append", str(twin), str(workdir / "data/train/batch_2.parquet"),
            "--context", str(workdir / "data/train_meta.parquet"), "--quiet")
    assert dsc.open(twin).content_id == dsc.open(growing).content_id


def test_fit_from_encodes_a_test_set_as_its_training_set(growing: Path, workdir: Path,
                                                          tmp_path: Path) -> None:
    """``dsc.compile(fit_from=cache)``: another file's events with the cache's encodings: the
    same tensors (normalisation, vocabulary, L), though its own data would fit others."""
    train = dsc.open(growing)
    kwargs = dict(COMPILE_KWARGS, empty_contexts="drop")
    kwargs["context"] = str(workdir / kwargs["context"])
    kwargs["join"] = str(workdir / kwargs["join"])
    own = dsc.compile(str(workdir / "data/train/batch_4.parquet"), out=tmp_path / "own", **kwargs)
    test = dsc.compile(str(workdir / "data/train/batch_4.parquet"), out=tmp_path / "test",
                       fit_from=train, **kwargs)
    assert test.manifest["tensors"] == train.manifest["tensors"]
    assert own.manifest["tensors"] != train.manifest["tensors"]
    assert test.manifest["spec"]["fit_from"] == str(growing)


def test_follow_moves_to_the_last_generation_at_the_next_epoch_only(growing: Path,
                                                                    workdir: Path) -> None:
    """``follow=True``: an append in the middle of an epoch changes nothing of it; the next
    epoch reads the last generation. The state records both, so a resume follows too."""
    options = dict(split="train", batch_size=16, seed=3, format="numpy")
    loader = dsc.Loader(growing, follow=True, **options)
    still = dsc.Loader(growing, **options)
    first = keys(loader, steps=3)
    append(growing, workdir, 2)
    rest = keys(loader)
    assert first + rest == keys(dsc.Loader(growing, generation=1, **options))
    state = loader.state_dict()          # at the end of epoch 0: epoch 1, nothing read yet
    assert state["follow"] and state["content_id"] == dsc.open(growing, generation=1).content_id
    loader.set_epoch(1)
    epoch_1 = keys(loader)
    assert loader.cache.generation == 2
    assert epoch_1 == keys(dsc.Loader(growing, epoch=1, **options))
    still.set_epoch(1)
    keys(still)
    assert still.cache.generation == 1, "without follow, a loader keeps its generation"
    # A resume of that state reads generation 1 where it stopped, then follows: epoch 1 is
    # the last generation's.
    resumed = dsc.Loader(growing, **options)
    resumed.load_state_dict(state)
    assert resumed.follow and resumed.cache.generation == 1
    assert keys(resumed) == epoch_1 and resumed.cache.generation == 2


def test_a_table_in_memory_appends_as_its_file_does(growing: Path, workdir: Path,
                                                     tmp_path: Path) -> None:
    """``dsc.append(cache, table)``: a pyarrow table (and a pandas frame as context) appends
    the shards its Parquet file does, byte for byte (the same content id)."""
    pq = pytest.importorskip("pyarrow.parquet")
    twin = tmp_path / "twin"
    shutil.copytree(growing, twin)
    by_file = append(growing, workdir, 2)
    table = pq.read_table(workdir / "data/train/batch_2.parquet")
    meta = pq.read_table(workdir / "data/train_meta.parquet").to_pandas()
    by_table = dsc.append(twin, table, context=meta)
    assert by_table.content_id == by_file.content_id
    assert by_table.manifest["generation"]["inputs"]["files"][0]["path"].startswith("memory:")


def test_replaced_keys_read_once_as_their_new_contexts(growing: Path, workdir: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    first = dsc.open(growing)
    old = pc.unique(pq.read_table(workdir / "data/train/batch_1.parquet")["event_id"])
    new = pq.read_table(workdir / "data/train/batch_2.parquet")
    ids = pc.unique(new["event_id"]).to_pylist()
    # The first 40 events of the second file take keys of the first: new data for them.
    rename = dict(zip(ids[:40], old.to_pylist()[:40]))
    column = pa.array([rename.get(i, i) for i in new["event_id"].to_pylist()], pa.int64())
    new = new.set_column(new.schema.get_field_index("event_id"), "event_id", column)
    meta = workdir / "data/train_meta.parquet"
    with pytest.raises(dsc.OptionsError, match="existing"):
        dsc.append(growing, new, context=meta, existing="overwrite")
    with pytest.raises(dsc.CompileError, match="existing replace"):
        dsc.append(growing, new, context=meta)
    grown = dsc.append(growing, new, context=meta, existing="replace")
    assert grown.manifest["generation"]["removed"] and sum(grown.splits.values()) == 760
    # The replaced contexts' statistics were read back from their file and taken out.
    assert "includes_hidden" not in grown.stats
    assert {s["split"]: s["contexts"] for s in grown.stats["splits"]} == \
        {**grown.splits, "all": 760}
    every = grown.keys("train") + grown.keys("val")
    assert len(every) == len(set(every)) == 760
    replaced = list(rename.values())
    assert set(replaced) <= set(every)
    # A lookup finds the new context, past every context the first generation stored.
    for key in replaced[:3]:
        split = "train" if key in grown.keys("train") else "val"
        assert grown.find(key, split) >= first.splits[split]
    assert grown._live_positions("train") is not None
    # An epoch reads each live context once, on the host and from a resident split alike.
    torch = pytest.importorskip("torch")
    options = dict(split="train", batch_size=16, seed=5, drop_last=False, format="torch",
                   device="cpu")
    host = list(dsc.Loader(growing, **options))
    resident = list(dsc.Loader(growing, resident=True, **options))
    read = [k for b in host for k in b["key"][:b.valid].tolist()]
    assert sorted(read) == sorted(grown.keys("train"))
    assert len(host) == len(resident)
    for a, b in zip(host, resident):
        for name in a.keys():
            assert torch.equal(a[name], b[name]), name
