"""examples/forecast.py, the windowed forecasting example: a GRU trained on windows of long
series beats repeating the last value on held-out series, on the CPU in well under a minute."""

from __future__ import annotations

import subprocess
import sys
import json
from pathlib import Path

import pytest

from conftest import REPO, run_dsc


@pytest.fixture(scope="module")
def sensors(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("forecast")
    run_dsc("gen", "series", "--out", "sensors", "--series", "80", "--steps", "300:1200",
            "--seed", "3", cwd=root)
    run_dsc("compile", "sensors/readings.parquet", "--key", "series_id", "--order-by", "t",
            "--features", "value,load,temp", "--encode", "value=zscore", "--encode",
            "load=zscore", "--encode", "temp=zscore", "--max-len", "1200", "--val-fraction",
            "0.2", "--out", "cache", cwd=root)
    return root / "cache"


def test_the_forecaster_beats_the_last_value_on_held_out_series(sensors: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples/forecast.py"), "--cache", str(sensors),
         "--window", "48", "--horizon", "4", "--torch-threads", "2", "--json"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["val_windows"] > 100 and s["train_windows"] > 10_000
    # The last value is a strong baseline on smooth series; the network does clearly better.
    assert s["mae_over_baseline"] < 0.85, s
    assert s["epochs"][-1]["val_mae"] < s["epochs"][0]["val_mae"]
    assert s["loader"]["wait_s"] < s["seconds"] / 2
