"""Shared statistical primitives: selection, bootstrap over prompts, correlations with CIs,
mixed and cluster-robust slopes, Holm, and table writing (used by every analysis family).
"""

from __future__ import annotations

import os
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps
from statsmodels.regression.linear_model import OLS
from statsmodels.regression.mixed_linear_model import MixedLM
from statsmodels.stats.multitest import multipletests
from statsmodels.tools.tools import add_constant

from blockcoupling.coupling import registry as measures
from blockcoupling.files.io import atomic_write

MIN_N_CORRELATION = 4
MIN_BOOTSTRAP = 5  # fewer resampling units: no bootstrap interval
METHODS = ("pearson", "spearman")
CI_METHODS = {"pearson": "fisher_z", "spearman": "fisher_z_bonett_wright"}
# The calibrated per-prompt summaries tabulated beside raw ``coupling`` (with CIs where it has
# them), and the chance levels tabulated as means (docs/datasets.md): from the measure registry.
CALIBRATED = tuple(m.summary for m in measures.calibrated())
NULLS = tuple(
    dict.fromkeys(m.summary_chance for m in measures.shown() if isinstance(m.summary_chance, str))
)


def calibrated_columns(table: pd.DataFrame) -> list[str]:
    """The ``CALIBRATED`` measures ``table`` holds with at least one value."""
    return [c for c in CALIBRATED if c in table and table[c].notna().any()]


# --------------------------------------------------------------------------- selection helpers
def select(obj: xr.DataArray | xr.Dataset, **coords: object) -> xr.DataArray | xr.Dataset:
    """Select one value per named dim; dims absent from `obj` are skipped (already selected)."""
    for dim, value in coords.items():
        if dim not in obj.dims:
            continue
        if value not in obj[dim].values:
            raise ValueError(f"{dim}={value!r} not in {list(obj[dim].values)}")
        obj = obj.sel({dim: value})
    return obj


def _cell_seed(seed: int, *key: object) -> np.random.Generator:
    """Generator seeded by `seed` and a stable hash of `key`, independent of the other cells."""
    return np.random.default_rng([seed, zlib.crc32("/".join(map(str, key)).encode())])


def bootstrap_mean(
    values: np.ndarray, n_boot: int, ci: float, rng: np.random.Generator
) -> tuple[float, float, float, int]:
    """Mean of the finite `values` (1-D) with a percentile bootstrap CI: (mean, low, high, n).

    The CI is NaN for fewer than ``MIN_BOOTSTRAP`` finite values (a bootstrap over so few is a
    range, not an interval), and (mean, mean) when they are all equal. ``n_boot=0``: the mean
    alone (NaN CI), for the tables whose numbers must not depend on the bootstrap's settings.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size < MIN_BOOTSTRAP or n_boot == 0:
        return (float(finite.mean()) if finite.size else np.nan), np.nan, np.nan, finite.size
    mean = float(finite.mean())
    if np.ptp(finite) == 0:
        return mean, mean, mean, finite.size
    res = sps.bootstrap(
        (finite,), np.mean, n_resamples=n_boot, confidence_level=ci, method="percentile", rng=rng
    )
    return (
        mean,
        float(res.confidence_interval.low),
        float(res.confidence_interval.high),
        finite.size,
    )


def _bootstrap_cells(
    da: xr.DataArray, n_boot: int, seed: int, ci: float, name: str, count: str, tag: str
) -> xr.Dataset:
    """Bootstrap over `prompt` for every cell of the other dims of `da`: `{name}`, `{name}_low`,
    `{name}_high` and `{count}` (number of finite prompts), with `da`'s dims minus prompt.
    Each cell's generator is seeded by `seed`, `tag` and the cell's labels.
    """
    template = da.isel(prompt=0, drop=True)
    other = list(template.dims)
    values = da.transpose(*other, "prompt").values
    out = np.full((4, *values.shape[:-1]), np.nan)
    for idx in np.ndindex(*values.shape[:-1]):
        key = [str(da[d].values[i]) for d, i in zip(other, idx)]
        out[(slice(None), *idx)] = bootstrap_mean(
            values[idx], n_boot, ci, _cell_seed(seed, tag, *key)
        )
    data = {
        f"{name}{suffix}": template.copy(data=out[i])
        for i, suffix in enumerate(("", "_low", "_high"))
    }
    data[count] = template.copy(data=out[3].astype(int))
    return xr.Dataset(data)


def without_intervals(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` without its bootstrap interval columns (``*_low``, ``*_high``)."""
    return table.drop(columns=[c for c in table.columns if c.endswith(("_low", "_high"))])


def _log10(values: np.ndarray) -> np.ndarray:
    """log10 of positive values, NaN elsewhere."""
    values = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(values > 0, np.log10(values), np.nan)


# --------------------------------------------------------------------------- correlations
def fisher_ci(r: float, n: int, ci: float = 0.95, se: float | None = None) -> tuple[float, float]:
    """CI of a correlation by Fisher z: tanh(atanh r -+ z_(1+ci)/2 * se), se = 1/sqrt(n-3) by
    default.
    """
    se = 1 / np.sqrt(n - 3) if se is None else se
    half = sps.norm.ppf((1 + ci) / 2) * se
    with np.errstate(divide="ignore"):
        z = np.arctanh(r)
    return float(np.tanh(z - half)), float(np.tanh(z + half))


def correlate(
    x: Sequence[float], y: Sequence[float], method: str = "pearson", ci: float = 0.95
) -> dict:
    """r, ci_low, ci_high, p, n, ci_method, reason for the pairs where both x and y are finite.

    Pearson: scipy r/p, Fisher-z CI (se 1/sqrt(n-3)). Spearman: scipy rho/p, Fisher-z CI with the
    Bonett-Wright se sqrt((1 + rho^2/2)/(n-3)) (Spearman's own, never Pearson's). n < 4 or
    constant input: NaN with a `reason`; |r| = 1: r and p, no interval.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(keep.sum())
    row = dict(
        r=np.nan,
        ci_low=np.nan,
        ci_high=np.nan,
        p=np.nan,
        n=n,
        ci_method=CI_METHODS[method],
        reason="",
    )
    if n < MIN_N_CORRELATION:
        return row | {"reason": f"n={n} < {MIN_N_CORRELATION}"}
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return row | {"reason": "constant input"}
    if method == "pearson":
        res = sps.pearsonr(x, y)
        r, p = res.statistic, res.pvalue
    else:
        r, p = sps.spearmanr(x, y)
    if abs(r) > 1 - 1e-12:
        # atanh(+-1) is infinite: no Fisher-z interval (never clipped into a finite z)
        return row | dict(r=float(r), p=float(p), reason="|r| = 1: no Fisher-z interval")
    if method == "pearson":  # scipy's Fisher-z interval (se 1/sqrt(n-3))
        interval = res.confidence_interval(confidence_level=ci)
        low, high = float(interval.low), float(interval.high)
    else:  # Bonett-Wright: scipy has no Spearman interval
        low, high = fisher_ci(float(r), n, ci, np.sqrt((1 + r**2 / 2) / (n - 3)))
    return row | dict(r=float(r), ci_low=low, ci_high=high, p=float(p))


def require_columns(table: pd.DataFrame, columns: Sequence[str]) -> None:
    """Raise if a needed column is missing."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks columns {missing}")


def _zscore(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns standardized to mean 0, sample sd 1 (ddof=1)."""
    return (frame - frame.mean()) / frame.std(ddof=1)


def mixed_slope(
    data: pd.DataFrame,
    target: str,
    predictor: str,
    group: str,
    ci: float = 0.95,
    standardize: bool = True,
) -> dict:
    """Statsmodels MixedLM ``target ~ 1 + z(predictor)`` with a random intercept per ``group``:
    coef (target units per predictor sd; per predictor unit when not ``standardize``), ci_low,
    ci_high, p, n, n_groups, reason.

    Repeated measures (checkpoints of one run, seeds of one configuration) share their group's
    intercept, so the slope is estimated within groups instead of treating every row as an
    independent model. NaN with a reason for fewer than 2 groups or too few rows.
    """
    data = data[[target, predictor, group]].dropna()
    n, n_groups = len(data), int(data[group].nunique())
    row = dict(coef=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, n=n, n_groups=n_groups)
    if n_groups < 2 or n < n_groups + 3:
        return row | {"reason": f"n={n}, groups={n_groups}: too few for a mixed model"}
    if data[predictor].nunique() < 2:
        return row | {"reason": "constant predictor"}
    x = data[predictor]
    if standardize:
        x = (x - x.mean()) / x.std(ddof=1)
    design = add_constant(x.rename(predictor).to_frame(), has_constant="add")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = MixedLM(data[target], design, groups=data[group]).fit(reml=True)
    bounds = fit.conf_int(alpha=1 - ci)
    converged = bool(getattr(fit, "converged", True))
    notes = {type(w.message).__name__ for w in caught if "Convergence" in type(w.message).__name__}
    reason = "" if converged and not notes else "fit did not fully converge"
    if not np.isfinite(bounds.loc[predictor]).all():
        # the random-intercept variance sits at its boundary (0: the groups do not differ), so
        # the mixed model's Hessian is singular; it reduces to OLS, whose standard errors are
        # then made robust to the grouping (cluster-robust by group)
        fit = OLS(data[target], design).fit(
            cov_type="cluster", cov_kwds={"groups": pd.factorize(data[group])[0]}, use_t=True
        )
        bounds = fit.conf_int(alpha=1 - ci)
        reason = (
            "random-intercept variance at 0: OLS with group-clustered standard errors, "
            f"t({n_groups - 1})"
        )
    return row | dict(
        coef=float(fit.params[predictor]),
        ci_low=float(bounds.loc[predictor, 0]),
        ci_high=float(bounds.loc[predictor, 1]),
        p=float(fit.pvalues[predictor]),
        reason=reason,
    )


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p values over the finite entries of ``p`` (NaN stays NaN)."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        out[finite] = multipletests(p[finite], method="holm")[1]
    return out


def write_table(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write one table as CSV, atomically."""
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))
