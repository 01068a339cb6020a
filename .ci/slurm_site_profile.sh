#!/usr/bin/env bash
# A site's own Slurm profile with the workflow, on a real one-node Slurm (.ci/slurm_cluster.sh):
# a profile `site` in a temporary $HOME/.config/snakemake (executor slurm, an account, a QoS, the
# partition as the plugin's own resource), no BLOCKCOUPLING_SLURM_* variable, runs the smoke
# prompts job through sbatch, and the sbatch line carries the site's account and QoS with the
# workflow's own memory and runtime (what --profile slurm asks: tests/test_slurm.py compares the
# two profiles' requests job by job). Stops every daemon it started on exit.
#   .ci/slurm_site_profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export PYTHONPATH=$repo/src${PYTHONPATH:+:$PYTHONPATH}
start=$SECONDS
fail() { echo "site profile test FAILED: $*" >&2; exit 1; }
say() { echo "site profile test [$((SECONDS - start)) s]: $*"; }
[ "$(id -u)" = 0 ] || fail "run it as root (apt-get, /etc/slurm/slurm.conf, the daemons)"
for daemon in slurmctld slurmd; do
    if pgrep -x "$daemon" > /dev/null; then fail "a $daemon is running already; stop it first"; fi
done

. .ci/slurm_cluster.sh  # a one-node Slurm, stopped on exit

home=$work/home
mkdir -p "$home/.config/snakemake/site"
cat > "$home/.config/snakemake/site/config.yaml" << PROFILE
executor: slurm
jobs: 4
slurm-qos: normal
slurm-status-command: squeue
slurm-init-seconds-before-status-checks: 2
default-resources:
  slurm_account: "'siteacct'"
  slurm_partition: ci
PROFILE
unset XDG_CONFIG_HOME BLOCKCOUPLING_SLURM_PARTITION BLOCKCOUPLING_SLURM_ACCOUNT
target=results/prompts/default.jsonl
say "the site profile from \$HOME/.config/snakemake/site, target $target"
HOME=$home "$repo/.venv/bin/snakemake" --profile site --configfile config/smoke.yaml \
    --directory "$work/run" --verbose "$target" > "$work/run.log" 2>&1 \
    || { tail -n 30 "$work/run.log"; fail "the run failed"; }
line=$(grep -o "sbatch call: .*" "$work/run.log" | head -n 1)
[ -n "$line" ] || { tail -n 30 "$work/run.log"; fail "no sbatch call in the log"; }
echo "$line" | cut -c 1-400
for part in "-A siteacct" "-p ci" "-t 60" "--mem 2000" "--qos=normal"; do
    case "$line" in *"$part"*) ;; *) fail "the sbatch line lacks '$part'" ;; esac
done
[ -s "$work/run/$target" ] || fail "$target was not written"
grep -q "JobState=COMPLETED" "$work/jobcomp.log" || fail "no job COMPLETED in the jobcomp log"
say "passed: the site's account and QoS with the workflow's memory and runtime"
