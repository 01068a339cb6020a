"""Which measure and K the primary tests should use: for the trained fixed-size runs, each
candidate (the excess and the overlap at every K of the run) against the log of the runs'
median effective rank, and against minus held-out bits per byte, across runs (Pearson r with
scipy's Fisher-z interval); and the share of runs whose median effective rank is below K. The
columns are the fixed-size primary test's (``stats.fixed_size.run_table``: held-out prompts).

    python tools/analysis/measure_vs_rank.py results/ [--out bench/runs/x.md]

A measure that correlates with log effective rank as strongly as it does with anything else
measures the spectrum's shape (docs/science.md, "Which K").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from blockcoupling.stats import fixed_size  # noqa: E402
from blockcoupling.stats.selection import Selection  # noqa: E402

MEASURES = ("coupling_excess", "overlap_u")
PROMPTS = "held_out"  # the prompts of the fixed-size primary test (fixed_size.PROMPT_SETS)


def table(results: Path) -> tuple[pd.DataFrame, list[int]]:
    """One row per trained fixed-size run, from ``fixed_size.run_table`` at every K of the
    run (the primary test's own columns): ``{measure}_k{K}`` (mean over the held-out prompts),
    ``rank`` (median effective rank over those prompts and every block; ``log_rank`` its log,
    the rank-adjusted slope's covariate), ``neg_bpb`` (minus held-out bits per byte)."""
    coupling = xr.open_dataset(results / "combined" / "coupling.nc")
    evaluation = xr.open_dataset(results / "combined" / "evaluation.nc")
    ks = [int(k) for k in coupling["k"].values]
    rows = None
    for k in ks:
        runs = fixed_size.run_table(coupling, evaluation, {}, Selection(k=k))
        if rows is None:
            rows = runs[["model"]].copy()
            rows["log_rank"] = runs[f"{fixed_size.RANK}_{PROMPTS}"]
            rows["rank"] = np.exp(rows["log_rank"])
            rows["neg_bpb"] = runs["neg_bpb"]
        for name in MEASURES:
            rows[f"{name}_k{k}"] = runs[f"{name}_{PROMPTS}"]
    return rows, ks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows, ks = table(args.results)
    rank = rows["rank"]
    lines = [
        f"{len(rows)} trained runs of `{fixed_size.FAMILY}` ({PROMPTS} prompts); median "
        f"effective rank {rank.median():.1f} (range {rank.min():.1f}-{rank.max():.1f}).",
        "",
        "| measure | K | runs with rank < K | r with log eff. rank [95% CI] "
        "| r with -bpb [95% CI] |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in MEASURES:
        for k in ks:
            cells = []
            for other in ("log_rank", "neg_bpb"):
                res = sps.pearsonr(rows[f"{name}_k{k}"], rows[other])
                ci = res.confidence_interval()
                cells.append(f"{res.statistic:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]")
            below = int((rows["rank"] < k).sum())
            lines.append(f"| {name} | {k} | {below} of {len(rows)} | {cells[0]} | {cells[1]} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
