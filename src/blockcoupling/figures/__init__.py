"""Figures (seaborn/matplotlib, Agg backend) from the combined datasets and the `stats` tables.

Every public function takes its data, a path (a stem, or a .png/.pdf path), and options; it writes a
PNG (dpi 150) and a PDF side by side, byte-reproducible, and returns their paths. Missing values
(NaN) are dropped per panel. Estimates, intervals and p values in titles are read from the
statistics tables, never computed here. Modules: `common` (style, saving, labels, the coupling
measures and their null levels, statistics text), `crossmodel`, `heatmaps`, `trajectories`,
`checkpoints`, `vit`, `calibration`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from blockcoupling.figures.calibration import calibration
from blockcoupling.figures.checkpoints import (
    coupling_vs_step,
    coupling_vs_validation_loss,
    depth_heatmaps_over_training,
    pick_steps,
    trajectory_metrics_vs_step,
)
from blockcoupling.figures.common import save, style
from blockcoupling.figures.crossmodel import (
    coupling_vs_score,
    hyperparameter_correlations,
    k_sweep_curve,
)
from blockcoupling.figures.heatmaps import depth_heatmaps, token_heatmaps
from blockcoupling.figures.trajectories import (
    lss_expodistance,
    pca_trajectories,
    singular_value_spectra,
)
from blockcoupling.figures.vit import vit_coupling_vs_accuracy, vit_coupling_vs_sd
from blockcoupling.files.io import read_netcdf
from blockcoupling.pipeline.figure_registry import FIGURES, claim_rows
from blockcoupling.stats.core import select
from blockcoupling.stats.selection import Selection

__all__ = [
    "FIGURES",
    "calibration",
    "coupling_vs_score",
    "coupling_vs_step",
    "coupling_vs_validation_loss",
    "depth_heatmaps",
    "depth_heatmaps_over_training",
    "hyperparameter_correlations",
    "k_sweep_curve",
    "lss_expodistance",
    "pca_trajectories",
    "pick_steps",
    "render",
    "save",
    "singular_value_spectra",
    "style",
    "token_heatmaps",
    "trajectory_metrics_vs_step",
    "vit_coupling_vs_accuracy",
    "vit_coupling_vs_sd",
]

# The figures (name -> category, input, options, tables): pipeline.figure_registry.FIGURES.
# The keyword under which each figure function takes each statistics table (by file stem) it
# reads beside its input.
TABLE_KEYWORDS = {
    "coupling_vs_score": {"correlations": "correlations", "fixed_size_runs": "fixed_size_runs"},
    "coupling_vs_validation_loss": {"checkpoint_correlations": "correlations"},
    "vit_coupling_vs_sd": {"vit_sd_trend": "trend"},
    "vit_coupling_vs_accuracy": {"vit_coupling_vs_accuracy": "within"},
}


def render(
    name: str,
    source: str | Path,
    path: str | Path,
    selection: Selection | None = None,
    token_model: str | None = None,
    tables: Sequence[str | Path] = (),
) -> list[Path]:
    """Draw figure ``name`` of FIGURES from its input file ``source`` (CSV or NetCDF) at ``path``;
    ``selection`` (k, reading, variant, norm) and ``token_model`` as FIGURES says it takes;
    ``tables``: the statistics tables (CSV) its titles read, those the run produced (a
    ``claims.csv`` as ``claims=``, the other as FIGURES' keyword for it); a figure that quotes
    claims rows (``figure_registry.CLAIM_FIGURES``) also gets the selection's K as ``k=``.
    """
    if name not in FIGURES:
        raise ValueError(f"no figure named {name!r}; one of {', '.join(FIGURES)}")
    data = pd.read_csv(source) if str(source).endswith(".csv") else read_netcdf(source)
    at = dict(selection or {})
    extra = {
        "claims" if Path(table).name == "claims.csv" else TABLE_KEYWORDS[name][Path(table).stem]: (
            pd.read_csv(table)
        )
        for table in tables
    }
    adapters = {
        "depth_heatmaps": lambda: depth_heatmaps(select(data["depth_mis"], **at), path),
        "depth_heatmaps_over_training": lambda: depth_heatmaps_over_training(
            select(data["depth_mis"], **at), path
        ),
        "token_heatmaps": lambda: token_heatmaps(
            data, path, model=token_model, claims=extra.get("claims"), **at
        ),
        "pca_trajectories": lambda: pca_trajectories(data, path, model=token_model),
        "singular_value_spectra": lambda: singular_value_spectra(data, path, model=token_model),
    }
    if claim_rows(name):  # its claims note states the K of the claims it quotes
        extra["k"] = at.get("k")
    return adapters.get(name, lambda: globals()[name](data, path, **extra))()
