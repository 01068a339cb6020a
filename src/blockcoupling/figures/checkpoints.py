"""Checkpoint figures: coupling measures and trajectory metrics over training, m_K heatmaps at
early/middle/final steps, coupling against validation loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import xarray as xr
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize

from blockcoupling.figures.common import (
    ADJACENT,
    MARKERS,
    MIS_LABEL,
    STEP_LABEL,
    first_text,
    label,
    measures,
    no_data,
    null_values,
    require_columns,
    save,
    style,
)
from blockcoupling.figures.heatmaps import heatmap_grid, matrix, require_dims
from blockcoupling.stats.core import select


def _model_order(table: pd.DataFrame) -> list[str]:
    """Model names ordered by size (log10_params; unknown last), then name."""
    models = table["model"].astype(str)
    size = (
        table["log10_params"]
        if "log10_params" in table.columns
        else pd.Series(np.nan, index=table.index)
    )
    order = pd.DataFrame({"model": models, "size": size.fillna(np.inf)}).drop_duplicates("model")
    return list(order.sort_values(["size", "model"])["model"])


def _lines_vs_step(
    table: pd.DataFrame, rows: Sequence[Sequence[str]], path: str | Path
) -> list[Path]:
    """A grid of panels (``rows`` of column names): value vs step (symlog x), one line per model
    (ordered by size), a band where the table has the column's CI (``*_low``, ``*_high``) and a
    dashed line per model at the column's chance level where it has one (common.MEASURES).
    """
    require_columns(table, ["model", "step", *(c for row in rows for c in row)])
    order = _model_order(table)
    palette = dict(zip(order, sns.color_palette(n_colors=len(order))))
    n_cols = max(len(row) for row in rows)
    with style():
        fig, axes = plt.subplots(
            len(rows), n_cols, figsize=(4.8 * n_cols + 1.5, 3.6 * len(rows) + 0.4), squeeze=False
        )
        for r, row in enumerate(rows):
            for c in range(n_cols):
                ax = axes[r, c]
                if c >= len(row):
                    ax.axis("off")
                    continue
                _step_panel(ax, table, row[c], palette, legend=(r, c) == (0, n_cols - 1))
        if axes[0, -1].get_legend() is not None:
            sns.move_legend(axes[0, -1], "upper left", bbox_to_anchor=(1.02, 1), title="model")
        fig.tight_layout()
        return save(fig, path)


def _step_panel(
    ax: plt.Axes, table: pd.DataFrame, column: str, palette: dict, legend: bool
) -> None:
    """One panel of ``_lines_vs_step``."""
    data = table.dropna(subset=[column]).sort_values("step")
    if data.empty:
        no_data(ax)
    else:
        sns.lineplot(
            data=data,
            x="step",
            y=column,
            hue="model",
            hue_order=list(palette),
            palette=palette,
            marker="o",
            errorbar=None,
            ax=ax,
            legend=legend,
        )
        null = null_values(data, column)
        for model, rows in data.groupby("model"):
            color = palette[str(model)]
            if {f"{column}_low", f"{column}_high"} <= set(data.columns):
                ax.fill_between(
                    rows["step"],
                    rows[f"{column}_low"],
                    rows[f"{column}_high"],
                    color=color,
                    alpha=0.15,
                    lw=0,
                )
            if null is not None:
                at = (data["model"] == model).to_numpy()
                ax.plot(rows["step"], null[at], color=color, ls="--", lw=0.8)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=-0.3)
    ax.set(xlabel=STEP_LABEL, ylabel=label(column))


def coupling_vs_step(table: pd.DataFrame, path: str | Path) -> list[Path]:
    """Each coupling measure the `checkpoint_table` has (raw; calibrated excess and overlap when
    present), over all pairs and adjacent blocks, vs training step, one line per model; dashed:
    the chance level.
    """
    rows = [
        [m] + ([ADJACENT[m]] if ADJACENT.get(m) in table.columns else []) for m in measures(table)
    ]
    return _lines_vs_step(table, rows or [["coupling", "adjacent_coupling"]], path)


def trajectory_metrics_vs_step(table: pd.DataFrame, path: str | Path) -> list[Path]:
    """Mean LSS and expodistance vs training step, one line per model (a `checkpoint_table`)."""
    return _lines_vs_step(table, [["lss", "expodistance"]], path)


def pick_steps(steps: Sequence[int]) -> list[int]:
    """Early (first), middle (closest to the midpoint in log(1 + step)) and final step,
    deduplicated.
    """
    steps = np.sort(np.asarray(steps, dtype=int))
    if steps.size == 0:
        return []
    log = np.log1p(steps)
    middle = steps[np.argmin(np.abs(log - (log[0] + log[-1]) / 2))]
    return list(dict.fromkeys(int(s) for s in (steps[0], middle, steps[-1])))


def depth_heatmaps_over_training(
    depth_mis: xr.DataArray, path: str | Path, steps: Sequence[int] | None = None
) -> list[Path]:
    """Layer x layer_ref m_K (mean over prompts) at early/middle/final steps; rows = model.

    `depth_mis`: dims (model, step, prompt, layer, layer_ref). `steps` default: `pick_steps` of the
    steps where each model has data.
    """
    require_dims(depth_mis, ("model", "step", "prompt", "layer", "layer_ref"))
    mean = depth_mis.mean("prompt", skipna=True)
    models = [str(m) for m in mean["model"].values]
    panels = []
    for model in models:
        part = mean.sel(model=model)
        have = [int(s) for s in part["step"].values if np.isfinite(part.sel(step=s).values).any()]
        chosen = pick_steps(have) if steps is None else list(steps)
        panels.append(
            [
                (f"{model}, step {s}", matrix(select(part, step=s), "layer", "layer_ref"))
                for s in chosen
            ]
            or [(model, pd.DataFrame())]
        )
    return heatmap_grid(panels, models, ("block l", "reference block l'"), MIS_LABEL, path)


def coupling_vs_validation_loss(
    table: pd.DataFrame, path: str | Path, correlations: pd.DataFrame | None = None
) -> list[Path]:
    """Each coupling measure vs validation loss over checkpoints and models (one panel per
    measure): colour = log10(step + 1), marker = model, grey ``_``: the chance level. Titles:
    the run-level estimate from ``correlations`` (a `checkpoint_correlations` table).
    """
    require_columns(table, ["model", "step", "coupling", "val_loss"])
    shown = measures(table) or ["coupling"]
    data = table.dropna(subset=["val_loss"]).sort_values("step")
    log_step = np.log10(data["step"].to_numpy(dtype=float) + 1)
    norm = Normalize(*(log_step.min(), log_step.max()) if len(data) else (0, 1))
    models = [m for m in _model_order(table) if m in set(data["model"])]
    with style():
        fig, axes = plt.subplots(
            1, len(shown), figsize=(5.2 * len(shown) + 1.5, 4.6), squeeze=False
        )
        for ax, measure in zip(axes[0], shown):
            null = null_values(data, measure)
            for i, model in enumerate(models):
                at = (data["model"] == model).to_numpy() & data[measure].notna().to_numpy()
                x, y = data.loc[at, "val_loss"], data.loc[at, measure]
                ax.plot(x, y, color="0.8", lw=0.6, zorder=1)
                if null is not None:
                    ax.scatter(x, null[at], marker="_", color="0.5", s=30, zorder=1)
                ax.scatter(
                    x,
                    y,
                    c=log_step[at],
                    cmap="viridis",
                    norm=norm,
                    marker=MARKERS[i % len(MARKERS)],
                    edgecolor="0.2",
                    lw=0.3,
                    label=model,
                    zorder=2,
                )
            if not data[measure].notna().any():
                no_data(ax)
            stat = first_text(
                correlations,
                "run-level slope",
                dict(subset="all runs", design="mixed model (run as group)", predictor=measure),
            )
            ax.set_title(stat, fontsize="small", wrap=True)
            ax.set(xlabel=label("val_loss"), ylabel=label(measure))
        if models:
            legend = axes[0, 0].legend(title="model", loc="best", fontsize="x-small")
            for handle in legend.legend_handles:
                handle.set_facecolor("0.6")
        fig.colorbar(
            ScalarMappable(norm=norm, cmap="viridis"), ax=axes[0, -1], label="log10(step + 1)"
        )
        return save(fig, path)
