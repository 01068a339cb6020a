"""Cross-model figures: coupling (raw, calibrated excess, overlap) against the generalization
score per design, correlation bars per predictor, and the correlation against K.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from blockcoupling.figures.common import (
    MARKERS,
    MEASURES,
    MIN_N_FIT,
    SHORT_LABELS,
    draw_panels,
    label,
    long_form,
    measures,
    no_data,
    save,
    score_column_label,
    style,
    wrap_name,
)
from blockcoupling.figures.quotes import (
    add_claims_note,
    exploratory_title,
    first_row,
    stat_row,
)
from blockcoupling.stats.claims import claim_of
from blockcoupling.stats.claims_markdown import number
from blockcoupling.stats.fixed_size import FAMILY as FIXED_SIZE

OTHER = "other models"
# (design, measure) -> the analyses whose claims rows rest on that panel's measure against the
# score: the only panels with a least-squares line, drawn when the rows' n is the panel's and
# its slope has each row's sign (the panel quotes them); every other panel says why it has none
PANEL_CLAIMS = {
    ("fixed_size", "coupling_excess"): (
        "fixed_size_excess_vs_bpb",
        "fixed_size_excess_vs_bpb_rank_adjusted",
    ),
    ("fixed_size", "coupling"): ("fixed_size_coupling_vs_bpb_rank_adjusted",),
    ("all models", "coupling"): ("crossmodel_coupling_vs_score",),  # when they are one kind
}
# (design, measure) -> the analysis whose claim that panel's measure is a condition of (its
# sign must agree) without a claims row of its own: no line there
PANEL_CONDITIONS = {("fixed_size", "overlap_u"): "fixed_size_excess_vs_bpb"}


def designs(table: pd.DataFrame, y: str = "score") -> list[tuple[str, pd.DataFrame]]:
    """(name, rows) per design: each family with at least MIN_N_FIT scored models on its own
    (e.g. a training grid), then every remaining model (e.g. the pretrained ones) together as
    ``OTHER``, beside and never pooled with the families. One design when there is no family.
    """
    family = (
        table["family"].fillna("").astype(str)
        if "family" in table.columns
        else pd.Series("", index=table.index)
    )
    counts = table.dropna(subset=[y]).groupby(family.loc[table[y].notna()]).size()
    own = [f for f in dict.fromkeys(family) if f and counts.get(f, 0) >= MIN_N_FIT]
    out = [(f, table[family == f]) for f in own]
    rest = table[~family.isin(own)]
    if not rest.empty or not out:
        out.append((OTHER if own else "all models", rest))
    return out


def _fit_line(ax: plt.Axes, x: np.ndarray, y: np.ndarray) -> None:
    """Least-squares line over the x range (drawn only beside its statistics row)."""
    slope, intercept = np.polyfit(x, y, 1)
    xs = np.array([x.min(), x.max()])
    ax.plot(xs, intercept + slope * xs, color="0.3", lw=1, zorder=2)


def coupling_vs_score(
    table: pd.DataFrame,
    path: str | Path,
    y: str = "score",
    correlations: pd.DataFrame | None = None,
    claims: pd.DataFrame | None = None,
    k: object = None,
    fixed_size_runs: pd.DataFrame | None = None,
) -> list[Path]:
    """Score vs each coupling measure (a seaborn FacetGrid; rows: raw m_K-based coupling,
    calibrated excess, overlap, as the table has them) per design (columns: a family of at
    least MIN_N_FIT models; the other models beside it, never pooled).

    One marker per model (one legend under the grid, no text on the points); horizontal bars:
    the table's CI (``{measure}_low/_high``); light grey ``|`` behind each point: that model's
    chance level (``coupling_null``, ``overlap_null``), a dashed line at the excess's 0. The
    title quotes the panel's exploratory correlation from ``correlations`` (a stats table:
    estimate, interval, p, n; never computed here). A least-squares line only in a panel whose
    measure claims rows rest on (``PANEL_CLAIMS``), drawn when those rows of ``claims`` count
    the panel's points and its slope has the sign of each, whose estimates its title then
    quotes; every other panel says why it has no line (``fit_reason``). Under the grid: the
    claims rows this figure draws, as claims.csv has them, with K and the chance levels drawn.

    ``fixed_size_runs`` (stats.fixed_size.run_table): the ``fixed_size`` column then plots the
    data its claims rows are fitted on, not ``table``'s: per run, each measure's mean over the
    held-out prompts (``{measure}_held_out``) against minus bits per byte (``neg_bpb``), so its
    points are the claims' n and its line's sign is theirs to share (no intervals there).
    """
    shown = measures(table) or ["coupling"]
    held = _held_out_long(fixed_size_runs, shown, y)
    if held is not None and "family" in table.columns:
        table = table[table["family"].astype(str) != FIXED_SIZE]
    scored = table.dropna(subset=[y]) if y in table.columns else table
    groups = designs(scored, y) if held is None or not scored.empty else []
    parts = [long_form(rows, shown, "measure").assign(design=name) for name, rows in groups]
    if held is not None:
        groups = [(FIXED_SIZE, None), *groups]
        parts = [held, *parts]
    long = pd.concat(parts, ignore_index=True).astype({"model": str})
    with style():
        grid = sns.FacetGrid(
            long,
            row="measure",
            col="design",
            row_order=shown,
            col_order=[name for name, _ in groups],
            sharex=False,
            sharey="col",
            height=3.0,
            aspect=1.35,
            despine=False,
        )
        order = list(dict.fromkeys(long["model"]))  # one marker and colour per model, all designs
        draw_panels(grid, _score_panel, y=y, order=order, claims=claims)
        for (measure, design), ax in grid.axes_dict.items():
            row = _correlation_row(correlations, design, measure)
            if design == OTHER:
                stat = "no fit: these models are not one design"
            elif held is not None and design == FIXED_SIZE:
                stat = "held-out prompts, y: -bits per byte\n(the claims' data)"
            else:
                stat = exploratory_title(row, "Pearson r")
            if design != OTHER:
                points = long[(long["measure"] == measure) & (long["design"] == design)]
                stat += "\n" + fit_reason(points.dropna(subset=["value", y]), y, claims)[1]
            ax.set_title(f"{design}\n{stat}" if measure == shown[0] else stat, fontsize="small")
            ax.set(xlabel=label(measure), ylabel="")
            ax.locator_params(axis="x", nbins=4)  # long tick labels stay apart
        _legend(grid)
        grid.figure.supylabel(score_column_label(table, y))
        chance = "grey | at each model's null level, dashed 0 for the excess"
        add_claims_note(grid.figure, claims, "coupling_vs_score", k, chance)
        return save(grid.figure, path)


def _held_out_long(runs: pd.DataFrame | None, shown: list[str], y: str) -> pd.DataFrame | None:
    """``fixed_size_runs`` in ``long_form``'s shape for the ``fixed_size`` column: per run and
    measure of ``shown``, value = the measure's held-out mean (NaN where not measured), ``y`` =
    ``neg_bpb``, no interval or chance level. None with fewer than MIN_N_FIT runs with -bpb
    (as ``designs`` gives a family its own column).
    """
    if runs is None or "neg_bpb" not in runs or runs["neg_bpb"].notna().sum() < MIN_N_FIT:
        return None
    parts = [
        pd.DataFrame(
            {
                "model": runs["model"].astype(str),
                "measure": measure,
                "design": FIXED_SIZE,
                "value": runs.get(f"{measure}_held_out", np.nan),
                y: runs["neg_bpb"],
                "low": np.nan,
                "high": np.nan,
                "null": np.nan,
            }
        )
        for measure in shown
    ]
    return pd.concat(parts, ignore_index=True)


def fit_reason(data: pd.DataFrame, y: str, claims: pd.DataFrame | None) -> tuple[bool, str]:
    """Whether a panel of ``coupling_vs_score`` (its points: ``long_form`` rows of one measure
    and design with a value and a score) gets a least-squares line, and the title line saying
    why: only where claims rows rest on its measure (``PANEL_CLAIMS``), those of ``claims``
    with an estimate count its points, and its slope has each one's sign; the line then quotes
    their estimates (claims.md's digits).
    """
    if data.empty:
        return False, ""
    measure, design = str(data["measure"].iloc[0]), str(data["design"].iloc[0])
    analyses = PANEL_CLAIMS.get((design, measure), ())
    if not analyses:
        if (design, measure) in PANEL_CONDITIONS:
            return False, "no line: no claims row of its own\n(a claim's sign condition, below)"
        return False, "no line: no claims row rests on this panel"
    rows = [stat_row(claims, claim=claim_of(analysis)) for analysis in analyses]
    rows = [r for r in rows if r is not None and np.isfinite(float(r["estimate"]))]
    if not rows:
        return False, "no line: its claims rows have no estimate"
    x = data["value"].to_numpy(float)
    if len(x) < 2 or np.ptp(x) == 0:
        return False, "no line: too few distinct points"
    counts = {int(r["n"]) for r in rows if pd.notna(r["n"])}
    if counts and counts != {len(x)}:
        n = ", ".join(str(c) for c in sorted(counts))
        return False, f"no line: its claims rows count n = {n},\nnot these {len(x)} points"
    slope = np.polyfit(x, data[y].to_numpy(float), 1)[0]
    estimates = [float(r["estimate"]) for r in rows]
    quoted = ", ".join(f"{'+' if e > 0 else ''}{number(e)}" for e in estimates)
    if any(np.sign(e) != np.sign(slope) for e in estimates):
        return False, f"no line: its slope's sign differs from\nthe claims' {quoted} (note below)"
    return True, f"line: least squares; the claims'\n{quoted} (note below) share its sign"


def _legend(grid: sns.FacetGrid) -> None:
    """One legend of every model (each design's, in column order) and the grey chance mark,
    under the whole grid: the constrained layout keeps it clear of the axis labels (a legend
    under each column, placed in axes fractions, sat over them once the layout shrank the axes).
    """
    entries: dict[str, object] = {}
    for ax in grid.axes[0]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(name, handle)
    if not entries:
        return
    chance = Line2D([], [], ls="", marker="|", color="0.6", ms=8, mew=1)
    handles = [*entries.values(), chance]
    labels = [wrap_name(name, 24) for name in entries] + ["chance level of the model's measure"]
    grid.figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(4, len(handles)),
        fontsize="x-small",
        title="model",
        frameon=False,
    )


def _correlation_row(
    correlations: pd.DataFrame | None, design: str, measure: str
) -> pd.Series | None:
    """The Pearson row of ``correlations`` for ``measure`` on ``design``'s subset."""
    if design == OTHER:
        return None
    subset = "all" if design == "all models" else f"family:{design}"
    return first_row(correlations, dict(subset=subset, predictor=measure, method="pearson"))


def _score_panel(
    data: pd.DataFrame,
    y: str,
    order: list[str],
    claims: pd.DataFrame | None = None,
    **_: object,
) -> None:
    """One panel of ``coupling_vs_score`` (one measure, one design), on the current axes; each
    model's marker and colour from its place in ``order`` (every design's models), so that the
    one legend tells them apart.
    """
    ax = plt.gca()
    measure, design = str(data["measure"].iloc[0]), str(data["design"].iloc[0])
    models = list(dict.fromkeys(data["model"]))
    palette = sns.color_palette("tab20" if len(order) > 10 else "tab10", min(len(order), 20))
    data = data.dropna(subset=["value", y])
    if data.empty:
        no_data(ax)
        return
    constant = MEASURES.get(measure)
    if isinstance(constant, float):
        ax.axvline(constant, color="0.6", ls="--", lw=0.8, zorder=0)
    elif data["null"].notna().any():
        ax.scatter(data["null"], data[y], marker="|", color="0.7", s=60, lw=1, zorder=0)
    if data["low"].notna().any():
        err = np.abs(np.vstack([data["value"] - data["low"], data["high"] - data["value"]]))
        ax.errorbar(data["value"], data[y], xerr=err, fmt="none", ecolor="0.55", lw=0.8, zorder=1)
    for model in models:
        rows, i = data[data["model"] == model], order.index(model)
        ax.scatter(
            rows["value"],
            rows[y],
            color=palette[i % len(palette)],
            marker=MARKERS[(i + i // len(palette)) % len(MARKERS)],  # past the colours: another
            edgecolor="0.2",
            lw=0.3,
            s=30,
            zorder=3,
            label=model,
        )
    if design != OTHER and fit_reason(data, y, claims)[0]:
        _fit_line(ax, data["value"].to_numpy(float), data[y].to_numpy(float))


def populated(table: pd.DataFrame) -> list[str]:
    """The subsets of a correlation table with at least one model (all of them if none has)."""
    n = pd.to_numeric(table["n"], errors="coerce").fillna(0).groupby(table["subset"]).max()
    subsets = list(dict.fromkeys(table["subset"]))
    return [s for s in subsets if n.get(s, 0) > 0] or subsets


def hyperparameter_correlations(
    corr: pd.DataFrame, path: str | Path, claims: pd.DataFrame | None = None, k: object = None
) -> list[Path]:
    """Bars of r (with CI error bars) per predictor, hue = method, one panel per subset; under
    them the claims row comparing coupling with size, depth and width (``claims``, at K ``k``).

    `corr`: a `stats.correlations` table. A panel shows only the predictors with an r in its
    subset (a predictor constant there, e.g. depth within a training grid, has none: it is
    named under the panel instead of drawn as "n/a"); a subset with no models, or with no r at
    all, has no panel.
    """
    estimated = corr[pd.to_numeric(corr["r"], errors="coerce").notna()]
    subsets = [s for s in populated(corr) if s in set(estimated["subset"])] or populated(corr)[:1]
    methods = list(dict.fromkeys(corr["method"]))
    width = 0.8 / max(len(methods), 1)
    colors = sns.color_palette(n_colors=max(len(methods), 1))
    shown = {
        subset: list(dict.fromkeys(estimated.loc[estimated["subset"] == subset, "predictor"]))
        for subset in subsets
    }
    with style():
        fig, axes = plt.subplots(
            1,
            max(len(subsets), 1),
            figsize=(sum(max(0.9 * len(p), 2.4) for p in shown.values()) + 2, 4),  # titles fit
            sharey=True,
            squeeze=False,
            layout="constrained",
        )
        for ax, subset in zip(axes[0], subsets):
            part = corr[corr["subset"] == subset].set_index(["predictor", "method"])
            predictors = shown[subset]
            for i, method in enumerate(methods):
                rows = part.reindex([(p, method) for p in predictors])
                pos = np.arange(len(predictors)) - 0.4 + width * (i + 0.5)
                r = rows["r"].to_numpy(dtype=float)
                err = np.abs(np.vstack([r - rows["ci_low"], rows["ci_high"] - r]))
                ax.bar(
                    pos, np.nan_to_num(r), width, yerr=err, capsize=3, color=colors[i], label=method
                )
            n = int(part["n"].max()) if len(part) else 0
            ax.axhline(0, color="0.3", lw=0.8)
            ax.set_xticks(
                np.arange(len(predictors)),
                [SHORT_LABELS.get(p, p) for p in predictors],
                rotation=30,
                ha="right",
            )
            if not predictors:
                no_data(ax, f"no correlation: n ≤ {n} models")
            left = [p for p in dict.fromkeys(part.index.get_level_values(0)) if p not in predictors]
            ax.set(title=f"{subset} models (n ≤ {n})", ylim=(-1.05, 1.05))
            if left:
                names = ", ".join(SHORT_LABELS.get(p, p) for p in left)
                ax.set_xlabel(f"no r (constant or too few):\n{names}", fontsize="x-small")
        target = str(corr["target"].iloc[0]) if len(corr) else "score"
        axes[0, 0].set_ylabel(f"correlation with {target} (r, 95% CI)")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, title="method", loc="outside right upper", frameon=False)
        add_claims_note(fig, claims, "hyperparameter_correlations", k, "r = 0 (the bars' base)")
        return save(fig, path)


def k_sweep_curve(sweep: pd.DataFrame, path: str | Path) -> list[Path]:
    """Correlation of coupling with the score vs K (95% CI band), hue = method, one panel per
    subset.

    `sweep`: a `stats.k_sweep` table.
    """
    subsets = populated(sweep)
    with style():
        fig, axes = plt.subplots(
            1,
            max(len(subsets), 1),
            figsize=(4.5 * len(subsets) + 1, 4),
            sharey=True,
            squeeze=False,
            layout="constrained",
        )
        for ax, subset in zip(axes[0], subsets):
            part = sweep[sweep["subset"] == subset].sort_values("k")
            for i, (method, rows) in enumerate(part.groupby("method", sort=False)):
                color = sns.color_palette()[i]
                err = np.abs(np.vstack([rows["r"] - rows["ci_low"], rows["ci_high"] - rows["r"]]))
                ax.errorbar(
                    rows["k"], rows["r"], yerr=err, marker="o", capsize=3, color=color, label=method
                )
                ax.fill_between(rows["k"], rows["ci_low"], rows["ci_high"], color=color, alpha=0.2)
            n = int(part["n"].max()) if len(part) else 0
            if not part["r"].notna().any():
                no_data(ax, f"no correlation: n ≤ {n} models\n(at least 4 needed)", y=0.75)
            ax.axhline(0, color="0.3", lw=0.8)
            ks = np.unique(part["k"].to_numpy(dtype=int))
            ax.set_xscale("log")  # the paper's K (4, 8, 10, 30, 50) apart: 8 and 10 read as such
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.set_xlim(ks.min() / 1.25, ks.max() * 1.25)
            ax.set(
                title=f"{subset} models (n ≤ {n})",
                xlabel="K (top singular vectors in $m_K$; log scale)",
                ylim=(-1.05, 1.05),
            )
        axes[0, 0].set_ylabel("correlation of coupling with score (r, 95% CI)")
        if sweep["r"].notna().any():
            handles, labels = axes[0, 0].get_legend_handles_labels()
            fig.legend(handles, labels, title="method", loc="outside right upper", frameon=False)
        return save(fig, path)
