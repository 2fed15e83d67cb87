"""`dsc.Loader(series_window=W, stride=S, horizon=H)`: windows cut from long series, in the order
`dsc order --series-window` gives, each the slice of its series with the next steps as its
target, resumable through state_dict, refused where it cannot hold."""

from __future__ import annotations

import json
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
    with pytest.raises(dsc.OptionsError, match="longer than the"):
        dsc.Loader(series_cache, series_window=300)
    with pytest.raises(dsc.OptionsError, match="not a column of x"):
        dsc.Loader(series_cache, series_window=8, horizon=2, horizon_columns=["pressure"])
    with pytest.raises(dsc.OptionsError, match="series"):
        dsc.Loader(series_cache, series_window=8, bucket=True)
    with pytest.raises(dsc.OptionsError) as e:
        dsc.Loader(series_cache, stride=4)
    assert e.value.option == "series_window"
