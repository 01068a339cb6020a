# A one-node Slurm on this machine, the one bring-up of .ci/slurm_test.sh,
# .ci/slurm_site_profile.sh and bench/slurm_batches.sh (each sets `name`, its messages' prefix,
# and runs from the repository root). Defines fail and say, puts src/ on PYTHONPATH, refuses to
# run but as root or beside a running slurmctld/slurmd, installs slurm-wlm and munge, writes
# slurm.conf for localhost with a partition ci (not the default), starts munged, slurmctld and
# slurmd, and sets a trap that cancels the jobs, stops the daemons by PID and restores slurm.conf
# on exit. Sets: work (a temporary folder), node, cpus, memory, pids. NODE_CPUS: the CPUs
# slurm.conf declares (default: the machine's; more than it has oversubscribes,
# config_overrides).
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
start=$SECONDS
fail() { echo "$name FAILED: $*" >&2; exit 1; }
say() { echo "$name [$((SECONDS - start)) s]: $*"; }
[ "$(id -u)" = 0 ] || fail "run it as root (apt-get, /etc/slurm/slurm.conf, the daemons)"
for daemon in slurmctld slurmd; do
    if pgrep -x "$daemon" > /dev/null; then fail "a $daemon is running already; stop it first"; fi
done
say "installing slurm-wlm and munge"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq slurm-wlm munge > /dev/null

work=$(mktemp -d /tmp/slurm-test.XXXXXX)
chmod 711 "$work"
conf=/etc/slurm/slurm.conf
pids=()
cleanup() {
    local status=$?
    set +e
    if [ -n "${run_pid:-}" ] && kill -0 "$run_pid" 2> /dev/null; then kill "$run_pid"; wait "$run_pid"; fi
    if [ ${#pids[@]} -gt 0 ] && squeue -h > /dev/null 2>&1; then
        scancel $(squeue -h -o %i) 2> /dev/null
        for _ in $(seq 30); do [ -z "$(squeue -h -o %i 2> /dev/null)" ] && break; sleep 1; done
    fi
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2> /dev/null; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 20); do kill -0 "$pid" 2> /dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2> /dev/null && kill -9 "$pid"
    done
    if [ -e "$work/slurm.conf.before" ]; then mv "$work/slurm.conf.before" "$conf"; else rm -f "$conf"; fi
    [ $status -ne 0 ] && tail -n 20 "$work"/log/slurm*.log 2> /dev/null
    rm -rf "$work"
    echo "slurm test: daemons stopped (${pids[*]:-none}), $conf restored, exit status $status"
}
trap cleanup EXIT

say "starting munged, slurmctld, slurmd (logs in $work/log)"
mkdir -p "$work"/{munge,state,spool,log}
chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
chmod 711 "$work/munge"
munged --foreground --force --socket="$work/munge/socket" --key-file="$work/munge/munge.key" \
    --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/seed" \
    --log-file="$work/log/munged.log" > "$work/log/munged.out" 2>&1 &
pids+=($!)
node=$(hostname -s)
cpus=$(slurmd -C | grep -o 'CPUs=[0-9]*' | cut -d= -f2)
memory=$(slurmd -C | grep -o 'RealMemory=[0-9]*' | cut -d= -f2)
[ -e "$conf" ] && cp -p "$conf" "$work/slurm.conf.before"
mkdir -p "$(dirname "$conf")"
cat > "$conf" << EOF
# written by .ci/slurm_test.sh (removed when it ends)
ClusterName=ci
SlurmctldHost=$node(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$work/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=${NODE_CPUS:-$cpus} RealMemory=$memory State=UNKNOWN
# not the default partition: jobs must name it (BLOCKCOUPLING_SLURM_PARTITION)
PartitionName=ci Nodes=ALL Default=NO MaxTime=INFINITE State=UP
EOF
slurmctld -D -i > "$work/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D > "$work/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 60); do
    [ "$(sinfo -h -p ci -o %t 2> /dev/null)" = idle ] && break
    sleep 1
done
[ "$(sinfo -h -p ci -o %t)" = idle ] || fail "the node did not come up: $(sinfo 2>&1 | tail -n 1)"
say "node $node (${NODE_CPUS:-$cpus} CPUs, $memory MB) idle in partition ci"
