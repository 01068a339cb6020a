"""The power of a primary test under the verdict's whole rule: one simulation for the pilot's
power (before the run, ``pilot_power``) and the run's own (``claims.achieved_power``).

A simulated study draws its units from a normal distribution at the declared effect and a
standard deviation (the pilot's, or the run's from its interval), runs both tests the verdict
reads (the CR1 t(G-1) test and the wild cluster bootstrap, each unit its own cluster) and
counts it when every condition of "reproduced" holds: the larger p below Holm's first
threshold, the estimate on the declared side, and the design's extra conditions (the
across-runs overlap slope agreeing in sign; the within-run arms differing in validation loss
as designed). Three designs:

- ``mean``: n units, a one-sample test (paired differences, per-suite statistics);
- ``arms``: n units per arm, the difference between two arms (regression on an arm indicator);
- ``slope``: n units, the standardized slope of y on x (effect = its correlation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats as sps

from blockcoupling.stats.inference import _cr1_t, wild_cluster_p

DECISION_SIM = 1000  # simulated studies per power value
WILD_DRAWS = 999  # sign vectors per wild bootstrap inside the simulation (exact up to 2^12)
CHECK_ALPHA = 0.05  # the level of the arms design's manipulation check (two-sided t)


@dataclass(frozen=True)
class Design:
    """A primary test's design for the simulation: ``kind`` (``mean``, ``arms``, ``slope``);
    ``sd`` the per-unit standard deviation (``mean``, ``arms``: pooled within arms; unused by
    ``slope``, which is standardized); ``check``: for ``arms``, the (difference, sd) of the
    manipulation check (the arms' difference in the change of minus validation loss), which
    must be significant on its designed side; ``agree_r``: for ``slope``, the correlation of
    the agreement measure (the overlap) with y, its correlation with x taken as effect x
    ``agree_r`` (the overlap related to the excess only through generalization).
    """

    kind: str
    sd: float = 1.0
    check: tuple[float, float] | None = None
    agree_r: float | None = None


def decision_p(y: np.ndarray, x: np.ndarray, column: int, draws: int, seed: int) -> float:
    """The p the verdict uses for coefficient ``column`` of ``y ~ x`` with one cluster per row:
    the larger of the CR1 t(G-1) p and the wild cluster bootstrap p.
    """
    n = len(y)
    groups = np.arange(n)
    a = np.linalg.pinv(x)[column]
    t = float(_cr1_t(a, y[:, None], x, groups)[0])
    p_t = 2 * sps.t.sf(abs(t), n - 1)
    return max(p_t, wild_cluster_p(y, x, column, groups, draws=draws, seed=seed))


def _ols(y: np.ndarray, x: np.ndarray, column: int) -> float:
    """The OLS coefficient ``column`` of ``y ~ x``."""
    return float(np.linalg.lstsq(x, y, rcond=None)[0][column])


def _study(
    design: Design, effect: float, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, bool]:
    """One simulated study: (y, x, extra condition holds)."""
    if design.kind == "mean":
        return effect + design.sd * rng.standard_normal(n), np.ones((n, 1)), True
    if design.kind == "arms":
        arm = np.repeat([1.0, 0.0], n)
        y = effect * arm + design.sd * rng.standard_normal(2 * n)
        extra = True
        if design.check is not None:
            diff, sd = design.check
            check = diff * arm + sd * rng.standard_normal(2 * n)
            a, b = check[arm == 1], check[arm == 0]
            test = sps.ttest_ind(a, b)
            extra = bool(test.pvalue < CHECK_ALPHA and np.sign(test.statistic) == np.sign(diff))
        return y, np.column_stack([np.ones(2 * n), arm]), extra
    if design.kind == "slope":
        r_oy = design.agree_r
        r_ox = effect * r_oy if r_oy is not None else 0.0
        cov = np.array([[1.0, effect, r_ox], [effect, 1.0, r_oy or 0.0], [r_ox, r_oy or 0.0, 1.0]])
        x, y, o = rng.multivariate_normal(np.zeros(3), cov, size=n, method="eigh").T
        exog = np.column_stack([np.ones(n), x])
        extra = True
        if r_oy is not None:  # the overlap's slope must share the excess's sign
            agree = _ols(y, np.column_stack([np.ones(n), o]), 1)
            extra = np.sign(agree) == np.sign(_ols(y, exog, 1))
        return y, exog, bool(extra)
    raise ValueError(f"design kind must be mean, arms or slope, got {design.kind!r}")


def decision_power(
    design: Design,
    effect: float,
    n: int,
    alpha: float,
    n_sim: int = DECISION_SIM,
    seed: int = 0,
    draws: int = WILD_DRAWS,
) -> float:
    """The share of ``n_sim`` simulated studies (normal draws, ``_study``) that the verdict
    would call reproduced: the larger of the t and wild bootstrap p below ``alpha``, the
    estimate on ``effect``'s side and the design's extra condition. ``n``: units (per arm for
    ``arms``). 0 when the sign-flip bootstrap's floor (2 / 2^units) is at or above ``alpha``.
    """
    units = 2 * n if design.kind == "arms" else n
    if not (np.isfinite(effect) and effect != 0 and n >= 2 and np.isfinite(design.sd)):
        return np.nan
    if design.sd <= 0 or (design.kind == "slope" and not abs(effect) < 1):
        return np.nan
    if 2.0 / 2**units >= alpha:
        return 0.0
    rng = np.random.default_rng(seed)
    column = 0 if design.kind == "mean" else 1
    hits = 0
    for i in range(n_sim):
        y, x, extra = _study(design, effect, n, rng)
        if not extra or np.sign(_ols(y, x, column)) != np.sign(effect):
            continue
        hits += decision_p(y, x, column, draws, seed + i) < alpha
    return hits / n_sim
