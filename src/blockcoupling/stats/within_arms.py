"""Within-run tests that separate coupling from training time: two arms of checkpoint suites
that differ in generalization at the same steps (the full text and a small data fraction,
whose validation loss turns up), and the trajectory measures' emergence.

- ``emergence_within_arms``: per suite, the change of the excess over the declared window
  (config ``stats.within_window``: [start, end] steps, from a pilot); the estimate is the
  full-text arm's mean change minus the small-data arm's (OLS on an arm indicator, each suite
  its own cluster: CR1, t(G-1), and the wild cluster bootstrap). A measure that follows
  training time alone changes alike in both arms: its null is the claim's.
- ``emergence_within_arms_val_loss``: the same for minus validation loss, the design's check
  that the arms differ in generalization over the window (the claims table requires its
  interval above 0 for "reproduced"); the first row's note gives the ratio of the two.
- ``emergence_lss_final_vs_init``, ``emergence_expodistance_final_vs_init``: per suite the
  line-shape score and expodistance (mean over prompts and tokens) at the last step minus at
  the first, suites sharing an init averaged, t over inits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr

from blockcoupling.stats.inference import (
    analysis_row,
    analysis_table,
    cluster_slope,
    run_level_test,
    test_row,
)

FAMILY = "emergence"
NAMES = ("emergence_within_arms", "emergence_within_arms_val_loss")
TRAJECTORY = ("lss", "expodistance")


def suites(coupling_checkpoints: xr.Dataset) -> pd.DataFrame:
    """The checkpoint suites (family ``emergence``; every model when none is) with their data
    fraction (NaN when the dataset has none): columns model, data_fraction.
    """
    meta = coupling_checkpoints["model"]
    models = meta.values.astype(str)
    fraction = (
        meta["data_fraction"].values.astype(float)
        if "data_fraction" in meta.coords
        else np.full(models.size, np.nan)
    )
    frame = pd.DataFrame({"model": models, "data_fraction": fraction})
    if "family" in meta.coords:
        family = meta["family"].values.astype(str)
        if (family == FAMILY).any():
            frame = frame[family == FAMILY]
    return frame.reset_index(drop=True)


def window_changes(
    table: pd.DataFrame, runs: pd.DataFrame, window: Sequence[int], variable: str
) -> pd.DataFrame:
    """Per suite: ``arm`` (1 at the largest data fraction, 0 below it), and ``change`` of
    ``variable`` and ``check`` of ``neg_val_loss``, each at the window's end minus its start
    (``checkpoint_table`` rows); suites missing either step are left out.
    """
    start, end = (int(s) for s in window)
    rows = table[table["model"].isin(runs["model"]) & table["step"].isin([start, end])]
    wide = rows.pivot_table(index="model", columns="step", values=[variable, "neg_val_loss"])
    fraction = runs.set_index("model")["data_fraction"]
    out = pd.DataFrame(index=wide.index)
    if (variable, start) in wide and (variable, end) in wide:
        out["change"] = wide[(variable, end)] - wide[(variable, start)]
        out["check"] = wide[("neg_val_loss", end)] - wide[("neg_val_loss", start)]
    else:
        out["change"] = out["check"] = np.nan
    out["arm"] = (fraction.reindex(out.index) == fraction.max()).astype(float)
    return out.dropna().rename_axis("model").reset_index()


def within_arms(
    coupling_checkpoints: xr.Dataset,
    table: pd.DataFrame,
    window: Sequence[int] | None,
    variable: str = "coupling_excess",
    primary: Sequence[str] = (),
    ci: float = 0.95,
) -> pd.DataFrame:
    """The two rows of the arms design (module docstring); NaN rows with the reason when the
    window is not declared or the suites do not form two arms of at least 2 suites each.
    """
    method = "arm difference of the change over the window: OLS on the arm, CR1 by suite, t(G-1)"
    if window is None:
        note = "not declared: set stats.within_window before the run"
        return analysis_table(
            [analysis_row(n, "suite", 0, method, note=note) for n in NAMES], primary
        )
    runs = suites(coupling_checkpoints)
    changes = window_changes(table, runs, window, variable)
    counts = changes["arm"].value_counts()
    span = f"steps {int(window[0])} -> {int(window[1])}"
    if len(counts) < 2 or counts.min() < 2:
        note = f"{span}: needs two data fractions with at least 2 suites each, has {dict(counts)}"
        return analysis_table(
            [analysis_row(n, "suite", 0, method, note=note) for n in NAMES], primary
        )
    unit = f"suite ({int(counts.get(1.0, 0))} full, {int(counts.get(0.0, 0))} small data)"
    fits = {
        name: cluster_slope(changes, column, "arm", "model", ci=ci)
        for name, column in zip(NAMES, ("change", "check"))
    }
    ratio = fits[NAMES[0]]["estimate"] / fits[NAMES[1]]["estimate"]
    notes = {
        NAMES[0]: f"{span}; {ratio:.3g} per unit of the arms' difference in the change of "
        f"minus validation loss; {fits[NAMES[0]]['note']}",
        NAMES[1]: f"{span}; the design's check: the arms differ in generalization; "
        f"{fits[NAMES[1]]['note']}",
    }
    rows = [
        analysis_row(
            name,
            unit,
            fit["n_clusters"],
            method,
            fit["estimate"],
            fit["ci_low"],
            fit["ci_high"],
            fit["p"],
            notes[name],
            p_wild=fit["p_wild"],
        )
        for name, fit in fits.items()
    ]
    return analysis_table(rows, primary)


def trajectory_emergence(
    table: pd.DataFrame,
    blocks: Mapping[str, str],
    primary: Sequence[str] = (),
    ci: float = 0.95,
) -> pd.DataFrame:
    """``emergence_{lss,expodistance}_final_vs_init``: per suite (``blocks``: model -> its
    init, ``checkpoints.init_blocks``) the measure at its last step minus at its first, suites
    sharing an init averaged, one-sample t over inits and an exact sign test.
    """
    method = "paired difference per run, runs sharing an init averaged; t over inits"
    rows = []
    for measure in TRAJECTORY:
        name = f"emergence_{measure}_final_vs_init"
        if measure not in table:
            rows.append(analysis_row(name, "initialization", 0, method, note="not measured"))
            continue
        per_run = {}
        for model, part in table[table["model"].isin(list(blocks))].groupby("model"):
            part = part.dropna(subset=[measure]).sort_values("step")
            if len(part) >= 2:
                per_run[model] = float(part[measure].iloc[-1] - part[measure].iloc[0])
        inits = pd.Series({m: blocks[m] for m in per_run}, dtype=object)
        by_init = pd.Series(per_run, dtype=float).groupby(inits).mean()
        test = run_level_test(by_init.to_numpy(), ci, units="initializations")
        note = f"last - first step; {test['note']}"
        unit = f"initialization ({len(per_run)} runs)"
        rows.append(test_row(name, unit, method, test, note))
    return analysis_table(rows, primary)
