"""Compare the claims tables two runs put in the README (between the claims markers, as
``blockcoupling claims`` writes them) at two git revisions: one Markdown row per claim with the
estimate, p_holm and verdict of each run, so a README states a difference between runs from the
runs' own tables, never typed.

python tools/analysis/claims_diff.py REV_A REV_B [--label-a AMD] [--label-b Intel] > bench/runs/F.md
(REV_A, REV_B: git revisions, or files holding a README's claims block)
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from blockcoupling.stats import claims

COLUMNS = ("estimate [95% CI]", "p_holm", "verdict")


def claims_rows(revision: str) -> tuple[str, dict[str, dict[str, str]]]:
    """(the run's header line, {claim: {column: cell}}) of the README at a git revision, or of
    a file that holds a README's claims block (e.g. a run's README kept in bench/runs/)."""
    if Path(revision).is_file():
        readme = Path(revision).read_text(encoding="utf-8")
    else:
        readme = subprocess.run(
            ["git", "show", f"{revision}:README.md"], capture_output=True, text=True, check=True
        ).stdout
    block = readme[readme.index(claims.START) : readme.index(claims.END)].splitlines()
    header = next(line for line in block if line.startswith("Claims of the paper"))
    first = next(i for i, line in enumerate(block) if line.startswith("| claim |"))
    table = block[first : block.index("", first)]  # the claims table, not the calibration one
    names = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        cells = dict(zip(names, (cell.strip() for cell in line.strip().strip("|").split("|"))))
        rows[cells["claim"]] = cells
    return header, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("--label-a", default="A")
    parser.add_argument("--label-b", default="B")
    args = parser.parse_args()
    (head_a, a), (head_b, b) = claims_rows(args.rev_a), claims_rows(args.rev_b)
    print(f"# Claims of two runs: {args.label_a} and {args.label_b}\n")
    print(f"`python tools/analysis/claims_diff.py {args.rev_a} {args.rev_b}`\n")
    print(f"- {args.label_a} (README at `{args.rev_a}`): {head_a.split('(')[0].strip()}")
    print(f"- {args.label_b} (README at `{args.rev_b}`): {head_b.split('(')[0].strip()}\n")
    cols = [f"{c} {label}" for c in COLUMNS for label in (args.label_a, args.label_b)]
    print("| claim | same | " + " | ".join(cols) + " |")
    print("| --- " * (len(cols) + 2) + "|")
    for claim in dict.fromkeys([*a, *b]):  # A's order, then claims only B has
        row_a, row_b = a.get(claim, {}), b.get(claim, {})
        same = all(row_a.get(c) == row_b.get(c) for c in COLUMNS)
        cells = [row.get(c, "") for c in COLUMNS for row in (row_a, row_b)]
        print(f"| {claim} | {'yes' if same else 'no'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
