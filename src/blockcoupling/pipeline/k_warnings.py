"""Warnings, not errors, about the configured K lists: a K above d/8 of a model leaves its chance
overlap K/d high (``k_warnings``; ``blockcoupling check-config`` prints them).
"""

from __future__ import annotations

from blockcoupling.pipeline.checks import model_shape
from blockcoupling.pipeline.plan import Plan

K_OVER_D_LIMIT = 1 / 8  # above it the chance overlap K/d leaves little room below 1


def k_warnings(plan: Plan) -> list[str]:
    """One line per configured K (``metrics.ks``, ``vit.ks``) that exceeds d/8 of some model
    (d from a trained run's config, a model's ``meta.d_model``, the ViT's ``embed_dim``): its
    overlap's chance level K/d is then above 1/8 and an unrelated top-K subspace already
    shares much of it. Warnings, not errors: the paper's K list (10, 30, 50) stays legal.
    """
    runs = plan.train_runs
    widths: dict[str, int] = {}
    for name, entry in plan.models.items():
        d_model = model_shape(entry, runs)[1]
        if d_model:
            widths[name] = int(d_model)
    lines = []
    for k, over in plan.metric.over_chance(widths, K_OVER_D_LIMIT).items():
        d = min(widths[name] for name in over)
        lines.append(
            f"metrics.ks: K={k} is more than d/8 for {len(over)} model(s) (e.g. "
            f"{over[0]!r}, d={d}: K/d={k / d:.2f}); their chance overlap K/d is high, "
            f"prefer K <= {int(K_OVER_D_LIMIT * d)} for them (stats.k is {plan.selection.k})"
        )
    if plan.vit is not None:
        d = int(plan.vit.base["embed_dim"])
        for k in plan.vit.ks:
            if k > K_OVER_D_LIMIT * d:
                lines.append(
                    f"vit.ks: K={k} is more than d/8 of the ViTs (embed_dim={d}: K/d={k / d:.2f}); "
                    f"prefer K <= {int(K_OVER_D_LIMIT * d)} (vit.k is {plan.vit.k})"
                )
    return lines
