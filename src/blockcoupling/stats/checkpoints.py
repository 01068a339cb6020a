"""Checkpoint analyses: coupling, LSS, expodistance and validation loss per checkpoint, and
their relation over training (checkpoints of one run are repeated measures, never pooled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps

from blockcoupling.coupling import registry as measures_registry
from blockcoupling.stats.core import (
    CALIBRATED,
    METHODS,
    MIN_N_CORRELATION,
    _bootstrap_cells,
    _cell_seed,
    _log10,
    bootstrap_mean,
    correlate,
    holm,
    require_columns,
    select,
)
from blockcoupling.stats.inference import (
    analysis_row,
    analysis_table,
    cluster_slope,
    run_level_test,
    test_row,
)
from blockcoupling.stats.selection import Bootstrap, Selection

EMERGENCE_FAMILY = "emergence"
COMBINED = "runs combined (t over initializations)"  # checkpoint_correlations' designs
STEP_EFFECTS = "step fixed effects, clustered by initialization"


def run_histories(models: dict[str, str], history_files: dict[str, str]) -> pd.DataFrame:
    """The training histories of the checkpoint models in one frame (columns model, step,
    val_loss, ...): `models` maps a model to its training run, `history_files` a run to its
    history.csv.
    """
    histories = [pd.read_csv(history_files[run]).assign(model=m) for m, run in models.items()]
    if not histories:
        return pd.DataFrame(columns=["model", "step", "val_loss"])
    return pd.concat(histories, ignore_index=True)


def checkpoint_table(
    coupling_checkpoints: xr.Dataset,
    history: pd.DataFrame,
    trajectories: xr.Dataset | None = None,
    selection: Selection = Selection(),
    boot: Bootstrap = Bootstrap(),
) -> pd.DataFrame:
    """One row per (model, step): coupling and adjacent_coupling (means over prompts, with
    percentile bootstrap CIs over prompts: ``*_low``, ``*_high``; also ``coupling_excess`` and
    ``overlap_u`` when the dataset has them), val_loss, ...

    `coupling_checkpoints`: dims (model, step, ..., prompt); `history`: columns model, step,
    val_loss (+ val_accuracy); `trajectories` (optional): lss, expodistance (model, step, prompt,
    token), averaged over prompts and tokens. Adds neg_val_loss (higher = better), log10_params,
    n_layers, d_model, group (models that differ only by seed share it), init (the
    initialization the run starts from, ``init_blocks``: runs that share it are one unit of
    every test over runs), and ``effective_rank`` (median over prompts and blocks) when the
    dataset has it.
    """
    require_columns(history, ["model", "step", "val_loss"])
    n_boot, seed, ci = boot.n_boot, boot.seed, boot.ci
    variables = ["coupling", "adjacent_coupling"]
    variables += [v for v in CALIBRATED if v in coupling_checkpoints]
    parts = [
        _bootstrap_cells(
            select(coupling_checkpoints[v], **selection), n_boot, seed, ci, v, f"n_prompts_{v}", v
        )
        for v in variables
    ]
    ds = xr.merge(parts, compat="override").drop_vars(
        [f"n_prompts_{v}" for v in variables[1:]], errors="ignore"
    )
    ds = ds.rename({"n_prompts_coupling": "n_prompts"})
    if trajectories is not None:
        ds = ds.assign(
            {
                v: trajectories[v].mean(["prompt", "token"], skipna=True)
                for v in ("lss", "expodistance")
            }
        )
    if "effective_rank" in coupling_checkpoints:
        rank = coupling_checkpoints["effective_rank"]
        rest = [d for d in rank.dims if d not in ("model", "step")]
        ds = ds.assign(effective_rank=rank.median(rest, skipna=True))
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
    inits = init_blocks(select(coupling_checkpoints["coupling"], **selection))
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
                "init": [inits.get(str(m), str(m)) for m in meta.values],
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
    """Per-run correlations (columns r, n: checkpoints, init: the run's initialization)
    combined with the initialization as the unit (runs that share one are not independent:
    their r are averaged first; checkpoints of a run are one time series, never units): r (mean
    over initializations), ci_low, ci_high, p (one-sample t(I-1) over initializations; none from
    fewer than ``inference.MIN_CLUSTERS``), p_wild (the wild cluster bootstrap beside it), n
    (initializations), n_runs, n_checkpoints, unit, reason (method, sign test).
    """
    require_columns(rows, ["r", "n", "init"])
    usable = rows[np.isfinite(rows["r"]) & (rows["n"] >= MIN_N_CORRELATION)]
    by_init = usable.groupby("init", sort=True)["r"].mean()
    test = run_level_test(by_init.to_numpy(), ci, units="initializations")
    runs = len(usable)
    return dict(
        r=test["estimate"],
        ci_low=test["ci_low"],
        ci_high=test["ci_high"],
        p=test["p"],
        p_wild=test["p_wild"],
        n=len(by_init),
        n_runs=runs,
        n_checkpoints=int(usable["n"].sum()),
        unit=f"initialization ({runs} run{'s' if runs != 1 else ''})",
        reason=test["note"],
    )


def descriptive(result: dict) -> dict:
    """A ``correlate`` result over one run's checkpoints as a description: its r and n, no
    interval or p (the checkpoints of a run are one time series, not independent draws).
    """
    reason = result["reason"] or "descriptive: one run's checkpoints, no interval or p"
    return result | dict(ci_low=np.nan, ci_high=np.nan, p=np.nan, ci_method="", reason=reason)


# every summary a figure draws (the registry's shown measures) and the adjacent coupling
CHECKPOINT_PREDICTORS = tuple(
    dict.fromkeys([*(m.summary for m in measures_registry.shown()), "adjacent_coupling"])
)


def checkpoint_correlations(
    table: pd.DataFrame,
    target: str = "neg_val_loss",
    predictors: Sequence[str] | None = None,
    methods: Sequence[str] = METHODS,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Coupling vs ``target`` over training; checkpoints of one run are repeated measures, and
    runs that share an initialization (``table``'s ``init``) one unit.

    They are never pooled as independent samples:

    - ``design="within run"``: each model's own correlation over its checkpoints (``subset`` =
      the model; descriptive, its checkpoints form one time series: r alone, no interval or p,
      which would take them as independent draws);
    - ``design="runs combined (t over initializations)"``: those correlations, averaged within
      an initialization, by a one-sample t test over initializations (``combined_correlation``);
    - ``design="step fixed effects, clustered by initialization"``: OLS slope of target per sd
      of the predictor with one intercept per step (the common training trend removed), CR1
      standard errors by initialization and t(I-1), the wild cluster bootstrap beside it
      (``coef``; ``r`` is NaN).

    ``predictors``: by default every one of ``CHECKPOINT_PREDICTORS`` (the measures a figure
    draws, and the adjacent coupling) the table holds with a finite value.
    ``n``: the rows' units (checkpoints of one run; initializations), named in ``unit``;
    ``p_holm``: Holm-adjusted over every test of the table (``note`` says so).
    """
    if predictors is None:
        predictors = [
            name
            for name in CHECKPOINT_PREDICTORS
            if name in table.columns and np.isfinite(table[name].to_numpy(dtype=float)).any()
        ]
    require_columns(table, ["model", "init", target, *predictors])
    rows = []
    for name, part in table.groupby("model", sort=True):
        for pred in predictors:
            for method in methods:
                rows.append(
                    dict(subset=str(name), design="within run", target=target, predictor=pred)
                    | {"method": method, "unit": "checkpoint (one run, descriptive)"}
                    | descriptive(correlate(part[pred], part[target], method, ci))
                )
    within = pd.DataFrame(rows)
    within["init"] = within["subset"].map(table.groupby("model")["init"].first())
    for pred in predictors:
        for method in methods:
            runs = within[(within["predictor"] == pred) & (within["method"] == method)]
            rows.append(
                dict(subset="all runs", design=COMBINED, target=target)
                | dict(predictor=pred, method=method, ci_method="t over initializations' mean r")
                | combined_correlation(runs, ci)
            )
        data = table.assign(x=_z(table[pred]))
        fit = cluster_slope(data, target, "x", "init", fixed=("step",), ci=ci)
        rows.append(
            dict(subset="all runs", design=STEP_EFFECTS, target=target)
            | dict(predictor=pred, method="ols", ci_method="CR1 by initialization, t(I-1)")
            | dict(coef=fit["estimate"], ci_low=fit["ci_low"], ci_high=fit["ci_high"])
            | dict(p=fit["p"], p_wild=fit["p_wild"], n=fit["n_clusters"])
            | dict(n_checkpoints=fit["n"], unit="initialization")
            | dict(reason=f"{fit['n']} checkpoints; {fit['note']}")
        )
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p"])
    out["note"] = f"p_holm: Holm over the {int(np.isfinite(out['p']).sum())} tests of this table"
    return out


def emergence_summary(table: pd.DataFrame, column: str = "coupling") -> pd.DataFrame:
    """The shape of ``column`` over training per model, descriptive only: value at the first
    step, the peak (step and value of the argmax), the last value, ``rise`` = peak - first and
    ``decline`` = peak - last; one row per model, with its group (seeds share a group). The
    argmax is biased towards a peak, so no test is made here: ``emergence_analyses`` chooses
    the peak on one half of the prompts and tests it on the other.
    """
    require_columns(table, ["model", "step", column])
    rows = []
    for model, part in table.dropna(subset=[column]).groupby("model", sort=True):
        part = part.sort_values("step")
        peak = part.loc[part[column].idxmax()]
        first, last = part.iloc[0], part.iloc[-1]
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
                rise=float(peak[column] - first[column]),
                decline=float(peak[column] - last[column]),
            )
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- emergence design


def emergence_analyses(
    coupling_checkpoints: xr.Dataset,
    table: pd.DataFrame,
    selection: Selection,
    variable: str = "coupling_excess",
    boot: Bootstrap = Bootstrap(),
    primary: Sequence[str] = (),
    peak_step: int | None = None,
) -> pd.DataFrame:
    """Emergence over training, runs as units (checkpoints of a run are one time series).

    Runs that share an initialization (``init_blocks``) are one unit: their values are
    averaged, or their checkpoints clustered, together.

    - ``emergence_trend``: each run's Spearman rho of ``variable`` (mean over prompts) vs log
      step, combined by a one-sample t test over initializations (t(I-1)) and an exact sign
      test (note);
    - ``emergence_loss_slope``: minus val_loss per sd of ``variable`` with step fixed effects
      (the common training trend removed), CR1 by initialization, t(I-1);
    - ``emergence_peak_vs_init`` / ``_vs_final``: per run, the peak step chosen on a random half
      of the prompts, the differences peak - first and peak - last measured on the other half;
      combined by a t test over initializations; per run (``...:<model>``) a paired percentile
      bootstrap over the held-out half's prompts (exploratory);
    - the paper's claims, one paired test each over initializations (``paired_claims``):
      ``emergence_final_vs_init``, ``emergence_relaxation`` (final - the declared
      ``peak_step``) and ``emergence_locality`` (adjacent minus all pairs, final - first step).
    Runs: the models of family ``emergence`` (every suite when none is of that family). Ids get the
    suffix ``_coupling`` when ``variable`` is the raw coupling.
    """
    n_boot, seed, ci = boot.n_boot, boot.seed, boot.ci
    suffix = "" if variable == "coupling_excess" else f"_{variable}"
    names = [f"emergence_{n}{suffix}" for n in ("trend", "loss_slope")]
    names += [f"emergence_peak_vs_{n}{suffix}" for n in ("init", "final")]
    if variable not in coupling_checkpoints or variable not in table:
        note = f"not measured: {variable} absent"
        return analysis_table([analysis_row(n, "run", 0, "", note=note) for n in names], primary)
    meta = coupling_checkpoints["model"]
    models = meta.values.astype(str)
    if "family" in meta.coords and (meta["family"].values.astype(str) == EMERGENCE_FAMILY).any():
        models = models[meta["family"].values.astype(str) == EMERGENCE_FAMILY]
    values = select(coupling_checkpoints[variable], **selection)
    blocks = init_blocks(values.sel(model=list(models)))
    part = table[table["model"].isin(models)].dropna(subset=[variable])
    rhos = {
        str(model): correlate(np.log1p(rows["step"]), rows[variable], "spearman", ci)["r"]
        for model, rows in part.groupby("model", sort=True)
    }
    trend = run_level_test(init_means(rhos, blocks), ci, units="initializations")
    rows = [
        analysis_row(
            names[0],
            _init_unit(rhos, blocks),
            trend["n"],
            "Spearman rho vs log step per run, runs sharing an init averaged; one-sample t "
            "over initializations",
            trend["estimate"],
            trend["ci_low"],
            trend["ci_high"],
            trend["p"],
            trend["note"],
            p_wild=trend["p_wild"],
        )
    ]
    data = part.assign(x=_z(part[variable]), init=part["model"].map(blocks))
    fit = cluster_slope(data, "neg_val_loss", "x", "init", fixed=("step",), ci=ci)
    rows.append(
        analysis_row(
            names[1],
            "initialization",
            fit["n_clusters"],
            "OLS per sd, step fixed effects, CR1 by initialization, t(I-1)",
            fit["estimate"],
            fit["ci_low"],
            fit["ci_high"],
            fit["p"],
            f"{fit['n']} checkpoints; {fit['note']}",
            p_wild=fit["p_wild"],
        )
    )
    per_run = [_split_half_peak(values.sel(model=m), n_boot, seed, m, ci) for m in models]
    for key, name in zip(("init", "final"), names[2:]):
        differences = {str(m): r[key][0] for m, r in zip(models, per_run)}
        test = run_level_test(init_means(differences, blocks), ci, units="initializations")
        method = (
            "peak chosen on half the prompts, tested on the other; runs sharing an init "
            "averaged; t over initializations"
        )
        unit = _init_unit(differences, blocks)
        rows.append(test_row(name, unit, method, test))
        for model, res in zip(models, per_run):
            estimate, low, high, n = res[key]
            rows.append(
                analysis_row(
                    f"{name}:{model}",
                    "prompt (held-out half)",
                    n,
                    "paired percentile bootstrap over prompts",
                    estimate,
                    low,
                    high,
                    note=f"peak step {res['peak_step']} chosen on the other half",
                )
            )
    rows += paired_claims(coupling_checkpoints, models, selection, variable, peak_step, ci, part)
    return analysis_table(rows, primary)


def init_blocks(values: xr.DataArray) -> dict[str, str]:
    """Model -> the initialization it starts from, for ``values (model, step, prompt)``: runs
    whose first-step values are identical on every prompt share one init (e.g. two learning
    rates at one seed); each block is named after its first model.
    """
    blocks: dict[bytes, str] = {}
    out = {}
    for model in values["model"].values.astype(str):
        run = values.sel(model=model).dropna("step", how="all")
        if run.sizes["step"] == 0:
            continue
        key = np.round(run.isel(step=0).values.astype(float), 12).tobytes()
        out[model] = blocks.setdefault(key, model)
    return out


def init_means(per_run: Mapping[str, float], blocks: Mapping[str, str]) -> np.ndarray:
    """The finite run-level values of ``per_run`` (model -> value) averaged within each
    initialization of ``blocks`` (model -> init, ``init_blocks``): one value per init.
    """
    finite = {m: v for m, v in per_run.items() if np.isfinite(v) and m in blocks}
    frame = pd.DataFrame({"value": finite, "init": {m: blocks[m] for m in finite}})
    return frame.groupby("init")["value"].mean().to_numpy() if len(frame) else np.array([])


def _init_unit(per_run: Mapping[str, float], blocks: Mapping[str, str]) -> str:
    """'initialization (R runs)': the unit of a test over ``init_means``."""
    runs = sum(1 for m, v in per_run.items() if np.isfinite(v) and m in blocks)
    return f"initialization ({runs} run{'s' if runs != 1 else ''})"


def paired_claims(
    coupling_checkpoints: xr.Dataset,
    models: Sequence[str],
    selection: Selection,
    variable: str = "coupling_excess",
    peak_step: int | None = None,
    ci: float = 0.95,
    table: pd.DataFrame | None = None,
) -> list[dict]:
    """The paper's emergence claims, one test each over initializations.

    Each is a paired difference per run (means over prompts), runs that share an
    initialization (``init_blocks``) averaged first, then a one-sample t over initializations
    (t(I-1)) and an exact sign test:

    - ``emergence_final_vs_init``: last step - first step;
    - ``emergence_relaxation``: last step - ``peak_step`` (declared before the run, config
      ``stats.peak_step``; the paper: coupling "increases persistently", so >= 0);
    - ``emergence_locality``: (adjacent - all-pairs excess) at the last step minus the same at
      the first step (the paper: coupling becomes more pronounced between adjacent layers);
    - ``emergence_within_loss`` (with ``table``, ``checkpoint_table``'s rows): per run, the
      Fisher z of the Spearman rho over its checkpoints after step 0 between ``variable`` and
      minus validation loss (``within_loss_z``): does coupling grow with performance within a
      run? Runs whose validation loss turns up (a small data fraction trained long) let it
      show either sign; a measure that only tracks training time falls there.
    Locality is defined on the excess only (raw m_K has no adjacent chance level); ids get
    ``_{variable}`` unless ``variable`` is ``coupling_excess``.
    """
    suffix = "" if variable == "coupling_excess" else f"_{variable}"
    values = select(coupling_checkpoints[variable], **selection).sel(model=list(models))
    means = values.mean("prompt", skipna=True)
    blocks = init_blocks(values)
    method = "paired difference per run, runs sharing an init averaged; t over inits"

    def row(name: str, per_run: dict[str, float], what: str) -> dict:
        test = run_level_test(init_means(per_run, blocks), ci, units="initializations")
        note = f"{what}; {test['note']}"
        return test_row(f"{name}{suffix}", _init_unit(per_run, blocks), method, test, note)

    def at(data: xr.DataArray, model: str, where: str | int) -> float:
        run = data.sel(model=model).dropna("step")
        if run.sizes["step"] == 0:
            return np.nan
        if where in ("first", "last"):
            return float(run.isel(step=0 if where == "first" else -1))
        return float(run.sel(step=where)) if where in run["step"].values else np.nan

    rows = [
        row(
            "emergence_final_vs_init",
            {m: at(means, m, "last") - at(means, m, "first") for m in models},
            "last - first step",
        )
    ]
    if peak_step is None:
        rows.append(
            analysis_row(
                f"emergence_relaxation{suffix}",
                "initialization",
                0,
                method,
                note="not declared: set stats.peak_step before the run",
            )
        )
    else:
        rows.append(
            row(
                "emergence_relaxation",
                {m: at(means, m, "last") - at(means, m, peak_step) for m in models},
                f"last step - declared peak step {peak_step}",
            )
        )
    if variable == "coupling_excess" and "adjacent_excess" in coupling_checkpoints:
        adjacent = select(coupling_checkpoints["adjacent_excess"], **selection)
        local = adjacent.sel(model=list(models)).mean("prompt", skipna=True) - means
        rows.append(
            row(
                "emergence_locality",
                {m: at(local, m, "last") - at(local, m, "first") for m in models},
                "(adjacent - all pairs) at the last step minus at the first",
            )
        )
    if table is not None and {"model", "step", variable, "neg_val_loss"} <= set(table):
        rows.append(
            row(
                "emergence_within_loss",
                {m: within_loss_z(table[table["model"] == m], variable) for m in models},
                "per run: Fisher z of Spearman rho (checkpoints after step 0) of the measure "
                "with minus validation loss",
            )
        )
    return rows


WITHIN_MIN_STEPS = 4  # checkpoints after step 0 a run needs for a within-run rho
RHO_CLIP = 0.999  # |rho| = 1 has an infinite Fisher z: clipped (z = 3.8)


def within_loss_z(rows: pd.DataFrame, variable: str = "coupling_excess") -> float:
    """One run's within-run association: the Fisher z (arctanh) of the Spearman rho between
    ``variable`` and ``neg_val_loss`` over its checkpoints after step 0 (step 0 is the init,
    where every run has both its lowest coupling and its worst loss: it would add the same
    concordant point to every run). NaN below ``WITHIN_MIN_STEPS`` checkpoints or when either
    is constant.
    """
    rows = rows[rows["step"] > 0].dropna(subset=[variable, "neg_val_loss"])
    if len(rows) < WITHIN_MIN_STEPS:
        return np.nan
    if rows[variable].nunique() < 2 or rows["neg_val_loss"].nunique() < 2:
        return np.nan
    rho = sps.spearmanr(rows[variable], rows["neg_val_loss"]).statistic
    return float(np.arctanh(np.clip(rho, -RHO_CLIP, RHO_CLIP)))


def _z(values: pd.Series) -> pd.Series:
    """z-scores (NaN when constant)."""
    sd = values.std(ddof=1)
    return (values - values.mean()) / sd if sd > 0 else values * np.nan


def _split_half_peak(values: xr.DataArray, n_boot: int, seed: int, model: str, ci: float) -> dict:
    """``values (step, prompt)`` of one run: prompts split at random (seeded by the model) into
    halves A and B; the peak = argmax over steps of A's means; on B, peak - first step and
    peak - last step with a paired percentile bootstrap over B's prompts:
    {"init": (estimate, low, high, n), "final": (...), "peak_step": int}; NaN (n 0, peak -1)
    for fewer than 2 steps or 4 prompts.
    """
    values = values.dropna("step", how="all").transpose("step", "prompt")
    steps = values["step"].values
    data = values.values
    if len(steps) < 2 or data.shape[1] < 4:
        empty = (np.nan, np.nan, np.nan, 0)
        return {"init": empty, "final": empty, "peak_step": -1}
    rng = _cell_seed(seed, "emergence_split", model)
    order = rng.permutation(data.shape[1])
    half_a, half_b = order[: data.shape[1] // 2], order[data.shape[1] // 2 :]
    peak = int(np.nanargmax(np.nanmean(data[:, half_a], axis=1)))
    out = {"peak_step": int(steps[peak])}
    for key, other in (("init", 0), ("final", len(steps) - 1)):
        diff = data[peak, half_b] - data[other, half_b]
        out[key] = bootstrap_mean(diff, n_boot, ci, rng)
    return out
