"""`dsc.Loader([a, b], weights=...)`: a mix of caches, against `dsc order` and the caches' own
bytes; resume, ranks, padding to the longest L, refusals."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import dsc
from conftest import dsc_bin, run_dsc

FLAGS = ["--key", "event_id", "--order-by", "time", "--context", "data/train_meta.parquet",
         "--empty-contexts", "drop", "--targets", "azimuth,zenith", "--features", "time,charge",
         "--shard-size", "64KiB"]


@pytest.fixture(scope="module")
def mixdir(tmp_path_factory) -> Path:
    """Caches `a` (L = 64) and `b` (L = 128, compressed) of disjoint events with the same
    tensors, and `c` with a categorical column that `a` lacks."""
    root = tmp_path_factory.mktemp("mix")
    run_dsc("gen", "icecube", "--out", "data", "--files", "2", "--events-per-file", "300",
            "--seed", "7", cwd=root)
    run_dsc("compile", "data/train/batch_1.parquet", *FLAGS, "--max-len", "64", "--out", "a",
            cwd=root)
    run_dsc("compile", "data/train/batch_2.parquet", *FLAGS, "--max-len", "128",
            "--compress", "zstd", "--out", "b", cwd=root)
    run_dsc("compile", "data/train/batch_2.parquet", *FLAGS, "--categorical", "sensor_id",
            "--out", "c", cwd=root)
    return root


def stored(cache: Path) -> dict:
    """Each key's `x` rows in `cache`."""
    loader = dsc.Loader(cache, batch_size=1, shuffle=False, drop_last=False, format="numpy")
    return {int(b["key"][0]): b["x"][0] for b in loader}


def keys(loader) -> list:
    return [b["key"].tolist() for b in loader]


def test_a_mix_gives_dsc_orders_batches_in_its_weights(mixdir: Path) -> None:
    a, b = stored(mixdir / "a"), stored(mixdir / "b")
    loader = dsc.Loader([mixdir / "a", mixdir / "b"], weights=[0.7, 0.3], mix_samples=20_000,
                        batch_size=100, window=1000, epoch=1)
    assert len(loader) == 200
    got = keys(loader)
    cli = json.loads(run_dsc("order", "a", "b", "--weights", "0.7,0.3", "--mix-samples", "20000",
                             "--batch-size", "100", "--window", "1000", "--epoch", "1", "--keys",
                             "--json", cwd=mixdir))
    assert got == cli
    flat = [k for batch in got for k in batch]
    share = sum(k in a for k in flat) / len(flat)
    assert abs(share - 0.7) < 0.007
    assert all(k in a or k in b for k in flat)


def test_rows_of_the_shorter_cache_are_padded_to_the_longest(mixdir: Path) -> None:
    own = {**stored(mixdir / "a"), **stored(mixdir / "b")}
    loader = dsc.Loader([mixdir / "a", mixdir / "b"], batch_size=32, format="numpy")
    seen = 0
    for batch in loader:
        x = batch["x"]
        assert x.shape == (32, 128, 2)
        for k, row in zip(batch["key"].tolist(), x):
            n = own[k].shape[0]
            np.testing.assert_array_equal(row[:n], own[k])
            assert not row[n:].any()
        seen += len(batch["key"])
    assert seen == len(own) // 32 * 32


def test_a_mix_resumes_on_other_ranks_and_refuses_other_weights(mixdir: Path) -> None:
    caches = [mixdir / "a", mixdir / "b"]
    whole = [k for batch in keys(dsc.Loader(caches, weights=[1, 1], batch_size=24)) for k in batch]
    loader = dsc.Loader(caches, weights=[1, 1], batch_size=24)
    it = iter(loader)
    before = [next(it)["key"].tolist() for _ in range(5)]
    state = loader.state_dict()
    assert state["weights"] == [1.0, 1.0] and "+" in state["content_id"]
    after = []
    for rank in range(2):
        other = dsc.Loader(caches, weights=[1, 1], batch_size=6, rank=rank, world_size=2)
        other.load_state_dict(state)
        after.append(keys(other))
    resumed = [k for step in zip(*after) for part in step for k in part]
    assert [k for b in before for k in b] + resumed == whole[:120 + len(resumed)]
    with pytest.raises(dsc.StateError, match="weights"):
        dsc.Loader(caches, weights=[2, 1], batch_size=24).load_state_dict(state)
    with pytest.raises(dsc.StateError, match="another cache"):
        dsc.Loader(caches[::-1], weights=[1, 1], batch_size=24).load_state_dict(state)
    # dsc order --from-state refuses the same: the state's caches in another order, or weights
    # that differ from the state's (it ran the state's order over whatever caches it was given).
    path = mixdir / "mix-state.json"
    path.write_text(json.dumps(state))
    for args, says in (([str(c) for c in caches[::-1]], "taken over other data"),
                       ([str(mixdir / "a")], "taken over other data"),
                       ([str(c) for c in caches] + ["--weights", "2,1"], "differs before the position")):
        out = subprocess.run([dsc_bin(), "order", *args, "--from-state", str(path), "--keys"],
                             capture_output=True, text=True)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
    run_dsc("order", *[str(c) for c in caches], "--from-state", str(path), "--keys")


def test_caches_that_differ_and_bad_weights_are_refused(mixdir: Path) -> None:
    with pytest.raises(dsc.OptionsError, match="sensor_id") as e:
        dsc.Loader([mixdir / "a", mixdir / "c"])
    assert e.value.tensor == "sensor_id"
    both = [mixdir / "a", mixdir / "b"]
    # Each names the keyword at fault (NaN reached Rust as unreadable JSON, 10**400 raised a
    # bare OverflowError, [] was taken for the default weights).
    for weights, says in (([1, 2, 3], "one positive number per cache"),
                          ([float("nan"), 1], "weights=[nan, 1]"),
                          ([float("inf"), 1], "weights=[inf, 1]"),
                          ([10**400, 1], "not a value this option takes"),
                          ([], "one positive number per cache"),
                          ([0, 1], "one positive number per cache"),
                          (["x", 1], "weights=")):
        with pytest.raises(dsc.OptionsError, match=re.escape(says)) as e:
            dsc.Loader(both, weights=weights)
        assert e.value.option == "weights", weights
    with pytest.raises(dsc.OptionsError, match="bucket="):
        dsc.Loader(both, bucket=True)
    for kwargs, option in ((dict(weights=[1.0]), "weights"), (dict(mix_samples=10), "mix_samples")):
        with pytest.raises(dsc.OptionsError, match="two or more caches") as e:
            dsc.Loader(mixdir / "a", **kwargs)
        assert e.value.option == option
    with pytest.raises(dsc.OptionsError, match="resident") as e:
        dsc.Loader(both, resident=True, format="torch")
    assert e.value.option == "resident"
    for kwargs, option in ((dict(pack=512, batch_size=4), "batch_size"),
                           (dict(pack=512, bucket=True), "bucket"), (dict(max_seqs=4), "max_seqs")):
        with pytest.raises(dsc.OptionsError) as e:
            dsc.Loader(mixdir / "a", **kwargs)
        assert e.value.option == option, kwargs
    # The same data twice would give each of its contexts twice per epoch.
    with pytest.raises(dsc.OptionsError, match="hold the same data") as e:
        dsc.Loader([mixdir / "a", mixdir / "a"])
    # Numbers that overflowed the mix's position counts (a PanicException before).
    for kwargs, says in ((dict(epoch=2**62), "past 2^64 positions"),
                         (dict(epoch=3, mix_samples=2**63 - 1), "at most 2^48 positions")):
        with pytest.raises(dsc.OptionsError, match=re.escape(says)):
            next(iter(dsc.Loader(both, batch_size=8, format="numpy", **kwargs)))
