"""The figures of the report as plain data (no matplotlib: the workflow builds one rule per
entry when it parses the DAG, and ``figures.render`` draws them).

``FIGURES``: name -> (report category, input file, options it takes, statistics tables its titles
read: its own statistics table first, then ``CLAIMS_TABLE`` where a panel draws a claim). A
figure is made when its input file is one of the config's outputs; a statistics table it reads
is an input when the config produces it (else the titles say there is no row). Adding one:
its function in ``blockcoupling.figures`` (named as the figure, taking (data, path) or an adapter
in ``render``), a line here, and its caption report/<name>.rst.
"""

from __future__ import annotations

# The claims table: a figure that draws a claim's measure quotes its row (estimate, interval, p,
# Holm p, verdict) from here, in claims.md's digits, where the run has one.
CLAIMS_TABLE = "results/stats/claims.csv"

FIGURES: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "coupling_vs_score": (
        "cross-model",
        "results/stats/summary.csv",
        (),
        ("results/stats/correlations.csv", CLAIMS_TABLE),
    ),
    "hyperparameter_correlations": (
        "cross-model",
        "results/stats/correlations.csv",
        (),
        (),
    ),
    "depth_heatmaps": ("cross-model", "results/combined/coupling.nc", ("selection",), ()),
    "token_heatmaps": (
        "cross-model",
        "results/combined/tokens.nc",
        ("selection", "token_model"),
        (),
    ),
    "lss_expodistance": ("cross-model", "results/combined/trajectories.nc", (), ()),
    "pca_trajectories": (
        "cross-model",
        "results/combined/trajectories.nc",
        ("token_model",),
        (),
    ),
    "singular_value_spectra": (
        "cross-model",
        "results/combined/spectra.nc",
        ("token_model",),
        (),
    ),
    "k_sweep_curve": ("cross-model", "results/stats/k_sweep.csv", (), ()),
    "coupling_vs_step": (
        "training emergence",
        "results/stats/checkpoint_table.csv",
        (),
        (),
    ),
    "depth_heatmaps_over_training": (
        "training emergence",
        "results/combined/checkpoints/coupling.nc",
        ("selection",),
        (),
    ),
    "trajectory_metrics_vs_step": (
        "training emergence",
        "results/stats/checkpoint_points.csv",
        (),
        (),
    ),
    "coupling_vs_validation_loss": (
        "training emergence",
        "results/stats/checkpoint_points.csv",
        (),
        ("results/stats/checkpoint_correlations.csv",),
    ),
    "vit_coupling_vs_sd": (
        "ViT sweep",
        "results/stats/vit_coupling_vs_sd.csv",
        (),
        ("results/stats/vit_sd_trend.csv", CLAIMS_TABLE),
    ),
    "vit_coupling_vs_accuracy": (
        "ViT sweep",
        "results/stats/vit_models.csv",
        (),
        ("results/stats/vit_coupling_vs_accuracy.csv", CLAIMS_TABLE),
    ),
}
