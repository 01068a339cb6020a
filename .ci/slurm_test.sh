#!/usr/bin/env bash
# A real Slurm on this machine, then the smoke DAG through the shipped profile, as a user runs it:
#   BLOCKCOUPLING_SLURM_PARTITION=ci snakemake --profile slurm --configfile config/smoke.yaml
# Installs slurm-wlm and munge (Debian packages; root), writes a one-node slurm.conf for localhost
# (jobcomp/filetxt logs every job; no accounting database, so the profile polls with squeue),
# starts munged, slurmctld and slurmd, and checks that
#   - every job of the DAG went through sbatch, the short CPU jobs in batches of the profile's
#     group width (each Slurm job the jobcomp log records COMPLETED),
#   - a extract_run_* job killed with scancel says CANCELLED in its Slurm log, is resubmitted
#     (retries: 1) with twice its runtime (sbatch's -t) and the run completes,
#   - the results equal a local run of the same config (.ci/compare_results.py),
#   - a rerun does nothing, and a run whose models need GPUs the partition lacks (config/paper.yaml)
#     stops before any job with one line,
#   - the fetch stage against a local hub (tests/hub_server.py): hub revisions and a prompt
#     dataset fetched by local rules, every compute job through sbatch with the hub offline,
#     checkpoint revisions deleted in turn within hub.max_revisions (tests/hub_server.py check),
#   - an emptied and a deleted revision folder each stop in one line, and fetch-ahead
#     (hub.max_revisions: all) then a run through sbatch with the hub stopped finishes.
# On exit, even a failed one, it cancels its jobs, stops every daemon it started by PID, and puts
# /etc/slurm/slurm.conf back as it was.
#   .ci/slurm_test.sh [LOCAL_RUN]   LOCAL_RUN: a finished local smoke run (`snakemake --cores 2
#                                   --configfile config/smoke.yaml --directory LOCAL_RUN`); made
#                                   here when not given
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
snakemake=$repo/.venv/bin/snakemake
python=$repo/.venv/bin/python
name="slurm test"
. .ci/slurm_cluster.sh  # a one-node Slurm, stopped on exit

local_run=${1:-}
if [ -z "$local_run" ]; then
    local_run=$work/local
    say "local smoke run for the comparison"
    "$snakemake" --cores "$cpus" --configfile config/smoke.yaml --directory "$local_run" --quiet progress
fi

# The documented settings: the partition (ci is not the default). The status command is left to
# the profile (squeue: Slurm keeps no accounting here); the plugin's first poll comes after 2 s
# instead of 40 s (a flag of the plugin; jobs here last seconds).
export BLOCKCOUPLING_SLURM_PARTITION=ci
slurm_run=$work/slurm
run=("$snakemake" --profile slurm --configfile config/smoke.yaml --directory "$slurm_run"
    --slurm-init-seconds-before-status-checks 2)
dry=$("${run[@]}" -n --quiet rules)
run+=(--verbose)  # the log shows each sbatch call: the retry's runtime is checked below
planned=$(echo "$dry" | awk '$1 == "total" {n = $2} END {print n}')
# Slurm jobs: local rules (all, vit_data, the fetch stage) run here; with BLOCKCOUPLING_SLURM_BATCH
# the short CPU jobs go in batches of the profile's group width (slurm.slurm_jobs); + 1: the retry
width=$("$python" -c 'from blockcoupling.pipeline.slurm import SlurmSettings; print(SlurmSettings.from_env().group_width())')
expected=$(echo "$dry" | "$python" -c '
import sys
from blockcoupling.pipeline.slurm import slurm_jobs
local = {"all", "vit_data", "fetch", "fetch_model", "fetch_checkpoint", "fetch_dataset", "total"}
rows = [line.split() for line in sys.stdin]
counts = {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}
print(slurm_jobs({rule: n for rule, n in counts.items() if rule not in local}, int(sys.argv[1])) + 1)
' "$width")
batches=$([ "$width" -gt 1 ] && echo "short CPU jobs $width to a Slurm job" || echo "each job its own Slurm job")
say "running the smoke DAG through Slurm: $planned jobs, $expected sbatch submissions (local rules aside, $batches, one retry)"
run_start=$SECONDS
"${run[@]}" > "$work/run.log" 2>&1 &
run_pid=$!
cancelled=""
for _ in $(seq 1200); do
    read -r cancelled cancelled_rule < <(squeue -h -t RUNNING -o '%i %k' | awk '$2 ~ /^rule_extract_run_/ {line = $0} END {print line}' || true) || true
    [ -n "$cancelled" ] && break
    kill -0 "$run_pid" 2> /dev/null || break
    sleep 0.5
done
[ -n "$cancelled" ] || fail "no extract_run job was seen running: $(tail -n 5 "$work/run.log")"
scancel "$cancelled"
say "cancelled Slurm job $cancelled ($(grep -o "jobid $cancelled .*" "$work/run.log" || true))"
if ! timeout 1800 tail --pid="$run_pid" -f /dev/null; then fail "the Slurm run hangs"; fi
wait "$run_pid" || fail "the Slurm run failed: $(tail -n 20 "$work/run.log")"
run_pid=""
say "the Slurm run finished in $((SECONDS - run_start)) s"

submitted=$(grep -o 'submitted with SLURM jobid [0-9]*' "$work/run.log" | awk '{print $NF}' || true)
completed=$(grep -o 'JobId=[0-9]* .*JobState=COMPLETED' "$work/jobcomp.log" | sed 's/ .*//; s/JobId=//' || true)
[ "$(echo "$submitted" | wc -l)" -eq "$expected" ] \
    || fail "$(echo "$submitted" | wc -l) sbatch submissions, expected $expected (local jobs aside, batches, + 1 retry)"
for id in $submitted; do
    [ "$id" = "$cancelled" ] && continue
    echo "$completed" | grep -qx "$id" || fail "Slurm job $id is not COMPLETED in the jobcomp log"
done
grep -q "JobId=$cancelled .*JobState=CANCELLED" "$work/jobcomp.log" \
    || fail "job $cancelled is not CANCELLED in the jobcomp log"
grep -q "Trying to restart job" "$work/run.log" || fail "Snakemake did not resubmit the cancelled job"
# the retry asks what the rule says: runtime x attempt (rules/runs.smk, JobRequests.own)
times=$(grep -o "sbatch call: .*" "$work/run.log" | grep -E -- "--comment '?$cancelled_rule'?( |$)" | grep -o -- " -t [0-9']*" | tr -dc '0-9\n' || true)
[ "$(echo "$times" | wc -l)" -eq 2 ] || fail "expected 2 sbatch calls of $cancelled_rule, got: $times"
first=$(echo "$times" | head -n 1)
[ "$(echo "$times" | tail -n 1)" -eq $((2 * first)) ] \
    || fail "the retry of $cancelled_rule asked -t $(echo "$times" | tail -n 1), not twice -t $first"
say "$cancelled_rule: -t $first, its retry -t $((2 * first))"
# Slurm's own line, or the job's (blockcoupling.runtime.runner) where its script had started
grep -rqsE "JOB $cancelled ON .* CANCELLED|CANCELLED \(SIGTERM to Slurm job $cancelled" \
    "$slurm_run/.snakemake/slurm_logs" || fail "the cancelled job's Slurm log does not say CANCELLED"
say "every job went through sbatch: $((expected - 1)) submissions completed + job $cancelled cancelled and resubmitted"

"$python" .ci/compare_results.py "$local_run" "$slurm_run" || fail "the results differ from the local run"
"$repo/.venv/bin/blockcoupling" verify "$slurm_run/results" || fail "the Slurm run's results do not match their records"

lines=$(wc -l < "$work/jobcomp.log")
"${run[@]}" > "$work/rerun.log" 2>&1 || fail "the rerun failed: $(tail -n 5 "$work/rerun.log")"
grep -q "Nothing to be done" "$work/rerun.log" || fail "the rerun ran jobs: $(tail -n 5 "$work/rerun.log")"
[ "$(wc -l < "$work/jobcomp.log")" -eq "$lines" ] || fail "the rerun submitted jobs"
say "a rerun does nothing"

if "$snakemake" --profile slurm --configfile config/paper.yaml --directory "$work/paper" \
    > "$work/paper.log" 2>&1; then fail "the paper suite ran on a partition without GPUs"; fi
grep -q "^slurm: models\..* needs [0-9]* GPU(s) .* partition ci has at most 0" "$work/paper.log" \
    || fail "the paper suite did not stop with one line: $(tail -n 5 "$work/paper.log")"
[ "$(wc -l < "$work/jobcomp.log")" -eq "$lines" ] || fail "the paper suite submitted jobs"
say "models needing GPUs stop before any job: $(grep '^slurm: ' "$work/paper.log")"
# The fetch stage as on a cluster whose nodes have no internet: a local hub on 127.0.0.1
# (tests/hub_server.py, stopped with the daemons) serves a tiny GPT-NeoX at revisions step0,
# step16 and main and a tiny ARC set; the fetch rules run here (local rules), every other job
# goes through sbatch with the hub offline, one checkpoint revision on disk at a time.
hub_run=$work/hub
read -ra hub_targets <<< "$("$python" tests/hub_server.py build "$work/hub_repos" "$hub_run" | tail -n 1)"
"$python" tests/hub_server.py serve "$work/hub_repos" "$work/hub_endpoint" "$work/hub_requests.log" \
    --lifetime 900 > "$work/log/hub.out" 2>&1 &
pids+=($!)
for _ in $(seq 60); do [ -s "$work/hub_endpoint" ] && break; sleep 0.5; done
[ -s "$work/hub_endpoint" ] || fail "the local hub did not start: $(tail -n 3 "$work/log/hub.out")"
hub=("$snakemake" "${hub_targets[@]}" --profile slurm --configfile "$hub_run/config.yaml"
    --directory "$hub_run" --slurm-init-seconds-before-status-checks 2)
offline=$("${hub[@]}" -n --quiet rules | awk '$1 == "job" {n = 0} $1 == "sample_prompts" || $1 == "extract" {n += $2} END {print n}')
say "the fetch stage against a local hub: fetches here, $offline offline jobs through Slurm"
HF_ENDPOINT=$(cat "$work/hub_endpoint") HF_HOME=$work/hf_home "${hub[@]}" > "$work/hub.log" 2>&1 \
    || fail "the hub run failed: $(tail -n 20 "$work/hub.log")"
submitted=$(grep -c 'submitted with SLURM jobid' "$work/hub.log" || true)
[ "$submitted" -eq "$offline" ] || fail "$submitted sbatch submissions in the hub run, expected $offline"
fetched=$(grep -c '^localrule fetch_' "$work/hub.log" || true)
[ "$fetched" -eq 4 ] || fail "$fetched local fetch jobs, expected 4 (two checkpoints, main, ARC)"
"$python" tests/hub_server.py check "$hub_run" "$work/hub_requests.log" || fail "the hub run is wrong"
say "fetched on the login node, $submitted offline jobs through Slurm, checkpoints deleted in turn"

# Hub faults and fetch-ahead as a cluster user meets them: an emptied revision folder stops the
# dry run in one line, a deleted one with the hub stopped fails its (local) fetch rule in one
# line, and hub.max_revisions: all fetches everything first, then the compute jobs go through
# sbatch with the hub stopped (tests/test_fetch.py, through the profile).
BLOCKCOUPLING_TEST_THROUGH_SLURM=1 "$python" -m pytest -q -p no:cacheprovider -m slow \
    tests/test_fetch.py -k "emptied_or_deleted or fetch_ahead" > "$work/hub_faults.log" 2>&1 \
    || fail "hub faults / fetch-ahead through Slurm: $(tail -n 30 "$work/hub_faults.log")"
say "hub faults in one line and fetch-ahead with the hub stopped, through Slurm: $(tail -n 1 "$work/hub_faults.log")"
say "passed"
