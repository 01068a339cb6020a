"""Checkpoint figures: coupling measures and trajectory metrics over training, m_K heatmaps at
early/middle/final steps, coupling against validation loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import xarray as xr
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.lines import Line2D

from blockcoupling.figures.common import (
    ADJACENT,
    MARKERS,
    MIS_LABEL,
    STEP_LABEL,
    declutter,
    draw_panels,
    label,
    long_form,
    measures,
    no_data,
    null_values,
    require_columns,
    save,
    step_axis,
    step_label,
    style,
)
from blockcoupling.figures.heatmaps import heatmap_grid, matrix, require_dims
from blockcoupling.figures.quotes import add_claims_note, exploratory_title, first_row
from blockcoupling.stats.checkpoints import COMBINED
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


def wrapped_grid(
    data: pd.DataFrame, panels: Sequence[str], height: float = 3.3, aspect: float = 1.3
) -> tuple[sns.FacetGrid, plt.Axes | None]:
    """A FacetGrid with one panel per ``panels`` (column ``panel`` of ``data``), wrapped at 3
    columns (2 for 4 panels), constrained layout; returns it and an axes (axis off) filling its
    first vacant slot, for the legend, or None when there is none. Map the panels with
    ``common.draw_panels``.
    """
    n_cols = len(panels) if len(panels) <= 3 else 2 if len(panels) == 4 else 3
    grid = sns.FacetGrid(
        data,
        col="panel",
        col_order=list(panels),
        col_wrap=n_cols if len(panels) > n_cols else None,
        sharey=False,
        height=height,
        aspect=aspect,
        despine=False,
    )
    n_rows = -(-len(panels) // n_cols)
    if len(panels) == n_rows * n_cols:
        return grid, None
    vacant = grid.figure.add_subplot(n_rows, n_cols, len(panels) + 1)
    vacant.axis("off")
    return grid, vacant


def model_legend(grid: sns.FacetGrid, vacant: plt.Axes | None, palette: dict) -> None:
    """One legend of the model lines: in the grid's vacant slot, else outside on the right."""
    handles = [Line2D([], [], color=c, marker="o", label=m) for m, c in palette.items()]
    where = vacant if vacant is not None else grid.figure
    loc = "center" if vacant is not None else "outside right upper"
    where.legend(handles=handles, loc=loc, title="model", fontsize="small", frameon=False)


def _lines_vs_step(
    table: pd.DataFrame,
    panels: Sequence[str],
    path: str | Path,
    annotate: Callable[[plt.Figure], None] | None = None,
) -> list[Path]:
    """One panel per column of ``panels`` (a seaborn FacetGrid): value vs step (symlog x, a
    tick at every step), one line per model (ordered by size), a band where the table has the
    column's CI (``*_low``, ``*_high``) and a dashed line per model at the column's chance level
    where it has one (common.MEASURES); ``annotate`` adds to the figure before it is saved.
    """
    require_columns(table, ["model", "step", *panels])
    order = _model_order(table)
    palette = dict(zip(order, sns.color_palette(n_colors=len(order))))
    data = long_form(table, list(panels), "panel").astype({"model": str})
    with style():
        grid, vacant = wrapped_grid(data, panels)
        draw_panels(grid, _step_panel, palette=palette)
        for column, ax in grid.axes_dict.items():
            step_axis(ax, table["step"])
            ax.set_title("")
            ax.set_ylabel(label(column))
        grid.set_xlabels(STEP_LABEL)
        model_legend(grid, vacant, palette)
        declutter(grid.figure)
        if annotate is not None:
            annotate(grid.figure)
        return save(grid.figure, path)


def _step_panel(data: pd.DataFrame, palette: dict, **_: object) -> None:
    """One panel of ``_lines_vs_step`` (long rows of one column), on the current axes."""
    ax = plt.gca()
    data = data.dropna(subset=["value"]).sort_values("step")
    if data.empty:
        no_data(ax)
    for model, rows in data.groupby("model", sort=False):
        color = palette[str(model)]
        ax.plot(rows["step"], rows["value"], color=color, marker="o", ms=4, lw=1.2, zorder=3)
        if rows["low"].notna().any():
            ax.fill_between(
                rows["step"], rows["low"], rows["high"], color=color, alpha=0.15, lw=0, zorder=2
            )
        if rows["null"].notna().any():
            ax.plot(rows["step"], rows["null"], color=color, ls="--", lw=0.8, zorder=1)


def coupling_vs_step(
    table: pd.DataFrame, path: str | Path, claims: pd.DataFrame | None = None, k: object = None
) -> list[Path]:
    """Each coupling measure the `checkpoint_table` has (raw; calibrated excess and overlap when
    present), over all pairs and adjacent blocks, vs training step, one line per model; dashed:
    the chance level, in the panels whose measure has one in the table. Under the grid: the
    emergence claims' rows of ``claims``, K and which panels draw a chance level.
    """
    panels = [
        column
        for m in measures(table)
        for column in (m, ADJACENT.get(m))
        if column in table.columns and table[column].notna().any()
    ] or ["coupling", "adjacent_coupling"]
    return _lines_vs_step(
        table,
        panels,
        path,
        lambda fig: add_claims_note(fig, claims, "coupling_vs_step", k, chance_text(table, panels)),
    )


def chance_text(table: pd.DataFrame, panels: Sequence[str]) -> str:
    """Which of ``panels`` (columns of ``table``) draw a chance level (dashed), which do not."""
    drawn = [p for p in panels if null_values(table, p) is not None]
    text = "dashed, " + ", ".join(drawn) if drawn else "none in this table"
    missing = [p for p in panels if p not in drawn]
    return text + (f" (none for {', '.join(missing)})" if drawn and missing else "")


def spaced(ticks: np.ndarray, parts: int = 8) -> np.ndarray:
    """The sorted ``ticks`` (log10(step + 1)) at least 1/``parts`` of their span apart, from the
    last (the final step) down, so no two labels of a colour bar collide (the first is kept).
    """
    if ticks.size < 2:
        return ticks
    gap = (ticks[-1] - ticks[0]) / parts
    kept = [ticks[-1]]
    for tick in ticks[-2::-1]:
        if kept[-1] - tick >= gap or tick == ticks[0]:
            if tick == ticks[0] and kept[-1] - tick < gap and len(kept) > 1:
                kept.pop()
            kept.append(tick)
    return np.array(kept[::-1])


def trajectory_metrics_vs_step(
    table: pd.DataFrame, path: str | Path, claims: pd.DataFrame | None = None, k: object = None
) -> list[Path]:
    """Mean LSS and expodistance vs training step, one line per model (a `checkpoint_table`);
    under the grid the claims rows of their emergence (``claims``). They have no K (``k``, the
    registry's selection, is not theirs: the note says so) and no chance level: their no-effect
    level is no change from step 0.
    """
    return _lines_vs_step(
        table,
        ["lss", "expodistance"],
        path,
        lambda fig: add_claims_note(
            fig,
            claims,
            "trajectory_metrics_vs_step",
            "none (the trajectories' measures have no K)",
            "none drawn (no effect: no change)",
        ),
    )


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
            [(f"step {s}", matrix(select(part, step=s), "layer", "layer_ref")) for s in chosen]
            or [(model, pd.DataFrame())]
        )
    return heatmap_grid(panels, models, ("block l", "reference block l'"), MIS_LABEL, path)


def coupling_vs_validation_loss(
    table: pd.DataFrame,
    path: str | Path,
    correlations: pd.DataFrame | None = None,
    claims: pd.DataFrame | None = None,
    k: object = None,
) -> list[Path]:
    """Each coupling measure vs validation loss over checkpoints and models (a seaborn
    FacetGrid, one panel per measure): colour = log10(step + 1), marker = model, a thin line
    through each run's checkpoints, light grey ``_``: the chance level. Titles: the run-level
    estimate from ``correlations`` (a `checkpoint_correlations` table: the mean within-run r,
    t over initializations, n = initializations), exploratory; no line is fitted through the
    pooled points. Under the grid: the within-run claim's row of ``claims``, K and the chance
    level drawn.
    """
    require_columns(table, ["model", "step", "coupling", "val_loss"])
    shown = measures(table) or ["coupling"]
    data = table.dropna(subset=["val_loss"]).sort_values("step").astype({"model": str})
    log_step = np.log10(data["step"].to_numpy(dtype=float) + 1)
    norm = Normalize(*(log_step.min(), log_step.max()) if len(data) else (0, 1))
    models = [m for m in _model_order(table) if m in set(data["model"])]
    long = long_form(data.assign(log_step=log_step), shown, "measure")
    with style():
        grid = sns.FacetGrid(
            long,
            col="measure",
            col_order=shown,
            sharey=False,
            height=3.6,
            aspect=1.2,
            despine=False,
        )
        draw_panels(grid, _loss_panel, models=models, norm=norm)
        for measure, ax in grid.axes_dict.items():
            row = first_row(
                correlations, dict(design=COMBINED, predictor=measure, method="pearson")
            )  # its n: initializations (runs sharing one averaged first), not checkpoints
            title = exploratory_title(row, "mean within-run r").replace(", n = ", ", inits = ")
            ax.set_title(title, fontsize="small")
            ax.set(xlabel=label("val_loss"), ylabel=label(measure))
        if models:
            handles = [
                Line2D([], [], ls="", marker=MARKERS[i % len(MARKERS)], color="0.5", label=m)
                for i, m in enumerate(models)
            ]
            grid.figure.legend(
                handles=handles,
                title="model",
                loc="outside lower center",
                ncol=3,
                fontsize="x-small",
                frameon=False,
            )
        bar = grid.figure.colorbar(
            ScalarMappable(norm=norm, cmap="viridis"),
            ax=grid.axes.ravel().tolist(),
            label="training step (colour: log10(step + 1))",
        )
        ticks = spaced(np.log10(np.unique(data["step"].to_numpy(dtype=float)) + 1))
        bar.set_ticks(ticks, labels=[step_label(round(10**t - 1)) for t in ticks])
        chance = chance_text(data, shown).replace("dashed", "light grey _")
        add_claims_note(grid.figure, claims, "coupling_vs_validation_loss", k, chance)
        return save(grid.figure, path)


def _loss_panel(data: pd.DataFrame, models: list[str], norm: Normalize, **_: object) -> None:
    """One panel of ``coupling_vs_validation_loss`` (one measure), on the current axes."""
    ax = plt.gca()
    data = data.dropna(subset=["value"])
    if data.empty:
        no_data(ax)
        return
    if data["null"].notna().any():
        ax.scatter(data["val_loss"], data["null"], marker="_", color="0.7", s=30, zorder=0)
    for i, model in enumerate(models):
        rows = data[data["model"] == model]
        ax.plot(rows["val_loss"], rows["value"], color="0.8", lw=0.6, zorder=1)
        ax.scatter(
            rows["val_loss"],
            rows["value"],
            c=rows["log_step"],
            cmap="viridis",
            norm=norm,
            marker=MARKERS[i % len(MARKERS)],
            edgecolor="0.2",
            lw=0.3,
            zorder=2,
        )
