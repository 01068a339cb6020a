"""Power of the declared primary tests at their declared effect, before the run.

Every primary test is a t statistic (a one-sample or paired t over units, an OLS slope, or a CR1
slope with a t(G-1) reference): ``estimate / se`` against t(df). Its power at a declared effect
``E`` is P(|T| > t_crit) for T = (E + se Z) / (se sqrt(chi2_df / df)), a noncentral t; here it
is a seeded Monte Carlo of that statistic (``simulated_power``), checked against scipy's
noncentral t in the tests. ``se`` comes from a pilot run (its interval's half width over
t_{0.975}(df)) and scales with sqrt(n_pilot / n) to another design size. The units are the
test's independent ones: for a CR1 test its clusters (G, df = G - 1: rows added within a cluster,
e.g. seeds of one configuration, add no degree of freedom), else its rows (each adds one df).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

ALPHA = 0.05
TARGET = 0.8
N_SIM = 20_000
POWER_COLUMNS = (
    "analysis",
    "effect",
    "pilot_estimate",
    "pilot_se",
    "pilot_n",
    "pilot_df",
    "n",
    "df",
    "alpha",
    "power",
    "n_for_target",
)


def holm_first_alpha(n_primary: int, alpha: float = ALPHA) -> float:
    """The smallest Holm threshold, alpha / m: the level a primary test's power is quoted at."""
    return alpha / max(int(n_primary), 1)


def simulated_power(
    effect: float, se: float, df: int, alpha: float, n_sim: int = N_SIM, seed: int = 0
) -> float:
    """Two-sided power of a t test (``estimate / se`` against t(df)) when the true value is
    ``effect`` (the estimate's units) and its standard error ``se``: the share of ``n_sim``
    seeded draws of (effect + se Z) / (se sqrt(chi2_df / df)) beyond t_{1 - alpha/2}(df).
    """
    if not (np.isfinite(effect) and np.isfinite(se) and se > 0 and df >= 1):
        return np.nan
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n_sim)
    scale = np.sqrt(rng.chisquare(df, n_sim) / df)
    t = (effect / se + z) / scale
    return float(np.mean(np.abs(t) > sps.t.ppf(1 - alpha / 2, df)))


def scaled_power(
    n: int, effect: float, se: float, n0: int, df0: int, alpha: float, seed: int = 0
) -> float:
    """``simulated_power`` at ``n`` units of a test whose pilot had ``n0`` units, standard error
    ``se`` and ``df0`` degrees of freedom: se scales as sqrt(n0 / n), df moves by n - n0.
    """
    return simulated_power(effect, se * np.sqrt(n0 / n), df0 + n - n0, alpha, seed=seed)


def df_of(row: Mapping[str, object]) -> int | None:
    """The reference distribution's degrees of freedom an analysis row states in its note
    (``t(9)``, ``t(R-1)`` written out, or ``df=15``); None when it states none.
    """
    found = re.findall(r"\bt\((\d+)\)|\bdf=(\d+)", str(row.get("note", "")))
    values = [int(a or b) for a, b in found]
    return values[-1] if values else None


def units_of(row: Mapping[str, object], df: int) -> int:
    """The pilot's independent units: a CR1 test's clusters (``df + 1``, its note says
    ``CR1``), else its ``n``.
    """
    return df + 1 if "CR1" in f"{row.get('method', '')} {row.get('note', '')}" else int(row["n"])


def pilot_power(
    pilot: pd.DataFrame,
    primary: Mapping[str, Mapping[str, object]],
    design_n: Mapping[str, int] | None = None,
    alpha: float = ALPHA,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per declared primary test (``POWER_COLUMNS``): its declared ``effect``, the pilot
    run's estimate, standard error (from its 95% interval and df), n (its independent units,
    ``units_of``: clusters for a CR1 test) and df, the design's n in the same units (the
    pilot's unless ``design_n`` names another; df moves by the same difference) and the power at
    Holm's first threshold alpha / m, and the n that would give ``TARGET`` power (NaN: above
    10 x the pilot's). ``pilot``: a run's ``results/stats/analyses.csv``.
    """
    by_id = {str(r["analysis"]): r for _, r in pilot.iterrows()}
    level = holm_first_alpha(len(primary), alpha)
    rows = []
    for analysis, declared in primary.items():
        effect = float(declared["effect"])
        row = by_id.get(analysis)
        df = df_of(row) if row is not None else None
        if row is None or df is None or not np.isfinite(row["ci_high"]):
            rows.append(dict(analysis=analysis, effect=effect, alpha=level))
            continue
        n0 = units_of(row, df)
        se0 = (float(row["ci_high"]) - float(row["ci_low"])) / (2 * sps.t.ppf(0.975, df))
        n = int((design_n or {}).get(analysis, n0))
        scaled = dict(effect=effect, se=se0, n0=n0, df0=df, alpha=level, seed=seed)
        sizes = range(n0 - df + 1, 10 * n0 + 1)
        target = next((m for m in sizes if scaled_power(m, **scaled) >= TARGET), None)
        rows.append(
            dict(
                analysis=analysis,
                effect=effect,
                pilot_estimate=float(row["estimate"]),
                pilot_se=se0,
                pilot_n=n0,
                pilot_df=df,
                n=n,
                df=df + n - n0,
                alpha=level,
                power=scaled_power(n, **scaled),
                n_for_target=np.nan if target is None else target,
            )
        )
    return pd.DataFrame(rows, columns=list(POWER_COLUMNS))


def keep_other_rows(fresh: pd.DataFrame, kept: pd.DataFrame, only: Sequence[str]) -> pd.DataFrame:
    """``fresh``'s rows of the analyses ``only`` and, for every other analysis of ``fresh``,
    its row of ``kept`` (an earlier power table: those tests keep their own pilot's power), in
    ``fresh``'s order; a one-line ValueError names an analysis that cannot be.
    """
    unknown = sorted(set(only) - set(fresh["analysis"]))
    if unknown:
        raise ValueError(f"--only {unknown[0]}: not a declared primary test of the config")
    old, new = kept.set_index("analysis"), fresh.set_index("analysis")
    missing = [a for a in new.index if a not in only and a not in old.index]
    if missing:
        raise ValueError(
            f"{missing[0]} has no row in the power table to keep: recompute it with --only "
            f"{missing[0]}"
        )
    rows = [(new if a in only else old).loc[[a]] for a in new.index]
    return pd.concat(rows).rename_axis("analysis").reset_index()[list(fresh.columns)]


def n_for_power(power_at: Callable[[int], float], start: int, stop: int) -> float:
    """The smallest n in [start, stop] whose ``power_at(n)`` reaches ``TARGET`` (NaN: none),
    by bisection (power rises with n; a simulated power's Monte Carlo error can move the
    answer by a unit or two).
    """
    if start > stop or not power_at(stop) >= TARGET:
        return np.nan
    low, high = start, stop  # power_at(high) reaches the target
    while low < high:
        mid = (low + high) // 2
        if power_at(mid) >= TARGET:
            high = mid
        else:
            low = mid + 1
    return float(high)
