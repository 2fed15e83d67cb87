"""String columns encoded to a fixed width from Python, and the two examples built on them:
examples/linkage.py (Bloom-filter bits in, 2-gram multi-hot out, against the most frequent
2-grams) and examples/dna.py (ASVs read as characters, against the majority site). Each learns
on held-out data on the CPU well within a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import dsc
from conftest import REPO, run_dsc


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("strings")
    run_dsc("gen", "linkage", "--out", "people", "--records", "4000", "--seed", "3", cwd=root)
    run_dsc("gen", "microbiome", "--out", "microbes", "--records", "400", "--seed", "3",
            cwd=root)
    return root


def test_python_compiles_string_columns_and_decodes_them_back(data: Path, tmp_path: Path) -> None:
    people = dsc.compile(str(data / "people/records.parquet"), key="uid", features=["yob"],
                         encode={"bloom": "bits", "first_name": "ngrams:2"}, ngram_vocab=40,
                         out=tmp_path / "people")
    bloom, grams = people.tensor("bloom"), people.tensor("first_name")
    assert (bloom.dtype, bloom.role, bloom.shape) == ("uint8", "encoded", (1, 256))
    assert grams.shape == (1, 40) and len(grams.encodings[0]["vocabulary"]) == 40
    source = pq.read_table(data / "people/records.parquet").to_pydict()
    by_uid = dict(zip(source["uid"], zip(source["bloom"], source["first_name"])))
    vocab = set(grams.encodings[0]["vocabulary"])
    loader = dsc.Loader(people, batch_size=64, shuffle=False, drop_last=False, format="numpy",
                        columns=["key", "bloom", "first_name"])
    for batch in loader:
        bits = people.decode("bloom", batch["bloom"])
        sets = people.decode("first_name", batch["first_name"])
        for i, uid in enumerate(batch["key"].tolist()):
            want_bits, name = by_uid[uid]
            assert bits[i, 0] == want_bits
            assert sets[i, 0] == {name[j:j + 2] for j in range(len(name) - 1)} & vocab
    # The CLI's bytes.
    run_dsc("compile", str(data / "people/records.parquet"), "--key", "uid", "--features", "yob",
            "--encode", "bloom=bits", "--encode", "first_name=ngrams:2", "--ngram-vocab", "40",
            "--out", str(tmp_path / "cli"))
    assert dsc.open(tmp_path / "cli").content_id == people.content_id


def test_resident_batches_of_string_tensors_equal_the_host_batches(data: Path,
                                                                   tmp_path: Path) -> None:
    # A string column per step is [n, L, W]: trimmed with the features on both paths.
    microbes = dsc.compile(str(data / "microbes/asvs.parquet"), key="sample_id",
                           features=["count"], encode={"asv": "chars:150"},
                           context=str(data / "microbes/samples.parquet"), targets=["site"],
                           out=tmp_path / "microbes")
    assert microbes.tensor("asv").is_sequence
    kw = dict(batch_size=16, seed=3, trim=True)
    host, resident = dsc.Loader(microbes, **kw), dsc.Loader(microbes, resident=True, **kw)
    assert resident.resident
    trimmed = 0
    for a, b in zip(host, resident, strict=True):
        assert a.keys() == b.keys()
        for name in a.keys():
            assert a[name].shape == b[name].shape and np.array_equal(a[name], b[name]), name
        trimmed += a["asv"].shape[1] < microbes.max_len
    assert trimmed > 0


def run_example(script: str, cache: Path) -> dict:
    out = subprocess.run([sys.executable, str(REPO / "examples" / script), "--cache", str(cache),
                          "--torch-threads", "2", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_table_of_records_compiles_without_a_key_into_tensors_without_a_step_axis(
        data: Path, tmp_path: Path) -> None:
    people = dsc.compile(str(data / "people/records.parquet"), features=["yob"],
                         categorical=["last_name"], targets=["uid"],
                         encode={"bloom": "bits", "first_name": "ngrams:2"}, ngram_vocab=40,
                         val_fraction=0.25, out=tmp_path / "people")
    assert people.is_records and "records" in repr(people)
    shapes = {t.name: (t.role, t.shape) for t in people.schema}
    assert shapes["x"] == ("context_features", (1,))
    assert shapes["last_name"] == ("context_categorical", ())
    assert shapes["bloom"] == ("context_encoded", (256,))
    assert shapes["first_name"] == ("context_encoded", (40,))
    assert shapes["y"] == ("targets", (1,))
    source = pq.read_table(data / "people/records.parquet").to_pydict()
    seen = []
    for split in ("train", "val"):
        loader = dsc.Loader(people, split=split, batch_size=100, shuffle=False, drop_last=False)
        for batch in loader:
            n = batch.valid
            assert batch["x"].shape == (100, 1) and batch["bloom"].shape == (100, 256)
            rows = batch["key"][:n].tolist()
            seen += rows
            bits = people.decode("bloom", batch["bloom"][:n])
            names = people.decode("last_name", batch["last_name"][:n])
            uids = people.decode("y", batch["y"][:n])
            for i, r in enumerate(rows):
                # The key is the row number: each sample is that row's values.
                assert bits[i] == source["bloom"][r]
                assert uids[i, 0] == source["uid"][r]
                assert names[i] == source["last_name"][r] or split == "val"
    assert sorted(seen) == list(range(len(source["uid"])))
    # The CLI's bytes.
    run_dsc("compile", str(data / "people/records.parquet"), "--features", "yob",
            "--categorical", "last_name", "--targets", "uid", "--encode", "bloom=bits",
            "--encode", "first_name=ngrams:2", "--ngram-vocab", "40", "--val-fraction", "0.25",
            "--out", str(tmp_path / "cli"))
    assert dsc.open(tmp_path / "cli").content_id == people.content_id


def test_a_string_the_encoding_cannot_store_is_a_compile_error_with_its_place(
        tmp_path: Path) -> None:
    """A CompileError names file, column and row as attributes, not only in its message, and a
    table of records refuses series windows for what it is (no steps), not for its length."""
    import pyarrow as pa
    pq.write_table(pa.table({"b": ["0101", "0110", "011"], "v": [1.0, 2.0, 3.0]}),
                   tmp_path / "bad.parquet")
    with pytest.raises(dsc.CompileError) as e:
        dsc.compile(str(tmp_path / "bad.parquet"), out=str(tmp_path / "c"), targets=["v"],
                    encode={"b": "bits"})
    assert (e.value.file, e.value.column, e.value.row) == (str(tmp_path / "bad.parquet"), "b", 2)
    assert "a bit string of 3 characters" in str(e.value)
    assert not (tmp_path / "c").exists()
    pq.write_table(pa.table({"b": ["0101", "0110", "0111"], "v": [1.0, 2.0, 3.0]}),
                   tmp_path / "good.parquet")
    cache = dsc.compile(str(tmp_path / "good.parquet"), out=str(tmp_path / "c"), targets=["v"],
                        encode={"b": "bits"})
    assert [t.name for t in cache.schema] == ["key", "b", "length", "y"]
    with pytest.raises(dsc.OptionsError, match="table of records") as e:
        dsc.Loader(cache, batch_size=2, series_window=2)
    assert e.value.option == "series_window"


def test_the_linkage_example_recovers_name_grams_from_bloom_filters(data: Path) -> None:
    run_dsc("compile", "people/records.parquet", "--features", "yob",
            "--encode", "bloom=bits", "--encode", "first_name=ngrams:2", "--val-fraction", "0.25",
            "--out", "people-cache", cwd=data)
    s = run_example("linkage.py", data / "people-cache")
    assert 900 < s["records_val"] < 1100
    assert s["val_f1"] > 0.8 and s["baseline_f1"] < 0.4, s


def test_the_dna_example_tells_the_site_from_the_sequences(data: Path) -> None:
    run_dsc("compile", "microbes/asvs.parquet", "--key", "sample_id", "--features", "count",
            "--encode", "count=log1p", "--encode", "asv=chars:150", "--context",
            "microbes/samples.parquet", "--targets", "site", "--val-fraction", "0.25",
            "--out", "microbes-cache", cwd=data)
    s = run_example("dna.py", data / "microbes-cache")
    assert 70 < s["samples_val"] < 130
    assert s["val_accuracy"] > s["majority_accuracy"] + 0.25, s
