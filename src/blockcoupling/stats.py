"""Statistics on combined coupling datasets: per-model means, correlations, OLS, checkpoints.

Inputs follow docs/datasets.md (combined `coupling.nc`, `evaluation.nc`, trajectories, checkpoint
suites). Results are xarray Datasets (NetCDF) or tidy pandas DataFrames (CSV). Coupling is minus the
mean mis-coupling, so larger = more coupled. Every table-level analysis runs per `subset`
(`all` models, `base` models only).
"""

from __future__ import annotations

import itertools
import os
import warnings
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm
import xarray as xr
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from blockcoupling.io import atomic_write

MIN_N_CORRELATION = 4
METHODS = ("pearson", "spearman")
SUBSETS = ("all", "base")
SCORE_NAMES = {"score": "score", "bits_per_byte": "neg_bits_per_byte", "mc_accuracy": "mc_accuracy"}
HYPERPARAMETERS = ("log10_params", "n_layers", "d_model", "log10_train_tokens")
DEFAULT_PREDICTORS = ("coupling", *HYPERPARAMETERS)
DEFAULT_PREDICTOR_SETS = {
    "coupling": ["coupling"],
    "hyperparameters": ["log10_params", "n_layers", "d_model"],
    "both": ["coupling", "log10_params", "n_layers", "d_model"],
}
CI_METHODS = {"pearson": "fisher_z", "spearman": "fisher_z_bonett_wright"}


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

    The CI is NaN for fewer than 2 finite values, and (mean, mean) when they are all equal.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size < 2:
        return (float(finite[0]) if finite.size else np.nan), np.nan, np.nan, finite.size
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


# --------------------------------------------------------------------------- per-model coupling
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


def model_coupling(
    coupling: xr.Dataset,
    k: int = 10,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
    variable: str = "coupling",
) -> xr.Dataset:
    """Mean coupling over prompts per (model, init|step) with a percentile bootstrap CI over
    prompts.

    `coupling[variable]` has dims (model, init|step, reading, variant, norm, k, prompt) and coord
    `prompt_source`. Returns `{variable}`, `{variable}_low/_high`, `n_prompts` (model, init|step)
    and the same per prompt source: `{variable}_by_source*` (model, init|step, source). NaN prompts
    are dropped; a CI needs >= 2 prompts. Seeds are per cell (seed + hash of its labels).
    """
    if variable not in coupling:
        raise ValueError(f"variable {variable!r} not in dataset {list(coupling.data_vars)}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    da = select(coupling[variable], k=k, reading=reading, variant=variant, norm=norm)
    if "prompt" not in da.dims or "model" not in da.dims:
        raise ValueError(f"{variable} needs dims model and prompt, got {da.dims}")
    result = _bootstrap_cells(da, n_boot, seed, ci, variable, "n_prompts", variable)
    source = da["prompt_source"].values.astype(str)
    by_source = [
        _bootstrap_cells(
            da.isel(prompt=source == s),
            n_boot,
            seed,
            ci,
            f"{variable}_by_source",
            "n_prompts_by_source",
            f"{variable}/{s}",
        )
        for s in np.unique(source)
    ]
    by_source = xr.concat(by_source, dim="source").assign_coords(source=np.unique(source))
    result = result.merge(by_source.transpose(*result.dims, "source"), compat="override")
    result.attrs.update(
        dict(
            k=k,
            reading=reading,
            variant=variant,
            norm=norm,
            n_boot=n_boot,
            seed=seed,
            ci=ci,
            ci_method="percentile bootstrap over prompts",
        )
    )
    return result


# --------------------------------------------------------------------------- model table
def _log10(values: np.ndarray) -> np.ndarray:
    """log10 of positive values, NaN elsewhere."""
    values = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(values > 0, np.log10(values), np.nan)


def model_table(
    model_coupling_ds: xr.Dataset, evaluation: xr.Dataset | None = None, score: str = "score"
) -> pd.DataFrame:
    """One row per trained model: coupling (+CI), score, log10_params, n_layers, d_model, ...

    `score`: "score" (leaderboard coord on `model`), "bits_per_byte" (stored as its negative,
    `score_name` = "neg_bits_per_byte", so higher = better) or "mc_accuracy" (from `evaluation`,
    dims model, init). Unknown scores stay NaN.
    """
    if score not in SCORE_NAMES:
        raise ValueError(f"score must be one of {list(SCORE_NAMES)}, got {score!r}")
    if score != "score" and evaluation is None:
        raise ValueError(f"score={score!r} needs the evaluation dataset")
    trained = select(model_coupling_ds, init="trained")
    models = trained["model"].values

    def coord(name: str) -> np.ndarray:
        return trained[name].values if name in trained.coords else np.full(len(models), np.nan)

    table = pd.DataFrame(
        {
            "model": models.astype(str),
            "family": coord("family"),
            "base": pd.Series(coord("base")).fillna(False).astype(bool).values,
            "coupling": trained["coupling"].values,
            "coupling_low": trained["coupling_low"].values,
            "coupling_high": trained["coupling_high"].values,
            "n_prompts": trained["n_prompts"].values,
            "log10_params": _log10(coord("params")),
            "n_layers": np.asarray(coord("n_layers"), dtype=float),
            "d_model": np.asarray(coord("d_model"), dtype=float),
            "log10_train_tokens": _log10(coord("train_tokens")),
        }
    )
    if "init" in model_coupling_ds.dims and "random" in model_coupling_ds["init"].values:
        table["coupling_random"] = model_coupling_ds["coupling"].sel(init="random").values
    if score == "score":
        values = np.asarray(coord("score"), dtype=float)
    else:
        values = (
            select(evaluation[score], init="trained").reindex(model=models).values.astype(float)
        )
    table["score"] = -values if score == "bits_per_byte" else values
    table["score_name"] = SCORE_NAMES[score]
    return table


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
    Bonett-Wright se sqrt((1 + rho^2/2)/(n-3)). n < 4 or constant input: NaN with a `reason`.
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
        r, p = sps.pearsonr(x, y)
        se = None
    else:
        r, p = sps.spearmanr(x, y)
        se = np.sqrt((1 + r**2 / 2) / (n - 3))
    low, high = fisher_ci(float(r), n, ci, se)
    return row | dict(r=float(r), ci_low=low, ci_high=high, p=float(p))


def subset_frames(
    table: pd.DataFrame, subsets: Sequence[str] = SUBSETS
) -> Iterator[tuple[str, pd.DataFrame]]:
    """Yield (name, rows) for `all` (every row), `base` (rows with base == True) and
    `family:<name>` (the rows of one family, e.g. a training grid).
    """
    for name in subsets:
        if name == "all":
            yield name, table
        elif name == "base":
            yield name, table[table["base"].astype(bool)]
        elif name.startswith("family:"):
            yield name, table[table["family"].astype(str) == name.split(":", 1)[1]]
        else:
            raise ValueError(f"subset must be one of {SUBSETS} or family:<name>, got {name!r}")


def table_subsets(table: pd.DataFrame) -> tuple[str, ...]:
    """`all`, `base`, and `family:<name>` for every family with at least MIN_N_CORRELATION
    models that is not the whole table.
    """
    counts = table["family"].astype(str).value_counts()
    families = [f for f, n in sorted(counts.items()) if MIN_N_CORRELATION <= n < len(table)]
    return (*SUBSETS, *(f"family:{f}" for f in families))


def with_holm(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``p_holm`` (Holm over every finite p of the table) and a ``note``."""
    n = int(np.isfinite(frame["p"].astype(float)).sum())
    return frame.assign(
        p_holm=holm(frame["p"]), note=f"p_holm: Holm over the {n} tests of this table"
    )


def require_columns(table: pd.DataFrame, columns: Sequence[str]) -> None:
    """Raise if a needed column is missing."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks columns {missing}")


def correlations(
    table: pd.DataFrame,
    target: str = "score",
    predictors: Sequence[str] = DEFAULT_PREDICTORS,
    methods: Sequence[str] = METHODS,
    subsets: Sequence[str] = SUBSETS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Correlation of each predictor with `target`, per subset and method (see `correlate`).

    Columns: subset, target, predictor, method, r, ci_low, ci_high, p, n, ci_method, reason.
    """
    require_columns(table, [target, *predictors])
    rows = [
        dict(subset=name, target=target, predictor=pred, method=m)
        | correlate(rows[pred], rows[target], m, ci)
        for name, rows in subset_frames(table, subsets)
        for pred in predictors
        for m in methods
    ]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- OLS and partial r
def _zscore(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns standardized to mean 0, sample sd 1 (ddof=1)."""
    return (frame - frame.mean()) / frame.std(ddof=1)


def _ols_rows(data: pd.DataFrame, target: str, predictors: Sequence[str], ci: float) -> list[dict]:
    """OLS of target on z-scored predictors (+ intercept): one row per term, fit stats repeated."""
    terms = ["const", *predictors]
    n = len(data)
    n_params = len(terms)
    reason = ""
    if n <= n_params + 1:
        reason = f"n={n} <= {n_params + 1} (parameters + 1)"
    else:
        constant = [p for p in predictors if data[p].nunique() < 2]
        reason = f"constant predictor {', '.join(constant)}" if constant else ""
    if reason:
        return [
            dict(
                term=t,
                coef=np.nan,
                ci_low=np.nan,
                ci_high=np.nan,
                p=np.nan,
                r2=np.nan,
                adj_r2=np.nan,
                aic=np.nan,
                n=n,
                reason=reason,
            )
            for t in terms
        ]
    fit = sm.OLS(
        data[target], sm.add_constant(_zscore(data[list(predictors)]), has_constant="add")
    ).fit()
    bounds = fit.conf_int(alpha=1 - ci)
    return [
        dict(
            term=t,
            coef=fit.params[t],
            ci_low=bounds.loc[t, 0],
            ci_high=bounds.loc[t, 1],
            p=fit.pvalues[t],
            r2=fit.rsquared,
            adj_r2=fit.rsquared_adj,
            aic=fit.aic,
            n=n,
            reason="",
        )
        for t in terms
    ]


def ols_fits(
    table: pd.DataFrame,
    target: str = "score",
    predictor_sets: Mapping[str, Sequence[str]] = DEFAULT_PREDICTOR_SETS,
    subsets: Sequence[str] = SUBSETS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Statsmodels OLS of `target` on z-scored predictors, per subset and predictor set.

    Rows with any missing value in target/predictors are dropped per fit. Long format, one row per
    term (const = intercept): subset, predictor_set, term, coef (target units per predictor sd),
    ci_low, ci_high, p, r2, adj_r2, aic, n, reason. NaN + reason when n <= parameters + 1.
    """
    require_columns(table, [target, *{p for preds in predictor_sets.values() for p in preds}])
    rows = []
    for name, rows_subset in subset_frames(table, subsets):
        for set_name, preds in predictor_sets.items():
            data = rows_subset[[target, *preds]].dropna()
            rows += [
                dict(subset=name, target=target, predictor_set=set_name) | r
                for r in _ols_rows(data, target, preds, ci)
            ]
    return pd.DataFrame(rows)


def _partial_row(data: pd.DataFrame, x: str, y: str, covariates: Sequence[str], ci: float) -> dict:
    """Partial r of x, y given covariates (residual method), t-test with df = n - 2 - n_cov."""
    n, n_cov = len(data), len(covariates)
    row = dict(r=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, n=n, df=n - 2 - n_cov, reason="")
    if n - 3 - n_cov < 1:
        return row | {"reason": f"n={n} < {4 + n_cov} (4 + covariates)"}
    design = sm.add_constant(data[list(covariates)], has_constant="add")
    rx = sm.OLS(data[x], design).fit().resid
    ry = sm.OLS(data[y], design).fit().resid
    if np.allclose(rx, 0) or np.allclose(ry, 0):
        return row | {"reason": "residuals constant"}
    r = float(np.corrcoef(rx, ry)[0, 1])
    df = n - 2 - n_cov
    t = r * np.sqrt(df / (1 - r**2)) if abs(r) < 1 else np.inf * np.sign(r)
    low, high = fisher_ci(r, n, ci, se=1 / np.sqrt(n - 3 - n_cov))
    return row | dict(r=r, ci_low=low, ci_high=high, p=float(2 * sps.t.sf(abs(t), df)))


def partial_correlation(
    table: pd.DataFrame,
    x: str = "coupling",
    y: str = "score",
    covariates: Sequence[str] = ("log10_params",),
    subsets: Sequence[str] = SUBSETS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Partial Pearson r of x and y controlling for covariates, per subset.

    Residuals of x and y after statsmodels OLS on the covariates (+ intercept); p from a t-test with
    df = n - 2 - n_cov; CI by Fisher z with se 1/sqrt(n - 3 - n_cov). Columns: subset, x, y,
    covariates, r, ci_low, ci_high, p, n, df, reason.
    """
    require_columns(table, [x, y, *covariates])
    rows = [
        dict(subset=name, x=x, y=y, covariates=",".join(covariates))
        | _partial_row(part[[x, y, *covariates]].dropna(), x, y, covariates, ci)
        for name, part in subset_frames(table, subsets)
    ]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- K sweep
def k_sweep(
    coupling: xr.Dataset,
    table: pd.DataFrame,
    target: str = "score",
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    methods: Sequence[str] = METHODS,
    subsets: Sequence[str] = SUBSETS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Correlation of trained-model coupling (mean over prompts) with `target` for every K.

    `coupling`: combined dataset (see `model_coupling`); `table`: `model_table` output
    (target, base).
    Columns: k plus those of `correlations` (predictor = "coupling").
    """
    require_columns(table, ["model", "base", target])
    means = select(
        coupling["coupling"], reading=reading, variant=variant, norm=norm, init="trained"
    )
    means = means.mean("prompt", skipna=True)
    frames = []
    for k in means["k"].values:
        at_k = pd.DataFrame(
            {"model": means["model"].values.astype(str), "coupling": means.sel(k=k).values}
        )
        keep = (
            ["model", "base", "family", target] if "family" in table else ["model", "base", target]
        )
        merged = table[keep].merge(at_k, on="model", how="left")
        frames.append(
            correlations(merged, target, ("coupling",), methods, subsets, ci).assign(k=int(k))
        )
    return pd.concat(frames, ignore_index=True)[["k", *frames[0].columns.drop("k")]]


# --------------------------------------------------------------------------- checkpoints
def checkpoint_table(
    coupling_checkpoints: xr.Dataset,
    history: pd.DataFrame,
    trajectories: xr.Dataset | None = None,
    k: int = 10,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> pd.DataFrame:
    """One row per (model, step): coupling and adjacent_coupling (means over prompts, with
    percentile bootstrap CIs over prompts: ``*_low``, ``*_high``), val_loss, ...

    `coupling_checkpoints`: dims (model, step, ..., prompt); `history`: columns model, step,
    val_loss (+ val_accuracy); `trajectories` (optional): lss, expodistance (model, step, prompt,
    token), averaged over prompts and tokens. Adds neg_val_loss (higher = better), log10_params,
    n_layers, d_model and group (models that differ only by seed share it).
    """
    require_columns(history, ["model", "step", "val_loss"])
    sel = dict(k=k, reading=reading, variant=variant, norm=norm)
    parts = [
        _bootstrap_cells(
            select(coupling_checkpoints[v], **sel), n_boot, seed, ci, v, f"n_prompts_{v}", v
        )
        for v in ("coupling", "adjacent_coupling")
    ]
    ds = xr.merge(parts, compat="override").drop_vars(
        ["n_prompts_adjacent_coupling"], errors="ignore"
    )
    ds = ds.rename({"n_prompts_coupling": "n_prompts"})
    if trajectories is not None:
        ds = ds.assign(
            {
                v: trajectories[v].mean(["prompt", "token"], skipna=True)
                for v in ("lss", "expodistance")
            }
        )
    table = (
        ds.drop_vars([c for c in ds.coords if c not in ("model", "step")])
        .to_dataframe()
        .reset_index()
    )
    table["model"] = table["model"].astype(str)
    table["step"] = table["step"].astype(int)
    meta = coupling_checkpoints["model"]

    def coord(name: str) -> np.ndarray:
        return meta[name].values if name in meta.coords else np.full(meta.size, np.nan)

    groups = np.asarray(coord("group"), dtype=object)
    table = table.merge(
        pd.DataFrame(
            {
                "model": meta.values.astype(str),
                "group": [
                    g if isinstance(g, str) and g else m for g, m in zip(groups, meta.values)
                ],
                "log10_params": _log10(coord("params")),
                "n_layers": coord("n_layers"),
                "d_model": coord("d_model"),
            }
        ),
        on="model",
    )
    hist = history.assign(model=history["model"].astype(str), step=history["step"].astype(int))
    hist = hist[[c for c in ("model", "step", "val_loss", "val_accuracy") if c in hist.columns]]
    table = table.merge(
        hist.drop_duplicates(["model", "step"], keep="last"), on=["model", "step"], how="left"
    )
    table["neg_val_loss"] = -table["val_loss"]
    # the combined file is the union of every model's steps: drop (model, step) pairs never measured
    table = table.dropna(subset=["coupling", "adjacent_coupling"], how="all")
    return table.sort_values(["model", "step"], ignore_index=True)


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
    design = sm.add_constant(x.rename(predictor).to_frame(), has_constant="add")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = sm.MixedLM(data[target], design, groups=data[group]).fit(reml=True)
    bounds = fit.conf_int(alpha=1 - ci)
    converged = bool(getattr(fit, "converged", True))
    notes = {type(w.message).__name__ for w in caught if "Convergence" in type(w.message).__name__}
    reason = "" if converged and not notes else "fit did not fully converge"
    if not np.isfinite(bounds.loc[predictor]).all():
        # the random-intercept variance sits at its boundary (0: the groups do not differ), so
        # the mixed model's Hessian is singular; it reduces to OLS, whose standard errors are
        # then made robust to the grouping (cluster-robust by group)
        fit = sm.OLS(data[target], design).fit(
            cov_type="cluster", cov_kwds={"groups": pd.factorize(data[group])[0]}
        )
        bounds = fit.conf_int(alpha=1 - ci)
        reason = "random-intercept variance at 0: OLS with group-clustered standard errors"
    return row | dict(
        coef=float(fit.params[predictor]),
        ci_low=float(bounds.loc[predictor, 0]),
        ci_high=float(bounds.loc[predictor, 1]),
        p=float(fit.pvalues[predictor]),
        reason=reason,
    )


def combined_correlation(rows: pd.DataFrame, ci: float = 0.95) -> dict:
    """Per-run correlations (columns r, n) combined by Fisher z weighted by n - 3: r, ci_low,
    ci_high, p (two-sided normal test of the mean z), n (rows in all), n_groups, reason.
    """
    usable = rows[np.isfinite(rows["r"]) & (rows["n"] >= MIN_N_CORRELATION)]
    row = dict(r=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, n=int(usable["n"].sum()))
    row["n_groups"] = len(usable)
    if len(usable) < 2:
        return row | {"reason": f"{len(usable)} run(s) with a correlation: too few to combine"}
    weights = usable["n"] - 3
    z = np.arctanh(np.clip(usable["r"], -0.999999, 0.999999))
    mean, se = float((weights * z).sum() / weights.sum()), float(1 / np.sqrt(weights.sum()))
    half = sps.norm.ppf((1 + ci) / 2) * se
    return row | dict(
        r=float(np.tanh(mean)),
        ci_low=float(np.tanh(mean - half)),
        ci_high=float(np.tanh(mean + half)),
        p=float(2 * sps.norm.sf(abs(mean) / se)),
        reason="",
    )


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p values over the finite entries of ``p`` (NaN stays NaN)."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        out[finite] = multipletests(p[finite], method="holm")[1]
    return out


def checkpoint_correlations(
    table: pd.DataFrame,
    target: str = "neg_val_loss",
    predictors: Sequence[str] = ("coupling", "adjacent_coupling"),
    methods: Sequence[str] = METHODS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Coupling vs ``target`` over training; checkpoints of one run are repeated measures.

    They are never pooled as independent samples:

    - ``design="within run"``: each model's own correlation over its checkpoints (``subset`` =
      the model; descriptive, its checkpoints form one time series);
    - ``design="runs combined (Fisher z)"``: those correlations combined, weighted by n - 3;
    - ``design="mixed model (run as group)"``: MixedLM slope of target on the z-scored predictor
      with a random intercept per run (``coef``; ``r`` is NaN).

    ``p_holm``: Holm-adjusted over every test of the table (``note`` says so).
    """
    require_columns(table, ["model", target, *predictors])
    rows = []
    for name, part in table.groupby("model", sort=True):
        for pred in predictors:
            for method in methods:
                rows.append(
                    dict(subset=str(name), design="within run", target=target, predictor=pred)
                    | {"method": method}
                    | correlate(part[pred], part[target], method, ci)
                )
    within = pd.DataFrame(rows)
    for pred in predictors:
        for method in methods:
            runs = within[(within["predictor"] == pred) & (within["method"] == method)]
            rows.append(
                dict(subset="all runs", design="runs combined (Fisher z)", target=target)
                | dict(predictor=pred, method=method, ci_method="fisher_z")
                | combined_correlation(runs, ci)
            )
        rows.append(
            dict(subset="all runs", design="mixed model (run as group)", target=target)
            | dict(predictor=pred, method="mixedlm", ci_method="wald")
            | mixed_slope(table, target, pred, "model", ci)
        )
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p"])
    out["note"] = f"p_holm: Holm over the {int(np.isfinite(out['p']).sum())} tests of this table"
    return out


def emergence_summary(table: pd.DataFrame, column: str = "coupling") -> pd.DataFrame:
    """The shape of ``column`` over training per model: value at the first step, the peak
    (step and value), the last value, ``rise`` = peak - first, ``decline`` = peak - last, and
    ``shape`` ("rise, peak, decline" when both exceed the peak's bootstrap half-width, else
    "rise" / "flat or falling"); one row per model, with its group (seeds share a group).
    """
    require_columns(table, ["model", "step", column])
    rows = []
    for model, part in table.dropna(subset=[column]).groupby("model", sort=True):
        part = part.sort_values("step")
        peak = part.loc[part[column].idxmax()]
        first, last = part.iloc[0], part.iloc[-1]
        width = (
            (peak[f"{column}_high"] - peak[f"{column}_low"]) / 2
            if f"{column}_high" in part.columns
            else 0.0
        )
        rise, decline = peak[column] - first[column], peak[column] - last[column]
        if rise > width and decline > width:
            shape = "rise, peak, decline"
        elif rise > width:
            shape = "rise"
        else:
            shape = "flat or falling"
        rows.append(
            dict(
                model=str(model),
                group=str(part["group"].iloc[0]) if "group" in part.columns else str(model),
                first_step=int(first["step"]),
                first=float(first[column]),
                peak_step=int(peak["step"]),
                peak=float(peak[column]),
                last_step=int(last["step"]),
                last=float(last[column]),
                rise=float(rise),
                decline=float(decline),
                peak_ci_half_width=float(width),
                shape=shape,
            )
        )
    return pd.DataFrame(rows)


def write_table(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write one table as CSV, atomically."""
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


# --------------------------------------------------------------------------- ViT sweep
VIT_NOTE_HOLM = "p_holm: Holm-adjusted over the {n} per-rate tests of this method"


def vit_coupling_values(
    combined: xr.Dataset,
    k: int,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    variable: str = "coupling",
) -> xr.DataArray:
    """``combined[variable]`` (a ``vit_results.grid_dataset``) at one K, reading, variant and
    norm: dims ``(sd, wd, seed, image)``.
    """
    if variable not in combined:
        raise ValueError(f"variable {variable!r} not in dataset {list(combined.data_vars)}")
    da = select(combined[variable], k=k, reading=reading, variant=variant, norm=norm)
    return da.transpose("sd", "wd", "seed", "image")


def vit_model_table(
    combined: xr.Dataset,
    k: int,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> pd.DataFrame:
    """One row per trained ViT (sd, wd, seed): ``coupling`` (mean over images) with a percentile
    bootstrap CI over images, ``adjacent_coupling``, ``test_accuracy``, ``test_loss``,
    ``n_images``. Each model's generator is seeded by ``seed`` and its grid point.
    """
    values = vit_coupling_values(combined, k, reading, variant, norm)
    adjacent = vit_coupling_values(combined, k, reading, variant, norm, "adjacent_coupling")
    rows = []
    for sd, wd, s in itertools.product(*(values[d].values for d in ("sd", "wd", "seed"))):
        cell = values.sel(sd=sd, wd=wd, seed=s).values
        mean, low, high, n = bootstrap_mean(cell, n_boot, ci, _cell_seed(seed, "vit", sd, wd, s))
        rows.append(
            dict(
                sd=float(sd),
                wd=float(wd),
                seed=int(s),
                coupling=mean,
                coupling_low=low,
                coupling_high=high,
                adjacent_coupling=float(np.nanmean(adjacent.sel(sd=sd, wd=wd, seed=s).values)),
                test_accuracy=float(combined["test_accuracy"].sel(sd=sd, wd=wd, seed=s)),
                test_loss=float(combined["test_loss"].sel(sd=sd, wd=wd, seed=s)),
                n_images=n,
            )
        )
    return pd.DataFrame(rows)


def crossed_bootstrap_means(
    values: np.ndarray, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap means of ``values (group, seed, image)`` resampling seeds and images (each with
    replacement, the same draw for every group: seeds and images are crossed random factors,
    groups fixed). Non-finite entries are left out of each resampled mean. Returns ``(n_boot,)``.
    """
    values = np.asarray(values, dtype=float)
    _, n_seed, n_image = values.shape
    seeds = rng.integers(0, n_seed, size=(n_boot, n_seed))
    images = rng.integers(0, n_image, size=(n_boot, n_image))
    seed_counts = np.stack([np.bincount(row, minlength=n_seed) for row in seeds])
    image_counts = np.stack([np.bincount(row, minlength=n_image) for row in images])
    finite = np.isfinite(values)
    total = np.einsum("gsi,bs,bi->b", np.where(finite, values, 0.0), seed_counts, image_counts)
    count = np.einsum("gsi,bs,bi->b", finite.astype(float), seed_counts, image_counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def vit_coupling_by_rate(
    combined: xr.Dataset,
    k: int,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Coupling per stochastic-depth rate: the mean over weight decays, seeds and images
    (``wd = "all"``) and per weight decay, each with a percentile CI from
    ``crossed_bootstrap_means`` (seeds and images resampled). Columns: sd, wd, coupling,
    ci_low, ci_high, n_models, n_images, ci_method.
    """
    values = vit_coupling_values(combined, k, reading, variant, norm)
    rows = []
    alpha = (1 - ci) / 2
    for sd in values["sd"].values:
        at_rate = values.sel(sd=sd)
        groups = [("all", at_rate.values)] + [
            (format(float(wd), "g"), at_rate.sel(wd=[wd]).values) for wd in values["wd"].values
        ]
        for wd, cube in groups:
            rng = _cell_seed(seed, "vit_rate", sd, wd)
            means = crossed_bootstrap_means(cube, n_boot, rng)
            low, high = (
                np.nanquantile(means, [alpha, 1 - alpha])
                if cube.shape[1] * cube.shape[2] > 1
                else (np.nan, np.nan)
            )
            rows.append(
                dict(
                    sd=float(sd),
                    wd=wd,
                    coupling=float(np.nanmean(cube)),
                    ci_low=float(low),
                    ci_high=float(high),
                    n_models=int(cube.shape[0] * cube.shape[1]),
                    n_images=int(cube.shape[2]),
                    ci_method="percentile bootstrap, seeds and images resampled (crossed)",
                )
            )
    return pd.DataFrame(rows)


def vit_sd_trend(table: pd.DataFrame, ci: float = 0.95) -> pd.DataFrame:
    """Does stochastic depth change coupling (and accuracy)? Per response (``coupling``,
    ``test_accuracy``): OLS of the per-model values on ``sd`` with weight decay as a categorical
    covariate (``y ~ sd + C(wd)``; the slope is per unit drop-path rate), and the Spearman
    correlation of the values with ``sd`` (Fisher-z CI). Columns: response, method, term,
    estimate, ci_low, ci_high, p, n, note.
    """
    import statsmodels.formula.api as smf

    require_columns(table, ["sd", "wd", "coupling", "test_accuracy"])
    rows = []
    for response in ("coupling", "test_accuracy"):
        data = table[["sd", "wd", response]].dropna()
        n = len(data)
        base = dict(response=response, n=n)
        n_params = 2 + data["wd"].nunique() - 1
        if n <= n_params + 1 or data["sd"].nunique() < 2:
            rows.append(
                base
                | dict(
                    method="ols",
                    term="sd",
                    estimate=np.nan,
                    ci_low=np.nan,
                    ci_high=np.nan,
                    p=np.nan,
                    note=f"n={n} too small or one rate only",
                )
            )
        else:
            formula = f"{response} ~ sd" + (" + C(wd)" if data["wd"].nunique() > 1 else "")
            fit = smf.ols(formula, data=data).fit()
            low, high = fit.conf_int(alpha=1 - ci).loc["sd"]
            rows.append(
                base
                | dict(
                    method="ols",
                    term="sd",
                    estimate=float(fit.params["sd"]),
                    ci_low=float(low),
                    ci_high=float(high),
                    p=float(fit.pvalues["sd"]),
                    note=f"{formula}; r2={fit.rsquared:.3f}",
                )
            )
        res = correlate(data["sd"], data[response], "spearman", ci)
        rows.append(
            base
            | dict(
                method="spearman",
                term="sd",
                estimate=res["r"],
                ci_low=res["ci_low"],
                ci_high=res["ci_high"],
                p=res["p"],
                note=res["reason"] or res["ci_method"],
            )
        )
    columns = ["response", "method", "term", "estimate", "ci_low", "ci_high", "p", "n", "note"]
    return pd.DataFrame(rows)[columns]


def vit_coupling_accuracy(
    table: pd.DataFrame, methods: Sequence[str] = METHODS, ci: float = 0.95
) -> pd.DataFrame:
    """Coupling vs test accuracy at a fixed stochastic-depth rate.

    Per rate and method: r of per-model coupling and accuracy across weight decays and seeds
    (``correlate``: Fisher-z CIs), with Holm-adjusted p-values over the rates (``p_holm``).
    Pooled over rates (``sd = "pooled"``): ``within_ols``, the slope of accuracy on coupling
    with one intercept per rate (``test_accuracy ~ coupling + C(sd)``; accuracy per unit
    coupling) and the within-rate partial correlation it implies (``within_r``, Fisher z with
    se ``1/sqrt(n - 2 - n_rates)``); ``mixedlm``, statsmodels MixedLM with a random intercept
    per rate. Columns: sd, method, estimate, ci_low, ci_high, p, p_holm, n, note.
    """
    require_columns(table, ["sd", "coupling", "test_accuracy"])
    rows = []
    for method in methods:
        per_rate = []
        for sd, part in table.groupby("sd", sort=True):
            res = correlate(part["coupling"], part["test_accuracy"], method, ci)
            per_rate.append(
                dict(
                    sd=format(float(sd), "g"),
                    method=method,
                    estimate=res["r"],
                    ci_low=res["ci_low"],
                    ci_high=res["ci_high"],
                    p=res["p"],
                    n=res["n"],
                    note=res["reason"] or res["ci_method"],
                )
            )
        adjusted = holm([row["p"] for row in per_rate])
        for row, p in zip(per_rate, adjusted):
            row["p_holm"] = float(p)
            row["note"] += "; " + VIT_NOTE_HOLM.format(n=int(np.isfinite(adjusted).sum()))
        rows += per_rate
    rows += _vit_pooled_within_rate(table, ci)
    columns = ["sd", "method", "estimate", "ci_low", "ci_high", "p", "p_holm", "n", "note"]
    return pd.DataFrame(rows)[columns]


def _vit_pooled_within_rate(table: pd.DataFrame, ci: float) -> list[dict]:
    """The pooled within-rate rows of ``vit_coupling_accuracy``."""
    import statsmodels.formula.api as smf

    data = table[["sd", "coupling", "test_accuracy"]].dropna()
    n, groups = len(data), data["sd"].nunique()
    nan = dict(estimate=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, p_holm=np.nan, n=n)
    df = n - 2 - (groups - 1)
    if df < 2 or data.groupby("sd")["coupling"].nunique().max() < 2:
        note = f"n={n} with {groups} rates: too few models per rate"
        return [
            dict(sd="pooled", method=m) | nan | {"note": note}
            for m in ("within_ols", "within_r", "mixedlm")
        ]
    formula = "test_accuracy ~ coupling" + (" + C(sd)" if groups > 1 else "")
    fit = smf.ols(formula, data=data).fit()
    low, high = fit.conf_int(alpha=1 - ci).loc["coupling"]
    t = float(fit.tvalues["coupling"])
    r = t / np.sqrt(t**2 + fit.df_resid)
    r_low, r_high = fisher_ci(r, n, ci, se=1 / np.sqrt(n - 2 - groups))
    rows = [
        dict(
            sd="pooled",
            method="within_ols",
            estimate=float(fit.params["coupling"]),
            ci_low=float(low),
            ci_high=float(high),
            p=float(fit.pvalues["coupling"]),
            p_holm=np.nan,
            n=n,
            note=f"{formula}: accuracy per unit coupling",
        ),
        dict(
            sd="pooled",
            method="within_r",
            estimate=float(r),
            ci_low=r_low,
            ci_high=r_high,
            p=float(fit.pvalues["coupling"]),
            p_holm=np.nan,
            n=n,
            note=f"partial r given the rate (t/sqrt(t^2+df), df={int(fit.df_resid)})",
        ),
    ]
    mixed = mixed_slope(data, "test_accuracy", "coupling", "sd", ci, standardize=False)
    note = "MixedLM test_accuracy ~ coupling, random intercept per rate"
    rows.append(
        dict(sd="pooled", method="mixedlm", p_holm=np.nan, n=n)
        | {key: mixed[key] for key in ("ci_low", "ci_high", "p")}
        | {
            "estimate": mixed["coef"],
            "note": note + (f"; {mixed['reason']}" if mixed["reason"] else ""),
        }
    )
    return rows
