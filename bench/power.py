"""Power of each declared primary test at its declared effect, from a pilot run, before the run
that tests it: writes ``resources/power.csv`` (config ``stats.power_file``), which the claims
table reads (its ``power`` column, and why an inconclusive test is inconclusive).

    python bench/power.py PILOT/results/stats/analyses.csv [--config config.yaml]
        [--n ID=N ...] [--only ID ...] [--out resources/power.csv]

Each primary test is a t statistic; its standard error comes from the pilot's interval and is
scaled to the design's n (``--n``: another number of units than the pilot's, e.g. when the
design grows); power by a seeded simulation of the noncentral t at Holm's first threshold
(blockcoupling.stats.power). Rows say the n that would reach 80%. ``--only``: recompute those
tests' rows from this pilot and keep the other rows of ``--out`` (their own earlier pilot).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blockcoupling.stats.power import pilot_power  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pilot", help="a pilot run's results/stats/analyses.csv")
    parser.add_argument("--config", default="config.yaml", help="the config declaring the tests")
    parser.add_argument(
        "--n",
        action="append",
        default=[],
        help="ID=N: the design's independent units (clusters for a CR1 test)",
    )
    parser.add_argument("--only", action="append", default=[], help="ID: only this test's row")
    parser.add_argument("--out", default="resources/power.csv")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    primary = yaml.safe_load(Path(args.config).read_text())["stats"]["primary"]
    design = {k: int(v) for k, v in (item.split("=", 1) for item in args.n)}
    table = pilot_power(pd.read_csv(args.pilot), primary, design, seed=args.seed)
    if args.only:
        kept = pd.read_csv(args.out).set_index("analysis")
        fresh = table.set_index("analysis")
        rows = [(fresh if a in args.only else kept).loc[[a]] for a in fresh.index]
        table = pd.concat(rows).rename_axis("analysis").reset_index()
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
