"""The HTML report's opening text (report/workflow.rst): every model the run measured, grouped
by where it comes from. The report template sees only the config, so the workflow hands it this
text (``config["report_models"]``), resolved from the checked plan.
"""

from __future__ import annotations

from blockcoupling.pipeline.entries import RANDOM, ModelEntry
from blockcoupling.pipeline.plan import Plan


def _names(names: list[str]) -> str:
    """Model names as rst literals, comma-separated."""
    return ", ".join(f"``{name}``" for name in names)


def _steps(steps: list[str], most: int = 12) -> str:
    """'checkpoints 0, 2, 8' (sorted numerically), or 'N checkpoints from A to B' past ``most``."""
    ordered = sorted(set(steps), key=int)
    if len(ordered) > most:
        return f"{len(ordered)} checkpoints from {ordered[0]} to {ordered[-1]}"
    return "checkpoints " + ", ".join(ordered)


def _twins(finals: list[ModelEntry]) -> str:
    """How many of ``finals`` are measured beside a random-init twin, and how many distinct
    twins that is (runs of one size and seed share one: ``ModelEntry.twin_of``).
    """
    with_twin = [e for e in finals if RANDOM in e.steps]
    distinct = len({e.twin_of or e.name for e in with_twin})
    if not with_twin:
        return ""
    which = "each" if len(with_twin) == len(finals) else f"{len(with_twin)} of them"
    shared = (
        ""
        if distinct == len(with_twin)
        else " (one shared twin: identical initialisations)"
        if distinct == 1
        else f" ({distinct} distinct twins: runs of one initialisation share one)"
    )
    return f", {which} beside its random-init twin{shared}"


def report_models(plan: Plan) -> str:
    """One sentence per source of models: those loaded (hub, package, path, model table) and,
    per training family, those trained here; each says which are measured at their final
    weights (and with a random-init twin) and which at checkpoints.
    """
    groups: dict[str, list[str]] = {}
    for name, entry in plan.models.items():
        family = entry.meta.get("family") if entry.is_trained_here else None
        where = f"trained here ({family or 'train.runs'})" if entry.is_trained_here else "loaded"
        groups.setdefault(where, []).append(name)
    parts = []
    for where, names in groups.items():
        entries = [plan.models[n] for n in names]
        suites = [e for e in entries if e.is_checkpoint_suite]
        finals = [e for e in entries if not e.is_checkpoint_suite]
        pieces = []
        if finals:
            names = _names([e.name for e in finals])
            pieces.append(f"{len(finals)} at final weights{_twins(finals)}: {names}")
        if suites:
            steps = [s for e in suites for s in e.steps]
            pieces.append(f"{len(suites)} at {_steps(steps)}: {_names([e.name for e in suites])}")
        parts.append(f"{where}, " + "; ".join(pieces))
    return "; ".join(parts)
