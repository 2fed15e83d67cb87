"""dsc.Loader: the Rust order, the shard bytes, resume, lifetimes, threads and bad arguments."""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import random
import shutil
import threading
import time
import traceback
import weakref
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import dsc
from conftest import COMPILE_KWARGS, order_keys, run_dsc

torch = pytest.importorskip("torch")


def keys_of(loader, epochs: int = 1) -> list[list[int]]:
    """The keys of each batch (of a pack, its sequences'), `epochs` epochs on."""
    return [b["key"][: b.seqs].tolist() for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("bucket", [False, True])
def test_order_equals_dsc_order(cache_dir: Path, shuffle: bool, world_size: int, bucket: bool) -> None:
    # Small windows so that an epoch spans several windows and shards.
    loader_args = dict(batch_size=24, seed=5, window=100, interleave=2, shuffle=shuffle, bucket=bucket)
    cli_args = ["--batch-size", "24", "--seed", "5", "--window", "100", "--interleave", "2"]
    if not shuffle:
        cli_args.append("--no-shuffle")
    if bucket:
        cli_args.append("--bucket")
    for rank in range(world_size):
        loader = dsc.Loader(cache_dir, rank=rank, world_size=world_size, **loader_args)
        for epoch in range(3):
            loader.set_epoch(epoch)
            got = keys_of(loader)
            want = order_keys(cache_dir, *cli_args, "--epoch", str(epoch), "--rank", str(rank),
                              "--world-size", str(world_size))
            assert got == want, f"rank {rank} epoch {epoch}"
            assert len(got) == len(loader)


def test_epoch_advances_by_itself_and_differs(cache_dir: Path) -> None:
    loader = dsc.Loader(cache_dir, batch_size=32, seed=1)
    first, second = keys_of(loader), keys_of(loader)
    assert loader.epoch == 2
    assert first != second
    # drop_last drops a different remainder each epoch; no key repeats within one.
    assert len(set(sum(first, []))) == len(set(sum(second, []))) == 32 * len(loader)
    assert second == order_keys(cache_dir, "--batch-size", "32", "--seed", "1", "--epoch", "1")


def test_values_equal_the_shard_bytes(cache_dir: Path) -> None:
    """Every tensor of every batch equals the rows of the shard tensors (read by the
    independent `safetensors` package) holding the batch's keys."""
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    by_key: dict[int, tuple[dict, int]] = {}
    for shard in manifest["shards"]:
        if shard["split"] != "train":
            continue
        tensors = load_file(str(cache_dir / shard["file"]))
        for i, k in enumerate(tensors["key"].tolist()):
            by_key[k] = (tensors, i)
    for fmt in ("torch", "numpy"):
        for trim in (False, True):
            loader = dsc.Loader(cache_dir, batch_size=40, seed=3, trim=trim, format=fmt)
            for batch in loader:
                assert list(batch) == [t["name"] for t in manifest["tensors"]]
                for j, k in enumerate(batch["key"].tolist()):
                    tensors, i = by_key[k]
                    for name, value in batch.items():
                        got = np.asarray(value[j])
                        want = tensors[name][i]
                        if trim and got.ndim >= 1 and name in ("x", "sensor_id"):
                            assert got.shape[0] == batch.seq_len
                            assert not want[batch.seq_len:].any(), "trim cut stored values"
                            want = want[: batch.seq_len]
                        assert got.dtype == want.dtype and np.array_equal(got, want), name


def test_trim_cuts_to_the_longest_sequence(cache_dir: Path) -> None:
    for batch in dsc.Loader(cache_dir, batch_size=16, seed=0, trim=True):
        assert batch["x"].shape[1] == batch["sensor_id"].shape[1] == max(1, int(batch["length"].max()))


def test_bucket_groups_similar_lengths_and_trims(cache_dir: Path) -> None:
    plain = dsc.Loader(cache_dir, batch_size=16, seed=3, trim=True)
    bucketed = dsc.Loader(cache_dir, batch_size=16, seed=3, bucket=True)
    assert bucketed.trim and len(bucketed) == len(plain)
    padded = {}
    for name, loader in (("plain", plain), ("bucketed", bucketed)):
        stored = values = 0
        keys = []
        for batch in loader:
            lengths = batch["length"]
            assert batch["x"].shape[1] == batch.seq_len == max(1, int(lengths.max()))
            stored += int(lengths.sum())
            values += batch.seq_len * len(lengths)
            keys += batch["key"].tolist()
        assert len(set(keys)) == len(keys), "each context at most once"
        padded[name] = stored / values
    assert padded["bucketed"] > 0.85 and padded["bucketed"] > padded["plain"] + 0.2, padded
    # A bucketed state resumes a bucketed loader only.
    state = bucketed.state_dict()
    assert state["bucket"] is True
    with pytest.raises(dsc.StateError, match="bucket"):
        dsc.Loader(cache_dir, batch_size=16, seed=3).load_state_dict(state)
    # States from before bucketing existed lack the field: they were not bucketed.
    old = plain.state_dict()
    del old["bucket"]
    dsc.Loader(cache_dir, batch_size=16, seed=3, trim=True).load_state_dict(old)


def ladder_len(longest: int, multiple: int, max_len: int) -> int:
    """The documented ladder (m, 2m, 3m, 4m, then four sizes per doubling, at most L), written
    out independently of the Rust code."""
    longest = max(1, longest)
    if multiple > 1:
        sizes = [multiple * k for k in (1, 2, 3, 4)]
        while sizes[-1] < longest:
            step = sizes[-1] // 4
            sizes += [sizes[-1] + step * k for k in (1, 2, 3, 4)]
        longest = min(size for size in sizes if size >= longest)
    return min(longest, max_len)


def test_trim_multiple_rounds_batch_lengths_to_few_shapes(cache_dir: Path) -> None:
    """Bucketed batches on a GPU see a handful of shapes, not one per length (issue 28 item 2):
    each batch's length is its longest sequence rounded up the ladder; values and order are the
    exact run's, the extra steps are padding."""
    max_len = dsc.open(cache_dir).max_len
    exact = dsc.Loader(cache_dir, batch_size=16, seed=3, bucket=True)
    rounded = dsc.Loader(cache_dir, batch_size=16, seed=3, bucket=True, trim_multiple=16)
    shapes = {e: set() for e in ("exact", "rounded")}
    for a, b in zip(exact, rounded, strict=True):
        assert a["key"].equal(b["key"])
        longest = max(1, int(a["length"].max()))
        assert a.seq_len == longest
        assert b.seq_len == b["x"].shape[1] == ladder_len(longest, 16, max_len)
        assert b["x"][:, :longest].equal(a["x"]) and not b["x"][:, longest:].any()
        shapes["exact"].add(a.seq_len)
        shapes["rounded"].add(b.seq_len)
    assert len(shapes["rounded"]) <= len(range(16, max_len + 16, 16)) < len(shapes["exact"]), shapes
    # The default: exact on the CPU; a CUDA device rounds to 16 (not testable without one).
    assert exact.trim_multiple == 1 and dsc._loader.GPU_TRIM_MULTIPLE == 16
    with pytest.raises(dsc.OptionsError, match="trim_multiple"):
        dsc.Loader(cache_dir, trim=True, trim_multiple=0)


def test_columns_load_a_subset(cache_dir: Path) -> None:
    full = next(iter(dsc.Loader(cache_dir, batch_size=8, seed=2)))
    part = next(iter(dsc.Loader(cache_dir, batch_size=8, seed=2, columns=["y", "x", "length"])))
    assert list(part) == ["x", "length", "y"]  # manifest order
    for name in part:
        assert torch.equal(part[name], full[name])


@pytest.mark.parametrize("threads", [0, 1, 3])
@pytest.mark.parametrize("bucket", [False, True])
def test_resume_after_k_batches_continues_the_same_order(cache_dir: Path, threads: int, bucket: bool) -> None:
    args = dict(batch_size=16, seed=9, window=64, num_threads=threads, bucket=bucket)
    full = dsc.Loader(cache_dir, **args)
    whole = [b["key"].tolist() for _ in range(2) for b in full]
    steps = len(full)
    rng = random.Random(threads)
    for k in rng.sample(range(1, 2 * steps), 4):
        first = dsc.Loader(cache_dir, **args)
        seen = []
        it = iter(first)
        for _ in range(k):
            try:
                seen.append(next(it)["key"].tolist())
            except StopIteration:  # the end of epoch 0: carry on into epoch 1
                it = iter(first)
                seen.append(next(it)["key"].tolist())
        state = json.loads(json.dumps(first.state_dict()))  # JSON-able
        del first, it
        resumed = dsc.Loader(cache_dir, **args)
        resumed.load_state_dict(state)
        rest = []
        while len(seen) + len(rest) < len(whole):
            rest.extend(b["key"].tolist() for b in resumed)
        assert seen + rest == whole, f"k={k}"


def test_resume_on_another_world_size_keeps_the_global_order(cache_dir: Path) -> None:
    one = dsc.Loader(cache_dir, batch_size=32, seed=4, rank=0, world_size=1)
    global_batches = keys_of(one)
    two = [dsc.Loader(cache_dir, batch_size=16, seed=4, rank=r, world_size=2) for r in range(2)]
    it = [iter(l) for l in two]
    for _ in range(3):
        for i in it:
            next(i)
    state = two[0].state_dict()
    assert state["samples"] == 3 * 32
    resumed = dsc.Loader(cache_dir, batch_size=32, seed=4, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert keys_of(resumed) == global_batches[3:]


def test_set_epoch_after_load_state_dict_keeps_the_position(cache_dir: Path) -> None:
    a = dsc.Loader(cache_dir, batch_size=16, seed=0, epoch=2)
    it = iter(a)
    next(it), next(it)
    b = dsc.Loader(cache_dir, batch_size=16, seed=0)
    b.load_state_dict(a.state_dict())
    b.set_epoch(2)  # the usual loop calls set_epoch(epoch) after restoring a checkpoint
    assert next(iter(b))["key"].tolist() == next(it)["key"].tolist()
    b.set_epoch(3)
    assert b.state_dict()["samples"] == 0 and b.epoch == 3


def test_len_is_exact_and_equal_on_every_rank(cache_dir: Path) -> None:
    for drop_last in (True, False):
        counts = []
        for rank in range(3):
            loader = dsc.Loader(cache_dir, batch_size=50, rank=rank, world_size=3, drop_last=drop_last)
            batches = list(loader)
            assert all(len(b["key"]) == 50 for b in batches)
            counts.append((len(loader), len(batches)))
        assert len(set(counts)) == 1 and counts[0][0] == counts[0][1]


def test_cache_order_is_zero_copy_and_outlives_the_loader(cache_dir: Path) -> None:
    loader = dsc.Loader(cache_dir, batch_size=64, shuffle=False)
    batch = next(iter(loader))
    expected = {k: v.clone() for k, v in batch.items()}
    del loader
    import gc

    gc.collect()
    for k, v in batch.items():  # still readable: the tensors keep the mapping alive
        assert torch.equal(v, expected[k])


def test_a_write_to_a_zero_copy_tensor_never_reaches_the_file(private_cache: Path) -> None:
    shard = sorted((private_cache / "shards").glob("train-*.safetensors"))[0]
    before = hashlib.sha256(shard.read_bytes()).hexdigest()
    batch = next(iter(dsc.Loader(private_cache, batch_size=64, shuffle=False)))
    batch["x"].fill_(12345.0)  # torch has no read-only tensors: the map is copy-on-write
    batch["key"].zero_()
    assert hashlib.sha256(shard.read_bytes()).hexdigest() == before
    # Nor what this process reads later: each zero-copy tensor is a private mapping of its own.
    for cache in (dsc.Cache(private_cache), batch_cache := dsc.Cache(private_cache)):
        again = next(iter(dsc.Loader(cache, batch_size=64, shuffle=False)))
        assert not torch.equal(again["x"], batch["x"]) and int(again["key"].abs().sum()) > 0
    # Shuffled batches of one context are views too: writing into them changes nothing else.
    ones = dsc.Loader(batch_cache, batch_size=1, seed=0)
    total = 0.0
    for b in ones:
        total += float(b["x"].abs().sum())
        b["x"].mul_(0)
    again = dsc.Loader(batch_cache, batch_size=1, seed=0)
    assert sum(float(b["x"].abs().sum()) for b in again) == total
    np_batch = next(iter(dsc.Loader(private_cache, batch_size=64, shuffle=False, format="numpy")))
    with pytest.raises(ValueError):
        np_batch["x"][0, 0, 0] = 1.0  # NumPy views of the cache are read-only


def test_copy_gives_tensors_of_their_own(cache_dir: Path) -> None:
    view = next(iter(dsc.Loader(cache_dir, batch_size=8, shuffle=False)))
    owned = next(iter(dsc.Loader(cache_dir, batch_size=8, shuffle=False, copy=True)))
    snapshot = view["x"].clone()
    assert torch.equal(owned["x"], snapshot)
    owned["x"].add_(1.0)
    assert torch.equal(view["x"], snapshot) and not torch.equal(owned["x"], snapshot)


def test_batches_stay_valid_while_later_batches_are_loaded(cache_dir: Path) -> None:
    """Gather buffers are reused only after every tensor over them is gone."""
    loader = dsc.Loader(cache_dir, batch_size=16, seed=0, prefetch=1)
    kept = []
    snapshots = []
    for batch in loader:
        kept.append(batch)
        snapshots.append(batch["x"].clone())
    for batch, snap in zip(kept, snapshots):
        assert torch.equal(batch["x"], snap)


def test_the_fill_path_gives_the_same_batches(cache_dir: Path) -> None:
    """The pinned path (Python threads gathering into torch buffers), run without pinning."""
    for threads, bucket in ((1, False), (3, False), (2, True)):
        plain = dsc.Loader(cache_dir, batch_size=24, seed=6, trim=True, bucket=bucket)
        filled = dsc.Loader(cache_dir, batch_size=24, seed=6, trim=True, num_threads=threads,
                            bucket=bucket)
        filled._fill_path = True
        a, b = list(plain), list(filled)
        assert len(a) == len(b) == len(plain)
        for x, y in zip(a, b):
            assert list(x) == list(y)
            for k in x:
                assert torch.equal(x[k], y[k]), k
        assert filled.epoch == 1 and filled.state_dict()["samples"] == 0


def gil_ticks_during(fn) -> int:
    """How often another Python thread ran while `fn()` ran. The switch interval is raised so
    far that the interpreter itself never hands the GIL over: the other thread runs only if
    `fn` releases it."""
    import sys

    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0)  # releases the GIL at once

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    counter = threading.Thread(target=count)
    counter.start()
    try:
        time.sleep(0.01)  # let the counter start
        start = ticks
        fn()
        return ticks - start
    finally:
        stop.set()
        sys.setswitchinterval(old)
        counter.join()


def test_iteration_releases_the_gil(cache_dir: Path) -> None:
    """Another Python thread runs while a batch loads (num_threads=0 gathers inside next(),
    in Rust); the same measurement of pure-Python work sees no progress, so this can fail."""
    def spin() -> None:
        x = 0
        for i in range(2_000_000):
            x += i

    assert gil_ticks_during(spin) == 0
    for threads in (0, 1):
        loader = dsc.Loader(cache_dir, batch_size=1400, seed=0, num_threads=threads, window=1400)
        # The epoch starts inside the measurement: with a loader thread the first batch cannot
        # be ready yet (a batch prefetched while the counter started would measure nothing).
        assert gil_ticks_during(lambda: next(iter(loader))) > 0, f"num_threads={threads}"


def test_dataloader_with_workers_fails_clearly(cache_dir: Path) -> None:
    ds = dsc.IterableDataset(cache_dir, batch_size=16)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    for ctx in ("fork", "spawn"):
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context=ctx)
        with pytest.raises(Exception, match="num_workers=0"):
            next(iter(dl))


def test_iterable_dataset_keeps_order_and_resume(cache_dir: Path) -> None:
    ds = dsc.IterableDataset(cache_dir, batch_size=16, seed=8)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    assert len(dl) == len(ds)
    got = [b["key"].tolist() for b in dl]
    assert got == order_keys(cache_dir, "--batch-size", "16", "--seed", "8")
    ds2 = dsc.IterableDataset(cache_dir, batch_size=16, seed=8)
    it = iter(torch.utils.data.DataLoader(ds2, batch_size=None))
    next(it)
    state = ds2.state_dict()
    ds3 = dsc.IterableDataset(cache_dir, batch_size=16, seed=8, epoch=0)
    ds3.load_state_dict(state)
    assert [b["key"].tolist() for b in torch.utils.data.DataLoader(ds3, batch_size=None)] == order_keys(
        cache_dir, "--batch-size", "16", "--seed", "8")[1:]
    pinned = next(iter(torch.utils.data.DataLoader(dsc.IterableDataset(cache_dir, batch_size=4),
                                                   batch_size=None)))
    assert isinstance(pinned, dsc.Batch)


def test_numpy_format(cache_dir: Path) -> None:
    batch = next(iter(dsc.Loader(cache_dir, batch_size=8, format="numpy", seed=0)))
    assert isinstance(batch["x"], np.ndarray) and batch["x"].dtype == np.float32
    assert batch["key"].tolist() == order_keys(cache_dir, "--batch-size", "8")[0]


def test_batch_buffers_export_typed_arrays_that_keep_them_alive(cache_dir: Path) -> None:
    """The extension's buffers give NumPy the tensor's dtype and shape in one call (what makes a
    batch cheap for Python, issue 28 item 3) through the array interface every CPython >= 3.9
    can build (issue 43), and each array keeps its buffer's bytes alive after the batch is
    dropped."""
    cache = dsc.open(cache_dir)
    loader = dsc.Loader(cache, batch_size=8, seed=0, trim=True)
    handle = cache._handle.loader(loader._options(0), 0, True)
    layout = handle.tensors()
    step, (seq_len, _), buffers = handle.next()
    assert step == 0 and len(buffers) == len(layout)
    arrays, copies = [], []
    for (name, dtype, whole, axis), buf in zip(layout, buffers):
        typed = np.asarray(buf)
        shape = list(whole)
        if axis is not None:
            shape[axis] = seq_len
        assert typed.dtype == np.dtype(dtype) and list(typed.shape) == shape, name
        assert typed.flags.c_contiguous and typed.flags.writeable, name
        # The array's base holds the buffer (NumPy 2 holds it with the interface's capsule).
        base = typed.base if isinstance(typed.base, tuple) else (typed.base,)
        assert base[0] is buf and typed.nbytes == len(buf), name
        assert torch.from_numpy(typed).data_ptr() == typed.ctypes.data, name
        arrays.append(typed)
        copies.append(typed.copy())
    del buffers, buf, typed
    gc.collect()
    # The next batches reuse the pool's freed buffers; these arrays still own theirs.
    for _ in range(3):
        handle.next()
    for (name, *_), a, c in zip(layout, arrays, copies):
        assert np.array_equal(a, c), name
    handle.close()
    # Read-only views of the cache (NumPy, cache order) stay read-only through the typed export.
    view = next(iter(dsc.Loader(cache, batch_size=8, shuffle=False, format="numpy")))["x"]
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0, 0] = 1.0


def test_fill_refuses_buffers_it_cannot_write_whole(cache_dir: Path) -> None:
    """`fill` writes into the caller's arrays with the GIL released, so it takes only writable,
    C-contiguous NumPy arrays, and says which rule an argument broke."""
    cache = dsc.open(cache_dir)
    loader = dsc.Loader(cache, batch_size=8, seed=0)
    handle = cache._handle.loader(loader._options(0), 0, True)
    sizes = [int(np.prod(whole)) * np.dtype(dtype).itemsize
             for _, dtype, whole, _ in handle.tensors()]
    good = [np.zeros(n, np.uint8) for n in sizes]
    handle.fill(0, good)
    readonly = [b.copy() for b in good]
    readonly[0].flags.writeable = False
    strided = [np.zeros(2 * n, np.uint8)[::2] if i == 0 else np.zeros(n, np.uint8)
               for i, n in enumerate(sizes)]
    for bad, why in ((readonly, "read-only"), (strided, "not C-contiguous"),
                     ([bytearray(n) for n in sizes], "no __array_struct__"),
                     ([good[0]] * len(sizes), "overlap")):
        with pytest.raises(dsc.OptionsError, match=why):
            handle.fill(0, bad)
    handle.close()


def test_rank_defaults_come_from_the_environment(cache_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = dsc.Loader(cache_dir, batch_size=8)
    assert (loader.rank, loader.world_size) == (1, 2)


def test_bad_arguments_raise_dsc_errors(cache_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(dsc.CacheError, match="manifest"):
        dsc.Loader(tmp_path)  # an empty directory is not a cache
    # Issue 39, class F: bare TypeErrors from os.fspath before.
    for given, named in [(123, "cache=123"), (None, "cache=None"), ([cache_dir, 4.5], "cache=4.5")]:
        with pytest.raises(dsc.OptionsError, match=named) as e:
            dsc.Loader(given)
        assert e.value.option == "cache"
    with pytest.raises(dsc.OptionsError, match="cache=123"):
        dsc.open(123)
    with pytest.raises(dsc.CacheError) as missing:
        dsc.Loader(tmp_path / "nothing")
    assert missing.value.file and "nothing" in missing.value.file
    with pytest.raises(dsc.OptionsError, match="no split .test.*.train."):
        dsc.Loader(cache_dir, split="test")
    # Checked before a resident split is sized (a bare KeyError before).
    with pytest.raises(dsc.OptionsError, match="no split .test."):
        dsc.Loader(cache_dir, split="test", resident=True, format="torch")
    with pytest.raises(dsc.OptionsError, match="batch_size=0"):
        dsc.Loader(cache_dir, batch_size=0)
    with pytest.raises(dsc.OptionsError, match="rank=2"):
        dsc.Loader(cache_dir, rank=2, world_size=2)
    with pytest.raises(dsc.OptionsError, match="no tensor .z."):
        dsc.Loader(cache_dir, columns=["x", "z"])
    with pytest.raises(dsc.OptionsError, match="more than half of this machine.s memory"):
        next(iter(dsc.Loader(cache_dir, batch_size=2**62)))
    with pytest.raises(dsc.OptionsError, match="format="):
        dsc.Loader(cache_dir, format="jax")
    assert issubclass(dsc.OptionsError, ValueError)


def test_flags_are_booleans_and_every_refusal_names_its_keyword(cache_dir: Path,
                                                                 tmp_path: Path) -> None:
    """Issue 52 (16): `shuffle="False"` shuffled, `drop_last="no"` dropped, `drop_last=None`
    meant False; `device="tpu"`, `compress=True`, `context=<generator>` raised bare errors;
    `max_len=2**64` was reported as a float. (Issue 54: a flag the Rust loader owns takes
    None as "not given", its Rust default, never False.)"""
    rust_owned = ("shuffle", "drop_last", "bucket", "trim", "pad_windows")
    for keyword in (*rust_owned, "copy", "pin_memory", "static", "gather_in_step", "follow"):
        for value in ("False", "no", None, 0, 1.0):
            if value is None and keyword in rust_owned:
                continue
            with pytest.raises(dsc.OptionsError, match=f"{keyword}=.*expected True or False") as e:
                dsc.Loader(cache_dir, batch_size=8, **{keyword: value})
            assert e.value.option == keyword
    given_none = dsc.Loader(cache_dir, batch_size=8, shuffle=None, drop_last=None, bucket=None,
                            trim=None)
    assert (given_none.shuffle, given_none.drop_last, given_none.bucket, given_none.trim) == (
        True, True, False, False)
    assert not dsc.Loader(cache_dir, batch_size=8, shuffle=np.bool_(False)).shuffle
    torch = pytest.importorskip("torch")
    with pytest.raises(dsc.OptionsError, match="device='tpu'") as e:
        dsc.Loader(cache_dir, batch_size=8, device="tpu")
    assert e.value.option == "device"
    compile_kwargs = dict(key="event_id", features=["charge"], out=tmp_path / "c")
    rows = str(cache_dir.parent / "data/train/batch_1.parquet")
    for kwargs, keyword in [(dict(compress=True), "compress"), (dict(force="yes"), "force"),
                            (dict(context=(r for r in [1, 2])), "context"),
                            (dict(max_len=2**64), "max_len"), (dict(max_len=True), "max_len"),
                            (dict(seed=-1), "seed")]:
        with pytest.raises(dsc.OptionsError, match=f"{keyword}=") as e:
            dsc.compile(rows, **{**compile_kwargs, **kwargs})
        assert e.value.option == keyword, kwargs
    assert torch is not None


def test_a_refused_loader_still_has_a_repr(cache_dir: Path) -> None:
    """Tracebacks (pytest's, a notebook's) and debuggers show `self` of the __init__ that
    raised: its repr must say what it is instead of raising over the first error."""
    for options in (dict(split="test"), dict(batch_size=0), dict(columns=["z"])):
        with pytest.raises(dsc.OptionsError) as refused:
            dsc.Loader(cache_dir, **options)
        frame = next(f for f, _ in traceback.walk_tb(refused.tb)
                     if f.f_code.co_name == "__init__" and isinstance(f.f_locals.get("self"), dsc.Loader))
        half = frame.f_locals["self"]
        assert repr(half) == f"<dsc.Loader of {str(cache_dir)!r}, not built: its options were refused>"
    whole = dsc.Loader(cache_dir, batch_size=4)
    assert repr(whole).startswith(f"dsc.Loader({str(cache_dir)!r}, split='train', batch_size=4,")
    assert f"steps={len(whole)})" in repr(whole)


def test_one_meaning_of_fingerprint_and_old_states_still_resume(cache_dir: Path) -> None:
    """`cache.fingerprint` is the inputs' fingerprint (what `dsc inspect` prints); the identity
    of the cache's bytes is `content_id`, which states record. States written before it carry
    the old content hash as `fingerprint` and still resume (issue 29, item 2)."""
    cache = dsc.open(cache_dir)
    inspect = json.loads(run_dsc("inspect", str(cache_dir), "--json"))
    assert cache.fingerprint == inspect["inputs_fingerprint"]
    loader = dsc.Loader(cache, batch_size=16, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["content_id"] == cache.content_id and "fingerprint" not in state
    old = {k: v for k, v in state.items() if k != "content_id"}
    h = hashlib.sha256()
    for shard in cache.manifest["shards"]:
        h.update(f"{shard['file']}:{shard['xxh3']};".encode())
    old["fingerprint"] = h.hexdigest()[:16]
    again = dsc.Loader(cache, batch_size=16, seed=1)
    again.load_state_dict(old)
    assert next(iter(again))["key"].equal(next(it)["key"])
    with pytest.raises(dsc.StateError, match="another cache"):
        dsc.Loader(cache, batch_size=16, seed=1).load_state_dict({**old, "fingerprint": "0" * 16})


def test_bad_states_raise_state_errors(cache_dir: Path, workdir: Path) -> None:
    loader = dsc.Loader(cache_dir, batch_size=16, seed=1)
    good = loader.state_dict()
    for change, pattern in [
        ({"seed": 2}, "seed"),
        ({"split": "val"}, "split"),
        # Another global batch resumes at the same position (test_a_state_resumes_at_...).
        ({"global_batch": 32, "samples": 48}, "do not fit"),
        ({"content_id": "0" * 16}, "another cache"),
        ({"samples": 7}, "do not fit"),
        ({"version": 99}, "version"),
        # Issue 27: accepted, then the next iter() raised OverflowError.
        ({"epoch": 2**64}, "not a dsc loader state"),
        ({"samples": -16}, "not a dsc loader state"),
    ]:
        with pytest.raises(dsc.StateError, match=pattern):
            loader.load_state_dict({**good, **change})
    with pytest.raises(dsc.StateError, match="lacks"):
        loader.load_state_dict({"epoch": 1})
    with pytest.raises(dsc.StateError):
        loader.load_state_dict("epoch 1")
    # A cache compiled with another shuffle seed holds other shards: another cache.
    other = dsc.compile(rows=str(workdir / "data/train/batch_*.parquet"),
                        out=workdir / "other-seed", force=True,
                        **{**COMPILE_KWARGS, "seed": 1,
                           "context": str(workdir / "data/train_meta.parquet"),
                           "join": str(workdir / "data/sensor_geometry.csv")})
    with pytest.raises(dsc.StateError, match="another cache"):
        dsc.Loader(other, batch_size=16, seed=1).load_state_dict(good)


def test_without_torch_batches_are_numpy_arrays(cache_dir: Path) -> None:
    """torch is optional: with it unimportable, `import dsc` works and batches are NumPy."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, dsc\n"
        f"l = dsc.Loader({str(cache_dir)!r}, batch_size=8)\n"
        "b = next(iter(l))\n"
        "assert l.format == 'numpy' and isinstance(b['x'], np.ndarray), type(b['x'])\n"
        "try:\n"
        f"    dsc.Loader({str(cache_dir)!r}, format='torch')\n"
        "except dsc.OptionsError as e:\n"
        "    assert 'needs PyTorch' in str(e)\n"
        "else:\n"
        "    raise SystemExit('format=torch without torch did not fail')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_valid_counts_each_context_once_without_drop_last(cache_dir: Path) -> None:
    """An evaluation pass over batch[:valid] sees every context of the split exactly once, on
    one rank and across ranks."""
    n = dsc.open(cache_dir).splits["val"]
    for world in (1, 2):
        seen = []
        for rank in range(world):
            for b in dsc.Loader(cache_dir, split="val", batch_size=50, shuffle=False,
                                drop_last=False, rank=rank, world_size=world):
                assert len(b["key"]) == 50
                seen.extend(b["key"][: b.valid].tolist())
        assert len(seen) == n and len(set(seen)) == n


def test_cache_helpers(cache_dir: Path) -> None:
    cache = dsc.open(cache_dir)
    vocab = cache.tensor("sensor_id").encodings[0]["vocabulary"]
    assert cache.vocab_size("sensor_id") == len(vocab) + 2
    for b in dsc.Loader(cache, batch_size=64):
        assert int(b["sensor_id"].max()) < cache.vocab_size("sensor_id")
    charge = cache.column_stats("charge")
    assert charge["table"] == "rows" and charge["numeric"]["min"] > 0
    with pytest.raises(dsc.OptionsError):
        cache.vocab_size("x")
    with pytest.raises(dsc.OptionsError, match="no statistics"):
        cache.column_stats("charge", split="test")


def test_abandoned_iterators_stop_their_threads(cache_dir: Path) -> None:
    """A loader dropped mid-epoch (e.g. an evaluation helper that reads a few batches) is freed
    with its threads, on the host and on the pinned path, without a gc pass."""
    import gc

    def names() -> set[str]:
        return {t.name for t in threading.enumerate()}

    before = names()
    gc.disable()
    try:
        for fill_path in (False, True):
            loader = dsc.Loader(cache_dir, batch_size=8, num_threads=2, prefetch=1)
            loader._fill_path = fill_path
            it = iter(loader)
            next(it)
            alive = weakref.ref(loader)
            del loader
            assert alive() is not None, "the iterator must keep its loader"
            del it
            assert alive() is None, "a reference cycle keeps the loader alive"
    finally:
        gc.enable()
    deadline = time.time() + 5
    while names() - before and time.time() < deadline:
        time.sleep(0.05)
    assert not (names() - before), names() - before


def test_a_forked_child_gets_a_worker_error_not_a_hang(cache_dir: Path) -> None:
    import os

    loader = dsc.Loader(cache_dir, batch_size=8, num_threads=1)
    it = iter(loader)
    next(it)
    pid = os.fork()
    if pid == 0:  # the child: every use must fail fast with WorkerError
        code = 0
        for must_raise, use in ((True, lambda: next(it)), (True, lambda: iter(loader)),
                                (False, loader.close)):
            try:
                use()
                if must_raise:
                    code = 3
            except dsc.WorkerError:
                pass
            except BaseException:  # noqa: BLE001
                code = 4
        os._exit(code)
    deadline = time.time() + 20
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the forked child hung")
    assert next(it)["key"].shape == (8,)  # the parent carries on


def test_empty_columns_are_refused(cache_dir: Path) -> None:
    with pytest.raises(dsc.OptionsError, match="columns"):
        dsc.Loader(cache_dir, columns=[])
    loader = dsc.Loader(cache_dir, columns=(c for c in ["x", "length"]))
    assert loader.columns == ["x", "length"]


def test_a_shard_cut_short_under_a_zero_copy_tensor_is_named(private_cache: Path) -> None:
    """Truncating a shard under a reader faults (inherent to mmap); dsc names the shard first.

    In a child process: the fault kills it (the previous SIGBUS disposition is restored and the
    fault re-raised), after one line on stderr naming the file.
    """
    import signal
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, dsc
        loader = dsc.Loader({str(private_cache)!r}, batch_size=64, shuffle=False)
        batch = next(iter(loader))  # zero-copy torch views: private maps of the shard
        shard = sorted(os.listdir({str(private_cache / "shards")!r}))[0]
        os.truncate(os.path.join({str(private_cache / "shards")!r}, shard), 64)
        print(float(batch["x"].sum()))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)
    assert "train-00000.safetensors: the shard changed under the reader" in r.stderr, r.stderr


def test_a_compressed_cache_loads_the_same_batches(cache_dir: Path, workdir: Path, tmp_path: Path,
                                                   monkeypatch) -> None:
    """A zstd cache, compiled from Python and converted by the CLI, gives the hot cache's
    batches: shuffled, bucketed, on the fill path and in cache order (where the zero-copy
    views of decompressed bytes are handed to torch as copies, so writes stay private)."""
    cold = tmp_path / "cold"
    shutil.copytree(cache_dir, cold)
    run_dsc("compress", str(cold))
    manifest = json.loads((cold / "manifest.json").read_text())
    assert all(s["file"].endswith(".zst") for s in manifest["shards"])
    monkeypatch.chdir(workdir)
    compiled = dsc.compile("data/train/batch_*.parquet", out=tmp_path / "compiled",
                           compress="zstd", shard_size="256KiB", **COMPILE_KWARGS)
    for args in (dict(seed=4), dict(seed=4, bucket=True), dict(shuffle=False, drop_last=False)):
        hot = list(dsc.Loader(cache_dir, batch_size=24, **args))
        for path in (cold, compiled.path):
            got = list(dsc.Loader(path, batch_size=24, **args))
            assert len(got) == len(hot) > 0
            for a, b in zip(hot, got):
                assert a.seq_len == b.seq_len
                for k in a:
                    assert torch.equal(a[k], b[k]), (args, k)
    # Issue 39, class F: a state taken on the hot cache resumes on its compressed copy (and
    # back): the same shards, the same order. It was refused as "another cache".
    assert dsc.open(cold).content_id == dsc.open(cache_dir).content_id
    hot_loader = dsc.Loader(cache_dir, batch_size=24, seed=4)
    it = iter(hot_loader)
    next(it)
    state = hot_loader.state_dict()
    want = [b["x"] for b in it]
    resumed = dsc.Loader(cold, batch_size=24, seed=4)
    resumed.load_state_dict(state)
    got = [b["x"] for b in resumed]
    assert len(got) == len(want) > 0 and all(torch.equal(a, b) for a, b in zip(want, got))
    filled = dsc.Loader(cold, batch_size=24, seed=6, trim=True, num_threads=2)
    filled._fill_path = True
    for a, b in zip(dsc.Loader(cache_dir, batch_size=24, seed=6, trim=True), filled):
        assert all(torch.equal(a[k], b[k]) for k in a)
    first = next(iter(dsc.Loader(cold, batch_size=8, shuffle=False)))
    again = next(iter(dsc.Loader(cold, batch_size=8, shuffle=False)))
    first["x"].add_(1.0)
    assert not torch.equal(first["x"], again["x"]), "a write stays in its own tensor"
    with pytest.raises(dsc.OptionsError, match="zstd"):
        dsc.compile("data/train/batch_*.parquet", out=tmp_path / "bad", compress="lz4",
                    **COMPILE_KWARGS)


def padded_contexts(cache_dir: Path, split: str = "train") -> dict:
    """Every context of ``split`` from padded batches: key -> {tensor name: one row}."""
    out = {}
    for batch in dsc.Loader(cache_dir, split=split, batch_size=64, shuffle=False, drop_last=False):
        for i, key in enumerate(batch["key"][: batch.valid].tolist()):
            out[key] = {name: t[i] for name, t in batch.items()}
    return out


def check_pack(batch, padded: dict) -> list:
    """A pack's sequences equal their padded contexts; its tails are empty. Returns its keys."""
    cu, seq_idx, position = batch["cu_seqlens"], batch["seq_idx"], batch["position"]
    seqs, tokens = batch.seqs, batch.tokens
    assert (seqs, tokens) == (int(batch["num_seqs"][0]), int(batch["num_tokens"][0]))
    assert int(cu[0]) == 0 and bool((cu[seqs:] == tokens).all())
    keys = batch["key"][:seqs].tolist()
    longest = 0
    for i, key in enumerate(keys):
        row = padded[key]
        n = int(row["length"])
        longest = max(longest, n)
        lo, hi = int(cu[i]), int(cu[i + 1])
        assert hi - lo == n
        assert torch.equal(batch["x"][lo:hi], row["x"][:n])
        assert torch.equal(batch["sensor_id"][lo:hi], row["sensor_id"][:n])
        assert bool((seq_idx[lo:hi] == i).all())
        assert torch.equal(position[lo:hi], torch.arange(n, dtype=torch.int32))
        for name in ("y", "length", "key"):
            assert torch.equal(batch[name][i], row[name]), name
    assert batch.max_seqlen == longest
    assert bool((seq_idx[tokens:] == len(batch["length"])).all())
    assert not batch["x"][tokens:].any() and not batch["y"][seqs:].any()
    return keys


def test_packed_batches_have_one_shape_and_the_padded_values(cache_dir: Path) -> None:
    padded = padded_contexts(cache_dir)
    cache = dsc.open(cache_dir)
    for fill_path, threads in ((False, 1), (False, 3), (True, 2)):
        loader = dsc.Loader(cache, pack=1024, seed=3, window=100, drop_last=False,
                            num_threads=threads)
        loader._fill_path = fill_path  # the pinned path, without pinning
        shapes, keys = set(), []
        for batch in loader:
            shapes.add(tuple((name, tuple(t.shape)) for name, t in batch.items()))
            got = check_pack(batch, padded)
            keys += got[: batch.valid]
        assert len(shapes) == 1, shapes
        assert sorted(keys) == sorted(padded), "every context exactly once"
        (shape,) = shapes
        shape = dict(shape)
        assert shape["x"][0] == shape["seq_idx"][0] == 1024
        assert shape["cu_seqlens"][0] == shape["y"][0] + 1
    # The order is the Rust loader's, rank by rank.
    for rank in range(2):
        got = keys_of(dsc.Loader(cache, pack=1024, seed=3, rank=rank, world_size=2))
        want = order_keys(cache_dir, "--pack", "1024", "--seed", "3", "--rank", str(rank),
                          "--world-size", "2")
        assert got == want


def test_packed_resume_len_and_options(cache_dir: Path) -> None:
    loader = dsc.Loader(cache_dir, pack=2048, max_seqs=40, seed=4)
    lens = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        lens.append(len(loader))
    assert len(set(lens)) == 1 and lens[0] > 3, "drop_last: the same steps every epoch"
    loader.set_epoch(1)
    straight = keys_of(loader)
    first = dsc.Loader(cache_dir, pack=2048, max_seqs=40, seed=4, epoch=1)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["pack"] == {"tokens": 2048, "max_seqs": 40} and state["samples"] == 2
    resumed = dsc.Loader(cache_dir, pack=2048, max_seqs=40, seed=4)
    resumed.load_state_dict(state)
    assert keys_of(resumed) == straight[2:]
    with pytest.raises(dsc.StateError, match="pack"):
        dsc.Loader(cache_dir, seed=4).load_state_dict(state)
    with pytest.raises(dsc.StateError, match="max_seqs"):
        dsc.Loader(cache_dir, pack=2048, seed=4).load_state_dict(state)
    for kwargs, pattern in [
        (dict(pack=1024, batch_size=8), "exclude"),
        (dict(pack=1024, bucket=True), "bucket"),
        (dict(pack=1024, trim=True), "trim"),
        (dict(max_seqs=8), "pack="),
        (dict(pack=16), "L = 64"),
        (dict(pack=0), "pack=0"),
    ]:
        with pytest.raises(dsc.OptionsError, match=pattern):
            dsc.Loader(cache_dir, **kwargs)


def test_the_packed_batches_example_in_python_md_runs(cache_dir: Path, tmp_path: Path) -> None:
    """docs/PYTHON.md's example of packed batches, run as written on a cache named `cache`."""
    from conftest import REPO

    text = (REPO / "docs" / "PYTHON.md").read_text()
    section = text[text.index("### Packed batches"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[: code.index("```")]
    (tmp_path / "cache").symlink_to(cache_dir)
    import contextlib
    import io
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(code, "PYTHON.md", "exec"), {})
    finally:
        os.chdir(cwd)
    seqs, tokens, longest = (int(v) for v in out.getvalue().split())
    assert 0 < seqs and 0 < tokens <= 32768 and 0 < longest <= 64


def test_one_iterator_at_a_time_across_threads(cache_dir: Path) -> None:
    """A Loader has one iterator at a time: another thread's iter() while it runs, or a second
    next() while one is under way, is a dsc.WorkerError; the running iterator is unharmed and
    the epoch is counted once."""
    loader = dsc.Loader(cache_dir, batch_size=8, seed=1)
    it = iter(loader)
    first = next(it)
    errors: list = []

    def in_thread(fn) -> None:
        try:
            fn()
        except dsc.WorkerError as e:
            errors.append(e)

    t = threading.Thread(target=in_thread, args=(lambda: iter(loader),))
    t.start()
    t.join()
    assert len(errors) == 1 and "one iterator at a time" in str(errors[0])
    # A next() while another is under way in another thread.
    started, release = threading.Event(), threading.Event()
    original = it.source.next_item

    def slow():
        started.set()
        release.wait(5)
        return original()

    it.source.next_item = slow
    t = threading.Thread(target=lambda: next(it))
    t.start()
    started.wait(5)
    in_thread(lambda: next(it))
    release.set()
    t.join()
    it.source.next_item = original
    assert len(errors) == 2 and "at once" in str(errors[1])
    rest = list(it)
    assert 2 + len(rest) == len(loader) and first.step == 0
    assert loader.epoch == 1 and loader.state_dict()["samples"] == 0
    # Once the iterator is done, another thread may iterate.
    got: list = []
    t = threading.Thread(target=lambda: got.append(sum(1 for _ in loader)))
    t.start()
    t.join()
    assert got == [len(loader)]


def test_a_loader_is_a_context_manager(cache_dir: Path) -> None:
    """``with`` stops the loading threads when the block ends: the open epoch ends there."""
    with dsc.Loader(cache_dir, batch_size=8, seed=0) as loader:
        it = iter(loader)
        first = next(it)["key"].tolist()
    assert isinstance(loader, dsc.Loader)
    with pytest.raises(StopIteration):
        next(it)
    # The position is kept: a new iteration continues with the next batch.
    assert next(iter(loader))["key"].tolist() == order_keys(cache_dir, "--batch-size", "8")[1]
    assert first == order_keys(cache_dir, "--batch-size", "8")[0]


@pytest.mark.parametrize("path", ["host", "host-no-threads", "resident"])
def test_stats_count_what_the_loader_handed_over(cache_dir: Path, path: str) -> None:
    """Issue 30, item 4: ``loader.stats()`` counts the batches, contexts and bytes handed over,
    every epoch together, whichever path made them; a hot cache reads no compressed shard."""
    kw = dict(batch_size=16, seed=0, trim=True)
    if path == "host-no-threads":
        kw["num_threads"] = 0
    if path == "resident":
        kw["resident"] = True
    loader = dsc.Loader(cache_dir, **kw)
    batches = list(loader)
    s = loader.stats()
    assert s["batches"] == len(batches), s
    assert s["contexts"] == sum(len(b["key"]) for b in batches), s
    assert s["bytes"] == sum(t.nbytes for b in batches for t in b.values()), s
    assert s["wait_s"] >= 0 and s["queue_mean"] >= 0, s
    assert (s["shard_reads"], s["shard_hits"], s["shard_evictions"]) == (0, 0, 0), s
    list(loader)  # the next epoch adds to the counts
    assert loader.stats()["batches"] == 2 * len(batches)


def test_stats_show_what_a_compressed_cache_read(cache_dir: Path, tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    shutil.copytree(cache_dir, cold)
    run_dsc("compress", str(cold))
    loader = dsc.Loader(cold, batch_size=16, seed=0)
    list(loader)
    s = loader.stats()
    shards = len(dsc.open(cold).manifest["shards"])
    assert s["shard_reads"] >= 1 and s["stored_bytes_read"] > 0, s
    assert s["shard_reads"] + s["shard_hits"] >= shards // 2, s


@pytest.mark.parametrize("before,after", [((8, 1), (3, 2)), ((4, 2), (16, 1))])
def test_a_state_resumes_at_another_global_batch(cache_dir: Path, before, after) -> None:
    """Issue 30, item 2: a state saved at one global batch (batch_size x world_size) continues
    at another from the same position of the same global order: nothing repeated, nothing left
    out; the resumed loader's own state counts from the same origin."""
    (b, w), (b2, w2) = before, after

    def taken(loaders, steps=None):
        per_rank = [[batch["key"].tolist() for batch in itertools.islice(iter(l), steps)]
                    for l in loaders]
        return [k for step in zip(*per_rank) for keys in step for k in keys]

    order = [k for batch in dsc.Loader(cache_dir, batch_size=1, seed=3) for k in batch["key"].tolist()]
    first = [dsc.Loader(cache_dir, batch_size=b, world_size=w, rank=r, seed=3) for r in range(w)]
    seen = taken(first, 5)
    state = first[0].state_dict()
    assert state["samples"] == 5 * b * w and state["global_batch"] == b * w
    resumed = []
    for r in range(w2):
        loader = dsc.Loader(cache_dir, batch_size=b2, world_size=w2, rank=r, seed=3)
        loader.load_state_dict(state)
        resumed.append(loader)
    seen += taken(resumed)
    assert seen == order[:len(seen)]
    assert len(order) - len(seen) < b2 * w2
    again = dsc.Loader(cache_dir, batch_size=b2, world_size=w2, seed=3)
    again.load_state_dict(state)
    it = iter(again)
    next(it), next(it)
    assert again.state_dict()["samples"] == 5 * b * w + 2 * b2 * w2
    # Bucketed orders are cut into global batches of their own size: refused elsewhere.
    bucketed = dsc.Loader(cache_dir, batch_size=b, world_size=w, seed=3, bucket=True)
    with pytest.raises(dsc.StateError, match="bucketed"):
        dsc.Loader(cache_dir, batch_size=b2, world_size=w2, seed=3, bucket=True).load_state_dict(
            bucketed.state_dict())


def test_a_batch_prints_its_shapes_not_its_values(cache_dir: Path) -> None:
    batch = next(iter(dsc.Loader(cache_dir, batch_size=4, seed=0)))
    text = repr(batch)
    assert text.startswith("dsc.Batch(epoch=0, step=0, seq_len=64, valid=4; "), text
    assert "x: float32[4x64x6]" in text and "key: int64[4]" in text and len(text) < 400, text
    packed = next(iter(dsc.Loader(cache_dir, pack=1024, seed=0)))
    assert f"seqs={packed.seqs}, tokens={packed.tokens}" in repr(packed)


def test_a_pickled_cache_opens_again_where_it_arrives(cache_dir: Path) -> None:
    """Issue 39, class F: pickling a dsc.Cache (to a DataLoader worker, a multiprocessing pool)
    raised a bare TypeError. It is pickled as what opens it and opened again on arrival."""
    import pickle
    cache = dsc.open(cache_dir)
    again = pickle.loads(pickle.dumps(cache))
    assert again is not cache and again.content_id == cache.content_id
    first = next(iter(dsc.Loader(cache, batch_size=8, shuffle=False)))
    arrived = next(iter(dsc.Loader(again, batch_size=8, shuffle=False)))
    assert all(torch.equal(first[k], arrived[k]) for k in first)
    with pytest.raises(dsc.WorkerError, match="cannot be pickled"):
        pickle.dumps(dsc.Loader(cache, batch_size=8))


def test_a_failed_batch_on_the_fill_path_closes_once_and_retries(cache_dir: Path,
                                                                monkeypatch) -> None:
    """A failed batch (an error, Ctrl-C) on the threaded fill path closes its epoch; closing the
    loader then closed it again and raised AttributeError (the handle was gone), hiding the
    KeyboardInterrupt. The next iter() goes on from the failed batch."""
    from dsc import _epochs

    want = [b["key"] for b in dsc.Loader(cache_dir, batch_size=8, shuffle=False)]
    loader = dsc.Loader(cache_dir, batch_size=8, shuffle=False)
    loader._fill_path = True
    real = _epochs._ThreadedSource.next_item
    calls = {"n": 0}

    def second_fails(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(_epochs._ThreadedSource, "next_item", second_fails)
    it = iter(loader)
    got = [next(it)["key"]]
    with pytest.raises(KeyboardInterrupt):
        next(it)
    loader.close()
    got += [b["key"] for b in loader]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_numpy_batch_says_that_moving_it_needs_torch(cache_dir: Path) -> None:
    """Issue 52 (21): `.to()` and `.pin_memory()` of a batch of NumPy arrays said
    AttributeError of numpy.ndarray."""
    batch = next(iter(dsc.Loader(cache_dir, batch_size=4, format="numpy")))
    for move in (lambda: batch.to("cpu"), batch.pin_memory):
        with pytest.raises(dsc.OptionsError, match=r"holds NumPy arrays: .*format='torch'") as e:
            move()
        assert e.value.option == "format"
