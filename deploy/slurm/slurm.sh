#!/bin/sh
# A single-host Slurm for det's tests and for trying det's slurm pools: munged, slurmctld and
# slurmd of Debian's slurm-wlm, run as root, all state under one directory.
#   deploy/slurm/slurm.sh start [DIR] [CPUS]   writes DIR/slurm.conf, starts the daemons and
#                                               waits until the node is idle; prints SLURM_CONF
#   deploy/slurm/slurm.sh stop [DIR]           stops them
# DIR defaults to /tmp/det-slurm, CPUS to 4 (more than the host has is allowed: the tests run
# several one-CPU jobs on a 2-core machine). Slurm's clients find the cluster by SLURM_CONF.
set -eu
cmd=${1:?usage: slurm.sh start|stop [DIR] [CPUS]}
dir=${2:-/tmp/det-slurm}
cpus=${3:-4}
host=$(hostname -s)

stop_pid() {
    [ -f "$1" ] || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    # slurmd and slurmctld finish their jobs' bookkeeping first: a few seconds
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$1"
}

case $cmd in
start)
    for b in munged slurmctld slurmd sbatch; do
        command -v "$b" >/dev/null || { echo "slurm.sh: $b not found (apt-get install slurm-wlm munge)" >&2; exit 2; }
    done
    mkdir -p "$dir/state" "$dir/spool" /run/munge
    if [ ! -f "$dir/munge.key" ]; then
        dd if=/dev/urandom bs=1 count=1024 of="$dir/munge.key" 2>/dev/null
    fi
    chown munge:munge "$dir/munge.key" /run/munge 2>/dev/null || true
    chmod 0400 "$dir/munge.key"
    cat > "$dir/slurm.conf" <<CONF
ClusterName=det
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=10
SchedulerParameters=sched_interval=1
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    export SLURM_CONF="$dir/slurm.conf"
    munged --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
        --socket=/run/munge/munge.socket.2 --force
    slurmctld -i
    slurmd
    for _ in $(seq 200); do
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
        [ "$state" = idle ] && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
        sleep 0.1
    done
    echo "slurm.sh: node $host not idle after 20 s (state '$state'); see $dir/*.log" >&2
    exit 1
    ;;
stop)
    # Jobs first, while slurmd can still kill their processes (it leaves them running when it
    # stops): SIGTERM, then SIGKILL after KillWait.
    if [ -f "$dir/slurmctld.pid" ]; then
        export SLURM_CONF="$dir/slurm.conf"
        scancel --user "$(id -un)" 2>/dev/null || true
        for _ in $(seq 300); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    stop_pid "$dir/slurmd.pid"
    stop_pid "$dir/slurmctld.pid"
    stop_pid "$dir/munged.pid"
    ;;
*)
    echo "usage: slurm.sh start|stop [DIR] [CPUS]" >&2; exit 2 ;;
esac
