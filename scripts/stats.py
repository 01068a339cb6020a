"""Rule stats: per-model coupling with bootstrap CIs; correlations, OLS, partial r, K sweep."""

from pathlib import Path

from blockcoupling import stats
from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.workflow import run_script, selection


def main(sm):
    spec = sm.params.stats
    select = selection(spec, with_k=False)
    coupling = read_netcdf(sm.input.coupling)
    evaluation = read_netcdf(sm.input.evaluation) if sm.input.evaluation else None
    per_model = stats.model_coupling(
        coupling,
        k=spec.get("k", 10),
        n_boot=spec.get("n_boot", 1000),
        seed=spec.get("seed", 0),
        **select,
    )
    table = stats.model_table(per_model, evaluation, score=sm.params.score)
    frames = {
        "summary": table,
        "correlations": stats.correlations(table),
        "ols": stats.ols_fits(table),
        "partial": stats.partial_correlation(table),
        "k_sweep": stats.k_sweep(coupling, table, **select),
    }
    stats.write_tables(frames, Path(sm.output.summary).parent)
    write_netcdf(per_model, sm.output.model_coupling)


run_script(snakemake, main)
