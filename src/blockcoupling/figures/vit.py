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
    MIN_N_FIT,
    first_text,
    interval,
    label,
    measures,
    no_data,
    null_values,
    require_columns,
    save,
    style,
)

SD_LABEL = "stochastic-depth rate (drop-path rate of the last block)"


def vit_coupling_vs_sd(
    by_rate: pd.DataFrame, path: str | Path, trend: pd.DataFrame | None = None
) -> list[Path]:
    """Each coupling measure (one panel each: raw, calibrated excess, overlap as the table has
    them) vs stochastic-depth rate: one line per weight decay (thin, coloured) and the mean over
    weight decays (black), each with the table's 95% CI; dashed grey: the chance level.

    `by_rate`: a `stats.vit_coupling_by_rate` table (wd = "all" for the pooled rows). Titles:
    the sd slope from ``trend`` (a `stats.vit_sd_trend` table).
    """
    require_columns(by_rate, ["sd", "wd", "coupling"])
    data = by_rate.assign(wd=by_rate["wd"].astype(str)).sort_values("sd")
    decays = [w for w in dict.fromkeys(data["wd"]) if w != "all"]
    colors = sns.color_palette("crest", n_colors=max(len(decays), 1))
    shown = measures(data) or ["coupling"]
    span = float(np.ptp(data["sd"])) if len(data) else 0.0
    with style():
        fig, axes = plt.subplots(
            1, len(shown), figsize=(5.4 * len(shown) + 0.8, 4.4), squeeze=False
        )
        for ax, measure in zip(axes[0], shown):
            for i, wd in enumerate(decays):
                rows = data[data["wd"] == wd]
                shift = (i - (len(decays) - 1) / 2) * 0.01 * (span or 1)  # keep bars apart
                ax.errorbar(
                    rows["sd"] + shift,
                    rows[measure],
                    yerr=interval(rows, measure),
                    color=colors[i],
                    marker="o",
                    ms=3,
                    lw=1,
                    capsize=2,
                    label=f"wd = {wd}",
                )
            pooled = data[data["wd"] == "all"]
            if not pooled.empty:
                ax.plot(
                    pooled["sd"], pooled[measure], color="black", marker="s", lw=2, label="all wd"
                )
                err = interval(pooled, measure)
                if err is not None:
                    ax.fill_between(
                        pooled["sd"],
                        pooled[measure] - err[0],
                        pooled[measure] + err[1],
                        color="0.5",
                        alpha=0.25,
                    )
                null = null_values(pooled, measure)
                if null is not None:
                    ax.plot(pooled["sd"], null, color="0.4", ls="--", lw=1, label="chance level")
            if data[measure].isna().all():
                no_data(ax)
            elif ax is axes[0, 0]:
                ax.legend(title="weight decay", loc="best", fontsize="x-small")
            stat = first_text(
                trend,
                "sd slope",
                dict(response=measure, term="sd", method="ols"),
                dict(response=measure, term="sd"),
            )
            ax.set_title(stat, fontsize="small", wrap=True)
            ax.set(xlabel=SD_LABEL, ylabel=label(measure))
        fig.suptitle("coupling vs stochastic depth (mean over seeds and images, 95% CI)")
        return save(fig, path)


def vit_coupling_vs_accuracy(
    table: pd.DataFrame, path: str | Path, within: pd.DataFrame | None = None
) -> list[Path]:
    """Test accuracy vs each coupling measure (one panel each), one point per ViT coloured by
    its stochastic-depth rate, with its CI (horizontal bars), an OLS line per rate and grey
    ``|`` at its chance level.

    `table`: a `stats.vit_model_table`. Titles: the pooled within-rate estimate from ``within``
    (a `stats.vit_coupling_accuracy` table).
    """
    require_columns(table, ["sd", "coupling", "test_accuracy"])
    shown = measures(table) or ["coupling"]
    rates = sorted(table["sd"].dropna().unique())
    norm = Normalize(min(rates, default=0), max(rates, default=1) if len(rates) > 1 else 1)
    cmap = plt.get_cmap("viridis")
    with style():
        fig, axes = plt.subplots(
            1, len(shown), figsize=(5.2 * len(shown) + 1.5, 4.6), squeeze=False
        )
        for ax, measure in zip(axes[0], shown):
            data = table.dropna(subset=[measure, "test_accuracy"])
            err = interval(data, measure)
            if err is not None:
                ax.errorbar(
                    data[measure],
                    data["test_accuracy"],
                    xerr=err,
                    fmt="none",
                    ecolor="0.75",
                    lw=0.8,
                    zorder=1,
                )
            null = null_values(data, measure)
            if null is not None:
                ax.scatter(null, data["test_accuracy"], marker="|", color="0.5", s=40, zorder=1)
            for rate in rates:
                rows = data[data["sd"] == rate]
                color = cmap(norm(rate))
                ax.scatter(
                    rows[measure],
                    rows["test_accuracy"],
                    color=color,
                    edgecolor="0.2",
                    lw=0.3,
                    zorder=2,
                )
                if len(rows) >= MIN_N_FIT and np.ptp(rows[measure]) > 0:
                    slope, intercept = np.polyfit(rows[measure], rows["test_accuracy"], 1)
                    xs = np.array([rows[measure].min(), rows[measure].max()])
                    ax.plot(xs, intercept + slope * xs, color=color, lw=1)
            if data.empty:
                no_data(ax)
            stat = first_text(
                within,
                "within-rate r",
                dict(sd="pooled", method="within_r", measure=measure),
                *([dict(sd="pooled", method="within_r")] if measure == "coupling" else []),
            )
            ax.set_title(stat, fontsize="small", wrap=True)
            ax.set(xlabel=label(measure), ylabel="test accuracy" if ax is axes[0, 0] else "")
        fig.colorbar(
            ScalarMappable(norm=norm, cmap=cmap), ax=axes[0, -1], label="stochastic-depth rate"
        )
        return save(fig, path)
