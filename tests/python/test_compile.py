"""dsc.compile and dsc.open: the CLI's cache byte for byte, errors that carry the place, the
mostlyai profile, and decoding back to source units."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import dsc
from conftest import COMPILE_FLAGS, COMPILE_KWARGS, REPO, run_dsc


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def in_workdir(workdir: Path):
    cwd = os.getcwd()
    os.chdir(workdir)
    yield workdir
    os.chdir(cwd)


def test_compile_equals_the_cli_byte_for_byte(in_workdir: Path, tmp_path: Path) -> None:
    cli = tmp_path / "cli"
    run_dsc("compile", "data/train/batch_*.parquet", *COMPILE_FLAGS, "--shard-size", "256KiB",
            "--out", str(cli), "-q", cwd=in_workdir)
    cache = dsc.compile("data/train/batch_*.parquet", out=tmp_path / "py", shard_size="256KiB",
                        **COMPILE_KWARGS)
    assert isinstance(cache, dsc.Cache)
    a, b = tree(cli), tree(tmp_path / "py")
    assert a.keys() == b.keys() and len(a) > 4
    for name in a:
        assert a[name] == b[name], name


def test_a_spec_file_with_overrides(in_workdir: Path, tmp_path: Path) -> None:
    spec = tmp_path / "dsc.toml"
    spec.write_text(run_dsc("compile", "data/train/batch_*.parquet", *COMPILE_FLAGS, "--print-spec",
                            cwd=in_workdir))
    run_dsc("compile", "--spec", str(spec), "--seed", "3", "--out", str(tmp_path / "cli"), "-q",
            cwd=in_workdir)
    dsc.compile(spec=spec, seed=3, out=tmp_path / "py")
    assert tree(tmp_path / "cli") == tree(tmp_path / "py")
    # One rule for both (CompileSpec::with_overrides): a key given replaces the file's, and
    # `encode` merges column by column.
    run_dsc("compile", "--spec", str(spec), "--encode", "x=minmax", "--val-fraction", "0.2",
            "--out", str(tmp_path / "cli2"), "-q", cwd=in_workdir)
    dsc.compile(spec=spec, encode={"x": "minmax"}, val_fraction=0.2, out=tmp_path / "py2")
    assert tree(tmp_path / "cli2") == tree(tmp_path / "py2")
    encode = json.loads((tmp_path / "py2" / "manifest.json").read_text())["spec"]["encode"]
    assert encode == {"charge": "log1p", "time": "zscore", "x": "minmax"}, encode


def test_compile_errors_carry_file_column_and_row(in_workdir: Path, tmp_path: Path) -> None:
    with pytest.raises(dsc.CompileError) as e:
        dsc.compile("data/train/batch_*.parquet", out=tmp_path / "c", key="event_id",
                    features=["x", "no_such_column"], join="data/sensor_geometry.csv", on="sensor_id")
    assert e.value.column == "no_such_column"
    assert e.value.file and e.value.file.endswith(".parquet")
    assert not (tmp_path / "c").exists(), "a failed compile left its output behind"
    with pytest.raises(dsc.CompileError) as e:
        dsc.compile("data/nothing_*.parquet", out=tmp_path / "c", key="event_id", features="x")
    assert "matched nothing" in str(e.value) and e.value.file == "data/nothing_*.parquet"
    with pytest.raises(dsc.CompileError, match="already exists"):
        dsc.compile("data/train/batch_*.parquet", out=in_workdir / "cache", key="event_id",
                    features="charge")


def test_bad_compile_options_are_options_errors(in_workdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "c"
    for kwargs, pattern in [
        (dict(truncate="middle"), "truncate"),
        (dict(max_len=-1), "max_len"),
        (dict(val_fraction=1.5), "val_fraction"),
        (dict(encode=["charge"]), "COLUMN=CHAIN"),
        (dict(shard_size="12 parsecs"), "unit"),
        (dict(join="data/sensor_geometry.csv"), "on="),
        (dict(val_keys="keys.txt"), "only applies with"),
    ]:
        with pytest.raises(dsc.OptionsError, match=pattern):
            dsc.compile("data/train/batch_*.parquet", out=out, key="event_id", features="charge",
                        **kwargs)
    # Without key= the rows are a table of records: what only sequences have is refused.
    with pytest.raises(dsc.OptionsError, match="order_by=.*without key="):
        dsc.compile("data/train/batch_*.parquet", out=out, features="charge", order_by="time")
    assert not out.exists()
    with pytest.raises(TypeError):
        dsc.compile("data/train/batch_*.parquet", out=out, key="event_id", featurs="x")


def test_the_typed_keywords_are_the_checked_ones() -> None:
    """`dsc.compile`'s `**options` are typed by `CompileOptions`; the names the run-time check
    takes (`_fields`' parameters) are the same, so neither list drifts from the other."""
    import inspect

    from dsc._compile import CompileOptions, _fields

    checked = set(inspect.signature(_fields).parameters) - {"rows", "spec"}
    assert set(CompileOptions.__annotations__) == checked
    for fn in (dsc.compile, dsc.compile_stage):
        assert "Unpack[CompileOptions]" in str(inspect.signature(fn).parameters["options"])


def test_the_mostlyai_profile_is_reachable(tmp_path: Path) -> None:
    data = REPO / "tests/vectors/mostlyai/seq/data"
    kwargs = dict(key="id", context=str(data / "ctx.parquet"), profile="mostlyai")
    run_dsc("compile", str(data / "tgt.parquet"), "--key", "id", "--context", str(data / "ctx.parquet"),
            "--profile", "mostlyai", "--out", str(tmp_path / "cli"), "-q")
    cache = dsc.compile(str(data / "tgt.parquet"), out=tmp_path / "py", **kwargs)
    assert tree(tmp_path / "cli") == tree(tmp_path / "py")
    assert any(t.role == "sub_column" for t in cache.schema)


def test_open_gives_manifest_schema_and_stats(cache_dir: Path) -> None:
    cache = dsc.open(cache_dir)
    assert cache.manifest == json.loads((cache_dir / "manifest.json").read_text())
    assert cache.stats == json.loads((cache_dir / "stats.json").read_text())
    assert [t.name for t in cache.schema] == ["key", "x", "sensor_id", "length", "full_length", "y"]
    x = cache.tensor("x")
    assert x.dtype == "float32" and x.shape == (64, 6) and x.is_sequence
    assert x.columns == ("x", "y", "z", "time", "charge", "auxiliary")
    assert sum(cache.splits.values()) == 1600 and cache.max_len == 64
    with pytest.raises(dsc.OptionsError, match="no tensor"):
        cache.tensor("nope")


def test_decode_matches_dsc_show(cache_dir: Path) -> None:
    """cache.decode inverts the encodings exactly as `dsc show` does (source units)."""
    cache = dsc.open(cache_dir)
    batch = next(iter(dsc.Loader(cache, batch_size=4, shuffle=False, format="numpy")))
    for i in range(4):
        shown = json.loads(run_dsc("show", str(cache_dir), "--index", str(i), "--json"))
        n = int(batch["length"][i])
        assert shown["key"] == int(batch["key"][i]) and shown["length"] == n
        x = cache.decode("x", batch["x"][i, :n])
        for j, col in enumerate(cache.tensor("x").columns):
            np.testing.assert_allclose(x[:, j], np.asarray(shown["columns"][col], dtype=np.float64),
                                       rtol=1e-12, atol=0)
        sensors = cache.decode("sensor_id", batch["sensor_id"][i, :n])
        assert list(sensors) == shown["columns"]["sensor_id"]
        y = cache.decode("y", batch["y"][i])
        np.testing.assert_allclose(y, [shown["targets"]["azimuth"], shown["targets"]["zenith"]])
        charge = cache.decode("x", batch["x"][i, :n, 4], column="charge")
        np.testing.assert_allclose(charge, shown["columns"]["charge"], rtol=1e-12)
    assert cache.decode("sensor_id", np.array([0, 1]))[0] is None


def test_an_official_test_split_from_key_files(in_workdir: Path, tmp_path: Path) -> None:
    # Take 37 keys of the cache as the "official" test set.
    first = next(iter(dsc.Loader(in_workdir / "cache", batch_size=37, seed=5)))
    test_keys = sorted(first["key"].tolist())
    ids = tmp_path / "test_ids.txt"
    ids.write_text("".join(f"{k}\n" for k in test_keys))
    run_dsc("compile", "data/train/batch_*.parquet", *COMPILE_FLAGS, "--split-keys",
            f"test={ids}", "--out", str(tmp_path / "cli"), "-q", cwd=in_workdir)
    cache = dsc.compile("data/train/batch_*.parquet", out=tmp_path / "py",
                        split_keys={"test": ids}, **COMPILE_KWARGS)
    assert tree(tmp_path / "cli") == tree(tmp_path / "py")
    assert [s["name"] for s in json.loads((tmp_path / "py" / "manifest.json").read_text())["splits"]] \
        == ["train", "test", "val"]
    got = sorted(k for b in dsc.Loader(cache.path, split="test", batch_size=8, drop_last=False)
                 for k in b["key"].tolist())
    assert sorted(set(got)) == test_keys
    with pytest.raises(dsc.OptionsError):
        dsc.compile("data/train/batch_*.parquet", out=tmp_path / "bad", split_keys=["test"],
                    **COMPILE_KWARGS)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(shard_size=1.5), "shard_size"),
    (dict(shard_size=True), "shard_size"),
    (dict(shard_size=-1), "shard_size"),
    (dict(shard_size=2**70), "shard_size"),
    (dict(bucket_size=0.5), "bucket_size"),
    (dict(max_memory=1.5), "max_memory"),
    (dict(max_memory=[1]), "max_memory"),
    (dict(max_len=2**70), "max_len"),
    (dict(seed=2**64), "seed"),
    (dict(seed=1.0), "seed"),
    (dict(compress="zstd", compress_level="high"), "compress_level"),
    (dict(compress="zstd", compress_level=2**40), "compress_level"),
    (dict(val_fraction="a tenth"), "val_fraction"),
    (dict(partitions=2**64), "partitions"),
])
def test_compile_keywords_of_the_wrong_kind_are_options_errors(in_workdir: Path, tmp_path: Path,
                                                                kwargs: dict, pattern: str) -> None:
    """Issue 27: a float shard size was truncated (1.5 meant 1 byte), and other values of the
    wrong type or range raised TypeError or OverflowError from the extension."""
    with pytest.raises(dsc.OptionsError, match=pattern):
        dsc.compile("data/train/batch_*.parquet", out=tmp_path / "c", key="event_id",
                    features="charge", **kwargs)
    assert not (tmp_path / "c").exists()


def test_ctrl_c_stops_a_compile_within_a_second_and_commits_nothing(tmp_path: Path) -> None:
    """Issue 27: Ctrl-C during dsc.compile did not stop it; the compile ran to the end and
    committed, then KeyboardInterrupt was raised."""
    import signal
    import threading
    import time

    run_dsc("gen", "icecube", "--out", "data", "--files", "4", "--events-per-file", "3000",
            "--seed", "7", cwd=tmp_path)
    out, staging = tmp_path / "cache", tmp_path / ".cache.dsc-partial"
    sent: list = []

    def press_ctrl_c() -> None:
        while not staging.exists():
            time.sleep(0.002)
        time.sleep(0.05)  # the compile is under way
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    kwargs = {**COMPILE_KWARGS, "context": str(tmp_path / "data/train_meta.parquet"),
              "join": str(tmp_path / "data/sensor_geometry.csv")}
    # Python's own Ctrl-C handler, whatever this process inherited: a shell starts background
    # jobs with SIGINT ignored, and Python then keeps it ignored (a CI started with `&` did).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    try:
        # Small buckets make the compile take seconds (a bucket is the unit it stops between).
        with pytest.raises(KeyboardInterrupt):
            dsc.compile(str(tmp_path / "data/train/batch_*.parquet"), out=out,
                        bucket_size="64KiB", max_memory="64MiB", **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
    stopped = time.perf_counter() - sent[0]
    assert stopped < 1.0, f"{stopped:.2f} s from Ctrl-C to KeyboardInterrupt"
    assert not out.exists() and not staging.exists()


def test_options_errors_name_the_keyword_not_a_flag(in_workdir: Path, tmp_path: Path,
                                                    cache_dir: Path) -> None:
    """Issue 29, item 4: the libraries name an option by its key; Python spells it as the
    keyword argument (``split_by=``, ``profile="mostlyai"``) and says which in ``option``."""
    with pytest.raises(dsc.OptionsError) as caught:
        dsc.compile("data/train/batch_*.parquet", out=tmp_path / "c", key="event_id",
                    features="charge", split_by="x")
    e = caught.value
    assert e.option == "split_by", e.option
    assert str(e) == "split_by= reads a column of the context table: give context=", str(e)
    with pytest.raises(dsc.OptionsError) as caught:
        dsc.compile("data/train/batch_*.parquet", out=tmp_path / "c", key="event_id",
                    profile="mostlyai", context="data/train_meta.parquet", features="charge")
    assert caught.value.option == "features"
    assert 'features= does not apply to profile="mostlyai"' in str(caught.value)
    # The loader's options the same way.
    with pytest.raises(dsc.OptionsError) as caught:
        dsc.Loader(cache_dir, pack=16)
    message = str(caught.value)
    assert caught.value.option == "pack" and message.startswith("pack=16 tokens"), message
    assert "--" not in message and "`" not in message, message


def _keyed(keys: list) -> "pa.Table":  # noqa: F821 (pyarrow imported inside)
    """Events of string keys `keys`, three each, with a time, a feature and a target."""
    import pyarrow as pa
    rows = [(k, t, float(i * 3 + t)) for i, k in enumerate(keys) for t in range(3)]
    return pa.table({"k": pa.array([r[0] for r in rows], pa.string()),
                     "t": pa.array([r[1] for r in rows], pa.int64()),
                     "v": pa.array([r[2] for r in rows], pa.float64())})


def test_a_key_file_lists_every_key_as_the_column_holds_it(tmp_path: Path) -> None:
    # Keys that differ only by their spaces or a leading `#` are distinct keys of the data.
    keys = [" lead", "lead", "trail ", "trail", "#x", "x", "", "a b"] + [f"k{i}" for i in range(24)]
    table = _keyed(keys)
    kwargs = dict(key="k", order_by="t", features=["v"], val_fraction=0.0)

    def test_split(listing: str, name: str) -> list:
        path = tmp_path / name
        path.write_text(listing)
        out = tmp_path / f"out-{name}"
        cache = dsc.compile(table, out=out, split_keys={"test": path}, **kwargs)
        return sorted(cache.keys("test"))

    # One key per line, exactly as written: nothing trimmed, no comments; CRLF endings too.
    assert test_split(" lead\ntrail \n#x\n", "lines.txt") == sorted([" lead", "trail ", "#x"])
    assert test_split("a b\r\nlead\r\n", "crlf.txt") == ["a b", "lead"]
    # JSON lines spell any key, the empty string included.
    assert test_split('" lead"\n""\n\n"#x"\n', "keys.jsonl") == sorted([" lead", "", "#x"])
    # What cannot be read one way is refused, naming the file and the line.
    for listing, name, pattern in [
        ("lead\n\ntrail\n", "blank.txt", r"blank\.txt: line 2: an empty line"),
        ("", "none.txt", r"none\.txt: lists no key"),
        ('"lead"\n{"k": 1}\n', "bad.jsonl", r"bad\.jsonl: line 2: .* not a JSON string"),
        ("lead\nnope\n", "missing.txt", r"missing\.txt: line 2: key nope .* not a context"),
    ]:
        (tmp_path / name).write_text(listing)
        with pytest.raises(dsc.CompileError, match=pattern):
            dsc.compile(table, out=tmp_path / f"refused-{name}",
                        split_keys={"test": tmp_path / name}, **kwargs)
        assert not (tmp_path / f"refused-{name}").exists()
