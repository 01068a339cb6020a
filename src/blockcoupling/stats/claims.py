"""One row per paper claim, with its verdict read from the analysis tables, and the markdown
rendering the README carries between ``<!-- claims:start -->`` and ``<!-- claims:end -->``.

Verdicts say no more than the evidence:

- "not testable with this design": the analysis is absent or has no estimate;
- a declared primary test (config ``stats.primary``): "reproduced" / "refuted" when its Holm p
  is below ``ALPHA`` and its interval excludes 0 on the paper's side / the other; else
  "inconclusive", saying why: "no effect of the declared size" (its 95% interval lies within
  +-the declared effect: an equivalence bound), "underpowered" (its power at the declared
  effect, from a pilot, is below ``TARGET_POWER``), or powered but neither excluded;
- an exploratory row: "exploratory:" with its direction (the paper's, the opposite, or none:
  the interval holds 0) and its unadjusted p; never "reproduced" or "refuted".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    "effect",
    "power",
)
ALPHA = 0.05
TARGET_POWER = 0.8
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
        "fixed_size_excess_vs_bpb_rank_adjusted",
        "sd of -bits per byte per sd of coupling_excess (held-out Shakespeare prompts), adjusted "
        "for the runs' log effective rank",
        +1,
        "one small architecture trained here; generalization varied by data fraction, weight "
        "decay and learning rate; runs clustered by configuration; unadjusted "
        "(fixed_size_excess_vs_bpb) the excess also tracks the spectrum's shape",
    ),
    Claim(
        "The same with the paper's raw coupling",
        "fixed_size_coupling_vs_bpb_rank_adjusted",
        "sd of -bits per byte per sd of raw coupling (minus mean m_K), held-out prompts, adjusted "
        "for log effective rank",
        +1,
        "raw m_K has a chance level that moves with the spectrum; the excess is the calibrated "
        "measure",
    ),
    Claim(
        "More coupled models have a smaller generalization gap",
        "fixed_size_excess_vs_gap_rank_adjusted",
        "sd of val - train loss per sd of coupling_excess, held-out prompts, adjusted for log "
        "effective rank",
        -1,
        "gap at each run's last step; same runs as above",
    ),
    Claim(
        "Coupling emerges with training: higher at the end than at initialization",
        "emergence_final_vs_init",
        "coupling_excess, last checkpoint - step 0, paired per run",
        +1,
        "small runs trained here; runs that share an initialization averaged first",
    ),
    Claim(
        "Coupling increases persistently through training (no decline after its peak)",
        "emergence_relaxation",
        "coupling_excess, last checkpoint - the declared peak step (stats.peak_step)",
        +1,
        "the peak step is declared from a pilot run before this one",
    ),
    Claim(
        "Coupling becomes more pronounced between adjacent layers with training (locality)",
        "emergence_locality",
        "(adjacent - all-pairs coupling_excess), last checkpoint - step 0",
        +1,
        "4-block models: adjacent pairs are 3 of 6",
    ),
    Claim(
        "Coupling across tokens emerges with training: self family (J_tt vs J_t't')",
        "tokens_self_trained_vs_random",
        "token-pair excess (t != t'), trained - twin",
        +1,
        "one token layer of one prompt per model; the fixed-size runs share one twin",
    ),
    Claim(
        "Coupling across tokens emerges with training: context (fixed input, fixed output)",
        "tokens_context_trained_vs_random",
        "token-pair excess (t != t'), mean of fixed input and fixed output, trained - twin",
        +1,
        "one token layer of one prompt per model; the fixed-size runs share one twin",
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
        "models differ in data, size and training at once",
    ),
)


def claim_of(analysis: str) -> str:
    """The text of the claim that analysis id ``analysis`` tests (KeyError: none does)."""
    return next(claim.text for claim in CLAIMS if claim.analysis == analysis)


def verdict(row: pd.Series | None, sign: int, effect: float = np.nan, power: float = np.nan) -> str:
    """The verdict of one analysis row for a claim predicting ``sign`` (+1 or -1); a primary
    row's ``effect`` (declared, the estimate's units) and ``power`` (at that effect) say why
    an inconclusive test is inconclusive (module docstring).
    """
    if row is None or not np.isfinite(row["estimate"]):
        return "not testable with this design"
    low, high = float(row["ci_low"]), float(row["ci_high"])
    bounded = np.isfinite(low) and np.isfinite(high)
    if not bool(row["primary"]):
        p = float(row["p"])
        if not (bounded and np.isfinite(p)):
            return "exploratory: estimate only, no interval"
        side = "the paper's direction" if (row["estimate"] > 0) == (sign > 0) else "opposite"
        direction = "no direction (interval holds 0)" if low <= 0 <= high else side
        return f"exploratory: {direction}, p = {p:.2g} unadjusted"
    p = float(row["p_holm"])
    if bounded and np.isfinite(p) and p < ALPHA and not low <= 0 <= high:
        return "reproduced" if (low > 0) == (sign > 0) else "refuted"
    if bounded and np.isfinite(effect) and -effect < low and high < effect:
        return f"inconclusive: no effect of the declared size (interval within +-{effect:g})"
    if not np.isfinite(power):
        return "inconclusive: its power at the declared effect is unknown (no pilot value)"
    if power < TARGET_POWER:
        return f"inconclusive: underpowered ({power:.2f} at the declared effect {effect:g})"
    return f"inconclusive: powered ({power:.2f}) for {effect:g}, which the interval holds"


def claims_table(
    analyses: pd.DataFrame,
    primary: Mapping[str, Mapping[str, object]] | tuple[str, ...] = (),
    power: pd.DataFrame | None = None,
    flags: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per ``CLAIMS`` entry from the combined analysis table (``CLAIM_COLUMNS``).

    ``primary``: the declared tests (config ``stats.primary``: id -> {effect, source}; a
    declared test the design lacks stays marked primary); ``power``: ``bench/power.py``'s table
    (analysis, effect, power), used where its effect is the declared one; ``flags``: analysis id
    -> a warning added to its limits (e.g. a K above a model's effective rank).
    """
    declared = {k: dict(v) for k, v in primary.items()} if isinstance(primary, Mapping) else {}
    names = set(primary)
    powers = {}
    if power is not None:
        powers = {str(r["analysis"]): r for _, r in power.iterrows()}
    by_id = {row["analysis"]: row for _, row in analyses.iterrows()}
    rows = []
    for claim in CLAIMS:
        row = by_id.get(claim.analysis)
        limits = claim.limits
        if row is not None and row["note"]:
            limits += f"; {row['note']}"
        effect, powered = np.nan, np.nan
        if claim.analysis in names:
            effect = float(declared.get(claim.analysis, {}).get("effect", np.nan))
            source = declared.get(claim.analysis, {}).get("source")
            limits += f"; declared effect {effect:g} ({source})" if source else ""
            pilot = powers.get(claim.analysis)
            usable = pilot is not None and np.isfinite(float(pilot["power"]))
            if usable and np.isclose(float(pilot["effect"]), effect):
                powered = float(pilot["power"])
                limits += f"; power {powered:.2f} at Holm's first threshold {pilot['alpha']:.3g}"
                if powered < TARGET_POWER:
                    need = pilot.get("n_for_target", np.nan)
                    limits += (
                        f": 80% needs {int(need)} units, beyond this design's budget"
                        if np.isfinite(need)
                        else ": 80% needs more than 10 times the pilot's units"
                    )
            elif np.isfinite(effect):
                limits += "; no pilot power at this effect (python bench/power.py)"
        else:
            limits += "; exploratory (not a declared primary test)"
        if flags and claim.analysis in flags:
            limits += f"; {flags[claim.analysis]}"
        values = {
            key: (row[key] if row is not None else np.nan)
            for key in ("estimate", "ci_low", "ci_high", "unit", "n", "p", "p_holm")
        }
        if row is not None:
            row = row.copy()
            row["primary"] = claim.analysis in names
        rows.append(
            dict(claim=claim.text, measure=claim.measure)
            | values
            | dict(
                primary=claim.analysis in names,
                verdict=verdict(row, claim.sign, effect, powered),
                limits=limits if row is not None else f"{limits}; not run with this design",
                effect=effect,
                power=powered,
            )
        )
    return pd.DataFrame(rows, columns=list(CLAIM_COLUMNS))


def _number(value: object) -> str:
    """A table cell: 3 significant digits, blank for NaN."""
    if isinstance(value, (float, np.floating)):
        return "" if not np.isfinite(value) else f"{value:.3g}"
    return str(value)


def claims_markdown(claims: pd.DataFrame, commit: str) -> str:
    """``claims`` as a markdown table stamped with the run's commit, then its reading in words
    (``claims_prose``): the README's statements about results come from here, never by hand.
    """
    lines = [
        f"Claims of the paper and their verdicts from the run at commit `{commit}` "
        "(`results/stats/claims.csv`; p_holm: Holm over the declared primary tests; power: "
        "at the declared effect and Holm's first threshold, from a pilot run before this one).",
        "",
        "| claim | measure | estimate [95% CI] | unit (n) | p | p_holm | primary | effect "
        "| power | verdict | limits |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, row in claims.iterrows():
        cells = [
            row["claim"],
            row["measure"],
            _interval(row),
            _unit(row),
            _number(row["p"]),
            _number(row["p_holm"]),
            "yes" if row["primary"] else "no",
            _number(row["effect"]),
            _number(row["power"]),
            f"**{row['verdict']}**",
            row["limits"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + claims_prose(claims)


def _interval(row: pd.Series) -> str:
    """``estimate [low, high]`` (the estimate alone without an interval; blank without one)."""
    if not np.isfinite(row["estimate"]):
        return ""
    if not (np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"])):
        return _number(row["estimate"])
    return f"{_number(row['estimate'])} [{_number(row['ci_low'])}, {_number(row['ci_high'])}]"


def _unit(row: pd.Series) -> str:
    """``unit (n)``, blank without units."""
    return "" if pd.isna(row["n"]) else f"{row['unit']} ({int(row['n'])})"


def claim_quote(row: pd.Series) -> str:
    """A claims row as a figure panel quotes it, in ``claims_markdown``'s digits: 'claim
    (primary): estimate [low, high] unit (n), p = .., Holm p = ..' then its verdict.
    """
    kind = "primary" if str(row["primary"]).lower() == "true" else "exploratory"
    if not np.isfinite(float(row["estimate"])):
        return f"claim ({kind}): {row['verdict']}"
    numbers = ", ".join(
        f"{name} = {_number(float(row[key]))}"
        for name, key in (("p", "p"), ("Holm p", "p_holm"))
        if np.isfinite(float(row[key]))
    )
    unit = _unit(row)
    return (
        f"claim ({kind}): {_interval(row)}{f' {unit}' if unit else ''}"
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
                f"{_interval(row)} over {_unit(row)}."
            )
    return "\n".join(lines) + "\n"
