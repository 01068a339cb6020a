"""The hub cache's volume: bytes a plan downloads from the hub and the most its cache holds at
once (``blockcoupling plan`` and the fetch rules print them), from the models' parameter counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockcoupling.pipeline.cost import GB, shape_of

if TYPE_CHECKING:
    from blockcoupling.pipeline.plan import Plan

HUB_BYTES_PER_PARAM = 2  # checkpoints on the hub are float16/bfloat16 files (assumed)
VIT_DATA_BYTES = 163e6  # the CIFAR-10 archive


def size_text(size: float) -> str:
    """Bytes in words: GB, or MB below a tenth of a GB."""
    return f"{size / GB:,.1f} GB" if size >= GB / 10 else f"{size / 1e6:,.1f} MB"


def hub_volume(plan: Plan) -> tuple[float, float, int]:
    """Bytes downloaded, peak bytes in the hub cache, and model revisions fetched: every hub
    model's weights once per revision (``HUB_BYTES_PER_PARAM`` per parameter; a random twin
    needs no weights), with at most ``hub.max_revisions`` checkpoint revisions in the cache at
    once (absent or ``all``: all of them stay), plus the CIFAR-10 archive of the ViT sweep.
    """
    bound = plan.hub.max_revisions
    total = kept = largest = 0.0
    revisions = checkpoints = 0
    for entry in plan.models.values():
        if "hub" not in entry.source:
            continue
        shape = shape_of(entry.meta, entry.load)  # parameters: the table's, else 13 d^2 L
        params = entry.meta.get("params") or (shape.params if shape else 0)
        size = float(params) * HUB_BYTES_PER_PARAM
        count = len(entry.steps) if entry.is_checkpoint_suite else 1
        revisions += count
        total += size * count
        if entry.is_checkpoint_suite:
            checkpoints += count
            largest = max(largest, size)
            kept += size * count
    data = VIT_DATA_BYTES if plan.vit is not None and plan.vit.base["dataset"] == "cifar10" else 0
    peak = total - kept + (kept if bound is None else min(bound, checkpoints) * largest) + data
    return total + data, peak, revisions
