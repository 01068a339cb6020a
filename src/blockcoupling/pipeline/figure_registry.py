"""The figures of the report as plain data (no matplotlib: the workflow builds one rule per
entry when it parses the DAG, and ``figures.render`` draws them).

``FIGURES``: name -> (report category, input file, options it takes, statistics tables its titles
read: its own statistics table first, then ``CLAIMS_TABLE`` where ``CLAIM_FIGURES`` ties a claims
row to it). A figure is made when its input file is one of the config's outputs; a statistics
table it reads is an input when the config produces it (else the titles say there is no row).
Adding one: its function in ``blockcoupling.figures`` (named as the figure, taking (data, path,
claims=None) or an adapter in ``render``), a line here, and its caption report/<name>.rst.

``CLAIM_FIGURES``: every claims row (its analysis id, ``stats.claims.CLAIMS``) -> the figure that
draws its measure; that figure quotes the row as claims.csv has it (``figures.quotes.claims_note``).
A new claims row needs one entry here (tests/test_figures.py fails on a row without one).
"""

from __future__ import annotations

# The claims table: a figure that draws a claim's measure quotes its row (estimate, interval, p,
# Holm p, verdict) from here, in claims.md's digits, where the run has one.
CLAIMS_TABLE = "results/stats/claims.csv"

# Every claims row (analysis id) -> the figure that draws its measure.
CLAIM_FIGURES: dict[str, str] = {
    "fixed_size_trained_vs_random": "calibration",
    "fixed_size_excess_vs_bpb": "coupling_vs_score",
    "fixed_size_excess_vs_bpb_rank_adjusted": "coupling_vs_score",
    "fixed_size_coupling_vs_bpb_rank_adjusted": "coupling_vs_score",
    "fixed_size_excess_vs_gap_rank_adjusted": "coupling_vs_score",
    "crossmodel_coupling_vs_score": "coupling_vs_score",
    "emergence_final_vs_init": "coupling_vs_step",
    "emergence_relaxation": "coupling_vs_step",
    "emergence_locality": "coupling_vs_step",
    "emergence_within_loss": "coupling_vs_validation_loss",
    "emergence_within_arms": "coupling_vs_validation_loss",
    "emergence_lss_final_vs_init": "trajectory_metrics_vs_step",
    "emergence_expodistance_final_vs_init": "trajectory_metrics_vs_step",
    "crossmodel_coupling_vs_size": "hyperparameter_correlations",
    "tokens_self_trained_vs_random": "token_heatmaps",
    "tokens_context_trained_vs_random": "token_heatmaps",
    "vit_sd_effect": "vit_coupling_vs_sd",
    "vit_accuracy_within_rate": "vit_coupling_vs_accuracy",
}


def claim_rows(figure: str) -> list[str]:
    """The analysis ids of the claims rows figure ``figure`` quotes (CLAIM_FIGURES' order)."""
    return [analysis for analysis, drawn in CLAIM_FIGURES.items() if drawn == figure]


_FIGURES: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "coupling_vs_score": (
        "cross-model",
        "results/stats/summary.csv",
        (),
        ("results/stats/correlations.csv", "results/stats/fixed_size_runs.csv"),
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
    "calibration": ("cross-model", "results/stats/calibration.csv", (), ()),
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
        ("results/stats/vit_sd_trend.csv",),
    ),
    "vit_coupling_vs_accuracy": (
        "ViT sweep",
        "results/stats/vit_models.csv",
        (),
        ("results/stats/vit_coupling_vs_accuracy.csv",),
    ),
}

# A figure that quotes claims rows also reads the claims table, and the selection (its K).
FIGURES = {
    name: (
        (category, source, tuple(dict.fromkeys((*takes, "selection"))), (*tables, CLAIMS_TABLE))
        if claim_rows(name)
        else (category, source, takes, tables)
    )
    for name, (category, source, takes, tables) in _FIGURES.items()
}

# Each figure rule's docstring (``snakemake --list-rules``): what it draws, and the paper figure
# it corresponds to (its number or LaTeX label, as its caption's first sentence names it).
DOCS: dict[str, tuple[str, str]] = {
    "coupling_vs_score": ("the score against each coupling measure", "Figure 1a"),
    "hyperparameter_correlations": (
        "r of coupling, size, depth, width with the score",
        "fig:correlation_hyperparams",
    ),
    "depth_heatmaps": ("m_K of every block pair, per model", "Figure 3"),
    "token_heatmaps": ("coupling across tokens", "Figure 4, fig:coupling_fixedin/out"),
    "lss_expodistance": ("LSS and expodistance of the trajectories", "figs:lss-expo"),
    "pca_trajectories": ("the trajectories' top principal components", "figs:pca"),
    "singular_value_spectra": ("the block Jacobians' spectra", "fig:svalues_trained"),
    "k_sweep_curve": ("the correlation with the score against K", "fig:alignment_vary_k"),
    "calibration": ("raw coupling beside its chance level, excess, rank", "no figure"),
    "coupling_vs_step": ("coupling over the checkpoints trained here", "Figure 1b"),
    "depth_heatmaps_over_training": ("m_K heatmaps at three checkpoints", "Figures 1c-e"),
    "trajectory_metrics_vs_step": ("LSS and expodistance over training", "figs:lss-training"),
    "coupling_vs_validation_loss": ("coupling against validation loss", "no figure, Section 5.3"),
    "vit_coupling_vs_sd": ("ViT coupling against stochastic depth", "figure:coupling_vitb"),
    "vit_coupling_vs_accuracy": ("ViT accuracy against coupling", "figure:coupling_vita"),
}


def doc(name: str) -> str:
    """Figure ``name``'s rule docstring, e.g. 'Draw WHAT (paper: Figure 1a).'."""
    what, paper = DOCS[name]
    return f"Draw {what} (paper: {paper})."
