"""Text a figure quotes from the statistics tables: a row's estimate, interval, p and n, its
verdict, and a claim's row of ``claims.csv`` in ``claims.md``'s digits (figures never compute a
statistic themselves).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from blockcoupling.figures.common import fix_layout
from blockcoupling.pipeline import figure_registry
from blockcoupling.stats import claims as claims_table


def stat_row(table: pd.DataFrame | None, **match: object) -> pd.Series | None:
    """The first row of a statistics table whose columns equal ``match`` (None when the table
    is absent, lacks one of the columns, or has no such row).
    """
    if table is None or not set(match) <= set(table.columns):
        return None
    rows = table
    for key, value in match.items():
        rows = rows[rows[key].astype(str) == str(value)]
    return None if rows.empty else rows.iloc[0]


def _value(row: pd.Series, *names: str) -> float:
    """The first finite of ``row``'s columns ``names`` (NaN if none)."""
    for name in names:
        value = pd.to_numeric(row.get(name, np.nan), errors="coerce")
        if np.isfinite(value):
            return float(value)
    return np.nan


def stat_text(row: pd.Series | None, what: str) -> str:
    """'what +0.41 [0.12, 0.70] unit, p = .., Holm p = .., n = ..; primary' from a statistics
    row (columns estimate or r or coef, ci_low, ci_high, p, p_holm, n, unit, primary), or why
    there is none.
    """
    if row is None:
        return f"{what}: no row in the statistics table"
    n = _value(row, "n")
    n_text = f"n = {int(n)}" if np.isfinite(n) else "n unknown"
    estimate = _value(row, "estimate", "r", "coef")
    if not np.isfinite(estimate):
        reason = row.get("reason", "") or row.get("note", "") or "not estimable"
        return f"{what}: {reason}" + ("" if "n=" in str(reason) else f" ({n_text})")
    unit = row.get("unit", "")
    low, high, p = _value(row, "ci_low"), _value(row, "ci_high"), _value(row, "p")
    bounds = f"[{low:+.2f}, {high:+.2f}]" if np.isfinite(low) and np.isfinite(high) else ""
    text = (
        f"{what} {estimate:+.2f} {bounds or '(no interval)'}"
        + (f" {unit}" if isinstance(unit, str) and unit else "")
        + (f", p = {p:.2g}" if np.isfinite(p) else ", no p")
    )
    p_holm = _value(row, "p_holm")
    text += (f", Holm p = {p_holm:.2g}" if np.isfinite(p_holm) else "") + f", {n_text}"
    if "primary" in row.index:
        text += "; primary" if str(row["primary"]).lower() == "true" else "; exploratory"
    return text


def first_row(table: pd.DataFrame | None, *matches: Mapping[str, object]) -> pd.Series | None:
    """The row of the first of ``matches`` that ``table`` has (None if it has none)."""
    for match in matches:
        row = stat_row(table, **match)
        if row is not None:
            return row
    return None


def first_text(table: pd.DataFrame | None, what: str, *matches: Mapping[str, object]) -> str:
    """``stat_text`` of the first of ``matches`` that ``table`` has a row for."""
    return stat_text(first_row(table, *matches), what)


def estimable(row: pd.Series | None) -> bool:
    """Whether a statistics row has a finite estimate (a fit or trend may then be drawn)."""
    return row is not None and bool(np.isfinite(_value(row, "estimate", "r", "coef")))


def verdict(row: pd.Series) -> str:
    """The row's verdict: its own ``verdict`` column, else from its numbers: 'above 0' / 'below
    0' when the interval excludes 0 and p (Holm-adjusted where the row has it) < 0.05, else
    'inconclusive'.
    """
    own = row.get("verdict", "")
    if isinstance(own, str) and own:
        return own
    low, high = _value(row, "ci_low"), _value(row, "ci_high")
    p = _value(row, "p_holm", "p")
    if np.isfinite(p) and p < 0.05 and (low > 0 or high < 0):
        return "above 0" if low > 0 else "below 0"
    return "inconclusive"


def stat_title(row: pd.Series | None, what: str) -> str:
    """``stat_text`` on two lines (estimate and interval; p, n, role and verdict) so that a
    panel title stays within its panel.
    """
    if row is not None and "r" in row.index and isinstance(row.get("unit"), str):
        row = row.drop("unit")  # a correlation's unit column names its units of analysis
    text = stat_text(row, what)
    if not estimable(row):
        return text.replace(": ", ":\n", 1)
    cut = min(i for i in (text.find(", p = "), text.find(", no p"), len(text)) if i >= 0)
    return f"{text[:cut]}\n{text[cut + 2 :]}; {verdict(row)}"


def exploratory_title(row: pd.Series | None, what: str) -> str:
    """``stat_title`` of a statistic no claim rests on, saying so: 'exploratory', its unadjusted
    p, and no Holm p or verdict (those are the claims table's, over its declared tests).
    """
    if not estimable(row):
        return stat_title(row, f"exploratory {what}")
    assert row is not None
    kept = row.drop([c for c in ("p_holm", "primary", "verdict") if c in row.index])
    text = stat_title(kept, f"exploratory {what}")
    text = text.rsplit("; ", 1)[0]  # the verdict stat_title reads from the numbers
    return text.replace(", n = ", " (unadjusted), n = ", 1) if ", p = " in text else text


def claims_note(
    claims: pd.DataFrame | None, figure: str, k: object = None, chance: str = ""
) -> str:
    """The claims rows ``figure`` draws (``pipeline.figure_registry.CLAIM_FIGURES``), each as
    claims.csv has it (``stats.claims.claim_quote``: claims.md's digits, primary marked, verdict),
    after a line stating K and the chance level the figure draws; '' when no row is tied to it.
    """
    analyses = figure_registry.claim_rows(figure)
    if not analyses:
        return ""
    head = "Claims drawn here (results/stats/claims.csv)"
    head += f"; K = {k}" if k is not None else ""
    head += f"; chance level: {chance}" if chance else ""
    lines = [head]
    for analysis in analyses:
        claim = claims_table.claim_of(analysis)
        row = stat_row(claims, claim=claim)
        if row is None:
            where = "no claims table in this run" if claims is None else "no row in claims.csv"
            lines.append(f"- {claim}: {where}")
            continue
        quote, _, verdict_text = claims_table.claim_quote(row).partition("\n")
        kind, _, numbers = quote.removeprefix("claim ").partition(": ")  # "(primary)", the rest
        lines.append(f"- {claim} {kind}: {numbers}" + (f"; {verdict_text}" if verdict_text else ""))
    return "\n".join(lines)


def add_claims_note(
    fig: plt.Figure,
    claims: pd.DataFrame | None,
    figure: str,
    k: object = None,
    chance: str = "",
) -> None:
    """``claims_note`` under everything ``fig`` shows, its lines wrapped to the figure's width:
    the layout is fixed first (``common.fix_layout``), so the note goes below the lowest text
    (a legend under the panels too) and the saved tight box takes it in. Call it last, just
    before ``common.save``; nothing when no claims row is tied to ``figure``.
    """
    text = claims_note(claims, figure, k, chance)
    if not text:
        return
    width = max(70, int(fig.get_figwidth() * 16))
    wrapped = [
        textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False)
        for line in text.replace(" = ", "\u00a0=\u00a0").splitlines()
    ]
    fix_layout(fig)
    renderer = fig.canvas.get_renderer()
    for legend in fig.legends:  # anchored where the layout put them, not at the saved box's edge
        box = legend.get_window_extent(renderer).transformed(fig.transFigure.inverted())
        legend.set_bbox_to_anchor(box, transform=fig.transFigure)
        legend.set_loc("center")
    bottom = fig.get_tightbbox(renderer).y0  # inches
    y = (bottom - 0.1) / fig.get_figheight()
    fig.text(0.01, y, "\n".join(wrapped), ha="left", va="top", fontsize="x-small")
