"""The independent units each primary test gets from a config's design, and a warning where a
primary cannot be tested: fewer units than its test needs (``units_needed``) give a row with no
interval, p or verdict, after the whole run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blockcoupling.pipeline.grids import expand_grids
from blockcoupling.pipeline.plan import Plan

# what each primary's units are, as the warnings name them
RUNS = "fixed-size runs trained here (train family fixed_size)"
SUITES = "initializations of the checkpoint suites (train family emergence, else hub step suites)"
TRAINED_SUITES = "initializations of the checkpoint suites trained here (train family emergence)"
ARMS = "initializations of the smaller arm's suites (train family emergence)"
VITS = "ViTs (vit.grid), each one OLS row"
UNIT_NAMES = {
    "fixed_size_excess_vs_bpb": RUNS,
    "tokens_self_trained_vs_random": RUNS,
    "fixed_size_trained_vs_random": RUNS,
    "emergence_within_loss": TRAINED_SUITES,
    "emergence_final_vs_init": SUITES,
    "emergence_relaxation": SUITES,
    "emergence_within_arms": ARMS,
    "vit_sd_effect": VITS,
    "vit_accuracy_within_rate": VITS,
}


def design_units(config: dict[str, Any]) -> dict[str, int]:
    """``expanded_units`` of a config as written (its grids not yet expanded)."""
    return expanded_units(expand_grids(config))


def expanded_units(config: dict[str, Any]) -> dict[str, int]:
    """The independent units of each primary in a design (``config`` with its grids expanded,
    ``grids.expand_grids``), as its analysis takes them:
    its fixed-size runs (family ``fixed_size``, one seed each) for the across-runs and token-wise
    tests; for the emergence tests the initializations of the checkpoint suites the analyses read
    (``stats.checkpoints``: the family ``emergence`` suites, their seeds, or where none is of that
    family the hub models measured at several ``steps``, one per repository), of trained suites
    only for the within-loss test (hub suites have no validation loss); for the arms test the
    seeds of its smaller arm (the largest data fraction against the others); and its ViTs
    (``vit.grid``, each one OLS row) for the ViT sweep's tests.
    """
    models = config.get("models") or {}
    meta = {name: spec.get("meta") or {} for name, spec in models.items()}
    runs = sum(m.get("family") == "fixed_size" and n.endswith("-final") for n, m in meta.items())
    suites = {
        n: m for n, m in meta.items() if m.get("family") == "emergence" and not n.endswith("-final")
    }
    trained = {n if m.get("seed") is None else m["seed"] for n, m in suites.items()}  # inits
    hub = {
        (spec.get("source") or {}).get("hub")
        for name, spec in models.items()
        if meta[name].get("family") != "emergence"
        and "hub" in (spec.get("source") or {})
        and len(spec.get("steps") or []) > 1
    }
    fractions = [m.get("data_fraction") for m in suites.values()]
    top = max(fractions) if fractions else None
    arms = [
        {m.get("seed") for m in suites.values() if (m.get("data_fraction") == top) == full}
        for full in (True, False)
    ]
    vit = config.get("vit") or {}
    grid = vit.get("grid") or {}
    vits = int(
        np.prod([len(grid.get(a) or []) for a in ("drop_path_rate", "weight_decay", "seeds")])
    )
    vits = vits if vit.get("enabled") else 0
    emergence = len(trained) if trained else len(hub)
    return {
        "fixed_size_excess_vs_bpb": runs,
        "tokens_self_trained_vs_random": runs,
        "fixed_size_trained_vs_random": runs,
        "emergence_within_loss": len(trained),
        "emergence_final_vs_init": emergence,
        "emergence_relaxation": emergence,
        "emergence_within_arms": min(len(a) for a in arms) if fractions else 0,
        "vit_sd_effect": vits,
        "vit_accuracy_within_rate": vits,
    }


def units_needed(plan: Plan) -> dict[str, int]:
    """The fewest units each counted primary's test gives an interval and p from: ``MIN_CLUSTERS``
    for a test over units; for a ViT OLS row (``stats.vit._ols_row``) its parameters plus two
    (the slope, an intercept and one per extra level of its blocks: seed and weight decay for
    the rate's effect, those and the rate for accuracy within a rate).
    """
    from blockcoupling.stats.inference import MIN_CLUSTERS  # statsmodels: only when asked

    needed = dict.fromkeys(plan.primary_units, MIN_CLUSTERS)
    if plan.vit is not None:
        levels = [len(plan.vit.seeds), len(plan.vit.weight_decay), len(plan.vit.drop_path_rate)]
        extra = [n - 1 for n in levels]
        for name, blocks in (("vit_sd_effect", extra[:2]), ("vit_accuracy_within_rate", extra)):
            if name in needed:
                needed[name] = 2 + sum(blocks) + 2
    return needed


def primary_unit_warnings(plan: Plan) -> list[str]:
    """One line per declared primary (``stats.primary``) whose design gives it fewer units than
    its test needs (``units_needed``; ``Plan.primary_units``): its row will have no interval, p
    or verdict; and one per declared primary whose units are not counted before the run.
    """
    needed = units_needed(plan)
    lines = [
        f"stats.primary.{name}: this design gives it {n} unit(s) ({UNIT_NAMES[name]}), fewer "
        f"than the {needed[name]} its test needs, so its row will have no interval, p or "
        "verdict: add units or move it out of stats.primary"
        for name, n in plan.primary_units.items()
        if n < needed[name]
    ]
    lines += [
        f"stats.primary.{name}: its units are not counted before the run (no unit rule for this "
        "test in pipeline/design_units.py); check its n in the analysis table"
        for name in plan.primary
        if name not in plan.primary_units
    ]
    return lines
