"""Subcommands that write records: a run's claims table and the measure registry into
marked blocks of the docs, the power table, a fetched hub revision; and ``verify``.
"""

from __future__ import annotations

import argparse
import stat
import sys
from pathlib import Path
from typing import Any


def render_claims(results: Path, readme: Path) -> str:
    """Write ``results``/stats/claims.md into ``readme`` between the claims markers."""
    from blockcoupling.stats.claims import END, START

    source = results / "stats" / "claims.md"
    if not source.is_file():
        raise ValueError(f"{source} not found: run the workflow's stats_claims rule first")
    body = source.read_text(encoding="utf-8")
    if START in body or END in body:
        raise ValueError(
            f"{source} holds the markers {START} / {END} itself (the README would get two "
            "pairs): it is not the table stats_claims writes; rerun the workflow's stats_claims"
        )
    _rewrite_block(readme, START, END, readme_tables(body, source))
    return f"{readme}: claims table from {source}"


PROSE = "How to read it (generated from the same table):"


def readme_tables(body: str, source: Path) -> str:
    """``claims.md`` as the README shows it: its tables, the generated sentences that read each
    row (``PROSE`` up to the next paragraph) replaced by one line naming where they are.
    """
    if PROSE not in body:
        return body
    before, _, after = body.partition(PROSE)
    rest = after.lstrip("\n")
    bullets = 0
    lines = rest.split("\n")
    while bullets < len(lines) and lines[bullets].startswith("- "):
        bullets += 1
    link = (
        f"One sentence per row reads it ({bullets} rows): `{source.name}` beside the table in the "
        "run's `results/stats/`; what each column means: "
        "[docs/statistics.md](docs/statistics.md#the-claims-table).\n"
    )
    return before + link + "\n".join(lines[bullets:])


def power_table(args: argparse.Namespace) -> str:
    """Deprecated ``power``: the power table of the config's primary tests from a pilot
    workflow run's analyses, written to ``--out`` (never the config's ``stats.power_file``,
    which ``pilot power`` alone writes); return it as text.
    """
    import pandas as pd

    from blockcoupling.cli.config_commands import describe, layered
    from blockcoupling.cli.parser import configfiles
    from blockcoupling.stats.power import keep_other_rows, pilot_power

    print(
        "blockcoupling power: deprecated; the config's stats.power_file is written by "
        "blockcoupling pilot power",
        file=sys.stderr,
    )
    files = configfiles(args)
    config = layered(files)
    primary = (config.get("stats") or {}).get("primary")
    if not isinstance(primary, dict) or not primary:
        raise ValueError(
            f"{describe(files)}: no stats.primary tests declared; give --configfile FILE"
        )
    power_file = Path((config.get("stats") or {}).get("power_file") or "resources/power.csv")
    if args.out.resolve() == power_file.resolve():
        raise ValueError(
            f"--out {args.out} is the config's stats.power_file, which blockcoupling pilot "
            "power writes (the verdict's rule on the pilot runs); name another file"
        )
    design = {}
    for item in args.n:
        key, _, value = item.partition("=")
        if key not in primary or not value.isdigit() or int(value) < 2:
            raise ValueError(f"--n {item}: give ID=N, a test of stats.primary and N >= 2 units")
        design[key] = int(value)
    table = pilot_power(analysis_table(args.pilot), primary, design, seed=args.seed)
    if args.only:
        table = keep_other_rows(table, pd.read_csv(args.out), args.only)
    table.to_csv(args.out, index=False)
    return table.to_string(index=False) + f"\nwrote {args.out}"


ANALYSIS_COLUMNS = ("analysis", "estimate", "ci_low", "ci_high", "n")


def analysis_table(path: Path) -> Any:
    """A run's ``stats/analyses.csv`` (the columns ``pilot_power`` reads), or a one-line
    ValueError naming the file and what it lacks (e.g. a power table given instead).
    """
    import pandas as pd

    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not an analysis table ({error})") from None
    missing = [column for column in ANALYSIS_COLUMNS if column not in table]
    if missing:
        raise ValueError(
            f"{path}: no column(s) {', '.join(missing)}: not an analysis table; give a pilot "
            "run's PILOT/results/stats/analyses.csv"
        )
    return table


def render_docs(file: Path) -> str:
    """Write the measure registry's table into ``file`` between the measure markers."""
    from blockcoupling.coupling.registry import DOCS_END, DOCS_START, docs_table

    _rewrite_block(file, DOCS_START, DOCS_END, docs_table() + "\n")
    return f"{file}: measure table from blockcoupling.coupling.registry"


def render_figures(run: Path, out: Path) -> str:
    """Copy a finished run's docs figures into ``out`` with their stamps
    (``pipeline.docs_figures``).
    """
    from blockcoupling.pipeline.docs_figures import COMMIT, copy_figures, read_stamp

    written = copy_figures(run, out)
    return (
        f"{len(written)} figures into {out} from {run} (made at {read_stamp(written[0])[COMMIT]})"
    )


def _rewrite_block(file: Path, start: str, end: str, body: str) -> None:
    """Replace ``file``'s block between ``start`` and ``end`` by ``body``, atomically: a
    symlink's target is rewritten (the link kept) with its own permissions; a read-only file is
    refused, untouched.
    """
    from blockcoupling.files.io import read_utf8, replace_marked_block, write_text

    target = file.resolve()
    if target.is_dir():
        raise ValueError(f"{file} is a folder: name the file that holds the markers {start}")
    if not target.is_file():
        raise ValueError(f"{file} does not exist: name the file that holds the markers {start}")
    mode = stat.S_IMODE(target.stat().st_mode)
    if not mode & stat.S_IWUSR:
        raise ValueError(f"{file} is read-only: make it writable (chmod u+w {file}) first")
    text = read_utf8(target, str(file))
    write_text(target, replace_marked_block(text, file, start, end, body))
    target.chmod(mode)  # its own permissions, not the umask's


def fetch_revision(repo: str, revision: str, folder: Path) -> str:
    """Fetch one model revision into ``folder`` (a revision folder of the hub cache) and write
    its manifest where the fetch rules keep it; returns a one-line summary.
    """
    from blockcoupling.lm import hub
    from blockcoupling.pipeline.hub_settings import HubSettings

    hub.go_online()  # before hub.check_fetch_folder imports huggingface_hub
    cache, kind, _ = hub.check_fetch_folder(folder, repo, revision)
    target = HubSettings(cache_dir=str(cache)).manifest(kind, repo, revision)
    manifest = hub.fetch_model(repo, revision, folder, manifest=target)
    size = manifest["bytes"] / 1e9
    return f"{repo}@{revision}: {len(manifest['files'])} files, {size:.2f} GB in {folder}"


def verify_results(folder: Path) -> int:
    """Print each problem of ``folder`` (see ``manifest.verify``) and a summary; 1 if any."""
    from blockcoupling.files import manifest

    problems = manifest.verify(folder)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in {folder}: it fails verification", file=sys.stderr)
        return 1
    print(f"{folder}: every result matches its recorded hash and opens")
    return 0
