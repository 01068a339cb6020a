"""Rule stats: correlations, OLS, partial r, K sweep (exploratory, across models); the
fixed-size design's run table and tests; the calibration and token-family tables. Point
estimates only: no number here depends on stats.n_boot (the bootstrap CIs are rule
stats_summary's)."""

import pandas as pd

from blockcoupling.files.io import read_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import calibration, core, crossmodel, fixed_size, tokens
from blockcoupling.stats.selection import POINT


def main(sm):
    selection = sm.params.selection
    coupling = read_netcdf(sm.input.coupling)
    evaluation = read_netcdf(sm.input.evaluation[0]) if sm.input.evaluation else None
    per_model = crossmodel.model_coupling(coupling, selection, POINT)  # the means only
    table = crossmodel.model_table(per_model, evaluation, score=sm.params.score)
    table = crossmodel.with_calibrated(table, coupling, selection, POINT)
    table = core.without_intervals(table)
    subsets = crossmodel.table_subsets(table)  # never pretrained pooled with a grid's runs
    predictors = crossmodel.table_predictors(table)
    correlations = crossmodel.correlations(table, predictors=predictors, subsets=subsets)
    history_of = dict(zip(sm.params.runs, sm.input.histories))
    histories = {model: pd.read_csv(history_of[run]) for model, run in sm.params.models.items()}
    runs = fixed_size.run_table(coupling, evaluation, histories, selection)
    primary = tuple(sm.params.primary)
    token_data = read_netcdf(sm.input.tokens[0]) if sm.input.tokens else None
    frames = {
        "correlations": crossmodel.with_holm(correlations),
        "ols": crossmodel.ols_fits(table, subsets=subsets),
        "partial": crossmodel.with_holm(crossmodel.partial_correlation(table, subsets=subsets)),
        "k_sweep": crossmodel.k_sweep(coupling, table, selection, subsets=subsets),
        "crossmodel_analyses": crossmodel.analysis_rows(correlations, primary),
        "fixed_size_runs": runs,
        "fixed_size": fixed_size.analyses(runs, primary),
        "calibration": calibration.calibration_table(coupling, sm.params.calibration_ks, selection),
        "token_analyses": tokens.token_analyses(token_data, selection, primary),
    }
    for name, frame in frames.items():
        core.write_table(frame, sm.output[name])


run_script(snakemake, main)
