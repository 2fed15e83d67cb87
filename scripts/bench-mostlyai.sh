#!/usr/bin/env bash
# Side by side: mostlyai-engine 2.7.3 vs `dsc compile --profile mostlyai` on the same Parquet files,
# and the engine's digit split vs `dsc digit-split` on the same 1M values (outputs compared).
#
#   scripts/bench-mostlyai.sh                 # 10,000 contexts (~1M target rows)
#   CONTEXTS="10000 100000" scripts/bench-mostlyai.sh
#
# The engine is installed into .venv-bench (git-ignored); set PYTHON to reuse an interpreter that
# already has mostlyai-engine==2.7.3, and DSC to use a dsc binary built beforehand. Work files go to ${WORK:-/tmp/dsc-bench-mostlyai}.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/dsc-bench-mostlyai}
CONTEXTS=${CONTEXTS:-10000}
if [ -z "${PYTHON:-}" ]; then
  if [ ! -x .venv-bench/bin/python ]; then
    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -q mostlyai-engine==2.7.3
  fi
  PYTHON=.venv-bench/bin/python
fi
# DSC: a dsc binary to use instead of building one here.
if [ -z "${DSC:-}" ]; then
  cargo build --release --locked -q
  DSC=${CARGO_TARGET_DIR:-target}/release/dsc
fi
mkdir -p "$WORK"
ratio() { "$PYTHON" -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.0f}x')" "$1" "$2"; }
echo "machine: $(nproc) cores, $(uname -sr)"

for n in $CONTEXTS; do
  data="$WORK/data-$n"
  "$PYTHON" scripts/mostlyai_bench.py gen --contexts "$n" --out "$data" >/dev/null
  engine_json=$("$PYTHON" scripts/mostlyai_bench.py engine --data "$data" --work "$WORK/engine-$n" 2>/dev/null | tail -1)
  engine_s=$("$PYTHON" -c "import json,sys; print(json.loads(sys.argv[1])['total_s'])" "$engine_json")
  start=$(date +%s.%N)
  "$DSC" compile "$data/tgt.parquet" --key id --context "$data/ctx.parquet" --profile mostlyai \
    --val-keys "$data/val-keys.txt" --out "$WORK/dsc-$n" --force --shard-size 32MiB -q >/dev/null
  end=$(date +%s.%N)
  dsc_s=$("$PYTHON" -c "print($end - $start)")
  "$PYTHON" - "$WORK/engine-$n/ModelStore" "$WORK/dsc-$n" <<'PY'
import json, sys
for kind in ("tgt", "ctx"):
    a = json.load(open(f"{sys.argv[1]}/{kind}-stats/stats.json"))
    b = json.load(open(f"{sys.argv[2]}/{kind}-stats.json"))
    assert a == b, f"{kind}-stats.json differs"
print("stats: identical to the engine's")
PY
  printf 'preprocess %s contexts: engine %.1f s (%s), dsc %.2f s, dsc is %s faster\n' \
    "$n" "$engine_s" "$engine_json" "$dsc_s" "$(ratio "$engine_s" "$dsc_s")"
done

mkdir -p "$WORK/digits"
"$PYTHON" scripts/mostlyai_bench.py digits --n 1000000 --out "$WORK/digits" > "$WORK/digits/engine.json"
engine_s=$("$PYTHON" -c "import json; print(json.load(open('$WORK/digits/engine.json'))['seconds'])")
dsc_json=$("$DSC" digit-split "$WORK/digits/values.f64" --out "$WORK/digits/dsc.u8" --json)
dsc_s=$("$PYTHON" -c "import json,sys; print(json.loads(sys.argv[1])['seconds'])" "$dsc_json")
"$PYTHON" scripts/mostlyai_bench.py compare --dir "$WORK/digits" >/dev/null && echo "digits: identical to the engine's on all 1,000,000 values"
printf 'digit split of 1,000,000 values: engine %.2f s, dsc %.1f ms, dsc is %s faster\n' \
  "$engine_s" "$(echo "$dsc_s * 1000" | bc -l)" "$(ratio "$engine_s" "$dsc_s")"
