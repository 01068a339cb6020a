"""Rule vit_stats: per-model coupling and accuracy, coupling vs stochastic depth, coupling vs
accuracy at a fixed rate, and the sweep's designed tests (tidy CSVs under
results/stats/vit_*.csv)."""

from blockcoupling.files.io import read_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import core, vit


def main(sm):
    combined = read_netcdf(sm.input[0])
    selection, boot = sm.params.selection, sm.params.bootstrap
    models = vit.vit_model_table(combined, selection, boot)
    runs = vit.vit_run_table(combined, selection)
    frames = {
        "vit_models": models,
        "vit_coupling_vs_sd": vit.vit_coupling_by_rate(combined, selection, boot),
        "vit_sd_trend": vit.vit_sd_trend(models),
        "vit_coupling_vs_accuracy": vit.vit_coupling_accuracy(models),
        "vit_runs": runs,
        "vit_analyses": vit.vit_analyses(runs, sm.params.primary),
    }
    for name, frame in frames.items():
        core.write_table(frame, sm.output[name])


run_script(snakemake, main)
