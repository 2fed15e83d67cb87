#!/usr/bin/env bash
# Everything a GPU machine can tell that CPU CI cannot, in one run: the CUDA tests of the Python
# package, then on the 640,000-event IceCube cache of docs/PERFORMANCE.md ("On a GPU") the feed
# alone, the training step fed each way (scripts/bench_gpu.py: eager, forward graphed, whole step
# captured) and examples/train.py's own runs, each with the GPU's busy share from NVML.
#
#   scripts/gpu_check.sh OUT [DSC [PART...]]
#
# OUT: a folder for the logs and JSON results; DSC: the dsc binary [default: target/release/dsc];
# PART: run only these parts [default: all]: tests (the pytest files below, CPU cases too),
# cuda-tests (their CUDA cases alone), upload, feed, bench-eager, bench-whole, bench-graphs,
# train (examples/train.py with no flags, then packed and padded, captured (the default on
# CUDA) and --no-graph, a full epoch each), dsc-train (the same, and --accumulate 2 over two
# epochs; DSC_TRAIN names the binary
# [default: dsc-train beside DSC], run with PyTorch's torch/lib on LD_LIBRARY_PATH),
# user-loop (examples/pulses_conv.py and bench_gpu.py's whole mode: dsc.CapturedStep in a
# loop of one's own), never-run (fp16 with the loss scaler captured, the GRU captured, captured
# runs resumed, a non-resident mix), first-steps (the default resident run against
# --resident off over its first 1,200 steps),
# threads (the compile, new and --force over itself, with its stages and largest phases, and
# `dsc bench`, at 2, 4, 8 and 16 threads, and bench_python.py's host path to the GPU at 2 to 16
# loader threads: what many cores change).
# `import dsc` must work (pip install ./python, or PYTHONPATH=python with the built extension
# as python/dsc/_dsc.abi3.so). Each part runs on its own, so that one failure leaves the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "$1" && cd "$1" && pwd)
dsc=$(realpath "${2:-target/release/dsc}")
shift $(($# < 2 ? $# : 2))
parts=("$@")
want() { [ ${#parts[@]} -eq 0 ] || [[ " ${parts[*]} " == *" $1 "* ]]; }
work=${DSC_GPU_WORK:-/tmp/dsc-gpu-check}
mkdir -p "$work"
export PYTHONUNBUFFERED=1 DSC_BIN="$dsc"
log() { printf '\n== %s  [%d s]\n' "$*" "$SECONDS" | tee -a "$out/summary.txt"; }

log "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
echo "cores $(nproc)" | tee -a "$out/summary.txt"
python3 -c "import torch, dsc; print('torch', torch.__version__, 'dsc', dsc.__version__)" \
    | tee -a "$out/summary.txt"

tests=(tests/python/test_static.py tests/python/test_resident.py tests/python/test_example.py
       tests/python/test_captured.py)
if want tests; then
    log "pytest: the loader's CUDA paths, static batches, the example script (CUDA and CPU)"
    python3 -m pytest "${tests[@]}" -q -p no:cacheprovider 2>&1 | tee "$out/pytest.txt" | tail -15
    tail -1 "$out/pytest.txt" >> "$out/summary.txt"
fi
if want cuda-tests; then
    log "pytest: the CUDA cases alone"
    python3 -m pytest "${tests[@]}" -q -p no:cacheprovider -k "cuda or captured" 2>&1 \
        | tee "$out/pytest-cuda.txt" | tail -15
    tail -1 "$out/pytest-cuda.txt" >> "$out/summary.txt"
fi

log "data: dsc gen icecube --files 64 --events-per-file 10000, the README's compile"
if [ ! -f "$work/cache/manifest.json" ]; then
    rm -rf "$work/data" "$work/cache"
    "$dsc" gen icecube --out "$work/data" --files 64 --events-per-file 10000 --seed 7 >/dev/null
    "$dsc" compile "$work/data/train/batch_*.parquet" --key event_id --order-by time \
        --context "$work/data/train_meta.parquet" --targets azimuth,zenith \
        --join "$work/data/sensor_geometry.csv" --on sensor_id \
        --features x,y,z,time,charge,auxiliary --categorical sensor_id \
        --encode time=zscore --encode charge=log1p --max-len 128 --val-fraction 0.1 \
        --seed 42 --out "$work/cache" 2>&1 | tail -2 | tee -a "$out/summary.txt"
fi
cache=$work/cache

bench() {  # NAME ARGS...: one scripts/bench_gpu.py run, its table in the summary
    local name=$1
    shift
    log "bench_gpu.py $*"
    python3 scripts/bench_gpu.py --cache "$cache" --pack 16384 "$@" --json \
        >"$out/bench-$name.json" 2>"$out/bench-$name.err"
    python3 - "$out/bench-$name.json" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
try:
    runs = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no result (see the .err file)")
for r in runs:
    if r["mode"] == "feed":
        print(f"feed   {r['feed']:21} {r['ops_per_step']:5.1f} ops/step · host "
              f"{r['host_us_per_step']:7.1f} us/step · first batch {r['first_batch_s']:.3f} s "
              f"· upload {r['upload_gib']:.2f} GiB in {r['upload_s']:.3f} s")
        continue
    busy = "n/a" if r["gpu_busy"] is None else f"{100 * r['gpu_busy']:.0f}%"
    print(f"{r['mode']:6} {r['feed']:11} {r['samples_per_s']:>9,.0f} samples/s · data wait "
          f"{100 * r['data_wait_share']:5.2f}% · host {r['host_us_per_step']:7.0f} us/step of "
          f"{r['step_us']:7.0f} · GPU busy {busy}")
EOF
}

train() {  # NAME ARGS...: examples/train.py with NVML sampled beside it
    local name=$1
    shift
    log "examples/train.py $*"
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 \
        >"$out/busy-$name.txt" 2>/dev/null &
    local sampler=$!
    python3 examples/train.py --cache "$cache" --dim 128 --layers 2 --heads 4 "$@" --json \
        >"$out/train-$name.json" 2>"$out/train-$name.err"
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    python3 - "$out/train-$name.json" "$out/busy-$name.txt" <<'EOF' | tee -a "$out/summary.txt"
import json, statistics, sys
try:
    s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except (ValueError, IndexError):
    sys.exit("no result (see the .err file)")
busy = [int(x) for x in open(sys.argv[2]).read().split() if x.strip().isdigit()]
# Steady state: the median of the logged windows after the first two (capture, compiles and
# the resident upload left out), as docs/PERFORMANCE.md counts it.
windows = [w["samples_per_s"] for w in s["steps"][2:]] or [s["samples_per_s"]]
waits = [w["data_wait_share"] for w in s["steps"][2:]] or [s["data_wait_share"]]
val = s["val_metric"][-1] if s["val_metric"] else None
print(f"steady {statistics.median(windows):,.0f} samples/s · data wait "
      f"{100 * statistics.median(waits):.2f}% · run {s['samples_per_s']:,.0f} samples/s · "
      f"GPU busy (NVML, whole run) {statistics.mean(busy) if busy else float('nan'):.0f}% · "
      f"val {val} · graph {s['graph']} · resident {s['resident']} · amp {s['amp']}")
EOF
}

dsc_train() {  # NAME ARGS...: dsc-train on the cache, its own NVML busy share in the summary
    local name=$1
    shift
    log "dsc-train $*"
    local bin=${DSC_TRAIN:-$(dirname "$dsc")/dsc-train}
    local lib
    lib=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
    LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 200 "$bin" --cache "$cache" \
        --task direction --dim 128 --layers 2 --heads 4 --out "$work/run-$name" "$@" --json \
        >"$out/dsc-train-$name.json" 2>"$out/dsc-train-$name.err"
    python3 - "$out/dsc-train-$name.json" <<'EOF' | tee -a "$out/summary.txt"
import json, statistics, sys
try:
    s = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no result (see the .err file)")
windows = [w["samples_per_s"] for w in s["steps"][2:]] or [s["total"]["samples_per_s"]]
waits = [w["data_wait_share"] for w in s["steps"][2:]] or [s["total"]["data_wait_share"]]
busy = s.get("gpu_busy_nvml")
val = s["epochs"][-1]["val_metric"] if s["epochs"] else None
print(f"steady {statistics.median(windows):,.0f} samples/s · data wait "
      f"{100 * statistics.median(waits):.2f}% · run {s['total']['samples_per_s']:,.0f} samples/s"
      f" · GPU busy (NVML) {'n/a' if busy is None else f'{100 * busy:.0f}%'} · val {val} · "
      f"step {s['step']} {s.get('graph_unavailable') or ''} · resident {s['resident']} · "
      f"amp {s['amp']}")
EOF
}

want upload && log "the resident upload: pinned staging (the loader's) against copies from the mapped shards"
want upload && python3 - "$cache" <<'PY' 2>&1 | tee -a "$out/summary.txt"
import sys, time, torch, dsc
from dsc import _resident
cache = dsc.open(sys.argv[1])
contexts = cache.splits["train"]

def reader():
    return dsc.Loader(cache, batch_size=_resident.UPLOAD_PIECE, shuffle=False, drop_last=False,
                      num_threads=1)

targets = {t.name: torch.empty((contexts, *t.shape), dtype=getattr(torch, t.dtype),
                               device="cuda") for t in cache.schema}
gib = sum(t.nbytes for t in targets.values()) / 2**30
for name, pinned in (("pinned staging", True), ("pageable copies", False)):
    for _ in range(2):  # the second pass reads the shards from the page cache
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if pinned:
            names = [t.name for t in cache.schema]
            pieces = _resident.split_pieces(torch, cache, "train", names)
            _resident._upload(torch, torch.device("cuda"), pieces, targets)
        else:
            at = 0
            for b in reader():
                for k, t in b.items():
                    targets[k][at:at + b.valid].copy_(t[:b.valid])
                at += b.valid
        torch.cuda.synchronize()
        took = time.perf_counter() - t0
    print(f"upload {name}: {gib:.2f} GiB in {took:.2f} s, {gib / took:.2f} GiB/s "
          "(hot page cache)")
PY

want feed && bench feed --modes feed --steps 400
want bench-eager && bench eager --modes eager --feeds resident,padded,padded_host,packed
want bench-whole && bench whole --modes whole
want bench-graphs && bench graphs --modes graphs --feeds packed
if want train; then
    # No flag but the cache and the task: on CUDA the captured step on untrimmed batches.
    train default --epochs 1
    train pack-graph --pack 16384 --epochs 1
    train pack-eager --pack 16384 --no-graph --epochs 1
    train padded-graph --batch-size 256 --epochs 1
    train padded-eager --batch-size 256 --no-graph --epochs 1
fi
if want dsc-train; then
    dsc_train default --epochs 1
    dsc_train pack-graph --pack 16384 --epochs 1
    dsc_train pack-eager --pack 16384 --no-graph --epochs 1
    dsc_train padded-graph --batch-size 256 --epochs 1
    dsc_train padded-eager --batch-size 256 --no-graph --epochs 1
    # The two graphs (micro-step, and micro-step with the update) replayed across epochs,
    # evaluation and checkpoints.
    dsc_train pack-graph-acc --pack 16384 --accumulate 2 --graph --epochs 2
fi
if want user-loop; then
    # dsc.CapturedStep in a loop of one's own (PYTHON.md): a convolutional network over the
    # pulses, and bench_gpu's whole mode (CapturedStep around examples/train.py's transformer
    # on the same batches as `train pack-graph`).
    log "examples/pulses_conv.py (dsc.CapturedStep, a network of its own)"
    python3 examples/pulses_conv.py --cache "$cache" --epochs 2 --batch-size 256 \
        >"$out/pulses-conv.txt" 2>&1
    tail -1 "$out/pulses-conv.txt" | tee -a "$out/summary.txt"
    bench user-loop --modes whole --feeds packed,resident
fi
if want never-run; then
    # What had not run on a GPU before issue 53: fp16 with the loss scaler captured, the GRU
    # captured, a captured run resumed, a mix from the host path.
    dsc_train fp16-graph --pack 16384 --amp fp16 --graph --epochs 1
    dsc_train gru-graph --model gru --batch-size 256 --graph --epochs 1
    train gru-graph --model gru --batch-size 256 --epochs 1
    dsc_train resume-first --pack 16384 --max-steps 150 --epochs 2
    dsc_train resume-second --resume "$work/run-resume-first/last.ckpt" --max-steps 300
    train resume-first --pack 16384 --max-steps 150 --epochs 2 --out "$work/py-resume"
    train resume-second --resume "$work/py-resume/last.pt" --max-steps 300
    [ -d "$work/cache-b" ] || cp -r "$cache" "$work/cache-b"
    dsc_train mix --cache "$work/cache-b" --weights 0.7,0.3 --resident off --pack 16384 --epochs 1
fi
if want first-steps; then
    train padded-default --batch-size 256 --epochs 1 --max-steps 1200
    train padded-host --batch-size 256 --epochs 1 --max-steps 1200 --resident off
fi
if want threads; then
    log "thread scaling: the README's compile (into a new folder, then --force over it) and dsc bench at 2, 4, 8, 16 threads"
    for n in 2 4 8 16; do
        rm -rf "$work/cache-t$n"
        for pass in new force; do
            "$dsc" compile "$work/data/train/batch_*.parquet" --key event_id --order-by time \
                --context "$work/data/train_meta.parquet" --targets azimuth,zenith \
                --join "$work/data/sensor_geometry.csv" --on sensor_id \
                --features x,y,z,time,charge,auxiliary --categorical sensor_id \
                --encode time=zscore --encode charge=log1p --max-len 128 --val-fraction 0.1 \
                --seed 42 --threads "$n" --out "$work/cache-t$n" --force --json \
                >"$out/compile-t$n-$pass.json" 2>/dev/null
        done
        # The same inputs and seed give the same cache whatever the thread count.
        same=$(diff -rq "$work/cache-t$n" "$cache" >/dev/null 2>&1 && echo identical || echo DIFFERENT)
        rm -rf "$work/cache-t$n"
        "$dsc" bench "$cache" --loader-threads "$n" --json >"$out/bench-t$n.json" 2>/dev/null
        python3 - "$n" "$same" "$out" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
n, same, out = sys.argv[1:]
def report(pass_):
    return json.load(open(f"{out}/compile-t{n}-{pass_}.json"))
new, force = report("new"), report("force")
two = json.load(open(f"{out}/compile-t2-new.json"))["seconds"]
b = json.load(open(f"{out}/bench-t{n}.json"))
stages = " ".join(f"{k} {v:.2f}" for k, v in new["timings"])
phases = sorted(new["phases"], key=lambda p: -p[1])[:5]
print(f"threads {n:>2}: compile {new['seconds']:6.2f} s ({two / new['seconds']:.2f}x the 2-thread "
      f"compile; --force over it {force['seconds']:.2f} s; cache {same}) · dsc bench shuffled "
      f"{b['contexts_per_s_shuffled'] / 1e6:6.2f} M contexts/s, "
      f"{b['shuffled_over_memcpy_threads']:.2f} of memcpy at as many threads")
print(f"    stages (wall s): {stages}")
print("    largest phases (thread-s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases))
EOF
    done
    log "bench_python.py --device cuda (the host path at 2 to 16 loader threads)"
    python3 scripts/bench_python.py "$cache" --dsc "$dsc" --device cuda --passes 2 --epochs 2 \
        --json >"$out/bench-python.json" 2>"$out/bench-python.err"
    python3 - "$out/bench-python.json" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no result (see the .err file)")
for k, v in r.items():
    if k.endswith("_per_s"):
        print(f"  {k[:-len('_contexts_per_s')]:<28} {v / 1e6:8.3f} M contexts/s")
print(f"  host path / pinned copies   {r.get('host_path_over_pinned_copy', float('nan')):8.2f}")
EOF
fi
log "done"
