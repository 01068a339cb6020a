"""Rule stats_summary: per-model coupling (raw and calibrated) with percentile bootstrap CIs
over prompts (summary.csv, model_coupling.nc): the only cross-model outputs that stats.n_boot
changes."""

from blockcoupling.files.io import read_netcdf, write_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import core, crossmodel


def main(sm):
    selection, boot = sm.params.selection, sm.params.bootstrap
    coupling = read_netcdf(sm.input.coupling)
    evaluation = read_netcdf(sm.input.evaluation[0]) if sm.input.evaluation else None
    per_model = crossmodel.model_coupling(coupling, selection, boot)
    table = crossmodel.model_table(per_model, evaluation, score=sm.params.score)
    table = crossmodel.with_calibrated(table, coupling, selection, boot)
    core.write_table(table, sm.output.summary)
    write_netcdf(per_model, sm.output.model_coupling)


run_script(snakemake, main)
