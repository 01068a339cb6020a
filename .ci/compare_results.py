"""Compare two runs' results/ folders: the same files, and equal contents (NetCDF values and
coordinates through xarray, attrs aside; CSV tables through pandas and trainer states through
torch, both without their wall-clock columns; every other file except figures byte for byte).
Exit status 1 with one line per difference.

python .ci/compare_results.py LOCAL_RUN_DIR SLURM_RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import xarray as xr

TIMING_COLUMNS = ("elapsed_s",)  # training history and trainer state: wall-clock seconds
FIGURES = (".png", ".pdf")  # rendered images: same data, but encoders may stamp them


# Content-hash records (results/.manifest, a checkpoint's checksums.json): they hash files that
# embed wall-clock times (trainer states, histories), so they differ between runs by design;
# `blockcoupling verify` checks each run's own records instead.
HASH_RECORDS = (".manifest", "checksums.json")


def files(run: Path) -> set[str]:
    """Paths of every result file under run/results (hash records aside), relative to run."""
    return {
        str(p.relative_to(run))
        for p in (run / "results").rglob("*")
        if p.is_file() and not any(part in HASH_RECORDS for part in p.relative_to(run).parts)
    }


def difference(a: Path, b: Path) -> str | None:
    """Why two files differ, or None."""
    if a.suffix == ".nc":
        with xr.open_dataset(a) as x, xr.open_dataset(b) as y:
            return None if x.equals(y) else f"values differ: {_worst(x, y)}"
    if a.suffix == ".csv":
        x, y = (pd.read_csv(p).drop(columns=list(TIMING_COLUMNS), errors="ignore") for p in (a, b))
        return None if x.equals(y) else "tables differ"
    if a.name == "trainer_state.pt":
        x, y = (_untimed(torch.load(p, weights_only=True)) for p in (a, b))
        return None if _same(x, y) else "trainer states differ"
    if a.suffix in FIGURES:
        return None
    return None if a.read_bytes() == b.read_bytes() else "bytes differ"


def _untimed(value: Any) -> Any:
    """``value`` without the TIMING_COLUMNS keys of any mapping in it."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING_COLUMNS}
    if isinstance(value, (list, tuple)):
        return [_untimed(v) for v in value]
    return value


def _same(x: Any, y: Any) -> bool:
    """Equality of nested containers of tensors and plain values."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return x == y


def _worst(x: xr.Dataset, y: xr.Dataset) -> str:
    """The variable with the largest absolute difference (for the message)."""
    worst = []
    for name in x.data_vars:
        if name in y and x[name].dtype.kind == "f" and x[name].shape == y[name].shape:
            worst.append((float(abs(x[name] - y[name]).max()), name))
    return f"max |diff| {max(worst)[0]:.3g} in {max(worst)[1]}" if worst else "variables"


def main(local: Path, slurm: Path) -> int:
    """Print the comparison; 0 when the runs agree."""
    ours, theirs = files(local), files(slurm)
    problems = [f"only in the local run: {p}" for p in sorted(ours - theirs)]
    problems += [f"only in the Slurm run: {p}" for p in sorted(theirs - ours)]
    for path in sorted(ours & theirs):
        why = difference(local / path, slurm / path)
        if why:
            problems.append(f"{path}: {why}")
    for problem in problems:
        print(f"MISMATCH {problem}")
    kinds = {s: sum(p.endswith(s) for p in ours & theirs) for s in (".nc", ".csv", *FIGURES)}
    print(f"compared {len(ours & theirs)} files ({kinds}): {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or not all(Path(run, "results").is_dir() for run in sys.argv[1:]):
        sys.exit("usage: python .ci/compare_results.py RUN_DIR OTHER_RUN_DIR (each with results/)")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
