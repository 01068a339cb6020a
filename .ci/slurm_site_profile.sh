#!/usr/bin/env bash
# A site's own Slurm profile with the workflow, on a real one-node Slurm (.ci/slurm_cluster.sh):
# a profile `site` in a temporary $HOME/.config/snakemake (executor slurm, an account, a QoS in
# the plugin's own option, the partition as the plugin's own resource, a short default runtime
# and memory), no BLOCKCOUPLING_SLURM_* variable, runs the smoke prompts job and one training
# job through sbatch, and each sbatch line carries the site's account and QoS with the
# workflow's own memory and runtime, not the site's defaults (what --profile slurm asks:
# tests/test_slurm.py compares the two profiles' requests job by job). Stops every daemon it
# started on exit.
#   .ci/slurm_site_profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
name="site profile test"
. .ci/slurm_cluster.sh  # a one-node Slurm, stopped on exit

home=$work/home
mkdir -p "$home/.config/snakemake/site"
write_profile() {  # the site's profile; $1: its status command line (or nothing)
    cat > "$home/.config/snakemake/site/config.yaml" << PROFILE
executor: slurm
jobs: 4
slurm-qos: normal
$1
slurm-init-seconds-before-status-checks: 2
default-resources:
  slurm_account: "'siteacct'"
  slurm_partition: ci
  runtime: 5
  mem_mb: 1000
PROFILE
}
unset XDG_CONFIG_HOME BLOCKCOUPLING_SLURM_PARTITION BLOCKCOUPLING_SLURM_ACCOUNT BLOCKCOUPLING_SLURM_STATUS
prompts=results/prompts/default.jsonl
train=results/train/fixed_size-f0.5-s0/history.csv
write_profile ""
say "the site profile without a status command (sacct: $(sacct -X -n 2>&1 | head -n 1))"
if HOME=$home "$repo/.venv/bin/snakemake" --profile site --configfile config/smoke.yaml \
    --directory "$work/nostatus" "$prompts" > "$work/nostatus.log" 2>&1; then
    fail "the run without a status command went on where sacct cannot answer"
fi
grep -q "^slurm: .*slurm-status-command: squeue" "$work/nostatus.log" \
    || { tail -n 20 "$work/nostatus.log"; fail "no one-line stop naming slurm-status-command"; }
[ -z "$(squeue -h -o %i)" ] && [ ! -s "$work/jobcomp.log" ] || fail "a job was submitted"
say "stopped before its first job: $(grep '^slurm: ' "$work/nostatus.log")"
write_profile "slurm-status-command: squeue"
say "the site profile from \$HOME/.config/snakemake/site, targets $prompts $train"
HOME=$home "$repo/.venv/bin/snakemake" --profile site --configfile config/smoke.yaml \
    --directory "$work/run" --verbose "$prompts" "$train" > "$work/run.log" 2>&1 \
    || { tail -n 30 "$work/run.log"; fail "the run failed"; }
# each job's sbatch line: the site's account, partition and QoS, the workflow's runtime and memory
check_line() {  # RULE PART...
    local rule=$1 line
    shift
    line=$(grep -o "sbatch call: .*" "$work/run.log" | grep -- "rule_$rule" | head -n 1)
    [ -n "$line" ] || { tail -n 30 "$work/run.log"; fail "no sbatch call of $rule in the log"; }
    echo "$line" | cut -c 1-400
    for part in "-A siteacct" "-p ci" "--qos=normal" "$@"; do
        case "$line " in *" $part "*) ;; *) fail "the sbatch line of $rule lacks '$part'" ;; esac
    done
    case "$line" in *"-C "*) fail "the sbatch line of $rule has a constraint" ;; esac
}
check_line sample_prompts "-t 60" "--mem 2000"
check_line train_fixed_size_f0_5_s0 "-t 60" "--mem 4000"
[ -s "$work/run/$prompts" ] || fail "$prompts was not written"
[ -s "$work/run/$train" ] || fail "$train was not written"
grep -q "JobState=COMPLETED" "$work/jobcomp.log" || fail "no job COMPLETED in the jobcomp log"
say "passed: the site's account and QoS with the workflow's memory and runtime (not its 5 min)"
