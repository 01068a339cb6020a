"""The quota guard: the output and download volume of a plan by rule, and the refusal of a plan
whose output exceeds ``budget.max_output_gb`` (``blockcoupling plan`` prints both; the
workflow's setup prints the volumes and stops before any job).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockcoupling.pipeline.cost import GB, JobCost, plan_costs, shape_of
from blockcoupling.pipeline.hub_volume import HUB_BYTES_PER_PARAM, VIT_DATA_BYTES, size_text

if TYPE_CHECKING:
    from blockcoupling.pipeline.plan import Plan

DEFAULT_MAX_OUTPUT_GB = 500.0  # the schema's default: a share of a shared cluster's quota


def output_by_rule(rows: list[JobCost]) -> dict[str, float]:
    """Output bytes of each rule of the costed jobs (``cost.plan_costs``), largest first."""
    volume: dict[str, float] = {}
    for row in rows:
        volume[row.rule] = volume.get(row.rule, 0.0) + row.output_bytes
    return dict(sorted(volume.items(), key=lambda kv: -kv[1]))


def download_by_rule(plan: Plan) -> dict[str, float]:
    """Bytes each fetch rule downloads (``hub_volume``'s count): ``fetch_model`` a hub model's
    weights, ``fetch_checkpoint`` every revision of a checkpoint suite, ``vit_data`` CIFAR-10.
    """
    volume = {"fetch_model": 0.0, "fetch_checkpoint": 0.0, "vit_data": 0.0}
    for entry in plan.models.values():
        if "hub" not in entry.source:
            continue
        shape = shape_of(entry.meta, entry.load)
        size = float(entry.meta.get("params") or (shape.params if shape else 0))
        size *= HUB_BYTES_PER_PARAM
        if entry.is_checkpoint_suite:
            volume["fetch_checkpoint"] += size * len(entry.steps)
        else:
            volume["fetch_model"] += size
    if plan.vit is not None and plan.vit.base["dataset"] == "cifar10":
        volume["vit_data"] = VIT_DATA_BYTES
    return dict(sorted(((r, v) for r, v in volume.items() if v), key=lambda kv: -kv[1]))


def _by_rule(volume: dict[str, float]) -> str:
    sizes = [f"{rule} {size_text(size)}" for rule, size in volume.items() if size]
    return ", ".join(sizes) or "none"


def volume_lines(plan: Plan, rows: list[JobCost]) -> list[str]:
    """Two lines: the output and the download volume by rule, with the output budget."""
    output, download = output_by_rule(rows), download_by_rule(plan)
    total = sum(output.values())
    limit = plan.max_output_gb
    bound = "no limit" if limit is None else f"budget.max_output_gb = {limit:g}"
    return [
        f"output: {size_text(total)} ({bound}); by rule: {_by_rule(output)}",
        f"download: {size_text(sum(download.values()))}; by rule: {_by_rule(download)}",
    ]


def over_budget(plan: Plan, rows: list[JobCost]) -> str | None:
    """The one line that stops a plan whose output exceeds ``budget.max_output_gb``, naming the
    rule that writes the most and the key; None within the budget.
    """
    if plan.max_output_gb is None:
        return None
    output = output_by_rule(rows)
    total = sum(output.values())
    if total <= plan.max_output_gb * GB:
        return None
    rule, largest = next(iter(output.items()))
    return (
        f"budget.max_output_gb: the plan writes {total / GB:,.0f} GB of output, more than "
        f"budget.max_output_gb = {plan.max_output_gb:g}; rule {rule} writes {largest / GB:,.0f} "
        "GB of it (blockcoupling plan shows it by model); fewer prompts, token prompts or "
        "steps, or raise budget.max_output_gb"
    )


def check_budget(plan: Plan) -> list[str]:
    """The plan's volume lines, or ``ValueError`` with ``over_budget``'s line."""
    rows = plan_costs(plan)
    refusal = over_budget(plan, rows)
    if refusal:
        raise ValueError(refusal)
    return volume_lines(plan, rows)
