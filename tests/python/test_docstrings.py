"""The examples in the package's docstrings run, in a folder holding the data they name
(`dsc gen icecube --out data`), and give what they show (issue 29, item 6)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import dsc
import dsc._loader
from conftest import run_dsc

pytest.importorskip("torch")


def test_docstring_examples_run(tmp_path: Path, monkeypatch) -> None:
    run_dsc("gen", "icecube", "--out", "data", "--files", "2", "--events-per-file", "400",
            "--seed", "3", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    # The package's own docstring first: it compiles the `cache` the others read.
    for module in (dsc, dsc._loader):
        result = doctest.testmod(module, extraglobs={"dsc": dsc}, optionflags=doctest.ELLIPSIS,
                                 verbose=False, report=True)
        assert result.attempted > 0, f"{module.__name__}: no example found"
        assert result.failed == 0, f"{module.__name__}: {result.failed} example(s) failed"
