#!/bin/bash
# Two builds of dsc compile the same caches: the README's demo data (one process, a small
# memory budget, three partitions) and the mostlyai profile's vectors (one process, two
# partitions); every shard, stats.json and manifest.json must be identical.
# For refactors of the compiler: build the old commit into another target folder, then
#   scripts/compare_builds.sh OLD/release/dsc target/release/dsc
set -euo pipefail
OLD=$(realpath "$1"); NEW=$(realpath "$2"); REPO=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; cd "$W"
$NEW gen icecube --out data --files 4 --events-per-file 1500 --seed 7 >/dev/null
OWN=(compile 'data/train/batch_*.parquet' --key event_id --order-by time --context data/train_meta.parquet --targets azimuth,zenith --join data/sensor_geometry.csv --on sensor_id --features x,y,z,time,charge,auxiliary --categorical sensor_id --encode time=zscore --encode charge=log1p,zscore --encode x=minmax --max-len 128 --val-fraction 0.1 --seed 42)
for b in old new; do
  BIN=$OLD; [ $b = new ] && BIN=$NEW
  $BIN "${OWN[@]}" --out $b-own >/dev/null
  $BIN "${OWN[@]}" --out $b-own-small --max-memory 64MiB --bucket-size 64KiB >/dev/null
  for s in scan fit write; do for i in 0 1 2; do $BIN "${OWN[@]}" --out $b-part --partition $i/3 --stage $s >/dev/null; done; done
  $BIN merge $b-part >/dev/null
  P=(compile $REPO/tests/vectors/mostlyai/seq/data/tgt.parquet --key id --context $REPO/tests/vectors/mostlyai/seq/data/ctx.parquet --profile mostlyai --partitions 2)
  $BIN "${P[@]}" --out $b-prof >/dev/null
  for s in scan fit write; do for i in 0 1; do $BIN "${P[@]}" --out $b-profpart --partition $i/2 --stage $s >/dev/null; done; done
  $BIN merge $b-profpart >/dev/null
done
for c in own own-small part prof profpart; do
  diff -r old-$c/shards new-$c/shards && cmp old-$c/stats.json new-$c/stats.json && for f in tgt-stats.json ctx-stats.json; do [ ! -f old-$c/$f ] || cmp old-$c/$f new-$c/$f; done && cmp old-$c/manifest.json new-$c/manifest.json && echo "$c: identical"
done
cmp -s new-own/manifest.json new-part/manifest.json && echo "one process == partitioned"
