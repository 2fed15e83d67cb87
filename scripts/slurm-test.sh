#!/usr/bin/env bash
# A partitioned compile on a real single-node Slurm (Debian's slurm-wlm): installs it if
# missing (root or sudo, as the chromium step of scripts/test.sh), starts munge, slurmctld and
# slurmd on this machine, submits examples/slurm/submit.sh (three job arrays, a dependent
# merge) on generated data, waits, and compares the cache with a plain compile byte for byte.
# Stops the daemons it started. Usage: scripts/slurm-test.sh [DSC_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dsc=${1:-$repo/target/debug/dsc}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v slurmctld >/dev/null 2>&1; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmd slurmctld slurm-client munge >/dev/null
fi

host=$(hostname -s)
mem_mib=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
work=$(mktemp -d)
chmod 755 "$work"
# A private cluster: its own configuration, state, logs and ports, so that it neither reads nor
# disturbs a Slurm this machine may already run.
export SLURM_CONF="$work/slurm/slurm.conf"
mkdir -p "$work/slurm/state" "$work/slurm/spool"
cat > "$SLURM_CONF" <<CONF
ClusterName=dsc-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=$(id -un)
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=$work/slurm/slurmctld.pid
SlurmdPidFile=$work/slurm/slurmd.pid
SlurmdSpoolDir=$work/slurm/spool
StateSaveLocation=$work/slurm/state
SlurmctldLogFile=$work/slurm/slurmctld.log
SlurmdLogFile=$work/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem_mib State=UNKNOWN
PartitionName=dsc Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

started_munge=
if ! pgrep -x munged >/dev/null; then
    as_root mkdir -p /run/munge
    as_root chown munge:munge /run/munge
    as_root /usr/sbin/munged --force 2>/dev/null
    started_munge=1
fi
stop() {
    for pid in "$work/slurm/slurmd.pid" "$work/slurm/slurmctld.pid"; do
        [ -f "$pid" ] && as_root kill "$(cat "$pid")" 2>/dev/null || true
    done
    [ -n "$started_munge" ] && as_root pkill -x munged || true
    sleep 1
    as_root rm -rf "$work"
}
trap stop EXIT
as_root env SLURM_CONF="$SLURM_CONF" /usr/sbin/slurmctld -f "$SLURM_CONF"
as_root env SLURM_CONF="$SLURM_CONF" /usr/sbin/slurmd -f "$SLURM_CONF"
up=
for _ in $(seq 1 30); do
    if sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|allocated'; then up=1; break; fi
    sleep 1
done
if [ -z "$up" ]; then
    echo "slurm-test: the single-node Slurm did not come up" >&2
    tail -20 "$work/slurm/slurmctld.log" "$work/slurm/slurmd.log" >&2 || true
    exit 1
fi

cd "$work"
"$dsc" gen icecube --out data --files 3 --events-per-file 60 --seed 3 >/dev/null
"$dsc" compile 'data/train/batch_*.parquet' --key event_id --order-by time \
    --context data/train_meta.parquet --targets azimuth,zenith --features time,charge \
    --categorical sensor_id --max-len 32 --val-fraction 0.2 --bucket-size 16KiB \
    --print-spec > dsc.toml
"$dsc" compile --spec dsc.toml --out plain --quiet >/dev/null
DSC_SBATCH_ARGS="--cpus-per-task=1 --mem=1G" DSC_BIN="$dsc" DSC_SPEC="$work/dsc.toml" \
    DSC_OUT="$work/cache" "$repo/examples/slurm/submit.sh" 2
for _ in $(seq 1 300); do
    [ -z "$(squeue -h)" ] && break
    sleep 1
done
if [ -n "$(squeue -h)" ]; then
    echo "slurm-test: jobs still queued after 300 s:" >&2
    squeue >&2
    scancel --user "$(id -un)" || true
    exit 1
fi
if [ ! -f cache/manifest.json ]; then
    echo "slurm-test: no cache was committed; the jobs' logs:" >&2
    tail -n 20 dsc-*.log >&2 || true
    exit 1
fi
diff -r plain cache
echo "slurm-test: 3 job arrays of 2 tasks and a merge on Slurm $(sinfo -V | awk '{print $2}') gave the plain compile's cache, byte for byte"
