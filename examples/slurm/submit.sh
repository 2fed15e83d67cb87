#!/bin/bash
# Submits a partitioned dsc compile to Slurm: three job arrays of N tasks (scan, fit, write),
# each starting when the previous one has completed, then one merge job.
#
#     DSC_SPEC=/shared/dsc.toml DSC_OUT=/shared/cache examples/slurm/submit.sh 16
#
# `dsc status $DSC_OUT` shows which partitions of which stage are done.
set -euo pipefail
n=${1:?usage: submit.sh PARTITIONS}
here=$(cd "$(dirname "$0")" && pwd)
export DSC_SPEC DSC_OUT
dep=()
for stage in scan fit write; do
    id=$(sbatch --parsable --export=ALL "${dep[@]}" --array="0-$((n - 1))" \
        "$here/compile.sbatch" "$stage")
    echo "$stage: job array $id"
    dep=(--dependency="afterok:$id")
done
id=$(sbatch --parsable --export=ALL "${dep[@]}" --job-name=dsc-merge --output=dsc-merge-%j.log \
    --wrap="${DSC_BIN:-dsc} merge '$DSC_OUT'")
echo "merge: job $id"
