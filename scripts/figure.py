"""Rules figure_<name>: one figure (PNG + PDF) from combined datasets or stats tables."""

import pandas as pd

from blockcoupling import figures
from blockcoupling.io import read_netcdf
from blockcoupling.stats import select
from blockcoupling.workflow import run_script, selection


def main(sm):
    name, spec, path = sm.params.figure, sm.params.stats, sm.output.png
    at = selection(spec)
    source = sm.input[0]
    data = pd.read_csv(source) if source.endswith(".csv") else read_netcdf(source)
    if name == "coupling_vs_score":
        figures.coupling_vs_score(data, path)
    elif name in (
        "hyperparameter_correlations",
        "k_sweep_curve",
        "coupling_vs_step",
        "trajectory_metrics_vs_step",
        "coupling_vs_validation_loss",
    ):
        getattr(figures, name)(data, path)
    elif name in ("depth_heatmaps", "depth_heatmaps_over_training"):
        getattr(figures, name)(select(data["depth_mis"], **at), path)
    elif name == "token_heatmaps":
        figures.token_heatmaps(data, path, model=sm.params.token_model, **at)
    elif name == "lss_expodistance":
        figures.lss_expodistance(data, path)
    elif name in ("pca_trajectories", "singular_value_spectra"):
        getattr(figures, name)(data, path, model=sm.params.token_model)
    else:
        raise ValueError(f"no figure named {name!r}")


run_script(snakemake, main)
