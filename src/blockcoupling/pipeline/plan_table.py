"""``blockcoupling plan``'s table: every job's cost (``cost.plan_costs``) with the Slurm runtime
it asks (``slurm_sizing.runtime_minutes``), the totals and the output by rule.
"""

from __future__ import annotations

from blockcoupling.pipeline.cost import CPU, GB, GPU, JobCost, Rates
from blockcoupling.pipeline.slurm_sizing import RUNTIME_FLOOR_MIN, RUNTIME_SAFETY, runtime_minutes


def plan_table(
    rows: list[JobCost], gpu: Rates = GPU, cpu: Rates = CPU, limit: int | None = None
) -> str:
    """A fixed-width table of the jobs (with the Slurm runtime the longest asks under a
    partition ``limit`` in minutes), the totals (GPU-hours, CPU-hours, output) and the output
    by rule.
    """
    head = (
        f"{'model':<26} {'rule':<11} {'jobs':>5} {'hours':>8} {'h/job':>6} {'min/job':>7} "
        f"{'peak GB':>8} {'declared':>8} {'output GB':>9}  device"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        flags = ("" if row.fits else "  OVER gpu_mem_gb") + (
            "" if row.in_time else "  OVER runtime: shard it (prompts_per_shard)"
        )
        lines.append(
            f"{row.model:<26} {row.rule:<11} {row.jobs:>5} {row.seconds / 3600:>8.2f} "
            f"{row.job_seconds / 3600:>6.2f} {runtime_minutes(row.job_seconds, 1, limit):>7} "
            f"{row.peak_bytes / GB:>8.1f} {row.declared_gb:>8.0f} "
            f"{row.output_bytes / GB:>9.2f}  {'GPU' if row.on_gpu else 'CPU'}{flags}"
        )
    parts: dict[str, float] = {}
    for row in rows:
        if row.rule not in ("extract",):
            continue
        for part, value in row.parts.items():
            parts[part] = parts.get(part, 0.0) + value
    share = sum(parts.values()) or 1.0
    by_rule: dict[str, float] = {}
    for row in rows:
        by_rule[row.rule] = by_rule.get(row.rule, 0.0) + row.output_bytes
    lines += [
        "-" * len(head),
        f"total: {sum(r.seconds for r in rows if r.on_gpu) / 3600:.1f} GPU-hours, "
        f"{sum(r.seconds for r in rows if not r.on_gpu) / 3600:.2f} CPU-hours, "
        f"{sum(r.output_bytes for r in rows) / GB:.1f} GB of output",
        "extraction time by part: "
        + ", ".join(
            f"{part} {100 * value / share:.0f}%"
            for part, value in sorted(parts.items(), key=lambda kv: -kv[1])
        ),
        "output by rule: "
        + ", ".join(
            f"{rule} {volume / GB:,.0f} GB"
            for rule, volume in sorted(by_rule.items(), key=lambda kv: -kv[1])
            if volume
        ),
        f"rates: {gpu.name}; {cpu.name}",
        f"Slurm runtime of a job (min/job): {RUNTIME_SAFETY:g} x its h/job, at least "
        f"{RUNTIME_FLOOR_MIN} min, doubled on its retry; "
        + (
            f"shards sized so that the retry fits the {limit}-minute limit"
            if limit
            else "no time limit given (--time-limit)"
        ),
    ]
    return "\n".join(lines)
