"""Which measure and K the primary tests should use: for the trained runs of one family, each
candidate (the excess and the overlap at every K of the run) against the log of the runs'
median effective rank, and against minus held-out bits per byte, across runs (Pearson r with
scipy's Fisher-z interval); and the share of runs whose median effective rank is below K.

    python bench/measure_vs_rank.py results/ [--family fixed_size] [--out bench/runs/x.md]

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SELECTION = dict(reading="authors", variant="ujv", norm="p", init="trained")
MEASURES = ("coupling_excess", "overlap_u")


def table(results: Path, family: str) -> tuple[pd.DataFrame, list[int]]:
    """One row per run of ``family``: ``{measure}_k{K}`` means over prompts, ``log_rank`` (log of
    the median effective rank over prompts and blocks), ``neg_bpb``."""
    data = xr.open_dataset(results / "combined" / "coupling.nc")
    models = data["model"].values[data["family"].values.astype(str) == family]
    data = data.sel(model=models)
    at = {k: v for k, v in SELECTION.items() if k in data.dims}
    rows = pd.DataFrame({"model": models.astype(str)})
    ks = [int(k) for k in data["k"].values]
    for name in MEASURES:
        values = data[name].sel({k: v for k, v in at.items() if k in data[name].dims})
        for k in ks:
            rows[f"{name}_k{k}"] = values.sel(k=k).mean("prompt").values
    rank = data["effective_rank"].sel(
        {k: v for k, v in at.items() if k in data["effective_rank"].dims}
    )
    rank = rank.stack(all=[d for d in rank.dims if d != "model"])
    rows["rank"] = np.nanmedian(rank.values, axis=1)
    rows["log_rank"] = np.log(rows["rank"])
    runs = pd.read_csv(results / "stats" / "fixed_size_runs.csv")[["model", "neg_bpb"]]
    return rows.merge(runs, on="model", how="left"), ks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--family", default="fixed_size")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows, ks = table(args.results, args.family)
    rank = rows["rank"]
    lines = [
        f"{len(rows)} trained runs of `{args.family}`; median effective rank "
        f"{rank.median():.1f} (range {rank.min():.1f}-{rank.max():.1f}).",
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
