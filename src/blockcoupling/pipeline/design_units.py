"""The independent units each primary test gets from a config's design, and a warning where a
primary cannot be tested: fewer units than a test needs (``stats.inference.MIN_CLUSTERS``) give a
row with no interval, p or verdict, after the whole run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blockcoupling.pipeline.grids import expand_grids
from blockcoupling.pipeline.plan import Plan

# what each primary's units are, as the warnings name them
UNIT_NAMES = {
    "fixed_size_excess_vs_bpb": "fixed-size runs trained here (train family fixed_size)",
    "tokens_self_trained_vs_random": "fixed-size runs trained here (train family fixed_size)",
    "fixed_size_trained_vs_random": "fixed-size runs trained here (train family fixed_size)",
    "emergence_within_loss": "checkpoint suites (train family emergence, hub steps)",
    "emergence_final_vs_init": "checkpoint suites (train family emergence, hub steps)",
    "emergence_relaxation": "checkpoint suites (train family emergence, hub steps)",
    "emergence_within_arms": "suites of the smaller arm (train family emergence)",
    "vit_sd_effect": "ViTs (vit.grid)",
    "vit_accuracy_within_rate": "ViTs (vit.grid)",
}


def design_units(config: dict[str, Any]) -> dict[str, int]:
    """The independent units of each primary in a config's design: its fixed-size runs (family
    ``fixed_size``, one seed each) for the across-runs and token-wise tests, its checkpoint
    suites (family ``emergence``, and hub models measured at several ``steps``) for the
    emergence tests, for the arms test the suites of its smaller arm (the largest data fraction
    against the others), and its ViTs (``vit.grid``, each one OLS row) for the ViT sweep's tests.
    """
    models = expand_grids(config).get("models", {})
    meta = {name: spec.get("meta") or {} for name, spec in models.items()}
    runs = sum(m.get("family") == "fixed_size" and n.endswith("-final") for n, m in meta.items())
    fractions = [
        m.get("data_fraction")
        for n, m in meta.items()
        if m.get("family") == "emergence" and not n.endswith("-final")
    ]
    hub_suites = sum(
        1
        for name, spec in models.items()
        if meta[name].get("family") != "emergence"
        and "hub" in (spec.get("source") or {})
        and len(spec.get("steps") or []) > 1
    )
    full = sum(f == max(fractions) for f in fractions) if fractions else 0
    vit = config.get("vit") or {}
    grid = vit.get("grid") or {}
    vits = int(
        np.prod([len(grid.get(a) or []) for a in ("drop_path_rate", "weight_decay", "seeds")])
    )
    vits = vits if vit.get("enabled") else 0
    suites = len(fractions) + hub_suites
    return {
        "fixed_size_excess_vs_bpb": runs,
        "tokens_self_trained_vs_random": runs,
        "fixed_size_trained_vs_random": runs,
        "emergence_within_loss": suites,
        "emergence_final_vs_init": suites,
        "emergence_relaxation": suites,
        "emergence_within_arms": min(full, len(fractions) - full),
        "vit_sd_effect": vits,
        "vit_accuracy_within_rate": vits,
    }


def primary_unit_warnings(plan: Plan) -> list[str]:
    """One line per declared primary (``stats.primary``) whose design gives it fewer than
    ``MIN_CLUSTERS`` units (``Plan.primary_units``): its row will have no interval, p or verdict.
    """
    from blockcoupling.stats.inference import MIN_CLUSTERS  # statsmodels: only when asked

    return [
        f"stats.primary.{name}: this design gives it {n} unit(s) ({UNIT_NAMES[name]}), fewer "
        f"than the {MIN_CLUSTERS} a test needs, so its row will have no interval, p or "
        "verdict: add units or move it out of stats.primary"
        for name, n in plan.primary_units.items()
        if n < MIN_CLUSTERS
    ]
