"""Cross-model analyses (exploratory): per-model coupling with bootstrap CIs over prompts,
correlations with the score and hyperparameters, OLS, partial r and the K sweep.

Every row is one model; seeds of one configuration are not independent models, so these tables
describe the models measured (they carry no primary test). Coupling is minus the mean
mis-coupling (larger = more coupled). Each analysis runs per `subset` (`all`, `base`, families).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps
from statsmodels.regression.linear_model import OLS
from statsmodels.tools.tools import add_constant

from blockcoupling.stats.core import (
    CALIBRATED,
    METHODS,
    MIN_N_CORRELATION,
    NULLS,
    _bootstrap_cells,
    _log10,
    _zscore,
    calibrated_columns,
    correlate,
    fisher_ci,
    holm,
    require_columns,
    select,
)
from blockcoupling.stats.inference import analysis_row, analysis_table
from blockcoupling.stats.selection import Bootstrap, Selection

SUBSETS = ("all", "base", "pretrained")
SCORE_NAMES = {"score": "score", "bits_per_byte": "neg_bits_per_byte", "mc_accuracy": "mc_accuracy"}
HYPERPARAMETERS = ("log10_params", "n_layers", "d_model", "log10_train_tokens")
DEFAULT_PREDICTORS = ("coupling", *HYPERPARAMETERS)
DEFAULT_PREDICTOR_SETS = {
    "coupling": ["coupling"],
    "hyperparameters": ["log10_params", "n_layers", "d_model"],
    "both": ["coupling", "log10_params", "n_layers", "d_model"],
}


def model_coupling(
    coupling: xr.Dataset,
    selection: Selection = Selection(),
    boot: Bootstrap = Bootstrap(),
    variable: str = "coupling",
) -> xr.Dataset:
    """Mean coupling over prompts per (model, init|step) with a percentile bootstrap CI over
    prompts.

    `coupling[variable]` has dims (model, init|step, reading, variant, norm, k, prompt) and coord
    `prompt_source`. Returns `{variable}`, `{variable}_low/_high`, `n_prompts` (model, init|step)
    and the same per prompt source: `{variable}_by_source*` (model, init|step, source). NaN prompts
    are dropped; a CI needs >= 5 prompts (core.MIN_BOOTSTRAP). Seeds are per cell (seed + hash
    of its labels).
    """
    if variable not in coupling:
        raise ValueError(f"variable {variable!r} not in dataset {list(coupling.data_vars)}")
    n_boot, seed, ci = boot.n_boot, boot.seed, boot.ci
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    da = select(coupling[variable], **selection)
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
            **selection,
            n_boot=n_boot,
            seed=seed,
            ci=ci,
            ci_method="percentile bootstrap over prompts",
        )
    )
    return result


# --------------------------------------------------------------------------- model table


def with_calibrated(
    table: pd.DataFrame,
    coupling: xr.Dataset,
    selection: Selection = Selection(),
    boot: Bootstrap = Bootstrap(),
) -> pd.DataFrame:
    """``table`` (a ``model_table``) with the calibrated measures of each trained model:
    ``coupling_excess`` and ``overlap_u`` with their percentile bootstrap CIs over prompts (as
    ``coupling``), ``coupling_null`` (raw coupling at chance) and ``overlap_null`` (K/d), where
    the combined dataset has them.
    """
    table = table.copy()
    models = table["model"].to_numpy()
    for name in CALIBRATED:
        if name not in coupling:
            continue
        per_model = model_coupling(coupling, selection, boot, variable=name)
        trained = select(per_model, init="trained").reindex(model=models)
        for suffix in ("", "_low", "_high"):
            table[f"{name}{suffix}"] = trained[f"{name}{suffix}"].values
    for name in NULLS:
        if name in coupling:
            values = select(coupling[name], **selection)
            values = select(values, init="trained").reindex(model=models)
            mean = values.mean("prompt") if "prompt" in values.dims else values
            table[name] = mean.values
    return table


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
            "group": [g if isinstance(g, str) and g else m for g, m in zip(coord("group"), models)],
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


def subset_frames(
    table: pd.DataFrame, subsets: Sequence[str] = SUBSETS
) -> Iterator[tuple[str, pd.DataFrame]]:
    """Yield (name, rows) for `all` (every row), `base` (rows with base == True), `pretrained`
    (the models that are not runs of a training grid) and
    `family:<name>` (the rows of one family, e.g. a training grid). Models that share a `group`
    (seeds of one configuration) are averaged into one row: configurations are the units.
    """
    for name in subsets:
        if name == "all":
            rows = table
        elif name == "base":
            rows = table[table["base"].astype(bool)]
        elif name == "pretrained":  # not a run of a training grid: its group is its own name
            rows = table
            if "group" in table:
                rows = table[table["group"].astype(str) == table["model"].astype(str)]
        elif name.startswith("family:"):
            rows = table[table["family"].astype(str) == name.split(":", 1)[1]]
        else:
            raise ValueError(f"subset must be one of {SUBSETS} or family:<name>, got {name!r}")
        yield name, by_configuration(rows)


def by_configuration(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per ``group`` (numeric columns averaged over its seeds, others from the first
    model); ``rows`` unchanged when it has no group column or every group has one model.
    ``attrs["unit"]`` says which.
    """
    if "group" not in rows or not rows["group"].duplicated().any():
        rows = rows.copy()
        rows.attrs["unit"] = "model"
        return rows
    numeric = rows.select_dtypes("number").columns
    agg = {c: ("mean" if c in numeric else "first") for c in rows.columns if c != "group"}
    merged = rows.groupby("group", sort=False, as_index=False).agg(agg)
    merged.attrs["unit"] = "configuration (seeds averaged)"
    return merged


def table_subsets(table: pd.DataFrame) -> tuple[str, ...]:
    """The subsets each exploratory table reports: `all`, `base` and `pretrained` when the
    table is one kind of model, else `pretrained` alone (runs of a training grid are never
    pooled with pretrained models: two disjoint clusters make a correlation of clusters), and
    `family:<name>` for every family with at least MIN_N_CORRELATION models that is not the
    whole table.
    """
    counts = table["family"].astype(str).value_counts()
    families = [f for f, n in sorted(counts.items()) if MIN_N_CORRELATION <= n < len(table)]
    grid_runs = (
        table["group"].astype(str) != table["model"].astype(str)
        if "group" in table
        else pd.Series(False, index=table.index)
    )
    pooled = SUBSETS if grid_runs.all() or not grid_runs.any() else ("pretrained",)
    return (*pooled, *(f"family:{f}" for f in families))


def table_predictors(table: pd.DataFrame) -> tuple[str, ...]:
    """Raw ``coupling``, the calibrated measures the table holds, then the hyperparameters."""
    calibrated = calibrated_columns(table)
    return ("coupling", *calibrated, *HYPERPARAMETERS)


def with_holm(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``p_holm`` (Holm over every finite p of the table) and a ``note``."""
    n = int(np.isfinite(frame["p"].astype(float)).sum())
    return frame.assign(
        p_holm=holm(frame["p"]), note=f"p_holm: Holm over the {n} tests of this table"
    )


def correlations(
    table: pd.DataFrame,
    target: str = "score",
    predictors: Sequence[str] = DEFAULT_PREDICTORS,
    methods: Sequence[str] = METHODS,
    subsets: Sequence[str] = SUBSETS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Correlation of each predictor with `target`, per subset and method (see `correlate`).

    Columns: subset, target, predictor, method, unit, r, ci_low, ci_high, p, n, ci_method,
    reason (n counts units: configurations when seeds were averaged).
    """
    require_columns(table, [target, *predictors])
    rows = [
        dict(subset=name, target=target, predictor=pred, method=m, unit=rows.attrs["unit"])
        | correlate(rows[pred], rows[target], m, ci)
        for name, rows in subset_frames(table, subsets)
        for pred in predictors
        for m in methods
    ]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- OLS and partial r
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
    fit = OLS(data[target], add_constant(_zscore(data[list(predictors)]), has_constant="add")).fit()
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
    design = add_constant(data[list(covariates)], has_constant="add")
    rx = OLS(data[x], design).fit().resid
    ry = OLS(data[y], design).fit().resid
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
    selection: Selection = Selection(),
    target: str = "score",
    methods: Sequence[str] = METHODS,
    subsets: Sequence[str] = SUBSETS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Correlation of trained-model coupling (mean over prompts) with `target` for every K (the
    selection's reading, variant and norm).

    `coupling`: combined dataset (see `model_coupling`); `table`: `model_table` output
    (target, base).
    Columns: k plus those of `correlations` (predictor = "coupling").
    """
    require_columns(table, ["model", "base", target])
    means = select(coupling["coupling"], **selection.every_k(), init="trained")
    means = means.mean("prompt", skipna=True)
    frames = []
    for k in means["k"].values:
        at_k = pd.DataFrame(
            {"model": means["model"].values.astype(str), "coupling": means.sel(k=k).values}
        )
        keep = [c for c in ("model", "base", "family", "group", target) if c in table]
        merged = table[keep].merge(at_k, on="model", how="left")
        frames.append(
            correlations(merged, target, ("coupling",), methods, subsets, ci).assign(k=int(k))
        )
    return pd.concat(frames, ignore_index=True)[["k", *frames[0].columns.drop("k")]]


def analysis_rows(correlation_table: pd.DataFrame, primary: Sequence[str] = ()) -> pd.DataFrame:
    """The cross-model tests in the analysis-table format (``inference.ANALYSIS_COLUMNS``), over
    the pretrained models (subset ``pretrained``: never pooled with the runs trained here; unit
    model; exploratory: the models differ in data, size and training at once).

    - ``crossmodel_coupling_vs_score``: the Spearman rho of coupling and the score;
    - ``crossmodel_coupling_vs_size``: |rho| of coupling with the score minus the largest |rho|
      of log parameters, depth or width with it (the paper: coupling correlates more strongly
      than those); an estimate only (the rhos share their models), none where a size predictor
      does not vary or has no rho.
    """
    picked = correlation_table[
        (correlation_table["subset"] == "pretrained") & (correlation_table["method"] == "spearman")
    ].set_index("predictor")
    method = "Spearman across models, Bonett-Wright interval"
    if "coupling" not in picked.index:
        rows = [analysis_row("crossmodel_coupling_vs_score", "model", 0, method, note="no row")]
    else:
        row = picked.loc["coupling"]
        rows = [
            analysis_row(
                "crossmodel_coupling_vs_score",
                "model",
                row["n"],
                method,
                row["r"],
                row["ci_low"],
                row["ci_high"],
                row["p"],
                row["reason"] or f"target {row['target']}",
            )
        ]
    rows.append(_size_row(picked))
    return analysis_table(rows, primary)


def _size_row(picked: pd.DataFrame) -> dict:
    """``crossmodel_coupling_vs_size`` from the pretrained models' Spearman rows (by predictor)."""
    name, method = "crossmodel_coupling_vs_size", "|rho| of coupling minus the largest size |rho|"
    sizes = list(DEFAULT_PREDICTOR_SETS["hyperparameters"])
    missing = [p for p in ["coupling", *sizes] if p not in picked.index]
    if missing:
        return analysis_row(name, "model", 0, method, note=f"no pretrained rows for {missing}")
    r = picked["r"].astype(float)
    n = int(picked.loc["coupling", "n"])
    unusable = [p for p in ["coupling", *sizes] if not np.isfinite(r[p])]
    if unusable:
        reasons = "; ".join(f"{p}: {picked.loc[p, 'reason'] or 'no rho'}" for p in unusable)
        return analysis_row(
            name,
            "model",
            n,
            method,
            note=f"not testable with these models ({n} pretrained): {reasons}",
        )
    largest = max(sizes, key=lambda p: abs(r[p]))
    return analysis_row(
        name,
        "model",
        n,
        method,
        abs(r["coupling"]) - abs(r[largest]),
        note=f"largest size rho: {largest} ({r[largest]:.3g}); no interval (the rhos share "
        "their models)",
    )
