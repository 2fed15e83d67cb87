"""examples/train.py, the reference PyTorch training script: it trains, resumes exactly, and
learns a classification above chance. CPU only, small generated caches; about 15 s on two
cores.

The dsc binary makes the data (conftest.dsc_bin: ``DSC_BIN``, else the newest of
target/{debug,release}/dsc).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dsc = pytest.importorskip("dsc")

from conftest import REPO as ROOT, compile_churn, run_dsc  # noqa: E402 (after the importorskips)

SCRIPT = ROOT / "examples" / "train.py"

# A small network keeps every run to a few seconds. One torch thread: the thread count changes
# the order of float sums, and the resume test compares runs bit for bit.
SMALL = ["--dim", "32", "--layers", "1", "--heads", "2", "--batch-size", "32",
         "--torch-threads", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def train_script():
    """examples/train.py as a module, so most runs skip the interpreter and torch start-up."""
    spec = importlib.util.spec_from_file_location("dsc_example_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()  # --threads sets it for the whole process
    yield module
    torch.set_num_threads(threads)
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def icecube_cache(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("icecube")
    data, cache = tmp / "data", tmp / "cache"
    run_dsc("gen", "icecube", "--out", str(data), "--files", "2", "--events-per-file", "300",
         "--seed", "7")
    run_dsc("compile", str(data / "train"), "--key", "event_id", "--order-by", "time",
         "--context", str(data / "train_meta.parquet"), "--targets", "azimuth,zenith",
         "--join", str(data / "sensor_geometry.csv"), "--on", "sensor_id",
         "--features", "x,y,z,time,charge,auxiliary", "--categorical", "sensor_id",
         "--encode", "time=zscore", "--encode", "charge=log1p", "--max-len", "64",
         "--val-fraction", "0.1", "--seed", "42", "--out", str(cache), "--quiet")
    return cache


@pytest.fixture(scope="module")
def churn_cache(tmp_path_factory) -> Path:
    """The churn cache (conftest.compile_churn) of 2,000 customers."""
    return compile_churn(tmp_path_factory.mktemp("churn"), 2000)


SUMMARY_KEYS = {"device", "amp", "task", "model", "parameters", "metric", "epochs", "steps",
                "optimizer_steps", "val_metric", "final_train_loss", "samples_per_s",
                "data_wait_share", "h2d_share", "compute_share", "wall_s", "checkpoint"}
EPOCH_KEYS = {"epoch", "steps", "train_loss", "val_loss", "val_metric", "samples_per_s",
              "data_wait_share", "h2d_share", "compute_share"}


def test_trains_and_prints_one_json_summary(icecube_cache, tmp_path):
    # The command line as users run it: --json prints the summary line and nothing else.
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--cache", str(icecube_cache), "--task", "direction",
         "--epochs", "1", "--log-every", "4", "--out", str(tmp_path / "run"), "--json", *SMALL],
        check=True, capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    s = json.loads(lines[0])
    assert SUMMARY_KEYS <= s.keys()
    assert s["device"] == "cpu" and s["amp"] == "none"
    assert s["metric"] == "mean_angular_error_rad"
    assert math.isfinite(s["final_train_loss"]) and 0 <= s["final_train_loss"] <= 2
    assert s["optimizer_steps"] == s["epochs"][0]["steps"] > 0
    assert len(s["epochs"]) == 1 and EPOCH_KEYS <= s["epochs"][0].keys()
    assert 0 < s["val_metric"][0] < math.pi
    assert s["samples_per_s"] > 0 and 0 <= s["data_wait_share"] <= 1
    assert s["h2d_share"] == 0  # no copy on the CPU
    # The loader's telemetry: every step's batch handed over, none read compressed.
    assert s["loader"]["batches"] == s["optimizer_steps"], s["loader"]
    assert s["loader"]["bytes"] > 0 and s["loader"]["shard_reads"] == 0, s["loader"]
    assert (tmp_path / "run" / "last.pt").exists()


def test_normalisation_from_the_train_statistics(train_script, icecube_cache):
    """Raw metres are standardised with the train split's mean and std, the log1p column with
    its encoded quantiles; zscore and bool columns are left alone."""
    cache = dsc.open(str(icecube_cache))
    shift, scale = train_script.resolve_inputs(cache, normalise=True).x_norm
    train = next(s for s in cache.stats["splits"] if s["split"] == "train")
    stats = {c["name"]: c.get("numeric") for c in train["columns"]}
    for i, col in enumerate("xyz"):
        assert (shift[i], scale[i]) == (stats[col]["mean"], stats[col]["std"])
        assert 200 < scale[i] < 350  # metres, spread over the detector
    assert (shift[3], scale[3]) == (0.0, 1.0)  # time: zscore already
    median = next(q["value"] for q in stats["charge"]["quantiles"] if q["q"] == 0.5)
    assert shift[4] == pytest.approx(math.log1p(median)) and 0.1 < scale[4] < 2
    assert (shift[5], scale[5]) == (0.0, 1.0)  # auxiliary: bool
    off = train_script.resolve_inputs(cache, normalise=False).x_norm
    assert off == ([0.0] * 6, [1.0] * 6)


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_resume_continues_exactly(train_script, icecube_cache, tmp_path):
    """Stopping mid-epoch and resuming (across an epoch end with validation) ends with the
    weights of a run that never stopped."""
    base = ["--cache", str(icecube_cache), "--epochs", "2", "--log-every", "3", "--json", *SMALL]
    steps_per_epoch = len(dsc.Loader(str(icecube_cache), split="train", batch_size=32))
    k, m = 5, steps_per_epoch + 4  # stop in epoch 0, finish in epoch 1
    whole = train_script.main([*base, "--max-steps", str(m), "--out", str(tmp_path / "whole")])
    first = train_script.main([*base, "--max-steps", str(k), "--out", str(tmp_path / "parts")])
    assert first["optimizer_steps"] == k and first["epochs"] == []
    ckpt = torch.load(tmp_path / "parts" / "last.pt", weights_only=True)
    assert ckpt["loader"]["epoch"] == 0 and ckpt["loader"]["samples"] == k * 32
    # The settings come from the checkpoint; the logging interval from the command line.
    second = train_script.main(["--resume", str(tmp_path / "parts" / "last.pt"),
                                "--max-steps", str(m), "--log-every", "3", "--json",
                                "--torch-threads", "1"])
    assert second["optimizer_steps"] == whole["optimizer_steps"] == m
    a, b = _weights(tmp_path / "whole" / "last.pt"), _weights(tmp_path / "parts" / "last.pt")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # Epoch 0 ended after the resume: its mean train loss and validation equal the whole run's,
    # and so does the loss of the last logged window.
    same = ("epoch", "steps", "train_loss", "val_loss", "val_metric")
    assert [{k: e[k] for k in same} for e in second["epochs"]] == \
        [{k: e[k] for k in same} for e in whole["epochs"]]
    assert second["final_train_loss"] == whole["final_train_loss"]


def test_a_resume_reads_the_generation_it_started_on(train_script, icecube_cache, tmp_path):
    """Issue 51: a checkpoint's loader state names the generation it read; after an append
    (dsc append) the resumed run reads that generation (its statistics and its order) and ends
    with the weights of a run that saw no append."""
    data = icecube_cache.parent / "data"
    flags = ["--key", "event_id", "--order-by", "time", "--context",
             str(data / "train_meta.parquet"), "--empty-contexts", "drop", "--targets",
             "azimuth,zenith", "--features", "time,charge,auxiliary", "--encode", "charge=log1p",
             "--max-len", "64", "--val-fraction", "0.1", "--seed", "42", "--quiet"]
    for name in ("still", "daily"):
        run_dsc("compile", str(data / "train/batch_1.parquet"), *flags, "--out", str(tmp_path / name))
    base = ["--epochs", "1", "--log-every", "3", "--json", *SMALL]
    whole = train_script.main(["--cache", str(tmp_path / "still"), *base, "--out",
                               str(tmp_path / "whole")])
    k = whole["optimizer_steps"] // 2
    train_script.main(["--cache", str(tmp_path / "daily"), *base, "--max-steps", str(k),
                       "--out", str(tmp_path / "parts")])
    dsc.append(tmp_path / "daily", data / "train/batch_2.parquet",
               context=data / "train_meta.parquet")
    rest = train_script.main(["--resume", str(tmp_path / "parts" / "last.pt"), "--json",
                              "--torch-threads", "1"])
    assert rest["optimizer_steps"] == whole["optimizer_steps"]
    a, b = _weights(tmp_path / "whole" / "last.pt"), _weights(tmp_path / "parts" / "last.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_resident_split_trains_the_same_run(train_script, icecube_cache, tmp_path):
    """--resident on (the split gathered by index, what CUDA runs by default) gives the batches
    of the host path, so the same run: the same weights bit for bit. The summary lists the
    batch lengths the steps saw (one per distinct length here: exact on the CPU)."""
    base = ["--cache", str(icecube_cache), "--epochs", "1", "--max-steps", "12", "--trim",
            "--bucket", "--json", *SMALL]
    host = train_script.main([*base, "--resident", "off", "--out", str(tmp_path / "host")])
    kept = train_script.main([*base, "--resident", "on", "--out", str(tmp_path / "kept")])
    assert kept["resident"] and not host["resident"]
    a, b = _weights(tmp_path / "host" / "last.pt"), _weights(tmp_path / "kept" / "last.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert host["batch_lens"] == kept["batch_lens"]
    assert sum(host["batch_lens"].values()) == 12 and len(host["batch_lens"]) > 1


def test_classification_learns_above_chance(train_script, churn_cache):
    cache = dsc.open(str(churn_cache))
    val = dsc.Loader(cache, split="val", batch_size=cache.splits["val"], shuffle=False)
    churned = next(iter(val))["y"][:, 0]
    majority = max(churned.mean().item(), 1 - churned.mean().item())
    s = train_script.main(["--cache", str(churn_cache), "--task", "classification",
                           "--target", "churned", "--model", "gru", "--epochs", "4",
                           "--lr", "3e-3", "--json", *SMALL])
    assert s["metric"] == "accuracy"
    accuracy = s["val_metric"][-1]
    # Predicting the majority class scores `majority` (about 0.7); the GRU reaches about 0.9.
    assert accuracy > majority + 0.1, (accuracy, majority, s["val_metric"])


def test_regression_runs(train_script, churn_cache):
    s = train_script.main(["--cache", str(churn_cache), "--task", "regression",
                           "--target", "lifetime_value", "--max-steps", "6", "--log-every", "3",
                           "--json", *SMALL])
    assert s["metric"] == "mae" and math.isfinite(s["final_train_loss"])


@pytest.fixture(scope="module")
def parity_caches(tmp_path_factory) -> dict:
    """Two generated caches for learning parity: the README's IceCube compile at a smaller
    size, and customers' transactions with a held-out `test` split named by key (every fifth
    customer), on which the final model is scored."""
    tmp = tmp_path_factory.mktemp("parity")
    run_dsc("gen", "icecube", "--out", str(tmp / "ice"), "--files", "2", "--events-per-file",
            "1500", "--seed", "11")
    run_dsc("compile", str(tmp / "ice" / "train"), "--key", "event_id", "--order-by", "time",
            "--context", str(tmp / "ice" / "train_meta.parquet"), "--targets", "azimuth,zenith",
            "--join", str(tmp / "ice" / "sensor_geometry.csv"), "--on", "sensor_id",
            "--features", "x,y,z,time,charge,auxiliary", "--categorical", "sensor_id",
            "--encode", "time=zscore", "--encode", "charge=log1p", "--max-len", "64",
            "--val-fraction", "0.1", "--seed", "42", "--out", str(tmp / "ice-cache"), "--quiet")
    run_dsc("gen", "sequences", "--out", str(tmp / "churn"), "--customers", "3000", "--files",
            "2", "--seed", "5")
    keys = torch.tensor(pytest.importorskip("pyarrow.parquet")
                        .read_table(tmp / "churn" / "customers.parquet")
                        .column("customer_id").to_pylist())
    (tmp / "test_keys.txt").write_text("".join(f"{k}\n" for k in keys[keys % 5 == 0].tolist()))
    run_dsc("compile", str(tmp / "churn" / "transactions"), "--key", "customer_id",
            "--order-by", "ts", "--context", str(tmp / "churn" / "customers.parquet"),
            "--targets", "churned,lifetime_value", "--context-features", "age,tenure_years",
            "--features", "amount,items,is_refund,ts", "--categorical", "merchant_category,channel",
            "--encode", "amount=log1p", "--nan", "zero", "--empty-contexts", "keep",
            "--max-len", "32", "--truncate", "tail", "--split-keys",
            f"test={tmp / 'test_keys.txt'}", "--val-fraction", "0.15", "--seed", "1",
            "--out", str(tmp / "churn-cache"), "--quiet")
    return {"icecube": tmp / "ice-cache", "churn": tmp / "churn-cache"}


def _pack_tokens(cache: Path, batch_size: int) -> int:
    """T for packs of about `batch_size` contexts: the mean stored length of the train split
    times the batch size (so that an epoch has about as many steps as padded batches)."""
    c = dsc.open(str(cache))
    lengths = [int(n) for b in dsc.Loader(c, batch_size=512, shuffle=False, drop_last=False,
                                          columns=["length"])
               for n in b["length"][: b.valid]]
    return max(c.max_len, round(batch_size * sum(lengths) / len(lengths)))


def test_packed_batches_learn_as_well_as_padded_ones(train_script, parity_caches):
    """Learning parity on the CPU: after the same epochs, the packed run's validation error is
    within 1.1x of the padded run's (the transformer on IceCube directions; the GRU on churn,
    scored by cross-entropy on a held-out test split); both learn."""
    ice = parity_caches["icecube"]
    common = ["--epochs", "3", "--json", *SMALL]
    padded = train_script.main(["--cache", str(ice), *common])
    packed = train_script.main(["--cache", str(ice), "--pack", str(_pack_tokens(ice, 32)),
                                *common])
    err = (padded["val_metric"][-1], packed["val_metric"][-1])
    assert err[1] <= 1.1 * err[0], err
    assert err[1] < 1.2, packed["val_metric"]  # predicting nothing useful gives about 1.57
    assert abs(packed["optimizer_steps"] - padded["optimizer_steps"]) <= 0.1 * padded["optimizer_steps"]

    churn = parity_caches["churn"]
    common = ["--cache", str(churn), "--task", "classification", "--target", "churned",
              "--model", "gru", "--epochs", "4", "--lr", "3e-3", "--json", *SMALL]
    padded = train_script.main(common)
    packed = train_script.main([*common, "--pack", str(_pack_tokens(churn, 32))])
    test = [next(e for e in s["evaluation"] if e["split"] == "test") for s in (padded, packed)]
    assert test[1]["loss"] <= 1.1 * test[0]["loss"], test
    assert test[1]["metric"] > 0.8, test  # accuracy; the majority class is about 0.7


def test_a_packed_step_compiles_once(train_script, icecube_cache):
    """Packs have one shape: torch.compile compiles the training step and the evaluation once,
    and the second epoch compiles nothing (dynamo's frame counter)."""
    s = train_script.main(["--cache", str(icecube_cache), "--epochs", "2", "--pack", "1024",
                           "--compile", "--json", *SMALL])
    frames = [e["compiled_frames"] for e in s["epochs"]]
    assert frames[0] >= 1 and frames[1] == frames[0], frames
    assert all(math.isfinite(e["val_metric"]) for e in s["epochs"])


def _relative_difference(a: dict, b: dict) -> float:
    """||a - b|| / ||a|| over all the weights together."""
    num = sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a) ** 0.5
    return float(num / sum((a[k].double() ** 2).sum() for k in a) ** 0.5)


@pytest.mark.parametrize("shape", [["--no-trim"], ["--pack", "1024", "--accumulate", "2"],
                                   ["--pack", "1024", "--resident", "on"]],
                         ids=["padded", "packed_accumulated", "packed_resident"])
def test_the_whole_step_trains_as_the_eager_loop(train_script, icecube_cache, tmp_path, shape):
    """--graph's step function (the one CUDA captures; here it runs uncaptured, fed from the
    loader's static buffers) gives the eager loop's run: the same losses and, over 30 optimizer
    steps (22 with accumulation) across an epoch end, the same weights within 1e-5 relative. Not bit for bit: its
    learning rate is a float32 device tensor (the eager schedule's a Python float64) and it
    runs fused AdamW; measured 3-4e-7."""
    base = ["--cache", str(icecube_cache), "--epochs", "2", "--max-steps", "30", "--log-every",
            "10", "--json", *SMALL, *shape]
    eager = train_script.main([*base, "--out", str(tmp_path / "eager")])
    whole = train_script.main([*base, "--graph", "--out", str(tmp_path / "whole")])
    assert whole["graph"] and not eager["graph"]
    assert whole["optimizer_steps"] == eager["optimizer_steps"] >= 20
    assert [s["lr"] for s in whole["steps"]] == pytest.approx([s["lr"] for s in eager["steps"]],
                                                              rel=1e-6)
    assert [s["train_loss"] for s in whole["steps"]] == pytest.approx(
        [s["train_loss"] for s in eager["steps"]], rel=1e-5)
    assert whole["epochs"][0]["val_metric"] == pytest.approx(eager["epochs"][0]["val_metric"],
                                                             rel=1e-5)
    diff = _relative_difference(_weights(tmp_path / "eager" / "last.pt"),
                                _weights(tmp_path / "whole" / "last.pt"))
    assert diff < 1e-5, diff


def test_the_whole_step_resumes_exactly(train_script, icecube_cache, tmp_path):
    """A --graph run stopped mid-epoch and resumed ends with the weights of one that never
    stopped, bit for bit on the CPU (the step counter and the learning rate come back from the
    position, the optimizer's state from the checkpoint)."""
    base = ["--cache", str(icecube_cache), "--epochs", "2", "--pack", "1024", "--graph",
            "--log-every", "5", "--json", *SMALL]
    whole = train_script.main([*base, "--max-steps", "25", "--out", str(tmp_path / "whole")])
    train_script.main([*base, "--max-steps", "7", "--out", str(tmp_path / "parts")])
    second = train_script.main(["--resume", str(tmp_path / "parts" / "last.pt"),
                                "--max-steps", "25", "--json", "--torch-threads", "1"])
    assert second["graph"] and second["optimizer_steps"] == 25
    a, b = _weights(tmp_path / "whole" / "last.pt"), _weights(tmp_path / "parts" / "last.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert second["final_train_loss"] == whole["final_train_loss"]
    # Its schedule lives on the device: an eager resume would not continue it.
    with pytest.raises(SystemExit, match="trained with --graph"):
        train_script.main(["--resume", str(tmp_path / "parts" / "last.pt"), "--no-graph",
                           "--max-steps", "30", "--json"])


def test_refusals_of_the_whole_step(train_script, icecube_cache):
    for extra, words in [(["--graph", "--trim"], "--trim cuts each batch .* use --pack"),
                         (["--graph", "--bucket", "--no-trim"], "--bucket makes a batch shape"),
                         (["--graph", "--pack", "1024", "--compile"], "choose one"),
                         (["--graph", "--pack", "1024", "--amp", "fp16"], "bf16")]:
        with pytest.raises(SystemExit, match=words):
            train_script.main(["--cache", str(icecube_cache), "--json", *SMALL, *extra])


def test_the_loaders_refusals_name_the_scripts_flags(train_script, icecube_cache):
    """The script declares no rule of the loader's own: dsc.Loader refuses shapes that exclude
    each other, and the message names this script's flags, not Python keywords."""
    for extra, words in [(["--pack", "4096", "--bucket"], "--bucket and --pack exclude"),
                         (["--max-seqs", "8"], "--max-seqs sizes packed batches: give --pack"),
                         (["--pack", "8"], "--pack 8 tokens are fewer than")]:
        with pytest.raises(SystemExit, match=words):
            train_script.main(["--cache", str(icecube_cache), "--json", *SMALL, *extra])


def test_every_number_that_reaches_torch_is_checked_first(train_script, icecube_cache, capsys):
    """Issue 52 (6, 20): what dsc-train refuses at the start, the script refuses too, with one
    line naming the flag: no traceback from torch, no NaN weights saved with exit code 0."""
    for extra, words in [
        (["--lr", "nan"], "--lr nan: must be a positive number"),
        (["--lr", "inf"], "--lr inf: must be a positive number"),
        (["--lr", "0"], "--lr 0.0: must be a positive number"),
        (["--weight-decay", "nan"], "--weight-decay nan: must be zero or a positive number"),
        (["--clip", "-1"], "--clip -1.0: must be zero (off)"),
        (["--seed", str(2**64)], "--seed 18446744073709551616: must be between 0 and"),
        (["--seed", "-1"], "--seed -1: must be between 0 and"),
        (["--epochs", "0"], "--epochs 0: must be between 1 and"),
        (["--epochs", "-1"], "--epochs -1: must be between 1 and"),
        (["--loader-threads", "100000"], "--loader-threads 100000: must be between 1 and 1024"),
        (["--threads", "2"], "--threads 2: torch's threads are --torch-threads 2"),
        (["--eval-split", "train"], "--eval-split train: the split trained on"),
        (["--eval-split", "nope"], "--eval-split nope: the cache has no such split"),
    ]:
        with pytest.raises(SystemExit) as e:
            train_script.main(["--cache", str(icecube_cache), "--json", *SMALL, *extra])
        said = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err
        assert e.value.code not in (0, None), extra
        assert words in said and "Traceback" not in said, (extra, said)


def test_a_resume_keeps_what_the_machine_chose(train_script, icecube_cache, tmp_path,
                                               monkeypatch):
    """A run records what it chose from its machine (device, precision, attention, trimming
    multiple) and a resume keeps it on another machine, changing one only when asked, and
    saying so. The other machine is injected: one whose automatic precision is bf16 (what a GPU
    machine picks); before the choice was recorded the resumed run silently switched to it and
    ended with other weights (a GPU machine showed it with --device cpu runs)."""
    base = ["--cache", str(icecube_cache), "--epochs", "1", "--log-every", "3", "--json", *SMALL]
    steps = len(dsc.Loader(str(icecube_cache), split="train", batch_size=32))
    whole = train_script.main([*base, "--max-steps", str(steps - 2), "--out", str(tmp_path / "w")])
    first = train_script.main([*base, "--max-steps", "4", "--out", str(tmp_path / "p")])
    assert (first["device"], first["amp"], first["trim_multiple"]) == ("cpu", "none", 1)
    ckpt = torch.load(tmp_path / "p" / "last.pt", weights_only=True)
    assert {k: ckpt["args"][k] for k in ("device", "amp", "attention", "graph")} == dict(
        device="cpu", amp="none", attention="padded", graph=False)
    monkeypatch.setattr(train_script, "auto_amp", lambda device: "bf16")
    resume = ["--resume", str(tmp_path / "p" / "last.pt"), "--json", "--torch-threads", "1"]
    kept = train_script.main([*resume, "--max-steps", str(steps - 2)])
    assert (kept["device"], kept["amp"], kept["resumed_with"]) == ("cpu", "none", {})
    a, b = _weights(tmp_path / "w" / "last.pt"), _weights(tmp_path / "p" / "last.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # Asked for: changed, and said.
    asked = train_script.main([*resume, "--max-steps", str(steps), "--amp", "bf16"])
    assert asked["amp"] == "bf16"
    assert asked["resumed_with"] == {"amp": {"checkpoint": "none", "now": "bf16"}}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_run_resumes_on_the_cpu_only_when_asked(train_script, icecube_cache, tmp_path):
    train_script.main(["--cache", str(icecube_cache), "--max-steps", "2", "--json", *SMALL,
                       "--out", str(tmp_path / "p")])
    path = tmp_path / "p" / "last.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"]["device"] = "cuda"  # as a GPU machine would have recorded it
    torch.save(ckpt, path)
    with pytest.raises(SystemExit, match="pass --device cpu"):
        train_script.main(["--resume", str(path), "--max-steps", "4", "--json"])
    moved = train_script.main(["--resume", str(path), "--max-steps", "4", "--json",
                               "--device", "cpu"])
    assert moved["device"] == "cpu"
    assert moved["resumed_with"]["device"] == {"checkpoint": "cuda", "now": "cpu"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_the_captured_step_learns_as_the_eager_loop(train_script, parity_caches):
    """On CUDA, where --graph captures the step: after the same epochs the captured run's
    validation error is within 1.1x of the eager run's (kernels add in other orders, so not
    equal), padded and packed."""
    ice = parity_caches["icecube"]
    for shape in (["--no-trim"], ["--pack", str(_pack_tokens(ice, 32))]):
        common = ["--cache", str(ice), "--epochs", "3", "--json", "--dim", "32", "--layers",
                  "1", "--heads", "2", "--batch-size", "32", "--device", "cuda", *shape]
        eager = train_script.main(common)
        graph = train_script.main([*common, "--graph"])
        assert graph["graph"] and graph["device"] == "cuda"
        err = (eager["val_metric"][-1], graph["val_metric"][-1])
        assert err[1] <= 1.1 * err[0] and err[1] < 1.2, (shape, err)


def test_a_gpu_machine_captures_by_default_and_a_resume_keeps_it(train_script, icecube_cache,
                                                                 tmp_path, monkeypatch):
    """Issue 53 (3): where --graph is left unset, a machine that captures (CUDA, injected here)
    trains the whole step captured, on untrimmed padded batches; the choice is in the summary
    and the checkpoint, and a resume on a machine that would not capture keeps it. --no-graph
    and --trim give the eager run, and a shape that changes (--bucket) says why it is eager."""
    base = ["--cache", str(icecube_cache), "--epochs", "1", "--log-every", "3", "--json", *SMALL]
    monkeypatch.setattr(train_script, "auto_graph", lambda device: True)
    auto = train_script.main([*base, "--max-steps", "4", "--out", str(tmp_path / "a")])
    assert (auto["graph"], auto["trim"], auto["batch_lens"]) == (True, False, {"64": 4})
    ckpt = torch.load(tmp_path / "a" / "last.pt", weights_only=True)
    assert (ckpt["args"]["graph"], ckpt["args"]["trim"]) == (True, False)
    for extra, graph, trim in [(["--no-graph"], False, True), (["--trim"], False, True),
                               (["--bucket"], False, True), (["--pack", "1024"], True, False)]:
        s = train_script.main([*base, "--max-steps", "2", *extra])
        assert (s["graph"], s["trim"]) == (graph, trim), extra
    monkeypatch.setattr(train_script, "auto_graph", lambda device: False)
    resumed = train_script.main(["--resume", str(tmp_path / "a" / "last.pt"), "--max-steps", "6",
                                 "--json", "--torch-threads", "1"])
    assert (resumed["graph"], resumed["trim"], resumed["optimizer_steps"]) == (True, False, 6)
    # Left unset on a machine that does not capture: today's eager, trimmed run.
    plain = train_script.main([*base, "--max-steps", "2"])
    assert (plain["graph"], plain["trim"]) == (False, True)


def test_the_scripts_loader_flags_take_the_loaders_defaults(train_script):
    """Issue 54 (3): a flag of examples/train.py that is a loader option defaults to the Rust
    loader's default (dsc.Loader.defaults(), from LoaderArgs::default()), and its network the
    dsc-train's (dim 128, 2 layers, 4 heads): the two trainers and the loader agree. --trim is
    the script's own choice from the machine (the captured step's untrimmed batches)."""
    args = vars(train_script.parse_args(["--cache", "c"]))
    loader = dsc.Loader.defaults()
    flag_of = {"num_threads": "loader_threads"}
    # Every loader key the script has a flag for, found by the key: a flag added later is held
    # to the loader's default too.
    shared = {k: flag_of.get(k, k) for k in loader if flag_of.get(k, k) in args}
    assert {"batch_size", "seed", "prefetch", "num_threads", "bucket", "pack"} <= set(shared)
    for key, flag in shared.items():
        if key == "trim":
            assert args[flag] is None  # left to the machine: see above
            continue
        assert args[flag] == loader[key], (key, args[flag], loader[key])
    assert (args["dim"], args["layers"], args["heads"]) == (128, 2, 4)

