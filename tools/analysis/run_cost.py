"""What a finished workflow run cost, per stage: jobs, CPU-minutes and job wall-minutes, summed
from its per-rule benchmark files (``benchmarks/``), as a markdown table for the README.

Usage: python tools/analysis/run_cost.py RUN_DIR [--elapsed SECONDS]

RUN_DIR is the folder the workflow ran in (it holds ``benchmarks/`` and ``results/``). Each job's
last benchmark row gives its wall seconds (``s``) and CPU seconds (``cpu_time``: psutil's, of the
job's process tree); stages group the jobs by rule and model family. ``--elapsed`` (the run's
wall-clock seconds, e.g. from Snakemake's "Elapsed time") adds the mean number of busy cores.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

PRETRAINED_FAMILIES = ("smollm2", "gemma3")


def stage(path: Path, root: Path) -> str:
    """The README stage of one benchmark file, from its rule folder and model name."""
    parts = path.relative_to(root).with_suffix("").parts
    rule = parts[0]
    if rule in ("extract", "evaluate", "metrics") and len(parts) >= 3:
        model, step = parts[1], parts[2]
        if model.startswith(PRETRAINED_FAMILIES):
            return f"pretrained {rule} (trained and twin)"
        family = model.split("-")[0].removesuffix("_lr")
        kind = "twin" if step == "random" else "trained"
        return f"`{family}` {rule} ({kind})"
    if rule == "train":
        return f"`{parts[1].split('-')[0].removesuffix('_lr')}` training"
    if rule == "vit":
        return {"train": "ViT training", "extract": "ViT extraction"}.get(
            parts[1], "ViT data, combine, statistics"
        )
    return "prompts, assembly, combine, statistics, figures"


def costs(root: Path) -> dict[str, list[float]]:
    """stage -> [jobs, CPU seconds, wall seconds]."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for path in sorted(root.rglob("*.tsv")):
        rows = list(csv.DictReader(path.open(), delimiter="\t"))
        if not rows:
            continue
        row = out[stage(path, root)]
        row[0] += 1
        row[1] += float(rows[-1].get("cpu_time") or 0)
        row[2] += float(rows[-1]["s"])
    return out


def table(root: Path, elapsed: float | None) -> str:
    """The markdown table (stages by CPU time, then the total)."""
    data = costs(root)
    lines = ["| stage | jobs | CPU-min | job wall-min (sum) |", "| --- | --- | --- | --- |"]
    for name, (jobs, cpu, wall) in sorted(data.items(), key=lambda item: -item[1][1]):
        lines.append(f"| {name} | {jobs:.0f} | {cpu / 60:.1f} | {wall / 60:.1f} |")
    jobs, cpu, wall = (sum(v[i] for v in data.values()) for i in range(3))
    lines.append(f"| **all jobs** | **{jobs:.0f}** | **{cpu / 60:.1f}** | **{wall / 60:.1f}** |")
    if elapsed:
        lines.append(
            f"\nRun wall time {elapsed / 60:.1f} min; jobs' CPU time over it: "
            f"{cpu / elapsed:.2f} busy cores on average."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the folder the workflow ran in")
    parser.add_argument("--elapsed", type=float, help="the run's wall-clock seconds")
    args = parser.parse_args()
    root = args.run_dir / "benchmarks"
    if not root.is_dir():
        parser.error(f"{root} does not exist: give the folder the workflow ran in")
    print(table(root, args.elapsed))


if __name__ == "__main__":
    main()
