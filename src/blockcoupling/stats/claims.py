"""One row per paper claim, with its verdict read from the analysis tables, and the markdown
rendering the README carries between ``<!-- claims:start -->`` and ``<!-- claims:end -->``.

Verdicts: "not testable with this design" (the analysis is absent or has no estimate),
"inconclusive" (no interval, or an interval that holds 0, or a primary whose Holm-adjusted p
is >= ``ALPHA``), "reproduced" (interval excludes 0 on the paper's side), "refuted" (interval
excludes 0 on the other side). Exploratory rows are judged on their own p and say so in
``limits``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

CLAIM_COLUMNS = (
    "claim",
    "measure",
    "estimate",
    "ci_low",
    "ci_high",
    "unit",
    "n",
    "p",
    "p_holm",
    "primary",
    "verdict",
    "limits",
)
ALPHA = 0.05
START, END = "<!-- claims:start -->", "<!-- claims:end -->"


@dataclass(frozen=True)
class Claim:
    """A claim of the paper, the analysis id that tests it, and the sign it predicts."""

    text: str
    analysis: str
    measure: str
    sign: int
    limits: str


CLAIMS = (
    Claim(
        "Training couples the blocks: trained models are more coupled than random-init twins",
        "fixed_size_trained_vs_random",
        "coupling_excess, trained - twin, on held-out prompts",
        +1,
        "the fixed-size runs; configurations as units",
    ),
    Claim(
        "More coupled models generalize better (held-out bits per byte)",
        "fixed_size_excess_vs_bpb",
        "coupling_excess on held-out Shakespeare prompts; -bits per byte per sd",
        +1,
        "one small architecture trained here; generalization varied by data fraction, weight "
        "decay and learning rate; runs clustered by configuration",
    ),
    Claim(
        "The same with the paper's raw coupling",
        "fixed_size_coupling_vs_bpb",
        "raw coupling (minus mean m_K) on held-out prompts; -bits per byte per sd",
        +1,
        "raw m_K has a chance level that moves with the spectrum; the excess is the calibrated "
        "measure",
    ),
    Claim(
        "More coupled models have a smaller generalization gap",
        "fixed_size_excess_vs_gap",
        "coupling_excess on held-out prompts; val - train loss (nats/token) per sd",
        -1,
        "gap at each run's last step; same runs as above",
    ),
    Claim(
        "Coupling emerges over training",
        "emergence_trend",
        "Spearman rho of coupling_excess vs log step, mean over runs",
        +1,
        "a few small runs trained here; the checkpoints of a run are one series",
    ),
    Claim(
        "Stochastic depth increases coupling (ViT)",
        "vit_sd_effect",
        "coupling_excess per unit drop-path rate, seed as a block",
        +1,
        "small ViTs on a small image set; fixed weight decay",
    ),
    Claim(
        "At a fixed rate, more coupled ViTs are more accurate",
        "vit_accuracy_within_rate",
        "test accuracy per sd of coupling_excess, rate fixed effects",
        +1,
        "small ViTs; within-rate variation comes from seeds",
    ),
    Claim(
        "Coupling correlates with the leaderboard score across pretrained models",
        "crossmodel_coupling_vs_score",
        "Spearman rho of coupling and the score across models",
        +1,
        "exploratory: models differ in data, size and training at once",
    ),
)


def verdict(row: pd.Series | None, sign: int) -> str:
    """The verdict of one analysis row for a claim predicting ``sign`` (+1 or -1)."""
    if row is None or not np.isfinite(row["estimate"]):
        return "not testable with this design"
    low, high = float(row["ci_low"]), float(row["ci_high"])
    if not (np.isfinite(low) and np.isfinite(high)):
        return "inconclusive"
    p = row["p_holm"] if bool(row["primary"]) else row["p"]
    if not np.isfinite(p) or p >= ALPHA or low <= 0 <= high:
        return "inconclusive"
    return "reproduced" if (low > 0) == (sign > 0) else "refuted"


def claims_table(analyses: pd.DataFrame, primary: Sequence[str] = ()) -> pd.DataFrame:
    """One row per ``CLAIMS`` entry from the combined analysis table (``CLAIM_COLUMNS``);
    ``primary``: the declared ids (a declared test the design lacks stays marked primary).
    """
    by_id = {row["analysis"]: row for _, row in analyses.iterrows()}
    rows = []
    for claim in CLAIMS:
        row = by_id.get(claim.analysis)
        limits = claim.limits
        if row is not None and row["note"]:
            limits += f"; {row['note']}"
        if claim.analysis not in primary:
            limits += "; exploratory (not a declared primary test)"
        values = {
            key: (row[key] if row is not None else np.nan)
            for key in ("estimate", "ci_low", "ci_high", "unit", "n", "p", "p_holm")
        }
        rows.append(
            dict(claim=claim.text, measure=claim.measure)
            | values
            | dict(
                primary=claim.analysis in primary,
                verdict=verdict(row, claim.sign),
                limits=limits if row is not None else f"{limits}; not run with this design",
            )
        )
    return pd.DataFrame(rows, columns=list(CLAIM_COLUMNS))


def _number(value: object) -> str:
    """A table cell: 3 significant digits, blank for NaN."""
    if isinstance(value, (float, np.floating)):
        return "" if not np.isfinite(value) else f"{value:.3g}"
    return str(value)


def claims_markdown(claims: pd.DataFrame, commit: str) -> str:
    """``claims`` as a markdown table, stamped with the run's commit."""
    lines = [
        f"Claims of the paper and their verdicts from the run at commit `{commit}` "
        "(`results/stats/claims.csv`; p_holm: Holm over the declared primary tests).",
        "",
        "| claim | measure | estimate [95% CI] | unit (n) | p | p_holm | primary | verdict "
        "| limits |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, row in claims.iterrows():
        interval = f"{_number(row['estimate'])} [{_number(row['ci_low'])}, "
        interval += f"{_number(row['ci_high'])}]"
        n = "" if pd.isna(row["n"]) else int(row["n"])
        cells = [
            row["claim"],
            row["measure"],
            interval if np.isfinite(row["estimate"]) else "",
            f"{row['unit']} ({n})" if n != "" else "",
            _number(row["p"]),
            _number(row["p_holm"]),
            "yes" if row["primary"] else "no",
            f"**{row['verdict']}**",
            row["limits"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_readme(readme: str | Path, markdown: str) -> str:
    """``readme``'s text with the block between the claims markers replaced by ``markdown``;
    a ValueError names the file when the markers are absent or not one pair.
    """
    text = Path(readme).read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {START} ... {END} block: add the two markers")
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(
            f"{readme} has {text.count(START)} {START} and {text.count(END)} {END} markers: "
            "keep one pair (which block is the claims table is not clear)"
        )
    return pattern.sub(lambda _: f"{START}\n{markdown}{END}", text, count=1)
