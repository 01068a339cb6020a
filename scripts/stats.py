"""Rule stats: per-model coupling with bootstrap CIs; correlations, OLS, partial r, K sweep."""

from blockcoupling import stats
from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.runner import run_script


def main(sm):
    at = dict(sm.params.selection)
    k = at.pop("k")
    coupling = read_netcdf(sm.input.coupling)
    evaluation = read_netcdf(sm.input.evaluation[0]) if sm.input.evaluation else None
    per_model = stats.model_coupling(
        coupling, k=k, n_boot=sm.params.n_boot, seed=sm.params.seed, **at
    )
    table = stats.model_table(per_model, evaluation, score=sm.params.score)
    subsets = stats.table_subsets(table)  # all, base, and each family (e.g. the training grid)
    frames = {
        "summary": table,
        "correlations": stats.with_holm(stats.correlations(table, subsets=subsets)),
        "ols": stats.ols_fits(table, subsets=subsets),
        "partial": stats.with_holm(stats.partial_correlation(table, subsets=subsets)),
        "k_sweep": stats.k_sweep(coupling, table, subsets=subsets, **at),
    }
    for name, frame in frames.items():
        stats.write_table(frame, sm.output[name])
    write_netcdf(per_model, sm.output.model_coupling)


run_script(snakemake, main)
