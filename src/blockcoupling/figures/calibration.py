"""The calibration figure: per model, raw coupling beside its chance level, the calibrated excess,
the overlap against K/d and the Jacobians' effective rank against K (the reading of the study
rests on it: raw m_K has a chance level that moves with d, K and the spectrum).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from blockcoupling.figures.common import label, no_data, require_columns, save, style
from blockcoupling.figures.quotes import add_claims_note

# (column, its chance level: a column or a constant, x label) of each panel, left to right
PANELS = (
    ("coupling", "coupling_null", "coupling"),
    ("coupling_excess", 0.0, "coupling_excess"),
    ("overlap_u", "overlap_null", "overlap_u"),
    ("effective_rank", "k", "effective rank of the block Jacobians\n(median; chance mark: K)"),
)
INITS = {"trained": ("o", "C0"), "random": ("s", "C1")}


def calibration(
    table: pd.DataFrame, path: str | Path, claims: pd.DataFrame | None = None, k: object = None
) -> list[Path]:
    """One row of panels per K of ``table`` (a ``stats.calibration`` table): per model (y),
    its raw coupling, calibrated excess, overlap and effective rank (x) for each init (marker),
    each beside its chance level (grey ``|``: ``coupling_null``, 0, K/d, and K for the rank).
    Under the grid: the trained-vs-twin claim's row of ``claims``, at the claims' K ``k``.
    """
    require_columns(table, ["model", "init", "k", "coupling"])
    panels = [p for p in PANELS if p[0] in table.columns]
    ks = sorted(table["k"].dropna().unique())
    models = list(dict.fromkeys(table["model"]))
    height = 0.22 * len(models) + 1.6
    with style():
        fig, axes = plt.subplots(
            len(ks),
            len(panels),
            figsize=(3.0 * len(panels) + 2.2, height * len(ks)),
            sharey=True,
            squeeze=False,
            layout="constrained",
        )
        for r, row_k in enumerate(ks):
            rows = table[table["k"] == row_k]
            for c, (column, chance, xlabel) in enumerate(panels):
                ax = axes[r, c]
                _panel(ax, rows, models, column, chance)
                ax.set_xlabel(label(xlabel) if xlabel in table.columns else xlabel)
                ax.set_title(f"K = {int(row_k)}", fontsize="small")
            axes[r, 0].set_yticks(range(len(models)), models, fontsize="x-small")
            axes[r, 0].set_ylim(len(models) - 0.5, -0.5)
        fig.legend(handles=_handles(table), loc="outside right upper", frameon=False)
        chance = "grey |, the Gaussian null's coupling, 0 for the excess, K/d, K for the rank"
        add_claims_note(fig, claims, "calibration", k, chance)
        return save(fig, path)


def _panel(
    ax: plt.Axes, rows: pd.DataFrame, models: list[str], column: str, chance: str | float
) -> None:
    """One panel: each model's value per init, and its chance level behind it."""
    data = rows.dropna(subset=[column])
    if data.empty:
        no_data(ax)
        return
    y = data["model"].map({m: i for i, m in enumerate(models)}).to_numpy(dtype=float)
    if isinstance(chance, float):
        ax.axvline(chance, color="0.6", ls="--", lw=0.8, zorder=0)
    elif chance in data.columns:
        ax.scatter(data[chance], y, marker="|", color="0.55", s=80, lw=1.2, zorder=1)
    for init, (marker, color) in INITS.items():
        part = data["init"] == init
        ax.scatter(
            data.loc[part, column], y[part.to_numpy()], marker=marker, color=color, s=18, zorder=2
        )
    other = ~data["init"].isin(list(INITS))
    if other.any():
        ax.scatter(data.loc[other, column], y[other.to_numpy()], marker="^", color="C2", s=18)
    ax.margins(x=0.1)
    ax.grid(axis="y", alpha=0.3)


def _handles(table: pd.DataFrame) -> list[Line2D]:
    """Legend entries: each init the table has, and the chance mark."""
    handles = [
        Line2D([], [], ls="", marker=marker, color=color, label=f"{init} model")
        for init, (marker, color) in INITS.items()
        if (table["init"] == init).any()
    ]
    if (~table["init"].isin(list(INITS))).any():
        handles.append(Line2D([], [], ls="", marker="^", color="C2", label="other init"))
    chance = "chance level (0 for the excess: dashed)"
    return [*handles, Line2D([], [], ls="", marker="|", color="0.55", ms=9, label=chance)]
