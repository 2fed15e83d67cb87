"""The code in README.md, docs/GUIDE.md, docs/PYTHON.md and docs/SCALE.md runs (issue 29, item 6).

Each document's ``sh`` blocks run in a fresh folder, in order: every ``dsc`` command as written
(the CLI under test), so the commands a reader copies work and their flags exist. Other commands
are run by other tests (``scripts/*.sh`` by CI itself, ``dsc-train`` by the trainer's tests,
``examples/train.py`` by test_example.py) or install things (``pip``, ``cargo``); they must be
among ``ELSEWHERE`` so that a new kind of command in the docs is a decision, not a silent skip.

Caches in object storage (``s3://bucket/…``) go to a moto S3 server on localhost that this module
starts, reached the way the docs say: ``AWS_ENDPOINT_URL`` and the other ``AWS_*`` variables.

Each document's ``python`` blocks run in order in one namespace, in a fresh folder holding the
sample data the docs use (``dsc gen icecube --out data``, smaller, ``dsc gen series --out
sensors``, ``dsc gen microbiome --out microbes`` and ``dsc gen linkage --out people``): a block may use what an
earlier one made (``cache``, ``loader``). Without a GPU, ``device="cuda"`` runs as
``device=None`` (the CPU path the text offers beside it); ``model`` is the reader's network,
here a stand-in. A block preceded by ``<!-- not run by tests: REASON -->`` is skipped
(multi-node launches, Ray) and must say why.

``rust`` blocks are checked by tests/docs.rs: each is the visible part of a doctest that runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import urllib.request

import pytest
import torch
from moto.server import ThreadedMotoServer

from conftest import REPO, dsc_bin

DOCS = ["README.md", "docs/GUIDE.md", "docs/PYTHON.md", "docs/SCALE.md"]
SKIP = re.compile(r"<!-- not run by tests: (.+) -->")
# Commands of the docs that other tests run, or that install things.
# maturin: scripts/test.sh builds the wheel it tests with it; scripts/wheel.sh is the same build
# at --release with zig's linker (minutes longer), run for a release, not by the tests.
# torchrun: test_torchrun.py runs the lines of PYTHON.md that launch examples/train.py.
ELSEWHERE = {"scripts/demo.sh", "scripts/test.sh", "scripts/venv.sh", "pip", "python", "export",
             "cargo", "dsc-train", "target/release/dsc-train", "maturin", "scripts/wheel.sh",
             "torchrun"}


@pytest.fixture(scope="module")
def s3_endpoint():
    """An S3 server on localhost with bucket ``bucket``, for the docs' ``s3://bucket/…``."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bucket", method="PUT")).read()
    yield endpoint
    server.stop()


@pytest.fixture(autouse=True)
def object_storage(s3_endpoint: str, tmp_path: Path, monkeypatch) -> None:
    """The environment a reader of the docs sets for an S3-compatible server, and a fetch
    folder of the test's own."""
    for key, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                       "DSC_CACHE_DIR": str(tmp_path / "dsc-cache")}.items():
        monkeypatch.setenv(key, value)


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    code: str
    skip: str | None


def blocks(doc: str) -> list[Block]:
    lines = (REPO / doc).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w+)", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(before)
        out.append(Block(doc, start + 1, m.group(1), "\n".join(body) + "\n",
                         skip.group(1) if skip else None))
        i += 1
    return out


def commands(code: str) -> list[list[str]]:
    """Each command of a shell block: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


@pytest.mark.parametrize("doc", DOCS)
def test_the_shell_commands_of_the_docs_run(doc: str, tmp_path: Path) -> None:
    ran = 0
    for block in blocks(doc):
        if block.lang != "sh" or block.skip:
            continue
        for words in commands(block.code):
            if words[0] != "dsc":
                assert words[0] in ELSEWHERE, f"{doc}:{block.line}: who runs {words[0]!r}?"
                continue
            args, into = words[1:], None
            if len(args) > 2 and args[-2] == ">":  # `dsc … > state.json`
                args, into = args[:-2], tmp_path / args[-1]
            r = subprocess.run([dsc_bin(), *args], cwd=tmp_path, capture_output=True, text=True)
            assert r.returncode == 0, f"{doc}:{block.line}: {shlex.join(words)}\n{r.stderr}"
            if into is not None:
                into.write_text(r.stdout)
            ran += 1
    assert ran > 0 or doc in ("docs/PYTHON.md", "docs/SCALE.md"), f"{doc}: no dsc command ran"


@pytest.mark.parametrize("doc", DOCS)
def test_the_python_of_the_docs_runs(doc: str, tmp_path: Path) -> None:
    python = [b for b in blocks(doc) if b.lang == "python"]
    if not python:
        pytest.skip(f"{doc} has no Python")
    subprocess.run([dsc_bin(), "gen", "icecube", "--out", "data", "--files", "2",
                    "--events-per-file", "500", "--seed", "7"], cwd=tmp_path, check=True,
                   capture_output=True)
    subprocess.run([dsc_bin(), "gen", "series", "--out", "sensors", "--series", "40",
                    "--steps", "200:800", "--seed", "7"], cwd=tmp_path, check=True,
                   capture_output=True)
    subprocess.run([dsc_bin(), "gen", "microbiome", "--out", "microbes", "--records", "200",
                    "--seed", "7"], cwd=tmp_path, check=True, capture_output=True)
    subprocess.run([dsc_bin(), "gen", "linkage", "--out", "people", "--records", "500",
                    "--seed", "7"], cwd=tmp_path, check=True, capture_output=True)
    namespace = {"__name__": "__doc__", "model": torch.nn.Linear(6, 3)}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        ran = 0
        for block in python:
            if block.skip:
                continue
            code = block.code
            if not torch.cuda.is_available():
                code = code.replace('device="cuda"', "device=None")
            try:
                exec(compile(code, f"{doc}:{block.line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"{doc}:{block.line}: {type(e).__name__}: {e}") from e
            ran += 1
        assert ran > 0
    finally:
        os.chdir(cwd)


def test_every_skipped_block_says_why() -> None:
    for doc in DOCS:
        for block in blocks(doc):
            if block.skip is not None:
                assert len(block.skip.strip()) > 5, f"{doc}:{block.line}: say why it is not run"
