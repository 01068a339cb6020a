"""Inference at the level the design varies: cluster-robust slopes with t(G-1) references,
run-level one-sample tests, and the analysis table every family writes.

Every analysis row has the columns of ``ANALYSIS_COLUMNS``: ``analysis`` (the hypothesis id),
``estimate`` and its ``ci_low``/``ci_high``, the ``unit`` of replication and their number ``n``,
``p``, ``p_holm`` (Holm over the declared primary hypotheses only, of each one's larger p of
``p`` and ``p_wild``: a verdict only where both tests agree), ``primary`` (declared in config
``stats.primary``), the ``method``, a ``note`` (why a value is missing, the design's limits) and
``p_wild``: a second method's p for tests on few clusters, the wild cluster bootstrap
(``wild_cluster_p``) beside CR1 t(G-1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from scipy import stats as sps
from statsmodels.regression.linear_model import OLS

from blockcoupling.stats.core import holm
from blockcoupling.stats.power import df_of

ANALYSIS_COLUMNS = (
    "analysis",
    "estimate",
    "ci_low",
    "ci_high",
    "unit",
    "n",
    "p",
    "p_holm",
    "primary",
    "method",
    "note",
    "p_wild",
)
EQUIVALENCE = "_equivalence"  # the id suffix of a declared test's TOST row
MIN_CLUSTERS = 5  # fewer clusters: no interval or p (a range at most)


def analysis_row(
    analysis: str,
    unit: str,
    n: int,
    method: str,
    estimate: float = np.nan,
    ci_low: float = np.nan,
    ci_high: float = np.nan,
    p: float = np.nan,
    note: str = "",
    p_wild: float = np.nan,
) -> dict:
    """One row of an analysis table (``primary`` and ``p_holm`` are set by ``mark_primary``)."""
    return dict(
        analysis=analysis,
        estimate=float(estimate),
        ci_low=float(ci_low),
        ci_high=float(ci_high),
        unit=unit,
        n=int(n),
        p=float(p),
        p_holm=np.nan,
        primary=False,
        method=method,
        note=note,
        p_wild=float(p_wild),
    )


def analysis_table(rows: Sequence[dict], primary: Sequence[str] = ()) -> pd.DataFrame:
    """Rows as a table with ``ANALYSIS_COLUMNS``; ``primary`` marks the declared hypotheses.
    ``p_holm`` stays NaN here: Holm runs over every family's primaries at once
    (``combine_analyses``).
    """
    frame = pd.DataFrame(list(rows), columns=list(ANALYSIS_COLUMNS))
    frame["primary"] = frame["analysis"].isin(list(primary))
    return frame


def combine_analyses(
    frames: Sequence[pd.DataFrame], primary: Sequence[str] | Mapping[str, Mapping[str, object]]
) -> pd.DataFrame:
    """Every family's analysis rows in one table: ``primary`` = the row's analysis is declared,
    then one ``{id}_equivalence`` row (``tost_row``) per declared test whose config entry names
    an ``equivalence`` bound, itself primary; ``p_holm`` = Holm over every primary row's
    ``deciding_p`` (other rows: NaN, exploratory).
    """
    frames = [f for f in frames if len(f)]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame = frame.reindex(columns=list(ANALYSIS_COLUMNS))
    text = ["analysis", "unit", "method", "note"]
    frame[text] = frame[text].fillna("").astype(str)
    bounds = {
        name: float(entry["equivalence"])
        for name, entry in (primary.items() if isinstance(primary, Mapping) else ())
        if entry.get("equivalence") is not None
    }
    tested = [
        tost_row(r, bounds[r["analysis"]]) for _, r in frame.iterrows() if r["analysis"] in bounds
    ]
    if tested:
        frame = pd.concat(
            [frame, pd.DataFrame(tested, columns=list(ANALYSIS_COLUMNS))], ignore_index=True
        )
    frame["primary"] = frame["analysis"].isin([*primary, *(f"{n}{EQUIVALENCE}" for n in bounds)])
    frame["p_holm"] = np.nan
    chosen = frame["primary"].to_numpy()
    frame.loc[chosen, "p_holm"] = holm(deciding_p(frame.loc[chosen]))
    return frame


def tost_row(row: Mapping[str, object], bound: float) -> dict:
    """``{analysis}_equivalence``: the two one-sided t tests (TOST) of ``|estimate| < bound``
    for an analysis row with a t interval (95%, its df stated in its note: ``power.df_of``); p =
    the larger one-sided p (each test at the level the p is compared with, i.e. the 1 - 2 alpha
    interval within +-bound). The estimate and interval are the row's own.
    """
    name = f"{row['analysis']}{EQUIVALENCE}"
    method = f"TOST: two one-sided t tests of |estimate| < {bound:g}"
    estimate, low, high = (float(row[k]) for k in ("estimate", "ci_low", "ci_high"))
    df = df_of(row)
    values = dict(estimate=estimate, ci_low=low, ci_high=high)
    if df is None or not np.isfinite(high - low) or high <= low:
        note = "no t interval with its df: no TOST"
        return analysis_row(name, str(row["unit"]), int(row["n"]), method, **values, note=note)
    se = (high - low) / (2 * sps.t.ppf(0.975, df))
    p = max(sps.t.sf((estimate + bound) / se, df), sps.t.cdf((estimate - bound) / se, df))
    note = f"equivalence bound +-{bound:g} (config stats.primary); t({df})"
    return analysis_row(name, str(row["unit"]), int(row["n"]), method, **values, p=p, note=note)


def deciding_p(rows: pd.DataFrame) -> np.ndarray:
    """Per row, the larger of ``p`` (CR1 or t) and ``p_wild`` (the wild cluster bootstrap; NaN:
    only ``p``): where the two disagree about significance the larger decides. NaN without ``p``.
    """
    p = rows["p"].to_numpy(dtype=float)
    wild = rows["p_wild"].to_numpy(dtype=float)
    return np.where(np.isfinite(wild) & np.isfinite(p), np.fmax(p, wild), p)


def cluster_slope(
    data: pd.DataFrame,
    response: str,
    term: str,
    cluster: str,
    fixed: Sequence[str] = (),
    ci: float = 0.95,
    covariates: Sequence[str] = (),
) -> dict:
    """OLS ``response ~ term + C(fixed)... + covariates...`` with cluster-robust (CR1) errors by
    ``cluster`` and a t reference with G - 1 degrees of freedom (statsmodels ``use_t``):
    estimate (response units per unit of ``term``), ci_low, ci_high, p, n (rows), n_clusters,
    note. Fewer than ``MIN_CLUSTERS`` clusters: the estimate only, with a note (a cluster-robust
    variance from so few clusters gives no interval).
    """
    data = data[list(dict.fromkeys([response, term, cluster, *fixed, *covariates]))].dropna()
    n = len(data)
    groups = int(data[cluster].nunique())
    out = dict(estimate=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, n=n, n_clusters=groups) | {
        "p_wild": np.nan
    }
    formula = f"{response} ~ {term}"
    formula += "".join(f" + C({f})" for f in fixed if data[f].nunique() > 1)
    formula += "".join(f" + {c}" for c in covariates if data[c].nunique() > 1)
    if n < 3 or data[term].nunique() < 2:
        return out | {"note": f"{formula}: n={n}, too few rows or a constant {term}"}
    model = smf.ols(formula, data=data)
    column = list(model.exog_names).index(term)
    if not identified(model.exog, column):
        return out | {
            "note": f"{formula}: n={n}, {term} not identified (its column lies in the span of "
            "the others: no data separate it from them)"
        }
    fit = model.fit()
    if not np.isfinite(fit.params[term]):
        return out | {"note": f"{formula}: {term} not estimable"}
    out["estimate"] = float(fit.params[term])
    if groups < MIN_CLUSTERS:
        return out | {
            "note": f"{formula}: {groups} clusters < {MIN_CLUSTERS}, estimate only, no interval"
        }
    groups_codes = pd.factorize(data[cluster])[0]
    fit = model.fit(cov_type="cluster", cov_kwds={"groups": groups_codes}, use_t=True)
    low, high = fit.conf_int(alpha=1 - ci).loc[term]
    return out | dict(
        ci_low=float(low),
        ci_high=float(high),
        p=float(fit.pvalues[term]),
        p_wild=wild_cluster_p(model.endog, model.exog, column, groups_codes),
        note=f"{formula}; CR1 by {cluster}, t({groups - 1})",
    )


def identified(exog: np.ndarray, column: int) -> bool:
    """Whether column ``column`` of the (n, p) design ``exog`` has a coefficient the data
    determine: dropping it lowers the design's rank. OLS by pseudo-inverse returns a finite
    number for an unidentified one too: the minimum-norm split, not an estimate.
    """
    return np.linalg.matrix_rank(exog) > np.linalg.matrix_rank(np.delete(exog, column, axis=1))


def term_identified(model: OLS, term: str) -> bool:
    """``identified`` for ``term`` of a statsmodels formula model (not fitted)."""
    return identified(model.exog, list(model.exog_names).index(term))


def run_level_test(values: Sequence[float], ci: float = 0.95, units: str = "runs") -> dict:
    """One-sample t test of run-level statistics against 0 (one value per unit): estimate (their
    mean), ci_low, ci_high (t with n - 1 df), p, n (finite values), p_sign (exact two-sided sign
    test of the nonzero values), note (naming ``units``, plural: what one value is). Fewer than
    ``MIN_CLUSTERS`` units: mean and range only.
    """
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    n = values.size
    out = dict(
        estimate=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, n=n, p_sign=np.nan, p_wild=np.nan
    )
    if n == 0:
        return out | {"note": "no run-level values"}
    out["estimate"] = float(values.mean())
    nonzero = values[values != 0]
    if nonzero.size:
        positive = int((nonzero > 0).sum())
        out["p_sign"] = float(sps.binomtest(positive, nonzero.size).pvalue)
    if n < MIN_CLUSTERS:
        return out | {
            "note": f"{n} {units} < {MIN_CLUSTERS}: range "
            f"[{values.min():.4g}, {values.max():.4g}], no interval"
        }
    sd = float(values.std(ddof=1))
    if sd == 0:
        return out | {"note": f"all {n} {units} give the same value: no interval"}
    test = sps.ttest_1samp(values, 0.0)
    interval = test.confidence_interval(confidence_level=ci)
    return out | dict(
        ci_low=float(interval.low),
        ci_high=float(interval.high),
        p=float(test.pvalue),
        p_wild=wild_cluster_p(values, np.ones((n, 1)), 0, np.arange(n)),
        note=f"one-sample t({n - 1}) over {units}; sign test p={out['p_sign']:.3g}",
    )


def test_row(analysis: str, unit: str, method: str, test: dict, note: str | None = None) -> dict:
    """The analysis row of a ``run_level_test`` result (``note``: in place of the test's own)."""
    return analysis_row(
        analysis,
        unit,
        test["n"],
        method,
        test["estimate"],
        test["ci_low"],
        test["ci_high"],
        test["p"],
        test["note"] if note is None else note,
        p_wild=test["p_wild"],
    )


def _cr1_t(a: np.ndarray, y: np.ndarray, x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """CR1 t statistics of one coefficient for every column of ``y`` (n x B): ``a`` (n) is its
    row of (X'X)^-1 X', ``x`` the design (n x k), ``groups`` cluster codes 0..G-1.
    """
    n, k = x.shape
    n_groups = int(groups.max()) + 1
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    resid = y - x @ beta
    scores = np.zeros((n_groups, y.shape[1]))
    np.add.at(scores, groups, a[:, None] * resid)
    scale = n_groups / (n_groups - 1) * (n - 1) / (n - k)
    return (a @ y) / np.sqrt(scale * (scores**2).sum(axis=0))


def wild_cluster_p(
    y: np.ndarray,
    x: np.ndarray,
    column: int,
    groups: np.ndarray,
    draws: int = 9999,
    seed: int = 0,
    enumerate_up_to: int = 12,
) -> float:
    """Two-sided p of coefficient ``column`` = 0 by the restricted wild cluster bootstrap (WCR,
    Rademacher weights, Cameron, Gelbach & Miller 2008): residuals of the fit without the
    coefficient, flipped by cluster, refitted, their CR1 t against the data's. Every one of the
    2^G sign vectors when G <= ``enumerate_up_to`` (exact), else ``draws`` seeded ones.
    ``y`` (n), ``x`` (n x k), ``groups`` (n) any labels. NaN for fewer than 2 clusters.
    """
    y, x = np.asarray(y, dtype=float), np.asarray(x, dtype=float)
    groups = pd.factorize(np.asarray(groups))[0]
    n_groups = int(groups.max()) + 1 if groups.size else 0
    if n_groups < 2 or x.shape[0] <= x.shape[1]:
        return np.nan
    a = np.linalg.pinv(x)[column]
    t = _cr1_t(a, y[:, None], x, groups)[0]
    rest = np.delete(x, column, axis=1)
    fitted = rest @ np.linalg.lstsq(rest, y, rcond=None)[0] if rest.shape[1] else np.zeros_like(y)
    resid = y - fitted
    exact = n_groups <= enumerate_up_to
    if exact:  # every sign vector, the observed one (all +1) among them: p >= 1 / 2^G
        signs = 1 - 2 * ((np.arange(2**n_groups)[:, None] >> np.arange(n_groups)) & 1)
    else:
        signs = np.random.default_rng(seed).choice([-1, 1], size=(draws, n_groups))
    star = fitted[:, None] + resid[:, None] * signs.T[groups]
    t_star = _cr1_t(a, star, x, groups)
    extreme = int(np.sum(np.abs(t_star) >= abs(t) - 1e-12))
    if exact:
        return extreme / len(signs)
    return (1 + extreme) / (1 + draws)  # a Monte Carlo p counts the observed draw: never 0
