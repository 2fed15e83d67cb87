#!/bin/bash
# Submits a partitioned dsc compile to Slurm: three job arrays of N tasks (scan, fit, write),
# each starting when the previous one has completed, then one merge job.
#
#     DSC_SPEC=/shared/dsc.toml DSC_OUT=/shared/cache examples/slurm/submit.sh 16
#
# `dsc status $DSC_OUT` shows which partitions of which stage are done. DSC_SBATCH_ARGS adds
# options to every sbatch (e.g. "--partition=short --cpus-per-task=8 --mem=16G"; they override
# the #SBATCH lines of compile.sbatch).
set -euo pipefail
n=${1:?usage: submit.sh PARTITIONS}
here=$(cd "$(dirname "$0")" && pwd)
export DSC_SPEC DSC_OUT
read -r -a extra <<< "${DSC_SBATCH_ARGS:-}"
dep=()
for stage in scan fit write; do
    id=$(sbatch --parsable --export=ALL "${extra[@]}" "${dep[@]}" --array="0-$((n - 1))" \
        "$here/compile.sbatch" "$stage")
    echo "$stage: job array $id"
    dep=(--dependency="afterok:$id")
done
id=$(sbatch --parsable --export=ALL "${extra[@]}" "${dep[@]}" --job-name=dsc-merge --output=dsc-merge-%j.log \
    --wrap="${DSC_BIN:-dsc} merge '$DSC_OUT'")
echo "merge: job $id"
