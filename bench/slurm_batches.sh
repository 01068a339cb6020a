#!/usr/bin/env bash
# Single jobs against batches (BLOCKCOUPLING_SLURM_BATCH) on a real one-node Slurm: the smoke DAG
# through the shipped profile, once with every job its own Slurm job and once with the short CPU
# jobs in batches, on the same cluster, each from an empty folder; prints each run's wall time,
# its Slurm jobs and the ratio. Root on Debian (.ci/slurm_cluster.sh installs and starts Slurm).
#   bench/slurm_batches.sh [BATCH]   BATCH: jobs per batch, or node (default)
#   NODE_CPUS=8 bench/slurm_batches.sh   declare 8 CPUs (oversubscribes a smaller machine)
set -euo pipefail
cd "$(dirname "$0")/.."
snakemake=$PWD/.venv/bin/snakemake
name="slurm batches"
. .ci/slurm_cluster.sh
export BLOCKCOUPLING_SLURM_PARTITION=ci
declare -A seconds jobs
for batch in 1 "${1:-node}"; do
    t0=$SECONDS
    BLOCKCOUPLING_SLURM_BATCH=$batch "$snakemake" --profile slurm --configfile config/smoke.yaml \
        --directory "$work/batch-$batch" --slurm-init-seconds-before-status-checks 2 \
        > "$work/batch-$batch.log" 2>&1 || fail "BATCH=$batch: $(tail -n 5 "$work/batch-$batch.log")"
    seconds[$batch]=$((SECONDS - t0))
    jobs[$batch]=$(grep -c 'submitted with SLURM jobid' "$work/batch-$batch.log")
    say "BATCH=$batch: ${seconds[$batch]} s, ${jobs[$batch]} Slurm jobs"
done
batch=${1:-node}
echo "batches/single wall time: $(awk -v a="${seconds[$batch]}" -v b="${seconds[1]}" 'BEGIN {printf "%.2f", a / b}') (${seconds[$batch]} s / ${seconds[1]} s), Slurm jobs ${jobs[$batch]} / ${jobs[1]}"
