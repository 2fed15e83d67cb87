#!/usr/bin/env bash
# Shuffled loading from a cache in object storage against the same cache on local disk (issue
# 30, item 3). Compiles the README's demo compile of ten times its data (160,000 contexts,
# EVENTS per file) with SHARD-sized shards into a local cache and into a bucket of an S3 server on
# localhost (moto's, from .venv; or the server at S3_ENDPOINT with bucket S3_BUCKET), then runs
# `dsc bench` on both: the remote one with --cache-limit a quarter of the cache and a fresh fetch
# folder. A quarter must hold the shards of two shuffle windows (about 2 x 8 shards: the loader
# refuses less), hence shards of 8 MiB. Prints both reports (JSON) and the figures
# docs/PERFORMANCE.md quotes.
# The server is moto's unless S3S_FS names an s3s-fs binary (`cargo install s3s-fs --version
# 0.14.1 --features binary`; not a dependency of dsc): a Rust server that takes far less of the
# machine's CPU to serve the same bytes, which matters on a 2-core machine where the server, the
# loader and the consumer share the cores.
#   scripts/bench_remote.sh                 (DSC=target/release/dsc by default)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DSC=$(realpath "${DSC:-target/release/dsc}")
SHARD=${SHARD:-8MiB}
EVENTS=${EVENTS:-20000}
work=$(mktemp -d /tmp/dsc-bench-remote.XXXXXX)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

if [ -z "${S3_ENDPOINT:-}" ]; then
    port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    if [ -n "${S3S_FS:-}" ]; then
        mkdir -p "$work/s3"
        "$S3S_FS" --host 127.0.0.1 --port "$port" --access-key testing --secret-key testing \
            "$work/s3" >/dev/null 2>&1 &
    else
        .venv/bin/python -m moto.server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
    fi
    server=$!
    S3_ENDPOINT="http://127.0.0.1:$port"
    for _ in $(seq 100); do curl -s "$S3_ENDPOINT" >/dev/null && break; sleep 0.1; done
    S3_BUCKET=bench
    curl -s -X PUT "$S3_ENDPOINT/$S3_BUCKET" >/dev/null
fi
export AWS_ENDPOINT_URL=$S3_ENDPOINT AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-testing} \
    AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-testing} AWS_REGION=${AWS_REGION:-us-east-1}
url="s3://$S3_BUCKET/demo"

cd "$work"
"$DSC" gen icecube --out data --files 8 --events-per-file "$EVENTS" --seed 7 >/dev/null
compile=(compile 'data/train/batch_*.parquet' --key event_id --order-by time
    --context data/train_meta.parquet --targets azimuth,zenith
    --join data/sensor_geometry.csv --on sensor_id
    --features x,y,z,time,charge,auxiliary --categorical sensor_id
    --encode time=zscore --encode charge=log1p
    --max-len 128 --val-fraction 0.1 --seed 42 --shard-size "$SHARD" --quiet)
"$DSC" "${compile[@]}" --out cache
start=$(date +%s.%N)
"$DSC" "${compile[@]}" --out "$url" --force --cache-dir "$work/staging"
upload_s=$(echo "$(date +%s.%N) - $start" | bc)
total=$(du -sb cache/shards | cut -f1)
limit=$((total / 4))
"$DSC" bench cache --json > local.json
"$DSC" bench "$url" --cache-limit "$limit" --cache-dir "$work/fetched" --json > remote.json
# The link itself: every shard downloaded (4 at a time, checked on arrival) into a fresh folder.
start=$(date +%s.%N)
"$DSC" verify "$url" --quick --cache-dir "$work/link" > /dev/null
link_s=$(echo "$(date +%s.%N) - $start" | bc)
all=$(du -sb "$work/link/remote" | cut -f1)
# A consumer slower than the link, as a training step is: the Python loader with a fixed
# amount of arithmetic per batch (a [256*128, 6] x [6, 96] product), from the local cache and
# from the bucket (a quarter kept), two epochs each.
"$ROOT/.venv/bin/python" - "$url" "$limit" "$work/py" > consumer.json <<'PY'
import json, sys, time
import numpy as np
import dsc
url, limit, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
def run(loader):
    n, start = 0, time.perf_counter()
    for epoch in range(2):
        loader.set_epoch(epoch)
        for b in loader:
            x = b["x"]
            (x.reshape(-1, x.shape[-1]) @ w).sum()
            n += len(x)
    return n / (time.perf_counter() - start)
local = run(dsc.Loader("cache", batch_size=256, format="numpy", num_threads=2))
remote_loader = dsc.Loader(url, batch_size=256, format="numpy", num_threads=2,
                           cache_limit=limit, cache_dir=folder)
remote = run(remote_loader)
print(json.dumps({"local": local, "remote": remote, "stats": remote_loader.stats()}))
PY
echo "local:  $(cat local.json)"
echo "remote: $(cat remote.json)"
python3 - "$limit" "$upload_s" "$link_s" "$all" <<'PY'
import json, sys
local, remote = json.load(open("local.json")), json.load(open("remote.json"))
consumer = json.load(open("consumer.json"))
limit, upload_s, link_s, link_bytes = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
print(f"cache: {remote['split_stored_bytes'] / 1e6:.1f} MB in the train split; limit {limit / 1e6:.1f} MB")
print(f"compile + upload to the bucket: {upload_s:.1f} s")
print(f"shuffled, {local['threads_running']} threads: local {local['contexts_per_s_shuffled']:,.0f} "
      f"contexts/s, remote {remote['contexts_per_s_shuffled']:,.0f} contexts/s: "
      f"remote / local {remote['contexts_per_s_shuffled'] / local['contexts_per_s_shuffled']:.2f}")
print(f"per epoch: {remote['shards_fetched_per_epoch']:.1f} shards, "
      f"{remote['bytes_fetched_per_epoch'] / 1e6:.1f} MB fetched = "
      f"{remote['fetched_over_split']:.2f} of the split; {remote['fetch_evictions_per_epoch']:.1f} "
      f"evictions; {remote['fetch_waits_per_epoch']:.1f} waits ({remote['fetch_wait_s_per_epoch']:.2f} s)")
epoch_s = remote["contexts"] / remote["contexts_per_s_shuffled"]
print(f"link: {link_bytes / 1e9 / link_s:.3f} GB/s (every shard, 4 downloads at once); the "
      f"shuffled remote pass fetched {remote['bytes_fetched_per_epoch'] / 1e9 / epoch_s:.3f} GB/s")
s = consumer["stats"]
per_context = remote["bytes_per_epoch"] / (remote["contexts_per_s_shuffled"] * epoch_s)
print(f"a consumer slower than the link (Python, 2 epochs): local {consumer['local']:,.0f} "
      f"contexts/s ({consumer['local'] * per_context / 1e9:.3f} GB/s of batches), remote "
      f"{consumer['remote']:,.0f}: remote / local "
      f"{consumer['remote'] / consumer['local']:.2f}; fetched {s['bytes_fetched'] / 1e6:.0f} MB "
      f"in {s['shards_fetched']} shards; the consumer waited {s['wait_s']:.2f} s in next()")
PY
