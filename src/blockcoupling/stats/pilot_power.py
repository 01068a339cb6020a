"""Power of the declared primary tests from pilot runs (``blockcoupling pilot``): per-unit
pilot values of each primary and their power under the verdict's rule at the design's n.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.stats import power as pw
from blockcoupling.stats.checkpoints import within_loss_z


def design_units(config: dict[str, Any]) -> dict[str, int]:
    """The independent units of each primary in a config's design: its fixed-size runs (family
    ``fixed_size``, one seed each) for the across-runs and token-wise tests, its checkpoint
    suites (family ``emergence``) for the within-run and emergence tests.
    """
    from blockcoupling.pipeline.grids import expand_grids

    models = expand_grids(config).get("models", {})
    family = {name: (spec.get("meta") or {}).get("family") for name, spec in models.items()}
    runs = sum(f == "fixed_size" and n.endswith("-final") for n, f in family.items())
    suites = sum(f == "emergence" and not n.endswith("-final") for n, f in family.items())
    return {
        "fixed_size_excess_vs_bpb": runs,
        "tokens_self_trained_vs_random": runs,
        "emergence_within_loss": suites,
        "emergence_final_vs_init": suites,
    }


def design_steps(config: dict[str, Any]) -> list[int]:
    """The checkpoint steps of the config's emergence suites."""
    return list(config["train"]["grids"]["emergence"]["base"]["checkpoint_steps"])


def pilot_units(
    within: pd.DataFrame, across: pd.DataFrame, k: int, steps: list[int]
) -> dict[str, Any]:
    """Per-unit pilot values of each primary: within-run Fisher z and last - first excess per
    suite (at the design's checkpoint steps), trained - twin token self excess per run, and the
    across-runs (excess, -val_loss) pairs.
    """
    col = f"excess_k{k}"
    suites = within[within["step"].isin(steps)].assign(neg_val_loss=lambda f: -f["val_loss"])
    z, growth = [], []
    for _, rows in suites.groupby("run"):
        rows = rows.sort_values("step")
        z.append(within_loss_z(rows.rename(columns={col: "coupling_excess"})))
        growth.append(float(rows[col].iloc[-1] - rows[col].iloc[0]))
    return {
        "emergence_within_loss": np.array(z),
        "emergence_final_vs_init": np.array(growth),
        "tokens_self_trained_vs_random": (
            across[f"tok_self_k{k}"] - across[f"twin_tok_self_k{k}"]
        ).to_numpy(),
        "fixed_size_excess_vs_bpb": (across[col].to_numpy(), -across["val_loss"].to_numpy()),
    }


def power_table(
    units: dict[str, Any],
    primary: dict[str, Any],
    design_n: dict[str, int],
    seed: int = 0,
    n_sim: int | None = None,
) -> pd.DataFrame:
    """``stats.power.POWER_COLUMNS`` rows: each declared primary's power under the verdict's
    rule at the design's n and Holm's first threshold, with the n that reaches 80%.
    """
    alpha = pw.holm_first_alpha(len(primary))
    sims = n_sim or pw.DECISION_SIM
    rows = []
    for analysis, declared in primary.items():
        effect, n = float(declared["effect"]), int(design_n[analysis])
        values = units.get(analysis)
        if values is None:
            rows.append(dict(analysis=analysis, effect=effect, n=n, alpha=alpha))
            continue
        if isinstance(values, tuple):
            x, y = values

            def at(m, x=x, y=y, effect=effect):
                return pw.slope_decision_power(x, y, effect, m, alpha, sims, seed)

            keep = np.isfinite(x) & np.isfinite(y)
            estimate = float(np.corrcoef(x[keep], y[keep])[0, 1])
            n0 = int(keep.sum())
            se = np.sqrt((1 - estimate**2) / max(n0 - 2, 1))
        else:

            def at(m, v=values, effect=effect):
                return pw.decision_power(v, effect, m, alpha, sims, seed)

            finite = values[np.isfinite(values)]
            n0, estimate = finite.size, float(finite.mean())
            se = float(finite.std(ddof=1) / np.sqrt(n0))
        power = at(n)
        need = n if power >= pw.TARGET else pw.n_for_power(at, n + 1, 4 * n)
        rows.append(
            dict(
                analysis=analysis,
                effect=effect,
                pilot_estimate=estimate,
                pilot_se=se,
                pilot_n=n0,
                pilot_df=n0 - 1,
                n=n,
                df=n - 1,
                alpha=alpha,
                power=power,
                n_for_target=need,
            )
        )
    return pd.DataFrame(rows, columns=list(pw.POWER_COLUMNS))
