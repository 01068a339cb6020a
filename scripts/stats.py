"""Rule stats: per-model coupling with bootstrap CIs; correlations, OLS, partial r, K sweep."""

from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.runner import run_script
from blockcoupling.stats import core, crossmodel


def main(sm):
    at = dict(sm.params.selection)
    k = at.pop("k")
    coupling = read_netcdf(sm.input.coupling)
    evaluation = read_netcdf(sm.input.evaluation[0]) if sm.input.evaluation else None
    per_model = crossmodel.model_coupling(
        coupling, k=k, n_boot=sm.params.n_boot, seed=sm.params.seed, **at
    )
    table = crossmodel.model_table(per_model, evaluation, score=sm.params.score)
    subsets = crossmodel.table_subsets(table)  # all, base, and each family (e.g. the training grid)
    frames = {
        "summary": table,
        "correlations": crossmodel.with_holm(crossmodel.correlations(table, subsets=subsets)),
        "ols": crossmodel.ols_fits(table, subsets=subsets),
        "partial": crossmodel.with_holm(crossmodel.partial_correlation(table, subsets=subsets)),
        "k_sweep": crossmodel.k_sweep(coupling, table, subsets=subsets, **at),
    }
    for name, frame in frames.items():
        core.write_table(frame, sm.output[name])
    write_netcdf(per_model, sm.output.model_coupling)


run_script(snakemake, main)
