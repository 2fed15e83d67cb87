"""A public benchmark end to end: a UEA/UCR time-series classification data set shipped with
`aeon`, converted to Parquet (one row per time step, rows scattered over two files, labels and
the official train/test split in a context table), compiled with its official split, trained with
dsc-train (and examples/train.py), and scored on the official test split next to the classical
baseline, 1-nearest-neighbour DTW from aeon, run in the same script.

    python examples/uea.py --dataset JapaneseVowels
    python examples/uea.py --dataset BasicMotions --dataset PickupGestureWiimoteZ --json

Needs `aeon` and `pyarrow` (scripts/venv.sh installs both) and the `dsc` and `dsc-train`
binaries: DSC_BIN / DSC_TRAIN_BIN, else the newest of target/{release,debug}. The model is
chosen by nothing but the settings below, fixed per data set: it is trained for a fixed number of
epochs, validated on `val` (carved out of the official train cases), and the test split is read
once, to report the final model (both trainers' `evaluation`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# Settings per data set: epochs and model size for a 2-core CPU, fixed in advance.
SETTINGS = {
    "JapaneseVowels": dict(epochs=40, dim=64, batch_size=16, lr=3e-3),
    "BasicMotions": dict(epochs=60, dim=64, batch_size=8, lr=3e-3),
    "PickupGestureWiimoteZ": dict(epochs=80, dim=64, batch_size=8, lr=3e-3),
}
DEFAULT = dict(epochs=40, dim=64, batch_size=16, lr=3e-3)


def binary(env: str, name: str) -> str:
    if os.environ.get(env):
        return os.environ[env]
    found = [p for p in (REPO / "target/release" / name, REPO / "target/debug" / name) if p.exists()]
    if not found:
        sys.exit(f"no {name} binary: build it (cargo build --release -p ...) or set {env}")
    return str(max(found, key=lambda p: p.stat().st_mtime))


def load(name: str):
    """The official train and test cases: lists of (dims, steps) arrays and string labels."""
    from aeon.datasets import load_classification

    out = {}
    for split in ("train", "test"):
        X, y = load_classification(name, split=split)
        out[split] = ([np.asarray(x, dtype=np.float64) for x in X], [str(v) for v in y])
    return out


def to_parquet(data, work: Path) -> tuple[list[str], list[str]]:
    """Writes rows/part-{0,1}.parquet (case_id, t, d0..) with each case's steps alternating
    between the two files, and cases.parquet (case_id, label, split). Returns the feature names
    and the class names (label k is classes[k])."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted(set(data["train"][1]))
    unknown = set(data["test"][1]) - set(classes)
    if unknown:
        sys.exit(f"test labels {sorted(unknown)} do not occur in train")
    dims = data["train"][0][0].shape[0]
    features = [f"d{i}" for i in range(dims)]
    parts: list[dict[str, list]] = [
        {"case_id": [], "t": [], **{f: [] for f in features}} for _ in range(2)
    ]
    cases = {"case_id": [], "label": [], "split": []}
    case_id = 0
    for split in ("train", "test"):
        for x, label in zip(*data[split]):
            for t in range(x.shape[1]):
                if np.isnan(x[:, t]).all():
                    continue  # padding of an unequal-length series stored as NaN
                part = parts[t % 2]
                part["case_id"].append(case_id)
                part["t"].append(t)
                for i, f in enumerate(features):
                    part[f].append(float(x[i, t]))
            cases["case_id"].append(case_id)
            cases["label"].append(classes.index(label))
            cases["split"].append(split)
            case_id += 1
    (work / "rows").mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        pq.write_table(pa.table(part), work / "rows" / f"part-{i}.parquet")
    pq.write_table(pa.table(cases), work / "cases.parquet")
    return features, classes


def run(cmd: list[str], **kw) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


def baseline(data) -> float:
    """1-NN DTW (aeon), full window, on the official split."""
    from aeon.classification.distance_based import KNeighborsTimeSeriesClassifier

    def prep(X):
        # aeon takes equal-length series as one array, unequal ones as a list.
        return np.stack(X) if len({x.shape[1] for x in X}) == 1 else X

    clf = KNeighborsTimeSeriesClassifier(distance="dtw", n_neighbors=1)
    clf.fit(prep(data["train"][0]), np.array(data["train"][1]))
    predicted = clf.predict(prep(data["test"][0]))
    return float((predicted == np.array(data["test"][1])).mean())


def one(name: str, work: Path, args) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    s = {**DEFAULT, **SETTINGS.get(name, {})}
    if args.epochs:
        s["epochs"] = args.epochs
    data = load(name)
    features, classes = to_parquet(data, work)
    cache = work / "cache"
    run([binary("DSC_BIN", "dsc"), "compile", str(work / "rows" / "part-*.parquet"),
         "--key", "case_id", "--order-by", "t", "--context", str(work / "cases.parquet"),
         "--targets", "label", "--features", ",".join(features), "--split-by", "split",
         "--val-fraction", str(args.val_fraction), "--seed", str(args.seed),
         "--out", str(cache), "--force", "-q"])
    common = ["--task", "classification", "--target", "label", "--model", "gru",
              "--dim", str(s["dim"]), "--layers", "1", "--epochs", str(s["epochs"]),
              "--batch-size", str(s["batch_size"]), "--lr", str(s["lr"]),
              "--seed", str(args.seed), "--json"]
    threads = ["--torch-threads", str(args.torch_threads)] if args.torch_threads else []
    t0 = time.perf_counter()
    summary = json.loads(run([binary("DSC_TRAIN_BIN", "dsc-train"), "--cache", str(cache),
                              "--out", str(work / "run"), *common, *threads]))
    dsc_seconds = time.perf_counter() - t0
    test = {e["split"]: e for e in summary["evaluation"]}["test"]
    result = {
        "dataset": name,
        "train_cases": len(data["train"][1]),
        "test_cases": len(data["test"][1]),
        "dims": len(features),
        "lengths": [min(x.shape[1] for x in data["train"][0]),
                    max(x.shape[1] for x in data["train"][0])],
        "classes": len(classes),
        "settings": {"model": "gru", "layers": 1, **s, "val_fraction": args.val_fraction},
        "dsc_train_test_accuracy": test["metric"],
        "dsc_train_seconds": round(dsc_seconds, 1),
    }
    if args.python_example:
        t0 = time.perf_counter()
        py = json.loads(run([sys.executable, str(REPO / "examples" / "train.py"),
                             "--cache", str(cache), *common, *threads]))
        result["train_py_test_accuracy"] = {e["split"]: e for e in py["evaluation"]}["test"]["metric"]
        result["train_py_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    result["dtw_1nn_test_accuracy"] = baseline(data)
    result["dtw_seconds"] = round(time.perf_counter() - t0, 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", action="append", help="aeon data set name (repeatable) "
                   f"[default: JapaneseVowels]; with settings of their own: {', '.join(SETTINGS)}")
    p.add_argument("--work", default="uea", help="folder for the Parquet files, caches and runs")
    p.add_argument("--epochs", type=int, default=None, help="override the data set's epochs")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="val carved out of the official train split (for model selection)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=None, help="CPU threads for libtorch")
    p.add_argument("--python-example", action=argparse.BooleanOptionalAction, default=True,
                   help="also train with examples/train.py on the same cache")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args()
    results = [one(name, Path(args.work) / name, args)
               for name in (args.dataset or ["JapaneseVowels"])]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'data set':24} {'train/test':>10} {'dsc-train':>10} {'train.py':>9} {'1-NN DTW':>9}")
    for r in results:
        py = r.get("train_py_test_accuracy")
        print(f"{r['dataset']:24} {r['train_cases']:>4}/{r['test_cases']:<5} "
              f"{r['dsc_train_test_accuracy']:>10.3f} {'' if py is None else f'{py:.3f}':>9} "
              f"{r['dtw_1nn_test_accuracy']:>9.3f}")


if __name__ == "__main__":
    main()
