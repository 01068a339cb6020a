"""ViT stochastic-depth sweep: per-model coupling and accuracy, coupling vs rate, and coupling
vs accuracy at a fixed rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from blockcoupling.coupling import registry as measures
from blockcoupling.stats.core import (
    CALIBRATED,
    METHODS,
    NULLS,
    _cell_seed,
    bootstrap_mean,
    calibrated_columns,
    correlate,
    fisher_ci,
    holm,
    mixed_slope,
    require_columns,
    select,
)
from blockcoupling.stats.inference import (
    MIN_CLUSTERS,
    analysis_row,
    analysis_table,
    cluster_slope,
    term_identified,
    wild_cluster_p,
)
from blockcoupling.stats.selection import Bootstrap, Selection

# --------------------------------------------------------------------------- ViT sweep
VIT_NOTE_HOLM = "p_holm: Holm-adjusted over the {n} per-rate tests of this method"


def vit_coupling_values(
    combined: xr.Dataset, selection: Selection, variable: str = "coupling"
) -> xr.DataArray:
    """``combined[variable]`` (a ``vit.results.grid_dataset``) at one K, reading, variant and
    norm: dims ``(sd, wd, seed, image)``.
    """
    if variable not in combined:
        raise ValueError(f"variable {variable!r} not in dataset {list(combined.data_vars)}")
    da = select(combined[variable], **selection)
    if "image" not in da.dims:  # a per-model value (overlap_null = K/d): the same for each image
        da = da.expand_dims(image=combined["image"].values, axis=-1)
    return da.transpose("sd", "wd", "seed", "image")


def vit_measures(combined: xr.Dataset) -> list[str]:
    """The coupling measures the sweep tabulates: raw ``coupling``, then the calibrated ones the
    dataset holds.
    """
    return ["coupling"] + [m for m in CALIBRATED if m in combined]


def _null_values(combined: xr.Dataset, selection: Selection) -> dict[str, xr.DataArray]:
    """The chance levels the dataset holds (``NULLS``), dims ``(sd, wd, seed, image)``."""
    return {
        name: vit_coupling_values(combined, selection, variable=name)
        for name in NULLS
        if name in combined
    }


def vit_model_table(
    combined: xr.Dataset, selection: Selection, boot: Bootstrap = Bootstrap()
) -> pd.DataFrame:
    """One row per trained ViT (sd, wd, seed): each of ``vit_measures`` (mean over images) with
    a percentile bootstrap CI over images (``{measure}_low``/``_high``; the same resampled
    images for every measure), ``adjacent_coupling``, the chance levels ``coupling_null`` and
    ``overlap_null`` (means over images), ``test_accuracy``, ``test_loss``, ``n_images``. Each
    model's generator is seeded by ``seed`` and its grid point.
    """
    n_boot, seed, ci = boot.n_boot, boot.seed, boot.ci
    values = {
        m: vit_coupling_values(combined, selection, variable=m) for m in vit_measures(combined)
    }
    adjacent = vit_coupling_values(combined, selection, variable="adjacent_coupling")
    nulls = {
        name: da.mean("image", skipna=True)
        for name, da in _null_values(combined, selection).items()
    }
    rows = []
    grid = values["coupling"]
    for sd, wd, s in itertools.product(*(grid[d].values for d in ("sd", "wd", "seed"))):
        at = dict(sd=sd, wd=wd, seed=s)
        row: dict = dict(sd=float(sd), wd=float(wd), seed=int(s))
        for measure, da in values.items():
            rng = _cell_seed(seed, "vit", sd, wd, s)
            mean, low, high, n = bootstrap_mean(da.sel(at).values, n_boot, ci, rng)
            row |= {measure: mean, f"{measure}_low": low, f"{measure}_high": high}
            row.setdefault("n_images", n)
        row["adjacent_coupling"] = float(np.nanmean(adjacent.sel(at).values))
        row |= {name: float(mean.sel(at)) for name, mean in nulls.items()}
        row["test_accuracy"] = float(combined["test_accuracy"].sel(at))
        row["test_loss"] = float(combined["test_loss"].sel(at))
        rows.append(row)
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
    combined: xr.Dataset, selection: Selection, boot: Bootstrap = Bootstrap()
) -> pd.DataFrame:
    """Each of ``vit_measures`` per stochastic-depth rate: the mean over weight decays, seeds
    and images (``wd = "all"``) and per weight decay, each with a percentile CI from
    ``crossed_bootstrap_means`` (seeds and images resampled) from at least
    ``inference.MIN_CLUSTERS`` seeds, else the range of the seed means (``ci_method`` says
    which: a bootstrap over 2 seeds is no interval). Columns: sd, wd, coupling, ci_low,
    ci_high (raw coupling's), ``{measure}``, ``{measure}_low``, ``{measure}_high`` for the
    calibrated ones, the chance levels (``NULLS``, means), n_models, n_images, ci_method.
    """
    n_boot, seed, ci = boot.n_boot, boot.seed, boot.ci
    values = {
        m: vit_coupling_values(combined, selection, variable=m) for m in vit_measures(combined)
    }
    nulls = _null_values(combined, selection)
    rows = []
    alpha = (1 - ci) / 2
    decays = [("all", list(values["coupling"]["wd"].values))]
    decays += [(format(float(wd), "g"), [wd]) for wd in values["coupling"]["wd"].values]
    for sd in values["coupling"]["sd"].values:
        for wd, chosen in decays:
            row: dict = dict(sd=float(sd), wd=wd)
            for measure, da in values.items():
                cube = da.sel(sd=sd, wd=chosen).values
                rng = _cell_seed(seed, "vit_rate", sd, wd)
                if cube.shape[1] >= MIN_CLUSTERS:
                    means = crossed_bootstrap_means(cube, n_boot, rng)
                    low, high = np.nanquantile(means, [alpha, 1 - alpha])
                    method = "percentile bootstrap, seeds and images resampled (crossed)"
                else:
                    seed_means = np.nanmean(cube, axis=(0, 2))
                    low, high = np.nanmin(seed_means), np.nanmax(seed_means)
                    method = f"range of the seed means ({cube.shape[1]} seeds < {MIN_CLUSTERS})"
                lower, upper = (
                    ("ci_low", "ci_high")
                    if measure == "coupling"
                    else (f"{measure}_low", f"{measure}_high")
                )
                row |= {measure: float(np.nanmean(cube)), lower: float(low), upper: float(high)}
                row |= dict(
                    n_models=int(cube.shape[0] * cube.shape[1]),
                    n_images=int(cube.shape[2]),
                    ci_method=method,
                )
            for name, da in nulls.items():
                row[name] = float(np.nanmean(da.sel(sd=sd, wd=chosen).values))
            rows.append(row)
    return pd.DataFrame(rows)


def vit_sd_trend(table: pd.DataFrame, ci: float = 0.95) -> pd.DataFrame:
    """Does stochastic depth change coupling (and accuracy)? Per response (``coupling``, the
    calibrated measures the table has, ``test_accuracy``): OLS of the per-model values on
    ``sd`` with weight decay as a categorical covariate (``y ~ sd + C(wd)``; the slope is per
    unit drop-path rate), and the Spearman correlation of the values with ``sd`` (Fisher-z CI).
    Columns: response, method, term, estimate, ci_low, ci_high, p, n, note.
    """
    import statsmodels.formula.api as smf

    require_columns(table, ["sd", "wd", "coupling", "test_accuracy"])
    rows = []
    calibrated = calibrated_columns(table)
    for response in ("coupling", *calibrated, "test_accuracy"):
        data = table[["sd", "wd", response]].dropna()
        n = len(data)
        base = dict(response=response, n=n)
        n_params = 2 + data["wd"].nunique() - 1
        formula = f"{response} ~ sd" + (" + C(wd)" if data["wd"].nunique() > 1 else "")
        model, note = None, f"n={n} too small or one rate only"
        if n > n_params + 1 and data["sd"].nunique() >= 2:
            model = smf.ols(formula, data=data)
            if not term_identified(model, "sd"):
                model = None
                note = f"{formula}: n={n}, sd not identified (each rate at its own decays)"
        if model is None:
            rows.append(
                base
                | dict(
                    method="ols",
                    term="sd",
                    estimate=np.nan,
                    ci_low=np.nan,
                    ci_high=np.nan,
                    p=np.nan,
                    note=note,
                )
            )
        else:
            fit = model.fit()
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
    """Each coupling measure (raw ``coupling`` and the calibrated ones the table has) vs test
    accuracy at a fixed stochastic-depth rate.

    Per measure, rate and method: r of per-model measure and accuracy across weight decays and
    seeds (``correlate``: Fisher-z CIs), with Holm-adjusted p-values over the rates
    (``p_holm``). Pooled over rates (``sd = "pooled"``): ``within_ols``, the slope of accuracy
    on the measure with one intercept per rate (``test_accuracy ~ measure + C(sd)``; accuracy
    per unit of the measure) and the within-rate partial correlation it implies (``within_r``,
    Fisher z with se ``1/sqrt(n - 2 - n_rates)``); ``mixedlm``, statsmodels MixedLM with a
    random intercept per rate. Where seeds recur across rates the seed is the unit
    (``_by_seed``: CR1 by seed, t(S-1); n = seeds). Columns: measure, sd, method, estimate,
    ci_low, ci_high, p, p_holm, n, note.
    """
    require_columns(table, ["sd", "coupling", "test_accuracy"])
    rows = []
    calibrated = calibrated_columns(table)
    for measure in ("coupling", *calibrated):
        for method in methods:
            per_rate = []
            for sd, part in table.groupby("sd", sort=True):
                res = correlate(part[measure], part["test_accuracy"], method, ci)
                per_rate.append(
                    dict(
                        measure=measure,
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
        rows += [row | {"measure": measure} for row in _vit_pooled_within_rate(table, measure, ci)]
    columns = ["measure", "sd", "method", "estimate", "ci_low", "ci_high", "p", "p_holm", "n"]
    return pd.DataFrame(rows)[[*columns, "note"]]


def _vit_pooled_within_rate(table: pd.DataFrame, measure: str, ci: float) -> list[dict]:
    """The pooled within-rate rows of ``vit_coupling_accuracy`` for one measure."""
    import statsmodels.formula.api as smf

    data = table[["sd", measure, "test_accuracy"]].dropna().rename(columns={measure: "x"})
    n, groups = len(data), data["sd"].nunique()
    nan = dict(estimate=np.nan, ci_low=np.nan, ci_high=np.nan, p=np.nan, p_holm=np.nan, n=n)
    df = n - 2 - (groups - 1)
    if df < 2 or data.groupby("sd")["x"].nunique().max() < 2:
        note = f"n={n} with {groups} rates: too few models per rate"
        return [
            dict(sd="pooled", method=m) | nan | {"note": note}
            for m in ("within_ols", "within_r", "mixedlm")
        ]
    formula = "test_accuracy ~ x" + (" + C(sd)" if groups > 1 else "")
    shown = formula.replace(" x", f" {measure}")
    model = smf.ols(formula, data=data)
    if not term_identified(model, "x"):
        note = f"{shown}: {measure} not identified within rates"
        return [
            dict(sd="pooled", method=m) | nan | {"note": note}
            for m in ("within_ols", "within_r", "mixedlm")
        ]
    fit = model.fit()
    low, high = fit.conf_int(alpha=1 - ci).loc["x"]
    t = float(fit.tvalues["x"])
    r = t / np.sqrt(t**2 + fit.df_resid)
    r_low, r_high = fisher_ci(r, n, ci, se=1 / np.sqrt(n - 2 - groups))
    if "seed" in table and table.groupby("seed")["sd"].nunique().max() > 1:
        return _by_seed(table, measure, shown, float(fit.params["x"]), float(r), ci)
    rows = [
        dict(
            sd="pooled",
            method="within_ols",
            estimate=float(fit.params["x"]),
            ci_low=float(low),
            ci_high=float(high),
            p=float(fit.pvalues["x"]),
            p_holm=np.nan,
            n=n,
            note=f"{shown}: accuracy per unit {measure}",
        ),
        dict(
            sd="pooled",
            method="within_r",
            estimate=float(r),
            ci_low=r_low,
            ci_high=r_high,
            p=float(fit.pvalues["x"]),
            p_holm=np.nan,
            n=n,
            note=f"partial r given the rate (t/sqrt(t^2+df), df={int(fit.df_resid)})",
        ),
    ]
    mixed = mixed_slope(data, "test_accuracy", "x", "sd", ci, standardize=False)
    note = f"MixedLM test_accuracy ~ {measure}, random intercept per rate"
    rows.append(
        dict(sd="pooled", method="mixedlm", p_holm=np.nan, n=n)
        | {key: mixed[key] for key in ("ci_low", "ci_high", "p")}
        | {
            "estimate": mixed["coef"],
            "note": note + (f"; {mixed['reason']}" if mixed["reason"] else ""),
        }
    )
    return rows


def _by_seed(
    table: pd.DataFrame, measure: str, shown: str, slope: float, r: float, ci: float
) -> list[dict]:
    """The pooled within-rate rows when a seed recurs across rates: a seed fixes a ViT's init
    and data order at every rate, so the within-rate association across seeds repeats at each
    rate and the seed is the unit. ``within_ols``: the same slope, CR1 by seed, t(S-1) (none
    from fewer than ``MIN_CLUSTERS`` seeds), its wild cluster bootstrap p in the note;
    ``within_r``: the partial r, its p the slope's, no Fisher-z interval (that one counts
    ViTs); ``mixedlm`` (a random intercept per rate, the ViTs independent) not fitted.
    """
    data = table[["sd", "seed", measure, "test_accuracy"]].dropna().rename(columns={measure: "x"})
    fit = cluster_slope(data, "test_accuracy", "x", "seed", fixed=("sd",), ci=ci)
    seeds = fit["n_clusters"]
    said = f"seeds recur across rates: the unit is the seed ({seeds} seeds, {len(data)} ViTs)"
    wild = f", wild cluster bootstrap p={fit['p_wild']:.3g}" if np.isfinite(fit["p_wild"]) else ""
    nan = dict(ci_low=np.nan, ci_high=np.nan, p_holm=np.nan, n=seeds)
    return [
        dict(sd="pooled", method="within_ols", estimate=slope, p=fit["p"])
        | nan
        | dict(ci_low=fit["ci_low"], ci_high=fit["ci_high"])
        | {"note": f"{shown}: accuracy per unit {measure}; {said}; {fit['note']}{wild}"},
        dict(sd="pooled", method="within_r", estimate=r, p=fit["p"])
        | nan
        | {"note": f"partial r given the rate; {said}: p of within_ols, no interval"},
        dict(sd="pooled", method="mixedlm", estimate=np.nan, p=np.nan)
        | nan
        | {"note": f"not fitted: {said} (a random intercept per rate takes ViTs as units)"},
    ]


def vit_run_table(combined: xr.Dataset, selection: Selection) -> pd.DataFrame:
    """One row per trained ViT (sd, wd, seed): ``test_accuracy`` and the mean over images of
    ``coupling`` and, when measured, ``coupling_excess`` and ``overlap_u``.
    """
    accuracy = combined["test_accuracy"].transpose("sd", "wd", "seed")
    grid = list(itertools.product(*(accuracy[d].values for d in ("sd", "wd", "seed"))))
    rows = pd.DataFrame(grid, columns=["sd", "wd", "seed"])
    rows["test_accuracy"] = accuracy.values.ravel()
    for variable in (m.summary for m in measures.shown()):
        if variable in combined:
            values = vit_coupling_values(combined, selection, variable=variable)
            rows[variable] = values.mean("image", skipna=True).values.ravel()
    return rows


def vit_analyses(runs: pd.DataFrame, primary: Sequence[str] = (), ci: float = 0.95) -> pd.DataFrame:
    """The sweep's designed tests, one trained ViT per unit (each its own training run).

    - ``vit_sd_effect[_{measure}]``: slope of the measure per unit drop-path rate, OLS with seed
      as a block (``y ~ sd + C(seed)``, + ``C(wd)`` when several weight decays), t(n - p),
      and the wild cluster bootstrap p by seed beside it (the verdict takes the larger);
    - ``vit_sd_effect_accuracy``: the same for test accuracy;
    - ``vit_accuracy_within_rate[_{measure}]``: test accuracy per sd of the measure, pooled
      within rates, seed as a block (``test_accuracy ~ z + C(sd) + C(seed)``, + ``C(wd)`` when
      several): a seed fixes a ViT's init and data order at every rate, so runs sharing a seed
      are not independent; the slope rests on the seed-by-rate variation.
    The measure is ``coupling_excess`` (no suffix); raw ``coupling`` and ``overlap_u`` are
    secondary. A missing measure gives a row saying so.
    """
    rows = []
    tested = {m.summary: measures.test_suffix(m) for m in measures.primary_first()}
    for measure, suffix in {**tested, "test_accuracy": "_accuracy"}.items():
        if measure not in runs or runs[measure].isna().all():
            note = f"not measured: {measure} absent"
            rows.append(analysis_row(f"vit_sd_effect{suffix}", "run", 0, "", note=note))
            if measure != "test_accuracy":
                name = f"vit_accuracy_within_rate{suffix}"
                rows.append(analysis_row(name, "run", 0, "", note=note))
            continue
        rows.append(_ols_row(runs, f"vit_sd_effect{suffix}", measure, "sd", ["seed", "wd"], ci))
        if measure != "test_accuracy":
            data = runs.assign(z=(runs[measure] - runs[measure].mean()) / runs[measure].std())
            name = f"vit_accuracy_within_rate{suffix}"
            rows.append(_ols_row(data, name, "test_accuracy", "z", ["sd", "seed", "wd"], ci))
    return analysis_table(rows, primary)


def _ols_row(
    data: pd.DataFrame, name: str, response: str, term: str, blocks: list[str], ci: float
) -> dict:
    """OLS ``response ~ term + C(block)...`` (blocks with one level left out): the term's row,
    classical SE and t(n - parameters), and beside it ``p_wild``, the wild cluster bootstrap
    clustered by seed (a seed fixes init and data order at every rate and weight decay): the
    verdict takes the larger p (``inference.deciding_p``). NaN ``p_wild`` from one seed.
    """
    import statsmodels.formula.api as smf

    data = data[[response, term, *blocks]].dropna()
    used = [b for b in blocks if data[b].nunique() > 1]
    formula = f"{response} ~ {term}" + "".join(f" + C({b})" for b in used)
    n_params = 2 + sum(data[b].nunique() - 1 for b in used)
    method = "OLS, classical SE, t(n - parameters); wild cluster bootstrap p by seed"
    if len(data) <= n_params + 1 or data[term].nunique() < 2:
        note = f"{formula}: n={len(data)} too small for {n_params} parameters"
        return analysis_row(name, "run", len(data), method, note=note)
    model = smf.ols(formula, data=data)
    if not term_identified(model, term):
        note = f"{formula}: n={len(data)}, {term} not identified beside the blocks"
        return analysis_row(name, "run", len(data), method, note=note)
    fit = model.fit()
    low, high = fit.conf_int(alpha=1 - ci).loc[term]
    seeds = data["seed"].to_numpy() if "seed" in data else np.zeros(len(data))
    column = model.exog_names.index(term)
    p_wild = wild_cluster_p(model.endog, model.exog, column, seeds)
    n_seeds = len(np.unique(seeds))
    wild = (
        f"wild cluster bootstrap by seed ({n_seeds} seeds), p={p_wild:.3g}"
        if np.isfinite(p_wild)
        else "no wild cluster bootstrap: one seed"
    )
    return analysis_row(
        name,
        "run",
        len(data),
        method,
        fit.params[term],
        low,
        high,
        fit.pvalues[term],
        f"{formula}; df={int(fit.df_resid)}; {wild}",
        p_wild=p_wild,
    )
