# One rule per figure; each PNG is registered in the HTML report with its caption
# (report/<figure>.rst). The figure's inputs decide whether the config enables it.
CROSS = "cross-model"
TRAINING = "training emergence"
FIGURES = {
    "coupling_vs_score": (CROSS, ["results/stats/summary.csv"]),
    "hyperparameter_correlations": (CROSS, ["results/stats/correlations.csv"]),
    "depth_heatmaps": (CROSS, ["results/combined/coupling.nc"]),
    "token_heatmaps": (CROSS, ["results/combined/tokens.nc"]),
    "lss_expodistance": (CROSS, ["results/combined/trajectories.nc"]),
    "pca_trajectories": (CROSS, ["results/combined/trajectories.nc"]),
    "singular_value_spectra": (CROSS, ["results/combined/spectra.nc"]),
    "k_sweep_curve": (CROSS, ["results/stats/k_sweep.csv"]),
    "coupling_vs_step": (TRAINING, ["results/stats/checkpoint_table.csv"]),
    "depth_heatmaps_over_training": (TRAINING, ["results/combined/checkpoints/coupling.nc"]),
    "trajectory_metrics_vs_step": (TRAINING, ["results/stats/checkpoint_table.csv"]),
    "coupling_vs_validation_loss": (TRAINING, ["results/stats/checkpoint_table.csv"]),
}
ENABLED_FIGURES = [
    name
    for name, (category, _) in FIGURES.items()
    if (category == CROSS and CROSS_MODEL) or (category == TRAINING and CHECKPOINT_MODELS)
]


def figure_targets():
    return [f"results/figures/{name}.png" for name in ENABLED_FIGURES]


for _figure in ENABLED_FIGURES:

    rule:
        name:
            f"figure_{_figure}"
        input:
            FIGURES[_figure][1],
        output:
            png=report(
                f"results/figures/{_figure}.png",
                caption=f"../report/{_figure}.rst",
                category=FIGURES[_figure][0],
            ),
            pdf=f"results/figures/{_figure}.pdf",
        log:
            f"logs/figures/{_figure}.log",
        benchmark:
            f"benchmarks/figures/{_figure}.tsv"
        conda:
            "../envs/analysis.yaml"
        params:
            figure=_figure,
            stats=STATS,
            token_model=config.get("figures", {}).get("token_model")
            or next(iter(CROSS_MODEL), None),
            code=FIGURE_CODE,
        script:
            "../scripts/figure.py"
