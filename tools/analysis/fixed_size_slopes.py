"""The fixed-size slopes of minus bits per byte on each predictor, plain, adjusted for the design
and adjusted for log effective rank, from a run's analysis table, as a Markdown table.

    python tools/analysis/fixed_size_slopes.py results/stats/fixed_size.csv \
        [--title TEXT] [--out F.md]

(``results/stats/analyses.csv`` works too: its other rows are left out.) Held-out prompts only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def table(analyses: pd.DataFrame) -> str:
    """One Markdown row per held-out-prompt fixed-size bits-per-byte analysis."""
    rows = analyses[
        analyses["analysis"].str.match(r"fixed_size_\w+_vs_bpb")
        & ~analyses["analysis"].str.contains("leaderboard")
    ]
    lines = [
        "| analysis | estimate [95% CI] | p | p wild bootstrap | n |",
        "| --- | --- | --- | --- | --- |",
    ]
    for _, row in rows.iterrows():
        interval = (
            f" [{row['ci_low']:+.3g}, {row['ci_high']:+.3g}]" if pd.notna(row["ci_low"]) else ""
        )
        wild = f"{row['p_wild']:.3g}" if pd.notna(row.get("p_wild")) else ""
        lines.append(
            f"| {row['analysis']} | {row['estimate']:+.3g}{interval} | {row['p']:.3g} | {wild} "
            f"| {int(row['n'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("analyses", type=Path, help="a run's results/stats/fixed_size.csv")
    parser.add_argument("--title", default="", help="a paragraph above the table")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = (f"{args.title}\n\n" if args.title else "") + table(pd.read_csv(args.analyses)) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
