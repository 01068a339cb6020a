"""The ``blockcoupling`` command: measure one model on a few prompts, check a workflow config.

blockcoupling measure SOURCE "prompt" ["prompt" ...]       coupling of one model beside chance
blockcoupling check-config --configfile FILE [--profile slurm]  validate a config as the workflow
blockcoupling plan --configfile FILE                       cost of its jobs (GPU-hours, memory)
blockcoupling verify results/                              every result against its recorded hash
blockcoupling fetch REPO REVISION FOLDER                   one hub revision into the hub cache

Maintainer commands (they write the project's own files):

blockcoupling claims RESULTS --readme README.md            a run's claims table into the README
blockcoupling docs docs/datasets.md                        the measure registry's table
blockcoupling docs --figures RUN                           a default run's figures: docs/figures
blockcoupling pilot within|across                          pilot runs (seeds 100+)
blockcoupling pilot power --configfile config.yaml         their power: stats.power_file
blockcoupling power ANALYSES --out FILE.csv                deprecated: another power estimate
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from blockcoupling.cli.config_commands import check_config_file, plan_report
from blockcoupling.cli.measure import measure_summary
from blockcoupling.cli.parser import build_parser
from blockcoupling.cli.records import (
    fetch_revision,
    power_table,
    render_claims,
    render_docs,
    render_figures,
    verify_results,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``blockcoupling`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check-config":
            from blockcoupling.cli.parser import configfiles

            print(check_config_file(configfiles(args), args.workflow_dir, args.profile))
        elif args.command == "claims":
            print(render_claims(args.results, args.readme))
        elif args.command == "docs":
            if args.file is None and args.figures is None:
                raise ValueError("name FILE (docs/datasets.md) or --figures RUN")
            if args.file is not None:
                print(render_docs(args.file))
            if args.figures is not None:
                print(render_figures(args.figures, args.out))
        elif args.command == "power":
            print(power_table(args))
        elif args.command == "pilot":
            from blockcoupling.cli.pilot import run_pilot, write_power

            print(write_power(args) if args.design == "power" else run_pilot(args))
        elif args.command == "plan":
            report, fits = plan_report(args)
            print(report)
            return 0 if fits else 1
        elif args.command == "fetch":
            print(fetch_revision(args.repo, args.revision, args.folder))
        elif args.command == "verify":
            return verify_results(args.folder)
        else:
            print(measure_summary(args))
    except (ValueError, OSError) as error:
        print(f"blockcoupling {args.command}: {error}", file=sys.stderr)
        return 2
    return 0
