"""Token-wise coupling, trained vs random-init twin (the paper: coupling across tokens emerges
with training, none at initialization).

Per model and init, a family's coupling is the mean excess (0: chance) over the distinct token
pairs (token != token_ref) of the token layers and prompts, at the statistics selection. Tests:

- ``tokens_{self|context}_trained_vs_random``: trained minus twin per run of the fixed-size
  family (context: the mean of the fixed-input and fixed-output families), seeds of a
  configuration averaged first, a t test over configurations (with ``random_init.per_run``
  each run has its own twin, an independent pair; otherwise the runs of one architecture share
  one twin, a constant whose own variation is not in the test);
- ``...:<model>``: the same difference for each pretrained model (one model: estimate only).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from blockcoupling.stats.core import select
from blockcoupling.stats.fixed_size import FAMILY
from blockcoupling.stats.inference import analysis_row, analysis_table, run_level_test, test_row
from blockcoupling.stats.selection import Selection

FAMILIES = {"self": ("self",), "context": ("fixed_in", "fixed_out")}


def token_excess(tokens: xr.Dataset, selection: Selection) -> pd.DataFrame:
    """One row per model: ``{family}_{init}`` (family of ``FAMILIES`` and init trained/random),
    the mean excess over distinct token pairs; NaN where a model has no token families.
    """
    out = pd.DataFrame(index=pd.Index(tokens["model"].values.astype(str), name="model"))
    for family, parts in FAMILIES.items():
        per_part = []
        for part in parts:
            name = f"{part}_excess"
            if name not in tokens:
                continue
            values = select(tokens[name], **selection)
            values = values.where(values["token"] != values["token_ref"])
            rest = [d for d in values.dims if d not in ("model", "init")]
            per_part.append(values.mean(rest, skipna=True))
        if not per_part:
            continue
        mean = sum(per_part) / len(per_part)
        for init in np.atleast_1d(mean["init"].values):
            out[f"{family}_{init}"] = mean.sel(init=init).values
    return out.reset_index()


def token_analyses(
    tokens: xr.Dataset | None,
    selection: Selection,
    primary: tuple[str, ...] = (),
    ci: float = 0.95,
) -> pd.DataFrame:
    """The rows of the module docstring (``inference.ANALYSIS_COLUMNS``)."""
    method = "trained - twin token-pair excess; t over configurations"
    if tokens is None or "init" not in tokens.dims or not len(tokens.data_vars):
        note = "not measured: no token families with random-init twins in this design"
        rows = [
            analysis_row(f"tokens_{f}_trained_vs_random", "configuration", 0, method, note=note)
            for f in FAMILIES
        ]
        return analysis_table(rows, primary)
    table = token_excess(tokens, selection)
    models = tokens["model"]
    family = models["family"].values.astype(str) if "family" in models.coords else None
    group = models["group"].values.astype(str) if "group" in models.coords else None
    trained_here = family == FAMILY if family is not None else np.zeros(models.size, bool)
    rows = []
    for name in FAMILIES:
        columns = {f"{name}_trained", f"{name}_random"}
        if not columns <= set(table.columns):
            rows.append(
                analysis_row(
                    f"tokens_{name}_trained_vs_random",
                    "configuration",
                    0,
                    method,
                    note="not measured: no trained and twin values",
                )
            )
            continue
        diff = table[f"{name}_trained"] - table[f"{name}_random"]
        runs = pd.DataFrame({"diff": diff, "group": group if group is not None else table.model})
        means = runs[trained_here].dropna().groupby("group")["diff"].mean()
        test = run_level_test(means.to_numpy(), ci, units="configurations")
        unit = f"configuration ({int(trained_here.sum())} runs)"
        rows.append(test_row(f"tokens_{name}_trained_vs_random", unit, method, test))
        for model, value in zip(table["model"][~trained_here], diff[~trained_here]):
            if np.isfinite(value):
                rows.append(
                    analysis_row(
                        f"tokens_{name}_trained_vs_random:{model}",
                        "model (one prompt's token pairs)",
                        1,
                        "trained - twin token-pair excess, one model",
                        value,
                        note="one model: estimate only, no interval",
                    )
                )
    return analysis_table(rows, primary)
