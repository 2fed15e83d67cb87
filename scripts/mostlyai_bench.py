#!/usr/bin/env python3
"""Side-by-side benchmark helpers for `scripts/bench-mostlyai.sh` (dsc vs mostlyai-engine 2.7.3).

  gen     --contexts N --out DIR [--seed S]   two-table data: ctx.parquet (id + 4 columns),
                                              tgt.parquet (id + 10 columns, ~100 rows per context),
                                              val-keys.txt (ids with id % 5 == 0)
  engine  --data DIR --work DIR [--partitions P]
                                              the engine's split -> analyze -> encode on the same
                                              files and validation keys; prints JSON timings
  digits  --n N --out DIR                     1M-style digit split: the engine's
                                              split_sub_columns_digit on N values, timed; writes the
                                              values (values.f64) and the engine's digits
                                              (engine.u8, 41 bytes per value) for comparison
  compare --dir DIR                           checks dsc's digits (dsc.u8) equal the engine's
"""
import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np


def gen(args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = args.contexts
    ids = np.arange(n, dtype=np.int64)
    age = rng.integers(18, 91, n).astype(float)
    age[rng.random(n) < 0.05] = np.nan
    countries = np.array([f"country_{i:02d}" for i in range(30)], dtype=object)
    country = countries[rng.integers(0, 30, n)]
    signup = np.datetime64("2015-01-01") + rng.integers(0, 8 * 365, n).astype("timedelta64[D]")
    income = np.round(rng.lognormal(10.5, 0.5, n), 2)
    ctx = pa.table(
        {
            "id": ids,
            "age": pa.array(age, mask=np.isnan(age)).cast(pa.int64()),
            "country": pa.array(country, type=pa.string()),
            "signup": pa.array(signup.astype("datetime64[us]")),
            "income": income,
        }
    )
    pq.write_table(ctx, out / "ctx.parquet")

    lengths = rng.integers(50, 151, n)
    rows = int(lengths.sum())
    key = np.repeat(ids, lengths)
    rng.shuffle(key)  # scattered rows, as in transaction logs
    amount = np.round(rng.normal(300, 200, rows), 2)
    nan_amount = rng.random(rows) < 0.02
    quantity = rng.integers(1, 21, rows)
    price = np.round(rng.uniform(0.5, 500, rows), 2)
    balance = np.round(rng.uniform(-1e5, 1e5, rows), 2)
    score = np.round(rng.random(rows), 4)
    cats = np.array([f"cat_{i:02d}" for i in range(20)], dtype=object)
    merchants = np.array([f"m{i:04d}" for i in range(5000)], dtype=object)
    channels = np.array(["app", "store", "web"], dtype=object)
    ts = np.datetime64("2020-01-01T00:00:00") + rng.integers(0, 3 * 365 * 86400, rows).astype("timedelta64[s]")
    ts = ts.astype("datetime64[ms]") + rng.integers(0, 1000, rows).astype("timedelta64[ms]")
    n_items = rng.integers(0, 51, rows).astype(float)
    n_items[rng.random(rows) < 0.03] = np.nan
    tgt = pa.table(
        {
            "id": key,
            "amount": pa.array(amount, mask=nan_amount),
            "quantity": quantity,
            "price": price,
            "balance": balance,
            "score": score,
            "category": pa.array(cats[rng.integers(0, 20, rows)], type=pa.string()),
            "merchant": pa.array(merchants[rng.integers(0, 5000, rows)], type=pa.string()),
            "channel": pa.array(channels[rng.integers(0, 3, rows)], type=pa.string()),
            "ts": pa.array(ts.astype("datetime64[us]")),
            "n_items": pa.array(n_items, mask=np.isnan(n_items)).cast(pa.int64()),
        }
    )
    pq.write_table(tgt, out / "tgt.parquet")
    (out / "val-keys.txt").write_text("".join(f"{i}\n" for i in ids[ids % 5 == 0]))
    print(json.dumps({"contexts": n, "rows": rows}))


def engine(args):
    import pandas as pd
    from mostlyai.engine import analysis, splitting
    from mostlyai.engine._tabular import encoding as tab_encoding
    from mostlyai.engine.random_state import set_random_state

    data = Path(args.data)
    ws = Path(args.work)
    if ws.exists():
        shutil.rmtree(ws)
    t0 = time.perf_counter()
    tgt = pd.read_parquet(data / "tgt.parquet")
    ctx = pd.read_parquet(data / "ctx.parquet")
    val = set(int(line) for line in (data / "val-keys.txt").read_text().split())
    t_read = time.perf_counter() - t0
    set_random_state(1)
    t = {}
    t0 = time.perf_counter()
    splitting.split(
        tgt_data=tgt,
        ctx_data=ctx,
        tgt_context_key="id",
        ctx_primary_key="id",
        n_partitions=args.partitions,
        trn_val_split=lambda keys: (keys[~keys.isin(val)], keys[keys.isin(val)]),
        workspace_dir=ws,
    )
    t["split_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    analysis.analyze(value_protection=False, workspace_dir=ws)
    t["analyze_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tab_encoding.encode(workspace_dir=ws)
    t["encode_s"] = time.perf_counter() - t0
    t["read_s"] = t_read
    t["total_s"] = t["split_s"] + t["analyze_s"] + t["encode_s"] + t_read
    print(json.dumps(t))


def digit_values(n, seed):
    rng = np.random.default_rng(seed)
    k = n // 4
    parts = [
        np.round(rng.normal(0, 1e4, k), 2),  # prices, balances
        rng.integers(-10**6, 10**6, k).astype(float),  # counts
        np.round(rng.random(k), 6),  # fractions
        rng.random(n - 3 * k) * 10.0 ** rng.integers(-12, 12, n - 3 * k),  # full precision
    ]
    v = np.concatenate(parts)
    v[rng.random(n) < 0.01] = np.nan
    rng.shuffle(v)
    return v


def digits(args):
    import pandas as pd
    from mostlyai.engine._encoding_types.tabular.numeric import split_sub_columns_digit

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    v = digit_values(args.n, 1)
    v.astype("<f8").tofile(out / "values.f64")
    s = pd.Series(v)
    t0 = time.perf_counter()
    df = split_sub_columns_digit(s, max_decimal=18, min_decimal=-20)
    secs = time.perf_counter() - t0
    df.to_numpy(dtype=np.uint8).tofile(out / "engine.u8")
    print(json.dumps({"values": len(v), "seconds": secs}))


def compare(args):
    d = Path(args.dir)
    a = np.fromfile(d / "engine.u8", dtype=np.uint8)
    b = np.fromfile(d / "dsc.u8", dtype=np.uint8)
    if a.shape != b.shape or not np.array_equal(a, b):
        rows = np.nonzero((a.reshape(-1, 41) != b.reshape(-1, 41)).any(axis=1))[0] if a.shape == b.shape else []
        print(f"DIFFERENT: {len(rows)} rows differ", file=sys.stderr)
        return 1
    print(json.dumps({"identical_rows": int(a.size // 41)}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--contexts", type=int, required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=1)
    e = sub.add_parser("engine")
    e.add_argument("--data", required=True)
    e.add_argument("--work", required=True)
    e.add_argument("--partitions", type=int, default=1)
    d = sub.add_parser("digits")
    d.add_argument("--n", type=int, default=1_000_000)
    d.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--dir", required=True)
    a = ap.parse_args()
    sys.exit({"gen": gen, "engine": engine, "digits": digits, "compare": compare}[a.cmd](a) or 0)


if __name__ == "__main__":
    main()
