"""One row per paper claim, with its verdict read from the analysis tables, and the markdown
rendering the README carries between ``<!-- claims:start -->`` and ``<!-- claims:end -->``.

Verdicts say no more than the evidence:

- "not testable with this design": the analysis is absent or has no estimate;
- a declared primary test (config ``stats.primary``): "reproduced" / "refuted" when its Holm p
  (of the larger of its CR1/t p and its wild cluster bootstrap p) is below ``ALPHA`` and its
  interval excludes 0 on the paper's side / the other; "refuted" only where the design tests
  the claim at the scale the paper made it (``Claim.scale`` empty), else "not reproduced in
  this design", with the paper's scale and the design's. "No effect of the declared size" only
  from a declared equivalence test (the entry's ``equivalence`` bound: its TOST row,
  ``inference.tost_row``, Holm-adjusted with the other primaries). Else "inconclusive", saying
  why: the two tests disagree about significance after Holm (the verdict waits for both),
  "underpowered" (its power at the declared effect, from a pilot, is below ``TARGET_POWER``),
  or powered but neither excluded;
- an exploratory row: "exploratory:" with its direction (the paper's, the opposite, or none:
  the interval holds 0) and its unadjusted p (and the wild cluster bootstrap's, where there is
  one); never "reproduced" or "refuted".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from blockcoupling.stats import power as power_of
from blockcoupling.stats.core import holm
from blockcoupling.stats.inference import EQUIVALENCE

CLAIM_COLUMNS = (
    "claim",
    "measure",
    "estimate",
    "ci_low",
    "ci_high",
    "unit",
    "n",
    "p",
    "p_wild",
    "p_holm",
    "primary",
    "verdict",
    "limits",
    "effect",
    "power",
    "power_achieved",
)
ALPHA = 0.05
TARGET_POWER = 0.8
START, END = "<!-- claims:start -->", "<!-- claims:end -->"


@dataclass(frozen=True)
class Claim:
    """A claim of the paper, the analysis id that tests it, the sign it predicts, and ``scale``:
    the scale the paper made it at against this design's (empty: the design tests it there).
    """

    text: str
    analysis: str
    measure: str
    sign: int
    limits: str
    scale: str = ""
    agree: str = ""  # another analysis whose estimate must share the sign for "reproduced"


LLMS = "the paper's: pretrained LLMs of 117M-70B parameters; here: small models trained here"
PYTHIA = (
    "the paper's: Pythia 6.9B and 12B over 143k steps; here: small models trained here (the "
    "default's: 4 blocks, width 64, 1,000 steps)"
)
VIT = (
    "the paper's: 64 ViTs of width 192 and depth 12 trained 500 epochs on CIFAR-10; here: config "
    "vit (the default's: width 64, depth 6, 12 epochs on 8 x 8 digits)"
)


CLAIMS = (
    Claim(
        "Training couples the blocks: trained models are more coupled than random-init twins",
        "fixed_size_trained_vs_random",
        "coupling_excess, trained - twin, on held-out prompts",
        +1,
        "the fixed-size runs; configurations as units",
        LLMS,
    ),
    Claim(
        "More coupled models generalize better (held-out bits per byte)",
        "fixed_size_excess_vs_bpb",
        "sd of -bits per byte per sd of coupling_excess at stats.k (held-out Shakespeare prompts)",
        +1,
        "one small architecture trained here; generalization varied by the data fraction at one "
        "size; each run its own seed (init and data): runs are the units; reproduced only if the "
        "subspace overlap's slope (fixed_size_overlap_u_vs_bpb) has the same sign",
        LLMS,
        agree="fixed_size_overlap_u_vs_bpb",
    ),
    Claim(
        "The same beyond the spectrum's shape (secondary)",
        "fixed_size_excess_vs_bpb_rank_adjusted",
        "sd of -bits per byte per sd of coupling_excess, adjusted for the runs' log effective rank",
        +1,
        "the excess also tracks the spectrum's shape across runs (docs/science.md, 'Which K')",
        LLMS,
    ),
    Claim(
        "The same with the paper's raw coupling",
        "fixed_size_coupling_vs_bpb_rank_adjusted",
        "sd of -bits per byte per sd of raw coupling (minus mean m_K), held-out prompts, adjusted "
        "for log effective rank",
        +1,
        "raw m_K has a chance level that moves with the spectrum; the excess is the calibrated "
        "measure",
        LLMS,
    ),
    Claim(
        "More coupled models have a smaller generalization gap",
        "fixed_size_excess_vs_gap_rank_adjusted",
        "sd of val - train loss per sd of coupling_excess, held-out prompts, adjusted for log "
        "effective rank",
        -1,
        "gap at each run's last step; same runs as above",
        LLMS,
    ),
    Claim(
        "Coupling emerges with training: higher at the end than at initialization",
        "emergence_final_vs_init",
        "coupling_excess, last checkpoint - step 0, paired per run",
        +1,
        "small runs trained here; runs that share an initialization averaged first",
        PYTHIA,
    ),
    Claim(
        "Coupling increases persistently through training (no decline after its peak)",
        "emergence_relaxation",
        "coupling_excess, last checkpoint - the declared peak step (stats.peak_step)",
        +1,
        "the peak step is declared from a pilot run before this one",
        PYTHIA,
    ),
    Claim(
        "Within a run, coupling grows as the model gets better (validation loss)",
        "emergence_within_loss",
        "per run, Fisher z of Spearman rho of coupling_excess with minus validation loss over "
        "its checkpoints after step 0",
        +1,
        "small runs trained here, each its own seed (init and data); half at a small data "
        "fraction trained long, where validation loss turns up, so a measure tracking training "
        "time alone falls; no-effect level 0",
        PYTHIA,
    ),
    Claim(
        "Coupling becomes more pronounced between adjacent layers with training (locality)",
        "emergence_locality",
        "(adjacent - all-pairs coupling_excess), last checkpoint - step 0",
        +1,
        "4-block models: adjacent pairs are 3 of 6",
        PYTHIA,
    ),
    Claim(
        "Coupling across tokens emerges with training: self family (J_tt vs J_t't')",
        "tokens_self_trained_vs_random",
        "token-pair excess (t != t'), trained - twin",
        +1,
        (
            "extract.token_layers x token_prompts per model, averaged within it; the twin is "
            "the run's own (random_init.per_run) or one shared by the runs"
        ),
        LLMS,
    ),
    Claim(
        "Coupling across tokens emerges with training: context (fixed input, fixed output)",
        "tokens_context_trained_vs_random",
        "token-pair excess (t != t'), mean of fixed input and fixed output, trained - twin",
        +1,
        (
            "extract.token_layers x token_prompts per model, averaged within it; the twin is "
            "the run's own (random_init.per_run) or one shared by the runs"
        ),
        LLMS,
    ),
    Claim(
        "Stochastic depth increases coupling (ViT)",
        "vit_sd_effect",
        "coupling_excess per unit drop-path rate, seed as a block",
        +1,
        "small ViTs on a small image set; fixed weight decay",
        VIT,
    ),
    Claim(
        "At a fixed rate, more coupled ViTs are more accurate",
        "vit_accuracy_within_rate",
        "test accuracy per sd of coupling_excess, rate and seed fixed effects",
        +1,
        "small ViTs; a seed fixes init and data order at every rate, so it is a block: the "
        "slope rests on the seed-by-rate variation",
        VIT,
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


def verdict(
    row: pd.Series | None,
    sign: int,
    effect: float = np.nan,
    power: float = np.nan,
    scale: str = "",
    tost: pd.Series | None = None,
    t_holm: float = np.nan,
    agree: pd.Series | None = None,
) -> str:
    """The verdict of one analysis row for a claim predicting ``sign`` (+1 or -1); a primary
    row's ``effect`` (declared, the estimate's units) and ``power`` (at that effect) say why
    an inconclusive test is inconclusive, ``scale`` why an opposite result refutes nothing
    (``Claim.scale``), ``tost`` its declared equivalence test's row, ``t_holm`` its Holm p from
    the t tests' p alone (``claims_table``), to tell whether the two tests disagree at the
    threshold the verdict uses (module docstring); ``agree`` the row of a declared
    sign-agreement condition (``Claim.agree``): "reproduced" only if its estimate has the same
    sign (else "inconclusive", naming it).
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
        return f"exploratory: {direction}, p = {p:.2g}{_wild(row)} unadjusted"
    p = float(row["p_holm"])
    if bounded and np.isfinite(p) and p < ALPHA and not low <= 0 <= high:
        if (low > 0) == (sign > 0):
            if agree is not None and not (float(agree["estimate"]) > 0) == (low > 0):
                return (
                    f"inconclusive: significant, but {agree['analysis']} (estimate "
                    f"{float(agree['estimate']):.3g}) does not have the same sign, which the "
                    "design requires for reproduced"
                )
            return "reproduced"
        return (
            f"not reproduced in this design: the opposite direction, at another scale ({scale})"
            if scale
            else "refuted"
        )
    if tost is not None and float(tost["p_holm"]) < ALPHA:
        where = " in this design" if scale else ""
        return (
            f"not reproduced{where}: no effect of the declared size ({tost['method']}, Holm p = "
            f"{float(tost['p_holm']):.2g})" + (f", at another scale ({scale})" if scale else "")
        )
    if _disagree(row, t_holm):
        return (
            f"inconclusive: the t test (p = {float(row['p']):.2g}) and the wild cluster bootstrap "
            f"(p = {float(row['p_wild']):.2g}) disagree about significance (Holm p "
            f"{t_holm:.2g} from the t tests, {p:.2g} from the larger p); the larger p decides "
            "(the verdict waits for both)"
        )
    if not np.isfinite(power):
        return "inconclusive: its power at the declared effect is unknown (no pilot value)"
    if power < TARGET_POWER:
        return f"inconclusive: underpowered ({power:.2f} at the declared effect {effect:g})"
    target = sign * abs(effect)  # the declared effect, in the paper's direction
    if bounded and low <= target <= high:
        return f"inconclusive: powered ({power:.2f}) for {effect:g}, which the interval holds"
    return (
        f"inconclusive: powered ({power:.2f}) for {effect:g}, which the interval excludes "
        "(no equivalence test is declared: not a finding of no effect)"
    )


def _wild(row: pd.Series) -> str:
    """``, wild p = ..`` when the row has a wild cluster bootstrap p, else empty."""
    wild = float(row.get("p_wild", np.nan))
    return f", wild p = {wild:.2g}" if np.isfinite(wild) else ""


def _disagree(row: pd.Series, t_holm: float) -> bool:
    """Whether the row's t test and its wild cluster bootstrap fall on either side of ``ALPHA``
    after Holm: ``t_holm`` (Holm over the t tests' p) against the row's ``p_holm`` (Holm over
    each test's larger p). Both tests must be there.
    """
    wild, decided = float(row.get("p_wild", np.nan)), float(row["p_holm"])
    usable = np.isfinite([float(row["p"]), wild, t_holm, decided]).all()
    return bool(usable and (t_holm < ALPHA) != (decided < ALPHA))


def claims_table(
    analyses: pd.DataFrame,
    primary: Mapping[str, Mapping[str, object]] | tuple[str, ...] = (),
    power: pd.DataFrame | None = None,
    flags: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per ``CLAIMS`` entry from the combined analysis table (``CLAIM_COLUMNS``).

    ``primary``: the declared tests (config ``stats.primary``: id -> {effect, source}; a
    declared test the design lacks stays marked primary); ``power``: the table ``blockcoupling
    power`` writes (analysis, effect, power), used where its effect is the declared one;
    ``flags``: analysis id -> a warning added to its limits (e.g. a K above a model's effective
    rank).
    """
    declared = {k: dict(v) for k, v in primary.items()} if isinstance(primary, Mapping) else {}
    names = set(primary)
    powers = {}
    if power is not None:
        powers = {str(r["analysis"]): r for _, r in power.iterrows()}
    by_id = {row["analysis"]: row for _, row in analyses.iterrows()}
    t_holm = {}  # Holm over the t tests' p of the rows Holm runs over (combine_analyses)
    if len(analyses):
        held = analyses[analyses["analysis"].isin([*names, *(n + EQUIVALENCE for n in names)])]
        t_holm = dict(zip(held["analysis"], holm(held["p"].astype(float))))
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
            tost = by_id.get(claim.analysis + EQUIVALENCE)
            if tost is not None:
                tested = np.isfinite(float(tost["p"]))
                limits += f"; declared equivalence: {tost['method']}" + (
                    f", p = {_number(tost['p'])}, Holm p = {_number(tost['p_holm'])}"
                    if tested
                    else ""
                )
                limits += f" ({tost['note']})"
            pilot = powers.get(claim.analysis)
            usable = pilot is not None and np.isfinite(float(pilot["power"]))
            if usable and np.isclose(float(pilot["effect"]), effect):
                powered = float(pilot["power"])
                limits += f"; power {powered:.2f} at Holm's first threshold {pilot['alpha']:.3g}"
                if powered < TARGET_POWER:
                    need = pilot.get("n_for_target", np.nan)
                    limits += (
                        f": 80% needs {int(need)} units (a CR1 test's: clusters), beyond "
                        "this design's budget"
                        if np.isfinite(need)
                        else ": 80% needs more than 10 times the pilot's units"
                    )
            elif np.isfinite(effect):
                limits += "; no pilot power at this effect (blockcoupling power)"
        else:
            limits += "; exploratory (not a declared primary test)"
        if flags and claim.analysis in flags:
            limits += f"; {flags[claim.analysis]}"
        values = {
            key: (row[key] if row is not None else np.nan)
            for key in ("estimate", "ci_low", "ci_high", "unit", "n", "p", "p_wild", "p_holm")
        }
        if row is not None:
            row = row.copy()
            row["primary"] = claim.analysis in names
        rows.append(
            dict(claim=claim.text, measure=claim.measure)
            | values
            | dict(
                primary=claim.analysis in names,
                verdict=verdict(
                    row,
                    claim.sign,
                    effect,
                    powered,
                    claim.scale,
                    by_id.get(claim.analysis + EQUIVALENCE),
                    t_holm.get(claim.analysis, np.nan),
                    _agree_row(by_id, claim),
                ),
                limits=limits if row is not None else f"{limits}; not run with this design",
                effect=effect,
                power=powered,
                power_achieved=(
                    achieved_power(row, effect, len(names))
                    if claim.analysis in names and row is not None
                    else np.nan
                ),
            )
        )
    return pd.DataFrame(rows, columns=list(CLAIM_COLUMNS))


def _agree_row(by_id: Mapping[str, pd.Series], claim: Claim) -> pd.Series | None:
    """The id and estimate a claim's sign-agreement condition reads (None: no condition; a
    NaN estimate when its row is absent, which never agrees).
    """
    if not claim.agree:
        return None
    row = by_id.get(claim.agree)
    estimate = float(row["estimate"]) if row is not None else np.nan
    return pd.Series({"analysis": claim.agree, "estimate": estimate})


def achieved_power(row: pd.Series, effect: float, n_primary: int) -> float:
    """The run's own power at the declared ``effect`` (not at its estimate): its standard error
    from its interval and the t reference its note states (else n - 1 df), at Holm's first
    threshold over ``n_primary`` tests; 0 when its units are too few for the wild bootstrap's
    p (at least 2/2^units) to pass that threshold. NaN without an interval.
    """
    low, high = float(row["ci_low"]), float(row["ci_high"])
    if not (np.isfinite(low) and np.isfinite(high) and np.isfinite(effect)):
        return np.nan
    n = int(row["n"]) if pd.notna(row["n"]) else 0
    df = power_of.df_of(row)
    df = df if df is not None else n - 1
    if df < 1:
        return np.nan
    alpha = power_of.holm_first_alpha(n_primary, ALPHA)
    if np.isfinite(float(row.get("p_wild", np.nan))) and 2.0 / 2 ** (df + 1) >= alpha:
        return 0.0
    se = (high - low) / (2 * sps.t.ppf(0.975, df))
    return power_of.simulated_power(effect, se, df, alpha)


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
        "(`results/stats/claims.csv`; p: the CR1 or t test's; p_wild: the wild cluster "
        "bootstrap's; p_holm: Holm over the declared primary tests of the larger of the two; "
        "power: at the declared effect and Holm's first threshold, from a pilot run before this "
        "one, on other seeds; power (run): the same from this run's own interval).",
        "",
        "| claim | measure | estimate [95% CI] | unit (n) | p | p_wild | p_holm | primary | effect "
        "| power | power (run) | verdict | limits |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, row in claims.iterrows():
        cells = [
            row["claim"],
            row["measure"],
            _interval(row),
            _unit(row),
            _number(row["p"]),
            _number(row["p_wild"]),
            _number(row["p_holm"]),
            "yes" if row["primary"] else "no",
            _number(row["effect"]),
            _number(row["power"]),
            _number(row.get("power_achieved", np.nan)),
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
        for name, key in (("p", "p"), ("wild p", "p_wild"), ("Holm p", "p_holm"))
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
