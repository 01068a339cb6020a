"""ViT sweep figures: coupling measures against the stochastic-depth rate, and test accuracy
against coupling within rates.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize

from blockcoupling.figures.common import (
    draw_panels,
    label,
    long_form,
    measures,
    no_data,
    require_columns,
    save,
    style,
)
from blockcoupling.figures.quotes import (
    add_claims_note,
    estimable,
    exploratory_title,
    first_row,
    stat_row,
    stat_title,
)
from blockcoupling.stats.claims import claim_of
from blockcoupling.stats.claims_markdown import number

SD_LABEL = "stochastic-depth rate (drop-path rate of the last block)"
RATE_LABEL = "stochastic-depth rate"
CMAP = "viridis"
CLAIM = "vit_accuracy_within_rate"  # the claims row whose slope the accuracy figure draws
CLAIM_MEASURE = "coupling_excess"  # its measure (stats.vit.vit_analyses, no suffix)


def _measure_grid(
    data: pd.DataFrame, shown: list[str], share: str, height: float = 3.6
) -> sns.FacetGrid:
    """A FacetGrid with one panel per coupling measure of ``shown`` (column ``measure`` of
    ``data``), side by side; the measure's axis (``share`` = 'x': the y axis) is each panel's
    own, the other shared.
    """
    return sns.FacetGrid(
        data,
        col="measure",
        col_order=shown,
        sharex=share == "x",
        sharey=share == "y",
        height=height,
        aspect=1.2 * 3.6 / height,
        despine=False,
    )


def _title(row: pd.Series | None, what: str) -> str:
    """A panel title: the statistics row as ``stat_title`` reads it, labelled exploratory where
    it is not a declared primary test (the claims rows are quoted under the grid).
    """
    if row is not None and str(row.get("primary", "")).lower() == "true":
        return stat_title(row, what)
    return exploratory_title(row, what)


def vit_coupling_vs_sd(
    by_rate: pd.DataFrame,
    path: str | Path,
    trend: pd.DataFrame | None = None,
    claims: pd.DataFrame | None = None,
    k: object = None,
) -> list[Path]:
    """Each coupling measure (one panel each: raw, calibrated excess, overlap as the table has
    them) vs stochastic-depth rate (a tick at every rate): the mean over weight decays (black,
    95% CI bars and band) and, where the sweep has more than one weight decay, one thin
    coloured line per weight decay; dashed grey: the chance level.

    `by_rate`: a `stats.vit_coupling_by_rate` table (wd = "all" for the pooled rows). Titles:
    the sd slope from ``trend`` (a `stats.vit_sd_trend` table), exploratory; under the grid:
    the claim's row of ``claims`` (vit_sd_effect, claims.md's digits), K and the chance level.
    """
    require_columns(by_rate, ["sd", "wd", "coupling"])
    data = by_rate.assign(wd=by_rate["wd"].astype(str)).sort_values("sd")
    decays = [w for w in dict.fromkeys(data["wd"]) if w != "all"]
    if len(decays) == 1:  # one weight decay: its rows are the pooled ones, drawn once
        pooled = data[data["wd"] == "all"]
        data = pooled if len(pooled) else data.assign(wd="all")
        decays = []
    shown = measures(data) or ["coupling"]
    long = long_form(data, shown, "measure")
    colors = dict(zip(decays, sns.color_palette("crest", n_colors=max(len(decays), 1))))
    pooled_label = "all weight decays" if decays else f"weight decay {_only(by_rate['wd'])}"
    with style():
        grid = _measure_grid(long, shown, share="x")
        rows = {
            measure: first_row(
                trend,
                dict(response=measure, term="sd", method="ols"),
                dict(response=measure, term="sd"),
            )
            for measure in shown
        }
        trended = {measure for measure, row in rows.items() if estimable(row)}
        draw_panels(grid, _sd_panel, colors=colors, pooled_label=pooled_label, trended=trended)
        rates = np.unique(data["sd"].to_numpy(dtype=float))
        for measure, ax in grid.axes_dict.items():
            row = rows[measure]
            ax.set_title(_title(row, "sd slope"), fontsize="small")
            ax.set_xticks(rates, [f"{r:g}" for r in rates])
            ax.set(xlabel="", ylabel=label(measure))
        grid.figure.supxlabel(SD_LABEL, fontsize="medium")
        handles, labels = grid.axes.flat[0].get_legend_handles_labels()
        grid.figure.legend(handles, labels, loc="outside right upper", fontsize="small")
        grid.figure.suptitle("coupling vs stochastic depth (mean over seeds and images, 95% CI)")
        chance = "dashed grey, each measure's mean null level (0 for the excess)"
        add_claims_note(grid.figure, claims, "vit_coupling_vs_sd", k, chance)
        return save(grid.figure, path)


def _only(values: pd.Series) -> str:
    """The one value of ``values`` other than 'all' (as text)."""
    return next(str(v) for v in values if str(v) != "all")


def _sd_panel(
    data: pd.DataFrame,
    colors: dict[str, tuple],
    pooled_label: str,
    trended: set[str],
    **_: object,
) -> None:
    """One panel of ``vit_coupling_vs_sd`` (long rows of one measure), on the current axes:
    the means joined by lines only where the trend table estimates that measure's slope.
    """
    ax = plt.gca()
    line = "-" if str(data["measure"].iloc[0]) in trended else ""
    span = float(np.ptp(data["sd"])) if len(data) else 0.0
    for i, (wd, color) in enumerate(colors.items()):
        rows = data[data["wd"] == wd]
        shift = (i - (len(colors) - 1) / 2) * 0.01 * (span or 1)  # keep their bars apart
        ax.errorbar(
            rows["sd"] + shift,
            rows["value"],
            yerr=np.abs(np.vstack([rows["value"] - rows["low"], rows["high"] - rows["value"]])),
            color=color,
            marker="o",
            ms=3,
            ls=line,
            lw=1,
            capsize=2,
            label=f"weight decay {wd}",
        )
    pooled = data[data["wd"] == "all"].dropna(subset=["value"])
    if pooled.empty:
        no_data(ax)
        return
    if pooled["low"].notna().any() and line:
        ax.fill_between(pooled["sd"], pooled["low"], pooled["high"], color="0.5", alpha=0.25, lw=0)
    ax.errorbar(
        pooled["sd"],
        pooled["value"],
        yerr=np.abs(np.vstack([pooled["value"] - pooled["low"], pooled["high"] - pooled["value"]])),
        color="black",
        marker="s",
        ls=line,
        lw=2,
        capsize=3,
        label=pooled_label,
    )
    if pooled["null"].notna().any():
        ax.plot(pooled["sd"], pooled["null"], color="0.4", ls="--", lw=1, label="chance level")


def vit_coupling_vs_accuracy(
    table: pd.DataFrame,
    path: str | Path,
    within: pd.DataFrame | None = None,
    claims: pd.DataFrame | None = None,
    k: object = None,
) -> list[Path]:
    """Test accuracy vs each coupling measure (one panel each), one point per ViT coloured by
    its stochastic-depth rate, with its CI (horizontal bars), grey ``|`` at its chance level.
    Lines only in the panel of the claim's measure (``CLAIM_MEASURE``): the claims row's
    within-rate slope drawn through each rate's mean (``claim_slope``); every other panel, or
    that one when the row is missing, says why it has none.

    `table`: a `stats.vit_model_table`. Titles: the pooled within-rate estimate from ``within``
    (a `stats.vit_coupling_accuracy` table), exploratory; under the grid: the claim's row of
    ``claims`` (vit_accuracy_within_rate, claims.md's digits), K and the chance level.
    """
    require_columns(table, ["sd", "coupling", "test_accuracy"])
    shown = measures(table) or ["coupling"]
    rates = sorted(table["sd"].dropna().unique())
    norm = Normalize(min(rates, default=0), max(rates, default=1) if len(rates) > 1 else 1)
    long = long_form(table.dropna(subset=["test_accuracy"]), shown, "measure")
    with style():
        grid = _measure_grid(long, shown, share="y", height=5.4)  # room for the legends below
        draw_panels(grid, _accuracy_panel, rates=rates, norm=norm, claims=claims)
        for measure, ax in grid.axes_dict.items():
            row = first_row(
                within,
                dict(sd="pooled", method="within_r", measure=measure),
                *([dict(sd="pooled", method="within_r")] if measure == "coupling" else []),
            )
            values = long[long["measure"] == measure].dropna(subset=["value"])
            why = claim_slope(values, claims)[1] if len(values) else ""
            title = _title(row, "within-rate r") + (f"\n{why}" if why else "")
            ax.set_title(title, fontsize="small")
            ax.set(xlabel=label(measure), ylabel="test accuracy")
            ax.locator_params(axis="x", nbins=4)  # long tick labels stay apart
        bar = grid.figure.colorbar(
            ScalarMappable(norm=norm, cmap=CMAP), ax=grid.axes.ravel().tolist(), label=RATE_LABEL
        )
        bar.set_ticks(rates, labels=[f"{r:g}" for r in rates])  # the rates trained
        chance = "grey | at each ViT's null level"
        add_claims_note(grid.figure, claims, "vit_coupling_vs_accuracy", k, chance)
        return save(grid.figure, path)


def _accuracy_panel(
    data: pd.DataFrame,
    rates: list[float],
    norm: Normalize,
    claims: pd.DataFrame | None,
    **_: object,
) -> None:
    """One panel of ``vit_coupling_vs_accuracy`` (long rows of one measure), current axes."""
    ax = plt.gca()
    data = data.dropna(subset=["value"])
    if data.empty:
        no_data(ax)
        return
    if data["low"].notna().any():
        err = np.abs(np.vstack([data["value"] - data["low"], data["high"] - data["value"]]))
        ax.errorbar(
            data["value"], data["test_accuracy"], xerr=err, fmt="none", ecolor="0.75", lw=0.8
        )
    if data["null"].notna().any():
        ax.scatter(data["null"], data["test_accuracy"], marker="|", color="0.6", s=30, zorder=1)
    slope = claim_slope(data, claims)[0]
    for rate in rates:
        rows = data[data["sd"] == rate]
        color = plt.get_cmap(CMAP)(norm(rate))
        ax.scatter(
            rows["value"], rows["test_accuracy"], color=color, edgecolor="0.2", lw=0.3, zorder=3
        )
        if np.isfinite(slope) and len(rows) >= 2 and np.ptp(rows["value"]) > 0:
            x0, y0 = rows["value"].mean(), rows["test_accuracy"].mean()
            xs = np.array([rows["value"].min(), rows["value"].max()])
            ax.plot(xs, y0 + slope * (xs - x0), color=color, lw=1)


def claim_slope(data: pd.DataFrame, claims: pd.DataFrame | None) -> tuple[float, str]:
    """The slope (test accuracy per unit of the measure) a panel of ``vit_coupling_vs_accuracy``
    draws within each rate, from the claims row of ``CLAIM`` (accuracy per sd of the measure,
    rate and seed as blocks: per unit, its estimate over the sd of the ViTs' values, as the
    statistics standardize it), and the title line saying so; NaN and why there is none where
    the panel's measure is not the claim's, the row has no estimate, or it counts other ViTs
    than the panel's (``data``: its long rows with a value).
    """
    measure = str(data["measure"].iloc[0])
    if measure != CLAIM_MEASURE:
        return np.nan, "no line: no claims row rests on this measure"
    row = stat_row(claims, claim=claim_of(CLAIM))
    if row is None or not np.isfinite(float(row["estimate"])):
        return np.nan, "no line: its claims row has no estimate"
    points = data.dropna(subset=["value", "test_accuracy"])
    if pd.notna(row["n"]) and int(row["n"]) != len(points):
        return (
            np.nan,
            f"no line: its claims row counts n = {int(row['n'])},\nnot these {len(points)} ViTs",
        )
    sd = float(points["value"].std(ddof=1))
    if not (np.isfinite(sd) and sd > 0):
        return np.nan, "no line: the measure does not vary"
    estimate = float(row["estimate"])
    return (
        estimate / sd,
        f"lines: the claim's slope {number(estimate)} per sd\nwithin each rate (note below)",
    )
