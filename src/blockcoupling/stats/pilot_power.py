"""Power of the declared primary tests from pilot runs (``blockcoupling pilot``): per-unit
pilot values of each primary and their power under the verdict's rule at the design's n.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats as sps

from blockcoupling.stats import power as pw
from blockcoupling.stats.checkpoints import within_loss_z
from blockcoupling.stats.inference import _cr1_t, wild_cluster_p

DECISION_SIM = 1000  # simulated studies per power value (the decision rule's power)
WILD_DRAWS = 999  # sign vectors per wild bootstrap inside the simulation (exact up to 2^12)


def _decision_p(y: np.ndarray, x: np.ndarray, column: int, draws: int, seed: int) -> float:
    """The p the verdict uses for coefficient ``column`` of ``y ~ x`` with one cluster per row
    (independent units): the larger of the CR1 t(G-1) p and the wild cluster bootstrap p
    (``inference.wild_cluster_p``), as ``claims.verdict`` reads them.
    """
    n = len(y)
    groups = np.arange(n)
    a = np.linalg.pinv(x)[column]
    t = float(_cr1_t(a, y[:, None], x, groups)[0])
    p_t = 2 * sps.t.sf(abs(t), n - 1)
    p_wild = wild_cluster_p(y, x, column, groups, draws=draws, seed=seed)
    return max(p_t, p_wild)


def _decided_share(
    studies: Iterator[tuple[np.ndarray, np.ndarray]],
    column: int,
    alpha: float,
    draws: int,
    seed: int,
    n_sim: int,
) -> float:
    """The share of ``n_sim`` simulated studies ``(y, x)`` whose verdict p (``_decision_p``
    of coefficient ``column``, study i's bootstrap seeded ``seed + i``) is below ``alpha``.
    """
    hits = sum(
        _decision_p(y, x, column, draws, seed + i) < alpha for i, (y, x) in enumerate(studies)
    )
    return hits / n_sim


def decision_power(
    pilot: np.ndarray,
    effect: float,
    n: int,
    alpha: float,
    n_sim: int = DECISION_SIM,
    seed: int = 0,
    draws: int = WILD_DRAWS,
) -> float:
    """Power of a one-sample test over ``n`` independent units (a paired difference or a
    per-run statistic per unit) under the verdict's rule: both the t test and the sign-flip
    (wild) bootstrap below ``alpha`` (``claims.verdict`` takes the larger p). Each simulated
    study resamples ``n`` values from the ``pilot``'s units, centred, and adds ``effect``: the
    pilot gives the spread and shape, the declared effect the mean. With few units the
    bootstrap's p cannot fall below 2 / 2^n, and the power is 0 when that is above ``alpha``
    (the t test alone would not see it).
    """
    pilot = np.asarray(pilot, dtype=float)
    pilot = pilot[np.isfinite(pilot)]
    if pilot.size < 2 or n < 2 or not np.isfinite(effect):
        return np.nan
    if 2.0 / 2**n >= alpha:  # the exact sign-flip bootstrap's floor: no study can pass
        return 0.0
    rng = np.random.default_rng(seed)
    centred = pilot - pilot.mean()
    ones = np.ones((n, 1))
    studies = ((effect + rng.choice(centred, size=n, replace=True), ones) for _ in range(n_sim))
    return _decided_share(studies, 0, alpha, draws, seed, n_sim)


def slope_decision_power(
    x: np.ndarray,
    y: np.ndarray,
    effect: float,
    n: int,
    alpha: float,
    n_sim: int = DECISION_SIM,
    seed: int = 0,
    draws: int = WILD_DRAWS,
) -> float:
    """Power of the standardized slope of ``y`` on ``x`` over ``n`` independent runs (one
    cluster each) under the verdict's rule (CR1 t(n-1) and the wild bootstrap both below
    ``alpha``), when the true standardized slope is ``effect``. Each simulated study resamples
    ``n`` of the pilot's runs: their z-scored ``x``, and as noise the pilot's residuals of z(y)
    on z(x), rescaled to variance 1 - effect^2 (so z(y) has unit variance); the pilot gives the
    distribution of the measure and of the noise, the declared effect the slope.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 4 or n < 4 or not 0 < abs(effect) < 1:
        return np.nan
    zx = (x - x.mean()) / x.std(ddof=1)
    zy = (y - y.mean()) / y.std(ddof=1)
    resid = zy - np.polyfit(zx, zy, 1)[0] * zx
    resid = (resid - resid.mean()) / resid.std(ddof=1) * np.sqrt(1 - effect**2)
    rng = np.random.default_rng(seed)

    def study() -> tuple[np.ndarray, np.ndarray]:
        xs = zx[rng.integers(0, x.size, size=n)]
        ys = effect * xs + resid[rng.integers(0, x.size, size=n)]
        return ys, np.column_stack([np.ones(n), xs])

    return _decided_share((study() for _ in range(n_sim)), 1, alpha, draws, seed, n_sim)


def pilot_units(
    within: pd.DataFrame, across: pd.DataFrame, k: int, steps: list[int]
) -> dict[str, Any]:
    """Per-unit pilot values of each primary: within-run Fisher z and last - first excess per
    suite (at the design's checkpoint steps), trained - twin token self excess per run, and the
    across-runs (excess, -val_loss) pairs.
    """
    col = f"excess_k{k}"
    suites = within[within["step"].isin(steps)].assign(neg_val_loss=lambda f: -f["val_loss"])
    z, growth = [], []
    for _, rows in suites.groupby("run"):
        rows = rows.sort_values("step")
        z.append(within_loss_z(rows.rename(columns={col: "coupling_excess"})))
        growth.append(float(rows[col].iloc[-1] - rows[col].iloc[0]))
    return {
        "emergence_within_loss": np.array(z),
        "emergence_final_vs_init": np.array(growth),
        "tokens_self_trained_vs_random": (
            across[f"tok_self_k{k}"] - across[f"twin_tok_self_k{k}"]
        ).to_numpy(),
        "fixed_size_excess_vs_bpb": (across[col].to_numpy(), -across["val_loss"].to_numpy()),
    }


def power_table(
    units: dict[str, Any],
    primary: dict[str, Any],
    design_n: dict[str, int],
    seed: int = 0,
    n_sim: int | None = None,
) -> pd.DataFrame:
    """``stats.power.POWER_COLUMNS`` rows: each declared primary's power under the verdict's
    rule at the design's n and Holm's first threshold, with the n that reaches 80%.
    """
    alpha = pw.holm_first_alpha(len(primary))
    sims = n_sim or DECISION_SIM
    rows = []
    for analysis, declared in primary.items():
        effect, n = float(declared["effect"]), int(design_n[analysis])
        values = units.get(analysis)
        if values is None:
            rows.append(dict(analysis=analysis, effect=effect, n=n, alpha=alpha))
            continue
        if isinstance(values, tuple):
            x, y = values

            def at(m, x=x, y=y, effect=effect):
                return slope_decision_power(x, y, effect, m, alpha, sims, seed)

            keep = np.isfinite(x) & np.isfinite(y)
            estimate = float(np.corrcoef(x[keep], y[keep])[0, 1])
            n0 = int(keep.sum())
            se = np.sqrt((1 - estimate**2) / max(n0 - 2, 1))
        else:

            def at(m, v=values, effect=effect):
                return decision_power(v, effect, m, alpha, sims, seed)

            finite = values[np.isfinite(values)]
            n0, estimate = finite.size, float(finite.mean())
            se = float(finite.std(ddof=1) / np.sqrt(n0))
        power = at(n)
        need = n if power >= pw.TARGET else pw.n_for_power(at, n + 1, 4 * n)
        rows.append(
            dict(
                analysis=analysis,
                effect=effect,
                pilot_estimate=estimate,
                pilot_se=se,
                pilot_n=n0,
                pilot_df=n0 - 1,
                n=n,
                df=n - 1,
                alpha=alpha,
                power=power,
                n_for_target=need,
            )
        )
    return pd.DataFrame(rows, columns=list(pw.POWER_COLUMNS))
