"""A second Snakemake run started beside a running one, told so in one line before Snakemake
reads the first run's incomplete outputs as the leftovers of a killed run (its advice,
``--rerun-incomplete``, is wrong for a run that is still going).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def another_run(workdir: str | Path, argv: Sequence[str]) -> str | None:
    """One line when the Snakemake state of ``workdir`` shows a run under way (lock files in
    ``.snakemake/locks`` and outputs marked incomplete in ``.snakemake/incomplete``), else
    None; also None for ``--unlock`` and for a run told ``--rerun-incomplete`` or
    ``--ignore-incomplete`` (which then meets Snakemake's own lock).
    """
    if {"--unlock", "--rerun-incomplete", "--ri", "--ignore-incomplete", "--ii"} & set(argv):
        return None
    state = Path(workdir) / ".snakemake"
    locks = list((state / "locks").glob("*.lock")) if (state / "locks").is_dir() else []
    marked = (state / "incomplete").is_dir() and any(
        p.is_file() for p in (state / "incomplete").rglob("*")
    )
    if not locks or not marked:
        return None
    return (
        f"another Snakemake run is under way in {Path(workdir).resolve()} (it holds "
        ".snakemake/locks, and the outputs of its running jobs are marked incomplete): wait "
        "for it to end, or start this one in another folder; if none runs (it was killed), "
        "run snakemake --unlock, then rerun with --rerun-incomplete"
    )
