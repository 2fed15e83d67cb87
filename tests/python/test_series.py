"""`dsc.Loader(series_window=W, stride=S, horizon=H)`: windows cut from long series, in the order
`dsc order --series-window` gives, each the slice of its series with the next steps as its
target, resumable through state_dict, refused where it cannot hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import dsc
from conftest import run_dsc


@pytest.fixture(scope="module")
def series_cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("series")
    run_dsc("gen", "series", "--out", "data", "--series", "24", "--steps", "60:240", "--seed", "2",
            cwd=root)
    run_dsc("compile", "data/readings.parquet", "--key", "series_id", "--order-by", "t",
            "--features", "value,load,temp", "--max-len", "240", "--val-fraction", "0.2",
            "--shard-size", "64KiB", "--out", "cache", cwd=root)
    return root / "cache"


def whole(cache: Path) -> dict:
    """Each series' stored rows of `x`, by key."""
    loader = dsc.Loader(cache, batch_size=1, shuffle=False, drop_last=False, format="numpy")
    return {int(b["key"][0]): b["x"][0][: int(b["length"][0])] for b in loader}


def test_windows_follow_dsc_order_and_hold_their_slice_and_next_steps(series_cache: Path) -> None:
    rows = whole(series_cache)
    loader = dsc.Loader(series_cache, batch_size=32, seed=5, window=128, format="numpy",
                        series_window=16, stride=8, horizon=4, horizon_columns=["value"],
                        drop_last=False)
    assert ("series_window=16, stride=8, horizon=4, horizon_columns=['value'], steps="
            in repr(loader))
    got = []
    for b in loader:
        assert b["x"].shape[1:] == (16, 3) and b["y_next"].shape[1:] == (4, 1)
        for i, (key, start) in enumerate(zip(b["key"].tolist(), b["start"].tolist())):
            series = rows[key]
            np.testing.assert_array_equal(b["x"][i], series[start:start + 16])
            np.testing.assert_array_equal(b["y_next"][i, :, 0], series[start + 16:start + 20, 0])
            assert b["length"][i] == 16 and b["horizon_length"][i] == 4
            got.append([key, start])
    want = json.loads(run_dsc("order", str(series_cache), "--keys", "--json", "--seed", "5",
                              "--window", "128", "--batch-size", "32", "--keep-last",
                              "--series-window", "16", "--stride", "8", "--horizon", "4",
                              "--horizon-columns", "value"))
    assert got == [pair for batch in want for pair in batch]
    every = sorted((k, s) for k, r in rows.items() for s in range(0, len(r) - 19, 8))
    # Every window once (the last batch completed with the epoch's first ones).
    assert sorted(set(map(tuple, got))) == every and len(got) < len(every) + 32


def test_a_windowed_loader_resumes_from_its_state_dict(series_cache: Path) -> None:
    kwargs = dict(batch_size=16, seed=1, window=64, format="numpy", series_window=12, stride=4)
    full = [list(zip(b["key"].tolist(), b["start"].tolist()))
            for b in dsc.Loader(series_cache, **kwargs)]
    first = dsc.Loader(series_cache, **kwargs)
    it = iter(first)
    head = [list(zip(b["key"].tolist(), b["start"].tolist())) for b in (next(it), next(it))]
    state = first.state_dict()
    again = dsc.Loader(series_cache, **kwargs)
    again.load_state_dict(state)
    rest = [list(zip(b["key"].tolist(), b["start"].tolist())) for b in again]
    assert head + rest == full
    other = dsc.Loader(series_cache, **dict(kwargs, stride=6))
    with pytest.raises(dsc.StateError):
        other.load_state_dict(state)


def test_series_windows_are_refused_where_they_cannot_hold(series_cache: Path) -> None:
    """Each refusal names the keyword at fault (`OptionsError.option`), and no number, however
    large, reaches an allocation or an overflow: a horizon ends within the cache's L."""
    max_len = dsc.open(series_cache).max_len
    cases = [
        (dict(series_window=max_len + 1), "series_window", "longer than the"),
        (dict(series_window=0), "series_window", "series_window=0"),
        (dict(series_window=8, stride=0), "stride", "stride=0"),
        (dict(series_window=8, horizon=-1), "horizon", "horizon=-1"),
        (dict(series_window=8, horizon=1.5), "horizon", "horizon=1.5"),
        (dict(series_window=8, horizon=2, horizon_columns=["pressure"]), "horizon_columns",
         "not a column of x"),
        (dict(series_window=8, horizon=2, horizon_columns=["value", "value"]), "horizon_columns",
         "twice"),
        (dict(series_window=8, horizon=2, horizon_columns=[]), "horizon_columns", "names no column"),
        (dict(series_window=8, horizon_columns=["value"]), "horizon_columns", "horizon is 0 steps"),
        (dict(series_window=8, pad_windows="no"), "pad_windows", "expected True or False"),
        (dict(series_window=8, horizon=2, horizon_columns=3), "horizon_columns", "a column name"),
        (dict(series_window=8, bucket=True), "bucket", "series windows"),
        (dict(series_window=8, trim=True), "trim", "series windows"),
        (dict(stride=4), "series_window", "pass series_window= too"),
    ]
    for horizon in (max_len - 7, 2**32, 2**62, 2**62 + 1, 2**63 - 1):
        for pad in (False, True):
            cases.append((dict(series_window=8, horizon=horizon, pad_windows=pad, num_threads=0),
                          "horizon", f"at most {max_len - 8}"))
    for kwargs, option, says in cases:
        with pytest.raises(dsc.OptionsError, match=re.escape(says)) as e:
            next(iter(dsc.Loader(series_cache, batch_size=2, format="numpy", **kwargs)))
        assert e.value.option == option, (kwargs, e.value.option, str(e.value))
    # A stride past every series is one window per series, not an overflow.
    far = dsc.Loader(series_cache, batch_size=2, format="numpy", series_window=8, stride=2**63)
    assert len(far) >= 1 and (next(iter(far))["start"] == 0).all()
    with pytest.raises(dsc.OptionsError, match="mixes 2 caches") as e:
        dsc.Loader([series_cache, series_cache], series_window=8)
    assert e.value.option == "series_window"
    # The longest horizon that ends within L: every target step past a series' end is padding.
    last = next(iter(dsc.Loader(series_cache, batch_size=2, format="numpy", series_window=8,
                                horizon=max_len - 8, pad_windows=True, horizon_columns="value")))
    assert last["y_next"].shape == (2, max_len - 8, 1)
    every = dsc.Loader(series_cache, series_window=8, horizon=2, pad_windows=np.True_)
    assert "horizon=2, horizon_columns=None, pad_windows=True" in repr(every)
