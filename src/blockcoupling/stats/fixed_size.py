"""Coupling vs generalization at fixed size (training family ``fixed_size``): one row per run,
regressions clustered by configuration (``group``: the run without its seed).

Outcomes: minus held-out bits per byte (``neg_bpb``, higher = better) and the generalization gap
(``gap`` = val_loss - train_loss at each run's last history step, nats/token). Predictors: the
calibrated ``coupling_excess`` (primary), ``overlap_u`` and the paper's raw ``coupling``, each a
mean over the held-out-domain prompts (prompt_source ``shakespeare``) and, separately, over the
leaderboard-style prompts. Every measure of the top-K bases moves with the shape of the
Jacobians' spectra (docs/science.md, "Which K"), so each slope is also given adjusted for the
log of the run's median effective rank (``_rank_adjusted``): the association of coupling with
generalization beyond what the spectrum's shape carries. Pretrained models are never pooled in
(the cross-model tables report them beside).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from blockcoupling.coupling import registry as measures
from blockcoupling.stats.core import correlate, select
from blockcoupling.stats.inference import (
    analysis_row,
    analysis_table,
    cluster_slope,
    run_level_test,
    test_row,
)
from blockcoupling.stats.selection import Selection

FAMILY = "fixed_size"
HELD_OUT_SOURCE = "shakespeare"
PREDICTORS = {m.summary: m.key for m in measures.tested()}  # the primary measure first
OUTCOMES = {"neg_bpb": "bpb", "gap": "gap"}
PROMPT_SETS = {"held_out": "", "leaderboard": "_leaderboard"}
DESIGN_COORDS = ("data_fraction", "weight_decay", "learning_rate", "seed")
DESIGN = ("log_data_fraction", "weight_decay", "log_learning_rate")  # the _adjusted covariates
RANK = "log_effective_rank"  # the _rank_adjusted covariate, per prompt set: {RANK}_{held_out|...}


def run_table(
    coupling: xr.Dataset,
    evaluation: xr.Dataset | None,
    histories: Mapping[str, pd.DataFrame],
    selection: Selection,
) -> pd.DataFrame:
    """One row per trained model of the ``fixed_size`` family: model, group, the design coords
    present (``DESIGN_COORDS``), per predictor and prompt set ``{predictor}_{held_out|leaderboard}``
    (mean over those prompts; NaN when the variable or the prompts are absent), per prompt set
    ``log_effective_rank_{held_out|leaderboard}`` (natural log of the median effective rank of
    the trained model's Jacobians over those prompts and its blocks; NaN without it),
    ``twin_difference`` (trained - random-twin excess, held-out prompts), neg_bpb, gap.
    ``histories``: model -> history.csv.
    """
    models = coupling["model"]
    family = models["family"].values.astype(str) if "family" in models.coords else None
    if family is None:
        return pd.DataFrame(columns=["model", "group"])
    chosen = models.values[family == FAMILY].astype(str)
    group = models["group"] if "group" in models.coords else models
    table = pd.DataFrame({"model": chosen, "group": group.sel(model=chosen).values.astype(str)})
    for name in DESIGN_COORDS:
        if name in models.coords:
            table[name] = models[name].sel(model=chosen).values
    source = coupling["prompt_source"].values.astype(str)
    masks = {"held_out": source == HELD_OUT_SOURCE, "leaderboard": source != HELD_OUT_SOURCE}
    for variable in PREDICTORS:
        for name, mask in masks.items():
            column = f"{variable}_{name}"
            if variable not in coupling or not mask.any():
                table[column] = np.nan
                continue
            da = select(coupling[variable], init="trained", **selection).sel(model=chosen)
            table[column] = da.isel(prompt=mask).mean("prompt", skipna=True).values
    for name, mask in masks.items():
        table[f"{RANK}_{name}"] = _log_effective_rank(coupling, chosen, mask)
    table["twin_difference"] = _twin_difference(coupling, chosen, masks["held_out"], selection)
    bpb = np.full(len(chosen), np.nan)
    if evaluation is not None and "bits_per_byte" in evaluation:
        bpb = select(evaluation["bits_per_byte"], init="trained").reindex(model=chosen).values
    table["neg_bpb"] = -np.asarray(bpb, dtype=float)
    table["gap"] = [generalization_gap(histories.get(m)) for m in chosen]
    return table


def _log_effective_rank(coupling: xr.Dataset, models: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per model: log of the median effective rank (``effective_rank``: participation ratio of
    each block's singular values) of the trained model over the ``mask`` prompts and every
    block; NaN without the variable or such prompts.
    """
    if "effective_rank" not in coupling or not mask.any() or not len(models):
        return np.full(len(models), np.nan)
    rank = coupling["effective_rank"].sel(model=models).isel(prompt=mask)
    if "init" in rank.dims:
        rank = rank.sel(init="trained")
    values = rank.transpose("model", ...).values.reshape(len(models), -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.nanmedian(values, axis=1))


def _twin_difference(
    coupling: xr.Dataset, models: np.ndarray, mask: np.ndarray, selection: Selection
) -> np.ndarray:
    """Trained minus random-twin ``coupling_excess`` per model (mean over the held-out prompts);
    NaN without the excess, the twins or such prompts.
    """
    if "coupling_excess" not in coupling or not mask.any():
        return np.full(len(models), np.nan)
    if "init" not in coupling.dims or "random" not in coupling["init"].values:
        return np.full(len(models), np.nan)
    da = select(coupling["coupling_excess"], **selection).sel(model=models).isel(prompt=mask)
    means = da.mean("prompt", skipna=True)
    return (means.sel(init="trained") - means.sel(init="random")).values


def generalization_gap(history: pd.DataFrame | None) -> float:
    """val_loss - train_loss at the last step that has both (NaN when train_loss is absent)."""
    if history is None or not {"val_loss", "train_loss"} <= set(history.columns):
        return np.nan
    rows = history.dropna(subset=["val_loss", "train_loss"]).sort_values("step")
    return float(rows["val_loss"].iloc[-1] - rows["train_loss"].iloc[-1]) if len(rows) else np.nan


def analyses(table: pd.DataFrame, primary: tuple[str, ...] = (), ci: float = 0.95) -> pd.DataFrame:
    """Per predictor, outcome and prompt set: the standardized slope (sd of the outcome per sd
    of the predictor) across runs (OLS, CR1 by configuration, t(G-1)) — ids
    ``fixed_size_{excess|overlap_u|coupling}_vs_{bpb|gap}[_leaderboard]`` — and the Spearman
    correlation of the configuration means (``..._config_spearman``, unit configuration,
    Bonett-Wright interval); the same slope adjusted for the design (``..._adjusted``: log data
    fraction, weight decay and log learning rate as covariates) and for the spectrum's shape
    (``..._rank_adjusted``: the runs' log effective rank on the same prompts, z-scored, as
    covariate); and
    ``fixed_size_trained_vs_random``, trained minus random-twin excess on the held-out prompts,
    a t test over configuration means.
    """
    rows = [_twin_row(table, ci)]
    for variable, short in PREDICTORS.items():
        for prompts, suffix in PROMPT_SETS.items():
            column = f"{variable}_{prompts}"
            for outcome, outcome_short in OUTCOMES.items():
                name = f"fixed_size_{short}_vs_{outcome_short}{suffix}"
                rows += _rows(table, name, column, outcome, f"{RANK}_{prompts}", ci)
    return analysis_table(rows, primary)


def _rows(
    table: pd.DataFrame, name: str, column: str, outcome: str, rank: str, ci: float
) -> list[dict]:
    """The run-level slope and the configuration-level Spearman of one predictor and outcome, and
    the slope adjusted for the design and for ``rank`` (the log effective rank column).
    """
    missing = [c for c in (column, outcome) if c not in table or table[c].isna().all()]
    method = "OLS, sd of outcome per sd of predictor, CR1 by configuration, t(G-1)"
    spearman = "Spearman of configuration means, Bonett-Wright interval"
    if table.empty or missing:
        note = (
            f"not testable: no runs of family {FAMILY} in this design"
            if table.empty
            else f"not measured: {', '.join(missing)} absent"
        )
        return [
            analysis_row(name, "run", 0, method, note=note),
            analysis_row(f"{name}_config_spearman", "configuration", 0, spearman, note=note),
            analysis_row(f"{name}_adjusted", "run", 0, method, note=note),
            analysis_row(f"{name}_rank_adjusted", "run", 0, method, note=note),
        ]
    design = [c for c in ("data_fraction", "weight_decay", "learning_rate") if c in table]
    data = table[["group", column, outcome, *design]].dropna(subset=[column, outcome])
    data = data.assign(x=_z(data[column]), y=_z(data[outcome]))
    fit = cluster_slope(data, "y", "x", "group", ci=ci)
    factors = pd.DataFrame(
        {
            "log_data_fraction": np.log10(data["data_fraction"]) if "data_fraction" in data else 0,
            "weight_decay": data["weight_decay"] if "weight_decay" in data else 0,
            "log_learning_rate": np.log10(data["learning_rate"]) if "learning_rate" in data else 0,
        },
        index=data.index,
    )
    adjusted = cluster_slope(
        data[["group", "x", "y"]].join(factors), "y", "x", "group", ci=ci, covariates=DESIGN
    )
    shape = data[["group", "x", "y"]].assign(
        rank=_z(table.loc[data.index, rank]) if rank in table else np.nan
    )
    by_rank = cluster_slope(shape, "y", "x", "group", ci=ci, covariates=("rank",))
    means = data.groupby("group")[[column, outcome]].mean()
    res = correlate(means[column], means[outcome], "spearman", ci)
    return [
        _slope_row(name, fit, method),
        analysis_row(
            f"{name}_config_spearman",
            "configuration",
            res["n"],
            spearman,
            res["r"],
            res["ci_low"],
            res["ci_high"],
            res["p"],
            res["reason"],
        ),
        _slope_row(
            f"{name}_adjusted",
            adjusted,
            method + ", adjusted for the design (log data fraction, weight decay, log lr)",
        ),
        _slope_row(
            f"{name}_rank_adjusted",
            by_rank,
            method + ", adjusted for the spectrum's shape (log effective rank)",
        ),
    ]


def _slope_row(name: str, fit: dict, method: str) -> dict:
    """The analysis row of one ``cluster_slope`` fit (unit: runs in their configurations)."""
    return analysis_row(
        name,
        f"run ({fit['n_clusters']} configurations)",
        fit["n"],
        method,
        fit["estimate"],
        fit["ci_low"],
        fit["ci_high"],
        fit["p"],
        fit["note"],
        p_wild=fit["p_wild"],
    )


def _z(values: pd.Series) -> pd.Series:
    """z-scores over runs (NaN when constant): slopes of z on z are standardized (r-like)."""
    sd = values.std(ddof=1)
    return (values - values.mean()) / sd if sd > 0 else values * np.nan


def _twin_row(table: pd.DataFrame, ci: float) -> dict:
    """``fixed_size_trained_vs_random``: t test of the configuration means of the trained minus
    twin excess (seeds of a configuration averaged first).
    """
    name, method = "fixed_size_trained_vs_random", "trained - twin excess; t over configurations"
    if table.empty:
        note = f"not testable: no runs of family {FAMILY} in this design"
        return analysis_row(name, "configuration", 0, method, note=note)
    if "twin_difference" not in table or table["twin_difference"].isna().all():
        return analysis_row(name, "configuration", 0, method, note="not measured: no twin excess")
    means = table.groupby("group")["twin_difference"].mean()
    test = run_level_test(means.to_numpy(), ci, units="configurations")
    return test_row(name, "configuration", method, test)
