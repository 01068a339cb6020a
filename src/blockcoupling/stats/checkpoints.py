"""Checkpoint analyses: coupling, LSS, expodistance and validation loss per checkpoint, and
their relation over training (checkpoints of one run are repeated measures, never pooled).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps

from blockcoupling.stats.core import (
    METHODS,
    MIN_N_CORRELATION,
    _bootstrap_cells,
    _log10,
    correlate,
    holm,
    mixed_slope,
    require_columns,
    select,
)


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
