"""The claims table (``claims.claims_table``) in words: the markdown table and its generated
reading that the README carries between ``START`` and ``END``, and a row as a figure panel
quotes it. Formatting only: every number and verdict comes from the table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

START, END = "<!-- claims:start -->", "<!-- claims:end -->"


def number(value: object) -> str:
    """A table cell: 3 significant digits, blank for NaN."""
    if isinstance(value, (float, np.floating)):
        return "" if not np.isfinite(value) else f"{value:.3g}"
    return str(value)


def interval(row: pd.Series) -> str:
    """``estimate [low, high]`` (the estimate alone without an interval; blank without one)."""
    if not np.isfinite(row["estimate"]):
        return ""
    if not (np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"])):
        return number(row["estimate"])
    return f"{number(row['estimate'])} [{number(row['ci_low'])}, {number(row['ci_high'])}]"


def unit(row: pd.Series) -> str:
    """``unit (n)``, blank without units."""
    return "" if pd.isna(row["n"]) else f"{row['unit']} ({int(row['n'])})"


def claims_markdown(claims: pd.DataFrame, commit: str) -> str:
    """``claims`` as a markdown table stamped with the run's commit, then its reading in words
    (``claims_prose``): the README's statements about results come from here, never by hand.
    """
    lines = [
        f"Claims of the paper and their verdicts from the run at commit `{commit}` "
        "(`results/stats/claims.csv`; p: the CR1 or t test's; p_wild: the wild cluster "
        "bootstrap's; p_holm: Holm over the declared primary tests of the larger of the two; "
        "a primary's verdict quotes its Holm-level interval: at Holm's first threshold; "
        "power: at the declared effect and Holm's first threshold, from a pilot run before this "
        "one, on other seeds; power (run): the same simulation at this run's own spread).",
        "",
        "| claim | measure | estimate [95% CI] | unit (n) | p | p_wild | p_holm | primary | effect "
        "| power | power (run) | verdict | limits |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, row in claims.iterrows():
        cells = [
            row["claim"],
            row["measure"],
            interval(row),
            unit(row),
            number(row["p"]),
            number(row["p_wild"]),
            number(row["p_holm"]),
            "yes" if row["primary"] else "no",
            number(row["effect"]),
            number(row["power"]),
            number(row.get("power_achieved", np.nan)),
            f"**{row['verdict']}**",
            row["limits"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + claims_prose(claims)


def claim_quote(row: pd.Series) -> str:
    """A claims row as a figure panel quotes it, in ``claims_markdown``'s digits: 'claim
    (primary): estimate [low, high] unit (n), p = .., Holm p = ..' then its verdict.
    """
    kind = "primary" if str(row["primary"]).lower() == "true" else "exploratory"
    if not np.isfinite(float(row["estimate"])):
        return f"claim ({kind}): {row['verdict']}"
    numbers = ", ".join(
        f"{name} = {number(float(row[key]))}"
        for name, key in (("p", "p"), ("wild p", "p_wild"), ("Holm p", "p_holm"))
        if np.isfinite(float(row[key]))
    )
    units = unit(row)
    return (
        f"claim ({kind}): {interval(row)}{f' {units}' if units else ''}"
        f"{f', {numbers}' if numbers else ''}\n{row['verdict']}"
    )


def claims_prose(claims: pd.DataFrame) -> str:
    """One generated sentence per claim: primary tests first, then the exploratory rows, each
    with its verdict, estimate, interval, unit and n.
    """
    lines = ["How to read it (generated from the same table):", ""]
    for primary in (True, False):
        for _, row in claims[claims["primary"] == primary].iterrows():
            kind = "primary" if primary else "exploratory"
            if not np.isfinite(row["estimate"]):
                lines.append(f"- {row['claim']} ({kind}): **{row['verdict']}**.")
                continue
            lines.append(
                f"- {row['claim']} ({kind}): **{row['verdict']}**; {row['measure']} = "
                f"{interval(row)} over {unit(row)}."
            )
    return "\n".join(lines) + "\n"
