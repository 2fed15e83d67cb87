"""examples/uea.py end to end on a public data set with an official split: JapaneseVowels (UEA,
shipped with aeon; 12 dimensions, 7-29 steps, 9 speakers, 270 train / 370 test cases). dsc-train
and examples/train.py must beat 1-NN DTW on the official test split, run in the same script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, dsc_bin


def dsc_train_bin() -> str:
    found = [p for p in (REPO / "target/debug/dsc-train", REPO / "target/release/dsc-train")
             if p.exists()]
    assert found, "no dsc-train binary: cargo build -p dsc-train"
    return str(max(found, key=lambda p: p.stat().st_mtime))


def test_japanese_vowels_beats_one_nn_dtw_on_the_official_test_split(tmp_path: Path) -> None:
    env = {**os.environ, "DSC_BIN": dsc_bin(),
           "DSC_TRAIN_BIN": os.environ.get("DSC_TRAIN_BIN") or dsc_train_bin()}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "uea.py"), "--dataset", "JapaneseVowels",
         "--work", str(tmp_path), "--torch-threads", "1", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    [r] = json.loads(out.stdout)
    assert (r["train_cases"], r["test_cases"], r["dims"], r["classes"]) == (270, 370, 12, 9)
    # The published 1-NN DTW (full window) accuracy on JapaneseVowels is 0.949.
    assert abs(r["dtw_1nn_test_accuracy"] - 0.9486) < 0.005, r
    assert r["dsc_train_test_accuracy"] > r["dtw_1nn_test_accuracy"], r
    assert r["train_py_test_accuracy"] > r["dtw_1nn_test_accuracy"], r
    # The cache holds the official split, val carved out of train only.
    manifest = json.loads((tmp_path / "JapaneseVowels" / "cache" / "manifest.json").read_text())
    splits = {s["name"]: s["contexts"] for s in manifest["splits"]}
    assert splits["test"] == 370 and splits["train"] + splits["val"] == 270, splits
