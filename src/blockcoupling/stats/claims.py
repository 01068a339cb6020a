"""One row per paper claim, with its verdict read from the analysis tables (the markdown
rendering: ``claims_markdown``).

Verdicts say no more than the evidence. A primary test's clauses quote its Holm-level
interval: its t interval at Holm's first threshold alpha / m (m: the declared tests Holm runs
over), the level its decision is read at.

- "not testable with this design": the analysis is absent or has no estimate;
- a declared primary test (config ``stats.primary``): "reproduced" / "refuted" when its Holm p
  (of the larger of its CR1/t p and its wild cluster bootstrap p) is below ``ALPHA``, on the
  paper's side (and its design's conditions hold: ``Claim.agree``, ``Claim.check``) / the
  other; "refuted" only where the design tests the claim at the scale the paper made it
  (``Claim.scale`` empty), else "not reproduced in this design", with the paper's scale and the
  design's. "No effect of the declared size" only from a declared equivalence test (the entry's
  ``equivalence`` bound: its TOST row, ``inference.tost_row``, Holm-adjusted with the other
  primaries). Else, when the tests disagree about significance after Holm: "inconclusive"
  (the verdict waits for both); when underpowered (pilot power below ``TARGET_POWER``):
  "inconclusive: underpowered"; when powered and the Holm-level interval excludes the declared
  effect E: "not reproduced at the declared size", from the one-sided t test of H0: effect >=
  E in the paper's direction, Holm-adjusted over the primaries (``p_effect_holm``); when it
  holds both 0 and E: "inconclusive";
- an exploratory row: "exploratory:" with its direction (the paper's, the opposite, or none:
  the interval holds 0) and its unadjusted p (and the wild cluster bootstrap's, where there is
  one); never "reproduced" or "refuted".
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy import stats as sps

from blockcoupling.stats import power as power_of
from blockcoupling.stats.claim_list import CLAIMS, Claim  # noqa: F401 (their former home)
from blockcoupling.stats.claims_markdown import (  # noqa: F401 (their former home, kept)
    END,
    START,
    claim_quote,
    claims_markdown,
    claims_prose,
    number,
)
from blockcoupling.stats.core import holm
from blockcoupling.stats.decision_power import Design, decision_power
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
    "holm_low",
    "holm_high",
    "p_effect",
    "p_effect_holm",
)
ALPHA = 0.05
TARGET_POWER = 0.8
ACHIEVED_SIM = 1000  # simulated studies of a run's own power (the pilot's: DECISION_SIM)


def claim_of(analysis: str) -> str:
    """The text of the claim that analysis id ``analysis`` tests (KeyError: none does)."""
    return next(claim.text for claim in CLAIMS if claim.analysis == analysis)


def _df(row: pd.Series) -> int:
    """The row's reference df: the one its note states, else n - 1."""
    df = power_of.df_of(row)
    return df if df is not None else (int(row["n"]) - 1 if pd.notna(row["n"]) else 0)


def _se(row: pd.Series) -> float:
    """The row's standard error from its 95% t interval (NaN without one)."""
    df = _df(row)
    if df < 1:
        return np.nan
    return (float(row["ci_high"]) - float(row["ci_low"])) / (2 * sps.t.ppf(0.975, df))


def holm_interval(row: pd.Series, m: int) -> tuple[float, float]:
    """The row's t interval at Holm's first threshold ``ALPHA`` / ``m``: the level its verdict
    is decided at (its 95% interval when m = 1).
    """
    se = _se(row)
    if not np.isfinite(se):
        return np.nan, np.nan
    half = sps.t.ppf(1 - power_of.holm_first_alpha(m, ALPHA) / 2, _df(row)) * se
    return float(row["estimate"]) - half, float(row["estimate"]) + half


def p_below_effect(row: pd.Series, effect: float, sign: int) -> float:
    """One-sided t p of H0: the effect is at least ``effect`` in the paper's direction
    (``sign``): small when the estimate lies well short of the declared effect.
    """
    se = _se(row)
    if not (np.isfinite(se) and se > 0 and np.isfinite(effect)):
        return np.nan
    return float(sps.t.cdf((sign * float(row["estimate"]) - abs(effect)) / se, _df(row)))


def verdict(
    row: pd.Series | None,
    sign: int,
    effect: float = np.nan,
    power: float = np.nan,
    scale: str = "",
    tost: pd.Series | None = None,
    t_holm: float = np.nan,
    agree: pd.Series | None = None,
    check: pd.Series | None = None,
) -> str:
    """The verdict of one analysis row for a claim predicting ``sign`` (+1 or -1), as the
    module docstring says; a primary row's ``effect`` (declared, the estimate's units) and
    ``power`` (at that effect), ``scale`` why an opposite result refutes nothing
    (``Claim.scale``), ``tost`` its declared equivalence test's row, ``t_holm`` its Holm p from
    the t tests' p alone (``claims_table``), to tell whether the two tests disagree at the
    threshold the verdict uses; ``agree`` the row of a sign-agreement condition
    (``Claim.agree``), ``check`` the row of a design check whose interval must lie above 0
    (``Claim.check``). The row's ``holm_low``/``holm_high`` and ``p_effect_holm`` (set by
    ``claims_table``; else its 95% interval and its unadjusted one-sided p, as for one test).
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
    if not bounded:
        return "inconclusive: no interval from these units (its limits say why)"
    h_low, h_high = (float(row.get(k, v)) for k, v in (("holm_low", low), ("holm_high", high)))
    quoted = f"Holm-level interval [{number(h_low)}, {number(h_high)}]"
    p = float(row["p_holm"])
    if np.isfinite(p) and p < ALPHA and not low <= 0 <= high:
        if (row["estimate"] > 0) == (sign > 0):
            if agree is not None and not (float(agree["estimate"]) > 0) == (sign > 0):
                return (
                    f"inconclusive: significant ({quoted}), but {agree['analysis']} (estimate "
                    f"{float(agree['estimate']):.3g}) does not have the same sign, which the "
                    "design requires for reproduced"
                )
            if check is not None and not float(check["ci_low"]) > 0:
                return (
                    f"inconclusive: significant ({quoted}), but {check['analysis']} (estimate "
                    f"{float(check['estimate']):.3g}, 95% interval [{number(check['ci_low'])}, "
                    f"{number(check['ci_high'])}]) does not lie above 0, which the design "
                    "requires for reproduced"
                )
            return f"reproduced ({quoted})"
        return (
            f"not reproduced in this design: the opposite direction ({quoted}), at another "
            f"scale ({scale})"
            if scale
            else f"refuted ({quoted})"
        )
    if tost is not None and float(tost["p_holm"]) < ALPHA:
        where = " in this design" if scale else ""
        return (
            f"not reproduced{where}: no effect of the declared size ({tost['method']}, Holm p = "
            f"{float(tost['p_holm']):.2g}; {quoted})"
            + (f", at another scale ({scale})" if scale else "")
        )
    if _disagree(row, t_holm):
        return (
            f"inconclusive: the t test (p = {float(row['p']):.2g}) and the wild cluster bootstrap "
            f"(p = {float(row['p_wild']):.2g}) disagree about significance (Holm p "
            f"{t_holm:.2g} from the t tests, {p:.2g} from the larger p); the larger p decides "
            f"(the verdict waits for both; {quoted})"
        )
    if not np.isfinite(power):
        return (
            f"inconclusive: its power at the declared effect is unknown (no pilot value; {quoted})"
        )
    if power < TARGET_POWER:
        return (
            f"inconclusive: underpowered ({power:.2f} at the declared effect {effect:g}; {quoted})"
        )
    target = sign * abs(effect)  # the declared effect, in the paper's direction
    if np.isfinite(h_low) and h_low <= 0 <= h_high and h_low <= target <= h_high:
        return (
            f"inconclusive: the {quoted} holds both 0 and the declared effect {effect:g} "
            f"(power {power:.2f})"
        )
    p_one = float(row.get("p_effect", p_below_effect(row, effect, sign)))
    p_adjusted = float(row.get("p_effect_holm", p_one))
    if np.isfinite(h_low) and not h_low <= target <= h_high and p_adjusted < ALPHA:
        return (
            f"not reproduced at the declared size {effect:g} (one-sided p = {p_one:.2g}, Holm "
            f"p = {p_adjusted:.2g}; {quoted}; power {power:.2f})"
        )
    return f"inconclusive: {quoted} (power {power:.2f} at the declared effect {effect:g})"


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


def _limits(
    claim: Claim,
    declared: Mapping[str, object],
    by_id: Mapping[str, pd.Series],
    pilot: pd.Series | None,
    effect: float,
) -> tuple[str, float]:
    """A primary claim's limits (declared effect, equivalence test, pilot power) and its pilot
    power at the declared effect (NaN: none at that effect).
    """
    limits, powered = "", np.nan
    source = declared.get("source")
    limits += f"; declared effect {effect:g} ({source})" if source else ""
    tost = by_id.get(claim.analysis + EQUIVALENCE)
    if tost is not None:
        tested = np.isfinite(float(tost["p"]))
        limits += f"; declared equivalence: {tost['method']}" + (
            f", p = {number(tost['p'])}, Holm p = {number(tost['p_holm'])}" if tested else ""
        )
        limits += f" ({tost['note']})"
    usable = pilot is not None and np.isfinite(float(pilot["power"]))
    if usable and np.isclose(float(pilot["effect"]), effect):
        powered = float(pilot["power"])
        limits += f"; power {powered:.2f} at Holm's first threshold {pilot['alpha']:.3g}"
        if powered < TARGET_POWER:
            need = pilot.get("n_for_target", np.nan)
            limits += (
                f": 80% needs {int(need)} units (a CR1 test's: clusters; an arms design's: per "
                "arm), beyond this design's budget"
                if np.isfinite(need)
                else ": 80% needs more than 4 times this design's units"
            )
    elif np.isfinite(effect):
        limits += "; no pilot power at this effect (blockcoupling pilot power)"
    return limits, powered


def _with_holm_level(
    analyses: pd.DataFrame, names: set[str], declared: Mapping[str, Mapping[str, object]]
) -> dict[str, dict[str, float]]:
    """Per declared test with a row: its Holm-level interval (``holm_interval`` over the m
    primary rows Holm runs over), its one-sided p against its declared effect
    (``p_below_effect``) and that p Holm-adjusted over the declared tests.
    """
    held = (
        analyses["primary"].astype(bool)
        if "primary" in analyses
        else analyses["analysis"].isin(names)
    )
    m = int(held.sum())
    sign = {claim.analysis: claim.sign for claim in CLAIMS}
    out = {}
    for _, row in analyses[analyses["analysis"].isin(names)].iterrows():
        name = row["analysis"]
        effect = float(declared.get(name, {}).get("effect", np.nan))
        h_low, h_high = holm_interval(row, max(m, 1))
        out[name] = dict(
            holm_low=h_low,
            holm_high=h_high,
            p_effect=p_below_effect(row, effect, sign.get(name, 1)),
        )
    adjusted = holm([v["p_effect"] for v in out.values()]) if out else []
    for values, p in zip(out.values(), adjusted):
        values["p_effect_holm"] = float(p)
    return out


def claims_table(
    analyses: pd.DataFrame,
    primary: Mapping[str, Mapping[str, object]] | tuple[str, ...] = (),
    power: pd.DataFrame | None = None,
    flags: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per ``CLAIMS`` entry from the combined analysis table (``CLAIM_COLUMNS``).

    ``primary``: the declared tests (config ``stats.primary``: id -> {effect, source}; a
    declared test the design lacks stays marked primary); ``power``: the table ``blockcoupling
    pilot power`` writes (analysis, effect, power), used where its effect is the declared one;
    ``flags``: analysis id -> a warning added to its limits (e.g. a K above a model's effective
    rank).
    """
    declared = {k: dict(v) for k, v in primary.items()} if isinstance(primary, Mapping) else {}
    names = set(primary)
    powers = {}
    if power is not None:
        powers = {str(r["analysis"]): r for _, r in power.iterrows()}
    by_id = {row["analysis"]: row for _, row in analyses.iterrows()}
    t_holm, levels = {}, {}  # Holm over the t tests' p of the rows Holm runs over
    if len(analyses):
        held = analyses[analyses["analysis"].isin([*names, *(n + EQUIVALENCE for n in names)])]
        t_holm = dict(zip(held["analysis"], holm(held["p"].astype(float))))
        levels = _with_holm_level(analyses, names, declared)
    rows = []
    for claim in CLAIMS:
        row = by_id.get(claim.analysis)
        limits = claim.limits
        if row is not None and row["note"]:
            limits += f"; {row['note']}"
        effect, powered = np.nan, np.nan
        if claim.analysis in names:
            effect = float(declared.get(claim.analysis, {}).get("effect", np.nan))
            extra, powered = _limits(
                claim, declared.get(claim.analysis, {}), by_id, powers.get(claim.analysis), effect
            )
            limits += extra
        else:
            limits += "; exploratory (not a declared primary test)"
        if flags and claim.analysis in flags:
            limits += f"; {flags[claim.analysis]}"
        values = {
            key: (row[key] if row is not None else np.nan)
            for key in ("estimate", "ci_low", "ci_high", "unit", "n", "p", "p_wild", "p_holm")
        }
        level = levels.get(claim.analysis, {})
        if row is not None:
            row = pd.concat([row, pd.Series(level, dtype=float)])
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
                    by_id.get(claim.check) if claim.check else None,
                ),
                limits=limits if row is not None else f"{limits}; not run with this design",
                effect=effect,
                power=powered,
                power_achieved=(
                    achieved_power(row, effect, len(names), claim, by_id)
                    if claim.analysis in names and row is not None
                    else np.nan
                ),
            )
            | {k: level.get(k, np.nan) for k in CLAIM_COLUMNS[-4:]}
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


def achieved_power(
    row: pd.Series,
    effect: float,
    n_primary: int,
    claim: Claim | None = None,
    by_id: Mapping[str, pd.Series] | None = None,
) -> float:
    """The run's own power at the declared ``effect`` (not at its estimate): the pilot's
    simulation (``decision_power``: the t test and the wild bootstrap below Holm's first
    threshold over ``n_primary`` tests, the estimate on the declared side, the design's
    conditions) with the spread of this run's units, from its interval. NaN without one.
    """
    se = _se(row)
    if not (np.isfinite(se) and se > 0 and np.isfinite(effect)):
        return np.nan
    n = int(row["n"]) if pd.notna(row["n"]) else 0
    alpha = power_of.holm_first_alpha(n_primary, ALPHA)
    kind = claim.design if claim is not None else "mean"
    sign = claim.sign if claim is not None else 1
    other = (by_id or {}).get(claim.agree or claim.check) if claim is not None else None
    if kind == "arms":
        check = None
        if other is not None and np.isfinite(_se(other)):
            check = (float(other["estimate"]), _se(other) * np.sqrt(n / 4))
        design = Design("arms", se * np.sqrt(n / 4), check=check)
        n = n // 2
    elif kind == "slope":
        agree = float(other["estimate"]) if other is not None else None
        design = Design("slope", agree_r=agree if agree is not None and abs(agree) < 1 else None)
    else:
        design = Design("mean", se * np.sqrt(n))
    return decision_power(design, sign * abs(effect), n, alpha, n_sim=ACHIEVED_SIM)
